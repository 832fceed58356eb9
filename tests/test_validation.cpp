// Every validation error and its message. These run without a GPU: every
// check exercised here happens before the library asks the device anything.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/internal.hpp"
#include "gatedmlp/gatedmlp.hpp"
#include "gatedmlp/layout.hpp"
#include "gatedmlp/quant.hpp"

using namespace gatedmlp;

namespace {

Problem base() {
  Problem p;
  p.m = 33;
  p.k = 64;
  p.u = 96;
  return p;
}

// Fake, well-separated, 256-byte aligned addresses: never dereferenced,
// because every check below fails before the device is touched.
void* fake(uintptr_t slot) { return reinterpret_cast<void*>(uintptr_t(1) << 40 | slot << 32); }

Arguments args_for(const Problem& p) {
  Arguments a;
  a.x = fake(1);
  a.w = fake(2);
  if (p.weights.format == WeightFormat::separate) a.w_up = fake(3);
  if (p.has_bias) a.bias = fake(4);
  if (p.has_bias && p.weights.format == WeightFormat::separate) a.bias_up = fake(5);
  a.y = fake(6);
  if (p.has_preact) a.preact = fake(7);
  return a;
}

// The status is an error of `code` whose message contains every fragment.
void expect_error(const Status& s, StatusCode code, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(s.ok()) << "expected an error";
  EXPECT_EQ(s.code(), code) << s.message();
  for (const std::string& f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << "message lacks '" << f << "': " << s.message();
}

}  // namespace

TEST(Validation, AcceptsTheBaseProblem) { EXPECT_TRUE(check_support(base()).ok()) << check_support(base()).message(); }

TEST(Validation, NonPositiveSizes) {
  for (int64_t v : {0, -5}) {
    Problem p = base(); p.k = v;
    expect_error(check_support(p), StatusCode::invalid_argument, {"k must be >= 1", "got " + std::to_string(v)});
    p = base(); p.u = v;
    expect_error(check_support(p), StatusCode::invalid_argument, {"u must be >= 1", "got " + std::to_string(v)});
  }
  Problem p = base(); p.m = -5;
  expect_error(check_support(p), StatusCode::invalid_argument, {"m must be >= 0", "got -5"});
  p = base(); p.batch = -2;
  expect_error(check_support(p), StatusCode::invalid_argument, {"batch must be >= 0", "got -2"});
}

// m = 0 or batch = 0 is empty work (an empty batch, an expert that no token
// chose): accepted, and run() launches nothing and touches no pointer, so
// null ones (an empty tensor's) are fine. The rest of the problem is still
// checked.
TEST(Validation, EmptyWorkIsNotAnError) {
  for (int which = 0; which < 2; ++which) {
    Problem p = base();
    (which ? p.batch : p.m) = 0;
    EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
    EXPECT_TRUE(validate(p, Arguments{}).ok()) << validate(p, Arguments{}).message();
    // No device is asked: this passes on a machine without a GPU.
    EXPECT_TRUE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << run(p, Arguments{}, nullptr, 0, nullptr).message();
    EXPECT_TRUE(run(p, args_for(p), nullptr, 0, nullptr).ok());
    EXPECT_EQ(workspace_size(p), 0u);
    Config c;
    c.path = KernelPath::sm80_mma;
    ASSERT_TRUE(plan(p, &c).ok());
    EXPECT_EQ(c.path, KernelPath::none);
    EXPECT_NE(c.reason.find("empty"), std::string::npos) << c.reason;
    // Still a problem: its other fields are checked.
    p.k = 0;
    expect_error(check_support(p), StatusCode::invalid_argument, {"k must be >= 1"});
    expect_error(run(p, Arguments{}, nullptr, 0, nullptr), StatusCode::invalid_argument, {"k must be >= 1"});
    p = base();
    (which ? p.batch : p.m) = 0;
    p.weights.group = 7;
    expect_error(check_support(p), StatusCode::invalid_argument, {"weights.group=7", "must divide u=96"});
  }
}

TEST(Validation, Dtypes) {
  Problem p = base();
  p.input_dtype = DType::fp32;
  expect_error(check_support(p), StatusCode::not_supported, {"input_dtype", "bf16 or fp16", "fp32"});
  p = base();
  p.output_dtype = static_cast<DType>(9);
  expect_error(check_support(p), StatusCode::invalid_argument, {"output_dtype", "9"});
  p = base();
  p.has_bias = true;
  p.bias_dtype = static_cast<DType>(7);
  expect_error(check_support(p), StatusCode::invalid_argument, {"bias_dtype", "7"});
  for (DType d : {DType::bf16, DType::fp16, DType::fp32}) {
    p = base();
    p.output_dtype = d;
    EXPECT_TRUE(check_support(p).ok());
  }
}

TEST(Validation, ActivationAndScalars) {
  Problem p = base();
  p.activation = static_cast<Activation>(42);
  expect_error(check_support(p), StatusCode::invalid_argument, {"activation", "42"});
  p = base();
  p.activation = Activation::swiglu_clamped;
  p.act_params.clamp_limit = 0.f;
  expect_error(check_support(p), StatusCode::invalid_argument, {"clamp_limit", "> 0", "got 0"});
  p.act_params.clamp_limit = NAN;
  expect_error(check_support(p), StatusCode::invalid_argument, {"clamp_limit"});
  p.act_params.clamp_limit = 7.f;
  p.act_params.clamp_alpha = INFINITY;
  expect_error(check_support(p), StatusCode::invalid_argument, {"clamp_alpha", "finite"});
  p = base();
  p.alpha = NAN;
  expect_error(check_support(p), StatusCode::invalid_argument, {"alpha must be finite"});
}

TEST(Validation, WeightLayout) {
  Problem p = base();
  p.weights.group = 7;  // 96 % 7 != 0
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.group=7", "must divide u=96"});
  p.weights.group = 200;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.group", "[0, u=96]", "got 200"});
  p.weights.group = -1;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.group", "got -1"});
  for (int64_t g : {1, 2, 3, 8, 32, 48, 96}) {
    p.weights.group = g;
    EXPECT_TRUE(check_support(p).ok()) << g;
  }
  p = base();
  p.weights.format = WeightFormat::separate;
  p.weights.group = 32;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.group", "fused weights only", "got 32"});
  p.weights.group = 0;
  p.weights.first = Half::up;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.first", "fused weights only"});
  p = base();
  p.weights.format = static_cast<WeightFormat>(5);
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.format", "5"});
}

TEST(Validation, LeadingDimensions) {
  Problem p = base();
  p.ldx = 63;
  expect_error(check_support(p), StatusCode::invalid_argument, {"ldx", ">= 64", "got 63"});
  p = base();
  p.weights.ld = 10;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.ld", ">= 64", "got 10"});
  p = base();
  p.weights.storage = WeightStorage::in_out;
  p.weights.ld = 100;  // needs >= 2u = 192
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.ld", ">= 192", "got 100"});
  p.weights.format = WeightFormat::separate;  // needs >= u = 96
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  p = base();
  p.ldy = 95;
  expect_error(check_support(p), StatusCode::invalid_argument, {"ldy", ">= 96", "got 95"});
  p = base();
  p.has_preact = true;
  p.ldpre = 191;
  expect_error(check_support(p), StatusCode::invalid_argument, {"ldpre", ">= 192", "got 191"});
}

TEST(Validation, BatchStrides) {
  Problem p = base();
  p.batch = 3;
  p.batch_stride_x = -7;
  expect_error(check_support(p), StatusCode::invalid_argument, {"batch_stride_x", "got -7"});
  p = base();
  p.batch = 3;
  p.batch_stride_y = 100;  // one batch of y spans 32*96 + 96
  expect_error(check_support(p), StatusCode::invalid_argument, {"batch_stride_y=100", "overlap", ">= 3168"});
  p = base();
  p.batch = 3;
  p.batch_stride_w = 0;  // shared weights are fine
  p.batch_stride_x = 0;  // and so is one X for every batch
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  p.has_preact = true;
  p.batch_stride_preact = 0;
  expect_error(check_support(p), StatusCode::invalid_argument, {"batch_stride_preact=0", "overlap"});
}

TEST(Validation, AbsurdStridesAreRefused) {
  Problem p = base();
  p.ldx = int64_t(1) << 60;
  expect_error(check_support(p), StatusCode::invalid_argument, {"'x'", "more than any device can address"});
}

TEST(Validation, MissingAndStrayPointers) {
  Problem p = base();
  Arguments a = args_for(p);
  a.x = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'x' is null"});
  a = args_for(p);
  a.y = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'y' is null"});
  a = args_for(p);
  a.w_up = fake(3);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_up' is set", "fused"});
  a = args_for(p);
  a.bias = fake(4);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'bias' is set", "has_bias=false"});
  a = args_for(p);
  a.preact = fake(7);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'preact' is set", "has_preact=false"});

  p.weights.format = WeightFormat::separate;
  p.has_bias = true;
  p.has_preact = true;
  a = args_for(p);
  a.w_up = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_up' is null", "separate"});
  a = args_for(p);
  a.bias_up = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'bias_up' is null"});
  a = args_for(p);
  a.preact = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'preact' is null", "has_preact=true"});
}

TEST(Validation, Misalignment) {
  Problem p = base();
  Arguments a = args_for(p);
  a.x = static_cast<const char*>(a.x) + 1;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'x'", "aligned", "2 bytes"});
  p.output_dtype = DType::fp32;
  a = args_for(p);
  a.y = static_cast<char*>(a.y) + 2;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'y'", "aligned", "fp32", "4 bytes"});
}

TEST(Validation, OutputOverlappingAnInput) {
  Problem p = base();
  Arguments a = args_for(p);
  a.y = const_cast<void*>(a.x);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"output 'y'", "overlaps 'x'"});
  // The last element of x is the first of y: still an overlap.
  a = args_for(p);
  a.y = static_cast<char*>(const_cast<void*>(a.x)) + (p.m * p.k - 1) * 2;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"output 'y'", "overlaps 'x'"});
  // One element further is fine as far as overlap goes.
  a.y = static_cast<char*>(a.y) + 2;
  const Status s = validate(p, a);
  EXPECT_TRUE(s.ok() || s.message().find("overlap") == std::string::npos) << s.message();

  p.has_preact = true;
  a = args_for(p);
  a.preact = static_cast<char*>(a.y) + 64;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'y'", "overlaps 'preact'"});
  a = args_for(p);
  a.preact = const_cast<void*>(a.w);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"output 'preact'", "overlaps 'w'"});
}

