// The quantized decode kernel on repacked 4-bit affine words
// (QuantFormat::repacked; the order is quant/repack_math.hpp's): the scales
// and biases multiply the mma's fp32 sums, not each weight.
//
// Why: on the checkpoint's order (dequant.cuh) every pair of weights costs a
// shift, a LOP3 and two pair FMAs (take MAGIC off, then q * s + b), and X a
// permute, because a k16 step of the mma mixes elements of four lanes whose
// 32-element spans may lie in four groups: the scale has to be applied before
// the mma. h66 read that kernel as bound by those instructions. If every k16
// step's 16 elements lie in one group, the mma can take the codes as one
// shift and one LOP3 make them: the nibble put in the top four mantissa bits
// of a 16-bit 1.0 is a = 1 + q / 16, exact in bf16 and fp16. Per group and
// weight row
//
//     sum_k x_k (q_k s + b) = 16 s * sum_k x_k a_k + (b - 16 s) * sum_k x_k
//
// the first sum an mma on the LOP3's output, the second an mma of X with an
// A operand of ones, which lands in the same C layout. A pair of weights
// then costs a shift and a LOP3 instead of four instructions; X needs no
// permute; per group and row, two fp32 FMAs per sum. The weights enter
// exactly (q * s + b is never rounded to X's type), as FP8's do. (The
// codes in the low mantissa bits, MAGIC + q, would save a shift per word,
// but the fp32 sums would then carry MAGIC = 128 or 1024 times sum x, and
// lose that many more bits where the terms cancel.)
//
// Measured (H200, docs/notes/quantized-decode.md h79): the dequantization's
// instructions went (no pair FMAs, no permutes) but the kernel's count per
// chunk hardly moved (addresses, moves, the fold and the second mma took
// their place), and it takes 1.11-1.16x the checkpoint order's time at
// M = 1 and 0.98-1.02x at M = 16: neither kernel is bound by its
// dequantization.
//
// The order: a row's K is cut into chunks of 128 elements (16 words; rows
// padded with zero words to whole chunks). Lane t of a quad loads words
// 16c + 4t ... 16c + 4t + 3 of chunk c, as on the checkpoint's order, but
// its word wd holds elements 128c + 32 wd + 8t + e (e = 0 ... 7), nibble i
// element 2i and nibble i + 4 element 2i + 1. So word wd of the four lanes
// covers the 32 elements from 128c + 32 wd, inside one group (groups are 32,
// 64 or 128 and K a multiple of the group), and pair i (nibbles i and
// i + 4) is (e_2i, e_2i+1): X's register i as loaded.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/device_dtype.cuh"
#include "decode_glu/ops.cuh"
#include "quant_decode/dequant.cuh"
#include "quant_decode/params.hpp"
#include "quant_decode/quant_decode.cuh"

