// Host side of the Hopper fast path: what it takes, its tile, its launcher.
#pragma once

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <string>

#include "gatedmlp/gatedmlp.hpp"
#include "sm90_gemm_glu/params.hpp"

namespace gatedmlp::sm90 {

// Limits of a tensor map, for every kernel that loads by TMA: strides below
// 2^40 bytes, coordinates signed 32-bit.
inline constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;
inline constexpr int64_t kMaxCoord = (int64_t{1} << 31) - 1;

// Tensor maps (launch.cpp), for every kernel that loads by TMA. The driver's
// entry point is looked up once per process; null with *s set if the
// driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn(Status* s);
// A prepared call's map takes the next call's address without being encoded
// again (cuTensorMapReplaceAddress); `what` names the tensor in the error.
Status replace_address(CUtensorMap* map, const void* addr, const char* what);
// A row-major 16-bit (or FP8) tensor with 128-byte-swizzled boxes whose
// inner extent is 128 bytes (64-byte swizzle: 64; unswizzled: any multiple
// of 16 bytes). dims[0] is the contiguous one; strides in bytes, for dims
// 1...; `what` names the tensor in the error.
Status encode(PFN_cuTensorMapEncodeTiled_v12000 fn, CUtensorMap* map, DType dt, const void* base, int rank,
              const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box, const char* what,
              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

// The compiled tiles (see the note at the top of sm90_gemm_glu.cuh).
struct Tile {
  int tile_m, tile_n, tile_k, stages, threads;
  int smem_bytes;
};
// Shared memory: 4 x (16 KB of X + 32 KB of weights), two 16 KB Y tiles (one
// per consumer warpgroup), 1 KB of bias, 8 mbarriers, the ticket ring's 8,
// 1 KB alignment slack.
inline constexpr Tile kTile{128, 128, 64, 4, 384, 4 * 49152 + 2 * 16384 + 1024 + 64 + 64 + 1024};
// The narrow tile, 88 output columns (176 weight rows): 5 x (16 KB of X + 22
// KB of weights), two 11 KB Y tiles, 704 B of bias, 10 mbarriers, the
// ticket ring, 1 KB slack.
// Where the 128-column tiles leave much of a last wave idle, its tiles
// (45 % more of them) can fill the waves better: 8B M = 512 is 3.39 waves of
// 128 columns and 4.94 of 88 (dispatch.cpp picks; docs/notes/hopper-kernel.md, h32).
inline constexpr Tile kTileNarrow{128, 88, 64, 5, 384, 5 * 38912 + 2 * 11264 + 704 + 80 + 64 + 1024};
// The ping-pong kernels (pingpong.cuh): the narrow tile, each consumer
// warpgroup running whole items in turn. 5 x 38 KB stages, per warpgroup an
// 11 KB Y tile and 704 B of bias, 12 mbarriers, 1 KB slack.
inline constexpr Tile kTilePingPong{128, 88, 64, 5, 384, 5 * 38912 + 2 * 11264 + 2 * 704 + 96 + 1024};
// The 96-column ping-pong kernels, for weights in blocks of G = 16, 32, 64,
// 128, ... rows (which 88-column tiles would start inside of; G = 64 and
// more as three 32-row boxes per weight half): 5 x 40 KB stages, per
// warpgroup a 12 KB Y tile and 768 B of bias, 12 mbarriers, 1 KB slack:
// 232032 of the 232448 bytes a block may have.
inline constexpr Tile kTilePingPong96{128, 96, 64, 5, 384, 5 * 40960 + 2 * 12288 + 2 * 768 + 96 + 1024};

// The e4m3 kernels (FP8 activations and weights): the 128-column tile with
// 128-deep k-blocks, the same 128-byte rows and shared-memory plan.
inline constexpr Tile kTileFp8{128, 128, 128, 4, 384, kTile.smem_bytes};

// CTAs per cluster (along M) for this problem: 2 for K > 8192, else 1 (and
// 1 with a single row-block); GATEDMLP_SM90_CLUSTER=1|2|4 overrides it.
int cluster_size(const Problem& resolved);

// Why the narrow tile cannot take this (resolved) problem, which the fast
// path takes (blocker() is ""), or "" if it can. `args` may be null.
std::string narrow_blocker(const Problem& resolved, const Arguments* args);

// Why the ping-pong kernels of tile_n columns (kTilePingPong's 88 or
// kTilePingPong96's 96) cannot take this (resolved) problem, which the fast
// path takes (blocker() is ""), or "" if they can. `args` may be null.
std::string pingpong_blocker(const Problem& resolved, const Arguments* args, int tile_n);

// True when this build contains the sm_90a kernel.
bool compiled();

// Why the fast path cannot take this (resolved) problem, or "" if it can.
// `args` may be null (plan() without pointers assumes aligned pointers).
std::string blocker(const Problem& resolved, const Arguments* args);

// An FP8 call (fp8_e4m3 X and weights, scales per tensor, row, channel or block):
// why the e4m3 kernels cannot take it, or "". `args` may be null.
std::string fp8_blocker(const Problem& resolved, const Arguments* args);

// Whether every FP8 call scaled per tensor, row or channel takes the
// promoting kernels (each 128-deep k-block summed apart, then added in
// fp32), as Problem::fp8_promote asks per call: GATEDMLP_FP8_PROMOTE=1
// (their error is _scaled_mm's, at 1.2-1.5x the time, h71). Block scales
// always take them.
bool fp8_promotes();

// Workspace for the split tail of `ctas` CTAs: a flag and a 64 x 256 fp32
// partial tile per consumer warpgroup (128 KB per CTA); and the ticket
// counter and slots (Params::tickets).
size_t workspace_bytes(int ctas);

// A grouped call (Gather::grouped): why the Hopper kernel cannot take it
// (blocker() and the expert stride), or "". `args` may be null.
std::string grouped_blocker(const Problem& resolved, const Arguments* args);

// A grouped call's workspace: the table of row units (Params::items), 16
// bytes per unit of grouped_units()' bound. It needs no other.
size_t grouped_workspace_bytes(const Problem& resolved);

// The plan kernel (grouped.cu): checks the E offsets (int32 or int64) of a
// grouped call of m rows and writes its table of `units` entries (the
// bound) for tile_m-row units into `items`, and index_error if given; with
// trap a bad offset is also a device-side assertion (Arguments::index_trap).
cudaError_t launch_grouped_plan(const void* offsets, bool index64, int64_t experts, int64_t m, int64_t units,
                                int tile_m, int32_t* items, int64_t* index_error, bool trap, cudaStream_t stream);

// How a prepared kernel is launched: grid, block, shared memory, whether
// with a cluster attribute, whether its tail is split (a fresh token per
// launch), and the typed launcher of its kernel.
struct KernelLaunch {
  dim3 grid, block;
  size_t smem = 0;
  bool cluster_attr = false;
  bool split = false;
  cudaError_t (*launch)(const KernelLaunch&, const Params&, cudaStream_t) = nullptr;
};

// A Hopper call prepared once: the parameter block with its tensor maps and
// the kernel's launch. launch_prepared() points it at each call's tensors:
// the tensor maps get the call's addresses (cuTensorMapReplaceAddress, no
// re-encoding), the workspace its pointers, a split tail a new token.
struct Prepared {
  Params p{};
  KernelLaunch k;
  bool uses_workspace = false;  // the split tail or the tickets: the call's workspace must be given
  int sms = 0;
  // A grouped call: its experts, the offsets' type, the table's units
  // (the plan kernel runs first, on each call's offsets).
  int64_t experts = 0;
  bool index64 = false;
  int64_t units = 0;
  // The addresses the tensor maps hold now.
  const void* x = nullptr;
  const void* w = nullptr;
  const void* w_up = nullptr;
  const void* y = nullptr;
  const void* pre = nullptr;
};

// Builds the tensor maps and prepares one persistent CTA per SM (at most
// one per tile), in clusters of 1, 2 or 4 CTAs along M (cluster_size()).
// The problem must have passed blocker().
// With at least workspace_bytes(sms) of workspace the last waves are split
// (see the kernel's Schedule); with less, or none, every item runs whole.
// tile_n: kTile's or kTileNarrow's (which must then take the problem);
// pingpong: the ping-pong kernels of kTilePingPong or kTilePingPong96
// (tile_n must be one of theirs, and pingpong_blocker() ""), which never
// split the tail. A prepared call may be launched again with other
// pointers of the same alignment (16 bytes for x, w, w_up, y, preact; the
// alignment of y and preact to 4 and 2 elements) and workspace as large.
Status prepare(const Problem& resolved, const Arguments& args, int tile_n, bool pingpong, int sms, void* workspace,
               size_t workspace_bytes, Prepared* out);
Status launch_prepared(Prepared& prepared, const Arguments& args, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream);

// prepare() then launch_prepared().
Status launch(const Problem& resolved, const Arguments& args, int tile_n, bool pingpong, int sms, void* workspace,
              size_t workspace_bytes, cudaStream_t stream);

// Per-dtype kernel set-up (sm90_gemm_glu_launch.cu): picks the kernel for
// p and cluster_m (1, 2 or 4 CTAs per cluster; p.m_units / p.tiles must
// count units of it), reads its launch knobs and plans the split tail into p.
cudaError_t setup_bf16(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k);
cudaError_t setup_fp16(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k);
// The e4m3 kernels: cooperative, 128 columns, no TMA pre-activation,
// clusters of one or two.
cudaError_t setup_fp8(Params& p, int activation, int cluster_m, int sms, KernelLaunch* k);

}  // namespace gatedmlp::sm90
