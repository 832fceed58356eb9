// bf16 instantiations of the portable kernel.
#include "sm80_gemm_glu/launch.cuh"

namespace gatedmlp::sm80 {
cudaError_t launch_bf16(Params p, const Config& cfg, cudaStream_t stream) {
  return launch_any<__nv_bfloat16>(p, cfg, stream);
}
}  // namespace gatedmlp::sm80
