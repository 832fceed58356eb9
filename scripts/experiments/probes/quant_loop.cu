// Probe h80 (docs/notes/quantized-decode.md, prepared after h79): is the
// int4 decode kernel's loop slowed by the instructions in it that are
// neither math nor loads?
//
// h79's source counters: the checkpoint-order kernel runs 264 warp
// instructions per chunk (1 KB of words) in its loop, of which ~90 are
// address arithmetic, moves, compares and branches (64-bit indices
// recomputed each k-block, the K-tail predicates on every load). Here the
// library's kernel (quant_decode_kernel: bf16 X, int4 g64 with bf16 scales,
// one n-tile, one chunk per k-block, 4 warps) runs beside a lean copy of
// its tile: the same loads, dequantization, mma and epilogue in the same
// order, but with pointers advanced by a constant step, a 32-bit trip count
// and no K-tail tests (the probe's K is a multiple of the chunk). Y must be
// bit-identical (checked before timing). Prediction: if those instructions
// cost time, the lean tile is faster by up to their share of the issue
// slots (~30 %); if not (the loop waits on loads, h79's long-scoreboard
// stalls), the two time the same, and the lead is the loads' latency.
// A third kernel (M = 1 only) is the lean tile with X read from shared
// memory, staged once per CTA (K x 2 bytes), instead of an L1 load in front
// of every mma: the long-scoreboard stalls h79's source counters put on the
// mma. A fourth has each warp own 8 columns over all of K (no K split
// between warps: a warp's set-up spread over 4x the chunks, U / 32 CTAs);
// its sums are ordered differently, so it is checked to a tolerance.
// A fifth (MODE 3, "lean+xp", h81) loads each chunk's X with its words, a
// chunk ahead (16 more registers), so that no mma waits on an X load.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//     scripts/experiments/probes/quant_loop.cu -o quant_loop && ./quant_loop
// (scripts/experiments/probe-decode-small.sh quant builds and runs it.)
// Standalone, not library code.
#include <cmath>
#include <cstring>

#include "gatedmlp/gatedmlp.hpp"
#include "h75_common.cuh"
#include "quant_decode/quant_decode.cuh"

using namespace gatedmlp;
using namespace gatedmlp::quant_decode;

namespace {

constexpr int kChunkK = 128;  // int4: 4 lanes x 32 elements

// quant_tile<bf16, kInt4, packed, NT = 1, UNROLL = 1> with the loop's
// bookkeeping taken out: K % 128 == 0 and no split, gather or down.
// MODE 0: that alone. MODE 1 (M = 1): X also staged in shared memory after
// the partial sums' bytes. MODE 2: each warp owns 8 columns over all of K
// (a CTA's 4 warps: 32 columns), so no warp splits K with another; the
// library's epilogue then runs once per warp's columns.
constexpr int kRedBytes = kMaxWarps * 512;  // decode::red_bytes<1, 1>(8 warps)

template <int MODE>
__global__ void __launch_bounds__(kMaxWarps * 32, 2) lean_kernel(const __grid_constant__ Params qp) {
  using T = __nv_bfloat16;
  using D = Dequant<T, kInt4, true>;
  extern __shared__ float4 smem_f4[];
  float* red = reinterpret_cast<float*>(smem_f4);
  const decode::Params& p = qp.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = MODE == 2 ? int64_t(blockIdx.x) * 32 + 8 * warp : int64_t(blockIdx.x) * 8;
  const LaneRows rows = lane_rows(qp, 0, j0, g, t);
  const int chunks = int(p.k / kChunkK);
  const int kb0 = MODE == 2 ? 0 : warp, nw = MODE == 2 ? 1 : p.warps;  // first chunk, chunks between
  const int n = kb0 < chunks ? (chunks - kb0 + nw - 1) / nw : 0;          // this warp's chunks

  // Pointers at this warp's first chunk, and their steps per chunk.
  const uint32_t* w0 = rows.w[0] + int64_t(kb0) * 16;
  const uint32_t* w1 = rows.w[1] + int64_t(kb0) * 16;
  const int64_t first_group = (int64_t(kb0) * kChunkK + 32 * t) >> qp.group_shift;
  const unsigned short* s0 = static_cast<const unsigned short*>(rows.s[0]) + rows.sbase[0] + first_group;
  const unsigned short* s1 = static_cast<const unsigned short*>(rows.s[1]) + rows.sbase[1] + first_group;
  const unsigned short* b0 = static_cast<const unsigned short*>(rows.b[0]) + rows.sbase[0] + first_group;
  const unsigned short* b1 = static_cast<const unsigned short*>(rows.b[1]) + rows.sbase[1] + first_group;
  const T* xp = static_cast<const T*>(p.x) + int64_t(min(g, p.m - 1)) * p.ldx + int64_t(kb0) * kChunkK + 32 * t;
  if constexpr (MODE == 1) {
    T* xs = reinterpret_cast<T*>(reinterpret_cast<char*>(smem_f4) + kRedBytes);
    for (int64_t i = int64_t(threadIdx.x) * 8; i < p.k; i += int64_t(blockDim.x) * 8)
      *reinterpret_cast<uint4*>(xs + i) = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + i);
    __syncthreads();
    xp = xs + kb0 * kChunkK + 32 * t;
  }
  const int step_w = 16 * nw, step_x = kChunkK * nw;
  const int step_s = (kChunkK * nw) >> qp.group_shift;  // groups of 32 ... 128 divide 128

