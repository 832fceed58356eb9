// The decode kernel (src/decode_glu/, M <= 16) against the float64 CPU
// reference, on fresh random inputs for every case (the seed is printed):
// every weight layout it reads (separate, stacked, interleaved by any G,
// either half first, padded rows), every activation, bias dtypes, the
// pre-activation, every output dtype, batches with strides (shared weights
// and bias included), padded X and Y rows, M = 1 ... 16, K any multiple of 8
// (K-tail chunks), odd U (a partial last group of 8 columns). Outputs are
// poisoned with NaN first: every element must be written and every byte
// around them (row and batch padding) left alone; the fused error must be at
// most 2x the unfused (cuBLASLt + GLU kernel) error plus a tiny atol
// (run_case, gpu_util.hpp). plan() must say KernelPath::decode for each.
// On an sm_90 device the cases the kernel's Hopper form can run (fused
// one-batch layouts it maps) also run on it (GATEDMLP_DECODE_HOPPER=1: the
// dispatcher keeps such small grids on the register form).
//
// GeGLU (erf) deep in its negative tail against float64 directly.
//
// Then what the kernel must refuse (K % 8, misaligned x, [K, out] storage,
// M = 17, strides that are not multiples of 8, GATEDMLP_DECODE=0): another
// kernel takes the call, plan() or the dispatcher says why, and the result
// is still right.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/internal.hpp"
#include "decode_glu/hopper.hpp"
#include "gpu_util.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

constexpr int64_t kDecodeMaxM = 16;

// A random problem the decode kernel takes. Sizes are kept so that the
// float64 CPU reference stays quick (under ~4M multiply-adds a case).
Problem random_decode_problem(std::mt19937_64& rng) {
  Problem p;
  p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
  // M: the n-tile edges (8 | 9, 16) often, anything in 1 ... 16 otherwise.
  p.m = rng() % 2 ? pick(rng, {1, 2, 7, 8, 9, 15, 16}) : 1 + int64_t(rng() % kDecodeMaxM);
  // K: one chunk of 32 and less, k-blocks of 64 and 128 exactly and with
  // tails, and longer K that loops over several k-blocks per warp.
  p.k = pick(rng, {8, 16, 24, 32, 40, 64, 136, 256, 264, 520, 1000, 1024, 2056, 4104});

  // Layout, then U to fit it (G must divide U).
  const int layout = int(rng() % 8);
  if (layout == 0) {
    p.weights.format = WeightFormat::separate;
    p.u = pick(rng, {1, 3, 8, 17, 40, 77, 129, 200, 264});
  } else if (layout == 1) {
    p.weights.group = 0;  // stacked
    p.u = pick(rng, {1, 5, 8, 31, 64, 95, 161, 250});
  } else {
    const int64_t g = pick(rng, {1, 2, 3, 4, 5, 8, 16, 24, 32, 64, 128});
    p.weights.group = g;
    const int64_t blocks = g >= 64 ? pick(rng, {1, 2, 3}) : pick(rng, {1, 2, 3, 5, 7, 13});
    p.u = g * blocks;
    if (p.u > 300) p.u = g;
  }
  if (p.weights.format == WeightFormat::fused) p.weights.first = rng() % 2 ? Half::up : Half::gate;

  p.activation = static_cast<Activation>(rng() % 5);
  if (p.activation == Activation::swiglu_clamped && rng() % 2) {
    p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;  // small limits: the clamp really bites
    p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
  }
  p.output_dtype = static_cast<DType>(rng() % 3);
  const float alphas[] = {1.0f, 0.5f, -1.5f, 1.25f};
  p.alpha = alphas[rng() % 4];
  random_bias_and_preact(p, rng);
  // Padded rows: X and the weights by multiples of 8 (16-byte rows), Y by anything.
  if (rng() % 3 == 0) p.ldx = p.k + 8 * pick(rng, {1, 3});
  if (rng() % 4 == 0) p.weights.ld = p.k + 8 * pick(rng, {1, 2});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  if (rng() % 3 == 0) {
    p.batch = pick(rng, {2, 3});
    const int64_t ldx = p.ldx ? p.ldx : p.k, ldy = p.ldy ? p.ldy : p.u;
    if (rng() % 2) p.batch_stride_w = 0;  // one set of weights for every batch
    else if (rng() % 2) {
      const int64_t rows = p.weights.format == WeightFormat::separate ? p.u : 2 * p.u;
      p.batch_stride_w = rows * (p.weights.ld ? p.weights.ld : p.k) + 8 * pick(rng, {1, 4});
    }
    if (rng() % 2) p.batch_stride_x = p.m * ldx + 8 * pick(rng, {1, 5});
    if (rng() % 2) p.batch_stride_y = p.m * ldy + pick(rng, {1, 2, 7});
    if (p.has_bias && rng() % 2) p.batch_stride_bias = rng() % 2 ? 0 : (p.weights.format == WeightFormat::separate ? p.u : 2 * p.u) + 3;
    if (p.has_preact && rng() % 2) p.batch_stride_preact = p.m * (p.ldpre ? p.ldpre : 2 * p.u) + pick(rng, {1, 6});
  }
  // The float64 reference: shrink U (keeping it a multiple of G) while the
  // case is above ~4M multiply-adds.
  const int64_t g = p.weights.format == WeightFormat::fused && p.weights.group ? p.weights.group : 1;
  while (p.batch * p.m * 2 * p.u * p.k > 4'000'000 && p.u > g) {
    p.u = std::max(g, (p.u / 2) / g * g);
    if (p.ldy) p.ldy = p.u + 3;
    if (p.ldpre) p.ldpre = 2 * p.u + 4;
    p.batch_stride_y = p.batch_stride_preact = kAuto;
    if (p.batch_stride_w != 0) p.batch_stride_w = kAuto;
    if (p.batch_stride_bias != 0) p.batch_stride_bias = kAuto;
  }
  return p;
}

