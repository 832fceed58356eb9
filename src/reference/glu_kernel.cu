// The unfused baseline's GLU kernel (glu_kernel.hpp): one thread per output
// (scalar) or per 8 outputs (contig, pair), rows in blocks of kRowsPerBlock.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "common/activation_math.hpp"
#include "common/device_dtype.cuh"
#include "common/layout_math.hpp"
#include "reference/glu_kernel.hpp"

namespace gatedmlp::ref::glu {
namespace {

constexpr int kGluThreads = 256;
constexpr int kGluVec = kVec;
constexpr int kGluRowsPerBlock = 8;  // consecutive rows a GLU block takes per grid step


// ---------------------------------------------------------------- device helpers
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

using gatedmlp::detail::to_float;
using gatedmlp::detail::from_float;

__device__ __forceinline__ float load_dyn(const void* base, DType t, int64_t i) {
  return gatedmlp::detail::load_float(base, static_cast<int>(t), i);
}
__device__ __forceinline__ void store_dyn(void* base, DType t, int64_t i, float v) {
  gatedmlp::detail::store_float(base, static_cast<int>(t), i, v);
}

// N values as 16-byte stores; dst must be 16-byte aligned global memory.
template <int N, typename O>
__device__ __forceinline__ void store_vec(O* dst, const float* v) {
  constexpr int kChunk = 16 / sizeof(O);
  static_assert(N % kChunk == 0, "store_vec writes whole 16-byte chunks");
#pragma unroll
  for (int c = 0; c < N / kChunk; ++c) {
    const float* s = v + c * kChunk;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (sizeof(O) == 2) {
        w[k] = detail::pack2<O>(s[2 * k], s[2 * k + 1]);
      } else {
        w[k] = __float_as_uint(s[k]);
      }
    }
    detail::store_global_16B(dst + c * kChunk, w[0], w[1], w[2], w[3]);
  }
}

template <int N>
__device__ __forceinline__ void store_vec_dyn(void* base, DType t, int64_t i, const float* v) {
  switch (t) {
    case DType::bf16:
      store_vec<N>(static_cast<__nv_bfloat16*>(base) + i, v);
      break;
    case DType::fp16:
      store_vec<N>(static_cast<__half*>(base) + i, v);
      break;
    default:
      store_vec<N>(static_cast<float*>(base) + i, v);
      break;
  }
}

// ---------------------------------------------------------------- GLU kernel

// Bias of the intermediate column `col` of half `half`. Fused bias is in
// weight-row order, which is the intermediate's column order; separate bias
// is two [U] vectors.
__device__ __forceinline__ float bias_at(const GluArgs& a, int64_t bias_off, int64_t col, int half) {
  if (a.separate) {
    return load_dyn(half ? a.bias_up : a.bias, a.bias_dtype, bias_off + col - half * a.u);
  }
  return load_dyn(a.bias, a.bias_dtype, bias_off + col);
}

// One item's intermediate values as loaded, before conversion:
//   contig: lo = g[0..V), hi = u[0..V)
//   pair:   lo, hi = the 2V interleaved columns from 2 j0 on
//   scalar: lo = g, hi = u (V = 1)
template <typename T, int V>
struct GluIn {
  Vec<T, V> lo, hi;
};

// Bias, pre-activation, activation and store of one item of one row. kAct >=
// 0: the activation is fixed at compile time and there is neither bias nor
// pre-activation (see glu_kernel).
template <typename T, typename O, GluMode kMode, int V, int kAct>
__device__ __forceinline__ void glu_finish(const GluArgs& a, int64_t row, int64_t j0, int64_t gcol, int64_t ucol,
                                           int gslot, const GluIn<T, V>& in) {
  // Batch and row within it; most calls have no batch, so skip the division.
  const int64_t b = a.rows == a.m ? 0 : row / a.m;
  const int64_t mi = row - b * a.m;
  O* y = static_cast<O*>(a.y) + b * a.stride_y + mi * a.ldy;

  float g[V], u[V];
  if constexpr (kMode == GluMode::pair) {
    // Selects rather than e[2i + gslot]: a runtime index would put e in local memory.
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const T& e0 = i < V / 2 ? in.lo.v[2 * i] : in.hi.v[2 * i - V];
      const T& e1 = i < V / 2 ? in.lo.v[2 * i + 1] : in.hi.v[2 * i + 1 - V];
      g[i] = to_float(gslot ? e1 : e0);
      u[i] = to_float(gslot ? e0 : e1);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      g[i] = to_float(in.lo.v[i]);
      u[i] = to_float(in.hi.v[i]);
    }
  }