TEST(Validation, RunRefusesBeforeLaunching) {
  // run() goes through the same checks; with a bad shape nothing reaches a device.
  Problem p = base();
  p.u = 0;
  expect_error(run(p, args_for(base()), nullptr, 0, nullptr), StatusCode::invalid_argument, {"u must be >= 1"});
}

TEST(Validation, PrintsProblemAndConfig) {
  Problem p = base();
  p.activation = Activation::swiglu_clamped;
  p.weights.group = 32;
  p.weights.first = Half::up;
  const std::string s = to_string(p);
  for (const char* f : {"m=33", "k=64", "u=96", "swiglu_clamped", "limit=7", "group=32", "first=up", "out_in"})
    EXPECT_NE(s.find(f), std::string::npos) << f << " not in " << s;
  Config c;
  c.path = KernelPath::sm80_mma;
  c.tile_m = 128;
  c.tile_n = 64;
  c.reason = "because";
  const std::string cs = to_string(c);
  for (const char* f : {"sm80_mma", "128x64", "because"}) EXPECT_NE(cs.find(f), std::string::npos) << cs;
}

// ---------------------------------------------------------------- quantized weights

namespace {

Problem quant_base() {
  Problem p = base();
  p.m = 4;
  p.k = 256;
  p.quantized = true;
  return p;
}

Arguments quant_args_for(const Problem& p) {
  Arguments a = args_for(p);
  a.w_scales = fake(8);
  if (p.quant.mode == QuantMode::affine) a.w_biases = fake(9);
  if (p.weights.format == WeightFormat::separate) {
    a.w_up_scales = fake(10);
    if (p.quant.mode == QuantMode::affine) a.w_up_biases = fake(11);
  }
  return a;
}

}  // namespace

