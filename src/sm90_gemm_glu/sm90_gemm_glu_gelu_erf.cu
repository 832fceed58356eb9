// Hopper kernels for activation 2 (gelu_erf): both dtypes, every cluster size
// (sm_90a only).
#include "sm90_gemm_glu/launch.cuh"

GATEDMLP_SM90_INSTANTIATE(2)
