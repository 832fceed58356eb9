// Helpers for the GPU tests: device buffers, a skip when there is no GPU,
// building random problems with host data laid out exactly like the device's,
// and running one case end to end against the float64 reference and the
// unfused yardstick (run_case), shared by the kernels' suites.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gatedmlp/gatedmlp.hpp"
#include "reference/reference.hpp"
#include "scoped_env.hpp"

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                   \
  } while (0)

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    int n_ = 0;                                                                     \
    if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) {                        \
      cudaGetLastError();                                                           \
      GTEST_SKIP() << "no CUDA device";                                             \
    }                                                                               \
  } while (0)

namespace gatedmlp::test {

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n && cudaMalloc(&p, n) != cudaSuccess) {
      p = nullptr;
      bytes = 0;
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { std::swap(p, o.p); std::swap(bytes, o.bytes); return *this; }
  ~DeviceBuffer() { if (p) cudaFree(p); }
};

// Whether the current device is compute capability 9.0 (H100/H200), where
// the Hopper kernels run; false without a device.
inline bool device_is_sm90() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}

// cudaDeviceSynchronize with a time limit (GATEDMLP_TEST_SYNC_LIMIT seconds,
// default 300: the slowest legitimate call, under compute-sanitizer, takes
// seconds). A kernel that never finishes ends the binary with exit code 3
// and a line naming what was running; a time-out of the whole binary would
// name nothing, and a hung GPU cannot be recovered within the process.
inline cudaError_t sync_within(const std::string& what) {
  const char* v = std::getenv("GATEDMLP_TEST_SYNC_LIMIT");
  const double limit = v ? std::atof(v) : 300.0;
  cudaEvent_t ev;
  if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) return e;
  cudaError_t e = cudaEventRecord(ev, 0);  // the legacy stream: after all earlier work
  const auto t0 = std::chrono::steady_clock::now();
  while (e == cudaSuccess) {
    e = cudaEventQuery(ev);
    if (e != cudaErrorNotReady) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
      std::fprintf(stderr, "[ HUNG ] the device did not finish within %.0f s: %s\n", limit, what.c_str());
      std::fprintf(stdout, "[ HUNG ] the device did not finish within %.0f s: %s\n", limit, what.c_str());
      std::fflush(nullptr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    e = cudaSuccess;
  }
  cudaEventDestroy(ev);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

// Host bytes of one tensor, and its device copy.
struct Tensor {
  std::vector<unsigned char> host;
  DeviceBuffer dev;
  void upload() {
    dev = DeviceBuffer(host.size());
    if (!host.empty()) cudaMemcpy(dev.p, host.data(), host.size(), cudaMemcpyHostToDevice);
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(dev.bytes);
    if (dev.bytes) cudaMemcpy(out.data(), dev.p, dev.bytes, cudaMemcpyDeviceToHost);
    return out;
  }
};

// Random values of `dtype` into a buffer of n elements (all of it: padding too).
inline void fill(std::vector<unsigned char>& buf, DType dtype, int64_t n, std::mt19937_64& rng, float lo, float hi) {
  buf.assign(size_t(n) * dtype_size(dtype), 0);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < n; ++i) ref::store_from_double(buf.data(), dtype, i, d(rng));
}

// n elements of dtype, every one NaN: an output's contents before a call,
// so that any element the call should have written and did not shows.
inline std::vector<unsigned char> nan_filled(DType dtype, int64_t n) {
  std::vector<unsigned char> buf(size_t(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) ref::store_from_double(buf.data(), dtype, i, NAN);
  return buf;
}

// ---------------------------------------------------------------- one case, end to end

struct Err {
  double max_abs = 0, sq_diff = 0, sq_ref = 0, max_ref = 0;
  int64_t n = 0;  // elements compared
  double rel() const { return sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff); }
  // The RMS error over the larger of the reference's RMS and 1: the tests
  // draw g and u of order 1, so an output that is small only because its
  // few elements nearly cancel (relu of a g near 0, m = 1, u = 3) is not
  // held to a relative bound that no fp32 sum meets.
  double rel_floor1() const { return std::sqrt(sq_diff / std::max(sq_ref, double(std::max<int64_t>(n, 1)))); }
};