// Whether the decode kernel's Hopper form takes p when it may run wherever
// it can (GATEDMLP_DECODE_HOPPER=1): on an sm_90 device, for the layouts it maps.
bool hopper_can_run(const Problem& p) {
  ScopedEnv on("GATEDMLP_DECODE_HOPPER", "1");
  Config cfg;
  return plan(p, &cfg).ok() && decode::is_hopper_form(cfg);
}

// Runs a case under the given variants and checks that the first one's
// plan() said decode (with the reason it gives).
void run_decode_case(const Problem& p, std::mt19937_64& rng, CaseStats* st, const std::vector<Variant>& variants,
                     const std::vector<int64_t>& ref_rows = {}) {
  std::vector<Config> plans;
  CaseOptions opt;
  opt.variants = variants;
  opt.plans = &plans;
  opt.ref_rows = ref_rows;
  run_case(p, rng, st, opt);
  if (::testing::Test::HasFailure()) return;
  ASSERT_EQ(plans.size(), variants.size());
  EXPECT_EQ(plans[0].path, KernelPath::decode) << "an eligible case did not take the decode kernel: " << to_string(plans[0]);
  EXPECT_EQ(plans[0].tile_m, p.m) << to_string(plans[0]);
  EXPECT_NE(plans[0].reason.find("decode"), std::string::npos) << plans[0].reason;
}

}  // namespace

