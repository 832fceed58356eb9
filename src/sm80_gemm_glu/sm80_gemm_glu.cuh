// Portable fused GEMM + GLU kernel: mma.sync tensor cores, sm_80 and newer.
//
// One CTA computes a tile of BM rows x BNO output columns of Y. For that it
// needs 2*BNO weight rows: the BNO gate rows of its output columns followed by
// the BNO up rows. The loader gathers those rows from wherever the layout puts
// them (separate tensors, stacked, interleaved by any G, either half first,
// [out,K] or [K,out] storage), so shared memory always holds
// [gate rows | up rows] x BK and the math never sees the layout. Where the
// tile's gate rows (and its up rows) are evenly spaced in memory -- separate,
// stacked, even/odd, blocks that are multiples of the tile -- two pointers and
// a stride address them; otherwise a per-row pointer table in shared memory.
//
// Each warp owns WM rows x WNO output columns and keeps two accumulators of the
// same shape, one over the gate rows and one over the up rows, so the gate and
// up values of an output element end in the same thread. The epilogue parks
// the fp32 accumulators in the idle pipeline shared memory and then walks the
// tile 8 output columns at a time: bias, alpha, act(g) * u, one 16-byte store.
// Only Y (and the pre-activation, if asked) reaches device memory.
//
// Pipeline: a STAGES-deep ring of shared-memory tiles. With aligned operands
// the loads are 16-byte cp.async (K, strides and pointers multiples of 8
// elements), unpredicated for interior tiles; otherwise each element is loaded
// by an ordinary load and zero-filled past the edges, which is slower but
// takes any shape and stride.
//
// Shared-memory rows are BK = 64 elements (128 bytes, eight 16-byte chunks);
// the chunk index is XORed with row%8 so the 8 rows one ldmatrix phase reads
// hit 32 distinct banks. Fragments are double-buffered in registers: the
// ldmatrix of k-step s+1 is issued before the mma of step s.
//
// Why these tiles (measured on H100, docs/notes/portable-kernel.md): 128x64-output tiles of 4 warps
// (each 64 rows x 64 GEMM columns, 128 fp32 accumulators) leave room for two
// CTAs per SM, so one CTA's epilogue overlaps the other's main loop; a
// 128x128 tile of 8 warps (one CTA per SM) was slower. 64-row tiles serve
// small M, where there are too few 128-row tiles to fill the SMs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "common/layout_math.hpp"
#include "sm80_gemm_glu/params.hpp"

