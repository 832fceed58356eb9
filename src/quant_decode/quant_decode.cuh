// The quantized decode kernel: gate/up GEMM + GLU for a few rows of X
// (M <= 64) from quantized weights, bound by streaming the packed weights
// once. The 16-bit decode kernel's design (decode_glu/decode_glu.cuh: swap AB,
// mma.m16n8k16 with 8 gate and 8 up weight rows as A and the tokens as B,
// loads straight into registers, the K split over the CTA's warps, the
// shared epilogue), with the weights dequantized in registers between the
// load and the mma (dequant.cuh). With column groups (CG > 1: 4-bit
// weights, M <= 16, column_groups() in launch.cpp) a CTA covers 8 CG
// columns and each X fragment feeds CG groups' weights: at M = 16 a group
// of 8 columns reads 4x as many bytes of X as of int4 words.
//
// Each lane streams 16 bytes of packed words per row per chunk: 32 elements
// of 4-bit formats, 16 of 8-bit ones, along K, at k0 + t * (elements per
// lane); the chunk of 4 lanes spans 128 (4-bit) or 64 (8-bit) of K. Every
// affine and MXFP4 group (32 and more) holds a lane's elements whole, so
// each lane needs one scale (and bias) per row per chunk; FP8's blocks of
// 128 hold a whole chunk, whose fp32 sums its scale multiplies. X is loaded
// for the same k, one word's worth of elements at a time (16 bytes for
// 4-bit, 8 for 8-bit), and paired as the dequantized weights are.
//
// The down projection (Params::down): 16 rows of one weight, 16 output
// columns per CTA, epilogue_down (decode_glu.cuh says how); its K may be
// split over gridDim.y CTAs that write partial sums (Params::partials).
//
// K is a multiple of 16 (of the group, for affine and MXFP4): a lane's
// elements are all in K or all past it. In a k-block that crosses K, the
// lanes past it load nothing and get zero weights and X, so they add exact
// zeros.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/layout_math.hpp"
#include "decode_glu/epilogue.cuh"
#include "decode_glu/gather.cuh"
#include "decode_glu/ops.cuh"
#include "quant_decode/dequant.cuh"
#include "quant_decode/params.hpp"

