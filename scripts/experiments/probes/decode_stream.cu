// Experiment h75 (docs/notes/drop-in-and-decode.md, the small shapes' bar): the decode kernel's sums fed
// by a shared-memory ring that bulk copies fill, against the same sums on
// register loads, in CUDA-graph replay with the weights rotated past L2 (as
// `gatedmlp bench` times). Standalone, not library code; no epilogue (the
// sums go to a sink), so what it times is the weight stream and the math.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/decode_stream.cu -o decode_stream && ./decode_stream
// A CTA owns 8 output columns (8 gate rows at j, 8 up rows at U + j of the
// stacked [2U, K] bf16 weights) over all of K, in k-blocks of 128; lane
// (g, t) of a warp multiplies rows g and 8 + g at k0 + 32u + 8t with
// mma.m16n8k16 (the weights as A, tokens as B), as the decode kernel does.
//   reg      the decode kernel's form: warp w loads k-blocks w, w + W, ...
//            into registers (W = min(k-blocks, 8)), 3 CTAs per SM
//   tmS      a producer warp fills an S-slot ring, one k-block (16 rows x
//            128 k, 4 KB) per slot, with one box of a 4-D tensor map
//            (K, 8 rows, 2 halves, U / 8); consumer warp w (of S) takes the
//            k-blocks of slot w, from shared memory
//   rbS      the same ring filled by 16 one-row bulk copies (cp.async.bulk,
//            256 bytes each) per k-block, no tensor map
//   reg+smem reg launched with the epilogue's dynamic shared memory, unused
//   reg+epi  reg with the decode kernel's end of a tile: partial sums
//            through shared memory, __syncthreads, one thread per output
//            summing them, silu(g) * u stored as bf16, __syncthreads
//   ownS     a CTA of S warps per 8 columns, each warp taking every S-th
//            k-block with the next one's loads in flight under this one's
//            mma (two register buffers); a lean end: warps 1 ... S-1 hand
//            their C fragments to warp 0 through shared memory, which adds
//            them in order and stores silu(g) * u straight from the
//            fragment (S = 1: no shared memory, no barrier)
// Then a check: every variant that stores Y (reg+epi, ownS) against
// reg+epi on random inputs (max |difference| / max |Y|).
// per shape, M = 1 and 16: us per call (median of 7 replays of 20 calls).
#include <cuda_bf16.h>

#include <cmath>

#include "h75_common.cuh"

__device__ __forceinline__ uint4 ldx(const void* p, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (ok) asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// One k-block's sums: wa[u][h] rows g (h = 0) and 8 + g (h = 1) at k0 + 32u + 8t.
template <int NT>
__device__ __forceinline__ void kblock(float (&acc)[NT][4], const uint4 (&wa)[4][2], const __nv_bfloat16* x, int64_t k,
                                       int64_t k0, int m) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  uint4 xb[4][NT];
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = min(nt * 8 + g, m - 1);
      xb[u][nt] = ldx(x + row * k + k0 + 32 * u + 8 * t, k0 + 32 * u + 8 * t < k);
    }
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma(acc[nt], wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, xb[u][nt].x, xb[u][nt].y);
      mma(acc[nt], wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, xb[u][nt].z, xb[u][nt].w);
    }
}

template <int NT>
__device__ __forceinline__ void sink_out(const float (&acc)[NT][4], unsigned* sink) {
  float s = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s += acc[nt][0] + acc[nt][1] + acc[nt][2] + acc[nt][3];
  if (s == 1234.5f) *sink = 1;
}

// EPI: the decode kernel's end of a tile: each warp's C fragments into
// shared memory (dynamic), __syncthreads, one thread per (token, column)
// summing the warps' partials and storing silu(g) * u as bf16, __syncthreads.
template <int NT, bool EPI>
__global__ void __launch_bounds__(256, 3) reg(const __nv_bfloat16* w, const __nv_bfloat16* x, int64_t k, int64_t u,
                                             int m, unsigned* sink, __nv_bfloat16* y) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int64_t j = int64_t(blockIdx.x) * 8 + g;
  const __nv_bfloat16* row[2] = {w + j * k + 8 * t, w + (u + j) * k + 8 * t};
  float acc[NT][4] = {};
  for (int64_t k0 = int64_t(warp) * 128; k0 < k; k0 += int64_t(warps) * 128) {
    uint4 wa[4][2];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wa[c][h] = k0 + 32 * c + 8 * t < k ? ld_stream(row[h] + k0 + 32 * c) : make_uint4(0, 0, 0, 0);
    kblock<NT>(acc, wa, x, k, k0, m);
  }
  if constexpr (!EPI) {
    sink_out<NT>(acc, sink);
  } else {
    extern __shared__ float red[];
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp * (NT * 128) + (nt * 4 + r) * 32 + lane] = acc[nt][r];
    __syncthreads();
    for (int e = threadIdx.x; e < 8 * m; e += blockDim.x) {
      const int c = e % 8, mm = e / 8, nt = mm >> 3, parity = mm & 1;
      const float* part = red + nt * 128 + ((c & 7) << 2) + ((mm & 7) >> 1);
      float gs = 0.f, us = 0.f;
      for (int i = 0; i < warps; ++i) {
        gs += part[i * (NT * 128) + parity * 32];
        us += part[i * (NT * 128) + (2 + parity) * 32];
      }
      y[int64_t(mm) * u + int64_t(blockIdx.x) * 8 + c] = __float2bfloat16(gs / (1.f + __expf(-gs)) * us);
    }
    __syncthreads();
  }
}

