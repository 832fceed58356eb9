// Hang debugging for the Hopper kernel, compiled only with
// -DGATEDMLP_SM90_WATCHDOG=ON (never in a release build):
//   * every mbarrier and split-tail flag wait that spins about a second
//     records what it waits for (the barrier and parity, or the flag and
//     the token's low 32 bits) and the word there (a flag's value; for a
//     barrier, the 64-bit word in shared memory, whose encoding the PTX ISA
//     leaves opaque: it read all ones in the self-test), and traps after
//     about 20 s (hopper.cuh);
//   * each warp records the last point of the kernel it reached (mark()) in
//     host-mapped memory, and a host thread prints those points, grouped by
//     CTA, when they have not changed for a few seconds while a CTA has not
//     exited: a hang in a wait the watchdog cannot time out (a named or
//     cluster barrier, a bulk-store wait) still shows where every warp is;
//   * GATEDMLP_SM90_WATCHDOG_SELFTEST=1 makes a launch hang on purpose, to
//     check the two above (scripts/hang-hunt.sh selftest).
#pragma once

#if defined(GATEDMLP_SM90_WATCHDOG)
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gatedmlp::sm90::watchdog {

constexpr int kMaxCtas = 1024, kWarps = 12;

// Points of the kernel (mark's first argument); a and b as noted.
enum Point : uint32_t {
  kStart = 1,    // after setmaxnreg (a: warpgroup)
  kLoad = 2,     // producer, before the empty wait (a: piece w, b: wait_code)
  kFull = 3,     // consumer, before the full wait (a: piece w, b: wait_code)
  kPartial = 4,  // consumer, handing or adding split-tail partials (a: piece w)
  kEpi = 5,      // consumer, entering the epilogue (a: row-block, b: column-block)
  kEpiBar = 6,   // past the epilogue's first barrier
  kStored = 7,   // Y stores issued (a: row-block, b: column-block)
  kDrain = 8,    // before the final bulk-store wait
  kEnd = 9,      // before the final cluster barrier
  kExit = 10,    // past it
};

// k-block, ring stage and the parity waited for, in 12 bits.
static __device__ __forceinline__ uint32_t wait_code(int kb, int stage, uint32_t parity) {
  return (static_cast<uint32_t>(kb) & 0x1ffu) | static_cast<uint32_t>(stage) << 9 | parity << 11;
}

// The host buffer: each warp's last point (uint32), then, per warp, what it
// has been stuck on (two uint64: address | wanted parity or token << 32, and
// the word at the address).
static __device__ uint32_t* g_trace;  // one copy per translation unit, set by arm()

static __device__ __forceinline__ uint32_t warp_slot() { return blockIdx.x * kWarps + threadIdx.x / 32; }

static __device__ __forceinline__ void mark(uint32_t point, uint32_t a = 0, uint32_t b = 0) {
  if (threadIdx.x % 32 == 0 && g_trace && blockIdx.x < kMaxCtas)
    reinterpret_cast<volatile uint32_t*>(g_trace)[warp_slot()] = point << 24 | (a & 0xfffu) << 12 | (b & 0xfffu);
}

// Whether a wait that began at clock t0 has spun for 2^lg clocks (2^31: about
// a second; 2^35: about 20 s).
static __device__ __forceinline__ bool waited(long long t0, int lg) { return clock64() - t0 > (1ll << lg); }

// A wait that has spun about a second: recorded for the host's report.
static __device__ __noinline__ void note(uint32_t addr, uint64_t want, uint64_t word) {
  if (threadIdx.x % 32 != 0 || !g_trace || blockIdx.x >= kMaxCtas) return;
  volatile uint64_t* stuck = reinterpret_cast<volatile uint64_t*>(g_trace + kMaxCtas * kWarps) + 2 * warp_slot();
  stuck[0] = addr | want << 32;
  stuck[1] = word;
}

// One that has spun about 20 s: the launch fails rather than hangs.
static __device__ __noinline__ void fire(const char* what, uint32_t addr, uint64_t want) {
  printf("[watchdog] block %u thread %u: %s at 0x%x, waiting for %llu: trap\n", blockIdx.x, threadIdx.x, what, addr,
         static_cast<unsigned long long>(want));
  __trap();
}

// Self-test (GATEDMLP_SM90_WATCHDOG_SELFTEST=1 at launch): warp 4 of CTA 0
// never frees ring stage 0, so the launch hangs at its fifth k-block; the
// report must name that stage's empty barrier, and the waits then trap.
static __device__ int g_selftest;
static __device__ __forceinline__ bool drop_release(int stage) {
  return g_selftest && stage == 0 && blockIdx.x == 0 && threadIdx.x / 32 == 4;
}

// One wait's patience: tick() on every unsuccessful try notes the wait once
// after about a second (word() reads what the waiter sees there) and fires
// after about 20 s.
struct Spin {
  long long t0;
  bool noted = false;
  __device__ Spin() { t0 = clock64(); }
  template <typename Word>
  __device__ __forceinline__ void tick(const char* what, uint32_t addr, uint64_t want, Word word) {
    if (!noted && waited(t0, 31)) {
      noted = true;
      note(addr, want, word());
    }
    if (waited(t0, 35)) fire(what, addr, want);
  }
};

struct Host {
  uint32_t* host = nullptr;
  uint32_t* dev = nullptr;
  std::atomic<int> ctas{0};
  std::atomic<unsigned> epoch{0};
};

inline std::string describe(uint32_t v) {
  static const char* names[] = {"-", "start", "load", "full", "partial", "epilogue", "epi-bar", "stored", "drain", "end", "exit"};
  const uint32_t pt = v >> 24, a = (v >> 12) & 0xfffu, b = v & 0xfffu;
  char s[48];
  if (pt == kLoad || pt == kFull)  // b: k-block, stage and parity
    std::snprintf(s, sizeof s, "%s(w%u,kb%u,s%u,p%u)", names[pt], a, b & 0x1ffu, (b >> 9) & 3u, b >> 11);
  else
    std::snprintf(s, sizeof s, "%s(%u,%u)", pt < 11 ? names[pt] : "?", a, b);
  return s;
}

inline void monitor(Host* h) {
  std::vector<uint32_t> prev;
  unsigned reported = ~0u;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const int n = h->ctas.load() * kWarps;
    const unsigned ep = h->epoch.load();
    std::vector<uint32_t> now(h->host, h->host + n);
    bool running = false;
    for (int c = 0; c < n / kWarps; ++c)
      if ((now[c * kWarps + kWarps - 1] >> 24) != kExit) running = true;
    if (running && now == prev && reported != ep) {
      reported = ep;
      std::map<std::string, std::string> by_state;  // warps' points -> CTAs
      for (int c = 0; c < n / kWarps; ++c) {
        std::string st;
        for (int w = 0; w < kWarps; ++w) st += (w ? (w % 4 ? " " : " | ") : "") + describe(now[c * kWarps + w]);
        by_state[st] += " " + std::to_string(c);
      }
      std::fprintf(stderr, "[watchdog] launch %u: no progress for 3 s; warps' last points (w0-3 | w4-7 | w8-11) by CTA:\n", ep);
      for (const auto& [st, ctas] : by_state) std::fprintf(stderr, "[watchdog]   %s  <- CTAs%s\n", st.c_str(), ctas.c_str());
      const uint64_t* stuck = reinterpret_cast<const uint64_t*>(h->host + kMaxCtas * kWarps);
      for (int i = 0; i < n; ++i)
        if (stuck[2 * i])
          std::fprintf(stderr, "[watchdog]   CTA %d warp %d stuck at 0x%x (shared: barrier; global: flag), wants %llu, word 0x%016llx\n",
                       i / kWarps, i % kWarps, static_cast<unsigned>(stuck[2 * i] & 0xffffffffu),
                       static_cast<unsigned long long>(stuck[2 * i] >> 32), static_cast<unsigned long long>(stuck[2 * i + 1]));
      std::fflush(stderr);
    }
    prev.swap(now);
  }
}