namespace gatedmlp::quant_decode {

// The k of one repacked chunk: 4 lanes x 32 elements.
inline constexpr int kRepackedChunk = 128;

// A scale or bias of dtype SDT (0 bf16, 1 fp16, 2 fp32) as loaded, and as a
// float. The loads are prefetched a k-block ahead and converted only where
// used: a conversion at the load would wait for it there.
template <int SDT>
__device__ __forceinline__ uint32_t load_scale_bits(const void* p, int64_t i) {
  if constexpr (SDT == 2) return __ldg(static_cast<const unsigned*>(p) + i);
  else return __ldg(static_cast<const unsigned short*>(p) + i);
}
template <int SDT>
__device__ __forceinline__ float scale_float(uint32_t v) {
  if constexpr (SDT == 0) return __uint_as_float(v << 16);
  else if constexpr (SDT == 1) return __half2float(__ushort_as_half(static_cast<unsigned short>(v)));
  else return __uint_as_float(v);
}

// SPANS: 32-element spans per group (1, 2 or 4: groups of 32, 64, and 128
// or more); a chunk's four words hold 4 / SPANS groups. NT n-tiles of 8
// tokens; SDT the scales' dtype. LaneRows, the partial sums and the
// epilogue are quant_tile's; a k-block is one chunk (two measured slower,
// h79).
template <typename T, int SPANS, int NT, int SDT>
__device__ __forceinline__ void repacked_tile(const Params& qp, float* red, int64_t expert, int count,
                                              const int* xrows, const int* yrows) {
  static_assert(SPANS == 1 || SPANS == 2 || SPANS == 4, "a group holds 1, 2 or 4 spans of a chunk");
  using C = dq::Consts<T>;
  constexpr int kGroups = 4 / SPANS;
  // The lowest of the top four mantissa bits (bf16: 7 bits, fp16: 10), and
  // the mask of both halves' four.
  constexpr int kLow = std::is_same_v<T, __nv_bfloat16> ? 3 : 6;
  constexpr uint32_t kCodeMask = (0xFu << kLow) | (0xFu << (kLow + 16));
  const decode::Params& p = qp.d;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = int64_t(blockIdx.x) * decode::columns_per_cta(p);
  int64_t kb_lo, kb_hi;
  cta_k_blocks(p, kRepackedChunk, &kb_lo, &kb_hi);
  const LaneRows rows = lane_rows(qp, expert, j0, g, t);
  const T* xrow[NT];  // at this lane's 8 elements of a span
  x_rows<T, NT>(p, count, xrows, g, 8 * t, xrow);

  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[0][nt][r] = 0.f;

  // Chunk kb's words (whole: rows are padded to chunks) and, per group and
  // row, the bits of its scale and bias (zero past K).
  auto load_chunk = [&](int64_t kb, uint4 (&wa)[2], uint2 (&sc)[kGroups][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wa[h] = decode::detail_::ld_weights(rows.w[h] + kb * (kRepackedChunk / 8));
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      const int64_t kg = kb * kRepackedChunk + gi * SPANS * 32;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[gi][h] = make_uint2(0, 0);
        if (kg < p.k) {
          const int64_t i = rows.sbase[h] + (kg >> qp.group_shift);
          sc[gi][h] = make_uint2(load_scale_bits<SDT>(rows.s[h], i), load_scale_bits<SDT>(rows.b[h], i));
        }
      }
    }
  };

  // As quant_tile: the next chunk's loads in flight while this one's math runs.
  uint4 wa[2];
  uint2 sc[kGroups][2];
  if (kb_lo + warp < kb_hi) load_chunk(kb_lo + warp, wa, sc);
  for (int64_t kb = kb_lo + warp; kb < kb_hi; kb += p.warps) {
    uint4 cw[2];
    uint2 cs[kGroups][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) cw[h] = wa[h];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) cs[gi][0] = sc[gi][0], cs[gi][1] = sc[gi][1];
    if (kb + p.warps < kb_hi) load_chunk(kb + p.warps, wa, sc);
    const int64_t kc = kb * kRepackedChunk;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      if (kc + gi * SPANS * 32 >= p.k) break;  // the same in every lane
      // sums: x (1 + q / 16) per row and token; xsum: x alone per token
      // (its rows all alike), both over this group's spans of the chunk.
      float sums[NT][4], xsum[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) sums[nt][r] = xsum[nt][r] = 0.f;
#pragma unroll
      for (int sp = 0; sp < SPANS; ++sp) {
        const int wd = gi * SPANS + sp;
        if (kc + 32 * wd >= p.k) break;  // the same in every lane: K is a multiple of 32
        uint32_t ag[4], au[4];
        const uint32_t w0 = detail_::word_of(cw[0], wd), w1 = detail_::word_of(cw[1], wd);
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // nibbles i and i + 4 to bits kLow ... kLow + 3 of each half
          const int sh = 4 * i - kLow;
          ag[i] = dq::and_or(sh > 0 ? w0 >> sh : w0 << -sh, kCodeMask, C::kOne);
          au[i] = dq::and_or(sh > 0 ? w1 >> sh : w1 << -sh, kCodeMask, C::kOne);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 xv = decode::detail_::ld_x(xrow[nt] + kc + 32 * wd);  // inside K: checked above
          decode::detail_::mma_16816<T>(sums[nt], ag[0], au[0], ag[1], au[1], xv.x, xv.y);
          decode::detail_::mma_16816<T>(sums[nt], ag[2], au[2], ag[3], au[3], xv.z, xv.w);
          decode::detail_::mma_16816<T>(xsum[nt], C::kOne, C::kOne, C::kOne, C::kOne, xv.x, xv.y);
          decode::detail_::mma_16816<T>(xsum[nt], C::kOne, C::kOne, C::kOne, C::kOne, xv.z, xv.w);
        }
      }
      // Per row: (16 s, b - 16 s). c0, c1: this lane's gate row (tokens
      // 2t, 2t+1); c2, c3: its up row.
      float s16[2], cb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sv = scale_float<SDT>(cs[gi][h].x);
        s16[h] = 16.f * sv;
        cb[h] = fmaf(-16.f, sv, scale_float<SDT>(cs[gi][h].y));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[0][nt][0] = fmaf(s16[0], sums[nt][0], fmaf(cb[0], xsum[nt][0], acc[0][nt][0]));
        acc[0][nt][1] = fmaf(s16[0], sums[nt][1], fmaf(cb[0], xsum[nt][1], acc[0][nt][1]));
        acc[0][nt][2] = fmaf(s16[1], sums[nt][2], fmaf(cb[1], xsum[nt][0], acc[0][nt][2]));
        acc[0][nt][3] = fmaf(s16[1], sums[nt][3], fmaf(cb[1], xsum[nt][1], acc[0][nt][3]));
      }
    }
  }

  decode::store_partials<NT, 1>(red, acc);
  __syncthreads();
  decode::tile_epilogue<NT, 1>(p, red, j0, expert, count, yrows);
  __syncthreads();
}

