// bf16 X with fp8_e4m3 weights: the quantized decode kernel's instantiations.
#include "quant_decode/quant_decode.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_bf16_fp8(const Params& p, Shape s, cudaStream_t stream) {
  return launch_format<__nv_bfloat16, kFp8>(p, s, stream);
}
}  // namespace gatedmlp::quant_decode
