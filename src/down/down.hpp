// The down projection (Problem::op == Operation::down): Y = alpha * H Wd^T + bd.
//
// Its kernels are the decode kernels' (decode_glu/, quant_decode/) with the
// 16 rows of a CTA's A operand taken as 16 output columns of one weight
// (Params::down), and past their rows a cuBLASLt GEMM. Before either, two
// passes may write into the workspace: the GLU of the input (glu_input: H =
// act(X) * X_up, rounded to X's type as an unfused model stores it), and the
// dequantized weights (quantized weights on a path that reads 16-bit ones).
// Computing the GLU once per call rather than in every CTA's loads keeps the
// decode kernels' instruction count per weight byte where it was: at M = 1 a
// CTA's 16 rows would otherwise pay 8 activations per 16 weights.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"
#include "quant_decode/quant_decode.hpp"

namespace gatedmlp::down {

// Where a call's scratch lives in the workspace, in this order, each part
// 256-byte aligned. Where cuBLASLt cannot write Y as asked, it writes fp32
// and a pass adds the bias and rounds once: with a bias (its epilogue
// refused an fp32 bias for a 16-bit Y, CUBLAS_STATUS_INVALID_VALUE on an
// H100 with CUDA 13.0, and a bias of Y's type would be rounded before the
// sum), and for a bf16 Y of fp16 X or the reverse (it multiplies 16-bit
// types into their own or fp32). The cuBLASLt GEMM takes what is left, up to kCublasBytes.
struct WorkspaceLayout {
  size_t glu = 0;      // [L][M, K] of X's type: act(X) * X_up
  size_t weights = 0;  // [U, K] of X's type: the dequantized weights
  size_t out32 = 0;    // [L][M, U] fp32: cuBLASLt's result, where a pass finishes Y
  size_t cublas = 0;   // cuBLASLt's own workspace (what workspace_size asks; it runs with less)
  size_t partials = 0; // [splits][M][U] fp32: the quantized decode kernel's split of K (unsplit with less)
  quant_decode::DownSplit split;  // that split (splits = 1: none)
  size_t required() const { return glu + weights + out32; }
  size_t total() const { return required() + cublas + partials; }
};
inline constexpr size_t kCublasBytes = size_t{8} << 20;

WorkspaceLayout workspace_layout(const Problem& resolved, KernelPath path);

// The problem the kernel of `path` runs once the passes are done: X dense
// in the workspace (glu_input off), 16-bit weights where they were
// dequantized. Its kernel-facing arguments follow from kernel_args().
Problem kernel_problem(const Problem& resolved, KernelPath path);
Arguments kernel_args(const Problem& resolved, KernelPath path, const WorkspaceLayout& layout, const Arguments& a,
                      void* workspace);

// A cuBLASLt plan for one kernel problem (descriptors, layouts and the
// heuristic's algorithm), made once per planned call and reused. It
// computes alpha * H Wd^T; the bias is finish_output's.
class CublasLinear {
 public:
  // `a`: the kernel arguments (their alignment picks the algorithm).
  static Status create(const Problem& kernel_problem, const Arguments& a, size_t cublas_bytes,
                       std::shared_ptr<CublasLinear>* out);
  virtual ~CublasLinear() = default;
  virtual Status run(const Arguments& a, void* cublas_ws, size_t cublas_bytes, cudaStream_t stream) = 0;
  virtual const std::string& describe() const = 0;
};

// The whole call for a resolved down problem on `cfg.path`: the passes, then
// the kernel. `linear` is the plan of a cublas path.
Status run(const Problem& resolved, const Config& cfg, const Arguments& a, CublasLinear* linear, int sms,
           void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---------------------------------------------------------------- passes (prepass.cu)
// h[l][m][k] = act(x) * x_up, rounded to `dtype` (glu_out16: the tanh-form
// activation the 16-bit outputs use). Strided x and x_up, dense h.
cudaError_t glu_input(const Problem& resolved, const void* x, const void* x_up, void* h, cudaStream_t stream);
// Y (the resolved problem's output, strided) = the dense fp32 [L][M, U]
// `src` plus the bias (if any), rounded once.
cudaError_t finish_output(const Problem& resolved, const float* src, const void* bias, void* y, cudaStream_t stream);
// Y = alpha * (the sum of `splits` fp32 partials [splits][M][U]) + bias, rounded once (batch 1).
cudaError_t reduce_splits(const Problem& resolved, const float* partials, int splits, const void* bias, void* y,
                          cudaStream_t stream);

}  // namespace gatedmlp::down
