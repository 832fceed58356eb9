// Probe h82 (docs/notes/quantized-decode.md): int4 weights as wgmma's A
// operand from registers, dequantized from a TMA ring, with X as wgmma's B
// operand from the same ring.
//
// The question: the register-load decode kernel (quant_decode.cuh) spends
// its issue slots on X at M > 8 (each n-tile's X fragment is a load and four
// permutes per weight word: h81) and loses to bf16 at M = 64 (~0.3x). Here
// X costs no instruction at all: a tensor map brings it into shared memory
// and the tensor core reads it there. The words come by TMA too (a 128-byte
// swizzled box of 32 words per row per stage); each lane reads a row's 16
// bytes (two k16 steps), takes byte t of each word (the two elements its A
// fragment holds at k = 2t, 2t + 1 of that word's 8), and dequantizes them
// with the library's rounding (MAGIC + q by an AND-OR, q exact, q * s + b
// rounded once to bf16). Per lane, per weight byte: a shift, a byte
// permute, the AND-OR and two pair FMAs; no X permutes, no X loads.
//
// Prediction (8B, H200): at M = 1 ~22 issue slots per warp per 256 weights
// against the library's ~37 (h79: ~300 per 2048), so up to ~1.4x faster if
// issue binds; at M = 64 the tensor core's share (m64n64k16: 32 cycles per
// warpgroup step) and the weights' bytes bind instead: ~20-30 us at 8B
// against ~60 us for the bf16 GEMM (>= 2x) and ~3x the library's kernel.
//
// Variants <N, CW, T, SG>: N tokens per wgmma (8, 16, 32, 64), CW consumer
// warpgroups per CTA, T 64-row tiles per warpgroup (a CTA owns 32 CW T
// output columns over all of K; one producer warp), SG k16 steps per wgmma
// group (two buffers of A registers; the group before retired once per SG
// steps). Y is checked against the library's register kernel (other sums'
// order, so to a tolerance) before timing. The first run (SG = 1: a wait
// per step) is docs/notes/data/h82-quant-wgmma-probe-sg1.txt.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//     scripts/experiments/probes/quant_wgmma.cu -lcublas -lcuda -o quant_wgmma
// (scripts/experiments/probe-decode-small.sh qwgmma builds and runs it.)
// Standalone, not library code.
#include <cublas_v2.h>

#include <cmath>
#include <cstring>

#include "gatedmlp/gatedmlp.hpp"
#include "h75_common.cuh"
#include "quant_decode/quant_decode.cuh"
#include "sm90_gemm_glu/hopper.cuh"

using namespace gatedmlp;
using namespace gatedmlp::quant_decode;

