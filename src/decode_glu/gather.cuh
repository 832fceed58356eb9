// Mixture-of-experts gather in the decode kernels (Params::indices set): the
// rows of a call choose their experts on the device, and each distinct
// expert's weights are streamed once, by the CTAs of one grid row, for all
// the rows that chose it (seed 003's rule: at a few tokens per step the time
// is the bytes of the distinct experts touched).
//
// No pass before the kernel: every CTA reads the n indices (a few hundred
// bytes from L2 at decode sizes) and builds, in shared memory, a bitmap of
// the experts chosen. Slot s of the grid's y is the s-th chosen expert in
// increasing order; CTAs past the last slot exit, and a CTA takes slots y,
// y + gridDim.y, ... The slot's rows are the output rows whose index names
// its expert, listed in increasing order (an ordered compaction, so a run is
// deterministic), then cut into tiles of the kernel's rows: a slot with more
// rows than a tile (a popular expert, MLX's many rows per index) runs its
// tiles in turn, re-reading its weights from L2.
//
// A bad index (outside [0, E)) is seen by every CTA, since each reads all
// of them: none writes an output, and CTA (0, 0) records the first bad
// position and its value in Params::index_error. Nothing is read through it.
#pragma once

#include <climits>
#include <cstdint>

#include "common/device_assert.cuh"
#include "decode_glu/params.hpp"

namespace gatedmlp::decode {

inline constexpr int kMaxExperts = 8192;    // the bitmap: 1 KB of shared memory
inline constexpr int kGatherEntries = 1024; // one expert's indices listed at a time
inline constexpr int kMaxTileRows = 64;     // the most rows of a kernel's tile

struct GatherShared {
  uint32_t chosen[kMaxExperts / 32];
  int list[kGatherEntries];   // positions in the indices of this slot's expert
  int xrow[kMaxTileRows];     // the tile's rows of x
  int yrow[kMaxTileRows];     // and of y (and pre)
  int warp_count[32];
  int bad;                    // the first bad position, or INT_MAX
  int expert;                 // this slot's expert, or -1 past the last slot
};

__device__ __forceinline__ int64_t load_index(const Params& p, int64_t i) {
  return p.index_64 ? int64_t(__ldg(static_cast<const long long*>(p.indices) + i))
                    : int64_t(__ldg(static_cast<const int*>(p.indices) + i));
}

// Calls body(expert, count, xrow, yrow) for each tile of up to ROWS rows of
// this CTA's slots: `count` rows, row m of the tile reading x row xrow[m]
// and writing y row yrow[m] (shared memory, valid until body returns). The
// body must end with a __syncthreads() (its epilogue reads what the next
// tile overwrites). Every thread of the CTA calls it.
template <int ROWS, typename Body>
__device__ __forceinline__ void for_each_gathered_tile(const Params& p, GatherShared& sh, Body&& body) {
  static_assert(ROWS <= kMaxTileRows, "a tile's rows must fit the row map");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int n = p.n_indices;
  const int words = (p.experts + 31) >> 5;
  for (int i = tid; i < words; i += blockDim.x) sh.chosen[i] = 0;
  if (tid == 0) sh.bad = INT_MAX;
  __syncthreads();
  for (int i = tid; i < n; i += blockDim.x) {
    const int64_t e = load_index(p, i);
    if (e < 0 || e >= p.experts) atomicMin(&sh.bad, i);
    else atomicOr(&sh.chosen[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  const int bad = sh.bad;
  if (p.index_error && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
    p.index_error[0] = bad == INT_MAX ? -1 : bad;
    p.index_error[1] = bad == INT_MAX ? 0 : load_index(p, bad);
  }
  if (bad != INT_MAX && p.index_trap && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0)
    gatedmlp::detail::device_assert_fail("gatedmlp: an expert index (Arguments::indices) is outside [0, E)",
                                         __FILE__, __LINE__);
  if (bad != INT_MAX) return;  // the same in every thread

  for (int slot = blockIdx.y;; slot += gridDim.y) {
    // The slot-th chosen expert: warp 0 counts the bitmap's bits, each lane
    // a run of `per` words, and a scan finds the lane holding it.
    if (warp == 0) {
      const int per = (words + 31) >> 5, w0 = lane * per, w1 = min(words, w0 + per);
      int c = 0;
      for (int w = w0; w < w1; ++w) c += __popc(sh.chosen[w]);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31 && slot >= incl) sh.expert = -1;
      if (slot >= incl - c && slot < incl) {
        int left = slot - (incl - c);
        for (int w = w0; w < w1; ++w) {
          uint32_t bits = sh.chosen[w];
          const int pc = __popc(bits);
          if (left < pc) {
            for (int q = 0; q < left; ++q) bits &= bits - 1;  // drop the lowest `left` bits
            sh.expert = w * 32 + __ffs(bits) - 1;
            break;
          }
          left -= pc;
        }
      }
    }
    __syncthreads();
    const int expert = sh.expert;
    if (expert < 0) return;

    for (int base = 0; base < n; base += kGatherEntries) {
      // The positions in [base, end) that chose `expert`, in order.
      const int end = min(n, base + kGatherEntries);
      int listed = 0;
      for (int i0 = base; i0 < end; i0 += blockDim.x) {
        const int i = i0 + tid;
        const bool mine = i < end && load_index(p, i) == expert;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) sh.warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before = listed, all = listed;
        for (int w = 0; w < warps; ++w) {
          before += w < warp ? sh.warp_count[w] : 0;
          all += sh.warp_count[w];
        }
        if (mine) sh.list[before + __popc(ballot & ((1u << lane) - 1))] = i;
        listed = all;
        __syncthreads();
      }
      const int64_t rows = int64_t(listed) * p.index_repeat;
      for (int64_t q0 = 0; q0 < rows; q0 += ROWS) {
        const int count = static_cast<int>(rows - q0 < ROWS ? rows - q0 : ROWS);
        for (int i = tid; i < count; i += blockDim.x) {  // a CTA of one warp has fewer threads than rows
          const int64_t q = q0 + i;
          const int64_t r = int64_t(sh.list[q / p.index_repeat]) * p.index_repeat + q % p.index_repeat;
          sh.yrow[i] = static_cast<int>(r);
          sh.xrow[i] = static_cast<int>(r / p.x_repeat);
        }
        __syncthreads();
        body(expert, count, sh.xrow, sh.yrow);
      }
    }
  }
}

}  // namespace gatedmlp::decode
