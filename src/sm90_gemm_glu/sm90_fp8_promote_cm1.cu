// The e4m3 (FP8) Hopper kernels in clusters of 1, every activation (sm_90a
// only), each 128-deep k-block summed apart and added into fp32 sums (block
// scales, or GATEDMLP_FP8_PROMOTE=1): a TU of their own, so a parallel build compiles them
// beside the other kernels' TUs.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {
GATEDMLP_SM90_FP8(, 1, true)
}
