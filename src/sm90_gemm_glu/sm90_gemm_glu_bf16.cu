// bf16 instantiations of the Hopper kernel (built for sm_90a only).
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {
cudaError_t launch_bf16(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream) {
  return launch_any<__nv_bfloat16>(p, activation, cluster_m, sms, stream);
}
}  // namespace gatedmlp::sm90
