// The unfused baseline: what users run today for the gate/up half of a gated
// MLP. One cuBLASLt GEMM writes g and u for every row into an [L][M, 2U]
// buffer in the input dtype, then a separate elementwise kernel (glu_kernel.cu)
// adds the bias, applies the activation and writes Y (and, if asked, the
// pre-activation).
//
// It is the benchmark's baseline and the tests' error yardstick, so it must
// take every problem check_support accepts (any weight layout, strides,
// batch, bias/preact dtypes) and round where a framework would: once after
// the GEMM (to the input dtype) and once on the output.
//
// The GEMM's algorithm is the cuBLASLt heuristic's first choice unless
// create() is asked to autotune (Unfused::Options): the benchmark does, so
// that its baseline is the fastest of the heuristic's first few algorithms
// and of cublasGemmEx (what torch.mm calls), timed on the benchmark's own
// operands. The tests keep the heuristic's choice: creating is then cheap.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/activation_math.hpp"
#include "common/layout_math.hpp"
#include "reference/glu_kernel.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::ref {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
using glu::GluArgs;
using glu::GluMode;
constexpr int kGluVec = glu::kVec;

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
// A cuBLAS algorithm for one call of the GEMM: a cuBLASLt algorithm, or
// cublasGemmEx (cuBLAS picks inside, as it does for torch.mm).
struct Plan {
  uint32_t min_alignment = 0;  // operands of every call must be aligned to this many bytes
  bool found = false;
  bool gemm_ex = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // what the algorithm asked for (cuBLASLt); the buffer passed is kWorkspaceBytes
};

// "algo 66, tile 20, stages 27, split-k 1, swizzle 0, cluster 0" (cuBLASLt's
// enum values): enough to tell two candidates apart in a report and to look
// them up in cublasLt.h.
std::string describe_algo(const cublasLtMatmulAlgo_t& a) {
  int32_t id = -1, splitk = 1;
  uint32_t tile = 0, stages = 0, swizzle = 0, reduction = 0;
  uint16_t cluster = 0;
  size_t written = 0;
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction),
                                             &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle),
                                             &written);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                             &written);
  std::string s = "algo " + std::to_string(id) + ", tile " + std::to_string(tile) + ", stages " +
                  std::to_string(stages) + ", split-k " + std::to_string(splitk);
  if (splitk > 1) s += " (reduction " + std::to_string(reduction) + ")";
  return s + ", swizzle " + std::to_string(swizzle) + ", cluster " + std::to_string(cluster);
}