  if constexpr (kAct < 0) {
    const int64_t bias_off = b * a.bias_stride;
    if (a.has_bias) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        if constexpr (kMode == GluMode::pair) {
          g[i] += bias_at(a, bias_off, 2 * (j0 + i) + gslot, 0);
          u[i] += bias_at(a, bias_off, 2 * (j0 + i) + 1 - gslot, 1);
        } else {
          g[i] += bias_at(a, bias_off, gcol + i, 0);
          u[i] += bias_at(a, bias_off, ucol + i, 1);
        }
      }
    }

    // The pre-activation's columns are the intermediate's columns.
    if (a.has_pre) {
      const int64_t pre_off = b * a.stride_pre + mi * a.ldpre;
      if constexpr (kMode == GluMode::pair) {
        float e[2 * V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          e[2 * i] = gslot ? u[i] : g[i];
          e[2 * i + 1] = gslot ? g[i] : u[i];
        }
        store_vec_dyn<2 * V>(a.pre, a.pre_dtype, pre_off + 2 * j0, e);
      } else if constexpr (kMode == GluMode::contig) {
        store_vec_dyn<V>(a.pre, a.pre_dtype, pre_off + gcol, g);
        store_vec_dyn<V>(a.pre, a.pre_dtype, pre_off + ucol, u);
      } else {
        store_dyn(a.pre, a.pre_dtype, pre_off + gcol, g[0]);
        store_dyn(a.pre, a.pre_dtype, pre_off + ucol, u[0]);
      }
    }
  }

  // A constant kAct folds glu's switch away.
  const int act = kAct >= 0 ? kAct : a.act;
  float out[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    out[i] = detail::glu<float>(act, g[i], u[i], a.clamp_alpha, a.clamp_limit);
  }
  if constexpr (kMode == GluMode::scalar) {
    y[j0] = from_float<O>(out[0]);
  } else {
    store_vec<V>(y + j0, out);
  }
}

// Blocks tile the row's items along x and take rows along y (see
// launch_glu_kernel).
//
// kAct >= 0 is the common call, made lean enough to stream near memory
// bandwidth: the activation fixed at compile time, no bias, no
// pre-activation. With everything chosen at run time (kAct < 0: a switch per
// output, bias and pre-activation branches) the same call streams at 2.8
// TB/s instead of 3.9-4.2 on the H200 (docs/notes/unfused-baseline.md, h47): a baseline that slow
// would flatter the fused kernel.
template <typename T, typename O, GluMode kMode, int kAct>
__global__ void __launch_bounds__(kGluThreads) glu_kernel(const GluArgs a) {
  constexpr int V = kMode == GluMode::scalar ? 1 : kGluVec;
  const int64_t two_u = 2 * a.u;
  const int64_t items = a.u / V;
  const int64_t item_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T* inter = static_cast<const T*>(a.inter);

  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += item_step) {
    const int64_t j0 = it * V;
    // Columns of the item's first g and u (contig, scalar), the same in every
    // row; pair mode reads the 2V columns from 2 j0 on.
    int64_t gcol = 0, ucol = 0;
    const int gslot = a.first == 0 ? 0 : 1;  // pair: which of each g/u pair is the gate
    if constexpr (kMode != GluMode::pair) {
      if (a.separate) {
        gcol = j0;
        ucol = a.u + j0;
      } else {
        gcol = detail::fused_row(j0, 0, a.group, a.first);
        ucol = detail::fused_row(j0, 1, a.group, a.first);
      }
    }
    // kGluRowsPerBlock consecutive rows per grid step (see launch_glu_kernel).
    for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * kGluRowsPerBlock; row0 < a.rows;
         row0 += static_cast<int64_t>(gridDim.y) * kGluRowsPerBlock) {
      const int64_t row1 = std::min<int64_t>(row0 + kGluRowsPerBlock, a.rows);
      for (int64_t row = row0; row < row1; ++row) {
        const T* p = inter + row * two_u;
        GluIn<T, V> in;
        in.lo = *reinterpret_cast<const Vec<T, V>*>(p + (kMode == GluMode::pair ? 2 * j0 : gcol));
        in.hi = *reinterpret_cast<const Vec<T, V>*>(p + (kMode == GluMode::pair ? 2 * j0 + V : ucol));
        glu_finish<T, O, kMode, V, kAct>(a, row, j0, gcol, ucol, gslot, in);
      }
    }
  }
}

