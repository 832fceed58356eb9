// Importing framework tensors as TensorView: DLPack first (nanobind's
// nb::ndarray, which also takes raw DLPack capsules), then
// __cuda_array_interface__ (version 2 and 3) for producers without DLPack.
#include "tensor.hpp"

#include <sstream>

namespace gatedmlp::py {

namespace {

std::string type_name_of(nb::handle obj) {
  nb::handle tp = obj.type();
  std::string mod = nb::hasattr(tp, "__module__") ? nb::cast<std::string>(nb::str(tp.attr("__module__"))) : "";
  std::string name = nb::cast<std::string>(nb::str(tp.attr("__qualname__")));
  return mod.empty() || mod == "builtins" ? name : mod + "." + name;
}

template <typename Array>
void fill_from(TensorView& t, const Array& a) {
  if (a.ndim() > static_cast<size_t>(TensorView::kMaxDims))
    throw nb::type_error(("'" + t.name + "' has " + std::to_string(a.ndim()) +
                          " dimensions; gatedmlp tensors have at most 3")
                             .c_str());
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[static_cast<size_t>(i)] = static_cast<int64_t>(a.shape(static_cast<size_t>(i)));
    t.strides[static_cast<size_t>(i)] = a.stride(static_cast<size_t>(i));
  }
  const nb::dlpack::dtype d = a.dtype();
  t.code = d.code;
  t.bits = d.bits;
  t.lanes = d.lanes;
  t.device_type = a.device_type();
  t.device_id = a.device_id();
}

// numpy-style type string ("<f2", "|u1") to a DLPack code and bit width.
bool parse_typestr(const std::string& s, uint8_t* code, uint8_t* bits) {
  if (s.size() < 3) return false;
  if (s[0] == '>') return false;  // big-endian data: nothing here reads it
  int bytes = 0;
  try {
    bytes = std::stoi(s.substr(2));
  } catch (...) {
    return false;
  }
  if (bytes <= 0 || bytes > 32) return false;
  switch (s[1]) {
    case 'f': *code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float); break;
    case 'i': *code = static_cast<uint8_t>(nb::dlpack::dtype_code::Int); break;
    case 'u': *code = static_cast<uint8_t>(nb::dlpack::dtype_code::UInt); break;
    case 'b': *code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bool); break;
    case 'c': *code = static_cast<uint8_t>(nb::dlpack::dtype_code::Complex); break;
    default: return false;
  }
  *bits = static_cast<uint8_t>(bytes * 8);
  return true;
}

TensorView from_cuda_array_interface(nb::handle obj, const char* name, bool writable) {
  TensorView t;
  t.name = name;
  nb::object cai_obj = obj.attr("__cuda_array_interface__");
  if (!nb::isinstance<nb::dict>(cai_obj))
    throw nb::type_error((std::string("'") + name + "': __cuda_array_interface__ is not a dict").c_str());
  nb::dict cai = nb::borrow<nb::dict>(cai_obj);
  auto bad = [&](const std::string& what) {
    return nb::type_error(("'" + std::string(name) + "': __cuda_array_interface__ " + what).c_str());
  };
  if (!cai.contains("shape") || !cai.contains("typestr") || !cai.contains("data"))
    throw bad("lacks one of 'shape', 'typestr', 'data'");
  if (cai.contains("mask") && !cai["mask"].is_none()) throw bad("has a mask, which gatedmlp does not take");

  nb::tuple shape = nb::cast<nb::tuple>(cai["shape"]);
  if (nb::len(shape) > static_cast<size_t>(TensorView::kMaxDims)) throw bad("has too many dimensions");
  t.ndim = static_cast<int>(nb::len(shape));
  for (int i = 0; i < t.ndim; ++i) t.shape[static_cast<size_t>(i)] = nb::cast<int64_t>(shape[static_cast<size_t>(i)]);

  const std::string typestr = nb::cast<std::string>(cai["typestr"]);
  if (!parse_typestr(typestr, &t.code, &t.bits)) throw bad("has typestr '" + typestr + "', which gatedmlp cannot read");
  const int64_t itemsize = t.bits / 8;

  nb::tuple data = nb::cast<nb::tuple>(cai["data"]);
  t.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
  const bool readonly = nb::len(data) > 1 && nb::cast<bool>(data[1]);
  if (writable && readonly)
    throw nb::type_error(("'" + std::string(name) + "' is read-only; an output must be writable").c_str());

  if (cai.contains("strides") && !cai["strides"].is_none()) {
    nb::tuple st = nb::cast<nb::tuple>(cai["strides"]);
    if (static_cast<int>(nb::len(st)) != t.ndim) throw bad("has strides of the wrong length");
    for (int i = 0; i < t.ndim; ++i) {
      const int64_t b = nb::cast<int64_t>(st[static_cast<size_t>(i)]);
      if (b % itemsize != 0)
        throw bad("has a stride of " + std::to_string(b) + " bytes, not a multiple of the element size");
      t.strides[static_cast<size_t>(i)] = b / itemsize;
    }
  } else {
    int64_t acc = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.strides[static_cast<size_t>(i)] = acc;
      acc *= t.shape[static_cast<size_t>(i)];
    }
  }
  if (cai.contains("stream") && !cai["stream"].is_none()) t.producer_stream = nb::cast<intptr_t>(cai["stream"]);
  t.device_type = kDeviceCUDA;
  t.device_id = -1;
  t.keep_obj = nb::borrow(obj);
  return t;
}

}  // namespace

std::optional<DType> TensorView::dtype() const {
  if (lanes != 1) return std::nullopt;
  if (code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && bits == 16) return DType::bf16;
  if (code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && bits == 16) return DType::fp16;
  if (code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && bits == 32) return DType::fp32;
  return std::nullopt;
}

