// The plan kernel of a grouped (MoE prefill) call: checks the offsets and
// writes the table of row units the Hopper kernel's schedule walks
// (Params::items), right before it, on the same stream.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/device_assert.cuh"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::sm90 {

namespace {

constexpr int kPlanThreads = 1024;

// One CTA. Thread t owns a run of consecutive experts: it checks their
// offsets, counts their units (ceil(rows / tile_m) each), and after a scan
// of the counts over the CTA writes their units in expert order: {first
// row, end row, expert, 0}. The units from the last one to `units` (the
// host's upper bound, which the schedule walks) are written empty. With a
// bad offset every unit is written empty, so the kernel after writes
// nothing, and index_error says which offset was bad: the first expert e
// whose end is below the previous end, negative or past m, or (the last)
// not m.
template <typename I>
__global__ void __launch_bounds__(kPlanThreads) grouped_plan_kernel(const I* offsets, int experts, int64_t m,
                                                                     int64_t units, int tile_m, int4* items,
                                                                     long long* index_error, bool trap) {
  __shared__ int bad;
  __shared__ int scan[kPlanThreads];
  const int t = threadIdx.x;
  if (t == 0) bad = INT_MAX;
  __syncthreads();
  const int per = (experts + kPlanThreads - 1) / kPlanThreads;
  const int e0 = min(experts, t * per), e1 = min(experts, e0 + per);
  int count = 0;
  for (int e = e0; e < e1; ++e) {
    const int64_t end = static_cast<int64_t>(offsets[e]);
    const int64_t begin = e > 0 ? static_cast<int64_t>(offsets[e - 1]) : 0;
    if (end < begin || end < 0 || end > m || (e == experts - 1 && end != m)) {
      atomicMin(&bad, e);
      break;
    }
    count += static_cast<int>((end - begin + tile_m - 1) / tile_m);
  }
  __syncthreads();
  const int first_bad = bad;
  if (first_bad != INT_MAX) {
    for (int64_t i = t; i < units; i += kPlanThreads) items[i] = make_int4(0, 0, 0, 0);
    if (t == 0 && index_error) {
      index_error[0] = first_bad;
      index_error[1] = static_cast<long long>(offsets[first_bad]);
    }
    if (t == 0 && trap)
      gatedmlp::detail::device_assert_fail("gatedmlp: a grouped call's offsets (Arguments::indices) are not "
                                           "nondecreasing in [0, m] ending at m", __FILE__, __LINE__);
    return;
  }
  // Inclusive scan of the counts (Hillis-Steele).
  scan[t] = count;
  __syncthreads();
  for (int d = 1; d < kPlanThreads; d *= 2) {
    const int v = t >= d ? scan[t - d] : 0;
    __syncthreads();
    scan[t] += v;
    __syncthreads();
  }
  int u = scan[t] - count;
  const int total = scan[kPlanThreads - 1];
  for (int e = e0; e < e1; ++e) {
    // Offsets fit in 32 bits: a grouped call has m < 2^31 rows (check_support).
    const int end = static_cast<int>(offsets[e]);
    for (int row = e > 0 ? static_cast<int>(offsets[e - 1]) : 0; row < end; row += tile_m)
      items[u++] = make_int4(row, end, e, 0);
  }
  for (int64_t i = total + t; i < units; i += kPlanThreads) items[i] = make_int4(0, 0, 0, 0);
  if (t == 0 && index_error) {
    index_error[0] = -1;
    index_error[1] = 0;
  }
}

}  // namespace

cudaError_t launch_grouped_plan(const void* offsets, bool index64, int64_t experts, int64_t m, int64_t units,
                                int tile_m, int32_t* items, int64_t* index_error, bool trap, cudaStream_t stream) {
  int4* out = reinterpret_cast<int4*>(items);
  long long* ie = reinterpret_cast<long long*>(index_error);
  const int e = static_cast<int>(experts);
  if (index64)
    grouped_plan_kernel<long long><<<1, kPlanThreads, 0, stream>>>(static_cast<const long long*>(offsets), e, m, units,
                                                                   tile_m, out, ie, trap);
  else
    grouped_plan_kernel<int32_t><<<1, kPlanThreads, 0, stream>>>(static_cast<const int32_t*>(offsets), e, m, units,
                                                                 tile_m, out, ie, trap);
  return cudaGetLastError();
}

}  // namespace gatedmlp::sm90
