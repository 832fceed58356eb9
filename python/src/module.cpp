// gatedmlp._gatedmlp: the Python binding of the C++ API.
//
// A thin layer: it mirrors the C++ names (enums, Problem, Arguments, Config,
// check_support, plan, validate, run, convert_weights) and adds gate_up(),
// which fills a Problem from the tensors it is given and calls run(). Every
// rule about shapes, dtypes, strides and pointers is checked by the C++
// library; the binding only checks what it needs to build the descriptor
// (that the tensors agree on M, K and U, that a row is contiguous) and turns
// a failed Status into an exception:
//
//     invalid_argument -> gatedmlp.InvalidArgumentError (a ValueError)
//     not_supported    -> gatedmlp.NotSupportedError    (a NotImplementedError)
//     no_device        -> gatedmlp.NoDeviceError        (a RuntimeError)
//     cuda_error       -> gatedmlp.CudaError            (a RuntimeError)
//     library_error    -> gatedmlp.LibraryError         (a RuntimeError)
//
// all of them subclasses of gatedmlp.Error, with the StatusCode in `.code`.
#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "gatedmlp/gatedmlp.hpp"
#include "gatedmlp/layout.hpp"
#include "tensor.hpp"

#ifndef GATEDMLP_VERSION
#define GATEDMLP_VERSION "unknown"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace gatedmlp::py {
namespace {

// ---------------------------------------------------------------- errors
struct ErrorClasses {
  PyObject* base = nullptr;
  PyObject* invalid = nullptr;
  PyObject* not_supported = nullptr;
  PyObject* no_device = nullptr;
  PyObject* cuda = nullptr;
  PyObject* library = nullptr;
};
ErrorClasses g_errors;

PyObject* error_class(StatusCode c) {
  switch (c) {
    case StatusCode::invalid_argument: return g_errors.invalid;
    case StatusCode::not_supported: return g_errors.not_supported;
    case StatusCode::no_device: return g_errors.no_device;
    case StatusCode::cuda_error: return g_errors.cuda;
    case StatusCode::library_error: return g_errors.library;
    default: return g_errors.base;
  }
}

PyObject* new_error_class(nb::module_& m, const char* name, PyObject* base1, PyObject* base2, const char* doc) {
  const std::string qualified = std::string("gatedmlp.") + name;
  PyObject* bases = base2 ? PyTuple_Pack(2, base1, base2) : PyTuple_Pack(1, base1);
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::borrow(cls);
  return cls;  // one reference kept for the life of the process
}

void set_python_error(const StatusError& e) {
  PyObject* cls = error_class(e.code);
  nb::object exc = nb::steal(PyObject_CallFunction(cls, "s", e.message.c_str()));
  if (!exc.is_valid()) return;  // the call itself raised; that error stands
  nb::object code = nb::cast(e.code);
  PyObject_SetAttrString(exc.ptr(), "code", code.ptr());
  PyErr_SetObject(cls, exc.ptr());
}

// ---------------------------------------------------------------- kwargs constructors
// Struct(field=value, ...) for the plain structs: each name must be a field.
template <typename T>
struct Field {
  const char* name;
  void (*set)(T&, nb::handle);
};

#define GATEDMLP_FIELD(T, f) \
  Field<T> { #f, [](T& o, nb::handle v) { o.f = nb::cast<decltype(o.f)>(v); } }

template <typename T, size_t N>
void init_from_kwargs(T* self, const nb::kwargs& kw, const std::array<Field<T>, N>& fields, const char* cls) {
  T value{};
  for (auto [key, v] : kw) {
    const std::string k = nb::cast<std::string>(key);
    const Field<T>* f = nullptr;
    for (const Field<T>& c : fields)
      if (k == c.name) f = &c;
    if (!f) throw nb::type_error((std::string(cls) + " has no field '" + k + "'").c_str());
    try {
      f->set(value, v);
    } catch (const nb::cast_error&) {
      throw nb::type_error((std::string(cls) + "." + k + " cannot take a " +
                            nb::cast<std::string>(nb::str(v.type().attr("__name__"))))
                               .c_str());
    }
  }
  new (self) T(value);
}

const std::array<Field<ActivationParams>, 2> kActivationParamsFields = {
    GATEDMLP_FIELD(ActivationParams, clamp_alpha), GATEDMLP_FIELD(ActivationParams, clamp_limit)};

const std::array<Field<WeightLayout>, 5> kWeightLayoutFields = {
    GATEDMLP_FIELD(WeightLayout, format), GATEDMLP_FIELD(WeightLayout, group), GATEDMLP_FIELD(WeightLayout, first),
    GATEDMLP_FIELD(WeightLayout, storage), GATEDMLP_FIELD(WeightLayout, ld)};

const std::array<Field<Problem>, 22> kProblemFields = {
    GATEDMLP_FIELD(Problem, m),
    GATEDMLP_FIELD(Problem, k),
    GATEDMLP_FIELD(Problem, u),
    GATEDMLP_FIELD(Problem, batch),
    GATEDMLP_FIELD(Problem, input_dtype),
    GATEDMLP_FIELD(Problem, output_dtype),
    GATEDMLP_FIELD(Problem, activation),
    GATEDMLP_FIELD(Problem, act_params),
    GATEDMLP_FIELD(Problem, weights),
    GATEDMLP_FIELD(Problem, alpha),
    GATEDMLP_FIELD(Problem, has_bias),
    GATEDMLP_FIELD(Problem, bias_dtype),
    GATEDMLP_FIELD(Problem, has_preact),
    GATEDMLP_FIELD(Problem, preact_dtype),
    GATEDMLP_FIELD(Problem, ldx),
    GATEDMLP_FIELD(Problem, ldy),
    GATEDMLP_FIELD(Problem, ldpre),
    GATEDMLP_FIELD(Problem, batch_stride_x),
    GATEDMLP_FIELD(Problem, batch_stride_w),
    GATEDMLP_FIELD(Problem, batch_stride_bias),
    GATEDMLP_FIELD(Problem, batch_stride_y),
    GATEDMLP_FIELD(Problem, batch_stride_preact),
};

#define GATEDMLP_PTR_FIELD(f)                                                                   \
  Field<Arguments> {                                                                            \
    #f, [](Arguments& o, nb::handle v) {                                                        \
      o.f = reinterpret_cast<std::remove_reference_t<decltype(o.f)>>(nb::cast<uintptr_t>(v)); \
    }                                                                                           \
  }

const std::array<Field<Arguments>, 7> kArgumentsFields = {
    GATEDMLP_PTR_FIELD(x),    GATEDMLP_PTR_FIELD(w), GATEDMLP_PTR_FIELD(w_up),   GATEDMLP_PTR_FIELD(bias),
    GATEDMLP_PTR_FIELD(bias_up), GATEDMLP_PTR_FIELD(y), GATEDMLP_PTR_FIELD(preact)};

template <typename T>
void add_copy(nb::class_<T>& c) {
  c.def("__copy__", [](const T& v) { return T(v); });
  c.def("__deepcopy__", [](const T& v, nb::handle) { return T(v); }, "memo"_a);
}

// ---------------------------------------------------------------- device and stream helpers
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

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// __cuda_array_interface__ v3 names the stream its data is ready on; order
// our stream after it.
void wait_for_producers(const std::vector<const TensorView*>& views, cudaStream_t stream) {
  for (const TensorView* t : views) {
    if (!t || t->producer_stream == 0) continue;
    cudaStream_t producer = t->producer_stream == 1   ? cudaStreamLegacy
                            : t->producer_stream == 2 ? cudaStreamPerThread
                                                      : reinterpret_cast<cudaStream_t>(t->producer_stream);
    if (producer == stream) continue;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(ev, producer);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, ev, 0);
      cudaEventDestroy(ev);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      raise(StatusCode::cuda_error, "gatedmlp: ordering the stream after the producer stream of '" + t->name +
                                        "' failed: " + cudaGetErrorString(e));
    }
  }
}

