// FP8 activations on the Hopper gate/up kernel (input_dtype = fp8_e4m3, sm_90a)
// on fresh random cases: X scaled per tensor, per row or per 1 x 128 block
// (x_scales [m, ceil(k / 128)]), FP8 weights scaled per tensor, per output
// channel or per 128 x 128 block (row_block 0 / 1 / 128, w_scales [ceil(N /
// 128), ceil(K / 128)]) in every scale dtype, every fused layout the Hopper
// kernel takes (stacked, either half first, interleaved in blocks of G = 1
// ... 256; with weight blocks the ones whose interleave block is a multiple
// of 128) and separate weights (any U), every activation (the clamped
// SwiGLU with its parameters), bias in every dtype, alpha, the
// pre-activation, every output dtype (an FP8 Y too: e4m3 with 1 x 128
// group scales, row-major or MN-major, with or without the amax), padded rows of X, of the weights'
// words and of Y, M = 1 ... 600 (several 128-row tiles, partial ones), K =
// 16 ... 2048 in steps of 16 (mostly with a partial last 128-deep k-block)
// and now and then K > 8192 (clusters of two), U odd and even (U % 8 != 0:
// Y stored without TMA). Then every blocked layout, K > 8192, the split
// tail forced, the knobs that change the schedule (one cluster, clusters of
// two), and the promoting kernels for calls without block scales
// (GATEDMLP_FP8_PROMOTE=1).
//
// Data: e4m3 bytes drawn by rounding uniform floats of a random range (1, 2,
// 16 or 448) to the nearest e4m3fn value, with zeros (+0 and -0), subnormals
// and the smallest normals sprinkled in; now and then only extremes (+-448,
// +-0, subnormals). Never the NaN codes 0x7F / 0xFF, which fill the padding
// of X and of the weight rows instead: a kernel that reads padding gets NaN.
// Scales are random fp32 values (their full mantissa), spread by 2^[-2, 1]
// per row / channel / block around a value that keeps g and u of order 1
// (each row's, channel's or block's its own draw: a kernel that applies
// another one's scale is far off); some cases flip the sign of half the
// scales.
//
// Reference: float64 on the dequantized inputs (e4m3 value x scale; X
// element (r, c) times x_scales[r], or x_scales[r * ceil(k / 128) + c /
// 128] in blocks; weight (n, c) times w_scales[(n / 128) * ceil(K / 128) +
// c / 128] in blocks, n in the tensor's own row order) through the shared
// cpu_reference: X dequantized to fp32 (the only rounding on the
// reference's side: 2^-24 relative, in the bound below), the FP8 weights
// and their stored scales read exactly by ref::quantized_weight. The same
// reference on |x|, |w|, |scales|, |alpha| gives A = |alpha| sum_k |x w|
// (of the dequantized values) per gate / up column, the magnitude the
// kernel's sums are rounded at.
//
// Tolerance, per element (every element of Y, and of the pre-activation):
//   dg  = acc(K) A_g + 2^-20 (A_g + |g| + 1)      (likewise du)
//   |y - y_ref| <= u_out |y_ref| + 1.01 (1.2 (|u| + 1 + du) dg + (|g| + dg) du
//                                        + act (|g| + dg)(|u| + 1 + du)) + floor
// where
//  - u_out is the output's unit roundoff (bf16 2^-8, fp16 2^-11, fp32 2^-24)
//    and floor fp16's subnormal spacing (2^-24; 0 otherwise): Y is rounded
//    once;
//  - the products of two e4m3 values are exact in fp32; the FP8 wgmma adds
//    each k=32 slice to the fp32 accumulator with the addends aligned to the
//    largest and kept to about 14 bits (DeepSeek-V3 report, 3.3.2: "around
//    14 bits" on H800), truncated, so each slice may lose a few 2^-14 of a
//    magnitude <= A: measured on the H100, 2^-12.6 A for one slice of 16
//    terms (K = 16, values over a range of 16). acc(K) = 2^-11 min(ceil(K /
//    32), 4): linear in the slices up to 4 and capped at 2^-9 beyond (the
//    slices' errors have random signs and the partial sums stay near
//    sqrt(K) of A's K): what the non-promoting kernels (all of K in the
//    wgmmas' accumulators, the default without block scales) were measured
//    within. The promoting kernels (every block-scaled call, the others
//    with GATEDMLP_FP8_PROMOTE=1) sum
//    each 128-deep k-block in an accumulator of its own, at most 4 k=32
//    wgmmas (<= 2^-11 min(ceil(K / 32), 4) of that block's share of A, its
//    block scales included), and add the blocks in fp32 (2^-24 of the
//    running sum per block: K = 16384 adds 128 of them, <= 2^-17 A): the
//    same bound holds with room. The 2^-20 term is the epilogue's fp32
//    roundings (scales, alpha, bias) and the reference's fp32 X;
//  - 1.2 bounds |d act(g) / dg| (silu 1.10, gelu 1.13, relu 1, clamped
//    SwiGLU 1.10 times (u + 1)), |act(g)| <= |g| the up half's factor;
//  - act is the activation's own error per |g u|: 8e-6 for 16-bit outputs
//    (the one-MUFU tanh form, <= 3.9e-6 |g u| measured), 4e-7 for fp32
//    (<= 2e-7 |g u|).
// The pre-activation: |p - p_ref| <= u_pre |p_ref| + 1.01 dp + floor.
// And norm-wise over Y, a backstop for small systematic errors: the RMS
// error over the larger of the reference's RMS and 1 at most 1e-2.
// Outputs are poisoned with NaN first: every element must be written and
// the padding of Y and the pre-activation must still hold the poison.
// An FP8 Y (check_fp8_y): each group's scale against the reference's amax
// / 448, each byte times its scale within half an e4m3 step of the
// reference (plus the bound above for the value before quantization), the
// amax within the bound and exactly consistent with the scales, the
// MN-major scales' padding untouched; then the same call with a bf16 Y
// under the same kernel and schedule: each FP8 value times its scale
// within one e4m3 step of it. By hand: a NaN in X reaches its row's scales
// and the amax; scales or amax in host memory write nothing.
//
// Then the accuracy of 128 x 128 blocks against per-tensor scales on the
// same dequantized values (and of the promoting kernels against the
// non-promoting ones) at K = 8192 and 16384; calls that must write nothing
// (x_scales null or in host memory, shapes the e4m3 kernels cannot read,
// blocked weights on fused layouts the rule refuses) and the plan's path
// and reason.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/layout_math.hpp"
#include "gatedmlp/quant.hpp"
#include "gpu_util.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

// ---------------------------------------------------------------- e4m3fn on the host

// (The codec is the shared reference's: ref::e4m3_to_double, double_to_e4m3.)
constexpr uint8_t kE4m3Nan = 0x7F;

// ---------------------------------------------------------------- devices

#define SKIP_WITHOUT_FP8_KERNEL()                                                                  \
  do {                                                                                             \
    SKIP_WITHOUT_GPU();                                                                            \
    if (!device_is_sm90()) GTEST_SKIP() << "FP8 activations run on sm_90 (H100/H200) only";       \
    if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel";                     \
  } while (0)

// ---------------------------------------------------------------- problems

// The Hopper kernel's fused layouts: stacked (group 0, or U), or blocks of G
// rows with G dividing 128 or a multiple of it.
constexpr int64_t kGroups[] = {1, 2, 8, 32, 64, 128, 256};

int64_t random_u(std::mt19937_64& rng) {
  if (rng() % 2)
    return pick(rng, {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 63, 64, 65, 96, 127, 128, 129, 136, 200, 256, 257,
                      264, 300});
  return 1 + int64_t(rng() % 400);
}

// The float64 references (the signed one and the magnitudes') each cost
// m x 2U x K multiply-adds: keep one under 1.5M (3M for the case), halving
// a dimension picked at random (U stays a multiple of the interleave block);
// without `rng`, K down to 128 first, then M down to 64, then U, K, M.
constexpr int64_t kReferenceBudget = 1'500'000;

// What U stays a multiple of: the interleave block; with 128 x 128 weight
// blocks, 128 for stacked fused weights too (the layout rule).
int64_t block_of(const Problem& p) {
  if (p.weights.format != WeightFormat::fused) return 1;
  if (p.weights.group > 0) return p.weights.group;
  return p.quant.row_block == 128 ? 128 : 1;
}

void fit_budget(Problem& p, std::mt19937_64* rng) {
  const int64_t g = block_of(p);
  const bool stacked_as_u = p.weights.format == WeightFormat::fused && p.weights.group == p.u;
  while (p.m * 2 * p.u * p.k > kReferenceBudget) {
    std::vector<int> dims;
    if (p.u > g && !stacked_as_u) dims.push_back(0);
    if (p.k > 16) dims.push_back(1);
    if (p.m > 1) dims.push_back(2);
    if (dims.empty()) break;
    int d = 0;
    if (rng) d = dims[(*rng)() % dims.size()];
    else if (p.k > 128) d = 1;
    else if (p.m > 64) d = 2;
    else d = dims.front();
    if (d == 0) p.u = std::max(g, (p.u / 2) / g * g);
    else if (d == 1) p.k = std::max<int64_t>(16, (p.k / 2) / 16 * 16);
    else p.m = std::max<int64_t>(1, p.m / 2);
  }
}

// The weight scale schemes, by quant.row_block: 0 per tensor, 1 per output
// channel (both with group_size 0), 128 per 128 x 128 block (group_size 128).
constexpr int kWeightSchemes[] = {0, 1, 128};
constexpr XScale kXScales[] = {XScale::tensor, XScale::row, XScale::block};

bool blocked_weights(const Problem& p) { return p.quant.row_block == 128; }

// The fields every FP8 problem shares; row_block picks the weight scheme.
Problem fp8_problem(XScale xs, int row_block, DType scale_dtype) {
  Problem p;
  p.input_dtype = DType::fp8_e4m3;
  p.x_scale = xs;
  p.quantized = true;
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, row_block == 128 ? 128 : 0, row_block};
  p.scale_dtype = scale_dtype;
  return p;
}

// K > 8192 (clusters of two CTAs, which need M > 128): each float64
// reference of such a case costs at most about this many multiply-adds
// (U small, M down to 129).
constexpr int64_t kLongKReferenceBudget = 16'000'000;

// What the dispatcher's reason says of the promoting kernels (each k-block
// summed in an accumulator of its own; dispatch.cpp's select_fp8).
constexpr const char* kPromotingReason = "in its own accumulator";