  auto scale = [](const unsigned short* s, const unsigned short* b) {
    Scale sc;
    const uint32_t sv = __ldg(s), bv = __ldg(b);
    sc.s = sv | (sv << 16);
    sc.b = bv | (bv << 16);
    return sc;
  };

  float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
  uint4 wa0, wa1;
  Scale sa0, sa1;
  uint4 xa[4];  // MODE 3: the next chunk's X, loaded with its words
  if (n > 0) {
    wa0 = decode::detail_::ld_weights(w0);
    wa1 = decode::detail_::ld_weights(w1);
    sa0 = scale(s0, b0);
    sa1 = scale(s1, b1);
    if constexpr (MODE == 3)
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) xa[wd] = decode::detail_::ld_x(xp + wd * 8);
  }
  for (int i = 0; i < n; ++i) {
    const uint4 cw0 = wa0, cw1 = wa1;
    const Scale cs0 = sa0, cs1 = sa1;
    uint4 cx[4];
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) cx[wd] = xa[wd];
    if (i + 1 < n) {
      w0 += step_w, w1 += step_w, s0 += step_s, s1 += step_s, b0 += step_s, b1 += step_s;
      wa0 = decode::detail_::ld_weights(w0);
      wa1 = decode::detail_::ld_weights(w1);
      sa0 = scale(s0, b0);
      sa1 = scale(s1, b1);
      if constexpr (MODE == 3)
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) xa[wd] = decode::detail_::ld_x(xp + step_x + wd * 8);
    }
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      uint32_t ag[4], au[4], xp4[4];
      D::word(detail_::word_of(cw0, wd), cs0, ag);
      D::word(detail_::word_of(cw1, wd), cs1, au);
      const uint4 v = MODE == 3   ? cx[wd]
                      : MODE == 1 ? *reinterpret_cast<const uint4*>(xp + wd * 8)
                                  : decode::detail_::ld_x_if(xp + wd * 8, true);
      const uint32_t xr[4] = {v.x, v.y, v.z, v.w};
      D::x_pairs(xr, xp4);
      decode::detail_::mma_16816<T>(acc[0][0], ag[0], au[0], ag[1], au[1], xp4[0], xp4[1]);
      decode::detail_::mma_16816<T>(acc[0][0], ag[2], au[2], ag[3], au[3], xp4[2], xp4[3]);
    }
    xp += step_x;
  }
  decode::store_partials<1, 1>(red, acc);
  __syncthreads();
  if constexpr (MODE == 2) {
    // Warp w's partial sums are the whole of its columns' (launched with
    // Params::warps = 1, so that the epilogue sums one warp's).
    for (int w = 0; w < int(blockDim.x / 32); ++w)
      decode::epilogue<1, 1>(p, red + w * 128, int64_t(blockIdx.x) * 32 + 8 * w, 0, p.m, nullptr);
  } else {
    decode::epilogue<1, 1>(p, red, j0, 0, p.m, nullptr);
  }
}