// ---------------------------------------------------------------- building the descriptor
struct GateUpTensors {
  TensorView x, w;
  std::optional<TensorView> w_up, bias, bias_up, out, preact;
};

struct GateUpOptions {
  Activation activation = Activation::silu;
  ActivationParams act_params;
  int64_t group = 0;
  Half first = Half::gate;
  WeightStorage storage = WeightStorage::out_in;
  float alpha = 1.0f;
};

std::string str(int64_t v) { return std::to_string(v); }

// Row stride of a matrix whose last axis must be contiguous; 0 (dense) when
// there is only one row and the stride means nothing.
int64_t row_stride(const TensorView& t, const char* hint = "") {
  if (t.size(-1) > 1 && t.stride(-1) != 1) {
    std::string msg = "'" + t.name + "' must have a contiguous last dimension (stride 1); got shape " + t.shape_str() +
                      " with strides " + t.strides_str();
    if (t.size(-2) > 1 && t.stride(-2) == 1)
      msg += std::string(" (a transposed view? pass the tensor it views") + hint + ")";
    raise_invalid(msg);
  }
  if (t.size(-2) <= 1) return 0;
  if (t.stride(-2) == 0)
    raise_invalid("'" + t.name + "' has row stride 0 (a broadcast view), which the descriptor cannot express; " +
                  "got shape " + t.shape_str() + " with strides " + t.strides_str());
  return t.stride(-2);
}