namespace gatedmlp::quant_decode {

namespace detail_ {

// 8 bytes of X, through L1 like the 16-byte loads; the second zero where !ok.
__device__ __forceinline__ uint2 ld_x8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_x8_if(const void* p, bool ok) {
  uint2 v = make_uint2(0, 0);
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n"
      " @q ld.global.nc.v2.u32 {%0, %1}, [%2];\n}"
      : "+r"(v.x), "+r"(v.y)
      : "l"(p), "r"(int(ok)));
  return v;
}

// One word's worth of X for token row `xrow` at element k: kElems 16-bit
// values as kElems / 2 registers.
// WHOLE: inside K, loaded without a predicate.
template <int kElems, bool WHOLE>
__device__ __forceinline__ void load_x(const void* xrow_at_k, bool ok, uint32_t (&x)[kElems / 2]) {
  if constexpr (kElems == 8) {
    const uint4 v = WHOLE ? decode::detail_::ld_x(xrow_at_k) : decode::detail_::ld_x_if(xrow_at_k, ok);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const uint2 v = WHOLE ? ld_x8(xrow_at_k) : ld_x8_if(xrow_at_k, ok);
    x[0] = v.x, x[1] = v.y;
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace detail_

inline constexpr int kMaxWarps = decode::kMaxWarps;

// Elements of a lane's 16 bytes of words per chunk.
template <int FMT>
inline constexpr int kLaneElemsOf = FMT == kInt8 || FMT == kFp8 ? 16 : 32;

// One lane's weight rows: the gate and up rows of column j0 + g (U-1 past
// U; the down projection's rows j0 + g and j0 + 8 + g), its 16 bytes of
// each row's words (4 * t words in), and where the rows' scales and biases
// start. expert: 0, or the gathered call's.
struct LaneRows {
  const uint32_t* w[2];
  const void* s[2];
  const void* b[2];
  int64_t sbase[2];
};

__device__ __forceinline__ LaneRows lane_rows(const Params& qp, int64_t expert, int64_t j0, int g, int t) {
  const decode::Params& p = qp.d;
  LaneRows r;
  const int64_t j = min(j0 + g, p.u - 1);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool up_tensor = p.separate && h;
    // 32-bit: blocker() keeps 2U below 2^31.
    const uint32_t row = p.down       ? uint32_t(min(j0 + h * 8 + g, p.u - 1))
                         : p.separate ? uint32_t(j)
                                      : gatedmlp::detail::fused_row<uint32_t>(uint32_t(j), h, uint32_t(p.group), p.first);
    r.w[h] = static_cast<const uint32_t*>(up_tensor ? p.w_up : p.w) + expert * p.sw + int64_t(row) * p.ldw + 4 * t;
    r.s[h] = up_tensor ? qp.scales_up : qp.scales;
    r.b[h] = up_tensor ? qp.biases_up : qp.biases;
    r.sbase[h] = expert * qp.expert_scales + int64_t(row >> qp.row_shift) * qp.groups;
  }
  return r;
}

// This CTA's k-blocks of block_k elements: all of K, or its split's share
// (Params::split_k_blocks).
__device__ __forceinline__ void cta_k_blocks(const decode::Params& p, int64_t block_k, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = (p.k + block_k - 1) / block_k;
  if (p.split_k_blocks) {
    *lo = int64_t(blockIdx.y) * p.split_k_blocks;
    *hi = min(*hi, *lo + p.split_k_blocks);
  }
}

// Token nt*8 + g of X for each n-tile (count-1 past count; the tile's rows
// `xrows`, gathered, or 0 ... count-1), at element `at` of the row.
template <typename T, int NT>
__device__ __forceinline__ void x_rows(const decode::Params& p, int count, const int* xrows, int g, int at,
                                       const T* (&xrow)[NT]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int mm = min(nt * 8 + g, count - 1);
    xrow[nt] = static_cast<const T*>(p.x) + int64_t(xrows ? xrows[mm] : mm) * p.ldx + at;
  }
}

// One tile: this CTA's columns from j0 over its k-blocks for `count` rows
// of X, then the epilogue. expert: 0, or the gathered call's (its words at
// expert * sw, its scales and biases at expert * expert_scales, its bias at
// expert * sb); xrows / yrows: the tile's rows of x and y (gathered), or null
// for rows 0 ... count-1. CG: groups of 8 columns per warp (gate/up, one
// chunk per k-block), each X fragment loaded once for all of them. Ends
// with a __syncthreads().
template <typename T, int FMT, bool PACKED, int NT, int UNROLL, int CG>
__device__ __forceinline__ void quant_tile(const Params& qp, float* red, int64_t expert, int count, const int* xrows,
                                           const int* yrows) {
  using namespace detail_;
  using D = Dequant<T, FMT, PACKED>;
  const decode::Params& p = qp.d;

  constexpr int kLaneElems = kLaneElemsOf<FMT>;
  constexpr int kChunk = 4 * kLaneElems;  // k per chunk (4 lanes)
  constexpr int kBlockK = kChunk * UNROLL;
  constexpr int kW = D::kWordElems, kP = D::kPairs;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  static_assert(CG == 1 || UNROLL == 1, "column groups take one chunk per k-block");
  const int64_t j0 = int64_t(blockIdx.x) * decode::columns_per_cta(p) * CG;
  int64_t kb_lo, kb_hi;
  cta_k_blocks(p, kBlockK, &kb_lo, &kb_hi);
  LaneRows rows[CG];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) rows[cg] = lane_rows(qp, expert, j0 + 8 * cg, g, t);
  const T* xrow[NT];
  x_rows<T, NT>(p, count, xrows, g, kLaneElems * t, xrow);

  float acc[CG][NT][4];
  decode::zero_sums(acc);

