// Host side of the Hopper fast path: what it takes, its tile, its launcher.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gatedmlp/gatedmlp.hpp"
#include "sm90_gemm_glu/params.hpp"

namespace gatedmlp::sm90 {

// The one compiled tile (see the note at the top of sm90_gemm_glu.cuh).
struct Tile {
  int tile_m, tile_n, tile_k, stages, threads;
  int smem_bytes;
};
// Shared memory: 4 x (16 KB of X + 32 KB of weights), two 16 KB Y tiles (one
// per consumer warpgroup), 1 KB of bias, 8 mbarriers, 1 KB alignment slack.
inline constexpr Tile kTile{128, 128, 64, 4, 384, 4 * 49152 + 2 * 16384 + 1024 + 64 + 1024};

// True when this build contains the sm_90a kernel.
bool compiled();

// Why the fast path cannot take this (resolved) problem, or "" if it can.
// `args` may be null (plan() without pointers assumes aligned pointers).
std::string blocker(const Problem& resolved, const Arguments* args);

// Workspace for the split tail of `ctas` CTAs: a flag and a 64 x 256 fp32
// partial tile per consumer warpgroup (128 KB per CTA).
size_t workspace_bytes(int ctas);

// Builds the tensor maps and launches one persistent CTA per SM (at most one
// per tile), in clusters of 1, 2 or 4 CTAs along M (launch.cpp,
// cluster_size(); GATEDMLP_SM90_CLUSTER overrides). The problem must have passed blocker().
// With at least workspace_bytes(sms) of workspace the last waves are split
// (see the kernel's Schedule); with less, or none, every item runs whole.
Status launch(const Problem& resolved, const Arguments& args, int sms, void* workspace, size_t workspace_bytes,
              cudaStream_t stream);

// Per-dtype kernel launchers (sm90_gemm_glu_launch.cu); cluster_m is 1,
// 2 or 4 CTAs per cluster, and p.m_units / p.tiles must count units of it.
cudaError_t launch_bf16(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream);
cudaError_t launch_fp16(const Params& p, int activation, int cluster_m, int sms, cudaStream_t stream);

}  // namespace gatedmlp::sm90