// A random FP8 problem. X scaled per tensor, row or 1 x 128 block; weights
// per tensor, channel or 128 x 128 block (without `blocks`: no block scales
// of either, the schemes GATEDMLP_FP8_PROMOTE=1 applies to). Blocked
// weights take separate tensors (any U, odd ones too) or fused ones whose
// interleave block is a multiple of 128 (stacked, U a multiple of 128, or
// G = 128 / 256), either half first. One case in 48 has K > 8192.
Problem random_fp8_problem(std::mt19937_64& rng, bool blocks = true) {
  const XScale xs = blocks ? kXScales[rng() % 3] : kXScales[rng() % 2];
  const int scheme = blocks ? kWeightSchemes[rng() % 3] : kWeightSchemes[rng() % 2];
  Problem p = fp8_problem(xs, scheme, static_cast<DType>(rng() % 3));
  const bool blocked = blocked_weights(p);
  // M: tile edges (64-row wgmma halves, 128-row tiles), several row tiles, anything.
  const int mk = int(rng() % 4);
  p.m = mk == 0 ? pick(rng, {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65})
        : mk == 1 ? pick(rng, {127, 128, 129, 200, 255, 256, 257, 383, 384, 385, 511, 512, 513, 600})
                  : 1 + int64_t(rng() % 600);
  // K: multiples of 16, one 32-deep wgmma slice and less, whole 128-deep
  // k-blocks and tails (a partial last k-block: the last X / weight block
  // scale covers less than 128 of K).
  p.k = rng() % 2 ? pick(rng, {16, 32, 48, 112, 128, 144, 240, 256, 272, 384, 496, 512, 528, 1008, 1024, 1040, 2032, 2048})
                  : 16 * (1 + int64_t(rng() % 128));
  const bool long_k = rng() % 48 == 0;
  const int layout = int(rng() % 8);
  if (long_k) {
    // Clusters of two: M > 128 and K > 8192, whole and partial last k-blocks;
    // U small (the float64 references), so blocked weights are separate.
    p.m = 129 + int64_t(rng() % 200);
    p.k = pick(rng, {8208, 8336, 8448, 8464, 9216, 12304});
    if (blocked || layout <= 3) {
      p.weights.format = WeightFormat::separate;
      p.u = 1 + int64_t(rng() % 6);
    } else if (layout <= 5) {
      p.u = 1 + int64_t(rng() % 6);  // stacked
    } else {
      const int64_t g = pick(rng, {1, 2});
      p.weights.group = g;
      p.u = g * (1 + int64_t(rng() % 3));
    }
  } else if (blocked) {
    if (layout <= 2) {
      p.weights.format = WeightFormat::separate;
      p.u = random_u(rng);
    } else if (layout <= 4) {
      p.u = 128 * pick(rng, {1, 2, 3});
      if (rng() % 4 == 0) p.weights.group = p.u;  // stacked, spelled G = U
    } else {
      const int64_t g = pick(rng, {128, 128, 256});
      p.weights.group = g;
      p.u = g * (g == 128 ? pick(rng, {2, 3}) : 2);
    }
  } else if (layout == 0) {
    p.weights.format = WeightFormat::separate;
    p.u = random_u(rng);
  } else if (layout <= 2) {
    p.u = random_u(rng);
    if (rng() % 4 == 0) p.weights.group = p.u;  // stacked, spelled G = U
  } else {
    const int64_t g = kGroups[rng() % std::size(kGroups)];
    p.weights.group = g;
    p.u = g * (g >= 64 ? pick(rng, {1, 2, 3}) : g == 32 ? pick(rng, {1, 2, 3, 5}) : pick(rng, {1, 3, 5, 9, 17, 33}));
    if (g <= 2 && rng() % 2) p.u = g * (1 + int64_t(rng() % 200));
  }
  if (p.weights.format == WeightFormat::fused) p.weights.first = rng() % 2 ? Half::up : Half::gate;
  p.activation = static_cast<Activation>(rng() % 5);
  if (p.activation == Activation::swiglu_clamped && rng() % 2) {
    p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;  // small limits: the clamp really bites
    p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
  }
  p.output_dtype = static_cast<DType>(rng() % 4);  // fp8_e4m3 = 3: an FP8 Y with its scales
  if (p.output_dtype == DType::fp8_e4m3) {
    p.y_scale_layout = rng() % 2 ? YScaleLayout::mn_major : YScaleLayout::row_major;
    p.has_y_amax = rng() % 2;
  }
  const float alphas[] = {1.0f, 1.0f, 0.5f, -1.5f, 2.75f};
  p.alpha = alphas[rng() % 5];
  if (long_k) {
    while (p.m * 2 * p.u * p.k > kLongKReferenceBudget && p.m > 129) p.m = std::max<int64_t>(129, p.m / 2);
  } else {
    fit_budget(p, &rng);
  }
  random_bias_and_preact(p, rng);  // U is final
  if (rng() % 3 == 0) p.ldx = p.k + 16 * pick(rng, {1, 2, 5});
  if (rng() % 4 == 0) p.weights.ld = p.k / 4 + 4 * pick(rng, {1, 2, 8});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  return p;
}

// ---------------------------------------------------------------- data

// How a case's e4m3 bytes and scales are drawn (see the file comment).
struct Fp8Data {
  bool extremes = false;        // only +-448, +-0, subnormals and the smallest normals
  double x_range = 2, w_range = 2;  // e4m3 values drawn uniform in [-range, range]
  bool negative_scales = false;     // half the scales negated
};

Fp8Data random_data(std::mt19937_64& rng) {
  Fp8Data d;
  d.extremes = rng() % 10 == 0;
  const double ranges[] = {1, 2, 16, 448};
  d.x_range = ranges[rng() % 4];
  d.w_range = ranges[1 + rng() % 3];
  d.negative_scales = rng() % 8 == 0;
  return d;
}

std::string describe(const Fp8Data& d) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "data: %s, x range %g, w range %g%s", d.extremes ? "extremes only" : "uniform",
                d.x_range, d.w_range, d.negative_scales ? ", half the scales negative" : "");
  return buf;
}

uint8_t draw_e4m3(std::mt19937_64& rng, bool extremes, double range) {
  static const uint8_t kExtremes[] = {0x7E, 0xFE, 0x7E, 0xFE, 0x7E, 0xFE, 0x00, 0x80, 0x01, 0x81, 0x08, 0x88};
  static const uint8_t kSpecial[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x08, 0x88};  // zeros, subnormals, min normals
  if (extremes) return kExtremes[rng() % std::size(kExtremes)];
  if (rng() % 64 == 0) return kSpecial[rng() % std::size(kSpecial)];
  std::uniform_real_distribution<double> u(-range, range);
  return ref::double_to_e4m3(u(rng));
}

// A positive scale around `nominal`: times 2^[lo, hi), negated half the time
// with `negative`.
double draw_scale(std::mt19937_64& rng, double nominal, double lo, double hi, bool negative) {
  std::uniform_real_distribution<double> e(lo, hi);
  const double s = nominal * std::exp2(e(rng));
  return negative && rng() % 2 ? -s : s;
}

// One FP8 weight tensor: `rows` rows of ld words (the e4m3 bytes of K, NaN
// codes after), and its scales of scale_dtype: 1, `rows`, or [ceil(rows /
// 128), ceil(K / 128)] for 128 x 128 blocks.
struct Fp8Weights {
  Tensor words, scales;
};

void make_fp8_weights(const Problem& r, int64_t rows, const Fp8Data& d, std::mt19937_64& rng, Fp8Weights* w) {
  const int64_t ld_bytes = r.weights.ld * 4;
  w->words.host.assign(size_t((rows - 1) * ld_bytes + r.k), kE4m3Nan);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t c = 0; c < r.k; ++c) w->words.host[size_t(row * ld_bytes + c)] = draw_e4m3(rng, d.extremes, d.w_range);
  // Dequantized weights of RMS ~1/sqrt(K) (with X of RMS ~1: g and u of order 1).
  const double nominal = (d.extremes ? 1.0 / 448 : 2.0 / d.w_range) / std::sqrt(double(r.k));
  // Per channel and per block: each scale its own draw over 2^[-2, 1), so
  // that a kernel applying another row's or block's scale is far off.
  const int64_t n = quant_scale_rows(r.quant, rows) * quant_groups_per_row(r.quant, r.k);
  w->scales.host.assign(size_t(n) * dtype_size(r.scale_dtype), 0);
  for (int64_t i = 0; i < n; ++i)
    ref::store_from_double(w->scales.host.data(), r.scale_dtype, i,
                           n > 1 ? draw_scale(rng, nominal, -2, 1, d.negative_scales)
                                 : draw_scale(rng, nominal, -1, 1, d.negative_scales));
  w->words.upload();
  w->scales.upload();
}

// The same weights with every sign bit and scale sign cleared: the
// magnitudes' reference.
Fp8Weights abs_weights(const Problem& r, const Fp8Weights& w) {
  Fp8Weights a;
  a.words.host = w.words.host;
  for (unsigned char& b : a.words.host) b = static_cast<unsigned char>(b & 0x7F);
  a.scales.host = w.scales.host;
  const int64_t n = int64_t(w.scales.host.size() / dtype_size(r.scale_dtype));
  for (int64_t i = 0; i < n; ++i)
    ref::store_from_double(a.scales.host.data(), r.scale_dtype, i,
                           std::fabs(ref::load_as_double(w.scales.host.data(), r.scale_dtype, i)));
  return a;
}

// ---------------------------------------------------------------- the bound

double unit_roundoff(DType dt) { return dt == DType::bf16 ? 0x1p-8 : dt == DType::fp16 ? 0x1p-11 : 0x1p-24; }
double subnormal_floor(DType dt) { return dt == DType::fp16 ? 0x1p-24 : 0.0; }

// The fp32 sums' error per unit of A (see the file comment).
double acc_error(int64_t k) { return 0x1p-11 * double(std::min<int64_t>((k + 31) / 32, 4)); }

// Error bound of one gate or up pre-activation value, and of the output.
double pre_bound(int64_t k, double a, double v) { return acc_error(k) * a + 0x1p-20 * (a + std::fabs(v) + 1.0); }

// The fp32 value of Y before it is rounded to the output: its sums' error
// through the GLU and the activation's own (act, see the file comment).
double glu_bound(double act, double g, double u, double dg, double du) {
  const double ue = std::fabs(u) + 1.0 + du, ge = std::fabs(g) + dg;
  return 1.01 * (1.2 * ue * dg + ge * du + act * ge * ue);
}

double y_bound(DType out, double want, double g, double u, double dg, double du) {
  const double act = out == DType::fp32 ? 4e-7 : 8e-6;  // FP8 Y: the 16-bit outputs' forms
  if (out == DType::fp8_e4m3) return glu_bound(act, g, u, dg, du);  // the value before quantization (check_fp8_y)
  return unit_roundoff(out) * std::fabs(want) + glu_bound(act, g, u, dg, du) + subnormal_floor(out);
}

// The spacing of e4m3fn values at magnitude t (t <= 448): 2^(e - 3) in
// [2^e, 2^(e + 1)), 2^-9 among the subnormals (below 2^-6).
double e4m3_spacing(double t) {
  if (!(t >= 0x1p-6)) return 0x1p-9;
  return std::ldexp(1.0, std::ilogb(std::min(t, 448.0)) - 3);
}

// ---------------------------------------------------------------- one case

