// FP8 activations (input_dtype = fp8_e4m3) on the host: what check_support
// and validate accept and refuse, by name, before any device is asked (X
// scaled per tensor, row or 1 x 128 block; weights per tensor, channel or
// 128 x 128 block, and the fused layouts block scales take); an FP8 Y
// (output_dtype = fp8_e4m3: its scales' layouts, extents and pointers, the
// amax, refused outside FP8 calls); how an FP8 problem prints; empty work;
// and the dispatcher's choice on simulated devices (the Hopper kernel on
// an H200, a refusal on an A100).
// The GPU suite is tests/test_gpu_fp8.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/internal.hpp"
#include "gatedmlp/gatedmlp.hpp"
#include "gatedmlp/quant.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"
#include "scoped_env.hpp"
#include "simulated_devices.hpp"

using namespace gatedmlp;

namespace {

// A good FP8 call: e4m3 X scaled per tensor, FP8 weights per tensor.
Problem fp8_base() {
  Problem p;
  p.m = 33;
  p.k = 64;
  p.u = 96;
  p.input_dtype = DType::fp8_e4m3;
  p.quantized = true;
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 0};
  p.scale_dtype = DType::fp32;
  return p;
}

// The weight scale schemes FP8 activations take, by quant.row_block: 0 per
// tensor, 1 per output channel, 128 per 128 x 128 block (group_size 128).
constexpr int kWeightSchemes[] = {0, 1, 128};
constexpr XScale kXScales[] = {XScale::tensor, XScale::row, XScale::block};

QuantFormat fp8_weights(int row_block) {
  return QuantFormat{QuantMode::fp8_e4m3, 8, row_block == 128 ? 128 : 0, row_block};
}

// fp8_base() with 128 x 128 blocked weight scales, m rows, k, u, and the
// fused layout `group` (-1: separate weights; 0: stacked).
Problem blocked_base(int64_t u, int64_t group, Half first = Half::gate) {
  Problem p = fp8_base();
  p.quant = fp8_weights(128);
  p.k = 272;  // 2 whole k-blocks and a partial one
  p.u = u;
  if (group < 0) {
    p.weights.format = WeightFormat::separate;
  } else {
    p.weights.group = group;
    p.weights.first = first;
  }
  return p;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains_ci(const std::string& s, const std::string& f) { return lower(s).find(lower(f)) != std::string::npos; }

// The status is an error whose message contains every fragment (case
// insensitive); of `code` unless `any_error_code`.
void expect_refused(const Status& s, StatusCode code, std::initializer_list<std::string> fragments,
                    bool any_error_code = false) {
  ASSERT_FALSE(s.ok()) << "expected an error";
  if (!any_error_code) {
    EXPECT_EQ(s.code(), code) << to_string(s.code()) << ": " << s.message();
  }
  for (const std::string& f : fragments)
    EXPECT_TRUE(contains_ci(s.message(), f)) << "message lacks '" << f << "': " << s.message();
}

// Fake, well-separated, 256-byte aligned addresses: never dereferenced,
// because every check exercised with them fails before the device is touched.
void* fake(uintptr_t slot) { return reinterpret_cast<void*>(uintptr_t(1) << 40 | slot << 32); }

Arguments fp8_args_for(const Problem& p) {
  Arguments a;
  a.x = fake(1);
  a.w = fake(2);
  a.w_scales = fake(8);
  if (p.weights.format == WeightFormat::separate) {
    a.w_up = fake(3);
    a.w_up_scales = fake(10);
  }
  if (p.has_bias) a.bias = fake(4);
  if (p.has_bias && p.weights.format == WeightFormat::separate) a.bias_up = fake(5);
  a.y = fake(6);
  if (p.has_preact) a.preact = fake(7);
  a.x_scales = fake(12);
  if (p.output_dtype == DType::fp8_e4m3) a.y_scales = static_cast<float*>(fake(13));
  if (p.has_y_amax) a.y_amax = static_cast<float*>(fake(14));
  return a;
}

detail::DeviceInfo h200() { return test::simulated_h200(); }

detail::DeviceInfo a100() { return test::simulated_a100(); }


// select_config with the dispatcher's knobs unset.
Status route(const Problem& p, const detail::DeviceInfo& dev, Config* c) {
  for (const char* v : {"GATEDMLP_SM90_TILE", "GATEDMLP_SM90_CLUSTER", "GATEDMLP_FORCE_PATH", "GATEDMLP_SM90_PINGPONG",
                        "GATEDMLP_DECODE"})
    unsetenv(v);
  return detail::select_config(p.resolved(), nullptr, dev, c);
}

}  // namespace

