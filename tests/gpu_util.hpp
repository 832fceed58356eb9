// Helpers for the GPU tests: device buffers, a skip when there is no GPU, and
// building random problems with host data laid out exactly like the device's.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
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

// cudaDeviceSynchronize with a time limit (GATEDMLP_TEST_SYNC_LIMIT seconds,
// default 300: the slowest legitimate call, under compute-sanitizer, takes
// seconds). A kernel that never finishes ends the binary with exit code 3
// and a line naming what was running; a time-out of the whole binary would
// name nothing, and a hung GPU cannot be recovered within the process.
inline cudaError_t sync_within(const std::string& what) {
  const char* v = std::getenv("GATEDMLP_TEST_SYNC_LIMIT");
  const double limit = v ? std::atof(v) : 300.0;
  cudaEvent_t ev;
  if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) return e;
  cudaError_t e = cudaEventRecord(ev, 0);  // the legacy stream: after all earlier work
  const auto t0 = std::chrono::steady_clock::now();
  while (e == cudaSuccess) {
    e = cudaEventQuery(ev);
    if (e != cudaErrorNotReady) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
      std::fprintf(stderr, "[ HUNG ] the device did not finish within %.0f s: %s\n", limit, what.c_str());
      std::fprintf(stdout, "[ HUNG ] the device did not finish within %.0f s: %s\n", limit, what.c_str());
      std::fflush(nullptr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    e = cudaSuccess;
  }
  cudaEventDestroy(ev);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

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
