// gatedmlp._gatedmlp: the Python binding of the C++ API.
//
// A thin layer: it mirrors the C++ names (enums, Problem, Arguments, Config,
// check_support, plan, validate, run, convert_weights) and adds gate_up()
// and down(), which fill a Problem from the tensors they are given and call
// run(). This file registers the names, the errors and the structs' keyword
// constructors and printing; the tensor entry points are gate_up.cpp,
// down.cpp and convert.cpp, with what they share in calls.hpp. Every
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
#include "gatedmlp/quant.hpp"
#include "calls.hpp"
#include "stage_timers.hpp"
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

const std::array<Field<Gather>, 5> kGatherFields = {
    GATEDMLP_FIELD(Gather, experts), GATEDMLP_FIELD(Gather, rows_per_x), GATEDMLP_FIELD(Gather, rows_per_index),
    GATEDMLP_FIELD(Gather, index_type), GATEDMLP_FIELD(Gather, grouped)};

const std::array<Field<Problem>, 34> kProblemFields = {
    GATEDMLP_FIELD(Problem, op),
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
    GATEDMLP_FIELD(Problem, glu_input),
    GATEDMLP_FIELD(Problem, ldx),
    GATEDMLP_FIELD(Problem, ldy),
    GATEDMLP_FIELD(Problem, ldpre),
    GATEDMLP_FIELD(Problem, batch_stride_x),
    GATEDMLP_FIELD(Problem, batch_stride_w),
    GATEDMLP_FIELD(Problem, batch_stride_bias),
    GATEDMLP_FIELD(Problem, batch_stride_y),
    GATEDMLP_FIELD(Problem, batch_stride_preact),
    GATEDMLP_FIELD(Problem, quantized),
    GATEDMLP_FIELD(Problem, quant),
    GATEDMLP_FIELD(Problem, scale_dtype),
    GATEDMLP_FIELD(Problem, x_scale),
    GATEDMLP_FIELD(Problem, fp8_promote),
    GATEDMLP_FIELD(Problem, y_scale_layout),
    GATEDMLP_FIELD(Problem, has_y_amax),
    GATEDMLP_FIELD(Problem, gather),
    GATEDMLP_FIELD(Problem, has_row_scale),
    GATEDMLP_FIELD(Problem, row_scale_dtype),
};

#define GATEDMLP_PTR_FIELD(f)                                                                   \
  Field<Arguments> {                                                                            \
    #f, [](Arguments& o, nb::handle v) {                                                        \
      o.f = reinterpret_cast<std::remove_reference_t<decltype(o.f)>>(nb::cast<uintptr_t>(v)); \
    }                                                                                           \
  }

const std::array<Field<Arguments>, 19> kArgumentsFields = {
    GATEDMLP_PTR_FIELD(x),        GATEDMLP_PTR_FIELD(x_up),     GATEDMLP_PTR_FIELD(w),        GATEDMLP_PTR_FIELD(w_up),
    GATEDMLP_PTR_FIELD(bias),     GATEDMLP_PTR_FIELD(bias_up),  GATEDMLP_PTR_FIELD(y),
    GATEDMLP_PTR_FIELD(preact),   GATEDMLP_PTR_FIELD(w_scales), GATEDMLP_PTR_FIELD(w_biases),
    GATEDMLP_PTR_FIELD(w_up_scales), GATEDMLP_PTR_FIELD(w_up_biases), GATEDMLP_PTR_FIELD(indices),
    GATEDMLP_PTR_FIELD(index_error), GATEDMLP_PTR_FIELD(row_scale), GATEDMLP_PTR_FIELD(x_scales),
    GATEDMLP_PTR_FIELD(y_scales),    GATEDMLP_PTR_FIELD(y_amax),
    Field<Arguments>{"index_trap", [](Arguments& o, nb::handle v) { o.index_trap = nb::cast<bool>(v); }}};

