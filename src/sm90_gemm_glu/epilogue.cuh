// Epilogue (per consumer warpgroup, 64 rows): alpha and bias are applied in
// registers; act(g) * u (for 16-bit Y in the one-MUFU tanh form, glu_out16:
// the epilogue is bound by its instructions and MUFU ops, docs/notes/hopper-epilogue.md h41) is
// rounded and written (stmatrix) into a
// 128-byte-swizzled shared tile that one thread hands to two TMA stores,
// which run while the warpgroup goes on to its next tile. (With fp32 output, or a Y the copy
// engine cannot address, 32-column fp32 chunks go through the same bytes and
// are stored by the threads.) The pre-activation, if asked, goes first:
// when it is 16-bit with 16-byte rows and U is whole tiles, in two rounds of
// 128 columns and TMA stores (store_pre_tma, in kernels of their own: PRE =
// 1), round 0 through the Y tile and round 1 through the item's last ring
// stage, held until it has been read, each round's stores covered by
// computing half of Y; otherwise from the registers, two columns
// per store (store_pre_fast for whole tiles of 16-bit output: straight-line
// code, small enough to stay in the instruction cache). An FP8 Y (the e4m3
// kernels) is quantized here too, one 1 x 128 group per row of the tile,
// its bytes through the same shared tile and a TMA store (store_y_fp8).
// Only Y (with an FP8 Y's scales and amax) and the pre-activation reach
// device memory.
//
// The pieces below run in the consumer warpgroups of both kernel families
// (sm90_gemm_glu.cuh, pingpong.cuh); epilogue() is the cooperative kernel's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "common/layout_math.hpp"
#include "sm90_gemm_glu/hopper.cuh"
#include "sm90_gemm_glu/params.hpp"
#include "sm90_gemm_glu/schedule.hpp"
#include "sm90_gemm_glu/tile.cuh"

namespace gatedmlp::sm90::detail_ {

using gatedmlp::detail::load_float;
using gatedmlp::detail::store_float;

// Column of the pre-activation output (and index into a fused bias) that
// holds logical (half, j): the weight row for fused weights, [gate | up] for
// separate ones. I: int64_t, or uint32_t (the blocker keeps 2U below 2^31)
// for a 32-bit division where the PRE = 1 kernels compute their store
// columns once per tile.
template <typename I>
__device__ __forceinline__ I pre_col(const Params& p, int half, I j) {
  if (p.separate) return half == 0 ? j : static_cast<I>(p.u) + j;
  return gatedmlp::detail::fused_row<I>(j, half, static_cast<I>(p.group), p.first);
}

// A tail partial: the warpgroup's 64 x 2N accumulators (N per thread; the
// slot holds N = 128) as float2 pairs, pair q of thread t at (q * 128 + t) *
// 2, so a warp's store is 256 contiguous bytes. Rows past M are neither
// written nor read.
__device__ __forceinline__ float* partial_slot(const Params& p, int64_t cta, int cw) {
  return p.sk_part + (cta * 2 + cw) * (64 * 256);
}

template <int N>
__device__ __forceinline__ void store_partial(const Params& p, const float (&d)[N], float* slot, int tid,
                                              int64_t row0) {
  const int64_t r = row0 + 16 * (tid / 32) + (tid % 32) / 4;
  const bool row_a = r < p.m, row_b = r + 8 < p.m;  // d[2q] is in row r + 8 * (q % 2)
#pragma unroll
  for (int q = 0; q < N / 2; ++q)
    if (q % 2 ? row_b : row_a) __stcg(reinterpret_cast<float2*>(slot) + q * 128 + tid, make_float2(d[2 * q], d[2 * q + 1]));
}

// Eight loads in flight at a time: unbounded, the compiler hoists all 64
// ahead of the adds, and 128 more live registers next to the accumulators
// spill.
template <int N>
__device__ __forceinline__ void add_partial(const Params& p, float (&d)[N], const float* slot, int tid,
                                            int64_t row0) {
  const int64_t r = row0 + 16 * (tid / 32) + (tid % 32) / 4;
  const bool row_a = r < p.m, row_b = r + 8 < p.m;  // the thread's two rows
  constexpr int kPairs = N / 2;  // 64, or 44: five rounds, the last of four
#pragma unroll
  for (int q0 = 0; q0 < kPairs; q0 += 8) {
    constexpr int kRound = 8;
    float2 v[kRound];
#pragma unroll
    for (int e = 0; e < kRound; ++e) {
      const int q = q0 + e;
      if (q < kPairs)
        v[e] = (q % 2 ? row_b : row_a) ? __ldcg(reinterpret_cast<const float2*>(slot) + q * 128 + tid)
                                       : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int e = 0; e < kRound; ++e) {
      const int q = q0 + e;
      if (q < kPairs) {
        d[2 * q] += v[e].x;
        d[2 * q + 1] += v[e].y;
      }
    }
    asm volatile("" ::: "memory");  // the next eight loads stay below these adds
  }
}

// Four adjacent elements at i (a multiple of 4; 8-byte aligned for 16-bit
// types, 16 for fp32).
__device__ __forceinline__ void store_vec4(void* p, int dtype, int64_t i, float4 v) {
  if (dtype == 2) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = v;
  } else if (dtype == 0) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 w;
    w.x = *reinterpret_cast<uint32_t*>(&a);
    w.y = *reinterpret_cast<uint32_t*>(&b);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = w;
  } else {
    __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    uint2 w;
    w.x = *reinterpret_cast<uint32_t*>(&a);
    w.y = *reinterpret_cast<uint32_t*>(&b);
    *reinterpret_cast<uint2*>(static_cast<__half*>(p) + i) = w;
  }
}

// Y of fragment element i: act(g) * u, or, with DONE, the value that
// glu_in_place already left in g's place.
// N accumulators per thread: gate in d[0, N/2), up in d[N/2, N).
// OUT16: Y is rounded to 16 bits, so the activation may take the one-MUFU
// tanh form (glu_out16: its ~1e-5 error is far below that rounding). The
// TMA path (16-bit Y, park_y_swizzled) and the PRE = 1 kernels (which the
// host gives only a Y stored by TMA) take it; the generic path (fp32 Y, or
// a Y the copy engine cannot address) keeps glu().
template <int ACT, bool DONE, int N, bool OUT16 = false>
__device__ __forceinline__ float y_of(const float (&d)[N], int i, float ca, float cl) {
#if defined(GATEDMLP_SM90_EXP_NO_ACT)
  // Timing experiment only (scripts/experiments/exp-epilogue.sh): Y = g * u, no special
  // functions.
  if constexpr (!DONE) return d[i] * d[i + N / 2];
#endif
  if constexpr (DONE) return d[i];
  else if constexpr (OUT16) return gatedmlp::detail::glu_out16<float>(ACT, d[i], d[i + N / 2], ca, cl);
  else return gatedmlp::detail::glu<float>(ACT, d[i], d[i + N / 2], ca, cl);
}

