// The quantized decode kernel on repacked 4-bit affine words
// (QuantFormat::repacked; the order is repack.cu's): the scales and biases
// multiply the mma's fp32 sums, not each weight.
//
// Why: on the checkpoint's order (dequant.cuh) every pair of weights costs a
// shift, a LOP3 and two pair FMAs (take MAGIC off, then q * s + b), and X a
// permute, because a k16 step of the mma mixes elements of four lanes whose
// 32-element spans may lie in four groups: the scale has to be applied before
// the mma. That kernel is bound by instructions at 61-78 % of the read
// roofline (docs/notes/quantized-decode.md, h66). If every k16 step's 16
// elements lie in one group, the mma can take the codes as one shift and
// one LOP3 make them: the nibble put in the top four mantissa bits of a
// 16-bit 1.0 is a = 1 + q / 16, exact in bf16 and fp16. Per group and
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

namespace detail_ {
// 16 bytes of X: every load the tile makes is inside K.
__device__ __forceinline__ uint4 ld_x16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
}  // namespace detail_

// A scale or bias of dtype SDT (0 bf16, 1 fp16, 2 fp32) as loaded, and as a
// float. The loads are issued stages ahead and converted only where used: a
// conversion at the load would wait for it there.
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

namespace detail_ {
// 16 bytes global -> shared, around the L1; a group of them per stage.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds16(const uint4* p) {
  uint4 v;
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s));
  return v;
}
}  // namespace detail_

// Stages of a warp's ring: chunks whose loads are in flight at once. Each
// holds the chunk's words in shared memory (1 KB per warp) and its scales
// and biases in registers (2 per group and row); groups of 32 (four a
// chunk) and 8 n-tiles take fewer stages, to keep their registers in bounds
// (no spills).
template <int SPANS, int NT>
inline constexpr int kRepackedStages = SPANS == 1 || NT >= 8 ? 2 : 4;
// Shared memory of one warp's ring.
template <int SPANS, int NT>
inline constexpr int kRepackedRingBytes = kRepackedStages<SPANS, NT> * 2 * 32 * 16;

