// Hopper fast path: TMA + wgmma, warp-specialised, persistent GEMM + GLU.
//
// Tile. A CTA computes 128 rows x 128 output columns of Y, i.e. a 128 x 256
// GEMM tile: the 128 gate rows of its output columns followed by the 128 up
// rows. The copy engine gathers those rows from the layout (one box for the
// gate rows, one for the up rows; the weight tensor map is 5-D, (K, G, half,
// block, batch), so stacked, separate and interleaved-by-G weights are all a
// box at some coordinate), and shared memory always holds [gate | up] x 64.
// 128 x 256 is the largest tile whose fp32 accumulators fit two consumer
// warpgroups (128 registers each: one m64n256k16 accumulator), and it moves
// 48 KB per 64-deep k-step for 4 MFLOP, so the tensor cores, not memory, set
// the pace; four stages (192 KB) keep three k-steps of loads in flight.
// The narrow kernels (BNO = 88: 88 gate + 88 up rows, one m64n176k16 per
// k-slice, 88 accumulators, five 38 KB stages) exist for wave counts: 8B M =
// 512 is 3.39 waves of 128-column tiles on 132 SMs and 4.94 of 88-column
// ones: 0.933 of cuBLAS against 0.889 on the H200 (a standalone probe of
// the two tiles: 0.97 against 0.87; docs/notes/hopper-kernel.md, h32); dispatch.cpp picks them
// where its wave model says so. They take no
// pre-activation and need Y stored by TMA (its last 24 columns as an
// unswizzled box).
// Both consumer warpgroups work on the same tile (cooperative): a ping-pong
// schedule, each warpgroup on its own 64-row tile so that one's epilogue runs
// under the other's main loop, loads the weight tile per 64 rows and was 6 %
// slower (docs/notes/hopper-kernel.md, h10). Ping-pong with whole 128 x 88 tiles per warpgroup
// moves the narrow tile's bytes per FLOP and is 2.5-3 % faster: those
// kernels are in pingpong.cuh (h49; with 96-column tiles for G = 16 and
// 32, h56), and take every call they can; these take the rest (K > 8192:
// clusters of two; M < 128; G = 64, 128, ...; fp32 Y; a pre-activation of
// G = 2 ... 128 blocks).
//
// Warpgroups. 384 threads:
//   warpgroup 0, the producer: one thread issues the TMA loads into a 4-stage
//     ring, each stage guarded by a "full" mbarrier (TMA transaction count)
//     and an "empty" mbarrier (one arrival per consumer warp). It gives its
//     registers away (setmaxnreg 56; 40 in the promoting FP8 kernels).
//   warpgroups 1 and 2, the consumers: each takes 64 rows of the tile and runs
//     one wgmma m64n256k16 per 16-deep k-slice, so gate column c and up
//     column c of a row land in the same thread (d[i] and d[i + 64]). A stage
//     is released once the next k-step's wgmma has been issued and the one
//     reading it retired (wait_group 1). Registers: setmaxnreg 224; with the
//     producer's 56 that is the CTA's 384 x 168 (128 x 56 + 256 x 224;
//     the promoting FP8 kernels: 40 and 232).
//
// Persistence. The grid is one CTA per SM; CTAs walk the tiles with a stride
// of the grid size, in groups of p.group_m (16) row-blocks so that a wave's X rows and
// weight rows stay in L2. Above K = 8192 CTAs run in clusters of two (or
// four, as a knob) that share (multicast) the weight tile: see the kernel
// and cluster_size() in launch.cpp; below, one-CTA clusters. With an odd number of
// row-blocks, the two CTAs of a cluster take two column-blocks of the last
// row-block, each loading its tiles as a one-CTA cluster would (tile_coord
// in schedule.hpp). Producer and consumers walk the same sequence
// (schedule.hpp), so the producer starts loading the next tile while the
// consumers run the epilogue. When the tiles do not fill whole
// waves and a workspace is given, the last one to two waves are split along
// K evenly over all clusters (stream-K): pieces that end inside a tile leave
// fp32 partial sums in the workspace, and the piece with the tile's last
// k-block adds them and runs the epilogue. At K >= 16384 (clusters of two)
// the whole tiles are instead drawn from a counter as clusters come free,
// in raster groups of 4, so that the clusters sharing rows stay close in k
// whatever their drift (TicketRing; it halved 405B's DRAM reads, h59).
//
// Epilogue: epilogue.cuh (alpha, bias, the GLU, the Y and pre-activation
// stores, the split tail's partial sums). The tile and the pipelines'
// bookkeeping: tile.cuh.
//
// Edges. TMA zero-fills rows past M and U and columns past K, so partial
// tiles need no predication in the main loop; the epilogue bounds-checks.
// When M < 128, X boxes hold only M rows (rounded up to 8): boxes mostly past
// the edge cost the copy engine as much as real rows (docs/notes/hopper-kernel.md, h16). A
// consumer warpgroup whose 64 rows all lie past M skips its MMAs (h17).
#pragma once

