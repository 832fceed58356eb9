// Dequantization in registers: one packed uint32 word of a weight row into
// pairs of 16-bit values (the tensor-core A operand's registers), and the X
// pairs that must meet them.
//
// A dot product does not care about the order of k, so a word's elements may
// come out in whatever pairs are cheapest, as long as X's pairs follow: the
// mma multiplies register i of A with register i of B. Two recipes:
//
//  Packed (the scales are of X's dtype, 4-bit formats): the 16-bit pair
//  arithmetic. An AND-OR puts elements i and i+4 of a 4-bit word into the
//  mantissas of a pair of 16-bit floats whose exponent makes the mantissa's
//  low bits count ones (MAGIC + q, exact: 128 + q in bf16, 1024 + q in fp16);
//  one pair FMA takes MAGIC off (exact), another computes q * s + b rounded
//  once to the 16-bit type. Pairs come out as (e0, e4), (e1, e5), (e2, e6),
//  (e3, e7); X is permuted to match (four byte permutes per 8 elements, per
//  token). MXFP4 in bf16 places the e2m1 code's exponent and mantissa bits
//  where a bf16 with exponent field e would keep them, as a subnormal for
//  e = 0: times 2^126 that is exactly the e2m1 value, and the group's power
//  of two folds into the same multiply while 2^(s - 1) fits in bf16.
//
//  fp32 (int8, scales of another dtype than X, MXFP4 with fp16 X): each
//  element exact in fp32 (magic-number conversion), q * s + b by one fp32
//  FMA, rounded to X's type in pairs of consecutive elements, so X needs no
//  permute.
//
// Either way every weight is q * s + b (or e2m1 * 2^(s - 127)) rounded once
// to X's 16-bit type: what dequantizing to that type and running the 16-bit
// kernel computes (the tests' yardstick).
//
//  FP8 (e4m3fn, float scales per block): the e4m3 bits go where a 16-bit
//  float with the same exponent field keeps them (a subnormal for exponent
//  0), and one pair multiply by 2^120 (bf16) or 2^8 (fp16) makes them the
//  exact e4m3 values; the scale is not applied to the weights but to the
//  fp32 sums of the chunk (kAccScale), so FP8 weights are never rounded.
//  Pairs come out as (e0, e2), (e1, e3). (0x7F, e4m3fn's NaN, reads as 480.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_dtype.cuh"
#include "quant_decode/params.hpp"

