// The decode kernel: gate/up GEMM + GLU for a few rows of X (M <= 16), where
// a call is bound by streaming the 2U x K weights from memory once.
//
// Swap AB. The tensor-core op is mma.m16n8k16 with the WEIGHTS as the
// 16-row A operand and the tokens as the 8-column B operand: rows 0-7 of A
// are the gate rows of 8 output columns j0 ... j0+7, rows 8-15 the up rows of
// the same columns, and the n = 8 columns are 8 tokens (two n-tiles for
// M <= 16). In the C fragment lane (g, t) = (lane / 4, lane % 4) then holds
// c0, c1 = gate of column j0+g for tokens 2t, 2t+1 and c2, c3 = up of the
// same column and tokens: gate and up of an output meet in one thread.
//
// No shared memory on the way in. A dot product does not care about the
// order of k, so each lane loads 16 bytes (8 consecutive k) of its gate row
// and of its up row at k0 + 8t of every 32-k chunk, straight from global
// memory into registers, and feeds elements 0-3 to the chunk's first k16
// step and 4-7 to the second. Logical k 2t+i of step s (A's a0/a1 and B's b0)
// is physical k0 + 8t + 4s + i, logical 2t+8+i (a2/a3, b1) is physical
// k0 + 8t + 4s + 2 + i: a bijection of the chunk's 32 k. B (X) follows the
// same map, so a lane loads 16 bytes of its token g at k0 + 8t too. The
// weights bypass L1 (read once: ld.global.nc.L1::no_allocate); X, tiny and
// read by every CTA, is loaded through L1 (ld.global.nc) and hits there or
// in L2.
//
// Every layout costs the same: each lane computes once where its two rows
// live (separate tensors, fused stacked, interleaved by any G, either half
// first; rows K-contiguous with any ld), then walks them along K.
//
// The down projection (Params::down) is the same loop over one weight: A's
// rows 0-7 and 8-15 are output columns j0 ... j0+15, so a CTA owns 16
// columns, and epilogue_down writes each C element as an output (alpha,
// bias; no activation).
//
// A gathered call (Params::indices, gather.cuh: MoE experts chosen per row
// on the device) runs the same tile on expert e's weights for the rows that
// chose e: grid row y is the y-th distinct expert, and the tile's rows of X
// and Y come from a row map in shared memory.
//
// Work split: a CTA owns CG groups of 8 output columns (16*CG weight rows;
// CG = 1 in every instantiation) over the whole of K. K is cut into
// k-blocks of UNROLL chunks (UNROLL KB of weights per group); the CTA's
// warps (one per k-block, at most 8) take k-blocks in turn, each issuing all
// of a k-block's loads before its mma, then the warps' partial C fragments
// are summed through shared memory in a fixed order (deterministic: no
// atomics) and the CTA's threads run the epilogue, one output each: bias,
// alpha, activation, pre-activation, Y.
//
// Why loads into registers and no pipeline: a call moves its weights once,
// so what counts is bytes in flight per SM (~30 KB cover the latency at
// 3 TB/s) and, for the small shapes whose whole grid fits on the SMs at
// once, that every CTA is resident from the start. 3 CTAs of 8 warps with
// 4 KB each in flight give 96 KB per SM. A variant streaming the weights
// through a 3-deep cp.async ring in shared memory per warp (fewer
// registers, more warps) measured 2-20 % slower at every shape (H100), and
// more weight rows per CTA (CG = 2, halving X's traffic) or 8 chunks per
// warp slower too.
//
// Rows past U (the last group of an odd U) and tokens past M read a valid
// row (U-1, M-1) instead of being predicated: their results are computed and
// never stored. The weights' loads are predicated (zero-filled) only in a
// k-block that crosses K; X's always (it costs a compare per chunk).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "common/layout_math.hpp"
#include "decode_glu/epilogue.cuh"
#include "decode_glu/gather.cuh"
#include "decode_glu/ops.cuh"
#include "decode_glu/params.hpp"

namespace gatedmlp::decode {


// One tile: this CTA's columns from j0 over all of K for `count` rows of X,
// then the epilogue. l: the batch, or the expert (gathered); xrows / yrows:
// the tile's rows of x and y (gathered, shared memory), or null for rows
// 0 ... count-1 of batch l. Ends with a __syncthreads(): the next tile
// overwrites the partial sums (and the row map).
template <typename T, int NT, int CG, int UNROLL>
__device__ __forceinline__ void decode_tile(const Params& p, float* red, int64_t j0, int64_t l, int count,
                                            const int* xrows, const int* yrows) {
  using namespace detail_;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kBlockK = 32 * UNROLL;
  const int64_t k_blocks = (p.k + kBlockK - 1) / kBlockK;

  // This lane's rows: the gate and up rows of column j0 + 8 cg + g (U-1
  // past U), and token nt*8 + g of X (the last row past count), at k = 8t.
  const T* wrow[CG][2];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const int64_t j = min(j0 + cg * 8 + g, p.u - 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T* base = static_cast<const T*>(p.separate && h ? p.w_up : p.w);
      // 32-bit: blocker() keeps 2U below 2^31. Down: rows j0+g and j0+8+g (U-1 past U).
      const uint32_t row = p.down       ? uint32_t(min(j0 + cg * 16 + h * 8 + g, p.u - 1))
                           : p.separate ? uint32_t(j)
                                        : gatedmlp::detail::fused_row<uint32_t>(uint32_t(j), h, uint32_t(p.group), p.first);
      wrow[cg][h] = base + l * p.sw + int64_t(row) * p.ldw + 8 * t;
    }
  }
  const T* xrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int mm = min(nt * 8 + g, count - 1);
    xrow[nt] = static_cast<const T*>(p.x) + l * p.sx + int64_t(xrows ? xrows[mm] : mm) * p.ldx + 8 * t;
  }

  float acc[CG][NT][4];
  zero_sums(acc);

  for (int64_t kb = warp; kb < k_blocks; kb += p.warps) {
    const int64_t k0 = kb * kBlockK;
    // The weights first: the long-latency loads, all of the k-block's in
    // flight together. In the K tail (K is a multiple of 8) pieces past K
    // are zero-filled, in X too.
    uint4 wa[UNROLL][CG][2];
    if (k0 + kBlockK <= p.k) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int cg = 0; cg < CG; ++cg)
