// `gatedmlp bench`: times the fused kernel against cuBLAS GEMM alone and
// against the unfused GEMM + GLU path, all three in the same run. The unfused
// path's GLU kernel is also timed alone, and its bytes over its time printed
// ("glu TB/s"): the baseline is only fair if that half runs near the memory
// bandwidth.
//
//   gatedmlp bench                                  # Llama-3 8B, M = 1 ... 65536
//   gatedmlp bench --model all --json bench.json
//   gatedmlp bench --m 1,4096 --k 8192 --u 28672 --layout g32 --first up
//   gatedmlp bench --path portable --schedule block  # the sm80 kernel on a Hopper GPU
//
// Method: each call's GPU time is taken with CUDA events after a warm-up, and
// the reported time is the median. Two schedules (--schedule):
//   call  (default) the paths are interleaved call by call, so clock and
//         thermal drift hit them alike;
//   block each path runs in its own block of consecutive calls (a few warm-up
//         calls of that path, then its timed calls back to back, an event
//         between calls), and the blocks rotate path by path kBlockRounds
//         times (A B C A B C A B C), so no path is timed only right after
//         another one; a path's median is over all its calls.
// The inputs rotate over enough copies of X, W and Y that one rotation is more
// than twice the L2 size, so no call finds its operands already cached by the
// previous one. --path sets GATEDMLP_FORCE_PATH before anything runs, to time
// the portable kernel on a GPU that has the Hopper one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::tool {
namespace {

struct Model {
  const char* name;
  int64_t k, u;
};
// Llama-3 hidden size and intermediate size.
constexpr Model kModels[] = {{"8b", 4096, 14336}, {"70b", 8192, 28672}, {"405b", 16384, 53248}};
const std::vector<int64_t> kDefaultM = {1, 16, 64, 256, 1024, 4096, 16384, 65536};

constexpr double kTargetSeconds = 0.4;  // timed reps of all the paths together, per shape
constexpr int64_t kMinReps = 3;         // the 405B shapes at large M take ~0.3 s a call
constexpr int64_t kMaxReps = 3000;
constexpr int64_t kMaxCopies = 64;
constexpr int64_t kBlockRounds = 3;          // --schedule block: rotations of the per-path blocks
constexpr int64_t kMaxBlockWarmup = 20;      // --schedule block: untimed calls before each block, at most
constexpr const char* kForcePathEnv = "GATEDMLP_FORCE_PATH";

enum class Schedule { call, block };
const char* schedule_name(Schedule s) { return s == Schedule::call ? "call" : "block"; }
constexpr size_t kSlackBytes = size_t{256} << 20;  // cuBLAS/context allocations beyond ours

struct Row {
  std::string model;
  int64_t m = 0, k = 0, u = 0;
  bool skipped = false;
  bool fused_ok = false;
  bool bad = false;  // the fused kernel failed or disagreed with unfused: exit non-zero
  std::string note;
  std::string path = "none", config;
  double fused_ms = NAN, gemm_ms = NAN, unfused_ms = NAN;
  // --preact: the same fused call without the pre-activation, timed in the
  // same run (what the pre-activation costs: fused_ms / fused_nopre_ms - 1).
  double fused_nopre_ms = NAN;
  // The unfused path's GLU kernel alone, and the bytes it moves (reads the
  // [M, 2U] intermediate, writes Y and any pre-activation): a baseline whose
  // elementwise half ran far below memory bandwidth would flatter us.
  double glu_ms = NAN, glu_bytes = 0;
  double fused_tflops = NAN, gemm_tflops = NAN;
  double check_rel = NAN;  // ||fused - unfused|| / ||unfused|| on sampled rows
  int64_t reps = 0, copies = 0;
  double act_fused_bytes = 0, act_unfused_bytes = 0;
  // Scratch the fused call used (workspace_size: the split tail's partial
  // tiles), reused across calls and layers, so not activation memory; the
  // unfused baseline's cuBLASLt workspace is 32 MB.
  double workspace_fused_bytes = 0;
};

double flops(int64_t m, int64_t k, int64_t u) { return 2.0 * double(m) * double(k) * double(2 * u); }

class Bench {
 public:
  Bench(const DeviceInfo& dev, Problem base, int64_t fixed_reps, Schedule schedule)
      : dev_(dev), base_(base), fixed_reps_(fixed_reps), schedule_(schedule) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Bench() { (void)cudaStreamDestroy(stream_); }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Row run_shape(const std::string& model, int64_t m, int64_t k, int64_t u);

