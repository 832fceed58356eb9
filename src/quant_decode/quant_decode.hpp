// Host side of the quantized decode kernel: gate/up + GLU for a few rows of
// X (M <= 16) from quantized weights (Problem::quantized), dequantized in
// registers on their way to the tensor cores.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::quant_decode {

// The most rows of X the kernel takes.
inline constexpr int64_t kMaxM = 16;

// Why the kernel cannot take this resolved quantized problem, or "" if it
// can. `a` null: pointers assumed 16-byte aligned (plan() without arguments).
std::string blocker(const Problem& resolved, const Arguments* a);

// Launches it on `stream` for a resolved problem that blocker() accepted.
cudaError_t launch(const Problem& resolved, const Arguments& a, int sms, cudaStream_t stream);

}  // namespace gatedmlp::quant_decode
