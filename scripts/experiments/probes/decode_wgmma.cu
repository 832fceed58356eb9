// Probe h76 (docs/notes/drop-in-and-decode.md): the small shapes' gate/up +
// GLU at M = 1 ... 16 with the weights as wgmma's A operand ("swap AB"),
// against cuBLAS's GEMM alone in the same run.
//
// h75 found the decode kernel's loads and mma.sync sums, without any end of
// a tile, already slower than cuBLAS at M = 16 on three of the four small
// shapes, and every ring that fed mma.sync from shared memory slower still
// (each 16 x 16 weight fragment costs an ldmatrix). cuBLAS's kernels for
// these shapes read as weight rows x 8 or 16 tokens with deep TMA rings:
// the tensor core reads the weights straight from shared memory. Here:
//
//   - a tensor map views stacked [2U, K] bf16 as (K, 8 rows, 2 halves,
//     U / 8 groups), so one box of (64 k, 8, 2, 4 T) lands as 64 T rows of
//     [group][gate 8 | up 8] with the 128-byte swizzle: each warp's 16
//     accumulator rows of an m64nNk16 are one group's 8 gate and 8 up rows,
//     so silu(g) * u is formed in registers, nothing exchanged;
//   - X's box (64 k, N tokens; N = 8 or 16, rows past M filled with zeros
//     by the copy) is the B operand;
//   - one producer warp fills a ring of S stages; W consumer warpgroups
//     take the k-blocks in turn (W = 2: the second adds its sums through
//     shared memory at the end);
//   - a CTA owns 32 T output columns over all of K.
//
// Then the same probe kernel (T = 1, 8 stages) against K split over a
// cluster of 2, 3 or 4 CTAs (h78, h90, swab_cluster; its launches with
// programmatic dependent launch were h78's too), the library's own kernel
// (decode_glu/decode_hopper.cu, included here and launched as the library
// launches it) and cuBLAS. (The variant sweep over T, S, W and K slices is
// at commit d281eb6, its table in docs/notes/data/h76-probe-kslices.txt;
// X fixed against rotated at 0a6c2ed, docs/notes/data/h77-probe-x-rotated.txt;
// the library's pieces one at a time, h77, at 81367b6.)
//
// Each variant's Y is checked against a plain float reference on random
// inputs. Standalone: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a
// -Isrc -Iinclude decode_wgmma.cu -lcublas -lcuda, from the repository root.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>

#include "decode_glu/decode_hopper.cu"  // the library's kernel (nvcc -Isrc -Iinclude from the repository root)
#include "h75_common.cuh"

using namespace gatedmlp;

namespace {

constexpr int kBk = 64;  // k per stage: one 128-byte swizzled row

__device__ __forceinline__ void tma_4d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(saddr(dst)),
      "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(saddr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          saddr(dst)),
      "l"(m), "r"(c0), "r"(c1), "r"(saddr(bar))
      : "memory");
}

// D[64 x N] += A[64 x 16] * B[N x 16]^T, both K-major in shared memory; N = 8
// ... 64, N / 2 accumulators per thread.
template <int N>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t a, uint64_t b) {
#define DW_PRE "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n"
#define DW_F(i) "+f"(d[i])
  if constexpr (N == 8) {
    asm volatile(DW_PRE "8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}"
                 : DW_F(0), DW_F(1), DW_F(2), DW_F(3)
                 : "l"(a), "l"(b));
  } else if constexpr (N == 16) {
    asm volatile(DW_PRE "16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}"
                 : DW_F(0), DW_F(1), DW_F(2), DW_F(3), DW_F(4), DW_F(5), DW_F(6), DW_F(7)
                 : "l"(a), "l"(b));
  } else if constexpr (N == 32) {
    asm volatile(DW_PRE
                 "32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, "
                 "%17, p, 1, 1, 0, 0;\n}"
                 : DW_F(0), DW_F(1), DW_F(2), DW_F(3), DW_F(4), DW_F(5), DW_F(6), DW_F(7), DW_F(8), DW_F(9),
                   DW_F(10), DW_F(11), DW_F(12), DW_F(13), DW_F(14), DW_F(15)
                 : "l"(a), "l"(b));
  } else {
    static_assert(N == 64);
    asm volatile(DW_PRE
                 "64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
                 "0;\n}"
                 : DW_F(0), DW_F(1), DW_F(2), DW_F(3), DW_F(4), DW_F(5), DW_F(6), DW_F(7), DW_F(8), DW_F(9),
                   DW_F(10), DW_F(11), DW_F(12), DW_F(13), DW_F(14), DW_F(15), DW_F(16), DW_F(17), DW_F(18),
                   DW_F(19), DW_F(20), DW_F(21), DW_F(22), DW_F(23), DW_F(24), DW_F(25), DW_F(26), DW_F(27),
                   DW_F(28), DW_F(29), DW_F(30), DW_F(31)
                 : "l"(a), "l"(b));
  }
#undef DW_PRE
#undef DW_F
}

