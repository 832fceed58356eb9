// Instantiates the portable kernel for one element type; included once per
// dtype translation unit so the two dtypes compile in parallel.
#pragma once

#include "common/allow_smem.hpp"
#include "sm80_gemm_glu/sm80_gemm_glu.cuh"
#include "sm80_gemm_glu/sm80_gemm_glu.hpp"

namespace gatedmlp::sm80 {

template <typename T, int BM, int BNO, int WARPS_M, int WARPS_N, int STAGES, bool VEC>
cudaError_t launch_tile(Params p, cudaStream_t stream) {
  using K = Sm80GemmGlu<T, BM, BNO, WARPS_M, WARPS_N, STAGES, VEC>;
  auto kernel = sm80_gemm_glu_kernel<T, BM, BNO, WARPS_M, WARPS_N, STAGES, VEC>;
  if (cudaError_t e = detail::allow_smem(kernel, K::kSmemBytes); e != cudaSuccess) return e;
  p.m_tiles = static_cast<int>((p.m + BM - 1) / BM);
  p.n_tiles = static_cast<int>((p.u + BNO - 1) / BNO);
  const dim3 grid(static_cast<unsigned>(int64_t(p.m_tiles) * p.n_tiles), static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
  kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_any(const Params& p, const Config& cfg, cudaStream_t stream) {
  static_assert(Sm80GemmGlu<T, 128, 64, 2, 2, 3, true>::kSmemBytes == kTileLarge.smem_bytes);
  static_assert(Sm80GemmGlu<T, 64, 64, 2, 2, 3, true>::kSmemBytes == kTileSmall.smem_bytes);
  if (cfg.tile_m == kTileLarge.tile_m) {
    return cfg.vector_loads ? launch_tile<T, 128, 64, 2, 2, 3, true>(p, stream)
                            : launch_tile<T, 128, 64, 2, 2, 3, false>(p, stream);
  }
  return cfg.vector_loads ? launch_tile<T, 64, 64, 2, 2, 3, true>(p, stream)
                          : launch_tile<T, 64, 64, 2, 2, 3, false>(p, stream);
}

}  // namespace gatedmlp::sm80
