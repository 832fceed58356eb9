// fp16 X with mxfp4 weights: the quantized decode kernel's instantiations.
#include "quant_decode/quant_decode.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_fp16_mxfp4(const Params& p, Shape s, cudaStream_t stream) {
  return launch_format<__half, kMxfp4>(p, s, stream);
}
}  // namespace gatedmlp::quant_decode
