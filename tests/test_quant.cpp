// The quantized formats' host side (gatedmlp/quant.hpp): format rules, the
// affine quantizer on hand-computed groups and its round trip on random ones.
// Bit-for-bit agreement with MLX itself is tested from Python against the
// mlx package (tests/python/test_quant.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/host_float16.hpp"
#include "gatedmlp/quant.hpp"
#include "reference/reference.hpp"
#include "scoped_env.hpp"
#include "simulated_devices.hpp"

namespace gatedmlp {
namespace {

QuantFormat fmt(int bits, int group) { return QuantFormat{QuantMode::affine, bits, group}; }

TEST(Quant, FormatRulesNameTheValues) {
  EXPECT_TRUE(check_quant_format(fmt(4, 64), 128).ok());
  EXPECT_TRUE(check_quant_format(fmt(8, 32), 32).ok());
  Status s = check_quant_format(fmt(3, 64), 128);
  EXPECT_EQ(s.code(), StatusCode::not_supported);
  EXPECT_NE(s.message().find("bits=3"), std::string::npos) << s.message();
  s = check_quant_format(fmt(4, 48), 96);
  EXPECT_EQ(s.code(), StatusCode::not_supported);
  EXPECT_NE(s.message().find("group_size=48"), std::string::npos) << s.message();
  s = check_quant_format(fmt(4, 64), 100);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("k=100"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("group_size=64"), std::string::npos) << s.message();
  EXPECT_FALSE(check_quant_format(fmt(4, 64), 0).ok());
  EXPECT_EQ(quant_words_per_row(fmt(4, 64), 256), 32);
  EXPECT_EQ(quant_words_per_row(fmt(8, 64), 256), 64);
  EXPECT_EQ(quant_groups_per_row(fmt(4, 32), 256), 8);
}

TEST(Quant, HandComputedGroups) {
  // Row 0: 0, 1, ..., 31. The max has the larger magnitude, so the scale is
  // negative and q = 0 is the max: scale = 31 / -15, bias = 31, q_j = 31 - j
  // scaled, i.e. q = round((31 - j) * 15 / 31).
  // Row 1: constant 0.5 (scale at its 1e-7 floor; the bias takes the value).
  // Row 2: zeros (the edge rounds to q0 = 0: bias 0).
  // Row 3: -8 ... 7 repeated: the min has the larger magnitude, scale > 0.
  const int64_t k = 32;
  std::vector<float> w(4 * k);
  for (int j = 0; j < k; ++j) {
    w[j] = float(j);
    w[k + j] = 0.5f;
    w[2 * k + j] = 0.0f;
    w[3 * k + j] = float(j % 16) - 8.0f;
  }
  std::vector<uint32_t> wq(4 * 4);
  std::vector<float> scales(4), biases(4);
  ASSERT_TRUE(quantize_host(fmt(4, 32), DType::fp32, 4, k, w.data(), wq.data(), scales.data(), biases.data()).ok());

  EXPECT_FLOAT_EQ(scales[0], 31.0f / -15.0f);
  EXPECT_EQ(biases[0], 31.0f);
  auto q_of = [&](int row, int j) { return (wq[size_t(row * 4 + j / 8)] >> (4 * (j % 8))) & 15u; };
  for (int j = 0; j < k; ++j)
    EXPECT_EQ(q_of(0, j), uint32_t(std::nearbyint((31.0f - float(j)) / (31.0f / 15.0f)))) << "j=" << j;
  EXPECT_EQ(q_of(0, 31), 0u);
  EXPECT_EQ(q_of(0, 0), 15u);

  EXPECT_EQ(biases[1], 0.5f);
  EXPECT_LT(scales[1], 0.0f);
  EXPECT_NEAR(scales[1], -1e-7f, 1e-12f);
  for (int j = 0; j < k; ++j) EXPECT_EQ(q_of(1, j), 0u);

  EXPECT_EQ(biases[2], 0.0f);
  EXPECT_FLOAT_EQ(scales[2], -1e-7f);
  for (int j = 0; j < k; ++j) EXPECT_EQ(q_of(2, j), 0u);

  EXPECT_GT(scales[3], 0.0f);
  EXPECT_EQ(biases[3], -8.0f);
  EXPECT_FLOAT_EQ(scales[3], 1.0f);
  for (int j = 0; j < k; ++j) EXPECT_EQ(q_of(3, j), uint32_t(j % 16)) << "j=" << j;

  // Dequantized: the edges exact, the constant and zero groups exact, row 3
  // exact (its values are on the grid).
  std::vector<float> back(4 * k, NAN);
  ASSERT_TRUE(dequantize_host(fmt(4, 32), DType::fp32, DType::fp32, 4, k, wq.data(), scales.data(), biases.data(),
                              back.data())
                  .ok());
  EXPECT_EQ(back[31], 31.0f);
  EXPECT_NEAR(back[0], 0.0f, 1e-5f);
  for (int j = 0; j < k; ++j) {
    EXPECT_EQ(back[size_t(k + j)], 0.5f);
    EXPECT_EQ(back[size_t(2 * k + j)], 0.0f);
    EXPECT_EQ(back[size_t(3 * k + j)], w[size_t(3 * k + j)]);
  }
}

TEST(Quant, RoundTripToTheNearestGridPoint) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dt : {DType::fp32, DType::fp16, DType::bf16}) {
        const int64_t rows = 7, k = 3 * group;
        std::vector<uint16_t> w16(size_t(rows * k));
        std::vector<float> w32(size_t(rows * k));
        for (size_t i = 0; i < w32.size(); ++i) {
          float v = n(rng) * 3.0f + (i % 5 == 0 ? 2.0f : 0.0f);
          if (dt == DType::bf16) w16[i] = ref::float_to_bf16(v), v = ref::bf16_to_float(w16[i]);
          if (dt == DType::fp16) w16[i] = ref::float_to_fp16(v), v = ref::fp16_to_float(w16[i]);
          w32[i] = v;
        }
        const void* w = dt == DType::fp32 ? static_cast<const void*>(w32.data()) : w16.data();
        const QuantFormat f = fmt(bits, group);
        const int64_t words = quant_words_per_row(f, k), groups = quant_groups_per_row(f, k);
        std::vector<uint32_t> wq(size_t(rows * words), 0xdeadbeefu);
        std::vector<float> s32(size_t(rows * groups)), b32(size_t(rows * groups));
        std::vector<uint16_t> s16(s32.size()), b16(b32.size());
        void* s = dt == DType::fp32 ? static_cast<void*>(s32.data()) : s16.data();
        void* b = dt == DType::fp32 ? static_cast<void*>(b32.data()) : b16.data();
        ASSERT_TRUE(quantize_host(f, dt, rows, k, w, wq.data(), s, b).ok());
        std::vector<float> back(size_t(rows * k), NAN);
        ASSERT_TRUE(dequantize_host(f, dt, DType::fp32, rows, k, wq.data(), s, b, back.data()).ok());
        // Each value lands on the nearest point of its group's grid, bias +
        // q * scale for q = 0 ... 2^bits - 1, or at the grid's end when it
        // lies beyond it (the grid starts exactly at the edge of larger
        // magnitude, so it can stop short of the other): within half a step
        // of the value clamped to the grid, plus the rounding of the scale and
        // bias to dt.
        const double n_bins = double((1 << bits) - 1);
        const double rel = dt == DType::fp32 ? 1e-6 : dt == DType::fp16 ? 1.0 / 2048 : 1.0 / 256;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g < groups; ++g) {
            const double sc = ref::load_as_double(s, dt, r * groups + g);
            const double bi = ref::load_as_double(b, dt, r * groups + g);
            const double lo = std::min(bi, bi + n_bins * sc), hi = std::max(bi, bi + n_bins * sc);
            for (int64_t j = 0; j < group; ++j) {
              const size_t i = size_t(r * k + g * group + j);
              const double v = w32[i], clamped = std::min(std::max(v, lo), hi);
              const double tol = std::fabs(v - clamped) + 0.5 * std::fabs(sc) +
                                 rel * (n_bins * std::fabs(sc) + std::fabs(bi)) + 1e-6;
              ASSERT_LE(std::fabs(double(back[i]) - v), tol)
                  << to_string(f) << " " << to_string(dt) << " row " << r << " k " << g * group + j;
            }
          }
      }
}