 private:
  using Call = std::function<Status(int64_t copy)>;
  void time_paths(const std::vector<Call>& calls, int64_t copies, std::vector<double>* ms, int64_t* reps);

  DeviceInfo dev_;
  Problem base_;
  int64_t fixed_reps_;
  Schedule schedule_;
  cudaStream_t stream_ = nullptr;
};

void Bench::time_paths(const std::vector<Call>& calls, int64_t copies, std::vector<double>* ms, int64_t* reps) {
  const size_t n = calls.size();
  int64_t next = 0;  // rotation position, advanced on every call of every path
  auto call = [&](size_t i) { status_check(calls[i](next++ % copies), "timed call"); };

  // Warm-up: one round pays the first-call costs (module load, cuBLASLt
  // setup); a second, timed, sizes the number of reps.
  for (size_t i = 0; i < n; ++i) call(i);
  double est_s = 0;
  {
    EventList ev(2 * n);
    for (size_t i = 0; i < n; ++i) {
      cuda_check(cudaEventRecord(ev[2 * i], stream_), "cudaEventRecord");
      call(i);
      cuda_check(cudaEventRecord(ev[2 * i + 1], stream_), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream_), "warm-up");
    for (size_t i = 0; i < n; ++i) {
      float t = 0;
      cuda_check(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
      est_s += t * 1e-3;
    }
  }
  *reps = fixed_reps_ > 0
              ? fixed_reps_
              : std::clamp<int64_t>(static_cast<int64_t>(kTargetSeconds / std::max(est_s, 1e-7)), kMinReps, kMaxReps);

  std::vector<std::vector<double>> times(n);
  if (schedule_ == Schedule::call) {
    // One event between consecutive calls: interval j times call j.
    const size_t total = static_cast<size_t>(*reps) * n;
    EventList ev(total + 1);
    cuda_check(cudaEventRecord(ev[0], stream_), "cudaEventRecord");
    for (size_t j = 0; j < total; ++j) {
      call(j % n);
      cuda_check(cudaEventRecord(ev[j + 1], stream_), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream_), "timed reps");
    for (size_t j = 0; j < total; ++j) {
      float t = 0;
      cuda_check(cudaEventElapsedTime(&t, ev[j], ev[j + 1]), "cudaEventElapsedTime");
      times[j % n].push_back(t);
    }
  } else {
    // Blocks: path i's block in round r holds `warm` untimed calls, then
    // `per_block` timed ones with an event between consecutive calls. The
    // reps are split over the rounds (rounded up), so the total stays near
    // the call schedule's.
    const int64_t per_block = (*reps + kBlockRounds - 1) / kBlockRounds;
    *reps = per_block * kBlockRounds;
    const int64_t warm = std::clamp<int64_t>(per_block / 10, 1, kMaxBlockWarmup);
    const size_t stride = static_cast<size_t>(per_block) + 1;  // events per block
    EventList ev(static_cast<size_t>(kBlockRounds) * n * stride);
    for (int64_t round = 0; round < kBlockRounds; ++round) {
      for (size_t i = 0; i < n; ++i) {
        const size_t base = (static_cast<size_t>(round) * n + i) * stride;
        for (int64_t w = 0; w < warm; ++w) call(i);
        cuda_check(cudaEventRecord(ev[base], stream_), "cudaEventRecord");
        for (int64_t j = 0; j < per_block; ++j) {
          call(i);
          cuda_check(cudaEventRecord(ev[base + static_cast<size_t>(j) + 1], stream_), "cudaEventRecord");
        }
      }
    }
    cuda_check(cudaStreamSynchronize(stream_), "timed blocks");
    for (int64_t round = 0; round < kBlockRounds; ++round) {
      for (size_t i = 0; i < n; ++i) {
        const size_t base = (static_cast<size_t>(round) * n + i) * stride;
        for (size_t j = 0; j + 1 < stride; ++j) {
          float t = 0;
          cuda_check(cudaEventElapsedTime(&t, ev[base + j], ev[base + j + 1]), "cudaEventElapsedTime");
          times[i].push_back(t);
        }
      }
    }
  }
  ms->assign(n, NAN);
  for (size_t i = 0; i < n; ++i) (*ms)[i] = median(times[i]);
}

Row Bench::run_shape(const std::string& model, int64_t m, int64_t k, int64_t u) {
  Row row;
  row.model = model;
  row.m = m;
  row.k = k;
  row.u = u;
  Problem p = base_;
  p.m = m;
  p.k = k;
  p.u = u;

  const size_t in_sz = dtype_size(p.input_dtype), out_sz = dtype_size(p.output_dtype);
  const size_t x_bytes = size_t(m) * k * in_sz, w_bytes = size_t(2 * u) * k * in_sz, y_bytes = size_t(m) * u * out_sz;
  const size_t inter_bytes = size_t(m) * 2 * u * in_sz;
  // --preact: the fused kernel also writes [M, 2U] (the unfused path writes
  // it in place of its intermediate).
  const size_t pre_bytes = p.has_preact ? size_t(m) * 2 * u * dtype_size(p.preact_dtype) : 0;
  row.act_fused_bytes = double(y_bytes + pre_bytes);
  row.act_unfused_bytes = double(inter_bytes + y_bytes);
  row.glu_bytes = double(inter_bytes + y_bytes + pre_bytes);

  if (const Status s = check_support(p); !s.ok()) {
    row.skipped = true;
    row.note = std::string("check_support: ") + s.message();
    return row;
  }
  Config cfg;
  const Status planned = plan(p, &cfg, dev_.device);
  row.fused_ok = planned.ok();
  if (row.fused_ok) {
    row.path = to_string(cfg.path);
    row.config = to_string(cfg);
  } else {
    row.note = std::string("fused not timed: ") + planned.message();
  }

  // Copies so that one rotation is more than twice the L2.
  const size_t per_copy = x_bytes + w_bytes + y_bytes + pre_bytes;
  const size_t l2 = static_cast<size_t>(std::max(dev_.prop.l2CacheSize, 0));
  const int64_t copies =
      std::clamp<int64_t>(static_cast<int64_t>(2 * l2 / std::max<size_t>(per_copy, 1)) + 1, 1, kMaxCopies);
  row.copies = copies;
  // --preact: the call without it is timed too (Row::fused_nopre_ms).
  Problem nopre = p;
  nopre.has_preact = false;
  Config nopre_cfg;
  const bool time_nopre = row.fused_ok && p.has_preact && plan(nopre, &nopre_cfg, dev_.device).ok();
  const size_t fused_ws =
      row.fused_ok ? std::max(workspace_size(p), time_nopre ? workspace_size(nopre) : size_t{0}) : 0;
  row.workspace_fused_bytes = double(fused_ws);
  const size_t need = size_t(copies) * per_copy + inter_bytes + (size_t{32} << 20) + fused_ws + kSlackBytes;
  if (!fits_in_memory(need, &row.note)) {
    row.skipped = true;
    return row;
  }

  try {
    std::vector<DeviceBuffer> xs, ws, ys, pres;
    std::vector<Arguments> args(copies);
    const float w_bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
    for (int64_t c = 0; c < copies; ++c) {
      xs.emplace_back(x_bytes, "X");
      ws.emplace_back(w_bytes, "W");
      ys.emplace_back(y_bytes, "Y");
      const uint64_t seed = 0x5EEDull * 1000003ull + uint64_t(m) * 7919ull + uint64_t(c) * 104729ull;
      status_check(ref::fill_random(xs.back().get(), p.input_dtype, m * k, seed, 0.0f, 1.0f, true, stream_),
                   "fill_random(X)");
      status_check(
          ref::fill_random(ws.back().get(), p.input_dtype, 2 * u * k, seed + 1, -w_bound, w_bound, false, stream_),
          "fill_random(W)");
      status_check(ref::fill_nan(ys.back().get(), p.output_dtype, m * u, stream_), "fill_nan(Y)");
      Arguments& a = args[c];
      a.x = xs.back().get();
      a.w = ws.back().get();
      if (p.weights.format == WeightFormat::separate) a.w_up = ws.back().as<char>() + size_t(u) * k * in_sz;
      a.y = ys.back().get();
      if (p.has_preact) {
        pres.emplace_back(pre_bytes, "preact");
        a.preact = pres.back().get();
      }
    }
    DeviceBuffer fused_workspace(fused_ws, "fused workspace");
    std::unique_ptr<ref::Unfused> unfused;
    status_check(ref::Unfused::create(p, &unfused), "Unfused::create");

    auto fused_call = [&](int64_t c) { return run(p, args[c], fused_workspace.get(), fused_ws, stream_); };
    auto nopre_call = [&](int64_t c) {
      Arguments a = args[c];
      a.preact = nullptr;
      return run(nopre, a, fused_workspace.get(), fused_ws, stream_);
    };
    auto gemm_call = [&](int64_t c) { return unfused->run_gemm_only(args[c], stream_); };
    auto unfused_call = [&](int64_t c) { return unfused->run(args[c], stream_); };
    auto glu_call = [&](int64_t c) { return unfused->run_glu_only(args[c], stream_); };

    // A benchmark of a wrong kernel is worthless: compare fused with unfused
    // on a few rows first (the fused Y was poisoned, so unwritten rows show).
    std::vector<int64_t> rows = {0, m / 3, m / 2, (2 * m) / 3, m - 1};
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    if (row.fused_ok) {
      const Status s = fused_call(0);
      if (!s.ok()) {
        row.fused_ok = false;
        row.bad = true;
        row.note = std::string("fused run failed: ") + s.message();
      }
    }
    if (row.fused_ok) {
      const std::vector<double> fy = copy_rows(args[0].y, p.output_dtype, u, u, rows, stream_);
      status_check(unfused_call(0), "unfused run");
      const std::vector<double> uy = copy_rows(args[0].y, p.output_dtype, u, u, rows, stream_);
      double num = 0, den = 0;
      for (size_t i = 0; i < fy.size(); ++i) {
        num += (fy[i] - uy[i]) * (fy[i] - uy[i]);
        den += uy[i] * uy[i];
      }
      row.check_rel = den > 0 ? std::sqrt(num / den) : (num == 0 ? 0.0 : INFINITY);
      if (!(row.check_rel <= 0.03)) {
        row.bad = true;
        row.note = fmt("WARNING: fused differs from unfused by %.3g (relative)", row.check_rel);
      }
    }

    std::vector<Call> calls;
    if (row.fused_ok) calls.push_back(fused_call);
    if (time_nopre) calls.push_back(nopre_call);
    calls.push_back(gemm_call);
    calls.push_back(unfused_call);
    calls.push_back(glu_call);
    std::vector<double> ms;
    time_paths(calls, copies, &ms, &row.reps);
    size_t i = 0;
    if (row.fused_ok) row.fused_ms = ms[i++];
    if (time_nopre) row.fused_nopre_ms = ms[i++];
    row.gemm_ms = ms[i++];
    row.unfused_ms = ms[i++];
    row.glu_ms = ms[i++];
  } catch (const ToolError& e) {
    // Out of memory mid-way, or a failing call: report the shape and go on.
    (void)cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
    row.skipped = true;
    row.note = e.what();
    return row;
  }
  const double f = flops(m, k, u);
  row.fused_tflops = f / (row.fused_ms * 1e-3) / 1e12;
  row.gemm_tflops = f / (row.gemm_ms * 1e-3) / 1e12;
  return row;
}

std::string cell(double v, const char* format) { return std::isfinite(v) ? fmt(format, v) : "-"; }

void print_table(const std::vector<Row>& rows) {
  std::printf("%-6s %6s %6s %6s | %9s %8s | %9s %9s | %8s %8s | %10s %10s | %8s | %-10s %s\n", "model", "M", "K",
              "U", "fused ms", "TFLOP/s", "gemm ms", "unfsd ms", "gemm/fsd", "unf/fsd", "act fused", "act unfsd",
              "glu TB/s", "path", "config / note");
  for (const Row& r : rows) {
    if (r.skipped) {
      std::printf("%-6s %6lld %6lld %6lld | skipped: %s\n", r.model.c_str(), (long long)r.m, (long long)r.k,
                  (long long)r.u, r.note.c_str());
      continue;
    }
    std::string tail = r.config;
    if (!r.note.empty()) tail += (tail.empty() ? "" : "  ") + std::string("[") + r.note + "]";
    // First, where a cut line still shows it.
    if (std::isfinite(r.fused_nopre_ms))
      tail = fmt("preact %+.1f%% (%.4f ms without)  ", 100.0 * (r.fused_ms / r.fused_nopre_ms - 1.0),
                 r.fused_nopre_ms) + tail;
    std::printf("%-6s %6lld %6lld %6lld | %9s %8s | %9s %9s | %8s %8s | %8.1fMB %8.1fMB | %8s | %-10s %s\n",
                r.model.c_str(), (long long)r.m, (long long)r.k, (long long)r.u, cell(r.fused_ms, "%.4f").c_str(),
                cell(r.fused_tflops, "%.1f").c_str(), cell(r.gemm_ms, "%.4f").c_str(),
                cell(r.unfused_ms, "%.4f").c_str(), cell(r.gemm_ms / r.fused_ms, "%.3f").c_str(),
                cell(r.unfused_ms / r.fused_ms, "%.3f").c_str(), r.act_fused_bytes / 1048576.0,
                r.act_unfused_bytes / 1048576.0, cell(r.glu_bytes / (r.glu_ms * 1e-3) / 1e12, "%.2f").c_str(),
                r.path.c_str(), tail.c_str());
  }
}

void write_json(const std::string& file, const DeviceInfo& d, const Problem& base, Schedule schedule,
                const std::string& force_path, const std::vector<Row>& rows) {
  std::ofstream out(file);
  if (!out) throw ToolError("cannot open --json file '" + file + "' for writing");
  out << "{\n";
  out << "  \"tool\": \"gatedmlp bench\",\n";
  out << "  \"device\": " << json_str(d.prop.name) << ",\n";
  out << "  \"compute_capability\": " << json_str(fmt("%d.%d", d.prop.major, d.prop.minor)) << ",\n";
  out << "  \"sm_count\": " << d.prop.multiProcessorCount << ",\n";
  out << "  \"l2_bytes\": " << d.prop.l2CacheSize << ",\n";
  out << "  \"driver_version\": " << json_str(cuda_version_string(d.driver_version)) << ",\n";
  out << "  \"runtime_version\": " << json_str(cuda_version_string(d.runtime_version)) << ",\n";
  out << "  \"cublaslt_version\": " << cublaslt_version() << ",\n";
  out << "  \"git_commit\": " << json_str(git_commit()) << ",\n";
  out << "  \"layout\": " << json_str(layout_name(base.weights)) << ",\n";
  out << "  \"activation\": " << json_str(to_string(base.activation)) << ",\n";
  out << "  \"input_dtype\": " << json_str(to_string(base.input_dtype)) << ",\n";
  out << "  \"output_dtype\": " << json_str(to_string(base.output_dtype)) << ",\n";
  out << "  \"preact\": " << (base.has_preact ? json_str(to_string(base.preact_dtype)) : "null") << ",\n";
  out << "  \"schedule\": " << json_str(schedule_name(schedule)) << ",\n";
  out << "  \"force_path\": " << json_str(force_path) << ",\n";
  out << "  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? ",\n" : "\n") << "    {";
    out << "\"model\": " << json_str(r.model) << ", \"m\": " << r.m << ", \"k\": " << r.k << ", \"u\": " << r.u;
    out << ", \"skipped\": " << (r.skipped ? "true" : "false") << ", \"bad\": " << (r.bad ? "true" : "false");
    out << ", \"fused_ms\": " << json_num(r.fused_ms) << ", \"fused_tflops\": " << json_num(r.fused_tflops);
    out << ", \"gemm_ms\": " << json_num(r.gemm_ms) << ", \"gemm_tflops\": " << json_num(r.gemm_tflops);
    out << ", \"unfused_ms\": " << json_num(r.unfused_ms);
    out << ", \"fused_nopre_ms\": " << json_num(r.fused_nopre_ms);
    out << ", \"glu_ms\": " << json_num(r.glu_ms) << ", \"glu_bytes\": " << json_num(r.glu_bytes);
    out << ", \"gemm_over_fused\": " << json_num(r.gemm_ms / r.fused_ms);
    out << ", \"unfused_over_fused\": " << json_num(r.unfused_ms / r.fused_ms);
    out << ", \"act_bytes_fused\": " << json_num(r.act_fused_bytes);
    out << ", \"act_bytes_unfused\": " << json_num(r.act_unfused_bytes);
    out << ", \"workspace_bytes_fused\": " << json_num(r.workspace_fused_bytes);
    out << ", \"check_rel_vs_unfused\": " << json_num(r.check_rel);
    out << ", \"path\": " << json_str(r.path) << ", \"config\": " << json_str(r.config);
    out << ", \"reps\": " << r.reps << ", \"copies\": " << r.copies;
    out << ", \"note\": " << json_str(r.note) << "}";
  }
  out << "\n  ]\n}\n";
  if (!out) throw ToolError("writing --json file '" + file + "' failed");
}

}  // namespace

int bench_main(int argc, char** argv) {
  std::vector<FlagSpec> specs = {
      {"model", "NAME",
       "Llama-3 gate/up shape: 8b (default; K=4096 U=14336), 70b (8192, 28672), 405b (16384, 53248), all"},
      {"m", "LIST", "comma-separated rows of X (default 1,16,64,256,1024,4096,16384,65536)"},
      {"k", "K", "custom shape: input features (with --u; replaces --model)"},
      {"u", "U", "custom shape: output features per half (with --k)"},
  };
  for (auto& s : kernel_flag_specs()) specs.push_back(s);
  // Of the option flags, the pre-activation output (the Hopper issue's bar
  // times it against Y alone: with --preact the fused call without it is a
  // fourth path of the same run, and the table's last column starts with
  // what the pre-activation cost).
  for (auto& s : extra_flag_specs())
    if (s.name == "preact" || s.name == "preact-dtype") specs.push_back(s);
  specs.push_back({"reps", "N",
                   "timed calls per path (default: adaptive, about 0.4 s per shape); with --schedule block, "
                   "split over the 3 rounds, rounded up"});
  specs.push_back({"schedule", "S",
                   "call (default): the paths interleaved call by call; block: each path timed in its own "
                   "block of consecutive calls after its own warm-up, the blocks rotated 3 times (A B C A B C ...)"});
  specs.push_back({"path", "P",
                   "fused kernel path, by setting GATEDMLP_FORCE_PATH: auto (unset it: the dispatcher's choice), "
                   "portable (the sm80 mma.sync kernel everywhere), hopper (the sm90 wgmma kernel where the problem "
                   "and device allow it); default: the environment as it is"});
  specs.push_back({"json", "FILE", "also write every row, the device, driver and git commit as JSON"});
  Flags f("bench",
          "Time the fused kernel, cuBLAS GEMM alone (into [M, 2U]) and the unfused GEMM + GLU in the same run.\n"
          "Times are medians of CUDA-event timings after warm-up, inputs rotated past twice the L2;\n"
          "--schedule says how the paths' calls are ordered, --path which fused kernel runs. The unfused\n"
          "path's GLU kernel is timed alone too; \"glu TB/s\" is its bytes (the intermediate read; Y and any\n"
          "pre-activation written) over its time.\n"
          "With --preact, the fused call without the pre-activation is timed too, as another path,\n"
          "and its cost printed first in the last column (\"preact +x.x%\").",
          specs);
  f.parse(argc, argv);
  if (f.help()) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }

  std::vector<std::pair<std::string, Model>> shapes;
  if (f.has("k") != f.has("u")) throw UsageError("--k and --u go together");
  if (f.has("k")) {
    if (f.has("model")) throw UsageError("--model and --k/--u are exclusive");
    const int64_t k = f.i64("k", 0), u = f.i64("u", 0);
    if (k < 1 || u < 1) throw UsageError("--k and --u must be >= 1");
    shapes.push_back({"custom", Model{"custom", k, u}});
  } else {
    const std::string name = f.str("model", "8b");
    bool found = false;
    for (const Model& mdl : kModels) {
      if (name == mdl.name || name == "all") {
        shapes.push_back({mdl.name, mdl});
        found = true;
      }
    }
    if (!found) throw UsageError("--model: expected 8b, 70b, 405b or all, got '" + name + "'");
  }
  const std::vector<int64_t> ms = f.i64_list("m", kDefaultM);
  for (int64_t m : ms) {
    if (m < 1) throw UsageError("--m: every M must be >= 1, got " + std::to_string(m));
  }
  const int64_t reps = f.i64("reps", 0);
  if (f.has("reps") && reps < 1) throw UsageError("--reps must be >= 1");
  const Problem base = problem_from_flags(f, 1, 1, 1);
  const std::string json = f.str("json", "");
  const std::string schedule_text = f.str("schedule", "call");
  if (schedule_text != "call" && schedule_text != "block")
    throw UsageError("--schedule: expected call or block, got '" + schedule_text + "'");
  const Schedule schedule = schedule_text == "call" ? Schedule::call : Schedule::block;
  if (f.has("path")) {
    // Set before the first library call, so every plan() and run() below sees it.
    const std::string path = f.str("path", "");
    if (path == "auto") {
      unsetenv(kForcePathEnv);
    } else if (path == "portable" || path == "hopper") {
      setenv(kForcePathEnv, path.c_str(), 1);
    } else {
      throw UsageError("--path: expected portable, hopper or auto, got '" + path + "'");
    }
  }
  const char* force_env = std::getenv(kForcePathEnv);
  const std::string force_path = force_env && *force_env ? force_env : "auto";

