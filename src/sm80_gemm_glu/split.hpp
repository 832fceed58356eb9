// The portable kernel's split tail, on the host: which of the last tiles are
// cut along K, and into how many pieces. Plain C++ (no CUDA), so the CPU tests
// check it directly.
//
// The portable kernel is not persistent: one CTA per tile, two resident per
// SM, dispatched in block order. When the tile count is a few slots past a
// whole number of waves, those last tiles run alone on an almost idle GPU
// (8B M = 4096: 7168 tiles on 264 slots = 27.15 waves run as 28). Cutting
// each of the last r tiles into S pieces of K / S k-tiles fills that wave
// with short pieces instead. Each piece parks its fp32 sums in the workspace
// and takes a ticket; the tile's last piece to arrive adds every piece's sums
// in piece order (the result does not depend on the arrival order) and runs
// the epilogue. No piece waits for another, so any dispatch order is safe.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::sm80 {

struct SplitPlan {
  int64_t tiles = 0;  // the last `tiles` tiles (in block order) are split; 0: none
  int pieces = 0;     // ... each into this many pieces along K (>= 2 when tiles > 0)
};

// The cost model, in units of one k-tile of one CTA's main loop (a 64-deep
// slice of the whole tile). Rough, and the plan only acts on large margins:
// a piece pays its k-tiles plus one unit to write its fp32 partial tile
// (64 KB for 128 x 64 outputs, about the bytes one k-tile loads); the last
// piece reads each partial (half a unit each) and runs the epilogue.
inline constexpr double kSplitWriteCost = 1.0;
inline constexpr double kSplitReadCost = 0.5;
inline constexpr double kEpilogueCost = 2.0;
inline constexpr int kMaxSplitPieces = 16;

// Predicted time of the last wave (r tiles on `slots` resident CTAs, k_tiles
// each), whole (pieces = 1) or cut into `pieces`.
inline double split_tail_cost(int64_t r, int64_t slots, int64_t k_tiles, int pieces) {
  if (pieces <= 1) return double(k_tiles) + kEpilogueCost;
  const int64_t rounds = (r * pieces + slots - 1) / slots;
  const int64_t piece_k = (k_tiles + pieces - 1) / pieces;
  return double(rounds) * (double(piece_k) + kSplitWriteCost) + (pieces - 1) * kSplitReadCost + kEpilogueCost;
}

// The split for `tiles` tiles of `k_tiles` k-tiles on `slots` resident CTAs.
// Splits only when there is at least one whole wave before the tail (below
// that the lone CTAs run faster than the model says, and at small M the
// partials only add traffic), when the tail is predicted at most 0.8 of its
// whole time, and when that saves at least 1 % of the call.
inline SplitPlan plan_split(int64_t tiles, int64_t slots, int64_t k_tiles) {
  SplitPlan none;
  if (tiles <= 0 || slots <= 0 || k_tiles < 2 || tiles < slots) return none;
  const int64_t r = tiles % slots;
  if (r == 0) return none;
  const double whole = split_tail_cost(r, slots, k_tiles, 1);
  int best = 1;
  double best_cost = whole;
  const int max_pieces = static_cast<int>(std::min<int64_t>(kMaxSplitPieces, k_tiles));
  for (int s = 2; s <= max_pieces; ++s) {
    const double c = split_tail_cost(r, slots, k_tiles, s);
    if (c < best_cost) best = s, best_cost = c;
  }
  const double call = double(tiles / slots + 1) * whole;
  if (best == 1 || best_cost > 0.8 * whole || whole - best_cost < 0.01 * call) return none;
  return {r, best};
}

// A forced split (tests, tuning): the last `tiles` tiles (all if <= 0 or more
// than there are) cut into `pieces`, at most one k-tile each.
inline SplitPlan forced_split(int64_t tiles, int64_t k_tiles, int64_t last, int pieces) {
  SplitPlan p;
  p.pieces = static_cast<int>(std::min<int64_t>({int64_t(pieces), k_tiles, int64_t(kMaxSplitPieces)}));
  if (p.pieces < 2 || tiles <= 0) return SplitPlan{};
  p.tiles = last <= 0 ? tiles : std::min(last, tiles);
  return p;
}

// The launch's block count with the plan, or -1 if it passes the grid's limit.
inline int64_t split_blocks(int64_t tiles, const SplitPlan& s) {
  const int64_t n = tiles - s.tiles + s.tiles * std::max(s.pieces, 1);
  return n > INT_MAX ? -1 : n;
}

// Workspace: one 64-bit ticket per split tile (padded to 256 bytes), then
// one fp32 tile of tile_m x 2 tile_n per piece.
inline size_t split_ticket_bytes(const SplitPlan& s) {
  return (size_t(s.tiles) * sizeof(uint64_t) + 255) / 256 * 256;
}
inline size_t split_workspace_bytes(const SplitPlan& s, int tile_m, int tile_n) {
  if (s.tiles <= 0 || s.pieces < 2) return 0;
  return split_ticket_bytes(s) + size_t(s.tiles) * size_t(s.pieces) * size_t(tile_m) * 2 * size_t(tile_n) * sizeof(float);
}

// Piece q of `pieces` covers k-tiles [k_tiles q / pieces, k_tiles (q+1) / pieces).
GATEDMLP_HD int64_t piece_begin(int64_t k_tiles, int pieces, int q) { return k_tiles * q / pieces; }

}  // namespace gatedmlp::sm80
