// Instantiates the Hopper kernel for one element type and every activation;
// included once per dtype translation unit.
#pragma once

#include "sm90_gemm_glu/sm90_gemm_glu.cuh"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::sm90 {

static_assert(Traits::kSmemBytes == kTile.smem_bytes, "kTile.smem_bytes must match the kernel's layout");
static_assert(Traits::BM == kTile.tile_m && Traits::BNO == kTile.tile_n && Traits::kStages == kTile.stages);

template <typename T, int ACT>
cudaError_t launch_act(const Params& p, int grid, cudaStream_t stream) {
  auto kernel = sm90_gemm_glu_kernel<T, ACT>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
      e != cudaSuccess)
    return e;
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_any(const Params& p, int activation, int grid, cudaStream_t stream) {
  switch (activation) {
    case 0: return launch_act<T, 0>(p, grid, stream);
    case 1: return launch_act<T, 1>(p, grid, stream);
    case 2: return launch_act<T, 2>(p, grid, stream);
    case 3: return launch_act<T, 3>(p, grid, stream);
    default: return launch_act<T, 4>(p, grid, stream);
  }
}

}  // namespace gatedmlp::sm90
