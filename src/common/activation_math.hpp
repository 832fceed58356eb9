// The GLU activations, written once for float (kernels) and double (the CPU
// reference). Y = act(g) * u, except swiglu_clamped which also clamps.
#pragma once

#include <cmath>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::detail {

enum ActivationId : int { kSilu = 0, kGeluTanh = 1, kGeluErf = 2, kRelu = 3, kSwigluClamped = 4 };

// Kernels use the hardware exp2 approximation (__expf, a few ulp): its error
// is far below the bf16/fp16 rounding of the result, and the accurate expf
// costs several times the instructions in the epilogue.
GATEDMLP_HD float m_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
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
  // Approximate reciprocal (as __expf): 1 / inf = 0 keeps large negative x right.
  return __fdividef(1.0f, 1.0f + m_exp(-x));
#else
  return 1.0f / (1.0f + m_exp(-x));
#endif
}

// gpt-oss: the gate is clamped from above only, the up projection both ways.
// Written so that a NaN passes through, as torch.clamp does.
template <typename F>
GATEDMLP_HD void clamp_swiglu(F& g, F& u, F limit) {
  g = g > limit ? limit : g;
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
      return (g > F(0) ? g : F(0)) * u;
    case kSwigluClamped: {
      clamp_swiglu(g, u, clamp_limit);
      return g * sigmoid(clamp_alpha * g) * (u + F(1));
    }
  }
  return F(0);
}

// Two GLU values at once (the portable kernel's epilogue: adjacent columns).
// For silu and the clamped SwiGLU the two sigmoids share one reciprocal, a
// quarter fewer special-function operations for a few more plain ones
// (NOTES.md h12: it helps the portable kernel; in the Hopper kernel, whose
// epilogue is bound by instructions, not the special-function unit, it
// was slower). With t = exp(-|x|) in [0, 1] and d = 1 + t in [1, 2], d0 d1
// cannot overflow; 1/d0 = d1 / (d0 d1), and sigmoid(x) is 1/d for x >= 0 and
// t/d for x < 0, accurate in both tails. A NaN stays in its own element: a
// NaN d is replaced by 2 before the shared reciprocal (fminf returns the
// other operand), and the NaN x still reaches its own result through t.
GATEDMLP_HD void sigmoid2(float x0, float x1, float& s0, float& s1) {
  const float t0 = m_exp(-fabsf(x0)), t1 = m_exp(-fabsf(x1));
  const float d0 = fminf(1.0f + t0, 2.0f), d1 = fminf(1.0f + t1, 2.0f);
#if defined(__CUDA_ARCH__)
  const float r = __fdividef(1.0f, d0 * d1);
#else
  const float r = 1.0f / (d0 * d1);
#endif
  const float i0 = d1 * r, i1 = d0 * r;
  s0 = x0 >= 0.0f ? i0 : t0 * i0;
  s1 = x1 >= 0.0f ? i1 : t1 * i1;
}

GATEDMLP_HD void glu2(int act, float g0, float u0, float g1, float u1, float clamp_alpha, float clamp_limit,
                      float& y0, float& y1) {
  if (act == kSilu) {
    float s0, s1;
    sigmoid2(g0, g1, s0, s1);
    y0 = g0 * s0 * u0;
    y1 = g1 * s1 * u1;
  } else if (act == kSwigluClamped) {
    clamp_swiglu(g0, u0, clamp_limit);
    clamp_swiglu(g1, u1, clamp_limit);
    float s0, s1;
    sigmoid2(clamp_alpha * g0, clamp_alpha * g1, s0, s1);
    y0 = g0 * s0 * (u0 + 1.0f);
    y1 = g1 * s1 * (u1 + 1.0f);
  } else {
    y0 = glu<float>(act, g0, u0, clamp_alpha, clamp_limit);
    y1 = glu<float>(act, g1, u1, clamp_alpha, clamp_limit);
  }
}

}  // namespace gatedmlp::detail
