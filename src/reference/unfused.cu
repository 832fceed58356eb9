// The unfused baseline: what users run today for the gate/up half of a gated
// MLP. One cuBLASLt GEMM writes g and u for every row into an [L][M, 2U]
// buffer in the input dtype, then a separate elementwise kernel adds the bias,
// applies the activation and writes Y (and, if asked, the pre-activation).
//
// It is the benchmark's baseline and the tests' error yardstick, so it must
// take every problem check_support accepts (any weight layout, strides,
// batch, bias/preact dtypes) and round where a framework would: once after
// the GEMM (to the input dtype) and once on the output.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>

#include "common/device_dtype.cuh"
#include "common/activation_math.hpp"
#include "common/layout_math.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::ref {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kGluThreads = 256;
constexpr int kGluVec = 8;  // outputs per thread on the vector paths: one 16-byte load of g and of u
constexpr int kGluRowsPerBlock = 8;  // consecutive rows a GLU block takes per grid step

// ---------------------------------------------------------------- errors
Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code =
      (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) ? StatusCode::no_device : StatusCode::cuda_error;
  return {code, "Unfused: " + what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

Status cublas_status(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return {StatusCode::library_error,
          "Unfused: " + what + " failed: " + cublasLtGetStatusName(st) + ": " + cublasLtGetStatusString(st)};
}

#define UNFUSED_TRY(expr)                        \
  do {                                           \
    if (Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

std::string shape_str(const Problem& p) {
  return "M=" + std::to_string(p.m) + " K=" + std::to_string(p.k) + " U=" + std::to_string(p.u) +
         " batch=" + std::to_string(p.batch);
}

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
// scalar: one output per thread, any layout, any alignment.
// contig: 8 consecutive outputs whose g (and u) columns are consecutive too,
//         i.e. separate weights or a fused group that is a multiple of 8.
// pair:   group = 1; the 16 intermediate columns of 8 outputs alternate g/u.
enum class GluMode : int { scalar, contig, pair };

struct GluArgs {
  const void* inter;  // [rows][2U], input dtype, dense
  int64_t rows;       // L * M
  int64_t m, u;
  bool separate;
  int64_t group;
  int first;
  int act;
  float clamp_alpha, clamp_limit;
  bool has_bias;
  const void* bias;
  const void* bias_up;
  DType bias_dtype;
  int64_t bias_stride;
  void* y;
  int64_t ldy, stride_y;
  bool has_pre;
  void* pre;
  int64_t ldpre, stride_pre;
  DType pre_dtype;
};

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
// TB/s instead of 3.9-4.2 on the H200 (NOTES.md, h47): a baseline that slow
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
  // (scripts/probes/glu_bw.cu, h47); a block per row repeated the column
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
    // (scripts/exp-glu.sh; NOTES.md, h47).
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
  }
}

// ---------------------------------------------------------------- host helpers
// Largest power of two (<= 256) dividing every address and step in `bits`.
uint32_t alignment_of(uintptr_t bits) {
  uint32_t a = 1;
  while (a < 256 && (bits & a) == 0) a <<= 1;
  return a;
}

bool aligned16(const void* p, int64_t ld_bytes, int64_t stride_bytes, bool batched) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld_bytes % 16 == 0 && (!batched || stride_bytes % 16 == 0);
}

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::fp16; }
bool is_float_dtype(DType t) { return is_16bit(t) || t == DType::fp32; }

