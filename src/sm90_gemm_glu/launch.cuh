// The Hopper kernel's launchers. Each activation's kernels (both dtypes, every
// cluster size) are compiled in their own translation unit
// (sm90_gemm_glu_<activation>.cu, through GATEDMLP_SM90_INSTANTIATE), so a
// parallel build compiles them side by side; sm90_gemm_glu_launch.cu holds the
// run-time dispatch over activations and sees only declarations.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>
#include <cstdio>
#include <cstdlib>

#include "common/allow_smem.hpp"
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

// The launch attribute of clusters of cm CTAs along x.
inline cudaLaunchAttribute cluster_dim(int cm) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = static_cast<unsigned>(cm);
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// A prepared kernel's grid, block and shared memory on `stream`, no attributes.
inline cudaLaunchConfig_t launch_config(const KernelLaunch& k, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = k.grid;
  cfg.blockDim = k.block;
  cfg.dynamicSmemBytes = k.smem;
  cfg.stream = stream;
  return cfg;
}

// One launch of a prepared kernel: the per-call part of a Hopper call. The
// ticket counter starts every launch at zero (the kernel's TicketRing).
template <typename T, int ACT, int CM, int PRE, int BNO, bool PROMO = false>
cudaError_t launch_cooperative(const KernelLaunch& k, const Params& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = launch_config(k, stream);
  cudaLaunchAttribute attr = cluster_dim(CM);
  cfg.attrs = &attr;
  cfg.numAttrs = k.cluster_attr ? 1 : 0;
  if (p.tickets)
    if (cudaError_t e = cudaMemsetAsync(p.tickets, 0, sizeof(uint32_t), stream); e != cudaSuccess) return e;
  const auto kernel = sm90_gemm_glu_kernel<T, ACT, CM, PRE, BNO, false, PROMO>;
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

// Prepares one persistent CTA (CM == 1) or cluster of CM CTAs per work
// item, at most as many as can be resident at once; all of them when the
// tail is split. Reads the launch knobs and plans the split tail (into p)
// once per distinct call; launch_cooperative does the rest per call.
template <typename T, int ACT, int CM, int PRE, int BNO, bool PROMO = false>
cudaError_t setup_cooperative(Params& p, int sms, KernelLaunch* k) {
  using Tr = TileTraits<BNO>;
  auto kernel = sm90_gemm_glu_kernel<T, ACT, CM, PRE, BNO, false, PROMO>;
  if (cudaError_t e = detail::allow_smem(kernel, Tr::kSmemBytes); e != cudaSuccess) return e;
  k->block = dim3(Tr::kThreads);
  k->smem = Tr::kSmemBytes;
  // One-CTA kernels are launched without the cluster attribute: with it (a
  // cluster of one), the same probe kernel ran 7 % slower at 8B M = 512 and
  // up to 1.6 % at 4096 (H200, scripts/experiments/probe-lib-gap.sh; docs/notes/hopper-kernel.md, h33).
  // The kernel needs no cluster for CM = 1 (a CTA is its own cluster).
  // GATEDMLP_SM90_CLUSTER_ATTR=1 sets it anyway (timing knob).
  const char* ca = std::getenv("GATEDMLP_SM90_CLUSTER_ATTR");
  k->cluster_attr = CM > 1 || (ca && std::atoi(ca) == 1);
  int resident = sms / CM;
  if constexpr (CM > 1) {
    // Not every SM can host a cluster (GPCs with an odd free SM); ask once
    // (per process: the library assumes one GPU model).
    static int clusters = -1;
    if (clusters < 0) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr = cluster_dim(CM);
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      cfg.blockDim = k->block;
      cfg.dynamicSmemBytes = k->smem;
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
  k->split = split;
  if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
    std::fprintf(stderr, "[gatedmlp] sm90: %d-column tiles; %lld items on %d clusters of %d%s%s; %s%s\n", BNO,
                 static_cast<long long>(p.tiles), resident, CM, p.odd_items ? "; last row-block in column pairs" : "",
                 p.tickets ? "; whole items drawn from a counter" : "",
                 split ? "split tail" : (p.sk_ctas == 0 ? "no split tail (no workspace)" : "no split tail"),
                 PRE ? "; pre-activation by TMA stores" : (p.has_pre ? "; pre-activation stored from registers" : ""));
  k->grid = dim3(static_cast<unsigned>(items * CM));
  k->launch = &launch_cooperative<T, ACT, CM, PRE, BNO, PROMO>;
  return cudaSuccess;
}

template <typename T, int ACT, int PRE, int N>
cudaError_t launch_pingpong(const KernelLaunch& k, const Params& p, cudaStream_t stream) {
  const cudaLaunchConfig_t cfg = launch_config(k, stream);
  return cudaLaunchKernelEx(&cfg, sm90_gemm_glu_pingpong_kernel<T, ACT, PRE, N>, p);
}

// The ping-pong kernels: one CTA per SM (at most one per item), every item
// whole (no split tail), no cluster attribute.
template <typename T, int ACT, int N>
cudaError_t setup_pingpong(const Params& p, int sms, KernelLaunch* k) {
  constexpr int kSmem = PingPongTraits<N>::kSmemBytes;
  const cudaError_t e = p.has_pre ? detail::allow_smem(sm90_gemm_glu_pingpong_kernel<T, ACT, 1, N>, kSmem)
                                  : detail::allow_smem(sm90_gemm_glu_pingpong_kernel<T, ACT, 0, N>, kSmem);
  if (e != cudaSuccess) return e;
  int ctas = sms;
  if (const char* v = std::getenv("GATEDMLP_SM90_CLUSTERS")) ctas = std::max(1, std::atoi(v));  // tuning and test knob
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(p.tiles, ctas));
  if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
    std::fprintf(stderr, "[gatedmlp] sm90: %d-column tiles, ping-pong; %lld items on %lld CTAs%s\n", p.tile_n,
                 static_cast<long long>(p.tiles), static_cast<long long>(grid),
                 p.has_pre ? "; pre-activation by TMA stores" : "");
  k->grid = dim3(static_cast<unsigned>(grid));
  k->block = dim3(PingPongTraits<N>::Tr::kThreads);
  k->smem = kSmem;
  k->cluster_attr = false;
  k->split = false;
  k->launch = p.has_pre ? &launch_pingpong<T, ACT, 1, N> : &launch_pingpong<T, ACT, 0, N>;
  return cudaSuccess;
}

template <typename T, int ACT>
cudaError_t setup_cm(Params& p, int cluster_m, int sms, KernelLaunch* k) {
  if (p.pingpong)
    return p.tile_n == kTilePingPong96.tile_n ? setup_pingpong<T, ACT, 96>(p, sms, k)
                                              : setup_pingpong<T, ACT, 88>(p, sms, k);
  // The narrow kernels (p.tile_n 88) come in clusters of one and two, without
  // the pre-activation: launch.cpp picks them only then.
  if (p.tile_n == kTileNarrow.tile_n)
    return cluster_m == 2 ? setup_cooperative<T, ACT, 2, 0, 88>(p, sms, k)
                          : setup_cooperative<T, ACT, 1, 0, 88>(p, sms, k);
  // The TMA pre-activation kernels come in the cluster sizes the library
  // picks (1, 2), and not for gelu_erf, whose activation needs more
  // registers: with the TMA pre-activation beside it, its kernels spilled
  // 24-60 B. launch.cpp clears p.pre_tma for both.
  if constexpr (ACT != static_cast<int>(Activation::gelu_erf)) {
    if (p.pre_tma)
      return cluster_m == 2 ? setup_cooperative<T, ACT, 2, 1, 128>(p, sms, k)
                            : setup_cooperative<T, ACT, 1, 1, 128>(p, sms, k);
  }
  switch (cluster_m) {
    case 4: return setup_cooperative<T, ACT, 4, 0, 128>(p, sms, k);
    case 2: return setup_cooperative<T, ACT, 2, 0, 128>(p, sms, k);
    default: return setup_cooperative<T, ACT, 1, 0, 128>(p, sms, k);
  }
}

template <typename T, int ACT>
cudaError_t launch_grouped(const KernelLaunch& k, const Params& p, cudaStream_t stream) {
  const cudaLaunchConfig_t cfg = launch_config(k, stream);
  return cudaLaunchKernelEx(&cfg, sm90_gemm_glu_kernel<T, ACT, 1, 0, 128, true>, p);
}

// A grouped call (p.grouped): one CTA per SM, at most one per row unit of
// the table's upper bound, every item whole, no cluster attribute.
template <typename T, int ACT>
cudaError_t setup_grouped(Params& p, int sms, KernelLaunch* k) {
  using Tr = TileTraits<128>;
  if (cudaError_t e = detail::allow_smem(sm90_gemm_glu_kernel<T, ACT, 1, 0, 128, true>, Tr::kSmemBytes);
      e != cudaSuccess)
    return e;
  int ctas = sms;
  if (const char* v = std::getenv("GATEDMLP_SM90_CLUSTERS")) ctas = std::max(1, std::atoi(v));  // tuning and test knob
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(p.tiles, ctas));
  if (const char* v = std::getenv("GATEDMLP_LOG"); v && *v && *v != '0')
    std::fprintf(stderr, "[gatedmlp] sm90: grouped, 128-column tiles; at most %lld items on %lld CTAs\n",
                 static_cast<long long>(p.tiles), static_cast<long long>(grid));
  k->grid = dim3(static_cast<unsigned>(grid));
  k->block = dim3(Tr::kThreads);
  k->smem = Tr::kSmemBytes;
  k->cluster_attr = false;
  k->split = false;
  k->launch = &launch_grouped<T, ACT>;
  return cudaSuccess;
}

