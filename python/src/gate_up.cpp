// gatedmlp.gate_up's C++ half: a Problem from the tensors (describe) and
// the call (calls.cpp's launch, with its scratch held per device and stream).
#include "calls.hpp"
#include "stage_timers.hpp"

namespace gatedmlp::py {

namespace {

struct GateUpTensors {
  TensorView x, w;
  std::optional<TensorView> w_up, bias, bias_up, out, preact;
  // Quantized weights: the scales and biases of w and w_up.
  std::optional<TensorView> scales, biases, scales_up, biases_up;
  GatherTensors gather;  // indices given: a gathered (MoE) call
  std::optional<TensorView> x_scales;  // FP8 activations: x's fp32 scales
  std::optional<TensorView> y_scales, y_amax;  // FP8 Y: its scales and amax
};

struct GateUpOptions {
  Activation activation = Activation::silu;
  ActivationParams act_params;
  int64_t group = 0;
  Half first = Half::gate;
  WeightStorage storage = WeightStorage::out_in;
  float alpha = 1.0f;
  std::optional<QuantFormat> quant;  // set: w (and w_up) are packed words
  bool x_fp8 = false;                // x's 8-bit integers are float8_e4m3fn bytes
  bool fp8_promote = false;          // Problem::fp8_promote
  YScaleLayout y_scale_layout = YScaleLayout::row_major;  // FP8 Y's scales
};

// The quantized half of describe(): w's words (and w_up's) with their
// scales and biases, [rows, K / group] each.
void describe_quantized_gate_up(const GateUpTensors& t, const QuantFormat& f, Problem* p, int64_t experts = 0) {
  const bool sep = t.w_up.has_value();
  std::vector<QuantTensors> tensors = {{&t.w, &t.scales, &t.biases, "scales", "biases"}};
  if (sep) tensors.push_back({&*t.w_up, &t.scales_up, &t.biases_up, "scales_up", "biases_up"});
  describe_quantized(f, sep ? p->u : 2 * p->u, tensors, p, experts);
  if (!sep && (t.scales_up || t.biases_up))
    raise_invalid("'scales_up' and 'biases_up' go with separate quantized weights (w_up); w holds both halves");
  if (sep && f.mode != QuantMode::mxfp4 && t.scales && t.scales_up) require_same_dtype(*t.scales_up, *t.scales);
}

Problem describe(const GateUpTensors& t, const GateUpOptions& o) {
  Problem p;
  const TensorView& x = t.x;
  const bool gathered = t.gather.on();
  // FP8 activations (x e4m3, with its scales): FP8 weights only, no gather.
  const bool fp8 = fp8_input(x, o.x_fp8, t.x_scales);
  if (fp8 && gathered)
    raise(StatusCode::not_supported, "gatedmlp: FP8 activations ('x_scales') take no gather ('indices')");
  if (fp8 && (!o.quant || o.quant->mode != QuantMode::fp8_e4m3))
    raise_invalid("FP8 activations need FP8 weights: quant=QuantFormat(mode=QuantMode.fp8_e4m3, bits=8, "
                  "group_size=0, row_block=0 (one scale per weight tensor) or 1 (one per weight row), or "
                  "group_size=128, row_block=128 (128 x 128 blocks)), with 'w' "
                  "(and 'w_up') the e4m3 bytes as uint32 or int32 words [rows, K / 4] and their 'scales'; got " +
                  (o.quant ? "quant=" + to_string(*o.quant) : std::string("no quant (16-bit weights)")));
  if (gathered) describe_gathered_input(x, t.gather, &p);
  else {
    require_no_gather(t.gather);
    describe_input(x, &p, fp8);
  }
  if (fp8) describe_x_scales(*t.x_scales, &p);
  if (o.fp8_promote && !fp8)
    raise_invalid("'fp8_promote' goes with FP8 activations ('x' float8_e4m3fn with its 'x_scales'); 'x' is " +
                  x.dtype_name());
  p.fp8_promote = o.fp8_promote;
  const bool batched = x.ndim == 3;

  p.activation = o.activation;
  p.act_params = o.act_params;
  p.alpha = o.alpha;

  // Weights: [2U, K] fused or [U, K] each (out_in); [K, 2U] / [K, U] (in_out).
  const bool sep = t.w_up.has_value();
  const bool in_out = o.storage == WeightStorage::in_out;
  const TensorView& w = t.w;
  int64_t experts = 0;  // gathered: E
  if (gathered) {
    // The experts' weights, [E, 2U, K] or [E, U, K] each (quantized: words).
    const char* wform = o.quant ? (sep ? "[E, U, K * bits / 32]" : "[E, 2U, K * bits / 32]")
                                : (sep ? "[E, U, K]" : "[E, 2U, K]");
    const ExpertWeights ew = describe_expert_weights(w, sep ? &*t.w_up : nullptr, wform, o.quant.has_value(),
                                                     o.storage, &p);
    experts = ew.experts;
    if (!sep && ew.rows % 2 != 0)
      raise_invalid("'w' holds fused gate and up weights, " + std::string(wform) +
                    ", so needs an even number of rows; got shape " + w.shape_str() +
                    " (pass w_up for separate gate and up weights)");
    p.u = sep ? ew.rows : ew.rows / 2;
    p.weights.format = sep ? WeightFormat::separate : WeightFormat::fused;
    p.weights.group = o.group;
    p.weights.first = o.first;
    if (o.quant) describe_quantized_gate_up(t, *o.quant, &p, experts);
    else {
      require_same_dtype(w, x);
      if (sep) require_same_dtype(*t.w_up, x);
    }
    describe_gather(t.gather, experts, &p);
  } else if (o.quant) {
    // Packed rows along K: the row count from w, K from x.
    if (w.ndim != 2) raise_invalid("'w' holds quantized weights, [rows, K * bits / 32], got shape " + w.shape_str());
    if (in_out) raise_invalid("quantized weights are stored [out, K] (storage=out_in)");
    if (!sep && w.size(0) % 2 != 0)
      raise_invalid("'w' holds fused gate and up weights, so needs an even number of rows; got shape " + w.shape_str());
    p.u = sep ? w.size(0) : w.size(0) / 2;
    p.weights.format = sep ? WeightFormat::separate : WeightFormat::fused;
    p.weights.group = o.group;
    p.weights.first = o.first;
    p.weights.ld = row_stride(w);
    if (sep) {
      const TensorView& wu = *t.w_up;
      if (wu.ndim != 2 || wu.size(0) != w.size(0) || wu.size(1) != w.size(1))
        raise_invalid("'w_up' must have the shape of 'w' " + w.shape_str() + ", got " + wu.shape_str());
      if (row_stride(wu) != p.weights.ld)
        raise_invalid("'w_up' must have the row stride of 'w', got strides " + wu.strides_str());
    }
    describe_quantized_gate_up(t, *o.quant, &p);
  } else {
  const char* wform = sep ? (in_out ? "[K, U]" : "[U, K]") : (in_out ? "[K, 2U]" : "[2U, K]");
  if (w.ndim != 2 && w.ndim != 3)
    raise_invalid("'w' must be " + std::string(wform) + " (or batched), got shape " + w.shape_str());
  const int64_t rows = in_out ? w.size(-1) : w.size(-2);
  const int64_t wk = in_out ? w.size(-2) : w.size(-1);
  if (wk != p.k)
    raise_invalid("'w' must be " + std::string(wform) + " with K = " + str(p.k) + " (x.shape[-1]), got shape " +
                  w.shape_str() + (in_out ? " (storage=in_out)" : " (storage=out_in)"));
  if (!sep && rows % 2 != 0)
    raise_invalid("'w' holds fused gate and up weights, [2U, K] or [K, 2U], so needs an even number of rows; " +
                  std::string("got shape ") + w.shape_str() + " (pass w_up for separate gate and up weights)");
  p.u = sep ? rows : rows / 2;
  require_same_dtype(w, x);
  p.weights.format = sep ? WeightFormat::separate : WeightFormat::fused;
  p.weights.group = o.group;
  p.weights.first = o.first;
  p.weights.storage = o.storage;
  p.weights.ld = row_stride(w, in_out ? " with storage=out_in" : " with storage=in_out");
  p.batch_stride_w = batch_stride(w, 2, p.batch, true, wform);
  if (sep) {
    const TensorView& wu = *t.w_up;
    if (wu.ndim != w.ndim || wu.size(-1) != w.size(-1) || wu.size(-2) != w.size(-2) ||
        (w.ndim == 3 && wu.size(0) != w.size(0)))
      raise_invalid("'w_up' must have the shape of 'w' " + w.shape_str() + ", got " + wu.shape_str());
    require_same_dtype(wu, x);
    if (row_stride(wu) != p.weights.ld)
      raise_invalid("'w_up' must have the row stride of 'w' (weights.ld = " + str(p.weights.ld) + "), got strides " +
                    wu.strides_str());
    if (batch_stride(wu, 2, p.batch, true, wform) != p.batch_stride_w)
      raise_invalid("'w_up' must have the batch stride of 'w', got strides " + wu.strides_str() + " and " +
                    w.strides_str());
  }
  }  // 16-bit weights

  // Bias: [2U] in weight-row order (fused), or [U] each (separate).
  if (t.bias) {
    p.has_bias = true;
    p.bias_dtype = dtype_of(*t.bias, "bias");
    const int64_t n = sep ? p.u : 2 * p.u;
    const char* bform = gathered ? (sep ? "[E, U]" : "[E, 2U]") : (sep ? "[U]" : "[2U]");
    std::vector<const TensorView*> biases = {&*t.bias};
    if (sep && t.bias_up) biases.push_back(&*t.bias_up);
    int64_t bs = 0;
    for (size_t i = 0; i < biases.size(); ++i) {
      const TensorView& b = *biases[i];
      const int64_t s = gathered ? expert_bias_stride(b, n, bform, experts) : bias_batch_stride(b, n, bform, p.batch);
      require_same_dtype(b, *t.bias);
      if (i == 0) bs = s;
      else if (s != bs)
        raise_invalid("'bias_up' must have the " + std::string(gathered ? "expert" : "batch") +
                      " stride of 'bias', got strides " + b.strides_str() + " and " +
                      t.bias->strides_str());
    }
    p.batch_stride_bias = bs;
  }

  const bool fp8_y = t.y_scales.has_value();
  if (fp8_y && !fp8)
    raise_invalid("'y_scales' (an FP8 Y) goes with FP8 activations ('x' float8_e4m3fn with its 'x_scales'); 'x' is " +
                  x.dtype_name());
  if (!fp8_y && t.y_amax) raise_invalid("'y_amax' goes with an FP8 Y ('out' float8_e4m3fn with its 'y_scales')");
  if (t.out) {
    describe_output(*t.out, batched, &p, fp8_y);
  } else {
    // FP8 activations have no 16-bit input dtype to follow: bf16 then.
    p.output_dtype = fp8_y ? DType::fp8_e4m3 : fp8 ? DType::bf16 : p.input_dtype;
  }
  if (fp8_y) {
    p.y_scale_layout = o.y_scale_layout;
    describe_y_scales(*t.y_scales, t.y_amax, &p);
  }

  if (t.preact) {
    const TensorView& q = *t.preact;
    if (q.ndim != x.ndim || q.size(-2) != p.m || q.size(-1) != 2 * p.u)
      raise_invalid("'preact' must be " +
                    std::string(batched ? "[batch, M, 2U] = (" + str(p.batch) + ", " : "[M, 2U] = (") + str(p.m) +
                    ", " + str(2 * p.u) + "), got shape " + q.shape_str());
    p.has_preact = true;
    p.preact_dtype = dtype_of(q, "pre-activation");
    p.ldpre = row_stride(q);
    p.batch_stride_preact = batched ? batch_stride(q, 2, p.batch, false, "[M, 2U]") : kAuto;
  }
  return p;
}

GateUpTensors import_gate_up(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias,
                             nb::handle bias_up, nb::handle preact, const QuantArrays& q, const GatherArgs& g,
                             const Fp8Args& f) {
  GateUpTensors t{import_tensor(x, "x", false), import_tensor(w, "w", false), {}, {}, {}, {}, {}, {}, {}, {}, {}, {},
                  {}, {}, {}};
  t.x_scales = import_optional(f.x_scales, "x_scales", false);
  t.y_scales = import_optional(f.y_scales, "y_scales", true);
  t.y_amax = import_optional(f.y_amax, "y_amax", true);
  t.gather = import_gather(g);
  t.scales = import_optional(q.scales, "scales", false);
  t.biases = import_optional(q.biases, "biases", false);
  t.scales_up = import_optional(q.scales_up, "scales_up", false);
  t.biases_up = import_optional(q.biases_up, "biases_up", false);
  t.w_up = import_optional(w_up, "w_up", false);
  t.bias = import_optional(bias, "bias", false);
  t.bias_up = import_optional(bias_up, "bias_up", false);
  t.out = import_optional(out, "out", true);
  t.preact = import_optional(preact, "preact", true);
  if (q.format && q.format->mode == QuantMode::fp8_e4m3) {
    fp8_bytes_as_words(t.w);
    if (t.w_up) fp8_bytes_as_words(*t.w_up);
  }
  return t;
}

GateUpOptions make_options(Activation activation, std::optional<ActivationParams> act_params, int64_t group,
                           Half first, WeightStorage storage, float alpha, const QuantArrays& q, const Fp8Args& f) {
  GateUpOptions o;
  o.quant = q.format;
  o.x_fp8 = f.x_fp8;
  o.fp8_promote = f.fp8_promote;
  o.y_scale_layout = f.y_scale_layout;
  o.activation = activation;
  if (act_params) o.act_params = *act_params;
  o.group = group;
  o.first = first;
  o.storage = storage;
  o.alpha = alpha;
  return o;
}

}  // namespace

void gate_up(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
             nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
             std::optional<float> clamp_alpha, std::optional<float> clamp_limit, int64_t group, Half first,
             WeightStorage storage, float alpha, uintptr_t stream_handle, nb::handle workspace,
             nb::handle workspace_alloc, const QuantArrays& q, bool hold_workspace, const GatherArgs& g,
             const Fp8Args& f) {
  GATEDMLP_LAP_START();
  if (out.is_none()) throw nb::type_error("'out' is required (the Python wrapper gatedmlp.gate_up allocates it)");
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact, q, g, f);
  GATEDMLP_LAP(kImport);
  GateUpOptions o = make_options(activation, act_params, group, first, storage, alpha, q, f);
  if (clamp_alpha) o.act_params.clamp_alpha = *clamp_alpha;
  if (clamp_limit) o.act_params.clamp_limit = *clamp_limit;
  GATEDMLP_LAP(kOptions);
  const Problem p = describe(t, o);
  GATEDMLP_LAP(kDescribe);