struct Fp8Stats {
  int cases = 0, runs = 0;
  int separate = 0, stacked = 0, interleaved = 0, up_first = 0;
  int x_row = 0, x_block = 0, w_channel = 0, w_block = 0, multi_tile = 0, m_odd = 0, u_no_tma = 0, long_k = 0,
      k_partial = 0, k_clusters = 0, padded_x = 0, padded_y = 0, preact = 0, bias = 0, extremes = 0, negative = 0;
  int by_act[5] = {0, 0, 0, 0, 0}, by_out[4] = {0, 0, 0, 0}, y_mn = 0, y_amax = 0;
  double worst_ratio = 0;                 // largest |error| / bound over every element checked
  double worst_rms[3] = {0, 0, 0};        // largest norm-wise error by output dtype
  void count(const Problem& p, const Fp8Data& d) {
    const Problem r = p.resolved();
    cases++;
    if (r.weights.format == WeightFormat::separate) separate++;
    else if (r.weights.group == r.u) stacked++;
    else interleaved++;
    up_first += r.weights.format == WeightFormat::fused && r.weights.first == Half::up;
    x_row += r.x_scale == XScale::row;
    x_block += r.x_scale == XScale::block;
    w_channel += r.quant.row_block == 1;
    w_block += r.quant.row_block == 128;
    multi_tile += r.m > 128;
    m_odd += r.m % 8 != 0;
    u_no_tma += r.u % 8 != 0;
    long_k += r.k >= 1024;
    k_partial += r.k % 128 != 0;
    k_clusters += r.k > 8192 && r.m > 128;
    padded_x += r.ldx > r.k;
    padded_y += r.ldy > r.u;
    preact += r.has_preact;
    bias += r.has_bias;
    extremes += d.extremes;
    negative += d.negative_scales;
    by_act[int(r.activation)]++;
    by_out[int(r.output_dtype)]++;
    y_mn += r.output_dtype == DType::fp8_e4m3 && r.y_scale_layout == YScaleLayout::mn_major;
    y_amax += r.output_dtype == DType::fp8_e4m3 && r.has_y_amax;
  }
  void print(const char* what) const {
    std::printf(
        "[ cases ] %s: %d cases, %d runs passed (separate %d, stacked %d, interleaved %d, up first %d; x per row %d, "
        "x per block %d, w per channel %d, w per block %d; M > 128 %d, M %% 8 != 0 %d, U %% 8 != 0 %d, K >= 1024 %d, "
        "K %% 128 != 0 %d, K > 8192 with M > 128 %d; padded x %d, padded y %d; bias %d, preact %d; extremes %d, "
        "negative scales %d; silu %d gelu_tanh %d gelu_erf %d relu %d clamped %d; out bf16 %d fp16 %d fp32 %d fp8 %d "
        "(scales MN-major %d, amax %d))\n",
        what, cases, runs, separate, stacked, interleaved, up_first, x_row, x_block, w_channel, w_block, multi_tile,
        m_odd, u_no_tma, long_k, k_partial, k_clusters, padded_x, padded_y, bias, preact, extremes, negative,
        by_act[0], by_act[1], by_act[2], by_act[3], by_act[4], by_out[0], by_out[1], by_out[2], by_out[3], y_mn,
        y_amax);
    std::printf("[ error ] worst |error| / bound %.3f; worst RMS error (over max(RMS, 1)): bf16 %.3g, fp16 %.3g, "
                "fp32 %.3g\n",
                worst_ratio, worst_rms[0], worst_rms[1], worst_rms[2]);
  }
};

// The FP8 runs: GATEDMLP_FORCE_PATH unset (the FP8 calls have one kernel),
// with and without the workspace, the split tail forced, one cluster (every
// item after another), clusters of two (the multicast pairs the library
// picks above K = 8192) with the split forced.
const Variant kFp8AsIs{"fp8, as is", true, nullptr, true};
const Variant kFp8NoWorkspace{"fp8, no workspace", true, nullptr, false};
const Variant kFp8SplitForced{"fp8, split tail forced", true, nullptr, true, "force"};
const Variant kFp8OneCluster{"fp8, one cluster", true, nullptr, true, nullptr, "1"};
const Variant kFp8Pairs{"fp8, GATEDMLP_SM90_CLUSTER=2, split tail forced", true, nullptr, true, "force", nullptr,
                        nullptr, "2"};

struct Fp8Options {
  std::vector<Variant> variants{kFp8AsIs};
  std::optional<Fp8Data> data;   // unset: drawn
  std::string log_must_contain;  // if set: the first run's GATEDMLP_LOG=1 output must contain it
  // If set: whether the plan must take the promoting kernels, as its
  // reason says (kPromotingReason).
  std::optional<bool> promotes;
};

// Checks an output in device layout [rows, ld] (`cols` valid) against the
// bound; every padding element must still be the poison. want_and_bound(row,
// col, &want, &bound, detail) gives the reference and its bound (and, with
// detail non-null, the values behind them, for the failure message).
template <typename Want>
::testing::AssertionResult check_output(const char* name, const std::vector<unsigned char>& out,
                                        const std::vector<unsigned char>& poison, DType dt, int64_t rows, int64_t ld,
                                        int64_t cols, Want want_and_bound, double* worst_ratio, double* rms) {
  const size_t es = dtype_size(dt);
  if (out.size() != poison.size()) return ::testing::AssertionFailure() << name << ": download of the wrong size";
  double sq_diff = 0, sq_ref = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < int64_t(out.size() / es); ++i) {
    const int64_t row = i / ld, col = i % ld;
    if (col >= cols || row >= rows) {
      if (std::memcmp(&out[size_t(i) * es], &poison[size_t(i) * es], es) != 0)
        return ::testing::AssertionFailure() << name << "[" << row << "][" << col << "] is padding (ld=" << ld
                                             << ", " << cols << " columns) and was written: "
                                             << ref::load_as_double(out.data(), dt, i);
      continue;
    }
    const double got = ref::load_as_double(out.data(), dt, i);
    double want = 0, bound = 0;
    want_and_bound(row, col, &want, &bound, nullptr);
    const double err = std::fabs(got - want);
    if (!std::isfinite(got) || !(err <= bound)) {
      std::string detail;
      want_and_bound(row, col, &want, &bound, &detail);
      if (!std::isfinite(got))
        return ::testing::AssertionFailure() << name << "[" << row << "][" << col << "] = " << got
                                             << " (not written, or NaN); reference " << want << " (" << detail << ")";
      return ::testing::AssertionFailure() << name << "[" << row << "][" << col << "] = " << got << ", reference "
                                           << want << ": error " << err << " > bound " << bound << " (" << detail
                                           << ")";
    }
    if (bound > 0) *worst_ratio = std::max(*worst_ratio, err / bound);
    sq_diff += err * err;
    sq_ref += want * want;
    n++;
  }
  *rms = std::sqrt(sq_diff / std::max(sq_ref, double(std::max<int64_t>(n, 1))));
  return ::testing::AssertionSuccess();
}

// An FP8 Y (output_dtype = fp8_e4m3) against the reference: each 1 x 128
// group's scale s must be its amax / 448 (448 s within the group's largest
// bound of the reference's amax; fp32 division: 2^-22), each byte q a
// finite e4m3 value with q s within half an e4m3 step (at the larger of
// |q| and the reference over s) of the reference, plus the value's own
// bound (want_and_bound's, before quantization) and the fp32 roundings of
// 448 / amax and of the product. The padding of Y and of y_scales (the
// MN-major columns past M) must still hold the poison. With has_y_amax:
// the amax within the largest bound of max |y|, and exactly consistent
// with the scales (amax x fp32(1 / 448) = the largest scale). `fp8` and
// `scales` return the bytes and scales read.
template <typename Want>
::testing::AssertionResult check_fp8_y(const Problem& r, const std::vector<unsigned char>& y,
                                       const std::vector<unsigned char>& y_poison,
                                       const std::vector<unsigned char>& ys_bytes,
                                       const std::vector<unsigned char>& ys_poison,
                                       const std::vector<unsigned char>& amax_bytes, Want want_and_bound,
                                       double* worst_ratio, std::vector<float>* scales) {
  const int64_t groups = (r.u + 127) / 128, ld = (r.m + 3) / 4 * 4;
  const bool mn = r.y_scale_layout == YScaleLayout::mn_major;
  auto sidx = [&](int64_t row, int64_t c) { return size_t(mn ? c * ld + row : row * groups + c); };
  if (y.size() != y_poison.size() || ys_bytes.size() != ys_poison.size())
    return ::testing::AssertionFailure() << "download of the wrong size";
  std::vector<float>& ys = *scales;
  ys.resize(ys_bytes.size() / 4);
  std::memcpy(ys.data(), ys_bytes.data(), ys_bytes.size());
  for (size_t i = 0; i < y.size(); ++i)
    if (int64_t(i) % r.ldy >= r.u && y[i] != y_poison[i])
      return ::testing::AssertionFailure() << "y[" << int64_t(i) / r.ldy << "][" << int64_t(i) % r.ldy
                                           << "] is padding (ldy=" << r.ldy << ", u=" << r.u << ") and was written";
  std::vector<char> used(ys.size(), 0);
  for (int64_t row = 0; row < r.m; ++row)
    for (int64_t c = 0; c < groups; ++c) used[sidx(row, c)] = 1;
  for (size_t i = 0; i < ys.size(); ++i)
    if (!used[i] && std::memcmp(&ys_bytes[4 * i], &ys_poison[4 * i], 4) != 0)
      return ::testing::AssertionFailure() << "y_scales[" << i << "] lies in the MN-major padding (ld " << ld
                                           << ", m " << r.m << ") and was written: " << ys[i];
  double amax_all = 0, slack_all = 0;
  float max_scale = 0;
  for (int64_t row = 0; row < r.m; ++row)
    for (int64_t c = 0; c < groups; ++c) {
      const int64_t j0 = 128 * c, j1 = std::min(r.u, j0 + 128);
      double ref_amax = 0, slack = 0, want = 0, b = 0;
      for (int64_t j = j0; j < j1; ++j) {
        want_and_bound(row, j, &want, &b, nullptr);
        ref_amax = std::max(ref_amax, std::fabs(want));
        slack = std::max(slack, b);
      }
      amax_all = std::max(amax_all, ref_amax);
      slack_all = std::max(slack_all, slack);
      const float sf = ys[sidx(row, c)];
      const double sc = sf, a = std::max(ref_amax, 1e-10);
      if (!(std::isfinite(sc) && sc > 0))
        return ::testing::AssertionFailure() << "y_scales[" << row << "][" << c << "] = " << sc
                                             << " (not written, or not positive); reference amax " << ref_amax;
      if (!(std::fabs(448 * sc - a) <= slack + 0x1p-22 * a))
        return ::testing::AssertionFailure() << "y_scales[" << row << "][" << c << "] = " << sc << ": 448 s = "
                                             << 448 * sc << ", reference amax " << a << ", error "
                                             << std::fabs(448 * sc - a) << " > bound " << slack + 0x1p-22 * a;
      max_scale = std::max(max_scale, sf);
      for (int64_t j = j0; j < j1; ++j) {
        const uint8_t q = y[size_t(row * r.ldy + j)];
        const double v = ref::e4m3_to_double(q);
        want_and_bound(row, j, &want, &b, nullptr);
        const double t = std::max(std::fabs(v), (std::fabs(want) + b) / sc);
        const double bound = 0.5 * e4m3_spacing(t) * sc + b + 0x1p-22 * (std::fabs(want) + b) + 448 * 0x1p-22 * sc;
        const double err = std::fabs(v * sc - want);
        if (!std::isfinite(v) || !(err <= bound)) {
          std::string detail;
          want_and_bound(row, j, &want, &b, &detail);
          return ::testing::AssertionFailure()
                 << "y[" << row << "][" << j << "] = e4m3 0x" << std::hex << int(q) << std::dec << " = " << v
                 << ", times its scale " << sc << " = " << v * sc << "; reference " << want << ": error " << err
                 << " > bound " << bound << " (half an e4m3 step " << 0.5 * e4m3_spacing(t) * sc
                 << " + the value's bound " << b << "; " << detail << ")";
        }
        if (bound > 0) *worst_ratio = std::max(*worst_ratio, err / bound);
      }
    }
  if (r.has_y_amax) {
    float am = 0;
    std::memcpy(&am, amax_bytes.data(), 4);
    if (!(std::fabs(double(am) - amax_all) <= slack_all + 0x1p-22 * amax_all))
      return ::testing::AssertionFailure() << "y_amax = " << am << ", reference max |y| " << amax_all << ", error "
                                           << std::fabs(double(am) - amax_all) << " > bound " << slack_all;
    if (am >= 1e-10f && am * (1.0f / 448.0f) != max_scale)
      return ::testing::AssertionFailure() << "y_amax = " << am << " but the largest scale is " << max_scale
                                           << " (448 x that = " << 448.0 * max_scale
                                           << "), not fp32(amax x fp32(1 / 448)) = " << am * (1.0f / 448.0f);
  }
  return ::testing::AssertionSuccess();
}

