// Hopper fast path, ping-pong schedule: each consumer warpgroup owns whole
// tiles, and the two take turns on the tensor cores, so that one's epilogue
// runs while the other's main loop keeps them busy.
//
// Why. The cooperative kernel (sm90_gemm_glu.cuh) has both consumer
// warpgroups on one 128 x 256 GEMM tile; while they run the epilogue (about
// 5 % of a tile's time, NOTES.md h11) the tensor cores wait. An earlier
// ping-pong (h10) gave each warpgroup 64 rows x 256 columns and lost: it
// loaded the whole weight tile per 64 rows (40 KB per 2.1 MFLOP, 19 KB per
// MFLOP against the cooperative kernel's 11.4), more than each SM's path from
// L2 sustains. Here a warpgroup's tile is 128 rows x 64 output columns (64
// gate + 64 up weight rows): 16 KB of X and 16 KB of weights per 64-deep
// k-step for 2.1 MFLOP, 15.3 KB per MFLOP, near what cuBLAS's 128 x 176 tiles
// move (13.4).
//
// Warpgroups. 384 threads, as in the cooperative kernel:
//   warpgroup 0, the producer: one thread fills a 6-stage ring (32 KB per
//     stage) with the X rows and weight rows of each tile in the order the
//     consumers take them; with clusters of two, each CTA loads the gate or
//     the up rows and multicasts them to both.
//   warpgroups 1 and 2, the consumers: the CTA's i-th tile goes to warpgroup
//     i % 2. Per 16-deep k-slice it runs two m64n128k16 wgmmas (tile rows
//     0-63 and 64-127), so gate column c and up column c of a row land in
//     the same thread (d[i] and d[i + 32] of each 64-row half: 128
//     accumulator registers, as many as the cooperative kernel's). A
//     warpgroup starts its main loop only when the other has issued all of
//     its own (named barriers 4 and 5), so the ring is consumed in order and
//     no one waits on a full barrier two phases ahead.
//
// Epilogue (per warpgroup, its own 128 x 64 tile): alpha and bias in
// registers, act(g) * u rounded into a 128-byte-swizzled 16 KB shared tile,
// two 64 x 64 TMA stores left in flight. Only 16-bit Y that TMA can address,
// without a pre-activation output and without a split tail; everything else
// takes the cooperative kernel (launch.cpp decides).
#pragma once

#include "sm90_gemm_glu/sm90_gemm_glu.cuh"