// The random suite: several hundred fresh cases, each on the decode kernel.
// Every 16th case also runs with GATEDMLP_DECODE=0 (the same inputs through
// the kernel the decode kernel stands in for), which must not take it.
TEST(GpuDecode, RandomEveryLayoutAndOption) {
  SKIP_WITHOUT_GPU();
  const int n = cases(480);
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  int by_layout[3] = {0, 0, 0}, two_tiles = 0, batched = 0, tails = 0, hopper = 0;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_decode_problem(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    std::vector<Variant> variants = {kAsIs};
    if (i % 16 == 0) variants.push_back(kNoDecode);
    if (hopper_can_run(p)) {
      ++hopper;
      variants.push_back(kDecodeHopper);
    }
    run_decode_case(p, rng, &st, variants);
    if (HasFailure()) return;
    by_layout[p.weights.format == WeightFormat::separate ? 0 : (p.weights.group == 0 ? 1 : 2)]++;
    two_tiles += p.m > 8;
    batched += p.batch > 1;
    tails += p.k % 128 != 0;
  }
  std::printf(
      "[ cases ] %d passed on the decode kernel (%d separate, %d stacked, %d interleaved; %d with M > 8, %d batched, "
      "%d with a K tail; %d on its Hopper form); worst fused/unfused relative-error ratio %.3f\n",
      st.cases, by_layout[0], by_layout[1], by_layout[2], two_tiles, batched, tails, hopper, st.worst_ratio);
  // On an sm_90 device the Hopper form takes the fused one-batch layouts it
  // maps (about a third of the cases): it must have been exercised.
  detail::DeviceInfo dev;
  if (detail::device_info(-1, &dev).ok() && dev.major == 9 && dev.minor == 0 && sm90::compiled()) {
    EXPECT_GT(hopper, n / 8) << "the decode kernel's Hopper form took too few cases";
  }
}

// Every layout x every activation x M in {1, 8, 9, 16}, on one odd shape
// (K with a tail, U not a multiple of 8), so that none is left to chance.
TEST(GpuDecode, EveryLayoutActivationAndTileEdge) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  const int64_t groups[] = {-1, 0, 1, 2, 4, 8, 16, 32, 64};  // -1: separate, 0: stacked
  int i = 0;
  for (int64_t g : groups)
    for (int act = 0; act < 5; ++act)
      for (int64_t m : {1, 8, 9, 16}) {
        Problem p;
        p.m = m;
        p.k = 1000;  // 7 k-blocks of 128 and a tail of 104 (13 pieces of 8)
        p.u = g > 1 ? g * (g >= 32 ? 3 : 13) : 131;
        p.input_dtype = i % 2 ? DType::fp16 : DType::bf16;
        p.output_dtype = static_cast<DType>(i % 3);
        p.activation = static_cast<Activation>(act);
        if (g < 0) p.weights.format = WeightFormat::separate;
        else {
          p.weights.group = g;
          p.weights.first = (act + m) % 2 ? Half::up : Half::gate;
        }
        p.has_bias = (act + i) % 2;
        p.bias_dtype = static_cast<DType>(i % 3);
        p.has_preact = i % 3 == 0;
        p.preact_dtype = static_cast<DType>((i / 3) % 3);
        p.alpha = i % 4 == 1 ? -0.75f : 1.0f;
        // Where the Hopper form can run it, that form too.
        std::vector<Variant> variants = {kAsIs};
        if (hopper_can_run(p)) variants.push_back(kDecodeHopper);
        run_decode_case(p, rng, &st, variants);
        if (HasFailure()) return;
        ++i;
      }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// The shapes the kernel is for, M = 1 ... 16 (the float64 reference on a few
