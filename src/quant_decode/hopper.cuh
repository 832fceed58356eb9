// The quantized decode kernel's Hopper form (sm_90a): int4, MXFP4, int8 and
// FP8 gate/up + GLU for up to 128 rows of X per launch (N = 32, 64 or 128
// tokens per wgmma; FP8 with two consumer warpgroups runs 65-128 rows in two
// passes of 64: hopper_launch.cpp).
//
// Why: the register-load kernel (quant_decode.cuh) loads X into registers
// for every n-tile and permutes it to the pairs the words come out in; at
// 32-64 rows that is most of its instructions, and it ran at ~0.4x the bf16
// GEMM at M = 64. Here X costs no instruction: a tensor map brings it into
// shared memory and wgmma reads it there as the B operand, while the
// weights, dequantized in registers, are its A operand (swap AB, as in the
// 16-bit decode kernel's Hopper form, decode_glu/decode_hopper.cu).
// Measured in a probe (docs/notes/quantized-decode.md, h82): 2.0-3.6x the
// register kernel at M = 32 and 64, 1.2-1.4x cuBLAS's bf16 GEMM at M = 64
// on 8B, 70B, Qwen3-32B and 2048 x 8192. Below 17 rows it is slower than
// the register kernel for 4-bit words (why is not measured yet) and faster
// for 8-bit ones from M = 9-16 (hopper_min_m(), h83).
//
// The ring: one producer thread issues per stage one box (4-bit) or two
// (8-bit) of 128 bytes (128-byte swizzled) of each of the CTA's 64 * W
// weight rows and four boxes of 64 k x N tokens of X (zero past M). Warp w of
// consumer warpgroup c holds A rows 16 w ... 16 w + 15 of the group of 8
// columns 4 c + w: the first half's 8 rows, then the second half's, so lane
// (g, t) ends with both sums of one column. Per pair of k16 steps a lane
// reads its two rows' 16 bytes (words 4 i ... 4 i + 3) and takes byte t of
// each word: elements 2t, 2t + 1 of that word's 8, exactly the k the A
// fragment holds. Each byte becomes a pair by a byte permute with the word
// shifted by 4, then the register kernel's packed recipe (dequant.cuh: for
// int4 the AND-OR onto the magic exponent and two pair FMAs, q exact, then
// q * s + b rounded once to X's type), so the weights are those of every
// other path.
// 8-bit words: the 16 bytes of a row's k16 step hold the fragment's k 2t,
// 2t + 1 in their 4-byte word t / 2 and k 2t + 8, 2t + 9 in word 2 + t / 2;
// a lane loads those two words of each of its rows and one byte permute
// gathers its four bytes, in the order the recipe wants them (int8: the
// fp32 one, dq::affine8, as the register kernel; FP8: the exact e4m3 pairs,
// Dequant<T, kFp8>). FP8's scales go on the fp32 sums as in the register
// kernel: each 128 k of a row (its block, or all of K under one scale)
// accumulates in registers of its own, added times its scale into the sums
// before the next block's first wgmma, after a wait for all of them (ptxas
// serializes every wgmma of a kernel whose other instructions read
// accumulators that may be in flight); the next block's words are
// dequantized while the last group of the block before runs.
// SG k16 steps are dequantized, their wgmmas issued as one group, and the
// group before retired (two buffers of A registers), so the tensor core's
// latency is waited on once per SG steps.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/allow_smem.hpp"
#include "decode_glu/epilogue.cuh"
#include "quant_decode/dequant.cuh"
#include "quant_decode/hopper.hpp"
#include "sm90_gemm_glu/hopper.cuh"

