// The e4m3 (FP8) Hopper kernels in clusters of 2, every activation (sm_90a
// only), all of K summed by the wgmmas (the default
// without block scales): a TU of their own, so a parallel build compiles them
// beside the other kernels' TUs.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {
GATEDMLP_SM90_FP8(, 2, false)
}
