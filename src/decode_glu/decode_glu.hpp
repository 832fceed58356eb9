// Host side of the decode kernel: gate/up + GLU for a few rows of X (M <= 16
// per batch), where the call is bound by streaming the weights once.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::decode {

// The most rows of X per batch the kernel takes.
inline constexpr int64_t kMaxM = 16;

// Why the decode kernel cannot take this resolved problem, or "" if it can.
// `a` null: pointers assumed 16-byte aligned (plan() without arguments).
std::string blocker(const Problem& resolved, const Arguments* a);

struct Params;
// The kernel's parameters for a resolved problem (params.hpp): pointers,
// shape, strides, layout, activation, options. The quantized decode kernel
// starts from them too.
Params make_params(const Problem& resolved, const Arguments& a);

// A gathered call's rows per tile (8, 16, ... up to max_rows): what a
// distinct expert gets under uniform routing, with room to spare.
int gathered_tile_rows(const Problem& resolved, int max_rows);

struct Shape;
// Warps per CTA for a gate/up launch of `ctas` CTAs of this instantiation
// on `sms` SMs; 0: one per k-block, at most kMaxWarps. Fewer warps, each
// taking more k-blocks, where that lets the whole grid be resident at once:
// on the small shapes a CTA's end (partial sums through shared memory, the
// epilogue) cost 0.2-2.5 us over the same sums without it, paid again by
// each wave of a grid of 1.5-3.9 waves (h75).
int warps_per_cta(const Shape& s, int64_t ctas, int sms);

// Launches it on `stream` for a resolved problem that blocker() accepted.
// `sms`: the device's multiprocessor count.
cudaError_t launch(const Problem& resolved, const Arguments& a, int sms, cudaStream_t stream);

}  // namespace gatedmlp::decode
