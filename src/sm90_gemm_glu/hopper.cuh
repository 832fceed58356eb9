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

#include <cstdint>
#include <type_traits>

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
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
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
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
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
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until all but the N most recent of the thread's bulk store groups
// have finished reading shared memory.
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

// Named barrier over `threads` threads (a warpgroup's 128); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
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
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
    if (v == token) return;
    __nanosleep(64);
  }
}

// ------------------------------------------------------------------ wgmma
// Shared-memory matrix descriptor for a K-major operand stored as 128-byte
// rows with the 128-byte swizzle (what TMA writes with SWIZZLE_128B): 8-row
// core-matrix groups 1024 bytes apart. The leading-byte offset is unused in
// this mode. Stepping 16 elements along K adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_byte_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_byte_addr & 0x3FFFF) >> 4);  // start address, 14 bits
  d |= uint64_t(1) << 16;                           // leading byte offset (unused)
  d |= uint64_t(1024 >> 4) << 32;                   // stride byte offset: 8 rows x 128 B
  d |= uint64_t(1) << 62;                           // layout: 128-byte swizzle
  return d;
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

// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, both operands K-major in shared
// memory. scale_d = 0 overwrites D (the first k-step of a tile).
// The kernel keeps a 64 x 256 tile (gate columns 0-127, then up columns
// 0-127) in one 128-register array and runs it as two of these, set S = 0, 1:
// B rows 0-63 are gate columns 64 S ..., rows 64-127 the up columns of the
// same outputs. Thread t holds D(row, n) in
//   d[LO + i] (n < 64) or d[HI + i - 32] (n >= 64), LO = 32 S, HI = 64 + 32 S,
//   row = 16*(t/32) + (t%32)/4 + 8*((i/2)%2),  n = 8*(i/4) + 2*(t%4) + i%2,
// so d[i] holds gate column 8*(i/4) + 2*(t%4) + i%2 of the 128 for i < 64,
// and d[i + 64] the up value of the same column: the layout one m64n256k16
// over [gate | up] would give.
#define GATEDMLP_WGMMA_M64N128K16(TYPES) \
  asm volatile( \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " {" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
  "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
  : \
    "+f"(d[LO + 0]), "+f"(d[LO + 1]), "+f"(d[LO + 2]), "+f"(d[LO + 3]), "+f"(d[LO + 4]), "+f"(d[LO + 5]), "+f"(d[LO + 6]), "+f"(d[LO + 7]), \
    "+f"(d[LO + 8]), "+f"(d[LO + 9]), "+f"(d[LO + 10]), "+f"(d[LO + 11]), "+f"(d[LO + 12]), "+f"(d[LO + 13]), "+f"(d[LO + 14]), "+f"(d[LO + 15]), \
    "+f"(d[LO + 16]), "+f"(d[LO + 17]), "+f"(d[LO + 18]), "+f"(d[LO + 19]), "+f"(d[LO + 20]), "+f"(d[LO + 21]), "+f"(d[LO + 22]), "+f"(d[LO + 23]), \
    "+f"(d[LO + 24]), "+f"(d[LO + 25]), "+f"(d[LO + 26]), "+f"(d[LO + 27]), "+f"(d[LO + 28]), "+f"(d[LO + 29]), "+f"(d[LO + 30]), "+f"(d[LO + 31]), \
    "+f"(d[HI + 0]), "+f"(d[HI + 1]), "+f"(d[HI + 2]), "+f"(d[HI + 3]), "+f"(d[HI + 4]), "+f"(d[HI + 5]), "+f"(d[HI + 6]), "+f"(d[HI + 7]), \
    "+f"(d[HI + 8]), "+f"(d[HI + 9]), "+f"(d[HI + 10]), "+f"(d[HI + 11]), "+f"(d[HI + 12]), "+f"(d[HI + 13]), "+f"(d[HI + 14]), "+f"(d[HI + 15]), \
    "+f"(d[HI + 16]), "+f"(d[HI + 17]), "+f"(d[HI + 18]), "+f"(d[HI + 19]), "+f"(d[HI + 20]), "+f"(d[HI + 21]), "+f"(d[HI + 22]), "+f"(d[HI + 23]), \
    "+f"(d[HI + 24]), "+f"(d[HI + 25]), "+f"(d[HI + 26]), "+f"(d[HI + 27]), "+f"(d[HI + 28]), "+f"(d[HI + 29]), "+f"(d[HI + 30]), "+f"(d[HI + 31]) \
  : "l"(a_desc), "l"(b_desc), "r"(scale_d))

template <typename T, int S>
__device__ __forceinline__ void wgmma_m64n128k16_set(float (&d)[128], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(S == 0 || S == 1, "one of the two column sets");
  constexpr int LO = 32 * S, HI = 64 + 32 * S;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) GATEDMLP_WGMMA_M64N128K16("bf16.bf16");
  else GATEDMLP_WGMMA_M64N128K16("f16.f16");
}

#undef GATEDMLP_WGMMA_M64N128K16

}  // namespace gatedmlp::sm90
