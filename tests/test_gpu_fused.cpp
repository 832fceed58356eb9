// The fused kernel against the float64 CPU reference, on fresh random inputs
// for every case: every layout, activation, dtype and option, odd shapes,
// padded strides and batches. Outputs are poisoned with NaN first; every
// element must be written, padding must stay untouched, and the fused error
// must be at most 2x the unfused (cuBLASLt + GLU kernel) error plus a tiny atol.
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <sstream>

#include "gpu_util.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

struct Err {
  double max_abs = 0, sq_diff = 0, sq_ref = 0, max_ref = 0;
  double rel() const { return sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff); }
};

int64_t one_batch_extent(int64_t rows, int64_t ld, int64_t cols) { return (rows - 1) * ld + cols; }

struct CaseStats {
  int cases = 0;
  double worst_ratio = 0;  // fused rel error / unfused rel error
};

// Compares an output tensor (device layout: [L][rows, ld], `cols` valid
// columns) with a dense reference [L][rows][cols]. Every valid element must be
// finite; every other byte of the buffer must still hold the poison.
::testing::AssertionResult compare(const char* name, const std::vector<unsigned char>& out,
                                   const std::vector<unsigned char>& poison, DType dt, int64_t L, int64_t rows,
                                   int64_t ld, int64_t cols, int64_t bstride, const std::vector<double>& ref, Err* e) {
  const size_t es = dtype_size(dt);
  std::vector<char> valid(out.size() / es, 0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = l * bstride + r * ld + c;
        valid[size_t(i)] = 1;
        const double v = ref::load_as_double(out.data(), dt, i);
        const double want = ref[size_t((l * rows + r) * cols + c)];
        if (!std::isfinite(v))
          return ::testing::AssertionFailure() << name << "[" << l << "][" << r << "][" << c << "] = " << v
                                               << " (not written, or NaN); reference " << want;
        const double d = std::fabs(v - want);
        e->max_abs = std::max(e->max_abs, d);
        e->sq_diff += d * d;
        e->sq_ref += want * want;
        e->max_ref = std::max(e->max_ref, std::fabs(want));
      }
  for (size_t i = 0; i < valid.size(); ++i)
    if (!valid[i] && std::memcmp(&out[i * es], &poison[i * es], es) != 0)
      return ::testing::AssertionFailure() << name << ": element " << i << " outside the output (padding) was written";
  return ::testing::AssertionSuccess();
}