// Milliseconds, or microseconds below 0.1 ms (where "0.0086 ms" would hide
// the differences between candidates).
std::string ms_str(double ms) {
  char buf[32];
  if (ms < 0.1) {
    std::snprintf(buf, sizeof(buf), "%.2f us", ms * 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4f ms", ms);
  }
  return buf;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The autotune's CUDA objects, released on every way out.
struct TuneScratch {
  cudaStream_t stream = nullptr;
  std::vector<cudaGraphExec_t> execs;
  std::vector<cudaEvent_t> events;
  ~TuneScratch() {
    for (cudaEvent_t e : events)
      if (e) (void)cudaEventDestroy(e);
    for (cudaGraphExec_t g : execs)
      if (g) (void)cudaGraphExecDestroy(g);
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

class UnfusedImpl final : public Unfused {
 public:
  UnfusedImpl() = default;
  UnfusedImpl(const UnfusedImpl&) = delete;
  UnfusedImpl& operator=(const UnfusedImpl&) = delete;
  ~UnfusedImpl() override;

  Status init(const Problem& problem, const Options& options);
  size_t intermediate_bytes() const override { return inter_bytes_; }
  Status run(const Arguments& args, cudaStream_t stream) override;
  Status run_gemm_only(const Arguments& args, cudaStream_t stream) override;
  Status run_glu_only(const Arguments& args, cudaStream_t stream) override;
  const GemmChoice& gemm_choice() const override { return choice_; }

 private:
  Status check_args(const Arguments& args, bool need_outputs) const;
  uint32_t operand_alignment(const Arguments& args) const;
  Status gemm(const Arguments& args, cudaStream_t stream);
  Status gemm_with(const Plan& plan, const Arguments& args, cudaStream_t stream);
  Status glu(const Arguments& args, cudaStream_t stream);
  Status heuristic(uint32_t min_alignment, int count, std::vector<cublasLtMatmulHeuristicResult_t>* out);
  Status autotune(const Options& options);
  bool gemm_ex_fits() const;
  Status sample_intermediate(const Plan& plan, const Arguments& args, cudaStream_t stream, std::vector<double>* out);

  Problem p_;
  bool separate_ = false;
  size_t esz_ = 2;
  int64_t n_out_ = 0;   // GEMM output columns per call: 2U fused, U per separate tensor
  bool empty_ = false;  // nothing to compute (L, M or U is 0)
  cudaDataType_t dt_ = CUDA_R_16BF;
  cublasOperation_t op_a_ = CUBLAS_OP_T;

  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // only when the autotune tries cublasGemmEx
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  // The algorithm for 256-byte-aligned operands (the common case) and for
  // progressively weaker alignments (slices, odd strides): the heuristic's
  // first choice, or for the tuned class the autotune's winner.
  Plan plans_[3];
  GemmChoice choice_;

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
  if (blas_) (void)cublasDestroy(blas_);
  if (lt_) (void)cublasLtDestroy(lt_);
}

// The heuristic's first `count` algorithms for operands aligned to
// `min_alignment` bytes, best first; empty when it has none for that
// alignment (not an error: the caller falls back to a weaker alignment).
Status UnfusedImpl::heuristic(uint32_t min_alignment, int count,
                              std::vector<cublasLtMatmulHeuristicResult_t>* out) {
  out->clear();
  cublasLtMatmulPreference_t pref = nullptr;
  UNFUSED_TRY(cublas_status(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  // 32 MiB: what PyTorch gives cuBLAS on Hopper (CUBLAS_WORKSPACE_CONFIG's default there).
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al = min_alignment;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (auto attr : align_attrs) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(count, 1)));
  int got = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_layout_, b_layout_, c_layout_, c_layout_, pref,
                                        static_cast<int>(results.size()), results.data(), &got);
  }
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && got == 0)) return Status::Ok();
  UNFUSED_TRY(cublas_status(
      st, "cublasLtMatmulAlgoGetHeuristic (" + shape_str(p_) + ", alignment " + std::to_string(al) + " bytes)"));
  for (int i = 0; i < got && i < static_cast<int>(results.size()); ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) out->push_back(results[i]);
  }
  return Status::Ok();
}

