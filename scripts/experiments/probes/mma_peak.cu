// Experiment (docs/notes, ceilings measured on the H100): the mma.sync peak, the portable kernel's ceiling; run by scripts/profile.sh (PROBE=1).
// Probe: the peak rate of mma.sync m16n8k16 (bf16 in, fp32 accumulate) on
// this GPU, with no memory traffic: each warp keeps 16 independent
// accumulators and issues mma back to back. The ceiling for the portable kernel.
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/mma_peak.cu -o mma_peak && ./mma_peak
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

__global__ void mma_loop(float* out, int iters) {
  float acc[16][4] = {};
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x ^ 5u, 7u};
  uint32_t b0 = threadIdx.x * 11u, b1 = 13u;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  float s = 0;
  for (int j = 0; j < 16; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == 12345.f) out[0] = s;
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  float* out;
  cudaMalloc(&out, 4);
  const int iters = 4096;
  for (int warps : {4, 8, 16}) {
    const int blocks = prop.multiProcessorCount * 2, threads = warps * 32 / 2;
    mma_loop<<<blocks, threads>>>(out, 16);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    mma_loop<<<blocks, threads>>>(out, iters);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double flops = 2.0 * 16 * 8 * 16 * 16.0 * iters * (double(blocks) * threads / 32);
    printf("mma.sync m16n8k16 bf16: %2d warps/SM: %.0f TFLOP/s (%s)\n", warps, flops / ms / 1e9,
           cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}
