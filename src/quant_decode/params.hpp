// The parameters of the quantized decode kernel: the 16-bit decode kernel's
// (decode_glu/params.hpp: x, y, bias, pre-activation, layout, activation)
// plus the packed weights' scales and biases.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "decode_glu/params.hpp"

namespace gatedmlp::quant_decode {

// Which dequantization a launch runs (dequant.cuh).
enum Format : int {
  kInt4 = 0,   // affine, 4 bits
  kInt8 = 1,   // affine, 8 bits
  kMxfp4 = 2,  // e2m1 values, e8m0 scales
  kFp8 = 3,    // e4m3fn values, float scales per block of rows x K applied to the fp32 sums
};

struct Params {
  // d.w / d.w_up: uint32 words, d.ldw words per row; d.k elements. d.batch is 1.
  decode::Params d;
  const void* scales;     // [rows, groups] of the weights in d.w
  const void* biases;     // affine only
  const void* scales_up;  // separate only
  const void* biases_up;
  int64_t groups;         // scales per row of the scale arrays: K / group_size (FP8: ceil, or 1)
  int group_shift;        // log2(group_size); 63 for one scale along all of K
  int row_shift;          // log2(row_block): 0 but for FP8's blocks; 31 for one scale for all rows
  int scale_dtype;        // affine: 0 bf16, 1 fp16, 2 fp32; mxfp4: e8m0 bytes
  int64_t expert_scales;  // gather: elements from one expert's scales (and biases) to the next's
};

// Which instantiation runs a launch: the format, NT n-tiles of 8 tokens
// (1, 2, 4 or 8: m <= 8, 16, 32, 64), and whether the scales are of X's dtype, so that
// the dequantization runs in pairs of X's type (dequant.cuh); otherwise it
// runs in fp32.
struct Shape {
  Format format = kInt4;
  int nt = 1;
  bool packed_math = false;
  int unroll = 1;  // chunks per k-block: 1 or 2
  bool gather = false;  // Params::d.indices set: the gathered instantiations (unroll 2 only up to nt 2)
  int cg = 1;           // groups of 8 columns per warp: 1, or 2 at nt = 1, 4 at nt = 2 (column_groups())
  int depth = 1;        // tiled: k-blocks each warp requests ahead, 1-3 (tiled_ahead())
};

// Tiled 4-bit affine words (tiled.cuh): one translation unit per input dtype.
inline constexpr int kTiledBlockK = 128;  // a k-block: 4 lanes x 32 elements
// One row of X is staged in shared memory while its padded K fits in this.
inline constexpr int kTiledXsMaxBytes = 40960;
// Whether a tiled call stages X (one row, not gathered): staged X is zero
// past K, so such a call has no K tail whatever K.
constexpr bool tiled_stages_x(int64_t m, int64_t k, int64_t x_bytes, bool gather) {
  return !gather && m == 1 && (k + kTiledBlockK - 1) / kTiledBlockK * kTiledBlockK * x_bytes <= kTiledXsMaxBytes;
}
// The most k-blocks a tiled kernel requests ahead (Shape::depth) without
// spilling: each set of a k-block's words and scales costs 12 registers per
// column group, under 128 where two CTAs share an SM (sm_90a, ptxas: one
// group 63-124 registers at depth 1-3; two groups 96-124 at 1-2, spilling at
// 3; four groups 222 at 1, 254 at 2).
constexpr int tiled_max_depth(int nt, int cg, bool gather) {
  return nt * cg >= 8 ? 1 : (cg == 2 || (gather && nt == 2)) ? 2 : 3;
}
// The same where K has a tail and X is not staged (the crossing k-block's
// predicated X loads cost registers: gathered, depth 2, 105 and 124 for 8-
// and 16-row tiles against 96 and 102 without a tail): two for gathered
// kernels, the only calls that take more than one there (tiled_ahead());
// one otherwise, so that no kernel is built that nothing picks.
constexpr int tiled_max_depth_tail(int nt, int cg, bool gather) {
  return !gather ? 1 : tiled_max_depth(nt, cg, gather) < 2 ? tiled_max_depth(nt, cg, gather) : 2;
}
cudaError_t launch_tiled_bf16(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_tiled_fp16(const Params& p, Shape s, cudaStream_t stream);

// One translation unit per input dtype and format.
cudaError_t launch_bf16_int4(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_bf16_int8(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_bf16_mxfp4(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_bf16_fp8(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_fp16_int4(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_fp16_int8(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_fp16_mxfp4(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_fp16_fp8(const Params& p, Shape s, cudaStream_t stream);
// Repacked int4 (repacked.cuh), one per X dtype and group: 32, 64, 128 or more.
cudaError_t launch_repacked_bf16_g32(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_repacked_bf16_g64(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_repacked_bf16_g128(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_repacked_fp16_g32(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_repacked_fp16_g64(const Params& p, Shape s, cudaStream_t stream);
cudaError_t launch_repacked_fp16_g128(const Params& p, Shape s, cudaStream_t stream);

}  // namespace gatedmlp::quant_decode