namespace gatedmlp::sm90 {

struct PingTraits {
  static constexpr int BM = 128;   // rows per tile: one consumer warpgroup, two m64 halves
  static constexpr int BNO = 64;   // output columns per tile (64 gate + 64 up weight rows)
  static constexpr int BK = 64;
  static constexpr int kStages = 6;
  static constexpr int kThreads = 384;
  static constexpr int kABytes = BM * BK * 2;       // 16 KB
  static constexpr int kBBytes = 2 * BNO * BK * 2;  // 16 KB: gate rows, then up rows
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kEpiBytes = BM * BNO * 2;    // per warpgroup: two 64 x 64 boxes, rows 0-63 and 64-127
  static constexpr int kBiasBytes = 2 * BNO * 4;    // per warpgroup: gate and up bias of its columns
  static constexpr int kBarBytes = 2 * kStages * 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kEpiBytes + 2 * kBiasBytes + kBarBytes + 1024;
};

namespace detail_ {

// Named barriers 4 + cw: consumer warpgroup cw's turn on the tensor cores.
constexpr int kTurnBar = 4;

// One 64-deep k-step of a warpgroup's tile from the stage at `stage`: per
// 16-deep slice an m64n128k16 for rows 0-63 and, with BOTH, one for rows
// 64-127, on the same weight rows. Leaves the step's group in flight and
// waits for the previous one (whose stage the caller then frees).
template <typename T, bool BOTH>
__device__ __forceinline__ void mma_kstep(float (&d)[128], uint32_t stage, int kb) {
  using Tr = PingTraits;
  const uint64_t da = desc_sw128(stage), da_hi = desc_sw128(stage + 64 * 128), db = desc_sw128(stage + Tr::kABytes);
  fence_regs(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::BK / 16; ++kk) {
    const int acc = (kb > 0 || kk > 0) ? 1 : 0;
    wgmma_m64n128k16<T, 0>(d, da + 2 * kk, db + 2 * kk, acc);
    if constexpr (BOTH) wgmma_m64n128k16<T, 64>(d, da_hi + 2 * kk, db + 2 * kk, acc);
  }
  wgmma_commit();
  fence_regs(d);
  wgmma_wait<1>();
  fence_regs(d);
}

template <int ACT, typename OUT>
__device__ __forceinline__ void park_y_pingpong(const float (&d)[128], unsigned char* tile, int warp, int lane,
                                                float ca, float cl) {
#pragma unroll
  for (int blk = 0; blk < 2; ++blk)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 64 * blk + 4 * j + 2 * h;  // gate d[i], d[i+1]; up d[i+32], d[i+33]
        const int r = 16 * warp + lane / 4 + 8 * h;
        const float y0 = gatedmlp::detail::glu<float>(ACT, d[i], d[i + 32], ca, cl);
        const float y1 = gatedmlp::detail::glu<float>(ACT, d[i + 1], d[i + 33], ca, cl);
        *reinterpret_cast<uint32_t*>(tile + blk * 8192 + r * 128 + ((j ^ (lane / 4)) * 16) + (lane % 4) * 4) =
            gatedmlp::detail::pack2<OUT>(y0, y1);
      }
}

template <typename T, int ACT>
__device__ __forceinline__ void epilogue_pingpong(const Params& p, float (&d)[128], unsigned char* tile, float* sbias,
                                                  int cw, int tid, const TileCoord& tc) {
  using Tr = PingTraits;
  const int warp = tid / 32, lane = tid % 32;
  const int bar = 1 + cw;
  const int64_t row0 = int64_t(tc.mb) * Tr::BM;
  const int64_t col0 = int64_t(tc.nb) * Tr::BNO;

  // This warpgroup's previous TMA store must have read the tile (it had the
  // other warpgroup's whole main loop to do so).
  if (tid == 0) bulk_wait_read();
  named_barrier(bar, 128);
  if (p.has_bias) {
    const int half = tid / Tr::BNO;
    const int64_t j = col0 + tid % Tr::BNO;
    float b = 0.f;
    if (j < p.u) {
      const int64_t boff = int64_t(tc.l) * p.sb;
      b = (p.separate && half == 1) ? load_float(p.bias_up, p.bias_dtype, boff + j)
                                    : load_float(p.bias, p.bias_dtype, boff + pre_col(p, half, j));
    }
    sbias[tid] = b;
    named_barrier(bar, 128);
  }
  if (p.alpha != 1.f || p.has_bias) {
#pragma unroll
    for (int i = 0; i < 128; ++i) {
      float v = d[i] * p.alpha;
      // Column of d[i] in the 128-wide GEMM tile: gate 0-63, up 64-127,
      // which is also its index in sbias.
      if (p.has_bias) v += sbias[8 * ((i % 64) / 4) + 2 * (lane % 4) + (i % 2)];
      d[i] = v;
    }
  }
  if (p.out_dtype == 0) park_y_pingpong<ACT, __nv_bfloat16>(d, tile, warp, lane, p.clamp_alpha, p.clamp_limit);
  else park_y_pingpong<ACT, __half>(d, tile, warp, lane, p.clamp_alpha, p.clamp_limit);
  fence_proxy_async();
  named_barrier(bar, 128);
  if (tid == 0 && row0 < p.m) {
    tma_store_3d(&p.tma_y, tile, static_cast<int>(col0), static_cast<int>(row0), tc.l);
    if (row0 + 64 < p.m) tma_store_3d(&p.tma_y, tile + 8192, static_cast<int>(col0), static_cast<int>(row0 + 64), tc.l);
    bulk_commit();
  }
}

}  // namespace detail_