namespace gatedmlp::quant_decode {

namespace hopper_detail {

template <int N, int W, int RB>
struct Ring {
  static constexpr int kWords = 64 * W * RB;                  // bytes of words per stage: RB per row
  static constexpr int kStage = hopper_stage_bytes(N, W, RB);  // then X: 4 slabs of [N][64]
  static constexpr int kStages = hopper_stages(N, W, RB);
  static constexpr int kThreads = 128 * W + 32;
  static constexpr int kSmem = kStages * kStage + 2 * kStages * 8 + 1024 /* alignment slack */;
  static constexpr int kSteps = W == 1 ? 8 : 4;            // SG: k16 steps per wgmma group
  static_assert(kStage % 1024 == 0, "stages must stay 1024-byte aligned");
  // N = 128 (65-128 rows in one pass): a stage holds 64 KB of X, so two.
  static_assert(kStages >= (N == 128 ? 2 : 3), "a ring of at least three stages (two at N = 128)");
};

// D[64 x N] (+)= A[64 x 16] (registers) * B[N x 16]^T (shared memory,
// K-major, 128-byte swizzle); ACC false: D is overwritten. Thread t of the
// warpgroup holds D(row, col) in d[i] for row = 16 (t / 32) + (t % 32) / 4 +
// 8 ((i / 2) % 2), col = 8 (i / 4) + 2 (t % 4) + i % 2.
template <typename T, int N, bool ACC = true>
__device__ __forceinline__ void wgmma_ra(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
#define GATEDMLP_QH_ACC8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), \
                            "+f"(d[o + 6]), "+f"(d[o + 7])
#define GATEDMLP_QH_WGMMA(TYPES)                                                                                   \
  if constexpr (N == 32)                                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES                                              \
                 " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19},"  \
                 " %20, p, 1, 1, 0;\n}"                                                                            \
                 : GATEDMLP_QH_ACC8(0), GATEDMLP_QH_ACC8(8)                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(ACC)));                             \
  else if constexpr (N == 64)                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES                                              \
                 " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20," \
                 " %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}" \
                 : GATEDMLP_QH_ACC8(0), GATEDMLP_QH_ACC8(8), GATEDMLP_QH_ACC8(16), GATEDMLP_QH_ACC8(24)            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(ACC)));                             \
  else                                                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " {"                                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "           \
                 "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "           \
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "           \
                 "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"\
                 : GATEDMLP_QH_ACC8(0), GATEDMLP_QH_ACC8(8), GATEDMLP_QH_ACC8(16), GATEDMLP_QH_ACC8(24),           \
                   GATEDMLP_QH_ACC8(32), GATEDMLP_QH_ACC8(40), GATEDMLP_QH_ACC8(48), GATEDMLP_QH_ACC8(56)          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(ACC)));
  static_assert(N == 32 || N == 64 || N == 128, "N = 32, 64 or 128 tokens");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    GATEDMLP_QH_WGMMA("bf16.bf16")
  } else {
    GATEDMLP_QH_WGMMA("f16.f16")
  }
#undef GATEDMLP_QH_WGMMA
#undef GATEDMLP_QH_ACC8
}

// Bytes of a weight row per stage (hopper_row_bytes(), usable in device code).
template <int FMT>
inline constexpr int kRowBytes = kHopperBk * (FMT == kInt8 || FMT == kFp8 ? 8 : 4) / 8;

// Keeps A registers an asynchronous wgmma reads alive, unmoved, until after
// the wait that retires it.
__device__ __forceinline__ void keep(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Byte `sel` of word w (elements 2t, 2t + 1 of its 8) with the first in
// bits 0-3 and the second in bits 16-19, as the packed recipes take a pair
// (dq::affine4_pair, dq::mxfp4_pair).
__device__ __forceinline__ uint32_t byte_pair(uint32_t w, uint32_t sel) { return dq::prmt(w, w >> 4, sel); }

}  // namespace hopper_detail