namespace {

constexpr int kBk = 256;  // k per stage: 32 words (128 bytes) per row, 4 groups of 64

template <int N, int CW, int T>
struct Cfg {
  static constexpr int kRows = 64 * CW * T;          // weight rows per CTA (gate and up)
  static constexpr int kCols = kRows / 2;            // output columns per CTA
  static constexpr int kGroups = kRows / 16;         // groups of 8 columns
  static constexpr int kW = kRows * 128;             // words per stage
  static constexpr int kX = N * kBk * 2;             // X per stage: 4 slabs of [N][64]
  static constexpr int kStage = kW + kX;
  static constexpr int kS = (200 * 1024) / kStage < 8 ? (200 * 1024) / kStage : 8;
  static constexpr int kThreads = 128 * CW + 32;
  static constexpr int kSmem = kS * kStage + 2 * kS * 8 + 1024;
  static_assert(kStage % 1024 == 0, "stages 1024-byte aligned");
  static_assert(kS >= 2, "at least two stages");
};

// D[64 x N] += A[64 x 16] (registers) * B[N x 16]^T (shared memory, K-major,
// 128-byte swizzle).
template <int N>
__device__ __forceinline__ void wgmma_ra(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  } else {
    static_assert(N == 64, "N = 8, 16, 32 or 64");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
}

// Keeps registers an asynchronous wgmma reads alive (and unmoved) until
// after the wait that retires it.
__device__ __forceinline__ void keep(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Byte `sel` of word w (elements 2t, 2t + 1 of its 8) as the bf16 pair
// q * s + b, rounded once (the library's packed int4 recipe).
__device__ __forceinline__ uint32_t deq(uint32_t w, uint32_t sel, uint32_t s, uint32_t b) {
  using C = dq::Consts<__nv_bfloat16>;
  const uint32_t v = dq::and_or(dq::prmt(w, w >> 4, sel), 0x000F000Fu, C::kMagic);
  const uint32_t q = dq::fma2<__nv_bfloat16>(v, C::kOne, C::kNegMagic);
  return dq::fma2<__nv_bfloat16>(q, s, b);
}

// Element i (0-3) of four bf16 in a uint2, as a pair.
__device__ __forceinline__ uint32_t pair_of(uint2 v, int i) {
  const uint32_t r = i < 2 ? v.x : v.y;
  return dq::prmt(r, r, (i & 1) ? 0x3232u : 0x1010u);
}

// Stacked int4 g64: words [2U][K/8], bf16 scales and biases [2U][K/64],
// bf16 X [M][K]; K % 256 == 0, U % (32 CW T) == 0. silu, bf16 Y [M][U].
template <int N, int CW, int T, int SG>
__global__ void __launch_bounds__(Cfg<N, CW, T>::kThreads)
    qwgmma(const __grid_constant__ Params qp, const __grid_constant__ CUtensorMap wmap,
           const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gatedmlp::sm90;
  using C = Cfg<N, CW, T>;
  static_assert(SG % 2 == 0 && 16 % SG == 0, "SG: 2, 4, 8 or 16 k16 steps (whole 16-byte chunks)");
  constexpr int S = C::kS;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * C::kStage);
  uint64_t* empty = full + S;
  const decode::Params& p = qp.d;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nkb = int(p.k / kBk);
  const int g0 = blockIdx.x * C::kGroups;  // first group of 8 columns
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], CW);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == 4 * CW) {
    if (lane == 0) {
      tma_prefetch_map(&wmap);
      tma_prefetch_map(&xmap);
      for (int kb = 0; kb < nkb; ++kb) {
        const int s = kb % S;
        if (kb >= S) mbar_wait(&empty[s], ((kb / S) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], C::kStage);
        unsigned char* st = smem + s * C::kStage;
        tma_load_5d(st, &wmap, &full[s], kb * 32, 0, 0, g0, 0);
        tma_load_3d(st + C::kW, &xmap, &full[s], 0, 0, kb * 4);
      }
    }
    return;
  }
  const int wg = warp / 4, w = warp % 4, g = lane / 4, t = lane % 4;
  const uint32_t sel = uint32_t(t) | (uint32_t(t + 4) << 8);
  // Tile tau's rows of this lane: group G = 4 (wg T + tau) + w, its gate
  // row g (CTA row 16 G + g) and up row g (16 G + 8 + g).
  const int64_t groups = qp.groups;
  const unsigned short* sp = static_cast<const unsigned short*>(qp.scales);
  const unsigned short* bp = static_cast<const unsigned short*>(qp.biases);
  int64_t srow[T][2];
#pragma unroll
  for (int tau = 0; tau < T; ++tau) {
    const int64_t j = 8 * int64_t(g0 + 4 * (wg * T + tau) + w) + g;
    srow[tau][0] = j * groups;
    srow[tau][1] = (p.u + j) * groups;
  }
  uint2 sc[T][2], bc[T][2];  // this stage's 4 scales / biases per row
#pragma unroll
  for (int tau = 0; tau < T; ++tau)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[tau][h] = __ldg(reinterpret_cast<const uint2*>(sp + srow[tau][h]));
      bc[tau][h] = __ldg(reinterpret_cast<const uint2*>(bp + srow[tau][h]));
    }
  float d[T][N / 2];