// The ring: S slots of one k-block (16 rows x 128 k, rows 256 bytes apart:
// [half][row][k], as the tensor map's box lands), S consumer warps and a
// producer warp. TM: a tensor-map box per slot; else 16 one-row bulk copies.
template <int NT, int S, bool TM>
__global__ void __launch_bounds__(32 * (S + 1)) ring(const __grid_constant__ CUtensorMap map, const __nv_bfloat16* w,
                                                    const __nv_bfloat16* x, int64_t k, int64_t u, int m,
                                                    unsigned* sink) {
  __shared__ __align__(128) char slots[S][4096];
  __shared__ uint64_t full[S], empty[S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kbs = (k + 127) / 128;
  ring_init<S>(full, empty, 1);
  __syncthreads();
  const int64_t j0 = int64_t(blockIdx.x) * 8;
  if (warp == S) {  // the producer
    for (int64_t p = 0; p < kbs; ++p) {
      const int st = int(p % S);
      if (p >= S) bar_wait(&empty[st], uint32_t((p / S - 1) & 1));
      if constexpr (TM) {
        if (lane == 0) {
          arrive_expect(&full[st], 4096);
          asm volatile(
              "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
              "%4, %5}], [%6];" ::"r"(saddr(slots[st])),
              "l"(&map), "r"(int(p * 128)), "r"(0), "r"(0), "r"(int(blockIdx.x)), "r"(saddr(&full[st]))
              : "memory");
        }
      } else {
        // 16 lanes, one row each; the K tail copies only what is there (the
        // consumers zero what lies past K).
        const uint32_t bytes = uint32_t((k - p * 128 < 128 ? k - p * 128 : 128) * 2);
        if (lane == 0)
          arrive_expect(&full[st], 16 * bytes);
        __syncwarp();
        if (lane < 16) {
          const int h = lane >> 3, r = lane & 7;
          const __nv_bfloat16* src = w + (h * u + j0 + r) * k + p * 128;
          bulk_copy(slots[st] + lane * 256, src, bytes, &full[st]);
        }
      }
    }
    return;
  }
  float acc[NT][4] = {};
  for (int64_t p = warp; p < kbs; p += S) {
    const int st = warp;
    bar_wait(&full[st], uint32_t((p / S) & 1));
    uint4 wa[4][2];
    const int64_t k0 = p * 128;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wa[c][h] = k0 + 32 * c + 8 * t < k ? *reinterpret_cast<const uint4*>(slots[st] + (h * 8 + g) * 256 + (32 * c + 8 * t) * 2)
                                           : make_uint4(0, 0, 0, 0);
    __syncwarp();
    if (lane == 0) arrive(&empty[st]);
    kblock<NT>(acc, wa, x, k, k0, m);
  }
  sink_out<NT>(acc, sink);
}

// The ownS variants (see the top): a CTA of S warps owns 8 columns.
template <int NT, int S>
__global__ void __launch_bounds__(32 * S) own(const __nv_bfloat16* w, const __nv_bfloat16* x, int64_t k, int64_t u,
                                             int m, __nv_bfloat16* y) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j = int64_t(blockIdx.x) * 8 + g;
  const __nv_bfloat16* row[2] = {w + j * k + 8 * t, w + (u + j) * k + 8 * t};
  const int64_t kbs = (k + 127) / 128;
  auto load = [&](uint4(&wa)[4][2], int64_t kb) {
    const int64_t k0 = kb * 128;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wa[c][h] = k0 + 32 * c + 8 * t < k ? ld_stream(row[h] + k0 + 32 * c) : make_uint4(0, 0, 0, 0);
  };
  float acc[NT][4] = {};
  uint4 cur[4][2], nxt[4][2];
  if (warp < kbs) load(cur, warp);
  for (int64_t kb = warp; kb < kbs; kb += S) {
    if (kb + S < kbs) load(nxt, kb + S);
    kblock<NT>(acc, cur, x, k, kb * 128, m);
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) cur[c][h] = nxt[c][h];
  }
  if constexpr (S > 1) {
    __shared__ float xfer[S - 1][NT][4][32];
    if (warp > 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) xfer[warp - 1][nt][r][lane] = acc[nt][r];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int i = 0; i < S - 1; ++i)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[nt][r] += xfer[i][nt][r][lane];
  }
  // Lane (g, t): acc[nt][p] the gate of column j for token nt * 8 + 2t + p,
  // acc[nt][2 + p] its up.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int token = nt * 8 + 2 * t + p;
      const float gv = acc[nt][p], uv = acc[nt][2 + p];
      if (token < m) y[int64_t(token) * u + j] = __float2bfloat16(gv / (1.f + __expf(-gv)) * uv);
    }
}

