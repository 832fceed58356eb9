// Host side of the quantized decode kernel's Hopper form: what it takes, its
// tensor maps, its launch (the kernel: hopper.cuh).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/internal.hpp"
#include "quant_decode/hopper.hpp"
#include "quant_decode/quant_decode.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::quant_decode {

using detail::err;

using sm90::kMaxCoord;
using sm90::kMaxStrideBytes;

int hopper_n(const Problem& r, int warpgroups) {
  if (r.m <= 32) return 32;
  if (r.m <= 64) return 64;
  const char* knob = std::getenv("GATEDMLP_QDECODE_HOPPER_N128");
  if (knob && std::strcmp(knob, "0") == 0) return 64;
  // FP8's sums, a block's sums and the A registers at 128 tokens do not fit
  // two consumer warpgroups' 168 registers (ptxas spilled 276 bytes), and
  // one warpgroup at 128 tokens ran only 0.96-1.16x as fast as two passes of
  // 64 with two warpgroups (h84): two passes.
  return r.quant.mode == QuantMode::fp8_e4m3 && warpgroups == 2 ? 64 : 128;
}

bool hopper_forced() {
  const char* knob = std::getenv("GATEDMLP_QDECODE_HOPPER");
  return knob && std::strcmp(knob, "all") == 0;
}

int hopper_min_m(const Problem& r) {
  if (hopper_forced()) return 1;
  if (r.quant.mode == QuantMode::fp8_e4m3) return kHopperMinMFp8;
  return r.quant.mode == QuantMode::affine && r.quant.bits == 8 ? kHopperMinMInt8 : kHopperMinM;
}

std::string hopper_blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  const int64_t g = r.weights.group;
  const char* knob = std::getenv("GATEDMLP_QDECODE_HOPPER");
  const bool mx = r.quant.mode == QuantMode::mxfp4, fp8 = r.quant.mode == QuantMode::fp8_e4m3;
  const bool affine = r.quant.mode == QuantMode::affine;
  // A stage's affine or e8m0 scales: 256 / group_size of them, 2 bytes each
  // (affine) or 1 (e8m0), in one load. FP8's are loaded one by one.
  const int64_t stage_scale_bytes = r.quant.group_size && !fp8 ? kHopperBk / r.quant.group_size * (mx ? 1 : 2) : 1;
  if (!sm90::compiled()) os << "this build has no sm_90a kernel";
  else if (knob && std::strcmp(knob, "0") == 0) os << "turned off (GATEDMLP_QDECODE_HOPPER=0)";
  else if (r.m < hopper_min_m(r) || r.m > kHopperMaxM)
    os << "m=" << r.m << " is outside " << hopper_min_m(r) << " ... " << kHopperMaxM
       << " (below, the register kernel was as fast or faster for these weights, past 128 dequantizing once is: h82, "
          "h83)";
  else if (r.gather.experts > 0) os << "a gathered call";
  else if (r.op != Operation::gate_up) os << "not a gate/up call";
  else if (r.batch != 1) os << "batch=" << r.batch << " (the Hopper form takes one batch)";
  else if (r.quant.repacked) os << "repacked words (it reads the checkpoint's order)";
  else if (r.quant.tiled) os << "tiled words (it reads the checkpoint's order)";
  else if (mx && r.input_dtype != DType::bf16) os << "MXFP4 with " << to_string(r.input_dtype) << " x (its pair recipe is bf16's)";
  else if (affine && r.scale_dtype != r.input_dtype)
    os << "scales of " << to_string(r.scale_dtype) << " with " << to_string(r.input_dtype)
       << " x (it loads a stage's scales as x's type)";
  else if (affine && r.quant.group_size != 32 && r.quant.group_size != 64 && r.quant.group_size != 128)
    os << "group_size=" << r.quant.group_size << " (it is built for 32, 64 and 128)";
  else if (r.weights.format != WeightFormat::fused) os << "separate gate and up weights";
  // The word map's boxes are whole groups of 8 columns of one block.
  else if (g % 8 || r.u % g) os << "weights.group=" << g << " is not a multiple of 8 dividing u=" << r.u;
  // A stage's scales are one vector load per row: whole stages, and the
  // scale arrays aligned to a stage's (2 bytes x 256 / group_size).
  else if (r.k % kHopperBk) os << "k=" << r.k << " is not a multiple of " << kHopperBk << " (whole stages of scales)";
  else if (a && (reinterpret_cast<uintptr_t>(a->w_scales) % stage_scale_bytes ||
                 (affine && reinterpret_cast<uintptr_t>(a->w_biases) % stage_scale_bytes)))
    os << "w_scales (" << a->w_scales << ") or w_biases (" << a->w_biases << ") is not " << stage_scale_bytes
       << "-byte aligned (a stage's scales in one load)";
  else if (r.k > kMaxCoord) os << "k=" << r.k << " exceeds 2^31-1 (TMA coordinates)";
  else if (2 * g * r.weights.ld * 4 >= kMaxStrideBytes || r.m * r.ldx * 2 >= kMaxStrideBytes)
    os << "a stride exceeds the tensor map's 2^40-byte limit";
  return os.str();
}

