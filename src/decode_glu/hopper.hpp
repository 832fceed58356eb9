// Host side of the decode kernel's Hopper form (decode_hopper.cu): gate/up +
// GLU for M <= 16 rows with the weights streamed by TMA into a ring and
// multiplied by wgmma as its A operand. What it takes, its launch, and a
// call prepared once whose tensor maps take each call's addresses.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime_api.h>

#include <string>

#include "decode_glu/params.hpp"
#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::decode {

// The form's shape: a CTA owns 32 output columns (one 64-row A tile: 4
// groups of 8 gate and 8 up rows) over all of K, in k-blocks of 64 (one
// 128-byte swizzled row) through a ring of kHopperStages; one producer warp
// and one consumer warpgroup.
inline constexpr int kHopperColumns = 32;
inline constexpr int kHopperBk = 64;
inline constexpr int kHopperStages = 8;
inline constexpr int kHopperThreads = 128 + 32;

// Why the Hopper form cannot take this resolved problem, or "" if it can
// (on an sm_90 device; the caller checks the device). It takes what the
// decode kernel takes (blocker() passed) with: one batch, gate/up (not the
// down projection or a gathered call), fused weights in blocks of G rows
// with G % 8 == 0 (stacked: G = U). `a` null: pointers assumed 16-byte
// aligned.
std::string hopper_blocker(const Problem& resolved, const Arguments* a);

// Why the Hopper form is not the faster one for this problem (which
// hopper_blocker() accepted) on `sms` SMs, or "" if it is. Its CTAs (32
// columns, two per SM) against the register form's (8 columns, 3-8 per SM),
// measured in one H200 run once the epilogue's code was short
// (docs/notes/drop-in-and-decode.md, h77): faster or level at m > 8 on
// every small shape and 8B, and at m <= 8 where its whole grid is resident
// at once (at most 2 CTAs per SM: Qwen2.5-0.5B, 1024 x 2816, Llama-3.2-1B
// and 3B); slower at m <= 8 past that (8B: 448 CTAs, 0.86-0.88x cuBLAS
// against the register form's 0.91-0.94x). Grids under half the SMs were
// not measured (the smallest was 1024 x 2816's 88 CTAs on 132 SMs): the
// register form keeps them.
std::string hopper_grid_blocker(const Problem& resolved, int sms);

// A decode call on the Hopper form, prepared once: the parameters and the
// two tensor maps (weights viewed as (K, 8 rows, 2 halves, G / 8 groups,
// U / G blocks), X as (K, M, 1)). hopper_launch() points them at each
// call's tensors.
struct HopperPrepared {
  Params p{};
  CUtensorMap wmap{}, xmap{};
  const void* w = nullptr;  // the addresses the maps hold now
  const void* x = nullptr;
  DType input = DType::bf16;
  int n = 8;                // tokens per wgmma: 8 (m <= 8) or 16
  int ctas_per_block = 1;   // CTAs per block of G columns
  unsigned grid = 0;
};

// The dispatcher's config for the Hopper form is the only decode config
// with a ring (stages > 0).
inline bool is_hopper_form(const Config& c) { return c.path == KernelPath::decode && c.stages > 0; }

// The problem must have passed blocker() and hopper_blocker(). A prepared
// call may be launched again with other pointers of the same alignment.
Status hopper_prepare(const Problem& resolved, const Arguments& args, HopperPrepared* out);
Status hopper_launch(HopperPrepared& prepared, const Arguments& args, cudaStream_t stream);

// The kernel's set-up on the current device (its shared-memory limit, once
// per device: hopper_prepare() calls it) and its launch (decode_hopper.cu,
// built for sm_90a only).
cudaError_t hopper_kernel_setup(const HopperPrepared& prepared);
cudaError_t hopper_kernel_launch(const HopperPrepared& prepared, cudaStream_t stream);

}  // namespace gatedmlp::decode
