// Helpers for the GPU tests: device buffers, a skip when there is no GPU, and
// building random problems with host data laid out exactly like the device's.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gatedmlp/gatedmlp.hpp"
#include "reference/reference.hpp"

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                   \
  } while (0)

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    int n_ = 0;                                                                     \
    if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) {                        \
      cudaGetLastError();                                                           \
      GTEST_SKIP() << "no CUDA device";                                             \
    }                                                                               \
  } while (0)

namespace gatedmlp::test {

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n && cudaMalloc(&p, n) != cudaSuccess) {
      p = nullptr;
      bytes = 0;
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { std::swap(p, o.p); std::swap(bytes, o.bytes); return *this; }
  ~DeviceBuffer() { if (p) cudaFree(p); }
};

// Host bytes of one tensor, and its device copy.
struct Tensor {
  std::vector<unsigned char> host;
  DeviceBuffer dev;
  void upload() {
    dev = DeviceBuffer(host.size());
    if (!host.empty()) cudaMemcpy(dev.p, host.data(), host.size(), cudaMemcpyHostToDevice);
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(dev.bytes);
    if (dev.bytes) cudaMemcpy(out.data(), dev.p, dev.bytes, cudaMemcpyDeviceToHost);
    return out;
  }
};

// Random values of `dtype` into a buffer of n elements (all of it: padding too).
inline void fill(std::vector<unsigned char>& buf, DType dtype, int64_t n, std::mt19937_64& rng, float lo, float hi) {
  buf.assign(size_t(n) * dtype_size(dtype), 0);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < n; ++i) ref::store_from_double(buf.data(), dtype, i, d(rng));
}

}  // namespace gatedmlp::test