inline Host& host() {
  static Host h;
  static std::once_flag once;
  std::call_once(once, [] {
    const size_t bytes = size_t(kMaxCtas) * kWarps * (sizeof(uint32_t) + 2 * sizeof(uint64_t));
    if (cudaHostAlloc(reinterpret_cast<void**>(&h.host), bytes, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&h.dev), h.host, 0) != cudaSuccess) {
      std::fprintf(stderr, "[watchdog] no host-mapped trace buffer; points are not recorded\n");
      h.host = h.dev = nullptr;
      return;
    }
    std::thread(monitor, &h).detach();
  });
  return h;
}

// Before a launch of `ctas` CTAs (the caller's translation unit's g_trace):
// clears the points and points the kernel at the buffer. Assumes the previous
// launch has finished (the tests synchronise after each call).
static void arm(int ctas) {
  Host& h = host();
  if (!h.host) return;
  h.ctas = 0;
  for (size_t i = 0; i < size_t(kMaxCtas) * kWarps * 5; ++i) h.host[i] = 0;  // points and stuck records
  h.epoch++;
  h.ctas = ctas < kMaxCtas ? ctas : kMaxCtas;
  cudaMemcpyToSymbol(g_trace, &h.dev, sizeof(h.dev));
  const char* v = std::getenv("GATEDMLP_SM90_WATCHDOG_SELFTEST");
  const int selftest = v && std::string(v) == "1";
  cudaMemcpyToSymbol(g_selftest, &selftest, sizeof(selftest));
}

}  // namespace gatedmlp::sm90::watchdog

#define GATEDMLP_WD_MARK(...) ::gatedmlp::sm90::watchdog::mark(__VA_ARGS__)
#else
#define GATEDMLP_WD_MARK(...) \
  do {                        \
  } while (0)
#endif
