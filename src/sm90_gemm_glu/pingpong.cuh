// Hopper fast path, ping-pong kernels: the narrow tile (128 tokens x 88
// output columns, 176 weight rows) with each consumer warpgroup running whole
// items in turn, so that one warpgroup's epilogue runs while the other's main
// loop has the tensor cores.
//
// Why. In the cooperative kernels (sm90_gemm_glu.cuh) both consumer
// warpgroups share each item, 64 rows each, and both run its epilogue at the
// same time: the tensor cores idle ~1.7 us of each ~30 us item (the narrow
// tile's timeline, docs/notes/hopper-epilogue.md). Four ways of putting epilogue work under the
// same warpgroup's main loop lost (h20, h34-h36). Here the two warpgroups
// take alternate items of the CTA's sequence, each item whole: per 16-deep
// k-slice a warpgroup issues two m64n176k16, rows 0-63 into d0 and rows
// 64-127 into d1 (176 accumulators per thread). The stage bytes per FLOP are
// those of the cooperative narrow kernel (13.2 KB per MFLOP): the earlier
// ping-pong tries (h10, h18) moved 15-19 and lost on the feed. This is the
// shape of cuBLAS's own M = 512 kernel (nvjet 176x128). A standalone probe
// (scripts/experiments/probes/wide_tile.cu, n88pp-s5) ran 2.3-4 % faster than the
// cooperative narrow kernel at 8B M = 512 ... 16384 (docs/notes/ping-pong.md, h49).
//
// Pipeline. As in the cooperative kernels: one producer thread loads X (128
// rows) and the 176 weight rows of each k-block into a 5-stage ring of 38 KB
// stages, in the items' order. A stage is read by one warpgroup (its empty
// barrier takes 4 warp arrivals). Item w's stages start w x k_blocks into the
// ring (every item runs whole: these kernels have no split tail).
//
// Turns. Item w's main loop starts once item w - 1's warpgroup has waited for
// all of its stages (turn[cw], one arrival per warp of the other warpgroup).
// That orders the two main loops on the tensor cores, and it is needed for
// correctness: an mbarrier wait names only a phase's parity, so no thread may
// wait on a full barrier more than one phase ahead of it, and item w's
// stages are k_blocks / 5 phases after item w - 2's.
//
// Epilogue (per warpgroup, 128 rows): alpha and bias, then rows 0-63 and
// 64-127 in turn through the warpgroup's one 64 x 88 Y tile and TMA stores
// (store_y_tma), the second half once the first half's stores have read the
// tile: the epilogue is hidden under the other warpgroup's main loop, so its
// length matters less than its shared memory (the ring keeps 5 stages).
//
// Pre-activation (PRE = 1; 16-bit, the input's dtype; stacked, separate, G =
// 1 or G = 8 weights in the 88-column kernels, any interleaved blocks of G =
// 1 or of 8 rows or more in the 96-column ones): per 64-row half, two rounds
// of it (the gate and the up values; or, for blocks the tile holds whole,
// the two halves of the tile's 2N interleaved columns) go through the same Y
// tile and TMA stores before Y does (store_pre_pingpong), all of it under
// the other warpgroup's main loop.
//
// What these kernels take (pingpong_blocker in launch.cpp): the narrow
// tile's calls (Y by TMA) in one-CTA clusters, M >= 128, and the
// pre-activation as above.
//
// 96 columns (N = 96: 192 weight rows, one m64n192k16 per 64 rows and
// k-slice, 192 accumulators per consumer thread, five 40 KB stages, 416
// bytes of shared memory to spare): for weights interleaved in blocks of 16
// or 32 rows. An 88-row box of those would start inside a block, which one
// TMA box cannot gather (and eleven 8-row boxes per half ran 2x slower: the
// copy engine pays per box, docs/notes/ping-pong.md h52), so they ran the cooperative
// 128-column kernels, 2-3 % behind stacked weights; with these they run at
// stacked's pace where the waves fill (8B M = 4096 and 16384: 1.034-1.042
// of cuBLAS against stacked's 1.038-1.043, h56). Blocks of 64, 128, ...
// rows: a 96-row tile starts on a multiple of 32 rows, so each weight half
// is three 32-row boxes of one block each (w_sub_boxes; h57), 7 boxes per
// stage where the others have 3. Y's columns 64-95 go as a 64 x 32 box with
// the 64-byte swizzle. Their pre-activation (h58): blocks of 16 and 32 as
// one run of 192 columns per tile; blocks of 64 and more as six 32-column
// pieces, one per weight sub-box and half. Registers: producer 24,
// consumers 240 (see PingPongTraits).
#pragma once