// Batch stride of a tensor whose unbatched form has `base` dimensions. One
// with no batch axis is shared by every batch (stride 0) when `shareable`.
int64_t batch_stride(const TensorView& t, int base, int64_t batch, bool shareable, const char* form) {
  if (t.ndim == base) {
    if (batch == 1) return kAuto;
    if (shareable) return 0;
    raise_invalid("'" + t.name + "' must be " + form + " with a leading batch axis of " + str(batch) +
                  " (x is batched), got shape " + t.shape_str());
  }
  if (t.ndim == base + 1) {
    if (t.size(0) != batch)
      raise_invalid("'" + t.name + "' has a batch axis of " + str(t.size(0)) + " but x has batch " + str(batch) +
                    "; got shape " + t.shape_str());
    return batch > 1 ? t.stride(0) : kAuto;
  }
  raise_invalid("'" + t.name + "' must be " + form + (shareable ? " or batched" : "") + ", got shape " + t.shape_str());
}

void require_same_dtype(const TensorView& t, const TensorView& ref) {
  if (t.code != ref.code || t.bits != ref.bits || t.lanes != ref.lanes)
    raise_invalid("'" + t.name + "' has dtype " + t.dtype_name() + " but '" + ref.name + "' has " + ref.dtype_name() +
                  "; the descriptor has one dtype for both");
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
                             nb::handle bias_up, nb::handle preact) {
  GateUpTensors t{import_tensor(x, "x", false), import_tensor(w, "w", false), {}, {}, {}, {}, {}};
  t.w_up = import_optional(w_up, "w_up", false);
  t.bias = import_optional(bias, "bias", false);
  t.bias_up = import_optional(bias_up, "bias_up", false);
  t.out = import_optional(out, "out", true);
  t.preact = import_optional(preact, "preact", true);
  return t;
}

GateUpOptions make_options(Activation activation, std::optional<ActivationParams> act_params, int64_t group,
                           Half first, WeightStorage storage, float alpha) {
  GateUpOptions o;
  o.activation = activation;
  if (act_params) o.act_params = *act_params;
  o.group = group;
  o.first = first;
  o.storage = storage;
  o.alpha = alpha;
  return o;
}

const void* ptr(const std::optional<TensorView>& t) { return t ? t->data : nullptr; }

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
  PyObject* owner;  // the framework's tensor, one reference held (released only when a bigger one replaces it)
  void* ptr;
  size_t bytes;
};
std::vector<HeldWorkspace> g_workspaces;  // guarded by the GIL

// Imports a workspace object: its pointer and size in bytes.
std::pair<void*, size_t> workspace_view(nb::handle obj) {
  const TensorView v = import_tensor(obj, "workspace", true);
  size_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= static_cast<size_t>(v.shape[static_cast<size_t>(i)]);
  return {v.data, n * (v.bits / 8u)};
}

std::pair<void*, size_t> workspace_for(const Problem& p, int device, cudaStream_t stream, nb::handle alloc,
                                       nb::object* keep) {
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
      if (w.device == device && w.stream == s && w.bytes >= n) return {w.ptr, w.bytes};
  *keep = alloc(n);
  const auto [ptr, bytes] = workspace_view(*keep);
  if (capture == cudaStreamCaptureStatusNone) {
    for (auto it = g_workspaces.begin(); it != g_workspaces.end(); ++it)
      if (it->device == device && it->stream == s) {
        // Too small: replaced. Its memory goes back to the framework, whose
        // allocator orders any reuse after the work already queued on it.
        Py_DECREF(it->owner);
        g_workspaces.erase(it);
        break;
      }
    g_workspaces.push_back({device, s, keep->inc_ref().ptr(), ptr, bytes});
  }
  return {ptr, bytes};
}

