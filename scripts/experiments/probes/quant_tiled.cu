// Probe h95 (docs/notes/quantized-decode.md): does the int4 decode kernel
// wait on its L1 wavefronts, and would a tile-contiguous repack of the words
// and scales lift it?
//
// The reading: at M = 1 (one n-tile, two column groups) a warp's k-block of
// 128 elements issues 4 word loads, 8 scale / bias loads and 4 X loads. On
// the checkpoint's layout each word load covers 8 rows x 64 bytes (8 cache
// lines, 8 wavefronts for 512 bytes) and each 2-byte scale or bias load
// 8 rows' lines (8 wavefronts for 32 bytes): ~104 wavefronts per k-block
// where its 2 KB of words and 256 bytes of scales need ~18. h66's ncu had
// L1/TEX 67 % busy at M = 1 (85 % at M = 16), a third of the stalls on it.
//
// The tiled layout (per group of 8 output columns c, 16 weight rows: h = 0
// gate, 1 up; g = the row in the group; t = the lane in the quad):
//   words  [c][k-block][h][g][t] 16 bytes: a warp's load is 512 contiguous
//          bytes (4 wavefronts), a CTA's k-block 1 KB per column group;
//   scales [c][group][g][h] (scale, bias) as two 16-bit values: a lane's one
//          8-byte load holds its gate and up rows' scale and bias; a warp's
//          covers 64 bytes per group (1-2 wavefronts).
// The sums are the same in the same order as the checkpoint-order lean
// kernel, so Y is bit-identical (checked before timing).
//
// Prediction: if the L1's wavefronts are what the warps wait on, the tiled
// kernel is 1.2-1.5x the lean one at M = 1 and more at M = 16 (where X's
// traffic is also on the L1); if the cap is elsewhere (DRAM access order,
// the issue of the math), the two time within a few %.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//     scripts/experiments/probes/quant_tiled.cu -o quant_tiled && ./quant_tiled
// (scripts/experiments/probe-decode-small.sh qtiled builds and runs it.)
// Standalone, not library code.
#include <cmath>
#include <cstring>

#include "gatedmlp/gatedmlp.hpp"
#include "h75_common.cuh"
#include "quant_decode/quant_decode.cuh"
#include "quant_decode/tiled.cuh"

using namespace gatedmlp;
using namespace gatedmlp::quant_decode;

namespace {

constexpr int kChunkK = 128;  // int4: 4 lanes x 32 elements

struct Tiled {
  const uint4* words;   // [U/8][K/128][2][8][4]
  const uint2* scales;  // [U/8][K/g][8] x (s_gate, b_gate, s_up, b_up)
  const uint32_t *ls, *lb;  // the library's order: [U/8][K/g][8] x (gate, up), scales and biases apart
};

// L: bit 0 tiled words, bit 1 tiled scales, bit 2 X staged once per CTA in
// shared memory (M = 1 only), bit 3 the tiled scales as the library stored
// them before e26f466 (two 32-bit loads, scales and biases apart), bit 4
// the first k-block's weights requested before X is staged (h96). 0: the
// checkpoint's arrays (h81's lean tile).
template <int NT, int CG, int L>
__global__ void __launch_bounds__(kMaxWarps * 32, CG * NT >= 4 ? 1 : 2)
    tiled_kernel(const __grid_constant__ Params qp, const __grid_constant__ Tiled tl) {
  using T = __nv_bfloat16;
  using D = Dequant<T, kInt4, true>;
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  const decode::Params& p = qp.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = int64_t(blockIdx.x) * 8 * CG;
  const int chunks = int(p.k / kChunkK), nw = p.warps;
  const int n = warp < chunks ? (chunks - warp + nw - 1) / nw : 0;
  const int64_t first_group = (int64_t(warp) * kChunkK + 32 * t) >> qp.group_shift;
  const int step_s = (kChunkK * nw) >> qp.group_shift;

  constexpr bool TW = L & 1, TS = L & 2, XS = L & 4, LS = L & 8, WF = L & 16;
  // Checkpoint order: per row pointers. Tiled: one pointer per column group.
  const uint32_t* wp[CG][2];
  const unsigned short *sp[CG][2], *bp[CG][2];
  const uint4* tw[CG];
  const uint2* ts[CG];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const LaneRows rows = lane_rows(qp, 0, j0 + 8 * cg, g, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wp[cg][h] = rows.w[h] + int64_t(warp) * 16;
      sp[cg][h] = static_cast<const unsigned short*>(rows.s[h]) + rows.sbase[h] + first_group;
      bp[cg][h] = static_cast<const unsigned short*>(rows.b[h]) + rows.sbase[h] + first_group;
    }
    const int64_t c = blockIdx.x * int64_t(CG) + cg;
    tw[cg] = tl.words + (c * chunks + warp) * 64 + g * 4 + t;
    ts[cg] = tl.scales + (c * qp.groups + first_group) * 8 + g;
  }
  const T* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    xp[nt] = static_cast<const T*>(p.x) + int64_t(min(nt * 8 + g, p.m - 1)) * p.ldx + int64_t(warp) * kChunkK + 32 * t;
  const int step_w = 16 * nw, step_x = kChunkK * nw;

