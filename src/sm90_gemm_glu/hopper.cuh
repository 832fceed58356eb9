// Hopper (sm_90a) building blocks for the fast path, written against the PTX
// ISA: mbarriers, TMA tensor loads, wgmma and its shared-memory descriptors,
// and register reallocation. Device code only; every function compiles to a
// single PTX instruction or a short loop around one.
//
// Compiled only for sm_90a (the wgmma and setmaxnreg instructions exist on no
// other target); the sm90 kernel's translation units are built for that
// architecture alone.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "sm90_gemm_glu/watchdog.cuh"

namespace gatedmlp::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------ mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the tensor-copy (async) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Arrive and announce `bytes` of transactions the copies will complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Spins until the barrier's phase with the given parity has completed.
// kCluster: with cluster-scope acquire, for what another CTA of the cluster
// wrote before its release.cluster arrival here (the ticket ring); the
// default is CTA scope.
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(GATEDMLP_SM90_WATCHDOG)
  watchdog::Spin spin;
  for (;;) {
    uint32_t done;
    if constexpr (kCluster)
      asm volatile(
          "{\n.reg .pred p;\n"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    if (done) return;
    spin.tick("mbarrier", smem_addr(bar), parity, [&] {
      uint64_t word;
      asm volatile("ld.shared.b64 %0, [%1];" : "=l"(word) : "r"(smem_addr(bar)) : "memory");
      return word;
    });
  }
#else
  if constexpr (kCluster)
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
#endif
}

// blockIdx.x read afresh where called: a volatile read is never merged with
// an earlier one, so a value needed again after a long loop is read again
// there instead of held (or spilled) through it.
__device__ __forceinline__ uint32_t block_x() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
  return v;
}

// threadIdx.x read afresh (volatile: not merged with another read of it).
__device__ __forceinline__ uint32_t thread_x() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  return v;
}

// ------------------------------------------------------------------ clusters
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster; orders barrier initialisation
// and, at the end, keeps a CTA alive while its peer may still write into it.
__device__ __forceinline__ void cluster_sync() {
  // Not .aligned: at the end the producer warp arrives diverged.
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// Arrive on the barrier at the same shared-memory offset in CTA `rank` of the
// cluster. Default (CTA-scope release) semantics: the arrival only says "my
// wgmma has finished reading this stage", which needs no cluster-wide fence;
// a .release.cluster arrive here halved the kernel's throughput.
// kRelease: with cluster-scope release, so that what this thread wrote before
// it is visible to a mbar_wait<true> in that CTA once the phase completes;
// once per work item (the ticket ring), not per k-step.
template <bool kRelease = false>
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  if constexpr (kRelease)
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(smem_addr(bar)),
        "r"(rank)
        : "memory");
  else
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(smem_addr(bar)),
        "r"(rank)
        : "memory");
}

// ------------------------------------------------------------------ TMA
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// A box of a 3-D tensor into shared memory; completes `bytes` on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_5d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                                            int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// Shared memory -> tensor box; clipped at the tensor's edges. Tracked by the
// issuing thread's bulk async-groups.
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tma_store_4d(const void* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until the thread's bulk stores have finished reading shared memory,
// all but the N most recently committed groups.
template <int N = 0>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Waits until they have completed.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's ordinary shared-memory writes before later reads by
// the async proxy (a TMA store).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// As tma_load_5d, but the box lands at the same offset in every CTA of
// `mask` and completes bytes on each one's barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_5d_multicast(void* dst, const void* map, uint64_t* bar, uint16_t mask, int c0,
                                                      int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%4, "
      "%5, %6, %7, %8}], [%2], %3;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(mask), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// ------------------------------------------------------------------ registers
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// Four 8 x 8 matrices of 16-bit values from the warp's registers to shared
// memory: lanes 8 i ... 8 i + 7 give the addresses of matrix i's rows 0-7,
// and each lane holds, in register i, row lane / 4, columns 2 (lane % 4) and
// + 1 of matrix i: the layout of an mma accumulator fragment.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Two such matrices (lanes 0-15 give the addresses, registers 0 and 1).
__device__ __forceinline__ void stmatrix_x2(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(r0), "r"(r1) : "memory");
}

// Named barrier over `threads` threads (a warpgroup's 128); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Counts the calling threads towards barrier id without waiting: the other
// side of a producer / consumer pair whose consumers call named_barrier.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ------------------------------------------------------------------ flags between CTAs
// A flag in global memory that one CTA raises, by storing the launch's
// token, after its threads' writes (the caller synchronises them first with a
// barrier, so the release covers them), and another waits for before reading
// those writes.
__device__ __forceinline__ void flag_raise(uint64_t* flag, uint64_t token) {
  asm volatile("st.release.gpu.global.b64 [%0], %1;" ::"l"(flag), "l"(token) : "memory");
}

__device__ __forceinline__ void flag_wait(const uint64_t* flag, uint64_t token) {
  uint64_t v;
#if defined(GATEDMLP_SM90_WATCHDOG)
  watchdog::Spin spin;
#endif
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
    if (v == token) return;
#if defined(GATEDMLP_SM90_WATCHDOG)
    spin.tick("split-tail flag", static_cast<uint32_t>(reinterpret_cast<uintptr_t>(flag)), token, [&] { return v; });
#endif
    __nanosleep(64);
  }
}