// ---------------------------------------------------------------- the functional entry point
void gate_up(nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
             nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
             std::optional<float> clamp_alpha, std::optional<float> clamp_limit, int64_t group, Half first,
             WeightStorage storage, float alpha, uintptr_t stream_handle, nb::handle workspace,
             nb::handle workspace_alloc) {
  if (out.is_none()) throw nb::type_error("'out' is required (the Python wrapper gatedmlp.gate_up allocates it)");
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact);
  GateUpOptions o = make_options(activation, act_params, group, first, storage, alpha);
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

  const cudaStream_t stream = as_stream(stream_handle);
  const int device = t.x.device_type == kDeviceCUDA ? t.x.device_id : -1;
  DeviceGuard guard(device);

  // Workspace: the caller's, or scratch held for this device and stream
  // (workspace_alloc allocates it); without either, the call runs unsplit.
  void* ws = nullptr;
  size_t ws_bytes = 0;
  nb::object allocated;
  if (!workspace.is_none()) {
    std::tie(ws, ws_bytes) = workspace_view(workspace);
  } else if (!workspace_alloc.is_none() && p.m > 0 && p.batch > 0) {
    std::tie(ws, ws_bytes) = workspace_for(p, device, stream, workspace_alloc, &allocated);
  }

  wait_for_producers({&t.x, &t.w, t.w_up ? &*t.w_up : nullptr, t.bias ? &*t.bias : nullptr,
                      t.bias_up ? &*t.bias_up : nullptr, &*t.out, t.preact ? &*t.preact : nullptr},
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
                     int64_t group, Half first, WeightStorage storage, float alpha) {
  GateUpTensors t = import_gate_up(x, w, out, w_up, bias, bias_up, preact);
  return describe(t, make_options(activation, act_params, group, first, storage, alpha));
}

// ---------------------------------------------------------------- weight conversion
struct WeightSide {
  int64_t rows = 0, k = 0, ld = 0;
};

// Rows (output features), K and row stride of one weight tensor in `l`'s
// storage. A 1-D tensor is a bias: K = 1.
WeightSide weight_side(const TensorView& t, const WeightLayout& l) {
  const bool in_out = l.storage == WeightStorage::in_out;
  WeightSide s;
  if (t.ndim == 1) {
    s.rows = t.size(0);
    s.k = 1;
    if (in_out) {
      if (s.rows > 1 && t.stride(0) != 1)
        raise_invalid("'" + t.name + "' must be contiguous (stride 1), got strides " + t.strides_str());
      s.ld = 0;
    } else {
      s.ld = s.rows > 1 ? t.stride(0) : 0;
    }
    return s;
  }
  if (t.ndim != 2)
    raise_invalid("'" + t.name + "' must be a 2-D weight (or a 1-D bias), got shape " + t.shape_str());
  s.rows = in_out ? t.size(1) : t.size(0);
  s.k = in_out ? t.size(0) : t.size(1);
  s.ld = row_stride(t);
  return s;
}

// Takes ld from the tensor; a layout that names another ld contradicts it.
WeightLayout with_tensor_ld(WeightLayout l, const WeightSide& s, const char* name) {
  if (l.ld != 0 && s.ld != 0 && l.ld != s.ld)
    raise_invalid(std::string(name) + ".ld = " + str(l.ld) + " contradicts the tensor's row stride of " + str(s.ld) +
                  " (leave ld at 0: it is read from the tensor)");
  if (s.ld != 0) l.ld = s.ld;
  return l;
}

