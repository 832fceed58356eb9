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

// FastDiv for 1 <= d < 2^31: shift = ceil(log2 d), mul = floor(2^32 (2^shift
// - d) / d) + 1. For n < 2^31 the sum umulhi(n, mul) + n stays below 2^32.
inline FastDiv make_fastdiv(uint32_t d) {
  FastDiv f{d, 0, 0};
  if (d == 0) return f;
  while ((uint64_t{1} << f.shift) < d) ++f.shift;
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - d)) / d + 1);
  return f;
}

GATEDMLP_HD uint32_t fast_div(const FastDiv& f, uint32_t n) {
#if defined(__CUDA_ARCH__)
  return (__umulhi(n, f.mul) + n) >> f.shift;
#else
  return static_cast<uint32_t>(((uint64_t(n) * f.mul >> 32) + n) >> f.shift);
#endif
}

// The row units and work items of p.m_tiles x p.n_tiles tiles per batch
// for clusters of cm CTAs along M (p.m_units, p.odd_items, p.tiles; see
// tile_coord), and tile_coord's divisors (p.group_m must be set).
// pair_cols: with cm = 2 and an odd m_tiles, the last row-block's CTAs pair
// up along the columns.
inline void plan_items(Params& p, int cm, int64_t batch, bool pair_cols) {
  p.m_units = (p.m_tiles + cm - 1) / cm;
  p.odd_items = 0;
  if (cm == 2 && p.m_tiles % 2 == 1 && pair_cols) {
    p.m_units = p.m_tiles / 2;
    p.odd_items = (p.n_tiles + 1) / 2;
  }
  p.tiles = (int64_t(p.m_units) * p.n_tiles + p.odd_items) * batch;
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  p.div_batch = make_fastdiv(u32(int64_t(p.m_units) * p.n_tiles + p.odd_items));
  p.div_group = make_fastdiv(u32(int64_t(p.group_m) * p.n_tiles));
  p.div_units = make_fastdiv(u32(p.group_m));
  p.div_units_last = make_fastdiv(u32(p.group_m > 0 && p.m_units % p.group_m ? p.m_units % p.group_m : p.group_m));
}

// Where work item t puts the CTA of rank `rank` in its cluster of CM.
struct TileCoord {
  int l, mb, nb;  // batch, row-block, column-block
  // The CTAs of the cluster share the row-block (an odd_items item), not the
  // column-block: each loads its own X and weight tiles, no multicast.
  bool pair_cols;
};

// Tile t -> (batch, row-block, column-block). Normally the CM CTAs of a
// cluster take consecutive row-blocks (a row unit) of one column-block, so
// they need the same weight rows. Row units run fastest within groups of
// p.group_m, so that concurrently running CTAs share X and W in L2. With
// clusters of two and an odd number of row-blocks, the last row-block's
// items follow each batch's row units: item i has the two CTAs on
// column-blocks 2i and 2i + 1 (the second past U when n_tiles is odd), so no
// CTA computes a row-block past M. (With the row units rounded up instead,
// 8B M = 384, 3 row-blocks, ran at 0.71 of cuBLAS where one-CTA clusters
// ran at 0.88: docs/notes/hopper-kernel.md, h24.)
template <int CM>
GATEDMLP_HD TileCoord tile_coord(const Params& p, int64_t t64, int rank) {
  // In 32-bit unsigned arithmetic, dividing by multiplication (FastDiv):
  // items number fewer than 2^31 (the fast path's blocker checks), and this
  // runs at the start of every item, on the consumers' way from one item's
  // epilogue to the next one's first wgmma. (64-bit divisions here, calls of
  // some hundred instructions, cost 0.5-0.9 % at 8B: docs/notes/split-tail-and-schedule.md, h26.)
  const uint32_t t = static_cast<uint32_t>(t64);
  const uint32_t units = uint32_t(p.m_units) * uint32_t(p.n_tiles);
  const uint32_t per_batch = p.div_batch.d;
  TileCoord c;
  const uint32_t l = fast_div(p.div_batch, t);
  c.l = static_cast<int>(l);
  const uint32_t r = t - l * per_batch;
  c.pair_cols = CM == 2 && r >= units;
  if (c.pair_cols) {
    c.mb = p.m_tiles - 1;
    c.nb = 2 * static_cast<int>(r - units) + rank;
    return c;
  }
  const uint32_t g = fast_div(p.div_group, r);
  const uint32_t in = r - g * p.div_group.d;
  // Every group has group_m row units but the last, which has what is left.
  const bool last = p.m_units - static_cast<int>(g) * p.group_m < p.group_m;
  const FastDiv& du = last ? p.div_units_last : p.div_units;
  const uint32_t col = fast_div(du, in);
  c.mb = (static_cast<int>(g) * p.group_m + static_cast<int>(in - col * du.d)) * CM + rank;
  c.nb = static_cast<int>(col);
  return c;
}