// act(g) * u of tile columns [64 H, 64 H + 64) written over g (d[i]), u kept:
// the PRE = 1 kernels compute Y while a TMA store of the pre-activation reads
// the shared tile, instead of waiting for it.
template <int ACT, int H>
__device__ __forceinline__ void glu_in_place(float (&d)[128], float ca, float cl) {
#pragma unroll
  for (int i = 32 * H; i < 32 * H + 32; ++i) d[i] = y_of<ACT, false, 128, true>(d, i, ca, cl);
}

template <int ACT, bool DONE, int Q>
__device__ __forceinline__ void park_glu_chunk(const float (&d)[128], float* buf, int warp, int lane, float ca,
                                               float cl) {
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * (4 * Q + jj) + 2 * h;
      const int r = 16 * warp + lane / 4 + 8 * h;
      const int c = 8 * jj + 2 * (lane % 4);
      *reinterpret_cast<float2*>(buf + r * Traits::kStageLd + c) =
          make_float2(y_of<ACT, DONE>(d, i, ca, cl), y_of<ACT, DONE>(d, i + 1, ca, cl));
    }
}

// Writes a parked 64 x 32 chunk of Y. Each thread stores 4 consecutive
// columns of a row.
__device__ __forceinline__ void store_chunk(const Params& p, const float* buf, int tid, int l, int64_t row0,
                                            int64_t col0, int64_t m_end) {
  for (int idx = tid; idx < 64 * (Traits::kChunk / 4); idx += 128) {
    const int r = idx / (Traits::kChunk / 4);
    const int c = (idx % (Traits::kChunk / 4)) * 4;
    const int64_t row = row0 + r, j0 = col0 + c;
    if (row >= m_end || j0 >= p.u) continue;
    const float4 v = *reinterpret_cast<const float4*>(buf + r * Traits::kStageLd + c);
    const float vs[4] = {v.x, v.y, v.z, v.w};
    const int64_t yi = int64_t(l) * p.sy + row * p.ldy + j0;
    if (p.y_vec4 && j0 + 4 <= p.u) {
      store_vec4(p.y, p.out_dtype, yi, v);
    } else {
      for (int e = 0; e < 4 && j0 + e < p.u; ++e) store_float(p.y, p.out_dtype, yi + e, vs[e]);
    }
  }
}

// pre_mode 1: where tile column c (of one half) lies from the start of the
// tile's blocks, 2 col0: whole blocks of 2G columns, then c's place in its
// block of G = 2^lg.
__device__ __forceinline__ int block_col(int c, int lg) { return ((c >> lg) << (lg + 1)) + (c & ((1 << lg) - 1)); }

// Two adjacent pre-activation values at element `row + c` (c even; the pair is
// 4-byte aligned for 16-bit types, 8 for fp32 when p.pre_vec2), or one at a
// time. `row` is the row's first element.
__device__ __forceinline__ void store_pre_pair(const Params& p, int64_t row, int c, float a, float b, bool both) {
  if (both && p.pre_vec2) {
    if (p.pre_dtype == 2) {
      *reinterpret_cast<float2*>(static_cast<float*>(p.pre) + row + c) = make_float2(a, b);
    } else if (p.pre_dtype == 0) {
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.pre) + row + c) = __floats2bfloat162_rn(a, b);
    } else {
      *reinterpret_cast<__half2*>(static_cast<__half*>(p.pre) + row + c) = __floats2half2_rn(a, b);
    }
    return;
  }
  store_float(p.pre, p.pre_dtype, row + c, a);
  if (both) store_float(p.pre, p.pre_dtype, row + c + 1, b);
}

// The pre-activation (alpha and bias applied) straight from the accumulator
// fragment to device memory, two adjacent columns per store. Where the tile's
// 128 columns of a half lie in the pre-activation row:
//   pre_mode 0 (separate, stacked, G a multiple of 128): each half is one
//     contiguous run starting at pre_col(half, col0);
//   pre_mode 1 (G divides 128, G >= 2): the tile covers [2 col0, 2 col0 + 256)
//     in blocks of G gate and G up columns; a thread's column pair never
//     straddles a block (G even, pairs start at even columns);
//   pre_mode 2 (G = 1): gate and up of column j sit side by side at 2j, so
//     the pair stored is (gate, up) in the layout's order.
// No shared memory and no barrier: the stores drain while the warpgroup goes
// on to the next tile.
__device__ __forceinline__ void store_pre(const Params& p, const float (&d)[128], int warp, int lane, int l,
                                          int64_t row0, int64_t col0) {
  // Columns as 32-bit offsets from the row (2U < 2^31: the blocker checks).
  const int g0 = static_cast<int>(pre_col(p, 0, col0)), u0 = static_cast<int>(pre_col(p, 1, col0));
  const int c2 = static_cast<int>(2 * col0);
  const int q = 2 * (lane % 4);
  const int lg = p.pre_log2g, gpos = p.first == 0 ? 0 : 1;
  const int ulim = static_cast<int>(min(p.u - col0, int64_t{128}));  // valid columns of the tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 16 * warp + lane / 4 + 8 * h;
    if (row >= p.m) continue;
    const int64_t base = int64_t(l) * p.spre + row * p.ldpre;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const int jl = 8 * jj + q;  // column within the tile (even)
      if (jl >= ulim) continue;
      const bool both = jl + 1 < ulim;
      const int i = 4 * jj + 2 * h;  // gate d[i], d[i+1]; up d[i+64], d[i+65]
      if (p.pre_mode == 0) {
        store_pre_pair(p, base, g0 + jl, d[i], d[i + 1], both);
        store_pre_pair(p, base, u0 + jl, d[i + 64], d[i + 65], both);
      } else if (p.pre_mode == 1) {
        const int blk = c2 + block_col(jl, lg);
        store_pre_pair(p, base, blk + (gpos << lg), d[i], d[i + 1], both);
        store_pre_pair(p, base, blk + ((1 - gpos) << lg), d[i + 64], d[i + 65], both);
      } else {
        const int c = c2 + 2 * jl;
        store_pre_pair(p, base, c, gpos == 0 ? d[i] : d[i + 64], gpos == 0 ? d[i + 64] : d[i], true);
        if (both)
          store_pre_pair(p, base, c + 2, gpos == 0 ? d[i + 1] : d[i + 65], gpos == 0 ? d[i + 65] : d[i + 1], true);
      }
    }
  }
}