// Every combination the FP8 path is documented to take passes check_support.
TEST(Fp8Checks, AcceptsTheGoodProblems) {
  EXPECT_TRUE(check_support(fp8_base()).ok()) << check_support(fp8_base()).message();
  // group (-1: separate, 0: stacked, = U: stacked spelled out), with U
  const std::pair<int64_t, int64_t> layouts[] = {{-1, 96}, {0, 96}, {0, 131}, {1, 131}, {2, 96}, {8, 96},
                                                 {32, 96}, {64, 128}, {128, 256}, {256, 512}, {131, 131}};
  int n = 0;
  for (const auto& [g, u] : layouts)
    for (XScale xs : kXScales)
      for (int rb : {0, 1})
        for (DType sd : {DType::bf16, DType::fp16, DType::fp32})
          for (DType out : {DType::bf16, DType::fp16, DType::fp32})
            for (int opt = 0; opt < 4; ++opt) {
              Problem p = fp8_base();
              p.u = u;
              if (g < 0) p.weights.format = WeightFormat::separate;
              else {
                p.weights.group = g;
                p.weights.first = opt % 2 ? Half::up : Half::gate;
              }
              p.x_scale = xs;
              p.quant.row_block = rb;
              p.scale_dtype = sd;
              p.output_dtype = out;
              p.activation = static_cast<Activation>((n + opt) % 5);
              p.alpha = opt == 3 ? -1.5f : 1.0f;
              p.has_bias = opt >= 2;
              p.bias_dtype = static_cast<DType>(n % 3);
              p.has_preact = opt % 2 == 1;
              p.preact_dtype = static_cast<DType>((n / 3) % 3);
              if (opt == 1) {
                p.ldx = p.k + 16;
                p.ldy = p.u + 3;
                p.weights.ld = p.k / 4 + 4;
                p.ldpre = 2 * p.u + 1;
              }
              const Status s = check_support(p);
              EXPECT_TRUE(s.ok()) << to_string(p) << ": " << s.message();
              ++n;
            }
  // M anywhere, K any multiple of 16 (with block scales too: the last
  // k-block may be partial).
  for (int64_t m : {1, 7, 129, 600, 100000})
    for (int64_t k : {16, 48, 1040, 8320, 16384, 16400})
      for (int scheme : {0, 128}) {
        Problem p = fp8_base();
        p.m = m;
        p.k = k;
        p.quant = fp8_weights(scheme);
        p.x_scale = scheme == 128 ? XScale::block : XScale::tensor;
        if (scheme == 128) p.weights.format = WeightFormat::separate;
        EXPECT_TRUE(check_support(p).ok()) << to_string(p) << ": " << check_support(p).message();
      }
}

// Any X scaling goes with any weight scaling: per tensor, per row and per
// 1 x 128 block of X, each with weights per tensor, per channel and per
// 128 x 128 block, in every scale dtype, on layouts every scheme takes.
TEST(Fp8Checks, EveryXScaleWithEveryWeightScheme) {
  // group (-1: separate, 0: stacked), U: layouts blocked weights take too
  const std::pair<int64_t, int64_t> layouts[] = {{-1, 96}, {-1, 131}, {0, 128}, {0, 384}, {128, 256}, {256, 512}};
  for (const auto& [g, u] : layouts)
    for (XScale xs : kXScales)
      for (int scheme : kWeightSchemes)
        for (DType sd : {DType::bf16, DType::fp16, DType::fp32})
          for (int64_t k : {16, 128, 144, 4096}) {
            Problem p = fp8_base();
            p.u = u;
            p.k = k;
            if (g < 0) p.weights.format = WeightFormat::separate;
            else p.weights.group = g;
            p.x_scale = xs;
            p.quant = fp8_weights(scheme);
            p.scale_dtype = sd;
            const Status s = check_support(p);
            EXPECT_TRUE(s.ok()) << to_string(p) << ": " << s.message();
          }
}

// The weights' words are dense at K / 4 (one byte per weight); X's rows at K.
TEST(Fp8Checks, ResolvedStrides) {
  Problem p = fp8_base();
  p.k = 4096;
  const Problem r = p.resolved();
  EXPECT_EQ(r.weights.ld, 1024);
  EXPECT_EQ(r.ldx, 4096);
  EXPECT_EQ(r.weights.group, p.u);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1u);
  EXPECT_EQ(quant_scale_rows(p.quant, 2 * p.u), 1);                                     // per tensor
  EXPECT_EQ(quant_scale_rows(QuantFormat{QuantMode::fp8_e4m3, 8, 0, 1}, 2 * p.u), 2 * p.u);  // per channel
  EXPECT_EQ(quant_groups_per_row(p.quant, p.k), 1);
  // 128 x 128 blocks: [ceil(N / 128), ceil(K / 128)] scales per tensor.
  const QuantFormat b = fp8_weights(128);
  EXPECT_EQ(quant_scale_rows(b, 2 * 256), 4);
  EXPECT_EQ(quant_scale_rows(b, 131), 2);
  EXPECT_EQ(quant_groups_per_row(b, 4096), 32);
  EXPECT_EQ(quant_groups_per_row(b, 4112), 33);
  EXPECT_EQ(quant_groups_per_row(b, 16), 1);
  Problem q = blocked_base(131, -1);
  q.k = 4112;
  EXPECT_EQ(q.resolved().weights.ld, 1028);
}

