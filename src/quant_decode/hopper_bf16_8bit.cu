// bf16 instantiations of the quantized decode kernel's Hopper form (sm_90a), 8-bit words.
#include "quant_decode/hopper.cuh"

namespace gatedmlp::quant_decode {
cudaError_t hopper_setup_bf16_8bit(const HopperPrepared& pr) { return hopper_dispatch<__nv_bfloat16, true>(pr, pr.q, pr.xmap[0], nullptr, true); }
cudaError_t hopper_launch_bf16_8bit(const HopperPrepared& pr, const Params& pass, const CUtensorMap& xmap, cudaStream_t stream) {
  return hopper_dispatch<__nv_bfloat16, true>(pr, pass, xmap, stream, false);
}
}  // namespace gatedmlp::quant_decode