// Split tail. With C clusters and T items that do not fill whole waves, the
// last wave runs T mod C items and leaves the other clusters idle for a whole
// item's time: 8B M = 4096 is 1792 items on 66 clusters, 27.15 waves run as
// 28. Split, the whole waves run as before and the k-blocks of the items of
// the partial wave (split_waves = 1) or of the last whole wave too
// (split_waves = 2) are shared out evenly over all C clusters. split_waves =
// 0 (the default) is 2 when there is only one whole wave (all of the work is
// shared out) and 1 otherwise. Measured on H200 (docs/notes/split-tail-and-schedule.md, h8): 8B M = 256
// (1.7 waves) 0.946 -> 0.982 of cuBLAS with 2; at 3.4 waves and more (M =
// 512, 1024, 4096) 2 is no better than 1 (within noise; on H100, 1 was as
// good or better).
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
                            int split_waves = 0) {
  p.sk_first = p.sk_iters = p.sk_q = 0;
  p.sk_r = 0;
  if (!enabled || clusters <= 0 || p.sk_ctas < clusters * cta_per_cluster || p.k_blocks < 2 ||
      p.tiles % clusters == 0)
    return false;
  const int64_t idle = clusters - p.tiles % clusters;  // clusters idle in the last wave
  if (!force && (p.m_tiles < 2 || idle * p.k_blocks < int64_t{kSplitMinIdleKBlocks} * clusters)) return false;
  const int64_t waves = p.tiles / clusters;
  if (split_waves == 0) split_waves = waves <= 1 ? 2 : 1;
  const int64_t whole_waves = split_waves == 1 ? waves : (waves > 0 ? waves - 1 : 0);
  p.sk_first = whole_waves * clusters;
  p.sk_iters = (p.tiles - p.sk_first) * p.k_blocks;
  p.sk_q = p.sk_iters / clusters;
  p.sk_r = static_cast<int>(p.sk_iters % clusters);
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

// A cluster's pieces. The kernel builds it before the accumulators are live
// (the divisions here are calls that would make ptxas spill around them) and
// keeps only 32-bit state: work items number fewer than 2^31 (the fast path's
// blocker checks). at() and the owner's questions need no 64-bit division.
// Whole items can also be handed out at run time (p.tickets: the kernel's
// ticket ring, docs/notes/split-tail-and-schedule.md h59): cluster c runs item c first, then whichever
// items it draws, until one is past the whole items; then its share of the
// tail as before (at_dynamic). The tail needs only that every whole item has
// run once, whichever cluster ran it.
inline constexpr int kHandedOut = 0x7fffffff;

struct Schedule {
  int c, clusters;  // this cluster, all clusters
  int whole;        // whole items before the tail (kHandedOut: not known yet, see at_dynamic)
  int whole_items;  // items [0, whole_items) run whole: p.sk_first, or p.tiles without a split
  int i0, i1;       // tail items i0 ... i1, counted from p.sk_first (i1 < i0: no share)
  int a0, b1;       // the share starts at k-block a0 of item i0 and ends before k-block b1 of item i1

  GATEDMLP_HD Schedule(const Params& p, int c_, int clusters_) : c(c_), clusters(clusters_) {
    // 32-bit: items number fewer than 2^31.
    const uint32_t tiles = static_cast<uint32_t>(p.tiles), nc = static_cast<uint32_t>(clusters);
    whole = static_cast<int>(p.sk_iters == 0 ? (tiles > uint32_t(c) ? (tiles - c + nc - 1) / nc : 0u)
                                             : static_cast<uint32_t>(p.sk_first) / nc);  // a multiple of the cluster count
    whole_items = static_cast<int>(p.sk_iters == 0 ? p.tiles : p.sk_first);
    i0 = 0, i1 = -1, a0 = b1 = 0;
    if (p.sk_iters == 0) return;
    const int64_t lo = begin(p, c), hi = begin(p, c + 1);
    if (hi <= lo) return;
    i0 = static_cast<int>(lo / p.k_blocks);
    i1 = static_cast<int>((hi - 1) / p.k_blocks);
    a0 = static_cast<int>(lo - int64_t(i0) * p.k_blocks);
    b1 = static_cast<int>(hi - int64_t(i1) * p.k_blocks);
  }

  // Tail iterations [begin(j), begin(j + 1)) belong to cluster j:
  // floor(j S / C) = j q + floor(j r / C) with S = q C + r (p.sk_q, p.sk_r).
  GATEDMLP_HD int64_t begin(const Params& p, int j) const {
    return int64_t(j) * p.sk_q + static_cast<int>(static_cast<unsigned>(j * p.sk_r) / static_cast<unsigned>(clusters));
  }

  // Pieces in all, whole items included.
  GATEDMLP_HD int count() const { return whole + (i1 >= i0 ? i1 - i0 + 1 : 0); }

  // Piece w of this cluster; false past the last one. Tail pieces run from
  // the share's last item down to its first.
  GATEDMLP_HD bool at(const Params& p, int w, Work* wk) const {
    if (w < whole) {
      wk->item = c + int64_t(w) * clusters;
      wk->kb0 = 0;
      wk->kb1 = p.k_blocks;
      wk->role = kWhole;
      return true;
    }
    const int i = i1 - (w - whole);
    if (i < i0) return false;
    wk->item = p.sk_first + i;
    wk->kb0 = i == i0 ? a0 : 0;
    wk->kb1 = i == i1 ? b1 : p.k_blocks;
    wk->role = wk->kb1 < p.k_blocks ? kPartial : (wk->kb0 > 0 ? kOwner : kWhole);
    return true;
  }

  // Items handed out at run time: piece w is whole item `item` while the
  // items drawn are whole ones (every piece from the first past them on is
  // the tail's, as at() numbers it from there). Call with w = 0, 1, ... in
  // turn; a cluster's first item is c.
  GATEDMLP_HD void hand_out() { whole = kHandedOut; }
  GATEDMLP_HD bool at_dynamic(const Params& p, int w, int64_t item, Work* wk) {
    if (w < whole) {
      if (item < whole_items) {
        wk->item = item;
        wk->kb0 = 0;
        wk->kb1 = p.k_blocks;
        wk->role = kWhole;
        return true;
      }
      whole = w;  // the first item past the whole ones: the tail starts here
    }
    return at(p, w, wk);
  }

  // The first cluster below c whose share does not reach into tail item
  // `item`. Every cluster between it and c with a share at all (with fewer
  // tail iterations than clusters, some have none) ends its share inside the
  // item and wrote a partial of it.
  GATEDMLP_HD int first_partial(const Params& p, int64_t item) const {
    const int64_t start = (item - p.sk_first) * p.k_blocks;
    int j = c - 1;
    while (j >= 0 && begin(p, j + 1) > start) --j;
    return j;
  }

  GATEDMLP_HD bool has_share(const Params& p, int j) const { return begin(p, j) != begin(p, j + 1); }
};

}  // namespace gatedmlp::sm90