TEST(Validation, QuantizedShapesAndFormats) {
  EXPECT_TRUE(check_support(quant_base()).ok()) << check_support(quant_base()).message();
  Problem p = quant_base();
  p.k = 250;
  expect_error(check_support(p), StatusCode::invalid_argument, {"k=250", "group_size=64"});
  p = quant_base();
  p.quant.bits = 3;
  expect_error(check_support(p), StatusCode::not_supported, {"bits=3"});
  p = quant_base();
  p.quant.group_size = 16;
  expect_error(check_support(p), StatusCode::not_supported, {"group_size=16"});
  p = quant_base();
  p.quant = QuantFormat{QuantMode::mxfp4, 4, 64};
  expect_error(check_support(p), StatusCode::not_supported, {"mxfp4", "group_size=64"});
  p = quant_base();
  p.weights.storage = WeightStorage::in_out;
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.storage", "out_in", "quantized"});
  p = quant_base();
  p.weights.ld = 16;  // 256 4-bit elements are 32 words
  expect_error(check_support(p), StatusCode::invalid_argument, {"weights.ld", "words", ">= 32", "got 16"});
  p = quant_base();
  p.batch = 2;
  expect_error(check_support(p), StatusCode::not_supported, {"quantized", "batch=2"});
  p = quant_base();
  p.scale_dtype = static_cast<DType>(7);
  expect_error(check_support(p), StatusCode::invalid_argument, {"scale_dtype"});
  // Dense ld is in words: K * bits / 32.
  p = quant_base();
  EXPECT_EQ(p.resolved().weights.ld, 32);
  p.quant.bits = 8;
  EXPECT_EQ(p.resolved().weights.ld, 64);
  const std::string s = to_string(quant_base());
  for (const char* f : {"quant=", "affine", "bits=4", "scales=bf16"}) EXPECT_NE(s.find(f), std::string::npos) << f << " not in " << s;
}

