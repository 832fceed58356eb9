// The down projection (Problem::op = Operation::down) on fresh random cases:
// 16-bit weights (out_in and in_out, padded rows, batches with shared or
// per-batch weights and biases) and every quantized format, the GLU fused
// into the input (every activation) or not, bias of every dtype, alpha,
// every output dtype, padded X and Y, odd U, K with tails, and M from 1
// past the decode kernels' rows, so every path runs: the 16-bit decode
// kernel (M <= 16), the quantized one (M <= 64; tiled int4: M <= 16 with
// scales of X's dtype), and cuBLASLt (with the
// weights dequantized into the workspace where a quantized kernel cannot
// read them).
//
// Every element of Y is held to float64 on what the kernels multiply: the
// input's GLU rounded to X's type (as an unfused model stores it), and the
// dequantized weights rounded to X's type (FP8 on its decode kernel: the
// exact e4m3 values). The RMS error against the exact float64 function
// (exact GLU, exact weights) is bounded too. Outputs are poisoned with NaN:
// every element must be written, padding must stay poison, and a call
// refused for too small a workspace writes nothing.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/activation_math.hpp"
#include "gatedmlp/quant.hpp"
#include "gpu_util.hpp"
#include "quant_decode/quant_decode.hpp"
#include "quant_weights.hpp"
#include "scoped_env.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

Problem random_down_problem(std::mt19937_64& rng) {
  Problem p;
  p.op = Operation::down;
  p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
  if (rng() % 7 >= 2) random_quant_format(p, rng);  // 2 in 7 with 16-bit weights
  // The tiled order (tile_quantized on the rows as they are): U a multiple
  // of 16, dense; mostly scales of X's dtype and M <= 16 (the tiled
  // kernels'), else the dequantizing path.
  const bool tiled = p.quantized && p.quant.mode == QuantMode::affine && p.quant.bits == 4 && !p.quant.repacked &&
                     rng() % 3 == 0;
  if (tiled) {
    p.quant.tiled = true;
    if (rng() % 4) p.scale_dtype = p.input_dtype;
  }
  const int mk = int(rng() % 8);
  p.m = mk < 3 ? pick(rng, {1, 2, 7, 8, 9, 15, 16, 17, 32, 33, 63, 64})
               : mk < 7 ? 1 + int64_t(rng() % 64) : pick(rng, {65, 80, 129});
  if (tiled && rng() % 4) p.m = 1 + int64_t(rng() % 16);
  const int64_t gs = p.quantized ? p.quant.group_size : 0;
  p.k = gs ? gs * pick(rng, {1, 2, 3, 5, 8, 9, 17, 33})
           : pick(rng, {8, 16, 24, 48, 64, 120, 128, 136, 400, 1032, 2056});
  if (p.quantized && p.quant.mode == QuantMode::fp8_e4m3 && gs && rng() % 3 == 0) p.k -= 16 * pick(rng, {1, 3});
  if (!p.quantized && rng() % 8 == 0) p.k = pick(rng, {12, 100, 333});  // not a multiple of 8: cuBLASLt
  p.u = tiled ? 16 * pick(rng, {1, 2, 3, 5, 9, 13}) : pick(rng, {1, 3, 8, 15, 16, 17, 40, 77, 129, 200});
  if (!p.quantized && rng() % 4 == 0) p.weights.storage = WeightStorage::in_out;
  if (rng() % 2) {
    p.glu_input = true;
    p.activation = static_cast<Activation>(rng() % 5);
    if (p.activation == Activation::swiglu_clamped && rng() % 2) {
      p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;
      p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
    }
  }
  p.output_dtype = static_cast<DType>(rng() % 3);
  const float alphas[] = {1.0f, 0.5f, -1.5f};
  p.alpha = alphas[rng() % 3];
  if (rng() % 2) {
    p.has_bias = true;
    p.bias_dtype = static_cast<DType>(rng() % 3);
  }
  if (rng() % 3 == 0) p.ldx = p.k + pick(rng, {8, 24, 3});
  if (rng() % 4 == 0 && !tiled) {
    if (p.quantized) p.weights.ld = quant_words_per_row(p.quant, p.k) + 4 * pick(rng, {1, 2});
    else p.weights.ld = (p.weights.storage == WeightStorage::out_in ? p.k : p.u) + pick(rng, {8, 5});
  }
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  if (!p.quantized && rng() % 4 == 0) {
    p.batch = pick(rng, {2, 3});
    if (rng() % 2) p.batch_stride_w = 0;  // shared weights
    if (p.has_bias && rng() % 2) p.batch_stride_bias = 0;
  }
  while (p.batch * p.m * p.u * p.k > 3'000'000 && p.u > (tiled ? 16 : 1)) {
    p.u = tiled ? std::max<int64_t>(16, p.u / 32 * 16) : std::max<int64_t>(1, p.u / 2);
    if (p.ldy) p.ldy = p.u + 3;
    if (p.weights.ld && p.weights.storage == WeightStorage::in_out) p.weights.ld = p.u + 5;
  }
  return p;
}