int hopper_warpgroups(const Problem& r, int sms) {
  const int64_t g = r.weights.group;
  const int64_t ctas = (g + 2 * kHopperColumns - 1) / (2 * kHopperColumns) * (r.u / g);
  return 2 * ctas >= sms ? 2 : 1;
}

int64_t hopper_ctas(const Problem& r, int warpgroups) {
  const int64_t g = r.weights.group, cols = int64_t(kHopperColumns) * warpgroups;
  return (g + cols - 1) / cols * (r.u / g);
}

Status hopper_prepare(const Problem& r, const Arguments& a, int warpgroups, HopperPrepared* out) {
  Status s;
  auto fn = sm90::encode_fn(&s);
  if (!fn) return s;
  HopperPrepared pr;
  pr.q = make_params(r, a);
  pr.input = r.input_dtype;
  pr.n = hopper_n(r, warpgroups);
  pr.warpgroups = warpgroups;
  pr.group_size = r.quant.group_size;
  const bool eight = r.quant.bits == 8;
  pr.format = r.quant.mode == QuantMode::mxfp4      ? kMxfp4
              : r.quant.mode == QuantMode::fp8_e4m3 ? kFp8
              : eight                               ? kInt8
                                                    : kInt4;
  const int64_t g = r.weights.group, ld = r.weights.ld * 4, blocks = r.u / g;
  const int64_t cols = int64_t(kHopperColumns) * warpgroups;
  pr.ctas_per_block = static_cast<int>((g + cols - 1) / cols);
  pr.grid = static_cast<unsigned>(hopper_ctas(r, warpgroups));
  {
    // Words as bytes: (K / 2 or K, 8 rows, 2 halves, G / 8 groups, U / G
    // blocks); a box is 128 bytes (256 k of 4 bits, 128 of 8) of 4 W
    // groups' 8 rows of both halves (fused_row(): block b holds its first
    // half's G rows, then its second half's). The byte type is FP8's, read
    // as words by the kernel.
    const cuuint64_t dims[5] = {cuuint64_t(eight ? r.k : r.k / 2), 8, 2, cuuint64_t(g / 8), cuuint64_t(blocks)};
    const cuuint64_t strides[4] = {cuuint64_t(ld), cuuint64_t(g * ld), cuuint64_t(8 * ld), cuuint64_t(2 * g * ld)};
    const cuuint32_t box[5] = {kHopperBk / 2, 8, 2, cuuint32_t(4 * warpgroups), 1};
    if (Status e = sm90::encode(fn, &pr.wmap, DType::fp8_e4m3, a.w, 5, dims, strides, box, "w"); !e) return e;
  }
  pr.passes = static_cast<int>(hopper_passes(r.m, pr.n));
  for (int i = 0; i < pr.passes; ++i) {
    // X: (K, rows, 1) from row n i; a box is 64 k of n rows, those past
    // the pass's rows zero.
    const int64_t rows = std::min<int64_t>(pr.n, r.m - int64_t(pr.n) * i);
    const cuuint64_t dims[3] = {cuuint64_t(r.k), cuuint64_t(rows), 1};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldx * 2), cuuint64_t(rows * r.ldx * 2)};
    const cuuint32_t box[3] = {64, cuuint32_t(pr.n), 1};
    const void* base = static_cast<const char*>(a.x) + int64_t(pr.n) * i * r.ldx * 2;
    if (Status e = sm90::encode(fn, &pr.xmap[i], r.input_dtype, base, 3, dims, strides, box, "x"); !e) return e;
  }
  pr.w = a.w;
  pr.x = a.x;
  if (const cudaError_t e = hopper_kernel_setup(pr); e != cudaSuccess)
    return err(StatusCode::cuda_error, "quantized decode kernel (Hopper form) set-up failed: ", cudaGetErrorString(e));
  *out = pr;
  return Status::Ok();
}

