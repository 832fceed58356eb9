// Where a launch of the Hopper kernel spends its time, per CTA: compiled only
// with -DGATEDMLP_SM90_TIMELINE=ON (never in a release build).
//
// Why: at one clock our kernel costs ~14 thousand cycles more per call than
// cuBLAS at every M (docs/notes/split-tail-and-schedule.md, "fixed cost per call"), and the split tail
// recovered nothing at 8B M = 1024 (h8). Whether that time is the prologue,
// the last epilogue, or clusters finishing their whole items at different
// times before the tail, only a per-CTA timeline says.
//
// Three threads per CTA record events with %globaltimer (one clock for the
// whole GPU): the producer's issuing thread (role 0) and thread 0 of each
// consumer warpgroup (roles 1, 2). Each event is one 32-byte record in a
// device buffer; after the launch, the launcher synchronises, copies the
// records back and appends them as text to the file named by
// GATEDMLP_SM90_TIMELINE (launches GATEDMLP_SM90_TIMELINE_SKIP onwards,
// default 5, at most GATEDMLP_SM90_TIMELINE_MAX of them, default 4).
// scripts/timeline.py summarises the file.
//
// Caveat: even these few stores make ptxas spill in the consumers (~75 spill
// stores in the 8B kernel), and the instrumented kernel ran 2-3.5 % slower
// than the release one (docs/notes/split-tail-and-schedule.md), so its per-item and tail times are upper
// bounds; scripts/timeline.sh prints both builds' benchmark side by side.
// Each CTA records up to ~170 pieces (fixed slots, see slot_of).
#pragma once

#if defined(GATEDMLP_SM90_TIMELINE)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm90_gemm_glu/params.hpp"