template <typename T>
void add_copy(nb::class_<T>& c) {
  c.def("__copy__", [](const T& v) { return T(v); });
  c.def("__deepcopy__", [](const T& v, nb::handle) { return T(v); }, "memo"_a);
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

std::string repr(const Gather& g) {
  return "Gather(experts=" + str(g.experts) + ", rows_per_x=" + str(g.rows_per_x) +
         ", rows_per_index=" + str(g.rows_per_index) + ", index_type=" + to_string(g.index_type) +
         (g.grouped ? ", grouped=True" : "") + ")";
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

std::string repr(const Arguments& a) {
  // x_up only when set: it belongs to the down projection's GLU input.
  return "Arguments(x=" + hex(a.x) + (a.x_up ? ", x_up=" + hex(a.x_up) : std::string()) + ", w=" + hex(a.w) +
         ", w_up=" + hex(a.w_up) + ", bias=" + hex(a.bias) + ", bias_up=" + hex(a.bias_up) + ", y=" + hex(a.y) +
         ", preact=" + hex(a.preact) +
         (a.w_scales || a.w_biases || a.w_up_scales || a.w_up_biases
              ? ", w_scales=" + hex(a.w_scales) + ", w_biases=" + hex(a.w_biases) + ", w_up_scales=" +
                    hex(a.w_up_scales) + ", w_up_biases=" + hex(a.w_up_biases)
              : std::string()) +
         (a.indices || a.index_error ? ", indices=" + hex(a.indices) + ", index_error=" + hex(a.index_error)
                                     : std::string()) +
         (a.index_trap ? ", index_trap=True" : "") +
         (a.row_scale ? ", row_scale=" + hex(a.row_scale) : std::string()) +
         (a.x_scales ? ", x_scales=" + hex(a.x_scales) : std::string()) +
         (a.y_scales || a.y_amax ? ", y_scales=" + hex(a.y_scales) + ", y_amax=" + hex(a.y_amax) : std::string()) +
         ")";
}

template <typename T>
uintptr_t addr(const T* p) {
  return reinterpret_cast<uintptr_t>(p);
}

}  // namespace
}  // namespace gatedmlp::py

// The gathered (MoE) form of gate_up and down, for their docstrings.
#define GATHER_DOC                                                                                                 \
  "With `indices` (int32 or int64 expert ids, contiguous, any shape) the call is gathered (Problem.gather): x is " \
  "[m / rows_per_x, K], out [m, U], and output row r uses row r / rows_per_x of x and the weights of expert "      \
  "indices[r / rows_per_index]; the weights, bias and quantized scales / biases carry a leading expert axis E "     \
  "([E, rows, K], [E, rows], [E, scale rows, groups]). index_error (2 int64 on the device), if given, is written " \
  "by the call: (-1, 0), or the first bad index's position and value (nothing else is written then). "              \
  "index_trap=True makes a bad index also a device-side assertion (Arguments.index_trap: the stream fails at its " \
  "next synchronisation, as an out-of-range index in a PyTorch kernel does; no read back)."

// FP8 activations on gate_up, for its docstring.
#define FP8_DOC                                                                                                     \
  "FP8 activations (Problem.input_dtype = fp8_e4m3; sm_90): x float8_e4m3fn [M, K], or its bytes as uint8 / "     \
  "int8 with x_fp8=True, and x_scales its float32 scales, 1 value (XScale.tensor), M (XScale.row, [M] or "       \
  "[M, 1]) or [M, ceil(K / 128)] (XScale.block, 1 x 128 groups); the weights FP8 too: "                          \
  "quant=QuantFormat(mode=fp8_e4m3, bits=8, group_size=0, row_block=0 (a scale per tensor) or 1 (per weight "     \
  "row), or group_size=128, row_block=128 (128 x 128 blocks)), w (and w_up) the e4m3 bytes as uint32 / int32 "    \
  "words [rows, K / 4], scales (scales_up) 1 value, [rows, 1] or [ceil(rows / 128), ceil(K / 128)] (bf16, fp16 "  \
  "or fp32). g = alpha * sum over 128-deep k-blocks of sx * sw * (xq @ wq^T) + bias, u likewise; out defaults "   \
  "to bf16 in make_problem. fp8_promote=True (Problem.fp8_promote): calls without block scales also sum each "      \
  "128-deep k-block apart and add it in fp32 (torch._scaled_mm's accuracy, at 1.2-1.5x the time). An FP8 Y "     \
  "(output_dtype = fp8_e4m3): out float8_e4m3fn [M, U] (or its bytes as uint8 / int8) with y_scales, float32 "   \
  "[M, ceil(U / 128)], one scale per row and 128 columns (amax / 448; y ~ out * scale), row-major or, with "      \
  "y_scale_layout=YScaleLayout.mn_major, strides (1, align4(M)); y_amax (one float32), if given, receives "        \
  "max |y|."