TEST(Validation, QuantizedPointers) {
  Problem p = quant_base();
  Arguments a = quant_args_for(p);
  a.w_scales = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_scales'", "null"});
  a = quant_args_for(p);
  a.w_biases = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_biases'", "null"});
  // mxfp4 has no biases: one passed is a mistake.
  p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};
  a = quant_args_for(p);
  a.w_biases = fake(9);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_biases'", "mxfp4"});
  // Separate weights need the up pair.
  p = quant_base();
  p.weights.format = WeightFormat::separate;
  a = quant_args_for(p);
  a.w_up_scales = nullptr;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_up_scales'"});
  // Scales on 16-bit weights are a mistake too.
  p = base();
  a = args_for(p);
  a.w_scales = fake(8);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_scales'", "not quantized"});
  // Words are uint32: 4-byte aligned.
  p = quant_base();
  a = quant_args_for(p);
  a.w = static_cast<const char*>(a.w) + 2;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w'", "uint32", "4 bytes"});
  // The output may not overlap the scales.
  a = quant_args_for(p);
  a.y = const_cast<void*>(a.w_scales);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"output 'y'", "overlaps 'w_scales'"});
}

TEST(Validation, Fp8Formats) {
  Problem p = quant_base();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
  p.scale_dtype = DType::fp32;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  EXPECT_EQ(p.resolved().weights.ld, 64);  // 256 bytes are 64 words
  p.k = 260;  // any multiple of 4; a partial last block
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  EXPECT_EQ(quant_groups_per_row(p.quant, 260), 3);
  EXPECT_EQ(quant_scale_rows(p.quant, 192), 2);
  p.k = 258;
  expect_error(check_support(p), StatusCode::invalid_argument, {"k=258", "multiple of 4"});
  p = quant_base();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 64, 128};
  expect_error(check_support(p), StatusCode::not_supported, {"fp8_e4m3", "group_size=64"});
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 64};
  expect_error(check_support(p), StatusCode::not_supported, {"fp8_e4m3", "row_block=64"});
  p.quant = QuantFormat{QuantMode::affine, 4, 64, 128};
  expect_error(check_support(p), StatusCode::not_supported, {"row_block=128"});
  // Per tensor and per channel: one scale, one per row.
  EXPECT_EQ(quant_scale_rows(QuantFormat{QuantMode::fp8_e4m3, 8, 0, 0}, 192), 1);
  EXPECT_EQ(quant_groups_per_row(QuantFormat{QuantMode::fp8_e4m3, 8, 0, 1}, 4096), 1);
  // No biases, and scales that cover the blocks.
  p = quant_base();
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
  Arguments a = quant_args_for(p);
  a.w_biases = fake(9);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'w_biases'", "fp8_e4m3"});
  // The output may not overlap the scales, which span [1, 2] floats here.
  a = quant_args_for(p);
  a.y = static_cast<char*>(const_cast<void*>(a.w_scales)) + 4;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"output 'y'", "overlaps 'w_scales'"});
}

