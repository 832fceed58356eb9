// Weight-layout index math and the host converter.
#include <gtest/gtest.h>

#include <random>

#include "gatedmlp/layout.hpp"

using namespace gatedmlp;

TEST(Layout, KnownPositions) {
  const int64_t U = 64;
  for (int64_t j = 0; j < U; ++j) {
    // even/odd, gate first (QuACK, matmul_ogs) and up first (the blog)
    EXPECT_EQ(fused_row(j, Half::gate, U, 1, Half::gate), 2 * j);
    EXPECT_EQ(fused_row(j, Half::up, U, 1, Half::gate), 2 * j + 1);
    EXPECT_EQ(fused_row(j, Half::up, U, 1, Half::up), 2 * j);
    EXPECT_EQ(fused_row(j, Half::gate, U, 1, Half::up), 2 * j + 1);
    // stacked [gate; up] (vLLM, HF gate_up_proj), group 0 = u
    EXPECT_EQ(fused_row(j, Half::gate, U, 0, Half::gate), j);
    EXPECT_EQ(fused_row(j, Half::up, U, 0, Half::gate), U + j);
    // blocks of 32, up first (cuDNN)
    EXPECT_EQ(fused_row(j, Half::up, U, 32, Half::up), (j / 32) * 64 + j % 32);
    EXPECT_EQ(fused_row(j, Half::gate, U, 32, Half::up), (j / 32) * 64 + 32 + j % 32);
  }
}

TEST(Layout, InverseIsABijection) {
  for (int64_t U : {1, 6, 48, 96})
    for (int64_t G : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), U})
      for (Half first : {Half::gate, Half::up}) {
        if (G != 0 && U % G != 0) continue;
        std::vector<int> seen(2 * U, 0);
        for (int64_t f = 0; f < 2 * U; ++f) {
          Half h;
          int64_t j;
          fused_row_inverse(f, U, G, first, &h, &j);
          ASSERT_GE(j, 0);
          ASSERT_LT(j, U);
          ASSERT_EQ(fused_row(j, h, U, G, first), f) << "U=" << U << " G=" << G;
          seen[size_t(static_cast<int>(h) * U + j)]++;
        }
        for (int c : seen) ASSERT_EQ(c, 1);
      }
}

namespace {

WeightLayout random_layout(std::mt19937_64& rng, int64_t u, int64_t k) {
  WeightLayout l;
  l.format = rng() % 3 == 0 ? WeightFormat::separate : WeightFormat::fused;
  l.storage = rng() % 2 ? WeightStorage::in_out : WeightStorage::out_in;
  if (l.format == WeightFormat::fused) {
    std::vector<int64_t> divisors;
    for (int64_t g = 1; g <= u; ++g)
      if (u % g == 0) divisors.push_back(g);
    l.group = rng() % 4 == 0 ? 0 : divisors[rng() % divisors.size()];
    l.first = rng() % 2 ? Half::up : Half::gate;
  }
  const int64_t rows = l.format == WeightFormat::fused ? 2 * u : u;
  l.ld = rng() % 2 ? 0 : (l.storage == WeightStorage::out_in ? k : rows) + int64_t(rng() % 5);
  return l;
}

size_t span(const WeightLayout& l, int64_t u, int64_t k) {
  const int64_t rows = l.format == WeightFormat::fused ? 2 * u : u;
  const bool io = l.storage == WeightStorage::in_out;
  const int64_t ld = l.ld ? l.ld : (io ? rows : k);
  return size_t(io ? (k - 1) * ld + rows : (rows - 1) * ld + k);
}

// Logical element (half, j, kk) of a buffer pair in layout l.
uint16_t at(const WeightLayout& l, const std::vector<uint16_t>& w, const std::vector<uint16_t>& wu, int64_t u, int64_t k,
            Half h, int64_t j, int64_t kk) {
  const bool sep = l.format == WeightFormat::separate;
  const int64_t row = sep ? j : fused_row(j, h, u, l.group, l.first);
  const int64_t rows = sep ? u : 2 * u;
  const bool io = l.storage == WeightStorage::in_out;
  const int64_t ld = l.ld ? l.ld : (io ? rows : k);
  const int64_t off = io ? kk * ld + row : row * ld + kk;
  return (sep && h == Half::up ? wu : w)[size_t(off)];
}

}  // namespace

TEST(Layout, ConvertPreservesEveryLogicalElement) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t u = 1 + rng() % 12, k = 1 + rng() % 9;
    const WeightLayout a = random_layout(rng, u, k), b = random_layout(rng, u, k);
    std::vector<uint16_t> aw(span(a, u, k)), awu(a.format == WeightFormat::separate ? span(a, u, k) : 0);
    for (auto& v : aw) v = uint16_t(rng());
    for (auto& v : awu) v = uint16_t(rng());
    std::vector<uint16_t> bw(span(b, u, k), 0xFFFF), bwu(b.format == WeightFormat::separate ? span(b, u, k) : 0, 0xFFFF);
    const Status s = convert_weights(u, k, DType::bf16, a, aw.data(), awu.empty() ? nullptr : awu.data(), b, bw.data(),
                                     bwu.empty() ? nullptr : bwu.data());
    ASSERT_TRUE(s.ok()) << s.message() << " seed " << seed;
    for (Half h : {Half::gate, Half::up})
      for (int64_t j = 0; j < u; ++j)
        for (int64_t kk = 0; kk < k; ++kk)
          ASSERT_EQ(at(a, aw, awu, u, k, h, j, kk), at(b, bw, bwu, u, k, h, j, kk))
              << to_string(a) << " -> " << to_string(b) << " seed " << seed;
  }
}

TEST(Layout, ConvertErrors) {
  std::vector<uint16_t> src(2 * 6 * 4), dst(2 * 6 * 4);
  WeightLayout stacked, g4;
  g4.group = 4;  // does not divide 6
  Status s = convert_weights(6, 4, DType::bf16, stacked, src.data(), nullptr, g4, dst.data(), nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("to.group=4"), std::string::npos) << s.message();
  s = convert_weights(6, 4, DType::bf16, stacked, nullptr, nullptr, stacked, dst.data(), nullptr);
  EXPECT_NE(s.message().find("'from_w' is null"), std::string::npos) << s.message();
  WeightLayout sep;
  sep.format = WeightFormat::separate;
  s = convert_weights(6, 4, DType::bf16, stacked, src.data(), nullptr, sep, dst.data(), nullptr);
  EXPECT_NE(s.message().find("'to_w_up' is null"), std::string::npos) << s.message();
  s = convert_weights(6, 4, DType::bf16, stacked, src.data(), nullptr, stacked, src.data() + 3, nullptr);
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.message();
  s = convert_weights(0, 4, DType::bf16, stacked, src.data(), nullptr, stacked, dst.data(), nullptr);
  EXPECT_NE(s.message().find("u must be >= 1"), std::string::npos) << s.message();
}