TEST(Quant, EmptyAndBadArguments) {
  EXPECT_TRUE(quantize_host(fmt(4, 64), DType::fp32, 0, 64, nullptr, nullptr, nullptr, nullptr).ok());
  float w[64] = {};
  uint32_t wq[8];
  float s[1], b[1];
  Status st = quantize_host(fmt(4, 64), DType::fp32, 1, 64, w, wq, nullptr, b);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("'scales'"), std::string::npos) << st.message();
  st = quantize_host(fmt(4, 64), DType::fp32, 1, 96, w, wq, s, b);
  EXPECT_NE(st.message().find("k=96"), std::string::npos) << st.message();
  st = dequantize_host(fmt(4, 64), DType::fp32, DType::fp32, -1, 64, wq, s, b, w);
  EXPECT_NE(st.message().find("rows must be >= 0"), std::string::npos) << st.message();
}

TEST(Quant, Mxfp4HandComputed) {
  // Row 0: the e2m1 values themselves (amax 6: scale 2^0), the second 8 negated.
  // Row 1: the same doubled (amax 12: scale 2^1, the same codes).
  // Row 2: zeros (scale byte 127, every code +0).
  // Row 3: the ties 0.25, 0.75, ... go to the smaller magnitude.
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float ties[8] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  std::vector<float> w(4 * 32);
  for (int j = 0; j < 32; ++j) {
    const float sign = (j / 8) % 2 ? -1.0f : 1.0f;
    w[size_t(j)] = sign * values[j % 8];
    w[size_t(32 + j)] = 2.0f * sign * values[j % 8];
    w[size_t(64 + j)] = 0.0f;
    w[size_t(96 + j)] = ties[j % 8];
  }
  const QuantFormat f{QuantMode::mxfp4, 4, 32};
  std::vector<uint32_t> wq(4 * 4);
  std::vector<uint8_t> scales(4);
  ASSERT_TRUE(quantize_host(f, DType::fp32, 4, 32, w.data(), wq.data(), scales.data(), nullptr).ok());
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(scales[1], 128);
  EXPECT_EQ(scales[2], 127);
  EXPECT_EQ(scales[3], 127);
  auto code = [&](int row, int j) { return (wq[size_t(row * 4 + j / 8)] >> (4 * (j % 8))) & 15u; };
  for (int j = 0; j < 32; ++j) {
    const uint32_t want = uint32_t(j % 8) | ((j / 8) % 2 && j % 8 ? 8u : 0u);  // -0 is stored as +0
    EXPECT_EQ(code(0, j), want) << "j=" << j;
    EXPECT_EQ(code(1, j), want) << "j=" << j;
    EXPECT_EQ(code(2, j), 0u) << "j=" << j;
    EXPECT_EQ(code(3, j), j % 8 == 7 ? 7u : uint32_t(j % 8)) << "j=" << j;  // 0.25 -> 0, 0.75 -> 0.5, ...
  }
  std::vector<float> back(4 * 32, NAN);
  ASSERT_TRUE(dequantize_host(f, DType::fp32, DType::fp32, 4, 32, wq.data(), scales.data(), nullptr, back.data()).ok());
  for (int j = 0; j < 64; ++j) EXPECT_EQ(back[size_t(j)], w[size_t(j)]) << "j=" << j;
  EXPECT_EQ(back[96 + 1], 0.5f);
  Status st = quantize_host(f, DType::fp32, 4, 32, w.data(), wq.data(), scales.data(), scales.data());
  EXPECT_NE(st.message().find("mxfp4 has no biases"), std::string::npos) << st.message();
  st = check_quant_format(QuantFormat{QuantMode::mxfp4, 4, 64}, 64);
  EXPECT_EQ(st.code(), StatusCode::not_supported);
}

}  // namespace

