// Host side of the portable mma.sync kernel: its tile menu and launchers.
#pragma once

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"
#include "sm80_gemm_glu/params.hpp"

namespace gatedmlp::sm80 {

// The compiled tiles. tile_n counts output columns; the CTA computes twice as
// many GEMM columns (gate and up).
struct Tile {
  int tile_m, tile_n, tile_k, stages, threads;
  int smem_bytes;
};
// Shared memory: stages x (A rows + B rows) x 64 x 2 bytes, plus one pointer per B row.
inline constexpr Tile kTileLarge{128, 64, 64, 3, 128, 3 * (128 + 128) * 64 * 2 + 128 * 8};
inline constexpr Tile kTileSmall{64, 64, 64, 3, 128, 3 * (64 + 128) * 64 * 2 + 128 * 8};

// Launch with one of the tiles above (selected by cfg.tile_m) and cfg.vector_loads.
cudaError_t launch_bf16(Params p, const Config& cfg, cudaStream_t stream);
cudaError_t launch_fp16(Params p, const Config& cfg, cudaStream_t stream);

}  // namespace gatedmlp::sm80
