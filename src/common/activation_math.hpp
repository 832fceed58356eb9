// The GLU activations, written once for float (kernels) and double (the CPU
// reference). Y = act(g) * u, except swiglu_clamped which also clamps.
#pragma once

#include <cmath>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::detail {

enum ActivationId : int { kSilu = 0, kGeluTanh = 1, kGeluErf = 2, kRelu = 3, kSwigluClamped = 4 };

// Kernels use the special-function unit's exp2 and reciprocal approximations
// (a few ulp: far below the bf16/fp16 rounding of the result; the accurate
// expf costs several times the instructions in the epilogue), in their
// flush-to-zero forms. __expf and __fdividef (ex2.approx.f32, div.approx.f32)
// wrap each in a range fix-up for subnormals, a few more instructions per
// output in epilogues bound by their instruction count (docs/notes/hopper-epilogue.md, h40). In
// the sigmoids below no subnormal matters: exp(-x) is subnormal only where
// 1 + exp(-x) rounds to 1 anyway, and sigmoid(x) only below 2^-126 (x <
// -87.3), which now gives 0 (so did __fdividef for divisors of 2^126 on).
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// One MUFU op, relative error about 2^-16.5 (glu_out16 below).
__device__ __forceinline__ float tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#endif
GATEDMLP_HD float m_exp(float x) {
#if defined(__CUDA_ARCH__)
  return ex2_ftz(x * 1.4426950408889634f);  // log2(e)
#else
  return expf(x);
#endif
}
GATEDMLP_HD double m_exp(double x) { return exp(x); }
GATEDMLP_HD float m_tanh(float x) { return tanhf(x); }
GATEDMLP_HD double m_tanh(double x) { return tanh(x); }
GATEDMLP_HD float m_erf(float x) { return erff(x); }
GATEDMLP_HD double m_erf(double x) { return erf(x); }

GATEDMLP_HD double sigmoid(double x) { return 1.0 / (1.0 + m_exp(-x)); }
GATEDMLP_HD float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  // 1 / inf = 0 keeps large negative x right; NaN stays NaN.
  return rcp_ftz(1.0f + m_exp(-x));
#else
  return 1.0f / (1.0f + m_exp(-x));
#endif
}

// min(a, b) that returns NaN when a is NaN (fminf would return b). On the
// device one min.NaN instruction (sm_80 and newer), as cheap as fminf: the
// two-instruction compare-and-select cost the Hopper kernel a register and
// made it spill.
GATEDMLP_HD double min_keep_nan(double a, double b) { return a > b ? b : a; }
GATEDMLP_HD float min_keep_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a > b ? b : a;
#endif
}

// max(a, 0) that returns NaN when a is NaN, for relu (torch.relu keeps a
// NaN; fmaxf and a compare-and-select would give 0). One max.NaN on the
// device.
GATEDMLP_HD double relu_keep_nan(double a) { return a < 0.0 ? 0.0 : a; }
GATEDMLP_HD float relu_keep_nan(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(a));
  return r;
#else
  return a < 0.0f ? 0.0f : a;
#endif
}

// gpt-oss: the gate is clamped from above only, the up projection both ways.
// A NaN passes through, as torch.clamp lets it.
template <typename F>
GATEDMLP_HD void clamp_swiglu(F& g, F& u, F limit) {
  g = min_keep_nan(g, limit);
  u = u < -limit ? -limit : (u > limit ? limit : u);
}

// gate and up already include alpha and bias.
template <typename F>
GATEDMLP_HD F glu(int act, F g, F u, F clamp_alpha, F clamp_limit) {
  switch (act) {
    case kSilu:
      return g * sigmoid(g) * u;
    case kGeluTanh: {
      const F c = F(0.7978845608028654);  // sqrt(2/pi)
      return F(0.5) * g * (F(1) + m_tanh(c * (g + F(0.044715) * g * g * g))) * u;
    }
    case kGeluErf:
      return F(0.5) * g * (F(1) + m_erf(g * F(0.7071067811865476))) * u;
    case kRelu:
      return relu_keep_nan(g) * u;
    case kSwigluClamped: {
      // gpt-oss: see clamp_swiglu (written out here: the Hopper kernel's
      // register allocation spilled with the call).
      g = min_keep_nan(g, clamp_limit);
      u = u < -clamp_limit ? -clamp_limit : (u > clamp_limit ? clamp_limit : u);
      return g * sigmoid(clamp_alpha * g) * (u + F(1));
    }
  }
  return F(0);
}

// glu_out16's (below) silu (gelu = false) and gelu_tanh (true), and
// nothing else: for epilogues that keep the common case's code short
// (decode::finish).
GATEDMLP_HD float glu_out16_silu_gelu(bool gelu, float g, float u) {
#if defined(__CUDA_ARCH__)
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  const float h = 0.5f * g;
  return fmaf(h, tanh_approx(gelu ? g * fmaf(c * 0.044715f, g * g, c) : h), h) * u;
#else
  return glu<float>(gelu ? kGeluTanh : kSilu, g, u, 0.f, 0.f);
#endif
}

