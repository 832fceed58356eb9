// Device-side element conversions, shared by the kernels and the references.
// `dtype` is the integer value of gatedmlp::DType (0 bf16, 1 fp16, 2 fp32):
// kernels take it at run time, since it only steers loads and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace gatedmlp::detail {

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

// Round to nearest even.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// Two values rounded to a 16-bit type and packed into one 32-bit word, a in
// the low half (the lower address when stored).
// One paired conversion (cvt.rn.bf16x2.f32 / f16x2), where two scalar ones
// and a byte permute would do the same.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  uint32_t w;
  __builtin_memcpy(&w, &h, 4);
  return w;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  uint32_t w;
  __builtin_memcpy(&w, &h, 4);
  return w;
}

// One 16-byte store of four words to 16-byte aligned global memory. In asm
// because the compiler splits a uint4 assignment built from packed halves
// into four 4-byte stores: each writes part of every sector it touches, and
// the unfused GLU kernel ran at half the memory bandwidth with them (docs/notes/unfused-baseline.md,
// h47).
__device__ __forceinline__ void store_global_16B(void* p, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
}

// Element i of an array whose type is known only at run time.
__device__ __forceinline__ float load_float(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case 0: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    case 1: return to_float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_float(void* p, int dtype, int64_t i, float v) {
  switch (dtype) {
    case 0: static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(v); break;
    case 1: static_cast<__half*>(p)[i] = from_float<__half>(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

}  // namespace gatedmlp::detail
