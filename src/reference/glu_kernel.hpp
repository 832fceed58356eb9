// The unfused baseline's second kernel: bias, activation and Y (and the
// pre-activation) from the [rows, 2U] intermediate one cuBLAS GEMM wrote
// (unfused.cpp). Apart from the GEMM so that the two build in parallel and
// each file holds one idea.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::ref::glu {

inline constexpr int kVec = 8;  // outputs per thread on the vector paths: one 16-byte load of g and of u


// scalar: one output per thread, any layout, any alignment.
// contig: 8 consecutive outputs whose g (and u) columns are consecutive too,
//         i.e. separate weights or a fused group that is a multiple of 8.
// pair:   group = 1; the 16 intermediate columns of 8 outputs alternate g/u.
enum class GluMode : int { scalar, contig, pair };

struct GluArgs {
  const void* inter;  // [rows][2U], input dtype, dense
  int64_t rows;       // L * M
  int64_t m, u;
  bool separate;
  int64_t group;
  int first;
  int act;
  float clamp_alpha, clamp_limit;
  bool has_bias;
  const void* bias;
  const void* bias_up;
  DType bias_dtype;
  int64_t bias_stride;
  void* y;
  int64_t ldy, stride_y;
  bool has_pre;
  void* pre;
  int64_t ldpre, stride_pre;
  DType pre_dtype;
};

// Launches the GLU kernel for `items` items per row (U, or U / kVec on the
// vector paths) of a.rows rows, X and W in `input`, Y in `output`.
void launch(DType input, DType output, GluMode mode, int64_t items, cudaStream_t stream, const GluArgs& a);

}  // namespace gatedmlp::ref::glu
