// Experiment h98 (docs/notes/moe.md, the decode bar's own ceiling): how fast
// one kernel can read the gate/up bytes of the experts a decode step touches,
// routed as scripts/bench_moe.py routes them, in CUDA-graph replay. The MoE
// counterpart of read_floor.cu's `quant` mode (h91). Standalone, not library
// code.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/moe_read_floor.cu -o moe_read_floor && ./moe_read_floor
// Per model, format and T (tokens per step, each to k distinct experts drawn
// uniformly, afresh for each of 16 steps; the experts' weights in two copies
// that the steps alternate, as bench_moe.py lays them out), two kernels,
// each at its best of five launch shapes (`flat`: one 16-byte load per
// thread, every load issued at the start; `N/SM`: N CTAs per SM over the
// grid, shared by the expected distinct experts, grid-stride):
//   listed   the distinct experts of each step listed by the host beforehand
//            (no routing work on the device): grid (CTAs per expert, slots),
//            CTA (x, y) reads its share of listed expert y's bytes
//   routed   the same loads, the experts found by the kernel as the library's
//            gathered kernels find them (decode_glu/gather.cuh): every CTA
//            reads the step's T x k ids, marks the chosen experts in shared
//            memory, and takes the y-th chosen one (grid rows: min(E, T k))
// us per step (median of 7 replays of the 16 steps), and the read rate on
// the distinct experts' bytes against a 2 GiB read in the same run.
#include <cstring>
#include <random>

#include "h75_common.cuh"

__global__ void empty_kernel() {}

// list: the step's distinct experts, count of them first.
__global__ void listed(const uint4* w, int64_t per_expert, const int* list, unsigned* sink) {
  if (int(blockIdx.y) >= list[0]) return;
  const uint4* e = w + int64_t(list[1 + blockIdx.y]) * per_expert;
  if (xor_gridstride(e, per_expert) == 0x9e3779b9u) *sink = 1;
}

// ids: the step's T x k expert ids.
__global__ void routed(const uint4* w, int64_t per_expert, const int* ids, int n_ids, int experts, unsigned* sink) {
  __shared__ unsigned mask[32];  // up to 1024 experts
  for (int i = threadIdx.x; i < 32; i += blockDim.x) mask[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_ids; i += blockDim.x) atomicOr(&mask[ids[i] >> 5], 1u << (ids[i] & 31));
  __syncthreads();
  // The y-th chosen expert: a scan of the mask's words (at most 32).
  int want = int(blockIdx.y), e = -1;
  for (int wd = 0; wd * 32 < experts && e < 0; ++wd) {
    const int c = __popc(mask[wd]);
    if (want < c) {
      unsigned m = mask[wd];
      for (int j = 0; j < want; ++j) m &= m - 1;
      e = wd * 32 + __ffs(m) - 1;
    } else {
      want -= c;
    }
  }
  if (e < 0) return;
  if (xor_gridstride(w + int64_t(e) * per_expert, per_expert) == 0x9e3779b9u) *sink = 1;
}