// The repacked order as quant.hpp documents it, pinned on hand-computed
// words: element i holds code i % 16.
TEST(Quant, RepackedOrderHandComputed) {
  const QuantFormat plain = fmt(4, 32);
  QuantFormat rep = plain;
  rep.repacked = true;
  const int64_t k = 160;  // a whole chunk and a quarter: the second is padded
  std::vector<uint32_t> words(size_t(k / 8));
  for (int64_t w = 0; w < k / 8; ++w)
    for (int e = 0; e < 8; ++e) words[size_t(w)] |= uint32_t((w * 8 + e) % 16) << (4 * e);
  EXPECT_EQ(quant_words_per_row(rep, k), 32);
  std::vector<uint32_t> out(32, 0xDEADBEEFu);
  ASSERT_TRUE(repack_quantized(plain, rep, 1, k, words.data(), out.data()).ok());
  // Word 0 <- word 0 (codes 0 ... 7), word 1 <- word 4 (elements 32 ... 39:
  // codes 0 ... 7), word 4 <- word 1 (codes 8 ... 15); nibbles e0 e2 e4 e6
  // e1 e3 e5 e7 from the lowest.
  EXPECT_EQ(out[0], 0x75316420u);
  EXPECT_EQ(out[1], 0x75316420u);
  EXPECT_EQ(out[4], 0xFDB9ECA8u);
  // The second chunk: only its first span (elements 128 ... 159, words
  // 16 ... 19 of the checkpoint) exists; they go to words 16, 20, 24, 28.
  for (int t = 0; t < 4; ++t)
    for (int wd = 0; wd < 4; ++wd)
      EXPECT_EQ(out[size_t(16 + 4 * t + wd)], wd == 0 ? (t % 2 ? 0xFDB9ECA8u : 0x75316420u) : 0u)
          << "word " << 16 + 4 * t + wd;
}

