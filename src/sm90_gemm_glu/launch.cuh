// The Hopper kernel's launchers. Each activation's kernels (both dtypes, every
// cluster size) are compiled in their own translation unit
// (sm90_gemm_glu_<activation>.cu, through GATEDMLP_SM90_INSTANTIATE), so a
// parallel build compiles them side by side; sm90_gemm_glu_launch.cu holds the
// run-time dispatch over activations and sees only declarations.
#pragma once

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <cstdio>
#include <cstdlib>

#include "sm90_gemm_glu/pingpong.cuh"
#include "sm90_gemm_glu/sm90_gemm_glu.cuh"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::sm90 {

// kTile and kTileNarrow must describe the kernels' tiles (launch.cpp counts
// k-blocks with tile_k).
template <int BNO>
constexpr bool tile_matches(const Tile& t) {
  using Tr = TileTraits<BNO>;
  return Tr::kSmemBytes == t.smem_bytes && Tr::BM == t.tile_m && Tr::BNO == t.tile_n && Tr::BK == t.tile_k &&
         Tr::kStages == t.stages && Tr::kThreads == t.threads;
}
static_assert(tile_matches<128>(kTile), "kTile does not describe the 128-column kernels");
static_assert(tile_matches<88>(kTileNarrow), "kTileNarrow does not describe the narrow kernels");
template <int N>
constexpr bool pingpong_tile_matches(const Tile& t) {
  using PT = PingPongTraits<N>;
  return PT::kSmemBytes == t.smem_bytes && PT::Tr::BM == t.tile_m && PT::N == t.tile_n && PT::Tr::BK == t.tile_k &&
         PT::kStages == t.stages && PT::Tr::kThreads == t.threads;
}
static_assert(pingpong_tile_matches<88>(kTilePingPong), "kTilePingPong does not describe the ping-pong kernels");
static_assert(pingpong_tile_matches<96>(kTilePingPong96), "kTilePingPong96 does not describe the 96-column ones");