// FP8 X is gate/up only.
TEST(Fp8Checks, RefusesTheDownProjection) {
  Problem p = fp8_base();
  p.op = Operation::down;
  expect_refused(check_support(p), StatusCode::not_supported, {"fp8", "down"});
  p.glu_input = true;
  expect_refused(check_support(p), StatusCode::not_supported, {"fp8", "down"});
}

// FP8 X needs FP8 weights: 16-bit weights, affine and MXFP4 are refused.
TEST(Fp8Checks, NeedsFp8Weights) {
  Problem p = fp8_base();
  p.quantized = false;
  p.quant = QuantFormat{};
  expect_refused(check_support(p), StatusCode::invalid_argument, {"fp8", "quant"});
  p = fp8_base();
  p.quant = QuantFormat{QuantMode::affine, 4, 64};
  p.scale_dtype = DType::bf16;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"fp8", "quant"});
  p = fp8_base();
  p.quant = QuantFormat{QuantMode::affine, 8, 32};
  expect_refused(check_support(p), StatusCode::invalid_argument, {"fp8", "quant"});
  p = fp8_base();
  p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};
  expect_refused(check_support(p), StatusCode::invalid_argument, {"fp8", "quant"});
}

// Weight scales per tensor (0, 0), per output channel (0, 1) or per 128 x
// 128 block (128, 128): blocks along K of whole rows (128, 1), (128, 0),
// and blocks of rows over all of K (0, 128) are not built, each refused
// naming group_size and row_block.
TEST(Fp8Checks, RefusesOtherWeightScaleBlocks) {
  Problem p = fp8_base();
  p.u = 128;  // stacked: an interleave block of 128, which 128 x 128 blocks take
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};  // DeepSeek-V3's 128 x 128 blocks: taken
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 1};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size=128", "row_block=1"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 0};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size=128", "row_block=0"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 128};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size=0", "row_block=128"});
  // With separate weights (no layout rule in the way) and X in blocks too.
  p.weights.format = WeightFormat::separate;
  p.x_scale = XScale::block;
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 1};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size", "row_block"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 128};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size", "row_block"});
  // A row block the FP8 format itself does not know.
  p = fp8_base();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 2};
  expect_refused(check_support(p), StatusCode::not_supported, {"row_block"});
  // A K block it does not know.
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 64, 128};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size"});
}

// 128 x 128 weight blocks: separate weights with any U (odd, not a multiple
// of 128: the last row block is partial); fused weights whose interleave
// block (group, or U when stacked) is a multiple of 128, either half first.
TEST(Fp8Checks, BlockedWeightsAcceptedLayouts) {
  struct L {
    int64_t u, group;  // group -1: separate, 0: stacked
  };
  const L good[] = {{1, -1},  {7, -1},  {131, -1}, {200, -1}, {257, -1}, {128, 0},  {256, 0},   {384, 0},
                    {128, 128}, {384, 384}, {256, 128}, {384, 128}, {512, 256}, {768, 256}, {1024, 512}};
  for (const L& l : good)
    for (Half first : {Half::gate, Half::up})
      for (XScale xs : kXScales) {
        if (l.group < 0 && first == Half::up) continue;  // first is fused weights' only
        Problem p = blocked_base(l.u, l.group, first);
        p.x_scale = xs;
        p.m = 129;
        const Status s = check_support(p);
        EXPECT_TRUE(s.ok()) << to_string(p) << ": " << s.message();
      }
  // Blocked scales need no layout rule for per-tensor/channel weights: the
  // layouts refused below are fine there.
  for (int scheme : {0, 1}) {
    Problem p = blocked_base(200, 0);
    p.quant = fp8_weights(scheme);
    EXPECT_TRUE(check_support(p).ok()) << to_string(p) << ": " << check_support(p).message();
    p = blocked_base(128, 64);
    p.quant = fp8_weights(scheme);
    EXPECT_TRUE(check_support(p).ok()) << to_string(p) << ": " << check_support(p).message();
  }
}

// Fused blocked weights whose interleave block is no multiple of 128:
// not_supported, the message naming the interleave block and its value
// (u= when stacked, group= when interleaved).
TEST(Fp8Checks, BlockedWeightsRefusedLayouts) {
  struct L {
    int64_t u, group;
    const char* value;
  };
  const L bad[] = {{200, 0, "u=200"},       {131, 0, "u=131"},       {64, 0, "u=64"},         {200, 200, "group=200"},
                   {128, 64, "group=64"},   {384, 192, "group=192"}, {96, 32, "group=32"},    {256, 1, "group=1"},
                   {640, 320, "group=320"}};
  for (const L& l : bad)
    for (Half first : {Half::gate, Half::up})
      for (XScale xs : kXScales) {
        Problem p = blocked_base(l.u, l.group, first);
        p.x_scale = xs;
        SCOPED_TRACE(to_string(p));
        expect_refused(check_support(p), StatusCode::not_supported, {"interleave block", l.value});
        // validate and run say the same, before any pointer is looked at.
        expect_refused(validate(p, fp8_args_for(p)), StatusCode::not_supported, {"interleave block", l.value});
        expect_refused(run(p, fp8_args_for(p), nullptr, 0, nullptr), StatusCode::not_supported,
                       {"interleave block", l.value});
      }
}