#include "sm90_gemm_glu/sm90_gemm_glu.cuh"

namespace gatedmlp::sm90 {

// N: 88 output columns, or 96 (blocks of 16 and 32 weight rows, which an
// 88-column tile would start inside of; see the note at the top).
template <int N_>
struct PingPongTraits {
  using Tr = TileTraits<N_>;
  static constexpr int N = Tr::BNO;  // output columns: N accumulators per 64 rows
  static constexpr int kStages = Tr::kStages;
  // Per warpgroup: one 64 x N Y tile (both halves in turn) and the tile's
  // 2 x N bias values.
  static constexpr int kEpiBytes = Tr::kEpiBytes;
  static constexpr int kBiasBytes = Tr::kBiasBytes;
  // Registers per thread: the producer warpgroup's and each consumer's.
  // setmaxnreg moves registers only within the CTA's own, 384 x 168 (the
  // 168 its launch bounds give each thread): a consumer's setmaxnreg.inc
  // waits until the producer's dec has freed enough, forever if it never
  // does (32 / 240, 256 registers short, hung). At the 88-column kernels'
  // 40 / 232 the 96-column consumers (192 accumulators) spilled 36 bytes in
  // the epilogue; at 24 / 240 nothing spills, the producer thread included.
  static constexpr int kProducerRegs = N_ == 96 ? 24 : 40;
  static constexpr int kConsumerRegs = N_ == 96 ? 240 : 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "more registers than the CTA holds");
  // full and empty per stage, and the two turn barriers.
  static constexpr int kBarBytes = (2 * kStages + 2) * 8;
  static constexpr int kSmemBytes = kStages * Tr::kStageBytes + 2 * kEpiBytes + 2 * kBiasBytes + kBarBytes + 1024;
};