// ------------------------------------------------------------------ wgmma
// Shared-memory matrix descriptor for a K-major operand stored as 128-byte
// rows with the 128-byte swizzle (what TMA writes with SWIZZLE_128B): 8-row
// core-matrix groups 1024 bytes apart. The leading-byte offset is unused in
// this mode. Stepping 16 elements along K adds 32 bytes to the start address.
// As two words: the low one (start address, 14 bits, and the unused leading
// offset) varies with the operand; the high one (stride byte offset: 8 rows
// x 128 B; layout: 128-byte swizzle) never does. Shared memory ends below
// 2^18 bytes, so stepping a low word by an in-range offset never carries
// into bit 16 (the promoting loop steps low words in 32-bit arithmetic).
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_byte_addr) {
  return ((smem_byte_addr & 0x3FFFFu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t desc_from_lo(uint32_t lo) {
  return (uint64_t((1024u >> 4) | (1u << 30)) << 32) | lo;
}
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_byte_addr) {
  return desc_from_lo(desc_lo(smem_byte_addr));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma boundaries.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 2N] (+)= A[64 x 16] * B[2N x 16]^T, both operands K-major in shared
// memory; scale_d = 0 overwrites D. C: "+f", or "=f" for write-only D.
// Thread t of the warpgroup holds D(row, col) in d[i], i < N, for
//   row = 16*(t/32) + (t%32)/4 + 8*((i/2)%2),  col = 8*(i/4) + 2*(t%4) + i%2.
// N = 128 (m64n256k16), 96 (m64n192k16, the 96-column ping-pong tile) or 88
// (m64n176k16, the narrow tile's gate 88 + up 88 rows); for e4m3 also 32
// (m64n64k32, the promoting kernels' quarters): each list is the one before
// it and more.
#define GATEDMLP_WGMMA_D32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define GATEDMLP_WGMMA_D64 \
  GATEDMLP_WGMMA_D32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define GATEDMLP_WGMMA_D88 \
  GATEDMLP_WGMMA_D64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87"
#define GATEDMLP_WGMMA_D96 \
  GATEDMLP_WGMMA_D88 ", " \
  "%88, %89, %90, %91, %92, %93, %94, %95"
#define GATEDMLP_WGMMA_D128 \
  GATEDMLP_WGMMA_D96 ", " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define GATEDMLP_WGMMA_OPS32(C) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
  C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
  C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
  C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define GATEDMLP_WGMMA_OPS64(C) \
  GATEDMLP_WGMMA_OPS32(C), \
  C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
  C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
  C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63])
#define GATEDMLP_WGMMA_OPS88(C) \
  GATEDMLP_WGMMA_OPS64(C), \
  C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]), C(d[71]), \
  C(d[72]), C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), \
  C(d[80]), C(d[81]), C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87])
#define GATEDMLP_WGMMA_OPS96(C) \
  GATEDMLP_WGMMA_OPS88(C), \
  C(d[88]), C(d[89]), C(d[90]), C(d[91]), C(d[92]), C(d[93]), C(d[94]), C(d[95])
#define GATEDMLP_WGMMA_OPS128(C) \
  GATEDMLP_WGMMA_OPS96(C), \
  C(d[96]), C(d[97]), C(d[98]), C(d[99]), C(d[100]), C(d[101]), C(d[102]), C(d[103]), \
  C(d[104]), C(d[105]), C(d[106]), C(d[107]), C(d[108]), C(d[109]), C(d[110]), C(d[111]), \
  C(d[112]), C(d[113]), C(d[114]), C(d[115]), C(d[116]), C(d[117]), C(d[118]), C(d[119]), \
  C(d[120]), C(d[121]), C(d[122]), C(d[123]), C(d[124]), C(d[125]), C(d[126]), C(d[127])

// SHAPE: "m64n256k16", "m64n192k16" or "m64n176k16" (FP8: "m64n256k32" or
// "m64n64k32");
// DREGS, OPS: the matching lists; A, B, SCALE: the operand numbers after the
// accumulators; IMM: the immediates after scale-d: the scales of A and B
// (1), and for 16-bit types their transposes (0: both K-major; FP8
// operands have no transpose, they are always K-major).
#define GATEDMLP_WGMMA(SHAPE, TYPES, DREGS, OPS, A, B, SCALE, C, IMM) \
  asm volatile( \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" SCALE ", 0;\n" \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPES " {" DREGS "}, %" A ", %" B ", p, " IMM ";\n}\n" \
  : OPS(C) \
  : "l"(a_desc), "l"(b_desc), "r"(scale_d))
