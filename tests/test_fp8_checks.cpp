// FP8 activations (input_dtype = fp8_e4m3) on the host: what check_support
// and validate accept and refuse, by name, before any device is asked; how
// an FP8 problem prints; empty work; and the dispatcher's choice on
// simulated devices (the Hopper kernel on an H200, a refusal on an A100).
// The GPU suite is tests/test_gpu_fp8.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/internal.hpp"
#include "gatedmlp/gatedmlp.hpp"
#include "gatedmlp/quant.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"
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
    for (XScale xs : {XScale::tensor, XScale::row})
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
  // M anywhere, K any multiple of 16.
  for (int64_t m : {1, 7, 129, 600, 100000})
    for (int64_t k : {16, 48, 1040, 8320, 16384}) {
      Problem p = fp8_base();
      p.m = m;
      p.k = k;
      EXPECT_TRUE(check_support(p).ok()) << to_string(p) << ": " << check_support(p).message();
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

// Weight scales per tensor or per output channel only: blocks along K
// (group_size != 0) and blocks of rows (row_block 128) are not built.
TEST(Fp8Checks, RefusesBlockedWeightScales) {
  Problem p = fp8_base();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};  // DeepSeek-V3's 128 x 128 blocks
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 1};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 0};
  expect_refused(check_support(p), StatusCode::not_supported, {"group_size"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 128};
  expect_refused(check_support(p), StatusCode::not_supported, {"row_block"});
  // A row block the FP8 format itself does not know.
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 0, 2};
  expect_refused(check_support(p), StatusCode::not_supported, {"row_block"});
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

// fp8_e4m3 is an input dtype only: not an output, bias, pre-activation or
// scale dtype. An x_scale outside the enum is refused by name.
TEST(Fp8Checks, Fp8IsAnInputDtypeOnly) {
  Problem p = fp8_base();
  p.output_dtype = DType::fp8_e4m3;
  expect_refused(check_support(p), StatusCode::invalid_argument, {"output_dtype"}, true);
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
  for (XScale xs : {XScale::tensor, XScale::row}) {
    Problem p = fp8_base();
    p.x_scale = xs;
    Arguments a = fp8_args_for(p);
    a.x_scales = nullptr;
    expect_refused(validate(p, a), StatusCode::invalid_argument, {"x_scales", "null"});
    expect_refused(run(p, a, nullptr, 0, nullptr), StatusCode::invalid_argument, {"x_scales"});
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

// An FP8 problem prints its input dtype and how X is scaled.
TEST(Fp8Checks, Printing) {
  EXPECT_STREQ(to_string(DType::fp8_e4m3), "fp8_e4m3");
  EXPECT_STREQ(to_string(XScale::tensor), "tensor");
  EXPECT_STREQ(to_string(XScale::row), "row");
  for (XScale xs : {XScale::tensor, XScale::row}) {
    Problem p = fp8_base();
    p.x_scale = xs;
    const std::string s = to_string(p);
    EXPECT_NE(s.find("fp8_e4m3"), std::string::npos) << s;
    EXPECT_NE(s.find("x_scale"), std::string::npos) << s;
    EXPECT_NE(s.find(std::string("x_scale=") + to_string(xs)), std::string::npos) << s;
  }
}

// No rows: not an error, nothing launched, no device asked, null pointers
// fine; the rest of the problem is still checked.
TEST(Fp8Checks, EmptyWork) {
  for (XScale xs : {XScale::tensor, XScale::row}) {
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
    p.quant.group_size = 128;
    EXPECT_FALSE(check_support(p).ok()) << "blocked FP8 scales with no rows";
  }
}

// The dispatcher on simulated devices: the Hopper kernel on an H200, the
// reason naming FP8; refused (not_supported, naming FP8) on an A100, where
// no kernel has an FP8 form; and refused on the H200 for what the e4m3
// kernels cannot read (K and ldx not multiples of 16).
TEST(Fp8Checks, DispatchOnSimulatedDevices) {
  Config c;
  for (XScale xs : {XScale::tensor, XScale::row})
    for (int rb : {0, 1})
      for (int64_t m : {1, 16, 64, 129, 4096}) {
        Problem p = fp8_base();
        p.x_scale = xs;
        p.quant.row_block = rb;
        p.m = m;
        p.k = 4096;
        p.u = 14336;
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
