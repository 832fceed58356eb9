// Devices the dispatcher tests plan for without having them (CPU tests):
// the DeviceInfo an H200 or an A100 reports.
#pragma once

#include "core/internal.hpp"

namespace gatedmlp::test {

inline detail::DeviceInfo simulated_h200() {
  detail::DeviceInfo d;
  d.device = 0;
  d.major = 9;
  d.minor = 0;
  d.sms = 132;
  d.smem_optin = 232448;
  d.l2_bytes = 50u << 20;
  d.name = "simulated H200";
  return d;
}

inline detail::DeviceInfo simulated_a100() {
  detail::DeviceInfo d;
  d.device = 0;
  d.major = 8;
  d.minor = 0;
  d.sms = 108;
  d.smem_optin = 166912;
  d.l2_bytes = 40u << 20;
  d.name = "simulated A100";
  return d;
}

}  // namespace gatedmlp::test
