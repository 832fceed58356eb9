// Which work items, and which k-blocks of them, each cluster of the Hopper
// kernel runs: whole items a wave at a time, then an even share of the split
// tail. Host and device code (the CPU tests check that every k-block of every
// item is run exactly once and that each owner adds exactly the partials
// written for its item).
#pragma once

#include <cstdint>

#include "sm90_gemm_glu/params.hpp"

#if defined(__CUDACC__)
#define GATEDMLP_HD __host__ __device__ __forceinline__
#else
#define GATEDMLP_HD inline
#endif

namespace gatedmlp::sm90 {

// Split tail. With C clusters and T items that do not fill whole waves, the
// last wave runs T mod C items and leaves the other clusters idle for a whole
// item's time: 8B M = 4096 is 1792 items on 66 clusters, 27.15 waves run as
// 28. Split, the whole waves run as before and the k-blocks of the items of
// the partial wave (split_waves = 1) or of the last whole wave too
// (split_waves = 2) are shared out evenly over all C clusters. Measured on
// H100 (NOTES.md, h8): 1 is as good or better than 2.
//
// Worth it only when the idle time it recovers, (ceil(T/C) - T/C) items of
// k_blocks each, exceeds what the pieces cost (drains, partials, epilogues:
// a few k-blocks' time): at least min_idle_kblocks. And never with a single
// row-block (M <= 128): such calls stream the weights at the DRAM's rate
// already, and splitting only added partial traffic (-7 % at M = 1 ... 128).
//
// Sets p.sk_first and p.sk_iters; returns whether the tail is split. A split
// needs the workspace (p.sk_ctas partials for the clusters' CTAs) and at
// least two k-blocks per item. force: whenever it is possible (tests).
constexpr int kSplitMinIdleKBlocks = 8;

inline bool plan_split_tail(Params& p, int64_t clusters, int cta_per_cluster, bool enabled, bool force = false,
                            int split_waves = 1) {
  p.sk_first = p.sk_iters = 0;
  if (!enabled || clusters <= 0 || p.sk_ctas < clusters * cta_per_cluster || p.k_blocks < 2 ||
      p.tiles % clusters == 0)
    return false;
  const int64_t idle = clusters - p.tiles % clusters;  // clusters idle in the last wave
  if (!force && (p.m_tiles < 2 || idle * p.k_blocks < int64_t{kSplitMinIdleKBlocks} * clusters)) return false;
  const int64_t waves = p.tiles / clusters;
  const int64_t whole_waves = split_waves == 1 ? waves : (waves > 0 ? waves - 1 : 0);
  p.sk_first = whole_waves * clusters;
  p.sk_iters = (p.tiles - p.sk_first) * p.k_blocks;
  return true;
}

// With the tail split (p.sk_iters > 0), cluster c of C owns tail iterations
// [c S / C, (c+1) S / C) of the S = p.sk_iters k-blocks of items p.sk_first
// onwards (item-major), so every cluster runs the same number of k-blocks. A
// share cut at item boundaries gives pieces. A piece that ends before its
// item's last k-block writes its fp32 sums to the workspace and raises a flag
// (a partial); the piece with the item's last k-block (the owner) adds the
// partials of the lower clusters that share the item, then runs the
// epilogue. A cluster runs its pieces from its last item down to its first:
// its partial first, its owner piece last, so an owner waits only for pieces
// that its peers ran first, and no wait chains through clusters.
struct Work {
  int64_t item;  // work item (tile_coord's t)
  int kb0, kb1;  // k-blocks [kb0, kb1) of the item
  int role;      // kWhole, kPartial or kOwner
};
constexpr int kWhole = 0, kPartial = 1, kOwner = 2;

struct Schedule {
  int64_t c, clusters;  // this cluster, all clusters
  int64_t whole;        // whole items before the split tail
  int64_t lo, hi;       // this cluster's tail iterations
  int64_t n;            // pieces in all (whole items included)

  GATEDMLP_HD Schedule(const Params& p, int64_t c_, int64_t clusters_) : c(c_), clusters(clusters_), lo(0), hi(0) {
    if (p.sk_iters == 0) {
      whole = p.tiles > c ? (p.tiles - c + clusters - 1) / clusters : 0;
      n = whole;
      return;
    }
    whole = p.sk_first / clusters;  // a multiple of the cluster count
    lo = begin(p, c);
    hi = begin(p, c + 1);
    n = whole + (hi > lo ? (hi - 1) / p.k_blocks - lo / p.k_blocks + 1 : 0);
  }

  // Tail iterations [begin(j), begin(j + 1)) belong to cluster j.
  GATEDMLP_HD int64_t begin(const Params& p, int64_t j) const { return j * p.sk_iters / clusters; }

  GATEDMLP_HD Work at(const Params& p, int64_t w) const {
    Work wk;
    if (w < whole) {
      wk.item = c + w * clusters;
      wk.kb0 = 0;
      wk.kb1 = p.k_blocks;
      wk.role = kWhole;
      return wk;
    }
    const int64_t kb = p.k_blocks;
    const int64_t i = (hi - 1) / kb - (w - whole);  // tail item, counted from p.sk_first
    const int64_t a = lo > i * kb ? lo : i * kb, b = hi < (i + 1) * kb ? hi : (i + 1) * kb;
    wk.item = p.sk_first + i;
    wk.kb0 = static_cast<int>(a - i * kb);
    wk.kb1 = static_cast<int>(b - i * kb);
    wk.role = b < (i + 1) * kb ? kPartial : (a > i * kb ? kOwner : kWhole);
    return wk;
  }

  // The first cluster below c whose share does not reach into tail item
  // `item`. Every cluster between it and c with a share at all (with fewer
  // tail iterations than clusters, some have none) ends its share inside the
  // item and wrote a partial of it.
  GATEDMLP_HD int64_t first_partial(const Params& p, int64_t item) const {
    const int64_t start = (item - p.sk_first) * p.k_blocks;
    int64_t j = c - 1;
    while (j >= 0 && begin(p, j + 1) > start) --j;
    return j;
  }

  GATEDMLP_HD bool has_share(const Params& p, int64_t j) const { return begin(p, j) != begin(p, j + 1); }
};

}  // namespace gatedmlp::sm90
