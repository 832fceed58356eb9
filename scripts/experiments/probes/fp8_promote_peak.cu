// Experiment h73 (docs/notes/fp8.md): how fast can an FP8 main loop with fp32
// promotion every 128 of K run on this GPU, with no memory traffic at all?
// Run by scripts/experiments/fp8-promote-peak.sh.
//
// Each CTA is two consumer warpgroups (one per SM, 200 KB of shared memory
// so no second CTA fits) looping over k-blocks of a 4-stage ring filled once
// with random e4m3 bytes and never refilled: no TMA, no L2, no barriers, so
// only the tensor cores, shared-memory reads, the register file and the
// issue slots are timed.
// Variants (each warpgroup: 64 rows; "tile" columns are weight rows):
//   fast      4 x m64n256k32 into the 128 sums, one group in flight (the
//             all-of-K loop, sm90_fp8_fast_*)
//   quarter   4 quarters of 4 x m64n64k32 into two 32-register accumulators
//             in turn, each added into the sums by FFMA (the promoting loop)
//   half      2 halves of 4 x m64n128k32 into one 64-register accumulator,
//             wait, FFMA (h71's first promoting loop)
//   fastffma  fast, plus 128 FFMA per k-block on 64 registers of their own
//             (no dependence on the wgmmas): do FFMAs slow the tensor
//             cores down by themselves?
//   n128      a 128-row weight tile (64 gate + 64 up columns): 4 x
//             m64n128k32, wait, 64 FFMA (DeepGEMM's 128 x 128 block)
//   quarter_vs
//             quarter with its two scales in vector registers (read per
//             thread from `out`, which holds the same values), as the
//             library's loop has them (its X scales differ by row); the
//             other variants take s0, s1 as kernel arguments, which ptxas
//             keeps in uniform registers, so their FFMAs read two vector
//             registers, not three (h87).
//   fast_rs, quarter_rs
//             fast and quarter with X (wgmma's A) from registers, read
//             from shared memory once per k-block (16 registers): does
//             re-reading A from shared memory for each quarter cost the
//             promoting loop its speed (h87)? The registers are filled by
//             plain 16-byte loads, not in wgmma's fragment order: the
//             probe times the loop, its sums mean nothing.
// Usage: fp8_promote_peak [k-blocks per CTA] [launches per variant, 5]
// Prints TFLOP/s per variant (the median launch), each kernel's registers
// and local memory, and the wall-clock span of its launches (h88: matched
// against the SM clock's samples by clock-summary.py).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "sm90_gemm_glu/hopper.cuh"  // the library's descriptor and wgmma fence / commit / wait helpers

namespace {

constexpr int kStages = 4, kXBytes = 128 * 128, kWBytes = 256 * 128, kStageBytes = kXBytes + kWBytes;
constexpr int kSmem = kStages * kStageBytes + 8 * 1024;  // > half the SM: one CTA per SM

using gatedmlp::sm90::desc_sw128;
using gatedmlp::sm90::fence_regs;
using gatedmlp::sm90::wgmma_commit;
using gatedmlp::sm90::wgmma_fence;
using gatedmlp::sm90::wgmma_wait;

#define L32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define L64 L32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define L128 L64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define O8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define O32 O8(0), O8(8), O8(16), O8(24)
#define O64 O32, O8(32), O8(40), O8(48), O8(56)
#define O128 O64, O8(64), O8(72), O8(80), O8(88), O8(96), O8(104), O8(112), O8(120)

// D (+)= A * B^T, e4m3, fp32 accumulators; scale-d 0 on the first k-step.
#define MMA(SHAPE, LIST, OPS, A, B, S)                                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\nwgmma.mma_async.sync.aligned." SHAPE          \
               ".f32.e4m3.e4m3 {" LIST "}, %" A ", %" B ", p, 1, 1;\n}\n"                                  \
               : OPS                                                                                        \
               : "l"(a), "l"(b), "r"(acc))
__device__ __forceinline__ void mma64(float (&d)[32], uint64_t a, uint64_t b, int acc) {
  MMA("m64n64k32", L32, O32, "32", "33", "34");
}
__device__ __forceinline__ void mma128(float (&d)[64], uint64_t a, uint64_t b, int acc) {
  MMA("m64n128k32", L64, O64, "64", "65", "66");
}
__device__ __forceinline__ void mma256(float (&d)[128], uint64_t a, uint64_t b, int acc) {
  MMA("m64n256k32", L128, O128, "128", "129", "130");
}
// The same with A from four registers (wgmma's register-A form).
#define MMA_RS(SHAPE, LIST, OPS, A, B, S)                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\nwgmma.mma_async.sync.aligned." SHAPE        \
               ".f32.e4m3.e4m3 {" LIST "}, {%" A "}, %" B ", p, 1, 1;\n}\n"                              \
               : OPS                                                                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc))
