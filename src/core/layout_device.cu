// Device-side weight-layout converter: one thread per element, any layout pair.
#include <cuda_runtime_api.h>

#include "core/layout_internal.hpp"

namespace gatedmlp {

namespace {

template <typename E>
__global__ void convert_kernel(int64_t u, int64_t k, detail::ConvLayout cf, detail::ConvLayout ct, const E* s0,
                               const E* s1, E* d0, E* d1) {
  const int64_t total = 2 * u * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    // k fastest: reads and writes of out_in layouts stay contiguous.
    const int64_t kk = i % k;
    const int64_t row = i / k;
    const int half = static_cast<int>(row / u);
    const int64_t j = row % u;
    int ts, td;
    const int64_t os = detail::conv_offset(cf, half, j, kk, &ts);
    const int64_t od = detail::conv_offset(ct, half, j, kk, &td);
    (td ? d1 : d0)[od] = (ts ? s1 : s0)[os];
  }
}

template <typename E>
cudaError_t launch(int64_t u, int64_t k, const detail::ConvLayout& cf, const detail::ConvLayout& ct,
                   const void* s0, const void* s1, void* d0, void* d1, cudaStream_t stream) {
  const int64_t total = 2 * u * k;
  const int64_t blocks = (total + 255) / 256;
  convert_kernel<E><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      u, k, cf, ct, static_cast<const E*>(s0), static_cast<const E*>(s1), static_cast<E*>(d0), static_cast<E*>(d1));
  return cudaGetLastError();
}

}  // namespace

Status convert_weights_device(int64_t u, int64_t k, DType dtype, const WeightLayout& from, const void* from_w,
                              const void* from_w_up, const WeightLayout& to, void* to_w, void* to_w_up,
                              cudaStream_t stream) {
  detail::ConvLayout cf, ct;
  if (Status s = detail::check_convert(u, k, dtype, from, from_w, from_w_up, to, to_w, to_w_up, &cf, &ct); !s)
    return s;
  const cudaError_t e = dtype == DType::fp32 ? launch<uint32_t>(u, k, cf, ct, from_w, from_w_up, to_w, to_w_up, stream)
                                             : launch<uint16_t>(u, k, cf, ct, from_w, from_w_up, to_w, to_w_up, stream);
  if (e != cudaSuccess) return detail::err(StatusCode::cuda_error, "convert_weights_device: ", cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace gatedmlp