void convert(nb::handle from_w, nb::handle to_w, WeightLayout from, WeightLayout to, nb::handle from_w_up,
             nb::handle to_w_up, uintptr_t stream_handle, bool device_only) {
  const TensorView src = import_tensor(from_w, "from_w", false);
  const TensorView dst = import_tensor(to_w, "to_w", true);
  const std::optional<TensorView> src_up = import_optional(from_w_up, "from_w_up", false);
  const std::optional<TensorView> dst_up = import_optional(to_w_up, "to_w_up", true);

  const DType dtype = dtype_of(src, "weight");
  require_same_dtype(dst, src);
  const WeightSide fs = weight_side(src, from);
  const WeightSide ts = weight_side(dst, to);
  const bool from_sep = from.format == WeightFormat::separate;
  const bool to_sep = to.format == WeightFormat::separate;
  if (!from_sep && fs.rows % 2 != 0)
    raise_invalid("'from_w' holds fused weights (from.format = fused), so needs an even number of rows (2U); " +
                  std::string("got shape ") + src.shape_str());
  const int64_t u = from_sep ? fs.rows : fs.rows / 2;
  const int64_t k = fs.k;
  if (ts.k != k || ts.rows != (to_sep ? u : 2 * u))
    raise_invalid("'to_w' must hold " + str(to_sep ? u : 2 * u) + " rows of K = " + str(k) + " (U = " + str(u) +
                  " from 'from_w' " + src.shape_str() + "), got shape " + dst.shape_str() + " with to.storage = " +
                  to_string(to.storage));
  auto same_as = [&](const std::optional<TensorView>& t, const TensorView& ref, const WeightSide& rs,
                     const WeightLayout& l) {
    if (!t) return;
    require_same_dtype(*t, src);
    const WeightSide s = weight_side(*t, l);
    if (t->ndim != ref.ndim || s.rows != rs.rows || s.k != rs.k)
      raise_invalid("'" + t->name + "' must have the shape of '" + ref.name + "' " + ref.shape_str() + ", got " +
                    t->shape_str());
    if (s.ld != rs.ld)
      raise_invalid("'" + t->name + "' must have the row stride of '" + ref.name + "', got strides " +
                    t->strides_str() + " and " + ref.strides_str());
  };
  same_as(src_up, src, fs, from);
  same_as(dst_up, dst, ts, to);
  from = with_tensor_ld(from, fs, "from");
  to = with_tensor_ld(to, ts, "to");

  std::vector<const TensorView*> all = {&src, &dst};
  if (src_up) all.push_back(&*src_up);
  if (dst_up) all.push_back(&*dst_up);
  bool host = true, device = true;
  for (const TensorView* t : all) {
    host &= t->on_host();
    device &= t->on_device();
  }
  if (device_only && !device) {
    for (const TensorView* t : all)
      if (!t->on_device())
        raise_invalid("convert_weights_device: '" + t->name + "' is " + t->device_name() +
                      " memory; all tensors must be CUDA device memory");
  }
  if (!host && !device) {
    std::string where;
    for (const TensorView* t : all) where += (where.empty() ? "" : ", ") + t->name + " on " + t->device_name();
    raise_invalid("convert_weights: the tensors must all be host memory or all CUDA memory, got " + where);
  }

  Status s;
  if (host && !device_only) {
    nb::gil_scoped_release release;
    s = convert_weights(u, k, dtype, from, src.data, ptr(src_up), to, dst.data,
                        dst_up ? dst_up->data : nullptr);
  } else {
    DeviceGuard guard(src.device_type == kDeviceCUDA ? src.device_id : -1);
    const cudaStream_t stream = as_stream(stream_handle);
    wait_for_producers({&src, &dst, src_up ? &*src_up : nullptr, dst_up ? &*dst_up : nullptr}, stream);
    nb::gil_scoped_release release;
    s = convert_weights_device(u, k, dtype, from, src.data, ptr(src_up), to, dst.data,
                               dst_up ? dst_up->data : nullptr, stream);
  }
  check(s);
}

// ---------------------------------------------------------------- printing
std::string repr(const ActivationParams& a) {
  return "ActivationParams(clamp_alpha=" + nb::cast<std::string>(nb::repr(nb::float_(a.clamp_alpha))) +
         ", clamp_limit=" + nb::cast<std::string>(nb::repr(nb::float_(a.clamp_limit))) + ")";
}

std::string repr(const WeightLayout& w) {
  return std::string("WeightLayout(format=") + to_string(w.format) + ", group=" + str(w.group) +
         ", first=" + to_string(w.first) + ", storage=" + to_string(w.storage) + ", ld=" + str(w.ld) + ")";
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

std::string repr(const Arguments& a) {
  return "Arguments(x=" + hex(a.x) + ", w=" + hex(a.w) + ", w_up=" + hex(a.w_up) + ", bias=" + hex(a.bias) +
         ", bias_up=" + hex(a.bias_up) + ", y=" + hex(a.y) + ", preact=" + hex(a.preact) + ")";
}

template <typename T>
uintptr_t addr(const T* p) {
  return reinterpret_cast<uintptr_t>(p);
}

}  // namespace
}  // namespace gatedmlp::py