namespace detail_ {

// The pre-activation of 64 rows from row0 (alpha and bias applied; stacked
// or separate weights: the gate and the up values each one run of columns),
// gate then up, each parked in the warpgroup's Y tile as Y would be and
// stored by two TMA stores (tma_pre, tma_pre_tail) into its run. The tile
// must be free on entry and is free again on return (each round waits for
// its stores to have read it: there is time for that, under the other
// warpgroup's main loop).
//
// Interleaved weights whose blocks the tile holds whole (p.pre_mode 2: G =
// 1; p.pre_mode 1: G = 8 in the 88-column kernels, 16 and 32 in the
// 96-column ones): the tile's N columns are one run of 2N pre-activation
// columns from 2 col0, in which gate and up of column j sit at
// (j / G) 2G + j % G and G further on (G = 1: side by side), the half that
// comes first at the lower. The run goes in two rounds of N columns, each
// parked unswizzled (2N-byte rows) and stored as one box (tma_pre: (2U, M,
// L), box N x 64 x 1). A thread's columns c and c + 1 (c even) stay in one
// block: G = 1 packs gate and up of both into one 8-byte store, larger G
// packs the pair of each half into a 4-byte store.
template <typename T, int N>
__device__ __forceinline__ void store_pre_pingpong(const Params& p, const float (&d)[N], unsigned char* tile,
                                                   int bar, int tid, int l, int64_t row0, int64_t col0) {
  const int warp = tid / 32, lane = tid % 32;
  constexpr int H = N / 2;  // d[i] gate, d[i + H] up
  if constexpr (N == 96) {
    if (p.w_sub_boxes) {
      // Blocks of 64, 128, ... rows (h58): each 32-column piece of the tile
      // (a weight sub-box) lies inside one block b at offset o, its gate and
      // up values at pre-activation columns 2G b + o and 2G b + G + o (the
      // half that comes first at the lower). Per half, the three pieces are
      // parked as three 64 x 32 boxes and stored each to its place.
      const bool gate_first = p.first == 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (half == 0) park_y_swizzled<0, true, T, 96, 0, true>(d, tile, warp, lane, 0.f, 0.f);
        else park_y_swizzled<0, true, T, 96, H, true>(d, tile, warp, lane, 0.f, 0.f);
        fence_proxy_async();
        named_barrier(bar, 128);
        if (tid == 0) {
          const int64_t g = p.w_group, first = (half == 0) == gate_first ? 0 : g;
          for (int j = 0; j < N / kSubBoxRows && col0 + kSubBoxRows * j < p.u; ++j) {
            const int64_t n = col0 + kSubBoxRows * j, b = n / g;
            tma_store_3d(&p.tma_pre, tile + j * (kSubBoxRows * 64 * 2), static_cast<int>(b * 2 * g + (n - b * g) + first),
                         static_cast<int>(row0), l);
          }
          bulk_commit();
          bulk_wait_read();
        }
        named_barrier(bar, 128);
      }
      return;
    }
  }
  if (p.pre_mode != 0) {
    const bool gate_first = p.first == 0;
    // Blocks of G >= 8: column c = 8 jj + 2 (lane % 4) sits in the block of
    // 8 jj, so the first half's value goes to 8 jj + (8 jj & -G) + cb.
    const int g = 1 << p.pre_log2g;
    const int cb = 2 * (lane % 4) + (gate_first ? 0 : g), du = gate_first ? g : -g;
#pragma unroll
    for (int round = 0; round < 2; ++round) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h;
        unsigned char* row = tile + r * (2 * N);
#pragma unroll
        for (int jj = 0; jj < N / 8; ++jj) {
          const int c = 8 * jj + 2 * (lane % 4);  // tile column (even)
          const int i = 4 * jj + 2 * h;
          if (p.pre_mode == 2) {
            if ((c < H) != (round == 0)) continue;
            const uint32_t lo = gate_first ? gatedmlp::detail::pack2<T>(d[i], d[i + H])
                                           : gatedmlp::detail::pack2<T>(d[i + H], d[i]);
            const uint32_t hi = gate_first ? gatedmlp::detail::pack2<T>(d[i + 1], d[i + H + 1])
                                           : gatedmlp::detail::pack2<T>(d[i + H + 1], d[i + 1]);
            *reinterpret_cast<uint2*>(row + (2 * c - N * round) * 2) = make_uint2(lo, hi);
          } else {
            const int og = 8 * jj + ((8 * jj) & -g) + cb, ou = og + du;
            if ((og < N) == (round == 0))
              *reinterpret_cast<uint32_t*>(row + (og - N * round) * 2) = gatedmlp::detail::pack2<T>(d[i], d[i + 1]);
            if ((ou < N) == (round == 0))
              *reinterpret_cast<uint32_t*>(row + (ou - N * round) * 2) =
                  gatedmlp::detail::pack2<T>(d[i + H], d[i + H + 1]);
          }
        }
      }
      fence_proxy_async();
      named_barrier(bar, 128);
      if (tid == 0) {
        const int64_t c0 = 2 * col0 + N * round;
        if (c0 < 2 * p.u) tma_store_3d(&p.tma_pre, tile, static_cast<int>(c0), static_cast<int>(row0), l);
        bulk_commit();
        bulk_wait_read();
      }
      named_barrier(bar, 128);
    }
    return;
  }
  // Stacked or separate weights (the 88-column kernels only: pingpong_blocker).
  if constexpr (N == 88) {
    const int gate_run = p.separate ? 0 : p.gate_half;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (half == 0) park_y_swizzled<0, true, T, 88, 0>(d, tile, warp, lane, 0.f, 0.f);
      else park_y_swizzled<0, true, T, 88, 44>(d, tile, warp, lane, 0.f, 0.f);
      fence_proxy_async();
      named_barrier(bar, 128);
      if (tid == 0) {
        const int run = half == 0 ? gate_run : 1 - gate_run;
        tma_store_4d(&p.tma_pre, tile, static_cast<int>(col0), run, static_cast<int>(row0), l);
        if (col0 + 64 < p.u)
          tma_store_4d(&p.tma_pre_tail, tile + 8192, static_cast<int>(col0 + 64), run, static_cast<int>(row0), l);
        bulk_commit();
        bulk_wait_read();
      }
      named_barrier(bar, 128);
    }
  }
}