TEST(Fp8Checks, RefusesGather) {
  Problem p = fp8_base();
  p.gather.experts = 8;
  expect_refused(check_support(p), StatusCode::not_supported, {"gather"});
  p.gather.rows_per_x = 3;
  p.m = 33;
  expect_refused(check_support(p), StatusCode::not_supported, {"gather"});
  // The grouped (prefill) form too.
  p = fp8_base();
  p.gather.experts = 4;
  p.gather.grouped = true;
  expect_refused(check_support(p), StatusCode::not_supported, {"gather"});
}

TEST(Fp8Checks, RefusesBatches) {
  Problem p = fp8_base();
  p.batch = 2;
  expect_refused(check_support(p), StatusCode::not_supported, {"batch"});
  p.batch = 0;  // an empty batch is empty work, not an error
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
}

// Weights stored in_out: quantized weights are out_in only.
TEST(Fp8Checks, RefusesWeightsInOut) {
  Problem p = fp8_base();
  p.weights.storage = WeightStorage::in_out;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"weights.storage"});
}

// fp8_e4m3 is X's dtype, and Y's in an FP8 call only: not a bias,
// pre-activation or scale dtype. An x_scale outside the enum is refused by
// name.
TEST(Fp8Checks, Fp8DtypeOnlyWhereItBelongs) {
  // Y may be FP8 in an FP8 call (FP8 Y, below); in a 16-bit one it is refused.
  Problem p = fp8_base();
  p.output_dtype = DType::fp8_e4m3;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  p.input_dtype = DType::bf16;
  p.quantized = false;
  p.quant = QuantFormat{};
  expect_refused(check_support(p), StatusCode::not_supported, {"output_dtype=fp8_e4m3", "input_dtype", "bf16"});
  p = fp8_base();
  p.has_bias = true;
  p.bias_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"bias_dtype"}, true);
  p = fp8_base();
  p.has_preact = true;
  p.preact_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"preact_dtype"}, true);
  p = fp8_base();
  p.scale_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"scale_dtype"}, true);
  p = fp8_base();
  p.x_scale = static_cast<XScale>(5);
  expect_refused(check_support(p), StatusCode::invalid_argument, {"x_scale"});
  // A 16-bit call ignores x_scale, whatever it says.
  Problem q = fp8_base();
  q.input_dtype = DType::bf16;
  q.quantized = false;
  q.quant = QuantFormat{};
  q.x_scale = XScale::row;
  EXPECT_TRUE(check_support(q).ok()) << check_support(q).message();
  // A 16-bit X with FP8 weights (the quantized decode path) still passes.
  q = fp8_base();
  q.input_dtype = DType::fp16;
  q.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
  EXPECT_TRUE(check_support(q).ok()) << check_support(q).message();
}

// The pointers: x_scales required with FP8 X, refused with 16-bit X; both
// named. Checked before the device is asked (fake pointers).
TEST(Fp8Checks, XScalesPointer) {
  for (XScale xs : kXScales)
    for (int scheme : kWeightSchemes) {
      Problem p = fp8_base();
      p.x_scale = xs;
      p.quant = fp8_weights(scheme);
      p.u = 128;  // stacked: an interleave block of 128, which 128 x 128 blocks take
      Arguments a = fp8_args_for(p);
      a.x_scales = nullptr;
      expect_refused(validate(p, a), StatusCode::invalid_argument, {"x_scales", "null"});
      expect_refused(run(p, a, nullptr, 0, nullptr), StatusCode::invalid_argument, {"x_scales"});
    }
  // Blocked weights, separate: both tensors' scales are needed.
  {
    Problem p = blocked_base(131, -1);
    p.x_scale = XScale::block;
    Arguments a = fp8_args_for(p);
    a.w_up_scales = nullptr;
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"w_up_scales"});
    a = fp8_args_for(p);
    a.w_scales = nullptr;
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"w_scales"});
  }
  // Separate weights: the up weights' scales are needed as well.
  Problem p = fp8_base();
  p.weights.format = WeightFormat::separate;
  Arguments a = fp8_args_for(p);
  a.w_up_scales = nullptr;
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"w_up_scales"});
  a = fp8_args_for(p);
  a.w_scales = nullptr;
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"w_scales"});
  // FP8 weights have no biases.
  p = fp8_base();
  a = fp8_args_for(p);
  a.w_biases = fake(9);
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"w_biases"});
  // x_scales on a 16-bit call: a mistake, named.
  Problem q;
  q.m = 33;
  q.k = 64;
  q.u = 96;
  Arguments b;
  b.x = fake(1);
  b.w = fake(2);
  b.y = fake(6);
  b.x_scales = fake(12);
  expect_refused(validate(q, b), StatusCode::invalid_argument, {"x_scales"});
  // ... also with 16-bit X and quantized weights.
  q.quantized = true;
  q.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 1};
  q.scale_dtype = DType::bf16;
  b.w_scales = fake(8);
  expect_refused(validate(q, b), StatusCode::invalid_argument, {"x_scales"});
}

