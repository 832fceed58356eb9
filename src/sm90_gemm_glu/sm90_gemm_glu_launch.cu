// Run-time dispatch of the Hopper kernel over activations. The kernels are
// compiled in sm90_gemm_glu_<activation>.cu; here they are only declared.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {

GATEDMLP_SM90_LAUNCHERS(extern, 0)
GATEDMLP_SM90_LAUNCHERS(extern, 1)
GATEDMLP_SM90_LAUNCHERS(extern, 2)
GATEDMLP_SM90_LAUNCHERS(extern, 3)
GATEDMLP_SM90_LAUNCHERS(extern, 4)
GATEDMLP_SM90_GROUPED(extern, __nv_bfloat16)
GATEDMLP_SM90_GROUPED(extern, __half)
GATEDMLP_SM90_FP8(extern, 1, true)
GATEDMLP_SM90_FP8(extern, 2, true)
GATEDMLP_SM90_FP8(extern, 1, false)
GATEDMLP_SM90_FP8(extern, 2, false)

namespace {

template <typename T>
cudaError_t setup_any(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k) {
  if (p.grouped) {
    switch (activation) {
      case 0: return setup_grouped<T, 0>(p, sms, k);
      case 1: return setup_grouped<T, 1>(p, sms, k);
      case 2: return setup_grouped<T, 2>(p, sms, k);
      case 3: return setup_grouped<T, 3>(p, sms, k);
      default: return setup_grouped<T, 4>(p, sms, k);
    }
  }
  switch (activation) {
    case 0: return setup_cm<T, 0>(p, cluster_m, sms, k);
    case 1: return setup_cm<T, 1>(p, cluster_m, sms, k);
    case 2: return setup_cm<T, 2>(p, cluster_m, sms, k);
    case 3: return setup_cm<T, 3>(p, cluster_m, sms, k);
    default: return setup_cm<T, 4>(p, cluster_m, sms, k);
  }
}

}  // namespace

cudaError_t setup_bf16(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k) {
  return setup_any<__nv_bfloat16>(p, activation, cluster_m, sms, k);
}
cudaError_t setup_fp16(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k) {
  return setup_any<__half>(p, activation, cluster_m, sms, k);
}

namespace {

template <bool PROMO>
cudaError_t setup_fp8_any(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k) {
  const bool two = cluster_m == 2;
  switch (activation) {
    case 0: return two ? setup_fp8_cm<0, 2, PROMO>(p, sms, k) : setup_fp8_cm<0, 1, PROMO>(p, sms, k);
    case 1: return two ? setup_fp8_cm<1, 2, PROMO>(p, sms, k) : setup_fp8_cm<1, 1, PROMO>(p, sms, k);
    case 2: return two ? setup_fp8_cm<2, 2, PROMO>(p, sms, k) : setup_fp8_cm<2, 1, PROMO>(p, sms, k);
    case 3: return two ? setup_fp8_cm<3, 2, PROMO>(p, sms, k) : setup_fp8_cm<3, 1, PROMO>(p, sms, k);
    default: return two ? setup_fp8_cm<4, 2, PROMO>(p, sms, k) : setup_fp8_cm<4, 1, PROMO>(p, sms, k);
  }
}

}  // namespace

cudaError_t setup_fp8(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k) {
  return p.fp8_promote ? setup_fp8_any<true>(p, activation, cluster_m, sms, k)
                       : setup_fp8_any<false>(p, activation, cluster_m, sms, k);
}

}  // namespace gatedmlp::sm90
