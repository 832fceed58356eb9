// Weight-layout helpers: where a gate/up row lives in a fused tensor, and
// conversion between any two layouts (once, at load time).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp {

// Physical row of logical row j of `half` in a fused [2U] weight interleaved
// in blocks of `group` rows (group must divide u; 0 means u).
int64_t fused_row(int64_t j, Half half, int64_t u, int64_t group, Half first);

// Inverse of fused_row: which half and logical row physical row f holds.
void fused_row_inverse(int64_t f, int64_t u, int64_t group, Half first, Half* half, int64_t* j);

// Copy gate/up weights of U output features and K inputs from one layout to
// another. `w_up` pointers are used only by WeightFormat::separate layouts.
// A bias is a weight with k = 1. Element size comes from `dtype`.
// convert_weights works on host memory; convert_weights_device on device
// memory, asynchronously on `stream`. Neither allows the source and the
// destination to overlap.
Status convert_weights(int64_t u, int64_t k, DType dtype, const WeightLayout& from,
                       const void* from_w, const void* from_w_up, const WeightLayout& to,
                       void* to_w, void* to_w_up);
Status convert_weights_device(int64_t u, int64_t k, DType dtype, const WeightLayout& from,
                              const void* from_w, const void* from_w_up, const WeightLayout& to,
                              void* to_w, void* to_w_up, cudaStream_t stream);

}  // namespace gatedmlp
