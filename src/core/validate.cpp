// Pointer checks at the API boundary: presence, element alignment, outputs
// overlapping anything else, and (last, since it needs a device) that each
// pointer is device memory of the current device.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/internal.hpp"
#include "gatedmlp/quant.hpp"

namespace gatedmlp {

using detail::err;

namespace {

struct Tensor {
  const char* name;
  const void* ptr;
  int64_t elems;  // span in elements
  size_t esize;   // bytes per element, and the alignment it needs
  const char* type;
  bool output;
  uintptr_t bytes() const { return uintptr_t(elems) * esize; }
};

Tensor tensor(const char* name, const void* ptr, int64_t elems, DType dtype, bool output) {
  return {name, ptr, elems, dtype_size(dtype), to_string(dtype), output};
}

std::string hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

Status check_presence(const char* name, const void* ptr, bool needed, const char* why_needed,
                      const char* why_unused) {
  if (needed && ptr == nullptr) return err(StatusCode::invalid_argument, "argument '", name, "' is null; ", why_needed);
  if (!needed && ptr != nullptr)
    return err(StatusCode::invalid_argument, "argument '", name, "' is set (", hex(ptr), ") but ", why_unused);
  return Status::Ok();
}

Status check_device_pointer(const Tensor& t, int device) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, t.ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // the query's failure must not leak into the caller's next check
    return err(StatusCode::invalid_argument, "argument '", t.name, "' (", hex(t.ptr),
               ") is not a pointer CUDA knows: ", cudaGetErrorString(e));
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device != device)
        return err(StatusCode::invalid_argument, "argument '", t.name, "' (", hex(t.ptr), ") is memory of device ",
                   attr.device, " but the current device is ", device);
      return Status::Ok();
    case cudaMemoryTypeManaged:
      return Status::Ok();
    case cudaMemoryTypeHost:
      return err(StatusCode::invalid_argument, "argument '", t.name, "' (", hex(t.ptr),
                 ") is pinned host memory; pass device memory");
    default:
      return err(StatusCode::invalid_argument, "argument '", t.name, "' (", hex(t.ptr),
                 ") is host memory; pass device memory");
  }
}

// At most 16 tensors, in place: run() checks them on every call, and a heap
// allocation per check is host time for nothing.
struct TensorList {
  Tensor items[16];
  size_t n = 0;
  void push_back(const Tensor& t) { items[n++] = t; }
  size_t size() const { return n; }
  const Tensor& operator[](size_t i) const { return items[i]; }
  const Tensor* begin() const { return items; }
  const Tensor* end() const { return items + n; }
};

// The tensors of a call and the bytes each spans (resolved problem).
Status tensors(const Problem& r, const Arguments& a, TensorList* out) {
  detail::Extents e;
  if (Status s = detail::extents(r, &e); !s) return s;
  const bool sep = r.weights.format == WeightFormat::separate;
  TensorList& ts = *out;
  ts.n = 0;
  ts.push_back(tensor("x", a.x, e.x, r.input_dtype, false));
  if (r.glu_input) ts.push_back(tensor("x_up", a.x_up, e.x, r.input_dtype, false));
  if (r.quantized) {
    // Tiled affine weights: the biases are in w_scales (pairs; e.scales counts both).
    const bool mx = r.quant.mode == QuantMode::mxfp4, affine = r.quant.mode == QuantMode::affine && !r.quant.tiled;
    const Tensor words{"w", a.w, e.w, 4, "uint32", false};
    const Tensor scales = mx ? Tensor{"w_scales", a.w_scales, e.scales, 1, "e8m0", false}
                             : tensor("w_scales", a.w_scales, e.scales, r.scale_dtype, false);
    ts.push_back(words);
    ts.push_back(scales);
    if (affine) ts.push_back(tensor("w_biases", a.w_biases, e.scales, r.scale_dtype, false));
    if (sep) {
      ts.push_back({"w_up", a.w_up, e.w, 4, "uint32", false});
      Tensor up_scales = scales;
      up_scales.name = "w_up_scales";
      up_scales.ptr = a.w_up_scales;
      ts.push_back(up_scales);
      if (affine) ts.push_back(tensor("w_up_biases", a.w_up_biases, e.scales, r.scale_dtype, false));
    }
  } else {
    ts.push_back(tensor("w", a.w, e.w, r.input_dtype, false));
    if (sep) ts.push_back(tensor("w_up", a.w_up, e.w, r.input_dtype, false));
  }
  if (r.input_dtype == DType::fp8_e4m3)
    ts.push_back(tensor("x_scales", a.x_scales,
                        r.x_scale == XScale::row     ? r.m
                        : r.x_scale == XScale::block ? r.m * ((r.k + 127) / 128)
                                                     : 1,
                        DType::fp32, false));
  if (r.has_bias) ts.push_back(tensor("bias", a.bias, e.bias, r.bias_dtype, false));
  if (r.has_bias && sep) ts.push_back(tensor("bias_up", a.bias_up, e.bias, r.bias_dtype, false));
  ts.push_back(tensor("y", a.y, e.y, r.output_dtype, true));
  if (r.output_dtype == DType::fp8_e4m3) {
    ts.push_back(tensor("y_scales", a.y_scales, detail::y_scale_span(r), DType::fp32, true));
    if (r.has_y_amax) ts.push_back(tensor("y_amax", a.y_amax, 1, DType::fp32, true));
  }
  if (r.has_preact) ts.push_back(tensor("preact", a.preact, e.preact, r.preact_dtype, true));
  if (r.gather.experts > 0) {
    const bool i64 = r.gather.index_type == IndexType::int64;
    const int64_t n = r.gather.grouped ? r.gather.experts : r.m / r.gather.rows_per_index;  // grouped: the offsets
    ts.push_back({"indices", a.indices, n, size_t(i64 ? 8 : 4), i64 ? "int64" : "int32", false});
    if (a.index_error) ts.push_back({"index_error", a.index_error, 2, 8, "int64", true});
    if (r.has_row_scale) ts.push_back(tensor("row_scale", a.row_scale, r.m, r.row_scale_dtype, false));
  }
  return Status::Ok();
}