// One 64-deep k-step over the item's 128 rows (X rows 0-63 at descriptor
// da0, 64-127 at da1, the 176 weight rows at db): per 16-deep slice, rows
// 0-63 into d0 and rows 64-127 into d1 (one m64n176k16 each).
// FIRST: the first slice's wgmmas overwrite the accumulators (write-only),
// for an item's first k-step, which must be straight-line code (behind a
// run-time branch ptxas serialises every wgmma: docs/notes/hopper-epilogue.md h22).
template <typename T, bool FIRST, int N>
__device__ __forceinline__ void kstep_pingpong(float (&d0)[N], float (&d1)[N], uint64_t da0, uint64_t da1,
                                               uint64_t db) {
  using Tr = typename PingPongTraits<N>::Tr;
  wgmma_tile<T, N, FIRST>(d0, da0, db);
  wgmma_tile<T, N, FIRST>(d1, da1, db);
#pragma unroll
  for (int kk = 1; kk < Tr::BK / 16; ++kk) {
    wgmma_tile<T, N, false>(d0, da0 + 2 * kk, db + 2 * kk);
    wgmma_tile<T, N, false>(d1, da1 + 2 * kk, db + 2 * kk);
  }
}

// One warpgroup's epilogue of a whole item (see the note at the top).
template <typename T, int ACT, int PRE, int N>
__device__ __forceinline__ void epilogue_pingpong(const Params& p, float (&d0)[N], float (&d1)[N],
                                                  unsigned char* tile, float* sbias, int cw, int tid,
                                                  const TileCoord& tc) {
  const int bar = 1 + cw, lane = tid % 32;
  const int64_t row0 = int64_t(tc.mb) * PingPongTraits<N>::Tr::BM, col0 = int64_t(tc.nb) * N;
  // The previous item's stores have read the tile (and every thread is past
  // its reads of sbias, which come before its last barrier).
  if (tid == 0) bulk_wait_read();
  named_barrier(bar, 128);
  if (p.has_bias) {
    load_bias<N>(p, sbias, tid, 128, tc.l, col0);
    named_barrier(bar, 128);
  }
  apply_alpha_bias(p, d0, sbias, lane);
  if constexpr (PRE == 1) store_pre_pingpong<T, N>(p, d0, tile, bar, tid, tc.l, row0, col0);
  store_y_tma<ACT, false>(p, d0, tile, bar, tid, tc.l, row0, col0, p.m);
  if (row0 + 64 >= p.m) return;  // rows 64-127 all past M: computed, never stored
  if (tid == 0) bulk_wait_read();
  named_barrier(bar, 128);
  apply_alpha_bias(p, d1, sbias, lane);
  if constexpr (PRE == 1) store_pre_pingpong<T, N>(p, d1, tile, bar, tid, tc.l, row0 + 64, col0);
  store_y_tma<ACT, false>(p, d1, tile, bar, tid, tc.l, row0 + 64, col0, p.m);
}

}  // namespace detail_