  // This warp's k-blocks are kb_first, kb_first + warps, ...: first the
  // whole ones (inside K), loaded and multiplied with no test on K, then at
  // most one that crosses K (K not a multiple of kBlockK), with every load
  // predicated. The cursors step by a constant per k-block: the loop keeps
  // no 64-bit index and tests nothing but its trip count (h80 measured the
  // tests and index arithmetic at 7-13 % of the time at M = 1).
  const int nw = p.warps;
  const int64_t kb_first = kb_lo + warp;
  const int64_t kb_whole = min(kb_hi, p.k / kBlockK);  // k-blocks below it lie inside K
  const int n_whole = kb_first < kb_whole ? int((kb_whole - kb_first + nw - 1) / nw) : 0;
  const bool crosses = kb_whole < kb_hi && kb_first <= kb_whole && (kb_whole - kb_first) % nw == 0;
  constexpr int kBlockWords = 16 * UNROLL;  // per row: 4 per lane per chunk
  const int wstep = kBlockWords * nw, kstep = kBlockK * nw;
  const uint32_t* wp[CG][2];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg)
#pragma unroll
    for (int h = 0; h < 2; ++h) wp[cg][h] = rows[cg].w[h] + kb_first * kBlockWords;
  int64_t k_load = kb_first * kBlockK;  // the k-block whose loads are issued next
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xrow[nt] += kb_first * kBlockK;  // the k-block multiplied next

  // The packed words and scales of the k-block at wp / k_load: all of its
  // loads in flight together. WHOLE: inside K.
  auto load_block = [&](auto whole, uint4(&wa)[UNROLL][CG][2], Scale(&sc)[UNROLL][CG][2]) {
    constexpr bool kWhole = decltype(whole)::value;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const bool ok = kWhole || k_load + u * kChunk + kLaneElems * t < p.k;  // this lane's elements
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wa[u][cg][h] = kWhole ? decode::detail_::ld_weights(wp[cg][h] + u * 16)
                                : decode::detail_::ld_weights_if(wp[cg][h] + u * 16, ok);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      // A scale that multiplies the weights: this lane's elements' group.
      // One that multiplies the chunk's sums (FP8): the chunk's, in every
      // lane, since lane t's part of the C fragment is tokens 2t, 2t+1 over
      // all of the chunk's k, whether or not lane t's own elements are in K.
      const int64_t ke = k_load + u * kChunk + (D::kAccScale ? 0 : kLaneElems * t);
      const bool ok = kWhole || ke < p.k;
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sc[u][cg][h] = D::load(rows[cg].s[h], rows[cg].b[h], qp.scale_dtype,
                                 rows[cg].sbase[h] + (ke >> qp.group_shift), ok);
    }
  };

  // The k-block at xrow, its words and scales in cw / cs, into acc. kc: its
  // first k (only read where it crosses K).
  auto multiply = [&](auto whole, const uint4(&cw)[UNROLL][CG][2], const Scale(&cs)[UNROLL][CG][2], int64_t kc) {
    constexpr bool kWhole = decltype(whole)::value;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const bool ok = kWhole || kc + u * kChunk + kLaneElems * t < p.k;
      // FP8: the chunk's sums, scaled into acc after it (its 64 k lie in one
      // block of 128, so all four lanes of a row share the scale).
      float part[CG][NT][4];
      if constexpr (D::kAccScale) decode::zero_sums(part);
      float(&sums)[CG][NT][4] = D::kAccScale ? part : acc;
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
        uint32_t xp[NT][kP];  // loaded with the first group's mma, reused by the others
#pragma unroll
        for (int cg = 0; cg < CG; ++cg) {
          uint32_t ag[kP], au[kP];
          D::word(word_of(cw[u][cg][0], wd), cs[u][cg][0], ag);
          D::word(word_of(cw[u][cg][1], wd), cs[u][cg][1], au);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (cg == 0) {
              uint32_t xr[kW / 2];
              load_x<kW, kWhole>(xrow[nt] + u * kChunk + wd * kW, ok, xr);
              D::x_pairs(xr, xp[nt]);
            }
#pragma unroll
            for (int s = 0; s < kP / 2; ++s)
              decode::detail_::mma_16816<T>(sums[cg][nt], ag[2 * s], au[2 * s], ag[2 * s + 1], au[2 * s + 1],
                                            xp[nt][2 * s], xp[nt][2 * s + 1]);
          }
        }
      }
      if constexpr (D::kAccScale) {
        // c0, c1: this lane's gate row; c2, c3: its up row.
#pragma unroll
        for (int cg = 0; cg < CG; ++cg)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            acc[cg][nt][0] = fmaf(cs[u][cg][0].fs, part[cg][nt][0], acc[cg][nt][0]);
            acc[cg][nt][1] = fmaf(cs[u][cg][0].fs, part[cg][nt][1], acc[cg][nt][1]);
            acc[cg][nt][2] = fmaf(cs[u][cg][1].fs, part[cg][nt][2], acc[cg][nt][2]);
            acc[cg][nt][3] = fmaf(cs[u][cg][1].fs, part[cg][nt][3], acc[cg][nt][3]);
          }
      }
    }
  };

  // Software pipeline in registers: the next k-block's loads are in flight
  // while this one is dequantized and multiplied, so a warp's loads never
  // wait on its math.
  uint4 wa[UNROLL][CG][2];
  Scale sc[UNROLL][CG][2];
  if (n_whole > 0) load_block(std::true_type{}, wa, sc);
  else if (crosses) load_block(std::false_type{}, wa, sc);