__global__ void gridstride(const uint4* p, int64_t n, unsigned* sink) {
  if (xor_gridstride(p, n) == 0x9e3779b9u) *sink = 1;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const int threads = 256;

  const float empty = replay_us(s, 16, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); });
  const int64_t big = int64_t(2) << 30;
  void* bigbuf;
  CK(cudaMalloc(&bigbuf, big));
  CK(cudaMemset(bigbuf, 1, big));
  float big_us = 1e30f;
  for (int per_sm : {2, 4, 8})
    big_us = std::min(big_us, replay_us(s, 4, [&](int) {
                        gridstride<<<unsigned(per_sm * sms), threads, 0, s>>>(static_cast<const uint4*>(bigbuf), big / 16,
                                                                                sink);
                      }));
  CK(cudaFree(bigbuf));
  const double rate = big / (big_us * 1e-6);
  std::printf("# empty kernel %.2f us per call; 2 GiB read %.1f us, %.2f TB/s (the rate)\n", empty, big_us, rate / 1e12);

  struct M {
    const char* name;
    int experts, k;
    int64_t hidden, inter;
  };
  const M models[] = {{"gpt-oss-20b", 32, 4, 2880, 2880}, {"qwen3-30b-a3b", 128, 8, 2048, 768}, {"mixtral", 8, 2, 4096, 14336}};
  // Bytes per weight element of the gate/up rows: words, and per group its scales (and biases).
  struct F {
    const char* name;
    double per_elem;
  };
  const F formats[] = {{"bf16", 2.0}, {"int4-g64", 0.5 + 4.0 / 64}, {"mxfp4", 0.5 + 1.0 / 32}};
  const int steps = 16;
  std::printf("%-14s %-9s %4s %7s %9s | %9s %-8s %8s %9s %-8s %8s\n", "model", "format", "T", "experts", "MB",
              "listed us", "best", "% rate", "routed us", "best", "% rate");
  std::mt19937 rng(98);
  for (const M& m : models)
    for (const F& f : formats) {
      const int64_t per_expert = (int64_t(2 * m.inter * m.hidden * f.per_elem) + 15) / 16;  // uint4s
      const int64_t all = per_expert * m.experts;
      std::vector<void*> copies(2);
      for (auto& b : copies) {
        CK(cudaMalloc(&b, all * 16));
        CK(cudaMemset(b, 1, all * 16));
      }
      for (int t : {1, 4, 16, 64}) {
        // Each step's ids (k distinct per token) and the list of distinct experts.
        std::vector<int> ids(size_t(steps) * t * m.k), lists(size_t(steps) * (m.experts + 1), 0);
        double distinct = 0;
        for (int st = 0; st < steps; ++st) {
          std::vector<char> seen(m.experts, 0);
          for (int tok = 0; tok < t; ++tok) {
            std::vector<int> perm(m.experts);
            for (int e = 0; e < m.experts; ++e) perm[e] = e;
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int j = 0; j < m.k; ++j) {
              ids[(size_t(st) * t + tok) * m.k + j] = perm[j];
              seen[perm[j]] = 1;
            }
          }
          int* l = &lists[size_t(st) * (m.experts + 1)];
          for (int e = 0; e < m.experts; ++e)
            if (seen[e]) l[1 + l[0]++] = e;
          distinct += l[0];
        }
        distinct /= steps;
        int *d_ids, *d_lists;
        CK(cudaMalloc(&d_ids, ids.size() * 4));
        CK(cudaMalloc(&d_lists, lists.size() * 4));
        CK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_lists, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
        const int slots = std::min(m.experts, t * m.k);
        const double bytes = distinct * per_expert * 16;
        // Launch shapes: 0: one load per thread; else CTAs per SM over the grid.
        const int shapes[] = {0, 2, 4, 8, 16};
        const char* names[] = {"flat", "2/SM", "4/SM", "8/SM", "16/SM"};
        float best[2] = {1e30f, 1e30f};
        int which[2] = {0, 0};
        for (int routed_v = 0; routed_v < 2; ++routed_v)
          for (int v = 0; v < 5; ++v) {
            // Grid x: CTAs per expert, with the expected distinct experts sharing the SMs.
            int64_t gx = shapes[v] == 0 ? (per_expert + threads - 1) / threads
                                        : std::max<int64_t>(1, int64_t(shapes[v]) * sms / std::max(1.0, distinct));
            gx = std::min<int64_t>(gx, (per_expert + threads - 1) / threads);
            const dim3 grid{unsigned(gx), unsigned(slots)};
            const float us = replay_us(s, steps, [&](int st) {
              const uint4* w = static_cast<const uint4*>(copies[st % 2]);
              if (routed_v)
                routed<<<grid, threads, 0, s>>>(w, per_expert, d_ids + size_t(st) * t * m.k, t * m.k, m.experts, sink);
              else
                listed<<<grid, threads, 0, s>>>(w, per_expert, d_lists + size_t(st) * (m.experts + 1), sink);
            });
            if (us < best[routed_v]) best[routed_v] = us, which[routed_v] = v;
          }
        const double roof = bytes / rate * 1e6;
        std::printf("%-14s %-9s %4d %7.1f %9.2f | %9.2f %-8s %7.1f %% %9.2f %-8s %7.1f %%\n", m.name, f.name, t, distinct,
                    bytes / 1e6, best[0], names[which[0]], 100.0 * roof / best[0], best[1], names[which[1]],
                    100.0 * roof / best[1]);
        CK(cudaFree(d_ids));
        CK(cudaFree(d_lists));
      }
      for (void* b : copies) CK(cudaFree(b));
    }
  return 0;
}