  float acc[CG][NT][4];
  decode::zero_sums(acc);
  uint4 wa[CG][2];
  Scale sa[CG][2];
  auto load = [&]() {
#pragma unroll
    for (int cg = 0; cg < CG; ++cg) {
      if constexpr (TW) {
        wa[cg][0] = decode::detail_::ld_weights(tw[cg]);
        wa[cg][1] = decode::detail_::ld_weights(tw[cg] + 32);
      } else {
        wa[cg][0] = decode::detail_::ld_weights(wp[cg][0]);
        wa[cg][1] = decode::detail_::ld_weights(wp[cg][1]);
      }
      if constexpr (!TS) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t sv = __ldg(sp[cg][h]), bv = __ldg(bp[cg][h]);
          sa[cg][h].s = sv | (sv << 16);
          sa[cg][h].b = bv | (bv << 16);
        }
      } else if constexpr (LS) {
        const int64_t at = ts[cg] - tl.scales;
        const uint32_t sv = __ldg(tl.ls + at), bv = __ldg(tl.lb + at);
        sa[cg][0].s = __byte_perm(sv, 0, 0x1010);
        sa[cg][0].b = __byte_perm(bv, 0, 0x1010);
        sa[cg][1].s = __byte_perm(sv, 0, 0x3232);
        sa[cg][1].b = __byte_perm(bv, 0, 0x3232);
      } else {
        const uint2 v = __ldg(ts[cg]);
        sa[cg][0].s = __byte_perm(v.x, 0, 0x1010);
        sa[cg][0].b = __byte_perm(v.x, 0, 0x3232);
        sa[cg][1].s = __byte_perm(v.y, 0, 0x1010);
        sa[cg][1].b = __byte_perm(v.y, 0, 0x3232);
      }
    }
  };
  auto step = [&]() {
#pragma unroll
    for (int cg = 0; cg < CG; ++cg) {
      if constexpr (TW) {
        tw[cg] += 64 * nw;
      } else {
        wp[cg][0] += step_w, wp[cg][1] += step_w;
      }
      if constexpr (TS) {
        ts[cg] += 8 * step_s;
      } else {
        sp[cg][0] += step_s, sp[cg][1] += step_s, bp[cg][0] += step_s, bp[cg][1] += step_s;
      }
    }
  };
  if (WF && n > 0) load();
  if constexpr (XS) {
    T* xs = reinterpret_cast<T*>(reinterpret_cast<char*>(smem_f4) + kMaxWarps * CG * NT * 512);  // decode::red_bytes
    for (int64_t i = int64_t(threadIdx.x) * 8; i < p.k; i += int64_t(blockDim.x) * 8)
      *reinterpret_cast<uint4*>(xs + i) = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + i);
    __syncthreads();
    xp[0] = xs + int64_t(warp) * kChunkK + 32 * t;
  }
  if (!WF && n > 0) load();
  for (int i = 0; i < n; ++i) {
    uint4 cw[CG][2];
    Scale cs[CG][2];
#pragma unroll
    for (int cg = 0; cg < CG; ++cg)
#pragma unroll
      for (int h = 0; h < 2; ++h) cw[cg][h] = wa[cg][h], cs[cg][h] = sa[cg][h];
    if (i + 1 < n) {
      step();
      load();
    }
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      uint32_t xq[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 v = XS ? *reinterpret_cast<const uint4*>(xp[nt] + wd * 8)
                                    : decode::detail_::ld_x(xp[nt] + wd * 8);
        const uint32_t xr[4] = {v.x, v.y, v.z, v.w};
        D::x_pairs(xr, xq[nt]);
      }
#pragma unroll
      for (int cg = 0; cg < CG; ++cg) {
        uint32_t ag[4], au[4];
        D::word(detail_::word_of(cw[cg][0], wd), cs[cg][0], ag);
        D::word(detail_::word_of(cw[cg][1], wd), cs[cg][1], au);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          decode::detail_::mma_16816<T>(acc[cg][nt], ag[0], au[0], ag[1], au[1], xq[nt][0], xq[nt][1]);
          decode::detail_::mma_16816<T>(acc[cg][nt], ag[2], au[2], ag[3], au[3], xq[nt][2], xq[nt][3]);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += step_x;
  }
  decode::store_partials<NT, CG>(red, acc);
  __syncthreads();
  decode::epilogue<NT, CG>(p, red, j0, 0, p.m, nullptr);
}

