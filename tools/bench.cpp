// `gatedmlp bench`: times the fused kernel against cuBLAS GEMM alone and
// against the unfused GEMM + GLU path, all three in the same run. The unfused
// path's GLU kernel is also timed alone, and its bytes over its time printed
// ("glu TB/s"): the baseline is only fair if that half runs near the memory
// bandwidth.
//
//   gatedmlp bench                                  # Llama-3 8B, M = 1 ... 65536
//   gatedmlp bench --model all --json bench.json
//   gatedmlp bench --model small                    # small models, M = 1 ... 16, CUDA-graph timing
//   gatedmlp bench --m 1,4096 --k 8192 --u 28672 --layout g32 --first up
//   gatedmlp bench --path portable --schedule block  # the sm80 kernel on a Hopper GPU
//   gatedmlp bench --host                           # host cost of run() (host_bench.cpp)
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
//
// Graph timing (--graph; the default for the small models): a call of a few
// microseconds timed by eager launches measures how fast the host launches,
// not the GPU. So each path's R calls (call j on operand copy j mod copies, R
// a multiple of the copies) are captured in one CUDA graph, the graphs are
// replayed under the same schedules as single calls above, and a path's time
// is its median replay over R.
//
// The cuBLAS baseline (--cublas): by default Unfused::create autotunes the
// GEMM on this shape's rotated operands (the cuBLASLt heuristic's first 8
// algorithms and cublasGemmEx, the call torch.mm makes; the fastest is kept
// for the shape), so that every ratio stands on the strongest cuBLAS, not on
// the heuristic's first guess. The choice is printed per shape.
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
  bool small;  // the small set: its own default M, graph timing by default
};
// Llama-3 hidden size and intermediate size; then the small set: Qwen2.5-0.5B,
// a 1024 x 2816 layer (Qwen1.5-0.5B's shape), Llama-3.2-1B and -3B.
constexpr Model kModels[] = {{"8b", 4096, 14336, false},     {"70b", 8192, 28672, false},
                             {"405b", 16384, 53248, false},  {"qwen-0.5b", 896, 4864, true},
                             {"1024x2816", 1024, 2816, true}, {"llama-1b", 2048, 8192, true},
                             {"llama-3b", 3072, 8192, true}};
const std::vector<int64_t> kDefaultM = {1, 16, 64, 256, 1024, 4096, 16384, 65536};
const std::vector<int64_t> kSmallM = {1, 2, 4, 8, 16};

constexpr double kTargetSeconds = 0.4;  // timed reps of all the paths together, per shape
constexpr int64_t kMinReps = 3;         // the 405B shapes at large M take ~0.3 s a call
constexpr int64_t kMaxReps = 3000;
constexpr int64_t kMaxCopies = 64;
constexpr int64_t kBlockRounds = 3;          // --schedule block: rotations of the per-path blocks
constexpr int64_t kMaxBlockWarmup = 20;      // --schedule block: untimed calls before each block, at most
// Graph timing: calls per graph such that the fastest path's replay lasts
// about kGraphReplayMs, at least kMinGraphCalls, at most kMaxGraphCalls
// (before rounding up to a multiple of the copies). At least 2: the Hopper
// kernel's split tail draws its flags' token on the host in run()
// (sm90_gemm_glu/launch.cuh, next_token), so a graph replays the tokens it
// captured, and a call replayed onto flags still holding its own token from
// the last replay would not wait for its partials. With two or more captured
// calls of the same problem sharing the workspace, the next call rewrites
// those flags with another token first. run_shape checks the replayed fused
// graph's output against the unfused one.
constexpr double kGraphReplayMs = 1.0;
constexpr int64_t kMinGraphCalls = 2;
constexpr int64_t kMaxGraphCalls = 64;
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
  // How the paths were timed: "events" (one event between calls) or "graph"
  // (CUDA-graph replays of graph_calls calls each; times are per call).
  std::string timing = "events";
  int64_t graph_calls = 0;
  double weight_bytes = 0;   // W read by one call (both halves)
  double rotated_bytes = 0;  // copies x (X + W + Y [+ preact]): what one rotation walks through
  // The unfused baseline's GEMM algorithm (Unfused::gemm_choice).
  ref::Unfused::GemmChoice cublas;
};

class GraphExecs;