// Random words: repacking then unrepacking gives them back, host and
// reference readers agree, and quantize_host / dequantize_host on the
// repacked format are the plain ones through the repack.
TEST(Quant, RepackRoundTrip) {
  std::mt19937_64 rng(0x5eed);
  for (int group : {32, 64, 128})
    for (int64_t k : {128, 256, 384, 1152, 96, 160, 224}) {
      if (k % group) continue;
      SCOPED_TRACE("group " + std::to_string(group) + " k " + std::to_string(k));
      const QuantFormat plain = fmt(4, group);
      QuantFormat rep = plain;
      rep.repacked = true;
      const int64_t rows = 3, wp = quant_words_per_row(plain, k), wr = quant_words_per_row(rep, k);
      EXPECT_EQ(wr, (k + 127) / 128 * 16);
      std::vector<uint32_t> words(size_t(rows * wp)), packed(size_t(rows * wr), 0xA5A5A5A5u), back(words.size());
      for (uint32_t& w : words) w = uint32_t(rng());
      ASSERT_TRUE(repack_quantized(plain, rep, rows, k, words.data(), packed.data()).ok());
      ASSERT_TRUE(repack_quantized(rep, plain, rows, k, packed.data(), back.data()).ok());
      EXPECT_EQ(back, words);
      // Word 4 t + wd of a chunk came from word 4 wd + t (quant.hpp): zero where that is past K.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < wr; ++i)
          if ((i & ~int64_t(15)) + ((i & 3) << 2) + ((i & 15) >> 2) >= wp) {
            EXPECT_EQ(packed[size_t(r * wr + i)], 0u) << "padding word " << i;
          }

      // Quantize random weights both ways; dequantize both.
      std::vector<float> w(size_t(rows * k));
      for (float& v : w) v = float(int64_t(rng() % 2001) - 1000) / 1000.f;
      const int64_t groups = quant_groups_per_row(plain, k);
      std::vector<float> s1(size_t(rows * groups)), b1(s1.size()), s2(s1.size()), b2(s1.size());
      std::vector<uint32_t> q1(size_t(rows * wp)), q2(size_t(rows * wr)), q1r(q2.size());
      ASSERT_TRUE(quantize_host(plain, DType::fp32, rows, k, w.data(), q1.data(), s1.data(), b1.data()).ok());
      ASSERT_TRUE(quantize_host(rep, DType::fp32, rows, k, w.data(), q2.data(), s2.data(), b2.data()).ok());
      ASSERT_TRUE(repack_quantized(plain, rep, rows, k, q1.data(), q1r.data()).ok());
      EXPECT_EQ(q2, q1r);
      EXPECT_EQ(s1, s2);
      EXPECT_EQ(b1, b2);
      std::vector<float> d1(w.size()), d2(w.size());
      ASSERT_TRUE(dequantize_host(plain, DType::fp32, DType::fp32, rows, k, q1.data(), s1.data(), b1.data(), d1.data()).ok());
      ASSERT_TRUE(dequantize_host(rep, DType::fp32, DType::fp32, rows, k, q2.data(), s2.data(), b2.data(), d2.data()).ok());
      EXPECT_EQ(d1, d2);
    }
}

