// gatedmlp.gate_up's C++ half: a Problem from the tensors (describe), the
// Hopper path's scratch held per device and stream, and the call.
#include <tuple>
#include <utility>

#include "calls.hpp"

namespace gatedmlp::py {

namespace {

struct GateUpTensors {
  TensorView x, w;
  std::optional<TensorView> w_up, bias, bias_up, out, preact;
  // Quantized weights: the scales and biases of w and w_up.
  std::optional<TensorView> scales, biases, scales_up, biases_up;
};

struct GateUpOptions {
  Activation activation = Activation::silu;
  ActivationParams act_params;
  int64_t group = 0;
  Half first = Half::gate;
  WeightStorage storage = WeightStorage::out_in;
  float alpha = 1.0f;
  std::optional<QuantFormat> quant;  // set: w (and w_up) are packed words
};

// Packed words: uint32, or int32 holding the same bits (frameworks without
// an unsigned 32-bit type).
void require_words(const TensorView& t) {
  if ((t.code != 0 && t.code != 1) || t.bits != 32 || t.lanes != 1)  // DLPack kDLInt, kDLUInt
    raise_invalid("'" + t.name + "' holds quantized weights, so must be uint32 (or int32) packed words, got " +
                  t.dtype_name());
}

// The quantized half of describe(): w's words and the scales and biases, [rows, K / group] each.
void describe_quantized(const GateUpTensors& t, const QuantFormat& f, Problem* p) {
  p->quantized = true;
  p->quant = f;
  if (Status s = check_quant_format(f, p->k); !s.ok()) check(s);
  const bool sep = t.w_up.has_value(), mx = f.mode == QuantMode::mxfp4, fp8 = f.mode == QuantMode::fp8_e4m3;
  const int64_t words = quant_words_per_row(f, p->k), groups = quant_groups_per_row(f, p->k);
  const int64_t rows = sep ? p->u : 2 * p->u, scale_rows = quant_scale_rows(f, rows);
  struct One {
    const TensorView* w;
    const std::optional<TensorView>* scales;
    const std::optional<TensorView>* biases;
    const char* sname;
    const char* bname;
  };
  const One ones[2] = {{&t.w, &t.scales, &t.biases, "scales", "biases"},
                       {sep ? &*t.w_up : nullptr, &t.scales_up, &t.biases_up, "scales_up", "biases_up"}};
  for (const One& o : ones) {
    if (!o.w) {
      if (*o.scales || *o.biases)
        raise_invalid("'scales_up' and 'biases_up' go with separate quantized weights (w_up); w holds both halves");
      continue;
    }
    require_words(*o.w);
    if (o.w->ndim != 2 || o.w->size(1) != words)
      raise_invalid("'" + o.w->name + "' must be [rows, K * bits / 32] = (" + str(rows) + ", " + str(words) +
                    ") uint32 words for K = " + str(p->k) + " and " + to_string(f) + ", got shape " + o.w->shape_str());
    if (!*o.scales) raise_invalid("'" + std::string(o.sname) + "' is required with quantized weights");
    const TensorView& sc = **o.scales;
    if (sc.ndim != 2 || sc.size(0) != scale_rows || sc.size(1) != groups)
      raise_invalid("'" + sc.name + "' must be [" + (fp8 ? "scale rows, scale columns" : "rows, K / group_size") +
                    "] = (" + str(scale_rows) + ", " + str(groups) + ") for " + to_string(f) + ", got shape " +
                    sc.shape_str());
    if ((groups > 1 && sc.stride(1) != 1) || (scale_rows > 1 && sc.stride(0) != groups))
      raise_invalid("'" + sc.name + "' must be contiguous, got strides " + sc.strides_str());
    if (mx) {
      if (sc.code != 1 || sc.bits != 8 || sc.lanes != 1)
        raise_invalid("'" + sc.name + "' must be uint8 (e8m0 scale bytes) for mxfp4, got " + sc.dtype_name());
      if (*o.biases) raise_invalid("'" + std::string(o.bname) + "' is given, but mxfp4 has no biases");
      continue;
    }
    if (fp8) {
      p->scale_dtype = dtype_of(sc, "scale");
      if (*o.biases) raise_invalid("'" + std::string(o.bname) + "' is given, but fp8_e4m3 has no biases");
      continue;
    }
    p->scale_dtype = dtype_of(sc, "scale");
    if (!*o.biases) raise_invalid("'" + std::string(o.bname) + "' is required with affine quantized weights");
    const TensorView& b = **o.biases;
    if (b.ndim != 2 || b.size(0) != rows || b.size(1) != groups)
      raise_invalid("'" + b.name + "' must have the shape of '" + sc.name + "' " + sc.shape_str() + ", got " +
                    b.shape_str());
    if ((groups > 1 && b.stride(1) != 1) || (rows > 1 && b.stride(0) != groups))
      raise_invalid("'" + b.name + "' must be contiguous, got strides " + b.strides_str());
    require_same_dtype(b, sc);
  }
  if (sep && !mx && t.scales && t.scales_up) require_same_dtype(*t.scales_up, *t.scales);
}

Problem describe(const GateUpTensors& t, const GateUpOptions& o) {
  Problem p;
  const TensorView& x = t.x;
  if (x.ndim != 2 && x.ndim != 3) raise_invalid("'x' must be [M, K] or [batch, M, K], got shape " + x.shape_str());
  const bool batched = x.ndim == 3;
  p.batch = batched ? x.size(0) : 1;
  p.m = x.size(-2);
  p.k = x.size(-1);
  p.input_dtype = dtype_of(x, "input");
  p.ldx = row_stride(x);
  p.batch_stride_x = batched ? batch_stride(x, 2, p.batch, false, "[M, K]") : kAuto;

  p.activation = o.activation;
  p.act_params = o.act_params;
  p.alpha = o.alpha;

  // Weights: [2U, K] fused or [U, K] each (out_in); [K, 2U] / [K, U] (in_out).
  const bool sep = t.w_up.has_value();
  const bool in_out = o.storage == WeightStorage::in_out;
  const TensorView& w = t.w;
  if (o.quant) {
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
    describe_quantized(t, *o.quant, &p);
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
    const char* bform = sep ? "[U]" : "[2U]";
    std::vector<const TensorView*> biases = {&*t.bias};
    if (sep && t.bias_up) biases.push_back(&*t.bias_up);
    int64_t bs = 0;
    for (size_t i = 0; i < biases.size(); ++i) {
      const TensorView& b = *biases[i];
      if ((b.ndim != 1 && b.ndim != 2) || b.size(-1) != n)
        raise_invalid("'" + b.name + "' must be " + bform + " = (" + str(n) + ",) (or batched), got shape " +
                      b.shape_str());
      if (n > 1 && b.stride(-1) != 1)
        raise_invalid("'" + b.name + "' must be contiguous (stride 1), got strides " + b.strides_str());
      require_same_dtype(b, *t.bias);
      const int64_t s = batch_stride(b, 1, p.batch, true, bform);
      if (i == 0) bs = s;
      else if (s != bs)
        raise_invalid("'bias_up' must have the batch stride of 'bias', got strides " + b.strides_str() + " and " +
                      t.bias->strides_str());
    }
    p.batch_stride_bias = bs;
  }

  if (t.out) {
    const TensorView& y = *t.out;
    if (y.ndim != x.ndim || y.size(-2) != p.m || y.size(-1) != p.u)
      raise_invalid("'out' must be " + std::string(batched ? "[batch, M, U] = (" + str(p.batch) + ", " : "[M, U] = (") +
                    str(p.m) + ", " + str(p.u) + "), got shape " + y.shape_str());
    p.output_dtype = dtype_of(y, "output");
    p.ldy = row_stride(y);
    p.batch_stride_y = batched ? batch_stride(y, 2, p.batch, false, "[M, U]") : kAuto;
  } else {
    p.output_dtype = p.input_dtype;
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
                             nb::handle bias_up, nb::handle preact, const QuantArrays& q) {
  GateUpTensors t{import_tensor(x, "x", false), import_tensor(w, "w", false), {}, {}, {}, {}, {}, {}, {}, {}, {}};
  t.scales = import_optional(q.scales, "scales", false);
  t.biases = import_optional(q.biases, "biases", false);
  t.scales_up = import_optional(q.scales_up, "scales_up", false);
  t.biases_up = import_optional(q.biases_up, "biases_up", false);
  t.w_up = import_optional(w_up, "w_up", false);
  t.bias = import_optional(bias, "bias", false);
  t.bias_up = import_optional(bias_up, "bias_up", false);
  t.out = import_optional(out, "out", true);
  t.preact = import_optional(preact, "preact", true);
  return t;
}

GateUpOptions make_options(Activation activation, std::optional<ActivationParams> act_params, int64_t group,
                           Half first, WeightStorage storage, float alpha, const QuantArrays& q) {
  GateUpOptions o;
  o.quant = q.format;
  o.activation = activation;
  if (act_params) o.act_params = *act_params;
  o.group = group;
  o.first = first;
  o.storage = storage;
  o.alpha = alpha;
  return o;
}

// ---------------------------------------------------------------- workspace
// The scratch a call on the Hopper path uses (workspace_size()), allocated
// through the caller's framework (workspace_alloc) the first time a stream
// needs it and kept for that device and stream: calls on one stream run in
// order, so they can share it, and a call then costs no allocation. A call
// being captured into a CUDA graph gets scratch of its own instead, which
// the framework's graph pool keeps for the graph's lifetime: a graph may be
// replayed on another stream, alongside eager calls on this one.
struct HeldWorkspace {
  int device;
  uintptr_t stream;
  // The imported scratch: its view owns the framework's memory (a consumed
  // DLPack capsule gives the memory to the importer, so holding the capsule
  // would not keep it). Deleted only when a bigger one replaces it, and
  // never at exit, when the framework may be gone.
  TensorView* owner;
  size_t bytes;
};
std::vector<HeldWorkspace> g_workspaces;  // guarded by the GIL

size_t bytes_of(const TensorView& v) {
  size_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= static_cast<size_t>(v.shape[static_cast<size_t>(i)]);
  return n * (v.bits / 8u);
}

// Scratch for a call: a held one, or a new one from `alloc`, which `fresh`
// owns until the call has been queued when it is not held (during capture).
std::pair<void*, size_t> workspace_for(const Problem& p, int device, cudaStream_t stream, nb::handle alloc,
                                       TensorView* fresh) {
  const size_t n = workspace_size(p);
  if (n == 0) return {nullptr, 0};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    capture = cudaStreamCaptureStatusActive;  // unknown: take fresh scratch, which is always safe
  }
  const uintptr_t s = reinterpret_cast<uintptr_t>(stream);
  if (capture == cudaStreamCaptureStatusNone)
    for (const HeldWorkspace& w : g_workspaces)
      if (w.device == device && w.stream == s && w.bytes >= n) return {w.owner->data, w.bytes};
  TensorView v = import_tensor(alloc(n), "workspace", true);
  const size_t bytes = bytes_of(v);
  if (capture != cudaStreamCaptureStatusNone) {
    *fresh = std::move(v);
    return {fresh->data, bytes};
  }
  for (auto it = g_workspaces.begin(); it != g_workspaces.end(); ++it)
    if (it->device == device && it->stream == s) {
      // Too small: replaced. Its memory goes back to the framework, whose
      // allocator orders any reuse after the work already queued on it.
      delete it->owner;
      g_workspaces.erase(it);
      break;
    }
  g_workspaces.push_back({device, s, new TensorView(std::move(v)), bytes});
  return {g_workspaces.back().owner->data, bytes};
}

}  // namespace

void gate_up(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
             nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
             std::optional<float> clamp_alpha, std::optional<float> clamp_limit, int64_t group, Half first,
             WeightStorage storage, float alpha, uintptr_t stream_handle, nb::handle workspace,
             nb::handle workspace_alloc, const QuantArrays& q) {
  if (out.is_none()) throw nb::type_error("'out' is required (the Python wrapper gatedmlp.gate_up allocates it)");
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact, q);
  GateUpOptions o = make_options(activation, act_params, group, first, storage, alpha, q);
  if (clamp_alpha) o.act_params.clamp_alpha = *clamp_alpha;
  if (clamp_limit) o.act_params.clamp_limit = *clamp_limit;
  const Problem p = describe(t, o);

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