// One random case, end to end. Returns the fused/unfused error ratio.
void run_case(const Problem& p, std::mt19937_64& rng, CaseStats* stats) {
  SCOPED_TRACE(to_string(p));
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t L = r.batch, rows_w = sep ? r.u : 2 * r.u;
  const bool io = r.weights.storage == WeightStorage::in_out;
  auto extent = [&](int64_t stride, int64_t one) { return (L - 1) * stride + one; };

  Tensor x, w, wu, b, bu;
  const float wscale = 2.0f / std::sqrt(float(r.k));  // keeps g and u near 1: the activations' interesting range
  fill(x.host, r.input_dtype, extent(r.batch_stride_x, one_batch_extent(r.m, r.ldx, r.k)), rng, -2.f, 2.f);
  const int64_t w_one = io ? one_batch_extent(r.k, r.weights.ld, rows_w) : one_batch_extent(rows_w, r.weights.ld, r.k);
  fill(w.host, r.input_dtype, extent(r.batch_stride_w, w_one), rng, -wscale, wscale);
  if (sep) fill(wu.host, r.input_dtype, extent(r.batch_stride_w, w_one), rng, -wscale, wscale);
  if (r.has_bias) {
    fill(b.host, r.bias_dtype, extent(r.batch_stride_bias, rows_w), rng, -0.5f, 0.5f);
    if (sep) fill(bu.host, r.bias_dtype, extent(r.batch_stride_bias, rows_w), rng, -0.5f, 0.5f);
  }
  for (Tensor* t : {&x, &w, &wu, &b, &bu}) t->upload();

  const int64_t y_n = extent(r.batch_stride_y, one_batch_extent(r.m, r.ldy, r.u));
  const int64_t pre_n = r.has_preact ? extent(r.batch_stride_preact, one_batch_extent(r.m, r.ldpre, 2 * r.u)) : 0;
  std::vector<unsigned char> y_poison(size_t(y_n) * dtype_size(r.output_dtype)), pre_poison(size_t(pre_n) * dtype_size(r.preact_dtype));
  for (int64_t i = 0; i < y_n; ++i) ref::store_from_double(y_poison.data(), r.output_dtype, i, NAN);
  for (int64_t i = 0; i < pre_n; ++i) ref::store_from_double(pre_poison.data(), r.preact_dtype, i, NAN);

  auto args_with = [&](Tensor& y, Tensor& pre) {
    Arguments a;
    a.x = x.dev.p;
    a.w = w.dev.p;
    a.w_up = sep ? wu.dev.p : nullptr;
    a.bias = r.has_bias ? b.dev.p : nullptr;
    a.bias_up = r.has_bias && sep ? bu.dev.p : nullptr;
    a.y = y.dev.p;
    a.preact = r.has_preact ? pre.dev.p : nullptr;
    return a;
  };

  // Fused.
  Tensor yf, pf, yu, pu;
  yf.host = y_poison;
  pf.host = pre_poison;
  yu.host = y_poison;
  pu.host = pre_poison;
  for (Tensor* t : {&yf, &pf, &yu, &pu}) t->upload();
  const Status s = run(p, args_with(yf, pf), nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  // Unfused: the error yardstick.
  std::unique_ptr<ref::Unfused> unfused;
  const Status su = ref::Unfused::create(p, &unfused);
  ASSERT_TRUE(su.ok()) << su.message();
  const Status sr = unfused->run(args_with(yu, pu), nullptr);
  ASSERT_TRUE(sr.ok()) << sr.message();
  CUDA_OK(cudaDeviceSynchronize());

  // Reference on the host copies.
  Arguments h;
  h.x = x.host.data();
  h.w = w.host.data();
  h.w_up = sep ? wu.host.data() : nullptr;
  h.bias = r.has_bias ? b.host.data() : nullptr;
  h.bias_up = r.has_bias && sep ? bu.host.data() : nullptr;
  std::vector<double> y_ref, pre_ref;
  ref::cpu_reference(p, h, &y_ref, &pre_ref);

  Err ef, eu;
  ASSERT_TRUE(compare("y (fused)", yf.download(), y_poison, r.output_dtype, L, r.m, r.ldy, r.u, r.batch_stride_y, y_ref, &ef));
  ASSERT_TRUE(compare("y (unfused)", yu.download(), y_poison, r.output_dtype, L, r.m, r.ldy, r.u, r.batch_stride_y, y_ref, &eu));
  const double atol = 1e-6 * std::max(1.0, ef.max_ref);
  EXPECT_LE(ef.max_abs, 2 * eu.max_abs + atol) << "max abs error: fused " << ef.max_abs << " unfused " << eu.max_abs;
  EXPECT_LE(ef.rel(), 2 * eu.rel() + 1e-6) << "relative error: fused " << ef.rel() << " unfused " << eu.rel();
  // Independent of the yardstick: a bf16/fp16 output cannot be off by more than a few ulps.
  EXPECT_LE(ef.rel(), r.output_dtype == DType::fp32 ? 1e-4 : 1e-2) << "fused relative error " << ef.rel();

  if (r.has_preact) {
    Err pef, peu;
    ASSERT_TRUE(compare("preact (fused)", pf.download(), pre_poison, r.preact_dtype, L, r.m, r.ldpre, 2 * r.u,
                        r.batch_stride_preact, pre_ref, &pef));
    ASSERT_TRUE(compare("preact (unfused)", pu.download(), pre_poison, r.preact_dtype, L, r.m, r.ldpre, 2 * r.u,
                        r.batch_stride_preact, pre_ref, &peu));
    EXPECT_LE(pef.max_abs, 2 * peu.max_abs + 1e-6 * std::max(1.0, pef.max_ref))
        << "preact max abs error: fused " << pef.max_abs << " unfused " << peu.max_abs;
  }
  stats->cases++;
  if (eu.rel() > 0) stats->worst_ratio = std::max(stats->worst_ratio, ef.rel() / eu.rel());
}

// ---------------------------------------------------------------- generators

uint64_t fresh_seed() {
  const uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(s));
  return s;
}