// FMT kInt4 / kInt8: affine, scales and biases of X's dtype, GS elements
// per group (32, 64 or 128); kMxfp4 (bf16 X): e2m1 values, an e8m0 scale
// per 32 (GS = 32); kFp8: e4m3fn, float scales per 128 k or all of K and
// per row, 128 rows or all rows (Params; GS = 128, the sums' blocks). W
// consumer warpgroups; N tokens per wgmma.
template <typename T, int FMT, int N, int W, int GS>
__global__ void __launch_bounds__(hopper_detail::Ring<N, W, hopper_detail::kRowBytes<FMT>>::kThreads)
    quant_hopper_kernel(const __grid_constant__ Params qp, const __grid_constant__ CUtensorMap wmap,
                        const __grid_constant__ CUtensorMap xmap, int ctas_per_block) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gatedmlp::sm90;
  using namespace hopper_detail;
  constexpr bool kMx = FMT == kMxfp4, kF8 = FMT == kFp8, k8 = FMT == kInt8 || kF8;
  constexpr int RB = kRowBytes<FMT>;
  using R = Ring<N, W, RB>;
  constexpr int S = R::kStages, SG = R::kSteps;
  constexpr int kGroups = kHopperBk / GS;  // scale groups per stage (affine, MXFP4)
  constexpr int kBox = 64 * W * 128;       // bytes of one 128-byte box of every row
  static_assert(FMT == kInt4 || FMT == kInt8 || (kMx && GS == 32 && std::is_same_v<T, __nv_bfloat16>) ||
                    (kF8 && GS == 128),
                "int4 / int8, MXFP4 with bf16 x, FP8 in 128-k blocks of sums");
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * R::kStage);
  uint64_t* empty = full + S;
  const decode::Params& p = qp.d;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nkb = static_cast<int>((p.k + kHopperBk - 1) / kHopperBk);
  // This CTA's block of G columns and its first group of 8 in it.
  const int block = blockIdx.x / ctas_per_block;
  const int g0 = 4 * W * (blockIdx.x % ctas_per_block);
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], W);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == 4 * W) {
    // The producer: one thread issues every stage's boxes.
    if (lane == 0) {
      tma_prefetch_map(&wmap);
      tma_prefetch_map(&xmap);
      for (int kb = 0; kb < nkb; ++kb) {
        const int s = kb % S;
        if (kb >= S) mbar_wait(&empty[s], ((kb / S) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], R::kStage);
        unsigned char* st = smem + s * R::kStage;
#pragma unroll
        for (int b = 0; b < RB / 128; ++b) tma_load_5d(st + b * kBox, &wmap, &full[s], kb * RB + 128 * b, 0, 0, g0, block);
#pragma unroll
        for (int i = 0; i < 4; ++i) tma_load_3d(st + R::kWords + i * N * 128, &xmap, &full[s], kb * kHopperBk + 64 * i, 0, 0);
      }
    }
    return;
  }
  const int wg = warp / 4, w = warp % 4, g = lane / 4, t = lane % 4;
  // 4-bit: byte t of a word (elements 2t, 2t + 1), and its neighbour 4 up.
  // 8-bit: from the step's words t / 2 and 2 + t / 2 (bytes 0-3, 4-7), the
  // lane's k 2t, 2t + 1, 2t + 8, 2t + 9 (int8), or 2t, 2t + 8, 2t + 1,
  // 2t + 9 (FP8: its recipe pairs bytes 0 and 2, 1 and 3).
  const uint32_t t2 = 2 * uint32_t(t % 2);
  const uint32_t sel = !k8   ? uint32_t(t) | (uint32_t(t + 4) << 8)
                       : kF8 ? t2 | ((t2 + 4) << 4) | ((t2 + 1) << 8) | ((t2 + 5) << 12)
                             : t2 | ((t2 + 1) << 4) | ((t2 + 4) << 8) | ((t2 + 5) << 12);
  // Lane (g, t): column c of the block (its group 4 wg + w of the CTA), the
  // block's first-half row c and second-half row c (fused_row()); columns
  // past the block (G not a multiple of 32 W) read the last one's scales
  // and are not written.
  const int64_t group = p.group;
  const int64_t c = 8 * int64_t(g0 + 4 * wg + w) + g;
  const int64_t cc = c < group ? c : group - 1;
  const int64_t ng = qp.groups;
  constexpr int kScaleBytes = kMx ? 1 : 2;
  const unsigned char* srow[2];
  const unsigned char* brow[2];
  int64_t f8row[2];  // FP8: the rows' first scales (Params::row_shift: rows per scale)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = (2 * int64_t(block) + h) * group + cc;
    srow[h] = static_cast<const unsigned char*>(qp.scales) + row * ng * kScaleBytes;
    brow[h] = kMx || kF8 ? nullptr : static_cast<const unsigned char*>(qp.biases) + row * ng * kScaleBytes;
    f8row[h] = (row >> qp.row_shift) * ng;
  }
  // A stage's affine or e8m0 scales (and biases) of both rows, as loaded
  // (two 16-bit or four e8m0 per register): one vector each
  // (hopper_blocker(): K % 256 == 0 and the arrays aligned to it); the next
  // stage's loaded while this one's are used. FP8: its two 128-k blocks'
  // scales of both rows, as floats.
  constexpr int kStageBytes = kGroups * kScaleBytes;  // 4, 8 or 16
  constexpr int kRegs = kF8 ? 1 : kStageBytes / 4;
  uint32_t sv[2][kRegs] = {}, bv[2][kRegs] = {};
  float fsc[2][2] = {};  // FP8: [block of the stage][row]
  auto load_vec = [](const unsigned char* p, uint32_t (&v)[kRegs]) {
    if constexpr (kRegs == 4) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else if constexpr (kRegs == 2) {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
      v[0] = x.x, v[1] = x.y;
    } else {
      v[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    }
  };
  auto load_scales = [&](int kb, uint32_t (&s2)[2][kRegs], uint32_t (&b2)[2][kRegs], float (&f2)[2][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kF8) {
#pragma unroll
        for (int b = 0; b < 2; ++b)
          f2[b][h] = gatedmlp::detail::load_float(qp.scales, qp.scale_dtype,
                                                   f8row[h] + ((int64_t(2 * kb + b) << 7) >> qp.group_shift));
      } else {
        load_vec(srow[h] + int64_t(kb) * kStageBytes, s2[h]);
        if constexpr (!kMx) load_vec(brow[h] + int64_t(kb) * kStageBytes, b2[h]);
      }
    }
  };
  // Group i's value of a row: a pair of X's type (int4), an e8m0 byte
  // (MXFP4), a float (int8).
  auto pair = [](const uint32_t (&v)[kRegs], int i) { return dq::prmt(v[i / 2], v[i / 2], (i & 1) ? 0x3232u : 0x1010u); };
  auto e8m0 = [](const uint32_t (&v)[kRegs], int i) { return int((v[i / 4] >> (8 * (i % 4))) & 0xFFu); };
  auto f32 = [](const uint32_t (&v)[kRegs], int i) {
    const uint32_t h = (i & 1) ? v[i / 2] >> 16 : v[i / 2] & 0xFFFFu;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(h << 16);
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  };
  load_scales(0, sv, bv, fsc);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  // FP8: one 128-k block's sums.
  float part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) part[i] = 0.f;
  float carry[2] = {0.f, 0.f};  // FP8: the scales of the previous stage's block 1
  // The block's sums, all its wgmmas retired, times its rows' scales into d.
  auto promote = [&](const float (&sc)[2]) {
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = fmaf(sc[(i / 2) % 2], part[i], d[i]);
  };
  uint32_t a[2][SG][4];