// PRE: 1 with the pre-activation output (store_pre_pingpong), 0 without.
// N: output columns per item, 88 or 96.
template <typename T, int ACT, int PRE, int N>
__global__ void __launch_bounds__(PingPongTraits<N>::Tr::kThreads, 1)
    sm90_gemm_glu_pingpong_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using PT = PingPongTraits<N>;
  using Tr = typename PT::Tr;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned char* epi = smem + PT::kStages * Tr::kStageBytes;
  float* sbias = reinterpret_cast<float*>(epi + 2 * PT::kEpiBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(epi + 2 * PT::kEpiBytes + 2 * PT::kBiasBytes);
  uint64_t* empty = full + PT::kStages;
  uint64_t* turn = empty + PT::kStages;

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const int cta = static_cast<int>(blockIdx.x), ctas = static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) {
    tma_prefetch_map(&p.tma_x);
    tma_prefetch_map(&p.tma_wg);
    tma_prefetch_map(&p.tma_wu);
    for (int s = 0; s < PT::kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4);  // one arrival per warp of the warpgroup that reads it
    }
    mbar_init(&turn[0], 4);  // one arrival per warp of the other warpgroup
    mbar_init(&turn[1], 4);
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------- producer
    setmaxnreg_dec<PT::kProducerRegs>();
    if (tid == 0) {
      detail_::RingPos<PT::kStages> pos;
      // The CTA's items cta, cta + ctas, ..., each whole (p.sk_iters is 0),
      // as the consumers' Schedule gives them: a loop of its own, which
      // leaves the 96-column producer the registers its sub-boxes need.
      const uint32_t tiles = static_cast<uint32_t>(p.tiles);
      for (uint32_t item = cta; item < tiles; item += ctas) {
        const TileCoord tc = tile_coord<1>(p, item, 0);
        // 32-bit: n0 < U < 2^31 (the blocker checks 2U), and so is G.
        const uint32_t n0 = uint32_t(tc.nb) * N;
        const uint32_t wgrp = static_cast<uint32_t>(p.w_group);
        const int c3 = static_cast<int>(n0 / wgrp), c1 = static_cast<int>(n0 - uint32_t(c3) * wgrp);
        const int xl = p.x_batched ? tc.l : 0, wl = p.w_batched ? tc.l : 0;
        // Every item whole (p.sk_iters is 0): k-blocks 0 ... k_blocks - 1, as
        // the consumers take them. (Reading wk.kb0 and kb1 instead cost the
        // 96-column producer, at 32 registers, 108 bytes of spills.)
        for (int kb = 0; kb < p.k_blocks; ++kb, pos.next()) {
          const int s = pos.stage;
          mbar_wait(&empty[s], pos.phase ^ 1);  // a fresh barrier passes parity 1 at once
          unsigned char* st = smem + s * Tr::kStageBytes;
          mbar_arrive_expect_tx(&full[s], p.x_rows * Tr::BK * 2 + Tr::kBBytes);
          tma_load_3d(st, &p.tma_x, &full[s], kb * Tr::BK, tc.mb * Tr::BM, xl);
          if (N == 96 && p.w_sub_boxes) {
            // G = 64, 128, ...: each half as kSubBoxRows-row boxes of one
            // block each, laid one after another as one box of 96 rows
            // would be (whole 1 KB swizzle atoms).
            int b1 = c1, b3 = c3;
#pragma unroll
            for (int j = 0; j < N / kSubBoxRows; ++j) {
              unsigned char* sb = st + Tr::kABytes + j * (kSubBoxRows * Tr::BK * 2);
              tma_load_5d(sb, &p.tma_wg, &full[s], kb * Tr::BK, b1, p.gate_half, b3, wl);
              tma_load_5d(sb + Tr::kBBytes / 2, &p.tma_wu, &full[s], kb * Tr::BK, b1, p.up_half, b3, wl);
              b1 += kSubBoxRows;
              if (static_cast<uint32_t>(b1) == wgrp) b1 = 0, ++b3;
            }
          } else {
            tma_load_5d(st + Tr::kABytes, &p.tma_wg, &full[s], kb * Tr::BK, c1, p.gate_half, c3, wl);
            tma_load_5d(st + Tr::kABytes + Tr::kBBytes / 2, &p.tma_wu, &full[s], kb * Tr::BK, c1, p.up_half, c3, wl);
          }
        }
      }
    }
  } else {
    // ---------------------------------------------------------- consumers
    setmaxnreg_inc<PT::kConsumerRegs>();
    const Schedule sched(p, cta, ctas);
    const int cw = wg - 1;  // takes the CTA's items cw, cw + 2, ...
    const int lane = tid % 32;
    unsigned char* tile = epi + cw * PT::kEpiBytes;
    float* bias = sbias + cw * 2 * N;
    if (tid == 0) {
      tma_prefetch_map(&p.tma_y);
      tma_prefetch_map(&p.tma_y_tail);
      if (PRE == 1) tma_prefetch_map(&p.tma_pre), tma_prefetch_map(&p.tma_pre_tail);
    }
    float d0[N], d1[N];  // rows 0-63 and 64-127 of the item
#pragma unroll
    for (int i = 0; i < N; ++i) d0[i] = d1[i] = 0.f;
    const uint32_t ring = smem_addr(smem);
    const uint32_t kbs = static_cast<uint32_t>(p.k_blocks);
    detail_::RingPos<PT::kStages> pos;
    pos.advance(uint32_t(cw) * kbs);  // warpgroup 1 starts at item 1
    auto release = [&](int s) {
      if (lane == 0) mbar_arrive(&empty[s]);
    };
    uint32_t turn_phase = 0;
    Work wk;
    for (int w = cw; sched.at(p, w, &wk); w += 2) {
      const TileCoord tc = tile_coord<1>(p, wk.item, 0);
      if (w > 0) {
        mbar_wait(&turn[cw], turn_phase);
        turn_phase ^= 1;
      }
      // The first k-step, peeled: its first wgmmas overwrite the
      // accumulators (write-only), so that they are dead from the previous
      // epilogue's last read on.
      int prev = pos.stage;
      mbar_wait(&full[prev], pos.phase);
      {
        const uint64_t da0 = detail_::desc_x<Tr>(ring, prev, 0), da1 = detail_::desc_x<Tr>(ring, prev, 1),
                       db = detail_::desc_w<Tr>(ring, prev);
        wgmma_fence();
        detail_::kstep_pingpong<T, true>(d0, d1, da0, da1, db);
        wgmma_commit();
        fence_regs(d0);
        fence_regs(d1);
      }
      pos.next();
      for (int kb = 1; kb < p.k_blocks; ++kb, pos.next()) {
        const int s = pos.stage;
        mbar_wait(&full[s], pos.phase);
        const uint64_t da0 = detail_::desc_x<Tr>(ring, s, 0), da1 = detail_::desc_x<Tr>(ring, s, 1),
                       db = detail_::desc_w<Tr>(ring, s);
        fence_regs(d0);
        fence_regs(d1);
        wgmma_fence();
        detail_::kstep_pingpong<T, false>(d0, d1, da0, da1, db);
        wgmma_commit();
        fence_regs(d0);
        fence_regs(d1);
        // The previous k-step's wgmmas have retired: their stage can be refilled.
        wgmma_wait<1>();
        fence_regs(d0);
        fence_regs(d1);
        release(prev);
        prev = s;
      }
      if (lane == 0) mbar_arrive(&turn[1 - cw]);  // every stage of this item has been waited for
      wgmma_wait<0>();
      fence_regs(d0);
      fence_regs(d1);
      release(prev);
      detail_::epilogue_pingpong<T, ACT, PRE, N>(p, d0, d1, tile, bias, cw, tid, tc);
      pos.advance(kbs);  // the other warpgroup's item
    }
    if (tid == 0) bulk_wait_all();  // the shared tile must outlive the last TMA store
  }
#endif
}

}  // namespace gatedmlp::sm90
