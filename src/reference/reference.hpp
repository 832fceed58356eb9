// References shared by the tests and the gatedmlp tool:
//  - cpu_reference: the exact function in float64, on host memory.
//  - Unfused: what users run today (a cuBLASLt GEMM into [M, 2U], then a
//    separate GLU kernel). The benchmark's baseline and the tests' error yardstick.
//  - gpu_reference_rows: float64 on the device for a sample of rows, for
//    sizes the CPU cannot do.
//  - fill_random: device-side random inputs (never zeros).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/host_float16.hpp"
#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::ref {

// Host conversions for 16-bit floats (round to nearest even): the library's.
using detail::bf16_to_float;
using detail::float_to_bf16;
using detail::fp16_to_float;
using detail::float_to_fp16;
// Read element i of a host array of `dtype` as double.
// OCP e4m3fn (bias 7, no infinities, S.1111.111 NaN): a byte's value, and
// v rounded to the nearest value (ties to the even code), saturating at
// +-448 (never a NaN code; NaN in gives 0x7F; a negative v that rounds to 0
// gives -0).
double e4m3_to_double(uint8_t b);
uint8_t double_to_e4m3(double v);

double load_as_double(const void* base, DType dtype, int64_t i);
// Round v to `dtype` and store it as element i.
void store_from_double(void* base, DType dtype, int64_t i, double v);

// The whole problem in float64 on host memory. `host` holds host pointers laid
// out exactly as the device call's would be (strides and all). Outputs are
// dense: y [L][M][U]; preact (if non-null and p.has_preact) [L][M][2U] in the
// pre-activation column order documented in gatedmlp.hpp.
// rows: if non-null, only these rows (of every batch) are computed; the
// outputs are then [L][rows.size()][...].
// Quantized weights (p.quantized) are dequantized exactly, in float64:
// q * scale + bias, or e2m1 * 2^(scale - 127).
// Operation::down: y [L][M][U] = alpha * H Wd^T + bd with H = x, or the exact
// act(x) * x_up (glu_input); preact is left empty.
void cpu_reference(const Problem& p, const Arguments& host, std::vector<double>* y,
                   std::vector<double>* preact, const std::vector<int64_t>* rows = nullptr);

// Weight (row, k) of a resolved quantized problem's packed words, in float64.
double quantized_weight(const Problem& resolved, const void* words, const void* scales, const void* biases,
                        int64_t row, int64_t k);

// cuBLASLt GEMM (X @ W^T over the stored weight rows, alpha applied, output in
// the input dtype) into an [M, 2U] intermediate, then a GLU kernel that adds
// the bias and applies the activation. Supports every Problem that
// check_support accepts.
//
// The GEMM's algorithm: by default the cuBLASLt heuristic's first choice for
// each alignment class of the operands (cheap to create: the tests' yardstick).
// With Options::autotune, create() also times, on the caller's operands, the
// heuristic's first `candidates` algorithms and cublasGemmEx (the call
// torch.mm / F.linear make for bf16/fp16), and keeps the fastest for the
// object's lifetime: the benchmark's baseline must be at least as fast as what
// a framework calls, and the heuristic's first pick is not always the fastest
// (8B M = 4096 on an H100: its #6 ran 4 % faster than its #1). A later
// candidate displaces an earlier one only if faster by more than 0.5 %, so
// candidates equal within the noise give the same choice every run.
class Unfused {
 public:
  struct Options {
    bool autotune = false;
    int candidates = 8;  // heuristic algorithms asked for (cublasGemmEx comes on top)
    // The operand sets to time on (x, w, w_up are read; nothing is written
    // to them), rotated call by call: pass copies enough to rotate past the
    // L2, as the benchmark's timed calls do. Required with autotune. They
    // must stay valid only during create().
    std::vector<Arguments> tune_args;
    double budget_seconds = 0.3;  // timed replays of all candidates together, roughly
  };

  // One algorithm the autotune timed.
  struct GemmCandidate {
    std::string name;       // "cublasLt heuristic #2 (algo 66, tile 20, ...)" or "cublasGemmEx"
    int heuristic_rank = 0; // 1-based rank in the heuristic's answer; 0 for cublasGemmEx
    size_t workspace = 0;   // bytes the algorithm asked for (cublasGemmEx: the handle's workspace)
    double ms = -1;         // median per GEMM call (all batches and halves); < 0: not timed (note says why)
    std::string note;
  };
  // What create() picked for the GEMM of the operands' alignment class.
  struct GemmChoice {
    bool autotuned = false;
    uint32_t alignment = 0;      // the alignment class (bytes) the choice is for; other classes keep the heuristic's
    std::vector<GemmCandidate> candidates;
    int winner = -1;             // index into candidates; -1 when nothing was timed
    std::string method;          // how the candidates were timed
    std::string summary;         // one line for a report
  };

  static Status create(const Problem& p, std::unique_ptr<Unfused>* out);
  static Status create(const Problem& p, const Options& options, std::unique_ptr<Unfused>* out);
  virtual ~Unfused() = default;
  // Bytes of the [L][M, 2U] intermediate this path allocates.
  virtual size_t intermediate_bytes() const = 0;
  // GEMM + GLU into args.y (and args.preact, copied from the intermediate).
  virtual Status run(const Arguments& args, cudaStream_t stream) = 0;
  // The GEMM alone into the intermediate: the "cuBLAS GEMM only" timing.
  virtual Status run_gemm_only(const Arguments& args, cudaStream_t stream) = 0;
  // The GLU kernel alone, on whatever the intermediate holds: the bench's
  // yardstick of how close the elementwise half runs to memory bandwidth.
  virtual Status run_glu_only(const Arguments& args, cudaStream_t stream) = 0;
  // The GEMM algorithm in use, and how it was chosen.
  virtual const GemmChoice& gemm_choice() const = 0;
};

// float64 reference on the device for batch 0 and the given rows:
// y_out is device memory [nrows][U] of double. rows_dev is device memory.
Status gpu_reference_rows(const Problem& p, const Arguments& dev, const int64_t* rows_dev,
                          int64_t nrows, double* y_out, cudaStream_t stream);

// The kernels' activation on the device, element by element: y[i] =
// glu_out16 (the 16-bit outputs' tanh form) when `out16`, else glu, of g[i]
// and u[i] (device arrays of n floats). For tests of the activation's own
// error, apart from any GEMM.
Status glu_on_device(int act, bool out16, const float* g, const float* u, float* y, int64_t n,
                     float clamp_alpha, float clamp_limit, cudaStream_t stream);

// Fill n elements of `dtype` at device pointer p. Uniform in [lo, hi), or
// normal(mean=lo, std=hi) when `normal` is set. Deterministic in seed.
Status fill_random(void* p, DType dtype, int64_t n, uint64_t seed, float lo, float hi,
                   bool normal, cudaStream_t stream);

// Fill n elements of `dtype` with a NaN bit pattern (poison before a check).
Status fill_nan(void* p, DType dtype, int64_t n, cudaStream_t stream);

}  // namespace gatedmlp::ref