#pragma unroll
  for (int x = 0; x < 2; ++x)
#pragma unroll
    for (int i = 0; i < SG; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[x][i][r] = 0u;
  // This lane's two rows in a stage (the 128-byte swizzle: chunk i of row r
  // at chunk i ^ (r % 8), and r % 8 = g).
  const int row0 = 16 * (4 * wg + w) + g;
  int prev = -1;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % S;
    uint32_t nsv[2][kRegs] = {}, nbv[2][kRegs] = {};
    float nfsc[2][2] = {};
    load_scales(kb + 1 < nkb ? kb + 1 : kb, nsv, nbv, nfsc);
    mbar_wait(&full[s], (kb / S) & 1);
    const unsigned char* st = smem + s * R::kStage;
    const uint32_t xlo = desc_lo(smem_addr(st + R::kWords));
#pragma unroll
    for (int grp = 0; grp < 16 / SG; ++grp) {
      uint32_t(&A)[SG][4] = a[grp & 1];
      if constexpr (k8) {
#pragma unroll
        for (int i = 0; i < SG; ++i) {  // one k16 step: 16 bytes of each row
          const int step = grp * SG + i;
          const unsigned char* bx = st + (step / 8) * kBox + ((step % 8) ^ g) * 16 + 4 * (t / 2);
          const uint32_t* rg = reinterpret_cast<const uint32_t*>(bx + row0 * 128);
          const uint32_t* ru = reinterpret_cast<const uint32_t*>(bx + (row0 + 8) * 128);
          const uint32_t wv[2] = {dq::prmt(rg[0], rg[2], sel), dq::prmt(ru[0], ru[2], sel)};
          // Registers 0 / 2: the first-half row's k 2t, 2t + 1 / 2t + 8, 2t + 9; 1 / 3: the second's.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (kF8) {
              uint32_t pr[2];
              Dequant<T, kFp8, true>::word(wv[h], Scale{}, pr);
              A[i][h] = pr[0];
              A[i][2 + h] = pr[1];
            } else {
              const int gi = step * 16 / GS;
              const float fs = f32(sv[h], gi), fb = f32(bv[h], gi);
              A[i][h] = gatedmlp::detail::pack2<T>(dq::affine8(wv[h], 0, fs, fb), dq::affine8(wv[h], 1, fs, fb));
              A[i][2 + h] = gatedmlp::detail::pack2<T>(dq::affine8(wv[h], 2, fs, fb), dq::affine8(wv[h], 3, fs, fb));
            }
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < SG; i += 2) {  // two k16 steps: one 16-byte chunk of each row
          const int chunk = (grp * SG + i) / 2;
          constexpr int kChunksPerGroup = GS / 32;
          const int gi = chunk / kChunksPerGroup;
          const uint4 wg4 = *reinterpret_cast<const uint4*>(st + row0 * 128 + ((chunk ^ g) * 16));
          const uint4 wu4 = *reinterpret_cast<const uint4*>(st + (row0 + 8) * 128 + ((chunk ^ g) * 16));
          const uint32_t n[8] = {byte_pair(wg4.x, sel), byte_pair(wu4.x, sel), byte_pair(wg4.y, sel),
                                 byte_pair(wu4.y, sel), byte_pair(wg4.z, sel), byte_pair(wu4.z, sel),
                                 byte_pair(wg4.w, sel), byte_pair(wu4.w, sel)};
          // Registers 0 / 2 of each step: the first-half row; 1 / 3: the second's.
          if constexpr (kMx) {
            const Scale sc[2] = {dq::mxfp4_scale(e8m0(sv[0], gi)), dq::mxfp4_scale(e8m0(sv[1], gi))};
#pragma unroll
            for (int r = 0; r < 8; ++r) A[i + r / 4][r % 4] = dq::mxfp4_pair<T>(n[r], sc[r % 2]);
          } else {
            const uint32_t s2[2] = {pair(sv[0], gi), pair(sv[1], gi)}, b2[2] = {pair(bv[0], gi), pair(bv[1], gi)};
#pragma unroll
            for (int r = 0; r < 8; ++r) A[i + r / 4][r % 4] = dq::affine4_pair<T>(n[r], s2[r % 2], b2[r % 2]);
          }
        }
      }
      if constexpr (kF8) {
        // A block starts: the one before goes into the sums.
        if (grp == 0 && kb > 0) promote(carry);
        if (grp == 8 / SG) promote(fsc[0]);
      }
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < SG; ++i) {
        const int step = grp * SG + i;  // k 16 step ... 16 step + 15 of the stage: slab step / 4
        const uint64_t desc = desc_from_lo(xlo + ((step / 4) * N * 128 + (step % 4) * 32) / 16);
        if constexpr (kF8) {
          // A block's first step overwrites its sums.
          if (step % 8 == 0) wgmma_ra<T, N, false>(part, A[i], desc);
          else wgmma_ra<T, N, true>(part, A[i], desc);
        } else {
          wgmma_ra<T, N>(d, A[i], desc);
        }
      }
      wgmma_commit();
      wgmma_wait<1>();
