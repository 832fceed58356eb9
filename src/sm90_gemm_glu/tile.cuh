// The Hopper kernels' tile and the bookkeeping of their pipelines: TileTraits
// (the tile shapes and the shared-memory plan), the named barriers, the ring
// position and the ticket ring. The kernel is described in sm90_gemm_glu.cuh;
// the ping-pong kernels (pingpong.cuh) use the same pieces.
#pragma once

#include <cstdint>

#include "sm90_gemm_glu/hopper.cuh"
#include "sm90_gemm_glu/params.hpp"

namespace gatedmlp::sm90 {

// The tile of the kernels with BNO_ output columns per tile: 128 (the
// default), 88 (the narrow kernels; see the note at the top), or 96 (the
// ping-pong kernels for blocks of 16 and 32 rows: pingpong.cuh).
template <int BNO_>
struct TileTraits {
  static_assert(BNO_ == 128 || BNO_ == 88 || BNO_ == 96, "tiles of 128, 88 or 96 output columns");
  static constexpr int BM = 128;    // rows per tile (two consumer warpgroups x 64)
  static constexpr int BNO = BNO_;  // output columns per tile
  static constexpr int BK = 64;     // one 128-byte swizzled row of 16-bit elements
  // 88 or 96 columns: 38 or 40 KB stages, five fit.
  static constexpr int kStages = BNO_ == 128 ? 4 : 5;
  static constexpr int kThreads = 384;
  static constexpr int kABytes = BM * BK * 2;          // 16 KB
  static constexpr int kBBytes = 2 * BNO * BK * 2;     // 32 KB (22, 24 KB): gate rows, then up rows
  // The up rows start on a swizzle atom (8 rows of 128 bytes), as the
  // descriptor of the whole [gate | up] tile assumes.
  static_assert(BNO * BK * 2 % 1024 == 0, "the up rows must start on a 1024-byte boundary");
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kChunk = 32;                    // generic epilogue: columns per pass
  static constexpr int kStageLd = kChunk + 8;          // padded: conflict-free float2 writes
  // Per consumer warpgroup: its 64 x BNO Y tile in 16-bit, as 64 x 64 boxes
  // with the 128-byte swizzle (what the TMA store reads; BNO = 88: one, then
  // a 64 x 24 box without swizzle, 48-byte rows; BNO = 96: one, then a 64 x
  // 32 box with the 64-byte swizzle, 64-byte rows). The generic epilogue (BNO
  // = 128 only) reuses the same bytes for a 64 x 32 fp32 chunk.
  static constexpr int kEpiBytes = 64 * BNO * 2;
  static_assert(64 * kStageLd * 4 <= kEpiBytes, "the fp32 chunk must fit the Y tile's bytes");
  static constexpr int kBiasBytes = 2 * BNO * 4;       // gate and up bias of the tile's columns, shared
  // PRE = 1: consumer warpgroup cw parks a 16 KB pre-activation round at cw
  // * kSpareStride in the held ring stage (store_pre_tma), on 1024-byte
  // boundaries (the 128-byte swizzle's period).
  static constexpr int kSpareStride = 24 * 1024;
  static constexpr int kBarBytes = 2 * kStages * 8;
  // The ticket ring (detail_::TicketRing): per slot two mbarriers.
  static constexpr int kTicketSlots = kTicketRingSlots;
  static constexpr int kTicketBytes = kTicketSlots * 2 * 8;
  // +1024: the dynamic shared memory base is aligned up to 1024 bytes, which
  // the 128-byte swizzle needs.
  static constexpr int kSmemBytes =
      kStages * kStageBytes + 2 * kEpiBytes + kBiasBytes + kBarBytes + kTicketBytes + 1024;
};
using Traits = TileTraits<128>;

namespace detail_ {

// Named barriers: 1 + cw for consumer warpgroup cw alone, kBothBar for both;
// kParkBar + cw: the other warpgroup's wgmmas no longer read the held stage
// (PRE = 1, store_pre_tma), so cw may park in it.
constexpr int kBothBar = 3;
constexpr int kParkBar = 4;

// A position in the ring of STAGES stages: the stage, and the parity of the
// pass through the ring, which the stage's barriers are waited on with. The
// producer and the consumers advance one each per k-block, in the same
// order. Counted rather than divided out of a k-block count: with 5 stages
// that division sat on every k-step and cost the narrow kernels ~7 %
// (docs/notes/hopper-kernel.md, h32).
template <int STAGES>
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == STAGES) stage = 0, phase ^= 1;
  }
  // n positions on at once (the ping-pong kernels skip the other
  // warpgroup's item); STAGES is a constant, so no division is a call.
  __device__ __forceinline__ void advance(uint32_t n) {
    uint32_t s = uint32_t(stage) + n % STAGES, passes = n / STAGES;
    if (s >= STAGES) s -= STAGES, ++passes;
    stage = static_cast<int>(s);
    phase ^= passes & 1u;
  }
};

