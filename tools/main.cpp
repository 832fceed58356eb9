// `gatedmlp`: the command-line tool. Dispatches to the subcommands and holds
// what they share (flag parsing, problem flags, device helpers).
//
//   gatedmlp bench    [flags]   fused vs cuBLAS GEMM vs unfused GEMM+GLU timings
//   gatedmlp bench --host       host time per call of run() against an empty launch
//   gatedmlp accuracy [flags]   error against an fp64 reference, fused and unfused
//   gatedmlp info     [flags]   the device, and the kernel path a problem takes
//   gatedmlp <command> --help
//
// Exit codes: 0 success, 1 a runtime failure, 2 a bad command line or no device.
#include <cublasLt.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <system_error>

#include "common.hpp"
#include "reference/reference.hpp"

#ifndef GATEDMLP_GIT_COMMIT
#define GATEDMLP_GIT_COMMIT "unknown"
#endif

namespace gatedmlp::tool {

// ---------------------------------------------------------------- Flags
Flags::Flags(std::string command, std::string summary, std::vector<FlagSpec> specs)
    : command_(std::move(command)), summary_(std::move(summary)), specs_(std::move(specs)) {}

const FlagSpec* Flags::find(const std::string& name) const {
  for (const FlagSpec& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

void Flags::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError("unexpected argument '" + arg + "' (flags start with --)");
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const FlagSpec* spec = find(name);
    if (spec == nullptr) throw UsageError("unknown flag --" + name);
    if (spec->metavar.empty()) {
      if (has_value) throw UsageError("--" + name + " is a switch and takes no value");
    } else if (!has_value) {
      if (i + 1 >= argc) throw UsageError("--" + name + " needs a value (" + spec->metavar + ")");
      value = argv[++i];
    }
    for (auto& [n, v] : values_) {
      if (n == name) throw UsageError("--" + name + " given twice");
    }
    values_.emplace_back(name, value);
  }
}

std::string Flags::usage() const {
  constexpr size_t kIndent = 26, kWidth = 100;
  std::string out = "usage: gatedmlp " + command_ + " [flags]\n\n" + summary_ + "\n\nflags:\n";
  for (const FlagSpec& s : specs_) {
    std::string line = "  --" + s.name + (s.metavar.empty() ? "" : " " + s.metavar);
    if (line.size() + 1 >= kIndent) {
      out += line + "\n";
      line.clear();
    }
    line.resize(kIndent, ' ');
    // Word-wrap the help text under its column.
    size_t pos = 0;
    bool first_word = true;
    while (pos < s.help.size()) {
      size_t end = s.help.find(' ', pos);
      if (end == std::string::npos) end = s.help.size();
      const std::string word = s.help.substr(pos, end - pos);
      if (!first_word && line.size() + 1 + word.size() > kWidth) {
        out += line + "\n";
        line.assign(kIndent, ' ');
        first_word = true;
      }
      line += (first_word ? "" : " ") + word;
      first_word = false;
      pos = end + 1;
    }
    out += line + "\n";
  }
  out += "  --help                  this text\n";
  return out;
}

bool Flags::has(const std::string& name) const {
  for (const auto& [n, v] : values_) {
    if (n == name) return true;
  }
  return false;
}

std::string Flags::str(const std::string& name, const std::string& def) const {
  for (const auto& [n, v] : values_) {
    if (n == name) return v;
  }
  return def;
}

int64_t parse_i64(const std::string& flag, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError("--" + flag + ": expected an integer, got '" + text + "'");
  }
  return v;
}

double parse_f64(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v)) {
    throw UsageError("--" + flag + ": expected a number, got '" + text + "'");
  }
  return v;
}

int64_t Flags::i64(const std::string& name, int64_t def) const {
  return has(name) ? parse_i64(name, str(name, "")) : def;
}

double Flags::f64(const std::string& name, double def) const {
  return has(name) ? parse_f64(name, str(name, "")) : def;
}