// The ring's barriers (one arrival each, the copies' bytes on `full`);
// thread 0 initialises, the caller synchronises the CTA after.
__device__ __forceinline__ void ring_init(uint64_t* full, uint64_t* empty, int stages) {
  if (threadIdx.x != 0) return;
  for (int i = 0; i < stages; ++i) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[i])));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[i])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// N tokens (8 or 16), T 64-row tiles (32 T columns) per CTA, S stages, KS
// slices of K: with KS > 1 (T = 1) a tile's 64 rows are 4 / KS groups of
// columns at KS slices of K (K / KS apart), and X's box holds the same KS
// slices as B's rows (N KS of them: slice s's tokens at rows s N ...), so
// the wgmma is N KS wide and warp w's useful sums (slice w / (4 / KS)) are
// its columns of slice s; slices > 0 hand them to slice 0's warp through
// shared memory at the end.
template <int N, int T, int S, int KS>
struct Cfg {
  static_assert(KS == 1 || T == 1, "k slices: one tile");
  static constexpr int kWN = N * KS;       // the wgmma's width
  static constexpr int kA = T * 64 * 128;  // weight bytes per stage
  static constexpr int kB = kWN * 128;     // X bytes per stage
  static constexpr int kStage = kA + kB;
  static constexpr int kRed = KS > 1 ? 128 * (N / 2) * 4 : 0;
  static constexpr int kSmem = S * kStage + kRed + 1024 /* alignment */ + 2 * S * 8;
  static constexpr int kThreads = 128 + 32;
};

template <int N, int T, int S, int KS>
__global__ void __launch_bounds__(Cfg<N, T, S, KS>::kThreads) swab(const __grid_constant__ CUtensorMap wmap,
                                                                   const __grid_constant__ CUtensorMap xmap, int k,
                                                                   int u, int m, __nv_bfloat16* __restrict__ y) {
  using C = Cfg<N, T, S, KS>;
  constexpr int kGroups = 4 / KS;  // column groups per 64-row tile
  constexpr int kWN = C::kWN;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * C::kStage + C::kRed);
  uint64_t* empty = full + S;
  float* red = reinterpret_cast<float*>(smem + S * C::kStage);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nkb = (k / KS + kBk - 1) / kBk;  // KS > 1: K % (8 KS) == 0
  ring_init(full, empty, S);
  __syncthreads();
  if (warp == 4) {
    // Producer: one thread issues every stage's two boxes.
    if (lane == 0) {
      const int g0 = blockIdx.x * kGroups * T;
      for (int kb = 0; kb < nkb; ++kb) {
        const int s = kb % S;
        if (kb >= S) bar_wait(&empty[s], ((kb / S) - 1) & 1);
        arrive_expect(&full[s], C::kStage);
        uint8_t* st = smem + s * C::kStage;
        if constexpr (KS == 1) {
          tma_4d(st, &wmap, &full[s], kb * kBk, 0, 0, g0);
          tma_2d(st + C::kA, &xmap, &full[s], kb * kBk, 0);
        } else {
          sm90::tma_load_5d(st, &wmap, &full[s], kb * kBk, 0, 0, g0, 0);
          sm90::tma_load_3d(st + C::kA, &xmap, &full[s], kb * kBk, 0, 0);
        }
      }
    }
    return;
  }
  float d[T][kWN / 2];
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < kWN / 2; ++i) d[t][i] = 0.f;
  int prev = -1;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % S;
    bar_wait(&full[s], (kb / S) & 1);
    const uint32_t st = saddr(smem + s * C::kStage);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      const uint64_t b = sm90::desc_sw128(st + C::kA + kk * 32);
