// Experiment h75 (docs/notes/drop-in-and-decode.md, the small shapes' floor): how fast one kernel can read
// the weight bytes of the small decode shapes, in CUDA-graph replay with the
// buffers rotated past L2, as `gatedmlp bench` times its kernels.
// Standalone, not library code.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/read_floor.cu -o read_floor && ./read_floor
//   ./read_floor quant   (h91: the quantized formats' bytes on the quantized issue's shapes; quant_floor below)
// (h75_common.cuh, beside it, holds what it shares with decode_stream.cu.)
// Per size (MB, as the shapes' 2 x U x K x 2 bytes) and launch shape:
//   flat    one 16-byte load per thread of a grid covering the bytes once
//           (every load issued at the start: the most bytes in flight)
//   gsN     a grid of N CTAs per SM striding over the bytes, 4 loads in
//           flight per thread per step
//   rows    the decode kernel's loads without its math: a CTA per 8 output
//           columns (8 gate rows at j, 8 up rows at U + j), a warp per
//           k-block of 4 x 32 k (at most 8 warps), lane (g, t) 16 bytes of
//           rows g at k0 + 32u + 8t, 3 CTAs per SM
//   bRsS    one CTA per R gate rows and their R up rows (two contiguous
//           R x K regions), streamed by one thread with 1-D bulk copies
//           (cp.async.bulk) in stages of 2 x 4 KB through an S-stage ring
//           that 4 consumer warps read and release
//   tGcBsS  the same ring fed by a tensor map instead: the stacked [2U, K]
//           weights viewed as (K, 8 rows, 2 halves, U / 8 groups), one box of
//           B k x 8 rows x gate and up x G groups per stage (G = 1: the
//           decode kernel's 8 columns; 8 G x 2 rows of B x 2 bytes each)
// us per call (median of 7 graph replays of 20 calls each) and TB/s.
#include <cstring>

#include "h75_common.cuh"

// The xor of everything read goes to *sink only if it equals a value no
// input has, so that no load is dead code.
__global__ void flat(const uint4* p, int64_t n, unsigned* sink) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint4 v = ld_stream(p + i);
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x9e3779b9u) *sink = 1;
}

__global__ void gridstride(const uint4* p, int64_t n, unsigned* sink) {
  if (xor_gridstride(p, n) == 0x9e3779b9u) *sink = 1;
}

// The decode kernel's pattern (decode_glu.cuh) with an xor for its math.
__global__ void __launch_bounds__(256, 3) rows(const uint4* w, int64_t k, int64_t u, unsigned* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j = int64_t(blockIdx.x) * 8 + g;
  const char* gate = reinterpret_cast<const char*>(w) + (j * k + 8 * t) * 2;
  const char* up = reinterpret_cast<const char*>(w) + ((u + j) * k + 8 * t) * 2;
  unsigned acc = 0;
  for (int64_t k0 = int64_t(warp) * 128; k0 < k; k0 += int64_t(warps) * 128) {
    uint4 a[4], b[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const bool ok = k0 + 32 * c + 8 * t < k;
      a[c] = ok ? ld_stream(reinterpret_cast<const uint4*>(gate + (k0 + 32 * c) * 2)) : make_uint4(0, 0, 0, 0);
      b[c] = ok ? ld_stream(reinterpret_cast<const uint4*>(up + (k0 + 32 * c) * 2)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) acc ^= a[c].x ^ b[c].y ^ a[c].z ^ b[c].w;
  }
  __shared__ unsigned red[8];
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned r = 0;
    for (int i = 0; i < warps; ++i) r ^= red[i];
    if (r == 0x9e3779b9u) *sink = 1;
  }
}