// No tokens (an empty batch, an expert no token chose) with quantized
// weights: not an error, nothing launched, no device asked; the format is
// still checked.
TEST(Validation, QuantizedEmptyWork) {
  for (const QuantFormat& f : {QuantFormat{QuantMode::affine, 4, 64}, QuantFormat{QuantMode::mxfp4, 4, 32},
                               QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128}}) {
    Problem p = quant_base();
    p.quant = f;
    p.m = 0;
    EXPECT_TRUE(validate(p, Arguments{}).ok()) << validate(p, Arguments{}).message();
    EXPECT_TRUE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << run(p, Arguments{}, nullptr, 0, nullptr).message();
    EXPECT_EQ(workspace_size(p), 0u);
    p.k = 250;
    EXPECT_FALSE(run(p, Arguments{}, nullptr, 0, nullptr).ok()) << "a bad K is refused even with no rows";
  }
}

TEST(Validation, DownProjection) {
  Problem p = base();
  p.op = Operation::down;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  // One weight tensor: no layout of gate/up halves, no pre-activation.
  Problem q = p;
  q.weights.format = WeightFormat::separate;
  expect_error(check_support(q), StatusCode::invalid_argument, {"op=down takes one weight tensor", "separate"});
  q = p;
  q.weights.group = 32;
  expect_error(check_support(q), StatusCode::invalid_argument, {"op=down", "group=32"});
  q = p;
  q.has_preact = true;
  expect_error(check_support(q), StatusCode::invalid_argument, {"has_preact applies to op=gate_up"});
  q = p;
  q.op = static_cast<Operation>(7);
  expect_error(check_support(q), StatusCode::invalid_argument, {"op has invalid value 7"});
  // glu_input belongs to the down projection.
  q = base();
  q.glu_input = true;
  expect_error(check_support(q), StatusCode::invalid_argument, {"glu_input applies to op=down"});
  // Its rows: ldy against u, the weights' ld against k (out_in) or u (in_out).
  q = p;
  q.weights.ld = 63;
  expect_error(check_support(q), StatusCode::invalid_argument, {"weights.ld", ">= 64", "got 63"});
  q = p;
  q.weights.storage = WeightStorage::in_out;
  q.weights.ld = 95;
  expect_error(check_support(q), StatusCode::invalid_argument, {"weights.ld", ">= 96", "got 95"});
  // Pointers: x_up with glu_input and only then; no w_up, no bias_up.
  q = p;
  q.glu_input = true;
  Arguments a = args_for(q);
  expect_error(validate(q, a), StatusCode::invalid_argument, {"'x_up' is null", "glu_input=true"});
  a.x_up = fake(8);
  q.glu_input = false;
  expect_error(validate(q, a), StatusCode::invalid_argument, {"'x_up' is set", "op=down with glu_input=true"});
  q = p;
  q.has_bias = true;
  a = args_for(q);
  a.bias_up = fake(5);
  expect_error(validate(q, a), StatusCode::invalid_argument, {"'bias_up' is set"});
  // Empty work is not an error.
  q = p;
  q.m = 0;
  EXPECT_TRUE(validate(q, Arguments{}).ok());
  EXPECT_TRUE(run(q, Arguments{}, nullptr, 0, nullptr).ok());
  // Printed as what it is.
  q = p;
  q.glu_input = true;
  q.activation = Activation::gelu_tanh;
  const std::string s = to_string(q);
  EXPECT_NE(s.find("Problem{down m=33"), std::string::npos) << s;
  EXPECT_NE(s.find("glu_input=gelu_tanh"), std::string::npos) << s;
  EXPECT_STREQ(to_string(KernelPath::cublas), "cublas");
  EXPECT_STREQ(to_string(Operation::down), "down");
}

