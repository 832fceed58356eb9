// Device properties, queried once per device: the dispatcher reads them on
// every call and cudaGetDeviceProperties is far too slow for that.
#include <mutex>
#include <unordered_map>

#include <cuda_runtime_api.h>

#include "core/internal.hpp"

namespace gatedmlp::detail {

Status device_info(int device, DeviceInfo* info) {
  if (device < 0) {
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
      cudaGetLastError();
      return err(StatusCode::no_device, "no usable CUDA device: ", cudaGetErrorString(e));
    }
  }
  static std::mutex mu;
  static std::unordered_map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(device); it != cache.end()) {
    *info = it->second;
    return Status::Ok();
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    cudaGetLastError();
    return err(StatusCode::no_device, "cannot read the properties of CUDA device ", device, ": ",
               cudaGetErrorString(e));
  }
  DeviceInfo d;
  d.device = device;
  d.major = prop.major;
  d.minor = prop.minor;
  d.sms = prop.multiProcessorCount;
  d.smem_optin = prop.sharedMemPerBlockOptin;
  d.l2_bytes = prop.l2CacheSize;
  d.name = prop.name;
  cache[device] = d;
  *info = d;
  return Status::Ok();
}

}  // namespace gatedmlp::detail