Status hopper_launch(HopperPrepared& pr, const Arguments& a, cudaStream_t stream) {
  if (a.w != pr.w) {
    if (Status e = sm90::replace_address(&pr.wmap, a.w, "w"); !e) return e;
    pr.w = a.w;
  }
  const decode::Params& p0 = pr.q.d;
  if (a.x != pr.x) {
    for (int i = 0; i < pr.passes; ++i)
      if (Status e = sm90::replace_address(&pr.xmap[i], static_cast<const char*>(a.x) + int64_t(pr.n) * i * p0.ldx * 2,
                                           "x");
          !e)
        return e;
    pr.x = a.x;
  }
  // Pass i: rows n i ... of x, y and the pre-activation.
  const size_t ysize = dtype_size(static_cast<DType>(p0.out_dtype));
  const size_t psize = dtype_size(static_cast<DType>(p0.pre_dtype));
  for (int i = 0; i < pr.passes; ++i) {
    Params q = pr.q;
    decode::Params& p = q.d;
    const int64_t row0 = int64_t(pr.n) * i;
    p.x = static_cast<const char*>(a.x) + row0 * p.ldx * 2;
    p.w = a.w;
    p.bias = a.bias;
    p.y = static_cast<char*>(a.y) + row0 * p.ldy * ysize;
    p.pre = a.preact ? static_cast<char*>(a.preact) + row0 * p.ldpre * psize : nullptr;
    p.m = static_cast<int>(std::min<int64_t>(pr.n, p0.m - row0));
    q.scales = a.w_scales;
    q.biases = a.w_biases;
    if (const cudaError_t e = hopper_kernel_launch(pr, q, pr.xmap[i], stream); e != cudaSuccess)
      return err(StatusCode::cuda_error, "quantized decode kernel (Hopper form) launch failed: ", cudaGetErrorString(e));
  }
  return Status::Ok();
}

#if defined(GATEDMLP_HAS_SM90)
cudaError_t hopper_kernel_setup(const HopperPrepared& pr) {
  const bool bf = pr.input == DType::bf16, eight = pr.format == kInt8 || pr.format == kFp8;
  if (eight) return bf ? hopper_setup_bf16_8bit(pr) : hopper_setup_fp16_8bit(pr);
  return bf ? hopper_setup_bf16(pr) : hopper_setup_fp16(pr);
}
cudaError_t hopper_kernel_launch(const HopperPrepared& pr, const Params& pass, const CUtensorMap& xmap,
                                 cudaStream_t stream) {
  const bool bf = pr.input == DType::bf16, eight = pr.format == kInt8 || pr.format == kFp8;
  if (eight) return bf ? hopper_launch_bf16_8bit(pr, pass, xmap, stream) : hopper_launch_fp16_8bit(pr, pass, xmap, stream);
  return bf ? hopper_launch_bf16(pr, pass, xmap, stream) : hopper_launch_fp16(pr, pass, xmap, stream);
}
#else
cudaError_t hopper_kernel_setup(const HopperPrepared&) { return cudaErrorNotSupported; }
cudaError_t hopper_kernel_launch(const HopperPrepared&, const Params&, const CUtensorMap&, cudaStream_t) {
  return cudaErrorNotSupported;
}
#endif

}  // namespace gatedmlp::quant_decode