double flops(int64_t m, int64_t k, int64_t u) { return 2.0 * double(m) * double(k) * double(2 * u); }

class Bench {
 public:
  Bench(const DeviceInfo& dev, Problem base, int64_t fixed_reps, Schedule schedule, bool autotune)
      : dev_(dev), base_(base), fixed_reps_(fixed_reps), schedule_(schedule), autotune_(autotune) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Bench() { (void)cudaStreamDestroy(stream_); }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Row run_shape(const std::string& model, int64_t m, int64_t k, int64_t u, bool graph);

 private:
  using Call = std::function<Status(int64_t copy)>;
  void time_paths(const std::vector<Call>& calls, int64_t copies, std::vector<double>* ms, int64_t* reps);
  // Graph timing: captures each path's calls in a graph, times the replays
  // with time_paths, and returns per-call medians.
  // `after`, if set, runs once the timing is done, with the graphs still alive.
  void time_paths_graph(const std::vector<Call>& calls, const std::vector<std::string>& names, int64_t copies,
                        std::vector<double>* ms, int64_t* reps, int64_t* graph_calls, std::string* note,
                        const std::function<void(const GraphExecs&)>& after);

  DeviceInfo dev_;
  Problem base_;
  int64_t fixed_reps_;
  Schedule schedule_;
  bool autotune_;
  cudaStream_t stream_ = nullptr;
};

// Owns the executable graphs of time_paths_graph.
class GraphExecs {
 public:
  GraphExecs() = default;
  GraphExecs(const GraphExecs&) = delete;
  GraphExecs& operator=(const GraphExecs&) = delete;
  ~GraphExecs() {
    for (cudaGraphExec_t e : execs_) (void)cudaGraphExecDestroy(e);
  }
  void add(cudaGraphExec_t e) { execs_.push_back(e); }
  cudaGraphExec_t operator[](size_t i) const { return execs_[i]; }

 private:
  std::vector<cudaGraphExec_t> execs_;
};

// Captures `calls` calls of `call` on `stream` (call j on copy j % copies)
// and instantiates the graph. The capture is always ended, so a failing call
// leaves the stream usable; the failure is thrown as ToolError.
cudaGraphExec_t capture_calls(const std::function<Status(int64_t)>& call, int64_t calls, int64_t copies,
                              cudaStream_t stream, const std::string& what, cudaStreamCaptureMode mode) {
  cuda_check(cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture (" + what + ")");
  Status failed;
  for (int64_t j = 0; j < calls && failed.ok(); ++j) failed = call(j % copies);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!failed.ok()) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw ToolError("capturing " + what + " in a CUDA graph: the call failed (" + to_string(failed.code()) +
                    "): " + failed.message());
  }
  if (end != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    cuda_check(end, "cudaStreamEndCapture (" + what + ")");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  cuda_check(inst, "cudaGraphInstantiate (" + what + ")");
  return exec;
}

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