// The common pre-activation case in a few instructions per pair: 16-bit
// output, pairs aligned (p.pre_vec2), a whole tile of columns, in each of
// store_pre's modes (one run per half, blocks of G, gate/up side by side).
// The general store_pre above branches on the mode, the dtype and the
// edges for every pair; fully unrolled, that code was big enough to miss the
// instruction cache on every tile (ncu: 23 % of stall samples "no
// instruction" with the pre-activation on). Here each pair is one pack and
// one store at a constant offset from two row pointers.
template <typename OUT, int MODE>
__device__ __forceinline__ void store_pre_fast(const Params& p, const float (&d)[128], int warp, int lane, int l,
                                               int64_t row0, int64_t col0) {
  const int q = 2 * (lane % 4);
  const bool gate_first = p.first == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 16 * warp + lane / 4 + 8 * h;
    if (row >= p.m) continue;
    OUT* base = static_cast<OUT*>(p.pre) + int64_t(l) * p.spre + row * p.ldpre;
    if constexpr (MODE == 0) {
      uint32_t* g = reinterpret_cast<uint32_t*>(base + pre_col(p, 0, col0) + q);
      uint32_t* u = reinterpret_cast<uint32_t*>(base + pre_col(p, 1, col0) + q);
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        const int i = 4 * jj + 2 * h;
        g[4 * jj] = gatedmlp::detail::pack2<OUT>(d[i], d[i + 1]);
        u[4 * jj] = gatedmlp::detail::pack2<OUT>(d[i + 64], d[i + 65]);
      }
    } else if constexpr (MODE == 1) {
      // Blocks of G = 2^lg gate and G up columns from 2 col0 on; a pair
      // never straddles a block (G and the pair's first column are even).
      // block_col(8 jj + q) = block_col(8 jj) + block_col(q): for G <= 8,
      // 8 jj is whole blocks; for G >= 8, q < 8 stays in 8 jj's block.
      const int lg = p.pre_log2g;
      OUT* g = base + 2 * col0 + ((gate_first ? 0 : 1) << lg) + block_col(q, lg);
      OUT* u = base + 2 * col0 + ((gate_first ? 1 : 0) << lg) + block_col(q, lg);
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        const int i = 4 * jj + 2 * h;
        const int off = block_col(8 * jj, lg);
        *reinterpret_cast<uint32_t*>(g + off) = gatedmlp::detail::pack2<OUT>(d[i], d[i + 1]);
        *reinterpret_cast<uint32_t*>(u + off) = gatedmlp::detail::pack2<OUT>(d[i + 64], d[i + 65]);
      }
    } else {
      // Column j's (gate, up) pair in the layout's order at 2j.
      uint32_t* c = reinterpret_cast<uint32_t*>(base + 2 * (col0 + q));
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        const int i = 4 * jj + 2 * h;
        c[8 * jj] = gate_first ? gatedmlp::detail::pack2<OUT>(d[i], d[i + 64])
                               : gatedmlp::detail::pack2<OUT>(d[i + 64], d[i]);
        c[8 * jj + 1] = gate_first ? gatedmlp::detail::pack2<OUT>(d[i + 1], d[i + 65])
                                   : gatedmlp::detail::pack2<OUT>(d[i + 65], d[i + 1]);
      }
    }
  }
}

// Byte offset of 16-bit column c (0 ... 127) of row r in a warpgroup's
// shared 64 x 128 tile: two 64 x 64 boxes with the 128-byte swizzle, the
// 16-byte chunk c / 8 of a row at chunk (c / 8) ^ (r % 8). The rows a warp
// writes at once differ in r % 8 = lane / 4, so they hit distinct banks.
__device__ __forceinline__ int swizzled_off(int r, int c, int lane) {
  return (c / 64) * 8192 + r * 128 + ((((c % 64) / 8) ^ (lane / 4)) * 16) + (c % 8) * 2;
}

// park_pre for rounds whose 8-column blocks of one half stay whole in the
// pre-activation row (MODE 0, and MODE 1 with G >= 8): one stmatrix per 16
// rows x 16 columns of a half, where 4-byte stores took four (as park_y does
// for Y). Lane l addresses row l % 8 of matrix l / 8 (park_y_swizzled).
template <typename OUT, int MODE, int ROUND>
__device__ __forceinline__ void park_pre_stsm(const Params& p, const float (&d)[128], unsigned char* tile, int warp,
                                              int lane) {
  static_assert(MODE == 0 || MODE == 1, "gate and up in runs or blocks of G >= 8");
  const int r = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
  const uint32_t base = smem_addr(tile);
  const int lg = p.pre_log2g;
  const int gpos = p.first == 0 ? 0 : 1;  // the gate's block within a pair of blocks (MODE 1)
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int jp = 4 * ROUND; jp < 4 * ROUND + 4; ++jp) {
      const int c = 16 * jp + 8 * (lane / 16);  // the tile column of this lane's matrix
      // Its column in the round's 128 (two boxes of 64).
      const int bc = MODE == 0 ? 64 * half + c - 64 * ROUND
                               : block_col(c, lg) + ((half == 0 ? gpos : 1 - gpos) << lg) - 128 * ROUND;
      uint32_t v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = 64 * half + 4 * (2 * jp + q / 2) + 2 * (q % 2);
        v[q] = gatedmlp::detail::pack2<OUT>(d[i], d[i + 1]);
      }
      stmatrix_x4(base + (bc / 64) * 8192 + r * 128 + ((((bc % 64) / 8) ^ (r % 8)) * 16), v[0], v[1], v[2], v[3]);
    }
}