// The GLU for outputs rounded to 16 bits (bf16 or fp16), in the kernels'
// epilogues: silu, the clamped SwiGLU and gelu_tanh through the
// special-function unit's tanh (`tanh.approx.f32`, one MUFU op, relative
// error about 2^-16.5), using sigmoid(x) = (1 + tanh(x / 2)) / 2:
//   silu(g) = h + h tanh(h), h = g / 2: a multiply, the tanh and an FMA,
// where the exp2-and-reciprocal sigmoid takes two MUFU ops and two more
// instructions. The epilogues are bound by their instruction count and the
// MUFU rate (docs/notes, h39, h41). Accuracy (GpuActivation test, against
// float64 over g in [-120, 120]): |error| <= 3.9e-6 |g u|, and relative
// error ~1e-5 where g >= 0; far below the output's own rounding (2^-9
// relative for bf16, 2^-12 for fp16) at the scale of g. Where g << 0 the
// result is tiny next to g and tanh's error near -1 makes its relative
// error grow, which no norm-wise comparison sees. fp32 outputs keep glu()
// (|error| <= 2e-7 |g u|). Host code (no MUFU): glu().
template <typename F>
GATEDMLP_HD F glu_out16(int act, F g, F u, F clamp_alpha, F clamp_limit) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(F) == 4) {
    switch (act) {
      case kSilu:
        return glu_out16_silu_gelu(false, g, u);
      case kGeluTanh:
        return glu_out16_silu_gelu(true, g, u);
      case kSwigluClamped: {
        g = min_keep_nan(g, clamp_limit);
        u = u < -clamp_limit ? -clamp_limit : (u > clamp_limit ? clamp_limit : u);
        const float h = 0.5f * g;
        return fmaf(h, tanh_approx(clamp_alpha * h), h) * (u + 1.0f);
      }
      default:
        break;
    }
  }
#endif
  return glu<F>(act, g, u, clamp_alpha, clamp_limit);
}

// N GLU values at once (the portable kernel's epilogue: adjacent columns).
// For silu and the clamped SwiGLU the N sigmoids share one reciprocal: fewer
// special-function operations for a few more plain ones (docs/notes/portable-kernel.md, v11: it
// helps the portable kernel; in the Hopper kernel, whose epilogue is bound
// by instructions rather than the special-function unit, it was slower,
// h12). With t = exp(-|x|) in [0, 1] and d = 1 + t in [1, 2], the product of
// the d stays within [1, 2^N] (no overflow for N <= 64); 1/d_i is the
// product of the d before it (a prefix product) times 1/(d_0 ... d_i) (the
// reciprocal of all, multiplied back by the d after i). sigmoid(x) is 1/d
// for x >= 0 and t/d for x < 0, accurate in both tails. A NaN stays in its
// own element: a NaN d is replaced by 2 before the products (fminf returns
// the other operand), and the NaN x still reaches its own result through t.
template <int N>
GATEDMLP_HD void sigmoid_n(const float* x, float* s) {
  static_assert(N >= 1 && N <= 64, "the product of N values in [1, 2] must stay finite");
  float t[N], d[N], pre[N];
  float run = 1.0f;
  GATEDMLP_UNROLL
  for (int i = 0; i < N; ++i) {
    t[i] = m_exp(-fabsf(x[i]));
    d[i] = fminf(1.0f + t[i], 2.0f);
    pre[i] = run;  // product of d[0 .. i-1]
    run *= d[i];
  }
#if defined(__CUDA_ARCH__)
  float r = rcp_ftz(run);  // 1 / (product of all)
#else
  float r = 1.0f / run;
#endif
  GATEDMLP_UNROLL
  for (int i = N - 1; i >= 0; --i) {
    const float inv = pre[i] * r;  // r holds 1 / (d[0] ... d[i])
    r *= d[i];
    s[i] = x[i] >= 0.0f ? inv : t[i] * inv;
  }
}

// g_in, u_in and y: N consecutive values each.
template <int N>
GATEDMLP_HD void glu_n(int act, const float* g_in, const float* u_in, float clamp_alpha, float clamp_limit, float* y) {
  if (act == kSilu || act == kSwigluClamped) {
    float g[N], u[N], x[N], sg[N];
    GATEDMLP_UNROLL
    for (int i = 0; i < N; ++i) {
      g[i] = g_in[i];
      u[i] = u_in[i];
      if (act == kSwigluClamped) clamp_swiglu(g[i], u[i], clamp_limit);
      x[i] = act == kSwigluClamped ? clamp_alpha * g[i] : g[i];
    }
    sigmoid_n<N>(x, sg);
    GATEDMLP_UNROLL
    for (int i = 0; i < N; ++i) y[i] = g[i] * sg[i] * (act == kSwigluClamped ? u[i] + 1.0f : u[i]);
  } else {
    GATEDMLP_UNROLL
    for (int i = 0; i < N; ++i) y[i] = glu<float>(act, g_in[i], u_in[i], clamp_alpha, clamp_limit);
  }
}

}  // namespace gatedmlp::detail