struct DownStats {
  int cases = 0, by_path[6] = {0, 0, 0, 0, 0, 0};
  double worst_rel = 0;
};

void run_down_case(const Problem& p, std::mt19937_64& rng, DownStats* st) {
  SCOPED_TRACE(to_string(p));
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  const bool fp8 = r.quantized && r.quant.mode == QuantMode::fp8_e4m3;
  const bool no_biases = r.quantized && r.quant.mode != QuantMode::affine;
  const int64_t x_n = (r.batch - 1) * r.batch_stride_x + one_batch_extent(r.m, r.ldx, r.k);

  // Weights: quantized (and their dequantization to X's type), or 16-bit.
  QuantWeights qw;
  Tensor w16;
  int64_t w16_n = 0;
  if (r.quantized) {
    make_weights(r, r.u, rng, &qw);
    if (::testing::Test::HasFatalFailure()) return;
  } else {
    const int64_t one = r.weights.storage == WeightStorage::out_in ? one_batch_extent(r.u, r.weights.ld, r.k)
                                                                   : one_batch_extent(r.k, r.weights.ld, r.u);
    w16_n = (r.batch - 1) * r.batch_stride_w + one;
    fill(w16.host, r.input_dtype, w16_n, rng, -2.f / std::sqrt(float(r.k)), 2.f / std::sqrt(float(r.k)));
  }
  Tensor x, xu, b;
  fill(x.host, r.input_dtype, x_n, rng, -2.f, 2.f);
  if (r.glu_input) fill(xu.host, r.input_dtype, x_n, rng, -2.f, 2.f);
  const int64_t b_n = r.has_bias ? (r.batch - 1) * r.batch_stride_bias + r.u : 0;
  if (r.has_bias) fill(b.host, r.bias_dtype, b_n, rng, -0.5f, 0.5f);
  for (Tensor* t : {&x, &xu, &b, &w16}) t->upload();

  const int64_t y_n = (r.batch - 1) * r.batch_stride_y + one_batch_extent(r.m, r.ldy, r.u);
  const std::vector<unsigned char> y_poison = nan_filled(r.output_dtype, y_n);
  Tensor y;
  y.host = y_poison;
  y.upload();

  Arguments a;
  a.x = x.dev.p;
  a.x_up = r.glu_input ? xu.dev.p : nullptr;
  a.w = r.quantized ? qw.words.dev.p : w16.dev.p;
  a.w_scales = r.quantized ? qw.scales.dev.p : nullptr;
  a.w_biases = r.quantized && !no_biases ? qw.biases.dev.p : nullptr;
  a.bias = r.has_bias ? b.dev.p : nullptr;
  a.y = y.dev.p;

  Config cfg;
  Status s = plan(p, &cfg);
  ASSERT_TRUE(s.ok()) << s.message();
  SCOPED_TRACE(to_string(cfg));
  // The path each case must take.
  const bool tiled_ok = !r.quant.tiled || (r.m <= quant_decode::kTiledMaxM && r.scale_dtype == r.input_dtype);
  const bool quant_ok = r.quantized && r.m <= 64 && r.k % 16 == 0 && r.weights.ld % 4 == 0 &&
                        (r.glu_input || r.ldx % 8 == 0) && tiled_ok;
  const bool decode_ok = !quant_ok && r.m <= 16 && r.k % 8 == 0 && r.weights.storage == WeightStorage::out_in &&
                         (r.glu_input || r.ldx % 8 == 0) && (r.quantized || r.weights.ld % 8 == 0) &&
                         (r.batch == 1 || r.quantized || (r.batch_stride_w % 8 == 0 && (r.glu_input || r.batch_stride_x % 8 == 0)));
  const KernelPath want = quant_ok ? KernelPath::quant_decode : decode_ok ? KernelPath::decode : KernelPath::cublas;
  EXPECT_EQ(cfg.path, want) << cfg.reason;
  if (r.glu_input) {
    EXPECT_NE(cfg.reason.find("GLU of its input"), std::string::npos) << cfg.reason;
  }

  const bool needs_ws = r.glu_input || (r.quantized && cfg.path != KernelPath::quant_decode) ||
                        (cfg.path == KernelPath::cublas &&
                         (r.has_bias || (r.output_dtype != DType::fp32 && r.output_dtype != r.input_dtype)));
  if (needs_ws) expect_refused_without_workspace(p, a, y, y_poison);
  if (::testing::Test::HasFatalFailure()) return;
  run_with_workspace(p, a, "down: " + to_string(p));
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<unsigned char> out = y.download();

  // The exact function.
  Arguments h;
  h.x = x.host.data();
  h.x_up = r.glu_input ? xu.host.data() : nullptr;
  h.w = r.quantized ? static_cast<const void*>(qw.words.host.data()) : w16.host.data();
  h.w_scales = r.quantized ? qw.scales.host.data() : nullptr;
  h.w_biases = r.quantized && !no_biases ? qw.biases.host.data() : nullptr;
  h.bias = r.has_bias ? b.host.data() : nullptr;
  std::vector<double> y_exact;
  ref::cpu_reference(p, h, &y_exact, nullptr);
  Err e;
  ASSERT_TRUE(compare("y", out, y_poison, r.output_dtype, r.batch, r.m, r.ldy, r.u, r.batch_stride_y, y_exact, &e));
  EXPECT_LE(e.rel_floor1(), r.output_dtype == DType::fp32 ? 1e-2 : 2e-2) << "relative error " << e.rel();

  // What the kernels multiply: the GLU rounded to X's type, dense; the
  // weights rounded to X's type, dense out_in (FP8 on its decode kernel:
  // the exact e4m3 values).
  Problem pr = r;
  std::vector<unsigned char> hr;
  if (r.glu_input) {
    pr.glu_input = false;
    pr.ldx = r.k;
    pr.batch_stride_x = r.m * r.k;
    hr.assign(size_t(r.batch * r.m * r.k) * dtype_size(r.input_dtype), 0);
    for (int64_t l = 0; l < r.batch; ++l)
      for (int64_t mm = 0; mm < r.m; ++mm)
        for (int64_t kk = 0; kk < r.k; ++kk) {
          const int64_t off = l * r.batch_stride_x + mm * r.ldx + kk;
          const double v = detail::glu<double>(static_cast<int>(r.activation),
                                               ref::load_as_double(x.host.data(), r.input_dtype, off),
                                               ref::load_as_double(xu.host.data(), r.input_dtype, off),
                                               double(r.act_params.clamp_alpha), double(r.act_params.clamp_limit));
          ref::store_from_double(hr.data(), r.input_dtype, (l * r.m + mm) * r.k + kk, v);
        }
  }
  Arguments hk = h;
  if (r.glu_input) {
    hk.x = hr.data();
    hk.x_up = nullptr;
  }
  // Repacked int4 too: its scales multiply the fp32 sums (quant_decode/repacked.cuh).
  const bool exact_weights = (fp8 || r.quant.repacked) && cfg.path == KernelPath::quant_decode;
  if (r.quantized && !exact_weights) {
    pr.quantized = false;
    pr.weights.ld = r.k;
    pr.batch_stride_w = r.u * r.k;
    hk.w = qw.dequantized.data();
    hk.w_scales = hk.w_biases = nullptr;
  }
  std::vector<double> y_k;
  ref::cpu_reference(pr, hk, &y_k, nullptr);
  const double ulp = r.output_dtype == DType::fp32 ? 1e-5 : r.output_dtype == DType::bf16 ? 0x1p-7 : 0x1p-9;
  double max_ref = 1.0;
  for (double v : y_k) max_ref = std::max(max_ref, std::fabs(v));
  // The GLU's rounding: the kernels' activation (fp32, the tanh form) and
  // the reference's exact one round an element of H to X's type
  // differently where it sits within ~2^-16 of a rounding edge, one
  // element in 2^8 (bf16) or 2^5 (fp16), by one ulp each: about
  // sqrt(K p) ulps of |h| |w|, with room.
  double glu_slack = 0;
  if (r.glu_input) {
    double hmax = 0;
    for (size_t i = 0; i < hr.size() / dtype_size(r.input_dtype); ++i)
      hmax = std::max(hmax, std::fabs(ref::load_as_double(hr.data(), r.input_dtype, int64_t(i))));
    const double wmax = 6.0 / std::sqrt(double(r.k));
    glu_slack = (0x1p-8 + 4 * std::sqrt(double(r.k)) * 0x1p-12) * hmax * wmax;
  }
  for (int64_t l = 0; l < r.batch; ++l)
    for (int64_t mm = 0; mm < r.m; ++mm)
      for (int64_t j = 0; j < r.u; ++j) {
        const double got = ref::load_as_double(out.data(), r.output_dtype, l * r.batch_stride_y + mm * r.ldy + j);
        const double want = y_k[size_t((l * r.m + mm) * r.u + j)];
        ASSERT_LE(std::fabs(got - want), ulp * std::fabs(want) + 2e-5 * max_ref + glu_slack)
            << "y[" << l << "][" << mm << "][" << j << "] = " << got << ", float64 on what the kernel multiplies "
            << want;
      }
  st->worst_rel = std::max(st->worst_rel, e.rel_floor1());
  st->by_path[static_cast<int>(cfg.path)]++;
  st->cases++;
}

}  // namespace

