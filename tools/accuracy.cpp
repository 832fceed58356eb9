// `gatedmlp accuracy`: the blog's accuracy table. For M = K = U = MNK, bf16,
// SwiGLU, stacked weights, it draws random kaiming-uniform inits
// (W ~ U(-1/sqrt(K), 1/sqrt(K)), as nn.Linear does; X ~ N(0, 1)) and reports
// the max abs, mean abs and relative (||out - ref|| / ||ref||) error of the
// fused kernel and of the unfused GEMM + GLU, mean ± std over the inits,
// against a float64 reference computed on the device for sampled rows.
//
//   gatedmlp accuracy                                 # MNK 1024 ... 8192, 100 inits, 60 s per size
//   gatedmlp accuracy --sizes 16384,65536 --inits 10 --json acc.json
//
// Both paths are measured against the same reference on the same inputs, so
// the fused/unfused ratio is the number to read: the fused kernel keeps g and
// u in fp32 and should not be less accurate than the unfused path.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::tool {
namespace {

const std::vector<int64_t> kDefaultSizes = {1024, 2048, 4096, 8192};
constexpr size_t kSlackBytes = size_t{256} << 20;

struct Err {
  double max_abs = 0, mean_abs = 0, rel = 0;
};

Err compare(const std::vector<double>& out, const std::vector<double>& ref) {
  double mx = 0, sum = 0, num = 0, den = 0;
  bool finite = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = out[i] - ref[i];
    if (!std::isfinite(d)) finite = false;  // NaN never passes: it must show in every statistic
    mx = std::max(mx, std::fabs(d));
    sum += std::fabs(d);
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (!finite || out.empty()) return {NAN, NAN, NAN};
  return {mx, sum / static_cast<double>(out.size()), den > 0 ? std::sqrt(num / den) : (num == 0 ? 0.0 : INFINITY)};
}

struct Series {
  std::vector<double> max_abs, mean_abs, rel;
  void add(const Err& e) {
    max_abs.push_back(e.max_abs);
    mean_abs.push_back(e.mean_abs);
    rel.push_back(e.rel);
  }
};

struct Row {
  int64_t mnk = 0;
  bool skipped = false;
  std::string note;
  int64_t inits = 0, rows = 0;
  bool fused_ok = false;
  Series fused, unfused;
  double seconds = 0;
};

Row run_size(const DeviceInfo& dev, int64_t n, int64_t inits, int64_t want_rows, double budget_s, uint64_t seed,
             cudaStream_t stream) {
  Row row;
  row.mnk = n;
  Problem p;
  p.m = p.k = p.u = n;
  p.input_dtype = p.output_dtype = DType::bf16;
  p.activation = Activation::silu;
  p.weights.format = WeightFormat::fused;  // stacked: [gate; up]
  p.weights.group = 0;

  if (const Status s = check_support(p); !s.ok()) {
    row.skipped = true;
    row.note = "check_support: " + s.message();
    return row;
  }
  Config cfg;
  const Status planned = plan(p, &cfg, dev.device);
  row.fused_ok = planned.ok();
  if (!row.fused_ok) row.note = "fused not measured: " + planned.message();

  const int64_t nrows = std::min(want_rows, n);
  row.rows = nrows;
  const size_t x_bytes = size_t(n) * n * 2, w_bytes = 2 * size_t(n) * n * 2, y_bytes = size_t(n) * n * 2;
  const size_t inter_bytes = 2 * size_t(n) * n * 2;
  const size_t ref_bytes = size_t(nrows) * n * sizeof(double);
  const size_t fused_ws = row.fused_ok ? workspace_size(p) : 0;
  const size_t need =
      x_bytes + w_bytes + y_bytes + inter_bytes + ref_bytes + fused_ws + (size_t{32} << 20) + kSlackBytes;
  if (!fits_in_memory(need, &row.note)) {
    row.skipped = true;
    return row;
  }

  const auto t0 = std::chrono::steady_clock::now();
  try {
    DeviceBuffer x(x_bytes, "X"), w(w_bytes, "W"), y(y_bytes, "Y"), ws(fused_ws, "fused workspace");
    DeviceBuffer ref_dev(ref_bytes, "reference rows"), rows_dev(size_t(nrows) * sizeof(int64_t), "row list");
    std::unique_ptr<ref::Unfused> unfused;
    status_check(ref::Unfused::create(p, &unfused), "Unfused::create");
    Arguments args;
    args.x = x.get();
    args.w = w.get();
    args.y = y.get();

    std::mt19937_64 rng(seed ^ (uint64_t(n) * 0x9E3779B97F4A7C15ull));
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    double last_init_s = 0;

    for (int64_t it = 0; it < inits; ++it) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it > 0 && elapsed + last_init_s > budget_s) break;
      const auto ti = std::chrono::steady_clock::now();

      const uint64_t s = rng();
      status_check(ref::fill_random(x.get(), DType::bf16, n * n, s, 0.0f, 1.0f, true, stream), "fill_random(X)");
      status_check(ref::fill_random(w.get(), DType::bf16, 2 * n * n, s + 1, -bound, bound, false, stream),
                   "fill_random(W)");
      std::vector<int64_t> rows;
      std::sample(all.begin(), all.end(), std::back_inserter(rows), nrows, rng);
      cuda_check(
          cudaMemcpyAsync(rows_dev.get(), rows.data(), rows.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(rows)");
      status_check(ref::gpu_reference_rows(p, args, rows_dev.as<int64_t>(), nrows, ref_dev.as<double>(), stream),
                   "gpu_reference_rows");
      std::vector<double> ref(size_t(nrows) * n);
      cuda_check(cudaMemcpyAsync(ref.data(), ref_dev.get(), ref_bytes, cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync(reference)");

      // One Y for both paths (it is the largest buffer at 64k), poisoned
      // before each so a row left unwritten shows up as NaN.
      if (row.fused_ok) {
        status_check(ref::fill_nan(y.get(), DType::bf16, n * n, stream), "fill_nan(Y)");
        status_check(run(p, args, ws.get(), fused_ws, stream), "fused run");
        row.fused.add(compare(copy_rows(y.get(), DType::bf16, n, n, rows, stream), ref));
      }
      status_check(ref::fill_nan(y.get(), DType::bf16, n * n, stream), "fill_nan(Y)");
      status_check(unfused->run(args, stream), "unfused run");
      row.unfused.add(compare(copy_rows(y.get(), DType::bf16, n, n, rows, stream), ref));

      ++row.inits;
      last_init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ti).count();
    }
  } catch (const ToolError& e) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    row.skipped = row.inits == 0;
    row.note = e.what();
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

std::string pm(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const MeanStd s = mean_std(v);
  return fmt("%.2e ± %.2e", s.mean, s.std);
}

std::string json_stat(const std::vector<double>& v) {
  const MeanStd s = mean_std(v);
  return "{\"mean\": " + json_num(s.mean) + ", \"std\": " + json_num(s.std) + "}";
}

std::string json_series(const Series& s) {
  return "{\"max_abs\": " + json_stat(s.max_abs) + ", \"mean_abs\": " + json_stat(s.mean_abs) +
         ", \"rel\": " + json_stat(s.rel) + "}";
}

}  // namespace

int accuracy_main(int argc, char** argv) {
  Flags f(
      "accuracy",
      "Error of the fused kernel and of the unfused GEMM + GLU against a float64 reference, mean ± std over\n"
      "random kaiming-uniform inits: M = K = U = MNK, bf16, SwiGLU, stacked [gate; up] weights.",
      {
          {"sizes", "LIST", "comma-separated MNK values (default 1024,2048,4096,8192; up to 65536 as memory allows)"},
          {"inits", "N", "random inits per size (default 100), capped by --budget-s"},
          {"rows", "R", "rows sampled per init for the fp64 reference (default 256)"},
          {"budget-s", "S", "time budget per size in seconds (default 60); at least one init always runs"},
          {"seed", "S", "base random seed (default: a fresh one, printed)"},
          {"json", "FILE", "also write the table, device, driver and git commit as JSON"},
      });
  f.parse(argc, argv);
  if (f.help()) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  const std::vector<int64_t> sizes = f.i64_list("sizes", kDefaultSizes);
  for (int64_t s : sizes) {
    if (s < 1) throw UsageError("--sizes: every size must be >= 1, got " + std::to_string(s));
  }
  const int64_t inits = f.i64("inits", 100);
  const int64_t nrows = f.i64("rows", 256);
  const double budget = f.f64("budget-s", 60.0);
  // Fresh inputs on every run unless --seed asks to repeat one; the seed is printed.
  const uint64_t seed = f.has("seed") ? static_cast<uint64_t>(f.i64("seed", 0))
                                      : (uint64_t(std::random_device{}()) << 32 | std::random_device{}()) >> 1;
  const std::string json = f.str("json", "");
  if (inits < 1) throw UsageError("--inits must be >= 1");
  if (nrows < 1) throw UsageError("--rows must be >= 1");
  if (budget <= 0) throw UsageError("--budget-s must be > 0");

  const DeviceInfo dev = require_device();
  std::fprintf(stderr, "gatedmlp accuracy: %s, driver %s, runtime %s, commit %s\n", dev.prop.name,
               cuda_version_string(dev.driver_version).c_str(), cuda_version_string(dev.runtime_version).c_str(),
               git_commit().c_str());
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  std::vector<Row> rows;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Row r = run_size(dev, sizes[i], inits, nrows, budget, seed, stream);
    if (r.skipped) {
      std::fprintf(stderr, "[%zu/%zu] MNK=%lld: skipped: %s\n", i + 1, sizes.size(), (long long)r.mnk, r.note.c_str());
    } else {
      std::fprintf(stderr, "[%zu/%zu] MNK=%lld: %lld inits x %lld rows in %.1f s; rel fused %s, unfused %s%s%s\n",
                   i + 1, sizes.size(), (long long)r.mnk, (long long)r.inits, (long long)r.rows, r.seconds,
                   pm(r.fused.rel).c_str(), pm(r.unfused.rel).c_str(), r.note.empty() ? "" : "; ", r.note.c_str());
    }
    rows.push_back(std::move(r));
  }
  (void)cudaStreamDestroy(stream);

  std::printf("device: %s, driver %s, runtime %s, commit %s; bf16, silu, stacked; W ~ U(+-1/sqrt(K)), X ~ N(0,1); seed %llu\n",
              dev.prop.name, cuda_version_string(dev.driver_version).c_str(),
              cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str(), (unsigned long long)seed);
  std::printf("%-6s %5s %5s | %-8s %-21s %-21s %-21s\n", "MNK", "inits", "rows", "path", "max abs diff",
              "mean abs diff", "relative diff");
  bool bad = false;
  for (const Row& r : rows) {
    if (r.skipped) {
      std::printf("%-6lld skipped: %s\n", (long long)r.mnk, r.note.c_str());
      continue;
    }
    if (r.fused_ok) {
      std::printf("%-6lld %5lld %5lld | %-8s %-21s %-21s %-21s\n", (long long)r.mnk, (long long)r.inits,
                  (long long)r.rows, "fused", pm(r.fused.max_abs).c_str(), pm(r.fused.mean_abs).c_str(),
                  pm(r.fused.rel).c_str());
    }
    std::printf("%-6s %5s %5s | %-8s %-21s %-21s %-21s\n", r.fused_ok ? "" : std::to_string(r.mnk).c_str(),
                r.fused_ok ? "" : std::to_string(r.inits).c_str(), r.fused_ok ? "" : std::to_string(r.rows).c_str(),
                "unfused", pm(r.unfused.max_abs).c_str(), pm(r.unfused.mean_abs).c_str(), pm(r.unfused.rel).c_str());
    if (!r.note.empty()) std::printf("       note: %s\n", r.note.c_str());
    // The design's tolerance: fused error at most 2x unfused (plus a hair).
    const double fr = mean_std(r.fused.rel).mean, ur = mean_std(r.unfused.rel).mean;
    if (r.fused_ok && !(fr <= 2.0 * ur + 1e-6)) {
      std::printf("       FAIL: fused relative error %.3g is more than 2x unfused %.3g\n", fr, ur);
      bad = true;
    }
    if (!(ur < 1.0)) bad = true;  // NaN or garbage from the baseline is a failure too
  }

  if (!json.empty()) {
    std::ofstream out(json);
    if (!out) throw ToolError("cannot open --json file '" + json + "' for writing");
    out << "{\n  \"tool\": \"gatedmlp accuracy\",\n";
    out << "  \"device\": " << json_str(dev.prop.name) << ",\n";
    out << "  \"driver_version\": " << json_str(cuda_version_string(dev.driver_version)) << ",\n";
    out << "  \"runtime_version\": " << json_str(cuda_version_string(dev.runtime_version)) << ",\n";
    out << "  \"git_commit\": " << json_str(git_commit()) << ",\n";
    out << "  \"seed\": " << seed << ",\n";
    out << "  \"dtype\": \"bf16\", \"activation\": \"silu\", \"layout\": \"stacked\",\n";
    out << "  \"budget_s\": " << json_num(budget) << ", \"requested_inits\": " << inits << ",\n";
    out << "  \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? ",\n" : "\n") << "    {\"mnk\": " << r.mnk << ", \"skipped\": " << (r.skipped ? "true" : "false")
          << ", \"inits\": " << r.inits << ", \"rows\": " << r.rows << ", \"seconds\": " << json_num(r.seconds);
      if (!r.skipped) {
        if (r.fused_ok) out << ", \"fused\": " << json_series(r.fused);
        out << ", \"unfused\": " << json_series(r.unfused);
      }
      out << ", \"note\": " << json_str(r.note) << "}";
    }
    out << "\n  ]\n}\n";
    if (!out) throw ToolError("writing --json file '" + json + "' failed");
    std::fprintf(stderr, "wrote %s\n", json.c_str());
  }
  return bad ? 1 : 0;
}

}  // namespace gatedmlp::tool
