// Host side of the quantized decode kernel's Hopper form (hopper.cuh):
// int4, MXFP4, int8 and FP8 gate/up + GLU for up to 128 rows of X, the
// packed words streamed by TMA into a ring, dequantized in registers as wgmma's A
// operand, with X read by the tensor core from the same ring (wgmma's B
// operand).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime_api.h>

#include <string>

#include "gatedmlp/gatedmlp.hpp"
#include "quant_decode/params.hpp"

namespace gatedmlp::quant_decode {

// The form's shape: k-blocks of 256 (128 bytes of each weight row per stage
// for 4-bit formats, 256 for 8-bit ones); each consumer warpgroup owns 32 output columns (a 64-row
// A tile: 4 groups of 8 gate and 8 up rows); a CTA has 1 or 2 of them
// (kHopperColumns * warpgroups columns) and one producer warp.
inline constexpr int kHopperBk = 256;
inline constexpr int kHopperColumns = 32;
// The form's first M per format: below it the register kernel was faster
// (H200, h82/h83). 4-bit: 0.54-0.83x the register kernel's speed at M <=
// 8, ~1.0x at 12-16 (int4), 0.75-0.94x (MXFP4); int8: 1.07-1.54x from M = 8
// on four of five shapes (its register kernel dequantizes in fp32 and
// loads X per n-tile); FP8: 0.88-1.26x at M = 12, 0.92-1.45x at 16.
inline constexpr int kHopperMinM = 17;
inline constexpr int kHopperMinMInt8 = 9;
inline constexpr int kHopperMinMFp8 = 16;
// This problem's first M for the form, or 1 under
// GATEDMLP_QDECODE_HOPPER=all (a measuring knob: the form wherever it can
// run, hopper_forced()).
int hopper_min_m(const Problem& problem);
bool hopper_forced();
// Past 64 rows, up to 128: one pass with 128 tokens per wgmma (m64n128k16,
// h84), or under GATEDMLP_QDECODE_HOPPER_N128=0 two passes of 64 (each
// streams the weights again; h82: ~2 x 51 us at 8B against ~135 us for
// dequantizing into the workspace and the 16-bit GEMM).
inline constexpr int kHopperMaxM = 128;
// Tokens per wgmma for this problem's m rows with `warpgroups` consumer
// warpgroups (32, 64 or 128), and the passes over the rows.
int hopper_n(const Problem& resolved, int warpgroups);
inline int64_t hopper_passes(int64_t m, int n) { return (m + n - 1) / n; }

// Bytes of a weight row in a stage: 256 k of 4 or 8 bits.
inline constexpr int hopper_row_bytes(int bits) { return kHopperBk * bits / 8; }
// A stage: row_bytes of each of the CTA's 64 W rows and 256 k of N tokens
// of X; as many stages as fit 200 KB, at most 8.
inline constexpr int hopper_stage_bytes(int n, int warpgroups, int row_bytes) {
  return 64 * warpgroups * row_bytes + n * kHopperBk * 2;
}
inline constexpr int hopper_stages(int n, int warpgroups, int row_bytes) {
  return (200 * 1024) / hopper_stage_bytes(n, warpgroups, row_bytes) < 8
             ? (200 * 1024) / hopper_stage_bytes(n, warpgroups, row_bytes)
             : 8;
}

// Why the Hopper form cannot take this resolved problem (which blocker()
// accepted at its rows, or at 64), or "" if it can (sm_90; the caller
// checks the device): affine int4 or int8 with scales of X's dtype and
// groups of 32, 64 or 128, MXFP4 with bf16 x, or FP8 e4m3 with any of its
// scale schemes; the checkpoint's word order, gate/up
// (not the down projection or a gathered call), one batch, fused weights in
// blocks of G rows with G % 8 == 0, hopper_min_m() <= m <= 128, k a multiple of 256,
// affine scale arrays aligned to a stage's scales (16 bytes at group 32;
// `a` null: assumed aligned). GATEDMLP_QDECODE_HOPPER=0 turns it off
// (tuning knob).
std::string hopper_blocker(const Problem& resolved, const Arguments* a);

// Consumer warpgroups per CTA for this problem on `sms` SMs: 2 (64
// columns) while U / 64 CTAs still cover half the SMs, else 1 (h82: 1024 x
// 2816 ran 1.2-1.6x faster with 32-column CTAs, 2048 x 8192 1.3x slower).
int hopper_warpgroups(const Problem& resolved, int sms);

// The form's grid: CTAs of kHopperColumns * warpgroups columns per block of
// G columns, times the blocks.
int64_t hopper_ctas(const Problem& resolved, int warpgroups);

// A call prepared once: the quantized kernel's parameters and the tensor
// maps (words viewed as (K bits / 8 bytes, 8 rows, 2 halves, G/8 groups,
// U/G blocks), X as (K, rows, 1) for each pass of n rows); hopper_launch()
// points them at each call's tensors.
struct HopperPrepared {
  Params q{};
  CUtensorMap wmap{}, xmap[2]{};
  const void* w = nullptr;  // the addresses the maps hold now
  const void* x = nullptr;
  DType input = DType::bf16;
  int n = 64;               // tokens per wgmma and rows per pass: hopper_n()
  int passes = 1;           // of n rows (2 only at n = 64 past 64 rows)
  int warpgroups = 2;       // consumer warpgroups per CTA
  int group_size = 64;      // of the affine scales along K
  Format format = kInt4;    // kInt4, kMxfp4 (bf16 x), kInt8 or kFp8
  int ctas_per_block = 1;   // CTAs per block of G columns
  unsigned grid = 0;
};

// The dispatcher's config for this form is the only quantized decode
// config with a ring (stages > 0).
inline bool is_hopper_form(const Config& c) { return c.path == KernelPath::quant_decode && c.stages > 0; }

// The problem must have passed blocker() and hopper_blocker(); warpgroups
// from the plan (Config::tile_n / kHopperColumns).
Status hopper_prepare(const Problem& resolved, const Arguments& args, int warpgroups, HopperPrepared* out);
Status hopper_launch(HopperPrepared& prepared, const Arguments& args, cudaStream_t stream);

// The kernels' set-up (shared-memory limit) and the launch of one pass
// (its parameters and X map), one translation unit per X dtype and word
// width (hopper_bf16.cu, hopper_bf16_8bit.cu, ...; built for sm_90a only).
cudaError_t hopper_kernel_setup(const HopperPrepared& prepared);
cudaError_t hopper_kernel_launch(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                                 cudaStream_t stream);
cudaError_t hopper_setup_bf16(const HopperPrepared& prepared);
cudaError_t hopper_launch_bf16(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                               cudaStream_t stream);
cudaError_t hopper_setup_fp16(const HopperPrepared& prepared);
cudaError_t hopper_launch_fp16(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                               cudaStream_t stream);
cudaError_t hopper_setup_bf16_8bit(const HopperPrepared& prepared);
cudaError_t hopper_launch_bf16_8bit(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                                    cudaStream_t stream);
cudaError_t hopper_setup_fp16_8bit(const HopperPrepared& prepared);
cudaError_t hopper_launch_fp16_8bit(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                                    cudaStream_t stream);

}  // namespace gatedmlp::quant_decode