// Half ROUND of a whole tile's 256 pre-activation columns: gate and up of
// tile columns [64 ROUND, 64 ROUND + 64), written into the warpgroup's
// shared tile (two 64 x 64 boxes) in the order the copy engine stores them:
//   MODE 0 (one run per half): box 0 the gate columns, box 1 the up columns,
//     each stored at its own run;
//   MODE 1 and 2 (blocks of G < 128, the tile's 256 columns one run from
//     2 col0): the run's 128 columns from 128 ROUND on, which hold exactly
//     those columns of both halves.
// Every mode parks the same registers in a round, the ones glu_in_place
// turns into Y next. MODE 0 and MODE 1 with G >= 8 by stmatrix
// (park_pre_stsm); G = 2, 4 two columns per 4-byte store; G = 1 four per
// 8-byte store.
template <typename OUT, int MODE, int ROUND>
__device__ __forceinline__ void park_pre(const Params& p, const float (&d)[128], unsigned char* tile, int warp,
                                         int lane) {
  if constexpr (MODE == 0) {
    park_pre_stsm<OUT, 0, ROUND>(p, d, tile, warp, lane);
    return;
  } else if constexpr (MODE == 1) {
    if (p.pre_log2g >= 3) {
      park_pre_stsm<OUT, 1, ROUND>(p, d, tile, warp, lane);
      return;
    }
  }
  const int q = 2 * (lane % 4);
  const bool gate_first = p.first == 0;
  const int lg = p.pre_log2g;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + lane / 4 + 8 * h;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const int i = 4 * jj + 2 * h;  // gate d[i], d[i+1]; up d[i+64], d[i+65]
      const int jl = 8 * jj + q;      // tile column (even)
      auto put = [&](int off, uint32_t v) { *reinterpret_cast<uint32_t*>(tile + swizzled_off(r, off, lane)) = v; };
      if ((jj < 8) != (ROUND == 0)) continue;  // resolved at compile time
      const int base = 2 * 64 * ROUND;            // the round's first run column
      if constexpr (MODE == 1) {
        const int bc = block_col(8 * jj, lg) + block_col(q, lg) - base;
        put(bc + ((gate_first ? 0 : 1) << lg), gatedmlp::detail::pack2<OUT>(d[i], d[i + 1]));
        put(bc + ((gate_first ? 1 : 0) << lg), gatedmlp::detail::pack2<OUT>(d[i + 64], d[i + 65]));
      } else {
        // Columns c ... c + 3 (c a multiple of 4: 8 aligned bytes of one
        // 16-byte chunk) in one 8-byte store. As two 4-byte stores, rows r
        // and r ^ 1 of a warp's store hit the same banks (their chunks are
        // swizzled onto the same pair), two wavefronts for 128 bytes; as
        // one, a warp's 256 bytes take the two they need.
        const int c = 2 * jl - base;
        const uint32_t lo = gate_first ? gatedmlp::detail::pack2<OUT>(d[i], d[i + 64])
                                       : gatedmlp::detail::pack2<OUT>(d[i + 64], d[i]);
        const uint32_t hi = gate_first ? gatedmlp::detail::pack2<OUT>(d[i + 1], d[i + 65])
                                       : gatedmlp::detail::pack2<OUT>(d[i + 65], d[i + 1]);
        *reinterpret_cast<uint2*>(tile + swizzled_off(r, c, lane)) = make_uint2(lo, hi);
      }
    }
  }
}

// A tile's pre-activation (16-bit, p.pre_tma: U is whole tiles, so every
// tile is) in two rounds of 128 columns, each parked in shared memory and
// handed to two TMA stores (rows past M are clipped by them). The 4-byte
// stores of store_pre_fast half-fill every 32-byte sector; here the copy
// engine writes whole lines. Round r holds tile columns [64 r, 64 r + 64)
// of both halves (park_pre). Round 0 goes through the warpgroup's Y tile,
// round 1 through `spare`, the warpgroup's 16 KB of the item's last ring
// stage (once both warpgroups are done with its operands), which the kernel
// holds until these stores have read it (docs/notes/pre-activation.md,
// h43: with one tile for both rounds, two waits per tile for the copy engine
// cost ~1 %). While the copy engine reads a round, the warpgroup computes Y
// of the round's columns in place of their g: every value the round parked
// is out of the registers' way by then. Returns once round 0 has
// been read: the Y tile is free for Y, and Y itself is in d[0 ... 63].
// Round 1's stores may still be reading `spare` (the last bulk group).
template <typename OUT, int MODE, int ACT>
__device__ __forceinline__ void store_pre_tma(const Params& p, float (&d)[128], unsigned char* tile,
                                              unsigned char* spare, bool early, int bar, int tid, int l,
                                              int64_t row0, int64_t col0) {
  const int warp = tid / 32, lane = tid % 32;
  const int cw = bar - 1;
  // Round 1 parks in the held stage, which holds the last k-step's operands
  // of both warpgroups (the weight tile is shared), so the other one's
  // wgmmas must be done with it. With `early`, the other warpgroup says so
  // as soon as its epilogue starts (it waited for its wgmmas before), here;
  // this one waits for that before round 1 (kParkBar + cw), which rarely
  // waits at all, where a barrier of both warpgroups there cost ~0.5 %
  // (docs/notes/pre-activation.md, h45). The arrivals must not run a generation ahead: a
  // warpgroup could arrive for its next item before the other had waited
  // for this one. `early` (a whole item of at least kStages k-blocks; not
  // the split tail's owners) rules that out: the next early item's
  // kStages-th k-block, or one before it, reuses the held stage, which is
  // refilled only once both have released it, after their round 1. (Asked
  // as "kb1 - kb0 >= kStages", it kept kb0 live through the main loop, and
  // ptxas spilled ~400 B; in the kernels of two-CTA clusters any `early`
  // known only at run time spilled ~340 B, so those keep the barrier of
  // both.)
  // Both warpgroups come here on every item with an epilogue (an idle one
  // too) and agree on `early`.
  if (early) named_barrier_arrive(kParkBar + (1 - cw), 256);
  // Where each round's two boxes go: MODE 0, the gate and the up run (64
  // columns apart from one round to the next); MODE 1, 2, one run from 2
  // col0, 128 columns per round.
  int c_box0 = static_cast<int>(2 * col0), c_box1 = c_box0 + 64, c_step = 128;
  if constexpr (MODE == 0) {
    c_box0 = static_cast<int>(pre_col(p, 0, static_cast<uint32_t>(col0)));
    c_box1 = static_cast<int>(pre_col(p, 1, static_cast<uint32_t>(col0)));
    c_step = 64;
  }
  // Not unrolled: unrolled, silu spilled 12-20 B and gelu_tanh 8-12 B.
#pragma unroll 1
  for (int round = 0; round < 2; ++round) {
    unsigned char* buf = round == 0 ? tile : spare;
    // Keeps what is computed from d (the packs, Y) from being hoisted above
    // the barriers and held across them.
    fence_regs(d);
#if !defined(GATEDMLP_SM90_EXP_PRE_NO_BOTHBAR)  // timing experiments only (scripts/experiments/exp-epilogue.sh)
    if (round == 1) named_barrier(early ? kParkBar + cw : kBothBar, 256);
#endif
#if !defined(GATEDMLP_SM90_EXP_PRE_NO_PARK)
    if (round == 0) park_pre<OUT, MODE, 0>(p, d, buf, warp, lane);
    else park_pre<OUT, MODE, 1>(p, d, buf, warp, lane);
#endif
    fence_proxy_async();
    named_barrier(bar, 128);
    if (tid == 0 && row0 < p.m) {
#if !defined(GATEDMLP_SM90_EXP_PRE_NO_STORE)
      tma_store_3d(&p.tma_pre, buf, c_box0 + c_step * round, static_cast<int>(row0), l);
      tma_store_3d(&p.tma_pre, buf + 8192, c_box1 + c_step * round, static_cast<int>(row0), l);
#endif
      bulk_commit();
    }
    fence_regs(d);
    if (round == 0) glu_in_place<ACT, 0>(d, p.clamp_alpha, p.clamp_limit);
    else glu_in_place<ACT, 1>(d, p.clamp_alpha, p.clamp_limit);
  }
  // Round 0's stores (all but the last group) have read the Y tile.
#if !defined(GATEDMLP_SM90_EXP_PRE_NO_WAIT)
  if (tid == 0) bulk_wait_read<1>();
#endif
  named_barrier(bar, 128);
  fence_regs(d);
}

