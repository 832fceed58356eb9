// Experiment h47 (docs/notes, the unfused baseline's GLU kernel): the same bytes in several traversal orders; run by exp-glu.sh (PROBE=1).
// Probe: how the GLU half of the unfused path (read an [M, 2U] bf16
// intermediate, write Y = silu(g) * u as [M, U]) reaches memory bandwidth
// with different traversals of the same bytes. Standalone, not library code.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/glu_bw.cu -o glu_bw && ./glu_bw
// Variants (8 outputs per thread-item: one 16-byte load of g and one of u):
//   persist2d  x over a row's items, y a one-wave grid stepping over rows (the library's kernel at 0b4397d)
//   block2d    x over a row's items, y = the row: one block per (row, x), no loop
//   rowblock   one block per row, its threads looping over the row's items
//   flat       one thread per item of the flattened [M, U / 8], in order
//   flatsep    flat, g and u from two separate [M, U] tensors
//   copy       the intermediate copied, 16 bytes per thread (reads and writes 2U per row)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct alignas(16) V8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ V8 glu8(V8 g, V8 u) {
  V8 y;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 gf = __bfloat1622float2(g.h[i]), uf = __bfloat1622float2(u.h[i]);
    const float a = __fdividef(gf.x, 1.0f + __expf(-gf.x)) * uf.x;
    const float b = __fdividef(gf.y, 1.0f + __expf(-gf.y)) * uf.y;
    y.h[i] = __floats2bfloat162_rn(a, b);
  }
  return y;
}

// items = U / 8 per row; the intermediate's row is 2U = 2 * 8 * items elements.
__global__ void persist2d(const V8* in, V8* y, int64_t m, int64_t items) {
  const int64_t it = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (it >= items) return;
  for (int64_t r = blockIdx.y; r < m; r += gridDim.y) y[r * items + it] = glu8(in[r * 2 * items + it], in[r * 2 * items + items + it]);
}

__global__ void block2d(const V8* in, V8* y, int64_t m, int64_t items) {
  const int64_t it = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = blockIdx.y;
  if (it < items) y[r * items + it] = glu8(in[r * 2 * items + it], in[r * 2 * items + items + it]);
}

__global__ void rowblock(const V8* in, V8* y, int64_t m, int64_t items) {
  const int64_t r = blockIdx.x;
  for (int64_t it = threadIdx.x; it < items; it += blockDim.x)
    y[r * items + it] = glu8(in[r * 2 * items + it], in[r * 2 * items + items + it]);
}

__global__ void flat(const V8* in, V8* y, int64_t m, int64_t items) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * items) return;
  const int64_t r = i / items, it = i - r * items;
  y[i] = glu8(in[r * 2 * items + it], in[r * 2 * items + items + it]);
}

__global__ void flatsep(const V8* g, const V8* u, V8* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = glu8(g[i], u[i]);
}

// As uint4: copying a V8 member by member compiles to 4-byte stores, which
// write every sector in parts and run at well under half the bandwidth.
__global__ void copy16(const uint4* in, uint4* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

template <typename F>
float median_ms(F launch, int reps = 20) {
  cudaEvent_t e[2];
  for (auto& x : e) CK(cudaEventCreate(&x));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e[0]));
    launch();
    CK(cudaEventRecord(e[1]));
    CK(cudaEventSynchronize(e[1]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e[0], e[1]));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  for (auto& x : e) CK(cudaEventDestroy(x));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MiB\n", prop.name, sms, prop.l2CacheSize >> 20);
  const int64_t shapes[][2] = {{4096, 14336}, {16384, 14336}, {4096, 28672}, {4096, 53248}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], u = s[1], items = u / 8, n = m * items;
    V8 *in, *y, *g, *up, *cp;
    CK(cudaMalloc(&in, n * 2 * sizeof(V8)));
    CK(cudaMalloc(&cp, n * 2 * sizeof(V8)));
    CK(cudaMalloc(&y, n * sizeof(V8)));
    CK(cudaMalloc(&g, n * sizeof(V8)));
    CK(cudaMalloc(&up, n * sizeof(V8)));
    CK(cudaMemset(in, 0x3c, n * 2 * sizeof(V8)));
    CK(cudaMemset(g, 0x3c, n * sizeof(V8)));
    CK(cudaMemset(up, 0x3c, n * sizeof(V8)));
    const double bytes = double(n) * 3 * sizeof(V8);
    const int t = 256;
    const unsigned gx = unsigned((items + t - 1) / t);
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist2d, t, 0));
    const unsigned gy = unsigned(std::max<int64_t>(1, std::min<int64_t>(m, int64_t(sms) * per_sm / gx)));
    const unsigned nb = unsigned((n + t - 1) / t);
    struct R {
      const char* name;
      float ms;
      double bytes;
    };
    std::vector<R> rs;
    rs.push_back({"persist2d", median_ms([&] { persist2d<<<dim3(gx, gy), t>>>(in, y, m, items); }), bytes});
    rs.push_back({"block2d", median_ms([&] { block2d<<<dim3(gx, unsigned(m)), t>>>(in, y, m, items); }), bytes});
    rs.push_back({"rowblock", median_ms([&] { rowblock<<<unsigned(m), t>>>(in, y, m, items); }), bytes});
    rs.push_back({"rowblk1k", median_ms([&] { rowblock<<<unsigned(m), 1024>>>(in, y, m, items); }), bytes});
    rs.push_back({"flat", median_ms([&] { flat<<<nb, t>>>(in, y, m, items); }), bytes});
    rs.push_back({"flatsep", median_ms([&] { flatsep<<<nb, t>>>(g, up, y, n); }), bytes});
    rs.push_back({"copy", median_ms([&] { copy16<<<2 * nb, t>>>(reinterpret_cast<const uint4*>(in), reinterpret_cast<uint4*>(cp), 2 * n); }), double(n) * 4 * sizeof(V8)});
    for (const R& r : rs)
      std::printf("M %6lld U %6lld  %-10s %8.4f ms %6.2f TB/s\n", (long long)m, (long long)u, r.name, r.ms,
                  r.bytes / (r.ms * 1e-3) / 1e12);
    for (V8* p : {in, y, g, up, cp}) CK(cudaFree(p));
  }
  return 0;
}
