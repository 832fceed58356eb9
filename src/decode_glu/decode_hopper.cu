// The decode kernel's Hopper form (sm_90a): gate/up GEMM + GLU for M <= 16
// rows of X, bound by streaming the weights once.
//
// Swap AB, as in the portable decode kernel (decode_glu.cuh), but with the
// tensor core reading the weights straight from shared memory: the weights
// are wgmma's 64-row A operand and the tokens its N = 8 or 16 columns (B).
// A tensor map views fused weights in blocks of G rows as (K, 8 rows, 2
// halves, G / 8 groups, U / G blocks), so one box of (64 k, 8, 2, 4, 1)
// lands as 64 rows [group][first half's 8 rows | second half's 8 rows]
// with the 128-byte swizzle. Warp w of the consumer warpgroup holds
// accumulator rows 16 w ... 16 w + 15: group w's 8 gate and 8 up rows, so
// lane (g, t) holds the gate and the up sums of one output column for the
// same tokens, and the epilogue runs from registers (no shared memory, no
// barrier at the end of a tile).
//
// Why: on the small shapes the register-load kernel's own loads and sums,
// without any end of a tile, were already slower than cuBLAS at M = 16,
// and rings feeding mma.sync from shared memory slower still (each 16 x 16
// weight fragment costs an ldmatrix); this form measured at 0.96-1.06x
// cuBLAS's GEMM alone where that kernel stood at 0.82-0.97x
// (docs/notes/drop-in-and-decode.md, h76).
//
// A CTA owns 32 output columns over all of K: one producer warp issues each
// k-block's weight box and X box (64 k x N tokens; rows past M and k past K
// are zero-filled by the copy) into a ring of kHopperStages stages; the
// consumer warpgroup runs 4 wgmmas per stage and releases a stage once the
// next stage's wgmmas are issued and its own have completed. Each CTA uses
// about 80 KB, so two share an SM.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/allow_smem.hpp"
#include "decode_glu/epilogue.cuh"
#include "decode_glu/hopper.hpp"
#include "sm90_gemm_glu/hopper.cuh"

namespace gatedmlp::decode {

namespace {

// D[64 x N] += A[64 x 16] * B[N x 16]^T, both K-major in shared memory with
// the 128-byte swizzle; N / 2 accumulators per thread. Thread t holds
// D(row, col) in d[i] for row = 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
// col = 8 (i / 4) + 2 (t % 4) + i % 2.
template <typename T, int N>
__device__ __forceinline__ void wgmma_n(float (&d)[N / 2], uint64_t a, uint64_t b) {
#define GATEDMLP_DH_WGMMA(TYPES)                                                                              \
  if constexpr (N == 8)                                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                   \
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32." TYPES " {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                             \
                 : "l"(a), "l"(b));                                                                           \
  else                                                                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                   \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPES                                         \
                 " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}"                               \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
                   "+f"(d[7])                                                                                 \
                 : "l"(a), "l"(b));
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    GATEDMLP_DH_WGMMA("bf16.bf16")
  } else {
    GATEDMLP_DH_WGMMA("f16.f16")
  }
#undef GATEDMLP_DH_WGMMA
}

template <int N>
struct Ring {
  static constexpr int kA = 64 * kHopperBk * 2;  // one 64-row weight tile
  static constexpr int kB = N * kHopperBk * 2;   // N tokens of X
  static constexpr int kStage = kA + kB;         // a multiple of 1024: the swizzle's alignment
  static constexpr int kSmem = kHopperStages * kStage + 2 * kHopperStages * 8 + 1024 /* alignment slack */;
  static_assert(kStage % 1024 == 0, "stages must stay 1024-byte aligned");
};

