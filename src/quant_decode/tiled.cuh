// The quantized decode kernel on tiled 4-bit affine weights
// (QuantFormat::tiled; the order is quant.hpp's and quant/tiled_math.hpp's):
// the checkpoint-order kernel's lanes, dequantization, mma and epilogue
// (quant_decode.cuh), with the loads a tile-contiguous order allows.
//
// Why: on the checkpoint's arrays a warp's 16-byte word load covers 8 rows x
// 64 bytes (8 cache lines for 512 bytes) and each of its 2-byte scale and
// bias loads 8 rows' lines, so a k-block of 2 KB of words and 256 bytes of
// scales costs the L1 ~100 wavefronts where its bytes need ~18. On the tiled
// order a warp's word load is 512 contiguous bytes, and one 8-byte load per
// lane brings the scales and biases of both its rows ((scale, bias) pairs in
// one array; in two arrays, two loads, it ran 6-11 % slower at M = 1). At
// one row of X the CTA also stages X in shared memory once, instead of every
// warp loading it through L1. Measured (H200, docs/notes/quantized-decode.md
// h95): 1.12-1.23x the checkpoint-order kernel's speed at M = 1-16.
//
// A lane (g, t) of column group c reads rows g (gate) and 8 + g (up) of
// tile (c, kb) (the down projection's tile c: rows 16c + g and 16c + 8 + g,
// output columns of their own, epilogue_down): words at
// ((c * KB + kb) * 16 + h * 8 + g) * 16 + 4t, the
// two rows' (scale, bias) pairs at 8-byte word ((c * G + group) * 8 + g), G
// the padded groups per row. K is padded to whole k-blocks with zero codes,
// scales and biases, so every load of weights and scales is unpredicated; X
// is loaded under a predicate in a k-block that crosses K (or staged with
// zeros).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "decode_glu/epilogue.cuh"
#include "decode_glu/ops.cuh"
#include "quant_decode/dequant.cuh"
#include "quant_decode/params.hpp"
#include "quant_decode/quant_decode.cuh"