template <typename T, int SPANS, int NT, int SDT, int MINB, bool GATHER>
__global__ void __launch_bounds__(kMaxWarps * 32, MINB) repacked_kernel(const __grid_constant__ Params qp) {
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  if constexpr (GATHER) {
    __shared__ decode::GatherShared sh;
    decode::for_each_gathered_tile<NT * 8>(qp.d, sh, [&](int expert, int count, const int* xrows, const int* yrows) {
      repacked_tile<T, SPANS, NT, SDT>(qp, red, expert, count, xrows, yrows);
    });
  } else {
    repacked_tile<T, SPANS, NT, SDT>(qp, red, 0, qp.d.m, nullptr, nullptr);
  }
}

// The instantiations of one X dtype and group: NT n-tiles of 8 tokens (1,
// 2, 4, 8: M <= 64), the scales' dtype, gathered or not. Register use as
// quant_decode_kernel's.
template <typename T, int SPANS, int NT, int SDT>
cudaError_t launch_repacked_sdt(const Params& p, Shape s, cudaStream_t stream) {
  constexpr int kMinBlocks = NT >= 4 ? 1 : 2;
  if (s.gather)
    return launch_grid<kRepackedChunk, NT, true>(repacked_kernel<T, SPANS, NT, SDT, kMinBlocks, true>, p, stream);
  return launch_grid<kRepackedChunk, NT, false>(repacked_kernel<T, SPANS, NT, SDT, kMinBlocks, false>, p, stream);
}

template <typename T, int SPANS, int NT>
cudaError_t launch_repacked_nt(const Params& p, Shape s, cudaStream_t stream) {
  switch (p.scale_dtype) {
    case 0: return launch_repacked_sdt<T, SPANS, NT, 0>(p, s, stream);
    case 1: return launch_repacked_sdt<T, SPANS, NT, 1>(p, s, stream);
    default: return launch_repacked_sdt<T, SPANS, NT, 2>(p, s, stream);
  }
}

template <typename T, int SPANS>
cudaError_t launch_repacked(const Params& p, Shape s, cudaStream_t stream) {
  switch (s.nt) {
    case 1: return launch_repacked_nt<T, SPANS, 1>(p, s, stream);
    case 2: return launch_repacked_nt<T, SPANS, 2>(p, s, stream);
    case 4: return launch_repacked_nt<T, SPANS, 4>(p, s, stream);
    default: return launch_repacked_nt<T, SPANS, 8>(p, s, stream);
  }
}

}  // namespace gatedmlp::quant_decode
