// The decode kernels' second half, shared by the 16-bit (decode_glu.cuh) and
// the quantized (quant_decode/) weight streams: the warps' partial C
// fragments summed through shared memory in a fixed order (deterministic: no
// atomics), then one output per thread: alpha, bias, pre-activation,
// activation, Y.
//
// Fragment layout (mma.m16n8k16, swap AB): C rows 0-7 are the gate rows of
// the CTA's 8 columns of a group, rows 8-15 their up rows; C's 8 columns are
// tokens. Lane (g, t) holds c0, c1 = gate of column g for tokens 2t, 2t+1
// and c2, c3 = up of the same column and tokens.
#pragma once

#include <cstdint>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "common/layout_math.hpp"
#include "decode_glu/params.hpp"

namespace gatedmlp::decode {

// Column of the pre-activation output (and index into a fused bias) that
// holds logical (half, j): the weight row for fused weights, [gate | up]
// for separate ones (gatedmlp.hpp).
__device__ __forceinline__ int64_t pre_col(const Params& p, int half, int64_t j) {
  if (p.separate) return half == 0 ? j : p.u + j;
  return gatedmlp::detail::fused_row(j, half, p.group, p.first);
}

// Dynamic shared memory: the warps' partial C fragments, [warps][CG][NT][4][32] floats.
template <int NT, int CG>
GATEDMLP_HD constexpr int red_bytes(int warps) {
  return warps * CG * NT * 4 * 32 * 4;
}

// A warp's sums, [CG][NT][4] (or any such array), set to zero.
template <int CG, int NT>
__device__ __forceinline__ void zero_sums(float (&acc)[CG][NT][4]) {
#pragma unroll
  for (int cg = 0; cg < CG; ++cg)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[cg][nt][r] = 0.f;
}

// This warp's partial sums into `red`, [warp][cg][nt][reg][lane]: each store
// is 32 consecutive floats. The caller synchronises before epilogue().
template <int NT, int CG>
__device__ __forceinline__ void store_partials(float* red, const float (&acc)[CG][NT][4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* mine = red + warp * (CG * NT * 128);
#pragma unroll
  for (int cg = 0; cg < CG; ++cg)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) mine[((cg * NT + nt) * 4 + r) * 32 + lane] = acc[cg][nt][r];
}

// One output from its gate and up sums, every option: alpha, bias,
// pre-activation, activation, Y (batch l, output row `row`, column j). Out
// of line: see finish().
inline __device__ __noinline__ void finish_any(const Params& p, float gs, float us, int64_t j, int64_t l, int64_t row) {
  float gv = gs * p.alpha, uv = us * p.alpha;
  if (p.has_bias) {
    const int64_t boff = int64_t(l) * p.sb;
    gv += gatedmlp::detail::load_float(p.bias, p.bias_dtype, boff + pre_col(p, 0, j));  // separate: j
    uv += p.separate ? gatedmlp::detail::load_float(p.bias_up, p.bias_dtype, boff + j)
                     : gatedmlp::detail::load_float(p.bias, p.bias_dtype, boff + pre_col(p, 1, j));
  }
  if (p.has_pre) {
    const int64_t base = l * p.spre + row * p.ldpre;
    gatedmlp::detail::store_float(p.pre, p.pre_dtype, base + pre_col(p, 0, j), gv);
    gatedmlp::detail::store_float(p.pre, p.pre_dtype, base + pre_col(p, 1, j), uv);
  }
  // 16-bit Y: the one-MUFU tanh form of the activation, as the other
  // kernels use for rounded outputs; fp32 Y: the exp form. GeGLU (erf)
  // as 0.5 g erfc(-g / sqrt 2) u, the same function as glu()'s
  // 0.5 g (1 + erf(g / sqrt 2)) u without its cancellation where g << 0:
  // at g = -4.6, 1 + erf is ~5e-6 and erf's absolute error (~6e-8)
  // would be ~1 % of the result, more than the unfused path's own error
  // on a one-element output (GpuDecode.GeluErfNegativeTail).
  float y;
  if (p.act == gatedmlp::detail::kGeluErf)
    y = 0.5f * gv * erfcf(-0.7071067811865476f * gv) * uv;
  else
    y = p.out_dtype == 2 ? gatedmlp::detail::glu<float>(p.act, gv, uv, p.clamp_alpha, p.clamp_limit)
                         : gatedmlp::detail::glu_out16<float>(p.act, gv, uv, p.clamp_alpha, p.clamp_limit);
  gatedmlp::detail::store_float(p.y, p.out_dtype, l * p.sy + row * p.ldy + j, y);
}

// finish_any() for any call; inline only for what models run: silu or
// gelu_tanh to a 16-bit Y, without bias or pre-activation. Why: with
// finish_any() inline at each of the Hopper form's 4 unrolled outputs the
// kernel's code grew from 17 to 46 KB, and its end, which every CTA
// reaches at once, ran 0.3-0.8 us slower on the small shapes than the same
// kernel ending in a bare silu (docs/notes/drop-in-and-decode.md, h77).
__device__ __forceinline__ void finish(const Params& p, float gs, float us, int64_t j, int64_t l, int64_t row) {
  namespace d = gatedmlp::detail;
  if ((p.has_bias | p.has_pre) == 0 && p.out_dtype != 2 && (p.act == d::kSilu || p.act == d::kGeluTanh)) {
    const float y = d::glu_out16_silu_gelu(p.act == d::kGeluTanh, gs * p.alpha, us * p.alpha);
    d::store_float(p.y, p.out_dtype, l * p.sy + row * p.ldy + j, y);
    return;
  }
  finish_any(p, gs, us, j, l, row);
}

// One (token, column) output per thread, columns fastest so neighbouring
// threads store neighbouring Y elements. Token m sits in n-tile m / 8 at C
// column m % 8 = 2t + parity; column c of the CTA in group c / 8, C row
// c % 8 (gate) and 8 + c % 8 (up). j0: the CTA's first column; l: the batch
// (gathered: the expert, for the bias); count: the tile's rows; yrows: the
// output row of each (gathered), or null for rows 0 ... count-1 of batch l.
template <int NT, int CG>
__device__ __forceinline__ void epilogue(const Params& p, const float* red, int64_t j0, int64_t l, int count,
                                         const int* yrows) {
  const int per_token = 8 * CG;
  for (int e = threadIdx.x; e < per_token * count; e += blockDim.x) {
    const int c = e % per_token, m = e / per_token;
    const int64_t j = j0 + c;
    if (j >= p.u) continue;
    const int cg = c >> 3, nt = m >> 3, parity = m & 1;
    const int src = ((c & 7) << 2) + ((m & 7) >> 1);  // the lane (g, t) that holds it
    const float* part = red + (cg * NT + nt) * 128 + src;
    float gs = 0.f, us = 0.f;
    for (int w = 0; w < p.warps; ++w) {
      gs += part[w * (CG * NT * 128) + parity * 32];
      us += part[w * (CG * NT * 128) + (2 + parity) * 32];
    }
    finish(p, gs, us, j, l, yrows ? yrows[m] : m);
  }
}

// The down projection's epilogue (Params::down): C rows 0-7 are output
// columns j0 ... j0+7, rows 8-15 columns j0+8 ... j0+15, so lane (g, t)
// holds c0, c1 = column j0+g and c2, c3 = column j0+8+g for tokens 2t, 2t+1.
// One (token, column) per thread: the warps' sums, alpha, bias, Y. l, count,
// yrows: as epilogue()'s.
template <int NT>
__device__ __forceinline__ void epilogue_down(const Params& p, const float* red, int64_t j0, int64_t l, int count,
                                              const int* yrows) {
  for (int e = threadIdx.x; e < 16 * count; e += blockDim.x) {
    const int c = e & 15, m = e >> 4;
    const int64_t j = j0 + c;
    if (j >= p.u) continue;
    const int nt = m >> 3, reg = ((c >> 3) << 1) + (m & 1);
    const float* part = red + nt * 128 + reg * 32 + ((c & 7) << 2) + ((m & 7) >> 1);
    float s = 0.f;
    for (int w = 0; w < p.warps; ++w) s += part[w * (NT * 128)];
    if (p.partials) {  // a split of K: the raw sum, finished by down::reduce_splits
      p.partials[(int64_t(blockIdx.y) * p.m + m) * p.u + j] = s;
      continue;
    }
    float y = s * p.alpha;
    if (p.has_bias) y += gatedmlp::detail::load_float(p.bias, p.bias_dtype, l * p.sb + j);
    const int64_t row = yrows ? yrows[m] : m;
    if (p.row_scale) y *= gatedmlp::detail::load_float(p.row_scale, p.row_scale_dtype, row);
    gatedmlp::detail::store_float(p.y, p.out_dtype, l * p.sy + row * p.ldy + j, y);
  }
}

// A tile's end in any decode kernel: the down projection's epilogue
// (Params::down; one column group) or gate/up's.
template <int NT, int CG>
__device__ __forceinline__ void tile_epilogue(const Params& p, const float* red, int64_t j0, int64_t l, int count,
                                              const int* yrows) {
  if constexpr (CG == 1) {
    if (p.down) {
      epilogue_down<NT>(p, red, j0, l, count, yrows);
      return;
    }
  }
  epilogue<NT, CG>(p, red, j0, l, count, yrows);  // column groups: gate/up only
}

}  // namespace gatedmlp::decode
