// float64 reference on the device for a sample of rows of batch 0.
//
// The CPU reference cannot do M = K = U = 65536 in any reasonable time; this
// computes the exact function (fp64 products and sums, fp64 activation) for
// the rows a test or the accuracy tool samples. It reads the inputs through
// the same layout rules as the library (fused_row, out_in/in_out, ld), so it
// checks the layout handling too rather than assuming it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/device_dtype.cuh"
#include "common/activation_math.hpp"
#include "common/layout_math.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::ref {
namespace {

// A 64-row x 64-output tile per block (64 gate and 64 up dot products per
// row), 4x4 outputs per thread, K in steps of 16 through shared memory:
// 12 shared loads feed 32 fp64 FMAs.
constexpr int kRows = 64;
constexpr int kCols = 64;
constexpr int kStepK = 16;
constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // rows (and columns) per thread, 16 apart

struct RefArgs {
  const void* x;
  const void* w;
  const void* w_up;
  const void* bias;
  const void* bias_up;
  const int64_t* rows;
  int64_t nrows;
  int64_t m, k, u;
  int64_t ldx, ldw;
  bool separate, out_in;
  int64_t group;
  int first;
  DType in_dtype, bias_dtype;
  bool has_bias;
  double alpha;
  int act;
  double clamp_alpha, clamp_limit;
  double* y;
};

// Every input dtype is exactly representable in fp32, so the fp32 load is exact.
__device__ __forceinline__ double load_d(const void* base, DType t, int64_t i) {
  return static_cast<double>(gatedmlp::detail::load_float(base, static_cast<int>(t), i));
}

// Physical weight row of logical output j of `half`, and the tensor holding it.
__device__ __forceinline__ int64_t weight_row(const RefArgs& a, int64_t j, int half) {
  return a.separate ? j : detail::fused_row(j, half, a.group, a.first);
}

__device__ __forceinline__ double load_weight(const RefArgs& a, int half, int64_t j, int64_t k) {
  const void* base = (a.separate && half == 1) ? a.w_up : a.w;
  const int64_t f = weight_row(a, j, half);
  const int64_t idx = a.out_in ? f * a.ldw + k : k * a.ldw + f;
  return load_d(base, a.in_dtype, idx);
}

__global__ void __launch_bounds__(kThreads) reference_rows_kernel(const RefArgs a) {
  __shared__ double xs[kStepK][kRows + 1];  // +1: the k-fastest fill would hit one bank
  __shared__ double gs[kStepK][kCols + 1];
  __shared__ double us[kStepK][kCols + 1];
  __shared__ int64_t row_of[kRows];
  __shared__ bool row_bad[kRows];

  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kCols;

  if (tid < kRows) {
    const int64_t r = r0 + tid;
    const int64_t row = r < a.nrows ? a.rows[r] : 0;
    const bool bad = row < 0 || row >= a.m;
    row_bad[tid] = bad;
    row_of[tid] = bad ? 0 : row;  // an out-of-range row reads row 0 and is reported as NaN
  }
  __syncthreads();

  double acc_g[kPerThread][kPerThread] = {};
  double acc_u[kPerThread][kPerThread] = {};

  for (int64_t k0 = 0; k0 < a.k; k0 += kStepK) {
#pragma unroll
    for (int i = 0; i < (kRows * kStepK) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int rr = idx / kStepK, kk = idx % kStepK;
      const int64_t k = k0 + kk;
      xs[kk][rr] = (r0 + rr < a.nrows && k < a.k) ? load_d(a.x, a.in_dtype, row_of[rr] * a.ldx + k) : 0.0;
    }
#pragma unroll
    for (int i = 0; i < (kCols * kStepK) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      // Walk the contiguous dimension of the stored weight with consecutive threads.
      const int jj = a.out_in ? idx / kStepK : idx % kCols;
      const int kk = a.out_in ? idx % kStepK : idx / kCols;
      const int64_t j = j0 + jj, k = k0 + kk;
      const bool in = j < a.u && k < a.k;
      gs[kk][jj] = in ? load_weight(a, 0, j, k) : 0.0;
      us[kk][jj] = in ? load_weight(a, 1, j, k) : 0.0;
    }
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < kStepK; ++kk) {
      double xv[kPerThread], gv[kPerThread], uv[kPerThread];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        xv[i] = xs[kk][ty + 16 * i];
        gv[i] = gs[kk][tx + 16 * i];
        uv[i] = us[kk][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
#pragma unroll
        for (int c = 0; c < kPerThread; ++c) {
          acc_g[i][c] = fma(xv[i], gv[c], acc_g[i][c]);
          acc_u[i][c] = fma(xv[i], uv[c], acc_u[i][c]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int rr = ty + 16 * i;
    const int64_t r = r0 + rr;
    if (r >= a.nrows) continue;
#pragma unroll
    for (int c = 0; c < kPerThread; ++c) {
      const int64_t j = j0 + tx + 16 * c;
      if (j >= a.u) continue;
      double g = a.alpha * acc_g[i][c];
      double u = a.alpha * acc_u[i][c];
      if (a.has_bias) {
        if (a.separate) {
          g += load_d(a.bias, a.bias_dtype, j);
          u += load_d(a.bias_up, a.bias_dtype, j);
        } else {
          g += load_d(a.bias, a.bias_dtype, weight_row(a, j, 0));
          u += load_d(a.bias, a.bias_dtype, weight_row(a, j, 1));
        }
      }
      const double y = row_bad[rr] ? nan("") : detail::glu<double>(a.act, g, u, a.clamp_alpha, a.clamp_limit);
      a.y[r * a.u + j] = y;
    }
  }
}

Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code =
      (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) ? StatusCode::no_device : StatusCode::cuda_error;
  return {code, "gpu_reference_rows: " + what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

Status invalid(const std::string& msg) { return {StatusCode::invalid_argument, "gpu_reference_rows: " + msg}; }

template <bool OUT16>
__global__ void glu_eval_kernel(int act, const float* g, const float* u, float* y, int64_t n, float ca, float cl) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = OUT16 ? detail::glu_out16<float>(act, g[i], u[i], ca, cl) : detail::glu<float>(act, g[i], u[i], ca, cl);
}

}  // namespace

Status gpu_reference_rows(const Problem& p, const Arguments& dev, const int64_t* rows_dev, int64_t nrows, double* y_out,
                          cudaStream_t stream) {
  if (Status s = check_support(p); !s.ok()) {
    return {s.code(), "gpu_reference_rows: problem rejected by check_support: " + s.message()};
  }
  if (p.op != Operation::gate_up) return {StatusCode::not_supported, "gpu_reference_rows: op=gate_up only"};
  if (nrows < 0) return invalid("nrows must be >= 0, got " + std::to_string(nrows));
  if (nrows == 0 || p.u == 0) return Status::Ok();
  if (p.batch < 1 || p.m < 1) return invalid("rows were requested from a problem with no rows");
  const Problem r = p.resolved();
  const bool separate = r.weights.format == WeightFormat::separate;
  if (rows_dev == nullptr) return invalid("rows_dev is null");
  if (y_out == nullptr) return invalid("y_out is null");
  if (r.k > 0 && dev.x == nullptr) return invalid("args.x is null");
  if (r.k > 0 && dev.w == nullptr) return invalid("args.w is null");
  if (r.k > 0 && separate && dev.w_up == nullptr) return invalid("args.w_up is null (separate weights)");
  if (r.has_bias && dev.bias == nullptr) return invalid("args.bias is null (has_bias)");
  if (r.has_bias && separate && dev.bias_up == nullptr)
    return invalid("args.bias_up is null (has_bias, separate weights)");
  if (r.input_dtype != DType::bf16 && r.input_dtype != DType::fp16) {
    return {StatusCode::not_supported,
            std::string("gpu_reference_rows: input dtype must be bf16 or fp16, got ") + to_string(r.input_dtype)};
  }
  if (!separate && r.weights.group <= 0) {
    return invalid("resolved weight group must be > 0, got " + std::to_string(r.weights.group));
  }

  RefArgs a{};
  a.x = dev.x;
  a.w = dev.w;
  a.w_up = dev.w_up;
  a.bias = dev.bias;
  a.bias_up = dev.bias_up;
  a.rows = rows_dev;
  a.nrows = nrows;
  a.m = r.m;
  a.k = r.k;
  a.u = r.u;
  a.ldx = r.ldx;
  a.ldw = r.weights.ld;
  a.separate = separate;
  a.out_in = r.weights.storage == WeightStorage::out_in;
  a.group = separate ? r.u : r.weights.group;
  a.first = r.weights.first == Half::gate ? 0 : 1;
  a.in_dtype = r.input_dtype;
  a.bias_dtype = r.bias_dtype;
  a.has_bias = r.has_bias;
  a.alpha = static_cast<double>(r.alpha);
  a.act = static_cast<int>(r.activation);
  a.clamp_alpha = static_cast<double>(r.act_params.clamp_alpha);
  a.clamp_limit = static_cast<double>(r.act_params.clamp_limit);
  a.y = y_out;

  const int64_t gx = (r.u + kCols - 1) / kCols;
  const int64_t gy = (nrows + kRows - 1) / kRows;
  if (gx > 0x7FFFFFFF || gy > 65535) {
    return invalid("too many rows or columns for one launch: U=" + std::to_string(r.u) +
                   ", nrows=" + std::to_string(nrows) + " (at most " + std::to_string(65535 * kRows) + " rows)");
  }
  reference_rows_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, 0, stream>>>(a);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

Status glu_on_device(int act, bool out16, const float* g, const float* u, float* y, int64_t n, float clamp_alpha,
                     float clamp_limit, cudaStream_t stream) {
  if (n <= 0) return {};
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  if (out16) glu_eval_kernel<true><<<blocks, 256, 0, stream>>>(act, g, u, y, n, clamp_alpha, clamp_limit);
  else glu_eval_kernel<false><<<blocks, 256, 0, stream>>>(act, g, u, y, n, clamp_alpha, clamp_limit);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {StatusCode::cuda_error, std::string("glu_on_device: ") + cudaGetErrorString(e)};
  return {};
}

}  // namespace gatedmlp::ref