// rows of the big ones; every element must still be written and every row
// agree with the unfused path), and a batch larger than a grid's y extent
// (65535), which the kernel loops over.
TEST(GpuDecode, ModelShapesAndLongBatch) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  struct Shape {
    int64_t m, k, u, group;  // group -1: separate
    DType in, out;
    Activation act;
    bool bias;
    std::vector<int64_t> rows;  // reference rows; empty: all
  };
  const Shape shapes[] = {
      {1, 1024, 2816, 0, DType::bf16, DType::bf16, Activation::silu, false, {}},
      {5, 896, 4864, 0, DType::bf16, DType::bf16, Activation::silu, true, {0, 4}},
      {16, 2048, 8192, -1, DType::fp16, DType::fp16, Activation::gelu_tanh, false, {0, 9, 15}},
      {8, 3072, 8192, 1, DType::bf16, DType::fp32, Activation::silu, true, {7}},
      {3, 4096, 14336, 0, DType::bf16, DType::bf16, Activation::silu, false, {1}},
      {12, 4096, 14336, 32, DType::bf16, DType::bf16, Activation::swiglu_clamped, true, {0, 11}},
  };
  for (const Shape& sh : shapes) {
    Problem p;
    p.m = sh.m;
    p.k = sh.k;
    p.u = sh.u;
    if (sh.group < 0) p.weights.format = WeightFormat::separate;
    else p.weights.group = sh.group;
    p.input_dtype = sh.in;
    p.output_dtype = sh.out;
    p.activation = sh.act;
    p.has_bias = sh.bias;
    SCOPED_TRACE(to_string(p));
    run_decode_case(p, rng, &st, {kAsIs}, sh.rows);
    if (HasFailure()) return;
  }
  {
    Problem p;
    p.m = 2;
    p.k = 24;
    p.u = 5;
    p.batch = 65537 + 3;
    p.weights.group = 1;
    p.has_bias = true;
    p.batch_stride_bias = 0;
    p.activation = Activation::gelu_erf;
    SCOPED_TRACE(to_string(p));
    run_decode_case(p, rng, &st, {kAsIs});
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// What the decode kernel must refuse: another kernel takes the call, plan()
// says why (the dispatcher adds "decode kernel not taken: <reason>"), and the
// result is right.
TEST(GpuDecode, RefusedCallsGoElsewhere) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  auto base = [] {
    Problem p;
    p.m = 4;
    p.k = 136;
    p.u = 40;
    p.activation = Activation::silu;
    return p;
  };
  struct Refusal {
    const char* why;  // what the reason must contain
    Problem p;
  };
  std::vector<Refusal> cases_;
  {
    Problem p = base();
    p.k = 100;
    cases_.push_back({"k=100", p});
  }
  {
    Problem p = base();
    p.weights.storage = WeightStorage::in_out;
    cases_.push_back({"in_out", p});
  }
  {
    Problem p = base();
    p.m = 17;
    cases_.push_back({"", p});  // past kMaxM: the dispatcher does not mention the decode kernel
  }
  {
    Problem p = base();
    p.ldx = p.k + 4;
    cases_.push_back({"ldx=140", p});
  }
  {
    Problem p = base();
    p.weights.format = WeightFormat::separate;
    p.weights.ld = p.k + 4;
    cases_.push_back({"weights.ld=140", p});
  }
  {
    Problem p = base();
    p.batch = 2;
    p.batch_stride_x = p.m * p.k + 4;
    cases_.push_back({"batch_stride_x", p});
  }
  {
    Problem p = base();
    p.batch = 2;
    p.batch_stride_w = 2 * p.u * p.k + 4;
    cases_.push_back({"batch_stride_w", p});
  }
  for (const Refusal& c : cases_) {
    SCOPED_TRACE(std::string(c.why) + ": " + to_string(c.p));
    std::vector<Config> plans;
    CaseOptions opt;
    opt.plans = &plans;
    run_case(c.p, rng, &st, opt);
    if (HasFailure()) return;
    ASSERT_EQ(plans.size(), 1u);
    EXPECT_NE(plans[0].path, KernelPath::decode) << to_string(plans[0]);
    if (*c.why) {
      EXPECT_NE(plans[0].reason.find(std::string("decode kernel not taken: ")), std::string::npos) << plans[0].reason;
      EXPECT_NE(plans[0].reason.find(c.why), std::string::npos) << plans[0].reason;
    } else {
      EXPECT_EQ(plans[0].reason.find("decode kernel not taken"), std::string::npos) << plans[0].reason;
    }
    if (HasFailure()) return;
  }
  // GATEDMLP_DECODE=0 on a case the kernel takes.
  {
    const Problem p = base();
    std::vector<Config> plans;
    CaseOptions opt;
    opt.variants = {kNoDecode};
    opt.plans = &plans;
    run_case(p, rng, &st, opt);
    if (HasFailure()) return;
    EXPECT_NE(plans[0].path, KernelPath::decode) << to_string(plans[0]);
    EXPECT_NE(plans[0].reason.find("GATEDMLP_DECODE=0"), std::string::npos) << plans[0].reason;
  }
  std::printf("[ cases ] %d passed on the other kernels; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// x one element past a 16-byte boundary: the call's own pointers make the
// dispatcher refuse the decode kernel (plan() without pointers cannot see
// it), and the other kernel's answer matches the reference.
TEST(GpuDecode, MisalignedXGoesElsewhere) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  Problem p;
  p.m = 3;
  p.k = 128;
  p.u = 24;
  p.output_dtype = DType::fp32;
  std::vector<unsigned char> hx, hw;
  fill(hx, DType::bf16, p.m * p.k, rng, -1.f, 1.f);
  fill(hw, DType::bf16, 2 * p.u * p.k, rng, -0.2f, 0.2f);
  DeviceBuffer x(hx.size() + 16), w(hw.size()), y(size_t(p.m * p.u) * 4);
  ASSERT_TRUE(x.p && w.p && y.p);
  void* dx = static_cast<unsigned char*>(x.p) + 2;  // one bf16 past 16-byte alignment
  CUDA_OK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(w.p, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));  // NaN
  Arguments a;
  a.x = dx;
  a.w = w.p;
  a.y = y.p;

  detail::DeviceInfo dev;
  ASSERT_TRUE(detail::device_info(-1, &dev).ok());
  Config with_args, without;
  ASSERT_TRUE(detail::select_config(p.resolved(), &a, dev, &with_args).ok());
  ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, dev, &without).ok());
  EXPECT_EQ(without.path, KernelPath::decode) << to_string(without);
  EXPECT_NE(with_args.path, KernelPath::decode) << to_string(with_args);
  EXPECT_NE(with_args.reason.find("is not 16-byte aligned"), std::string::npos) << with_args.reason;

  const Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(sync_within("misaligned x: " + to_string(p)));
  expect_y_matches_cpu(p, hx.data(), hw.data(), y.p, 1e-4, "misaligned x");
}