// SPANS: 32-element spans per group (1, 2 or 4: groups of 32, 64, and 128
// or more); a chunk's four words hold 4 / SPANS groups. NT n-tiles of 8
// tokens; SDT the scales' dtype. ring: this warp's kRepackedRingBytes of
// shared memory. LaneRows, the partial sums and the epilogue are
// quant_tile's.
//
// Why a ring: with one chunk prefetched into registers, as quant_tile does,
// the kernel streamed ~2 TB/s on an H200 whatever its instructions per
// byte (h79): each warp had ~1 KB in flight. The ring keeps kStages chunks
// in flight per warp without the registers to hold them.
template <typename T, int SPANS, int NT, int SDT>
__device__ __forceinline__ void repacked_tile(const Params& qp, float* red, uint4* ring, int64_t expert, int count,
                                              const int* xrows, const int* yrows) {
  static_assert(SPANS == 1 || SPANS == 2 || SPANS == 4, "a group holds 1, 2 or 4 spans of a chunk");
  using C = dq::Consts<T>;
  constexpr int kGroups = 4 / SPANS;
  constexpr int S = kRepackedStages<SPANS, NT>;
  // The lowest of the top four mantissa bits (bf16: 7 bits, fp16: 10), and
  // the mask of both halves' four.
  constexpr int kLow = std::is_same_v<T, __nv_bfloat16> ? 3 : 6;
  constexpr uint32_t kCodeMask = (0xFu << kLow) | (0xFu << (kLow + 16));
  const decode::Params& p = qp.d;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = int64_t(blockIdx.x) * decode::columns_per_cta(p);
  int64_t kb_lo = 0, kb_hi = (p.k + kRepackedChunk - 1) / kRepackedChunk;
  if (p.split_k_blocks) {
    kb_lo = int64_t(blockIdx.y) * p.split_k_blocks;
    kb_hi = min(kb_hi, kb_lo + p.split_k_blocks);
  }
  const LaneRows rows = lane_rows(qp, expert, j0, g, t);
  // Token nt*8 + g of X (count-1 past count), at this lane's 8 elements of a span.
  const T* xrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int mm = min(nt * 8 + g, count - 1);
    xrow[nt] = static_cast<const T*>(p.x) + int64_t(xrows ? xrows[mm] : mm) * p.ldx + 8 * t;
  }

  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[0][nt][r] = 0.f;

  // Stage `slot` <- chunk kb: its words into the ring (rows are padded to
  // whole chunks), the bits of its scales and biases into sc (zero past K).
  // A group is committed even past the warp's last chunk, so that the
  // waits below count stages.
  uint2 sc[S][kGroups][2];
  auto issue = [&](int64_t kb, int slot) {
    if (kb < kb_hi) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        detail_::cp_async16(ring + (slot * 2 + h) * 32 + lane, rows.w[h] + kb * (kRepackedChunk / 8));
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) {
        const int64_t kg = kb * kRepackedChunk + gi * SPANS * 32;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[slot][gi][h] = make_uint2(0, 0);
          if (kg < p.k) {
            const int64_t i = rows.sbase[h] + (kg >> qp.group_shift);
            sc[slot][gi][h] = make_uint2(load_scale_bits<SDT>(rows.s[h], i), load_scale_bits<SDT>(rows.b[h], i));
          }
        }
      }
    }
    detail_::cp_async_commit();
  };

  // Chunk kb from stage `slot` into acc.
  auto consume = [&](int64_t kb, int slot) {
    const uint4 cw[2] = {detail_::lds16(ring + slot * 64 + lane), detail_::lds16(ring + slot * 64 + 32 + lane)};
    const int64_t kc = kb * kRepackedChunk;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      if (kc + gi * SPANS * 32 >= p.k) break;  // the same in every lane
      // sums: x (1 + q / 16) per row and token; xsum: x alone per token (its
      // rows all alike), both over this group's spans of the chunk.
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
          const uint4 xv = detail_::ld_x16(xrow[nt] + kc + 32 * wd);
          decode::detail_::mma_16816<T>(sums[nt], ag[0], au[0], ag[1], au[1], xv.x, xv.y);
          decode::detail_::mma_16816<T>(sums[nt], ag[2], au[2], ag[3], au[3], xv.z, xv.w);
          decode::detail_::mma_16816<T>(xsum[nt], C::kOne, C::kOne, C::kOne, C::kOne, xv.x, xv.y);
          decode::detail_::mma_16816<T>(xsum[nt], C::kOne, C::kOne, C::kOne, C::kOne, xv.z, xv.w);
        }
      }
      // Per row: (16 s, b - 16 s). c0, c1: this lane's gate row (tokens 2t,
      // 2t+1); c2, c3: its up row.
      float s16[2], cb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sv = scale_float<SDT>(sc[slot][gi][h].x);
        s16[h] = 16.f * sv;
        cb[h] = fmaf(-16.f, sv, scale_float<SDT>(sc[slot][gi][h].y));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[0][nt][0] = fmaf(s16[0], sums[nt][0], fmaf(cb[0], xsum[nt][0], acc[0][nt][0]));
        acc[0][nt][1] = fmaf(s16[0], sums[nt][1], fmaf(cb[0], xsum[nt][1], acc[0][nt][1]));
        acc[0][nt][2] = fmaf(s16[1], sums[nt][2], fmaf(cb[1], xsum[nt][0], acc[0][nt][2]));
        acc[0][nt][3] = fmaf(s16[1], sums[nt][3], fmaf(cb[1], xsum[nt][1], acc[0][nt][3]));
      }
    }
  };

  // The warp's chunks kb_lo + warp, + warps, ...: S - 1 in flight ahead of
  // the one consumed. Each lane reads back only the 16-byte pieces it copied
  // itself, so its own wait is the only synchronisation; a slot is refilled
  // only after the chunk read from it has been used.
  const int64_t first = kb_lo + warp, step = p.warps;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) issue(first + st * step, st);
  for (int64_t base = first; base < kb_hi; base += S * step) {
#pragma unroll
    for (int st = 0; st < S; ++st) {
      const int64_t kb = base + st * step;
      if (kb >= kb_hi) break;
      issue(kb + (S - 1) * step, (st + S - 1) % S);
      detail_::cp_async_wait<S - 1>();  // chunk kb's group is done
      consume(kb, st);
    }
  }
  detail_::cp_async_wait<0>();
  __syncthreads();  // red overlays the rings (repacked_kernel)

  decode::store_partials<NT, 1>(red, acc);
  __syncthreads();
  if (p.down) decode::epilogue_down<NT>(p, red, j0, expert, count, yrows);
  else decode::epilogue<NT, 1>(p, red, j0, expert, count, yrows);
  __syncthreads();
}

// Shared memory: each warp's ring during the k-loop, the partial sums
// (quant_tile's red) over the same bytes after it.
template <typename T, int SPANS, int NT, int SDT, int MINB, bool GATHER>
__global__ void __launch_bounds__(kMaxWarps * 32, MINB) repacked_kernel(const __grid_constant__ Params qp) {
  extern __shared__ float4 smem_f4[];
  constexpr int kRing = kRepackedRingBytes<SPANS, NT>;
  uint4* ring = reinterpret_cast<uint4*>(smem_f4) + (threadIdx.x >> 5) * (kRing / 16);
  float* red = reinterpret_cast<float*>(smem_f4);
  if constexpr (GATHER) {
    __shared__ decode::GatherShared sh;
    decode::for_each_gathered_tile<NT * 8>(qp.d, sh, [&](int expert, int count, const int* xrows, const int* yrows) {
      repacked_tile<T, SPANS, NT, SDT>(qp, red, ring, expert, count, xrows, yrows);
    });
  } else {
    repacked_tile<T, SPANS, NT, SDT>(qp, red, ring, 0, qp.d.m, nullptr, nullptr);
  }
}

// The instantiations of one X dtype and group: NT n-tiles of 8 tokens (1,
// 2, 4, 8: M <= 64), the scales' dtype, gathered or not. Register use as
// quant_decode_kernel's.
template <typename T, int SPANS, int NT, int SDT>
cudaError_t launch_repacked_sdt(const Params& p, Shape s, cudaStream_t stream) {
  constexpr int kMinBlocks = NT >= 4 ? 1 : 2;
  constexpr int kRing = kRepackedRingBytes<SPANS, NT>;
  if (s.gather)
    return launch_grid<kRepackedChunk, NT, true>(repacked_kernel<T, SPANS, NT, SDT, kMinBlocks, true>, p, stream,
                                                 kRing);
  return launch_grid<kRepackedChunk, NT, false>(repacked_kernel<T, SPANS, NT, SDT, kMinBlocks, false>, p, stream,
                                                kRing);
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