// CM: CTAs per cluster along M (1 or 2), sharing the weight rows as in the
// cooperative kernel. p describes 64-column tiles (p.n_tiles, the weight
// maps' 64-row boxes) and has no split tail (p.sk_iters = 0).
template <typename T, int ACT, int CM>
__global__ void __launch_bounds__(PingTraits::kThreads, 1) sm90_pingpong_kernel(const __grid_constant__ Params p) {
  static_assert(CM == 1 || CM == 2, "clusters of one or two CTAs");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = PingTraits;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned char* epi = smem + Tr::kStages * Tr::kStageBytes;
  float* sbias = reinterpret_cast<float*>(epi + 2 * Tr::kEpiBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(epi + 2 * Tr::kEpiBytes + 2 * Tr::kBiasBytes);
  uint64_t* empty = full + Tr::kStages;

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const uint32_t rank = CM > 1 ? cluster_rank() : 0;
  const int cluster = static_cast<int>(blockIdx.x / CM), clusters = static_cast<int>(gridDim.x / CM);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(&full[s], 1);
      // One arrival per warp of the consuming warpgroup, in every CTA the
      // stage's multicast loads fill.
      mbar_init(&empty[s], 4 * CM);
    }
    fence_barrier_init();
  }
  if constexpr (CM > 1) cluster_sync();
  else __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------- producer
    setmaxnreg_dec<56>();
    if (tid == 0) {
      const Schedule sched(p, cluster, clusters);
      tma_prefetch_map(&p.tma_x);
      tma_prefetch_map(&p.tma_wg);
      tma_prefetch_map(&p.tma_wu);
      uint32_t it = 0;
      Work wk;
      for (int w = 0; sched.at(p, w, &wk); ++w) {
        const detail_::TileCoord tc = detail_::tile_coord<CM>(p, wk.item, rank);
        const int64_t n0 = int64_t(tc.nb) * Tr::BNO;
        const int c1 = static_cast<int>(n0 % p.w_group), c3 = static_cast<int>(n0 / p.w_group);
        const int xl = p.x_batched ? tc.l : 0, wl = p.w_batched ? tc.l : 0;
        for (int kb = 0; kb < p.k_blocks; ++kb, ++it) {
          const int s = it % Tr::kStages;
          mbar_wait(&empty[s], ((it / Tr::kStages) & 1) ^ 1);
          unsigned char* st = smem + s * Tr::kStageBytes;
          mbar_arrive_expect_tx(&full[s], p.x_rows * Tr::BK * 2 + Tr::kBBytes);
          tma_load_3d(st, &p.tma_x, &full[s], kb * Tr::BK, tc.mb * Tr::BM, xl);
          if constexpr (CM == 1) {
            tma_load_5d(st + Tr::kABytes, &p.tma_wg, &full[s], kb * Tr::BK, c1, p.gate_half, c3, wl);
            tma_load_5d(st + Tr::kABytes + Tr::kBBytes / 2, &p.tma_wu, &full[s], kb * Tr::BK, c1, p.up_half, c3, wl);
          } else {
            // Rank 0 loads the gate rows, rank 1 the up rows, for both.
            const int h = static_cast<int>(rank);
            tma_load_5d_multicast(st + Tr::kABytes + h * (Tr::kBBytes / 2), h == 0 ? &p.tma_wg : &p.tma_wu, &full[s],
                                  (1u << CM) - 1, kb * Tr::BK, c1, h == 0 ? p.gate_half : p.up_half, c3, wl);
          }
        }
      }
    }
  } else {
    // ---------------------------------------------------------- consumers
    setmaxnreg_inc<224>();
    const Schedule sched(p, cluster, clusters);
    const int cw = wg - 1;
    const int lane = tid % 32;
    unsigned char* tile = epi + cw * Tr::kEpiBytes;
    float* wbias = sbias + cw * 2 * Tr::BNO;
    if (tid == 0) tma_prefetch_map(&p.tma_y);
    if (p.x_rows < Tr::BM) {
      // As in the cooperative kernel: the A rows no X box fills, zeroed once.
      const int off = p.x_rows * Tr::BK * 2, bytes = Tr::kABytes - off;
      for (int s = 0; s < Tr::kStages; ++s)
        for (int o = (cw * 128 + tid) * 16; o < bytes; o += 256 * 16)
          *reinterpret_cast<uint4*>(smem + s * Tr::kStageBytes + off + o) = make_uint4(0u, 0u, 0u, 0u);
      fence_proxy_async();
      named_barrier(detail_::kBothBar, 256);
    }
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    const uint32_t ring = smem_addr(smem);
    auto release = [&](int s) {
      if (lane != 0) return;
      mbar_arrive(&empty[s]);
      if constexpr (CM > 1) mbar_arrive_cluster(&empty[s], rank ^ 1u);
    };
    const int count = sched.count();
    Work wk;
    for (int w = cw; w < count; w += 2) {
      sched.at(p, w, &wk);
      const detail_::TileCoord tc = detail_::tile_coord<CM>(p, wk.item, rank);
      const int64_t row0 = int64_t(tc.mb) * Tr::BM;
      // Rows past M: a tile wholly past it only frees its stages; one whose
      // second half is, runs only the first half's MMAs.
      const bool idle = row0 >= p.m, lo_only = row0 + 64 >= p.m;
      if (w > 0) named_barrier(detail_::kTurnBar + cw, 256);  // the other has issued its main loop
      uint32_t it = uint32_t(w) * uint32_t(p.k_blocks);
      int prev = -1;
      for (int kb = 0; kb < p.k_blocks; ++kb, ++it) {
        const int s = it % Tr::kStages;
        mbar_wait(&full[s], (it / Tr::kStages) & 1);
        // Each variant whole within its branch: a branch between the wgmmas
        // of one k-step makes ptxas serialise them (warning C7520).
        if (!idle) {
          if (lo_only) detail_::mma_kstep<T, false>(d, ring + s * Tr::kStageBytes, kb);
          else detail_::mma_kstep<T, true>(d, ring + s * Tr::kStageBytes, kb);
        }
        if (prev >= 0) release(prev);
        prev = s;
      }
      // The other warpgroup's turn: every stage of this tile has been
      // waited for, so its waits are on the ring's next fills.
      if (w + 1 < count) named_barrier_arrive(detail_::kTurnBar + (1 - cw), 256);
      wgmma_wait<0>();
      fence_regs(d);
      if (prev >= 0) release(prev);
#if defined(GATEDMLP_SM90_EXP_SKIP_EPILOGUE)
      continue;
#endif
      detail_::epilogue_pingpong<T, ACT>(p, d, tile, wbias, cw, tid, tc);
    }
    if (tid == 0) bulk_wait_all();
  }
  if constexpr (CM > 1) cluster_sync();
#endif
}

}  // namespace gatedmlp::sm90