TEST(Quant, RepackRefusesByName) {
  const QuantFormat plain = fmt(4, 64);
  QuantFormat rep = plain;
  rep.repacked = true;
  uint32_t a[64] = {}, b[64] = {};
  Status s = repack_quantized(fmt(8, 64), fmt(8, 64), 1, 128, a, b);
  EXPECT_EQ(s.code(), StatusCode::not_supported);
  EXPECT_NE(s.message().find("affine 4-bit"), std::string::npos) << s.message();
  QuantFormat other = rep;
  other.group_size = 32;
  s = repack_quantized(plain, other, 1, 128, a, b);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("group_size=32"), std::string::npos) << s.message();
  s = repack_quantized(plain, rep, 1, 100, a, b);
  EXPECT_NE(s.message().find("k=100"), std::string::npos) << s.message();
  s = repack_quantized(plain, rep, 2, 128, nullptr, b);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("src"), std::string::npos) << s.message();
  EXPECT_TRUE(repack_quantized(plain, rep, 0, 128, nullptr, nullptr).ok());  // empty
  QuantFormat mx{QuantMode::mxfp4, 4, 32};
  mx.repacked = true;
  s = check_quant_format(mx, 64);
  EXPECT_EQ(s.code(), StatusCode::not_supported);
  EXPECT_NE(s.message().find("repacked"), std::string::npos) << s.message();
  rep.bits = 8;
  EXPECT_FALSE(check_quant_format(rep, 128).ok());
}


