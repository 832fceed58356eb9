// The plain parameter struct handed to the decode kernel, and the shape of
// one launch (host side, no CUDA headers needed beyond the runtime API).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::decode {

// Everything the kernel needs, resolved on the host. Strides in elements.
struct Params {
  const void* x;
  const void* w;        // fused weights, or the gate weights if separate
  const void* w_up;     // separate only
  const void* bias;     // fused [2U] in weight-row order, or the gate bias [U]
  const void* bias_up;  // separate only
  void* y;
  void* pre;

  int m;                // rows of X per batch, 1 ... kMaxM
  int batch;
  int64_t k, u;
  int64_t ldx, ldw, ldy, ldpre;
  int64_t sx, sw, sb, sy, spre;  // batch strides

  int64_t group;        // interleave block (fused); unused if separate
  int first;            // 0: gate block first, 1: up block first
  int separate;         // 1: two weight tensors
  int down;             // 1: the down projection, one [U, K] weight (CTA rows j0 .. j0+15 are 16 output columns)

  int act;
  float alpha, clamp_alpha, clamp_limit;
  int out_dtype, bias_dtype, pre_dtype;  // 0 bf16, 1 fp16, 2 fp32
  int has_bias, has_pre;

  // The split of K inside a CTA: K is cut into k-blocks of kUnroll chunks
  // of 32 elements; warp w of `warps` takes k-blocks w, w + warps, ...
  int warps;

  // The quantized down projection's split of K over gridDim.y CTAs
  // (quant_decode only): CTA row y takes k-blocks [y * split_k_blocks,
  // (y + 1) * split_k_blocks) and writes its raw sums to partials [y][m][u],
  // which down::reduce_splits sums with alpha and the bias. 0 / null: no split.
  int64_t split_k_blocks;
  float* partials;

  // Mixture-of-experts gather (gather.cuh; null indices: none). gridDim.y
  // CTAs share the distinct experts chosen; a CTA's rows are those that
  // chose its expert, in tiles of the kernel's rows. The expert takes the
  // batch's place in the weights' and bias' strides (sw, sb); x, y and pre
  // rows come from the row map (sx, sy, spre 0).
  const void* indices;     // n_indices expert ids, int32 or int64 (index_64)
  int64_t* index_error;    // optional: {-1, 0}, or the first bad index's position and value
  int index_trap;          // a bad index is also a device-side assertion (Arguments::index_trap)
  int index_64;
  int n_indices;
  int experts;
  int x_repeat;            // output rows per row of x
  int index_repeat;        // output rows per index
  const void* row_scale;   // down only: Y row r times row_scale[r] after the bias (null: none)
  int row_scale_dtype;
};

// 32-element chunks per k-block: the loads one warp has in flight at once
// (kUnroll x 1 KB of weights per group of 8 columns).
inline constexpr int kUnroll = 4;
inline constexpr int kMaxWarps = 8;

// Output columns per CTA: 8 gate/up pairs, or 16 rows of a down projection.
GATEDMLP_HD int64_t columns_per_cta(const Params& p) { return p.down ? 16 : 8; }

// Warps per CTA for K: one per k-block, at most kMaxWarps.
inline int warps_for(int64_t k, int unroll = kUnroll) {
  const int64_t k_blocks = (k + 32 * unroll - 1) / (32 * unroll);
  return static_cast<int>(k_blocks < kMaxWarps ? k_blocks : kMaxWarps);
}

// Which instantiation runs a launch: NT n-tiles of 8 tokens (1: m <= 8,
// 2: m <= 16); one_wave: the grid fits on the SMs at 3 CTAs each.
struct Shape {
  int nt = 1;
  bool one_wave = false;
  bool gather = false;  // Params::indices set: the gathered instantiations
};

// The most CTAs along y: past it a CTA takes batches (or a gathered call's
// slots of distinct experts) y, y + gridDim.y, ...
inline constexpr int kMaxGridY = 65535;

// One translation unit per input dtype (decode_glu_bf16.cu, decode_glu_fp16.cu).
// grid: (ceil(u / 8), min(batch, 65535)); p.warps warps per CTA (0: chosen
// from K).
cudaError_t launch_bf16(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_fp16(const Params& p, Shape s, cudaStream_t stream);

}  // namespace gatedmlp::decode
