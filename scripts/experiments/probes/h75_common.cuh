// What the h75 / h76 probes (read_floor.cu, decode_stream.cu,
// decode_wgmma.cu) share: error checks, random fills, the streaming load,
// mbarrier waits, the decode tile's tensor map
// over stacked [2U, K] bf16 weights, and timing in CUDA-graph replay.
// Standalone, not library code.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// 16 bytes read once: kept out of L1, the rest of the 256-byte L2 block
// fetched along (as the decode kernel loads its weights).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The xor of n 16-byte words read grid-stride by the whole grid, 4 loads in
// flight per thread per step.
__device__ __forceinline__ unsigned xor_gridstride(const uint4* p, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride);
    const uint4 c = ld_stream(p + i + 2 * stride), d = ld_stream(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.x ^ c.y ^ d.z;
  }
  for (; i < n; i += stride) acc ^= ld_stream(p + i).x;
  return acc;
}

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(saddr(bar)),
      "r"(parity)
      : "memory");
}

// An S-slot ring's barriers: full[i] completes on one arrival and the
// copies' bytes, empty[i] on `consumers` arrivals. Thread 0 initialises;
// the caller synchronises the CTA after.
template <int S>
__device__ __forceinline__ void ring_init(uint64_t (&full)[S], uint64_t (&empty)[S], uint32_t consumers) {
  if (threadIdx.x != 0) return;
  for (int i = 0; i < S; ++i) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[i])));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(&empty[i])), "r"(consumers));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(bar)) : "memory");
}

// `bytes` of contiguous global memory into shared memory, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   saddr(dst)),
               "l"(src), "r"(bytes), "r"(saddr(bar))
               : "memory");
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

// Stacked bf16 [2U, K] viewed as (K, 8 rows, 2 halves, U / 8 groups): a box
// (bk, 8, 2, g) is bk k of the gate and up rows of g groups of 8 columns,
// landing as [group][half][row][k].
inline CUtensorMap make_decode_map(const void* base, int64_t k, int64_t u, int bk, int g) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {cuuint64_t(k), 8, 2, cuuint64_t(u / 8)};
  const cuuint64_t strides[3] = {cuuint64_t(k * 2), cuuint64_t(u * k * 2), cuuint64_t(8 * k * 2)};
  const cuuint32_t box[4] = {cuuint32_t(bk), 8, 2, cuuint32_t(g)};
  const cuuint32_t es[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box, es,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled: error %d\n", int(r));
    std::exit(1);
  }
  return m;
}

// Random bf16 in [-1, 1) from a hash of the index.
__global__ void fill_random(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(float(h & 0xffff) / 32768.f - 1.f);
  }
}

// The small model set's shapes (K, U).
struct SmallShape {
  const char* name;
  int64_t k, u;
};
inline constexpr SmallShape kSmallShapes[] = {
    {"qwen-0.5b", 896, 4864}, {"1024x2816", 1024, 2816}, {"llama-1b", 2048, 8192}, {"llama-3b", 3072, 8192}};

// Copies of `bytes` rotating past 3x the L2 (as the benchmark rotates its
// weights), each filled with `fill`.
inline std::vector<void*> rotated_buffers(int64_t bytes, int fill) {
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const int copies = int(std::max<int64_t>(2, 3 * int64_t(l2) / bytes + 1));
  std::vector<void*> bufs(copies);
  for (auto& b : bufs) {
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(b, fill, bytes));
  }
  return bufs;
}

// us per call: `calls` launches (launch(c), c = 0 ... calls-1) captured
// into one graph, replayed once to warm up, then 7 times; the median.
template <typename Launch>
float replay_us(cudaStream_t s, int calls, Launch&& launch) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < calls; ++c) launch(c);
  CK(cudaGetLastError());
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[3];
}