#pragma unroll
          for (int h = 0; h < 2; ++h) wa[u][cg][h] = ld_weights(wrow[cg][h] + k0 + u * 32);
    } else {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int cg = 0; cg < CG; ++cg)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wa[u][cg][h] = ld_weights_if(wrow[cg][h] + k0 + u * 32, k0 + u * 32 + 8 * t < p.k);
    }
    // X, 16 bytes per n-tile and chunk (an L1 or L2 hit), loaded after the
    // weights so that its latency hides under theirs.
    uint4 xb[UNROLL][NT];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xb[u][nt] = ld_x_if(xrow[nt] + k0 + u * 32, k0 + u * 32 + 8 * t < p.k);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const uint4(&xu)[NT] = xb[u];
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // Step 0: elements 0-3 of each 16-byte piece; step 1: 4-7.
          mma_16816<T>(acc[cg][nt], wa[u][cg][0].x, wa[u][cg][1].x, wa[u][cg][0].y, wa[u][cg][1].y, xu[nt].x,
                       xu[nt].y);
          mma_16816<T>(acc[cg][nt], wa[u][cg][0].z, wa[u][cg][1].z, wa[u][cg][0].w, wa[u][cg][1].w, xu[nt].z,
                       xu[nt].w);
        }
    }
  }

  store_partials<NT, CG>(red, acc);
  __syncthreads();
  tile_epilogue<NT, CG>(p, red, j0, l, count, yrows);
  __syncthreads();
}

// GATHER: the rows and experts of a gathered call (gather.cuh); otherwise
// batch l of gridDim.y's, all p.m rows.
template <typename T, int NT, int CG, int UNROLL, int MINB, bool GATHER>
__global__ void __launch_bounds__(kMaxWarps * 32, MINB) decode_glu_kernel(const __grid_constant__ Params p) {
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  const int64_t j0 = int64_t(blockIdx.x) * (p.down ? 16 * CG : 8 * CG);
  if constexpr (GATHER) {
    __shared__ GatherShared sh;
    for_each_gathered_tile<NT * 8>(p, sh, [&](int expert, int count, const int* xrows, const int* yrows) {
      decode_tile<T, NT, CG, UNROLL>(p, red, j0, expert, count, xrows, yrows);
    });
  } else {
    for (int l = blockIdx.y; l < p.batch; l += gridDim.y) decode_tile<T, NT, CG, UNROLL>(p, red, j0, l, p.m, nullptr, nullptr);
  }
}

// Launches decode_glu_kernel<...> with p.warps warps per CTA (0: one per
// k-block, at most kMaxWarps).
template <typename T, int NT, int CG, int UNROLL, int MINB, bool GATHER = false>
cudaError_t launch_kernel(Params p, cudaStream_t stream) {
  if (p.warps == 0) p.warps = warps_for(p.k, UNROLL);
  const int64_t cols = columns_per_cta(p) * CG;
  // Gathered: one grid row per slot of a distinct expert, at most min(E, n).
  const int64_t ys = GATHER ? (p.experts < p.n_indices ? p.experts : p.n_indices) : p.batch;
  const dim3 grid(static_cast<unsigned>((p.u + cols - 1) / cols),
                  static_cast<unsigned>(ys < kMaxGridY ? ys : kMaxGridY));
  decode_glu_kernel<T, NT, CG, UNROLL, MINB, GATHER><<<grid, p.warps * 32, red_bytes<NT, CG>(p.warps), stream>>>(p);
  return cudaGetLastError();
}

// The three instantiations per dtype (Shape, params.hpp), none spilling:
//  m <= 8:  4 chunks (4 KB of weights) per warp in flight, <= 80 registers:
//           3 CTAs of 8 warps per SM.
//  m <= 16, grids that fit in one wave at 3 CTAs per SM: 3 chunks, <= 80
//           registers (X of two n-tiles costs 16 registers more per chunk).
//  m <= 16, bigger grids: 4 chunks, 2 CTAs per SM (~112 registers): fewer
//           warps but more bytes in flight each, and whole waves matter less.
// Measured on an H100 in CUDA-graph replay (launch.cpp has the numbers).
// Warps per CTA: one per k-block (at most 8), or fewer where that lets the
// whole grid be resident at once (launch.cpp, warps_per_cta).
template <typename T>
cudaError_t launch_any(const Params& p, Shape s, cudaStream_t stream) {
  // Gathered: the m <= 8 shape and the bigger grids' m <= 16 one.
  if (s.gather) return s.nt == 1 ? launch_kernel<T, 1, 1, 4, 3, true>(p, stream) : launch_kernel<T, 2, 1, 4, 2, true>(p, stream);
  if (s.nt == 1) return launch_kernel<T, 1, 1, 4, 3>(p, stream);
  if (s.one_wave) return launch_kernel<T, 2, 1, 3, 3>(p, stream);
  return launch_kernel<T, 2, 1, 4, 2>(p, stream);
}

}  // namespace gatedmlp::decode
