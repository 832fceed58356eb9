// Host side of the quantized decode kernel's Hopper form (hopper.cuh):
// int4 gate/up + GLU for 17-64 rows of X, the packed words streamed by TMA
// into a ring, dequantized in registers as wgmma's A operand, with X read by
// the tensor core from the same ring (wgmma's B operand).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime_api.h>

#include <string>

#include "gatedmlp/gatedmlp.hpp"
#include "quant_decode/params.hpp"

namespace gatedmlp::quant_decode {

// The form's shape: k-blocks of 256 (32 words, 128 bytes, of each weight
// row per stage); each consumer warpgroup owns 32 output columns (a 64-row
// A tile: 4 groups of 8 gate and 8 up rows); a CTA has 1 or 2 of them
// (kHopperColumns * warpgroups columns) and one producer warp.
inline constexpr int kHopperBk = 256;
inline constexpr int kHopperColumns = 32;
inline constexpr int kHopperMinM = 17;  // below: the register kernel (h82)
// Past 64 rows it runs in passes of 64 (each streams the weights again), up
// to 128: two passes at 8B cost ~2 x 51 us against ~135 us for dequantizing
// into the workspace and the 16-bit GEMM (h82).
inline constexpr int kHopperMaxM = 128;
inline constexpr int64_t hopper_passes(int64_t m) { return (m + 63) / 64; }

// A stage: 32 words of each of the CTA's 64 W rows and 256 k of N tokens of
// X; as many stages as fit 200 KB, at most 8.
inline constexpr int hopper_stage_bytes(int n, int warpgroups) {
  return 64 * warpgroups * (kHopperBk / 2) + n * kHopperBk * 2;
}
inline constexpr int hopper_stages(int n, int warpgroups) {
  return (200 * 1024) / hopper_stage_bytes(n, warpgroups) < 8 ? (200 * 1024) / hopper_stage_bytes(n, warpgroups) : 8;
}

// Why the Hopper form cannot take this resolved problem (which blocker()
// accepted at its rows, or at 64), or "" if it can (sm_90; the caller
// checks the device): affine int4 with scales of X's dtype and groups of
// 32, 64 or 128, or MXFP4 with bf16 x; the checkpoint's word order, gate/up
// (not the down projection or a gathered call), one batch, fused weights in
// blocks of G rows with G % 8 == 0, 17 <= m <= 128, k a multiple of 256,
// the scale arrays aligned to a stage's scales (16 bytes for int4 at group
// 32; `a` null: assumed aligned). GATEDMLP_QDECODE_HOPPER=0 turns it off
// (tuning knob).
std::string hopper_blocker(const Problem& resolved, const Arguments* a);

// Consumer warpgroups per CTA for this problem on `sms` SMs: 2 (64
// columns) while U / 64 CTAs still cover half the SMs, else 1 (h82: 1024 x
// 2816 ran 1.2-1.6x faster with 32-column CTAs, 2048 x 8192 1.3x slower).
int hopper_warpgroups(const Problem& resolved, int sms);

// A call prepared once: the quantized kernel's parameters and the tensor
// maps (words viewed as (K/2 bytes, 8 rows, 2 halves, G/8 groups, U/G
// blocks), X as (K, rows, 1) for each pass of 64 rows); hopper_launch()
// points them at each call's tensors.
struct HopperPrepared {
  Params q{};
  CUtensorMap wmap{}, xmap[2]{};
  const void* w = nullptr;  // the addresses the maps hold now
  const void* x = nullptr;
  DType input = DType::bf16;
  int n = 64;               // tokens per wgmma: 32 (m <= 32) or 64
  int passes = 1;           // of 64 rows (m > 64: 2)
  int warpgroups = 2;       // consumer warpgroups per CTA
  int group_size = 64;      // of the scales along K
  bool mxfp4 = false;       // MXFP4 (bf16 x) rather than affine int4
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
// (its parameters and X map; hopper_bf16.cu, hopper_fp16.cu, built for
// sm_90a only).
cudaError_t hopper_kernel_setup(const HopperPrepared& prepared);
cudaError_t hopper_kernel_launch(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                                 cudaStream_t stream);
cudaError_t hopper_setup_bf16(const HopperPrepared& prepared);
cudaError_t hopper_launch_bf16(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                               cudaStream_t stream);
cudaError_t hopper_setup_fp16(const HopperPrepared& prepared);
cudaError_t hopper_launch_fp16(const HopperPrepared& prepared, const Params& pass, const CUtensorMap& xmap,
                               cudaStream_t stream);

}  // namespace gatedmlp::quant_decode