// One wgmma of N accumulators per thread (2N weight rows).
#define GATEDMLP_WGMMA_N(N, SHAPE, TYPES, C)                                           \
  GATEDMLP_WGMMA(SHAPE, TYPES, GATEDMLP_WGMMA_D##N, GATEDMLP_WGMMA_OPS##N, #N, GATEDMLP_WGMMA_B##N, \
                 GATEDMLP_WGMMA_S##N, C, "1, 1, 0, 0")
#define GATEDMLP_WGMMA_N_FP8(N, SHAPE, C)                                              \
  GATEDMLP_WGMMA(SHAPE, "e4m3.e4m3", GATEDMLP_WGMMA_D##N, GATEDMLP_WGMMA_OPS##N, #N, GATEDMLP_WGMMA_B##N, \
                 GATEDMLP_WGMMA_S##N, C, "1, 1")
#define GATEDMLP_WGMMA_B32 "33"
#define GATEDMLP_WGMMA_S32 "34"
#define GATEDMLP_WGMMA_B88 "89"
#define GATEDMLP_WGMMA_S88 "90"
#define GATEDMLP_WGMMA_B96 "97"
#define GATEDMLP_WGMMA_S96 "98"
#define GATEDMLP_WGMMA_B128 "129"
#define GATEDMLP_WGMMA_S128 "130"

// One wgmma of a consumer warpgroup's tile: N accumulators per thread, 2N
// weight rows (m64n256k16 for N = 128, m64n192k16 for 96, m64n176k16 for
// 88), T's type; for e4m3 (N = 128 only) m64n256k32. Either way one wgmma
// reads 32 bytes of each operand row: a 128-byte k-block row is 4 of them.
// FIRST: D = A * B^T (scale_d 0), and the compiler told that D's old values
// are not read ("=f"): once the previous tile's epilogue has read them, their
// registers are free (docs/notes/hopper-epilogue.md, h22). Otherwise D += A * B^T.
template <typename T, int N, bool FIRST>
__device__ __forceinline__ void wgmma_tile(float (&d)[N], uint64_t a_desc, uint64_t b_desc) {
  static_assert(N == 128 || N == 96 || N == 88, "m64n256k16, m64n192k16 and m64n176k16 only");
  const int scale_d = FIRST ? 0 : 1;
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    static_assert(N == 128, "e4m3: m64n256k32 only");
    if constexpr (FIRST) GATEDMLP_WGMMA_N_FP8(128, "m64n256k32", "=f");
    else GATEDMLP_WGMMA_N_FP8(128, "m64n256k32", "+f");
  } else {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
#define GATEDMLP_WGMMA_ANY(NN, SHAPE)                                   \
  if constexpr (kBf16 && FIRST) GATEDMLP_WGMMA_N(NN, SHAPE, "bf16.bf16", "=f"); \
  else if constexpr (kBf16) GATEDMLP_WGMMA_N(NN, SHAPE, "bf16.bf16", "+f");     \
  else if constexpr (FIRST) GATEDMLP_WGMMA_N(NN, SHAPE, "f16.f16", "=f");       \
  else GATEDMLP_WGMMA_N(NN, SHAPE, "f16.f16", "+f");
  if constexpr (N == 128) {
    GATEDMLP_WGMMA_ANY(128, "m64n256k16")
  } else if constexpr (N == 96) {
    GATEDMLP_WGMMA_ANY(96, "m64n192k16")
  } else {
    GATEDMLP_WGMMA_ANY(88, "m64n176k16")
  }
#undef GATEDMLP_WGMMA_ANY
  }
}

// A quarter of a consumer warpgroup's e4m3 tile: D[64 x 64] (+)= A[64 x 32]
// * B[64 x 32]^T (m64n64k32), 32 accumulators per thread laid out as 32 of
// wgmma_tile's: d[i] of quarter q is wgmma_tile's d[32 q + i]. The
// promoting kernels sum each k-block of one quarter in such an accumulator
// of their own, two of them in turn.
template <bool FIRST>
__device__ __forceinline__ void wgmma_quarter_fp8(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  const int scale_d = FIRST ? 0 : 1;
  if constexpr (FIRST) GATEDMLP_WGMMA_N_FP8(32, "m64n64k32", "=f");
  else GATEDMLP_WGMMA_N_FP8(32, "m64n64k32", "+f");
}

#undef GATEDMLP_WGMMA_N
#undef GATEDMLP_WGMMA_N_FP8
#undef GATEDMLP_WGMMA_B32
#undef GATEDMLP_WGMMA_S32
#undef GATEDMLP_WGMMA_B88
#undef GATEDMLP_WGMMA_S88
#undef GATEDMLP_WGMMA_B96
#undef GATEDMLP_WGMMA_S96
#undef GATEDMLP_WGMMA_B128
#undef GATEDMLP_WGMMA_S128
#undef GATEDMLP_WGMMA
#undef GATEDMLP_WGMMA_OPS128
#undef GATEDMLP_WGMMA_OPS96
#undef GATEDMLP_WGMMA_OPS88
#undef GATEDMLP_WGMMA_OPS64
#undef GATEDMLP_WGMMA_OPS32
#undef GATEDMLP_WGMMA_D128
#undef GATEDMLP_WGMMA_D96
#undef GATEDMLP_WGMMA_D88
#undef GATEDMLP_WGMMA_D64
#undef GATEDMLP_WGMMA_D32

}  // namespace gatedmlp::sm90