std::string TensorView::dtype_name() const {
  std::string base;
  using C = nb::dlpack::dtype_code;
  switch (static_cast<C>(code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: {
      // DLPack 1.1's 8-bit floats, by number (nanobind >= 2.0 need not name
      // them): PyTorch's float8_* tensors export these codes.
      static const char* const kFloat8[] = {"float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                                            "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"};
      if (code >= kDLFloat8First && code < kDLFloat8First + 8 && bits == 8 && lanes == 1)
        return kFloat8[code - kDLFloat8First];
      base = "dlpack_code" + std::to_string(code) + "_bits";
      break;
    }
  }
  std::string s = base + std::to_string(bits);
  if (lanes != 1) s += "x" + std::to_string(lanes);
  return s;
}

static std::string join(const int64_t* v, int n) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  if (n == 1) os << ",";
  os << ")";
  return os.str();
}

std::string TensorView::shape_str() const { return join(shape.data(), ndim); }
std::string TensorView::strides_str() const { return join(strides.data(), ndim); }

const char* TensorView::device_name() const {
  switch (device_type) {
    case kDeviceCPU: return "cpu";
    case kDeviceCUDA: return "cuda";
    case kDeviceCUDAHost: return "cuda_host";
    case kDeviceCUDAManaged: return "cuda_managed";
    default: return "other";
  }
}

// An unversioned DLPack capsule ("dltensor", what torch.utils.dlpack.to_dlpack
// and the package's wrappers pass), read in place: its fields copied, the
// capsule held for the view's lifetime and left unconsumed, so that its own
// destructor frees the tensor when the last reference goes. nanobind's import
// does the same work and more (a handle allocated per tensor, the capsule
// renamed and its destructor moved): ~0.33 us a tensor on an H200 host, h88.
// False for anything else, which nanobind imports.
static bool from_capsule(nb::handle obj, TensorView& t) {
  PyObject* o = obj.ptr();
  if (!PyCapsule_CheckExact(o) || !PyCapsule_IsValid(o, "dltensor")) return false;
  // DLPack's DLManagedTensor begins with its DLTensor, laid out as nanobind's dltensor.
  const auto* d = static_cast<const nb::dlpack::dltensor*>(PyCapsule_GetPointer(o, "dltensor"));
  if (d->ndim < 0 || d->ndim > TensorView::kMaxDims) return false;  // nanobind refuses it, naming why
  t.data = static_cast<char*>(d->data) + d->byte_offset;
  t.ndim = d->ndim;
  int64_t compact = 1;  // DLPack: no strides means row-major
  for (int i = t.ndim - 1; i >= 0; --i) {
    const size_t k = static_cast<size_t>(i);
    t.shape[k] = d->shape[i];
    t.strides[k] = d->strides ? d->strides[i] : compact;
    compact *= d->shape[i];
  }
  t.code = d->dtype.code;
  t.bits = d->dtype.bits;
  t.lanes = d->dtype.lanes;
  t.device_type = d->device.device_type;
  t.device_id = d->device.device_id;
  t.keep_obj = nb::borrow(obj);
  return true;
}

TensorView import_tensor(nb::handle obj, const char* name, bool writable) {
  if (obj.is_none()) throw nb::type_error((std::string("'") + name + "' is required, got None").c_str());
  TensorView t;
  t.name = name;
  if (from_capsule(obj, t)) return t;  // unversioned DLPack has no read-only flag
  if (writable) {
    nb::ndarray<> a;
    if (nb::try_cast(obj, a, false)) {
      fill_from(t, a);
      t.keep_rw = std::move(a);
      return t;
    }
    nb::ndarray<nb::ro> r;
    if (nb::try_cast(obj, r, false))
      throw nb::type_error(("'" + std::string(name) + "' is read-only; an output must be writable").c_str());
  } else {
    nb::ndarray<nb::ro> a;
    if (nb::try_cast(obj, a, false)) {
      fill_from(t, a);
      t.keep_ro = std::move(a);
      return t;
    }
  }
  if (nb::hasattr(obj, "__cuda_array_interface__")) return from_cuda_array_interface(obj, name, writable);

  // Say why: a framework's own DLPack refusal (a tensor that requires grad,
  // say) is the most useful message there is.
  std::string why = "expected a tensor with __dlpack__ or __cuda_array_interface__ (PyTorch, JAX, CuPy, NumPy...)";
  if (nb::hasattr(obj, "__dlpack__")) {
    try {
      obj.attr("__dlpack__")();
      why = "its DLPack export could not be imported";
    } catch (nb::python_error& e) {
      why = std::string("its DLPack export failed: ") + e.what();
    }
  }
  throw nb::type_error(("'" + std::string(name) + "' (" + type_name_of(obj) + "): " + why).c_str());
}

std::optional<TensorView> import_optional(nb::handle obj, const char* name, bool writable) {
  if (!obj.is_valid() || obj.is_none()) return std::nullopt;
  return import_tensor(obj, name, writable);
}

bool TensorView::is_fp8_e4m3() const { return code == kDLFloat8E4M3FN && bits == 8 && lanes == 1; }

bool TensorView::is_byte() const {
  return (code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int) ||
          code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)) &&
         bits == 8 && lanes == 1;
}

DType dtype_of(const TensorView& t, const char* what) {
  if (auto d = t.dtype()) return *d;
  raise_invalid("'" + t.name + "' has dtype " + t.dtype_name() + ", which is no gatedmlp " + what +
                " type (bf16, fp16 or fp32)");
}

}  // namespace gatedmlp::py