// GeGLU (erf) deep in the negative tail, fp32 Y: 0.5 g (1 + erf(g / sqrt 2))
// is ~1e-6 |g| at g = -5, where 1 + erf in fp32 keeps only a few bits; the
// kernel's erfc form must keep its relative precision. One token, gate
// values -5, -3, 0.5, 4 (up = 1) straight from the weights.
TEST(GpuDecode, GeluErfNegativeTail) {
  SKIP_WITHOUT_GPU();
  Problem p;
  p.m = 1;
  p.k = 8;
  p.u = 4;
  p.weights.format = WeightFormat::separate;
  p.activation = Activation::gelu_erf;
  p.output_dtype = DType::fp32;
  const float gate[4] = {-5.f, -3.f, 0.5f, 4.f};
  std::vector<uint16_t> hx(8, 0), hw(4 * 8, 0), hu(4 * 8, 0);
  hx[0] = ref::float_to_bf16(1.f);
  for (int j = 0; j < 4; ++j) {
    hw[size_t(j) * 8] = ref::float_to_bf16(gate[j]);
    hu[size_t(j) * 8] = ref::float_to_bf16(1.f);
  }
  DeviceBuffer x(hx.size() * 2), w(hw.size() * 2), wu(hu.size() * 2), y(4 * 4);
  ASSERT_TRUE(x.p && w.p && wu.p && y.p);
  CUDA_OK(cudaMemcpy(x.p, hx.data(), x.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(w.p, hw.data(), w.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(wu.p, hu.data(), wu.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));
  Config c;
  ASSERT_TRUE(plan(p, &c).ok());
  EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.w_up = wu.p;
  a.y = y.p;
  const Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(sync_within("gelu_erf tail: " + to_string(p)));
  std::vector<float> out(4);
  CUDA_OK(cudaMemcpy(out.data(), y.p, y.bytes, cudaMemcpyDeviceToHost));
  Arguments h;
  h.x = hx.data();
  h.w = hw.data();
  h.w_up = hu.data();
  std::vector<double> want;
  ref::cpu_reference(p, h, &want, nullptr);
  for (int j = 0; j < 4; ++j)
    EXPECT_NEAR(out[size_t(j)], want[size_t(j)], 1e-5 * std::fabs(want[size_t(j)]))
        << "g = " << gate[j] << ": got " << out[size_t(j)] << ", float64 " << want[size_t(j)];
}
