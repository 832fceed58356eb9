// The down projection's passes (down.hpp): the GLU of its input into the
// workspace, and the bias and rounding of cuBLASLt's fp32 result into Y.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "down/down.hpp"

namespace gatedmlp::down {

namespace {

// One element per thread and step, grid-stride. At decode sizes (M x K of a
// few hundred KB) this is a couple of microseconds; at prefill it moves 3
// bytes per 2 it saves the GEMM nothing, as an unfused model's GLU does.
template <typename T>
__global__ void glu_input_kernel(const T* __restrict__ x, const T* __restrict__ x_up, T* __restrict__ h,
                                 int64_t m, int64_t k, int64_t ldx, int64_t sx, int64_t total, int act,
                                 float clamp_alpha, float clamp_limit) {
  const int64_t per_batch = m * k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / per_batch, r = i % per_batch;
    const int64_t off = l * sx + (r / k) * ldx + r % k;
    const float g = gatedmlp::detail::to_float(x[off]), u = gatedmlp::detail::to_float(x_up[off]);
    // The decode epilogue's forms: erfc for GeGLU's negative tail, the
    // tanh-form activation for a 16-bit result.
    const float y = act == gatedmlp::detail::kGeluErf
                        ? 0.5f * g * erfcf(-0.7071067811865476f * g) * u
                        : gatedmlp::detail::glu_out16<float>(act, g, u, clamp_alpha, clamp_limit);
    h[i] = gatedmlp::detail::from_float<T>(y);
  }
}

__global__ void finish_output_kernel(const float* __restrict__ src, const void* bias, int bias_dtype, int64_t sb,
                                     void* y, int out_dtype, int64_t m, int64_t u, int64_t ldy, int64_t sy,
                                     int64_t total) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / (m * u), r = i % (m * u), j = r % u;
    float v = src[i];
    if (bias) v += gatedmlp::detail::load_float(bias, bias_dtype, l * sb + j);
    gatedmlp::detail::store_float(y, out_dtype, l * sy + (r / u) * ldy + j, v);
  }
}

__global__ void reduce_splits_kernel(const float* __restrict__ partials, int splits, float alpha, const void* bias,
                                     int bias_dtype, void* y, int out_dtype, int64_t m, int64_t u, int64_t ldy) {
  const int64_t total = m * u;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += partials[k * total + i];
    const int64_t j = i % u;
    float v = s * alpha;
    if (bias) v += gatedmlp::detail::load_float(bias, bias_dtype, j);
    gatedmlp::detail::store_float(y, out_dtype, (i / u) * ldy + j, v);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? b : 4096);
}

}  // namespace

cudaError_t glu_input(const Problem& r, const void* x, const void* x_up, void* h, cudaStream_t stream) {
  const int64_t total = r.batch * r.m * r.k;
  const int act = static_cast<int>(r.activation);
  if (r.input_dtype == DType::bf16)
    glu_input_kernel<__nv_bfloat16><<<blocks_for(total), 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(x_up), static_cast<__nv_bfloat16*>(h),
        r.m, r.k, r.ldx, r.batch_stride_x, total, act, r.act_params.clamp_alpha, r.act_params.clamp_limit);
  else
    glu_input_kernel<__half><<<blocks_for(total), 256, 0, stream>>>(
        static_cast<const __half*>(x), static_cast<const __half*>(x_up), static_cast<__half*>(h), r.m, r.k, r.ldx,
        r.batch_stride_x, total, act, r.act_params.clamp_alpha, r.act_params.clamp_limit);
  return cudaGetLastError();
}

cudaError_t reduce_splits(const Problem& r, const float* partials, int splits, const void* bias, void* y,
                          cudaStream_t stream) {
  reduce_splits_kernel<<<blocks_for(r.m * r.u), 256, 0, stream>>>(partials, splits, r.alpha, r.has_bias ? bias : nullptr,
                                                                  static_cast<int>(r.bias_dtype), y,
                                                                  static_cast<int>(r.output_dtype), r.m, r.u, r.ldy);
  return cudaGetLastError();
}

cudaError_t finish_output(const Problem& r, const float* src, const void* bias, void* y, cudaStream_t stream) {
  const int64_t total = r.batch * r.m * r.u;
  finish_output_kernel<<<blocks_for(total), 256, 0, stream>>>(src, r.has_bias ? bias : nullptr,
                                                              static_cast<int>(r.bias_dtype), r.batch_stride_bias, y,
                                                              static_cast<int>(r.output_dtype), r.m, r.u, r.ldy,
                                                              r.batch_stride_y, total);
  return cudaGetLastError();
}

}  // namespace gatedmlp::down
