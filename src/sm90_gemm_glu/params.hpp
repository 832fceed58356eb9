// The parameter block of the Hopper kernel, filled on the host (launch.cpp).
#pragma once

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; no driver library is linked)

#include <cstdint>

namespace gatedmlp::sm90 {

// Rows per weight box where a 96-column tile gathers each weight half from
// several blocks of G rows (w_sub_boxes below).
inline constexpr int kSubBoxRows = 32;

// The ticket ring (Params::tickets): slots per cluster, and where the slots
// start after the counter (in uint32 words: 256 bytes on).
inline constexpr int kTicketRingSlots = 4;
inline constexpr int kTicketSlotsOffset = 64;

// n / d for 0 <= n < 2^31 as (umulhi(n, mul) + n) >> shift (Granlund and
// Montgomery's round-up method; schedule.hpp): tile_coord divides by these
// at the start of every work item, where a 32-bit division is some 25
// dependent instructions. d = 0: unset.
struct FastDiv {
  uint32_t d, mul, shift;
};

// Passed by value as a __grid_constant__ kernel parameter, so the tensor maps
// live in parameter space where the copy engine can read them.
struct Params {
  // X as (K, M, L); box 64 x 128 x 1.
  CUtensorMap tma_x;
  // Weights as (K, G, H, U/G, L): G rows per interleave block, H = 2 halves
  // per block (fused) or 1 (separate). Gate rows of output columns [n0, n0+128)
  // are the box at (k, n0 % G, gate_half, n0 / G, l); up rows likewise. For
  // separate weights tma_wg and tma_wu map the two tensors; for fused ones
  // they are the same map.
  CUtensorMap tma_wg;
  CUtensorMap tma_wu;
  // Y as (U, M, L), 16-bit output: box 64 x 64 x 1; FP8 (y_fp8): bytes,
  // box 128 x 64 x 1. Used when y_tma.
  CUtensorMap tma_y;
  // The narrow tile's last 24 columns: Y with box 24 x 64 x 1, no swizzle;
  // the 96-column tile's last 32: box 32 x 64 x 1, 64-byte swizzle.
  CUtensorMap tma_y_tail;
  // The pre-activation as (2U, M, L), 16-bit only; box 64 x 64 x 1. Used
  // when pre_tma (U is then a multiple of the 128-column tile). The
  // ping-pong kernels (stacked or separate weights only) map it as (U, 2
  // runs, M, L) instead, so that a box is clipped at the end of its run:
  // box 64 x 1 x 64 x 1, and tma_pre_tail the tile's last 24 columns
  // (no swizzle), as for Y.
  CUtensorMap tma_pre;
  CUtensorMap tma_pre_tail;

  int64_t m, k, u;
  int batch;
  int tile_n;           // output columns per tile: 128, 88 (the narrow kernels) or 96 (ping-pong only)
  int pingpong;         // tile_n 88 or 96: the ping-pong kernels (pingpong.cuh), else the cooperative ones
  int m_tiles, n_tiles, k_blocks;
  int group_m;          // row units per raster group (tile order, see tile_coord)
  int m_units;          // row units of CM row-blocks: m_tiles / CM, rounded up, or down when odd_items
  // Clusters of two with an odd m_tiles: the last row-block's items, where
  // the two CTAs take two column-blocks of that row-block (not two row-blocks
  // of one column-block), ceil(n_tiles / 2) per batch; 0 otherwise.
  int odd_items;
  int64_t tiles;        // batch * (m_units * n_tiles + odd_items): the work items of clusters
  // tile_coord's divisors (plan_items): items per batch, items per raster
  // group, and row units per group, for whole groups and for the last one.
  FastDiv div_batch, div_group, div_units, div_units_last;
  int64_t w_group;      // G of the tensor maps (U for stacked and separate)
  int gate_half, up_half;
  // Clusters: part q of a weight half (128 / (CM/2) rows) is the box at
  // (c1 + q * w_part_c1, ..., c3 + q * w_part_c3): rows within a block, or
  // whole blocks of G rows when G is smaller than the part.
  int w_part_c1, w_part_c3;
  // 96-column ping-pong tiles of weights in blocks of G = 64, 128, 160, ...
  // (multiples of kSubBoxRows that neither divide 96 nor are multiples of
  // it): each weight half as w_sub_boxes boxes of kSubBoxRows rows, each
  // inside one block (a tile starts on a multiple of 32 rows), the first at
  // (c1, c3), each next one kSubBoxRows rows on, into the next block at its
  // end. 0: one box per half.
  int w_sub_boxes;
  int x_batched, w_batched;  // 0: every batch reads coordinate 0 (stride 0)
  int x_rows;                // rows per X box: BM, or M rounded up to 8 when M < BM (the rest of the ring's A rows are zeroed once)