// act(g) * u of the thread's fragment, rounded to OUT and written into the
// warpgroup's 64 x N Y tile by stmatrix: one instruction per 16 rows x 16
// columns of the warp, where 4-byte stores took four (docs/notes/hopper-epilogue.md, h21).
// Matrices 0-3 of column pair jp are rows 0-7 and 8-15 of columns 16 jp ...
// + 7, then of the next 8 columns; lane l addresses row l % 8 of matrix
// l / 8. Columns 0-63 (N = 128: all) are 64 x 64 boxes with the 128-byte
// swizzle (swizzled_off); the 24 columns after them (N = 88) a 64 x 24 box
// without swizzle, 48-byte rows (8 of them hit distinct banks), the last 8
// of those by stmatrix.x2; the 32 after them (N = 96) a 64 x 32 box with
// the 64-byte swizzle (16-byte chunk q of row r at q ^ (r / 2) % 4: 8 rows
// of 64 bytes, unswizzled, would hit each bank four times). OFF (with DONE
// only): the values parked are d[OFF + i] instead of d[i] (the ping-pong
// kernels park the up half of the pre-activation so). BOX32 (N = 96, DONE):
// every 32 columns a 64 x 32 box of their own, with the 64-byte swizzle, as
// columns 64-95 are otherwise (the 96-column kernels' pre-activation of
// weights in blocks of 64 or more rows, whose 32-column pieces go to
// different places).
template <int ACT, bool DONE, typename OUT, int N, int OFF = 0, bool BOX32 = false>
__device__ __forceinline__ void park_y_swizzled(const float (&d)[N], unsigned char* tile, int warp, int lane,
                                                float ca, float cl) {
  static_assert(N == 128 || N == 88 || N == 96, "Y tiles of 128, 88 or 96 columns");
  static_assert(OFF == 0 || DONE, "an offset only for values already computed");
  static_assert(!BOX32 || (N == 96 && DONE), "32-column boxes: the 96-column pre-activation");
  constexpr int kPlainLd = 2 * (N - 64);  // N = 88, 96: bytes per row of the second box
  const int r = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;  // the row this lane addresses
  const uint32_t base = smem_addr(tile);
  // The address of the 8-column block at column c (a multiple of 8) of row
  // r; `swz`, known at compile time: whether c lies in a swizzled box.
  auto addr = [&](bool swz, int c) -> uint32_t {
    if (BOX32) return base + (c / 32) * 4096 + r * 64 + ((((c % 32) / 8) ^ ((r / 2) % 4)) * 16);
    if (swz) return base + (c / 64) * 8192 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16);
    if (N == 96) return base + 8192 + r * kPlainLd + ((((c - 64) / 8) ^ ((r / 2) % 4)) * 16);
    return base + 8192 + r * kPlainLd + (c - 64) * 2;
  };
#pragma unroll
  for (int jp = 0; jp < N / 16; ++jp) {
    uint32_t v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = 4 * (2 * jp + q / 2) + 2 * (q % 2);  // column block 2 jp + q / 2, rows + 8 (q % 2)
      v[q] = gatedmlp::detail::pack2<OUT>(y_of<ACT, DONE, N, true>(d, OFF + i, ca, cl), y_of<ACT, DONE, N, true>(d, OFF + i + 1, ca, cl));
    }
    stmatrix_x4(addr(N == 128 || 16 * jp < 64, 16 * jp + 8 * (lane / 16)), v[0], v[1], v[2], v[3]);
  }
  if constexpr (N % 16 == 8) {
    constexpr int jb = N / 8 - 1;  // the last 8-column block: rows 0-7 and 8-15
    uint32_t v[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int i = 4 * jb + 2 * q;
      v[q] = gatedmlp::detail::pack2<OUT>(y_of<ACT, DONE, N, true>(d, OFF + i, ca, cl), y_of<ACT, DONE, N, true>(d, OFF + i + 1, ca, cl));
    }
    stmatrix_x2(addr(false, 8 * jb), v[0], v[1]);
  }
}

// Gate and up bias of the tile's N columns into sbias[0, 2N) (gate, then
// up), elements i = first, first + step, ... of them: the two cooperative
// warpgroups load them together (step 256), a ping-pong warpgroup alone
// (step 128). Columns past U read as 0.
template <int N>
__device__ __forceinline__ void load_bias(const Params& p, float* sbias, int first, int step, int l, int64_t col0) {
  const int64_t boff = int64_t(l) * p.sb;
  for (int i = first; i < 2 * N; i += step) {
    const int half = i / N;
    const int64_t j = col0 + i % N;
    float b = 0.f;
    if (j < p.u)
      b = (p.separate && half == 1) ? load_float(p.bias_up, p.bias_dtype, boff + j)
                                    : load_float(p.bias, p.bias_dtype, boff + pre_col(p, half, j));
    sbias[i] = b;
  }
}

// g = alpha * acc + bias, u likewise, in place (sbias as load_bias leaves it).
template <int N>
__device__ __forceinline__ void apply_alpha_bias(const Params& p, float (&d)[N], const float* sbias, int lane) {
  if (p.alpha == 1.f && !p.has_bias) return;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float v = d[i] * p.alpha;
    if (p.has_bias) {
      const int col = 8 * ((i % (N / 2)) / 4) + 2 * (lane % 4) + (i % 2);
      v += sbias[(i / (N / 2)) * N + col];
    }
    d[i] = v;
  }
}

// FP8 calls (Params::fp8): the scales a consumer thread applies to a tile's
// sums: X's for its two rows (x0: row r, x1: r + 8), and the weights': per
// tensor, gate (w0) and up (w1); per channel, the two it stages for the
// warpgroup, gate and up of column `tid` of the tile. Loaded when the tile
// starts (load_fp8_scales), so their global-memory latency passes under the
// main loop instead of stalling the epilogue. PROMO: the promoting kernels
// apply X's scales and the weights' (but per channel) as they add each
// k-block (PromoScaleRows), and the epilogue only the per-channel ones.
struct Fp8Scales {
  float x0, x1, w0, w1;
};