// The current device, or no_device with the runtime's reason.
Status current_device(int* device) {
  if (cudaError_t ce = cudaGetDevice(device); ce != cudaSuccess) {
    cudaGetLastError();
    return err(StatusCode::no_device, "no usable CUDA device: ", cudaGetErrorString(ce));
  }
  return Status::Ok();
}

}  // namespace

Status validate(const Problem& p, const Arguments& a) {
  if (Status s = check_support(p); !s) return s;
  // Empty work reads and writes nothing: its pointers may be anything (an
  // empty tensor's often is null).
  if (detail::empty(p)) return Status::Ok();
  return detail::validate_pointers(p.resolved(), a);
}

namespace detail {

Status validate_pointers(const Problem& r, const Arguments& a) {
  const bool sep = r.weights.format == WeightFormat::separate;

  if (Status s = check_presence("x", a.x, true, "x [M, K] is required", ""); !s) return s;
  if (Status s = check_presence("x_up", a.x_up, r.glu_input,
                                "glu_input=true needs the up half of the input in x_up (x holds the gate half)",
                                "x_up is used only by op=down with glu_input=true");
      !s)
    return s;
  if (Status s = check_presence("w", a.w, true, "the weights are required", ""); !s) return s;
  if (Status s = check_presence("w_up", a.w_up, sep, "weights.format=separate needs the up weights in w_up",
                                "weights.format=fused takes all weights in w; w_up must be null");
      !s)
    return s;
  if (Status s = check_presence("bias", a.bias, r.has_bias, "has_bias=true needs bias",
                                "has_bias=false; set has_bias=true to use it");
      !s)
    return s;
  if (Status s = check_presence("bias_up", a.bias_up, r.has_bias && sep,
                                "has_bias=true with separate weights needs the up bias in bias_up",
                                "bias_up is used only with has_bias=true and separate weights");
      !s)
    return s;
  // Tiled affine weights keep their biases in w_scales ((scale, bias) pairs).
  const bool q = r.quantized, affine = q && r.quant.mode == QuantMode::affine && !r.quant.tiled;
  // A literal, not a built string: run() checks the pointers on every call.
  const char* no_biases = !q                                    ? "the weights are not quantized (Problem::quantized is false)"
                          : r.quant.mode == QuantMode::mxfp4    ? "mxfp4 weights have no biases"
                          : r.quant.mode == QuantMode::fp8_e4m3 ? "fp8_e4m3 weights have no biases"
                          : r.quant.tiled ? "tiled weights keep their biases in w_scales ((scale, bias) pairs)"
                                                                : "";
  if (Status s = check_presence("w_scales", a.w_scales, q, "quantized weights need their scales in w_scales",
                                "the weights are not quantized (Problem::quantized is false)");
      !s)
    return s;
  if (Status s = check_presence("w_biases", a.w_biases, affine, "affine quantized weights need their biases in w_biases",
                                no_biases);
      !s)
    return s;
  if (Status s = check_presence("w_up_scales", a.w_up_scales, q && sep,
                                "separate quantized weights need the up weights' scales in w_up_scales",
                                "w_up_scales is used only with separate quantized weights");
      !s)
    return s;
  if (Status s = check_presence("w_up_biases", a.w_up_biases, affine && sep,
                                "separate affine quantized weights need the up weights' biases in w_up_biases",
                                "w_up_biases is used only with separate affine quantized weights");
      !s)
    return s;
  if (Status s = check_presence("x_scales", a.x_scales, r.input_dtype == DType::fp8_e4m3,
                                "input_dtype=fp8_e4m3 needs the scales of x in x_scales (fp32)",
                                "x_scales is used only with input_dtype=fp8_e4m3");
      !s)
    return s;
  if (Status s = check_presence("y", a.y, true, "the output y is required", ""); !s) return s;
  const bool fp8_y = r.output_dtype == DType::fp8_e4m3;
  if (Status s = check_presence("y_scales", a.y_scales, fp8_y,
                                "output_dtype=fp8_e4m3 needs y_scales for Y's fp32 scales (ceil(u / 128) per row)",
                                "y_scales is used only with output_dtype=fp8_e4m3");
      !s)
    return s;
  if (Status s = check_presence("y_amax", a.y_amax, fp8_y && r.has_y_amax, "has_y_amax=true needs y_amax (one fp32)",
                                "has_y_amax is false; set has_y_amax=true (with output_dtype=fp8_e4m3) to write it");
      !s)
    return s;
  const bool g = r.gather.experts > 0;
  if (Status s = check_presence("indices", a.indices, g, "a gathered call (gather.experts > 0) needs the expert indices",
                                "gather.experts is 0 (no gather)");
      !s)
    return s;
  if (Status s = check_presence("row_scale", a.row_scale, r.has_row_scale, "has_row_scale=true needs row_scale",
                                "has_row_scale=false; set has_row_scale=true to use it");
      !s)
    return s;
  if (!g && a.index_error)
    return err(StatusCode::invalid_argument, "argument 'index_error' is set (", hex(a.index_error),
               ") but gather.experts is 0 (no gather)");
  if (!g && a.index_trap)
    return err(StatusCode::invalid_argument, "argument 'index_trap' is set but gather.experts is 0 (no gather)");
  if (Status s = check_presence("preact", a.preact, r.has_preact, "has_preact=true needs preact",
                                "has_preact=false; set has_preact=true to write it");
      !s)
    return s;

  TensorList ts;
  if (Status s = tensors(r, a, &ts); !s) return s;

  for (const Tensor& t : ts) {
    if (reinterpret_cast<uintptr_t>(t.ptr) % t.esize != 0)
      return err(StatusCode::invalid_argument, "argument '", t.name, "' (", hex(t.ptr), ") must be aligned to its ",
                 t.type, " element size of ", t.esize, " bytes");
  }

  // An output may not share a byte with any other tensor: the kernel reads
  // inputs while it writes outputs, and two outputs would race.
  for (size_t i = 0; i < ts.size(); ++i)
    for (size_t j = 0; j < ts.size(); ++j) {
      if (i == j || !ts[i].output || (ts[j].output && j < i)) continue;
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(ts[i].ptr);
      const uintptr_t a1 = a0 + ts[i].bytes();
      const uintptr_t b0 = reinterpret_cast<uintptr_t>(ts[j].ptr);
      const uintptr_t b1 = b0 + ts[j].bytes();
      if (a0 < b1 && b0 < a1)
        return err(StatusCode::invalid_argument, "output '", ts[i].name, "' [", hex(ts[i].ptr), ", +", a1 - a0,
                   " bytes) overlaps '", ts[j].name, "' [", hex(ts[j].ptr), ", +", b1 - b0, " bytes)");
    }

  if (a.devices_checked) return Status::Ok();  // the caller knows each tensor's device
  int device = -1;
  if (Status s = current_device(&device); !s) return s;
  for (const Tensor& t : ts)
    if (Status s = check_device_pointer(t, device); !s) return s;
  return Status::Ok();
}

Status validate_workspace(const Problem& r, const Arguments& a, const void* ws, size_t bytes) {
  if (ws == nullptr && bytes == 0) return Status::Ok();
  if (ws == nullptr)
    return err(StatusCode::invalid_argument, "argument 'workspace' is null but workspace_bytes=", bytes,
               "; pass nullptr with 0 to run without one");
  if (bytes == 0)
    return err(StatusCode::invalid_argument, "argument 'workspace' is set (", hex(ws),
               ") but workspace_bytes=0; pass its size, or nullptr with 0");
  if (reinterpret_cast<uintptr_t>(ws) % 16 != 0)
    return err(StatusCode::invalid_argument, "argument 'workspace' (", hex(ws), ") must be 16-byte aligned");
  TensorList ts;
  if (Status s = tensors(r, a, &ts); !s) return s;
  const uintptr_t w0 = reinterpret_cast<uintptr_t>(ws), w1 = w0 + bytes;
  for (const Tensor& t : ts) {
    const uintptr_t b0 = reinterpret_cast<uintptr_t>(t.ptr);
    const uintptr_t b1 = b0 + t.bytes();
    if (w0 < b1 && b0 < w1)
      return err(StatusCode::invalid_argument, "argument 'workspace' [", hex(ws), ", +", bytes, " bytes) overlaps '",
                 t.name, "' [", hex(t.ptr), ", +", b1 - b0, " bytes)");
  }
  if (a.devices_checked) return Status::Ok();
  int device = -1;
  if (Status s = current_device(&device); !s) return s;
  return check_device_pointer({"workspace", ws, static_cast<int64_t>(bytes), 1, "byte", true}, device);
}

}  // namespace detail

}  // namespace gatedmlp
