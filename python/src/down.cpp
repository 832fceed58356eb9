// gatedmlp.down's C++ half: the down projection (Problem::op = down), a
// Problem from the tensors and the call (gathered: with the per-row scale,
// the MoE routing weight, when row_scale is given). What it shares with gate_up (the
// input, the output, a bias vector, quantized weights, the launch and its
// scratch) is in calls.cpp.
#include "calls.hpp"

namespace gatedmlp::py {

namespace {

struct DownTensors {
  TensorView x, w;
  std::optional<TensorView> x_up, bias, out;
  // Quantized weights: w's scales and biases.
  std::optional<TensorView> scales, biases;
  GatherTensors gather;  // indices given: a gathered (MoE) call
  std::optional<TensorView> row_scale;  // gathered only: y[r] *= row_scale[r] after the bias
};

struct DownOptions {
  Activation activation = Activation::silu;  // the GLU of the input, with x_up; unused without
  ActivationParams act_params;
  WeightStorage storage = WeightStorage::out_in;
  float alpha = 1.0f;
  std::optional<QuantFormat> quant;  // set: w holds packed words
};

Problem describe(const DownTensors& t, const DownOptions& o) {
  Problem p;
  p.op = Operation::down;
  const TensorView& x = t.x;
  const bool gathered = t.gather.on();
  if (gathered) describe_gathered_input(x, t.gather, &p);
  else {
    require_no_gather(t.gather);
    describe_input(x, &p);
  }
  const bool batched = x.ndim == 3;

  // The up half of a GLU input: read with x's strides (the descriptor has
  // one ldx and one batch stride for both), so it must share them.
  if (t.x_up) {
    const TensorView& xu = *t.x_up;
    bool same_shape = xu.ndim == x.ndim;
    for (int i = 0; same_shape && i < x.ndim; ++i) same_shape = xu.size(i) == x.size(i);
    if (!same_shape)
      raise_invalid("'x_up' (the up half of the input) must have the shape of 'x' " + x.shape_str() + ", got " +
                    xu.shape_str());
    require_same_dtype(xu, x);
    if (row_stride(xu) != p.ldx)
      raise_invalid("'x_up' must have the row stride of 'x' (ldx = " + str(p.ldx) + "), got strides " +
                    xu.strides_str() + " and " + x.strides_str());
    if (batched && batch_stride(xu, 2, p.batch, false, "[M, K]") != p.batch_stride_x)
      raise_invalid("'x_up' must have the batch stride of 'x', got strides " + xu.strides_str() + " and " +
                    x.strides_str());
    p.glu_input = true;
  }
  p.activation = o.activation;
  p.act_params = o.act_params;
  p.alpha = o.alpha;

  // Weights: one tensor, [U, K] (out_in) or [K, U] (in_out); quantized:
  // [U, K * bits / 32] words.
  const bool in_out = o.storage == WeightStorage::in_out;
  const TensorView& w = t.w;
  p.weights.storage = o.storage;
  int64_t experts = 0;  // gathered: E
  if (gathered) {
    // The experts' weights, [E, U, K] (quantized: [E, U, K * bits / 32] words).
    if (!o.quant && (t.scales || t.biases))
      raise_invalid("'scales' and 'biases' go with quantized weights (pass quant=); 'w' holds " + w.dtype_name() +
                    " weights");
    const ExpertWeights ew = describe_expert_weights(w, nullptr, o.quant ? "[E, U, K * bits / 32]" : "[E, U, K]",
                                                     o.quant.has_value(), o.storage, &p);
    experts = ew.experts;
    p.u = ew.rows;
    if (o.quant) describe_quantized(*o.quant, p.u, {{&t.w, &t.scales, &t.biases, "scales", "biases"}}, &p, experts);
    else require_same_dtype(w, x);
    describe_gather(t.gather, experts, &p);
  } else if (o.quant) {
    if (w.ndim != 2) raise_invalid("'w' holds quantized weights, [U, K * bits / 32], got shape " + w.shape_str());
    if (in_out) raise_invalid("quantized weights are stored [out, K] (storage=out_in)");
    p.u = w.size(0);
    p.weights.ld = row_stride(w);
    describe_quantized(*o.quant, p.u, {{&t.w, &t.scales, &t.biases, "scales", "biases"}}, &p);
  } else {
    if (t.scales || t.biases)
      raise_invalid("'scales' and 'biases' go with quantized weights (pass quant=); 'w' holds " + w.dtype_name() +
                    " weights");
    const char* wform = in_out ? "[K, U]" : "[U, K]";
    if (w.ndim != 2 && w.ndim != 3)
      raise_invalid("'w' must be " + std::string(wform) + " (or batched), got shape " + w.shape_str());
    const int64_t wk = in_out ? w.size(-2) : w.size(-1);
    if (wk != p.k)
      raise_invalid("'w' must be " + std::string(wform) + " with K = " + str(p.k) + " (x.shape[-1]), got shape " +
                    w.shape_str() + (in_out ? " (storage=in_out)" : " (storage=out_in)"));
    p.u = in_out ? w.size(-1) : w.size(-2);
    require_same_dtype(w, x);
    p.weights.ld = row_stride(w, in_out ? " with storage=out_in" : " with storage=in_out");
    p.batch_stride_w = batch_stride(w, 2, p.batch, true, wform);
  }

  if (t.bias) {
    p.has_bias = true;
    p.bias_dtype = dtype_of(*t.bias, "bias");
    p.batch_stride_bias = gathered ? expert_bias_stride(*t.bias, p.u, "[E, U]", experts)
                                   : bias_batch_stride(*t.bias, p.u, "[U]", p.batch);
  }

  if (t.row_scale) describe_row_scale(*t.row_scale, &p);

  if (t.out) describe_output(*t.out, batched, &p);
  else p.output_dtype = p.input_dtype;
  return p;
}

DownTensors import_down(nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias,
                        const QuantArrays& q, const GatherArgs& g,
                        nb::handle row_scale) {  // q's _up arrays: unused (one weight tensor)
  DownTensors t{import_tensor(x, "x", false), import_tensor(w, "w", false), {}, {}, {}, {}, {}, {}, {}};
  t.gather = import_gather(g);
  t.x_up = import_optional(x_up, "x_up", false);
  t.scales = import_optional(q.scales, "scales", false);
  t.biases = import_optional(q.biases, "biases", false);
  t.bias = import_optional(bias, "bias", false);
  t.out = import_optional(out, "out", true);
  t.row_scale = import_optional(row_scale, "row_scale", false);
  if (q.format && q.format->mode == QuantMode::fp8_e4m3) fp8_bytes_as_words(t.w);
  return t;
}

DownOptions make_options(Activation activation, std::optional<ActivationParams> act_params, WeightStorage storage,
                         float alpha, const QuantArrays& q) {
  DownOptions o;
  o.quant = q.format;
  o.activation = activation;
  if (act_params) o.act_params = *act_params;
  o.storage = storage;
  o.alpha = alpha;
  return o;
}

}  // namespace

void down(nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias, Activation activation,
          std::optional<ActivationParams> act_params, std::optional<float> clamp_alpha,
          std::optional<float> clamp_limit, WeightStorage storage, float alpha, uintptr_t stream_handle,
          nb::handle workspace, nb::handle workspace_alloc, const QuantArrays& q, bool hold_workspace,
          const GatherArgs& g, nb::handle row_scale) {
  if (out.is_none()) throw nb::type_error("'out' is required (the Python wrapper gatedmlp.down allocates it)");
  DownTensors t = import_down(x, w, out, x_up, bias, q, g, row_scale);
  DownOptions o = make_options(activation, act_params, storage, alpha, q);
  if (clamp_alpha) o.act_params.clamp_alpha = *clamp_alpha;
  if (clamp_limit) o.act_params.clamp_limit = *clamp_limit;
  const Problem p = describe(t, o);

  Arguments a;
  a.x = t.x.data;
  a.x_up = ptr(t.x_up);
  a.w = t.w.data;
  a.bias = ptr(t.bias);
  a.y = t.out->data;
  a.w_scales = ptr(t.scales);
  a.w_biases = ptr(t.biases);
  set_gather_arguments(t.gather, &a);
  a.row_scale = ptr(t.row_scale);

  const GatherTensors& gt = t.gather;
  launch(p, a, t.x, stream_handle, workspace, workspace_alloc,
         {&t.x, t.x_up ? &*t.x_up : nullptr, &t.w, t.bias ? &*t.bias : nullptr, &*t.out,
          t.scales ? &*t.scales : nullptr, t.biases ? &*t.biases : nullptr, gt.indices ? &*gt.indices : nullptr,
          gt.index_error ? &*gt.index_error : nullptr, t.row_scale ? &*t.row_scale : nullptr},
         hold_workspace);
}

Problem make_down_problem(nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias,
                          Activation activation, std::optional<ActivationParams> act_params, WeightStorage storage,
                          float alpha, const QuantArrays& q, const GatherArgs& g, nb::handle row_scale) {
  DownTensors t = import_down(x, w, out, x_up, bias, q, g, row_scale);
  return describe(t, make_options(activation, act_params, storage, alpha, q));
}

}  // namespace gatedmlp::py
