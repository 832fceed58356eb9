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
      // gpt-oss: the gate is clamped from above only, the up projection both ways.
      g = g < clamp_limit ? g : clamp_limit;
      u = u < -clamp_limit ? -clamp_limit : (u > clamp_limit ? clamp_limit : u);
      return g * sigmoid(clamp_alpha * g) * (u + F(1));
    }
  }
  return F(0);
}

}  // namespace gatedmlp::detail