// X scaled per 1 x 128 block: x_scales spans m * ceil(k / 128) fp32 values
// (the overlap check sees exactly that many): y starting on the last of
// them is refused, y right after them is not refused for overlap (fake
// pointers: it fails later, at the device check). Per row: m values; per
// tensor: one.
TEST(Fp8Checks, XScalesExtent) {
  struct C {
    XScale xs;
    int64_t m, k, count;
  };
  const C cases[] = {{XScale::block, 33, 64, 33},   {XScale::block, 33, 128, 33},  {XScale::block, 33, 144, 66},
                     {XScale::block, 7, 272, 21},   {XScale::block, 5, 4112, 165}, {XScale::row, 33, 272, 33},
                     {XScale::tensor, 33, 272, 1}};
  for (const C& c : cases) {
    Problem p = fp8_base();
    p.x_scale = c.xs;
    p.m = c.m;
    p.k = c.k;
    SCOPED_TRACE(to_string(p));
    Arguments a = fp8_args_for(p);
    const char* xs = static_cast<const char*>(a.x_scales);
    a.y = const_cast<char*>(xs) + (c.count - 1) * 4;
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"y", "overlaps", "x_scales"});
    a.y = const_cast<char*>(xs) + c.count * 4;
    const Status s = validate(p, a);
    ASSERT_FALSE(s.ok()) << "fake pointers passed validate";
    EXPECT_EQ(s.message().find("overlaps"), std::string::npos) << s.message();
  }
}

// 128 x 128 weight blocks: w_scales (and w_up_scales) span ceil(N / 128) *
// ceil(K / 128) values of scale_dtype, N the rows of that tensor (2U fused,
// U separate); y on their last one is refused, right after them is not
// refused for overlap.
TEST(Fp8Checks, BlockedWeightScalesExtent) {
  struct C {
    int64_t u, group, k;  // group -1: separate
    DType sd;
    int64_t count;  // per tensor
  };
  const C cases[] = {{256, 0, 272, DType::fp32, 4 * 3},  {128, 128, 4096, DType::bf16, 2 * 32},
                     {384, 128, 144, DType::fp16, 6 * 2}, {131, -1, 272, DType::bf16, 2 * 3},
                     {7, -1, 16, DType::fp32, 1},         {257, -1, 4112, DType::fp16, 3 * 33}};
  for (const C& c : cases)
    for (const char* which : {"w_scales", "w_up_scales"}) {
      const bool up = std::string(which) == "w_up_scales";
      if (up && c.group >= 0) continue;  // fused: one tensor
      Problem p = blocked_base(c.u, c.group);
      p.k = c.k;
      p.scale_dtype = c.sd;
      p.x_scale = XScale::block;
      SCOPED_TRACE(std::string(which) + ": " + to_string(p));
      ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
      Arguments a = fp8_args_for(p);
      const char* base = static_cast<const char*>(up ? a.w_up_scales : a.w_scales);
      const int64_t es = int64_t(dtype_size(c.sd));
      a.y = const_cast<char*>(base) + (c.count - 1) * es;
      expect_refused(validate(p, a), StatusCode::invalid_argument, {"overlaps", which});
      a.y = const_cast<char*>(base) + c.count * es;
      const Status s = validate(p, a);
      ASSERT_FALSE(s.ok()) << "fake pointers passed validate";
      EXPECT_EQ(s.message().find("overlaps"), std::string::npos) << s.message();
    }
}

// An FP8 problem prints its input dtype and how X is scaled.
TEST(Fp8Checks, Printing) {
  EXPECT_STREQ(to_string(DType::fp8_e4m3), "fp8_e4m3");
  EXPECT_STREQ(to_string(XScale::tensor), "tensor");
  EXPECT_STREQ(to_string(XScale::row), "row");
  EXPECT_STREQ(to_string(XScale::block), "block");
  for (XScale xs : kXScales) {
    Problem p = fp8_base();
    p.x_scale = xs;
    const std::string s = to_string(p);
    EXPECT_NE(s.find("fp8_e4m3"), std::string::npos) << s;
    EXPECT_NE(s.find("x_scale"), std::string::npos) << s;
    EXPECT_NE(s.find(std::string("x_scale=") + to_string(xs)), std::string::npos) << s;
  }
  // X in blocks with 128 x 128 weight blocks: both in the description.
  Problem p = blocked_base(256, 128, Half::up);
  p.x_scale = XScale::block;
  const std::string s = to_string(p);
  EXPECT_NE(s.find("x_scale=block"), std::string::npos) << s;
  EXPECT_NE(s.find("group_size=128"), std::string::npos) << s;
  EXPECT_NE(s.find("row_block=128"), std::string::npos) << s;
  EXPECT_NE(s.find("group=128"), std::string::npos) << s;
}

