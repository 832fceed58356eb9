// The GLU activations, written once for float (kernels) and double (the CPU
// reference). Y = act(g) * u, except swiglu_clamped which also clamps.
#pragma once

#include <cmath>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::detail {

enum ActivationId : int { kSilu = 0, kGeluTanh = 1, kGeluErf = 2, kRelu = 3, kSwigluClamped = 4 };

GATEDMLP_HD float m_exp(float x) { return expf(x); }
GATEDMLP_HD double m_exp(double x) { return exp(x); }
GATEDMLP_HD float m_tanh(float x) { return tanhf(x); }
GATEDMLP_HD double m_tanh(double x) { return tanh(x); }
GATEDMLP_HD float m_erf(float x) { return erff(x); }
GATEDMLP_HD double m_erf(double x) { return erf(x); }

template <typename F>
GATEDMLP_HD F sigmoid(F x) {
  return F(1) / (F(1) + m_exp(-x));
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