#pragma unroll 1
  for (int left = n_whole; left > 0; --left) {
    uint4 cw[UNROLL][CG][2];
    Scale cs[UNROLL][CG][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int h = 0; h < 2; ++h) cw[u][cg][h] = wa[u][cg][h], cs[u][cg][h] = sc[u][cg][h];
#pragma unroll
    for (int cg = 0; cg < CG; ++cg) wp[cg][0] += wstep, wp[cg][1] += wstep;
    k_load += kstep;
    if (left > 1) load_block(std::true_type{}, wa, sc);
    else if (crosses) load_block(std::false_type{}, wa, sc);
    multiply(std::true_type{}, cw, cs, 0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xrow[nt] += kstep;
  }
  if (crosses) multiply(std::false_type{}, wa, sc, kb_whole * kBlockK);

  decode::store_partials<NT, CG>(red, acc);
  __syncthreads();
  decode::tile_epilogue<NT, CG>(p, red, j0, expert, count, yrows);
  __syncthreads();
}

// GATHER: the rows and experts of a gathered call (decode_glu/gather.cuh);
// otherwise all p.m rows of the one weight.
template <typename T, int FMT, bool PACKED, int NT, int UNROLL, int MINB, bool GATHER, int CG = 1>
__global__ void __launch_bounds__(kMaxWarps * 32, MINB) quant_decode_kernel(const __grid_constant__ Params qp) {
  static_assert(CG == 1 || !GATHER, "column groups: gate/up calls that are not gathered");
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  if constexpr (GATHER) {
    __shared__ decode::GatherShared sh;
    decode::for_each_gathered_tile<NT * 8>(qp.d, sh, [&](int expert, int count, const int* xrows, const int* yrows) {
      quant_tile<T, FMT, PACKED, NT, UNROLL, 1>(qp, red, expert, count, xrows, yrows);
    });
  } else {
    quant_tile<T, FMT, PACKED, NT, UNROLL, CG>(qp, red, 0, qp.d.m, nullptr, nullptr);
  }
}

