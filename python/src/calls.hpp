// The binding's tensor entry points (gate_up, down, make_problem, convert)
// and what they share: the device and stream around a call, reading
// strides and dtypes from imported tensors, the descriptor's common parts
// (input, output, bias, quantized weights) and the launch with its scratch.
// module.cpp registers them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <nanobind/nanobind.h>

#include "gatedmlp/gatedmlp.hpp"
#include "gatedmlp/layout.hpp"
#include "gatedmlp/quant.hpp"
#include "tensor.hpp"

namespace gatedmlp::py {

namespace nb = nanobind;

// Makes `device` current for the scope (the kernel launches on the current
// device, which need not be the tensors' one), and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      return;  // no device: run() reports that
    }
    if (current == device) return;
    if (cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    previous_ = current;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

inline cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// __cuda_array_interface__ v3 names the stream its data is ready on: orders
// `stream` after each view's producer stream.
void wait_for_producers(const std::vector<const TensorView*>& views, cudaStream_t stream);

inline std::string str(int64_t v) { return std::to_string(v); }

// Row stride of a matrix whose last axis must be contiguous; 0 (dense) when
// there is only one row, or no element, and the stride means nothing.
int64_t row_stride(const TensorView& t, const char* hint = "");

// Batch stride of a tensor whose unbatched form has `base` dimensions. One
// with no batch axis is shared by every batch (stride 0) when `shareable`.
int64_t batch_stride(const TensorView& t, int base, int64_t batch, bool shareable, const char* form);

void require_same_dtype(const TensorView& t, const TensorView& ref);

inline const void* ptr(const std::optional<TensorView>& t) { return t ? t->data : nullptr; }

// Quantized weights' extra arrays and format (all None / nullopt: 16-bit weights).
struct QuantArrays {
  nb::handle scales, biases, scales_up, biases_up;
  std::optional<QuantFormat> format;
};

// FP8 weights given as their e4m3 bytes ([rows, K] float8_e4m3fn or uint8,
// as checkpoints store them) become the 4-byte words [rows, K / 4] the
// quantized path reads (other tensors are left as they are), so that a
// caller makes no int32 view per call (~1 us of host time in
// gatedmlp.fp8_gate_up, h86). Raises, naming the tensor, when its rows are
// not whole aligned words.
void fp8_bytes_as_words(TensorView& t);

// A Mixture-of-Experts gather (Problem::gather), as the entry points take
// it: the expert ids (None: no gather), rows_per_x, rows_per_index and the
// optional index_error output (gatedmlp.hpp's Gather says what they mean);
// grouped: indices holds the E cumulative row ends of rows sorted by expert.
struct GatherArgs {
  nb::handle indices, index_error;
  int64_t rows_per_x = 1, rows_per_index = 1;
  bool grouped = false;
  bool index_trap = false;  // Arguments::index_trap
};

// The same, imported.
struct GatherTensors {
  std::optional<TensorView> indices, index_error;
  int64_t rows_per_x = 1, rows_per_index = 1;
  bool grouped = false;
  bool index_trap = false;
  bool on() const { return indices.has_value(); }
};

GatherTensors import_gather(const GatherArgs& g);

// ---------------------------------------------------------------- descriptor parts (calls.cpp)
// The input x, [M, K] or [batch, M, K]: batch, m, k, input_dtype, ldx and
// batch_stride_x. fp8: x holds FP8 activations (fp8_input() said so), read
// as e4m3fn bytes whatever its 8-bit dtype.
void describe_input(const TensorView& x, Problem* p, bool fp8 = false);

// FP8 activations (gate_up, Problem::input_dtype = fp8_e4m3), as the entry
// points take them: x float8_e4m3fn, or its bytes as uint8 / int8 with
// x_fp8 = True (a framework whose DLPack export has no float8 dtype), and
// x_scales, x's fp32 scales (None: a 16-bit call).
struct Fp8Args {
  nb::handle x_scales;
  bool x_fp8 = false;
  bool fp8_promote = false;  // Problem::fp8_promote (FP8 activations only)
  // FP8 Y (an FP8 call's output_dtype = fp8_e4m3): out's 1 x 128 group
  // scales (given: out holds e4m3 bytes), their layout, and the optional
  // amax output.
  nb::handle y_scales, y_amax;
  YScaleLayout y_scale_layout = YScaleLayout::row_major;
};

// Whether x holds FP8 activations: float8_e4m3fn, or 8-bit integers with
// x_fp8. Raises, naming the argument, when x_fp8 is set on another dtype,
// when FP8 x comes without x_scales, or x_scales without FP8 x.
bool fp8_input(const TensorView& x, bool x_fp8, const std::optional<TensorView>& x_scales);

// The fp32 scales of FP8 x (p->m and p->k set): 1 value (XScale::tensor),
// m (XScale::row, one per row: [M] or [M, 1], torch._scaled_mm's row-wise
// scale_a) or m * ceil(k / 128) (XScale::block, [M, ceil(K / 128)]
// row-major), contiguous; sizes that coincide mean the same and are read
// in that order. Sets p->x_scale.
void describe_x_scales(const TensorView& s, Problem* p);

// The output `out`, [M, U] or [batch, M, U] like x (p's batch, m and u
// already set): output_dtype, ldy and batch_stride_y. fp8: out holds an
// FP8 Y (float8_e4m3fn, or its bytes as uint8 / int8).
void describe_output(const TensorView& y, bool batched, Problem* p, bool fp8 = false);

// An FP8 Y's scales (p's m and u set, p->y_scale_layout the layout asked
// for): float32 [M, ceil(U / 128)], row-major (strides (ceil(U / 128), 1))
// or MN-major (strides (1, align4(M)), DeepGEMM's TMA-aligned layout),
// and the optional amax, one float32. Sets has_y_amax.
void describe_y_scales(const TensorView& s, const std::optional<TensorView>& amax, Problem* p);

// The batch stride of a bias vector b, [n] (shared by the batch) or
// [batch, n], contiguous; `form` names n in messages ("[2U]", "[U]").
int64_t bias_batch_stride(const TensorView& b, int64_t n, const char* form, int64_t batch);

// One tensor of quantized weights with its scales and biases (the names
// the messages give them when absent).
struct QuantTensors {
  const TensorView* words;
  const std::optional<TensorView>* scales;
  const std::optional<TensorView>* biases;
  const char* scales_name;
  const char* biases_name;
};

// The quantized part of a descriptor (p->k already set): each tensor's
// words [rows, K * bits / 32], scales [scale rows, groups] and, for affine,
// biases of the scales' shape and dtype. Sets quantized, quant and
// scale_dtype. With `experts` (a gathered call's E, 0: none) each has a
// leading expert axis: words [E, rows, K * bits / 32], scales and biases
// [E, scale rows, groups], contiguous (a per-tensor FP8 scale: [E], [E, 1]
// or [E, 1, 1]).
void describe_quantized(const QuantFormat& f, int64_t rows, const std::vector<QuantTensors>& tensors, Problem* p,
                        int64_t experts = 0);

// ---------------------------------------------------------------- gathered calls (calls.cpp)
// A call without indices refuses the gather's other arguments.
void require_no_gather(const GatherTensors& g);

// The input x of a gathered call, [m / rows_per_x, K] (2-D): m = its rows
// x rows_per_x, k, input_dtype and ldx.
void describe_gathered_input(const TensorView& x, const GatherTensors& g, Problem* p);

// The experts' weights w (and w_up) of a gathered call, [E, rows, K]
// (out_in), or quantized [E, rows, K * bits / 32] words (their row length
// is describe_quantized's to check): sets weights.storage, weights.ld and
// batch_stride_w (the expert stride). `form` names the shape in messages.
struct ExpertWeights {
  int64_t experts, rows;
};
ExpertWeights describe_expert_weights(const TensorView& w, const TensorView* w_up, const char* form, bool quantized,
                                      WeightStorage storage, Problem* p);

// The expert stride of a gathered call's bias, [E, n] (n contiguous);
// `form` names it in messages ("[E, 2U]").
int64_t expert_bias_stride(const TensorView& b, int64_t n, const char* form, int64_t experts);

// The gather itself (p->m set): indices (int32 or int64, contiguous, m /
// rows_per_index of them) and index_error (int64, 2). Sets p->gather.
void describe_gather(const GatherTensors& g, int64_t experts, Problem* p);

// Arguments::indices and index_error from g.
void set_gather_arguments(const GatherTensors& g, Arguments* a);

// The per-row scale of a gathered down projection (Problem::has_row_scale,
// p->m and p->gather set): m values (any shape, contiguous), fp32, bf16 or
// fp16. Sets has_row_scale and row_scale_dtype; refused without a gather.
void describe_row_scale(const TensorView& s, Problem* p);

// The two int64 of an index_error tensor, read on `stream` once the work
// queued there is done (a synchronisation): (-1, 0), or the first bad
// index's position and value.
std::pair<int64_t, int64_t> read_index_error(nb::handle index_error, uintptr_t stream_handle);

// ---------------------------------------------------------------- the launch (calls.cpp)
// Runs p on a, on x's device and `stream_handle`, after the producer
// streams of `views`. The workspace is the caller's (`workspace`), or
// scratch from workspace_alloc(n) held for the device and stream (fresh
// while a CUDA graph is being captured, or with hold_workspace false: the
// framework then owns it and frees it after the call, as torch.compile's
// CUDA-graph trees require of an op's allocations), or none when both are
// None.
void launch(const Problem& p, const Arguments& a, const TensorView& x, uintptr_t stream_handle, nb::handle workspace,
            nb::handle workspace_alloc, const std::vector<const TensorView*>& views, bool hold_workspace = true);

// gatedmlp.gate_up's C++ half (gate_up.cpp): fills a Problem from the
// tensors and calls run().
// With fp8.x_scales (FP8 activations) x is e4m3 and the weights FP8
// quantized (quant's fp8_e4m3 mode, w / w_up their bytes as words).
void gate_up(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
             nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
             std::optional<float> clamp_alpha, std::optional<float> clamp_limit, int64_t group, Half first,
             WeightStorage storage, float alpha, uintptr_t stream_handle, nb::handle workspace,
             nb::handle workspace_alloc, const QuantArrays& quant, bool hold_workspace = true,
             const GatherArgs& gather = {}, const Fp8Args& fp8 = {});

// The Problem gate_up() would run for these tensors (gate_up.cpp).
Problem make_problem(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
                     nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
                     int64_t group, Half first, WeightStorage storage, float alpha, const QuantArrays& quant,
                     const GatherArgs& gather = {}, const Fp8Args& fp8 = {});

// gatedmlp.down's C++ half (down.cpp): the down projection, op = down, y =
// alpha * (h @ Wd^T) + bd with h = x, or act(x) * x_up when x_up is given
// (glu_input); gathered, each row times row_scale[r] when row_scale is
// given. Only quant's scales and biases are used (one weight tensor).
void down(nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias, Activation activation,
          std::optional<ActivationParams> act_params, std::optional<float> clamp_alpha,
          std::optional<float> clamp_limit, WeightStorage storage, float alpha, uintptr_t stream_handle,
          nb::handle workspace, nb::handle workspace_alloc, const QuantArrays& quant, bool hold_workspace = true,
          const GatherArgs& gather = {}, nb::handle row_scale = nb::none());

// The Problem down() would run for these tensors (down.cpp).
Problem make_down_problem(nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias,
                          Activation activation, std::optional<ActivationParams> act_params, WeightStorage storage,
                          float alpha, const QuantArrays& quant, const GatherArgs& gather = {},
                          nb::handle row_scale = nb::none());

// convert_weights / convert_weights_device (convert.cpp).
void convert(nb::handle from_w, nb::handle to_w, WeightLayout from, WeightLayout to, nb::handle from_w_up,
             nb::handle to_w_up, uintptr_t stream_handle, bool device_only);

// quantize_host / dequantize_host on host tensors (quant.cpp): shapes and
// dtypes read from them; the outputs are the caller's.
void quantize(nb::handle w, nb::handle wq, nb::handle scales, nb::handle biases, const QuantFormat& format);
void dequantize(nb::handle wq, nb::handle scales, nb::handle biases, nb::handle w, const QuantFormat& format);
void repack(nb::handle src, nb::handle dst, const QuantFormat& from, const QuantFormat& to, int64_t k,
            uintptr_t stream_handle);

}  // namespace gatedmlp::py