// No rows: not an error, nothing launched, no device asked, null pointers
// fine; the rest of the problem is still checked.
TEST(Fp8Checks, EmptyWork) {
  for (XScale xs : kXScales) {
    Problem p = fp8_base();
    p.x_scale = xs;
    p.m = 0;
    EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
    EXPECT_TRUE(validate(p, Arguments{}).ok()) << validate(p, Arguments{}).message();
    EXPECT_TRUE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << run(p, Arguments{}, nullptr, 0, nullptr).message();
    EXPECT_EQ(workspace_size(p), 0u);
    p.op = Operation::down;
    EXPECT_FALSE(check_support(p).ok()) << "FP8 down with no rows";
    p = fp8_base();
    p.m = 0;
    p.quant.group_size = 128;  // (128, 0): not a scheme FP8 activations take
    EXPECT_FALSE(check_support(p).ok()) << "blocked FP8 scales with no rows";
    // 128 x 128 blocks with no rows: fine on a layout they take, refused on one they do not.
    p = blocked_base(256, 0);
    p.x_scale = xs;
    p.m = 0;
    EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
    EXPECT_TRUE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << run(p, Arguments{}, nullptr, 0, nullptr).message();
    p.u = 200;
    expect_refused(check_support(p), StatusCode::not_supported, {"interleave block", "u=200"});
    expect_refused(run(p, Arguments{}, nullptr, 0, nullptr), StatusCode::not_supported, {"interleave block"});
  }
}

// The dispatcher on simulated devices: the Hopper kernel on an H200, the
// reason naming FP8; refused (not_supported, naming FP8) on an A100, where
// no kernel has an FP8 form; and refused on the H200 for what the e4m3
// kernels cannot read (K and ldx not multiples of 16).
TEST(Fp8Checks, DispatchOnSimulatedDevices) {
  Config c;
  for (XScale xs : kXScales)
    for (int rb : kWeightSchemes)
      for (int64_t m : {1, 16, 64, 129, 4096}) {
        Problem p = fp8_base();
        p.x_scale = xs;
        p.quant = fp8_weights(rb);
        p.m = m;
        p.k = m == 129 ? 4112 : 4096;  // a partial last k-block too
        p.u = 14336;
        if (m == 64) p.weights.group = 128;  // interleaved blocks of 128 rows: any scheme takes them
        const Status a = route(p, a100(), &c);
        expect_refused(a, StatusCode::not_supported, {"fp8"});
        if (!sm90::compiled()) continue;
        const Status s = route(p, h200(), &c);
        ASSERT_TRUE(s.ok()) << to_string(p) << ": " << s.message();
        EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
        EXPECT_NE(c.reason.find("FP8"), std::string::npos) << c.reason;
      }
  if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel";
  Problem p = fp8_base();
  p.k = 40;  // a multiple of 8 (the 16-bit kernels' rule), not of 16
  Status s = route(p, h200(), &c);
  if (check_support(p).ok()) expect_refused(s, StatusCode::not_supported, {"k=40"});
  else expect_refused(check_support(p), StatusCode::invalid_argument, {"k=40"}, true);
  p = fp8_base();
  p.ldx = p.k + 8;
  s = route(p, h200(), &c);
  if (check_support(p).ok()) expect_refused(s, StatusCode::not_supported, {"ldx"});
  else expect_refused(check_support(p), StatusCode::invalid_argument, {"ldx"}, true);
  // Weight rows of words not on 16 bytes.
  p = fp8_base();
  p.weights.ld = p.k / 4 + 2;
  s = route(p, h200(), &c);
  if (check_support(p).ok()) expect_refused(s, StatusCode::not_supported, {"weights.ld"});
  else expect_refused(check_support(p), StatusCode::invalid_argument, {"weights.ld"}, true);
  // A block of rows that neither divides 128 nor is a multiple of it: the
  // Hopper kernel's boxes cannot gather it, and FP8 has no other kernel.
  p = fp8_base();
  p.u = 192;
  p.weights.group = 96;
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  expect_refused(route(p, h200(), &c), StatusCode::not_supported, {"group"});
  // Padded rows on 16 bytes are fine.
  p = fp8_base();
  p.ldx = p.k + 16;
  p.weights.ld = p.k / 4 + 4;
  s = route(p, h200(), &c);
  EXPECT_TRUE(s.ok()) << s.message();
}

