// fp16 X with tiled int4 weights (QuantFormat::tiled): the instantiations.
#include "quant_decode/tiled.cuh"

namespace gatedmlp::quant_decode {
cudaError_t launch_tiled_fp16(const Params& p, Shape s, cudaStream_t stream) { return launch_tiled<__half>(p, s, stream); }
}  // namespace gatedmlp::quant_decode
