// Device-side test inputs: counter-based random fills and NaN poison.
//
// Each element is a pure function of (seed, index), so a fill is
// reproducible whatever the grid shape and needs no generator state. Filling
// on the device keeps multi-GiB inputs (M = K = 65536) from being staged
// through the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/device_dtype.cuh"
#include "reference/reference.hpp"

namespace gatedmlp::ref {
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;  // golden-ratio increment of splitmix64
constexpr int kThreads = 256;

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

using gatedmlp::detail::from_float;

// Element i is element i of the splitmix64 sequence started at `key`: the
// sequence is equidistributed, and distinct seeds give unrelated keys.
template <typename T>
__global__ void fill_random_kernel(T* __restrict__ out, int64_t n, uint64_t key, float lo, float hi, bool normal) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t r = mix64(key + static_cast<uint64_t>(i) * kGamma);
    float v;
    if (normal) {
      // Box-Muller from two 24-bit uniforms; u1 is in (0, 1] so the log is
      // finite (the tail is cut at about 5.8 sigma, harmless for test data).
      const float u1 = static_cast<float>((r >> 40) + 1) * 0x1p-24f;
      const float u2 = static_cast<float>((r >> 16) & 0xFFFFFFull) * 0x1p-24f;
      v = lo + hi * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    } else {
      const float u = static_cast<float>(r >> 40) * 0x1p-24f;  // [0, 1)
      v = lo + (hi - lo) * u;
    }
    out[i] = from_float<T>(v);
  }
}

template <typename Bits>
__global__ void fill_bits_kernel(Bits* __restrict__ out, int64_t n, Bits bits) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = bits;
  }
}

// Enough blocks to fill the GPU several times over; the grid-stride loop
// covers the rest, so huge n never overflows gridDim.x.
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 16));
}

Status check_fill_args(const char* fn, const void* p, DType dtype, int64_t n) {
  if (n < 0) {
    return {StatusCode::invalid_argument, std::string(fn) + ": n must be >= 0, got " + std::to_string(n)};
  }
  if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::fp32) {
    return {StatusCode::invalid_argument, std::string(fn) + ": dtype must be bf16, fp16 or fp32, got value " +
                                              std::to_string(static_cast<int>(dtype))};
  }
  if (n > 0 && p == nullptr) {
    return {StatusCode::invalid_argument, std::string(fn) + ": pointer is null for n = " + std::to_string(n)};
  }
  const size_t align = dtype == DType::fp32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    return {StatusCode::invalid_argument,
            std::string(fn) + ": pointer is not aligned to its " + std::to_string(align) + "-byte element"};
  }
  return Status::Ok();
}

Status launch_status(const char* fn) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code =
      (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) ? StatusCode::no_device : StatusCode::cuda_error;
  return {code, std::string(fn) + ": kernel launch failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

}  // namespace

Status fill_random(void* p, DType dtype, int64_t n, uint64_t seed, float lo, float hi, bool normal,
                   cudaStream_t stream) {
  if (Status s = check_fill_args("fill_random", p, dtype, n); !s.ok()) return s;
  if (n == 0) return Status::Ok();
  const uint64_t key = mix64(seed + kGamma);
  const unsigned grid = grid_for(n);
  switch (dtype) {
    case DType::bf16:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, key, lo, hi, normal);
      break;
    case DType::fp16:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__half*>(p), n, key, lo, hi, normal);
      break;
    case DType::fp32:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(p), n, key, lo, hi, normal);
      break;
    case DType::fp8_e4m3: break;  // refused by check_fill_args
  }
  return launch_status("fill_random");
}

Status fill_nan(void* p, DType dtype, int64_t n, cudaStream_t stream) {
  if (Status s = check_fill_args("fill_nan", p, dtype, n); !s.ok()) return s;
  if (n == 0) return Status::Ok();
  const unsigned grid = grid_for(n);
  // Quiet NaNs: the all-ones exponent with the top mantissa bit set.
  switch (dtype) {
    case DType::bf16:
      fill_bits_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(p), n, uint16_t{0x7FC0});
      break;
    case DType::fp16:
      fill_bits_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(p), n, uint16_t{0x7E00});
      break;
    case DType::fp32:
      fill_bits_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint32_t*>(p), n, uint32_t{0x7FC00000u});
      break;
    case DType::fp8_e4m3: break;  // refused by check_fill_args
  }
  return launch_status("fill_nan");
}

}  // namespace gatedmlp::ref
