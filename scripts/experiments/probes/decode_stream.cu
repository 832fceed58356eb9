// Experiment h75 (docs/notes/drop-in-and-decode.md, the small shapes' bar): the decode kernel's sums fed
// by a shared-memory ring that bulk copies fill, against the same sums on
// register loads, in CUDA-graph replay with the weights rotated past L2 (as
// `gatedmlp bench` times). Standalone, not library code; no epilogue (the
// sums go to a sink), so what it times is the weight stream and the math.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/decode_stream.cu -o decode_stream && ./decode_stream
// A CTA owns 8 output columns (8 gate rows at j, 8 up rows at U + j of the
// stacked [2U, K] bf16 weights) over all of K, in k-blocks of 128; lane
// (g, t) of a warp multiplies rows g and 8 + g at k0 + 32u + 8t with
// mma.m16n8k16 (the weights as A, tokens as B), as the decode kernel does.
//   reg      the decode kernel's form: warp w loads k-blocks w, w + W, ...
//            into registers (W = min(k-blocks, 8)), 3 CTAs per SM
//   tmS      a producer warp fills an S-slot ring, one k-block (16 rows x
//            128 k, 4 KB) per slot, with one box of a 4-D tensor map
//            (K, 8 rows, 2 halves, U / 8); consumer warp w (of S) takes the
//            k-blocks of slot w, from shared memory
//   rbS      the same ring filled by 16 one-row bulk copies (cp.async.bulk,
//            256 bytes each) per k-block, no tensor map
//   reg+smem reg launched with the epilogue's dynamic shared memory, unused
//   reg+epi  reg with the decode kernel's end of a tile: partial sums
//            through shared memory, __syncthreads, one thread per output
//            summing them, silu(g) * u stored as bf16, __syncthreads
// per shape, M = 1 and 16: us per call (median of 7 replays of 20 calls).
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

__device__ __forceinline__ uint4 ldw(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ldx(const void* p, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (ok) asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(saddr(bar)),
      "r"(parity)
      : "memory");
}

// One k-block's sums: wa[u][h] rows g (h = 0) and 8 + g (h = 1) at k0 + 32u + 8t.
template <int NT>
__device__ __forceinline__ void kblock(float (&acc)[NT][4], const uint4 (&wa)[4][2], const __nv_bfloat16* x, int64_t k,
                                       int64_t k0, int m) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  uint4 xb[4][NT];
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = min(nt * 8 + g, m - 1);
      xb[u][nt] = ldx(x + row * k + k0 + 32 * u + 8 * t, k0 + 32 * u + 8 * t < k);
    }
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma(acc[nt], wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, xb[u][nt].x, xb[u][nt].y);
      mma(acc[nt], wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, xb[u][nt].z, xb[u][nt].w);
    }
}

template <int NT>
__device__ __forceinline__ void sink_out(const float (&acc)[NT][4], unsigned* sink) {
  float s = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s += acc[nt][0] + acc[nt][1] + acc[nt][2] + acc[nt][3];
  if (s == 1234.5f) *sink = 1;
}

// EPI: the decode kernel's end of a tile: each warp's C fragments into
// shared memory (dynamic), __syncthreads, one thread per (token, column)
// summing the warps' partials and storing silu(g) * u as bf16, __syncthreads.
template <int NT, bool EPI>
__global__ void __launch_bounds__(256, 3) reg(const __nv_bfloat16* w, const __nv_bfloat16* x, int64_t k, int64_t u,
                                             int m, unsigned* sink, __nv_bfloat16* y) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int64_t j = int64_t(blockIdx.x) * 8 + g;
  const __nv_bfloat16* row[2] = {w + j * k + 8 * t, w + (u + j) * k + 8 * t};
  float acc[NT][4] = {};
  for (int64_t k0 = int64_t(warp) * 128; k0 < k; k0 += int64_t(warps) * 128) {
    uint4 wa[4][2];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wa[c][h] = k0 + 32 * c + 8 * t < k ? ldw(row[h] + k0 + 32 * c) : make_uint4(0, 0, 0, 0);
    kblock<NT>(acc, wa, x, k, k0, m);
  }
  if constexpr (!EPI) {
    sink_out<NT>(acc, sink);
  } else {
    extern __shared__ float red[];
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp * (NT * 128) + (nt * 4 + r) * 32 + lane] = acc[nt][r];
    __syncthreads();
    for (int e = threadIdx.x; e < 8 * m; e += blockDim.x) {
      const int c = e % 8, mm = e / 8, nt = mm >> 3, parity = mm & 1;
      const float* part = red + nt * 128 + ((c & 7) << 2) + ((mm & 7) >> 1);
      float gs = 0.f, us = 0.f;
      for (int i = 0; i < warps; ++i) {
        gs += part[i * (NT * 128) + parity * 32];
        us += part[i * (NT * 128) + (2 + parity) * 32];
      }
      y[int64_t(mm) * u + int64_t(blockIdx.x) * 8 + c] = __float2bfloat16(gs / (1.f + __expf(-gs)) * us);
    }
    __syncthreads();
  }
}