Status check_pointer(const void* p, const char* name, size_t elem) {
  if (p == nullptr) {
    return {StatusCode::invalid_argument, std::string("Unfused: args.") + name + " is null"};
  }
  if (reinterpret_cast<uintptr_t>(p) % elem != 0) {
    return {StatusCode::invalid_argument,
            std::string("Unfused: args.") + name + " is not aligned to its " + std::to_string(elem) + "-byte element"};
  }
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // the query's failure is not sticky; do not leak it to later checks
    return cuda_status(err, std::string("cudaPointerGetAttributes(args.") + name + ")");
  }
  if (attr.type == cudaMemoryTypeUnregistered) {
    return {StatusCode::invalid_argument,
            std::string("Unfused: args.") + name + " is host memory the device cannot access"};
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- implementation
class UnfusedImpl final : public Unfused {
 public:
  UnfusedImpl() = default;
  UnfusedImpl(const UnfusedImpl&) = delete;
  UnfusedImpl& operator=(const UnfusedImpl&) = delete;
  ~UnfusedImpl() override;

  Status init(const Problem& problem);
  size_t intermediate_bytes() const override { return inter_bytes_; }
  Status run(const Arguments& args, cudaStream_t stream) override;
  Status run_gemm_only(const Arguments& args, cudaStream_t stream) override;
  Status run_glu_only(const Arguments& args, cudaStream_t stream) override;

 private:
  struct Algo {
    uint32_t min_alignment = 0;
    bool found = false;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
  };

  Status check_args(const Arguments& args, bool need_outputs) const;
  Status gemm(const Arguments& args, cudaStream_t stream);
  Status glu(const Arguments& args, cudaStream_t stream);
  Status find_algo(Algo* algo);

  Problem p_;
  bool separate_ = false;
  size_t esz_ = 2;
  int64_t n_out_ = 0;   // GEMM output columns per call: 2U fused, U per separate tensor
  bool empty_ = false;  // nothing to compute (L, M or U is 0)

  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  // The heuristic's choice for 256-byte-aligned operands (the common case)
  // and for progressively weaker alignments (slices, odd strides).
  Algo algos_[3];

  void* inter_ = nullptr;
  size_t inter_bytes_ = 0;
  void* workspace_ = nullptr;
};

UnfusedImpl::~UnfusedImpl() {
  // Errors here cannot be reported; a destructor must not throw.
  if (workspace_) (void)cudaFree(workspace_);
  if (inter_) (void)cudaFree(inter_);
  if (a_layout_) (void)cublasLtMatrixLayoutDestroy(a_layout_);
  if (b_layout_) (void)cublasLtMatrixLayoutDestroy(b_layout_);
  if (c_layout_) (void)cublasLtMatrixLayoutDestroy(c_layout_);
  if (desc_) (void)cublasLtMatmulDescDestroy(desc_);
  if (lt_) (void)cublasLtDestroy(lt_);
}

Status UnfusedImpl::find_algo(Algo* algo) {
  cublasLtMatmulPreference_t pref = nullptr;
  UNFUSED_TRY(cublas_status(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al = algo->min_alignment;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (auto attr : align_attrs) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_layout_, b_layout_, c_layout_, c_layout_, pref, 1, &result,
                                        &count);
  }
  (void)cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED means no algorithm for this alignment: not an error here,
  // the caller falls back to a weaker alignment.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && count == 0)) {
    algo->found = false;
    return Status::Ok();
  }
  UNFUSED_TRY(cublas_status(
      st, "cublasLtMatmulAlgoGetHeuristic (" + shape_str(p_) + ", alignment " + std::to_string(al) + " bytes)"));
  if (result.state != CUBLAS_STATUS_SUCCESS) {
    algo->found = false;
    return Status::Ok();
  }
  algo->found = true;
  algo->algo = result.algo;
  algo->workspace = result.workspaceSize;
  return Status::Ok();
}