#pragma unroll
      for (int i = 0; i < SG; ++i) keep(a[(grp & 1) ^ 1][i]);
      // The previous stage's last group is retired now: its slot goes back.
      if (grp == 0) {
        if (prev >= 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[prev]);
        prev = s;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        sv[h][i] = nsv[h][i];
        bv[h][i] = nbv[h][i];
      }
      carry[h] = fsc[1][h];
      fsc[0][h] = nfsc[0][h];
      fsc[1][h] = nfsc[1][h];
    }
  }
  wgmma_wait<0>();
  if constexpr (kF8) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(part[i])::"memory");
    if (nkb > 0) promote(carry);
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
  // Lane (g, t): the first half's sums in d[4 c' + e], the second's in
  // d[4 c' + 2 + e], for tokens 8 c' + 2 t + e.
  const int64_t j = int64_t(block) * group + c;
  if (c >= group || j >= p.u) return;
  const int gate = p.first;  // 1: the up half is the first
#pragma unroll
  for (int ct = 0; ct < N / 8; ++ct)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int token = 8 * ct + 2 * t + e;
      if (token >= p.m) continue;
      const float h0 = d[4 * ct + e], h1 = d[4 * ct + 2 + e];
      decode::finish(p, gate ? h1 : h0, gate ? h0 : h1, j, 0, token);
    }
