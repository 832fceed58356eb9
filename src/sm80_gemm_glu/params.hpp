// The plain parameter struct handed to the portable kernel.
#pragma once

#include <cstdint>

namespace gatedmlp::sm80 {

// Everything the kernel needs, resolved on the host. Strides in elements.
struct Params {
  const void* x;
  const void* w;       // fused weights, or gate weights
  const void* w_up;    // separate only
  const void* bias;    // fused [2U], or gate bias
  const void* bias_up; // separate only
  void* y;
  void* pre;

  int64_t m, k, u;
  int batch;
  int64_t ldx, ldw, ldy, ldpre;
  int64_t sx, sw, sb, sy, spre;  // batch strides

  int64_t group;
  int first;           // 0: gate block first, 1: up block first
  int separate;        // 1: two weight tensors
  int in_out;          // 1: weights stored [K, out]

  int act;
  float alpha, clamp_alpha, clamp_limit;
  int out_dtype, bias_dtype, pre_dtype;  // 0 bf16, 1 fp16, 2 fp32
  int has_bias, has_pre;
  int y_vec_stores;    // 8 adjacent Y elements (from a multiple of 8) may be stored as 16-byte vectors

  int m_tiles, n_tiles;
};

}  // namespace gatedmlp::sm80