int64_t pick(std::mt19937_64& rng, std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); }

// A random size: often an edge around the tile sizes (16, 64, 128), otherwise anything.
int64_t random_size(std::mt19937_64& rng, int64_t max) {
  if (rng() % 2) return pick(rng, {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 200});
  return 1 + int64_t(rng() % uint64_t(max));
}

Problem random_problem(std::mt19937_64& rng, DType in) {
  Problem p;
  p.input_dtype = in;
  p.m = random_size(rng, 300);
  // Half the cases keep K a multiple of 8 so the 16-byte loader runs too.
  p.k = rng() % 2 ? 8 * (1 + int64_t(rng() % 40)) : random_size(rng, 300);
  p.u = random_size(rng, 260);
  p.activation = static_cast<Activation>(rng() % 5);
  if (p.activation == Activation::swiglu_clamped && rng() % 2) {
    p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;  // small limits: the clamp really bites
    p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
  }
  const int fmt = int(rng() % 6);
  if (fmt == 0) {
    p.weights.format = WeightFormat::separate;
  } else {
    const int64_t g = fmt == 1 ? 1 : fmt == 2 ? 8 : fmt == 3 ? 32 : fmt == 4 ? 0 : pick(rng, {2, 3, 5, 16});
    if (g > 1) p.u = g * ((p.u + g - 1) / g);
    p.weights.group = g;
    p.weights.first = rng() % 2 ? Half::up : Half::gate;
  }
  if (rng() % 5 == 0) p.weights.storage = WeightStorage::in_out;
  if (rng() % 5 == 0) p.weights.ld = (p.weights.storage == WeightStorage::out_in ? p.k : (fmt == 0 ? p.u : 2 * p.u)) + pick(rng, {1, 8, 13});
  p.output_dtype = static_cast<DType>(rng() % 3);
  if (rng() % 2) {
    p.has_bias = true;
    p.bias_dtype = static_cast<DType>(rng() % 3);
  }
  if (rng() % 3 == 0) {
    p.has_preact = true;
    p.preact_dtype = static_cast<DType>(rng() % 3);
    if (rng() % 2) p.ldpre = 2 * p.u + pick(rng, {1, 4, 9});
  }
  p.alpha = float(pick(rng, {1, 1, 2, -3})) * 0.5f;
  if (rng() % 3 == 0) p.ldx = p.k + pick(rng, {1, 8, 24});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 2, 7});
  if (rng() % 4 == 0) {
    p.batch = pick(rng, {2, 3});
    p.m = std::min<int64_t>(p.m, 100);
    if (rng() % 2) p.batch_stride_w = 0;  // one set of weights for all batches
    if (rng() % 2) p.batch_stride_x = (p.m) * (p.ldx ? p.ldx : p.k) + pick(rng, {8, 16, 40});
    if (rng() % 2) p.batch_stride_y = (p.m) * (p.ldy ? p.ldy : p.u) + pick(rng, {2, 6});
    if (p.has_bias && rng() % 2) p.batch_stride_bias = 0;
  }
  return p;
}

// GATEDMLP_TEST_CASES overrides the number of random cases (the sanitizer
// runs use a handful).
int cases(int n) {
  const char* v = std::getenv("GATEDMLP_TEST_CASES");
  return v ? std::atoi(v) : n;
}

