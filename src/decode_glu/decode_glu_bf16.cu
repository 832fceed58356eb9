// bf16 instantiations of the decode kernel.
#include "decode_glu/decode_glu.cuh"

namespace gatedmlp::decode {
cudaError_t launch_bf16(const Params& p, Shape s, cudaStream_t stream) { return launch_any<__nv_bfloat16>(p, s, stream); }
}  // namespace gatedmlp::decode
