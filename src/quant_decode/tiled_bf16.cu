// bf16 X with tiled int4 weights (QuantFormat::tiled): the instantiations.
#include "quant_decode/tiled.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_tiled_bf16(const Params& p, Shape s, cudaStream_t stream) { return launch_tiled<__nv_bfloat16>(p, s, stream); }
}  // namespace gatedmlp::quant_decode