void Bench::time_paths_graph(const std::vector<Call>& calls, const std::vector<std::string>& names, int64_t copies,
                             std::vector<double>* ms, int64_t* reps, int64_t* graph_calls, std::string* note,
                             const std::function<void(const GraphExecs&)>& after) {
  const size_t n = calls.size();
  // Eager warm-up of every path (module loads, first-call set-up stay out of
  // the capture), then one call each timed: the estimate that sizes R.
  for (size_t i = 0; i < n; ++i) status_check(calls[i](static_cast<int64_t>(i) % copies), "warm-up call");
  cuda_check(cudaStreamSynchronize(stream_), "warm-up");
  double est_min = INFINITY;
  {
    EventList ev(2 * n);
    for (size_t i = 0; i < n; ++i) {
      cuda_check(cudaEventRecord(ev[2 * i], stream_), "cudaEventRecord");
      status_check(calls[i]((static_cast<int64_t>(i) + 1) % copies), "estimate call");
      cuda_check(cudaEventRecord(ev[2 * i + 1], stream_), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream_), "estimate");
    for (size_t i = 0; i < n; ++i) {
      float t = 0;
      cuda_check(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
      est_min = std::min(est_min, double(t));
    }
  }
  int64_t r = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kGraphReplayMs / std::max(est_min, 1e-4))),
                                  kMinGraphCalls, kMaxGraphCalls);
  r = (r + copies - 1) / copies * copies;  // every replay walks the whole rotation
  *graph_calls = r;

  // Global capture mode, as torch.cuda.graph captures by default: the
  // library and cuBLAS must work under it for users who capture them. If a
  // path does not, it is captured in relaxed mode and the row says so.
  GraphExecs graphs;
  for (size_t i = 0; i < n; ++i) {
    const std::string what = names[i] + fmt(" (%lld calls)", (long long)r);
    try {
      graphs.add(capture_calls(calls[i], r, copies, stream_, what, cudaStreamCaptureModeGlobal));
    } catch (const ToolError& e) {
      graphs.add(capture_calls(calls[i], r, copies, stream_, what, cudaStreamCaptureModeRelaxed));
      *note += (note->empty() ? "" : "; ") + std::string("captured in relaxed mode, global mode failed: ") + e.what();
    }
  }
  std::vector<Call> replays;
  for (size_t i = 0; i < n; ++i) {
    const cudaGraphExec_t e = graphs[i];
    replays.push_back([this, e](int64_t) -> Status {
      const cudaError_t err = cudaGraphLaunch(e, stream_);
      if (err == cudaSuccess) return Status::Ok();
      return {StatusCode::cuda_error, std::string("cudaGraphLaunch: ") + cudaGetErrorString(err)};
    });
  }
  time_paths(replays, 1, ms, reps);
  for (double& v : *ms) v /= static_cast<double>(r);
  if (after) after(graphs);
  // Every launch has been waited for (time_paths and `after` synchronise); the graphs can go.
}