NB_MODULE(_gatedmlp, m) {
  using namespace gatedmlp;
  using namespace gatedmlp::py;

  m.doc() = "Fused gated-MLP (GEMM + GLU) kernels: the binding of the gatedmlp C++ API.";
  m.attr("__version__") = GATEDMLP_VERSION;
  m.attr("kAuto") = kAuto;

  // ---- errors
  g_errors.base = new_error_class(m, "Error", PyExc_Exception, nullptr,
                                  "A gatedmlp call failed; .code holds the StatusCode, the message is the library's.");
  g_errors.invalid = new_error_class(m, "InvalidArgumentError", g_errors.base, PyExc_ValueError,
                                     "The call is malformed (StatusCode.invalid_argument).");
  g_errors.not_supported =
      new_error_class(m, "NotSupportedError", g_errors.base, PyExc_NotImplementedError,
                      "Well-formed, but no kernel in this build takes it (StatusCode.not_supported).");
  g_errors.no_device = new_error_class(m, "NoDeviceError", g_errors.base, PyExc_RuntimeError,
                                       "No usable CUDA device (StatusCode.no_device).");
  g_errors.cuda = new_error_class(m, "CudaError", g_errors.base, PyExc_RuntimeError,
                                  "A CUDA runtime call failed (StatusCode.cuda_error).");
  g_errors.library = new_error_class(m, "LibraryError", g_errors.base, PyExc_RuntimeError,
                                     "A dependency failed (StatusCode.library_error).");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      set_python_error(e);
    }
  });

  // ---- enums
  nb::enum_<StatusCode>(m, "StatusCode")
      .value("ok", StatusCode::ok)
      .value("invalid_argument", StatusCode::invalid_argument)
      .value("not_supported", StatusCode::not_supported)
      .value("no_device", StatusCode::no_device)
      .value("cuda_error", StatusCode::cuda_error)
      .value("library_error", StatusCode::library_error);
  nb::enum_<DType>(m, "DType")
      .value("bf16", DType::bf16)
      .value("fp16", DType::fp16)
      .value("fp32", DType::fp32);
  nb::enum_<Activation>(m, "Activation")
      .value("silu", Activation::silu, "SwiGLU: silu(g) * u")
      .value("gelu_tanh", Activation::gelu_tanh, "GeGLU, tanh approximation")
      .value("gelu_erf", Activation::gelu_erf, "GeGLU, exact erf")
      .value("relu", Activation::relu, "ReGLU")
      .value("swiglu_clamped", Activation::swiglu_clamped,
             "gpt-oss: g=min(g,limit); u=clamp(u,-limit,limit); g*sigmoid(alpha*g)*(u+1)");
  nb::enum_<WeightFormat>(m, "WeightFormat")
      .value("fused", WeightFormat::fused, "one [2U, K] tensor interleaved in blocks of `group` rows")
      .value("separate", WeightFormat::separate, "two [U, K] tensors, w (gate) and w_up");
  nb::enum_<Half>(m, "Half").value("gate", Half::gate).value("up", Half::up);
  nb::enum_<WeightStorage>(m, "WeightStorage")
      .value("out_in", WeightStorage::out_in, "[out, K], K contiguous (nn.Linear)")
      .value("in_out", WeightStorage::in_out, "[K, out], out contiguous");
  nb::enum_<KernelPath>(m, "KernelPath")
      .value("none", KernelPath::none)
      .value("sm80_mma", KernelPath::sm80_mma)
      .value("sm90_wgmma", KernelPath::sm90_wgmma)
      .value("decode", KernelPath::decode);

  // ---- Status
  nb::class_<Status>(m, "Status")
      .def(nb::init<>())
      .def(nb::init<StatusCode, std::string>(), "code"_a, "message"_a)
      .def("ok", &Status::ok)
      .def_prop_ro("code", &Status::code)
      .def_prop_ro("message", [](const Status& s) { return s.message(); })
      .def("__bool__", &Status::ok)
      .def("raise_if_error", [](const Status& s) { check(s); }, "Raises the gatedmlp.Error of a failed status.")
      .def("__repr__", [](const Status& s) {
        return std::string("Status(") + to_string(s.code()) +
               (s.message().empty() ? "" : ", " + nb::cast<std::string>(nb::repr(nb::str(s.message().c_str())))) +
               ")";
      });

  // ---- ActivationParams, WeightLayout, Problem, Arguments, Config
  auto ap = nb::class_<ActivationParams>(m, "ActivationParams")
                .def("__init__", [](ActivationParams* self, nb::kwargs kw) {
                  init_from_kwargs(self, kw, kActivationParamsFields, "ActivationParams");
                })
                .def_rw("clamp_alpha", &ActivationParams::clamp_alpha)
                .def_rw("clamp_limit", &ActivationParams::clamp_limit)
                .def("__repr__", [](const ActivationParams& a) { return repr(a); });
  add_copy(ap);

  auto wl = nb::class_<WeightLayout>(m, "WeightLayout")
                .def("__init__", [](WeightLayout* self, nb::kwargs kw) {
                  init_from_kwargs(self, kw, kWeightLayoutFields, "WeightLayout");
                })
                .def_rw("format", &WeightLayout::format)
                .def_rw("group", &WeightLayout::group)
                .def_rw("first", &WeightLayout::first)
                .def_rw("storage", &WeightLayout::storage)
                .def_rw("ld", &WeightLayout::ld)
                .def("__repr__", [](const WeightLayout& w) { return repr(w); })
                .def("__str__", [](const WeightLayout& w) { return to_string(w); });
  add_copy(wl);

  auto pr = nb::class_<Problem>(m, "Problem")
                .def("__init__",
                     [](Problem* self, nb::kwargs kw) { init_from_kwargs(self, kw, kProblemFields, "Problem"); })
                .def_rw("m", &Problem::m)
                .def_rw("k", &Problem::k)
                .def_rw("u", &Problem::u)
                .def_rw("batch", &Problem::batch)
                .def_rw("input_dtype", &Problem::input_dtype)
                .def_rw("output_dtype", &Problem::output_dtype)
                .def_rw("activation", &Problem::activation)
                .def_rw("act_params", &Problem::act_params)
                .def_rw("weights", &Problem::weights)
                .def_rw("alpha", &Problem::alpha)
                .def_rw("has_bias", &Problem::has_bias)
                .def_rw("bias_dtype", &Problem::bias_dtype)
                .def_rw("has_preact", &Problem::has_preact)
                .def_rw("preact_dtype", &Problem::preact_dtype)
                .def_rw("ldx", &Problem::ldx)
                .def_rw("ldy", &Problem::ldy)
                .def_rw("ldpre", &Problem::ldpre)
                .def_rw("batch_stride_x", &Problem::batch_stride_x)
                .def_rw("batch_stride_w", &Problem::batch_stride_w)
                .def_rw("batch_stride_bias", &Problem::batch_stride_bias)
                .def_rw("batch_stride_y", &Problem::batch_stride_y)
                .def_rw("batch_stride_preact", &Problem::batch_stride_preact)
                .def("resolved", &Problem::resolved,
                     "A copy with every 0/kAuto stride and group replaced by its value (after check_support).")
                .def("__repr__", [](const Problem& p) { return to_string(p); });
  add_copy(pr);

  auto ar = nb::class_<Arguments>(m, "Arguments",
                                  "Raw device pointers (ints, e.g. tensor.data_ptr()) for run(); "
                                  "gate_up() takes tensors instead.")
                .def("__init__", [](Arguments* self, nb::kwargs kw) {
                  init_from_kwargs(self, kw, kArgumentsFields, "Arguments");
                });
