// The down projection past the decode kernels' rows: one cuBLASLt GEMM,
// alpha in it (the bias, where there is one, is down::finish_output's).
// Where the weights are reused across hundreds of rows there is nothing to
// fuse into a plain GEMM, and cuBLASLt is the toolkit's own at that.
//
// Row-major Y [M, U] is column-major D [U, M]; so D = alpha * op(A) * B with
// A the weights (out_in [U, K] row-major is column-major [K, U], transposed;
// in_out [K, U] is column-major [U, K] as it is) and B = H (column-major
// [K, M]).
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>

#include "core/internal.hpp"
#include "down/down.hpp"

namespace gatedmlp::down {

namespace {

using detail::err;

cudaDataType_t cuda_type(DType d) {
  return d == DType::bf16 ? CUDA_R_16BF : d == DType::fp16 ? CUDA_R_16F : CUDA_R_32F;
}

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return err(StatusCode::library_error, "cuBLASLt ", what, " failed: ", cublasLtGetStatusName(s), ": ",
             cublasLtGetStatusString(s));
}

// One handle per device and thread, made on first use and kept (a handle
// costs a few hundred microseconds to create; a call must not pay that).
Status handle_for_current_device(cublasLtHandle_t* out) {
  constexpr int kDevices = 64;
  thread_local cublasLtHandle_t handles[kDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    cudaGetLastError();
    return err(StatusCode::no_device, "no usable CUDA device for cuBLASLt");
  }
  if (!handles[device])
    if (Status s = lt_status(cublasLtCreate(&handles[device]), "cublasLtCreate"); !s) return s;
  *out = handles[device];
  return Status::Ok();
}

// Largest power of two (<= 16) dividing the address and every step in
// bytes. 16 is the most any algorithm asks, and what the plan's key (the
// pointers' alignment classes; the workspace is 16-byte aligned) keeps true.
uint32_t alignment_of(const void* p, int64_t ld_bytes, int64_t stride_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld_bytes) | uintptr_t(stride_bytes);
  uint32_t a = 1;
  while (a < 16 && (bits & a) == 0) a <<= 1;
  return a;
}

class Linear final : public CublasLinear {
 public:
  ~Linear() override {
    if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
    for (cublasLtMatrixLayout_t l : {a_, b_, d_})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }

  Status init(const Problem& r, const Arguments& args, size_t cublas_bytes) {
    r_ = r;
    cublas_bytes_ = cublas_bytes;
    if (Status s = handle_for_current_device(&handle_); !s) return s;
    const bool in_out = r.weights.storage == WeightStorage::in_out;
    const cudaDataType_t in = cuda_type(r.input_dtype), out = cuda_type(r.output_dtype);
    if (Status s = lt_status(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor"); !s)
      return s;
    const cublasOperation_t ta = in_out ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    const uint64_t a_rows = in_out ? r.u : r.k, a_cols = in_out ? r.k : r.u;
    if (Status s = layout(&a_, in, a_rows, a_cols, r.weights.ld, r.batch_stride_w); !s) return s;
    if (Status s = layout(&b_, in, r.k, r.m, r.ldx, r.batch_stride_x); !s) return s;
    if (Status s = layout(&d_, out, r.u, r.m, r.ldy, r.batch_stride_y); !s) return s;

    if (Status s = lt_status(cublasLtMatmulPreferenceCreate(&pref_), "preference"); !s) return s;
    const size_t ws = cublas_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    // Split-K partial sums reduced in fp32, or no split: left free, the
    // heuristic's pick at M = 64, K = 2056, N = 12 gave a bf16 Y 2.7 ulps off
    // float64 (H200), the size of a 16-bit rounding of partial sums.
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                         sizeof reductions);
    const size_t ei = dtype_size(r.input_dtype), eo = dtype_size(r.output_dtype);
    const uint32_t al_a = alignment_of(args.w, r.weights.ld * int64_t(ei), r.batch_stride_w * int64_t(ei));
    const uint32_t al_b = alignment_of(args.x, r.ldx * int64_t(ei), r.batch_stride_x * int64_t(ei));
    const uint32_t al_d = alignment_of(args.y, r.ldy * int64_t(eo), r.batch_stride_y * int64_t(eo));
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
    cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);

    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    if (Status s = lt_status(cublasLtMatmulAlgoGetHeuristic(handle_, op_, a_, b_, d_, d_, pref_, 1, &h, &found),
                             "algorithm heuristic");
        !s)
      return s;
    if (found == 0)
      return err(StatusCode::not_supported, "cuBLASLt has no algorithm for the down projection ", to_string(r));
    algo_ = h.algo;
    std::ostringstream os;
    os << "cuBLASLt GEMM (heuristic's first algorithm, " << h.workspaceSize << " bytes of its workspace)";
    describe_ = os.str();
    return Status::Ok();
  }

  Status run(const Arguments& a, void* cublas_ws, size_t cublas_bytes, cudaStream_t stream) override {
    const float alpha = r_.alpha, beta = 0.f;
    return lt_status(cublasLtMatmul(handle_, op_, &alpha, a.w, a_, a.x, b_, &beta, a.y, d_, a.y, d_, &algo_,
                                    cublas_bytes >= cublas_bytes_ ? cublas_ws : nullptr,
                                    cublas_bytes >= cublas_bytes_ ? cublas_bytes_ : 0, stream),
                     "matmul");
  }

  const std::string& describe() const override { return describe_; }

 private:
  Status layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                int64_t batch_stride) {
    if (Status s = lt_status(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld), "matrix layout"); !s) return s;
    if (r_.batch > 1) {
      const int32_t count = static_cast<int32_t>(r_.batch);
      cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
      cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                       sizeof batch_stride);
    }
    return Status::Ok();
  }

  Problem r_;
  size_t cublas_bytes_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::string describe_;
};

}  // namespace

Status CublasLinear::create(const Problem& r, const Arguments& a, size_t cublas_bytes,
                            std::shared_ptr<CublasLinear>* out) {
  if (r.batch > INT32_MAX)
    return err(StatusCode::not_supported, "batch=", r.batch, " is more than cuBLASLt's batch count takes (2^31-1)");
  auto l = std::make_shared<Linear>();
  if (Status s = l->init(r, a, cublas_bytes); !s) return s;
  *out = std::move(l);
  return Status::Ok();
}

}  // namespace gatedmlp::down