Status UnfusedImpl::init(const Problem& problem) {
  if (Status s = check_support(problem); !s.ok()) {
    return {s.code(), "Unfused::create: problem rejected by check_support: " + s.message()};
  }
  if (!is_16bit(problem.input_dtype)) {
    return {StatusCode::not_supported,
            std::string("Unfused::create: input dtype must be bf16 or fp16, got ") + to_string(problem.input_dtype)};
  }
  if (!is_float_dtype(problem.output_dtype) || (problem.has_bias && !is_float_dtype(problem.bias_dtype)) ||
      (problem.has_preact && !is_float_dtype(problem.preact_dtype))) {
    return {StatusCode::invalid_argument,
            "Unfused::create: output, bias and preact dtypes must be "
            "bf16, fp16 or fp32"};
  }
  p_ = problem.resolved();
  separate_ = p_.weights.format == WeightFormat::separate;
  esz_ = dtype_size(p_.input_dtype);
  n_out_ = separate_ ? p_.u : 2 * p_.u;
  if (!separate_ && p_.weights.group <= 0) {
    return {StatusCode::invalid_argument,
            "Unfused::create: resolved weight group must be > 0, got " + std::to_string(p_.weights.group)};
  }
  empty_ = p_.batch == 0 || p_.m == 0 || p_.u == 0;
  if (empty_) return Status::Ok();

  inter_bytes_ = static_cast<size_t>(p_.batch) * static_cast<size_t>(p_.m) * static_cast<size_t>(2 * p_.u) * esz_;
  UNFUSED_TRY(cuda_status(
      cudaMalloc(&inter_, inter_bytes_),
      "cudaMalloc of the [L][M, 2U] intermediate (" + std::to_string(inter_bytes_) + " bytes, " + shape_str(p_) + ")"));

  if (p_.k == 0) return Status::Ok();  // the GEMM is a memset of zeros; no cuBLAS needed

  UNFUSED_TRY(cuda_status(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc of the cuBLASLt workspace"));
  UNFUSED_TRY(cublas_status(cublasLtCreate(&lt_), "cublasLtCreate"));

  // cuBLASLt is column-major. Computing C^T = W * X^T, with C^T a column-major
  // [n_out, M] (ld 2U), writes C as the row-major [M, 2U] intermediate; X
  // row-major [M, ldx] is already X^T column-major, and W is read in its
  // stored order (transposed when rows are K-contiguous).
  const cudaDataType_t dt = p_.input_dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  UNFUSED_TRY(
      cublas_status(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  const bool out_in = p_.weights.storage == WeightStorage::out_in;
  const cublasOperation_t op_a = out_in ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  UNFUSED_TRY(cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
                            "cublasLtMatmulDescSetAttribute(TRANSA)"));
  UNFUSED_TRY(cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                            "cublasLtMatmulDescSetAttribute(TRANSB)"));

  const uint64_t k = static_cast<uint64_t>(p_.k), n = static_cast<uint64_t>(n_out_), m = static_cast<uint64_t>(p_.m);
  UNFUSED_TRY(cublas_status(out_in ? cublasLtMatrixLayoutCreate(&a_layout_, dt, k, n, p_.weights.ld)
                                   : cublasLtMatrixLayoutCreate(&a_layout_, dt, n, k, p_.weights.ld),
                            "cublasLtMatrixLayoutCreate(W, ld " + std::to_string(p_.weights.ld) + ")"));
  UNFUSED_TRY(cublas_status(cublasLtMatrixLayoutCreate(&b_layout_, dt, k, m, p_.ldx),
                            "cublasLtMatrixLayoutCreate(X, ldx " + std::to_string(p_.ldx) + ")"));
  UNFUSED_TRY(cublas_status(cublasLtMatrixLayoutCreate(&c_layout_, dt, n, m, 2 * p_.u),
                            "cublasLtMatrixLayoutCreate(intermediate)"));

  algos_[0].min_alignment = 256;
  algos_[1].min_alignment = 16;
  algos_[2].min_alignment = static_cast<uint32_t>(esz_);
  bool any = false;
  for (Algo& a : algos_) {
    UNFUSED_TRY(find_algo(&a));
    any = any || a.found;
  }
  if (!any) {
    return {StatusCode::not_supported, "Unfused::create: cuBLASLt has no algorithm for " + shape_str(p_) + " (" +
                                           to_string(p_.input_dtype) + ", W " + to_string(p_.weights) + ")"};
  }
  return Status::Ok();
}

Status UnfusedImpl::check_args(const Arguments& a, bool need_outputs) const {
  UNFUSED_TRY(check_pointer(a.x, "x", esz_));
  UNFUSED_TRY(check_pointer(a.w, "w", esz_));
  if (separate_) UNFUSED_TRY(check_pointer(a.w_up, "w_up", esz_));
  if (!need_outputs) return Status::Ok();
  if (p_.has_bias) {
    const size_t bsz = dtype_size(p_.bias_dtype);
    UNFUSED_TRY(check_pointer(a.bias, "bias", bsz));
    if (separate_) UNFUSED_TRY(check_pointer(a.bias_up, "bias_up", bsz));
  }
  UNFUSED_TRY(check_pointer(a.y, "y", dtype_size(p_.output_dtype)));
  if (p_.has_preact) UNFUSED_TRY(check_pointer(a.preact, "preact", dtype_size(p_.preact_dtype)));
  return Status::Ok();
}

Status UnfusedImpl::gemm(const Arguments& args, cudaStream_t stream) {
  if (p_.k == 0) {
    return cuda_status(cudaMemsetAsync(inter_, 0, inter_bytes_, stream), "cudaMemsetAsync(intermediate)");
  }
  const bool batched = p_.batch > 1;
  const int64_t inter_batch = p_.m * 2 * p_.u;

  // The algorithm must tolerate the weakest alignment of any operand in any call.
  uintptr_t a_bits = reinterpret_cast<uintptr_t>(args.w);
  if (separate_) a_bits |= reinterpret_cast<uintptr_t>(args.w_up);
  if (batched) a_bits |= static_cast<uintptr_t>(p_.batch_stride_w) * esz_;
  uintptr_t b_bits = reinterpret_cast<uintptr_t>(args.x);
  if (batched) b_bits |= static_cast<uintptr_t>(p_.batch_stride_x) * esz_;
  uintptr_t c_bits = reinterpret_cast<uintptr_t>(inter_);
  if (separate_) c_bits |= static_cast<uintptr_t>(p_.u) * esz_;
  if (batched) c_bits |= static_cast<uintptr_t>(inter_batch) * esz_;
  const uint32_t align = alignment_of(a_bits | b_bits | c_bits);

  const Algo* algo = nullptr;
  for (const Algo& a : algos_) {
    if (a.found && a.min_alignment <= align) {
      algo = &a;
      break;
    }
  }
  if (algo == nullptr) {
    return {StatusCode::not_supported, "Unfused::run: cuBLASLt has no algorithm for operands aligned to " +
                                           std::to_string(align) + " bytes (" + shape_str(p_) + ")"};
  }

  const float alpha = p_.alpha;
  const float beta = 0.0f;
  const auto* x = static_cast<const char*>(args.x);
  const auto* w = static_cast<const char*>(args.w);
  const auto* w_up = static_cast<const char*>(args.w_up);
  char* c = static_cast<char*>(inter_);
  const int nparts = separate_ ? 2 : 1;
  for (int64_t b = 0; b < p_.batch; ++b) {
    for (int part = 0; part < nparts; ++part) {
      const char* wp = (part == 0 ? w : w_up) + static_cast<size_t>(b * p_.batch_stride_w) * esz_;
      const char* xp = x + static_cast<size_t>(b * p_.batch_stride_x) * esz_;
      char* cp = c + static_cast<size_t>(b * inter_batch + part * p_.u) * esz_;
      const cublasStatus_t st = cublasLtMatmul(lt_, desc_, &alpha, wp, a_layout_, xp, b_layout_, &beta, cp, c_layout_,
                                               cp, c_layout_, &algo->algo, workspace_, kWorkspaceBytes, stream);
      if (st != CUBLAS_STATUS_SUCCESS) {
        return cublas_status(st, "cublasLtMatmul (" + shape_str(p_) + ", batch " + std::to_string(b) +
                                     (separate_ ? (part == 0 ? ", gate" : ", up") : "") + ")");
      }
    }
  }
  return Status::Ok();
}

Status UnfusedImpl::glu(const Arguments& args, cudaStream_t stream) {
  GluArgs a{};
  a.inter = inter_;
  a.rows = p_.batch * p_.m;
  a.m = p_.m;
  a.u = p_.u;
  a.separate = separate_;
  a.group = separate_ ? p_.u : p_.weights.group;
  a.first = p_.weights.first == Half::gate ? 0 : 1;
  a.act = static_cast<int>(p_.activation);
  a.clamp_alpha = p_.act_params.clamp_alpha;
  a.clamp_limit = p_.act_params.clamp_limit;
  a.has_bias = p_.has_bias;
  a.bias = args.bias;
  a.bias_up = args.bias_up;
  a.bias_dtype = p_.bias_dtype;
  a.bias_stride = p_.batch > 1 ? p_.batch_stride_bias : 0;
  a.y = args.y;
  a.ldy = p_.ldy;
  a.stride_y = p_.batch_stride_y;
  a.has_pre = p_.has_preact;
  a.pre = args.preact;
  a.ldpre = p_.ldpre;
  a.stride_pre = p_.batch_stride_preact;
  a.pre_dtype = p_.preact_dtype;

  const bool batched = p_.batch > 1;
  GluMode mode = GluMode::scalar;
  if (p_.u % kGluVec == 0) {
    if (separate_ || a.group % kGluVec == 0)
      mode = GluMode::contig;
    else if (a.group == 1)
      mode = GluMode::pair;
  }
  if (mode != GluMode::scalar) {
    const int64_t osz = static_cast<int64_t>(dtype_size(p_.output_dtype));
    bool ok = aligned16(a.y, a.ldy * osz, a.stride_y * osz, batched);
    if (p_.has_preact) {
      const int64_t psz = static_cast<int64_t>(dtype_size(p_.preact_dtype));
      ok = ok && aligned16(a.pre, a.ldpre * psz, a.stride_pre * psz, batched);
    }
    if (!ok) mode = GluMode::scalar;
  }

  const int64_t items = mode == GluMode::scalar ? p_.u : p_.u / kGluVec;
  if (p_.input_dtype == DType::bf16) {
    launch_glu_in<__nv_bfloat16>(p_.output_dtype, mode, items, stream, a);
  } else {
    launch_glu_in<__half>(p_.output_dtype, mode, items, stream, a);
  }
  return cuda_status(cudaGetLastError(), "GLU kernel launch (" + shape_str(p_) + ")");
}

Status UnfusedImpl::run(const Arguments& args, cudaStream_t stream) {
  if (empty_) return Status::Ok();
  UNFUSED_TRY(check_args(args, true));
  UNFUSED_TRY(gemm(args, stream));
  return glu(args, stream);
}

Status UnfusedImpl::run_gemm_only(const Arguments& args, cudaStream_t stream) {
  if (empty_) return Status::Ok();
  UNFUSED_TRY(check_args(args, false));
  return gemm(args, stream);
}

Status UnfusedImpl::run_glu_only(const Arguments& args, cudaStream_t stream) {
  if (empty_) return Status::Ok();
  UNFUSED_TRY(check_args(args, true));
  return glu(args, stream);
}

}  // namespace

Status Unfused::create(const Problem& p, std::unique_ptr<Unfused>* out) {
  if (out == nullptr) return {StatusCode::invalid_argument, "Unfused::create: out is null"};
  out->reset();
  auto impl = std::make_unique<UnfusedImpl>();
  if (Status s = impl->init(p); !s.ok()) return s;
  *out = std::move(impl);
  return Status::Ok();
}

}  // namespace gatedmlp::ref