TEST(GpuDown, RandomEveryPathFormatAndOption) {
  SKIP_WITHOUT_GPU();
  const int n = cases(1000);
  std::mt19937_64 rng(fresh_seed());
  DownStats st;
  int glu = 0, quant = 0, tiled = 0, batched = 0;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_down_problem(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    run_down_case(p, rng, &st);
    if (HasFailure()) return;
    glu += p.glu_input;
    quant += p.quantized;
    tiled += p.quantized && p.quant.tiled;
    batched += p.batch > 1;
  }
  std::printf(
      "[ cases ] %d passed (decode %d, quant_decode %d, cublas %d; %d with the GLU fused into the input, %d quantized, "
      "%d of them tiled, %d batched); worst RMS error relative to float64 %.2e\n",
      st.cases, st.by_path[int(KernelPath::decode)], st.by_path[int(KernelPath::quant_decode)],
      st.by_path[int(KernelPath::cublas)], glu, quant, tiled, batched, st.worst_rel);
}

// Every format x activation (GLU input) x M at one odd shape, and the 16-bit
// weights on every path.
TEST(GpuDown, EveryFormatActivationAndPath) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  DownStats st;
  const QuantFormat formats[] = {{QuantMode::affine, 4, 64},  {QuantMode::affine, 4, 32}, {QuantMode::affine, 8, 128},
                                 {QuantMode::mxfp4, 4, 32},   {QuantMode::fp8_e4m3, 8, 128, 128},
                                 {QuantMode::fp8_e4m3, 8, 0, 1},
                                 {QuantMode::affine, 4, 64, 1, false, true}};  // tiled
  int i = 0;
  for (int f = -1; f < int(std::size(formats)); ++f)
    for (int act = -1; act < 5; ++act)
      for (int64_t m : {1, 9, 16, 40, 70}) {
        Problem p;
        p.op = Operation::down;
        if (f >= 0) {
          p.quantized = true;
          p.quant = formats[f];
          p.scale_dtype = i % 3 == 0 ? DType::fp32 : (i % 2 ? DType::fp16 : DType::bf16);
        }
        p.input_dtype = i % 2 ? DType::fp16 : DType::bf16;
        if (p.quant.tiled) p.scale_dtype = p.input_dtype;  // the tiled kernels' scales
        p.m = m;
        p.k = 1152;
        p.u = p.quant.tiled ? 144 : 131;  // tiles of 16 rows
        p.glu_input = act >= 0;
        if (act >= 0) p.activation = static_cast<Activation>(act);
        p.output_dtype = static_cast<DType>(i % 3);
        p.has_bias = i % 2;
        run_down_case(p, rng, &st);
        if (HasFailure()) return;
        ++i;
      }
  std::printf("[ cases ] %d passed (decode %d, quant_decode %d, cublas %d)\n", st.cases,
              st.by_path[int(KernelPath::decode)], st.by_path[int(KernelPath::quant_decode)],
              st.by_path[int(KernelPath::cublas)]);
}