template <int NT, int CG, int L>
void launch_tiled(const Params& q0, const Tiled& tl, cudaStream_t s) {
  Params q = q0;
  q.d.warps = int(std::min<int64_t>(q.d.k / kChunkK, q.d.warps));
  const unsigned grid = unsigned((q.d.u + 8 * CG - 1) / (8 * CG));
  const int smem = decode::red_bytes<NT, CG>(kMaxWarps) + (L & 4 ? int(q.d.k) * 2 : 0);
  if (L & 4) CK(cudaFuncSetAttribute(tiled_kernel<NT, CG, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tiled_kernel<NT, CG, L><<<grid, q.d.warps * 32, smem, s>>>(q, tl);
}

// The tiled copy of stacked [2U][K/8] words and [2U][K/64] bf16 scales / biases.
__global__ void tile_words(const uint4* w, uint4* out, int64_t k, int64_t u) {
  const int64_t chunks = k / kChunkK, n = (u / 8) * chunks * 64;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i & 3), g = int((i >> 2) & 7), h = int((i >> 5) & 1);
    const int64_t kb = (i >> 6) % chunks, c = (i >> 6) / chunks;
    const int64_t row = h * u + c * 8 + g;
    out[i] = w[row * (k / 32) + kb * 4 + t];  // a row is K / 32 uint4
  }
}
__global__ void tile_scales(const uint16_t* s, const uint16_t* b, uint2* out, int64_t groups, int64_t u) {
  const int64_t n = (u / 8) * groups * 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int g = int(i & 7);
    const int64_t gi = (i >> 3) % groups, c = (i >> 3) / groups;
    const int64_t rg = (c * 8 + g) * groups + gi, ru = (u + c * 8 + g) * groups + gi;
    out[i] = make_uint2(uint32_t(s[rg]) | uint32_t(b[rg]) << 16, uint32_t(s[ru]) | uint32_t(b[ru]) << 16);
  }
}

