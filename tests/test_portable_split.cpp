// The portable kernel's split tail plan (src/sm80_gemm_glu/split.hpp), on the
// host: it splits the 8B M = 4096 tail it was built for and leaves alone the
// shapes where it would not pay; wherever it splits, the pieces cover every
// k-tile once, none is empty, the tail is predicted faster, and the launch
// and workspace sizes add up.
#include <gtest/gtest.h>

#include <random>

#include "sm80_gemm_glu/split.hpp"

using namespace gatedmlp::sm80;

namespace {

// Every k-tile in exactly one piece, pieces in order and non-empty.
::testing::AssertionResult pieces_cover(int64_t k_tiles, int pieces) {
  if (piece_begin(k_tiles, pieces, 0) != 0 || piece_begin(k_tiles, pieces, pieces) != k_tiles)
    return ::testing::AssertionFailure() << k_tiles << " k-tiles in " << pieces << ": ends "
                                         << piece_begin(k_tiles, pieces, 0) << ", "
                                         << piece_begin(k_tiles, pieces, pieces);
  for (int q = 0; q < pieces; ++q)
    if (piece_begin(k_tiles, pieces, q + 1) <= piece_begin(k_tiles, pieces, q))
      return ::testing::AssertionFailure() << k_tiles << " k-tiles in " << pieces << ": piece " << q << " is empty";
  return ::testing::AssertionSuccess();
}

}  // namespace

// Llama-3 8B (K = 4096: 64 k-tiles; U = 14336: 224 column tiles of 64) with
// 128-row tiles on 132 SMs x 2 resident CTAs.
TEST(PortableSplit, EightBShapes) {
  const int64_t slots = 264, k_tiles = 64, n_tiles = 224;
  // M = 4096: 7168 tiles = 27 waves + 40 tiles; those 40 fill the last wave as 6 x 40 = 240 pieces.
  SplitPlan s = plan_split(32 * n_tiles, slots, k_tiles);
  EXPECT_EQ(s.tiles, 40);
  EXPECT_EQ(s.pieces, 6);
  EXPECT_EQ(split_blocks(32 * n_tiles, s), 7128 + 240);
  // M = 1024 (6.79 waves), 16384 (108.6) and 65536 (434.4): the best split
  // saves too little (a fifth of a tile of 7, or under 1 % of the call).
  for (int64_t m_tiles : {8, 128, 512}) {
    s = plan_split(m_tiles * n_tiles, slots, k_tiles);
    EXPECT_EQ(s.pieces, 0) << "M = " << m_tiles * 128;
    EXPECT_EQ(s.tiles, 0) << "M = " << m_tiles * 128;
  }
  // Less than one wave, an exact number of waves, a single k-tile: never.
  EXPECT_EQ(plan_split(200, slots, k_tiles).pieces, 0);
  EXPECT_EQ(plan_split(2 * slots, slots, k_tiles).pieces, 0);
  EXPECT_EQ(plan_split(slots + 10, slots, 1).pieces, 0);
}

TEST(PortableSplit, PlansAreConsistent) {
  std::mt19937_64 rng(20261124);
  int split = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t slots = 1 + int64_t(rng() % 600);
    const int64_t tiles = 1 + int64_t(rng() % (slots * (1 + rng() % 40)));
    const int64_t k_tiles = 1 + int64_t(rng() % 300);
    const SplitPlan s = plan_split(tiles, slots, k_tiles);
    SCOPED_TRACE(::testing::Message() << "tiles " << tiles << " slots " << slots << " k_tiles " << k_tiles);
    if (s.pieces == 0) {
      ASSERT_EQ(s.tiles, 0);
      ASSERT_EQ(split_workspace_bytes(s, 128, 64), 0u);
      continue;
    }
    ++split;
    ASSERT_GE(tiles, slots);
    ASSERT_EQ(s.tiles, tiles % slots);  // exactly the last, partial wave
    ASSERT_GE(s.pieces, 2);
    ASSERT_LE(s.pieces, std::min<int64_t>(kMaxSplitPieces, k_tiles));
    ASSERT_TRUE(pieces_cover(k_tiles, s.pieces));
    ASSERT_LE(split_tail_cost(s.tiles, slots, k_tiles, s.pieces), 0.8 * split_tail_cost(s.tiles, slots, k_tiles, 1));
    ASSERT_EQ(split_blocks(tiles, s), tiles - s.tiles + s.tiles * s.pieces);
    ASSERT_EQ(split_workspace_bytes(s, 128, 64),
              split_ticket_bytes(s) + size_t(s.tiles * s.pieces) * 128 * 128 * sizeof(float));
    ASSERT_GE(split_ticket_bytes(s), size_t(s.tiles) * 8);
    ASSERT_EQ(split_ticket_bytes(s) % 256, 0u);  // the partials stay 16-byte aligned
  }
  EXPECT_GT(split, 100) << "the sweep should reach the split";
}

TEST(PortableSplit, ForcedSplitClamps) {
  // Never more pieces than k-tiles or kMaxSplitPieces; one piece is no split.
  EXPECT_EQ(forced_split(50, 3, 0, 8).pieces, 3);
  EXPECT_EQ(forced_split(50, 3, 0, 8).tiles, 50);
  EXPECT_EQ(forced_split(50, 100, 0, 40).pieces, kMaxSplitPieces);
  EXPECT_EQ(forced_split(50, 1, 0, 8).pieces, 0);
  EXPECT_EQ(forced_split(50, 1, 0, 8).tiles, 0);
  EXPECT_EQ(forced_split(50, 9, 0, 1).pieces, 0);
  // The last R tiles, at most all of them.
  EXPECT_EQ(forced_split(50, 9, 7, 4).tiles, 7);
  EXPECT_EQ(forced_split(50, 9, 70, 4).tiles, 50);
  for (int64_t k = 2; k < 40; ++k)
    for (int s = 2; s <= 16 && s <= k; ++s) EXPECT_TRUE(pieces_cover(k, s));
}