#endif
}

// One instantiation's set-up (setup: the shared-memory limit) or launch.
template <typename T, int FMT, int N, int W, int GS>
cudaError_t hopper_one(const HopperPrepared& pr, const Params& q, const CUtensorMap& xmap, cudaStream_t stream,
                       bool setup) {
  using R = hopper_detail::Ring<N, W, hopper_detail::kRowBytes<FMT>>;
  auto kernel = quant_hopper_kernel<T, FMT, N, W, GS>;
  if (setup) return detail::allow_smem(kernel, R::kSmem);
  kernel<<<pr.grid, R::kThreads, R::kSmem, stream>>>(q, pr.wmap, xmap, pr.ctas_per_block);
  return cudaGetLastError();
}

// One format and group: N = 32, 64 or 128 tokens, 1 or 2 consumer
// warpgroups (FP8 at 128: 1, hopper_n()).
template <typename T, int FMT, int GS>
cudaError_t hopper_format(const HopperPrepared& pr, const Params& q, const CUtensorMap& xmap, cudaStream_t stream,
                          bool setup) {
  if (pr.n == 32)
    return pr.warpgroups == 1 ? hopper_one<T, FMT, 32, 1, GS>(pr, q, xmap, stream, setup)
                              : hopper_one<T, FMT, 32, 2, GS>(pr, q, xmap, stream, setup);
  if (pr.n == 64)
    return pr.warpgroups == 1 ? hopper_one<T, FMT, 64, 1, GS>(pr, q, xmap, stream, setup)
                              : hopper_one<T, FMT, 64, 2, GS>(pr, q, xmap, stream, setup);
  if constexpr (FMT == kFp8) return hopper_one<T, FMT, 128, 1, GS>(pr, q, xmap, stream, setup);
  else
    return pr.warpgroups == 1 ? hopper_one<T, FMT, 128, 1, GS>(pr, q, xmap, stream, setup)
                              : hopper_one<T, FMT, 128, 2, GS>(pr, q, xmap, stream, setup);
}

// The instantiations of one X dtype and word width: int4 in groups of 32,
// 64 or 128 and MXFP4 (bf16), or int8 in those groups and FP8.
template <typename T, bool EIGHT_BIT>
cudaError_t hopper_dispatch(const HopperPrepared& pr, const Params& q, const CUtensorMap& xmap, cudaStream_t stream,
                            bool setup) {
  constexpr int F = EIGHT_BIT ? kInt8 : kInt4;
  if constexpr (EIGHT_BIT) {
    if (pr.format == kFp8) return hopper_format<T, kFp8, 128>(pr, q, xmap, stream, setup);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (pr.format == kMxfp4) return hopper_format<T, kMxfp4, 32>(pr, q, xmap, stream, setup);
  }
  if (pr.group_size == 32) return hopper_format<T, F, 32>(pr, q, xmap, stream, setup);
  if (pr.group_size == 64) return hopper_format<T, F, 64>(pr, q, xmap, stream, setup);
  return hopper_format<T, F, 128>(pr, q, xmap, stream, setup);
}

}  // namespace gatedmlp::quant_decode