#pragma unroll
  for (int tau = 0; tau < T; ++tau)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[tau][i] = 0.f;
  // Two buffers of SG k16 steps' A registers: SG steps are dequantized,
  // their wgmmas issued as one group, and the group before retired, so the
  // tensor core's latency is waited on once per SG steps.
  uint32_t a[2][SG][T][4];
#pragma unroll
  for (int x = 0; x < 2; ++x)
#pragma unroll
    for (int i = 0; i < SG; ++i)
#pragma unroll
      for (int tau = 0; tau < T; ++tau)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[x][i][tau][r] = 0u;
  int prev = -1;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % S;
    // The next stage's scales, while this one's are used.
    uint2 nsc[T][2], nbc[T][2];
    const int nk = kb + 1 < nkb ? kb + 1 : kb;
#pragma unroll
    for (int tau = 0; tau < T; ++tau)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        nsc[tau][h] = __ldg(reinterpret_cast<const uint2*>(sp + srow[tau][h] + 4 * nk));
        nbc[tau][h] = __ldg(reinterpret_cast<const uint2*>(bp + srow[tau][h] + 4 * nk));
      }
    mbar_wait(&full[s], (kb / S) & 1);
    const unsigned char* st = smem + s * C::kStage;
    const uint32_t xlo = desc_lo(smem_addr(st + C::kW));
#pragma unroll
    for (int grp = 0; grp < 16 / SG; ++grp) {
      const int buf = grp & 1;
#pragma unroll
      for (int i = 0; i < SG; i += 2) {  // pairs of k16 steps: one 16-byte chunk per row
        const int sp2 = (grp * SG + i) / 2;
        uint4 wv[T][2];
        uint32_t ps[T][2], pb[T][2];
#pragma unroll
        for (int tau = 0; tau < T; ++tau)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = 16 * (4 * (wg * T + tau) + w) + 8 * h + g;
            wv[tau][h] = *reinterpret_cast<const uint4*>(st + row * 128 + ((sp2 ^ g) * 16));
            ps[tau][h] = pair_of(sc[tau][h], sp2 / 2);
            pb[tau][h] = pair_of(bc[tau][h], sp2 / 2);
          }
#pragma unroll
        for (int e = 0; e < 2 && i + e < SG; ++e) {
          uint32_t(&A)[T][4] = a[buf][i + e];
#pragma unroll
          for (int tau = 0; tau < T; ++tau) {
            const uint32_t lo_g = e ? wv[tau][0].z : wv[tau][0].x, hi_g = e ? wv[tau][0].w : wv[tau][0].y;
            const uint32_t lo_u = e ? wv[tau][1].z : wv[tau][1].x, hi_u = e ? wv[tau][1].w : wv[tau][1].y;
            A[tau][0] = deq(lo_g, sel, ps[tau][0], pb[tau][0]);
            A[tau][1] = deq(lo_u, sel, ps[tau][1], pb[tau][1]);
            A[tau][2] = deq(hi_g, sel, ps[tau][0], pb[tau][0]);
            A[tau][3] = deq(hi_u, sel, ps[tau][1], pb[tau][1]);
          }
        }
      }
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < SG; ++i) {
        const int step = grp * SG + i;
        const uint64_t bdesc = desc_from_lo(xlo + ((step / 4) * N * 128 + (step % 4) * 32) / 16);
#pragma unroll
        for (int tau = 0; tau < T; ++tau) wgmma_ra<N>(d[tau], a[buf][i][tau], bdesc);
      }
      wgmma_commit();
      wgmma_wait<1>();
#pragma unroll
      for (int i = 0; i < SG; ++i)
#pragma unroll
        for (int tau = 0; tau < T; ++tau) keep(a[buf ^ 1][i][tau]);
      if (grp == 0) {
        if (prev >= 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[prev]);
        prev = s;
      }
    }
#pragma unroll
    for (int tau = 0; tau < T; ++tau)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[tau][h] = nsc[tau][h];
        bc[tau][h] = nbc[tau][h];
      }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int tau = 0; tau < T; ++tau) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[tau][i])::"memory");
    const int64_t j = 8 * int64_t(g0 + 4 * (wg * T + tau) + w) + g;