  const DeviceInfo dev = require_device();
  std::fprintf(stderr, "gatedmlp bench: %s (sm_%d%d, %d SMs, L2 %.0f MiB), driver %s, runtime %s, commit %s\n",
               dev.prop.name, dev.prop.major, dev.prop.minor, dev.prop.multiProcessorCount,
               dev.prop.l2CacheSize / 1048576.0, cuda_version_string(dev.driver_version).c_str(),
               cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str());
  std::fprintf(stderr, "layout %s, activation %s, %s -> %s, schedule %s, path %s\n", layout_name(base.weights).c_str(),
               to_string(base.activation), to_string(base.input_dtype), to_string(base.output_dtype),
               schedule_name(schedule), force_path.c_str());

  Bench bench(dev, base, reps, schedule);
  std::vector<Row> rows;
  const size_t total = shapes.size() * ms.size();
  for (const auto& [name, mdl] : shapes) {
    for (int64_t m : ms) {
      const auto t0 = std::chrono::steady_clock::now();
      Row r = bench.run_shape(name, m, mdl.k, mdl.u);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r.skipped) {
        std::fprintf(stderr, "[%zu/%zu] %s M=%lld K=%lld U=%lld: skipped: %s\n", rows.size() + 1, total, name.c_str(),
                     (long long)m, (long long)mdl.k, (long long)mdl.u, r.note.c_str());
      } else {
        std::fprintf(stderr,
                     "[%zu/%zu] %s M=%lld K=%lld U=%lld: fused %s ms, gemm %.4f ms, unfused %.4f ms, glu %.4f ms "
                     "(%lld reps, %lld copies, %.1f s)%s%s\n",
                     rows.size() + 1, total, name.c_str(), (long long)m, (long long)mdl.k, (long long)mdl.u,
                     cell(r.fused_ms, "%.4f").c_str(), r.gemm_ms, r.unfused_ms, r.glu_ms, (long long)r.reps,
                     (long long)r.copies, secs, r.note.empty() ? "" : ": ", r.note.c_str());
      }
      rows.push_back(std::move(r));
    }
  }

  std::printf("device: %s, driver %s, runtime %s, commit %s; layout %s, %s, %s%s; schedule %s, path %s\n",
              dev.prop.name, cuda_version_string(dev.driver_version).c_str(),
              cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str(),
              layout_name(base.weights).c_str(), to_string(base.activation), to_string(base.input_dtype),
              base.has_preact ? ", +preact" : "", schedule_name(schedule), force_path.c_str());
  print_table(rows);
  if (!json.empty()) {
    write_json(json, dev, base, schedule, force_path, rows);
    std::fprintf(stderr, "wrote %s\n", json.c_str());
  }
  bool any_bad = false;
  for (const Row& r : rows) any_bad = any_bad || r.bad;
  return any_bad ? 1 : 0;
}

}  // namespace gatedmlp::tool
