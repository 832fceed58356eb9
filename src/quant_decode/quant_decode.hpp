// Host side of the quantized decode kernel: gate/up + GLU for a few rows of
// X (M <= 64) from quantized weights (Problem::quantized), dequantized in
// registers on their way to the tensor cores.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"
#include "quant_decode/params.hpp"

namespace gatedmlp::quant_decode {

// The most rows of X the kernel takes.
inline constexpr int64_t kMaxM = 64;
// The tiled kernels' most rows (QuantFormat::tiled: one or two n-tiles;
// past them the tiled weights are dequantized).
inline constexpr int64_t kTiledMaxM = 16;
// The most rows of one tile: kMaxM, or kTiledMaxM for tiled words (a
// gathered call runs more rows as more tiles).
inline int64_t max_tile_rows(const Problem& r) { return r.quant.tiled ? kTiledMaxM : kMaxM; }

// Why the kernel cannot take this resolved quantized problem, or "" if it
// can. `a` null: pointers assumed 16-byte aligned (plan() without arguments).
std::string blocker(const Problem& resolved, const Arguments* a);

// The down projection's split of K over CTAs, asked for by
// GATEDMLP_QDECODE_DOWN_SPLIT=S (tuning knob; off by default, h67): `splits`
// CTAs share each 16 rows' K, k_blocks_per_split k-blocks each, and write
// fp32 partial sums [splits][M][U] that down::reduce_splits finishes.
// splits = 1: no split.
struct DownSplit {
  int splits = 1;
  int64_t k_blocks_per_split = 0;
};
DownSplit down_split(const Problem& resolved);

// Groups of 8 output columns each warp streams together (1, 2 or 4) on a
// device with `sms` SMs: each X fragment it loads then feeds 2 or 4 groups'
// weights. At M = 16 a CTA of one group reads 4x as many bytes of X as of
// int4 weights. 4-bit weights (affine, MXFP4 with bf16 X) of gate/up calls
// that are not gathered, on the checkpoint's order, one chunk per k-block;
// GATEDMLP_QDECODE_CG=1|2|4 sets it (tuning knob; 2 applies at M <= 8, 4
// at M 9-16). `why`: the rule's reason.
int column_groups(const Problem& resolved, int sms, std::string* why = nullptr);

// Warps per CTA of the tiled down projection (QuantFormat::tiled, not
// gathered) on a device with `sms` SMs: 4 where a grid of 8-warp CTAs would
// end in a wave less than half full and 4-warp ones fit in one, else 0 (the
// kernel's own 8). GATEDMLP_QDECODE_DOWN, where set, decides instead.
// `why`: the rule's reason where it applies.
int down_warps(const Problem& resolved, int sms, std::string* why = nullptr);

// k-blocks each warp of a tiled kernel (QuantFormat::tiled) requests ahead
// of the one it multiplies, 1 ... tiled_max_depth() (where K has a tail
// and X is not staged, tiled_max_depth_tail(): 2 gathered, else 1), on a
// device with `sms` SMs; 0 for other formats. GATEDMLP_QDECODE_AHEAD=n,
// where set, decides instead (clamped to what the kernel takes). `why`:
// the rule's reason where it asks for more than one.
int tiled_ahead(const Problem& resolved, int sms, std::string* why = nullptr);

// The kernel's parameters for a resolved problem and its arguments.
Params make_params(const Problem& resolved, const Arguments& a);

// Launches it on `stream` for a resolved problem that blocker() accepted.
// split / partials: the down projection's split of K (down_split()) and
// its [splits][M][U] fp32 scratch; null partials run it unsplit. groups:
// the plan's column_groups() (Config::tile_n / 8), warps: the plan's
// down_warps() (Config::threads / 32; 0: the kernel's own), ahead: the
// plan's tiled_ahead() (Config::ahead; 0 or 1: one k-block), each decided
// once when the call is planned.
cudaError_t launch(const Problem& resolved, const Arguments& a, cudaStream_t stream,
                   const DownSplit& split = DownSplit{}, float* partials = nullptr, int groups = 1, int warps = 0,
                   int ahead = 0);

// ---------------------------------------------------------------- more rows
// Past kMaxM rows (past 128 where the Hopper form takes the call: hopper.hpp)
// the weights are dequantized into the workspace and the
// 16-bit kernels run on them (run() in core/api.cpp): one [rows, K] array of
// X's dtype per weight tensor.
struct DequantizeArgs {
  QuantFormat format;
  DType scale_dtype = DType::bf16;  // affine
  DType out_dtype = DType::bf16;    // bf16 or fp16
  int64_t rows = 0, k = 0;
  const void* words = nullptr;      // [rows, ldw] uint32
  int64_t ldw = 0;
  const void* scales = nullptr;     // [rows, K / group_size]
  const void* biases = nullptr;     // affine only
  void* out = nullptr;              // [rows, K], dense
};
cudaError_t dequantize_device(const DequantizeArgs& d, cudaStream_t stream);
// repack_quantized_device's kernel (arguments checked): dense rows of 4-bit
// words from one order to the other (quant/repack_math.hpp).
cudaError_t repack_words_device(bool from_repacked, bool to_repacked, int64_t rows, int64_t k, const uint32_t* src,
                                uint32_t* dst, cudaStream_t stream);
// The arguments that dequantize `rows` rows of one weight tensor of a
// resolved quantized problem into `out` ([rows, K] of X's dtype, dense).
DequantizeArgs dequantize_args(const Problem& resolved, int64_t rows, const void* words, const void* scales,
                               const void* biases, void* out);

// The 16-bit problem that runs on the dequantized weights, and the
// workspace bytes they take (256-byte aligned).
Problem dequantized_problem(const Problem& resolved);
size_t dequantized_bytes(const Problem& resolved);

}  // namespace gatedmlp::quant_decode