int main() {
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const char* names[] = {"reg", "tm4", "tm8", "rb4", "rb8", "reg+smem", "reg+epi", "own1", "own2", "own4"};
  constexpr int kVariants = 10;
  std::printf("%-10s %3s |", "shape", "M");
  for (const char* n : names) std::printf(" %8s", n);
  std::printf("   (us per call)\n");
  for (const SmallShape& sh : kSmallShapes) {
    const int64_t bytes = 2 * sh.u * sh.k * 2;
    const std::vector<void*> bufs = rotated_buffers(bytes, 0);
    const int copies = int(bufs.size());
    std::vector<CUtensorMap> maps;
    for (void* b : bufs) maps.push_back(make_decode_map(b, sh.k, sh.u, 128, 1));
    for (void* b : bufs) fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(b), bytes / 2, 0x1234u);
    __nv_bfloat16 *x, *y;
    CK(cudaMalloc(&x, 16 * sh.k * 2));
    fill_random<<<64, 256>>>(x, 16 * sh.k, 0x9876u);
    CK(cudaDeviceSynchronize());
    CK(cudaMalloc(&y, 16 * sh.u * 2));
    for (int m : {1, 16}) {
      std::printf("%-10s %3d |", sh.name, m);
      const unsigned grid = unsigned(sh.u / 8);
      const int64_t kbs = (sh.k + 127) / 128;
      const bool two = m > 8;
      // Variant v's launch on weight copy c.
      auto launch = [&](int v, int c) {
        const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(bufs[c % copies]);
        const CUtensorMap& mp = maps[c % copies];
        switch (v) {
          case 0:
          case 5:
          case 6: {
            // 5: as 0 with the epilogue's dynamic shared memory allocated
            // and unused; 6: with the epilogue.
            const unsigned th = unsigned(32 * std::min<int64_t>(kbs, 8));
            const size_t red = v == 0 ? 0 : size_t(th / 32) * (two ? 2 : 1) * 512;
            if (v == 6) {
              if (two) reg<2, true><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
              else reg<1, true><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
            } else {
              if (two) reg<2, false><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
              else reg<1, false><<<grid, th, red, s>>>(w, x, sh.k, sh.u, m, sink, y);
            }
            break;
          }
          case 1:
            if (two) ring<2, 4, true><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            else ring<1, 4, true><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            break;
          case 2:
            if (two) ring<2, 8, true><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            else ring<1, 8, true><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            break;
          case 7:
            if (two) own<2, 1><<<grid, 32, 0, s>>>(w, x, sh.k, sh.u, m, y);
            else own<1, 1><<<grid, 32, 0, s>>>(w, x, sh.k, sh.u, m, y);
            break;
          case 8:
            if (two) own<2, 2><<<grid, 64, 0, s>>>(w, x, sh.k, sh.u, m, y);
            else own<1, 2><<<grid, 64, 0, s>>>(w, x, sh.k, sh.u, m, y);
            break;
          case 9:
            if (two) own<2, 4><<<grid, 128, 0, s>>>(w, x, sh.k, sh.u, m, y);
            else own<1, 4><<<grid, 128, 0, s>>>(w, x, sh.k, sh.u, m, y);
            break;
          case 3:
            if (two) ring<2, 4, false><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            else ring<1, 4, false><<<grid, 160, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            break;
          default:
            if (two) ring<2, 8, false><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
            else ring<1, 8, false><<<grid, 288, 0, s>>>(mp, w, x, sh.k, sh.u, m, sink);
        }
      };
      for (int v = 0; v < kVariants; ++v) {
        const float us = replay_us(s, 20, [&](int c) { launch(v, c); });
        std::printf(" %8.2f", us);
      }
      // The variants that store Y against reg+epi, on weight copy 0.
      std::vector<__nv_bfloat16> want(size_t(m) * sh.u), got(size_t(m) * sh.u);
      launch(6, 0);
      CK(cudaMemcpy(want.data(), y, want.size() * 2, cudaMemcpyDeviceToHost));
      float top = 0.f;
      for (auto v : want) top = std::max(top, std::fabs(__bfloat162float(v)));
      std::printf("   check vs reg+epi (max |Y| %.3g):", top);
      for (int v = 7; v < kVariants; ++v) {
        CK(cudaMemset(y, 0xff, want.size() * 2));
        launch(v, 0);
        CK(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost));
        float worst = 0.f;
        for (size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::fabs(__bfloat162float(got[i]) - __bfloat162float(want[i])));
        std::printf(" %s %.2e", names[v], worst / top);
      }
      std::printf("\n");
    }
    for (void* b : bufs) CK(cudaFree(b));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  return 0;
}