// Calls without block scales take the kernels that sum all of K in the
// wgmmas, unless GATEDMLP_FP8_PROMOTE=1 (exactly "1") sends them to the
// promoting kernels; calls with block scales (of X or of the weights)
// promote whatever it says. The plan's reason says which.
TEST(Fp8Checks, PromoteKnobOnSimulatedH200) {
  if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel";
  Config c;
  for (const char* knob : {static_cast<const char*>(nullptr), "1", "0", "yes"}) {
    test::ScopedEnv env("GATEDMLP_FP8_PROMOTE", knob);
    for (XScale xs : kXScales)
      for (int rb : kWeightSchemes) {
        Problem p = fp8_base();
        p.x_scale = xs;
        p.quant = fp8_weights(rb);
        p.m = 300;
        p.k = 16384;
        p.u = 1024;
        SCOPED_TRACE(std::string("GATEDMLP_FP8_PROMOTE=") + (knob ? knob : "(unset)") + ": " + to_string(p));
        const Status s = route(p, h200(), &c);
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
        const bool blocks = xs == XScale::block || rb == 128;
        const bool promoting = c.reason.find("in its own accumulator") != std::string::npos;
        EXPECT_EQ(promoting, blocks || (knob && std::string(knob) == "1")) << c.reason;
      }
  }
}

// Problem::fp8_promote asks for the promoting kernels per call, as the knob
// does for every call: the plan's reason says so, the problem prints it,
// and a plan made without it is not reused with it (the plan cache's key).
// A 16-bit call ignores it, as it ignores x_scale.
TEST(Fp8Checks, PromoteFieldOnSimulatedH200) {
  if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel";
  test::ScopedEnv env("GATEDMLP_FP8_PROMOTE", nullptr);
  Config c;
  for (XScale xs : kXScales)
    for (int rb : kWeightSchemes) {
      Problem p = fp8_base();
      p.x_scale = xs;
      p.quant = fp8_weights(rb);
      Problem q = p;
      q.fp8_promote = true;
      SCOPED_TRACE(to_string(q));
      EXPECT_FALSE(detail::same_problem(p, q));
      EXPECT_NE(to_string(q).find("fp8_promote"), std::string::npos) << to_string(q);
      EXPECT_EQ(to_string(p).find("fp8_promote"), std::string::npos) << to_string(p);
      const Status s = route(q, h200(), &c);
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_NE(c.reason.find("in its own accumulator"), std::string::npos) << c.reason;
    }
  Problem b;
  b.m = 64;
  b.k = 256;
  b.u = 128;
  Problem b2 = b;
  b2.fp8_promote = true;
  EXPECT_TRUE(check_support(b2).ok());
  EXPECT_TRUE(detail::same_problem(b, b2));
}

// ---------------------------------------------------------------- FP8 Y

// An FP8 Y: every X and weight scheme takes it, with either scale layout
// and with or without the amax; what it needs is checked by name.
TEST(Fp8Checks, Fp8OutputAccepted) {
  for (XScale xs : kXScales)
    for (int scheme : kWeightSchemes)
      for (YScaleLayout l : {YScaleLayout::row_major, YScaleLayout::mn_major})
        for (bool amax : {false, true}) {
          Problem p = fp8_base();
          p.x_scale = xs;
          p.quant = fp8_weights(scheme);
          p.u = 128;
          p.output_dtype = DType::fp8_e4m3;
          p.y_scale_layout = l;
          p.has_y_amax = amax;
          p.has_preact = scheme == 1;  // the pre-activation stays available
          EXPECT_TRUE(check_support(p).ok()) << to_string(p) << ": " << check_support(p).message();
        }
}

TEST(Fp8Checks, Fp8OutputRefusals) {
  Problem p = fp8_base();
  p.output_dtype = DType::fp8_e4m3;
  p.y_scale_layout = static_cast<YScaleLayout>(7);
  expect_refused(check_support(p), StatusCode::invalid_argument, {"y_scale_layout", "7"});
  // The amax belongs to an FP8 Y.
  p = fp8_base();
  p.has_y_amax = true;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"has_y_amax", "output_dtype=bf16"});
  // FP8 Y from 16-bit X with FP8 weights (the quantized decode path): refused.
  p = fp8_base();
  p.input_dtype = DType::fp16;
  p.output_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::not_supported, {"output_dtype=fp8_e4m3", "fp16"});
  // The down projection takes no FP8 Y either.
  p = Problem{};
  p.op = Operation::down;
  p.m = 4;
  p.k = 64;
  p.u = 32;
  p.output_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::not_supported, {"output_dtype=fp8_e4m3", "op=down"});
}

// y_scales is required with an FP8 Y and refused without one; y_amax goes
// with has_y_amax. Named, before the device is asked (fake pointers).
TEST(Fp8Checks, Fp8OutputPointers) {
  Problem p = fp8_base();
  p.output_dtype = DType::fp8_e4m3;
  Arguments a = fp8_args_for(p);
  a.y_scales = nullptr;
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"y_scales", "null"});
  expect_refused(run(p, a, nullptr, 0, nullptr), StatusCode::invalid_argument, {"y_scales"});
  a = fp8_args_for(p);
  a.y_amax = static_cast<float*>(fake(14));
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"y_amax", "has_y_amax"});
  p.has_y_amax = true;
  a = fp8_args_for(p);
  a.y_amax = nullptr;
  expect_refused(validate(p, a), StatusCode::invalid_argument, {"y_amax", "null"});
  // y_scales on a bf16 Y: a mistake, named.
  Problem q = fp8_base();
  Arguments b = fp8_args_for(q);
  b.y_scales = static_cast<float*>(fake(13));
  expect_refused(validate(q, b), StatusCode::invalid_argument, {"y_scales", "output_dtype=fp8_e4m3"});
}