__device__ __forceinline__ void mma64_rs(float (&d)[32], const uint32_t* a, uint64_t b, int acc) {
  MMA_RS("m64n64k32", L32, O32, "32, %33, %34, %35", "36", "37");
}
__device__ __forceinline__ void mma256_rs(float (&d)[128], const uint32_t* a, uint64_t b, int acc) {
  MMA_RS("m64n256k32", L128, O128, "128, %129, %130, %131", "132", "133");
}

// One k-block of N accumulators over weight rows at b: 4 k-steps of 32.
template <int N>
__device__ __forceinline__ void kblock(float (&t)[N], uint64_t a, uint64_t b, bool first) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int acc = (first && k == 0) ? 0 : 1;
    if constexpr (N == 32) mma64(t, a + 2 * k, b + 2 * k, acc);
    else if constexpr (N == 64) mma128(t, a + 2 * k, b + 2 * k, acc);
    else mma256(t, a + 2 * k, b + 2 * k, acc);
  }
  wgmma_commit();
  fence_regs(t);
}
// The same with A from registers: 4 per k-step.
template <int N>
__device__ __forceinline__ void kblock_rs(float (&t)[N], const uint32_t (&a)[16], uint64_t b, bool first) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int acc = (first && k == 0) ? 0 : 1;
    if constexpr (N == 32) mma64_rs(t, a + 4 * k, b + 2 * k, acc);
    else mma256_rs(t, a + 4 * k, b + 2 * k, acc);
  }
  wgmma_commit();
  fence_regs(t);
}
template <int N, int OFF, int M>
__device__ __forceinline__ void add(float (&d)[M], const float (&t)[N], float s0, float s1) {
#pragma unroll
  for (int i = 0; i < N; ++i) d[OFF + i] = fmaf(t[i], (i / 2) % 2 ? s1 : s0, d[OFF + i]);
}

// The promoting loop's k-block: four quarters of 64 weight rows into two
// 32-register accumulators in turn, each added into the sums while the next
// runs. issue(t, q) issues quarter q's wgmmas into t.
template <class Issue>
__device__ __forceinline__ void quarters(float (&d)[128], Issue issue, float s0, float s1) {
  float ta[32], tb[32];
  issue(ta, 0);
  issue(tb, 1);
  wgmma_wait<1>();
  fence_regs(ta);
  add<32, 0>(d, ta, s0, s1);
  issue(ta, 2);
  wgmma_wait<1>();
  fence_regs(tb);
  add<32, 32>(d, tb, s0, s1);
  issue(tb, 3);
  wgmma_wait<1>();
  fence_regs(ta);
  add<32, 64>(d, ta, s0, s1);
  wgmma_wait<0>();
  fence_regs(tb);
  add<32, 96>(d, tb, s0, s1);
}

enum Variant { kFast, kQuarter, kHalf, kN128, kFastFfma, kFastRs, kQuarterRs, kQuarterVs };
const char* kNames[] = {"fast", "quarter", "half", "n128", "fastffma", "fast_rs", "quarter_rs", "quarter_vs"};
// Weight rows a k-block multiplies (FLOPs: 2 x 128 rows x this x 128).
constexpr int kRows[] = {256, 256, 256, 128, 256, 256, 256, 256};