template <typename T, int N>
__global__ void __launch_bounds__(kHopperThreads)
    decode_hopper_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap wmap,
                         const __grid_constant__ CUtensorMap xmap, int ctas_per_block, int64_t group) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gatedmlp::sm90;
  using R = Ring<N>;
  constexpr int S = kHopperStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * R::kStage);
  uint64_t* empty = full + S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nkb = static_cast<int>((p.k + kHopperBk - 1) / kHopperBk);
  // This CTA's block of G columns and its first group of 8 in it.
  const int block = blockIdx.x / ctas_per_block;
  const int g0 = 4 * (blockIdx.x % ctas_per_block);
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == 4) {
    // The producer: one thread issues every stage's two boxes.
    if (lane == 0) {
      tma_prefetch_map(&wmap);
      tma_prefetch_map(&xmap);
      for (int kb = 0; kb < nkb; ++kb) {
        const int s = kb % S;
        if (kb >= S) mbar_wait(&empty[s], ((kb / S) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], R::kStage);
        unsigned char* st = smem + s * R::kStage;
        tma_load_5d(st, &wmap, &full[s], kb * kHopperBk, 0, 0, g0, block);
        tma_load_3d(st + R::kA, &xmap, &full[s], kb * kHopperBk, 0, 0);
      }
    }
    return;
  }
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  int prev = -1;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % S;
    mbar_wait(&full[s], (kb / S) & 1);
    const uint32_t st = smem_addr(smem + s * R::kStage);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHopperBk / 16; ++kk)
      wgmma_n<T, N>(d, desc_sw128(st + kk * 32), desc_sw128(st + R::kA + kk * 32));
    wgmma_commit();
    // The previous stage's wgmmas are done once at most this one's are in
    // flight: its slot goes back to the producer.
    wgmma_wait<1>();
    if (prev >= 0 && threadIdx.x == 0) mbar_arrive(&empty[prev]);
    prev = s;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
  // Lane (g, t) of warp w: column c = 8 (g0 + w) + g of the block, the
  // first half's sums in d[4c' + e], the second's in d[4c' + 2 + e], for
  // tokens 8 c' + 2 t + e.
  const int64_t c = 8 * int64_t(g0 + warp) + lane / 4;
  const int64_t j = int64_t(block) * group + c;
  if (c >= group || j >= p.u) return;
  const int gate = p.first;  // 1: the up half is the map's first
#pragma unroll
  for (int cc = 0; cc < N / 8; ++cc)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int token = 8 * cc + 2 * (lane % 4) + e;
      if (token >= p.m) continue;
      const float h0 = d[4 * cc + e], h1 = d[4 * cc + 2 + e];
      finish(p, gate ? h1 : h0, gate ? h0 : h1, j, 0, token);
    }
#endif
}

template <typename T, int N>
cudaError_t launch_typed(const HopperPrepared& pr, cudaStream_t stream) {
  decode_hopper_kernel<T, N><<<pr.grid, kHopperThreads, Ring<N>::kSmem, stream>>>(pr.p, pr.wmap, pr.xmap,
                                                                                  pr.ctas_per_block, pr.p.group);
  return cudaGetLastError();
}

template <typename T, int N>
cudaError_t setup_typed() {
  return detail::allow_smem(decode_hopper_kernel<T, N>, Ring<N>::kSmem);
}

}  // namespace

cudaError_t hopper_kernel_setup(const HopperPrepared& pr) {
  if (pr.input == DType::bf16) return pr.n == 8 ? setup_typed<__nv_bfloat16, 8>() : setup_typed<__nv_bfloat16, 16>();
  return pr.n == 8 ? setup_typed<__half, 8>() : setup_typed<__half, 16>();
}

cudaError_t hopper_kernel_launch(const HopperPrepared& pr, cudaStream_t stream) {
  if (pr.input == DType::bf16)
    return pr.n == 8 ? launch_typed<__nv_bfloat16, 8>(pr, stream) : launch_typed<__nv_bfloat16, 16>(pr, stream);
  return pr.n == 8 ? launch_typed<__half, 8>(pr, stream) : launch_typed<__half, 16>(pr, stream);
}

}  // namespace gatedmlp::decode