void run_fp8_case(const Problem& p, std::mt19937_64& rng, Fp8Stats* st, const Fp8Options& opt = Fp8Options{}) {
  const Fp8Data d = opt.data ? *opt.data : random_data(rng);
  SCOPED_TRACE(to_string(p) + "; " + describe(d));
  {
    const Status s = check_support(p);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  const Problem r = p.resolved();
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t rows_w = sep ? r.u : 2 * r.u, G = sep ? r.u : r.weights.group;
  const int first = static_cast<int>(r.weights.first);

  // X: e4m3 bytes, NaN codes in the padding; its fp32 scales.
  Tensor x, xs;
  x.host.assign(size_t(one_batch_extent(r.m, r.ldx, r.k)), kE4m3Nan);
  for (int64_t row = 0; row < r.m; ++row)
    for (int64_t c = 0; c < r.k; ++c) x.host[size_t(row * r.ldx + c)] = draw_e4m3(rng, d.extremes, d.x_range);
  const double x_nominal = d.extremes ? 1.0 / 448 : 2.0 / d.x_range;  // dequantized X of magnitude ~1
  // One per tensor, per row, or per row and 128 of K ([m, ceil(k / 128)]):
  // each per-row or per-block scale its own draw over 2^[-2, 1).
  const int64_t k_groups = (r.k + 127) / 128;
  const int64_t n_xs = r.x_scale == XScale::row ? r.m : r.x_scale == XScale::block ? r.m * k_groups : 1;
  std::vector<float> sx(static_cast<size_t>(n_xs));
  for (float& s : sx)
    s = float(n_xs > 1 ? draw_scale(rng, x_nominal, -2, 1, d.negative_scales)
                       : draw_scale(rng, x_nominal, -1, 1, d.negative_scales));
  // The scale of X element (row, c).
  auto sx_index = [&](int64_t row, int64_t c) -> size_t {
    return size_t(r.x_scale == XScale::row ? row : r.x_scale == XScale::block ? row * k_groups + c / 128 : 0);
  };
  xs.host.resize(sx.size() * 4);
  std::memcpy(xs.host.data(), sx.data(), xs.host.size());

  Fp8Weights wg, wu;
  make_fp8_weights(r, rows_w, d, rng, &wg);
  if (sep) make_fp8_weights(r, rows_w, d, rng, &wu);
  Tensor b, bu;
  if (r.has_bias) {
    fill(b.host, r.bias_dtype, rows_w, rng, -0.5f, 0.5f);
    if (sep) fill(bu.host, r.bias_dtype, rows_w, rng, -0.5f, 0.5f);
  }
  for (Tensor* t : {&x, &xs, &b, &bu}) t->upload();

  const int64_t y_n = one_batch_extent(r.m, r.ldy, r.u);
  const int64_t pre_n = r.has_preact ? one_batch_extent(r.m, r.ldpre, 2 * r.u) : 0;
  const std::vector<unsigned char> y_poison = nan_filled(r.output_dtype, y_n);
  const std::vector<unsigned char> pre_poison = nan_filled(r.preact_dtype, pre_n);
  // An FP8 Y's scales (the MN-major layout's padding poisoned too) and amax.
  const bool fp8_y = r.output_dtype == DType::fp8_e4m3;
  const int64_t y_groups = (r.u + 127) / 128;
  const int64_t ys_n = !fp8_y ? 0
                       : r.y_scale_layout == YScaleLayout::mn_major ? y_groups * ((r.m + 3) / 4 * 4)
                                                                    : r.m * y_groups;
  const std::vector<unsigned char> ys_poison = nan_filled(DType::fp32, ys_n), amax_poison = nan_filled(DType::fp32, 1);
  std::vector<unsigned char> first_y;  // the first run's FP8 Y and scales (compared with a bf16 Y below)
  std::vector<float> first_scales;

  // The references: X dequantized to fp32, the FP8 weights read exactly;
  // g and u from the pre-activation, and the magnitudes A likewise.
  std::vector<float> xd(size_t(one_batch_extent(r.m, r.ldx, r.k)), 0.f), xa(xd.size(), 0.f);
  for (int64_t row = 0; row < r.m; ++row)
    for (int64_t c = 0; c < r.k; ++c) {
      const size_t i = size_t(row * r.ldx + c);
      xd[i] = float(ref::e4m3_to_double(x.host[i]) * double(sx[sx_index(row, c)]));
      xa[i] = std::fabs(xd[i]);
    }
  Problem pr = p;
  pr.input_dtype = DType::fp32;  // the reference reads X as fp32 (never a library call)
  pr.has_preact = true;
  pr.ldpre = 0;
  Arguments h;
  h.x = xd.data();
  h.w = wg.words.host.data();
  h.w_scales = wg.scales.host.data();
  h.w_up = sep ? wu.words.host.data() : nullptr;
  h.w_up_scales = sep ? wu.scales.host.data() : nullptr;
  h.bias = r.has_bias ? b.host.data() : nullptr;
  h.bias_up = r.has_bias && sep ? bu.host.data() : nullptr;
  std::vector<double> y_ref, pre_ref;
  ref::cpu_reference(pr, h, &y_ref, &pre_ref);
  Problem pa = pr;
  pa.alpha = std::fabs(p.alpha);
  pa.has_bias = false;
  const Fp8Weights wga = abs_weights(r, wg), wua = sep ? abs_weights(r, wu) : Fp8Weights{};
  Arguments ha;
  ha.x = xa.data();
  ha.w = wga.words.host.data();
  ha.w_scales = wga.scales.host.data();
  ha.w_up = sep ? wua.words.host.data() : nullptr;
  ha.w_up_scales = sep ? wua.scales.host.data() : nullptr;
  std::vector<double> y_abs, mag;
  ref::cpu_reference(pa, ha, &y_abs, &mag);
  ASSERT_EQ(pre_ref.size(), size_t(r.m * 2 * r.u));
  ASSERT_EQ(mag.size(), pre_ref.size());

  auto pre_cols = [&](int64_t j, int64_t* cg, int64_t* cu) {
    *cg = sep ? j : detail::fused_row<int64_t>(j, 0, G, first);
    *cu = sep ? r.u + j : detail::fused_row<int64_t>(j, 1, G, first);
  };
  auto y_want = [&](int64_t row, int64_t j, double* want, double* bound, std::string* detail) {
    int64_t cg = 0, cu = 0;
    pre_cols(j, &cg, &cu);
    const size_t o = size_t(row * 2 * r.u);
    const double g = pre_ref[o + size_t(cg)], u = pre_ref[o + size_t(cu)];
    const double ag = mag[o + size_t(cg)], au = mag[o + size_t(cu)];
    const double dg = pre_bound(r.k, ag, g), du = pre_bound(r.k, au, u);
    *want = y_ref[size_t(row * r.u + j)];
    *bound = y_bound(r.output_dtype, *want, g, u, dg, du);
    if (!detail) return;
    char buf[240];
    std::snprintf(buf, sizeof buf, "g=%.9g u=%.9g, |.| sums A_g=%.6g A_u=%.6g, x scale %.9g%s", g, u, ag, au,
                  double(sx[sx_index(row, 0)]), r.x_scale == XScale::block ? " (its first k-block's)" : "");
    *detail = buf;
  };
  auto pre_want = [&](int64_t row, int64_t c, double* want, double* bound, std::string* detail) {
    const size_t o = size_t(row * 2 * r.u + c);
    *want = pre_ref[o];
    *bound = unit_roundoff(r.preact_dtype) * std::fabs(*want) + 1.01 * pre_bound(r.k, mag[o], *want) +
             subnormal_floor(r.preact_dtype);
    if (!detail) return;
    char buf[120];
    std::snprintf(buf, sizeof buf, "|.| sum A=%.6g", mag[o]);
    *detail = buf;
  };

  Arguments a;
  a.x = x.dev.p;
  a.x_scales = xs.dev.p;
  a.w = wg.words.dev.p;
  a.w_scales = wg.scales.dev.p;
  a.w_up = sep ? wu.words.dev.p : nullptr;
  a.w_up_scales = sep ? wu.scales.dev.p : nullptr;
  a.bias = r.has_bias ? b.dev.p : nullptr;
  a.bias_up = r.has_bias && sep ? bu.dev.p : nullptr;

  for (const Variant& v : opt.variants) {
    std::optional<ScopedEnv> force_env, split_env, clusters_env, cluster_env;
    if (v.set_env) force_env.emplace(kForcePathEnv, v.force_path);
    if (v.split_tail) split_env.emplace("GATEDMLP_SM90_SPLIT_TAIL", v.split_tail);
    if (v.clusters) clusters_env.emplace("GATEDMLP_SM90_CLUSTERS", v.clusters);
    if (v.cluster) cluster_env.emplace("GATEDMLP_SM90_CLUSTER", v.cluster);
    Config cfg;
    const Status sp = plan(p, &cfg);
    ASSERT_TRUE(sp.ok()) << v.label << ": plan: " << sp.message();
    SCOPED_TRACE(std::string(v.label) + ": " + to_string(cfg));
    EXPECT_EQ(cfg.path, KernelPath::sm90_wgmma) << cfg.reason;
    EXPECT_NE(cfg.reason.find("FP8"), std::string::npos) << "the plan's reason names no FP8: " << cfg.reason;
    if (opt.promotes) {
      EXPECT_EQ(cfg.reason.find(kPromotingReason) != std::string::npos, *opt.promotes)
          << (*opt.promotes ? "expected the promoting kernels: " : "expected the non-promoting kernels: ")
          << cfg.reason;
    }

    Tensor y, pre, ys, amax;
    y.host = y_poison;
    pre.host = pre_poison;
    ys.host = ys_poison;
    amax.host = amax_poison;
    for (Tensor* t : {&y, &pre, &ys, &amax}) t->upload();
    a.y = y.dev.p;
    a.preact = r.has_preact ? pre.dev.p : nullptr;
    a.y_scales = fp8_y ? static_cast<float*>(ys.dev.p) : nullptr;
    a.y_amax = fp8_y && r.has_y_amax ? static_cast<float*>(amax.dev.p) : nullptr;
    // The workspace arrives holding garbage: its contents need no initialisation.
    const size_t ws_bytes = v.workspace ? workspace_size(p) : 0;
    DeviceBuffer ws(ws_bytes);
    ASSERT_EQ(ws.bytes, ws_bytes) << "cudaMalloc of the workspace";
    if (ws_bytes) CUDA_OK(cudaMemset(ws.p, 0xff, ws_bytes));
    const Status s = run_checking_log(p, a, ws.p, ws_bytes,
                                      &v == &opt.variants.front() ? opt.log_must_contain : std::string(), v.label);
    ASSERT_TRUE(s.ok()) << s.message();
    CUDA_OK(sync_within(std::string(v.label) + ": " + to_string(p) + " -> " + to_string(cfg)));

    if (fp8_y) {
      std::vector<float> scales;
      const std::vector<unsigned char> yb = y.download();
      ASSERT_TRUE(check_fp8_y(r, yb, y_poison, ys.download(), ys_poison, amax.download(), y_want, &st->worst_ratio,
                              &scales));
      if (first_y.empty()) {
        first_y = yb;
        first_scales = scales;
      }
    } else {
      double rms = 0;
      ASSERT_TRUE(check_output("y", y.download(), y_poison, r.output_dtype, r.m, r.ldy, r.u, y_want,
                               &st->worst_ratio, &rms));
      EXPECT_LE(rms, 1e-2) << "norm-wise error of y: RMS error over max(RMS, 1) = " << rms;
      double& worst = st->worst_rms[int(r.output_dtype)];
      worst = std::max(worst, rms);
    }
    if (r.has_preact) {
      double pre_rms = 0;
      ASSERT_TRUE(check_output("preact", pre.download(), pre_poison, r.preact_dtype, r.m, r.ldpre, 2 * r.u, pre_want,
                               &st->worst_ratio, &pre_rms));
    }
    st->runs++;
  }
  if (fp8_y) {
    // The same call with a bf16 Y, under the first variant's settings (the
    // same kernel and schedule, so the same fp32 sums): each FP8 value
    // times its scale within one e4m3 step (at the larger of |q| and the
    // bf16 value over s) of the bf16 Y, plus the bf16 Y's own rounding and
    // the difference of the two activation forms (the bf16 Y stored
    // without TMA takes the exact one).
    const Variant& v = opt.variants.front();
    std::optional<ScopedEnv> force_env, split_env, clusters_env, cluster_env;
    if (v.set_env) force_env.emplace(kForcePathEnv, v.force_path);
    if (v.split_tail) split_env.emplace("GATEDMLP_SM90_SPLIT_TAIL", v.split_tail);
    if (v.clusters) clusters_env.emplace("GATEDMLP_SM90_CLUSTERS", v.clusters);
    if (v.cluster) cluster_env.emplace("GATEDMLP_SM90_CLUSTER", v.cluster);
    Problem pb = p;
    pb.output_dtype = DType::bf16;
    pb.has_y_amax = false;
    pb.has_preact = false;
    Tensor yb;
    yb.host = nan_filled(DType::bf16, y_n);
    yb.upload();
    Arguments ab = a;
    ab.y = yb.dev.p;
    ab.preact = nullptr;
    ab.y_scales = nullptr;
    ab.y_amax = nullptr;
    const size_t ws_bytes = v.workspace ? workspace_size(pb) : 0;
    DeviceBuffer ws(ws_bytes);
    const Status s = run(pb, ab, ws.p, ws_bytes, nullptr);
    ASSERT_TRUE(s.ok()) << "the bf16 Y: " << s.message();
    CUDA_OK(sync_within("the bf16 Y of " + to_string(p)));
    const std::vector<unsigned char> ybf = yb.download();
    const int64_t ld = (r.m + 3) / 4 * 4;
    const bool mn = r.y_scale_layout == YScaleLayout::mn_major;
    for (int64_t row = 0; row < r.m; ++row)
      for (int64_t j = 0; j < r.u; ++j) {
        const double sc = first_scales[size_t(mn ? (j / 128) * ld + row : row * y_groups + j / 128)];
        const double q = ref::e4m3_to_double(first_y[size_t(row * r.ldy + j)]);
        const double vb = ref::load_as_double(ybf.data(), DType::bf16, row * r.ldy + j);
        int64_t cg = 0, cu = 0;
        cg = sep ? j : detail::fused_row<int64_t>(j, 0, G, first);
        cu = sep ? r.u + j : detail::fused_row<int64_t>(j, 1, G, first);
        const size_t o = size_t(row * 2 * r.u);
        const double g = pre_ref[o + size_t(cg)], u = pre_ref[o + size_t(cu)];
        const double t = std::max(std::fabs(q), std::fabs(vb) / sc);
        const double bound = e4m3_spacing(t) * sc + 0x1p-8 * std::fabs(vb) +
                             1.6e-5 * (std::fabs(g) + 1) * (std::fabs(u) + 1) + 448 * 0x1p-22 * sc;
        ASSERT_LE(std::fabs(q * sc - vb), bound)
            << "y[" << row << "][" << j << "]: FP8 " << q << " x scale " << sc << " = " << q * sc << ", bf16 Y " << vb
            << ": more than one e4m3 step (" << e4m3_spacing(t) * sc << ") apart";
      }
  }
  st->count(p, d);
}

// The variants a random case runs under: as is always, and a quarter of the
// cases each without workspace, with the split tail forced, on one cluster,
// in clusters of two.
std::vector<Variant> random_variants(std::mt19937_64& rng) {
  std::vector<Variant> v{kFp8AsIs};
  switch (rng() % 8) {
    case 0: v.push_back(kFp8NoWorkspace); break;
    case 1: v.push_back(kFp8SplitForced); break;
    case 2: v.push_back(kFp8OneCluster); break;
    case 3: v.push_back(kFp8Pairs); break;
    default: break;
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------- tests

// The shared reference's e4m3 codec: every code round-trips, and the
// quantized-weight reference decodes the same values (no device).
TEST(GpuFp8, HostE4m3CodecMatchesTheReference) {
  Problem q = fp8_problem(XScale::tensor, 0, DType::fp32);
  q.k = 256;
  const Problem r = q.resolved();
  std::vector<uint32_t> words(64);
  unsigned char* bytes = reinterpret_cast<unsigned char*>(words.data());
  for (int c = 0; c < 256; ++c) bytes[c] = static_cast<unsigned char>(c);
  const float one = 1.0f;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // the NaN codes
    const double want = ref::quantized_weight(r, words.data(), &one, nullptr, 0, c);
    EXPECT_EQ(ref::e4m3_to_double(uint8_t(c)), want) << "code " << c;
    EXPECT_EQ(ref::double_to_e4m3(want), uint8_t(c)) << "code " << c << " does not round-trip";
  }
  EXPECT_EQ(ref::e4m3_to_double(0x7E), 448.0);
  EXPECT_EQ(ref::e4m3_to_double(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(ref::double_to_e4m3(1e6), 0x7E);     // saturates, never NaN
  EXPECT_EQ(ref::double_to_e4m3(-1e6), 0xFE);
  EXPECT_EQ(ref::double_to_e4m3(1.0625), 0x38);  // halfway between 1 and 1.125: to the even code (1.0)
  EXPECT_EQ(ref::double_to_e4m3(1.1875), 0x3A);  // halfway between 1.125 and 1.25: to the even code (1.25)
  EXPECT_EQ(ref::double_to_e4m3(-1e-9), 0x80);
  EXPECT_TRUE(std::isnan(ref::e4m3_to_double(0x7F)));
  EXPECT_TRUE(std::isnan(ref::e4m3_to_double(0xFF)));
}

TEST(GpuFp8, RandomEveryLayoutScaleAndOption) {
  SKIP_WITHOUT_FP8_KERNEL();
  const int n = cases(1000);
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_fp8_problem(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    Fp8Options opt;
    opt.variants = random_variants(rng);
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  st.print("random");
}

// GATEDMLP_FP8_PROMOTE=1 (set for this test, restored after): calls scaled
// per tensor, row or channel take the promoting kernels too (each 128-deep
// k-block summed apart and added into fp32), as the plan's reason says, and
// stay within the same bound; calls with block scales take them whatever
// the knob says. (The random suite above runs the default: the others on
// the kernels that sum all of K in the wgmmas' accumulators.)
TEST(GpuFp8, PromotingKernels) {
  SKIP_WITHOUT_FP8_KERNEL();
  ScopedEnv promote("GATEDMLP_FP8_PROMOTE", "1");
  const int n = cases(40);
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  Fp8Options opt;
  opt.promotes = true;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_fp8_problem(rng, false);
    SCOPED_TRACE("case " + std::to_string(i));
    opt.variants = random_variants(rng);
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    // Long K in clusters of two: where promotion matters most.
    Problem p = fp8_problem(XScale::row, 1, DType::bf16);
    p.m = 200;
    p.k = 12304;
    p.u = 6;
    p.weights.format = WeightFormat::separate;
    p.has_preact = true;
    p.preact_dtype = DType::fp32;
    opt.variants = {kFp8AsIs};
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  st.print("GATEDMLP_FP8_PROMOTE=1");
  {
    // The same per call, without the knob: Problem::fp8_promote.
    ScopedEnv unset("GATEDMLP_FP8_PROMOTE", nullptr);
    Fp8Stats sf;
    for (int i = 0; i < 12; ++i) {
      Problem p = random_fp8_problem(rng, false);
      p.fp8_promote = true;
      SCOPED_TRACE("fp8_promote case " + std::to_string(i));
      opt.variants = random_variants(rng);
      run_fp8_case(p, rng, &sf, opt);
      if (HasFailure()) return;
    }
    sf.print("Problem::fp8_promote");
  }
  Fp8Stats sb;
  opt.promotes = true;
  for (int i = 0; i < 8; ++i) {
    Problem p = random_fp8_problem(rng);
    while (p.x_scale != XScale::block && !blocked_weights(p)) p = random_fp8_problem(rng);
    SCOPED_TRACE("block-scaled case " + std::to_string(i));
    opt.variants = random_variants(rng);
    run_fp8_case(p, rng, &sb, opt);
    if (HasFailure()) return;
  }
  sb.print("GATEDMLP_FP8_PROMOTE=1, block scales");
}

// Every layout x activation x X scale x weight scale (per tensor and per
// channel: 128 x 128 blocks are the next test's), on odd shapes.
TEST(GpuFp8, EveryLayoutActivationAndScale) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  // group (-1: separate, 0: stacked), first
  const std::pair<int64_t, Half> layouts[] = {{-1, Half::gate}, {0, Half::gate}, {0, Half::up},  {1, Half::gate},
                                              {2, Half::up},    {8, Half::up},   {32, Half::gate}, {64, Half::up},
                                              {128, Half::gate}, {256, Half::up}, {-2, Half::up}};  // -2: G = U
  const int64_t ms[] = {1, 9, 77, 129, 300};
  const int64_t ks[] = {16, 144, 1040, 48};
  int i = 0;
  for (const auto& [g, first] : layouts)
    for (int act = 0; act < 5; ++act)
      for (XScale xsc : kXScales)
        for (int rb = 0; rb < 2; ++rb) {
          Problem p = fp8_problem(xsc, rb, static_cast<DType>((i / 3) % 3));
          p.m = ms[i % 5];
          p.k = ks[i % 4];
          if (g == -1) {
            p.weights.format = WeightFormat::separate;
            p.u = i % 2 ? 131 : 136;
          } else {
            p.u = g > 1 ? g * (g >= 128 ? 1 + i % 2 : 3) : (i % 2 ? 131 : 136);
            p.weights.group = g == -2 ? p.u : g;
            p.weights.first = first;
          }
          p.activation = static_cast<Activation>(act);
          p.output_dtype = static_cast<DType>(i % 4);
          p.y_scale_layout = i % 8 == 3 ? YScaleLayout::mn_major : YScaleLayout::row_major;
          p.has_y_amax = i % 16 == 7;
          p.alpha = i % 4 == 1 ? -1.5f : 1.0f;
          p.has_bias = (act + i) % 2;
          p.bias_dtype = static_cast<DType>((i / 2) % 3);
          p.has_preact = i % 4 == 0;
          p.preact_dtype = static_cast<DType>((i / 4) % 3);
          fit_budget(p, nullptr);
          if (i % 3 == 0) p.ldx = p.k + 32;
          if (i % 5 == 0) p.ldy = p.u + 5;
          run_fp8_case(p, rng, &st);
          if (HasFailure()) return;
          ++i;
        }
  st.print("every layout x activation x scale");
}

// 128 x 128 weight blocks on every layout they take x X scale, two
// activations each (all five over the layouts): separate weights (U odd, below and past one 128-row block), stacked (U =
// 128 ... 384, G = 0 or U), interleaved in blocks of 128 or 256, either
// half first; odd M (partial row tiles: X block scales past M), K with a
// partial last k-block. The float64 references' budget is met by fewer
// rows first, so K keeps its partial k-block.
TEST(GpuFp8, EveryBlockedLayoutActivationAndScale) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  struct L {
    int64_t group;  // -1: separate, 0: stacked, -2: stacked as G = U
    Half first;
    int64_t u;
  };
  const L layouts[] = {{-1, Half::gate, 131}, {-1, Half::gate, 7},   {-1, Half::gate, 264}, {0, Half::gate, 128},
                       {0, Half::up, 256},    {-2, Half::up, 128},   {-2, Half::gate, 384}, {128, Half::gate, 256},
                       {128, Half::up, 384},  {256, Half::up, 512}};
  const int64_t ms[] = {1, 9, 77, 129, 300};
  const int64_t ks[] = {144, 16, 1040, 272, 400, 128};
  int i = 0;
  for (const L& l : layouts)
    for (int a = 0; a < 2; ++a)
      for (XScale xsc : kXScales) {
        const int act = (i / 3) % 5;
        Problem p = fp8_problem(xsc, 128, static_cast<DType>((i / 2) % 3));
        p.m = ms[i % 5];
        p.k = ks[i % 6];
        p.u = l.u;
        if (l.group == -1) {
          p.weights.format = WeightFormat::separate;
        } else {
          p.weights.group = l.group == -2 ? l.u : l.group;
          p.weights.first = l.first;
        }
        p.activation = static_cast<Activation>(act);
        p.output_dtype = static_cast<DType>(i % 4);
        p.y_scale_layout = i % 8 == 3 ? YScaleLayout::mn_major : YScaleLayout::row_major;
        p.has_y_amax = i % 16 == 7;
        p.alpha = i % 4 == 1 ? -1.5f : 1.0f;
        p.has_bias = (act + i) % 2;
        p.bias_dtype = static_cast<DType>((i / 2) % 3);
        p.has_preact = i % 4 == 0;
        p.preact_dtype = static_cast<DType>((i / 4) % 3);
        while (p.m * 2 * p.u * p.k > kReferenceBudget && p.m > 1) p.m = (p.m / 2) | 1;  // odd M
        while (p.m * 2 * p.u * p.k > kReferenceBudget && p.k > 144) p.k = (p.k / 2) / 16 * 16;
        if (i % 3 == 0) p.ldx = p.k + 32;
        if (i % 5 == 0) p.ldy = p.u + 5;
        if (i % 7 == 0) p.weights.ld = p.k / 4 + 8;
        run_fp8_case(p, rng, &st);
        if (HasFailure()) return;
        ++i;
      }
  st.print("blocked weights: every layout x X scale, every activation");
}

// K > 8192: the library runs clusters of two (weight multicast); an odd
// number of row-blocks (3) runs the last one's CTAs in column pairs. The
// launcher's log must say so.
TEST(GpuFp8, LongKInClustersOfTwo) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  Fp8Options opt;
  opt.variants = {kFp8AsIs, kFp8NoWorkspace};
  opt.log_must_contain = "clusters of 2";
  {
    Problem p = fp8_problem(XScale::row, 1, DType::bf16);
    p.m = 256;
    p.k = 8320;
    p.u = 128;
    p.has_bias = true;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    Problem p = fp8_problem(XScale::tensor, 0, DType::fp32);
    p.m = 300;
    p.k = 8448;
    p.u = 37;  // U % 8 != 0
    p.weights.format = WeightFormat::separate;
    p.output_dtype = DType::fp32;
    p.activation = Activation::gelu_tanh;
    p.has_preact = true;
    p.preact_dtype = DType::fp32;
    p.ldx = p.k + 16;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    Problem p = fp8_problem(XScale::row, 0, DType::fp16);
    p.m = 129;
    p.k = 12288;
    p.u = 32;
    p.weights.group = 32;
    p.weights.first = Half::up;
    p.output_dtype = DType::fp16;
    p.activation = Activation::swiglu_clamped;
    p.alpha = 0.5f;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  // Block scales: X per 1 x 128 block, 128 x 128 weight blocks; the last
  // k-block partial (K % 128 = 16, 32), and whole.
  {
    Problem p = fp8_problem(XScale::block, 128, DType::bf16);
    p.m = 300;
    p.k = 8336;
    p.u = 9;  // separate, one partial row block
    p.weights.format = WeightFormat::separate;
    p.has_bias = true;
    p.has_preact = true;
    p.preact_dtype = DType::fp32;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    Problem p = fp8_problem(XScale::block, 128, DType::fp16);
    p.m = 129;
    p.k = 8464;
    p.u = 128;  // stacked, up first
    p.weights.first = Half::up;
    p.output_dtype = DType::fp32;
    p.activation = Activation::gelu_erf;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    Problem p = fp8_problem(XScale::tensor, 128, DType::fp32);
    p.m = 257;
    p.k = 16384;
    p.u = 8;
    p.weights.format = WeightFormat::separate;
    p.alpha = -1.5f;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  {
    Problem p = fp8_problem(XScale::block, 1, DType::bf16);  // X blocks, weights per channel
    p.m = 385;
    p.k = 9232;
    p.u = 9;
    p.weights.format = WeightFormat::separate;
    p.output_dtype = DType::bf16;
    p.activation = Activation::relu;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  st.print("K > 8192");
}

// The promoting kernels' error per weight scheme (per tensor with
// GATEDMLP_FP8_PROMOTE=1), on inputs that dequantize
// to the same values: e4m3 X [256, K] and stacked W [512, K] of magnitudes
// 2^-4 ... 112 (or 0), scaled per tensor (fp32 sx, sw); the blocked inputs
// are the same values with each 1 x 128 block of X and 128 x 128 block of W
// multiplied by 2^e, e in [-2, 2] (exact in e4m3: they stay in 2^-6 ...
// 448), and the block's scale by 2^-e (exact in fp32), so both calls
// compute one float64 function. The mean |error| of the pre-activations
// (fp32; every 8th row, all 2U columns) against it: the blocked scheme's
// at most 1.1x the per-tensor scheme's, at K = 8192 and 16384; and at K =
// 16384 the promoting per-tensor kernel's (GATEDMLP_FP8_PROMOTE=1) at most
// the default one's (all of K in the wgmmas' accumulators). Every
// element is also held to the bound the other tests use.
TEST(GpuFp8, BlockedAccuracyMatchesPerTensor) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  constexpr int64_t M = 256, U = 256, N = 2 * U, kRowStep = 8;
  for (const int64_t K : {int64_t(8192), int64_t(16384)}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    const int64_t kg = K / 128, ng = N / 128;
    std::uniform_real_distribution<double> uni(-112, 112);
    auto draw = [&] {
      uint8_t b = ref::double_to_e4m3(uni(rng));
      if (std::fabs(ref::e4m3_to_double(b)) < 0x1p-4) b = 0;
      return b;
    };
    // Per tensor: X of RMS ~1 (the e4m3 values' is 112 / sqrt(3)), g and u too.
    std::vector<uint8_t> xq(size_t(M * K)), wq(size_t(N * K));
    for (uint8_t& b : xq) b = draw();
    for (uint8_t& b : wq) b = draw();
    const float sx = float(draw_scale(rng, 1.0 / 64, -0.5, 0.5, false));
    const float sw = float(draw_scale(rng, 1.0 / (64 * std::sqrt(double(K))), -0.5, 0.5, false));
    // Blocked: the same values, each block times 2^e and its scale times 2^-e.
    std::uniform_int_distribution<int> ed(-2, 2);
    std::vector<int> ex(size_t(M * kg)), ew(size_t(ng * kg));
    for (int& e : ex) e = ed(rng);
    for (int& e : ew) e = ed(rng);
    std::vector<uint8_t> xb(xq.size()), wb(wq.size());
    std::vector<float> sxb(size_t(M * kg)), swb(size_t(ng * kg));
    bool exact = true;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < K; ++c) {
        const int e = ex[size_t(r * kg + c / 128)];
        const double v = std::ldexp(ref::e4m3_to_double(xq[size_t(r * K + c)]), e);
        xb[size_t(r * K + c)] = ref::double_to_e4m3(v);
        exact = exact && ref::e4m3_to_double(xb[size_t(r * K + c)]) == v;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < K; ++c) {
        const int e = ew[size_t((n / 128) * kg + c / 128)];
        const double v = std::ldexp(ref::e4m3_to_double(wq[size_t(n * K + c)]), e);
        wb[size_t(n * K + c)] = ref::double_to_e4m3(v);
        exact = exact && ref::e4m3_to_double(wb[size_t(n * K + c)]) == v;
      }
    ASSERT_TRUE(exact) << "a block's e4m3 values scaled by 2^e are not exact";
    for (size_t i = 0; i < sxb.size(); ++i) sxb[i] = std::ldexp(sx, -ex[i]);
    for (size_t i = 0; i < swb.size(); ++i) swb[i] = std::ldexp(sw, -ew[i]);

    // The float64 reference (both schemes': the same dequantized values) and
    // the magnitudes A, on every kRowStep-th row.
    const int64_t rows = M / kRowStep;
    std::vector<double> xd(size_t(rows * K)), wd(static_cast<size_t>(K)), g_ref(size_t(rows * N)),
        a_ref(size_t(rows * N));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < K; ++c)
        xd[size_t(i * K + c)] = ref::e4m3_to_double(xq[size_t(i * kRowStep * K + c)]) * double(sx);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < K; ++c) wd[size_t(c)] = ref::e4m3_to_double(wq[size_t(n * K + c)]) * double(sw);
      for (int64_t i = 0; i < rows; ++i) {
        const double* xr = &xd[size_t(i * K)];
        double g[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
        for (int64_t c = 0; c < K; c += 4)
          for (int j = 0; j < 4; ++j) {
            const double t = xr[c + j] * wd[size_t(c + j)];
            g[j] += t;
            a[j] += std::fabs(t);
          }
        g_ref[size_t(i * N + n)] = (g[0] + g[1]) + (g[2] + g[3]);
        a_ref[size_t(i * N + n)] = (a[0] + a[1]) + (a[2] + a[3]);
      }
    }

    // One call: its pre-activations' mean |error| over the sampled rows,
    // every element within the bound.
    auto mean_error = [&](XScale xs_kind, int scheme, const std::vector<uint8_t>& xbytes,
                          const std::vector<float>& xscales, const std::vector<uint8_t>& wbytes,
                          const std::vector<float>& wscales, const char* promote_knob, bool promotes,
                          std::vector<float>* pre_out) -> double {
      ScopedEnv knob("GATEDMLP_FP8_PROMOTE", promote_knob);
      Problem p = fp8_problem(xs_kind, scheme, DType::fp32);
      p.m = M;
      p.k = K;
      p.u = U;
      p.output_dtype = DType::fp32;
      p.has_preact = true;
      p.preact_dtype = DType::fp32;
      const std::string what = to_string(p) + (promote_knob ? std::string(", GATEDMLP_FP8_PROMOTE=") + promote_knob : "");
      Config cfg;
      const Status sp = plan(p, &cfg);
      EXPECT_TRUE(sp.ok()) << what << ": " << sp.message();
      EXPECT_EQ(cfg.reason.find(kPromotingReason) != std::string::npos, promotes) << what << ": " << cfg.reason;
      DeviceBuffer dx(xbytes.size()), dw(wbytes.size()), dsx(xscales.size() * 4), dsw(wscales.size() * 4),
          dy(size_t(M * U * 4)), dpre(size_t(M * N * 4));
      const size_t ws_bytes = workspace_size(p);
      DeviceBuffer ws(ws_bytes);
      if (!dx.p || !dw.p || !dsx.p || !dsw.p || !dy.p || !dpre.p || ws.bytes != ws_bytes) {
        ADD_FAILURE() << what << ": cudaMalloc";
        return NAN;
      }
      cudaMemcpy(dx.p, xbytes.data(), dx.bytes, cudaMemcpyHostToDevice);
      cudaMemcpy(dw.p, wbytes.data(), dw.bytes, cudaMemcpyHostToDevice);
      cudaMemcpy(dsx.p, xscales.data(), dsx.bytes, cudaMemcpyHostToDevice);
      cudaMemcpy(dsw.p, wscales.data(), dsw.bytes, cudaMemcpyHostToDevice);
      const std::vector<unsigned char> poison = nan_filled(DType::fp32, M * N);
      cudaMemcpy(dpre.p, poison.data(), dpre.bytes, cudaMemcpyHostToDevice);
      Arguments a;
      a.x = dx.p;
      a.x_scales = dsx.p;
      a.w = dw.p;
      a.w_scales = dsw.p;
      a.y = dy.p;
      a.preact = dpre.p;
      const Status s = run(p, a, ws.p, ws_bytes, nullptr);
      EXPECT_TRUE(s.ok()) << what << ": " << s.message();
      const cudaError_t ce = sync_within(what);
      EXPECT_EQ(ce, cudaSuccess) << what << ": " << cudaGetErrorString(ce);
      std::vector<float> pre(size_t(M * N));
      cudaMemcpy(pre.data(), dpre.p, dpre.bytes, cudaMemcpyDeviceToHost);
      double sum = 0;
      int64_t bad = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t n = 0; n < N; ++n) {
          const double want = g_ref[size_t(i * N + n)], got = pre[size_t(i * kRowStep * N + n)];
          const double err = std::fabs(got - want);
          const double bound = 0x1p-24 * std::fabs(want) + 1.01 * pre_bound(K, a_ref[size_t(i * N + n)], want);
          if (!(err <= bound) && bad++ == 0)
            ADD_FAILURE() << what << ": preact[" << i * kRowStep << "][" << n << "] = " << got << ", reference "
                          << want << ": error " << err << " > bound " << bound;
          sum += err;
        }
      EXPECT_EQ(bad, 0) << what << ": elements past the bound";
      if (pre_out) *pre_out = std::move(pre);
      return sum / double(rows * N);
    };

    std::vector<float> pre_tensor, pre_blocked;
    const double e_tensor = mean_error(XScale::tensor, 0, xq, {sx}, wq, {sw}, "1", true, &pre_tensor);
    const double e_blocked = mean_error(XScale::block, 128, xb, sxb, wb, swb, nullptr, true, &pre_blocked);
    if (HasFailure()) return;
    double max_diff = 0;
    for (size_t i = 0; i < pre_tensor.size(); ++i)
      max_diff = std::max(max_diff, double(std::fabs(pre_tensor[i] - pre_blocked[i])));
    std::printf("[ accuracy ] K=%lld, M=%lld, U=%lld: mean |error| of g, u (fp32) per tensor %.4g, 128 x 128 blocks "
                "%.4g (ratio %.4f); the two outputs differ by at most %.3g\n",
                static_cast<long long>(K), static_cast<long long>(M), static_cast<long long>(U), e_tensor, e_blocked,
                e_blocked / e_tensor, max_diff);
    EXPECT_LE(e_blocked, 1.1 * e_tensor) << "blocked scales lose accuracy against per-tensor ones on the same values";
    if (K == 16384) {
      const double e_fast = mean_error(XScale::tensor, 0, xq, {sx}, wq, {sw}, nullptr, false, nullptr);
      std::printf("[ accuracy ] K=%lld, per tensor: mean |error| promoting (GATEDMLP_FP8_PROMOTE=1) %.4g, "
                  "non-promoting (the default) %.4g (ratio %.3f)\n",
                  static_cast<long long>(K), e_tensor, e_fast, e_fast / e_tensor);
      EXPECT_LE(e_tensor, e_fast) << "the promoting kernel is less accurate than the non-promoting one";
    }
  }
}