TEST(Validation, Gather) {
  Problem p = base();  // m = 33
  p.m = 32;
  p.gather.experts = 8;
  p.gather.rows_per_x = 4;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  Problem q = p;
  q.gather.rows_per_x = 3;
  expect_error(check_support(q), StatusCode::invalid_argument, {"m=32", "multiple of gather.rows_per_x=3"});
  q = p;
  q.gather.rows_per_index = 5;
  expect_error(check_support(q), StatusCode::invalid_argument, {"m=32", "multiple of gather.rows_per_index=5"});
  q = p;
  q.gather.rows_per_index = 0;
  expect_error(check_support(q), StatusCode::invalid_argument, {"gather.rows_per_index must be >= 1, got 0"});
  q = p;
  q.gather.experts = -1;
  expect_error(check_support(q), StatusCode::invalid_argument, {"gather.experts must be >= 0", "got -1"});
  q = p;
  q.gather.experts = kMaxGatherExperts + 1;
  expect_error(check_support(q), StatusCode::not_supported, {"gather.experts=8193", "8192"});
  q = p;
  q.gather.index_type = static_cast<IndexType>(3);
  expect_error(check_support(q), StatusCode::invalid_argument, {"gather.index_type has invalid value 3"});
  q = p;
  q.batch = 2;
  expect_error(check_support(q), StatusCode::invalid_argument, {"batch = 1", "got batch=2"});
  q = p;
  q.weights.storage = WeightStorage::in_out;
  expect_error(check_support(q), StatusCode::not_supported, {"out_in", "convert_weights"});
  // Pointers: the indices are required with a gather, and only then; so is index_error.
  Arguments a = args_for(p);
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'indices' is null", "gather.experts > 0"});
  a.indices = fake(9);
  Problem plain = base();
  Arguments b = args_for(plain);
  b.indices = fake(9);
  expect_error(validate(plain, b), StatusCode::invalid_argument, {"'indices' is set", "gather.experts is 0"});
  b.indices = nullptr;
  b.index_error = reinterpret_cast<int64_t*>(fake(10));
  expect_error(validate(plain, b), StatusCode::invalid_argument, {"'index_error' is set", "gather.experts is 0"});
  b.index_error = nullptr;
  b.index_trap = true;
  expect_error(validate(plain, b), StatusCode::invalid_argument, {"'index_trap' is set", "gather.experts is 0"});
  // Alignment of the indices to their type.
  q = p;
  q.gather.index_type = IndexType::int64;
  a.indices = static_cast<char*>(fake(9)) + 4;
  expect_error(validate(q, a), StatusCode::invalid_argument, {"'indices'", "int64 element size of 8"});
  // The row scale: a gathered down projection's, and only there.
  q = p;
  q.has_row_scale = true;
  expect_error(check_support(q), StatusCode::invalid_argument, {"has_row_scale applies to a gathered down projection", "op=gate_up"});
  q.op = Operation::down;
  q.gather.experts = 0;
  q.gather.rows_per_x = 1;
  expect_error(check_support(q), StatusCode::invalid_argument, {"has_row_scale", "gather.experts=0"});
  q.gather.experts = 8;
  EXPECT_TRUE(check_support(q).ok()) << check_support(q).message();
  Arguments ra = args_for(q);
  ra.indices = fake(9);
  expect_error(validate(q, ra), StatusCode::invalid_argument, {"'row_scale' is null", "has_row_scale=true"});
  q.has_row_scale = false;
  ra.row_scale = fake(11);
  expect_error(validate(q, ra), StatusCode::invalid_argument, {"'row_scale' is set", "has_row_scale=false"});
  // Empty work.
  q = p;
  q.m = 0;
  EXPECT_TRUE(validate(q, Arguments{}).ok());
  // Printed.
  const std::string s = to_string(p);
  EXPECT_NE(s.find("gather(experts=8 rows_per_x=4 rows_per_index=1 indices=int32)"), std::string::npos) << s;
}

// Grouped (rows sorted by expert, E offsets): gate_up on 16-bit weights only,
// each refusal by name; the offsets are E values.
TEST(Validation, Grouped) {
  Problem p = base();  // m = 33
  p.gather.experts = 8;
  p.gather.grouped = true;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  EXPECT_NE(to_string(p).find("grouped"), std::string::npos) << to_string(p);
  Problem q = p;
  q.gather.rows_per_x = 3;
  q.m = 33;
  expect_error(check_support(q), StatusCode::invalid_argument, {"grouped", "rows_per_x = rows_per_index = 1", "rows_per_x=3"});
  q = p;
  q.has_preact = true;
  expect_error(check_support(q), StatusCode::not_supported, {"grouped", "no pre-activation"});
  q = p;
  q.op = Operation::down;
  expect_error(check_support(q), StatusCode::not_supported, {"grouped", "gate_up only"});
  q = p;
  q.quantized = true;
  expect_error(check_support(q), StatusCode::not_supported, {"grouped", "16-bit weights"});
  // The offsets: E int32 values, aligned.
  Arguments a = args_for(p);
  a.indices = static_cast<char*>(fake(9)) + 2;
  expect_error(validate(p, a), StatusCode::invalid_argument, {"'indices'", "int32 element size of 4"});
  // Grouped and plain gathers are different problems (the plan cache's key).
  q = p;
  q.gather.grouped = false;
  EXPECT_FALSE(detail::same_problem(p, q));
}