inline int64_t one_batch_extent(int64_t rows, int64_t ld, int64_t cols) { return (rows - 1) * ld + cols; }

struct CaseStats {
  int cases = 0;
  double worst_ratio = 0;  // fused rel error / unfused rel error
};

// Compares an output tensor (device layout: [L][rows, ld], `cols` valid
// columns) with a dense reference [L][nref][cols], where the reference rows
// are `ref_rows` (sampled; nullptr: all rows, nref = rows). Every valid element
// must be finite, sampled or not; every other byte of the buffer must still
// hold the poison. Errors are over the sampled rows.
inline ::testing::AssertionResult compare(const char* name, const std::vector<unsigned char>& out,
                                   const std::vector<unsigned char>& poison, DType dt, int64_t L, int64_t rows,
                                   int64_t ld, int64_t cols, int64_t bstride, const std::vector<double>& ref, Err* e,
                                   const std::vector<int64_t>* ref_rows = nullptr) {
  const size_t es = dtype_size(dt);
  std::vector<int64_t> ref_index(size_t(rows), -1);  // row -> its row in `ref`, or -1: not sampled
  if (ref_rows) {
    for (size_t i = 0; i < ref_rows->size(); ++i) ref_index[size_t((*ref_rows)[i])] = int64_t(i);
  } else {
    for (int64_t r = 0; r < rows; ++r) ref_index[size_t(r)] = r;
  }
  const int64_t nref = ref_rows ? int64_t(ref_rows->size()) : rows;
  std::vector<char> valid(out.size() / es, 0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = l * bstride + r * ld + c;
        valid[size_t(i)] = 1;
        const double v = ref::load_as_double(out.data(), dt, i);
        const int64_t ri = ref_index[size_t(r)];
        const double want = ri >= 0 ? ref[size_t((l * nref + ri) * cols + c)] : NAN;
        if (!std::isfinite(v))
          return ::testing::AssertionFailure() << name << "[" << l << "][" << r << "][" << c << "] = " << v
                                               << " (not written, or NaN); reference " << want;
        if (ri < 0) continue;
        const double d = std::fabs(v - want);
        e->max_abs = std::max(e->max_abs, d);
        e->sq_diff += d * d;
        e->sq_ref += want * want;
        e->max_ref = std::max(e->max_ref, std::fabs(want));
        e->n++;
      }
  for (size_t i = 0; i < valid.size(); ++i)
    if (!valid[i] && std::memcmp(&out[i * es], &poison[i * es], es) != 0)
      return ::testing::AssertionFailure() << name << ": element " << i << " outside the output (padding) was written";
  return ::testing::AssertionSuccess();
}

// Worst, over the rows of every batch, of ||a - b|| / ||b|| for one row of two
// outputs in the same device layout: a wrong tile shows in its rows even where
// the reference was only sampled.
inline double worst_row_rel_diff(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, DType dt,
                          int64_t L, int64_t rows, int64_t ld, int64_t cols, int64_t bstride, int64_t* worst_row) {
  double worst = 0;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t r = 0; r < rows; ++r) {
      double num = 0, den = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = l * bstride + r * ld + c;
        const double va = ref::load_as_double(a.data(), dt, i), vb = ref::load_as_double(b.data(), dt, i);
        num += (va - vb) * (va - vb);
        den += vb * vb;
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      if (!(rel <= worst)) {  // NaN counts as worst
        worst = rel;
        *worst_row = l * rows + r;
      }
    }
  return worst;
}

inline constexpr const char* kForcePathEnv = "GATEDMLP_FORCE_PATH";