  // Epilogue, strides in elements.
  const void* bias;
  const void* bias_up;
  void* y;
  void* pre;
  int64_t ldy, ldpre, sb, sy, spre;
  int64_t group;       // layout's G (fused), for bias and pre-activation columns
  int first, separate;
  float alpha, clamp_alpha, clamp_limit;
  int out_dtype, bias_dtype, pre_dtype;  // 0 bf16, 1 fp16, 2 fp32
  int has_bias, has_pre;
  int y_vec4;          // 4 adjacent Y elements from a multiple of 4 may be stored as one vector
  int y_tma;           // Y is written by TMA stores from a swizzled shared-memory tile
  int pre_mode;        // where a tile's pre-activation columns lie: see store_pre
  int pre_log2g;       // pre_mode 1: log2(G)
  int pre_vec2;        // two adjacent pre-activation elements at an even index may be stored as one vector
  int pre_tma;         // the pre-activation goes through shared memory and TMA stores (PRE = 1 kernels, store_pre_tma)

  // Split tail (stream-K over the last waves; see Schedule in the kernel).
  // Work items [0, sk_first) run whole, a wave at a time; the k-blocks of
  // items [sk_first, tiles) are shared out evenly, sk_iters of them in all,
  // over the clusters. sk_iters = 0: no split, every item runs whole.
  int64_t sk_first, sk_iters;
  int64_t sk_q;        // sk_iters / clusters
  int sk_r;            // sk_iters % clusters
  float* sk_part;      // per CTA and consumer warpgroup: one 64 x 256 fp32 partial tile
  // Per partial: a flag raised (set to sk_token) once it is written. The
  // token is new for every eager launch, so the flags need no zeroing: what
  // a previous launch, or anything else, left there does not equal it (a
  // 64-bit value drawn per launch: a stale or garbage flag matches with
  // probability 2^-64). A launch captured into a CUDA graph replays one
  // token, so it zeroes the flags before the kernel (launch_prepared).
  uint64_t* sk_flag;
  uint64_t sk_token;
  int64_t sk_ctas;     // CTAs the workspace has partials for (0: no workspace, no split)

  // Whole items handed out at run time (cooperative kernels only): a counter
  // in the workspace, zeroed before each launch, from which each cluster's
  // leader draws its next item, then from kTicketSlotsOffset on
  // kTicketRingSlots slots per cluster (the kernel's TicketRing, docs/notes/split-tail-and-schedule.md
  // h59). nullptr: cluster c runs items c, c + clusters, ...
  uint32_t* tickets;

  // Grouped calls (Gather::grouped; the GROUPED kernels only): row unit mb
  // of the schedule is entry mb of this table in the workspace, four int32
  // {first row, end row, expert, 0} written by the plan kernel
  // (grouped.cu) from the offsets just before; first >= end: no rows (the
  // schedule counts an upper bound of units). X rows come from the first
  // row on, the weights and bias are the expert's, Y rows stop at the end.
  const int32_t* items;
  int grouped;  // the GROUPED kernels (launch.cuh's setup_grouped)

  // FP8 calls (the e4m3 kernels). Scales per tensor, row or channel
  // multiply the fp32 sums of gate and up before alpha and the bias: X's
  // (fp32: x_scale[0], or x_scale[row] with x_scale_row) and the weights'
  // (scale_dtype: w_scale[0] for both halves of fused weights, w_scale[0]
  // and w_scale_up[0] for separate ones; with w_scale_col one per weight
  // row, at the row's pre_col index for fused weights, at j in each tensor
  // for separate ones). Block scales multiply each 128-deep k-block's sum
  // as it is added (the promoting kernels only): X's with x_scale_block at
  // x_scale[row * k_groups + kb], the weights' with w_scale_block at
  // [weight row / 128][kb] of each tensor (k_groups per row).
  int fp8;
  const void* x_scale;
  const void* w_scale;
  const void* w_scale_up;
  int x_scale_row, w_scale_col, scale_dtype;
  int x_scale_block, w_scale_block;
  int k_groups;     // ceil(K / 128)
  int fp8_promote;  // the promoting kernels (any block scale, Problem::fp8_promote or fp8_promotes())

  // FP8 Y (output_dtype = fp8_e4m3; the e4m3 kernels only): each row's 128
  // columns of a tile quantized with one fp32 scale (store_y_fp8), e4m3
  // bytes into y, the scale of row r and group c at y_scales[r * ys_row +
  // c * ys_group], and with y_amax the amax of all of Y folded in by
  // atomicMax (launch_prepared zeroes it first).
  int y_fp8;
  float* y_scales;
  int64_t ys_row, ys_group;
  float* y_amax;
};

// A grouped call's table: the row units it may need, an upper bound known
// on the host. An expert of c rows takes ceil(c / 128) units, so E experts
// over m rows take at most floor(m / 128) + min(E, m) of them.
inline int64_t grouped_units(int64_t m, int64_t experts, int tile_m) {
  return m / tile_m + (experts < m ? experts : m);
}

}  // namespace gatedmlp::sm90