Row Bench::run_shape(const std::string& model, int64_t m, int64_t k, int64_t u, bool graph) {
  Row row;
  row.timing = graph ? "graph" : "events";
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
  row.weight_bytes = double(w_bytes);

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
  row.rotated_bytes = double(copies) * double(per_copy);
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
    // The baseline's GEMM: autotuned on the rotated copies the timed calls use.
    std::unique_ptr<ref::Unfused> unfused;
    ref::Unfused::Options uopt;
    uopt.autotune = autotune_;
    if (autotune_) uopt.tune_args = args;
    if (const Status s = ref::Unfused::create(p, uopt, &unfused); !s.ok()) {
      if (!autotune_) status_check(s, "Unfused::create");
      // A failed autotune should not lose the shape: the heuristic's choice
      // is timed instead, and the line says so.
      (void)cudaDeviceSynchronize();
      (void)cudaGetLastError();
      status_check(ref::Unfused::create(p, &unfused), "Unfused::create (heuristic, after the autotune failed)");
      row.cublas = unfused->gemm_choice();
      row.cublas.summary = "AUTOTUNE FAILED (" + s.message() + "); timed: " + row.cublas.summary;
    } else {
      row.cublas = unfused->gemm_choice();
    }

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
    std::vector<double> uy;  // the unfused rows of copy 0: the graph check below compares with them too
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
      uy = copy_rows(args[0].y, p.output_dtype, u, u, rows, stream_);
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
    std::vector<std::string> names;
    auto add_path = [&](const char* name, Call call) {
      names.push_back(name);
      calls.push_back(std::move(call));
    };
    if (row.fused_ok) add_path("fused run()", fused_call);
    if (time_nopre) add_path("fused run() without preact", nopre_call);
    add_path("cuBLAS GEMM", gemm_call);
    add_path("cuBLAS GEMM + GLU", unfused_call);
    add_path("GLU kernel", glu_call);
    std::vector<double> ms;
    if (graph) {
      std::string note;
      // The replayed fused graph must still compute Y: a replay reuses what
      // run() decided when it was captured (pointers, and the Hopper split
      // tail's flag tokens), so copy 0's Y is poisoned, the graph replayed
      // once more, and its rows compared with the unfused ones as above.
      auto check_replay = [&](const GraphExecs& g) {
        if (!row.fused_ok || uy.empty()) return;
        status_check(ref::fill_nan(args[0].y, p.output_dtype, m * u, stream_), "fill_nan(Y)");
        cuda_check(cudaGraphLaunch(g[0], stream_), "cudaGraphLaunch (replay check)");
        const std::vector<double> gy = copy_rows(args[0].y, p.output_dtype, u, u, rows, stream_);
        double num = 0, den = 0;
        for (size_t i = 0; i < gy.size(); ++i) {
          num += (gy[i] - uy[i]) * (gy[i] - uy[i]);
          den += uy[i] * uy[i];
        }
        const double rel = den > 0 ? std::sqrt(num / den) : (num == 0 ? 0.0 : INFINITY);
        if (!(rel <= 0.03)) {
          row.bad = true;
          note += fmt("WARNING: the replayed fused graph differs from unfused by %.3g (relative)", rel);
        }
      };
      time_paths_graph(calls, names, copies, &ms, &row.reps, &row.graph_calls, &note, check_replay);
      if (!note.empty()) row.note += (row.note.empty() ? "" : "; ") + note;
    } else {
      time_paths(calls, copies, &ms, &row.reps);
    }
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
    if (r.timing != "events") continue;
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

// The graph-timed rows, in microseconds per call. "W TB/s" is the fused
// call's weight bytes over its time: at these M the call streams W once, so
// this is how close it runs to the DRAM bandwidth.
void print_graph_table(const std::vector<Row>& rows, double l2_bytes) {
  std::printf(
      "CUDA-graph timing: each path's R calls (R = \"calls\") captured in one graph, call j on copy j mod C of X, W "
      "and Y;\nthe C copies (\"copies\", \"rotated\" = C x (X + W + Y)) rotate past twice the L2 (2 x %.0f MiB), so "
      "every call reads its weights from DRAM.\nTimes are medians of the replays over R, in microseconds per call.\n",
      l2_bytes / 1048576.0);
  std::printf("%-9s %6s %6s %6s | %9s %9s %9s %9s | %8s %8s | %7s | %6s %8s %5s | %-10s %s\n", "model", "M", "K",
              "U", "fused us", "gemm us", "unfsd us", "glu us", "gemm/fsd", "unf/fsd", "W TB/s", "copies", "rotated",
              "calls", "path", "config / note");
  for (const Row& r : rows) {
    if (r.timing != "graph") continue;
    if (r.skipped) {
      std::printf("%-9s %6lld %6lld %6lld | skipped: %s\n", r.model.c_str(), (long long)r.m, (long long)r.k,
                  (long long)r.u, r.note.c_str());
      continue;
    }
    std::string tail = r.config;
    if (!r.note.empty()) tail += (tail.empty() ? "" : "  ") + std::string("[") + r.note + "]";
    if (std::isfinite(r.fused_nopre_ms))
      tail = fmt("preact %+.1f%% (%.2f us without)  ", 100.0 * (r.fused_ms / r.fused_nopre_ms - 1.0),
                 r.fused_nopre_ms * 1e3) + tail;
    std::printf("%-9s %6lld %6lld %6lld | %9s %9s %9s %9s | %8s %8s | %7s | %6lld %6.0fMB %5lld | %-10s %s\n",
                r.model.c_str(), (long long)r.m, (long long)r.k, (long long)r.u,
                cell(r.fused_ms * 1e3, "%.2f").c_str(), cell(r.gemm_ms * 1e3, "%.2f").c_str(),
                cell(r.unfused_ms * 1e3, "%.2f").c_str(), cell(r.glu_ms * 1e3, "%.2f").c_str(),
                cell(r.gemm_ms / r.fused_ms, "%.3f").c_str(), cell(r.unfused_ms / r.fused_ms, "%.3f").c_str(),
                cell(r.weight_bytes / (r.fused_ms * 1e-3) / 1e12, "%.2f").c_str(), (long long)r.copies,
                r.rotated_bytes / 1e6, (long long)r.graph_calls, r.path.c_str(), tail.c_str());
  }
}

// One line per shape: the cuBLAS algorithm the baseline ran ("gemm" and
// "unfsd" columns) and, when autotuned, the runner-ups' times from the
// autotune (its own timing: graph replays on the same rotated operands).
void print_cublas_choices(const std::vector<Row>& rows, bool autotune) {
  std::printf("cuBLAS GEMM per shape (%s):\n",
              autotune ? "autotuned when the shape's Unfused was created: the fastest of the cuBLASLt heuristic's "
                         "first 8 algorithms and cublasGemmEx, timed in CUDA-graph replays on the rotated operands "
                         "(back to back, so a little slower than in the table); a later candidate displaces an "
                         "earlier one only if > 0.5 % faster; tile and cluster are cublasLt.h enum values"
                       : "--cublas heuristic: the cuBLASLt heuristic's first choice, not timed");
  for (const Row& r : rows) {
    if (r.skipped && r.cublas.summary.empty()) continue;
    std::printf("  %-9s M=%-6lld K=%-6lld U=%-6lld %s\n", r.model.c_str(), (long long)r.m, (long long)r.k,
                (long long)r.u, r.cublas.summary.empty() ? "-" : r.cublas.summary.c_str());
  }
}

void write_json(const std::string& file, const DeviceInfo& d, const Problem& base, Schedule schedule,
                const std::string& force_path, bool autotune, const std::vector<Row>& rows) {
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
  out << "  \"cublas_mode\": " << json_str(autotune ? "autotune" : "heuristic") << ",\n";
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
    out << ", \"timing\": " << json_str(r.timing) << ", \"graph_calls\": " << r.graph_calls;
    out << ", \"weight_bytes\": " << json_num(r.weight_bytes) << ", \"rotated_bytes\": " << json_num(r.rotated_bytes);
    out << ", \"fused_weight_tbps\": " << json_num(r.weight_bytes / (r.fused_ms * 1e-3) / 1e12);
    out << ", \"cublas_choice\": " << json_str(r.cublas.summary);
    out << ", \"cublas_autotuned\": " << (r.cublas.autotuned ? "true" : "false");
    out << ", \"cublas_method\": " << json_str(r.cublas.method);
    out << ", \"cublas_alignment\": " << r.cublas.alignment;
    out << ", \"cublas_candidates\": [";
    for (size_t c = 0; c < r.cublas.candidates.size(); ++c) {
      const auto& cd = r.cublas.candidates[c];
      out << (c ? ", " : "") << "{\"name\": " << json_str(cd.name) << ", \"heuristic_rank\": " << cd.heuristic_rank
          << ", \"workspace_bytes\": " << cd.workspace << ", \"ms\": " << json_num(cd.ms >= 0 ? cd.ms : NAN)
          << ", \"winner\": " << (static_cast<int>(c) == r.cublas.winner ? "true" : "false")
          << ", \"note\": " << json_str(cd.note) << "}";
    }
    out << "]";
    out << ", \"note\": " << json_str(r.note) << "}";
  }
  out << "\n  ]\n}\n";
  if (!out) throw ToolError("writing --json file '" + file + "' failed");
}

}  // namespace

