// The grouped (MoE prefill) Hopper kernels for fp16, every activation (sm_90a
// only): a TU of their own, so a parallel build compiles them beside the
// activations' TUs.
#include "sm90_gemm_glu/launch.cuh"

namespace gatedmlp::sm90 {
GATEDMLP_SM90_GROUPED(, __half)
}