#include <cstdint>

#include "sm90_gemm_glu/epilogue.cuh"
#include "sm90_gemm_glu/hopper.cuh"
#include "sm90_gemm_glu/params.hpp"
#include "sm90_gemm_glu/schedule.hpp"
#include "sm90_gemm_glu/tile.cuh"
#include "sm90_gemm_glu/timeline.cuh"

namespace gatedmlp::sm90 {

namespace detail_ {

// wgmma descriptors of ring stage s (shared address of the ring: `ring`):
// consumer warpgroup cw's 64 X rows, and the whole weight tile.
template <typename Tr>
__device__ __forceinline__ uint64_t desc_x(uint32_t ring, int s, int cw) {
  return desc_sw128(ring + s * Tr::kStageBytes + cw * 64 * 128);
}
template <typename Tr>
__device__ __forceinline__ uint64_t desc_w(uint32_t ring, int s) {
  return desc_sw128(ring + s * Tr::kStageBytes + Tr::kABytes);
}

// The promoting kernels' quarters (the kernel's main loop): one k-block of
// 64 weight rows into t, four m64n64k32 wgmmas, committed as one group.
// a, b: the low descriptor words (desc_lo) of the warpgroup's X rows and
// the quarter's weight rows, stepped in 32-bit warp-uniform arithmetic so
// that the sixteen descriptors of a k-block stay in uniform registers (as
// 64-bit per-thread values they cost 64 R2UR and ~70 IMAD per warp and
// k-block: h73, docs/notes/fp8.md).
__device__ __forceinline__ void quarter_fp8(float (&t)[32], uint32_t a, uint32_t b) {
  wgmma_fence();
  wgmma_quarter_fp8<true>(t, desc_from_lo(a), desc_from_lo(b));
#pragma unroll
  for (int kk = 1; kk < 4; ++kk) wgmma_quarter_fp8<false>(t, desc_from_lo(a + 2 * kk), desc_from_lo(b + 2 * kk));
  wgmma_commit();
  fence_regs(t);
}

// Quarter Q's sums times its scales (s0: the thread's row r, s1: r + 8)
// added into the tile's fp32 sums (wgmma_tile's layout: d[32 Q + i]).
template <int Q>
__device__ __forceinline__ void add_quarter(float (&d)[128], const float (&t)[32], float s0, float s1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) d[32 * Q + i] = fmaf(t[i], (i / 2) % 2 ? s1 : s0, d[32 * Q + i]);
}

}  // namespace detail_

