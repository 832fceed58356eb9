// bf16 X with repacked int4 weights in groups of 64: the instantiations.
#include "quant_decode/repacked.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_repacked_bf16_g64(const Params& p, Shape s, cudaStream_t stream) {
  return launch_repacked<__nv_bfloat16, 2>(p, s, stream);
}
}  // namespace gatedmlp::quant_decode
