// Shared by the host and device weight-layout converters.
#pragma once

#include "common/layout_math.hpp"
#include "core/internal.hpp"
#include "gatedmlp/layout.hpp"

namespace gatedmlp::detail {

// A layout with its defaults filled in, in the form the copy loops use.
struct ConvLayout {
  int separate, in_out, first;
  int64_t group, ld;
};

// Checks one side of a conversion and resolves it. `side` is "from" or "to".
Status check_conv_layout(const char* side, const WeightLayout& l, int64_t u, int64_t k, const void* w,
                         const void* w_up, ConvLayout* out, int64_t* span);
Status check_convert(int64_t u, int64_t k, DType dtype, const WeightLayout& from, const void* from_w,
                     const void* from_w_up, const WeightLayout& to, const void* to_w, const void* to_w_up,
                     ConvLayout* cf, ConvLayout* ct);

// Offset of logical element (half, j, kk) and which tensor (0: w, 1: w_up) holds it.
GATEDMLP_HD int64_t conv_offset(const ConvLayout& l, int half, int64_t j, int64_t kk, int* tensor) {
  int64_t row = j;
  *tensor = 0;
  if (l.separate) *tensor = half;
  else row = fused_row(j, half, l.group, l.first);
  return l.in_out ? kk * l.ld + row : row * l.ld + kk;
}

}  // namespace gatedmlp::detail
