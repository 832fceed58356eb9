// Library-internal helpers shared by the core translation units.
#pragma once

#include <sstream>
#include <string>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::detail {

// Builds an error message: err(StatusCode::invalid_argument, "m must be >= 1, got ", m)
template <typename... Ts>
Status err(StatusCode code, const Ts&... parts) {
  std::ostringstream os;
  os << "gatedmlp: ";
  (os << ... << parts);
  return Status(code, os.str());
}

struct DeviceInfo {
  int device = -1;
  int major = 0, minor = 0;
  int sms = 0;
  size_t smem_optin = 0;  // max dynamic shared memory per block
  size_t l2_bytes = 0;
  std::string name;
};

// Properties of `device` (-1: current), cached after the first query.
Status device_info(int device, DeviceInfo* info);

// The one place that picks the kernel and its config. `args` may be null
// (plan() without pointers assumes 16-byte aligned pointers).
Status select_config(const Problem& resolved, const Arguments* args, const DeviceInfo& dev, Config* cfg);

// Element counts each tensor spans (w: uint32 words when quantized), from its first to its last element, for a
// resolved problem. Used for the overlap check.
struct Extents {
  int64_t x, w, bias, y, preact;
  int64_t scales;  // quantized weights: scales (and biases) of one weight tensor, [rows, K / group_size]
};
Status extents(const Problem& resolved, Extents* e);

// Number of weight rows (output features) of one weight tensor.
inline int64_t weight_rows(const Problem& p) {
  return p.op == Operation::gate_up && p.weights.format == WeightFormat::fused ? 2 * p.u : p.u;
}

inline bool is_down(const Problem& p) { return p.op == Operation::down; }

// FP8 activations (and FP8 weights) on the Hopper kernel's e4m3 form: the
// weights are read as they are, never dequantized first.
inline bool fp8_input(const Problem& p) { return p.input_dtype == DType::fp8_e4m3; }

// Quantized weights that run() dequantizes into the workspace first (for a
// 16-bit kernel): those that neither the quantized decode kernel nor the
// FP8 kernels read.
inline bool dequantized_first(const Problem& p, KernelPath path) {
  return p.quantized && !fp8_input(p) && path != KernelPath::quant_decode;
}

// FP8 Y (output_dtype = fp8_e4m3): its 1 x 128 groups per row, the
// element stride of the scales from one row to the next and from one group
// to the next (YScaleLayout), and the span of y_scales in elements.
inline int64_t y_scale_groups(const Problem& p) { return (p.u + 127) / 128; }
inline int64_t y_scale_mn_ld(const Problem& p) { return (p.m + 3) / 4 * 4; }
inline int64_t y_scale_row_stride(const Problem& p) {
  return p.y_scale_layout == YScaleLayout::mn_major ? 1 : y_scale_groups(p);
}
inline int64_t y_scale_group_stride(const Problem& p) {
  return p.y_scale_layout == YScaleLayout::mn_major ? y_scale_mn_ld(p) : 1;
}
inline int64_t y_scale_span(const Problem& p) {
  return (p.m - 1) * y_scale_row_stride(p) + (y_scale_groups(p) - 1) * y_scale_group_stride(p) + 1;
}

// Rows of x a call reads: m, or a gathered call's m / rows_per_x.
inline int64_t x_rows(const Problem& p) { return p.gather.experts > 0 ? p.m / p.gather.rows_per_x : p.m; }

bool log_enabled();

// No rows to compute (m = 0 or batch = 0): run() launches nothing.
inline bool empty(const Problem& p) { return p.m == 0 || p.batch == 0; }

// validate()'s pointer checks for a resolved problem that passed
// check_support and is not empty.
Status validate_pointers(const Problem& resolved, const Arguments& args);

// run()'s workspace: with workspace_bytes > 0 it must be 16-byte aligned
// device memory of the current device that shares no byte with a tensor of
// `args`. (nullptr, 0) is always accepted. Call after validate(problem, args),
// with the resolved problem.
Status validate_workspace(const Problem& resolved, const Arguments& args, const void* workspace,
                          size_t workspace_bytes);

// Whether two problems are the same call (every field, floats bit for bit).
bool same_problem(const Problem& a, const Problem& b);

}  // namespace gatedmlp::detail
