// Host side of the decode kernel's Hopper form: what it takes, its tensor
// maps, its launch (the kernel: decode_hopper.cu).
#include <sstream>

#include "core/internal.hpp"
#include "decode_glu/decode_glu.hpp"
#include "decode_glu/hopper.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::decode {

using detail::err;

using sm90::kMaxCoord;
using sm90::kMaxStrideBytes;

std::string hopper_blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  const int64_t g = r.weights.group;
  if (!sm90::compiled()) os << "this build has no sm_90a kernel";
  else if (std::string no = blocker(r, a); !no.empty()) os << no;
  else if (r.gather.experts > 0) os << "a gathered call";
  else if (r.op != Operation::gate_up) os << "not a gate/up call";
  else if (r.batch != 1) os << "batch=" << r.batch << " (the Hopper form takes one batch)";
  else if (r.weights.format != WeightFormat::fused) os << "separate gate and up weights";
  // The weight map's boxes are whole groups of 8 columns of one block.
  else if (g % 8 || r.u % g) os << "weights.group=" << g << " is not a multiple of 8 dividing u=" << r.u;
  else if (r.k > kMaxCoord) os << "k=" << r.k << " exceeds 2^31-1 (TMA coordinates)";
  else if (4 * g * r.weights.ld >= kMaxStrideBytes || 2 * r.m * r.ldx >= kMaxStrideBytes)
    os << "a stride exceeds the tensor map's 2^40-byte limit";
  return os.str();
}

std::string hopper_grid_blocker(const Problem& r, int sms) {
  const int64_t g = r.weights.group;
  const int64_t ctas = (g + kHopperColumns - 1) / kHopperColumns * (r.u / g);
  std::ostringstream os;
  if (2 * ctas < sms)
    os << "its " << ctas << " CTAs of " << kHopperColumns << " columns leave over half of the " << sms
       << " SMs idle (the register form's CTAs of 8 fill them)";
  else if (r.m <= 8 && ctas > 2 * int64_t(sms))
    os << "m=" << r.m << " <= 8 and its " << ctas << " CTAs are more than 2 per SM (" << sms
       << " SMs): the register form streams faster there";
  return os.str();
}

Status hopper_prepare(const Problem& r, const Arguments& a, HopperPrepared* out) {
  Status s;
  auto fn = sm90::encode_fn(&s);
  if (!fn) return s;
  HopperPrepared pr;
  pr.p = make_params(r, a);
  pr.input = r.input_dtype;
  pr.n = r.m <= 8 ? 8 : 16;
  const int64_t g = r.weights.group, ld = r.weights.ld * 2, blocks = r.u / g;
  pr.ctas_per_block = static_cast<int>((g + kHopperColumns - 1) / kHopperColumns);
  pr.grid = static_cast<unsigned>(pr.ctas_per_block * blocks);
  {
    // Weights: (K, 8 rows, 2 halves, G / 8 groups, U / G blocks); a box is
    // 64 k of 4 groups' 8 rows of both halves (fused_row(): block b holds
    // its first half's G rows, then its second half's).
    const cuuint64_t dims[5] = {cuuint64_t(r.k), 8, 2, cuuint64_t(g / 8), cuuint64_t(blocks)};
    const cuuint64_t strides[4] = {cuuint64_t(ld), cuuint64_t(g * ld), cuuint64_t(8 * ld), cuuint64_t(2 * g * ld)};
    const cuuint32_t box[5] = {kHopperBk, 8, 2, kHopperColumns / 8, 1};
    if (Status e = sm90::encode(fn, &pr.wmap, r.input_dtype, a.w, 5, dims, strides, box, "w"); !e) return e;
  }
  {
    // X: (K, M, 1); a box is 64 k of N rows, those past M zero-filled.
    const cuuint64_t dims[3] = {cuuint64_t(r.k), cuuint64_t(r.m), 1};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldx * 2), cuuint64_t(r.m * r.ldx * 2)};
    const cuuint32_t box[3] = {kHopperBk, cuuint32_t(pr.n), 1};
    if (Status e = sm90::encode(fn, &pr.xmap, r.input_dtype, a.x, 3, dims, strides, box, "x"); !e) return e;
  }
  pr.w = a.w;
  pr.x = a.x;
  if (const cudaError_t e = hopper_kernel_setup(pr); e != cudaSuccess)
    return err(StatusCode::cuda_error, "decode kernel (Hopper form) set-up failed: ", cudaGetErrorString(e));
  *out = pr;
  return Status::Ok();
}

Status hopper_launch(HopperPrepared& pr, const Arguments& a, cudaStream_t stream) {
  if (a.w != pr.w) {
    if (Status e = sm90::replace_address(&pr.wmap, a.w, "w"); !e) return e;
    pr.w = a.w;
  }
  if (a.x != pr.x) {
    if (Status e = sm90::replace_address(&pr.xmap, a.x, "x"); !e) return e;
    pr.x = a.x;
  }
  pr.p.x = a.x;
  pr.p.w = a.w;
  pr.p.bias = a.bias;
  pr.p.y = a.y;
  pr.p.pre = a.preact;
  if (const cudaError_t e = hopper_kernel_launch(pr, stream); e != cudaSuccess)
    return err(StatusCode::cuda_error, "decode kernel (Hopper form) launch failed: ", cudaGetErrorString(e));
  return Status::Ok();
}

#if !defined(GATEDMLP_HAS_SM90)
cudaError_t hopper_kernel_setup(const HopperPrepared&) { return cudaErrorNotSupported; }
cudaError_t hopper_kernel_launch(const HopperPrepared&, cudaStream_t) { return cudaErrorNotSupported; }
#endif

}  // namespace gatedmlp::decode