NB_MODULE(_gatedmlp, m) {
  using namespace gatedmlp;
  using namespace gatedmlp::py;

  m.doc() = "Fused gated-MLP (GEMM + GLU) kernels: the binding of the gatedmlp C++ API.";
  m.attr("__version__") = GATEDMLP_VERSION;
  m.attr("kAuto") = kAuto;
  m.attr("kMaxGatherExperts") = kMaxGatherExperts;
#ifdef GATEDMLP_PY_TIMERS
  // Timing experiment only (stage_timers.hpp): mean ns per gate_up call of
  // each stage since the last call of this, then reset.
  m.def("_stage_timers", []() {
    namespace T = gatedmlp::py::stage_timers;
    nb::dict d;
    for (int i = 0; i < T::kCount; ++i) {
      d[T::kNames[i]] = T::g_calls ? static_cast<double>(T::g_ns[static_cast<size_t>(i)]) / T::g_calls : 0.0;
      T::g_ns[static_cast<size_t>(i)] = 0;
    }
    d["calls"] = T::g_calls;
    T::g_calls = 0;
    return d;
  });
#endif

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
      .value("fp32", DType::fp32)
      .value("fp8_e4m3", DType::fp8_e4m3,
             "OCP e4m3fn, one byte: X of an FP8 gate_up call (Problem.x_scale), and in such a call Y too, with "
             "its 1 x 128 group scales (Problem.y_scale_layout)");
  nb::enum_<YScaleLayout>(m, "YScaleLayout", "Where an FP8 Y's fp32 scales lie (Arguments.y_scales)")
      .value("row_major", YScaleLayout::row_major,
             "y_scales[r * ceil(u / 128) + j / 128]: [M, ceil(U / 128)] row-major (per-token groups)")
      .value("mn_major", YScaleLayout::mn_major,
             "y_scales[(j / 128) * align4(m) + r]: each group's column of M scales contiguous, M rounded up to a "
             "multiple of 4 (DeepGEMM's MN-major, TMA-aligned layout)");
  nb::enum_<XScale>(m, "XScale", "How the fp32 scales in Arguments.x_scales dequantize FP8 activations")
      .value("tensor", XScale::tensor, "one scale for all of X: x_scales[0]")
      .value("row", XScale::row, "one per row of X (per token): x_scales[r], m of them")
      .value("block", XScale::block,
             "one per row of X and 128 columns of K (1 x 128 groups, DeepSeek-V3's activation scales): "
             "x_scales[r * ceil(k / 128) + c / 128], [M, ceil(K / 128)] row-major");
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
      .value("decode", KernelPath::decode)
      .value("quant_decode", KernelPath::quant_decode)
      .value("cublas", KernelPath::cublas, "the down projection past the decode kernels' rows: a cuBLASLt GEMM");
  nb::enum_<IndexType>(m, "IndexType")
      .value("int32", IndexType::int32)
      .value("int64", IndexType::int64);
  nb::enum_<Operation>(m, "Operation")
      .value("gate_up", Operation::gate_up, "y = act(x @ Wg^T + bg) * (x @ Wu^T + bu)")
      .value("down", Operation::down, "y = alpha * (h @ Wd^T) + bd, h = x or act(x) * x_up (glu_input)");

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

  auto ga = nb::class_<Gather>(m, "Gather",
                               "Mixture-of-experts gather (Problem.gather; experts > 0): output row r uses row "
                               "r / rows_per_x of x and the weights of expert indices[r / rows_per_index].")
                .def("__init__", [](Gather* self, nb::kwargs kw) { init_from_kwargs(self, kw, kGatherFields, "Gather"); })
                .def_rw("experts", &Gather::experts)
                .def_rw("rows_per_x", &Gather::rows_per_x)
                .def_rw("rows_per_index", &Gather::rows_per_index)
                .def_rw("index_type", &Gather::index_type)
                .def_rw("grouped", &Gather::grouped)
                .def("__repr__", [](const Gather& g) { return repr(g); });
  add_copy(ga);

  auto pr = nb::class_<Problem>(m, "Problem")
                .def("__init__",
                     [](Problem* self, nb::kwargs kw) { init_from_kwargs(self, kw, kProblemFields, "Problem"); })
                .def_rw("op", &Problem::op)
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
                .def_rw("glu_input", &Problem::glu_input)
                .def_rw("ldx", &Problem::ldx)
                .def_rw("ldy", &Problem::ldy)
                .def_rw("ldpre", &Problem::ldpre)
                .def_rw("batch_stride_x", &Problem::batch_stride_x)
                .def_rw("batch_stride_w", &Problem::batch_stride_w)
                .def_rw("batch_stride_bias", &Problem::batch_stride_bias)
                .def_rw("batch_stride_y", &Problem::batch_stride_y)
                .def_rw("batch_stride_preact", &Problem::batch_stride_preact)
                .def_rw("quantized", &Problem::quantized)
                .def_rw("quant", &Problem::quant)
                .def_rw("scale_dtype", &Problem::scale_dtype)
                .def_rw("x_scale", &Problem::x_scale)
                .def_rw("fp8_promote", &Problem::fp8_promote)
                .def_rw("y_scale_layout", &Problem::y_scale_layout)
                .def_rw("has_y_amax", &Problem::has_y_amax)
                .def_rw("gather", &Problem::gather)
                .def_rw("has_row_scale", &Problem::has_row_scale)
                .def_rw("row_scale_dtype", &Problem::row_scale_dtype)
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
  GATEDMLP_PTR_PROP(x_up);
  GATEDMLP_PTR_PROP(w);
  GATEDMLP_PTR_PROP(w_up);
  GATEDMLP_PTR_PROP(bias);
  GATEDMLP_PTR_PROP(bias_up);
  GATEDMLP_PTR_PROP(y);
  GATEDMLP_PTR_PROP(preact);
  GATEDMLP_PTR_PROP(w_scales);
  GATEDMLP_PTR_PROP(w_biases);
  GATEDMLP_PTR_PROP(w_up_scales);
  GATEDMLP_PTR_PROP(w_up_biases);
  GATEDMLP_PTR_PROP(indices);
  GATEDMLP_PTR_PROP(index_error);
  GATEDMLP_PTR_PROP(row_scale);
  GATEDMLP_PTR_PROP(x_scales);
  GATEDMLP_PTR_PROP(y_scales);
  GATEDMLP_PTR_PROP(y_amax);
#undef GATEDMLP_PTR_PROP
  ar.def_rw("index_trap", &Arguments::index_trap);
  ar.def("__repr__", [](const Arguments& a) { return repr(a); });
  add_copy(ar);

  auto cf = nb::class_<Config>(m, "Config")
                .def(nb::init<>())
                .def_rw("path", &Config::path)
                .def_rw("tile_m", &Config::tile_m)
                .def_rw("tile_n", &Config::tile_n)
                .def_rw("tile_k", &Config::tile_k)
                .def_rw("stages", &Config::stages)
                .def_rw("ahead", &Config::ahead)
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
  m.def(
      "gate_up",
      [](nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
         nb::handle preact, Activation activation, std::optional<ActivationParams> act_params,
         std::optional<float> clamp_alpha, std::optional<float> clamp_limit, int64_t group, Half first,
         WeightStorage storage, float alpha, uintptr_t stream, nb::handle workspace, nb::handle workspace_alloc,
         nb::handle scales, nb::handle biases, nb::handle scales_up, nb::handle biases_up,
         std::optional<QuantFormat> quant, bool hold_workspace, nb::handle indices, int64_t rows_per_x,
         int64_t rows_per_index, nb::handle index_error, bool grouped, nb::handle x_scales, bool x_fp8, bool fp8_promote,
         nb::handle y_scales, nb::handle y_amax, YScaleLayout y_scale_layout, bool index_trap) {
        gate_up(x, w, out, w_up, bias, bias_up, preact, activation, act_params, clamp_alpha, clamp_limit, group,
                first, storage, alpha, stream, workspace, workspace_alloc,
                QuantArrays{scales, biases, scales_up, biases_up, quant}, hold_workspace,
                GatherArgs{indices, index_error, rows_per_x, rows_per_index, grouped, index_trap},
                Fp8Args{x_scales, x_fp8, fp8_promote, y_scales, y_amax, y_scale_layout});
      },
      "x"_a, "w"_a, "out"_a, "w_up"_a = nb::none(), "bias"_a = nb::none(), "bias_up"_a = nb::none(),
      "preact"_a = nb::none(), nb::kw_only(), "activation"_a = Activation::silu, "act_params"_a = nb::none(),
      "clamp_alpha"_a = nb::none(), "clamp_limit"_a = nb::none(), "group"_a = 0, "first"_a = Half::gate,
      "storage"_a = WeightStorage::out_in, "alpha"_a = 1.0f, "stream"_a = 0, "workspace"_a = nb::none(),
      "workspace_alloc"_a = nb::none(), "scales"_a = nb::none(), "biases"_a = nb::none(),
      "scales_up"_a = nb::none(), "biases_up"_a = nb::none(), "quant"_a = nb::none(), "hold_workspace"_a = true,
      "indices"_a = nb::none(), "rows_per_x"_a = 1, "rows_per_index"_a = 1, "index_error"_a = nb::none(),
      "grouped"_a = false, "x_scales"_a = nb::none(), "x_fp8"_a = false, "fp8_promote"_a = false,
      "y_scales"_a = nb::none(), "y_amax"_a = nb::none(), "y_scale_layout"_a = YScaleLayout::row_major,
      "index_trap"_a = false,
      "Fills a Problem from the tensors and calls run() on `stream`. Low level: gatedmlp.gate_up() "
      "allocates `out` and picks the stream. clamp_alpha / clamp_limit, when given, override act_params'. "
      "Without `workspace`, workspace_alloc(n) (if given) returns n bytes of device scratch the first "
      "time a stream needs some; it is kept for that device and stream (fresh scratch while a CUDA "
      "graph is being captured, or with hold_workspace=False: torch ops, whose allocations torch.compile's "
      "CUDA-graph trees must see freed). With `quant` (a QuantFormat), w and w_up are packed uint32 words "
      "[rows, K * bits / 32] and scales / biases (scales_up / biases_up) their [rows, K / group_size] "
      "scales and biases. " GATHER_DOC
      " With grouped=True (gate_up only, 16-bit weights, sm_90) x [m, K] holds rows sorted by expert and `indices` "
      "the E cumulative row ends (torch._grouped_mm's offs; the last must be m); index_error then names the first "
      "bad offset. " FP8_DOC);
  m.def(
      "make_problem",
      [](nb::handle x, nb::handle w, nb::handle out, nb::handle w_up, nb::handle bias, nb::handle bias_up,
         nb::handle preact, Activation activation, std::optional<ActivationParams> act_params, int64_t group,
         Half first, WeightStorage storage, float alpha, nb::handle scales, nb::handle biases, nb::handle scales_up,
         nb::handle biases_up, std::optional<QuantFormat> quant, nb::handle indices, int64_t rows_per_x,
         int64_t rows_per_index, bool grouped, nb::handle x_scales, bool x_fp8, bool fp8_promote,
         nb::handle y_scales, nb::handle y_amax, YScaleLayout y_scale_layout) {
        return make_problem(x, w, out, w_up, bias, bias_up, preact, activation, act_params, group, first, storage,
                            alpha, QuantArrays{scales, biases, scales_up, biases_up, quant},
                            GatherArgs{indices, nb::none(), rows_per_x, rows_per_index, grouped},
                            Fp8Args{x_scales, x_fp8, fp8_promote, y_scales, y_amax, y_scale_layout});
      },
      "x"_a, "w"_a, "out"_a = nb::none(), "w_up"_a = nb::none(), "bias"_a = nb::none(), "bias_up"_a = nb::none(),
      "preact"_a = nb::none(), nb::kw_only(), "activation"_a = Activation::silu, "act_params"_a = nb::none(),
      "group"_a = 0, "first"_a = Half::gate, "storage"_a = WeightStorage::out_in, "alpha"_a = 1.0f,
      "scales"_a = nb::none(), "biases"_a = nb::none(), "scales_up"_a = nb::none(), "biases_up"_a = nb::none(),
      "quant"_a = nb::none(), "indices"_a = nb::none(), "rows_per_x"_a = 1, "rows_per_index"_a = 1,
      "grouped"_a = false, "x_scales"_a = nb::none(), "x_fp8"_a = false, "fp8_promote"_a = false,
      "y_scales"_a = nb::none(), "y_amax"_a = nb::none(), "y_scale_layout"_a = YScaleLayout::row_major,
      "The Problem gate_up() would run for these tensors (output dtype = input dtype when out is None; bf16 for "
      "FP8 activations).");
  m.def(
      "down",
      [](nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias, Activation activation,
         std::optional<ActivationParams> act_params, std::optional<float> clamp_alpha,
         std::optional<float> clamp_limit, WeightStorage storage, float alpha, uintptr_t stream,
         nb::handle workspace, nb::handle workspace_alloc, nb::handle scales, nb::handle biases,
         std::optional<QuantFormat> quant, bool hold_workspace, nb::handle indices, int64_t rows_per_x,
         int64_t rows_per_index, nb::handle index_error, nb::handle row_scale, bool index_trap) {
        down(x, w, out, x_up, bias, activation, act_params, clamp_alpha, clamp_limit, storage, alpha, stream,
             workspace, workspace_alloc, QuantArrays{scales, biases, nb::none(), nb::none(), quant}, hold_workspace,
             GatherArgs{indices, index_error, rows_per_x, rows_per_index, false, index_trap}, row_scale);
      },
      "x"_a, "w"_a, "out"_a, "x_up"_a = nb::none(), "bias"_a = nb::none(), nb::kw_only(),
      "activation"_a = Activation::silu, "act_params"_a = nb::none(), "clamp_alpha"_a = nb::none(),
      "clamp_limit"_a = nb::none(), "storage"_a = WeightStorage::out_in, "alpha"_a = 1.0f, "stream"_a = 0,
      "workspace"_a = nb::none(), "workspace_alloc"_a = nb::none(), "scales"_a = nb::none(),
      "biases"_a = nb::none(), "quant"_a = nb::none(), "hold_workspace"_a = true, "indices"_a = nb::none(),
      "rows_per_x"_a = 1, "rows_per_index"_a = 1, "index_error"_a = nb::none(), "row_scale"_a = nb::none(),
      "index_trap"_a = false,
      "The down projection (Problem.op = down): y = alpha * (h @ w^T) + bias into `out` on `stream`, with h = x, "
      "or act(x) * x_up when x_up is given (glu_input; activation and act_params / clamp_alpha / clamp_limit "
      "say which GLU). w is [U, K] (storage=out_in) or [K, U] (in_out); with `quant` (a QuantFormat), "
      "[U, K * bits / 32] packed words with scales / biases [U, K / group_size]. Low level: gatedmlp.down() "
      "allocates `out` and picks the stream; workspace and workspace_alloc as for gate_up. " GATHER_DOC
      " row_scale (gathered only: m float32, bfloat16 or float16 values, contiguous, any shape) multiplies "
      "output row r by row_scale[r] after alpha and the bias (Problem.has_row_scale: the MoE routing weight).");
  m.def(
      "make_down_problem",
      [](nb::handle x, nb::handle w, nb::handle out, nb::handle x_up, nb::handle bias, Activation activation,
         std::optional<ActivationParams> act_params, WeightStorage storage, float alpha, nb::handle scales,
         nb::handle biases, std::optional<QuantFormat> quant, nb::handle indices, int64_t rows_per_x,
         int64_t rows_per_index, nb::handle row_scale) {
        return make_down_problem(x, w, out, x_up, bias, activation, act_params, storage, alpha,
                                 QuantArrays{scales, biases, nb::none(), nb::none(), quant},
                                 GatherArgs{indices, nb::none(), rows_per_x, rows_per_index}, row_scale);
      },
      "x"_a, "w"_a, "out"_a = nb::none(), "x_up"_a = nb::none(), "bias"_a = nb::none(), nb::kw_only(),
      "activation"_a = Activation::silu, "act_params"_a = nb::none(), "storage"_a = WeightStorage::out_in,
      "alpha"_a = 1.0f, "scales"_a = nb::none(), "biases"_a = nb::none(), "quant"_a = nb::none(),
      "indices"_a = nb::none(), "rows_per_x"_a = 1, "rows_per_index"_a = 1, "row_scale"_a = nb::none(),
      "The Problem down() would run for these tensors (output dtype = input dtype when out is None).");
  m.def("read_index_error", &read_index_error, "index_error"_a, "stream"_a = 0,
        "(position, value) of a gathered call's index_error, read on `stream` after the work queued there (a "
        "synchronisation): (-1, 0) when every index was in [0, E). Refused while the stream is being captured "
        "into a CUDA graph.");
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

  // ---- quantized weights (gatedmlp/quant.hpp)
  nb::enum_<QuantMode>(m, "QuantMode")
      .value("affine", QuantMode::affine, "MLX: w = q * scale + bias per group along K")
      .value("mxfp4", QuantMode::mxfp4, "e2m1 values, an e8m0 scale per 32 along K (gpt-oss, MLX's mxfp4)")
      .value("fp8_e4m3", QuantMode::fp8_e4m3,
             "e4m3fn values, a float scale per block of row_block rows x group_size of K (FP8 checkpoints)");
  nb::class_<QuantFormat>(m, "QuantFormat")
      .def(
          "__init__",
          [](QuantFormat* self, QuantMode mode, int bits, int group_size, int row_block, bool repacked, bool tiled) {
            new (self) QuantFormat{mode, bits, group_size, row_block, repacked, tiled};
          },
          "mode"_a = QuantMode::affine, "bits"_a = 4, "group_size"_a = 64, "row_block"_a = 1, "repacked"_a = false,
          "tiled"_a = false)
      .def_rw("mode", &QuantFormat::mode)
      .def_rw("bits", &QuantFormat::bits)
      .def_rw("group_size", &QuantFormat::group_size)
      .def_rw("row_block", &QuantFormat::row_block)
      .def_rw("repacked", &QuantFormat::repacked)
      .def_rw("tiled", &QuantFormat::tiled)
      .def("__repr__", [](const QuantFormat& f) { return to_string(f); });
  m.def("check_quant_format", &check_quant_format, "format"_a, "k"_a,
        "The format's rules (bits, group size) and K against them.");
  m.def("quant_words_per_row", &quant_words_per_row, "format"_a, "k"_a);
  m.def("quant_groups_per_row", &quant_groups_per_row, "format"_a, "k"_a);
  m.def("quant_scale_rows", &quant_scale_rows, "format"_a, "rows"_a);
  m.def("quantize_into", &quantize, "w"_a, "wq"_a, "scales"_a, "biases"_a.none(), "format"_a,
        "quantize_host on host arrays: w [..., K] into wq [..., K * bits / 32] (uint32), scales and biases "
        "[..., K / group_size] (w's dtype; mxfp4: uint8 scales, biases None). gatedmlp.quantize allocates them.");
  m.def("repack_into", &repack, "src"_a, "dst"_a, "from_format"_a, "to_format"_a, "k"_a, "stream"_a = 0,
        "repack_quantized (host arrays) or repack_quantized_device (CUDA arrays, on `stream`): the words of src "
        "[..., words of from_format] into dst [..., words of to_format]. gatedmlp.repack allocates dst.");
  m.def("dequantize_into", &dequantize, "wq"_a, "scales"_a, "biases"_a.none(), "w"_a, "format"_a,
        "dequantize_host on host arrays into w [..., K] (its dtype). gatedmlp.dequantize allocates it.");

  // ---- printing
  m.def("to_string", [](DType v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](Operation v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](Activation v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](WeightFormat v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](Half v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](WeightStorage v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](KernelPath v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](StatusCode v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](IndexType v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](XScale v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](YScaleLayout v) { return std::string(to_string(v)); }, "value"_a);
  m.def("to_string", [](const WeightLayout& v) { return to_string(v); }, "value"_a);
  m.def("to_string", [](const Problem& v) { return to_string(v); }, "value"_a);
  m.def("to_string", [](const Config& v) { return to_string(v); }, "value"_a);
  m.def("dtype_size", &dtype_size, "dtype"_a);
}
