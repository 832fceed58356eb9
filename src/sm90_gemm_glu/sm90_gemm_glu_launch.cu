// Run-time dispatch of the Hopper kernel over activations. The kernels are
// compiled in sm90_gemm_glu_<activation>.cu; here they are only declared.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {

GATEDMLP_SM90_LAUNCHERS(extern, 0)
GATEDMLP_SM90_LAUNCHERS(extern, 1)
GATEDMLP_SM90_LAUNCHERS(extern, 2)
GATEDMLP_SM90_LAUNCHERS(extern, 3)
GATEDMLP_SM90_LAUNCHERS(extern, 4)

namespace {

template <typename T>
cudaError_t launch_any(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream) {
  switch (activation) {
    case 0: return launch_cm<T, 0>(p, cluster_m, sms, stream);
    case 1: return launch_cm<T, 1>(p, cluster_m, sms, stream);
    case 2: return launch_cm<T, 2>(p, cluster_m, sms, stream);
    case 3: return launch_cm<T, 3>(p, cluster_m, sms, stream);
    default: return launch_cm<T, 4>(p, cluster_m, sms, stream);
  }
}

}  // namespace

cudaError_t launch_bf16(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream) {
  return launch_any<__nv_bfloat16>(p, activation, cluster_m, sms, stream);
}
cudaError_t launch_fp16(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream) {
  return launch_any<__half>(p, activation, cluster_m, sms, stream);
}

}  // namespace gatedmlp::sm90