#pragma unroll
    for (int cc = 0; cc < N / 8; ++cc)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = 8 * cc + 2 * t + e;
        if (token < p.m) decode::finish(p, d[tau][4 * cc + e], d[tau][4 * cc + 2 + e], j, 0, token);
      }
  }
#endif
}

// Words [2U][K/8] as (K/8 words, 8 rows, 2 halves, U/8 groups, 1): a box of
// (32, 8, 2, G, 1) lands as [group][half][row][32 words], 128-byte swizzled.
CUtensorMap word_map(const void* base, int64_t k, int64_t u, int groups) {
  CUtensorMap mp;
  const cuuint64_t rb = cuuint64_t(k / 2);  // bytes per row
  const cuuint64_t dims[5] = {cuuint64_t(k / 8), 8, 2, cuuint64_t(u / 8), 1};
  const cuuint64_t strides[4] = {rb, cuuint64_t(u) * rb, 8 * rb, cuuint64_t(2 * u) * rb};
  const cuuint32_t box[5] = {32, 8, 2, cuuint32_t(groups), 1};
  const cuuint32_t es[5] = {1, 1, 1, 1, 1};
  if (encode_fn()(&mp, CU_TENSOR_MAP_DATA_TYPE_UINT32, 5, const_cast<void*>(base), dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("word map: encode failed\n");
    std::exit(1);
  }
  return mp;
}

// X [M][K] as (64, M, K/64): a box of (64, N, 4) lands as [slab][token][64],
// rows past M zero.
CUtensorMap x_map(const void* base, int64_t k, int m, int n) {
  CUtensorMap mp;
  const cuuint64_t dims[3] = {64, cuuint64_t(m), cuuint64_t(k / 64)};
  const cuuint64_t strides[2] = {cuuint64_t(k * 2), 128};
  const cuuint32_t box[3] = {64, cuuint32_t(n), 4};
  const cuuint32_t es[3] = {1, 1, 1};
  if (encode_fn()(&mp, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("x map: encode failed\n");
    std::exit(1);
  }
  return mp;
}

template <int N, int CW, int T, int SG>
void launch_q(const Params& q, const CUtensorMap& wm, const CUtensorMap& xm, cudaStream_t s) {
  using C = Cfg<N, CW, T>;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(qwgmma<N, CW, T, SG>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    set = true;
  }
  qwgmma<N, CW, T, SG><<<unsigned(q.d.u / C::kCols), C::kThreads, C::kSmem, s>>>(q, wm, xm);
}

struct ProbeShape {
  const char* name;
  int64_t k, u;
};
constexpr ProbeShape kShapes[] = {{"8b", 4096, 14336},       {"70b", 8192, 28672},      {"qwen3-32b", 5120, 25600},
                                  {"2048x8192", 2048, 8192}, {"1024x2816", 1024, 2816}};
constexpr int kMaxM = 64;

struct Copy {
  uint32_t* words;
  __nv_bfloat16 *scales, *biases;
};

__global__ void fill_words(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    p[i] = h ^ (h >> 13);
  }
}

__global__ void fill_scales(__nv_bfloat16* s, __nv_bfloat16* b, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    s[i] = __float2bfloat16(0.001f + 0.01f * float((i * 37) % 101) / 101.f);
    b[i] = __float2bfloat16(-0.04f * float((i * 53) % 97) / 97.f);
  }
}

Params make_params(const Copy& c, const void* x, void* y, int64_t k, int64_t u, int m) {
  Params q{};
  decode::Params& p = q.d;
  p.x = x;
  p.w = c.words;
  p.y = y;
  p.m = m;
  p.batch = 1;
  p.k = k;
  p.u = u;
  p.ldx = k;
  p.ldw = k / 8;
  p.ldy = u;
  p.group = u;  // stacked: gate rows, then up rows
  p.act = int(gatedmlp::Activation::silu);
  p.alpha = 1.f;
  p.warps = 4;
  q.scales = c.scales;
  q.biases = c.biases;
  q.groups = k / 64;
  q.group_shift = 6;
  q.scale_dtype = 0;
  return q;
}