  const cudaStream_t stream = as_stream(stream_handle);
  const int device = t.x.device_type == kDeviceCUDA ? t.x.device_id : -1;
  DeviceGuard guard(device);

  // Workspace: the caller's, or scratch held for this device and stream
  // (workspace_alloc allocates it); without either, the call runs unsplit.
  void* ws = nullptr;
  size_t ws_bytes = 0;
  TensorView ws_view;  // owns the caller's workspace, or fresh scratch, until the call is queued
  if (!workspace.is_none()) {
    ws_view = import_tensor(workspace, "workspace", true);
    ws = ws_view.data;
    ws_bytes = bytes_of(ws_view);
  } else if (!workspace_alloc.is_none() && p.m > 0 && p.batch > 0) {
    std::tie(ws, ws_bytes) = workspace_for(p, device, stream, workspace_alloc, &ws_view);
  }

  wait_for_producers({&t.x, &t.w, t.w_up ? &*t.w_up : nullptr, t.bias ? &*t.bias : nullptr,
                      t.bias_up ? &*t.bias_up : nullptr, &*t.out, t.preact ? &*t.preact : nullptr,
                      t.scales ? &*t.scales : nullptr, t.biases ? &*t.biases : nullptr,
                      t.scales_up ? &*t.scales_up : nullptr, t.biases_up ? &*t.biases_up : nullptr},
                     stream);
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(p, a, ws, ws_bytes, stream);
  }
  check(s);
}

Problem make_problem(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
                     nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
                     int64_t group, Half first, WeightStorage storage, float alpha, const QuantArrays& q) {
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact, q);
  return describe(t, make_options(activation, act_params, group, first, storage, alpha, q));
}

}  // namespace gatedmlp::py