#pragma unroll
      for (int t = 0; t < T; ++t) wgmma<kWN>(d[t], sm90::desc_sw128(st + t * 64 * 128 + kk * 32), b);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    if (prev >= 0 && threadIdx.x == 0) arrive(&empty[prev]);
    prev = s;
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < kWN / 2; ++i) asm volatile("" : "+f"(d[t][i])::"memory");
  // v[t]: this warp's own N / 2 sums (its slice's columns of the wgmma).
  const int slice = warp / kGroups, grp = warp % kGroups;
  float v[T][N / 2];
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) v[t][i] = d[t][i];
  if constexpr (KS > 1) {
#pragma unroll
    for (int sl = 1; sl < KS; ++sl)
      if (slice == sl) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) red[((sl - 1) * kGroups + grp) * (N / 2) * 32 + i * 32 + lane] = d[0][sl * N / 2 + i];
      }
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (slice > 0) return;
#pragma unroll
    for (int o = 1; o < KS; ++o)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) v[0][i] += red[((o - 1) * kGroups + grp) * (N / 2) * 32 + i * 32 + lane];
  }
  // Group grp of tile t: lane's row lane / 4 is column j's gate (v[.][4c],
  // v[.][4c + 1]: tokens 8c + 2 (lane % 4) + 0/1) and its up (v[.][4c + 2],
  // v[.][4c + 3]).
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const int j = (blockIdx.x * kGroups * T + kGroups * t + grp) * 8 + lane / 4;
    if (j >= u) continue;
#pragma unroll
    for (int c = 0; c < N / 8; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = 8 * c + 2 * (lane % 4) + e;
        const float g = v[t][4 * c + e], uu = v[t][4 * c + 2 + e];
        if (token < m) y[int64_t(token) * u + j] = __float2bfloat16(g / (1.f + __expf(-g)) * uu);
      }
  }
}