namespace gatedmlp::quant_decode {

// One tile: `count` rows of X (xrows / yrows: the gathered tile's rows of x
// and y, or null for 0 ... count-1) through expert `expert`'s weights (0 but
// for gathered calls: its tiles at expert * sw words, its (scale, bias)
// pairs at expert * expert_scales). Ends with a __syncthreads().
//   NT: n-tiles of 8 tokens (1 or 2); CG: groups of 8 columns per CTA;
//   XS: X (one row) staged in shared memory after the partial sums, zero
//       past K;
//   TAIL: K is not a multiple of 128, so a k-block crosses it and (X not
//       staged) loads X under a predicate. That path costs 12-19 registers
//       (ptxas), so kernels without a tail are built without it.
//   DEPTH: k-blocks each warp has requested ahead of the one it multiplies
//       (a register set of words and scales each; tiled_ahead() in
//       launch.cpp): a gathered call's 2-warp CTAs keep too few loads in
//       flight with one. With a tail, gathered kernels only
//       (tiled_max_depth_tail()).
template <typename T, int NT, int CG, bool XS, bool TAIL, int DEPTH>
__device__ __forceinline__ void tiled_tile(const Params& qp, float* red, int64_t expert, int count, const int* xrows,
                                           const int* yrows) {
  static_assert(!XS || (NT == 1 && !TAIL), "X staged for one row, padded with zeros");
  static_assert(DEPTH >= 1, "at least the k-block multiplied");
  using D = Dequant<T, kInt4, true>;
  const decode::Params& p = qp.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nw = p.warps;
  const int64_t j0 = int64_t(blockIdx.x) * decode::columns_per_cta(p) * CG;  // down: CG = 1
  const int k_blocks = int((p.k + kTiledBlockK - 1) / kTiledBlockK);
  const int whole = int(p.k / kTiledBlockK);  // k-blocks inside K: X unpredicated
  // This warp's k-blocks: warp, warp + nw, ...; the last may cross K.
  const int n = warp < k_blocks ? (k_blocks - warp + nw - 1) / nw : 0;
  const int n_whole = !TAIL ? n : warp < whole ? (whole - warp + nw - 1) / nw : 0;
  const int64_t first_group = (int64_t(warp) * kTiledBlockK + 32 * t) >> qp.group_shift;
  const int step_s = (kTiledBlockK * nw) >> qp.group_shift;  // groups per step (groups of 32-128 divide 128)

  const uint4* wp[CG];
  const uint2* sp[CG];  // (scale, bias) of rows g and 8 + g
  const int64_t groups = qp.groups / 2;  // qp.groups: the pair array's elements per row
  // Tiles of 8 columns (gate/up: u % 8 == 0) or 16 (down: u % 16 == 0; check_support).
  const int64_t last_c = p.u / decode::columns_per_cta(p) - 1;
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const int64_t c = min(int64_t(blockIdx.x) * CG + cg, last_c);  // past U: read, never stored
    wp[cg] = static_cast<const uint4*>(p.w) + expert * (p.sw / 4) + (c * k_blocks + warp) * 64 + g * 4 + t;
    sp[cg] = static_cast<const uint2*>(qp.scales) + expert * (qp.expert_scales / 4) + (c * groups + first_group) * 8 + g;
  }
  const T* xrow[NT];
  x_rows<T, NT>(p, count, xrows, g, 32 * t + warp * kTiledBlockK, xrow);
  float acc[CG][NT][4];
  decode::zero_sums(acc);
  // The k-blocks requested ahead, in turn: k-block i in set i % DEPTH.
  uint4 wa[DEPTH][CG][2];
  Scale sa[DEPTH][CG][2];
  auto load = [&](uint4(&w)[CG][2], Scale(&sc)[CG][2]) {
#pragma unroll
    for (int cg = 0; cg < CG; ++cg) {
      w[cg][0] = decode::detail_::ld_weights(wp[cg]);
      w[cg][1] = decode::detail_::ld_weights(wp[cg] + 32);
      // Row g's (scale, bias) in the low word, row 8 + g's in the high one.
      const uint2 v = __ldg(sp[cg]);
      sc[cg][0].s = __byte_perm(v.x, 0, 0x1010);
      sc[cg][0].b = __byte_perm(v.x, 0, 0x3232);
      sc[cg][1].s = __byte_perm(v.y, 0, 0x1010);
      sc[cg][1].b = __byte_perm(v.y, 0, 0x3232);
      wp[cg] += 64 * nw;
      sp[cg] += 8 * step_s;
    }
  };
  // whole_v: the k-block lies inside K (X unpredicated; staged X always is);
  // ok: this lane's elements of a crossing k-block lie inside K.
  auto multiply = [&](auto whole_v, const uint4(&cw)[CG][2], const Scale(&cs)[CG][2], bool ok) {
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      uint32_t xq[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t xr[4];
        if constexpr (XS) {
          const uint4 v = *reinterpret_cast<const uint4*>(xrow[nt] + wd * 8);
          xr[0] = v.x, xr[1] = v.y, xr[2] = v.z, xr[3] = v.w;
        } else {
          detail_::load_x<8, decltype(whole_v)::value>(xrow[nt] + wd * 8, ok, xr);
        }
        D::x_pairs(xr, xq[nt]);
      }
#pragma unroll
      for (int cg = 0; cg < CG; ++cg) {
        uint32_t ag[4], au[4];
        D::word(detail_::word_of(cw[cg][0], wd), cs[cg][0], ag);
        D::word(detail_::word_of(cw[cg][1], wd), cs[cg][1], au);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          decode::detail_::mma_16816<T>(acc[cg][nt], ag[0], au[0], ag[1], au[1], xq[nt][0], xq[nt][1]);
          decode::detail_::mma_16816<T>(acc[cg][nt], ag[2], au[2], ag[3], au[3], xq[nt][2], xq[nt][3]);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xrow[nt] += kTiledBlockK * nw;
  };

  // Software pipeline in registers: the next DEPTH k-blocks' loads in flight
  // while this one is multiplied. Only a warp's last k-block can cross K.
  // The first k-blocks' weights are requested before X is staged, so that
  // the staging's round trip passes under theirs.
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (d < n) load(wa[d], sa[d]);
  if constexpr (XS) {
    // X's row, padded with zeros to whole k-blocks, after the partial sums.
    T* xs = reinterpret_cast<T*>(reinterpret_cast<char*>(red) + decode::red_bytes<NT, CG>(nw));
    const T* x = static_cast<const T*>(p.x);
    for (int64_t i = int64_t(threadIdx.x) * 8; i < int64_t(k_blocks) * kTiledBlockK; i += int64_t(blockDim.x) * 8)
      *reinterpret_cast<uint4*>(xs + i) =
          i < p.k ? *reinterpret_cast<const uint4*>(x + i) : make_uint4(0, 0, 0, 0);  // K % 8 == 0
    __syncthreads();
    xrow[0] = xs + warp * kTiledBlockK + 32 * t;
  }

  // Unrolled by DEPTH, so that every set is named at compile time (registers).
  for (int i = 0; i < n_whole; i += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (d > 0 && i + d >= n_whole) break;
      uint4 cw[CG][2];
      Scale cs[CG][2];
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
        cw[cg][0] = wa[d][cg][0], cw[cg][1] = wa[d][cg][1], cs[cg][0] = sa[d][cg][0], cs[cg][1] = sa[d][cg][1];
      if (i + d + DEPTH < n) load(wa[d], sa[d]);
      multiply(std::true_type{}, cw, cs, true);
    }
  }
  if constexpr (TAIL)
    if (n > n_whole) {
      // The crossing k-block is the warp's k-block n_whole, in set n_whole %
      // DEPTH. Its values are selected into a set of their own: a multiply
      // per set, each named, had put the sets on the stack (ptxas: 144 bytes
      // of stack frame, no spill reported; 1.1-1.25x slower, h98).
      const int last = n_whole % DEPTH;
      uint4 cw[CG][2];
      Scale cs[CG][2];
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cw[cg][h] = wa[0][cg][h], cs[cg][h] = sa[0][cg][h];
#pragma unroll
          for (int d = 1; d < DEPTH; ++d)
            if (last == d) cw[cg][h] = wa[d][cg][h], cs[cg][h] = sa[d][cg][h];
        }
      multiply(std::false_type{}, cw, cs, int64_t(warp + n_whole * nw) * kTiledBlockK + 32 * t < p.k);
    }

  decode::store_partials<NT, CG>(red, acc);
  __syncthreads();
  decode::tile_epilogue<NT, CG>(p, red, j0, expert, count, yrows);
  __syncthreads();
}