// y_scales spans (m - 1) * row stride + (groups - 1) * group stride + 1
// fp32 values: row-major m * ceil(u / 128); MN-major the columns of
// align4(m), the last one m long. An output placed on its last one is
// refused as an overlap, right after it is not. The FP8 Y spans m * ldy
// bytes, y_amax one fp32.
TEST(Fp8Checks, Fp8OutputExtents) {
  struct C {
    YScaleLayout l;
    int64_t m, u, span;
  };
  const C cases[] = {{YScaleLayout::row_major, 33, 300, 99}, {YScaleLayout::mn_major, 33, 300, 2 * 36 + 33},
                     {YScaleLayout::row_major, 1, 128, 1},   {YScaleLayout::mn_major, 1, 129, 4 + 1},
                     {YScaleLayout::mn_major, 8, 96, 8},     {YScaleLayout::mn_major, 5, 1000, 7 * 8 + 5}};
  for (const C& c : cases) {
    Problem p = fp8_base();
    p.m = c.m;
    p.u = c.u;
    p.output_dtype = DType::fp8_e4m3;
    p.y_scale_layout = c.l;
    p.has_y_amax = true;
    SCOPED_TRACE(to_string(p));
    EXPECT_EQ(detail::y_scale_span(p.resolved()), c.span);
    Arguments a = fp8_args_for(p);
    char* ys = reinterpret_cast<char*>(a.y_scales);
    a.y_amax = reinterpret_cast<float*>(ys + (c.span - 1) * 4);
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"overlaps", "y_scales"});
    a.y_amax = reinterpret_cast<float*>(ys + c.span * 4);
    Status s = validate(p, a);
    ASSERT_FALSE(s.ok()) << "fake pointers passed validate";
    EXPECT_EQ(s.message().find("overlaps"), std::string::npos) << s.message();
    // Y: one byte per element.
    a = fp8_args_for(p);
    char* y = static_cast<char*>(a.y);
    a.y_scales = reinterpret_cast<float*>(y + (c.m * c.u - 1) / 4 * 4);  // on its last bytes, 4-byte aligned
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"overlaps"});
    a.y_scales = reinterpret_cast<float*>(y + (c.m * c.u + 3) / 4 * 4);
    s = validate(p, a);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message().find("overlaps"), std::string::npos) << s.message();
  }
}

TEST(Fp8Checks, Fp8OutputPrintingAndPlanKey) {
  EXPECT_STREQ(to_string(YScaleLayout::row_major), "row_major");
  EXPECT_STREQ(to_string(YScaleLayout::mn_major), "mn_major");
  Problem p = fp8_base();
  p.output_dtype = DType::fp8_e4m3;
  p.y_scale_layout = YScaleLayout::mn_major;
  p.has_y_amax = true;
  const std::string s = to_string(p);
  EXPECT_NE(s.find("out=fp8_e4m3(y_scales=mn_major, amax)"), std::string::npos) << s;
  // The layout and the amax are part of the plan's key.
  Problem q = p;
  EXPECT_TRUE(detail::same_problem(p, q));
  q.y_scale_layout = YScaleLayout::row_major;
  EXPECT_FALSE(detail::same_problem(p, q));
  q = p;
  q.has_y_amax = false;
  EXPECT_FALSE(detail::same_problem(p, q));
  // A bf16 Y ignores them.
  Problem b = fp8_base(), c = fp8_base();
  c.y_scale_layout = YScaleLayout::mn_major;
  EXPECT_TRUE(detail::same_problem(b, c));
}

// No rows: nothing launched; a null y_amax is fine (an empty Y's amax is
// 0, written when y_amax is given).
TEST(Fp8Checks, Fp8OutputEmptyWork) {
  Problem p = fp8_base();
  p.m = 0;
  p.output_dtype = DType::fp8_e4m3;
  p.has_y_amax = true;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  EXPECT_TRUE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << run(p, Arguments{}, nullptr, 0, nullptr).message();
}

// The dispatcher's reason says where Y's scales go.
TEST(Fp8Checks, Fp8OutputDispatchOnSimulatedH200) {
  if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel";
  for (YScaleLayout l : {YScaleLayout::row_major, YScaleLayout::mn_major}) {
    Problem p = fp8_base();
    p.m = 4096;
    p.k = 4096;
    p.u = 14336;
    p.output_dtype = DType::fp8_e4m3;
    p.y_scale_layout = l;
    p.has_y_amax = l == YScaleLayout::mn_major;
    Config c;
    const Status s = route(p, h200(), &c);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(c.path, KernelPath::sm90_wgmma);
    EXPECT_NE(c.reason.find("1 x 128 groups"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find(to_string(l)), std::string::npos) << c.reason;
    EXPECT_EQ(c.reason.find("amax") != std::string::npos, p.has_y_amax) << c.reason;
  }
}