template <int N, bool PROMO = false>
__device__ __forceinline__ Fp8Scales load_fp8_scales(const Params& p, int tid, int64_t row0, int64_t col0) {
  static_assert(N == 128, "e4m3 kernels: 128-column tiles (one column of each half per thread)");
  const int warp = tid / 32, lane = tid % 32;
  const float* xs = static_cast<const float*>(p.x_scale);
  const int64_t r = row0 + 16 * warp + lane / 4;
  Fp8Scales s{0.f, 0.f, 0.f, 0.f};  // rows past M and columns past U are never stored
  if (PROMO || p.x_scale_block) s.x0 = s.x1 = 1.f;  // applied per k-block (PromoScales)
  else if (!p.x_scale_row) s.x0 = s.x1 = xs[0];
  else {
    if (r < p.m) s.x0 = xs[r];
    if (r + 8 < p.m) s.x1 = xs[r + 8];
  }
  if (p.w_scale_block || (PROMO && !p.w_scale_col)) s.w0 = s.w1 = 1.f;
  else if (!p.w_scale_col) {
    s.w0 = load_float(p.w_scale, p.scale_dtype, 0);
    s.w1 = load_float(p.separate ? p.w_scale_up : p.w_scale, p.scale_dtype, 0);
  } else if (const int64_t j = col0 + tid; j < p.u) {
    s.w0 = p.separate ? load_float(p.w_scale, p.scale_dtype, j) : load_float(p.w_scale, p.scale_dtype, pre_col(p, 0, j));
    s.w1 = p.separate ? load_float(p.w_scale_up, p.scale_dtype, j)
                      : load_float(p.w_scale, p.scale_dtype, pre_col(p, 1, j));
  }
  return s;
}

// The promoting kernels' scales: what multiplies one 128-deep k-block's
// sums of a thread as it is added: its two rows' X scales times the
// k-block's scale of the tile's gate rows (g) and of its up rows (u). Every
// scaling but per-channel weights is applied here, so that a k-block's
// loads and products take the same instructions whatever the call's
// scaling, with no branch in the loop (h87, docs/notes/fp8.md):
// - X per tensor, per row or per 1 x 128 block: x_scale at a fixed offset
//   (0, or the row's), stepped by one per k-block only for blocks;
// - weights per tensor or per 128 x 128 block likewise (w_scale and, for
//   separate weights, w_scale_up); per channel: 1 here, the epilogue's.
// Rows past M read row M - 1's scales: finite, and their sums are 0 (the
// rows of the X tile past M are zero) and never stored.
// PromoScaleLoads holds the loaded values (the weights' as the bits of
// p.scale_dtype), BlockScales their products: the promoting loop loads a
// k-block's scales as the k-block starts and converts and multiplies them
// after issuing its first wgmmas (an instruction that reads a loaded
// register before its load has returned stalls the warp, h73).
struct BlockScales {
  float g0, g1, u0, u1;  // gate row r, gate row r + 8, up row r, up row r + 8
};
struct PromoScaleLoads {
  float x0, x1;     // X rows r and r + 8
  uint32_t wg, wu;  // the gate and up weights' scales, as stored
};
struct PromoScaleRows {
  // Element offsets at k-block 0 (32-bit: the host checks that the scale
  // arrays have fewer than 2^31 entries): the thread's two X-scale rows and
  // the tile's gate and up weight scales.
  int x0, x1, wg, wu;
};

// An idle warpgroup (rows past M, or columns past U: its weight block would
// lie past the scales) reads offset 0 of each array, which every call has.
__device__ __forceinline__ PromoScaleRows promo_scale_rows(const Params& p, int tid, int64_t row0, int64_t col0,
                                                           bool idle) {
  const int warp = tid / 32, lane = tid % 32;
  const int64_t last = p.m - 1;
  const int64_t r0 = min(row0 + 16 * warp + lane / 4, last), r1 = min(row0 + 16 * warp + lane / 4 + 8, last);
  PromoScaleRows b{0, 0, 0, 0};
  if (idle) return b;
  if (p.x_scale_block) {
    b.x0 = static_cast<int>(r0 * p.k_groups);
    b.x1 = static_cast<int>(r1 * p.k_groups);
  } else if (p.x_scale_row) {
    b.x0 = static_cast<int>(r0);
    b.x1 = static_cast<int>(r1);
  }
  if (p.w_scale_block) {
    // Every 128 rows of a half lie in one block (the host checks the
    // layout): the block of the half's first row.
    b.wg = static_cast<int>((p.separate ? col0 : pre_col(p, 0, col0)) / 128 * p.k_groups);
    b.wu = static_cast<int>((p.separate ? col0 : pre_col(p, 1, col0)) / 128 * p.k_groups);
  }
  return b;
}

// A scale's bits as p.scale_dtype stores it (0 bf16, 1 fp16, else fp32; as
// load_float), and its value, by selects rather than branches.
__device__ __forceinline__ uint32_t load_scale_bits(const void* p, int dtype, int i) {
  if (dtype == 0 || dtype == 1) return __ldg(static_cast<const unsigned short*>(p) + i);
  return __ldg(static_cast<const unsigned int*>(p) + i);
}
__device__ __forceinline__ float scale_of_bits(uint32_t b, int dtype) {
  const float h = __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  const float f = __uint_as_float(dtype == 0 ? b << 16 : b);
  return dtype == 1 ? h : f;
}

__device__ __forceinline__ PromoScaleLoads load_promo_scales(const Params& p, const PromoScaleRows& b, int kb) {
  const float* xs = static_cast<const float*>(p.x_scale);
  const int kx = p.x_scale_block ? kb : 0, kw = p.w_scale_block ? kb : 0;
  // The k-block added to the 32-bit row offsets before the pointer is
  // formed (the arrays hold under 2^31 entries): as (xs + b.x0) + kx, ptxas
  // kept both offsets widened to 64 bits through the loop, two registers
  // the promoting kernels lack (h93).
  return {__ldg(xs + (b.x0 + kx)), __ldg(xs + (b.x1 + kx)),
          load_scale_bits(p.w_scale, p.scale_dtype, b.wg + kw),
          load_scale_bits(p.separate ? p.w_scale_up : p.w_scale, p.scale_dtype, b.wu + kw)};
}

__device__ __forceinline__ BlockScales promo_scale_products(const Params& p, const PromoScaleLoads& l) {
  const float wg = p.w_scale_col ? 1.f : scale_of_bits(l.wg, p.scale_dtype);
  const float wu = p.w_scale_col ? 1.f : scale_of_bits(l.wu, p.scale_dtype);
  return {l.x0 * wg, l.x1 * wg, l.x0 * wu, l.x1 * wu};
}