// The split tail forced (GATEDMLP_SM90_SPLIT_TAIL=force, as the 16-bit
// suites do): a partial wave of tiles shared out over the SMs along K, the
// partial sums through the workspace. The launcher's log must say the tail
// was split; the same call without workspace (unsplit) must be right too.
TEST(GpuFp8, SplitTailForced) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  Fp8Options opt;
  opt.variants = {kFp8SplitForced, kFp8NoWorkspace, kFp8Pairs};
  opt.log_must_contain = "; split tail";
  struct Shape {
    int64_t m, k, u, group;  // group -1: separate
    DType out;
    bool preact, bias;
    XScale xs;
    int row_block;
  };
  const Shape shapes[] = {
      {200, 1024, 520, 0, DType::fp32, false, true, XScale::row, 1},
      {130, 768, 264, 8, DType::bf16, true, false, XScale::tensor, 1},
      {77, 2048, 300, -1, DType::fp16, false, true, XScale::row, 0},
      {300, 512, 131, 1, DType::fp32, true, true, XScale::tensor, 0},
      // Block scales: a piece of the split tail starts mid-K, its k-blocks'
      // scales are those of where it starts.
      {200, 1040, 131, -1, DType::fp32, true, true, XScale::block, 128},
      {130, 784, 256, 128, DType::bf16, false, false, XScale::row, 128},
      {257, 1552, 40, -1, DType::fp16, false, true, XScale::block, 0},
  };
  int i = 0;
  for (const Shape& s : shapes) {
    Problem p = fp8_problem(s.xs, s.row_block, static_cast<DType>(i % 3));
    p.m = s.m;
    p.k = s.k;
    p.u = s.u;
    if (s.group < 0) p.weights.format = WeightFormat::separate;
    else p.weights.group = s.group;
    p.output_dtype = s.out;
    p.has_preact = s.preact;
    p.preact_dtype = s.out;
    p.has_bias = s.bias;
    p.activation = static_cast<Activation>(i % 5);
    p.alpha = i % 2 ? 1.0f : -0.75f;
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
    ++i;
  }
  st.print("split tail forced");
}