// The tiled order (tile_quantized): fresh random words, scales and biases,
// every group and K with and without a padded k-block: tiling then untiling
// gives them back, each word and scale sits where quant.hpp says (by hand,
// not through tiled_math.hpp), dequantize_host reads the tiled arrays as
// the plain ones, and quantize_host(tiled) is the plain quantizer tiled.
TEST(Quant, TiledOrderRoundTrip) {
  std::mt19937_64 rng(std::random_device{}());
  for (int group : {32, 64, 128})
    for (int64_t k : {128, 256, 96, 160, 384, 640}) {
      if (k % group) continue;
      SCOPED_TRACE("group " + std::to_string(group) + " k " + std::to_string(k));
      const QuantFormat plain = fmt(4, group);
      QuantFormat tiled = plain;
      tiled.tiled = true;
      const int64_t rows = 16 * int64_t(1 + rng() % 3), kb = (k + 127) / 128;
      const int64_t wp = k / 8, gp = k / group, wt = quant_words_per_row(tiled, k), gt = quant_groups_per_row(tiled, k);
      EXPECT_EQ(wt, kb * 16);
      EXPECT_EQ(gt, 2 * kb * 128 / group);  // (scale, bias) pairs
      std::vector<uint32_t> words(size_t(rows * wp)), tw(size_t(rows * wt), 0xA5A5A5A5u), back(words.size());
      std::vector<uint16_t> s(size_t(rows * gp)), b(s.size()), ts(size_t(rows * gt), 0xFFFF);
      std::vector<uint16_t> sback(s.size()), bback(s.size());
      for (uint32_t& w : words) w = uint32_t(rng());
      for (size_t i = 0; i < s.size(); ++i) {
        s[i] = detail::float_to_bf16(0.01f + float(rng() % 100) * 1e-3f);
        b[i] = detail::float_to_bf16(-float(rng() % 100) * 1e-2f);
      }
      ASSERT_TRUE(tile_quantized(plain, DType::bf16, rows, k, words.data(), s.data(), b.data(), tw.data(), ts.data()).ok());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t w = 0; w < wp; ++w)
          ASSERT_EQ(tw[size_t((((r / 16) * kb + w / 16) * 16 + r % 16) * 16 + w % 16)], words[size_t(r * wp + w)])
              << "row " << r << " word " << w;
        for (int64_t gi = 0; gi < gp; ++gi) {
          const size_t at = size_t(((((r / 16) * (gt / 2) + gi) * 8 + r % 8) * 2 + (r / 8) % 2) * 2);
          ASSERT_EQ(ts[at], s[size_t(r * gp + gi)]) << "row " << r << " group " << gi;
          ASSERT_EQ(ts[at + 1], b[size_t(r * gp + gi)]) << "row " << r << " group " << gi;
        }
      }
      ASSERT_TRUE(untile_quantized(plain, DType::bf16, rows, k, tw.data(), ts.data(), back.data(), sback.data(),
                                   bback.data()).ok());
      EXPECT_EQ(back, words);
      EXPECT_EQ(sback, s);
      EXPECT_EQ(bback, b);
      std::vector<uint16_t> d1(size_t(rows * k)), d2(d1.size());
      ASSERT_TRUE(dequantize_host(plain, DType::bf16, DType::bf16, rows, k, words.data(), s.data(), b.data(), d1.data()).ok());
      ASSERT_TRUE(dequantize_host(tiled, DType::bf16, DType::bf16, rows, k, tw.data(), ts.data(), nullptr, d2.data()).ok());
      EXPECT_EQ(d1, d2);
      // quantize_host(tiled): the plain quantizer's arrays, tiled.
      std::vector<float> w(size_t(rows * k));
      for (float& v : w) v = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
      std::vector<uint32_t> q1(words.size()), q2(tw.size());
      std::vector<float> s1(s.size()), b1(s.size()), s2(ts.size()), s1t(ts.size());
      std::vector<uint32_t> q1t(tw.size());
      ASSERT_TRUE(quantize_host(plain, DType::fp32, rows, k, w.data(), q1.data(), s1.data(), b1.data()).ok());
      ASSERT_TRUE(quantize_host(tiled, DType::fp32, rows, k, w.data(), q2.data(), s2.data(), nullptr).ok());
      ASSERT_TRUE(tile_quantized(plain, DType::fp32, rows, k, q1.data(), s1.data(), b1.data(), q1t.data(), s1t.data()).ok());
      EXPECT_EQ(q2, q1t);
      EXPECT_EQ(s2, s1t);
      // A biases array beside tiled weights is refused by name.
      const Status st = quantize_host(tiled, DType::fp32, rows, k, w.data(), q2.data(), s2.data(), b1.data());
      EXPECT_NE(st.message().find("(scale, bias) pairs"), std::string::npos) << st.message();
    }
}

