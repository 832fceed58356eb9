// The Hopper kernel's work schedule (src/sm90_gemm_glu/schedule.hpp), on the
// host: for many item counts, cluster counts and k-block counts, every k-block
// of every item runs exactly once, the split tail is balanced, and each owner
// adds exactly the partials written for its item, each of which was written
// by a lower cluster as its first tail piece (so no wait can deadlock or
// chain).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sm90_gemm_glu/schedule.hpp"

using namespace gatedmlp::sm90;

namespace {

Params params(int64_t tiles, int k_blocks, int64_t ctas) {
  Params p{};
  p.tiles = tiles;
  p.k_blocks = k_blocks;
  p.m_tiles = 2;
  p.sk_ctas = ctas;
  return p;
}

// Each cluster's schedule and the pieces it ran, in order.
struct ClusterRun {
  Schedule s;
  std::vector<Work> pieces;
};

// Every cluster runs its pieces of the static order (items c, c + C, ...).
::testing::AssertionResult run_static(const Params& p, int64_t clusters, std::vector<ClusterRun>* runs) {
  for (int64_t c = 0; c < clusters; ++c) {
    ClusterRun r{Schedule(p, static_cast<int>(c), static_cast<int>(clusters)), {}};
    const int n = r.s.count();
    for (int w = 0; w < n; ++w) {
      Work wk;
      if (!r.s.at(p, w, &wk)) return ::testing::AssertionFailure() << "cluster " << c << ": no piece " << w;
      r.pieces.push_back(wk);
    }
    Work past;
    if (r.s.at(p, n, &past))
      return ::testing::AssertionFailure() << "cluster " << c << ": a piece past the " << n << " counted";
    runs->push_back(r);
  }
  return ::testing::AssertionSuccess();
}

// Whole items handed out at run time (at_dynamic), as the kernel's ticket
// ring does: each cluster's first item is its own index; then, in a random
// order of clusters coming free, each draws clusters + (a counter's next
// value) until it draws an item past the whole ones, and then runs its tail.
::testing::AssertionResult run_handed_out(const Params& p, int64_t clusters, std::mt19937_64& rng,
                                          std::vector<ClusterRun>* runs) {
  std::vector<int64_t> item(static_cast<size_t>(clusters));
  std::vector<int> busy;  // clusters with pieces left
  for (int64_t c = 0; c < clusters; ++c) {
    runs->push_back(ClusterRun{Schedule(p, static_cast<int>(c), static_cast<int>(clusters)), {}});
    runs->back().s.hand_out();
    item[size_t(c)] = c;
    busy.push_back(static_cast<int>(c));
  }
  int64_t counter = 0;
  while (!busy.empty()) {
    // A cluster comes free and starts its next piece; while that is a whole
    // item drawn (or its first), it draws the item after it.
    const size_t i = rng() % busy.size();
    const int c = busy[i];
    ClusterRun& r = (*runs)[size_t(c)];
    const int w = static_cast<int>(r.pieces.size());
    Work wk;
    if (!r.s.at_dynamic(p, w, item[size_t(c)], &wk)) {
      busy.erase(busy.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    r.pieces.push_back(wk);
    if (w < r.s.whole) item[size_t(c)] = clusters + counter++;
  }
  // One draw per whole item, each drawn once (check_runs checks the latter).
  const int64_t whole_items = p.sk_iters == 0 ? p.tiles : p.sk_first;
  if (counter != whole_items)
    return ::testing::AssertionFailure() << counter << " draws for " << whole_items << " whole items on " << clusters
                                         << " clusters";
  return ::testing::AssertionSuccess();
}

// Checks what the clusters ran; returns a failure message or "".
::testing::AssertionResult check_runs(const Params& p, int64_t clusters, const std::vector<ClusterRun>& runs) {
  const int64_t T = p.tiles, KB = p.k_blocks;
  std::vector<int> runs_of(size_t(T * KB), 0);
  std::map<int64_t, std::set<int64_t>> written;  // item -> clusters that wrote a partial of it
  std::map<int64_t, std::set<int64_t>> added;    // item -> clusters whose partials its owner adds
  std::vector<int64_t> tail_blocks(size_t(clusters), 0);
  for (int64_t c = 0; c < clusters; ++c) {
    const Schedule& s = runs[size_t(c)].s;
    if (s.begin(p, static_cast<int>(c)) != c * p.sk_iters / clusters)
      return ::testing::AssertionFailure() << "cluster " << c << ": share starts at " << s.begin(p, static_cast<int>(c))
                                           << ", not " << c * p.sk_iters / clusters;
    const std::vector<Work>& pieces = runs[size_t(c)].pieces;
    const int n = static_cast<int>(pieces.size()), whole = s.whole;
    int partials = 0;
    for (int w = 0; w < n; ++w) {
      const Work& wk = pieces[size_t(w)];
      if (wk.item < 0 || wk.item >= T || wk.kb0 < 0 || wk.kb0 >= wk.kb1 || wk.kb1 > KB)
        return ::testing::AssertionFailure() << "cluster " << c << " piece " << w << ": item " << wk.item << " k ["
                                             << wk.kb0 << ", " << wk.kb1 << ")";
      for (int kb = wk.kb0; kb < wk.kb1; ++kb) runs_of[size_t(wk.item * KB + kb)]++;
      if (wk.item >= p.sk_first && p.sk_iters > 0) tail_blocks[size_t(c)] += wk.kb1 - wk.kb0;
      const bool ends = wk.kb1 == KB, starts = wk.kb0 == 0;
      if ((wk.role == kWhole) != (starts && ends) || (wk.role == kPartial) != !ends ||
          (wk.role == kOwner) != (ends && !starts))
        return ::testing::AssertionFailure() << "cluster " << c << " item " << wk.item << " k [" << wk.kb0 << ", "
                                             << wk.kb1 << "): wrong role " << wk.role;
      if (wk.role == kPartial) {
        // A cluster has one partial slot, written by its first tail piece.
        if (++partials > 1 || w != whole)
          return ::testing::AssertionFailure() << "cluster " << c << ": partial at piece " << w << " (tail starts at "
                                               << whole << ")";
        written[wk.item].insert(c);
      }
      if (wk.role == kOwner) {
        if (w != n - 1)
          return ::testing::AssertionFailure() << "cluster " << c << ": owner piece " << w << " is not its last";
        for (int j = static_cast<int>(c) - 1, stop = s.first_partial(p, wk.item); j > stop; --j)
          if (s.has_share(p, j)) added[wk.item].insert(j);
        if (added[wk.item].empty())
          return ::testing::AssertionFailure() << "cluster " << c << " owns item " << wk.item << " with no partials";
      }
    }
  }
  for (int64_t i = 0; i < T * KB; ++i)
    if (runs_of[size_t(i)] != 1)
      return ::testing::AssertionFailure() << "item " << i / KB << " k-block " << i % KB << " ran "
                                           << runs_of[size_t(i)] << " times";
  if (written != added) return ::testing::AssertionFailure() << "the partials written differ from those added";
  if (p.sk_iters > 0) {
    const auto [mn, mx] = std::minmax_element(tail_blocks.begin(), tail_blocks.end());
    if (*mx - *mn > 1)
      return ::testing::AssertionFailure() << "tail shares from " << *mn << " to " << *mx << " k-blocks";
  }
  return ::testing::AssertionSuccess();
}

// The static order, then (seed != 0) items handed out in a random order of draws.
::testing::AssertionResult check(const Params& p, int64_t clusters, uint64_t seed = 0) {
  std::vector<ClusterRun> runs;
  if (::testing::AssertionResult r = run_static(p, clusters, &runs); !r) return r;
  if (::testing::AssertionResult r = check_runs(p, clusters, runs); !r) return r << " (static order)";
  if (seed == 0) return ::testing::AssertionSuccess();
  std::mt19937_64 rng(seed);
  runs.clear();
  if (::testing::AssertionResult r = run_handed_out(p, clusters, rng, &runs); !r) return r;
  if (::testing::AssertionResult r = check_runs(p, clusters, runs); !r) return r << " (handed out, seed " << seed << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(Schedule, EveryBlockOnceAndOwnersAddTheirPartials) {
  std::mt19937_64 seeds(std::random_device{}());
  auto seed = [&] { return seeds() | 1; };  // nonzero: items also handed out at run time
  int split = 0, whole = 0;
  for (int waves : {0, 1, 2})
    for (bool force : {false, true})
      for (int64_t clusters : {1, 2, 3, 7, 66, 132})
        for (int kb : {1, 2, 3, 5, 16, 64})
          for (int64_t tiles = 1; tiles <= 300; ++tiles) {
            Params p = params(tiles, kb, 2 * clusters);
            const bool s = plan_split_tail(p, clusters, 2, true, force, waves);
            (s ? split : whole)++;
            const bool worth = (clusters - tiles % clusters) * kb >= kSplitMinIdleKBlocks * clusters;
            EXPECT_EQ(s, kb >= 2 && tiles % clusters != 0 && (force || worth))
                << tiles << " items, " << clusters << " clusters, " << kb << " k-blocks, force " << force;
            ASSERT_TRUE(check(p, clusters, seed())) << tiles << " items on " << clusters << " clusters, " << kb
                                            << " k-blocks, " << (s ? "split" : "whole") << ", split_waves " << waves;
            if (s) {
              const int64_t at_most = waves ? waves : (tiles < 2 * clusters ? 2 : 1);  // 0: automatic
              EXPECT_LT(tiles - p.sk_first, at_most * clusters) << "more than " << at_most << " waves split";
            }
          }
  EXPECT_GT(split, 0);
  EXPECT_GT(whole, 0);
}

TEST(Schedule, SplitNeedsWorkspaceAndIsOptional) {
  // 8B M = 4096: 1792 items on 66 clusters of two, 64 k-blocks.
  Params p = params(1792, 64, 132);
  ASSERT_TRUE(plan_split_tail(p, 66, 2, true));
  EXPECT_EQ(p.sk_first, 27 * 66);  // 27 whole waves, the partial one split
  EXPECT_EQ(p.sk_iters, (1792 - 27 * 66) * 64);
  EXPECT_TRUE(check(p, 66));
  ASSERT_TRUE(plan_split_tail(p, 66, 2, true, false, 2));
  EXPECT_EQ(p.sk_first, 26 * 66);  // the last whole wave too
  EXPECT_TRUE(check(p, 66));
  // Not worth it: 64 items on 66 clusters of 16 k-blocks (M = 512, K = 1024,
  // U = 4096) recover 2/66 of a wave; a single row-block streams weights.
  Params small = params(64, 16, 132);
  EXPECT_FALSE(plan_split_tail(small, 66, 2, true));
  EXPECT_TRUE(plan_split_tail(small, 66, 2, true, true));
  Params one_row_block = params(112, 64, 132);
  one_row_block.m_tiles = 1;
  EXPECT_FALSE(plan_split_tail(one_row_block, 132, 1, true));
  p.sk_ctas = 131;  // too little workspace for 66 clusters of two
  EXPECT_FALSE(plan_split_tail(p, 66, 2, true));
  EXPECT_EQ(p.sk_iters, 0);
  p.sk_ctas = 132;
  EXPECT_FALSE(plan_split_tail(p, 66, 2, false));  // turned off
  EXPECT_TRUE(check(p, 66));
  // 8B M = 256: 112 items on 66 clusters, one whole wave: all of it is shared out.
  Params m256 = params(112, 64, 132);
  ASSERT_TRUE(plan_split_tail(m256, 66, 2, true));
  EXPECT_EQ(m256.sk_first, 0);
  EXPECT_EQ(m256.sk_iters, 112 * 64);
  EXPECT_TRUE(check(m256, 66));
  Params q = params(132, 64, 132);  // whole waves: nothing to split
  EXPECT_FALSE(plan_split_tail(q, 66, 2, true));
}

// Items to tiles (plan_items, tile_coord): over every item of every batch and
// every CTA of a cluster, each tile of the m_tiles x n_tiles grid is computed
// exactly once; the CTAs left over sit past M or past U, never inside the
// grid twice. With the column pairs (clusters of two, odd m_tiles) no CTA is
// given a row-block past M, so at most one CTA per batch is idle (on a
// column-block past U, when n_tiles is odd).
namespace {
template <int CM>
::testing::AssertionResult check_coverage(int m_tiles, int n_tiles, int group_m, int batch, bool pair_cols) {
  Params p{};
  p.m_tiles = m_tiles;
  p.n_tiles = n_tiles;
  p.group_m = group_m;
  plan_items(p, CM, batch, pair_cols);
  std::vector<int> hits(size_t(batch) * m_tiles * n_tiles, 0);
  int64_t idle_rows = 0, idle_cols = 0;
  for (int64_t t = 0; t < p.tiles; ++t)
    for (int rank = 0; rank < CM; ++rank) {
      const TileCoord c = tile_coord<CM>(p, t, rank);
      if (c.l < 0 || c.l >= batch || c.mb < 0 || c.nb < 0)
        return ::testing::AssertionFailure() << "item " << t << " rank " << rank << ": (" << c.l << ", " << c.mb
                                             << ", " << c.nb << ")";
      if (c.mb >= m_tiles) {
        ++idle_rows;
      } else if (c.nb >= n_tiles) {
        ++idle_cols;
      } else if (++hits[(size_t(c.l) * m_tiles + c.mb) * n_tiles + c.nb] != 1) {
        return ::testing::AssertionFailure() << "tile (" << c.l << ", " << c.mb << ", " << c.nb << ") twice";
      }
    }
  for (size_t i = 0; i < hits.size(); ++i)
    if (hits[i] != 1) return ::testing::AssertionFailure() << "tile " << i << " never computed";
  const bool pairs = CM == 2 && pair_cols && m_tiles % 2 == 1;
  const int64_t want_rows = pairs ? 0 : int64_t(batch) * n_tiles * ((m_tiles + CM - 1) / CM * CM - m_tiles);
  const int64_t want_cols = pairs ? int64_t(batch) * (n_tiles % 2) : 0;
  if (idle_rows != want_rows || idle_cols != want_cols)
    return ::testing::AssertionFailure() << idle_rows << " CTAs past M, " << idle_cols << " past U; expected "
                                         << want_rows << " and " << want_cols;
  return ::testing::AssertionSuccess();
}
}  // namespace

TEST(Schedule, EveryTileOnceWithColumnPairs) {
  for (int m_tiles : {1, 2, 3, 4, 5, 7, 9, 33})
    for (int n_tiles : {1, 2, 3, 112, 113})
      for (int group_m : {1, 3, 16})
        for (int batch : {1, 3}) {
          SCOPED_TRACE(::testing::Message() << m_tiles << " x " << n_tiles << " tiles, group " << group_m << ", batch "
                                            << batch);
          EXPECT_TRUE(check_coverage<1>(m_tiles, n_tiles, group_m, batch, true));
          if (m_tiles >= 2) {
            EXPECT_TRUE(check_coverage<2>(m_tiles, n_tiles, group_m, batch, true));
            EXPECT_TRUE(check_coverage<2>(m_tiles, n_tiles, group_m, batch, false));
          }
          if (m_tiles >= 4) {
            EXPECT_TRUE(check_coverage<4>(m_tiles, n_tiles, group_m, batch, true));
          }
        }
  // 8B M = 384 (3 row-blocks, 112 column-blocks) in clusters of two: one row
  // unit of 112 items, then 56 column pairs, where rounding up ran 224.
  Params p{};
  p.m_tiles = 3;
  p.n_tiles = 112;
  plan_items(p, 2, 1, true);
  EXPECT_EQ(p.tiles, 112 + 56);
  plan_items(p, 2, 1, false);
  EXPECT_EQ(p.tiles, 224);
}

// tile_coord's division by multiplication against the hardware's division:
// every divisor the kernel can see is below 2^31, and so is every dividend.
TEST(Schedule, FastDivMatchesDivision) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 16, 112, 113, 1792, 3584, 65535, 65536, 65537, 1u << 30,
                                    (1u << 30) + 1, (1u << 31) - 1};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % ((1u << 31) - 1));
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % 4096);
  for (uint32_t d : divisors) {
    const FastDiv f = make_fastdiv(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, (1u << 31) - 1, (1u << 31) - 2};
    for (int i = 0; i < 2000; ++i) ns.push_back(rng() % (1u << 31));
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;  // (d + 1 etc. past the range)
      ASSERT_EQ(fast_div(f, n), n / d) << n << " / " << d << " (mul " << f.mul << ", shift " << f.shift << ")";
    }
  }
}