// The quantized down projection's split of K over CTAs (partial sums in the
// workspace, summed by a second pass), asked for by its knob: a long K in
// every format, and random quantized cases.
TEST(GpuDown, SplitOfK) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  DownStats st;
  Problem p;
  p.op = Operation::down;
  p.quantized = true;
  p.m = 5;
  p.k = 16384;
  p.u = 40;
  p.has_bias = true;
  p.alpha = 0.5f;
  setenv("GATEDMLP_QDECODE_DOWN_SPLIT", "4", 1);
  for (const QuantFormat& f : {QuantFormat{QuantMode::affine, 4, 64}, QuantFormat{QuantMode::affine, 8, 32},
                               QuantFormat{QuantMode::mxfp4, 4, 32}, QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128}}) {
    p.quant = f;
    p.scale_dtype = f.mode == QuantMode::fp8_e4m3 ? DType::fp32 : DType::bf16;
    p.glu_input = f.bits == 8;
    Config cfg;
    ASSERT_TRUE(plan(p, &cfg).ok());
    EXPECT_GT(workspace_size(p), size_t(2 * p.m * p.u * 4)) << "the partials of a split: " << to_string(p);
    run_down_case(p, rng, &st);
    if (HasFailure()) break;
  }
  setenv("GATEDMLP_QDECODE_DOWN_SPLIT", "3", 1);
  int split = 0;
  for (int i = 0; i < cases(200) && !HasFailure(); ++i) {
    Problem q = random_down_problem(rng);
    if (!q.quantized || q.m > 64) continue;
    SCOPED_TRACE("case " + std::to_string(i));
    run_down_case(q, rng, &st);
    if (HasFailure()) break;
    ++split;
  }
  unsetenv("GATEDMLP_QDECODE_DOWN_SPLIT");
  std::printf("[ cases ] %d passed (%d with the split forced to 3)\n", st.cases, split);
}