TEST(Quant, TiledRefusesByName) {
  QuantFormat tiled = fmt(4, 64);
  tiled.tiled = true;
  uint32_t a[64] = {}, c[64] = {};
  uint16_t s[64] = {}, t[64] = {};
  Status st = tile_quantized(tiled, DType::bf16, 16, 128, a, s, s, c, t);
  EXPECT_NE(st.message().find("tiled=false"), std::string::npos) << st.message();
  st = tile_quantized(fmt(4, 64), DType::bf16, 8, 128, a, s, s, c, t);
  EXPECT_NE(st.message().find("rows=8"), std::string::npos) << st.message();
  st = tile_quantized(fmt(8, 64), DType::bf16, 16, 128, a, s, s, c, t);
  EXPECT_NE(st.message().find("affine 4-bit"), std::string::npos) << st.message();
  st = tile_quantized(fmt(4, 64), DType::bf16, 16, 128, a, nullptr, s, c, t);
  EXPECT_NE(st.message().find("'scales'"), std::string::npos) << st.message();
  EXPECT_TRUE(tile_quantized(fmt(4, 64), DType::bf16, 0, 128, nullptr, nullptr, nullptr, nullptr, nullptr).ok());
  // A gate/up problem on tiled weights must be in the fused group-8 order, dense, not gathered.
  Problem p;
  p.m = 1, p.k = 128, p.u = 16;
  p.quantized = true;
  p.quant = tiled;
  EXPECT_NE(check_support(p).message().find("group 8, gate first"), std::string::npos) << check_support(p).message();
  p.weights.group = 8;
  EXPECT_TRUE(check_support(p).ok()) << check_support(p).message();
  p.weights.ld = 40;
  EXPECT_NE(check_support(p).message().find("weights.ld=40"), std::string::npos) << check_support(p).message();
  // A down projection's rows are tiled as they are: whole tiles of 16 output columns.
  Problem d;
  d.op = Operation::down;
  d.m = 1, d.k = 256, d.u = 24;
  d.quantized = true;
  d.quant = tiled;
  EXPECT_NE(check_support(d).message().find("u=24"), std::string::npos) << check_support(d).message();
  d.u = 32;
  EXPECT_TRUE(check_support(d).ok()) << check_support(d).message();
  Config cfg;
  ASSERT_TRUE(detail::select_config(d.resolved(), nullptr, test::simulated_h200(), &cfg).ok());
  EXPECT_EQ(cfg.path, KernelPath::quant_decode) << cfg.reason;
  d.m = 17;  // past the tiled kernels' rows: dequantized into the workspace
  ASSERT_TRUE(detail::select_config(d.resolved(), nullptr, test::simulated_h200(), &cfg).ok());
  EXPECT_NE(cfg.path, KernelPath::quant_decode) << cfg.reason;
  EXPECT_NE(cfg.reason.find("tiled"), std::string::npos) << cfg.reason;
}