namespace gatedmlp::sm80 {

namespace detail_ {

using gatedmlp::detail::load_float;
using gatedmlp::detail::store_float;

// Eight adjacent elements at i (16-byte aligned for 16-bit types, 32 for fp32).
__device__ __forceinline__ void store_vec8(void* p, int dtype, int64_t i, const float (&v)[8]) {
  if (dtype == 2) {
    float4* d = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  uint32_t w[4];
  for (int e = 0; e < 4; ++e) {
    w[e] = dtype == 0 ? gatedmlp::detail::pack2<__nv_bfloat16>(v[2 * e], v[2 * e + 1])
                      : gatedmlp::detail::pack2<__half>(v[2 * e], v[2 * e + 1]);
  }
  // One 16-byte store: a uint4 assignment here compiled to four 4-byte ones.
  gatedmlp::detail::store_global_16B(static_cast<uint16_t*>(p) + i, w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16_full(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Element offset of chunk c (8 elements) of row r in a swizzled [rows][64]
// tile: the 8 rows one ldmatrix phase reads land on 8 different chunk columns.
__device__ __forceinline__ int swz(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }

// Where logical weight row (half, j) lives: the tensor and its physical row.
__device__ __forceinline__ int64_t weight_row(const Params& p, int half, int64_t j, const void** base) {
  if (p.separate) {
    *base = half == 0 ? p.w : p.w_up;
    return j;
  }
  *base = p.w;
  return gatedmlp::detail::fused_row(j, half, p.group, p.first);
}

// Column of the pre-activation output (and index into a fused bias) that
// holds logical (half, j): the weight row for fused weights, [gate | up] for
// separate ones.
__device__ __forceinline__ int64_t pre_col(const Params& p, int half, int64_t j) {
  if (p.separate) return half == 0 ? j : p.u + j;
  return gatedmlp::detail::fused_row(j, half, p.group, p.first);
}

// The second half of the epilogue. The accumulators of the whole CTA tile
// sit in shared memory as fp32 [BM][2*BNO + kAccPad] (gate columns, then up
// columns); each thread now takes 8 consecutive output columns of a row at a
// time: bias, alpha, activation, one 16-byte store. The loop is not unrolled
// over the tile, and the activation is a template parameter chosen once
// outside it, so the code stays small (an inlined per-register epilogue made
// the kernel hundreds of KB of SASS and its instruction-cache misses stalled
// the main loop; see docs/notes/portable-kernel.md).
template <int ACT, int BM, int BNO, int THREADS>
__device__ __forceinline__ void store_tile(const Params& p, const float* sacc, int ld_acc, int l, int64_t m0,
                                           int64_t n0) {
  constexpr int kVecs = BNO / 8;  // 8-column groups per row
  const int64_t boff = int64_t(l) * p.sb;
  for (int idx = threadIdx.x; idx < BM * kVecs; idx += THREADS) {
    const int r = idx / kVecs;
    const int c0 = (idx % kVecs) * 8;
    const int64_t row = m0 + r;
    const int64_t j0 = n0 + c0;
    if (row >= p.m || j0 >= p.u) continue;
    const float4* gs = reinterpret_cast<const float4*>(sacc + r * ld_acc + c0);
    const float4* us = reinterpret_cast<const float4*>(sacc + r * ld_acc + BNO + c0);
    const float4 g4[2] = {gs[0], gs[1]}, u4[2] = {us[0], us[1]};
    const float* gv = reinterpret_cast<const float*>(g4);
    const float* uv = reinterpret_cast<const float*>(u4);
    float out[8], gg[8], uu[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      gg[e] = gv[e] * p.alpha;
      uu[e] = uv[e] * p.alpha;
      if (p.has_bias && j0 + e < p.u) {
        gg[e] += load_float(p.bias, p.bias_dtype, boff + pre_col(p, 0, j0 + e));  // separate: j
        uu[e] += p.separate ? load_float(p.bias_up, p.bias_dtype, boff + j0 + e)
                            : load_float(p.bias, p.bias_dtype, boff + pre_col(p, 1, j0 + e));
      }
    }
    if (p.out_dtype != 2) {
      // 16-bit Y: the one-MUFU tanh form of the activation (glu_out16).
#pragma unroll
      for (int e = 0; e < 8; ++e)
        out[e] = gatedmlp::detail::glu_out16<float>(ACT, gg[e], uu[e], p.clamp_alpha, p.clamp_limit);
    } else {
      // fp32 Y: pairs of sigmoids share a reciprocal (docs/notes/portable-kernel.md, v11: 1 %
      // faster than one each; groups of 8 measured no faster than pairs).
#pragma unroll
      for (int e = 0; e < 8; e += 2)
        gatedmlp::detail::glu_n<2>(ACT, gg + e, uu + e, p.clamp_alpha, p.clamp_limit, out + e);
    }
    if (p.has_pre) {
      const int64_t base = int64_t(l) * p.spre + row * p.ldpre;
      for (int e = 0; e < 8 && j0 + e < p.u; ++e) {
        store_float(p.pre, p.pre_dtype, base + pre_col(p, 0, j0 + e), gg[e]);
        store_float(p.pre, p.pre_dtype, base + pre_col(p, 1, j0 + e), uu[e]);
      }
    }
    const int64_t yi = int64_t(l) * p.sy + row * p.ldy + j0;
    if (p.y_vec_stores && j0 + 8 <= p.u) {
      store_vec8(p.y, p.out_dtype, yi, out);
    } else {
      for (int e = 0; e < 8 && j0 + e < p.u; ++e) store_float(p.y, p.out_dtype, yi + e, out[e]);
    }
  }
}

}  // namespace detail_

template <typename T, int BM, int BNO, int WARPS_M, int WARPS_N, int STAGES, bool VEC>
struct Sm80GemmGlu {
  static constexpr int BK = 64;
  static constexpr int BN = 2 * BNO;  // gate rows then up rows
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M;
  static constexpr int WNO = BNO / WARPS_N;
  static constexpr int MT = WM / 16;
  static constexpr int NT = WNO / 8;
  static constexpr int kStageElems = (BM + BN) * BK;
  static constexpr int kSmemBytes = STAGES * kStageElems * 2 + BN * 8;  // + B row pointers
  // The epilogue's fp32 accumulator tile reuses the pipeline stages. The pad
  // of 8 floats staggers rows across banks for the float2 writes.
  static constexpr int kAccLd = 2 * BNO + 8;
  static_assert(BM * kAccLd * 4 <= STAGES * kStageElems * 2, "accumulator tile must fit in the stages");
  static_assert(WM % 16 == 0 && WNO % 16 == 0, "warp tile must be whole 16x16 fragments");
  static_assert(BM * BK / 8 % kThreads == 0 && BN * BK / 8 % kThreads == 0, "chunks must split evenly");
};

template <typename T, int BM, int BNO, int WARPS_M, int WARPS_N, int STAGES, bool VEC>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32)
    sm80_gemm_glu_kernel(const __grid_constant__ Params p) {
  using K = Sm80GemmGlu<T, BM, BNO, WARPS_M, WARPS_N, STAGES, VEC>;
  constexpr int BK = K::BK, BN = K::BN, MT = K::MT, NT = K::NT, WM = K::WM, WNO = K::WNO;
  using namespace detail_;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / WARPS_N;
  const int wn = warp % WARPS_N;

  // Grouped raster: GROUP consecutive M tiles walk the N tiles together, so a
  // weight tile is reused from L2 by the CTAs that run at the same time.
  constexpr int GROUP = 8;
  const int pid = blockIdx.x;
  const int span = GROUP * p.n_tiles;
  const int first_m = (pid / span) * GROUP;
  const int gsz = min(p.m_tiles - first_m, GROUP);
  const int tm = first_m + (pid % span) % gsz;
  const int tn = (pid % span) / gsz;
  const int64_t m0 = int64_t(tm) * BM;
  const int64_t n0 = int64_t(tn) * BNO;
  const int k_tiles = static_cast<int>((p.k + BK - 1) / BK);

  for (int l = blockIdx.y; l < p.batch; l += gridDim.y) {
    const T* x = static_cast<const T*>(p.x) + int64_t(l) * p.sx;
    const int64_t woff = int64_t(l) * p.sw;

    // Per-thread source rows for the 16-byte loader, fixed for the whole tile.
    // A rows are evenly spaced, so one pointer serves all of a thread's A
    // chunks. B rows are a gather through the layout: their pointers live in
    // shared memory, computed once per tile (null past u).
    constexpr int kChunksPerRow = BK / 8;
    constexpr int kRowStep = K::kThreads / kChunksPerRow;
    static_assert(BNO % kRowStep == 0, "a thread's B chunks must split evenly between the halves");
    const int my_chunk = tid % kChunksPerRow;
    const T* a_src = x + (m0 + tid / kChunksPerRow) * p.ldx + my_chunk * 8;
    const int64_t a_step = kRowStep * p.ldx;
    const bool interior = m0 + BM <= p.m && n0 + BNO <= p.u;
    // In most layouts (separate, stacked, even/odd, blocks that are multiples
    // of the tile) the tile's gate rows, and its up rows, are each evenly
    // spaced in memory: then two pointers and a stride replace the per-row
    // pointer table and its shared-memory reads in the main loop.
    int64_t b_stride = 0;
    const T* b_base[2] = {nullptr, nullptr};
    if (VEC && interior) {
      if (p.separate) {
        b_stride = p.ldw;
      } else if (p.group == 1) {
        b_stride = 2 * p.ldw;
      } else if (p.group % BNO == 0 || p.group == p.u) {
        b_stride = p.ldw;
      }
      if (b_stride != 0)
        for (int h = 0; h < 2; ++h) {
          const void* base;
          const int64_t row = weight_row(p, h, n0, &base);
          b_base[h] = static_cast<const T*>(base) + woff + row * p.ldw + (tid / kChunksPerRow) * b_stride + my_chunk * 8;
        }
    }
    const bool b_affine = b_stride != 0;
    const int64_t b_step = kRowStep * b_stride;
    const T** s_brow = reinterpret_cast<const T**>(smem_raw + STAGES * K::kStageElems * 2);
    for (int r = tid; r < BN; r += K::kThreads) {
      const int64_t j = n0 + (r % BNO);
      const T* row = nullptr;
      if (j < p.u) {
        const void* base;
        const int64_t wr = weight_row(p, r / BNO, j, &base);
        row = static_cast<const T*>(base) + woff + (p.in_out ? wr : wr * p.ldw);
      }
      s_brow[r] = row;
    }
    __syncthreads();

    auto load_tile = [&](int stage, int kt) {
      T* sa = smem + stage * K::kStageElems;
      T* sb = sa + BM * BK;
      const int64_t k0 = int64_t(kt) * BK;
      if constexpr (VEC) {
        const int64_t gk = k0 + my_chunk * 8;
        if (interior && k0 + BK <= p.k) {
          // Every row and chunk in range: no predicates, no zero-fill operand.
          const T* a = a_src + k0;
#pragma unroll
          for (int i = 0; i < BM / kRowStep; ++i)
            cp_async_16_full(smem_addr(sa + swz(tid / kChunksPerRow + i * kRowStep, my_chunk)), a + i * a_step);
          if (b_affine) {
            constexpr int kHalf = BNO / kRowStep;  // chunks of one half per thread
#pragma unroll
            for (int i = 0; i < BN / kRowStep; ++i) {
              const int r = tid / kChunksPerRow + i * kRowStep;
              cp_async_16_full(smem_addr(sb + swz(r, my_chunk)), b_base[i / kHalf] + (i % kHalf) * b_step + k0);
            }
            return;
          }
#pragma unroll
          for (int i = 0; i < BN / kRowStep; ++i) {
            const int r = tid / kChunksPerRow + i * kRowStep;
            cp_async_16_full(smem_addr(sb + swz(r, my_chunk)), s_brow[r] + gk);
          }
          return;
        }
        const bool k_ok = gk < p.k;
#pragma unroll
        for (int i = 0; i < BM / kRowStep; ++i) {
          const int r = tid / kChunksPerRow + i * kRowStep;
          const bool ok = k_ok && m0 + r < p.m;
          cp_async_16(smem_addr(sa + swz(r, my_chunk)), ok ? a_src + i * a_step + k0 : static_cast<const T*>(p.x),
                      ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < BN / kRowStep; ++i) {
          const int r = tid / kChunksPerRow + i * kRowStep;
          const T* row = s_brow[r];
          const bool ok = k_ok && row != nullptr;
          cp_async_16(smem_addr(sb + swz(r, my_chunk)), ok ? row + gk : static_cast<const T*>(p.x), ok ? 16 : 0);
        }
      } else {
        const T zero = T(0.0f);
        for (int idx = tid; idx < BM * BK; idx += K::kThreads) {
          const int r = idx / BK, kk = idx % BK;
          const int64_t gm = m0 + r, gk = k0 + kk;
          sa[swz(r, kk >> 3) + (kk & 7)] = (gm < p.m && gk < p.k) ? x[gm * p.ldx + gk] : zero;
        }
        for (int idx = tid; idx < BN * BK; idx += K::kThreads) {
          // [K, out] storage: neighbouring threads take neighbouring rows, which
          // are the contiguous direction in memory.
          int r, kk;
          if (p.in_out) { r = idx % BN; kk = idx / BN; } else { r = idx / BK; kk = idx % BK; }
          const int64_t gk = k0 + kk;
          const T* row = s_brow[r];
          T v = zero;
          if (row != nullptr && gk < p.k) v = p.in_out ? row[gk * p.ldw] : row[gk];
          sb[swz(r, kk >> 3) + (kk & 7)] = v;
        }
      }
    };

    float acc[MT][2][NT][4];
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[a][h][b][c] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_tile(s, s);
      cp_async_commit();
    }

    // Fragments of one k16 step: A for MT row blocks, B for both halves.
    uint32_t af[2][MT][4];
    uint32_t bf[2][2][NT][2];
    // ldmatrix addresses. A thread's rows keep the same row%8 for every mt, h
    // and np, and the k-step only flips chunk bits 1-2, so with 128-byte rows
    // the swizzled address of step ks is (offset ^ ks*32) plus a constant:
    // one LOP3 per step instead of the full swizzle per fragment.
    const uint32_t a_frag = (wm * WM + (lane & 15)) * (BK * 2) + (((lane >> 4) ^ (lane & 7)) << 4);
    const uint32_t b_frag = BM * BK * 2 + (wn * WNO + ((lane >> 4) << 3) + (lane & 7)) * (BK * 2) +
                            ((((lane >> 3) & 1) ^ (lane & 7)) << 4);
    const uint32_t smem_base = smem_addr(smem_raw);
    auto load_frags = [&](int buf, uint32_t stage_addr, int ks) {
      const uint32_t a = stage_addr + (a_frag ^ (ks << 5));
      const uint32_t b = stage_addr + (b_frag ^ (ks << 5));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a + mt * 16 * (BK * 2), af[buf][mt][0], af[buf][mt][1], af[buf][mt][2], af[buf][mt][3]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np)
          ldmatrix_x4(b + (h * BNO + np * 16) * (BK * 2), bf[buf][h][2 * np][0], bf[buf][h][2 * np][1],
                      bf[buf][h][2 * np + 1][0], bf[buf][h][2 * np + 1][1]);
    };

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      // The stage refilled below was read in iteration kt-1, which every warp
      // has finished: it passed the barrier above.
      const int nk = kt + STAGES - 1;
      const uint32_t stage_addr = smem_base + (kt % STAGES) * (K::kStageElems * 2);
      load_frags(0, stage_addr, 0);
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks) {
        if (ks == 1) {
          // Issued after the first k-step's mma, so the latency of the row
          // pointer reads (shared memory) hides behind tensor-core work.
          if (nk < k_tiles) load_tile(nk % STAGES, nk);
          cp_async_commit();
        }
        if (ks + 1 < BK / 16) load_frags((ks + 1) & 1, stage_addr, ks + 1);
        const int cur = ks & 1;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              mma_16816<T>(acc[mt][h][nt], af[cur][mt], bf[cur][h][nt][0], bf[cur][h][nt][1]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next batch's prologue overwrites stages other warps may still read

    // ---- epilogue. Gate and up of an output element sit in the same thread;
    // park the fp32 accumulators in the (now idle) pipeline shared memory so
    // the activation and the stores run over whole rows, 8 columns at a time.
    float* sacc = reinterpret_cast<float*>(smem_raw);
    {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = wm * WM + mt * 16 + g + hr * 8;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const int c = h * BNO + wn * WNO + nt * 8 + 2 * t;
              *reinterpret_cast<float2*>(sacc + r * K::kAccLd + c) =
                  make_float2(acc[mt][h][nt][hr * 2], acc[mt][h][nt][hr * 2 + 1]);
            }
        }
    }
    __syncthreads();
    switch (p.act) {
      case 0: store_tile<0, BM, BNO, K::kThreads>(p, sacc, K::kAccLd, l, m0, n0); break;
      case 1: store_tile<1, BM, BNO, K::kThreads>(p, sacc, K::kAccLd, l, m0, n0); break;
      case 2: store_tile<2, BM, BNO, K::kThreads>(p, sacc, K::kAccLd, l, m0, n0); break;
      case 3: store_tile<3, BM, BNO, K::kThreads>(p, sacc, K::kAccLd, l, m0, n0); break;
      default: store_tile<4, BM, BNO, K::kThreads>(p, sacc, K::kAccLd, l, m0, n0); break;
    }
    __syncthreads();  // the next batch's prologue overwrites the accumulator tile
  }
}

}  // namespace gatedmlp::sm80