std::vector<int64_t> Flags::i64_list(const std::string& name, std::vector<int64_t> def) const {
  if (!has(name)) return def;
  const std::string text = str(name, "");
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const size_t stop = comma == std::string::npos ? text.size() : comma;
    out.push_back(parse_i64(name, text.substr(start, stop - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------- problem flags
std::vector<FlagSpec> kernel_flag_specs() {
  return {
      {"layout", "L",
       "weight layout: stacked (default), separate, or gN = fused, interleaved in blocks of N rows (g1, g8, g32...)"},
      {"first", "HALF", "fused layouts: which half block 0 holds, gate (default) or up"},
      {"storage", "S", "weight storage: out_in ([2U, K], default) or in_out ([K, 2U])"},
      {"act", "A", "activation: silu (default), gelu_tanh, gelu_erf, relu, swiglu_clamped"},
      {"dtype", "T", "input dtype: bf16 (default) or fp16"},
      {"out-dtype", "T", "output dtype: bf16, fp16, fp32 (default: the input dtype)"},
  };
}

std::vector<FlagSpec> extra_flag_specs() {
  return {
      {"batch", "L", "batch count (default 1)"},
      {"alpha", "A", "scale of both GEMM results (default 1)"},
      {"bias", "", "add gate and up biases"},
      {"bias-dtype", "T", "bias dtype: fp32 (default), bf16, fp16"},
      {"preact", "", "also write the [M, 2U] pre-activation"},
      {"preact-dtype", "T", "pre-activation dtype (default bf16)"},
      {"clamp-alpha", "A", "swiglu_clamped: sigmoid slope (default 1.702)"},
      {"clamp-limit", "X", "swiglu_clamped: clamp limit (default 7)"},
  };
}

WeightLayout parse_layout(const std::string& text) {
  WeightLayout w;
  if (text == "stacked") {
    w.format = WeightFormat::fused;
    w.group = 0;
  } else if (text == "separate") {
    w.format = WeightFormat::separate;
  } else if (text.size() > 1 && text[0] == 'g') {
    w.format = WeightFormat::fused;
    w.group = parse_i64("layout", text.substr(1));
    if (w.group < 1) throw UsageError("--layout: the group in '" + text + "' must be >= 1");
  } else {
    throw UsageError("--layout: expected stacked, separate or gN (g1, g8, g32...), got '" + text + "'");
  }
  return w;
}

std::string layout_name(const WeightLayout& w) {
  std::string s;
  if (w.format == WeightFormat::separate) {
    s = "separate";
  } else {
    // Appended, not "g" + to_string(...): GCC 12 warns falsely (-Wrestrict) on that form.
    s = w.group == 0 ? "stacked" : "g";
    if (w.group != 0) s += std::to_string(w.group);
    if (w.first == Half::up) s += "/up-first";
  }
  if (w.storage == WeightStorage::in_out) s += "/in_out";
  return s;
}

Activation parse_activation(const std::string& text) {
  for (Activation a :
       {Activation::silu, Activation::gelu_tanh, Activation::gelu_erf, Activation::relu, Activation::swiglu_clamped}) {
    if (text == to_string(a)) return a;
  }
  throw UsageError("--act: expected silu, gelu_tanh, gelu_erf, relu or swiglu_clamped, got '" + text + "'");
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "bf16") return DType::bf16;
  if (text == "fp16") return DType::fp16;
  if (text == "fp32") return DType::fp32;
  throw UsageError("--" + flag + ": expected bf16, fp16 or fp32, got '" + text + "'");
}

Problem problem_from_flags(const Flags& f, int64_t m, int64_t k, int64_t u) {
  Problem p;
  p.m = m;
  p.k = k;
  p.u = u;
  if (f.has("layout")) p.weights = parse_layout(f.str("layout", ""));
  if (f.has("first")) {
    const std::string h = f.str("first", "");
    if (h != "gate" && h != "up") throw UsageError("--first: expected gate or up, got '" + h + "'");
    if (p.weights.format == WeightFormat::separate) throw UsageError("--first applies to fused layouts only");
    p.weights.first = h == "gate" ? Half::gate : Half::up;
  }
  if (f.has("storage")) {
    const std::string s = f.str("storage", "");
    if (s != "out_in" && s != "in_out") throw UsageError("--storage: expected out_in or in_out, got '" + s + "'");
    p.weights.storage = s == "out_in" ? WeightStorage::out_in : WeightStorage::in_out;
  }
  if (f.has("act")) p.activation = parse_activation(f.str("act", ""));
  if (f.has("dtype")) {
    p.input_dtype = parse_dtype("dtype", f.str("dtype", ""));
    if (p.input_dtype == DType::fp32) throw UsageError("--dtype: inputs are bf16 or fp16");
  }
  p.output_dtype = f.has("out-dtype") ? parse_dtype("out-dtype", f.str("out-dtype", "")) : p.input_dtype;
  p.batch = f.i64("batch", 1);
  p.alpha = static_cast<float>(f.f64("alpha", 1.0));
  p.has_bias = f.has("bias");
  if (f.has("bias-dtype")) p.bias_dtype = parse_dtype("bias-dtype", f.str("bias-dtype", ""));
  p.has_preact = f.has("preact");
  if (f.has("preact-dtype")) p.preact_dtype = parse_dtype("preact-dtype", f.str("preact-dtype", ""));
  p.act_params.clamp_alpha = static_cast<float>(f.f64("clamp-alpha", p.act_params.clamp_alpha));
  p.act_params.clamp_limit = static_cast<float>(f.f64("clamp-limit", p.act_params.clamp_limit));
  return p;
}

// ---------------------------------------------------------------- device
DeviceInfo require_device() {
  DeviceInfo info;
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    throw NoDevice(std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err));
  }
  if (count == 0) throw NoDevice("the CUDA runtime found no devices");
  if (const cudaError_t err = cudaGetDevice(&info.device); err != cudaSuccess) {
    throw NoDevice(std::string("cudaGetDevice: ") + cudaGetErrorString(err));
  }
  if (const cudaError_t err = cudaGetDeviceProperties(&info.prop, info.device); err != cudaSuccess) {
    throw NoDevice(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err));
  }
  cuda_check(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  cuda_check(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  return info;
}

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

size_t cublaslt_version() { return cublasLtGetVersion(); }

void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw ToolError(what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

void status_check(const Status& s, const std::string& what) {
  if (!s.ok()) throw ToolError(what + " failed (" + to_string(s.code()) + "): " + s.message());
}

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&p_, bytes);
  if (err != cudaSuccess) {
    p_ = nullptr;
    (void)cudaGetLastError();  // an allocation failure is not sticky; keep it out of later checks
    throw ToolError("cudaMalloc of " + what + " (" + fmt("%.2f", gib(static_cast<double>(bytes))) +
                    " GiB) failed: " + cudaGetErrorString(err));
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) (void)cudaFree(p_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) (void)cudaFree(p_);
}

EventList::EventList(size_t n) : events_(n, nullptr) {
  for (size_t i = 0; i < n; ++i) {
    if (const cudaError_t err = cudaEventCreate(&events_[i]); err != cudaSuccess) {
      for (size_t j = 0; j < i; ++j) (void)cudaEventDestroy(events_[j]);
      events_.clear();
      cuda_check(err, "cudaEventCreate");
    }
  }
}

EventList::~EventList() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

std::vector<double> copy_rows(const void* y, DType t, int64_t ld, int64_t u, const std::vector<int64_t>& rows,
                              cudaStream_t stream) {
  const size_t esz = dtype_size(t);
  const size_t row_bytes = static_cast<size_t>(u) * esz;
  std::vector<unsigned char> raw(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    cuda_check(cudaMemcpyAsync(raw.data() + i * row_bytes,
                               static_cast<const char*>(y) + static_cast<size_t>(rows[i] * ld) * esz, row_bytes,
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(output rows to host)");
  }
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(output rows to host)");
  std::vector<double> out(rows.size() * static_cast<size_t>(u));
  for (size_t i = 0; i < out.size(); ++i) out[i] = ref::load_as_double(raw.data(), t, static_cast<int64_t>(i));
  return out;
}

// ---------------------------------------------------------------- misc
std::string git_commit() {
  if (const char* env = std::getenv("GATEDMLP_GIT_COMMIT"); env != nullptr && *env != '\0') return env;
  return GATEDMLP_GIT_COMMIT;
}

MeanStd mean_std(const std::vector<double>& v) {
  MeanStd r;
  if (v.empty()) return {NAN, NAN};
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - r.mean) * (x - r.mean);
    r.std = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_num(double v) { return std::isfinite(v) ? fmt("%.9g", v) : "null"; }

std::string fmt(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, ap2);
  va_end(ap2);
  return out;
}

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

bool fits_in_memory(size_t need, std::string* note) {
  size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (need <= free_b) return true;
  *note = fmt("needs %.1f GiB of GPU memory, %.1f GiB free", gib(double(need)), gib(double(free_b)));
  return false;
}

}  // namespace gatedmlp::tool

namespace {

const char* kUsage =
    "usage: gatedmlp <command> [flags]\n"
    "\n"
    "Fused gated-MLP (GEMM + GLU) kernels: benchmark, accuracy and device info.\n"
    "\n"
    "commands:\n"
    "  bench      time the fused kernel against cuBLAS GEMM alone and the unfused GEMM + GLU\n"
    "             (bench --host: the host time per call of run() against an empty kernel launch)\n"
    "  accuracy   error of fused and unfused against a float64 reference (the blog's table)\n"
    "  info       the device, and which kernel path and config a problem gets\n"
    "\n"
    "Run 'gatedmlp <command> --help' for a command's flags.\n"
    "Exit codes: 0 ok, 1 runtime failure, 2 bad command line or no CUDA device.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace gatedmlp::tool;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  static char help_flag[] = "--help";
  static char* help_argv[] = {help_flag};
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    if (argc < 3) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    cmd = argv[2];  // "gatedmlp help bench" is "gatedmlp bench --help"
    sub_argc = 1;
    sub_argv = help_argv;
  }
  if (cmd == "--version") {
    std::printf("gatedmlp (commit %s)\n", git_commit().c_str());
    return 0;
  }
  int (*sub)(int, char**) = nullptr;
  if (cmd == "bench")
    sub = bench_main;
  else if (cmd == "accuracy")
    sub = accuracy_main;
  else if (cmd == "info")
    sub = info_main;
  if (sub == nullptr) {
    std::fprintf(stderr, "gatedmlp: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  }
  try {
    return sub(sub_argc, sub_argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gatedmlp %s: error: %s\n(see 'gatedmlp %s --help')\n", cmd.c_str(), e.what(), cmd.c_str());
    return 2;
  } catch (const NoDevice& e) {
    std::fprintf(stderr, "no CUDA device: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gatedmlp %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
