// A kernel's dynamic shared-memory limit, raised once per device.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <cuda_runtime_api.h>

namespace gatedmlp::detail {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) the first
// time on each device: the attribute belongs to the device's context, and
// setting it on every call was a driver round trip per launch.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  static std::mutex mu;
  static std::unordered_map<const void*, uint64_t> done;  // kernel -> one bit per device ordinal < 64
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const void* key = reinterpret_cast<const void*>(kernel);
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;  // others: set on every call
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& mask = done[key];
  if (bit && (mask & bit)) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); e != cudaSuccess)
    return e;
  mask |= bit;
  return cudaSuccess;
}

}  // namespace gatedmlp::detail