// run() with the workspace given, optionally with GATEDMLP_LOG=1 and its
// stderr captured: the log must then contain `must_contain` (a launcher's
// choice the test is about). An empty must_contain runs it plainly.
inline Status run_checking_log(const Problem& p, const Arguments& a, void* ws, size_t ws_bytes,
                               const std::string& must_contain, const char* label) {
  if (must_contain.empty()) return run(p, a, ws, ws_bytes, nullptr);
  ScopedEnv log_env("GATEDMLP_LOG", "1");
  ::testing::internal::CaptureStderr();
  const Status s = run(p, a, ws, ws_bytes, nullptr);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(must_contain), std::string::npos)
      << label << ": GATEDMLP_LOG=1 printed no \"" << must_contain << "\"; it printed:\n" << log;
  return s;
}

// One fused run of a case: under which GATEDMLP_FORCE_PATH, and with or
// without the workspace. On the Hopper path the workspace holds the split
// tail's partial sums; GATEDMLP_SM90_SPLIT_TAIL=force splits every tail that
// can be split (the default splits only where it pays, which the small test
// shapes rarely reach; the schedule tests check that choice on the CPU).
struct Variant {
  const char* label = "fused";
  bool set_env = false;              // false: GATEDMLP_FORCE_PATH as the environment has it
  const char* force_path = nullptr;  // with set_env: the value; nullptr unsets it
  bool workspace = true;             // workspace_size() bytes, poisoned; false: (nullptr, 0)
  const char* split_tail = nullptr;  // GATEDMLP_SM90_SPLIT_TAIL for the run; nullptr: as the environment has it
  const char* clusters = nullptr;    // GATEDMLP_SM90_CLUSTERS for the run; nullptr: as the environment has it
  const char* tile = nullptr;        // GATEDMLP_SM90_TILE for the run; nullptr: as the environment has it
  const char* cluster = nullptr;     // GATEDMLP_SM90_CLUSTER (CTAs per cluster); nullptr: as the environment has it
  const char* decode = nullptr;      // GATEDMLP_DECODE ("0": the decode kernel left out); nullptr: as the environment has it
  const char* decode_hopper = nullptr;  // GATEDMLP_DECODE_HOPPER ("1": the decode kernel's Hopper form wherever it can run)
};
inline const Variant kAsIs{};
// The same call with the decode kernel left out: M <= 16 then takes the
// Hopper or portable kernel, whose small-M coverage this keeps.
inline const Variant kNoDecode{"fused, GATEDMLP_DECODE=0", false, nullptr, true, nullptr, nullptr, nullptr, nullptr,
                               "0"};
// The decode kernel's Hopper form wherever it can run (sm_90), also on the
// small shapes where the dispatcher keeps the register form.
inline const Variant kDecodeHopper{"fused, GATEDMLP_DECODE_HOPPER=1", false, nullptr, true, nullptr, nullptr,
                                   nullptr, nullptr, nullptr, "1"};

struct CaseOptions {
  std::vector<Variant> variants{kAsIs};  // one fused run each, on the same inputs
  // Rows (of every batch) the float64 reference is computed for; empty: all.
  // With a sample, every element must still be written, and each row of the
  // fused output must agree with the unfused one.
  std::vector<int64_t> ref_rows;
  std::vector<Config>* plans = nullptr;  // if set: plan() under each variant, in order
  // If set: the first variant's run, with GATEDMLP_LOG=1, must print this to
  // stderr (the library's own word on which kernel ran).
  std::string log_must_contain;
};