namespace gatedmlp::sm90::timeline {

constexpr int kMaxCtas = 1024, kRoles = 3, kMaxEvents = 1024;

enum Point : uint16_t {
  kEntry = 1,      // role 0, first instruction
  kSynced = 2,     // role 0, past the barrier set-up's cluster barrier
  kLoad = 3,       // producer: a piece's first empty-slot wait
  kLoaded = 4,     // producer: the piece's last load issued
  kPiece = 5,      // consumer: a piece's first full-stage wait
  kFirstFull = 6,  // consumer: the piece's first stage has arrived
  kMainDone = 7,   // consumer: the piece's last wgmma retired
  kHanded = 8,     // consumer: a partial written and its flag raised
  kAdded = 9,      // consumer (owner): the lower clusters' partials added
  kEpiDone = 10,   // consumer: the epilogue's stores issued
  kDrained = 11,   // consumer: the last TMA store complete
  kExit = 12,      // every role, past the final cluster barrier
};

struct Event {
  uint64_t t;        // %globaltimer, ns
  uint32_t point_w;  // point << 16 | piece index within the CTA's schedule; 0: no event
  int32_t item;
  int32_t kb0, kb1;  // pieces' first events only (kLoad, kPiece)
  int32_t piece_role;  // kWhole, kPartial, kOwner (schedule.hpp): likewise
  int32_t pad;
};
static_assert(sizeof(Event) == 32, "one record per 32 bytes");

static __constant__ Event* g_events;  // one copy per translation unit, set by arm()

// Each event has a fixed slot, so that the recording threads keep no state
// (a pointer and a count kept live through the consumers' loop made ptxas
// spill): entry 0-1, then per piece w two producer slots or six consumer
// slots, then drained and exit last. Pieces past the slots are not recorded.
static __device__ __forceinline__ int slot_of(uint16_t point, int w) {
  if (point <= kSynced) return point - kEntry;
  if (point == kExit) return kMaxEvents - 1;
  if (point == kDrained) return kMaxEvents - 2;
  if (point <= kLoaded) return 2 + 2 * w + (point - kLoad);
  return 2 + 6 * w + (point - kPiece);
}

// The time, point, piece and item: a 16-byte store and a few instructions,
// cheap enough to sit where the accumulators are live (anything more there
// made ptxas spill).
static __device__ __forceinline__ void record(int role, uint16_t point, int w = 0, int64_t item = -1) {
  Event* base = g_events;
  const int slot = slot_of(point, w);
  if (!base || blockIdx.x >= kMaxCtas || slot >= kMaxEvents - 2 + (point >= kDrained ? 2 : 0)) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  const uint64_t info = uint64_t(uint32_t(point) << 16 | (uint32_t(w) & 0xffffu)) | uint64_t(uint32_t(item)) << 32;
  *reinterpret_cast<ulonglong2*>(base + (size_t(blockIdx.x) * kRoles + role) * kMaxEvents + slot) =
      make_ulonglong2(t, info);
}

// A piece's first event, with its k-blocks and role; called where no
// accumulator is live.
static __device__ __noinline__ void record_piece(int role, uint16_t point, int w, int64_t item, int kb0, int kb1,
                                                 int piece_role) {
  record(role, point, w, item);
  Event* base = g_events;
  const int slot = slot_of(point, w);
  if (!base || blockIdx.x >= kMaxCtas || slot >= kMaxEvents - 2) return;
  Event* e = base + (size_t(blockIdx.x) * kRoles + role) * kMaxEvents + slot;
  e->kb0 = kb0;
  e->kb1 = kb1;
  e->piece_role = piece_role;
}

struct Host {
  Event* dev = nullptr;
  int launches = 0, dumped = 0;
  FILE* out = nullptr;
};

inline Host& host() {
  static Host h;
  static bool init = false;
  if (!init) {
    init = true;
    const char* path = std::getenv("GATEDMLP_SM90_TIMELINE");
    if (!path || !*path) return h;
    if (cudaMalloc(reinterpret_cast<void**>(&h.dev), sizeof(Event) * kMaxCtas * kRoles * kMaxEvents) != cudaSuccess) {
      std::fprintf(stderr, "[timeline] no device buffer; nothing is recorded\n");
      h.dev = nullptr;
      return h;
    }
    h.out = std::fopen(path, "a");
    if (!h.out) std::fprintf(stderr, "[timeline] cannot open %s\n", path);
  }
  return h;
}

inline int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

// Before a launch: whether this one is recorded; if so, clears the records
// and points the kernel (this translation unit's g_events) at them.
static bool arm(cudaStream_t stream) {
  Host& h = host();
  Event* target = nullptr;
  const int idx = h.launches++;
  const bool on = h.dev && h.out && idx >= env_int("GATEDMLP_SM90_TIMELINE_SKIP", 5) &&
                  h.dumped < env_int("GATEDMLP_SM90_TIMELINE_MAX", 4);
  if (on) {
    cudaMemsetAsync(h.dev, 0, sizeof(Event) * kMaxCtas * kRoles * kMaxEvents, stream);
    target = h.dev;
  }
  cudaMemcpyToSymbolAsync(g_events, &target, sizeof(target), 0, cudaMemcpyHostToDevice, stream);
  return on;
}

// After a recorded launch: waits for it and appends its events, one line
// each ("ev launch cta role point w item kb0 kb1 piece_role t_ns", t from
// the launch's first event), after a line describing the launch.
static void collect(const Params& p, int ctas, int cm, cudaStream_t stream) {
  Host& h = host();
  if (cudaStreamSynchronize(stream) != cudaSuccess) return;
  const int n = ctas < kMaxCtas ? ctas : kMaxCtas;
  std::vector<Event> ev(size_t(n) * kRoles * kMaxEvents);
  if (cudaMemcpy(ev.data(), h.dev, ev.size() * sizeof(Event), cudaMemcpyDeviceToHost) != cudaSuccess) return;
  uint64_t t0 = ~uint64_t{0};
  for (const Event& e : ev)
    if (e.point_w && e.t < t0) t0 = e.t;
  const int id = h.dumped++;
  std::fprintf(h.out, "launch %d m %lld k %lld u %lld batch %d tiles %lld ctas %d cm %d k_blocks %d sk_first %lld sk_iters %lld\n",
               id, static_cast<long long>(p.m), static_cast<long long>(p.k), static_cast<long long>(p.u), p.batch,
               static_cast<long long>(p.tiles), ctas, cm, p.k_blocks, static_cast<long long>(p.sk_first),
               static_cast<long long>(p.sk_iters));
  for (int c = 0; c < n; ++c)
    for (int r = 0; r < kRoles; ++r)
      for (int i = 0; i < kMaxEvents; ++i) {
        const Event& e = ev[(size_t(c) * kRoles + r) * kMaxEvents + i];
        if (!e.point_w) continue;
        std::fprintf(h.out, "ev %d %d %d %u %u %d %d %d %d %llu\n", id, c, r, e.point_w >> 16, e.point_w & 0xffffu,
                     e.item, e.kb0, e.kb1, e.piece_role, static_cast<unsigned long long>(e.t - t0));
      }
  std::fflush(h.out);
}

}  // namespace gatedmlp::sm90::timeline

#define GATEDMLP_TL(...) ::gatedmlp::sm90::timeline::record(__VA_ARGS__)
#define GATEDMLP_TL_PIECE(...) ::gatedmlp::sm90::timeline::record_piece(__VA_ARGS__)
#else
#define GATEDMLP_TL(...) \
  do {                 \
  } while (0)
#define GATEDMLP_TL_PIECE(...) \
  do {                       \
  } while (0)
#endif