#define GATEDMLP_PTR_PROP(f)                                                                           \
  ar.def_prop_rw(                                                                                      \
      #f, [](const Arguments& a) { return addr(a.f); },                                                \
      [](Arguments& a, uintptr_t v) { a.f = reinterpret_cast<std::remove_reference_t<decltype(a.f)>>(v); })
  GATEDMLP_PTR_PROP(x);
  GATEDMLP_PTR_PROP(w);
  GATEDMLP_PTR_PROP(w_up);
  GATEDMLP_PTR_PROP(bias);
  GATEDMLP_PTR_PROP(bias_up);
  GATEDMLP_PTR_PROP(y);
  GATEDMLP_PTR_PROP(preact);
#undef GATEDMLP_PTR_PROP
  ar.def("__repr__", [](const Arguments& a) { return repr(a); });
  add_copy(ar);

  auto cf = nb::class_<Config>(m, "Config")
                .def(nb::init<>())
                .def_rw("path", &Config::path)
                .def_rw("tile_m", &Config::tile_m)
                .def_rw("tile_n", &Config::tile_n)
                .def_rw("tile_k", &Config::tile_k)
                .def_rw("stages", &Config::stages)
                .def_rw("threads", &Config::threads)
                .def_rw("vector_loads", &Config::vector_loads)
                .def_rw("pingpong", &Config::pingpong)
                .def_rw("reason", &Config::reason)
                .def("__repr__", [](const Config& c) { return to_string(c); });
  add_copy(cf);

  // ---- the C++ API, one to one
  m.def("check_support", &check_support, "problem"_a,
        "Shape, dtype, stride and layout rules; needs no device. Returns a Status (truthy when ok).");
  m.def("workspace_size", &workspace_size, "problem"_a, "Bytes of device workspace run() needs.");
  m.def(
      "plan",
      [](const Problem& p, int device) {
        Config c;
        check(plan(p, &c, device));
        return c;
      },
      "problem"_a, "device"_a = -1, "The Config run() would use on `device` (-1: current). Raises on failure.");
  m.def("validate", &validate, "problem"_a, "args"_a,
        "check_support, then the pointer checks. Returns a Status (truthy when ok).");
  m.def(
      "run",
      [](const Problem& p, const Arguments& a, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) {
        Status s;
        {
          nb::gil_scoped_release release;
          s = run(p, a, reinterpret_cast<void*>(workspace), workspace_bytes, as_stream(stream));
        }
        check(s);
      },
      "problem"_a, "args"_a, "workspace"_a = 0, "workspace_bytes"_a = 0, "stream"_a = 0,
      "Validates, then launches on `stream` (a cudaStream_t as an int; 0: the default stream). Raises on failure. "
      "Pointers are raw: prefer gate_up(), which reads them and the descriptor from tensors.");

  m.def("fused_row", &fused_row, "j"_a, "half"_a, "u"_a, "group"_a, "first"_a,
        "Physical row of logical row j of `half` in a fused [2U] weight interleaved by `group` (0: u).");
  m.def(
      "fused_row_inverse",
      [](int64_t f, int64_t u, int64_t group, Half first) {
        Half h = Half::gate;
        int64_t j = 0;
        fused_row_inverse(f, u, group, first, &h, &j);
        return std::make_pair(h, j);
      },
      "f"_a, "u"_a, "group"_a, "first"_a, "(half, j) held by physical row f: the inverse of fused_row.");

  // ---- tensor entry points (the descriptor comes from the tensors)
  m.def("gate_up", &gate_up, "x"_a, "w"_a, "out"_a, "w_up"_a = nb::none(), "bias"_a = nb::none(),
        "bias_up"_a = nb::none(), "preact"_a = nb::none(), nb::kw_only(), "activation"_a = Activation::silu,
        "act_params"_a = nb::none(),
        "clamp_alpha"_a = nb::none(), "clamp_limit"_a = nb::none(), "group"_a = 0, "first"_a = Half::gate,
        "storage"_a = WeightStorage::out_in, "alpha"_a = 1.0f, "stream"_a = 0, "workspace"_a = nb::none(),
        "workspace_alloc"_a = nb::none(),
        "Fills a Problem from the tensors and calls run() on `stream`. Low level: gatedmlp.gate_up() "
        "allocates `out` and picks the stream. clamp_alpha / clamp_limit, when given, override act_params'. "
        "Without `workspace`, workspace_alloc(n) (if given) returns n bytes of device scratch the first "
        "time a stream needs some; it is kept for that device and stream (fresh scratch while a CUDA "
        "graph is being captured).");
  m.def("make_problem", &make_problem, "x"_a, "w"_a, "out"_a = nb::none(), "w_up"_a = nb::none(),
        "bias"_a = nb::none(), "bias_up"_a = nb::none(), "preact"_a = nb::none(), nb::kw_only(),
        "activation"_a = Activation::silu, "act_params"_a = nb::none(), "group"_a = 0, "first"_a = Half::gate,
        "storage"_a = WeightStorage::out_in, "alpha"_a = 1.0f,
        "The Problem gate_up() would run for these tensors (output dtype = input dtype when out is None).");
  m.def(
      "convert_weights",
      [](nb::handle from_w, nb::handle to_w, const WeightLayout& from, const WeightLayout& to, nb::handle from_w_up,
         nb::handle to_w_up, uintptr_t stream) { convert(from_w, to_w, from, to, from_w_up, to_w_up, stream, false); },
      "from_w"_a, "to_w"_a, nb::kw_only(), "from_layout"_a, "to_layout"_a, "from_w_up"_a = nb::none(),
      "to_w_up"_a = nb::none(), "stream"_a = 0,
      "Copies gate/up weights (or a 1-D bias) from one layout to another. U, K, dtype and ld come from the "
      "tensors. Host tensors use the host converter, CUDA tensors the device one on `stream`.");
  m.def(
      "convert_weights_device",
      [](nb::handle from_w, nb::handle to_w, const WeightLayout& from, const WeightLayout& to, nb::handle from_w_up,
         nb::handle to_w_up, uintptr_t stream) { convert(from_w, to_w, from, to, from_w_up, to_w_up, stream, true); },
      "from_w"_a, "to_w"_a, nb::kw_only(), "from_layout"_a, "to_layout"_a, "from_w_up"_a = nb::none(),
      "to_w_up"_a = nb::none(), "stream"_a = 0, "convert_weights for CUDA tensors, asynchronously on `stream`.");

  // ---- printing
  m.def("to_string", [](DType v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](Activation v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](WeightFormat v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](Half v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](WeightStorage v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](KernelPath v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](StatusCode v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](const WeightLayout& v) { return to_string(v); }, "value"_a);
  m.def("to_string", [](const Problem& v) { return to_string(v); }, "value"_a);
  m.def("to_string", [](const Config& v) { return to_string(v); }, "value"_a);
  m.def("dtype_size", &dtype_size, "dtype"_a);
}