// PRE: 1 for the kernels that store the pre-activation through TMA (a 16-bit
// pre-activation of T with 16-byte rows, U whole tiles, p.pre_tma), 0 for
// the rest, with or without a pre-activation.
// CM: CTAs per cluster along M (1, 2 or 4). The CTAs of a cluster compute CM
// consecutive row-blocks of the same columns; each loads 1/CM of the shared
// weight tile (CM = 2: the gate or the up rows; 4: half of one of them) and
// multicasts it to all, so a k-step reads 16 + 32/CM KB per CTA from L2, and
// the CTAs stay in step, which is what lets long-K problems (K = 16384: 12 MB
// of operands per tile) share their weight reads rather than each going to
// DRAM. (CM = 2, an odd row-block count: the last row-block's items have the
// two CTAs on two column-blocks, each loading its own X and weight tiles
// without multicast; the stage barriers are kept as for the other items.)
// BNO: output columns per tile, 128, or 88 for the narrow kernels (no
// pre-activation, Y by TMA, clusters of one or two: each CTA of a pair loads
// one 88-row half, where a quarter of it, 44 rows, would not start on a
// swizzle atom).
// GROUPED: a grouped (MoE prefill) call, rows sorted by expert: row unit mb
// is entry mb of p.items (params.hpp), whose rows start anywhere and end at
// their expert's last row; its weights and bias are the expert's. One-CTA
// clusters (two CTAs of a unit would need two experts' weights), 128-column
// tiles, no pre-activation, no split tail.
// T: the operands' type, bf16 or fp16, or __nv_fp8_e4m3 (FP8 calls: the
// same 128-byte rows, so 128-deep k-blocks, m64n256k32, and the scales on
// the sums in the epilogue; 128-column tiles, PRE = 0, clusters of one or
// two, no grouping).
template <typename T, int ACT, int CM, int PRE, int BNO, bool GROUPED = false, bool PROMO = false>
__global__ void __launch_bounds__(Traits::kThreads, 1) sm90_gemm_glu_kernel(const __grid_constant__ Params p) {
  static_assert(CM == 1 || CM == 2 || CM == 4, "clusters of one, two or four CTAs");
  static_assert(!GROUPED || (CM == 1 && PRE == 0 && BNO == 128), "grouped kernels: one CTA, 128 columns, no PRE");
  static_assert(BNO == 128 || (CM <= 2 && PRE == 0), "narrow kernels: clusters of one or two, no pre-activation");
  static_assert(PRE == 0 || TileTraits<BNO>::kSpareStride + 16384 <= TileTraits<BNO>::kStageBytes,
                "PRE = 1: each consumer warpgroup parks 16 KB in the held stage");
  constexpr bool kFp8 = std::is_same_v<T, __nv_fp8_e4m3>;
  static_assert(!kFp8 || (PRE == 0 && BNO == 128 && CM <= 2 && !GROUPED), "e4m3 kernels: 128 columns, PRE = 0");
  static_assert(!PROMO || kFp8, "the promoting main loop is the e4m3 kernels'");
  // Elements per 128-byte k-block row (the ring's rows are 128 bytes for
  // every type), and the wgmmas per k-block: each reads 32 bytes of a row.
  constexpr int kBK = 128 / int(sizeof(T));
  constexpr int kSlices = 4;
  // Registers per thread of the producer and of each consumer warpgroup,
  // within the CTA's 384 x 168: the promoting consumers hold two 32-register
  // k-block accumulators besides the 128 sums.
  constexpr int kProducerRegs = PROMO ? 40 : 56, kConsumerRegs = PROMO ? 232 : 224;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "more registers than the CTA holds");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = TileTraits<BNO>;
  extern __shared__ unsigned char smem_raw[];
  // Align the ring to 1024 bytes (the 128-byte swizzle repeats every 8 rows).
  // Every CTA gets the same base, so offsets agree across the cluster.
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned char* epi = smem + Tr::kStages * Tr::kStageBytes;
  float* sbias = reinterpret_cast<float*>(epi + 2 * Tr::kEpiBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(epi + 2 * Tr::kEpiBytes + Tr::kBiasBytes);
  uint64_t* empty = full + Tr::kStages;
  detail_::TicketRing<CM, Tr::kTicketSlots> tickets{
      empty + Tr::kStages, empty + Tr::kStages + Tr::kTicketSlots,
      p.tickets ? p.tickets + kTicketSlotsOffset + (blockIdx.x / CM) * Tr::kTicketSlots : nullptr};
  // Tickets only in clusters of two, what long K runs in (cluster_size()):
  // compiled into the one-CTA kernels, the ring's state made fp16 silu's
  // PRE = 1 kernel spill 384 bytes.
  const bool dyn = CM == 2 && p.tickets != nullptr;
#if defined(GATEDMLP_SM90_EXP_NO_SYNC) && !defined(GATEDMLP_SM90_EXP_NO_LOADS)
#error "GATEDMLP_SM90_EXP_NO_SYNC needs GATEDMLP_SM90_EXP_NO_LOADS: the ring is filled once and never refilled"
#endif

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const uint32_t rank = CM > 1 ? cluster_rank() : 0;
  // This cluster's work: whole items, then its share of the split tail. Each
  // role builds its own copy after setmaxnreg, so that no schedule state is
  // live across the register reallocation (it spilled there otherwise).
  const int cluster = static_cast<int>(blockIdx.x / CM), clusters = static_cast<int>(gridDim.x / CM);
  if (threadIdx.x == 0) {
    GATEDMLP_TL(0, timeline::kEntry);
    // The copy engine fetches each tensor map on first use; asked for now,
    // the fetch overlaps the set-up instead of delaying the first load.
    tma_prefetch_map(&p.tma_x);
    tma_prefetch_map(&p.tma_wg);
    tma_prefetch_map(&p.tma_wu);
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(&full[s], 1);
      // One arrival per consumer warp of every CTA whose stage s the loads
      // into this stage's slot (multicast) also fill.
      mbar_init(&empty[s], 8 * CM);
    }
    if (dyn) tickets.init();
    fence_barrier_init();
  }
  if constexpr (CM > 1) cluster_sync();
  else __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------- producer
    setmaxnreg_dec<kProducerRegs>();
    GATEDMLP_WD_MARK(watchdog::kStart, 0);
    // The promoting kernels test %tid.x afresh: a tid kept live for both
    // roles takes a register their consumers lack (it spilled: h93).
    if (PROMO ? thread_x() == 0 : tid == 0) {
      GATEDMLP_TL(0, timeline::kSynced);
      Schedule sched(p, cluster, clusters);
      if (dyn) sched.hand_out();
      uint32_t item = static_cast<uint32_t>(cluster);  // with tickets: the next whole item
      detail_::RingPos<Tr::kStages> pos;
      Work wk;
      for (int w = 0; dyn ? sched.at_dynamic(p, w, item, &wk) : sched.at(p, w, &wk); ++w) {
        // A whole item drawn (or the cluster's first): another follows it.
        const bool fed = dyn && w < sched.whole;
        uint32_t ticket = 0;
        if (fed && rank == 0) ticket = atomicAdd(p.tickets, 1u);  // needed only after this piece's loads
        const TileCoord tc = tile_coord<CM>(p, wk.item, rank);
        // A CTA past U (the last column pair when n_tiles is odd) loads the
        // last column-block's weights and ignores them, so that no box lies
        // wholly past the tensor.
        // 32-bit: n0 < U < 2^31 (the blocker checks 2U), and so is G.
        const uint32_t n0 = uint32_t(tc.nb < p.n_tiles ? tc.nb : p.n_tiles - 1) * Tr::BNO;
        const uint32_t wgrp = static_cast<uint32_t>(p.w_group);
        const int c3 = static_cast<int>(n0 / wgrp), c1 = static_cast<int>(n0 - uint32_t(c3) * wgrp);
        int xl = p.x_batched ? tc.l : 0, wl = p.w_batched ? tc.l : 0;
        int xrow = tc.mb * Tr::BM;
        if constexpr (GROUPED) {
          const int4 it = *reinterpret_cast<const int4*>(p.items + 4 * tc.mb);
          if (it.x >= it.y) continue;  // a unit past the last expert's rows (the consumers skip it too)
          xrow = it.x;
          xl = 0;
          wl = it.z;
        }
        GATEDMLP_TL_PIECE(0, timeline::kLoad, w, wk.item, wk.kb0, wk.kb1, wk.role);
        for (int kb = wk.kb0; kb < wk.kb1; ++kb, pos.next()) {
          const int s = pos.stage;
          GATEDMLP_WD_MARK(watchdog::kLoad, w, watchdog::wait_code(kb, s, pos.phase ^ 1));
#if defined(GATEDMLP_SM90_EXP_NO_SYNC)
          if (w > 0 || kb - wk.kb0 >= Tr::kStages) continue;  // (timing experiment, below)
#endif
          mbar_wait(&empty[s], pos.phase ^ 1);  // a fresh barrier passes parity 1 at once
#if defined(GATEDMLP_SM90_EXP_NO_LOADS)
          // Timing experiment only (scripts/experiments/fp8-promote-exp.sh):
          // the ring is filled once, by the first piece's first pass, and
          // every later k-block runs on what it holds: the kernel without
          // the copy engine's traffic. Y is wrong.
          if (w > 0 || kb - wk.kb0 >= Tr::kStages) {
            mbar_arrive(&full[s]);
            continue;
          }
#endif
          unsigned char* st = smem + s * Tr::kStageBytes;
          mbar_arrive_expect_tx(&full[s], p.x_rows * 128 + Tr::kBBytes);  // 128-byte X rows
          tma_load_3d(st, &p.tma_x, &full[s], kb * kBK, xrow, xl);
          if (CM == 1 || (CM == 2 && tc.pair_cols)) {
            // The whole weight tile, for this CTA alone (with column pairs
            // each CTA also loads the shared X tile itself: no multicast).
            tma_load_5d(st + Tr::kABytes, &p.tma_wg, &full[s], kb * kBK, c1, p.gate_half, c3, wl);
            tma_load_5d(st + Tr::kABytes + Tr::kBBytes / 2, &p.tma_wu, &full[s], kb * kBK, c1, p.up_half, c3, wl);
          } else {
            // This CTA's part of the weight tile: half rank / kParts (gate,
            // up), rows (rank % kParts) * 128 / kParts onwards, multicast to
            // every CTA of the cluster.
            constexpr int kParts = CM > 1 ? CM / 2 : 1;  // (CM = 1 never comes here)
            const int h = static_cast<int>(rank) / kParts, q = static_cast<int>(rank) % kParts;
            tma_load_5d_multicast(st + Tr::kABytes + h * (Tr::kBBytes / 2) + q * (Tr::kBBytes / 2 / kParts),
                                  h == 0 ? &p.tma_wg : &p.tma_wu, &full[s], (1u << CM) - 1, kb * kBK,
                                  c1 + q * p.w_part_c1, h == 0 ? p.gate_half : p.up_half, c3 + q * p.w_part_c3, wl);
          }
        }
        GATEDMLP_TL(0, timeline::kLoaded, w, wk.item);
        if (fed) {
          if (rank == 0) {
            item = static_cast<uint32_t>(clusters) + ticket;
            tickets.publish(w, item);
          } else {
            item = tickets.read(w);
            tickets.done(w, rank);
          }
        }
      }
    }
  } else {
    // ---------------------------------------------------------- consumers
    setmaxnreg_inc<kConsumerRegs>();
    GATEDMLP_WD_MARK(watchdog::kStart, wg);
    Schedule sched(p, cluster, clusters);
    if (dyn) sched.hand_out();
    uint32_t item = static_cast<uint32_t>(cluster);  // with tickets: the next whole item
    const int cw = wg - 1;  // rows 64*cw ... 64*cw + 63 of the tile
    const int lane = tid % 32;
    unsigned char* tile = epi + cw * Tr::kEpiBytes;
    if (p.y_tma && tid == 0) tma_prefetch_map(&p.tma_y);
    if (PRE == 1 && tid == 0) tma_prefetch_map(&p.tma_pre);
    if (p.x_rows < Tr::BM) {
      // X boxes of x_rows rows (M < BM): the A rows after them are never
      // loaded. Zero them once, so that the MMAs read what a full box's zero
      // fill would have given (those rows are past M and never stored).
      const int off = p.x_rows * 128, bytes = Tr::kABytes - off;  // 128-byte rows
      for (int s = 0; s < Tr::kStages; ++s)
        for (int o = (cw * 128 + tid) * 16; o < bytes; o += 256 * 16)
          *reinterpret_cast<uint4*>(smem + s * Tr::kStageBytes + off + o) = make_uint4(0u, 0u, 0u, 0u);
      fence_proxy_async();
      named_barrier(detail_::kBothBar, 256);
    }
    float d[BNO];
#pragma unroll
    for (int i = 0; i < BNO; ++i) d[i] = 0.f;
    const uint32_t ring = smem_addr(smem);
    // Frees stage s in this CTA and, with multicast, in the peer (whose
    // loads also write here).
    auto release = [&](int s) {
#if defined(GATEDMLP_SM90_EXP_NO_SYNC)
      // Timing experiment only (scripts/experiments/fp8-promote-exp.sh):
      // with NO_LOADS the ring is filled once, and the consumers wait for
      // that fill only and free nothing: the main loops without their
      // stage barriers. Y is wrong.
      return;
#endif
      if (lane != 0) return;
#if defined(GATEDMLP_SM90_WATCHDOG)
      if (watchdog::drop_release(s)) return;  // the watchdog's self-test: an arrival that never comes
#endif
      mbar_arrive(&empty[s]);
      if constexpr (CM > 1)
#pragma unroll
        for (uint32_t peer = 1; peer < CM; ++peer) mbar_arrive_cluster(&empty[s], (rank + peer) % CM);
    };
    detail_::RingPos<Tr::kStages> pos;  // as the producer's
    Work wk;
    // With tickets: after a whole item drawn, the next one from the ring.
    auto next_piece = [&](int w) {
      if (!dyn) return sched.at(p, w, &wk);
      if (w > 0 && w - 1 < sched.whole) {
        item = tickets.read(w - 1);
        __syncwarp();
        if (lane == 0) tickets.done(w - 1, rank);
      }
      return sched.at_dynamic(p, w, item, &wk);
    };
    for (int w = 0; next_piece(w); ++w) {
      TileCoord tc = tile_coord<CM>(p, wk.item, rank);
      // This warpgroup's first row, the end of its rows (M, or its expert's
      // last row + 1), and the batch of Y (grouped: tc.l is the expert, for
      // the bias).
      int64_t row0 = int64_t(tc.mb) * Tr::BM + 64 * cw, m_end = p.m;
      int yl = tc.l;
      if constexpr (GROUPED) {
        const int4 it = *reinterpret_cast<const int4*>(p.items + 4 * tc.mb);
        if (it.x >= it.y) continue;  // no rows: the producer loaded nothing for it
        row0 = int64_t(it.x) + 64 * cw;
        m_end = it.y;
        tc.l = it.z;
        yl = 0;
      }
      // A warpgroup whose 64 rows all lie past M (M <= 64, or the second half
      // of a last row-block), or whose columns lie past U (the second CTA of
      // the last pair_cols item when n_tiles is odd), only frees the stages:
      // its sums would never be stored, and its MMAs would read the shared
      // tiles for nothing.
      const bool idle = row0 >= m_end || int64_t(tc.nb) * Tr::BNO >= p.u;
      // FP8: this tile's scales, in flight during the main loop (the
      // promoting kernels load them after it: registers).
      detail_::Fp8Scales fs{};
      if constexpr (kFp8 && !PROMO)
        if (!idle && wk.role != kPartial) fs = detail_::load_fp8_scales<BNO>(p, tid, row0, int64_t(tc.nb) * Tr::BNO);
      int prev = -1;
      if constexpr (PROMO) {
        // Each 128-deep k-block summed in accumulators of its own, quarter
        // by quarter (64 weight rows, m64n64k32: gate 0-63, gate 64-127, up
        // 0-63, up 64-127), and each quarter's sums added into the fp32
        // sums times its scales: the FP8 tensor cores keep too few
        // bits to sum all of K themselves. Two 32-register accumulators in
        // turn, so that one quarter's wgmmas run while the other's sums are
        // added. Half tiles (one 64-register accumulator, a wait per half)
        // ran as fast; what cost time was the instructions around the
        // wgmmas (h71, h73, docs/notes/fp8.md). (The last quarter carried
        // into the next k-block ran no faster, h87: waited for with
        // wgmma_wait<1> there, ptxas serialized every wgmma.)
#pragma unroll
        for (int i = 0; i < BNO; ++i) d[i] = 0.f;
        // The descriptors' low words (quarter q's weight rows: 64 of 128
        // bytes on, in 16-byte units), from warp-uniform values only (cw
        // and the stage through __shfl_sync, which ptxas knows to be
        // uniform), so that they stay in uniform registers (desc_lo).
        const uint32_t x_lo = desc_lo(ring) + uint32_t(__shfl_sync(0xffffffffu, cw, 0)) * (64 * 128 >> 4);
        const uint32_t w_lo = desc_lo(ring) + (Tr::kABytes >> 4);
        constexpr uint32_t kQuarter = 64 * 128 >> 4, kStageLo = Tr::kStageBytes >> 4;
        {
          const detail_::PromoScaleRows rows =
              detail_::promo_scale_rows(p, tid, row0, int64_t(tc.nb) * Tr::BNO, idle);
          // A k-block's scales are loaded as it starts, before its stage is
          // waited for, and multiplied after its first quarters are issued:
          // they come from L1 (a line holds 32 k-blocks of a row's), so
          // their latency passes under the wait and the first wgmmas. (h73
          // loaded them a k-block ahead, in a second set of registers: the
          // loop spilled; h87, docs/notes/fp8.md.) The idle test stays
          // inside the loop: a loop of its own for idle warpgroups made
          // ptxas spill 2 KB.
          for (int kb = wk.kb0; kb < wk.kb1; ++kb, pos.next()) {
            const int s = pos.stage;
            GATEDMLP_WD_MARK(watchdog::kFull, w, watchdog::wait_code(kb, s, pos.phase));
            const detail_::PromoScaleLoads use = detail_::load_promo_scales(p, rows, kb);
#if defined(GATEDMLP_SM90_EXP_NO_SYNC)
            if (w == 0 && kb - wk.kb0 < Tr::kStages)
#endif
            mbar_wait(&full[s], pos.phase);
            if (idle) {
              release(s);
              continue;
            }
            const uint32_t su = uint32_t(__shfl_sync(0xffffffffu, s, 0));
            const uint32_t a = x_lo + su * kStageLo, b = w_lo + su * kStageLo;
            float ta[32], tb[32];
            detail_::quarter_fp8(ta, a, b);
            detail_::quarter_fp8(tb, a, b + kQuarter);
            wgmma_wait<1>();
            fence_regs(ta);
#if defined(GATEDMLP_SM90_EXP_NO_SCALES)
            // Timing experiment only (fp8-promote-exp.sh): every scale 1,
            // the loads unused. Y is wrong but for scales of 1.
            const detail_::BlockScales bs{1.f, 1.f, 1.f, 1.f};
#else
            const detail_::BlockScales bs = detail_::promo_scale_products(p, use);
#endif
            detail_::add_quarter<0>(d, ta, bs.g0, bs.g1);
            detail_::quarter_fp8(ta, a, b + 2 * kQuarter);
            wgmma_wait<1>();
            fence_regs(tb);
            detail_::add_quarter<1>(d, tb, bs.g0, bs.g1);
            detail_::quarter_fp8(tb, a, b + 3 * kQuarter);
            wgmma_wait<1>();
            fence_regs(ta);
            detail_::add_quarter<2>(d, ta, bs.u0, bs.u1);
            wgmma_wait<0>();
            fence_regs(tb);
            // The stage is read: free it before the last quarter's adds.
            release(s);
            detail_::add_quarter<3>(d, tb, bs.u0, bs.u1);
          }
        }
        // The tile's place, computed again from the item for what follows
        // rather than kept through the loop, whose sums and quarters leave
        // it no registers (ptxas spilled it: h88, docs/notes/fp8.md). The
        // empty asm hides that the item is the one the first computation
        // used. (Reading the thread's index again too made the epilogue
        // spill 400 bytes; in clusters of two the recomputation moved more
        // spills into the epilogue than it took out, so those keep theirs.)
        if constexpr (CM == 1) {
          int64_t again = wk.item;
          asm volatile("" : "+l"(again));
          tc = tile_coord<CM>(p, again, rank);
          row0 = int64_t(tc.mb) * Tr::BM + 64 * cw;
          yl = tc.l;
        }
      } else {
        // The item's first k-step, peeled: its first wgmma overwrites the
        // accumulators and says so (wgmma_tile<..., true>), so that they are
        // dead from the previous epilogue's last read of them on.
        if (wk.kb0 < wk.kb1) {  // (every piece has a k-block; the schedule tests check it)
          const int s = pos.stage;
          GATEDMLP_WD_MARK(watchdog::kFull, w, watchdog::wait_code(wk.kb0, s, pos.phase));
          if (tid == 0) GATEDMLP_TL_PIECE(wg, timeline::kPiece, w, wk.item, wk.kb0, wk.kb1, wk.role);
#if defined(GATEDMLP_SM90_EXP_NO_SYNC)
          if (w == 0)
#endif
          mbar_wait(&full[s], pos.phase);
          if (tid == 0) GATEDMLP_TL(wg, timeline::kFirstFull, w, wk.item);
          if (!idle) {
            const uint64_t da = detail_::desc_x<Tr>(ring, s, cw), db = detail_::desc_w<Tr>(ring, s);
            wgmma_fence();
            wgmma_tile<T, BNO, true>(d, da, db);
#pragma unroll
            for (int kk = 1; kk < kSlices; ++kk) wgmma_tile<T, BNO, false>(d, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            fence_regs(d);
          }
          prev = s;
          pos.next();
        }
        for (int kb = wk.kb0 + 1; kb < wk.kb1; ++kb, pos.next()) {
          const int s = pos.stage;
          GATEDMLP_WD_MARK(watchdog::kFull, w, watchdog::wait_code(kb, s, pos.phase));
#if defined(GATEDMLP_SM90_EXP_NO_SYNC)
          if (w == 0 && kb - wk.kb0 < Tr::kStages)
#endif
          mbar_wait(&full[s], pos.phase);
          if (!idle) {
            const uint64_t da = detail_::desc_x<Tr>(ring, s, cw), db = detail_::desc_w<Tr>(ring, s);
            fence_regs(d);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kSlices; ++kk) wgmma_tile<T, BNO, false>(d, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            fence_regs(d);
            // The previous k-step's wgmma has retired: its stage can be refilled.
            wgmma_wait<1>();
            fence_regs(d);
          }
          release(prev);
          prev = s;
        }
        wgmma_wait<0>();
        fence_regs(d);
      }
      if (tid == 0) GATEDMLP_TL(wg, timeline::kMainDone, w, wk.item);
      // PRE = 1: an item with an epilogue keeps its last stage until the
      // epilogue's second pre-activation round has been read from it
      // (store_pre_tma); the producer meanwhile fills the other three.
      const bool hold = PRE == 1 && prev >= 0 && wk.role != kPartial && int64_t(tc.nb) * Tr::BNO < p.u;
      if (prev >= 0 && !hold) release(prev);
      if constexpr (PROMO)
        if (!idle && wk.role != kPartial)
          fs = detail_::load_fp8_scales<BNO, true>(p, tid, row0, int64_t(tc.nb) * Tr::BNO);
      if (wk.role != kWhole) GATEDMLP_WD_MARK(watchdog::kPartial, w);
      if (wk.role == kPartial) {
        // Hand the sums to the item's owner; no epilogue here.
        // (The promoting one-CTA kernels read blockIdx.x again here: held
        // from the kernel's start, it was spilled. In clusters of two the
        // fresh read spilled more elsewhere.)
        const uint32_t cta = PROMO && CM == 1 ? block_x() : blockIdx.x;
        detail_::store_partial(p, d, detail_::partial_slot(p, cta, cw), tid, row0);
        named_barrier(1 + cw, 128);
        if (tid == 0) flag_raise(p.sk_flag + cta * 2 + cw, p.sk_token);
        if (tid == 0) GATEDMLP_TL(wg, timeline::kHanded, w, wk.item);
        continue;
      }
      if (wk.role == kOwner) {
        // Add the partials of the lower clusters that share this item (the
        // CTA of the same rank in each, the same warpgroup).
        for (int j = sched.c - 1, stop = sched.first_partial(p, wk.item); j > stop; --j) {
          if (!sched.has_share(p, j)) continue;  // no share, no partial
          const int64_t cta = j * CM + rank;
          if (tid == 0) flag_wait(p.sk_flag + cta * 2 + cw, p.sk_token);
          named_barrier(1 + cw, 128);
          detail_::add_partial(p, d, detail_::partial_slot(p, cta, cw), tid, row0);
        }
        if (tid == 0) GATEDMLP_TL(wg, timeline::kAdded, w, wk.item);
      }
      // Nothing to store (the whole CTA has no columns: both warpgroups skip
      // the epilogue and its CTA-wide barriers together).
      if (int64_t(tc.nb) * Tr::BNO >= p.u) continue;
#if defined(GATEDMLP_SM90_EXP_SKIP_EPILOGUE)
      // Timing experiment only (scripts/experiments/exp-epilogue.sh): what the epilogue
      // costs the tile loop. Y is never written.
      if (hold) release(prev);
      continue;
#endif
      GATEDMLP_WD_MARK(watchdog::kEpi, tc.mb, tc.nb);
      // The warpgroup's 16 KB of the held stage (read by the PRE = 1
      // kernels only; the others ignore it).
      unsigned char* spare = smem + (prev >= 0 ? prev : 0) * Tr::kStageBytes + cw * Tr::kSpareStride;
      // Y by TMA stores where the call's Y can take them, but for a grouped
      // unit's rows that end inside this warpgroup's 64 (the box would write
      // the next expert's rows, which another CTA owns): those go from
      // registers.
      const bool y_tma = p.y_tma && (!GROUPED || row0 + 64 <= m_end);
      detail_::epilogue<T, ACT, PRE, BNO, PROMO>(p, d, tile, spare,
                                                 CM == 1 && wk.role == kWhole && p.k_blocks >= Tr::kStages, sbias,
                                                 cw, tid, tc, row0, m_end, yl, y_tma, fs);
      if (hold) {
        // Round 1's stores (all but the Y tile's group) have read the stage.
#if !defined(GATEDMLP_SM90_EXP_PRE_NO_WAIT)
        if (tid == 0) bulk_wait_read<1>();
#endif
        named_barrier(1 + cw, 128);
        release(prev);
      }
      GATEDMLP_WD_MARK(watchdog::kStored, tc.mb, tc.nb);
      if (tid == 0) GATEDMLP_TL(wg, timeline::kEpiDone, w, wk.item);
    }
    GATEDMLP_WD_MARK(watchdog::kDrain);
    if (tid == 0) bulk_wait_all();  // the shared tile must outlive the last TMA store
    if (tid == 0) GATEDMLP_TL(wg, timeline::kDrained);
  }
  // A CTA may not exit while its peer can still multicast into it or arrive
  // on its barriers.
  GATEDMLP_WD_MARK(watchdog::kEnd);
  if constexpr (CM > 1) cluster_sync();
  GATEDMLP_WD_MARK(watchdog::kExit);
  if (tid == 0) GATEDMLP_TL(wg, timeline::kExit);
#endif
}

}  // namespace gatedmlp::sm90