// h81: the lean tile over CG groups of 8 columns per warp (a CTA: 8 CG
// columns), each X fragment loaded once and multiplied into every group's
// weights, NT n-tiles of 8 tokens. CG = 1 is the lean tile for any NT. At
// M = 16 a CTA of 8 columns reads 4x as many bytes of X (through L1) as of
// int4 weights; CG groups cut that to 4 / CG.
template <int NT, int CG>
__global__ void __launch_bounds__(kMaxWarps * 32, CG * NT >= 4 ? 1 : 2) lean_cg_kernel(const __grid_constant__ Params qp) {
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
  const uint32_t* wp[CG][2];
  const unsigned short *sp[CG][2], *bp[CG][2];
  const int64_t first_group = (int64_t(warp) * kChunkK + 32 * t) >> qp.group_shift;
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const LaneRows rows = lane_rows(qp, 0, j0 + 8 * cg, g, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wp[cg][h] = rows.w[h] + int64_t(warp) * 16;
      sp[cg][h] = static_cast<const unsigned short*>(rows.s[h]) + rows.sbase[h] + first_group;
      bp[cg][h] = static_cast<const unsigned short*>(rows.b[h]) + rows.sbase[h] + first_group;
    }
  }
  const T* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    xp[nt] = static_cast<const T*>(p.x) + int64_t(min(nt * 8 + g, p.m - 1)) * p.ldx + int64_t(warp) * kChunkK + 32 * t;
  const int step_w = 16 * nw, step_x = kChunkK * nw, step_s = (kChunkK * nw) >> qp.group_shift;

  float acc[CG][NT][4];
  decode::zero_sums(acc);
  uint4 wa[CG][2];
  Scale sa[CG][2];
  auto load = [&]() {
#pragma unroll
    for (int cg = 0; cg < CG; ++cg)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wa[cg][h] = decode::detail_::ld_weights(wp[cg][h]);
        const uint32_t sv = __ldg(sp[cg][h]), bv = __ldg(bp[cg][h]);
        sa[cg][h].s = sv | (sv << 16);
        sa[cg][h].b = bv | (bv << 16);
      }
  };
  if (n > 0) load();
  for (int i = 0; i < n; ++i) {
    uint4 cw[CG][2];
    Scale cs[CG][2];
#pragma unroll
    for (int cg = 0; cg < CG; ++cg)
#pragma unroll
      for (int h = 0; h < 2; ++h) cw[cg][h] = wa[cg][h], cs[cg][h] = sa[cg][h];
    if (i + 1 < n) {
#pragma unroll
      for (int cg = 0; cg < CG; ++cg)
#pragma unroll
        for (int h = 0; h < 2; ++h) wp[cg][h] += step_w, sp[cg][h] += step_s, bp[cg][h] += step_s;
      load();
    }
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      uint32_t xq[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 v = decode::detail_::ld_x(xp[nt] + wd * 8);
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

template <int NT, int CG>
void launch_cg(const Params& q0, cudaStream_t s) {
  Params q = q0;
  q.d.warps = int(std::min<int64_t>(q.d.k / kChunkK, q.d.warps));
  const unsigned grid = unsigned((q.d.u + 8 * CG - 1) / (8 * CG));
  lean_cg_kernel<NT, CG><<<grid, q.d.warps * 32, decode::red_bytes<NT, CG>(q.d.warps), s>>>(q);
}

constexpr int64_t kMaxRows = 64;  // rows of X and Y allocated

struct ProbeShape {
  const char* name;
  int64_t k, u;
};
constexpr ProbeShape kShapes[] = {{"8b", 4096, 14336},       {"70b", 8192, 28672},      {"qwen3-32b", 5120, 25600},
                             {"2048x8192", 2048, 8192}, {"1024x2816", 1024, 2816}};

// One rotated copy: words [2U][K/8], then scales and biases [2U][K/64] bf16.
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

}  // namespace

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::printf("%-10s %3s | %9s %9s %9s %9s %9s | %8s %8s %8s %8s %8s   (us per call; TB/s of words, scales and biases)\n",
              "shape", "M", "library", "lean", "lean+xs", "cols", "lean+xp", "library", "lean", "lean+xs", "cols", "lean+xp");
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
      fill_words<<<1024, 256>>>(c.words, words, 0x1234u);  // every copy the same values
      fill_scales<<<256, 256>>>(c.scales, c.biases, groups);
    }
    __nv_bfloat16 *x, *y1, *y2;
    CK(cudaMalloc(&x, kMaxRows * sh.k * 2));
    CK(cudaMalloc(&y1, kMaxRows * sh.u * 2));
    CK(cudaMalloc(&y2, kMaxRows * sh.u * 2));
    fill_random<<<64, 256>>>(x, kMaxRows * sh.k, 0x9876u);
    CK(cudaDeviceSynchronize());
    for (int m : {1, 8}) {
      // Bit-identical Y first.
      CK(cudaMemset(y1, 0xFF, 16 * sh.u * 2));
      CK(cudaMemset(y2, 0xFF, 16 * sh.u * 2));
      CK((launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2>(make_params(cs[0], x, y1, sh.k, sh.u, m), s)));
      CK((launch_grid<kChunkK, 1, false>(lean_kernel<0>, make_params(cs[0], x, y2, sh.k, sh.u, m), s)));
      CK(cudaStreamSynchronize(s));
      std::vector<uint16_t> a(size_t(m * sh.u)), b(a.size());
      CK(cudaMemcpy(a.data(), y1, a.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
      bool same = std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
      // The X-in-shared-memory form at M = 1: grid and warps as launch_grid sets them.
      const int64_t kblocks = sh.k / kChunkK;
      auto launch_xs = [&](const Copy& c, void* y) {
        Params q = make_params(c, x, y, sh.k, sh.u, 1);
        q.d.warps = int(std::min<int64_t>(kblocks, q.d.warps));
        lean_kernel<1><<<unsigned((sh.u + 7) / 8), q.d.warps * 32, kRedBytes + int(sh.k) * 2, s>>>(q);
      };
      // Warps owning columns: U / 32 CTAs of 4 warps (the probe's U are multiples of 32).
      auto launch_cols = [&](const Copy& c, void* y) {
        Params q = make_params(c, x, y, sh.k, sh.u, m);
        q.d.warps = 1;
        lean_kernel<2><<<unsigned(sh.u / 32), 4 * 32, kRedBytes, s>>>(q);
      };
      CK(cudaMemset(y2, 0xFF, 16 * sh.u * 2));
      launch_cols(cs[0], y2);
      CK(cudaStreamSynchronize(s));
      std::vector<uint16_t> cc(a.size());
      CK(cudaMemcpy(cc.data(), y2, cc.size() * 2, cudaMemcpyDeviceToHost));
      // Each warp sums all of K in one chain: other sums than the K-split's, so not bit-identical.
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        float fa, fc;
        const uint32_t ua = uint32_t(a[i]) << 16, uc = uint32_t(cc[i]) << 16;
        std::memcpy(&fa, &ua, 4);
        std::memcpy(&fc, &uc, 4);
        worst = std::max(worst, double(std::fabs(fa - fc)) / (std::fabs(double(fa)) + 1e-3));
      }
      if (m == 1) {
        CK(cudaMemset(y2, 0xFF, 16 * sh.u * 2));
        launch_xs(cs[0], y2);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
        same = same && std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
      }
      const float tl = replay_us(s, 2 * copies, [&](int c) {
        (void)launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2>(make_params(cs[c % copies], x, y1, sh.k, sh.u, m), s);
      });
      const float tn = replay_us(s, 2 * copies, [&](int c) {
        (void)launch_grid<kChunkK, 1, false>(lean_kernel<0>, make_params(cs[c % copies], x, y2, sh.k, sh.u, m), s);
      });
      const float tc = replay_us(s, 2 * copies, [&](int c) { launch_cols(cs[c % copies], y2); });
      // X prefetched with the words (MODE 3): the same sums in the same order.
      CK(cudaMemset(y2, 0xFF, 16 * sh.u * 2));
      CK((launch_grid<kChunkK, 1, false>(lean_kernel<3>, make_params(cs[0], x, y2, sh.k, sh.u, m), s)));
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
      const bool same3 = std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
      const float t3 = replay_us(s, 2 * copies, [&](int c) {
        (void)launch_grid<kChunkK, 1, false>(lean_kernel<3>, make_params(cs[c % copies], x, y2, sh.k, sh.u, m), s);
      });
      const float tx = m == 1 ? replay_us(s, 2 * copies, [&](int c) { launch_xs(cs[c % copies], y2); }) : 0.f;
      std::printf("%-10s %3d | %9.2f %9.2f %9.2f %9.2f %9.2f | %8.3f %8.3f %8.3f %8.3f %8.3f   %s, cols: worst rel. %.1e\n",
                  sh.name, m, tl, tn, tx, tc, t3, bytes / tl * 1e-6, bytes / tn * 1e-6, m == 1 ? bytes / tx * 1e-6 : 0.0,
                  bytes / tc * 1e-6, bytes / t3 * 1e-6,
                  same && same3 ? "(Y bit-identical)" : "(Y DIFFERS: a lean tile is wrong)", worst);
    }
    // h81: column groups per warp, at M = 1, 8, 16 (NT = 1, 1, 2) and,
    // prepared for the next step, 32 and 64 (NT = 4, 8; two groups at most),
    // each against the library's kernel of the same NT without groups (Y
    // bit-identical: each column's sums are the same sums in the same order).
    for (int m : {1, 8, 16, 32, 64}) {
      const int nt = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
      auto run_library = [&](const Params& qq) {
        switch (nt) {
          case 1: return launch_kernel<__nv_bfloat16, kInt4, true, 1, 1, 2>(qq, s);
          case 2: return launch_kernel<__nv_bfloat16, kInt4, true, 2, 1, 2>(qq, s);
          case 4: return launch_kernel<__nv_bfloat16, kInt4, true, 4, 1, 1>(qq, s);
          default: return launch_kernel<__nv_bfloat16, kInt4, true, 8, 1, 1>(qq, s);
        }
      };
      // false where this (NT, CG) is not built (four groups need NT <= 2).
      auto run_cg = [&](int cg, const Params& qq) {
        switch (nt * 10 + cg) {
          case 11: launch_cg<1, 1>(qq, s); return true;
          case 12: launch_cg<1, 2>(qq, s); return true;
          case 14: launch_cg<1, 4>(qq, s); return true;
          case 21: launch_cg<2, 1>(qq, s); return true;
          case 22: launch_cg<2, 2>(qq, s); return true;
          case 24: launch_cg<2, 4>(qq, s); return true;
          case 41: launch_cg<4, 1>(qq, s); return true;
          case 42: launch_cg<4, 2>(qq, s); return true;
          case 81: launch_cg<8, 1>(qq, s); return true;
          case 82: launch_cg<8, 2>(qq, s); return true;
          default: return false;
        }
      };
      CK(cudaMemset(y1, 0xFF, kMaxRows * sh.u * 2));
      CK(run_library(make_params(cs[0], x, y1, sh.k, sh.u, m)));
      CK(cudaStreamSynchronize(s));
      std::vector<uint16_t> a(size_t(m * sh.u)), b(a.size());
      CK(cudaMemcpy(a.data(), y1, a.size() * 2, cudaMemcpyDeviceToHost));
      bool same = true;
      float tg[4] = {0.f, 0.f, 0.f, 0.f};
      for (int ci = 0; ci < 3; ++ci) {
        const int cg = 1 << ci;
        CK(cudaMemset(y2, 0xFF, kMaxRows * sh.u * 2));
        if (!run_cg(cg, make_params(cs[0], x, y2, sh.k, sh.u, m))) continue;
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
        same = same && std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
        tg[ci + 1] = replay_us(s, 2 * copies, [&](int c) { run_cg(cg, make_params(cs[c % copies], x, y2, sh.k, sh.u, m)); });
      }
      tg[0] = replay_us(s, 2 * copies, [&](int c) { (void)run_library(make_params(cs[c % copies], x, y1, sh.k, sh.u, m)); });
      auto tbs = [&](float us) { return us > 0.f ? bytes / us * 1e-6 : 0.0; };
      std::printf("cg %-10s %3d | library %8.2f | lean cg1 %8.2f  cg2 %8.2f  cg4 %8.2f us | %.3f %.3f %.3f %.3f TB/s  %s\n",
                  sh.name, m, tg[0], tg[1], tg[2], tg[3], tbs(tg[0]), tbs(tg[1]), tbs(tg[2]), tbs(tg[3]),
                  same ? "(Y bit-identical)" : "(Y DIFFERS)");
    }
    for (Copy& c : cs) {
      CK(cudaFree(c.words));
      CK(cudaFree(c.scales));
      CK(cudaFree(c.biases));
    }
    CK(cudaFree(x));
    CK(cudaFree(y1));
    CK(cudaFree(y2));
  }
  return 0;
}