template <int V>
__global__ void __launch_bounds__(256, 1) loop(float* out, int kblocks, float s0, float s1) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int cw = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  // Random bytes (small e4m3 values), so that the tensor cores draw the
  // power they draw on real data.
  for (int o = threadIdx.x * 16; o < kStages * kStageBytes; o += 256 * 16) {
    uint32_t h = (o * 2654435761u) ^ 0x9e3779b9u, w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h = h * 1664525u + 1013904223u, w[j] = h & 0x3f3f3f3fu;
    *reinterpret_cast<uint4*>(smem + o) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  // quarter_vs: the scales per thread (main fills `out` with s0, s1 pairs).
  const float v0 = V == kQuarterVs ? out[2 * (threadIdx.x % 128)] : s0;
  const float v1 = V == kQuarterVs ? out[2 * (threadIdx.x % 128) + 1] : s1;
  float d[128], e[V == kFastFfma ? 64 : 1];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (V == kFastFfma ? 64 : 1); ++i) e[i] = float(threadIdx.x + i);
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint32_t st = base + (kb % kStages) * kStageBytes;
    const uint64_t a = desc_sw128(st + cw * 64 * 128), b = desc_sw128(st + kXBytes);
    constexpr uint64_t q = 64 * 128 >> 4;  // 64 weight rows, in descriptor units
    if constexpr (V == kFast || V == kFastFfma) {
      kblock(d, a, b, false);
      wgmma_wait<1>();
      fence_regs(d);
      if constexpr (V == kFastFfma) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int i = 0; i < 64; ++i) e[i] = fmaf(e[i], s0, s1);
          fence_regs(e);
        }
      }
    } else if constexpr (V == kQuarter) {
      quarters(d, [&](float (&t)[32], int qi) { kblock(t, a, b + qi * q, true); }, s0, s1);
    } else if constexpr (V == kQuarterVs) {
      quarters(d, [&](float (&t)[32], int qi) { kblock(t, a, b + qi * q, true); }, v0, v1);
    } else if constexpr (V == kFastRs || V == kQuarterRs) {
      // This warpgroup's 8 KB of X, 64 bytes per thread, read once.
      uint32_t ar[16];
      const unsigned char* xs = smem + (kb % kStages) * kStageBytes + cw * 64 * 128 + (threadIdx.x % 128) * 16;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 v = *reinterpret_cast<const uint4*>(xs + j * 2048);
        ar[4 * j] = v.x, ar[4 * j + 1] = v.y, ar[4 * j + 2] = v.z, ar[4 * j + 3] = v.w;
      }
      if constexpr (V == kFastRs) {
        kblock_rs(d, ar, b, false);
        wgmma_wait<0>();  // the next k-block's loads overwrite ar
        fence_regs(d);
      } else {
        quarters(d, [&](float (&t)[32], int qi) { kblock_rs(t, ar, b + qi * q, true); }, s0, s1);
      }
    } else if constexpr (V == kHalf) {
      float t[64];
      kblock(t, a, b, true);
      wgmma_wait<0>();
      fence_regs(t);
      add<64, 0>(d, t, s0, s1);
      kblock(t, a, b + 2 * q, true);
      wgmma_wait<0>();
      fence_regs(t);
      add<64, 64>(d, t, s0, s1);
    } else if constexpr (V == kN128) {
      float t[64];
      kblock(t, a, b, true);
      wgmma_wait<0>();
      fence_regs(t);
      add<64, 0>(d, t, s0, s1);
    }
  }
  wgmma_wait<0>();
  fence_regs(d);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += d[i];
  if constexpr (V == kFastFfma)
#pragma unroll
    for (int i = 0; i < 64; ++i) s += e[i];
  if (s == 1234.5f) out[threadIdx.x] = s;  // never true; keeps the sums live
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

template <int V>
float time_ms(int sms, int kblocks, int launches, float* out) {
  auto k = loop<V>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncAttributes fa{};
  cudaFuncGetAttributes(&fa, k);
  k<<<sms, 256, kSmem>>>(out, 64, 1.f, 0.5f);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  const double t0 = now_s();
  for (int r = 0; r < launches; ++r) {
    cudaEventRecord(e0);
    k<<<sms, 256, kSmem>>>(out, kblocks, 1.f, 0.5f);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0.f;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  const double t1 = now_s();
  std::sort(ms.begin(), ms.end());
  const float med = ms[ms.size() / 2];
  const double flops = 2.0 * 128 * kRows[V] * 128 * double(kblocks) * sms;
  printf("%-9s %7.3f ms  %6.0f TFLOP/s  regs %3d  local %3zu B  (%s)  wall %.3f %.3f\n", kNames[V], med,
         flops / med / 1e9, fa.numRegs, fa.localSizeBytes, cudaGetErrorString(cudaGetLastError()), t0, t1);
  return med;
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int kblocks = argc > 1 ? std::atoi(argv[1]) : 8192;
  const int launches = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  float* out = nullptr;
  cudaMalloc(&out, 256 * sizeof(float));
  {
    std::vector<float> pairs(256);
    for (int i = 0; i < 256; ++i) pairs[i] = i % 2 ? 0.5f : 1.f;  // the s0, s1 every launch passes
    cudaMemcpy(out, pairs.data(), pairs.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  printf("%s, %d SMs, %d k-blocks of 128 per CTA, one CTA per SM, no memory traffic\n", prop.name,
         prop.multiProcessorCount, kblocks);
  // Twice round, so that the clocks settle before the second.
  for (int round = 0; round < 2; ++round) {
    printf("round %d\n", round);
    time_ms<kFast>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kQuarter>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kHalf>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kN128>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kFastFfma>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kFastRs>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kQuarterRs>(prop.multiProcessorCount, kblocks, launches, out);
    time_ms<kQuarterVs>(prop.multiProcessorCount, kblocks, launches, out);
  }
  return 0;
}