// The library's tiled scales (QuantFormat::tiled): a uint32 per (c, group,
// g) holding rows g and 8 + g, one array for the scales, one for the biases.
__global__ void tile_scales_lib(const uint16_t* s, const uint16_t* b, uint32_t* so, uint32_t* bo, int64_t groups,
                                int64_t u) {
  const int64_t n = (u / 8) * groups * 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int g = int(i & 7);
    const int64_t gi = (i >> 3) % groups, c = (i >> 3) / groups;
    const int64_t rg = (c * 8 + g) * groups + gi, ru = (u + c * 8 + g) * groups + gi;
    so[i] = uint32_t(s[rg]) | uint32_t(s[ru]) << 16;
    bo[i] = uint32_t(b[rg]) | uint32_t(b[ru]) << 16;
  }
}

constexpr int64_t kMaxRows = 16;

struct ProbeShape {
  const char* name;
  int64_t k, u;
};
constexpr ProbeShape kShapes[] = {{"8b", 4096, 14336},       {"70b", 8192, 28672},      {"qwen3-32b", 5120, 25600},
                                  {"2048x8192", 2048, 8192}, {"1024x2816", 1024, 2816}};

struct Copy {
  uint32_t* words;
  __nv_bfloat16 *scales, *biases;
  uint4* twords;
  uint2* tscales;
  uint32_t *lscales, *lbiases;  // the library's tiled scales and biases
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

}  // namespace

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  // Columns: the library's kernel; the lean tile on the checkpoint's arrays;
  // tiled words only; tiled scales only; both; both with X staged (M = 1);
  // the library's tiled kernels (h95, on its tiled arrays); tiled with X
  // staged, the first weights requested before X (M = 1).
  std::printf("%-10s %3s | %8s %8s %8s %8s %8s %8s %8s %8s | TB/s of words, scales and biases, the same order\n",
              "shape", "M", "library", "lean", "t.words", "t.scales", "tiled", "tiled+xs", "lib.tile", "xs+wfirst");
  for (const ProbeShape& sh : kShapes) {
    const int64_t rows = 2 * sh.u, words = rows * sh.k / 8, groups = rows * sh.k / 64;
    const int64_t bytes = words * 4 + groups * 4;
    const int copies = int(std::max<int64_t>(2, 3 * int64_t(l2) / bytes + 1));
    std::vector<Copy> cs(copies);
    for (Copy& c : cs) {
      CK(cudaMalloc(&c.words, words * 4));
      CK(cudaMalloc(&c.scales, groups * 2));
      CK(cudaMalloc(&c.biases, groups * 2));
      CK(cudaMalloc(&c.twords, words * 4));
      CK(cudaMalloc(&c.tscales, groups * 4));
      CK(cudaMalloc(&c.lscales, groups * 2));
      CK(cudaMalloc(&c.lbiases, groups * 2));
      fill_words<<<1024, 256>>>(c.words, words, 0x1234u);  // every copy the same values
      fill_scales<<<256, 256>>>(c.scales, c.biases, groups);
      tile_words<<<1024, 256>>>(reinterpret_cast<const uint4*>(c.words), c.twords, sh.k, sh.u);
      tile_scales<<<256, 256>>>(reinterpret_cast<const uint16_t*>(c.scales), reinterpret_cast<const uint16_t*>(c.biases),
                                c.tscales, sh.k / 64, sh.u);
      tile_scales_lib<<<256, 256>>>(reinterpret_cast<const uint16_t*>(c.scales), reinterpret_cast<const uint16_t*>(c.biases),
                                    c.lscales, c.lbiases, sh.k / 64, sh.u);
    }
    __nv_bfloat16 *x, *y1, *y2;
    CK(cudaMalloc(&x, kMaxRows * sh.k * 2));
    CK(cudaMalloc(&y1, kMaxRows * sh.u * 2));
    CK(cudaMalloc(&y2, kMaxRows * sh.u * 2));
    fill_random<<<64, 256>>>(x, kMaxRows * sh.k, 0x9876u);
    CK(cudaDeviceSynchronize());
    for (int m : {1, 8, 16}) {
      // The library's choice at these M for int4 g64: one n-tile and two
      // column groups at M <= 8, two and four at M = 9-16.
      auto run = [&](int which, int ci, void* y) {
        const Copy& c = cs[ci % copies];
        const Params q = make_params(c, x, y, sh.k, sh.u, m);
        const Tiled tl{c.twords, c.tscales, c.lscales, c.lbiases};
        if (which == 9) {  // the library's tiled kernels on its own arrays ((scale, bias) pairs: the probe's)
          Params lq = q;
          lq.d.w = c.twords;
          lq.scales = c.tscales;
          lq.biases = nullptr;
          lq.groups = 2 * q.groups;  // the pair array's elements per row
          Shape sp;
          sp.nt = m <= 8 ? 1 : 2;
          sp.cg = m <= 8 ? 2 : 4;
          (void)launch_tiled<__nv_bfloat16>(lq, sp, s);
          return;
        }
        if (m <= 8) {
          switch (which) {
            case 0: (void)launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2, false, 2>(q, s); break;
            case 1: launch_tiled<1, 2, 0>(q, tl, s); break;
            case 2: launch_tiled<1, 2, 1>(q, tl, s); break;
            case 3: launch_tiled<1, 2, 2>(q, tl, s); break;
            case 4: launch_tiled<1, 2, 3>(q, tl, s); break;
            case 5: launch_tiled<1, 2, 7>(q, tl, s); break;
            default: launch_tiled<1, 2, 23>(q, tl, s); break;
          }
        } else {
          switch (which) {
            case 0: (void)launch_kernel<__nv_bfloat16, kInt4, true, 2, 1, 1, false, 4>(q, s); break;
            case 1: launch_tiled<2, 4, 0>(q, tl, s); break;
            case 2: launch_tiled<2, 4, 1>(q, tl, s); break;
            case 3: launch_tiled<2, 4, 2>(q, tl, s); break;
            default: launch_tiled<2, 4, 3>(q, tl, s); break;
          }
        }
      };
      const int kinds = 8;  // then the library's tiled kernel (run as which = 9), then tiled+xs, weights first
      std::vector<uint16_t> a(size_t(m * sh.u)), b(a.size());
      bool same = true;
      auto variant = [&](int w) { return w == 6 ? 9 : (w == 5 || w == 7) && m > 1 ? -1 : w == 7 ? 6 : w; };  // -1: none
      for (int which = 0; which < kinds; ++which) {
        if (variant(which) < 0) continue;
        void* y = which == 0 ? y1 : y2;
        CK(cudaMemset(y, 0xFF, kMaxRows * sh.u * 2));
        run(variant(which), 0, y);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(which == 0 ? a.data() : b.data(), y, a.size() * 2, cudaMemcpyDeviceToHost));
        if (which > 0) same = same && std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
      }
      float tm[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      // Two rounds, interleaved; the faster of each.
      for (int round = 0; round < 2; ++round)
        for (int which = 0; which < kinds; ++which) {
          if (variant(which) < 0) continue;
          const float us = replay_us(s, 2 * copies, [&](int c) { run(variant(which), c, which == 0 ? y1 : y2); });
          tm[which] = round == 0 ? us : std::min(tm[which], us);
        }
      std::printf("%-10s %3d |", sh.name, m);
      for (float us : tm) std::printf(" %8.2f", us);
      std::printf(" |");
      for (float us : tm) std::printf(" %6.3f", us > 0.f ? bytes / us * 1e-6 : 0.0);
      std::printf("   %s\n", same ? "(Y bit-identical)" : "(Y DIFFERS: a variant is wrong)");
    }
    for (Copy& c : cs) {
      CK(cudaFree(c.words));
      CK(cudaFree(c.scales));
      CK(cudaFree(c.biases));
      CK(cudaFree(c.twords));
      CK(cudaFree(c.tscales));
      CK(cudaFree(c.lscales));
      CK(cudaFree(c.lbiases));
    }
    CK(cudaFree(x));
    CK(cudaFree(y1));
    CK(cudaFree(y2));
  }
  return 0;
}