// 1-D bulk copies of a CTA's two contiguous regions (R gate rows, R up rows
// of K each), 2 x kPiece bytes per stage, S stages.
constexpr int kPiece = 4096;
template <int S>
__global__ void __launch_bounds__(160) bulk(const char* w, int64_t k, int64_t u, int r, unsigned* sink) {
  extern __shared__ __align__(128) char ring[];
  __shared__ uint64_t full[S], empty[S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t region = int64_t(r) * k * 2;
  const char* gate = w + int64_t(blockIdx.x) * region;
  const char* up = w + u * k * 2 + int64_t(blockIdx.x) * region;
  const int64_t pieces = (region + kPiece - 1) / kPiece;
  ring_init<S>(full, empty, 4);
  __syncthreads();
  if (warp == 4) {
    if (lane == 0) {
      for (int64_t p = 0; p < pieces; ++p) {
        const int st = int(p % S);
        if (p >= S) bar_wait(&empty[st], uint32_t((p / S - 1) & 1));
        const uint32_t bytes = uint32_t(region - p * kPiece < kPiece ? region - p * kPiece : kPiece);
        arrive_expect(&full[st], 2 * bytes);
        char* dst = ring + st * 2 * kPiece;
        bulk_copy(dst, gate + p * kPiece, bytes, &full[st]);
        bulk_copy(dst + kPiece, up + p * kPiece, bytes, &full[st]);
      }
    }
    return;
  }
  unsigned acc = 0;
  for (int64_t p = 0; p < pieces; ++p) {
    const int st = int(p % S);
    bar_wait(&full[st], uint32_t((p / S) & 1));
    acc ^= reinterpret_cast<const unsigned*>(ring + st * 2 * kPiece)[threadIdx.x];
    __syncwarp();
    if (lane == 0) arrive(&empty[st]);
  }
  if (acc == 0x9e3779b9u) *sink = 1;
}

// One box of a 4-D tensor map per stage.
template <int S>
__global__ void __launch_bounds__(160) tmap(const __grid_constant__ CUtensorMap map, int64_t k, int bk, int gpc,
                                            uint32_t box_bytes, unsigned* sink) {
  extern __shared__ __align__(128) char ring[];
  __shared__ uint64_t full[S], empty[S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t kbs = (k + bk - 1) / bk;
  ring_init<S>(full, empty, 4);
  __syncthreads();
  if (warp == 4) {
    if (lane == 0) {
      for (int64_t p = 0; p < kbs; ++p) {
        const int st = int(p % S);
        if (p >= S) bar_wait(&empty[st], uint32_t((p / S - 1) & 1));
        arrive_expect(&full[st], box_bytes);
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
            "%5}], [%6];" ::"r"(saddr(ring + st * box_bytes)),
            "l"(&map), "r"(int(p * bk)), "r"(0), "r"(0), "r"(int(blockIdx.x) * gpc), "r"(saddr(&full[st]))
            : "memory");
      }
    }
    return;
  }
  unsigned acc = 0;
  for (int64_t p = 0; p < kbs; ++p) {
    const int st = int(p % S);
    bar_wait(&full[st], uint32_t((p / S) & 1));
    acc ^= reinterpret_cast<const unsigned*>(ring + st * box_bytes)[threadIdx.x];
    __syncwarp();
    if (lane == 0) arrive(&empty[st]);
  }
  if (acc == 0x9e3779b9u) *sink = 1;
}

__global__ void empty_kernel() {}

// `read_floor quant` (h91, docs/notes/quantized-decode.md): the same floor for
// the quantized issue's roofline bar, whose shapes include two small ones.
// Per shape and format, the bytes a gate/up call at M = 1 must read (packed
// words with their scales and biases; X and Y add under 0.1 %) read by the
// pattern-free launch shapes above (flat, gsN), against the read rate of
// the same run (a 2 GiB read, as the benchmark's `torch.sum`) and an empty
// kernel's time in the same replay: the share of the roofline that any
// kernel reading those bytes once can reach.
int quant_floor(cudaStream_t s, int sms, unsigned* sink) {
  struct Q { const char* name; int64_t k, u; };
  const Q shapes[] = {{"8b", 4096, 14336}, {"70b", 8192, 28672}, {"qwen3-32b", 5120, 25600},
                      {"2048x8192", 2048, 8192}, {"1024x2816", 1024, 2816}};
  // Bytes per weight element: words, and per group of 64 (or block) its scales.
  struct F { const char* name; double per_elem; };
  const F formats[] = {{"int4-g64", 0.5 + 4.0 / 64}, {"mxfp4", 0.5 + 1.0 / 32}, {"int8-g64", 1.0 + 4.0 / 64},
                       {"fp8-block", 1.0 + 4.0 / (128.0 * 128.0)}, {"bf16", 2.0}};
  const int threads = 256;
  auto best_read = [&](const std::vector<void*>& bufs, int64_t bytes) {
    const int64_t n = bytes / 16;
    const int copies = int(bufs.size());
    float best = 1e30f;
    for (int v = 0; v < 4; ++v) {
      const int per_sm[] = {0, 2, 4, 8};
      const float us = replay_us(s, 20, [&](int c) {
        const uint4* p = static_cast<const uint4*>(bufs[c % copies]);
        if (v == 0) flat<<<unsigned((n + threads - 1) / threads), threads, 0, s>>>(p, n, sink);
        else gridstride<<<unsigned(per_sm[v] * sms), threads, 0, s>>>(p, n, sink);
      });
      best = std::min(best, us);
    }
    return best;
  };
  const float empty = replay_us(s, 20, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); });
  const int64_t big = int64_t(2) << 30;
  void* bigbuf;
  CK(cudaMalloc(&bigbuf, big));
  CK(cudaMemset(bigbuf, 1, big));
  const float big_us = best_read({bigbuf}, big);
  CK(cudaFree(bigbuf));
  const double rate = big / (big_us * 1e-6);
  std::printf("# empty kernel %.2f us per call; 2 GiB read %.1f us, %.2f TB/s (the rate)\n", empty, big_us, rate / 1e12);
  std::printf("%-10s %-9s %8s | %9s %8s %9s %8s\n", "shape", "format", "MB", "floor us", "TB/s", "roof us",
              "floor/roof");
  for (const Q& q : shapes)
    for (const F& f : formats) {
      const int64_t bytes = (int64_t(2 * q.u * q.k * f.per_elem) + 15) / 16 * 16;
      const std::vector<void*> bufs = rotated_buffers(bytes, 1);
      const float us = best_read(bufs, bytes);
      const double roof = bytes / rate * 1e6;
      std::printf("%-10s %-9s %8.2f | %9.2f %8.2f %9.2f %7.1f %%\n", q.name, f.name, bytes / 1e6, us,
                  bytes / (us * 1e-6) / 1e12, roof, 100.0 * roof / us);
      for (void* b : bufs) CK(cudaFree(b));
    }
  return 0;
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  for (auto kernel : {tmap<4>, tmap<6>, tmap<8>})
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 * 1024));
  CK(cudaFuncSetAttribute(bulk<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 2 * kPiece));
  CK(cudaFuncSetAttribute(bulk<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 2 * kPiece));
  CK(cudaFuncSetAttribute(bulk<12>, cudaFuncAttributeMaxDynamicSharedMemorySize, 12 * 2 * kPiece));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  if (argc > 1 && std::strcmp(argv[1], "quant") == 0) return quant_floor(s, sms, sink);
  std::printf("%-10s %8s | %-6s %9s %8s\n", "shape", "MB", "kernel", "us", "TB/s");
  const char* names[] = {"flat", "gs2", "gs4", "gs8", "rows", "b8s4", "b8s8", "b16s8", "b32s8", "b64s12",
                         "t1c128s4", "t1c256s4", "t4c128s4", "t4c64s8", "t2c128s6"};
  const int per_sm[] = {0, 2, 4, 8};
  const int bulk_rows[] = {0, 0, 0, 0, 0, 8, 8, 16, 32, 64}, bulk_stages[] = {0, 0, 0, 0, 0, 4, 8, 8, 8, 12};
  const int tm_g[] = {1, 1, 4, 4, 2}, tm_bk[] = {128, 256, 128, 64, 128}, tm_s[] = {4, 4, 4, 8, 6};
  for (const SmallShape& sh : kSmallShapes) {
    const int64_t bytes = 2 * sh.u * sh.k * 2;
    const int64_t n = bytes / 16;
    const std::vector<void*> bufs = rotated_buffers(bytes, 1);
    const int copies = int(bufs.size());
    std::vector<CUtensorMap> maps[5];
    for (int v = 0; v < 5; ++v)
      for (void* b : bufs) maps[v].push_back(make_decode_map(b, sh.k, sh.u, tm_bk[v], tm_g[v]));
    for (int variant = 0; variant < 15; ++variant) {
      const int threads = 256;
      const float us = replay_us(s, 20, [&](int c) {
        const uint4* p = static_cast<const uint4*>(bufs[c % copies]);
        if (variant == 0) {
          flat<<<unsigned((n + threads - 1) / threads), threads, 0, s>>>(p, n, sink);
        } else if (variant < 4) {
          gridstride<<<unsigned(per_sm[variant] * sms), threads, 0, s>>>(p, n, sink);
        } else if (variant == 4) {
          const int64_t kb = (sh.k + 127) / 128;
          rows<<<unsigned(sh.u / 8), unsigned(32 * (kb < 8 ? kb : 8)), 0, s>>>(p, sh.k, sh.u, sink);
        } else if (variant < 10) {
          const char* wp = reinterpret_cast<const char*>(p);
          const int r = bulk_rows[variant], st = bulk_stages[variant];
          const unsigned grid = unsigned(sh.u / r);
          const int smem = st * 2 * kPiece;
          if (st == 4) bulk<4><<<grid, 160, smem, s>>>(wp, sh.k, sh.u, r, sink);
          else if (st == 8) bulk<8><<<grid, 160, smem, s>>>(wp, sh.k, sh.u, r, sink);
          else bulk<12><<<grid, 160, smem, s>>>(wp, sh.k, sh.u, r, sink);
        } else {
          const int v = variant - 10;
          const uint32_t box = uint32_t(tm_bk[v]) * 16 * tm_g[v] * 2;
          const unsigned grid = unsigned(sh.u / 8 / tm_g[v]);
          const int smem = int(box) * tm_s[v];
          const CUtensorMap& mp = maps[v][c % copies];
          if (tm_s[v] == 4) tmap<4><<<grid, 160, smem, s>>>(mp, sh.k, tm_bk[v], tm_g[v], box, sink);
          else if (tm_s[v] == 6) tmap<6><<<grid, 160, smem, s>>>(mp, sh.k, tm_bk[v], tm_g[v], box, sink);
          else tmap<8><<<grid, 160, smem, s>>>(mp, sh.k, tm_bk[v], tm_g[v], box, sink);
        }
      });
      std::printf("%-10s %8.1f | %-6s %9.2f %8.2f\n", sh.name, bytes / 1e6, names[variant], us, bytes / (us * 1e-6) / 1e12);
    }
    for (void* b : bufs) CK(cudaFree(b));
  }
  return 0;
}
