// The e4m3 (FP8) Hopper kernels in clusters of 1, every activation (sm_90a
// only): a TU of their own, so a parallel build compiles them beside the
// 16-bit kernels' TUs.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {
GATEDMLP_SM90_FP8(, 1)
}