// Launches one persistent CTA (CM == 1) or cluster of CM CTAs per work
// item, at most as many as can be resident at once; all of them when the tail
// is split.
// A fresh, nonzero 64-bit token per launch (splitmix64 of a counter seeded
// per process): the split tail's flags compare against it.
inline uint64_t next_token() {
  static std::atomic<uint64_t> counter{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  uint64_t z = counter.fetch_add(0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;
}

template <typename T, int ACT, int CM, int PRE, int BNO>
cudaError_t launch_act(Params p, int sms, cudaStream_t stream) {
  using Tr = TileTraits<BNO>;
  auto kernel = sm90_gemm_glu_kernel<T, ACT, CM, PRE, BNO>;
  // Per call: the attribute belongs to the current device.
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(Tr::kThreads);
  cfg.dynamicSmemBytes = Tr::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  // One-CTA kernels are launched without the cluster attribute: with it (a
  // cluster of one), the same probe kernel ran 7 % slower at 8B M = 512 and
  // up to 1.6 % at 4096 (H200, scripts/probe-lib-gap.sh; NOTES.md, h33).
  // The kernel needs no cluster for CM = 1 (a CTA is its own cluster).
  // GATEDMLP_SM90_CLUSTER_ATTR=1 sets it anyway (timing knob).
  const char* ca = std::getenv("GATEDMLP_SM90_CLUSTER_ATTR");
  cfg.numAttrs = CM > 1 || (ca && std::atoi(ca) == 1) ? 1 : 0;
  int resident = sms / CM;
  if constexpr (CM > 1) {
    // Not every SM can host a cluster (GPCs with an odd free SM); ask once
    // (per process: the library assumes one GPU model).
    static int clusters = -1;
    if (clusters < 0) {
      cfg.gridDim = dim3(CM * resident);
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters <= 0) {
        (void)cudaGetLastError();
        clusters = resident;
      }
    }
    resident = std::min(resident, clusters);
    if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
      std::fprintf(stderr, "[gatedmlp] sm90: %d resident clusters of %d reported\n", clusters, CM);
  }
  // Tuning knob (any cluster size): run on fewer clusters than fit.
  if (const char* v = std::getenv("GATEDMLP_SM90_CLUSTERS")) resident = std::max(1, std::atoi(v));
  resident = std::max(resident, 1);
  // The ticket slots are per cluster, for at most sk_ctas CTAs (more only
  // through the knob above).
  if (int64_t(resident) * CM > p.sk_ctas) p.tickets = nullptr;
  // Split tail (schedule.hpp): GATEDMLP_SM90_SPLIT_TAIL=0 turns it off,
  // =force splits whenever possible (tests); GATEDMLP_SM90_SPLIT_WAVES=1|2
  // splits the partial wave only, or the last whole wave too (default:
  // plan_split_tail's choice).
  const char* st = std::getenv("GATEDMLP_SM90_SPLIT_TAIL");
  const char* sw = std::getenv("GATEDMLP_SM90_SPLIT_WAVES");
  const bool force = st && std::string(st) == "force";
  const bool split = plan_split_tail(p, resident, CM, !st || force || std::atoi(st) != 0, force, sw ? std::atoi(sw) : 0);
  const int64_t items = split ? resident : std::min<int64_t>(p.tiles, resident);
  if (split) p.sk_token = next_token();
  if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
    std::fprintf(stderr, "[gatedmlp] sm90: %d-column tiles; %lld items on %d clusters of %d%s%s; %s%s\n", BNO,
                 static_cast<long long>(p.tiles), resident, CM, p.odd_items ? "; last row-block in column pairs" : "",
                 p.tickets ? "; whole items drawn from a counter" : "",
                 split ? "split tail" : (p.sk_ctas == 0 ? "no split tail (no workspace)" : "no split tail"),
                 PRE ? "; pre-activation by TMA stores" : (p.has_pre ? "; pre-activation stored from registers" : ""));
  cfg.gridDim = dim3(static_cast<unsigned>(items * CM));
  // The ticket counter starts every launch at zero (the kernel's TicketRing).
  if (p.tickets)
    if (cudaError_t e = cudaMemsetAsync(p.tickets, 0, sizeof(uint32_t), stream); e != cudaSuccess) return e;
#if defined(GATEDMLP_SM90_WATCHDOG)
  watchdog::arm(static_cast<int>(cfg.gridDim.x));
#endif
#if defined(GATEDMLP_SM90_TIMELINE)
  const bool recorded = timeline::arm(stream);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  if (recorded && e == cudaSuccess) timeline::collect(p, static_cast<int>(cfg.gridDim.x), CM, stream);
  return e;
#else
  return cudaLaunchKernelEx(&cfg, kernel, p);
#endif
}

// The ping-pong kernels: one CTA per SM (at most one per item), every item
// whole (no split tail), no cluster attribute.
template <typename T, int ACT, int N>
cudaError_t launch_pingpong(const Params& p, int sms, cudaStream_t stream) {
  const auto kernel = p.has_pre ? sm90_gemm_glu_pingpong_kernel<T, ACT, 1, N> : sm90_gemm_glu_pingpong_kernel<T, ACT, 0, N>;
  constexpr int kSmem = PingPongTraits<N>::kSmemBytes;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem); e != cudaSuccess)
    return e;
  int ctas = sms;
  if (const char* v = std::getenv("GATEDMLP_SM90_CLUSTERS")) ctas = std::max(1, std::atoi(v));  // tuning and test knob
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(p.tiles, ctas));
  if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
    std::fprintf(stderr, "[gatedmlp] sm90: %d-column tiles, ping-pong; %lld items on %lld CTAs%s\n", p.tile_n,
                 static_cast<long long>(p.tiles), static_cast<long long>(grid),
                 p.has_pre ? "; pre-activation by TMA stores" : "");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(PingPongTraits<N>::Tr::kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

template <typename T, int ACT>
cudaError_t launch_cm(const Params& p, int cluster_m, int sms, cudaStream_t stream) {
  if (p.pingpong)
    return p.tile_n == kTilePingPong96.tile_n ? launch_pingpong<T, ACT, 96>(p, sms, stream)
                                              : launch_pingpong<T, ACT, 88>(p, sms, stream);
  // The narrow kernels (p.tile_n 88) come in clusters of one and two, without
  // the pre-activation: launch.cpp picks them only then.
  if (p.tile_n == kTileNarrow.tile_n)
    return cluster_m == 2 ? launch_act<T, ACT, 2, 0, 88>(p, sms, stream) : launch_act<T, ACT, 1, 0, 88>(p, sms, stream);
  // The TMA pre-activation kernels come in the cluster sizes the library
  // picks (1, 2), and not for gelu_erf, whose activation needs more
  // registers: with the TMA pre-activation beside it, its kernels spilled
  // 24-60 B. launch.cpp clears p.pre_tma for both.
  if constexpr (ACT != static_cast<int>(Activation::gelu_erf)) {
    if (p.pre_tma)
      return cluster_m == 2 ? launch_act<T, ACT, 2, 1, 128>(p, sms, stream) : launch_act<T, ACT, 1, 1, 128>(p, sms, stream);
  }
  switch (cluster_m) {
    case 4: return launch_act<T, ACT, 4, 0, 128>(p, sms, stream);
    case 2: return launch_act<T, ACT, 2, 0, 128>(p, sms, stream);
    default: return launch_act<T, ACT, 1, 0, 128>(p, sms, stream);
  }
}

// Explicit instantiation (in a kernel TU) or declaration (`extern`, in the
// dispatch TU) of launch_cm for both dtypes and activation ACT.
#define GATEDMLP_SM90_LAUNCHERS(EXTERN, ACT)                                                                  \
  EXTERN template cudaError_t launch_cm<__nv_bfloat16, ACT>(const Params&, int, int, cudaStream_t);         \
  EXTERN template cudaError_t launch_cm<__half, ACT>(const Params&, int, int, cudaStream_t);
#define GATEDMLP_SM90_INSTANTIATE(ACT) \
  namespace gatedmlp::sm90 {           \
  GATEDMLP_SM90_LAUNCHERS(, ACT)       \
  }

}  // namespace gatedmlp::sm90