// One random case, end to end: inputs, the unfused yardstick and the float64
// reference once, then one fused run per variant, each checked.
inline void run_case(const Problem& p, std::mt19937_64& rng, CaseStats* stats, const CaseOptions& opt = CaseOptions{}) {
  SCOPED_TRACE(to_string(p));
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t L = r.batch, rows_w = sep ? r.u : 2 * r.u;
  const bool io = r.weights.storage == WeightStorage::in_out;
  auto extent = [&](int64_t stride, int64_t one) { return (L - 1) * stride + one; };
  const std::vector<int64_t>* ref_rows = opt.ref_rows.empty() ? nullptr : &opt.ref_rows;

  Tensor x, w, wu, b, bu;
  const float wscale = 2.0f / std::sqrt(float(r.k));  // keeps g and u near 1: the activations' interesting range
  fill(x.host, r.input_dtype, extent(r.batch_stride_x, one_batch_extent(r.m, r.ldx, r.k)), rng, -2.f, 2.f);
  const int64_t w_one = io ? one_batch_extent(r.k, r.weights.ld, rows_w) : one_batch_extent(rows_w, r.weights.ld, r.k);
  fill(w.host, r.input_dtype, extent(r.batch_stride_w, w_one), rng, -wscale, wscale);
  if (sep) fill(wu.host, r.input_dtype, extent(r.batch_stride_w, w_one), rng, -wscale, wscale);
  if (r.has_bias) {
    fill(b.host, r.bias_dtype, extent(r.batch_stride_bias, rows_w), rng, -0.5f, 0.5f);
    if (sep) fill(bu.host, r.bias_dtype, extent(r.batch_stride_bias, rows_w), rng, -0.5f, 0.5f);
  }
  for (Tensor* t : {&x, &w, &wu, &b, &bu}) t->upload();

  const int64_t y_n = extent(r.batch_stride_y, one_batch_extent(r.m, r.ldy, r.u));
  const int64_t pre_n = r.has_preact ? extent(r.batch_stride_preact, one_batch_extent(r.m, r.ldpre, 2 * r.u)) : 0;
  const std::vector<unsigned char> y_poison = nan_filled(r.output_dtype, y_n), pre_poison = nan_filled(r.preact_dtype, pre_n);

  auto args_with = [&](Tensor& y, Tensor& pre) {
    Arguments a;
    a.x = x.dev.p;
    a.w = w.dev.p;
    a.w_up = sep ? wu.dev.p : nullptr;
    a.bias = r.has_bias ? b.dev.p : nullptr;
    a.bias_up = r.has_bias && sep ? bu.dev.p : nullptr;
    a.y = y.dev.p;
    a.preact = r.has_preact ? pre.dev.p : nullptr;
    return a;
  };

  // Unfused: the error yardstick.
  Tensor yu, pu;
  yu.host = y_poison;
  pu.host = pre_poison;
  for (Tensor* t : {&yu, &pu}) t->upload();
  std::unique_ptr<ref::Unfused> unfused;
  const Status su = ref::Unfused::create(p, &unfused);
  ASSERT_TRUE(su.ok()) << su.message();
  const Status sr = unfused->run(args_with(yu, pu), nullptr);
  ASSERT_TRUE(sr.ok()) << sr.message();
  CUDA_OK(sync_within("unfused: " + to_string(p)));

  // Reference on the host copies.
  Arguments h;
  h.x = x.host.data();
  h.w = w.host.data();
  h.w_up = sep ? wu.host.data() : nullptr;
  h.bias = r.has_bias ? b.host.data() : nullptr;
  h.bias_up = r.has_bias && sep ? bu.host.data() : nullptr;
  std::vector<double> y_ref, pre_ref;
  ref::cpu_reference(p, h, &y_ref, &pre_ref, ref_rows);

  const std::vector<unsigned char> yu_out = yu.download();
  Err eu;
  ASSERT_TRUE(compare("y (unfused)", yu_out, y_poison, r.output_dtype, L, r.m, r.ldy, r.u, r.batch_stride_y, y_ref,
                      &eu, ref_rows));
  // The yardstick must itself be right: its error is bounded as the fused one's is below.
  EXPECT_LE(eu.rel_floor1(), r.output_dtype == DType::fp32 ? 1e-2 : 2e-2)
      << "unfused relative error " << eu.rel() << " (" << eu.rel_floor1() << " against an RMS of at least 1)";
  std::vector<unsigned char> pu_out;
  Err peu;
  if (r.has_preact) {
    pu_out = pu.download();
    ASSERT_TRUE(compare("preact (unfused)", pu_out, pre_poison, r.preact_dtype, L, r.m, r.ldpre, 2 * r.u,
                        r.batch_stride_preact, pre_ref, &peu, ref_rows));
  }

  for (const Variant& v : opt.variants) {
    std::optional<ScopedEnv> env, split_env;
    if (v.set_env) env.emplace(kForcePathEnv, v.force_path);
    if (v.split_tail) split_env.emplace("GATEDMLP_SM90_SPLIT_TAIL", v.split_tail);
    std::optional<ScopedEnv> clusters_env, tile_env, cluster_env;
    if (v.clusters) clusters_env.emplace("GATEDMLP_SM90_CLUSTERS", v.clusters);
    if (v.cluster) cluster_env.emplace("GATEDMLP_SM90_CLUSTER", v.cluster);
    if (v.tile) tile_env.emplace("GATEDMLP_SM90_TILE", v.tile);
    std::optional<ScopedEnv> decode_env, decode_hopper_env;
    if (v.decode) decode_env.emplace("GATEDMLP_DECODE", v.decode);
    if (v.decode_hopper) decode_hopper_env.emplace("GATEDMLP_DECODE_HOPPER", v.decode_hopper);
    Config cfg;
    const Status sp = plan(p, &cfg);
    ASSERT_TRUE(sp.ok()) << v.label << ": plan: " << sp.message();
    SCOPED_TRACE(std::string(v.label) + ": " + to_string(cfg));
    if (opt.plans) opt.plans->push_back(cfg);

    Tensor yf, pf;
    yf.host = y_poison;
    pf.host = pre_poison;
    for (Tensor* t : {&yf, &pf}) t->upload();
    // The workspace arrives holding garbage (NaN floats, nonzero flags): the
    // library may not rely on its contents.
    const size_t ws_bytes = v.workspace ? workspace_size(p) : 0;
    DeviceBuffer ws(ws_bytes);
    ASSERT_EQ(ws.bytes, ws_bytes) << "cudaMalloc of the workspace";
    if (ws_bytes) CUDA_OK(cudaMemset(ws.p, 0xff, ws_bytes));
    // The launcher's log is checked on the first variant.
    const Status s = run_checking_log(p, args_with(yf, pf), ws.p, ws_bytes,
                                      &v == &opt.variants.front() ? opt.log_must_contain : std::string(), v.label);
    ASSERT_TRUE(s.ok()) << s.message();
    CUDA_OK(sync_within(std::string(v.label) + ": " + to_string(p) + " -> " + to_string(cfg)));

    const std::vector<unsigned char> yf_out = yf.download();
    Err ef;
    ASSERT_TRUE(compare("y (fused)", yf_out, y_poison, r.output_dtype, L, r.m, r.ldy, r.u, r.batch_stride_y, y_ref,
                        &ef, ref_rows));
    const double atol = 1e-6 * std::max(1.0, ef.max_ref);
    EXPECT_LE(ef.max_abs, 2 * eu.max_abs + atol) << "max abs error: fused " << ef.max_abs << " unfused " << eu.max_abs;
    EXPECT_LE(ef.rel(), 2 * eu.rel() + 1e-6) << "relative error: fused " << ef.rel() << " unfused " << eu.rel();
    // Independent of the yardstick: a bf16/fp16 output cannot be off by more
    // than a few ulps, an fp32 one by more than fp32 sums allow.
    EXPECT_LE(ef.rel_floor1(), r.output_dtype == DType::fp32 ? 1e-4 : 1e-2)
        << "fused relative error " << ef.rel() << " (" << ef.rel_floor1() << " against an RMS of at least 1)";
    if (ref_rows) {
      int64_t worst_row = -1;
      const double d = worst_row_rel_diff(yf_out, yu_out, r.output_dtype, L, r.m, r.ldy, r.u, r.batch_stride_y,
                                          &worst_row);
      EXPECT_LE(d, 0.05) << "y row " << worst_row << " (batch-major) differs from unfused by " << d << " (relative)";
    }

    if (r.has_preact) {
      Err pef;
      ASSERT_TRUE(compare("preact (fused)", pf.download(), pre_poison, r.preact_dtype, L, r.m, r.ldpre, 2 * r.u,
                          r.batch_stride_preact, pre_ref, &pef, ref_rows));
      EXPECT_LE(pef.max_abs, 2 * peu.max_abs + 1e-6 * std::max(1.0, pef.max_ref))
          << "preact max abs error: fused " << pef.max_abs << " unfused " << peu.max_abs;
    }
    if (eu.rel() > 0) stats->worst_ratio = std::max(stats->worst_ratio, ef.rel() / eu.rel());
  }
  stats->cases++;
}

