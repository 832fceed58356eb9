// A borrowed view of a framework tensor (PyTorch, JAX, CuPy, NumPy, ...):
// pointer, shape, strides, dtype and device, imported without a copy through
// DLPack, or through __cuda_array_interface__ for producers without DLPack.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::py {

namespace nb = nanobind;

// DLPack device types the binding cares about.
inline constexpr int kDeviceCPU = 1;
inline constexpr int kDeviceCUDA = 2;
inline constexpr int kDeviceCUDAHost = 3;
inline constexpr int kDeviceCUDAManaged = 13;

// DLPack (1.1) dtype codes of the 8-bit floats: kDLFloat8_e3m4 = 7 ...
// kDLFloat8_e8m0fnu = 14, among them kDLFloat8_e4m3fn = 10, PyTorch's
// float8_e4m3fn (the FP8 activations' format).
inline constexpr uint8_t kDLFloat8First = 7;
inline constexpr uint8_t kDLFloat8E4M3FN = 10;

// Thrown by the binding for a Status that is not ok; the module turns it into
// the Python exception class of its code.
struct StatusError {
  StatusCode code;
  std::string message;
};

[[noreturn]] inline void raise(StatusCode code, std::string message) {
  throw StatusError{code, std::move(message)};
}
[[noreturn]] inline void raise_invalid(std::string message) {
  raise(StatusCode::invalid_argument, "gatedmlp: " + std::move(message));
}
inline void check(const Status& s) {
  if (!s.ok()) raise(s.code(), s.message());
}

struct TensorView {
  static constexpr int kMaxDims = 8;

  std::string name;  // the argument name, for messages
  void* data = nullptr;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements
  uint8_t code = 0, bits = 0;                // DLPack dtype
  uint16_t lanes = 1;
  int device_type = 0;
  int device_id = -1;  // -1: unknown (the current device)
  intptr_t producer_stream = 0;  // __cuda_array_interface__ "stream", 0 if none

  // Keeps the imported memory alive for as long as the view.
  std::optional<nb::ndarray<nb::ro>> keep_ro;
  std::optional<nb::ndarray<>> keep_rw;
  nb::object keep_obj;

  // Axis i, negative counting from the end.
  int64_t size(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t stride(int i) const { return strides[static_cast<size_t>(i < 0 ? ndim + i : i)]; }

  std::optional<DType> dtype() const;
  std::string dtype_name() const;  // "bfloat16", "float16", "float64", "float8_e4m3fn", ...
  bool is_fp8_e4m3() const;        // float8_e4m3fn (DLPack kDLFloat8_e4m3fn)
  bool is_byte() const;            // uint8 or int8 (e.g. FP8 bytes viewed as integers)
  std::string shape_str() const;   // "(4, 8)"
  std::string strides_str() const;
  bool on_host() const { return device_type == kDeviceCPU || device_type == kDeviceCUDAHost; }
  bool on_device() const { return device_type == kDeviceCUDA || device_type == kDeviceCUDAManaged; }
  const char* device_name() const;
};

// Imports `obj` without copying. Raises TypeError naming `name` when `obj` is
// not a tensor, or `writable` is asked of a read-only one.
TensorView import_tensor(nb::handle obj, const char* name, bool writable);
// As import_tensor, or nothing for None.
std::optional<TensorView> import_optional(nb::handle obj, const char* name, bool writable);

// The gatedmlp DType of a tensor, or an invalid_argument error naming it.
DType dtype_of(const TensorView& t, const char* what = "tensor");

}  // namespace gatedmlp::py