// Launches `kernel` (k-blocks of kBlockK elements, NT n-tiles, CG column
// groups) with min(p.d.warps, k-blocks) warps per CTA and one CTA per 8 CG
// columns (16 for the down projection); a gathered call (GATHER) takes one
// grid row per slot of a distinct expert.
template <int kBlockK, int NT, bool GATHER, typename Kernel, int CG = 1>
cudaError_t launch_grid(Kernel kernel, Params p, cudaStream_t stream) {
  const int64_t k_blocks = (p.d.k + kBlockK - 1) / kBlockK;
  const int64_t per_cta = p.d.split_k_blocks ? p.d.split_k_blocks : k_blocks;
  p.d.warps = static_cast<int>(per_cta < p.d.warps ? per_cta : p.d.warps);
  const int64_t cols = decode::columns_per_cta(p.d) * CG;
  const unsigned splits = p.d.split_k_blocks ? static_cast<unsigned>((k_blocks + per_cta - 1) / per_cta) : 1u;
  // Gathered (never split): one grid row per slot of a distinct expert, at most min(E, n).
  const int64_t slots = p.d.experts < p.d.n_indices ? p.d.experts : p.d.n_indices;
  const unsigned ys = GATHER ? static_cast<unsigned>(slots < decode::kMaxGridY ? slots : decode::kMaxGridY) : splits;
  const dim3 grid(static_cast<unsigned>((p.d.u + cols - 1) / cols), ys);
  kernel<<<grid, p.d.warps * 32, decode::red_bytes<NT, CG>(p.d.warps), stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int FMT, bool PACKED, int NT, int UNROLL, int MINB, bool GATHER = false, int CG = 1>
cudaError_t launch_kernel(const Params& p, cudaStream_t stream) {
  using Kernel = decltype(&quant_decode_kernel<T, FMT, PACKED, NT, UNROLL, MINB, GATHER, CG>);
  return launch_grid<4 * kLaneElemsOf<FMT> * UNROLL, NT, GATHER, Kernel, CG>(
      quant_decode_kernel<T, FMT, PACKED, NT, UNROLL, MINB, GATHER, CG>, p, stream);
}

// The instantiations of one (X dtype, format): packed or fp32 dequantization
// where the format has both, NT n-tiles of 8 tokens (1, 2, 4, 8: M <= 64),
// and s.unroll chunks per k-block (1 or 2); column groups (s.cg, from
// column_groups()) 2 at NT = 1 and 4 at NT = 2.
// Four and eight n-tiles take more than 128 registers (they spill at 2 CTAs
// of 8 warps): launched with 4 warps, they fit 3 CTAs per SM anyway. So
// do four column groups. Gathered tiles of up to 16 rows also come with two
// chunks per k-block (122-128 registers, h97); larger ones with one.
template <typename T, int FMT, bool PACKED, int NT>
cudaError_t launch_unroll(const Params& p, Shape s, cudaStream_t stream) {
  constexpr int kMinBlocks = NT >= 4 ? 1 : 2;
  if (s.gather) {
    if constexpr (NT <= 2)
      if (s.unroll == 2) return launch_kernel<T, FMT, PACKED, NT, 2, kMinBlocks, true>(p, stream);
    return launch_kernel<T, FMT, PACKED, NT, 1, kMinBlocks, true>(p, stream);
  }
  if (s.unroll == 2) return launch_kernel<T, FMT, PACKED, NT, 2, kMinBlocks>(p, stream);
  // 4-bit formats only (column_groups()); not on MXFP4's fp32
  // dequantization (fp16 X: 16 bytes of spills).
  constexpr bool kGroups = FMT == kInt4 || (FMT == kMxfp4 && PACKED);
  if constexpr (NT == 1 && kGroups)
    if (s.cg == 2) return launch_kernel<T, FMT, PACKED, 1, 1, 2, false, 2>(p, stream);
  if constexpr (NT == 2 && kGroups)
    if (s.cg == 4) return launch_kernel<T, FMT, PACKED, 2, 1, 1, false, 4>(p, stream);
  return launch_kernel<T, FMT, PACKED, NT, 1, kMinBlocks>(p, stream);
}

template <typename T, int FMT, bool PACKED>
cudaError_t launch_nt(const Params& p, Shape s, cudaStream_t stream) {
  switch (s.nt) {
    case 1: return launch_unroll<T, FMT, PACKED, 1>(p, s, stream);
    case 2: return launch_unroll<T, FMT, PACKED, 2>(p, s, stream);
    case 4: return launch_unroll<T, FMT, PACKED, 4>(p, s, stream);
    default: return launch_unroll<T, FMT, PACKED, 8>(p, s, stream);
  }
}

template <typename T, int FMT>
cudaError_t launch_format(const Params& p, Shape s, cudaStream_t stream) {
  if constexpr (FMT == kFp8) {
    return launch_nt<T, FMT, true>(p, s, stream);
  } else if constexpr (FMT == kInt8) {
    return launch_nt<T, FMT, false>(p, s, stream);
  } else if constexpr (FMT == kMxfp4 && !std::is_same_v<T, __nv_bfloat16>) {
    return launch_nt<T, FMT, false>(p, s, stream);  // 2^(e - 127) does not fit fp16
  } else {
    return s.packed_math ? launch_nt<T, FMT, true>(p, s, stream) : launch_nt<T, FMT, false>(p, s, stream);
  }
}

}  // namespace gatedmlp::quant_decode