  Arguments a;
  a.x = t.x.data;
  a.w = t.w.data;
  a.w_up = ptr(t.w_up);
  a.bias = ptr(t.bias);
  a.bias_up = ptr(t.bias_up);
  a.y = t.out->data;
  a.preact = t.preact ? t.preact->data : nullptr;
  a.w_scales = ptr(t.scales);
  a.w_biases = ptr(t.biases);
  a.w_up_scales = ptr(t.scales_up);
  a.w_up_biases = ptr(t.biases_up);
  a.x_scales = ptr(t.x_scales);
  a.y_scales = t.y_scales ? static_cast<float*>(t.y_scales->data) : nullptr;
  a.y_amax = t.y_amax ? static_cast<float*>(t.y_amax->data) : nullptr;
  set_gather_arguments(t.gather, &a);

  const GatherTensors& gt = t.gather;
  GATEDMLP_LAP(kArguments);
  launch(p, a, t.x, stream_handle, workspace, workspace_alloc,
         {&t.x, &t.w, t.w_up ? &*t.w_up : nullptr, t.bias ? &*t.bias : nullptr, t.bias_up ? &*t.bias_up : nullptr,
          &*t.out, t.preact ? &*t.preact : nullptr, t.scales ? &*t.scales : nullptr, t.biases ? &*t.biases : nullptr,
          t.scales_up ? &*t.scales_up : nullptr, t.biases_up ? &*t.biases_up : nullptr,
          gt.indices ? &*gt.indices : nullptr, gt.index_error ? &*gt.index_error : nullptr,
          t.x_scales ? &*t.x_scales : nullptr, t.y_scales ? &*t.y_scales : nullptr, t.y_amax ? &*t.y_amax : nullptr},
         hold_workspace);
}

Problem make_problem(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
                     nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
                     int64_t group, Half first, WeightStorage storage, float alpha, const QuantArrays& q,
                     const GatherArgs& g, const Fp8Args& f) {
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact, q, g, f);
  return describe(t, make_options(activation, act_params, group, first, storage, alpha, q, f));
}

}  // namespace gatedmlp::py