template <typename T, typename O, GluMode kMode, int kAct>
void launch_glu_kernel(int64_t items, cudaStream_t stream, const GluArgs& a) {
  const int64_t gx = std::min<int64_t>((items + kGluThreads - 1) / kGluThreads, int64_t{1} << 20);
  // A block per kGluRowsPerBlock rows (and x chunk), rows beyond the grid's
  // limit looping: blocks start in order, so the rows in flight stay
  // together and move through memory as a streaming copy's do. A one-wave
  // grid whose blocks step over the rows ran 7-18 % slower
  // (scripts/experiments/probes/glu_bw.cu, h47); a block per row repeated the column
  // arithmetic (a 64-bit division for interleaved layouts) on every row.
  const int64_t gy = std::min<int64_t>((a.rows + kGluRowsPerBlock - 1) / kGluRowsPerBlock, 65535);
  glu_kernel<T, O, kMode, kAct><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kGluThreads, 0, stream>>>(a);
}

// The lean kernels exist for 16-bit outputs in the input's dtype on the
// vector paths; every other call takes the general one.
template <typename T, typename O, GluMode kMode>
void launch_glu_mode(int64_t items, cudaStream_t stream, const GluArgs& a) {
  if constexpr (std::is_same_v<T, O> && kMode != GluMode::scalar) {
    // GATEDMLP_GLU_GENERAL=1: the general kernel on every call, to compare
    // (scripts/experiments/exp-glu.sh; docs/notes/unfused-baseline.md, h47).
    static const bool general = std::getenv("GATEDMLP_GLU_GENERAL") != nullptr;
    if (!a.has_bias && !a.has_pre && !general) {
      switch (a.act) {
        case detail::kSilu:
          return launch_glu_kernel<T, O, kMode, detail::kSilu>(items, stream, a);
        case detail::kGeluTanh:
          return launch_glu_kernel<T, O, kMode, detail::kGeluTanh>(items, stream, a);
        case detail::kGeluErf:
          return launch_glu_kernel<T, O, kMode, detail::kGeluErf>(items, stream, a);
        case detail::kRelu:
          return launch_glu_kernel<T, O, kMode, detail::kRelu>(items, stream, a);
        case detail::kSwigluClamped:
          return launch_glu_kernel<T, O, kMode, detail::kSwigluClamped>(items, stream, a);
        default:
          break;
      }
    }
  }
  launch_glu_kernel<T, O, kMode, -1>(items, stream, a);
}

template <typename T, typename O>
void launch_glu_typed(GluMode mode, int64_t items, cudaStream_t stream, const GluArgs& a) {
  switch (mode) {
    case GluMode::scalar:
      launch_glu_mode<T, O, GluMode::scalar>(items, stream, a);
      break;
    case GluMode::contig:
      launch_glu_mode<T, O, GluMode::contig>(items, stream, a);
      break;
    case GluMode::pair:
      launch_glu_mode<T, O, GluMode::pair>(items, stream, a);
      break;
  }
}

template <typename T>
void launch_glu_in(DType out, GluMode mode, int64_t items, cudaStream_t stream, const GluArgs& a) {
  switch (out) {
    case DType::bf16:
      launch_glu_typed<T, __nv_bfloat16>(mode, items, stream, a);
      break;
    case DType::fp16:
      launch_glu_typed<T, __half>(mode, items, stream, a);
      break;
    case DType::fp32:
      launch_glu_typed<T, float>(mode, items, stream, a);
      break;
    case DType::fp8_e4m3:  // an input dtype only: the unfused baseline's callers never ask for it
      break;
  }
}

}  // namespace

void launch(DType input, DType output, GluMode mode, int64_t items, cudaStream_t stream, const GluArgs& a) {
  if (input == DType::bf16)
    launch_glu_in<__nv_bfloat16>(output, mode, items, stream, a);
  else
    launch_glu_in<__half>(output, mode, items, stream, a);
}

}  // namespace gatedmlp::ref::glu