// The tiled down projection's warps per CTA (down_warps): 4 where 8-warp
// CTAs would end in a wave less than half full on 132 SMs and 4-warp ones
// fit in one.
TEST(Quant, TiledDownWarps) {
  struct Case { int64_t m, k, u; int threads; };
  const Case cases[] = {{16, 25600, 5120, 128},  // Qwen3-32B: 320 CTAs, 2 per SM at 8 warps, 5 at 4
                        {16, 14336, 4096, 0},    // 8B: 256 CTAs, one wave of 8 warps
                        {1, 28672, 8192, 128},   // 70B: 512 CTAs, 3 per SM at 8 warps (X not staged), 6 at 4
                        {1, 14336, 4096, 0},     // 8B: X staged, 4 per SM at 8 warps
                        {16, 28672, 8192, 0},    // 70B: 512 CTAs, 2 per SM at 8 warps: two waves, the last 94 % full
                        {1, 4096, 1024, 0}};
  for (const Case& c : cases) {
    Problem d;
    d.op = Operation::down;
    d.m = c.m, d.k = c.k, d.u = c.u;
    d.quantized = true;
    d.quant = fmt(4, 64);
    d.quant.tiled = true;
    Config cfg;
    ASSERT_TRUE(detail::select_config(d.resolved(), nullptr, test::simulated_h200(), &cfg).ok());
    SCOPED_TRACE(to_string(d));
    EXPECT_EQ(cfg.path, KernelPath::quant_decode) << cfg.reason;
    EXPECT_EQ(cfg.threads, c.threads) << cfg.reason;
    EXPECT_EQ(cfg.reason.find("4 warps per CTA") != std::string::npos, c.threads == 128) << cfg.reason;
    d.quant.tiled = false;  // the checkpoint order keeps its own
    ASSERT_TRUE(detail::select_config(d.resolved(), nullptr, test::simulated_h200(), &cfg).ok());
    EXPECT_EQ(cfg.threads, 0) << cfg.reason;
  }
}
// k-blocks requested ahead by the tiled kernels (Config::ahead): two for
// gathered gate/up calls, one for dense ones and down projections (h97);
// the knob clamped to what each kernel takes without spilling
// (tiled_max_depth()); 0 off the tiled order.
TEST(Quant, TiledAhead) {
  auto pick = [](const Problem& p) {
    Config c;
    const Status s = detail::select_config(p.resolved(), nullptr, test::simulated_h200(), &c);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
    return c;
  };
  Problem g;  // Mixtral's experts at one token, top 2: one 8-row tile each
  g.m = 2, g.k = 4096, g.u = 14336;
  g.gather.experts = 8;
  g.gather.rows_per_x = 2;
  g.quantized = true;
  g.quant = fmt(4, 64);
  g.quant.tiled = true;
  g.weights.group = 8;
  Config c = pick(g);
  EXPECT_EQ(c.ahead, 2) << to_string(c);
  EXPECT_NE(c.reason.find("2 k-blocks requested ahead"), std::string::npos) << c.reason;
  EXPECT_NE(to_string(c).find("ahead=2"), std::string::npos) << to_string(c);
  Problem gd = g;  // their down projections: 8-warp CTAs, one ahead
  gd.op = Operation::down;
  gd.k = 14336, gd.u = 4096;
  gd.weights = WeightLayout{};
  EXPECT_EQ(pick(gd).ahead, 1);
  Problem d = g;  // 8B's gate/up and down projection, dense
  d.gather = Gather{};
  d.m = 1;
  EXPECT_EQ(pick(d).ahead, 1);
  Problem dd = gd;
  dd.gather = Gather{};
  dd.m = 16;
  EXPECT_EQ(pick(dd).ahead, 1);
  Problem untiled = g;
  untiled.quant.tiled = false;
  untiled.weights = WeightLayout{};
  EXPECT_EQ(pick(untiled).ahead, 0);
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE_AHEAD", "3");
    EXPECT_EQ(pick(g).ahead, 3);   // 8-row tiles, one column group
    EXPECT_EQ(pick(gd).ahead, 3);
    EXPECT_EQ(pick(dd).ahead, 3);  // the down projection: one column group
    c = pick(d);                   // M = 1: two column groups, at most 2
    EXPECT_EQ(c.tile_n, 16) << to_string(c);
    EXPECT_EQ(c.ahead, 2) << to_string(c);
    EXPECT_NE(c.reason.find("set by GATEDMLP_QDECODE_AHEAD"), std::string::npos) << c.reason;
    d.m = 16;  // four column groups: one
    c = pick(d);
    EXPECT_EQ(c.tile_n, 32) << to_string(c);
    EXPECT_EQ(c.ahead, 1) << to_string(c);
    g.m = 64;  // 16-row tiles: at most 2
    EXPECT_EQ(pick(g).tile_m, 16);
    EXPECT_EQ(pick(g).ahead, 2);
  }
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE_AHEAD", "1");
    EXPECT_EQ(pick(g).ahead, 1);
  }
  // K with a tail of the k-blocks of 128 (gpt-oss's 2880): gathered kernels
  // go two deep there too, dense ones one; but for one staged row of X,
  // zero past K.
  Problem gt = g;
  gt.m = 4, gt.k = 2880, gt.u = 2880;
  c = pick(gt);
  EXPECT_EQ(c.ahead, 2) << to_string(c);
  EXPECT_NE(c.reason.find("2 k-blocks requested ahead"), std::string::npos) << c.reason;
  Problem gtd = gt;  // its down projection keeps one
  gtd.op = Operation::down;
  gtd.weights = WeightLayout{};
  EXPECT_EQ(pick(gtd).ahead, 1);
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE_AHEAD", "3");
    EXPECT_EQ(pick(gt).ahead, 2);
    EXPECT_EQ(pick(gtd).ahead, 2);
    Problem dtd = gtd;  // dense, with the tail: one
    dtd.gather = Gather{};
    dtd.m = 4;
    EXPECT_EQ(pick(dtd).ahead, 1);
    Problem dt = d;  // 8B's gate/up with K = 4032: 31.5 k-blocks
    dt.m = 1, dt.k = 4032;
    EXPECT_EQ(pick(dt).ahead, 2);  // X staged: two column groups' most
    dt.m = 2;
    EXPECT_EQ(pick(dt).ahead, 1);
  }
}
}  // namespace gatedmlp
