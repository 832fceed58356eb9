// fp16 instantiations of the decode kernel.
#include "decode_glu/decode_glu.cuh"

namespace gatedmlp::decode {
cudaError_t launch_fp16(const Params& p, Shape s, cudaStream_t stream) { return launch_any<__half>(p, s, stream); }
}  // namespace gatedmlp::decode