namespace gatedmlp::quant_decode {

namespace dq {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// (a & b) | c in one LOP3.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// a * b + c on pairs of 16-bit values, rounded once.
template <typename T>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c);
template <>
__device__ __forceinline__ uint32_t fma2<__nv_bfloat16>(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
template <>
__device__ __forceinline__ uint32_t fma2<__half>(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// Pairs of constants.
template <typename T>
struct Consts;
template <>
struct Consts<__nv_bfloat16> {
  static constexpr uint32_t kMagic = 0x43004300u;     // 128, 128
  static constexpr uint32_t kNegMagic = 0xC300C300u;  // -128, -128
  static constexpr uint32_t kOne = 0x3F803F80u;       // 1, 1
};
template <>
struct Consts<__half> {
  static constexpr uint32_t kMagic = 0x64006400u;     // 1024, 1024
  static constexpr uint32_t kNegMagic = 0xE400E400u;  // -1024, -1024
  static constexpr uint32_t kOne = 0x3C003C00u;       // 1, 1
};

// fp32 multiply without flush-to-zero (MXFP4's 0.5 passes through a
// subnormal), whatever the build's fast-math flags.
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// X's registers for one word: (x0 x1) (x2 x3) (x4 x5) (x6 x7) to the
// packed recipe's (x0 x4) (x1 x5) (x2 x6) (x3 x7).
__device__ __forceinline__ void permute_x(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  out[0] = prmt(in[0], in[2], 0x5410);
  out[1] = prmt(in[0], in[2], 0x7632);
  out[2] = prmt(in[1], in[3], 0x5410);
  out[3] = prmt(in[1], in[3], 0x7632);
}

}  // namespace dq

// One row's scale state for the elements a lane holds (one group).
struct Scale {
  uint32_t s = 0, b = 0;  // packed: the pair (s, s), (b, b); fp32: float bits
  float fs = 0.f, fb = 0.f;
  int e = 0;              // mxfp4: the e8m0 byte
};

namespace dq {

// The packed recipes on one pair: n holds element a in bits 0-3 and element
// b in bits 16-19 (other bits ignored); out comes the pair (a, b) of X's
// 16-bit type. Shared by the register kernel (a word shifted by 4 i gives
// elements i and i + 4) and the Hopper form (a byte permute gives two
// neighbours).
// Affine int4: q * s + b rounded once (s, b: pairs of X's type).
template <typename T>
__device__ __forceinline__ uint32_t affine4_pair(uint32_t n, uint32_t s, uint32_t b) {
  using C = Consts<T>;
  const uint32_t v = and_or(n, 0x000F000Fu, C::kMagic);  // MAGIC + (a, b)
  const uint32_t q = fma2<T>(v, C::kOne, C::kNegMagic);  // exact
  return fma2<T>(q, s, b);
}
// MXFP4 in bf16: e2m1 * 2^(e - 127) exactly (sc: mxfp4_scale()).
template <typename T>
__device__ __forceinline__ uint32_t mxfp4_pair(uint32_t n, const Scale& sc) {
  // Exponent and mantissa bits (0-2) to bf16 bits 6-8, the sign (3) to 15.
  const uint32_t v = and_or(n << 6, 0x01C001C0u, (n << 12) & 0x80008000u);
  uint32_t r = fma2<T>(v, sc.s, 0x80008000u);  // + (-0): keeps -0 and exact
  if (sc.e > 128) r = fma2<T>(r, sc.b, 0x80008000u);
  return r;
}
// Affine int8, element j of a word's four bytes: q exact in fp32 (2^23 + q
// under the magic exponent, less 2^23), then q * s + b by one fp32 FMA.
// Shared by the register kernel and the Hopper form (whose words are four
// bytes it gathered).
__device__ __forceinline__ float affine8(uint32_t w, int j, float fs, float fb) {
  return fmaf(__uint_as_float(prmt(w, 0x4B000000u, 0x7440u | uint32_t(j))) - 8388608.f, fs, fb);
}
// MXFP4's scale from its e8m0 byte: s the pair 2^(e - 1) when that fits
// bf16 (e <= 128), else 2^126, with b = 2^(e - 127) applied by a second
// multiply. ok = false (e then 0): zero, a row past the weights.
__device__ __forceinline__ Scale mxfp4_scale(int e, bool ok = true) {
  Scale sc;
  sc.e = e;
  const uint32_t m1 = sc.e <= 128 ? uint32_t(sc.e + 126) << 7 : 253u << 7;
  sc.s = ok ? m1 | (m1 << 16) : 0u;
  const uint32_t m2 = uint32_t(sc.e) << 7;
  sc.b = m2 | (m2 << 16);
  return sc;
}

}  // namespace dq

// Dequant<T, FMT, PACKED>: kWordElems elements per uint32 word, kPairs =
// kWordElems / 2 A registers out of each, and the X registers to match.
template <typename T, int FMT, bool PACKED>
struct Dequant;

// ---------------------------------------------------------------- affine int4, packed
template <typename T>
struct Dequant<T, kInt4, true> {
  static constexpr int kWordElems = 8, kPairs = 4;
  static constexpr bool kAccScale = false;
  // Scale index i of a row's scales (and biases), of X's dtype.
  __device__ __forceinline__ static Scale load(const void* scales, const void* biases, int, int64_t i, bool ok) {
    Scale sc;
    if (ok) {
      const uint32_t s = __ldg(static_cast<const unsigned short*>(scales) + i);
      const uint32_t b = __ldg(static_cast<const unsigned short*>(biases) + i);
      sc.s = s | (s << 16);
      sc.b = b | (b << 16);
    }
    return sc;
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale& sc, uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = dq::affine4_pair<T>(w >> (4 * i), sc.s, sc.b);  // (e_i, e_i+4)
  }
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[4], uint32_t (&out)[4]) { dq::permute_x(x, out); }
};

// ---------------------------------------------------------------- MXFP4 in bf16, packed
template <typename T>
struct Dequant<T, kMxfp4, true> {
  static_assert(sizeof(T) == 2, "16-bit X");
  static constexpr int kWordElems = 8, kPairs = 4;
  static constexpr bool kAccScale = false;
  // The e8m0 byte as dq::mxfp4_scale() makes it.
  __device__ __forceinline__ static Scale load(const void* scales, const void*, int, int64_t i, bool ok) {
    return dq::mxfp4_scale(ok ? __ldg(static_cast<const unsigned char*>(scales) + i) : 0, ok);
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale& sc, uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = dq::mxfp4_pair<T>(w >> (4 * i), sc);  // (e_i, e_i+4)
  }
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[4], uint32_t (&out)[4]) { dq::permute_x(x, out); }
};

// ---------------------------------------------------------------- fp32 recipes
// The scale and bias as floats, whatever their dtype.
__device__ __forceinline__ Scale load_f32(const void* scales, const void* biases, int dtype, int64_t i, bool ok) {
  Scale sc;
  if (ok) {
    sc.fs = gatedmlp::detail::load_float(scales, dtype, i);
    sc.fb = gatedmlp::detail::load_float(biases, dtype, i);
  }
  return sc;
}

template <typename T>
struct Dequant<T, kInt4, false> {
  static constexpr int kWordElems = 8, kPairs = 4;
  static constexpr bool kAccScale = false;
  __device__ __forceinline__ static Scale load(const void* s, const void* b, int dtype, int64_t i, bool ok) {
    return load_f32(s, b, dtype, i, ok);
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale& sc, uint32_t (&a)[4]) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = fmaf(__uint_as_float(dq::and_or(w >> (4 * i), 0xFu, 0x4B000000u)) - 8388608.f, sc.fs, sc.fb);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = gatedmlp::detail::pack2<T>(v[2 * i], v[2 * i + 1]);
  }
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[4], uint32_t (&out)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = x[i];
  }
};

