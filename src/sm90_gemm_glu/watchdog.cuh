// Hang debugging for the Hopper kernel, compiled only with
// -DGATEDMLP_SM90_WATCHDOG=ON (never in a release build):
//   * every mbarrier and split-tail flag wait traps after spinning 2-3 s and
//     prints the barrier, the parity it waited for and its raw state
//     (hopper.cuh);
//   * each warp records the last point of the kernel it reached (mark()) in
//     host-mapped memory, and a host thread prints those points, grouped by
//     CTA, when they have not changed for a few seconds while a CTA has not
//     exited: a hang in a wait the watchdog cannot time out (a named or
//     cluster barrier, a bulk-store wait) still shows where every warp is.
#pragma once

#if defined(GATEDMLP_SM90_WATCHDOG)
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
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
  kLoad = 2,     // producer, before the empty wait (a: piece w, b: k-block)
  kFull = 3,     // consumer, before the full wait (a: piece w, b: k-block)
  kPartial = 4,  // consumer, handing or adding split-tail partials (a: piece w)
  kEpi = 5,      // consumer, entering the epilogue (a: row-block, b: column-block)
  kEpiBar = 6,   // past the epilogue's first barrier
  kStored = 7,   // Y stores issued (a: row-block, b: column-block)
  kDrain = 8,    // before the final bulk-store wait
  kEnd = 9,      // before the final cluster barrier
  kExit = 10,    // past it
};

// A wait that has spun for about 2^32 clocks (2-3 s): print the barrier,
// the parity or token it waits for, and its raw 64-bit state (phase bit,
// pending arrivals, transaction count), then trap, so that the call fails
// rather than hangs.
static __device__ __noinline__ void fire(const char* what, uint32_t addr, uint64_t state, uint64_t want) {
  printf("[watchdog] block %u thread %u: %s at 0x%x, waiting for %llu, state 0x%016llx\n", blockIdx.x, threadIdx.x,
         what, addr, static_cast<unsigned long long>(want), static_cast<unsigned long long>(state));
  __trap();
}
static __device__ __forceinline__ bool expired(long long t0) { return clock64() - t0 > (1ll << 32); }

static __device__ uint32_t* g_trace;  // [CTA][warp]; one copy per translation unit, set by arm()

static __device__ __forceinline__ void mark(uint32_t point, uint32_t a = 0, uint32_t b = 0) {
  if (threadIdx.x % 32 == 0 && g_trace && blockIdx.x < kMaxCtas)
    reinterpret_cast<volatile uint32_t*>(g_trace)[blockIdx.x * kWarps + threadIdx.x / 32] =
        point << 24 | (a & 0xfffu) << 12 | (b & 0xfffu);
}

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
      std::fflush(stderr);
    }
    prev.swap(now);
  }
}

inline Host& host() {
  static Host h;
  static std::once_flag once;
  std::call_once(once, [] {
    const size_t bytes = size_t(kMaxCtas) * kWarps * sizeof(uint32_t);
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
  for (size_t i = 0; i < size_t(kMaxCtas) * kWarps; ++i) h.host[i] = 0;
  h.epoch++;
  h.ctas = ctas < kMaxCtas ? ctas : kMaxCtas;
  cudaMemcpyToSymbol(g_trace, &h.dev, sizeof(h.dev));
}

}  // namespace gatedmlp::sm90::watchdog

#define GATEDMLP_WD_MARK(...) ::gatedmlp::sm90::watchdog::mark(__VA_ARGS__)
#else
#define GATEDMLP_WD_MARK(...) \
  do {                        \
  } while (0)
#endif
