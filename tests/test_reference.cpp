// The float64 CPU reference against an independent naive loop, plus the
// host-side half-precision conversions and activation values it relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "common/activation_math.hpp"
#include "reference/reference.hpp"

using namespace gatedmlp;
using namespace gatedmlp::ref;

namespace {

std::mt19937_64 fresh_rng() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

// Written separately from the library's activation code on purpose.
double naive_act(Activation a, double g, double u) {
  switch (a) {
    case Activation::silu: return g / (1.0 + std::exp(-g)) * u;
    case Activation::gelu_tanh: return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * std::pow(g, 3)))) * u;
    case Activation::gelu_erf: return 0.5 * g * std::erfc(-g / std::sqrt(2.0)) * u;
    case Activation::relu: return std::max(g, 0.0) * u;
    case Activation::swiglu_clamped: {
      const double a_ = 1.702, lim = 7.0;
      const double gc = std::min(g, lim), uc = std::clamp(u, -lim, lim);
      return gc / (1.0 + std::exp(-a_ * gc)) * (uc + 1.0);
    }
  }
  return NAN;
}

}  // namespace

TEST(HostHalf, Bf16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3F80);         // tie: to even
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3F82);         // tie: to even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(HostHalf, Fp16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16(f), h) << std::hex << h << " " << f;
  }
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(65504.f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(float_to_fp16(1e-7f), 0x0002);  // subnormal: 1e-7 / 2^-24 = 1.68 -> 2
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(Reference, ActivationValues) {
  // Hand-checked values at g = 1, u = 1.
  auto one = [](Activation a) {
    Problem p;
    p.m = p.k = p.u = 1;
    p.activation = a;
    const uint16_t x = float_to_bf16(1.0f), w[2] = {float_to_bf16(1.0f), float_to_bf16(1.0f)};
    Arguments h;
    h.x = &x;
    h.w = w;
    std::vector<double> y;
    cpu_reference(p, h, &y, nullptr);
    return y[0];
  };
  EXPECT_NEAR(one(Activation::silu), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(one(Activation::gelu_tanh), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(one(Activation::gelu_erf), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(one(Activation::relu), 1.0, 1e-15);
  EXPECT_NEAR(one(Activation::swiglu_clamped), 2.0 / (1.0 + std::exp(-1.702)), 1e-6);
}

TEST(Reference, ClampIsApplied) {
  // g = 10 is clamped to 7, u = -9 to -7.
  Problem p;
  p.m = p.k = p.u = 1;
  p.activation = Activation::swiglu_clamped;
  const uint16_t x = float_to_bf16(1.0f), w[2] = {float_to_bf16(10.f), float_to_bf16(-9.f)};
  Arguments h;
  h.x = &x;
  h.w = w;
  std::vector<double> y;
  cpu_reference(p, h, &y, nullptr);
  EXPECT_NEAR(y[0], 7.0 / (1.0 + std::exp(-1.702 * 7.0)) * -6.0, 1e-5);
}

// The portable kernel's grouped form (N sigmoids share one reciprocal)
// against the naive formula, over both tails, and with NaN and infinities in
// one element of a group: the others must not notice.
template <int N>
void check_grouped_activation(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> wide(-120.f, 120.f), narrow(-8.f, 8.f);
  for (Activation a : {Activation::silu, Activation::swiglu_clamped}) {
    SCOPED_TRACE(std::string(to_string(a)) + ", N = " + std::to_string(N));
    const int act = static_cast<int>(a);
    for (int i = 0; i < 20000; ++i) {
      float g[N], u[N], y[N];
      for (int e = 0; e < N; ++e) {
        g[e] = (i + e) % 3 ? narrow(rng) : wide(rng);
        u[e] = narrow(rng);
      }
      detail::glu_n<N>(act, g, u, 1.702f, 7.0f, y);
      for (int e = 0; e < N; ++e) {
        const double ref = naive_act(a, g[e], u[e]);
        // A few float roundings, plus exp's condition number |x| times the
        // float rounding of its argument x (alpha g: 1.702 in float and the
        // product), which is no fault of the grouping.
        const double x = a == Activation::swiglu_clamped ? 1.702 * std::min(double(g[e]), 7.0) : g[e];
        const double tol = (4e-6 + 2.5e-7 * std::fabs(x)) * std::fabs(ref) + 1e-37;
        ASSERT_LE(std::fabs(y[e] - ref), tol) << "g " << g[e] << " u " << u[e] << ": " << y[e] << " vs " << ref;
      }
    }
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      float g[N], u[N], y[N];
      for (int e = 0; e < N; ++e) g[e] = 0.5f + e, u[e] = 2.f;
      g[N / 2] = bad;
      detail::glu_n<N>(act, g, u, 1.702f, 7.0f, y);
      for (int e = 0; e < N; ++e) {
        if (e == N / 2) {
          if (std::isnan(bad)) {
            EXPECT_TRUE(std::isnan(y[e])) << "a NaN gate gave " << y[e];
          }
          continue;
        }
        EXPECT_NEAR(y[e], naive_act(a, g[e], u[e]), 1e-5 * std::fabs(naive_act(a, g[e], u[e])))
            << "element " << e << " beside a gate of " << bad;
      }
    }
  }
}

TEST(Reference, GroupedActivationMatchesNaive) {
  auto rng = fresh_rng();
  check_grouped_activation<1>(rng);
  check_grouped_activation<2>(rng);
  check_grouped_activation<8>(rng);
  // The other activations go through the scalar form, element by element.
  std::uniform_real_distribution<float> d(-8.f, 8.f);
  for (Activation a : {Activation::gelu_tanh, Activation::gelu_erf, Activation::relu}) {
    float g[8], u[8], y[8];
    for (int e = 0; e < 8; ++e) g[e] = d(rng), u[e] = d(rng);
    detail::glu_n<8>(static_cast<int>(a), g, u, 1.702f, 7.0f, y);
    for (int e = 0; e < 8; ++e)
      EXPECT_EQ(y[e], detail::glu<float>(static_cast<int>(a), g[e], u[e], 1.702f, 7.0f)) << to_string(a);
  }
}

// Every layout, activation and option against a naive loop over logical weights.
TEST(Reference, MatchesNaiveLoop) {
  auto rng = fresh_rng();
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  for (int trial = 0; trial < 60; ++trial) {
    Problem p;
    p.m = 1 + rng() % 9;
    p.k = 1 + rng() % 17;
    const int64_t groups[] = {1, 2, 3, 4, 6};
    const int64_t g = groups[rng() % 5];
    p.u = g * (1 + rng() % 4);
    p.batch = 1 + rng() % 3;
    p.activation = static_cast<Activation>(rng() % 5);
    p.weights.format = rng() % 3 == 0 ? WeightFormat::separate : WeightFormat::fused;
    p.weights.storage = rng() % 2 ? WeightStorage::in_out : WeightStorage::out_in;
    if (p.weights.format == WeightFormat::fused) {
      p.weights.group = rng() % 4 == 0 ? 0 : g;
      p.weights.first = rng() % 2 ? Half::up : Half::gate;
    }
    p.input_dtype = rng() % 2 ? DType::fp16 : DType::bf16;
    p.has_bias = rng() % 2;
    p.has_preact = true;
    p.alpha = rng() % 2 ? 1.0f : 0.75f;
    p.ldx = p.k + rng() % 3;
    ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
    const Problem r = p.resolved();
    const bool sep = r.weights.format == WeightFormat::separate;
    const int64_t G = sep ? r.u : r.weights.group;

    // Logical values, rounded to the input dtype.
    auto q = [&](float v) { return double(p.input_dtype == DType::bf16 ? bf16_to_float(float_to_bf16(v)) : fp16_to_float(float_to_fp16(v))); };
    const int64_t L = r.batch, M = r.m, K = r.k, U = r.u;
    std::vector<double> X(L * M * K), Wg(L * U * K), Wu(L * U * K), Bg(L * U), Bu(L * U);
    for (auto& v : X) v = q(val(rng));
    for (auto& v : Wg) v = q(val(rng));
    for (auto& v : Wu) v = q(val(rng));
    for (auto& v : Bg) v = double(val(rng));
    for (auto& v : Bu) v = double(val(rng));

    // Physical buffers in the problem's layout.
    const int64_t rows = sep ? U : 2 * U;
    std::vector<uint16_t> x(r.batch_stride_x * L), w(r.batch_stride_w * L), wu(sep ? r.batch_stride_w * L : 0);
    std::vector<float> b(r.batch_stride_bias * L), bu(sep ? r.batch_stride_bias * L : 0);
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) store_from_double(x.data(), p.input_dtype, l * r.batch_stride_x + m * r.ldx + k, X[(l * M + m) * K + k]);
      for (int64_t f = 0; f < rows; ++f) {
        // Inverse mapping, written out: row f is in block f/G; even blocks hold `first`.
        int half = 0;
        int64_t j = f;
        if (!sep) {
          const int64_t block = f / G;
          half = (block % 2 == 0) == (r.weights.first == Half::gate) ? 0 : 1;
          j = (block / 2) * G + f % G;
        }
        for (int pass = 0; pass < (sep ? 2 : 1); ++pass) {
          const int hh = sep ? pass : half;
          std::vector<uint16_t>& dst = (sep && pass == 1) ? wu : w;
          const std::vector<double>& src = hh == 0 ? Wg : Wu;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t off = l * r.batch_stride_w + (r.weights.storage == WeightStorage::out_in ? f * r.weights.ld + k : k * r.weights.ld + f);
            store_from_double(dst.data(), p.input_dtype, off, src[(l * U + j) * K + k]);
          }
          if (sep) {
            (pass == 0 ? b : bu)[l * r.batch_stride_bias + f] = float((pass == 0 ? Bg : Bu)[l * U + f]);
          } else {
            b[l * r.batch_stride_bias + f] = float((hh == 0 ? Bg : Bu)[l * U + j]);
          }
        }
      }
    }
    Arguments h;
    h.x = x.data();
    h.w = w.data();
    if (sep) h.w_up = wu.data();
    if (p.has_bias) {
      h.bias = b.data();
      if (sep) h.bias_up = bu.data();
    }
    std::vector<double> y, pre;
    cpu_reference(p, h, &y, &pre);

    for (int64_t l = 0; l < L; ++l)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < U; ++j) {
          double gg = 0, uu = 0;
          for (int64_t k = 0; k < K; ++k) {
            gg += X[(l * M + m) * K + k] * Wg[(l * U + j) * K + k];
            uu += X[(l * M + m) * K + k] * Wu[(l * U + j) * K + k];
          }
          gg = gg * double(p.alpha) + (p.has_bias ? double(float(Bg[l * U + j])) : 0.0);
          uu = uu * double(p.alpha) + (p.has_bias ? double(float(Bu[l * U + j])) : 0.0);
          const double want = naive_act(p.activation, gg, uu);
          ASSERT_NEAR(y[(l * M + m) * U + j], want, 1e-6 * (1 + std::fabs(want)))
              << to_string(p) << " l=" << l << " m=" << m << " j=" << j;
          // The pre-activation holds g and u at the documented columns.
          int64_t cg = j, cu = U + j;
          if (!sep) {
            const int64_t block = j / G;
            const bool gate_first = r.weights.first == Half::gate;
            cg = (2 * block + (gate_first ? 0 : 1)) * G + j % G;
            cu = (2 * block + (gate_first ? 1 : 0)) * G + j % G;
          }
          ASSERT_NEAR(pre[(l * M + m) * 2 * U + cg], gg, 1e-9) << to_string(p);
          ASSERT_NEAR(pre[(l * M + m) * 2 * U + cu], uu, 1e-9) << to_string(p);
        }
  }
}

TEST(Reference, RowSubsetMatchesFullRun) {
  auto rng = fresh_rng();
  Problem p;
  p.m = 13;
  p.k = 11;
  p.u = 6;
  std::vector<uint16_t> x(p.m * p.k), w(2 * p.u * p.k);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  for (auto& v : x) v = float_to_bf16(val(rng));
  for (auto& v : w) v = float_to_bf16(val(rng));
  Arguments h;
  h.x = x.data();
  h.w = w.data();
  std::vector<double> full, part;
  cpu_reference(p, h, &full, nullptr);
  const std::vector<int64_t> rows = {12, 0, 5};
  cpu_reference(p, h, &part, nullptr, &rows);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t j = 0; j < p.u; ++j) EXPECT_EQ(part[i * p.u + j], full[rows[i] * p.u + j]);
}