// Only extreme values: every e4m3 product at +-448 x 448 or near the
// subnormals, and negative scales.
TEST(GpuFp8, ExtremeValuesAndNegativeScales) {
  SKIP_WITHOUT_FP8_KERNEL();
  std::mt19937_64 rng(fresh_seed());
  Fp8Stats st;
  Fp8Options opt;
  Fp8Data d;
  d.extremes = true;
  d.negative_scales = true;
  opt.data = d;
  for (int i = 0; i < 18; ++i) {
    Problem p = fp8_problem(kXScales[i % 3], kWeightSchemes[(i / 3) % 3], static_cast<DType>(i % 3));
    p.m = pick(rng, {1, 64, 131, 256});
    p.k = pick(rng, {16, 256, 1040});
    p.u = pick(rng, {40, 64, 77});
    if (blocked_weights(p)) p.weights.format = WeightFormat::separate;  // U no multiple of 128
    p.output_dtype = static_cast<DType>((i / 3) % 3);
    p.activation = static_cast<Activation>(i % 5);
    p.has_bias = i % 3 == 0;
    p.has_preact = i % 4 == 0;
    fit_budget(p, nullptr);
    run_fp8_case(p, rng, &st, opt);
    if (HasFailure()) return;
  }
  st.print("extremes");
}

