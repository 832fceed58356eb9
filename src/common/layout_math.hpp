// Index math for the weight layouts, shared by host code and kernels.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GATEDMLP_HD __host__ __device__ __forceinline__
#else
#define GATEDMLP_HD inline
#endif

// Unrolls a loop in device code; nothing for host compilers (nvcc's host
// pass included), which do not know the pragma (and warn).
#if defined(__CUDA_ARCH__)
#define GATEDMLP_UNROLL _Pragma("unroll")
#else
#define GATEDMLP_UNROLL
#endif

namespace gatedmlp::detail {

// half: 0 = gate, 1 = up; first: which half block 0 holds. I: the index
// type, int64_t, or uint32_t where the caller knows 2U < 2^31 and wants a
// 32-bit division (the Hopper kernel's pre_col).
template <typename I>
GATEDMLP_HD I fused_row(I j, int half, I group, int first) {
  const I block = j / group;
  const I slot = (half == first) ? 0 : 1;
  return (2 * block + slot) * group + (j - block * group);
}

GATEDMLP_HD void fused_row_inverse(int64_t f, int64_t group, int first, int* half, int64_t* j) {
  const int64_t block2 = f / group;
  const int64_t within = f - block2 * group;
  const int slot = static_cast<int>(block2 & 1);
  *half = slot == 0 ? first : 1 - first;
  *j = (block2 >> 1) * group + within;
}

}  // namespace gatedmlp::detail