// The sums times the row's X scale and the column's weight scale of its
// half. Per-channel scales go through `stage` (2N floats, gate then up: the
// Y tile's bytes, free at this point), one column per thread.
template <int N>
__device__ __forceinline__ void apply_fp8_scales(const Params& p, float (&d)[N], const Fp8Scales& s, float* stage,
                                                 int bar, int tid) {
  const int lane = tid % 32;
  if (!p.w_scale_col) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float sx = (i / 2) % 2 ? s.x1 : s.x0;
      d[i] *= sx * s.w0;
      d[i + N / 2] *= sx * s.w1;
    }
    return;
  }
  stage[tid] = s.w0;
  stage[N + tid] = s.w1;
  named_barrier(bar, 128);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float sx = (i / 2) % 2 ? s.x1 : s.x0;
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    d[i] *= sx * stage[col];
    d[i + N / 2] *= sx * stage[N + col];
  }
  named_barrier(bar, 128);  // the stage's bytes are the Y tile's next
}

// Fast Y: registers -> swizzled shared tile -> two TMA stores (rows row0 ...
// row0 + 63, clipped at M and U; none at all from m_end on), issued by one thread and left in flight
// while the warpgroup goes on. The tile must be free (its previous stores
// have read it: bulk_wait_read and a barrier of the warpgroup before).
template <int ACT, bool DONE, int N>
__device__ __forceinline__ void store_y_tma(const Params& p, const float (&d)[N], unsigned char* tile, int bar,
                                            int tid, int l, int64_t row0, int64_t col0, int64_t m_end) {
  const int warp = tid / 32, lane = tid % 32;
  if (p.out_dtype == 0)
    park_y_swizzled<ACT, DONE, __nv_bfloat16, N>(d, tile, warp, lane, p.clamp_alpha, p.clamp_limit);
  else
    park_y_swizzled<ACT, DONE, __half, N>(d, tile, warp, lane, p.clamp_alpha, p.clamp_limit);
  fence_proxy_async();
  named_barrier(bar, 128);
  if (tid == 0 && row0 < m_end) {
    // Columns 64 on: the second 64-column box, or (N = 88, 96) the 24- or
    // 32-column one.
    const CUtensorMap* second = N == 128 ? &p.tma_y : &p.tma_y_tail;
    tma_store_3d(&p.tma_y, tile, static_cast<int>(col0), static_cast<int>(row0), l);
    if (col0 + 64 < p.u) tma_store_3d(second, tile + 8192, static_cast<int>(col0 + 64), static_cast<int>(row0), l);
    bulk_commit();
  }
}

// The larger of a and b, NaN if either is (fmaxf would drop it): a NaN in
// Y must reach its group's scale and the amax, not vanish from them.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// FP8 Y (p.y_fp8, the e4m3 kernels): the tile's 128 columns are one 1 x 128
// group of each row (tiles start on multiples of 128), held by the four
// lanes of a quad, 32 values each. Y in place of g (the 16-bit output's
// one-MUFU forms: their ~1e-5 error is far below e4m3's 2^-4 step), each
// row's amax over its valid columns (shuffles within the quad), its scale
// amax / 448 stored by the quad's first lane, the values times 448 / amax
// rounded to e4m3 pairs into the 128-byte-swizzled shared tile (64 rows of
// 128 bytes; a warp's 2-byte stores of one column block hit 8 distinct
// 16-byte chunks), then one TMA store, or, for a Y the copy engine cannot
// address, bytes stored by the threads. With y_amax, each warp folds its
// rows' amax into it (atomicMax on the bits: non-negative floats, and a
// NaN, order as their bits do).
template <int ACT>
__device__ __forceinline__ void store_y_fp8(const Params& p, float (&d)[128], unsigned char* tile, int bar, int tid,
                                            int yl, int64_t row0, int64_t col0, int64_t m_end, bool y_tma) {
  const int warp = tid / 32, lane = tid % 32;
  const int ulim = static_cast<int>(min(p.u - col0, int64_t{128}));  // valid columns of the tile
  float amax[2] = {0.f, 0.f};  // rows r and r + 8
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const float y = y_of<ACT, false, 128, true>(d, i, p.clamp_alpha, p.clamp_limit);
    d[i] = y;
    const int c = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    if (c < ulim) amax[(i / 2) % 2] = max_nan(amax[(i / 2) % 2], fabsf(y));
  }
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    amax[h] = max_nan(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
    amax[h] = max_nan(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
    // The floor keeps 448 / amax finite for a group of zeros (its values
    // stay 0). The scale is amax times fp32(1 / 448) and 448 / amax the
    // approximate reciprocal's (2 ulp; no IEEE division, whose slow path
    // is a call): their product is 1 within 2^-21, far inside e4m3's step.
    const float a = max_nan(amax[h], 1e-10f);
    inv[h] = __fdividef(448.f, a);
    const int64_t row = row0 + 16 * warp + lane / 4 + 8 * h;
    if (lane % 4 == 0 && row < m_end) p.y_scales[row * p.ys_row + (col0 / 128) * p.ys_group] = a * (1.f / 448.f);
  }
#pragma unroll
  for (int jj = 0; jj < 16; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * jj + 2 * h;
      const __nv_fp8x2_storage_t q =
          __nv_cvt_float2_to_fp8x2(make_float2(d[i] * inv[h], d[i + 1] * inv[h]), __NV_SATFINITE, __NV_E4M3);
      const int r = 16 * warp + lane / 4 + 8 * h;  // r % 8 = lane / 4
      *reinterpret_cast<__nv_fp8x2_storage_t*>(tile + r * 128 + (((jj / 2) ^ (lane / 4)) * 16) + (jj % 2) * 8 +
                                               2 * (lane % 4)) = q;
    }
  if (p.y_amax) {
    float m = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row0 + 16 * warp + lane / 4 + 8 * h < m_end) m = max_nan(m, amax[h]);
#pragma unroll
    for (int s = 4; s < 32; s *= 2) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, s));  // the quads agree already
    if (lane == 0) atomicMax(reinterpret_cast<int*>(p.y_amax), __float_as_int(m));
  }
  fence_proxy_async();
  named_barrier(bar, 128);
  if (y_tma) {
    if (tid == 0 && row0 < m_end) {
      tma_store_3d(&p.tma_y, tile, static_cast<int>(col0), static_cast<int>(row0), yl);
      bulk_commit();
    }
    return;
  }
  // U, ldy or y not on 16 bytes: a warp stores 128 bytes of a row per
  // step, byte by byte. A fixed, unrolled 16 steps: as a strided loop over
  // the tile, ptxas spilled ~480 B of the accumulators in every
  // non-promoting kernel.
  unsigned char* y = static_cast<unsigned char*>(p.y) + int64_t(yl) * p.sy + row0 * p.ldy + col0;
  const int rows = static_cast<int>(min(m_end - row0, int64_t{64}));
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    const int r = 4 * t + tid / 32, c = 4 * (tid % 32);  // a warp stores 128 bytes of one row
    if (r >= rows || c >= ulim) continue;
    const uint32_t v = *reinterpret_cast<const uint32_t*>(tile + r * 128 + (((c / 16) ^ (r % 8)) * 16) + c % 16);
    unsigned char* dst = y + r * p.ldy + c;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c + e < ulim) dst[e] = static_cast<unsigned char>(v >> (8 * e));
  }
}