int bench_main(int argc, char** argv) {
  std::vector<FlagSpec> specs = {
      {"model", "NAME",
       "Llama-3 gate/up shape: 8b (default; K=4096 U=14336), 70b (8192, 28672), 405b (16384, 53248); "
       "small: qwen-0.5b (896, 4864), 1024x2816, llama-1b (Llama-3.2-1B: 2048, 8192), llama-3b (3072, 8192), "
       "each by name or all four as 'small' (default M 1,2,4,8,16, graph timing); all: every one"},
      {"m", "LIST",
       "comma-separated rows of X, for every model (default 1,16,64,256,1024,4096,16384,65536; small models "
       "1,2,4,8,16)"},
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
                   "split over the 3 rounds, rounded up; with graph timing, replays of the path's graph"});
  specs.push_back({"schedule", "S",
                   "call (default): the paths interleaved call by call; block: each path timed in its own "
                   "block of consecutive calls after its own warm-up, the blocks rotated 3 times (A B C A B C ...)"});
  specs.push_back({"graph", "",
                   "time every model in CUDA-graph replay: each path's R calls (rotating the copies) captured in "
                   "one graph, the graphs replayed under --schedule, times per call in microseconds (default for "
                   "the small models only)"});
  specs.push_back({"no-graph", "", "time the small models by eager launches with events too"});
  specs.push_back({"cublas", "MODE",
                   "the baseline's GEMM algorithm: autotune (default: the fastest of the cuBLASLt heuristic's "
                   "first 8 and cublasGemmEx, timed per shape on the rotated operands when the shape starts) or "
                   "heuristic (the heuristic's first choice, untimed, as before)"});
  specs.push_back({"path", "P",
                   "fused kernel path, by setting GATEDMLP_FORCE_PATH: auto (unset it: the dispatcher's choice), "
                   "portable (the sm80 mma.sync kernel everywhere), hopper (the sm90 wgmma kernel where the problem "
                   "and device allow it); default: the environment as it is"});
  specs.push_back({"json", "FILE", "also write every row, the device, driver and git commit as JSON"});
  for (auto& s : host_bench_flag_specs()) specs.push_back(s);
  Flags f("bench",
          "Time the fused kernel, cuBLAS GEMM alone (into [M, 2U]) and the unfused GEMM + GLU in the same run.\n"
          "Times are medians of CUDA-event timings after warm-up, inputs rotated past twice the L2;\n"
          "--schedule says how the paths' calls are ordered, --path which fused kernel runs. The unfused\n"
          "path's GLU kernel is timed alone too; \"glu TB/s\" is its bytes (the intermediate read; Y and any\n"
          "pre-activation written) over its time.\n"
          "The cuBLAS GEMM is autotuned per shape (--cublas); the algorithm each shape ran is printed\n"
          "after the tables. The small models (and all with --graph) are timed in CUDA-graph replay and\n"
          "reported in microseconds per call, with the fused call's weight-read rate (\"W TB/s\").\n"
          "With --preact, the fused call without the pre-activation is timed too, as another path,\n"
          "and its cost printed first in the last column (\"preact +x.x%\").\n"
          "--host: a separate mode, the host time per call of run() and of its parts against an empty\n"
          "kernel launch (see host_bench.cpp); only --host-batches, --host-calls and --json go with it.",
          specs);
  f.parse(argc, argv);
  if (f.help()) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  if (f.has("host")) {
    for (const FlagSpec& s : specs) {
      if (f.has(s.name) && s.name != "host" && s.name != "json" && s.name.rfind("host-", 0) != 0)
        throw UsageError("--" + s.name + " does not apply to --host (only --host-batches, --host-calls, --json)");
    }
    return host_bench(f);
  }
  for (const FlagSpec& s : host_bench_flag_specs()) {
    if (s.name != "host" && f.has(s.name)) throw UsageError("--" + s.name + " goes with --host");
  }

  std::vector<std::pair<std::string, Model>> shapes;
  if (f.has("k") != f.has("u")) throw UsageError("--k and --u go together");
  if (f.has("k")) {
    if (f.has("model")) throw UsageError("--model and --k/--u are exclusive");
    const int64_t k = f.i64("k", 0), u = f.i64("u", 0);
    if (k < 1 || u < 1) throw UsageError("--k and --u must be >= 1");
    shapes.push_back({"custom", Model{"custom", k, u, false}});
  } else {
    const std::string name = f.str("model", "8b");
    bool found = false;
    for (const Model& mdl : kModels) {
      if (name == mdl.name || name == "all" || (name == "small" && mdl.small)) {
        shapes.push_back({mdl.name, mdl});
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (const Model& mdl : kModels) names += std::string(mdl.name) + ", ";
      throw UsageError("--model: expected " + names + "small or all, got '" + name + "'");
    }
  }
  const bool m_given = f.has("m");
  const std::vector<int64_t> m_flag = f.i64_list("m", kDefaultM);
  for (int64_t m : m_flag) {
    if (m < 1) throw UsageError("--m: every M must be >= 1, got " + std::to_string(m));
  }
  if (f.has("graph") && f.has("no-graph")) throw UsageError("--graph and --no-graph are exclusive");
  const std::string cublas_mode = f.str("cublas", "autotune");
  if (cublas_mode != "autotune" && cublas_mode != "heuristic")
    throw UsageError("--cublas: expected autotune or heuristic, got '" + cublas_mode + "'");
  const bool autotune = cublas_mode == "autotune";
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

  // Each model's M list and timing.
  struct Job {
    std::string name;
    Model mdl;
    int64_t m;
    bool graph;
  };
  std::vector<Job> jobs;
  for (const auto& [name, mdl] : shapes) {
    const bool graph = f.has("graph") || (mdl.small && !f.has("no-graph"));
    for (int64_t m : m_given ? m_flag : (mdl.small ? kSmallM : kDefaultM)) jobs.push_back({name, mdl, m, graph});
  }

  const DeviceInfo dev = require_device();
  std::fprintf(stderr, "gatedmlp bench: %s (sm_%d%d, %d SMs, L2 %.0f MiB), driver %s, runtime %s, commit %s\n",
               dev.prop.name, dev.prop.major, dev.prop.minor, dev.prop.multiProcessorCount,
               dev.prop.l2CacheSize / 1048576.0, cuda_version_string(dev.driver_version).c_str(),
               cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str());
  std::fprintf(stderr, "layout %s, activation %s, %s -> %s, schedule %s, path %s, cuBLAS %s\n",
               layout_name(base.weights).c_str(), to_string(base.activation), to_string(base.input_dtype),
               to_string(base.output_dtype), schedule_name(schedule), force_path.c_str(), cublas_mode.c_str());

  Bench bench(dev, base, reps, schedule, autotune);
  std::vector<Row> rows;
  const size_t total = jobs.size();
  for (const Job& job : jobs) {
    const int64_t m = job.m;
    const Model& mdl = job.mdl;
    const auto t0 = std::chrono::steady_clock::now();
    Row r = bench.run_shape(job.name, m, mdl.k, mdl.u, job.graph);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.skipped) {
      std::fprintf(stderr, "[%zu/%zu] %s M=%lld K=%lld U=%lld: skipped: %s\n", rows.size() + 1, total,
                   job.name.c_str(), (long long)m, (long long)mdl.k, (long long)mdl.u, r.note.c_str());
    } else if (job.graph) {
      std::fprintf(stderr,
                   "[%zu/%zu] %s M=%lld K=%lld U=%lld: graph, per call: fused %s us, gemm %.2f us, unfused %.2f us, "
                   "glu %.2f us (%lld replays of %lld calls, %lld copies, %.1f s)%s%s\n",
                   rows.size() + 1, total, job.name.c_str(), (long long)m, (long long)mdl.k, (long long)mdl.u,
                   cell(r.fused_ms * 1e3, "%.2f").c_str(), r.gemm_ms * 1e3, r.unfused_ms * 1e3, r.glu_ms * 1e3,
                   (long long)r.reps, (long long)r.graph_calls, (long long)r.copies, secs,
                   r.note.empty() ? "" : ": ", r.note.c_str());
    } else {
      std::fprintf(stderr,
                   "[%zu/%zu] %s M=%lld K=%lld U=%lld: fused %s ms, gemm %.4f ms, unfused %.4f ms, glu %.4f ms "
                   "(%lld reps, %lld copies, %.1f s)%s%s\n",
                   rows.size() + 1, total, job.name.c_str(), (long long)m, (long long)mdl.k, (long long)mdl.u,
                   cell(r.fused_ms, "%.4f").c_str(), r.gemm_ms, r.unfused_ms, r.glu_ms, (long long)r.reps,
                   (long long)r.copies, secs, r.note.empty() ? "" : ": ", r.note.c_str());
    }
    if (!r.cublas.summary.empty()) {
      std::fprintf(stderr, "    cuBLAS: %s%s%s\n", r.cublas.summary.c_str(), r.cublas.autotuned ? "; autotune: " : "",
                   r.cublas.autotuned ? r.cublas.method.c_str() : "");
    }
    rows.push_back(std::move(r));
  }

  bool any_events = false, any_graph = false;
  for (const Job& job : jobs) (job.graph ? any_graph : any_events) = true;
  std::printf("device: %s, driver %s, runtime %s, commit %s; layout %s, %s, %s%s; schedule %s, path %s, cuBLAS %s\n",
              dev.prop.name, cuda_version_string(dev.driver_version).c_str(),
              cuda_version_string(dev.runtime_version).c_str(), git_commit().c_str(),
              layout_name(base.weights).c_str(), to_string(base.activation), to_string(base.input_dtype),
              base.has_preact ? ", +preact" : "", schedule_name(schedule), force_path.c_str(), cublas_mode.c_str());
  if (any_events) print_table(rows);
  if (any_events && any_graph) std::printf("\n");
  if (any_graph) print_graph_table(rows, double(std::max(dev.prop.l2CacheSize, 0)));
  std::printf("\n");
  print_cublas_choices(rows, autotune);
  if (!json.empty()) {
    write_json(json, dev, base, schedule, force_path, autotune, rows);
    std::fprintf(stderr, "wrote %s\n", json.c_str());
  }
  bool any_bad = false;
  for (const Row& r : rows) any_bad = any_bad || r.bad;
  return any_bad ? 1 : 0;
}

}  // namespace gatedmlp::tool