float bf(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(h, s);
  void* ws;
  CK(cudaMalloc(&ws, 32 << 20));
  cublasSetWorkspace(h, ws, 32 << 20);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // Variants: CW consumer warpgroups, T tiles each, SG k16 steps per wgmma group.
  constexpr int kV = 6;
  const char* vnames[kV] = {"w1t1s2", "w1t1s4", "w1t1s8", "w2t1s4", "w1t2s4", "w2t2s4"};
  std::printf("%-10s %3s | %8s %8s %8s |", "shape", "M", "cublas16", "lib", "lib-cg");
  for (const char* v : vnames) std::printf(" %8s", v);
  std::printf(" | (us per call; then TB/s of int4 words + scales + biases; Y check)\n");
  for (const ProbeShape& sh : kShapes) {
    const int64_t rows = 2 * sh.u, words = rows * sh.k / 8, groups = rows * sh.k / 64;
    const int64_t bytes = words * 4 + groups * 4;
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const int copies = int(std::max<int64_t>(2, 3 * int64_t(l2) / bytes + 1));
    std::vector<Copy> cs(copies);
    for (Copy& c : cs) {
      CK(cudaMalloc(&c.words, words * 4));
      CK(cudaMalloc(&c.scales, groups * 2));
      CK(cudaMalloc(&c.biases, groups * 2));
      fill_words<<<1024, 256>>>(c.words, words, 0x1234u);
      fill_scales<<<256, 256>>>(c.scales, c.biases, groups);
    }
    // bf16 weights for the cuBLAS yardstick (values irrelevant to its time).
    const int64_t wbytes = rows * sh.k * 2;
    const std::vector<void*> wb = rotated_buffers(wbytes, 0);
    __nv_bfloat16 *x, *y1, *y2, *yc;
    CK(cudaMalloc(&x, kMaxM * sh.k * 2));
    CK(cudaMalloc(&y1, kMaxM * sh.u * 2));
    CK(cudaMalloc(&y2, kMaxM * sh.u * 2));
    CK(cudaMalloc(&yc, kMaxM * rows * 2));
    fill_random<<<64, 256>>>(x, kMaxM * sh.k, 0x9876u);
    CK(cudaDeviceSynchronize());
    std::vector<CUtensorMap> wm1, wm2, wm4;  // boxes of 4, 8, 16 groups
    for (Copy& c : cs) {
      wm1.push_back(word_map(c.words, sh.k, sh.u, 4));
      wm2.push_back(word_map(c.words, sh.k, sh.u, 8));
      wm4.push_back(word_map(c.words, sh.k, sh.u, 16));
    }
    for (int m : {1, 4, 8, 16, 32, 64}) {
      const int n = m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
      const CUtensorMap xm = x_map(x, sh.k, m, n);
      const int nt = n / 8;
      auto lib = [&](int cg, const Params& q) {
        switch (nt * 10 + cg) {
          case 11: return launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2>(q, s);
          case 12: return launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2, false, 2>(q, s);
          case 21: return launch_kernel<__nv_bfloat16, kInt4, true, 2, 1, 2>(q, s);
          case 24: return launch_kernel<__nv_bfloat16, kInt4, true, 2, 1, 1, false, 4>(q, s);
          case 41: return launch_kernel<__nv_bfloat16, kInt4, true, 4, 1, 1>(q, s);
          default: return launch_kernel<__nv_bfloat16, kInt4, true, 8, 1, 1>(q, s);
        }
      };
      const int cg = nt == 1 ? 2 : nt == 2 ? 4 : 1;
      auto variant = [&](int v, int c, void* y) {
        const Params q = make_params(cs[c], x, y, sh.k, sh.u, m);
#define QW(CW, T, SG, MAPS)                                      \
  switch (n) {                                                   \
    case 8: launch_q<8, CW, T, SG>(q, MAPS[c], xm, s); break;   \
    case 16: launch_q<16, CW, T, SG>(q, MAPS[c], xm, s); break; \
    case 32: launch_q<32, CW, T, SG>(q, MAPS[c], xm, s); break; \
    default: launch_q<64, CW, T, SG>(q, MAPS[c], xm, s); break; \
  }
        switch (v) {
          case 0: QW(1, 1, 2, wm1); break;
          case 1: QW(1, 1, 4, wm1); break;
          case 2: QW(1, 1, 8, wm1); break;
          case 3: QW(2, 1, 4, wm2); break;
          case 4: QW(1, 2, 4, wm2); break;
          default: QW(2, 2, 4, wm4); break;
        }
#undef QW
      };
      // The library's Y (ungrouped) on copy 0, then each variant's.
      CK(cudaMemset(y1, 0xFF, kMaxM * sh.u * 2));
      CK(lib(1, make_params(cs[0], x, y1, sh.k, sh.u, m)));
      CK(cudaStreamSynchronize(s));
      std::vector<uint16_t> ref(size_t(m * sh.u)), got(ref.size());
      CK(cudaMemcpy(ref.data(), y1, ref.size() * 2, cudaMemcpyDeviceToHost));
      double worst = 0;
      bool nan = false;
      for (int v = 0; v < kV; ++v) {
        CK(cudaMemset(y2, 0xFF, kMaxM * sh.u * 2));
        variant(v, 0, y2);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(got.data(), y2, got.size() * 2, cudaMemcpyDeviceToHost));
        double amax = 0;
        for (uint16_t r : ref) amax = std::max(amax, double(std::fabs(bf(r))));
        for (size_t i = 0; i < ref.size(); ++i) {
          const float a = bf(ref[i]), b = bf(got[i]);
          if (!std::isfinite(b)) nan = true;
          worst = std::max(worst, double(std::fabs(a - b)) / (amax + 1e-6));
        }
      }
      float tv[kV];
      for (int v = 0; v < kV; ++v) tv[v] = replay_us(s, 2 * copies, [&](int c) { variant(v, c % copies, y2); });
      const float t1 = replay_us(s, 2 * copies, [&](int c) {
        (void)lib(1, make_params(cs[c % copies], x, y1, sh.k, sh.u, m));
      });
      const float tg = cg > 1 ? replay_us(s, 2 * copies, [&](int c) {
        (void)lib(cg, make_params(cs[c % copies], x, y1, sh.k, sh.u, m));
      })
                              : t1;
      const float tc = replay_us(s, int(2 * wb.size()), [&](int c) {
        const float one = 1.f, zero = 0.f;
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), m, int(sh.k), &one, wb[c % wb.size()], CUDA_R_16BF,
                     int(sh.k), x, CUDA_R_16BF, int(sh.k), &zero, yc, CUDA_R_16BF, int(rows), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      });
      auto tbs = [&](float us) { return bytes / us * 1e-6; };
      std::printf("%-10s %3d | %8.2f %8.2f %8.2f |", sh.name, m, tc, t1, tg);
      for (float t : tv) std::printf(" %8.2f", t);
      std::printf(" | %.2f %.2f |", tbs(t1), tbs(tg));
      for (float t : tv) std::printf(" %.2f", tbs(t));
      std::printf(" TB/s | worst |dY| / max|Y| %.1e%s\n", worst, nan ? " NON-FINITE" : "");
    }
    for (Copy& c : cs) {
      CK(cudaFree(c.words));
      CK(cudaFree(c.scales));
      CK(cudaFree(c.biases));
    }
    for (void* b : wb) CK(cudaFree(b));
    CK(cudaFree(x));
    CK(cudaFree(y1));
    CK(cudaFree(y2));
    CK(cudaFree(yc));
  }
  std::printf("SMs %d\n", sms);
  return 0;
}