Status UnfusedImpl::init(const Problem& problem, const Options& options) {
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
  if (options.autotune && options.candidates < 1) {
    return {StatusCode::invalid_argument,
            "Unfused::create: Options::candidates must be >= 1, got " + std::to_string(options.candidates)};
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
  if (empty_) {
    choice_.summary = "none (nothing to compute)";
    return Status::Ok();
  }

  inter_bytes_ = static_cast<size_t>(p_.batch) * static_cast<size_t>(p_.m) * static_cast<size_t>(2 * p_.u) * esz_;
  UNFUSED_TRY(cuda_status(
      cudaMalloc(&inter_, inter_bytes_),
      "cudaMalloc of the [L][M, 2U] intermediate (" + std::to_string(inter_bytes_) + " bytes, " + shape_str(p_) + ")"));

  if (p_.k == 0) {  // the GEMM is a memset of zeros; no cuBLAS needed
    choice_.summary = "cudaMemsetAsync (K = 0)";
    return Status::Ok();
  }

  UNFUSED_TRY(cuda_status(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc of the cuBLASLt workspace"));
  UNFUSED_TRY(cublas_status(cublasLtCreate(&lt_), "cublasLtCreate"));

  // cuBLASLt is column-major. Computing C^T = W * X^T, with C^T a column-major
  // [n_out, M] (ld 2U), writes C as the row-major [M, 2U] intermediate; X
  // row-major [M, ldx] is already X^T column-major, and W is read in its
  // stored order (transposed when rows are K-contiguous). This is the operand
  // order torch.mm(X, W.t()) hands cuBLAS.
  dt_ = p_.input_dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  UNFUSED_TRY(
      cublas_status(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  const bool out_in = p_.weights.storage == WeightStorage::out_in;
  op_a_ = out_in ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  UNFUSED_TRY(cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a_, sizeof(op_a_)),
                            "cublasLtMatmulDescSetAttribute(TRANSA)"));
  UNFUSED_TRY(cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                            "cublasLtMatmulDescSetAttribute(TRANSB)"));

  const uint64_t k = static_cast<uint64_t>(p_.k), n = static_cast<uint64_t>(n_out_), m = static_cast<uint64_t>(p_.m);
  UNFUSED_TRY(cublas_status(out_in ? cublasLtMatrixLayoutCreate(&a_layout_, dt_, k, n, p_.weights.ld)
                                   : cublasLtMatrixLayoutCreate(&a_layout_, dt_, n, k, p_.weights.ld),
                            "cublasLtMatrixLayoutCreate(W, ld " + std::to_string(p_.weights.ld) + ")"));
  UNFUSED_TRY(cublas_status(cublasLtMatrixLayoutCreate(&b_layout_, dt_, k, m, p_.ldx),
                            "cublasLtMatrixLayoutCreate(X, ldx " + std::to_string(p_.ldx) + ")"));
  UNFUSED_TRY(cublas_status(cublasLtMatrixLayoutCreate(&c_layout_, dt_, n, m, 2 * p_.u),
                            "cublasLtMatrixLayoutCreate(intermediate)"));

  plans_[0].min_alignment = 256;
  plans_[1].min_alignment = 16;
  plans_[2].min_alignment = static_cast<uint32_t>(esz_);
  bool any = false;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  for (Plan& pl : plans_) {
    UNFUSED_TRY(heuristic(pl.min_alignment, 1, &results));
    pl.found = !results.empty();
    if (pl.found) {
      pl.algo = results[0].algo;
      pl.workspace = results[0].workspaceSize;
    }
    any = any || pl.found;
  }
  if (!any) {
    return {StatusCode::not_supported, "Unfused::create: cuBLASLt has no algorithm for " + shape_str(p_) + " (" +
                                           to_string(p_.input_dtype) + ", W " + to_string(p_.weights) + ")"};
  }
  for (const Plan& pl : plans_) {
    if (!pl.found) continue;
    GemmCandidate c;
    c.name = "cublasLt heuristic #1 (" + describe_algo(pl.algo) + ")";
    c.heuristic_rank = 1;
    c.workspace = pl.workspace;
    c.note = "not timed";
    choice_.alignment = pl.min_alignment;
    choice_.candidates.push_back(c);
    choice_.summary = c.name + ", not timed (for operands aligned to " + std::to_string(pl.min_alignment) + " bytes)";
    break;
  }
  choice_.method = "the heuristic's first choice per alignment class";
  if (options.autotune) return autotune(options);
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

// The weakest alignment (bytes, a power of two up to 256) of any GEMM operand
// in any call these arguments make: the algorithm must tolerate it.
uint32_t UnfusedImpl::operand_alignment(const Arguments& args) const {
  const bool batched = p_.batch > 1;
  const int64_t inter_batch = p_.m * 2 * p_.u;
  uintptr_t a_bits = reinterpret_cast<uintptr_t>(args.w);
  if (separate_) a_bits |= reinterpret_cast<uintptr_t>(args.w_up);
  if (batched) a_bits |= static_cast<uintptr_t>(p_.batch_stride_w) * esz_;
  uintptr_t b_bits = reinterpret_cast<uintptr_t>(args.x);
  if (batched) b_bits |= static_cast<uintptr_t>(p_.batch_stride_x) * esz_;
  uintptr_t c_bits = reinterpret_cast<uintptr_t>(inter_);
  if (separate_) c_bits |= static_cast<uintptr_t>(p_.u) * esz_;
  if (batched) c_bits |= static_cast<uintptr_t>(inter_batch) * esz_;
  return alignment_of(a_bits | b_bits | c_bits);
}

Status UnfusedImpl::gemm(const Arguments& args, cudaStream_t stream) {
  if (p_.k == 0) {
    return cuda_status(cudaMemsetAsync(inter_, 0, inter_bytes_, stream), "cudaMemsetAsync(intermediate)");
  }
  const uint32_t align = operand_alignment(args);
  for (const Plan& pl : plans_) {
    if (pl.found && pl.min_alignment <= align) return gemm_with(pl, args, stream);
  }
  return {StatusCode::not_supported, "Unfused::run: cuBLASLt has no algorithm for operands aligned to " +
                                         std::to_string(align) + " bytes (" + shape_str(p_) + ")"};
}

// cublasGemmEx takes 32-bit sizes (the call torch.mm makes); larger problems
// leave it out of the autotune.
bool UnfusedImpl::gemm_ex_fits() const {
  const int64_t lim = std::numeric_limits<int>::max();
  return n_out_ <= lim && p_.m <= lim && p_.k <= lim && p_.weights.ld <= lim && p_.ldx <= lim && 2 * p_.u <= lim;
}

Status UnfusedImpl::gemm_with(const Plan& plan, const Arguments& args, cudaStream_t stream) {
  const int64_t inter_batch = p_.m * 2 * p_.u;
  const float alpha = p_.alpha;
  const float beta = 0.0f;
  const auto* x = static_cast<const char*>(args.x);
  const auto* w = static_cast<const char*>(args.w);
  const auto* w_up = static_cast<const char*>(args.w_up);
  char* c = static_cast<char*>(inter_);
  const int nparts = separate_ ? 2 : 1;
  if (plan.gemm_ex) {
    // cublasSetStream resets the handle's workspace to cuBLAS's default pool,
    // so the workspace is set after it, on every call (as PyTorch does).
    UNFUSED_TRY(cublas_status(cublasSetStream(blas_, stream), "cublasSetStream"));
    UNFUSED_TRY(cublas_status(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes), "cublasSetWorkspace"));
  }
  for (int64_t b = 0; b < p_.batch; ++b) {
    for (int part = 0; part < nparts; ++part) {
      const char* wp = (part == 0 ? w : w_up) + static_cast<size_t>(b * p_.batch_stride_w) * esz_;
      const char* xp = x + static_cast<size_t>(b * p_.batch_stride_x) * esz_;
      char* cp = c + static_cast<size_t>(b * inter_batch + part * p_.u) * esz_;
      cublasStatus_t st;
      if (plan.gemm_ex) {
        st = cublasGemmEx(blas_, op_a_, CUBLAS_OP_N, static_cast<int>(n_out_), static_cast<int>(p_.m),
                          static_cast<int>(p_.k), &alpha, wp, dt_, static_cast<int>(p_.weights.ld), xp, dt_,
                          static_cast<int>(p_.ldx), &beta, cp, dt_, static_cast<int>(2 * p_.u), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
      } else {
        st = cublasLtMatmul(lt_, desc_, &alpha, wp, a_layout_, xp, b_layout_, &beta, cp, c_layout_, cp, c_layout_,
                            &plan.algo, workspace_, kWorkspaceBytes, stream);
      }
      if (st != CUBLAS_STATUS_SUCCESS) {
        return cublas_status(st, std::string(plan.gemm_ex ? "cublasGemmEx" : "cublasLtMatmul") + " (" +
                                     shape_str(p_) + ", batch " + std::to_string(b) +
                                     (separate_ ? (part == 0 ? ", gate" : ", up") : "") + ")");
      }
    }
  }
  return Status::Ok();
}

// Rows 0 and M - 1 of batch 0's intermediate after one GEMM with `plan`, as
// double: the autotune's check that a winner computes what the heuristic's
// first choice does.
Status UnfusedImpl::sample_intermediate(const Plan& plan, const Arguments& args, cudaStream_t stream,
                                        std::vector<double>* out) {
  UNFUSED_TRY(gemm_with(plan, args, stream));
  const size_t row_elems = static_cast<size_t>(2 * p_.u);
  std::vector<unsigned char> raw(2 * row_elems * esz_);
  const char* base = static_cast<const char*>(inter_);
  UNFUSED_TRY(cuda_status(cudaMemcpyAsync(raw.data(), base, row_elems * esz_, cudaMemcpyDeviceToHost, stream),
                          "cudaMemcpyAsync(intermediate row)"));
  UNFUSED_TRY(cuda_status(cudaMemcpyAsync(raw.data() + row_elems * esz_,
                                          base + static_cast<size_t>(p_.m - 1) * row_elems * esz_, row_elems * esz_,
                                          cudaMemcpyDeviceToHost, stream),
                          "cudaMemcpyAsync(intermediate row)"));
  UNFUSED_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(intermediate rows)"));
  out->resize(2 * row_elems);
  for (size_t i = 0; i < out->size(); ++i) (*out)[i] = load_as_double(raw.data(), p_.input_dtype, int64_t(i));
  return Status::Ok();
}

// Times the candidates on the caller's operands and keeps the fastest for the
// alignment class those operands fall in (the other classes keep the
// heuristic's first choice). Each candidate runs R calls back to back in a
// CUDA graph, rotating over the operand sets; the graphs are replayed in
// interleaved rounds (A B C A B C ...) so clock drift hits all alike, and
// each candidate's time is its median replay over R. Graphs, because a
// GEMM of a few microseconds timed by eager launches measures the host's
// launch rate, not the GPU.
Status UnfusedImpl::autotune(const Options& o) {
  constexpr double kReplayMs = 1.0;  // a replay of the fastest candidate lasts about this long
  constexpr int64_t kMaxCalls = 64;  // calls per graph, at most (before rounding to the operand sets)
  constexpr int kMinRounds = 3, kMaxRounds = 50;
  constexpr double kCheckRel = 1e-2;  // a winner's rows against heuristic #1's: rounding differs, values must not

  if (o.tune_args.empty()) {
    return {StatusCode::invalid_argument,
            "Unfused::create: Options::autotune needs the operands to time on (Options::tune_args is empty)"};
  }
  uint32_t align = 256;
  for (const Arguments& a : o.tune_args) {
    UNFUSED_TRY(check_args(a, false));
    align = std::min(align, operand_alignment(a));
  }
  int cls = -1;
  for (int i = 0; i < 3; ++i) {
    if (plans_[i].found && plans_[i].min_alignment <= align) {
      cls = i;
      break;
    }
  }
  if (cls < 0) {
    return {StatusCode::not_supported, "Unfused::create: cuBLASLt has no algorithm for the tuning operands, aligned to " +
                                           std::to_string(align) + " bytes (" + shape_str(p_) + ")"};
  }
  const uint32_t cls_align = plans_[cls].min_alignment;

  // The candidates: the heuristic's first o.candidates algorithms, then cublasGemmEx.
  std::vector<Plan> plans;
  std::vector<GemmCandidate> cands;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  UNFUSED_TRY(heuristic(cls_align, o.candidates, &results));
  if (results.empty()) {  // the class was found with one asked for; keep that one
    cublasLtMatmulHeuristicResult_t r{};
    r.algo = plans_[cls].algo;
    r.workspaceSize = plans_[cls].workspace;
    results.push_back(r);
  }
  for (size_t i = 0; i < results.size(); ++i) {
    Plan pl;
    pl.min_alignment = cls_align;
    pl.found = true;
    pl.algo = results[i].algo;
    pl.workspace = results[i].workspaceSize;
    plans.push_back(pl);
    GemmCandidate c;
    c.heuristic_rank = static_cast<int>(i) + 1;
    c.name = "cublasLt heuristic #" + std::to_string(i + 1) + " (" + describe_algo(pl.algo) + ")";
    c.workspace = pl.workspace;
    cands.push_back(c);
  }
  {
    Plan pl;
    pl.min_alignment = cls_align;
    pl.gemm_ex = true;
    GemmCandidate c;
    c.name = "cublasGemmEx (the call torch.mm makes)";
    c.workspace = kWorkspaceBytes;
    if (!gemm_ex_fits()) {
      c.note = "not timed: a size exceeds cublasGemmEx's 32-bit int";
    } else if (const cublasStatus_t st = blas_ ? CUBLAS_STATUS_SUCCESS : cublasCreate(&blas_);
               st != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      c.note = std::string("not timed: cublasCreate failed: ") + cublasGetStatusName(st);
    } else {
      pl.found = true;
    }
    plans.push_back(pl);
    cands.push_back(c);
  }
  const size_t n = plans.size();
  const size_t nsets = o.tune_args.size();
  const auto& sets = o.tune_args;

  TuneScratch t;
  // The operands may have been filled on another stream.
  UNFUSED_TRY(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the autotune)"));
  UNFUSED_TRY(cuda_status(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking), "cudaStreamCreate (autotune)"));
  auto new_event = [&](cudaEvent_t* e) {
    *e = nullptr;
    const cudaError_t err = cudaEventCreate(e);
    if (err == cudaSuccess) t.events.push_back(*e);
    return cuda_status(err, "cudaEventCreate (autotune)");
  };
  auto elapsed_ms = [](cudaEvent_t a, cudaEvent_t b, double* ms) {
    float f = 0;
    const cudaError_t err = cudaEventElapsedTime(&f, a, b);
    *ms = f;
    return cuda_status(err, "cudaEventElapsedTime (autotune)");
  };

  // A warm call each (first-call costs; a candidate cuBLAS refuses is dropped
  // here), then one call each timed: the estimate that sizes the graphs.
  std::vector<bool> live(n);
  for (size_t i = 0; i < n; ++i) {
    live[i] = plans[i].found;
    if (!live[i]) continue;
    if (Status s = gemm_with(plans[i], sets[0], t.stream); !s.ok()) {
      live[i] = false;
      cands[i].note = "not timed: " + s.message();
      (void)cudaGetLastError();
    }
  }
  // A fault in a kernel is sticky: nothing more could run, so it is an error.
  UNFUSED_TRY(cuda_status(cudaStreamSynchronize(t.stream), "the autotune's first calls (" + shape_str(p_) + ")"));
  std::vector<double> est(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    cudaEvent_t e0, e1;
    UNFUSED_TRY(new_event(&e0));
    UNFUSED_TRY(new_event(&e1));
    UNFUSED_TRY(cuda_status(cudaEventRecord(e0, t.stream), "cudaEventRecord"));
    UNFUSED_TRY(gemm_with(plans[i], sets[std::min(i, nsets - 1)], t.stream));
    UNFUSED_TRY(cuda_status(cudaEventRecord(e1, t.stream), "cudaEventRecord"));
    UNFUSED_TRY(cuda_status(cudaStreamSynchronize(t.stream), "the autotune's estimate (" + shape_str(p_) + ")"));
    UNFUSED_TRY(elapsed_ms(e0, e1, &est[i]));
  }
  double est_min = -1, round_ms = 0;
  size_t nlive = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    ++nlive;
    est_min = est_min < 0 ? est[i] : std::min(est_min, est[i]);
  }
  if (nlive == 0) {
    return {StatusCode::library_error, "Unfused::create: no GEMM candidate ran (" + shape_str(p_) + "); first: " +
                                           (cands.empty() ? std::string("none") : cands[0].note)};
  }

  // R calls per graph: the fastest candidate's replay lasts ~kReplayMs, and R
  // is a multiple of the operand sets, so every replay walks the whole
  // rotation and no call finds the previous call's operands in L2.
  int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kReplayMs / std::max(est_min, 1e-4))), 1,
                                      kMaxCalls);
  calls = (calls + static_cast<int64_t>(nsets) - 1) / static_cast<int64_t>(nsets) * static_cast<int64_t>(nsets);

  // Capture a graph per candidate; if any capture fails, every candidate is
  // timed as a block of eager calls instead (one method for all).
  bool graphs = true;
  std::string graph_note;
  t.execs.assign(n, nullptr);
  for (size_t i = 0; i < n && graphs; ++i) {
    if (!live[i]) continue;
    cudaGraph_t g = nullptr;
    Status s = cuda_status(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    const bool began = s.ok();
    for (int64_t j = 0; s.ok() && j < calls; ++j) s = gemm_with(plans[i], sets[static_cast<size_t>(j) % nsets], t.stream);
    if (began) {
      const Status e = cuda_status(cudaStreamEndCapture(t.stream, &g), "cudaStreamEndCapture");
      if (s.ok()) s = e;
    }
    if (s.ok()) s = cuda_status(cudaGraphInstantiate(&t.execs[i], g, 0), "cudaGraphInstantiate");
    if (g) (void)cudaGraphDestroy(g);
    if (!s.ok()) {
      graphs = false;
      graph_note = " (CUDA-graph capture failed: " + s.message() + ")";
      (void)cudaGetLastError();
    }
  }
  if (!graphs) {
    for (cudaGraphExec_t& g : t.execs) {
      if (g) (void)cudaGraphExecDestroy(g);
      g = nullptr;
    }
  }
  auto replay = [&](size_t i) -> Status {
    if (graphs) return cuda_status(cudaGraphLaunch(t.execs[i], t.stream), "cudaGraphLaunch (autotune)");
    for (int64_t j = 0; j < calls; ++j) UNFUSED_TRY(gemm_with(plans[i], sets[static_cast<size_t>(j) % nsets], t.stream));
    return Status::Ok();
  };

  for (size_t i = 0; i < n; ++i) {
    if (live[i]) round_ms += est[i] * static_cast<double>(calls);
  }
  const int rounds = std::clamp(static_cast<int>(o.budget_seconds * 1e3 / std::max(round_ms, 1e-3)), kMinRounds,
                                kMaxRounds);
  // An untimed round first (a graph's first launch uploads it), unless a
  // round is long enough for that not to matter.
  if (round_ms < 50.0) {
    for (size_t i = 0; i < n; ++i)
      if (live[i]) UNFUSED_TRY(replay(i));
  }
  // One event between consecutive replays: interval k times replay k.
  std::vector<cudaEvent_t> ev(static_cast<size_t>(rounds) * nlive + 1);
  for (cudaEvent_t& e : ev) UNFUSED_TRY(new_event(&e));
  std::vector<size_t> order;  // candidate of each interval
  size_t k = 0;
  UNFUSED_TRY(cuda_status(cudaEventRecord(ev[0], t.stream), "cudaEventRecord"));
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (!live[i]) continue;
      UNFUSED_TRY(replay(i));
      UNFUSED_TRY(cuda_status(cudaEventRecord(ev[++k], t.stream), "cudaEventRecord"));
      order.push_back(i);
    }
  }
  UNFUSED_TRY(cuda_status(cudaStreamSynchronize(t.stream), "the autotune's timed replays (" + shape_str(p_) + ")"));
  std::vector<std::vector<double>> times(n);
  for (size_t j = 0; j < order.size(); ++j) {
    double ms = 0;
    UNFUSED_TRY(elapsed_ms(ev[j], ev[j + 1], &ms));
    times[order[j]].push_back(ms / static_cast<double>(calls));
  }
  for (size_t i = 0; i < n; ++i) {
    if (live[i]) cands[i].ms = median_of(times[i]);
  }

  // The winner: walking the candidates in order (the heuristic's, then
  // cublasGemmEx), a candidate displaces the best so far only if it is
  // faster by more than kTieMargin. Candidates within the replays' noise of
  // each other (the usual case at small M, where most run the same kernel)
  // then give the same answer every run, the earlier one, instead of
  // flipping with the noise. A winner other than heuristic #1 must compute
  // what #1 computes.
  constexpr double kTieMargin = 0.005;
  std::vector<double> ref_rows;
  int winner = -1;
  while (true) {
    winner = -1;
    for (size_t i = 0; i < n; ++i) {
      if (!live[i] || !(cands[i].ms > 0)) continue;
      if (winner < 0 || cands[i].ms < cands[winner].ms * (1.0 - kTieMargin)) winner = static_cast<int>(i);
    }
    if (winner <= 0 || !live[0]) break;
    if (ref_rows.empty()) UNFUSED_TRY(sample_intermediate(plans[0], sets[0], t.stream, &ref_rows));
    std::vector<double> rows;
    UNFUSED_TRY(sample_intermediate(plans[winner], sets[0], t.stream, &rows));
    double num = 0, den = 0;
    for (size_t j = 0; j < rows.size(); ++j) {
      num += (rows[j] - ref_rows[j]) * (rows[j] - ref_rows[j]);
      den += ref_rows[j] * ref_rows[j];
    }
    const double rel = den > 0 ? std::sqrt(num / den) : (num == 0 ? 0.0 : INFINITY);
    if (rel <= kCheckRel) break;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "fastest, but its rows differ from heuristic #1's by %.3g (relative): not used",
                  rel);
    cands[winner].note = buf;
    live[winner] = false;
  }
  if (winner < 0) {
    return {StatusCode::library_error, "Unfused::create: no GEMM candidate could be timed (" + shape_str(p_) + ")"};
  }

  plans_[cls] = plans[winner];
  plans_[cls].min_alignment = cls_align;
  choice_.autotuned = true;
  choice_.alignment = cls_align;
  choice_.candidates = cands;
  choice_.winner = winner;
  choice_.method = (graphs ? "CUDA-graph replays of " : "blocks of ") + std::to_string(calls) + " calls rotating over " +
                   std::to_string(nsets) + " operand set(s), " + std::to_string(rounds) +
                   " interleaved rounds, median" + graph_note;
  std::string sum = cands[winner].name + " " + ms_str(cands[winner].ms);
  if (winner != 0 && cands[0].ms > 0) sum += "; heuristic #1 " + ms_str(cands[0].ms);
  const GemmCandidate& ex = cands.back();
  if (winner != static_cast<int>(n) - 1) sum += "; cublasGemmEx " + (ex.ms > 0 ? ms_str(ex.ms) : ex.note);
  sum += " (" + std::to_string(nlive) + " timed)";
  choice_.summary = sum;
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
  glu::launch(p_.input_dtype, p_.output_dtype, mode, items, stream, a);
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

Status Unfused::create(const Problem& p, std::unique_ptr<Unfused>* out) { return create(p, Options{}, out); }

Status Unfused::create(const Problem& p, const Options& options, std::unique_ptr<Unfused>* out) {
  if (out == nullptr) return {StatusCode::invalid_argument, "Unfused::create: out is null"};
  out->reset();
  if (p.op != Operation::gate_up)
    return {StatusCode::not_supported, "Unfused::create: the unfused baseline is of the gate/up half (op=gate_up)"};
  auto impl = std::make_unique<UnfusedImpl>();
  if (Status s = impl->init(p, options); !s.ok()) return s;
  *out = std::move(impl);
  return Status::Ok();
}

}  // namespace gatedmlp::ref