// The grouped kernels, all five activations of one dtype, in a TU of their
// own (sm90_grouped_<dtype>.cu), declared `extern` in the dispatch TU.
#define GATEDMLP_SM90_GROUPED(EXTERN, T)                                         \
  EXTERN template cudaError_t setup_grouped<T, 0>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_grouped<T, 1>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_grouped<T, 2>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_grouped<T, 3>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_grouped<T, 4>(Params&, int, KernelLaunch*);

// The e4m3 kernels of activation ACT in clusters of CM (1 or 2):
// cooperative, 128 columns, PRE = 0 (launch.cpp clears p.pre_tma for FP8);
// PROMO: each k-block summed apart and added into fp32 (the kernel's
// promoting main loop), else all of K summed by the wgmmas.
template <int ACT, int CM, bool PROMO>
cudaError_t setup_fp8_cm(Params& p, int sms, KernelLaunch* k) {
  return setup_cooperative<__nv_fp8_e4m3, ACT, CM, 0, 128, PROMO>(p, sms, k);
}

// The e4m3 kernels of one cluster size and main loop, all five activations,
// in a TU of their own (sm90_fp8_<promote|fast>_cm<CM>.cu), declared
// `extern` in the dispatch TU.
#define GATEDMLP_SM90_FP8(EXTERN, CM, PROMO)                                         \
  EXTERN template cudaError_t setup_fp8_cm<0, CM, PROMO>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_fp8_cm<1, CM, PROMO>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_fp8_cm<2, CM, PROMO>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_fp8_cm<3, CM, PROMO>(Params&, int, KernelLaunch*); \
  EXTERN template cudaError_t setup_fp8_cm<4, CM, PROMO>(Params&, int, KernelLaunch*);

// Explicit instantiation (in a kernel TU) or declaration (`extern`, in the
// dispatch TU) of setup_cm for both dtypes and activation ACT.
#define GATEDMLP_SM90_LAUNCHERS(EXTERN, ACT)                                                        \
  EXTERN template cudaError_t setup_cm<__nv_bfloat16, ACT>(Params&, int, int, KernelLaunch*);     \
  EXTERN template cudaError_t setup_cm<__half, ACT>(Params&, int, int, KernelLaunch*);
#define GATEDMLP_SM90_INSTANTIATE(ACT) \
  namespace gatedmlp::sm90 {           \
  GATEDMLP_SM90_LAUNCHERS(, ACT)       \
  }

}  // namespace gatedmlp::sm90