template <typename T, bool PACKED>
struct Dequant<T, kInt8, PACKED> {
  static_assert(!PACKED, "int8 dequantizes in fp32");
  static constexpr int kWordElems = 4, kPairs = 2;
  static constexpr bool kAccScale = false;
  __device__ __forceinline__ static Scale load(const void* s, const void* b, int dtype, int64_t i, bool ok) {
    return load_f32(s, b, dtype, i, ok);
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale& sc, uint32_t (&a)[2]) {
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = dq::affine8(w, i, sc.fs, sc.fb);
    a[0] = gatedmlp::detail::pack2<T>(v[0], v[1]);
    a[1] = gatedmlp::detail::pack2<T>(v[2], v[3]);
  }
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[2], uint32_t (&out)[2]) {
    out[0] = x[0];
    out[1] = x[1];
  }
};

template <typename T>
struct Dequant<T, kMxfp4, false> {
  static constexpr int kWordElems = 8, kPairs = 4;
  static constexpr bool kAccScale = false;
  // fs: 2^(e - 127) (a subnormal float for e = 0).
  __device__ __forceinline__ static Scale load(const void* scales, const void*, int, int64_t i, bool ok) {
    Scale sc;
    const uint32_t e = ok ? __ldg(static_cast<const unsigned char*>(scales) + i) : 0u;
    sc.fs = ok ? __uint_as_float(e == 0 ? 0x00400000u : e << 23) : 0.f;
    return sc;
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale& sc, uint32_t (&a)[4]) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t n = w >> (4 * i);
      // e2m1's exponent and mantissa to float bits 22-24 (a subnormal for
      // exponent 0), its sign to 31: times 2^126, the e2m1 value.
      const float f = __uint_as_float(((n & 7u) << 22) | ((n & 8u) << 28));
      v[i] = dq::mul_rn(dq::mul_rn(f, 0x1p126f), sc.fs);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = gatedmlp::detail::pack2<T>(v[2 * i], v[2 * i + 1]);
  }
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[4], uint32_t (&out)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = x[i];
  }
};

// ---------------------------------------------------------------- FP8 e4m3fn
template <typename T>
struct Fp8Bits;
template <>
struct Fp8Bits<__nv_bfloat16> {
  // Byte b to bits ((b & 0x7F) << 4) | ((b & 0x80) << 8): exponent in 7-10, mantissa 4-6.
  static constexpr int kShift = 4;
  static constexpr uint32_t kMask = 0x07F007F0u;
  static constexpr uint32_t kScale = 0x7B807B80u;  // 2^120, 2^120
};
template <>
struct Fp8Bits<__half> {
  // Byte b to bits ((b & 0x7F) << 7) | ((b & 0x80) << 8): exponent in 10-13, mantissa 7-9.
  static constexpr int kShift = 7;
  static constexpr uint32_t kMask = 0x3F803F80u;
  static constexpr uint32_t kScale = 0x5C005C00u;  // 256, 256
};

template <typename T, bool PACKED>
struct Dequant<T, kFp8, PACKED> {
  static_assert(PACKED, "FP8 dequantizes in 16-bit pairs");
  static constexpr int kWordElems = 4, kPairs = 2;
  static constexpr bool kAccScale = true;
  // The block's scale, whatever its dtype, for the fp32 sums.
  __device__ __forceinline__ static Scale load(const void* scales, const void*, int dtype, int64_t i, bool ok) {
    Scale sc;
    sc.fs = ok ? gatedmlp::detail::load_float(scales, dtype, i) : 0.f;
    return sc;
  }
  __device__ __forceinline__ static void word(uint32_t w, const Scale&, uint32_t (&a)[2]) {
    using B = Fp8Bits<T>;
    // Bytes 0 and 2, then 1 and 3, with their signs from bits 7 and 23 (15 and 31).
    const uint32_t v0 = dq::and_or(w << B::kShift, B::kMask, (w << 8) & 0x80008000u);
    const uint32_t v1 = dq::and_or(w >> (8 - B::kShift), B::kMask, w & 0x80008000u);
    a[0] = dq::fma2<T>(v0, B::kScale, 0x80008000u);  // exact: the e4m3 values
    a[1] = dq::fma2<T>(v1, B::kScale, 0x80008000u);
  }
  // X's (x0 x1) (x2 x3) to the pairs' (x0 x2) (x1 x3).
  __device__ __forceinline__ static void x_pairs(const uint32_t (&x)[2], uint32_t (&out)[2]) {
    out[0] = dq::prmt(x[0], x[1], 0x5410);
    out[1] = dq::prmt(x[0], x[1], 0x7632);
  }
};

}  // namespace gatedmlp::quant_decode