template <int N, int T, int S, int KS = 1>
void launch_swab(const CUtensorMap& wm, const CUtensorMap& xm, int k, int u, int m, __nv_bfloat16* y, cudaStream_t s) {
  using C = Cfg<N, T, S, KS>;
  static bool once = [] {
    CK(cudaFuncSetAttribute(swab<N, T, S, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    return true;
  }();
  (void)once;
  const int cols = 32 * T / KS;
  const unsigned grid = unsigned((u + cols - 1) / cols);
  swab<N, T, S, KS><<<grid, C::kThreads, C::kSmem, s>>>(wm, xm, k, u, m, y);
}


// h78: K split over a cluster of KC CTAs (T = 1, the probe's maps). CTA
// rank r of a cluster takes the r-th KC-th of the k-blocks of the same 32
// columns; ranks > 0 store their sums into rank 0's shared memory
// (distributed shared memory), and rank 0 adds them and ends the tile.
// Why: on 1024 x 2816 the 88 CTAs of the one-CTA form keep only 88 of 132
// SMs streaming, each with at most its ring's 8 stages in flight; KC CTAs
// per tile put KC times the bytes in flight over more SMs, for one
// exchange of N / 2 floats per thread at the end. S: stages per CTA, small
// enough that the grid stays resident (each CTA's share of K is short).
template <int N, int S, int KC>
struct ClusterCfg {
  static constexpr int kA = 64 * 128;  // weight bytes per stage
  static constexpr int kB = N * 128;   // X bytes per stage
  static constexpr int kStage = kA + kB;
  static constexpr int kRed = (KC - 1) * (N / 2) * 128 * 4;  // ranks > 0's sums
  static constexpr int kSmem = S * kStage + kRed + 1024 /* alignment */ + 2 * S * 8;
};

// A float into the same shared-memory offset of CTA `rank` of the cluster.
__device__ __forceinline__ void st_cluster(const float* mine, uint32_t rank, float v) {
  asm volatile(
      "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\nst.shared::cluster.f32 [r], %2;\n}" ::"r"(saddr(mine)),
      "r"(rank), "f"(v)
      : "memory");
}

// PDL (h78 too): launched as a programmatic dependent of the kernel before
// it in the stream (PDL > 0), the CTA letting the next launch start at
// once. PDL = 1: the producer issues the first S stages' weight boxes
// before waiting for the previous grid (griddepcontrol.wait), X's only
// after it, so the weights stream while the previous kernel ends: sound
// only where no earlier kernel writes the weights, a measure of the lever.
// PDL = 2: it waits before any load, so only the launch and the CTA's set-up
// overlap the previous kernel: sound for any neighbour, what a library
// could ship.
template <int N, int S, int KC, int PDL = 0>
__global__ void __launch_bounds__(160) swab_cluster(const __grid_constant__ CUtensorMap wmap,
                                                    const __grid_constant__ CUtensorMap xmap, int k, int u, int m,
                                                    __nv_bfloat16* __restrict__ y) {
  using C = ClusterCfg<N, S, KC>;
  extern __shared__ uint8_t raw[];
  // The same offset in every CTA of the kernel: st_cluster's addresses
  // name the peer's copy of `red`.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  float* red = reinterpret_cast<float*>(smem + S * C::kStage);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * C::kStage + C::kRed);
  uint64_t* empty = full + S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = KC > 1 ? sm90::cluster_rank() : 0;
  const int tile = blockIdx.x / KC;
  // Rank r takes k-blocks [r all / KC, (r + 1) all / KC): shares that
  // differ by one at most (h90: 16 k-blocks over 3 CTAs as 5, 5, 6).
  const int all = (k + kBk - 1) / kBk;
  const int kb0 = int(rank) * all / KC, end = (int(rank) + 1) * all / KC;
  const int nkb = end - kb0;
  ring_init(full, empty, S);
  __syncthreads();
  // A peer's shared memory may be written only once that CTA has started:
  // every thread arrives here and waits before the exchange at the end.
  if constexpr (KC > 1) asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
  if constexpr (PDL > 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (warp == 4) {
    if (lane == 0) {
      // PDL = 1: the first stages' weights now, their X once the previous grid is done.
      const int early = PDL == 1 ? (nkb < S ? nkb : S) : 0;
      for (int i = 0; i < early; ++i) {
        arrive_expect(&full[i], C::kStage);
        tma_4d(smem + i * C::kStage, &wmap, &full[i], (kb0 + i) * kBk, 0, 0, 4 * tile);
      }
      if constexpr (PDL > 0) asm volatile("griddepcontrol.wait;" ::: "memory");
      for (int i = 0; i < early; ++i)
        tma_2d(smem + i * C::kStage + C::kA, &xmap, &full[i], (kb0 + i) * kBk, 0);
      for (int i = early; i < nkb; ++i) {
        const int s = i % S;
        if (i >= S) bar_wait(&empty[s], ((i / S) - 1) & 1);
        arrive_expect(&full[s], C::kStage);
        uint8_t* st = smem + s * C::kStage;
        tma_4d(st, &wmap, &full[s], (kb0 + i) * kBk, 0, 0, 4 * tile);
        tma_2d(st + C::kA, &xmap, &full[s], (kb0 + i) * kBk, 0);
      }
    }
    __syncwarp();
    if constexpr (KC > 1) {
      asm volatile("barrier.cluster.wait;" ::: "memory");
      sm90::cluster_sync();  // every thread of the cluster takes part
    }
    return;
  }
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  int prev = -1;
  for (int i = 0; i < nkb; ++i) {
    const int s = i % S;
    bar_wait(&full[s], (i / S) & 1);
    const uint32_t st = saddr(smem + s * C::kStage);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk)
      wgmma<N>(d, sm90::desc_sw128(st + kk * 32), sm90::desc_sw128(st + C::kA + kk * 32));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    if (prev >= 0 && threadIdx.x == 0) arrive(&empty[prev]);
    prev = s;
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
  if constexpr (KC > 1) {
    asm volatile("barrier.cluster.wait;" ::: "memory");  // every CTA of the cluster has started
    // Slot (rank - 1) of rank 0's `red`, [slot][i][thread]: 128 consecutive floats per store.
    if (rank > 0)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) st_cluster(&red[((rank - 1) * (N / 2) + i) * 128 + threadIdx.x], 0, d[i]);
    sm90::cluster_sync();  // release the stores, acquire them in rank 0
    if (rank > 0) return;
#pragma unroll
    for (int r = 1; r < KC; ++r)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) d[i] += red[((r - 1) * (N / 2) + i) * 128 + threadIdx.x];
  }
  // Lane (g, t) of warp w: column (4 tile + w) 8 + g; gate in d[4c + e], up
  // in d[4c + 2 + e], for tokens 8c + 2t + e.
  const int j = (4 * tile + warp) * 8 + lane / 4;
  if (j >= u) return;
#pragma unroll
  for (int c = 0; c < N / 8; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int token = 8 * c + 2 * (lane % 4) + e;
      const float g = d[4 * c + e], uu = d[4 * c + 2 + e];
      if (token < m) y[int64_t(token) * u + j] = __float2bfloat16(g / (1.f + __expf(-g)) * uu);
    }
}

template <int N, int S, int KC, int PDL = 0>
void launch_cluster(const CUtensorMap& wm, const CUtensorMap& xm, int k, int u, int m, __nv_bfloat16* y,
                    cudaStream_t s) {
  using C = ClusterCfg<N, S, KC>;
  static bool once = [] {
    CK(cudaFuncSetAttribute(swab_cluster<N, S, KC, PDL>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    return true;
  }();
  (void)once;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((u + 31) / 32 * KC));
  cfg.blockDim = dim3(160);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = KC;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL > 0 ? 2 : 1;
  CK(cudaLaunchKernelEx(&cfg, swab_cluster<N, S, KC, PDL>, wm, xm, k, u, m, y));
}

// One thread per (token, column), float sums.
__global__ void reference(const __nv_bfloat16* w, const __nv_bfloat16* x, int k, int u, int m, float* y) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x, token = blockIdx.y;
  if (j >= u || token >= m) return;
  float g = 0, v = 0;
  for (int i = 0; i < k; ++i) {
    const float xi = __bfloat162float(x[int64_t(token) * k + i]);
    g += xi * __bfloat162float(w[int64_t(j) * k + i]);
    v += xi * __bfloat162float(w[int64_t(u + j) * k + i]);
  }
  y[int64_t(token) * u + j] = g / (1.f + expf(-g)) * v;
}

// Stacked [2U, K] as (K / ks, 8 rows, 2 halves, U / 8 groups[, ks slices]).
CUtensorMap weight_map(const void* base, int64_t k, int64_t u, int t, int ks = 1) {
  CUtensorMap mp;
  const cuuint64_t dims[5] = {cuuint64_t(k / ks), 8, 2, cuuint64_t(u / 8), cuuint64_t(ks)};
  const cuuint64_t strides[4] = {cuuint64_t(k * 2), cuuint64_t(u * k * 2), cuuint64_t(8 * k * 2),
                                 cuuint64_t(k / ks * 2)};
  const cuuint32_t box[5] = {kBk, 8, 2, cuuint32_t(4 * t / ks), cuuint32_t(ks)};
  const cuuint32_t es[5] = {1, 1, 1, 1, 1};
  if (encode_fn()(&mp, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, ks > 1 ? 5 : 4, const_cast<void*>(base), dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("weight map: encode failed\n");
    std::exit(1);
  }
  return mp;
}

// X [M, K] as (K / ks, M rows[, ks slices]); a box of (64, n[, ks]) lands
// as [slice][token][k], rows past M zero.
CUtensorMap x_map(const void* base, int64_t k, int m, int n, int ks = 1) {
  CUtensorMap mp;
  const cuuint64_t dims[3] = {cuuint64_t(k / ks), cuuint64_t(m), cuuint64_t(ks)};
  const cuuint64_t strides[2] = {cuuint64_t(k * 2), cuuint64_t(k / ks * 2)};
  const cuuint32_t box[3] = {kBk, cuuint32_t(n), cuuint32_t(ks)};
  const cuuint32_t es[3] = {1, 1, 1};
  if (encode_fn()(&mp, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, ks > 1 ? 3 : 2, const_cast<void*>(base), dims, strides, box,
                  es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("x map: encode failed\n");
    std::exit(1);
  }
  return mp;
}

}  // namespace

// The library's kernel on the probe's buffers: a HopperPrepared as
// hopper_prepare() builds it (stacked weights, silu, bf16 Y, no options).
decode::HopperPrepared lib_call(const void* w, const void* x, __nv_bfloat16* y, int k, int u, int m) {
  decode::HopperPrepared pr;
  decode::Params& p = pr.p;
  p.x = x;
  p.w = w;
  p.y = y;
  p.m = m;
  p.batch = 1;
  p.k = k;
  p.u = u;
  p.ldx = p.ldw = k;
  p.ldy = u;
  p.group = u;
  p.act = int(Activation::silu);
  p.alpha = 1.f;
  p.out_dtype = 0;
  p.warps = 1;
  pr.input = DType::bf16;
  pr.n = m <= 8 ? 8 : 16;
  pr.ctas_per_block = (u + 31) / 32;
  pr.grid = unsigned(pr.ctas_per_block);
  {
    const cuuint64_t dims[5] = {cuuint64_t(k), 8, 2, cuuint64_t(u / 8), 1};
    const cuuint64_t strides[4] = {cuuint64_t(2 * k), cuuint64_t(2 * int64_t(u) * k), cuuint64_t(16 * k),
                                   cuuint64_t(4 * int64_t(u) * k)};
    const cuuint32_t box[5] = {kBk, 8, 2, 4, 1};
    const cuuint32_t es[5] = {1, 1, 1, 1, 1};
    if (encode_fn()(&pr.wmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(w), dims, strides, box, es,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      std::exit(1);
  }
  {
    const cuuint64_t dims[3] = {cuuint64_t(k), cuuint64_t(m), 1};
    const cuuint64_t strides[2] = {cuuint64_t(2 * k), cuuint64_t(2 * int64_t(m) * k)};
    const cuuint32_t box[3] = {kBk, cuuint32_t(pr.n), 1};
    const cuuint32_t es[3] = {1, 1, 1};
    if (encode_fn()(&pr.xmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(x), dims, strides, box, es,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      std::exit(1);
  }
  return pr;
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(h, s);
  void* ws;
  CK(cudaMalloc(&ws, 32 << 20));
  cublasSetWorkspace(h, ws, 32 << 20);
  // T1S8: the probe's kernel; CnSs: K split over a cluster of n CTAs of s
  // stages each (swab_cluster), p / w: launched with PDL, weights before
  // the wait / every load after it; lib: the library's kernel
  // (decode_glu/decode_hopper.cu) launched as it launches it. X and the
  // weights rotate over `copies` copies (h77: X fixed or rotated timed the
  // same).
  // (h78's PDL variants, C1S8p, C1S8w and C2S6p, are at commit d0e807d.)
  // h90: K split over clusters of 3, whose 264 CTAs on 1024 x 2816 (88
  // tiles) put two on every one of the 132 SMs, each SM streaming 2/3 of
  // a tile's bytes (C2's 176 CTAs leave 44 SMs with two halves: a whole
  // tile, as T1S8's busiest SMs).
  const char* names[] = {"cuBLAS", "T1S8", "C2S8", "C2S4", "C3S8", "C3S6", "C3S4", "C4S4", "lib"};
  constexpr int kVariants = 9;
  std::printf("%-10s %3s |", "shape", "M");
  for (const char* n : names) std::printf(" %8s", n);
  std::printf("   (us per call)\n");
  for (const SmallShape& sh : kSmallShapes) {
    const int k = int(sh.k), u = int(sh.u);
    const int64_t bytes = 2 * sh.u * sh.k * 2;
    const std::vector<void*> bufs = rotated_buffers(bytes, 0);
    const int copies = int(bufs.size());
    for (void* b : bufs) fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(b), bytes / 2, 0x1234u);
    std::vector<__nv_bfloat16*> xs(copies);
    for (auto& x : xs) {
      CK(cudaMalloc(&x, 16 * sh.k * 2));
      fill_random<<<64, 256>>>(x, 16 * sh.k, 0x9876u);  // every copy the same values
    }
    __nv_bfloat16 *y, *yc;
    float* yr;
    CK(cudaMalloc(&y, 16 * sh.u * 2));
    CK(cudaMalloc(&yc, 16 * 2 * sh.u * 2));
    CK(cudaMalloc(&yr, 16 * sh.u * 4));
    CK(cudaDeviceSynchronize());
    std::vector<CUtensorMap> w1;
    for (void* b : bufs) w1.push_back(weight_map(b, sh.k, sh.u, 1));
    for (int m : {1, 4, 8, 9, 16}) {
      std::vector<CUtensorMap> x8, x16;
      std::vector<decode::HopperPrepared> lib;
      for (int i = 0; i < copies; ++i) {
        x8.push_back(x_map(xs[i], sh.k, m, 8));
        x16.push_back(x_map(xs[i], sh.k, m, 16));
        lib.push_back(lib_call(bufs[i], xs[i], y, k, u, m));
      }
      CK(decode::hopper_kernel_setup(lib[0]));
      auto launch = [&](int v, int c) {
        const int i = c % copies;
        const CUtensorMap& xm = m <= 8 ? x8[i] : x16[i];
#define DW_CLUSTER(S, KC, PDL)                                           \
  (m <= 8 ? launch_cluster<8, S, KC, PDL>(w1[i], xm, k, u, m, y, s) \
          : launch_cluster<16, S, KC, PDL>(w1[i], xm, k, u, m, y, s))
        switch (v) {
          case 0: {
            const float one = 1.f, zero = 0.f;
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2 * u, m, k, &one, bufs[i], CUDA_R_16BF, k, xs[i], CUDA_R_16BF,
                         k, &zero, yc, CUDA_R_16BF, 2 * u, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            break;
          }
          case 1:
            if (m <= 8) launch_swab<8, 1, 8, 1>(w1[i], xm, k, u, m, y, s);
            else launch_swab<16, 1, 8, 1>(w1[i], xm, k, u, m, y, s);
            break;
          case 2: DW_CLUSTER(8, 2, 0); break;
          case 3: DW_CLUSTER(4, 2, 0); break;
          case 4: DW_CLUSTER(8, 3, 0); break;
          case 5: DW_CLUSTER(6, 3, 0); break;
          case 6: DW_CLUSTER(4, 3, 0); break;
          case 7: DW_CLUSTER(4, 4, 0); break;
          default: CK(decode::hopper_kernel_launch(lib[i], s));
        }
#undef DW_CLUSTER
      };
      // Check every variant's Y against the float reference on copy 0.
      reference<<<dim3((u + 127) / 128, m), 128, 0, s>>>(static_cast<const __nv_bfloat16*>(bufs[0]), xs[0], k, u, m, yr);
      std::vector<float> ref(size_t(m) * u);
      CK(cudaMemcpyAsync(ref.data(), yr, ref.size() * 4, cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
      double worst = 0;
      for (int v = 1; v < kVariants; ++v) {
        CK(cudaMemsetAsync(y, 0xFF, size_t(m) * u * 2, s));  // NaN poison
        launch(v, 0);
        std::vector<__nv_bfloat16> got(size_t(m) * u);
        CK(cudaMemcpyAsync(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        for (size_t e = 0; e < got.size(); ++e) {
          const double err = std::fabs(double(__bfloat162float(got[e])) - ref[e]) / (1.0 + std::fabs(ref[e]));
          if (!(err <= 2e-2)) {
            std::printf("%s M=%d %s: Y[%zu, %zu] = %g, reference %g\n", sh.name, m, names[v], e / u, e % u,
                        double(__bfloat162float(got[e])), double(ref[e]));
            return 1;
          }
          worst = std::max(worst, err);
        }
      }
      std::printf("%-10s %3d |", sh.name, m);
      float t[kVariants];
      for (int v = 0; v < kVariants; ++v) {
        t[v] = replay_us(s, 20, [&](int c) { launch(v, c); });
        std::printf(" %8.2f", t[v]);
      }
      std::printf("   (Y checked, worst rel. error %.1e)\n", worst);
    }
    for (void* b : bufs) CK(cudaFree(b));
    for (auto x : xs) CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(yc));
    CK(cudaFree(yr));
  }
  return 0;
}
