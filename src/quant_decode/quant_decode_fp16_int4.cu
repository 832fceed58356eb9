// fp16 X with int4 weights: the quantized decode kernel's instantiations.
#include "quant_decode/quant_decode.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_fp16_int4(const Params& p, Shape s, cudaStream_t stream) {
  return launch_format<__half, kInt4>(p, s, stream);
}
}  // namespace gatedmlp::quant_decode
