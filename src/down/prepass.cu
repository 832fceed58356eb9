// The down projection's passes into the workspace (down.hpp): the GLU of its
// input, and the bias as fp32 for cuBLASLt's epilogue.
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

__global__ void bias_to_f32_kernel(const void* bias, int dtype, int64_t n, int64_t total, int64_t stride, float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = gatedmlp::detail::load_float(bias, dtype, (i / n) * stride + i % n);
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

cudaError_t bias_to_f32(const void* bias, DType dtype, int64_t n, int64_t batches, int64_t stride, float* out,
                        cudaStream_t stream) {
  bias_to_f32_kernel<<<blocks_for(n * batches), 256, 0, stream>>>(bias, static_cast<int>(dtype), n, n * batches,
                                                                   stride, out);
  return cudaGetLastError();
}

}  // namespace gatedmlp::down