void run_random(DType in, int n) {
  SKIP_WITHOUT_GPU();
  n = cases(n);
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_problem(rng, in);
    run_case(p, rng, &st);
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst fused/unfused relative-error ratio %.3f\n", st.cases, st.worst_ratio);
}

}  // namespace

TEST(GpuFused, RandomBf16) { run_random(DType::bf16, 220); }
TEST(GpuFused, RandomFp16) { run_random(DType::fp16, 160); }

// Every layout x activation x storage on one odd shape, so none is left to chance.
TEST(GpuFused, EveryLayoutAndActivation) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int fmt = 0; fmt < 6; ++fmt)
    for (int act = 0; act < 5; ++act)
      for (int io = 0; io < 2; ++io) {
        Problem p;
        p.m = 77;
        p.k = io ? 72 : 136;
        p.u = 96;
        p.activation = static_cast<Activation>(act);
        if (fmt == 0) p.weights.format = WeightFormat::separate;
        else {
          p.weights.group = fmt == 1 ? 1 : fmt == 2 ? 8 : fmt == 3 ? 32 : fmt == 4 ? 0 : 48;
          p.weights.first = act % 2 ? Half::up : Half::gate;
        }
        p.weights.storage = io ? WeightStorage::in_out : WeightStorage::out_in;
        p.has_bias = (act + fmt) % 2;
        p.has_preact = (act + io) % 2;
        run_case(p, rng, &st);
        if (HasFailure()) return;
      }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Tiny and tile-edge shapes in every combination.
TEST(GpuFused, EdgeShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int64_t m : {1, 5, 64, 65, 129})
    for (int64_t k : {1, 7, 8, 33, 64})
      for (int64_t u : {1, 3, 64, 65}) {
        Problem p;
        p.m = m;
        p.k = k;
        p.u = u;
        p.activation = static_cast<Activation>(rng() % 5);
        run_case(p, rng, &st);
        if (HasFailure()) return;
      }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Larger shapes on the 16-byte path: many K tiles, several CTAs in M and N.
TEST(GpuFused, LargerVectorShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < 12; ++i) {
    Problem p;
    p.m = pick(rng, {257, 300, 513});
    p.k = pick(rng, {1024, 1032, 2056});
    p.u = pick(rng, {192, 320, 264});
    p.weights.group = pick(rng, {0, 1, 8});
    if (p.u % (p.weights.group ? p.weights.group : 1)) p.weights.group = 0;
    p.weights.first = rng() % 2 ? Half::up : Half::gate;
    p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
    p.activation = static_cast<Activation>(rng() % 5);
    p.has_bias = rng() % 2;
    run_case(p, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Shapes big enough for the dispatcher to pick the 128-row tile (two CTAs
// per SM), with K tails, the element loader, [K, out] storage and batches, so
// that tile sees every path too.
TEST(GpuFused, LargeTileShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < 6; ++i) {
    Problem p;
    p.m = 1536 + 7 * i;
    p.u = 1408 + 96 * i;  // 22+ column tiles of 64, the last one partial; divisible by every group below
    p.k = pick(rng, {72, 136, 100, 264});
    p.weights.group = i % 3 == 0 ? 0 : (i % 3 == 1 ? 1 : 32);
    p.weights.first = i % 2 ? Half::up : Half::gate;
    if (i == 4) p.weights.storage = WeightStorage::in_out;
    if (i == 5) {
      p.weights.format = WeightFormat::separate;
      p.weights.group = 0;
      p.weights.first = Half::gate;
      p.batch = 2;
      p.m = 1000;
    }
    p.input_dtype = i % 2 ? DType::fp16 : DType::bf16;
    p.activation = static_cast<Activation>(i % 5);
    p.has_bias = i % 2 == 0;
    p.has_preact = i == 2;
    Config c;
    const Status s = plan(p, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(c.tile_m, 128) << to_string(c);
    run_case(p, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}