// N output columns per tile (N accumulators per thread). The narrow tile (N
// = 88) takes neither a pre-activation nor a Y the copy engine cannot
// address (the host picks it only without them: dispatch.cpp).
// row0: the warpgroup's first row; m_end: the end of the rows it may store
// (M, or a grouped unit's last row + 1); yl: Y's batch (tc.l is the bias's:
// a grouped call's expert); y_tma: Y by TMA stores (p.y_tma, but for a
// grouped unit that ends inside the warpgroup's rows).
// fs: an FP8 call's scales (load_fp8_scales; the 16-bit kernels ignore it).
// PRE = 1: `spare` is the warpgroup's 16 KB of a held ring stage, `early`
// whether the other warpgroup may say it is done with that stage without a
// barrier of both (see store_pre_tma); the other kernels ignore them.
// PROMO: the promoting FP8 kernels, whose consumers' thread index spills
// when an epilogue step needs it (their main loop leaves it no register).
template <typename T, int ACT, int PRE, int N, bool PROMO = false>
__device__ __forceinline__ void epilogue(const Params& p, float (&d)[N], unsigned char* tile, unsigned char* spare,
                                         bool early, float* sbias, int cw, int tid, const TileCoord& tc,
                                         int64_t row0, int64_t m_end, int yl, bool y_tma, const Fp8Scales& fs) {
  static_assert(PRE == 0 || N == 128, "the pre-activation kernels have 128-column tiles");
  const int warp = tid / 32, lane = tid % 32;
  const int bar = 1 + cw;  // named barrier of this consumer warpgroup
  const int64_t col0 = int64_t(tc.nb) * N;
  float* buf = reinterpret_cast<float*>(tile);

  // The previous tile's TMA store must have read the tile before it is
  // overwritten (it had a whole main loop to do so).
  if (tid == 0) bulk_wait_read();
  named_barrier(bar, 128);
  GATEDMLP_WD_MARK(watchdog::kEpiBar, tc.mb, tc.nb);

  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) apply_fp8_scales(p, d, fs, buf, bar, tid);
  if (p.has_bias) {
    // Bias depends only on the columns, which both warpgroups share.
    named_barrier(kBothBar, 256);  // both are done reading the previous tile's
    // cw * 128 + tid is threadIdx.x - 128 (the consumers are warpgroups 1
    // and 2); the promoting kernels take it from threadIdx.x.
    load_bias<N>(p, sbias, PROMO ? static_cast<int>(threadIdx.x) - 128 : cw * 128 + tid, 256, tc.l, col0);
    named_barrier(kBothBar, 256);
  }
  apply_alpha_bias(p, d, sbias, lane);

  if constexpr (PRE == 1) {
    // Its own kernels: next to the register-direct paths below, this path
    // made ptxas spill ~300 B in some of them.
    switch (p.pre_mode) {
      case 0: store_pre_tma<T, 0, ACT>(p, d, tile, spare, early, bar, tid, tc.l, row0, col0); break;
      case 1: store_pre_tma<T, 1, ACT>(p, d, tile, spare, early, bar, tid, tc.l, row0, col0); break;
      default: store_pre_tma<T, 2, ACT>(p, d, tile, spare, early, bar, tid, tc.l, row0, col0); break;
    }
  } else if constexpr (N == 128) {  // (the narrow tile never has a pre-activation)
    if (p.has_pre) {
      // Whole tiles of 16-bit, pair-aligned output take the compact path.
      if (p.pre_vec2 && p.pre_dtype != 2 && col0 + N <= p.u) {
#define GATEDMLP_PRE_FAST(OUT)                                                                   \
  switch (p.pre_mode) {                                                                          \
    case 0: store_pre_fast<OUT, 0>(p, d, warp, lane, tc.l, row0, col0); break;                   \
    case 1: store_pre_fast<OUT, 1>(p, d, warp, lane, tc.l, row0, col0); break;                   \
    default: store_pre_fast<OUT, 2>(p, d, warp, lane, tc.l, row0, col0); break;                  \
  }
        if (p.pre_dtype == 0) {
          GATEDMLP_PRE_FAST(__nv_bfloat16)
        } else {
          GATEDMLP_PRE_FAST(__half)
        }
#undef GATEDMLP_PRE_FAST
      } else {
        store_pre(p, d, warp, lane, tc.l, row0, col0);
      }
    }
  }

  if constexpr (std::is_same_v<T, __nv_fp8_e4m3> && N == 128) {
    if (p.y_fp8) {
      store_y_fp8<ACT>(p, d, tile, bar, tid, yl, row0, col0, m_end, y_tma);
      return;
    }
  }

  // With PRE = 1, store_pre_tma has already computed Y (in d[0 ... 63]).
  constexpr bool kDone = PRE == 1;
  if (y_tma) {
    store_y_tma<ACT, kDone>(p, d, tile, bar, tid, yl, row0, col0, m_end);
    return;
  }
  if constexpr (N != 128) {
    __trap();  // not reached: the host picks the narrow tile only when Y can be stored by TMA
  } else {
#define GATEDMLP_Y_CHUNK(Q)                                                          \
  park_glu_chunk<ACT, kDone, Q>(d, buf, warp, lane, p.clamp_alpha, p.clamp_limit);   \
  named_barrier(bar, 128);                                                           \
  store_chunk(p, buf, tid, yl, row0, col0 + Q * Traits::kChunk, m_end);             \
  if (Q < 3) named_barrier(bar, 128);
  GATEDMLP_Y_CHUNK(0)
  GATEDMLP_Y_CHUNK(1)
  GATEDMLP_Y_CHUNK(2)
  GATEDMLP_Y_CHUNK(3)
#undef GATEDMLP_Y_CHUNK
  }
}

}  // namespace gatedmlp::sm90::detail_