// The tiled down projection with 4 warps per CTA: the plan's rule where
// 8-warp CTAs would end in a wave less than half full (300 CTAs of 16 rows
// at M = 16, 2 per SM: 36 in the second wave on 132 SMs), and any tiled
// case with the warps set by GATEDMLP_QDECODE_DOWN (4 and 2: each warp
// takes more k-blocks).
TEST(GpuDown, TiledWarps) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  DownStats st;
  Problem p;
  p.op = Operation::down;
  p.quantized = true;
  p.quant = QuantFormat{QuantMode::affine, 4, 64, 1, false, true};
  p.m = 16;
  p.k = 960;  // 7.5 k-blocks of 128: every warp takes two, one crosses K
  p.u = 16 * 300;
  p.has_bias = true;
  Config cfg;
  ASSERT_TRUE(plan(p, &cfg).ok());
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int slots8 = 2 * sms, last = 300 % slots8;  // down_warps' rule at 2 and 5 CTAs per SM
  EXPECT_EQ(cfg.threads, 300 > slots8 && 300 <= 5 * sms && last > 0 && 2 * last < slots8 ? 128 : 0) << cfg.reason;
  run_down_case(p, rng, &st);
  int forced = 0;
  for (const char* w : {"4,1", "2,1"}) {
    test::ScopedEnv env("GATEDMLP_QDECODE_DOWN", w);
    for (int i = 0, n = 0; n < cases(40) && i < 100000 && !HasFailure(); ++i) {
      Problem q = random_down_problem(rng);
      if (!q.quantized || !q.quant.tiled) continue;
      SCOPED_TRACE("case " + std::to_string(i) + ", GATEDMLP_QDECODE_DOWN=" + w);
      run_down_case(q, rng, &st);
      ++forced, ++n;
    }
  }
  std::printf("[ cases ] %d passed (%d tiled with the warps set)\n", st.cases, forced);
}

// Deeper register pipelines for the tiled down projection
// (GATEDMLP_QDECODE_AHEAD = 2, 3; the plan's Config::ahead).
TEST(GpuDown, TiledAhead) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  DownStats st;
  int deeper = 0;
  for (const char* v : {"2", "3"}) {
    ScopedEnv env("GATEDMLP_QDECODE_AHEAD", v);
    for (int i = 0, n = 0; n < cases(60) && i < 100000 && !HasFailure(); ++i) {
      const Problem q = random_down_problem(rng);
      if (!q.quantized || !q.quant.tiled) continue;
      SCOPED_TRACE("case " + std::to_string(i) + ", GATEDMLP_QDECODE_AHEAD=" + v);
      Config c;
      ASSERT_TRUE(plan(q, &c).ok());
      if (c.path == KernelPath::quant_decode) {
        // One column group: every depth, but where K has a tail of the
        // k-blocks of 128 and X is not staged (one row, padded K <= 40 KB):
        // these dense cases take one there (gathered ones two:
        // GpuGather.TiledAhead).
        const bool staged = q.m == 1 && (q.k + 127) / 128 * 128 * int64_t(dtype_size(q.input_dtype)) <= 40960;
        EXPECT_EQ(c.ahead, q.k % 128 == 0 || staged ? std::atoi(v) : 1) << to_string(c);
        deeper += c.ahead > 1;
      }
      run_down_case(q, rng, &st);
      ++n;
    }
  }
  std::printf("[ cases ] %d passed (%d on the tiled kernel deeper than one k-block)\n", st.cases, deeper);
  EXPECT_GT(deeper, 0);
}