inline uint64_t fresh_seed() {
  const uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(s));
  return s;
}

inline int64_t pick(std::mt19937_64& rng, std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); }

// Half the cases get a bias, a third a pre-activation output (sometimes
// with a padded row stride), each in a random dtype. p.u must be final.
inline void random_bias_and_preact(Problem& p, std::mt19937_64& rng) {
  if (rng() % 2) {
    p.has_bias = true;
    p.bias_dtype = static_cast<DType>(rng() % 3);
  }
  if (rng() % 3 == 0) {
    p.has_preact = true;
    p.preact_dtype = static_cast<DType>(rng() % 3);
    if (rng() % 2) p.ldpre = 2 * p.u + pick(rng, {1, 4, 9});
  }
}

// A call that needs workspace, run without: refused by name, and `out`
// (poisoned with `poison` before) still holds the poison.
inline void expect_refused_without_workspace(const Problem& p, const Arguments& a, const Tensor& out,
                                             const std::vector<unsigned char>& poison) {
  const Status s = run(p, a, nullptr, 0, nullptr);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_NE(s.message().find("workspace"), std::string::npos) << s.message();
  CUDA_OK(sync_within("refused call"));
  ASSERT_EQ(out.download(), poison) << "a refused call wrote its output";
}

// run() with workspace_size(p) bytes of workspace (filled with 0xff: its
// contents need no initialisation), then a synchronisation that names `what`.
inline void run_with_workspace(const Problem& p, const Arguments& a, const std::string& what) {
  const size_t bytes = workspace_size(p);
  DeviceBuffer ws(bytes);
  if (bytes) CUDA_OK(cudaMemset(ws.p, 0xff, bytes));
  const Status s = run(p, a, ws.p, bytes, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(sync_within(what));
}

// GATEDMLP_TEST_CASES overrides the number of random cases (the sanitizer
// runs use a handful).
inline int cases(int n) {
  const char* v = std::getenv("GATEDMLP_TEST_CASES");
  return v ? std::atoi(v) : n;
}

// The fp32 Y of a problem whose x and weights are on the host at hx, hw
// (laid out as the device call's) against the float64 CPU reference:
// |y - want| <= rel (1 + |want|) for every element. y_dev: [M, U] on the
// device, dense.
inline void expect_y_matches_cpu(const Problem& p, const void* hx, const void* hw, const void* y_dev, double rel,
                                 const std::string& what) {
  std::vector<float> out(size_t(p.m * p.u));
  ASSERT_EQ(cudaMemcpy(out.data(), y_dev, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess) << what;
  Arguments h;
  h.x = hx;
  h.w = hw;
  std::vector<double> want;
  ref::cpu_reference(p, h, &want, nullptr);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], want[i], rel * (1 + std::fabs(want[i]))) << what << ", element " << i;
}

}  // namespace gatedmlp::test