// Whole items handed out at run time (p.tickets). In a persistent kernel
// that gives cluster c items c, c + C, c + 2C, ..., the clusters drift apart
// over a long K, and the CTAs that read the same X or weight rows do so at
// k-blocks too far apart for L2 to keep them: 405B M = 4096 read 47 GB from
// DRAM for 3.6 GB of operands. Drawn from a counter as each cluster comes
// free, consecutive items start close together whatever the drift, and with
// a narrow raster group the CTAs that share rows run close behind each other
// (docs/notes/split-tail-and-schedule.md, h59).
//
// The cluster's leader (rank 0's producer) draws the item that follows piece
// n when it starts loading piece n, and publishes it in slot n % kSlots of
// the cluster's slots in the workspace once it has issued piece n's loads,
// arriving on that slot's full barrier in every CTA of the cluster (release,
// cluster scope). Every other reader (each consumer warp of every CTA, the
// other CTAs' producers) waits on the full barrier in its own CTA (acquire,
// cluster scope), reads the slot, and arrives on the leader's empty barrier,
// which the leader waits on before it writes the slot again kSlots pieces on.
// Readers take the slots in order and the leader writes them in order, so no
// reader waits on a parity two phases ahead. The slots are in global memory,
// not in shared memory: racecheck, which does not follow this cluster-scope
// hand-over, flagged every read of a shared-memory slot as a race against
// its write (docs/notes/split-tail-and-schedule.md, h59).
template <int CM, int kSlots>
struct TicketRing {
  static constexpr int kReaders = 8 * CM + (CM - 1);
  uint64_t* full;   // [kSlots], one arrival: the leader's
  uint64_t* empty;  // [kSlots], kReaders arrivals; only the leader's CTA's are used
  uint32_t* item;   // [kSlots], this cluster's slots in the workspace

  __device__ __forceinline__ void init() {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kReaders);
    }
  }
  // The leader: `next` follows piece n.
  __device__ __forceinline__ void publish(int n, uint32_t next) {
    const int s = n % kSlots;
    mbar_wait<(CM > 1)>(&empty[s], ((n / kSlots) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
    asm volatile("st.relaxed.cluster.global.u32 [%0], %1;" ::"l"(&item[s]), "r"(next) : "memory");
    if constexpr (CM > 1)
#pragma unroll
      for (uint32_t r = 1; r < CM; ++r) mbar_arrive_cluster<true>(&full[s], r);
    mbar_arrive(&full[s]);
  }
  // Every other reader: the item that follows piece n.
  __device__ __forceinline__ uint32_t read(int n) {
    const int s = n % kSlots;
    mbar_wait<(CM > 1)>(&full[s], (n / kSlots) & 1);
    uint32_t v;
    asm volatile("ld.relaxed.cluster.global.u32 %0, [%1];" : "=r"(v) : "l"(&item[s]) : "memory");
    return v;
  }
  // Once per reader (a warp after __syncwarp, or a producer thread), after read(n).
  __device__ __forceinline__ void done(int n, uint32_t rank) {
    const int s = n % kSlots;
    if (CM == 1 || rank == 0)
      mbar_arrive(&empty[s]);
    else
      mbar_arrive_cluster<true>(&empty[s], 0);
  }
};

}  // namespace detail_

}  // namespace gatedmlp::sm90