// GATHER: the rows and experts of a gathered call (decode_glu/gather.cuh,
// one column group, X not staged); otherwise all p.m rows of the one weight.
template <typename T, int NT, int CG, bool XS, bool TAIL, bool GATHER, int DEPTH>
__global__ void __launch_bounds__(kMaxWarps * 32, NT * CG >= 8 ? 1 : 2)
    tiled_kernel(const __grid_constant__ Params qp) {
  static_assert(!GATHER || (CG == 1 && !XS), "gathered tiles: one column group, X from its rows");
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  if constexpr (GATHER) {
    __shared__ decode::GatherShared sh;
    decode::for_each_gathered_tile<NT * 8>(qp.d, sh, [&](int expert, int count, const int* xrows, const int* yrows) {
      tiled_tile<T, NT, 1, false, TAIL, DEPTH>(qp, red, expert, count, xrows, yrows);
    });
  } else {
    tiled_tile<T, NT, CG, XS, TAIL, DEPTH>(qp, red, 0, int(qp.d.m), nullptr, nullptr);
  }
}

template <typename T, int NT, int CG, bool XS, bool TAIL, bool GATHER, int DEPTH>
cudaError_t launch_tiled_kernel(Params p, cudaStream_t stream) {
  const int64_t k_blocks = (p.d.k + kTiledBlockK - 1) / kTiledBlockK;
  p.d.warps = static_cast<int>(k_blocks < p.d.warps ? k_blocks : p.d.warps);
  const int smem = decode::red_bytes<NT, CG>(p.d.warps) + (XS ? int(k_blocks * kTiledBlockK * sizeof(T)) : 0);
  // Gathered: one grid row per slot of a distinct expert, at most min(E, n).
  const int64_t slots = p.d.experts < p.d.n_indices ? p.d.experts : p.d.n_indices;
  const unsigned ys = GATHER ? static_cast<unsigned>(slots < decode::kMaxGridY ? slots : decode::kMaxGridY) : 1u;
  const int64_t cols = decode::columns_per_cta(p.d) * CG;
  const dim3 grid(static_cast<unsigned>((p.d.u + cols - 1) / cols), ys);
  tiled_kernel<T, NT, CG, XS, TAIL, GATHER, DEPTH><<<grid, p.d.warps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

// A kernel at `depth` (tiled_ahead(), at most tiled_max_depth()). Where K
// has a tail (staged X has none: it is zero past K) only gathered kernels
// go deeper than one.
template <typename T, int NT, int CG, bool XS, bool GATHER>
cudaError_t launch_tiled_depth(const Params& p, int depth, cudaStream_t stream) {
  constexpr int kMax = tiled_max_depth(NT, CG, GATHER);
  if constexpr (!XS)
    if (p.d.k % kTiledBlockK) {
      constexpr int kTail = tiled_max_depth_tail(NT, CG, GATHER);
      if constexpr (kTail >= 2)
        if (depth >= 2) return launch_tiled_kernel<T, NT, CG, false, true, GATHER, 2>(p, stream);
      return launch_tiled_kernel<T, NT, CG, false, true, GATHER, 1>(p, stream);
    }
  if constexpr (kMax >= 3)
    if (depth >= 3) return launch_tiled_kernel<T, NT, CG, XS, false, GATHER, 3>(p, stream);
  if constexpr (kMax >= 2)
    if (depth >= 2) return launch_tiled_kernel<T, NT, CG, XS, false, GATHER, 2>(p, stream);
  return launch_tiled_kernel<T, NT, CG, XS, false, GATHER, 1>(p, stream);
}

// s.nt: 1 (m <= 8) or 2 (m <= 16; a gathered call's tiles: up to 16 rows);
// s.cg: 1, or column_groups()' 2 (nt 1) or 4 (nt 2). One row of X is staged
// where it fits in shared memory.
template <typename T, int NT, int CG>
cudaError_t launch_tiled_shape(const Params& p, int depth, cudaStream_t stream) {
  if constexpr (NT == 1)
    if (tiled_stages_x(p.d.m, p.d.k, sizeof(T), false))
      return launch_tiled_depth<T, 1, CG, true, false>(p, depth, stream);
  return launch_tiled_depth<T, NT, CG, false, false>(p, depth, stream);
}

template <typename T>
cudaError_t launch_tiled(const Params& p, Shape s, cudaStream_t stream) {
  if (s.gather)
    return s.nt == 1 ? launch_tiled_depth<T, 1, 1, false, true>(p, s.depth, stream)
                     : launch_tiled_depth<T, 2, 1, false, true>(p, s.depth, stream);
  if (s.nt == 1)
    return s.cg == 2 ? launch_tiled_shape<T, 1, 2>(p, s.depth, stream) : launch_tiled_shape<T, 1, 1>(p, s.depth, stream);
  return s.cg == 4 ? launch_tiled_shape<T, 2, 4>(p, s.depth, stream) : launch_tiled_shape<T, 2, 1>(p, s.depth, stream);
}

}  // namespace gatedmlp::quant_decode
