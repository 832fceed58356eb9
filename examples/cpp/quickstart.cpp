// gatedmlp's C++ quick start, whole: Y = silu(X Wg^T) * (X Wu^T) for a few
// tokens of Llama-3 8B's shapes, checked against a CPU dot product. Without a
// GPU it stops after the checks that need none (check_support, the plan's
// shape rules).
#include <gatedmlp/gatedmlp.hpp>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  gatedmlp::Problem p;
  p.m = 4;                                           // tokens
  p.k = 4096;                                        // hidden size
  p.u = 14336;                                       // intermediate size
  p.weights.format = gatedmlp::WeightFormat::fused;  // [2U, K]: the gate rows, then the up rows
  p.activation = gatedmlp::Activation::silu;
  std::printf("%s\n", gatedmlp::to_string(p).c_str());
  if (gatedmlp::Status s = gatedmlp::check_support(p); !s.ok()) {
    std::fprintf(stderr, "check_support: %s\n", s.message().c_str());
    return 1;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: the problem is supported; nothing launched\n");
    return 0;
  }
  gatedmlp::Config config;
  if (gatedmlp::Status s = gatedmlp::plan(p, &config); !s.ok()) {
    std::fprintf(stderr, "plan: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("%s\n", gatedmlp::to_string(config).c_str());

  // Inputs: small deterministic values, exactly representable in bf16.
  const size_t nx = size_t(p.m) * p.k, nw = size_t(2 * p.u) * p.k, ny = size_t(p.m) * p.u;
  std::vector<__nv_bfloat16> hx(nx), hw(nw), hy(ny);
  for (size_t i = 0; i < nx; ++i) hx[i] = __float2bfloat16(float(int(i % 7) - 3) / 8);
  for (size_t i = 0; i < nw; ++i) hw[i] = __float2bfloat16(float(int(i % 11) - 5) / 256);

  void *x = nullptr, *w = nullptr, *y = nullptr, *ws = nullptr;
  const size_t ws_bytes = gatedmlp::workspace_size(p);  // optional scratch (Hopper: split last wave)
  cudaMalloc(&x, nx * 2);
  cudaMalloc(&w, nw * 2);
  cudaMalloc(&y, ny * 2);
  if (ws_bytes) cudaMalloc(&ws, ws_bytes);
  cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(w, hw.data(), nw * 2, cudaMemcpyHostToDevice);

  gatedmlp::Arguments a;
  a.x = x;
  a.w = w;
  a.y = y;
  if (gatedmlp::Status s = gatedmlp::run(p, a, ws, ws_bytes, /*stream=*/nullptr); !s.ok()) {
    std::fprintf(stderr, "run: %s\n", s.message().c_str());
    return 1;
  }
  cudaMemcpy(hy.data(), y, ny * 2, cudaMemcpyDeviceToHost);

  // A few outputs against a CPU dot product.
  double worst = 0;
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.u; j += 997) {
      double g = 0, u = 0;
      for (int64_t k = 0; k < p.k; ++k) {
        const double xv = __bfloat162float(hx[size_t(r * p.k + k)]);
        g += xv * __bfloat162float(hw[size_t(j * p.k + k)]);
        u += xv * __bfloat162float(hw[size_t((p.u + j) * p.k + k)]);
      }
      const double want = g / (1 + std::exp(-g)) * u;
      const double got = __bfloat162float(hy[size_t(r * p.u + j)]);
      worst = std::fmax(worst, std::fabs(got - want) / (std::fabs(want) + 1e-2));
    }
  std::printf("Y[%lld x %lld] computed; worst relative error of the sampled outputs %.2e\n",
              static_cast<long long>(p.m), static_cast<long long>(p.u), worst);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaFree(ws);
  return worst < 2e-2 ? 0 : 1;
}