// plan() on sm_90: the Hopper kernel, its reason naming FP8, for every X
// scale and every weight scale.
TEST(GpuFp8, PlanTakesTheHopperKernel) {
  SKIP_WITHOUT_FP8_KERNEL();
  for (XScale xsc : kXScales)
    for (int rb : kWeightSchemes) {
      Problem p = fp8_problem(xsc, rb, DType::fp32);
      p.m = 1000;
      p.k = 4096;
      p.u = 14336;
      Config c;
      const Status s = plan(p, &c);
      ASSERT_TRUE(s.ok()) << to_string(p) << ": " << s.message();
      EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
      EXPECT_NE(c.reason.find("FP8"), std::string::npos) << c.reason;
      // One row too: no decode kernel takes FP8 X.
      p.m = 1;
      ASSERT_TRUE(plan(p, &c).ok());
      EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
    }
}

// Off sm_90 (or in a build without the sm_90a kernel): plan() and run()
// refuse with not_supported and a message, writing nothing.
TEST(GpuFp8, RefusedOffHopper) {
  SKIP_WITHOUT_GPU();
  if (device_is_sm90() && sm90::compiled()) GTEST_SKIP() << "this device runs FP8 activations";
  Problem p = fp8_problem(XScale::row, 1, DType::bf16);
  p.m = 64;
  p.k = 256;
  p.u = 64;
  Config c;
  const Status s = plan(p, &c);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_FALSE(s.message().empty());
  const Problem r = p.resolved();
  DeviceBuffer x(size_t(r.m * r.k)), w(size_t(2 * r.u * r.k)), sw(size_t(2 * r.u * 2)), sx(size_t(r.m * 4)),
      y(size_t(r.m * r.u * 2));
  ASSERT_TRUE(x.p && w.p && sw.p && sx.p && y.p);
  const std::vector<unsigned char> poison = nan_filled(DType::bf16, r.m * r.u);
  CUDA_OK(cudaMemcpy(y.p, poison.data(), poison.size(), cudaMemcpyHostToDevice));
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.w_scales = sw.p;
  a.x_scales = sx.p;
  a.y = y.p;
  const Status t = run(p, a, nullptr, 0, nullptr);
  EXPECT_EQ(t.code(), StatusCode::not_supported) << t.message();
  EXPECT_FALSE(t.message().empty());
  CUDA_OK(sync_within("refused FP8 call"));
  std::vector<unsigned char> out(poison.size());
  CUDA_OK(cudaMemcpy(out.data(), y.p, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(out, poison) << "a refused call wrote y";
}

// Calls that must be refused before anything is written: by name where the
// argument is wrong (x_scales missing, in host memory, overlapped by y;
// x_scales on a 16-bit call), and for what the e4m3 kernels cannot read (K
// or ldx not a multiple of 16, x off 16 bytes).
TEST(GpuFp8, BadCallsWriteNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = fp8_problem(XScale::row, 1, DType::fp32);
  p.m = 40;
  p.k = 256;
  p.u = 48;
  p.output_dtype = DType::bf16;
  const Problem r = p.resolved();
  // Room for the variants below: ldx up to k + 8, k up to 256.
  DeviceBuffer x(size_t(r.m * (r.k + 32)) + 64), w(size_t(2 * r.u * r.k) + 64), sw(size_t(2 * r.u * 4)),
      sx(size_t(r.m * 4)), y(size_t(r.m * r.u * 2)), x16(size_t(r.m * r.k * 2)), w16(size_t(2 * r.u * r.k * 2));
  ASSERT_TRUE(x.p && w.p && sw.p && sx.p && y.p && x16.p && w16.p);
  CUDA_OK(cudaMemset(x.p, 0x38, x.bytes));  // e4m3 1.0
  CUDA_OK(cudaMemset(w.p, 0x30, w.bytes));  // e4m3 0.5
  const std::vector<float> ones(size_t(2 * r.u), 1.0f);
  CUDA_OK(cudaMemcpy(sw.p, ones.data(), sw.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(sx.p, ones.data(), sx.bytes, cudaMemcpyHostToDevice));
  const std::vector<unsigned char> poison = nan_filled(DType::bf16, r.m * r.u);
  CUDA_OK(cudaMemcpy(y.p, poison.data(), poison.size(), cudaMemcpyHostToDevice));
  auto good = [&] {
    Arguments a;
    a.x = x.p;
    a.w = w.p;
    a.w_scales = sw.p;
    a.x_scales = sx.p;
    a.y = y.p;
    return a;
  };
  auto y_untouched = [&](const std::string& what) {
    ASSERT_EQ(sync_within(what), cudaSuccess) << what;
    std::vector<unsigned char> out(poison.size());
    ASSERT_EQ(cudaMemcpy(out.data(), y.p, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(out, poison) << what << ": a refused call wrote y";
  };
  auto refused = [&](const Problem& q, const Arguments& a, const std::string& what, std::optional<StatusCode> code,
                     std::initializer_list<const char*> says) {
    SCOPED_TRACE(what + ": " + to_string(q));
    const Status s = run(q, a, nullptr, 0, nullptr);
    ASSERT_FALSE(s.ok()) << what << " was not refused";
    if (code) {
      EXPECT_EQ(s.code(), *code) << s.message();
    }
    for (const char* f : says) EXPECT_NE(s.message().find(f), std::string::npos) << "no '" << f << "' in: " << s.message();
    y_untouched(what);
  };

  // x_scales missing: refused by name, on any device (validate comes first).
  Arguments a = good();
  a.x_scales = nullptr;
  refused(p, a, "x_scales null", StatusCode::invalid_argument, {"x_scales"});
  a = good();
  a.w_scales = nullptr;
  refused(p, a, "w_scales null", StatusCode::invalid_argument, {"w_scales"});
  std::vector<float> host_scales(size_t(r.m), 1.0f);
  a = good();
  a.x_scales = host_scales.data();
  refused(p, a, "x_scales in host memory", StatusCode::invalid_argument, {"x_scales", "host memory"});
  {
    // y over the scales of x: a buffer of y's size whose bytes 128 ... hold
    // x_scales (a call that went ahead would write only inside it).
    SCOPED_TRACE("y overlapping x_scales");
    DeviceBuffer both(y.bytes);
    ASSERT_TRUE(both.p);
    std::vector<unsigned char> before = poison;
    std::memcpy(before.data() + 128, ones.data(), size_t(r.m * 4));
    CUDA_OK(cudaMemcpy(both.p, before.data(), before.size(), cudaMemcpyHostToDevice));
    a = good();
    a.y = both.p;
    a.x_scales = static_cast<const char*>(both.p) + 128;
    const Status s = run(p, a, nullptr, 0, nullptr);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
    EXPECT_NE(s.message().find("x_scales"), std::string::npos) << s.message();
    CUDA_OK(sync_within("y overlapping x_scales"));
    std::vector<unsigned char> after(before.size());
    CUDA_OK(cudaMemcpy(after.data(), both.p, after.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(after, before) << "a refused call wrote y";
  }
  // x_scales on a 16-bit call: a mistake, named.
  {
    Problem q;
    q.m = r.m;
    q.k = r.k;
    q.u = r.u;
    Arguments b;
    b.x = x16.p;
    b.w = w16.p;
    b.y = y.p;
    b.x_scales = sx.p;
    refused(q, b, "x_scales with bf16 x", StatusCode::invalid_argument, {"x_scales"});
  }
  // What the e4m3 kernels cannot read (elsewhere: refused anyway).
  {
    Problem q = p;
    q.k = 40;  // a multiple of 8, not of 16: rows of X not on 16 bytes
    refused(q, good(), "k=40", std::nullopt, {});
  }
  {
    Problem q = p;
    q.ldx = q.k + 8;
    refused(q, good(), "ldx=k+8", std::nullopt, {});
  }
  {
    a = good();
    a.x = static_cast<const char*>(x.p) + 8;
    refused(p, a, "x off 16 bytes", std::nullopt, {});
  }
  {
    a = good();
    a.w = static_cast<const char*>(w.p) + 4;  // uint32 words, not on 16 bytes
    refused(p, a, "w off 16 bytes", std::nullopt, {});
  }
  // And the good call itself is not refused where FP8 runs.
  if (device_is_sm90() && sm90::compiled()) {
    const size_t bytes = workspace_size(p);
    DeviceBuffer ws(bytes);
    const Status s = run(p, good(), ws.p, bytes, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    CUDA_OK(sync_within("good FP8 call"));
    // x = 1, w = 0.5, scales 1: g = u = K x 0.5 = 128, y = silu(128) * 128 everywhere.
    std::vector<unsigned char> out(poison.size());
    CUDA_OK(cudaMemcpy(out.data(), y.p, out.size(), cudaMemcpyDeviceToHost));
    const double g = 0.5 * double(r.k), want = g / (1.0 + std::exp(-g)) * g;
    for (int64_t i = 0; i < r.m * r.u; ++i)
      ASSERT_NEAR(ref::load_as_double(out.data(), DType::bf16, i), want, 0x1p-8 * want) << "y element " << i;
  }
}

// 128 x 128 weight blocks on a fused layout whose interleave block is no
// multiple of 128 (stacked U = 200, G = U = 200, G = 64, 192, 32): run()
// refuses with not_supported, naming the interleave block and its value,
// and writes nothing; on any device (check_support's rule, before the
// dispatcher). plan() says the same.
TEST(GpuFp8, BlockedWeightsOnRefusedFusedLayoutsWriteNothing) {
  SKIP_WITHOUT_GPU();
  struct Bad {
    int64_t u, group;
    Half first;
    XScale xs;
    const char* value;
  };
  const Bad bads[] = {{200, 0, Half::gate, XScale::block, "u=200"},
                      {200, 200, Half::up, XScale::row, "group=200"},
                      {128, 64, Half::up, XScale::tensor, "group=64"},
                      {384, 192, Half::gate, XScale::block, "group=192"},
                      {96, 32, Half::gate, XScale::row, "group=32"}};
  for (const Bad& b : bads) {
    Problem p = fp8_problem(b.xs, 128, DType::bf16);
    p.m = 40;
    p.k = 272;
    p.u = b.u;
    p.weights.group = b.group;
    p.weights.first = b.first;
    SCOPED_TRACE(to_string(p));
    const int64_t kg = (p.k + 127) / 128;
    // Every buffer as large as the call would read or write.
    DeviceBuffer x(size_t(p.m * p.k)), w(size_t(2 * p.u * p.k)), sw(size_t((2 * p.u + 127) / 128 * kg * 2)),
        sx(size_t(p.m * kg * 4)), y(size_t(p.m * p.u * 2));
    ASSERT_TRUE(x.p && w.p && sw.p && sx.p && y.p);
    CUDA_OK(cudaMemset(x.p, 0x38, x.bytes));  // e4m3 1.0
    CUDA_OK(cudaMemset(w.p, 0x30, w.bytes));  // e4m3 0.5
    CUDA_OK(cudaMemset(sw.p, 0x3f, sw.bytes));  // bf16 0x3f3f, about 0.75
    CUDA_OK(cudaMemset(sx.p, 0, sx.bytes));
    const std::vector<unsigned char> poison = nan_filled(DType::bf16, p.m * p.u);
    CUDA_OK(cudaMemcpy(y.p, poison.data(), poison.size(), cudaMemcpyHostToDevice));
    Arguments a;
    a.x = x.p;
    a.w = w.p;
    a.w_scales = sw.p;
    a.x_scales = sx.p;
    a.y = y.p;
    const Status s = run(p, a, nullptr, 0, nullptr);
    EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
    for (const char* f : {"interleave block", b.value})
      EXPECT_NE(s.message().find(f), std::string::npos) << "no '" << f << "' in: " << s.message();
    Config c;
    const Status sp = plan(p, &c);
    EXPECT_EQ(sp.code(), StatusCode::not_supported) << sp.message();
    EXPECT_NE(sp.message().find(b.value), std::string::npos) << sp.message();
    CUDA_OK(sync_within("refused blocked layout"));
    std::vector<unsigned char> out(poison.size());
    CUDA_OK(cudaMemcpy(out.data(), y.p, out.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(out, poison) << "a refused call wrote y";
  }
}

// Empty work: nothing launched, nothing written, null pointers fine.
TEST(GpuFp8, EmptyWorkLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = fp8_problem(XScale::row, 1, DType::bf16);
  p.m = 0;
  p.k = 256;
  p.u = 64;
  const Status s = run(p, Arguments{}, nullptr, 0, nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(workspace_size(p), 0u);
  CUDA_OK(sync_within("empty FP8 call"));
}

// FP8 Y, by hand: x all e4m3 1.0 but one NaN code in row 2, weights 0.5,
// scales 1, relu: every y of the other rows is relu(K / 2) * K / 2, so
// each group's scale is that / 448 and each byte e4m3 448; row 2 is NaN
// throughout (the NaN sums through every column), so its scales are NaN
// (a NaN never vanishes into a group's amax) and so is the amax. The
// same with y_scales or y_amax in host memory: refused by name, nothing
// written.
TEST(GpuFp8, Fp8OutputNanAndBadCalls) {
  SKIP_WITHOUT_FP8_KERNEL();
  Problem p = fp8_problem(XScale::tensor, 0, DType::fp32);
  p.m = 5;
  p.k = 64;
  p.u = 200;
  p.activation = Activation::relu;
  p.output_dtype = DType::fp8_e4m3;
  p.has_y_amax = true;
  const int64_t groups = 2;
  DeviceBuffer x(size_t(p.m * p.k)), w(size_t(2 * p.u * p.k)), sx(4), sw(4), y(size_t(p.m * p.u)),
      ys(size_t(p.m * groups * 4)), amax(4);
  ASSERT_TRUE(x.p && w.p && sx.p && sw.p && y.p && ys.p && amax.p);
  CUDA_OK(cudaMemset(x.p, 0x38, x.bytes));  // e4m3 1.0
  CUDA_OK(cudaMemset(static_cast<unsigned char*>(x.p) + 2 * p.k + 17, 0x7F, 1));
  CUDA_OK(cudaMemset(w.p, 0x30, w.bytes));  // e4m3 0.5
  const float one = 1.0f;
  CUDA_OK(cudaMemcpy(sx.p, &one, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(sw.p, &one, 4, cudaMemcpyHostToDevice));
  const std::vector<unsigned char> y_poison(size_t(p.m * p.u), 0x55), ys_poison = nan_filled(DType::fp32, p.m * groups);
  auto reset = [&] {
    CUDA_OK(cudaMemcpy(y.p, y_poison.data(), y_poison.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ys.p, ys_poison.data(), ys_poison.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(amax.p, 0x11, 4));
  };
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.x_scales = sx.p;
  a.w_scales = sw.p;
  a.y = y.p;
  a.y_scales = static_cast<float*>(ys.p);
  a.y_amax = static_cast<float*>(amax.p);
  reset();
  const Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(sync_within("FP8 Y with a NaN"));
  std::vector<unsigned char> yh(y_poison.size());
  std::vector<float> sh(size_t(p.m * groups));
  float am = 0;
  CUDA_OK(cudaMemcpy(yh.data(), y.p, yh.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(sh.data(), ys.p, sh.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&am, amax.p, 4, cudaMemcpyDeviceToHost));
  const float v = 32.0f * 32.0f;  // relu(K / 2) * K / 2
  for (int64_t r = 0; r < p.m; ++r) {
    for (int64_t c = 0; c < groups; ++c) {
      const float sc = sh[size_t(r * groups + c)];
      if (r == 2) EXPECT_TRUE(std::isnan(sc)) << "row 2 (a NaN in x), group " << c << ": scale " << sc;
      else EXPECT_EQ(sc, v * (1.0f / 448.0f)) << "row " << r << ", group " << c;
    }
    for (int64_t j = 0; j < p.u; ++j) {
      const uint8_t q = yh[size_t(r * p.u + j)];
      if (r == 2) EXPECT_EQ(q & 0x7F, 0x7F) << "y[2][" << j << "] = 0x" << std::hex << int(q) << " is no NaN code";
      else EXPECT_EQ(q, 0x7E) << "y[" << r << "][" << j << "]: e4m3 448 expected";
      if (HasFailure()) return;
    }
  }
  EXPECT_TRUE(std::isnan(am)) << "y_amax " << am << " lost the NaN";

  // Host memory for the scales or the amax: refused by name, nothing written.
  std::vector<float> host(size_t(p.m * groups));
  for (int which = 0; which < 2; ++which) {
    reset();
    Arguments b = a;
    (which ? b.y_amax : b.y_scales) = host.data();
    const Status e = run(p, b, nullptr, 0, nullptr);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.message().find(which ? "y_amax" : "y_scales"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("host memory"), std::string::npos) << e.message();
    CUDA_OK(sync_within("refused FP8 Y call"));
    CUDA_OK(cudaMemcpy(yh.data(), y.p, yh.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(yh, y_poison) << "a refused call wrote y";
  }
}
