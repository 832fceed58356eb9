// `gatedmlp bench --host`: what a call of run() costs the host, against the
// floor of any launch (an empty kernel <<<1, 32>>>). At decode sizes a
// layer's GPU time is a few microseconds, so the host time of run() (its
// validation, planning, pointer queries, launch) can decide whether the GPU
// waits on the CPU.
//
//   gatedmlp bench --host [--host-batches 200] [--host-calls 100] [--json FILE]
//
// Entries (each timed the same way):
//   (a) an empty kernel <<<1, 32>>> on a stream: the floor
//   (b) run() on a cached problem: M = 1, K = U = 256, bf16, the same
//       Problem and pointers on every call
//   (c) run() with x and y rotating over 4 buffers each (activations change
//       per call, weights stay: the common case)
//   (d) validate() alone, (e) plan() alone
//   (f) cudaPointerGetAttributes on a device pointer (what a pointer check costs)
//   (g) cudaLaunchKernelEx of the empty kernel with a cluster dimension of 1
//       (the Hopper launcher's launch; sm_90 and newer)
//   (h) cudaLaunchKernelEx of the empty kernel with no attribute
//   (i), (j) as (b), (c) on M = 1, K = 1024, U = 2816: a grid the decode
//       kernel's Hopper form takes on sm_90 (its tensor maps' addresses
//       replaced per call in (j)); the register form elsewhere
//
// Method: host time only. A batch of N calls (no synchronisation inside it)
// is timed with std::chrono::steady_clock; the stream is synchronised before
// every batch, so the GPU's queue starts empty and, with N at most 500,
// never fills (a full queue would make the launch wait for the GPU, and the
// host time would measure the GPU). The entries take turns batch by batch
// (the starting entry rotating), so clock and frequency drift hit all alike;
// each entry's time is its median batch over N.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::tool {
namespace {

constexpr int64_t kDefaultBatches = 200;
constexpr int64_t kDefaultCalls = 100;
// A pending-launch queue holds about a thousand launches; half of that keeps
// a batch of the slowest entry's kernels far from filling it.
constexpr int64_t kMaxCalls = 500;
constexpr int64_t kWarmBatches = 5;
constexpr int kBuffers = 4;             // (c): x and y rotate over this many buffers each
constexpr double kBarRatio = 2.0;       // run() on a cached problem <= 2x the empty launch

struct Entry {
  std::string key, label;
  std::function<Status(int64_t calls)> batch;
  bool available = true;
  std::string note;
  std::vector<double> us;  // per call, one value per timed batch
  double median = NAN, p10 = NAN, p90 = NAN;
};

Status cuda_error(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return {StatusCode::cuda_error, std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// The stream the entries launch on, destroyed on every way out.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

}  // namespace

std::vector<FlagSpec> host_bench_flag_specs() {
  return {
      {"host", "",
       "a separate mode: host time per call (us) of an empty kernel launch, run() on a cached problem, run() with "
       "x/y rotating over 4 buffers, validate(), plan(), cudaPointerGetAttributes and cudaLaunchKernelEx, "
       "run() on a decode-size problem (M=1, K=1024, U=2816), interleaved batch by batch; prints each against the "
       "empty launch and the bar run() <= 2x it"},
      {"host-batches", "N", "--host: timed batches per entry (default 200); the median batch is reported"},
      {"host-calls", "N", "--host: calls per batch, no sync inside a batch (default 100, at most 500)"},
  };
}

int host_bench(const Flags& f) {
  const int64_t batches = f.i64("host-batches", kDefaultBatches);
  const int64_t calls = f.i64("host-calls", kDefaultCalls);
  if (batches < 1) throw UsageError("--host-batches must be >= 1");
  if (calls < 1 || calls > kMaxCalls)
    throw UsageError("--host-calls must be in [1, " + std::to_string(kMaxCalls) +
                     "] (more could fill the GPU's launch queue, and the host would wait for the GPU)");
  const std::string json = f.str("json", "");

  const DeviceInfo dev = require_device();
  std::fprintf(stderr, "gatedmlp bench --host: %s (sm_%d%d), driver %s, runtime %s, commit %s\n", dev.prop.name,
               dev.prop.major, dev.prop.minor, cuda_version_string(dev.driver_version).c_str(),
               cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str());
  if (const char* log = std::getenv("GATEDMLP_LOG"); log != nullptr && *log != '\0' && std::string(log) != "0") {
    std::fprintf(stderr,
                 "warning: GATEDMLP_LOG=%s is set: run() prints every call, and (b) and (c) time the printing. "
                 "Unset it for meaningful numbers.\n",
                 log);
  }

  Stream stream;
  const cudaStream_t s = stream.s;

  // The tiny problem: M = 1, K = U = 256, bf16 in and out, stacked weights, silu.
  Problem p;
  p.m = 1;
  p.k = 256;
  p.u = 256;
  const size_t esz = dtype_size(p.input_dtype);
  DeviceBuffer w(size_t(2 * p.u) * size_t(p.k) * esz, "W");
  std::vector<DeviceBuffer> xs, ys;
  for (int i = 0; i < kBuffers; ++i) {
    xs.emplace_back(size_t(p.m) * size_t(p.k) * esz, "X");
    ys.emplace_back(size_t(p.m) * size_t(p.u) * dtype_size(p.output_dtype), "Y");
    status_check(ref::fill_random(xs.back().get(), p.input_dtype, p.m * p.k, 11 + i, 0.0f, 1.0f, true, s),
                 "fill_random(X)");
  }
  status_check(ref::fill_random(w.get(), p.input_dtype, 2 * p.u * p.k, 7, -0.0625f, 0.0625f, false, s),
               "fill_random(W)");
  cuda_check(cudaStreamSynchronize(s), "fill");
  // The workspace a caller following the README passes.
  const size_t ws_bytes = workspace_size(p);
  DeviceBuffer ws(ws_bytes, "workspace");
  std::vector<Arguments> args(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    args[i].x = xs[i].get();
    args[i].w = w.get();
    args[i].y = ys[i].get();
  }
  const Arguments a0 = args[0];
  Config cfg;
  const Status planned = plan(p, &cfg, dev.device);

  // (i), (j): the decode-size problem, its own buffers.
  Problem pd = p;
  pd.k = 1024;
  pd.u = 2816;
  DeviceBuffer wd(size_t(2 * pd.u) * size_t(pd.k) * esz, "W (decode)");
  std::vector<DeviceBuffer> xds, yds;
  std::vector<Arguments> dargs(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    xds.emplace_back(size_t(pd.m) * size_t(pd.k) * esz, "X (decode)");
    yds.emplace_back(size_t(pd.m) * size_t(pd.u) * dtype_size(pd.output_dtype), "Y (decode)");
    status_check(ref::fill_random(xds.back().get(), pd.input_dtype, pd.m * pd.k, 31 + i, 0.0f, 1.0f, true, s),
                 "fill_random(X, decode)");
    dargs[i].x = xds[i].get();
    dargs[i].w = wd.get();
    dargs[i].y = yds[i].get();
  }
  status_check(ref::fill_random(wd.get(), pd.input_dtype, 2 * pd.u * pd.k, 29, -0.0625f, 0.0625f, false, s),
               "fill_random(W, decode)");
  cuda_check(cudaStreamSynchronize(s), "fill (decode)");
  const size_t wsd_bytes = workspace_size(pd);
  DeviceBuffer wsd(wsd_bytes, "workspace (decode)");
  Config cfgd;
  const Status planned_d = plan(pd, &cfgd, dev.device);

  std::vector<Entry> entries;
  auto add = [&](const char* key, const char* label, std::function<Status(int64_t)> fn) {
    Entry e;
    e.key = key;
    e.label = label;
    e.batch = std::move(fn);
    entries.push_back(std::move(e));
  };
  add("a", "empty kernel <<<1, 32>>>", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) launch_empty_kernel(s);
    return Status::Ok();
  });
  add("b", "run(), cached problem, same pointers", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = run(p, a0, ws.get(), ws_bytes, s); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("c", "run(), x and y rotating over 4 buffers", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = run(p, args[static_cast<size_t>(i % kBuffers)], ws.get(), ws_bytes, s); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("d", "validate()", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = validate(p, a0); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("e", "plan()", [&](int64_t n) {
    Config c;
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = plan(p, &c); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("f", "cudaPointerGetAttributes(device pointer)", [&](int64_t n) {
    cudaPointerAttributes attr{};
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = cuda_error(cudaPointerGetAttributes(&attr, a0.x), "cudaPointerGetAttributes"); !st.ok())
        return st;
    }
    return Status::Ok();
  });
  add("g", "cudaLaunchKernelEx, cluster dim 1x1x1", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = cuda_error(launch_empty_kernel_ex(s, true), "cudaLaunchKernelEx"); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("h", "cudaLaunchKernelEx, no attribute", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = cuda_error(launch_empty_kernel_ex(s, false), "cudaLaunchKernelEx"); !st.ok()) return st;
    }
    return Status::Ok();
  });

  add("i", "run(), M=1 K=1024 U=2816, same pointers", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = run(pd, dargs[0], wsd.get(), wsd_bytes, s); !st.ok()) return st;
    }
    return Status::Ok();
  });
  add("j", "run(), M=1 K=1024 U=2816, x and y rotating", [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (Status st = run(pd, dargs[static_cast<size_t>(i % kBuffers)], wsd.get(), wsd_bytes, s); !st.ok()) return st;
    }
    return Status::Ok();
  });

  // Which entries run here: one call each, checked. A failure marks the entry
  // n/a (run() on a GPU the library does not support, a cluster launch
  // before sm_90) instead of ending the bench: it must run on any CUDA GPU.
  for (Entry& e : entries) {
    if (e.key == "g" && dev.prop.major < 9) {
      e.available = false;
      e.note = "n/a: cluster launches need sm_90 or newer";
      continue;
    }
    Status st = e.batch(1);
    if (st.ok()) st = cuda_error(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    if (st.ok()) st = cuda_error(cudaGetLastError(), "launch");
    if (!st.ok()) {
      (void)cudaGetLastError();
      e.available = false;
      e.note = "n/a: " + st.message();
    }
  }

  auto run_batch = [&](Entry& e, bool timed) {
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (between batches)");
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = e.batch(calls);
    const auto t1 = std::chrono::steady_clock::now();
    status_check(st, "(" + e.key + ") " + e.label);
    if (timed) e.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / double(calls));
  };
  for (int64_t b = 0; b < kWarmBatches; ++b) {
    for (Entry& e : entries)
      if (e.available) run_batch(e, false);
  }
  const size_t n = entries.size();
  for (int64_t b = 0; b < batches; ++b) {
    for (size_t j = 0; j < n; ++j) {
      Entry& e = entries[(j + static_cast<size_t>(b)) % n];
      if (e.available) run_batch(e, true);
    }
  }
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (end)");
  cuda_check(cudaGetLastError(), "the launches");
  for (Entry& e : entries) {
    if (!e.available) continue;
    e.median = median(e.us);
    e.p10 = percentile(e.us, 0.10);
    e.p90 = percentile(e.us, 0.90);
  }
  const double floor_us = entries[0].median;

  std::printf("gatedmlp bench --host: %s (sm_%d%d), driver %s, runtime %s, commit %s\n", dev.prop.name,
              dev.prop.major, dev.prop.minor, cuda_version_string(dev.driver_version).c_str(),
              cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str());
  const std::string plan_text = planned.ok() ? to_string(cfg) : "failed: " + planned.message();
  std::printf("problem: M=%lld K=%lld U=%lld %s %s, workspace %zu bytes; plan: %s\n", (long long)p.m, (long long)p.k,
              (long long)p.u, to_string(p.input_dtype), layout_name(p.weights).c_str(), ws_bytes, plan_text.c_str());
  const std::string plan_text_d = planned_d.ok() ? to_string(cfgd) : "failed: " + planned_d.message();
  std::printf("(i), (j): M=%lld K=%lld U=%lld, workspace %zu bytes; plan: %s\n", (long long)pd.m, (long long)pd.k,
              (long long)pd.u, wsd_bytes, plan_text_d.c_str());
  std::printf(
      "host time per call, microseconds: median (p10, p90) of %lld batches of %lld calls, steady_clock around each "
      "batch,\nthe stream synchronised between batches (never inside one), the entries interleaved batch by batch\n",
      (long long)batches, (long long)calls);
  std::printf("  %-3s %-42s %9s %9s %9s %8s\n", "", "entry", "median", "p10", "p90", "x (a)");
  for (const Entry& e : entries) {
    if (!e.available) {
      std::printf("  (%s) %-42s %s\n", e.key.c_str(), e.label.c_str(), e.note.c_str());
      continue;
    }
    std::printf("  (%s) %-42s %9.3f %9.3f %9.3f %8s\n", e.key.c_str(), e.label.c_str(), e.median, e.p10, e.p90,
                std::isfinite(floor_us) && floor_us > 0 ? fmt("%.2f", e.median / floor_us).c_str() : "-");
  }
  const Entry& cached = entries[1];
  std::string bar;
  if (!cached.available || !(floor_us > 0)) {
    bar = "n/a (" + (cached.available ? std::string("no empty-launch time") : cached.note) + ")";
  } else {
    const double ratio = cached.median / floor_us;
    bar = fmt("%s (%.3f us against %.3f us: %.2fx)", ratio <= kBarRatio ? "PASS" : "MISSED", cached.median, floor_us,
              ratio);
  }
  std::printf("bar: run() on a cached problem <= 2x the empty launch: %s\n", bar.c_str());

  if (!json.empty()) {
    std::ofstream out(json);
    if (!out) throw ToolError("cannot open --json file '" + json + "' for writing");
    out << "{\n  \"tool\": \"gatedmlp bench --host\",\n";
    out << "  \"device\": " << json_str(dev.prop.name) << ",\n";
    out << "  \"compute_capability\": " << json_str(fmt("%d.%d", dev.prop.major, dev.prop.minor)) << ",\n";
    out << "  \"driver_version\": " << json_str(cuda_version_string(dev.driver_version)) << ",\n";
    out << "  \"runtime_version\": " << json_str(cuda_version_string(dev.runtime_version)) << ",\n";
    out << "  \"git_commit\": " << json_str(git_commit()) << ",\n";
    out << "  \"batches\": " << batches << ", \"calls_per_batch\": " << calls << ",\n";
    out << "  \"problem\": " << json_str(to_string(p)) << ",\n";
    out << "  \"config\": " << json_str(plan_text) << ",\n";
    out << "  \"workspace_bytes\": " << ws_bytes << ",\n";
    out << "  \"problem_ij\": " << json_str(to_string(pd)) << ",\n";
    out << "  \"config_ij\": " << json_str(plan_text_d) << ",\n";
    out << "  \"entries\": [";
    for (size_t i = 0; i < n; ++i) {
      const Entry& e = entries[i];
      out << (i ? ",\n" : "\n") << "    {\"key\": " << json_str(e.key) << ", \"label\": " << json_str(e.label)
          << ", \"available\": " << (e.available ? "true" : "false") << ", \"median_us\": " << json_num(e.median)
          << ", \"p10_us\": " << json_num(e.p10) << ", \"p90_us\": " << json_num(e.p90)
          << ", \"ratio_to_empty_launch\": " << json_num(e.median / floor_us) << ", \"note\": " << json_str(e.note)
          << "}";
    }
    out << "\n  ],\n  \"bar\": " << json_str("run() on a cached problem <= 2x the empty launch: " + bar) << "\n}\n";
    if (!out) throw ToolError("writing --json file '" + json + "' failed");
    std::fprintf(stderr, "wrote %s\n", json.c_str());
  }
  return 0;
}

}  // namespace gatedmlp::tool