// The ring: S slots of one k-block (16 rows x 128 k, rows 256 bytes apart:
// [half][row][k], as the tensor map's box lands), S consumer warps and a
// producer warp. TM: a tensor-map box per slot; else 16 one-row bulk copies.
template <int NT, int S, bool TM>
__global__ void __launch_bounds__(32 * (S + 1)) ring(const __grid_constant__ CUtensorMap map, const __nv_bfloat16* w,
                                                    const __nv_bfloat16* x, int64_t k, int64_t u, int m,
                                                    unsigned* sink) {
  __shared__ __align__(128) char slots[S][4096];
  __shared__ uint64_t full[S], empty[S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kbs = (k + 127) / 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[i])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[i])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t j0 = int64_t(blockIdx.x) * 8;
  if (warp == S) {  // the producer
    for (int64_t p = 0; p < kbs; ++p) {
      const int st = int(p % S);
      if (p >= S) bar_wait(&empty[st], uint32_t((p / S - 1) & 1));
      if constexpr (TM) {
        if (lane == 0) {
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;" ::"r"(saddr(&full[st])) : "memory");
          asm volatile(
              "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
              "%4, %5}], [%6];" ::"r"(saddr(slots[st])),
              "l"(&map), "r"(int(p * 128)), "r"(0), "r"(0), "r"(int(blockIdx.x)), "r"(saddr(&full[st]))
              : "memory");
        }
      } else {
        // 16 lanes, one row each; the K tail copies only what is there (the
        // consumers zero what lies past K).
        const uint32_t bytes = uint32_t((k - p * 128 < 128 ? k - p * 128 : 128) * 2);
        if (lane == 0)
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[st])), "r"(16 * bytes)
                       : "memory");
        __syncwarp();
        if (lane < 16) {
          const int h = lane >> 3, r = lane & 7;
          const __nv_bfloat16* src = w + (h * u + j0 + r) * k + p * 128;
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                           saddr(slots[st] + lane * 256)),
                       "l"(src), "r"(bytes), "r"(saddr(&full[st]))
                       : "memory");
        }
      }
    }
    return;
  }
  float acc[NT][4] = {};
  for (int64_t p = warp; p < kbs; p += S) {
    const int st = warp;
    bar_wait(&full[st], uint32_t((p / S) & 1));
    uint4 wa[4][2];
    const int64_t k0 = p * 128;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wa[c][h] = k0 + 32 * c + 8 * t < k ? *reinterpret_cast<const uint4*>(slots[st] + (h * 8 + g) * 256 + (32 * c + 8 * t) * 2)
                                           : make_uint4(0, 0, 0, 0);
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[st])) : "memory");
    kblock<NT>(acc, wa, x, k, k0, m);
  }
  sink_out<NT>(acc, sink);
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

// (K, 8, 2, U / 8) over stacked bf16 [2U, K]; box (128, 8, 2, 1).
CUtensorMap make_map(const void* base, int64_t k, int64_t u) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {cuuint64_t(k), 8, 2, cuuint64_t(u / 8)};
  const cuuint64_t strides[3] = {cuuint64_t(k * 2), cuuint64_t(u * k * 2), cuuint64_t(8 * k * 2)};
  const cuuint32_t box[4] = {128, 8, 2, 1};
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

int main() {
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const struct {
    const char* name;
    int64_t k, u;
  } shapes[] = {{"qwen-0.5b", 896, 4864}, {"1024x2816", 1024, 2816}, {"llama-1b", 2048, 8192}, {"llama-3b", 3072, 8192}};
  const char* names[] = {"reg", "tm4", "tm8", "rb4", "rb8", "reg+smem", "reg+epi"};
  std::printf("%-10s %3s |", "shape", "M");
  for (const char* n : names) std::printf(" %8s", n);
  std::printf("   (us per call)\n");
  for (const auto& sh : shapes) {
    const int64_t bytes = 2 * sh.u * sh.k * 2;
    const int copies = int(std::max<int64_t>(2, 3 * int64_t(l2) / bytes + 1));
    std::vector<__nv_bfloat16*> bufs(copies);
    std::vector<CUtensorMap> maps;
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 0, bytes));
      maps.push_back(make_map(b, sh.k, sh.u));
    }
    __nv_bfloat16 *x, *y;
    CK(cudaMalloc(&x, 16 * sh.k * 2));
    CK(cudaMemset(x, 0, 16 * sh.k * 2));
    CK(cudaMalloc(&y, 16 * sh.u * 2));
    for (int m : {1, 16}) {
      std::printf("%-10s %3d |", sh.name, m);
      for (int v = 0; v < 7; ++v) {
        const int calls = 20;
        const unsigned grid = unsigned(sh.u / 8);
        const int64_t kbs = (sh.k + 127) / 128;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < calls; ++c) {
          const __nv_bfloat16* w = bufs[c % copies];
          const CUtensorMap& mp = maps[c % copies];
          const bool two = m > 8;
          switch (v) {
            case 0:
            case 5:
            case 6: {
              // 5: as 0 with the epilogue's dynamic shared memory allocated
              // and unused; 6: with the epilogue.
              const unsigned th = unsigned(32 * std::min<int64_t>(kbs, 8));
              const size_t red = v == 0 ? 0 : size_t(th / 32) * (two ? 2 : 1) * 512;
              if (v == 6) {
                if (two) reg<2, true><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
                else reg<1, true><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
              } else {
                if (two) reg<2, false><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
                else reg<1, false><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
              }
              break;
            }
            case 1:
              if (two) ring<2, 4, true><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              else ring<1, 4, true><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              break;
            case 2:
              if (two) ring<2, 8, true><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              else ring<1, 8, true><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              break;
            case 3:
              if (two) ring<2, 4, false><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              else ring<1, 4, false><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              break;
            default:
              if (two) ring<2, 8, false><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
              else ring<1, 8, false><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
          }
        }
        CK(cudaGetLastError());
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ts;
        for (int r = 0; r < 7; ++r) {
          CK(cudaEventRecord(a, s));
          CK(cudaGraphLaunch(ge, s));
          CK(cudaEventRecord(b, s));
          CK(cudaEventSynchronize(b));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, a, b));
          ts.push_back(ms * 1000.f / calls);
        }
        std::sort(ts.begin(), ts.end());
        std::printf(" %8.2f", ts[3]);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
      std::printf("\n");
    }
    for (auto& b : bufs) CK(cudaFree(b));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  return 0;
}
