// Shared pieces of the `gatedmlp` command-line tool (bench, accuracy, info):
// flag parsing, the problem-from-flags helper, device checks, RAII device
// buffers, statistics and a little JSON.
//
// Build: cmake --build build --target gatedmlp_tool   (the binary is build/tools/gatedmlp)
// Run:   build/tools/gatedmlp --help
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp::tool {

// A malformed command line: main prints it and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// No usable CUDA device: main prints "no CUDA device: <reason>" and exits 2.
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Anything that went wrong while running (a CUDA or library error): exit 1.
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- flags
struct FlagSpec {
  std::string name;     // without the leading "--"
  std::string metavar;  // empty: a boolean switch that takes no value
  std::string help;
};

// "--name value" and "--name=value"; "--help"/"-h" are always accepted.
// Unknown flags, missing values and stray positionals throw UsageError.
class Flags {
 public:
  Flags(std::string command, std::string summary, std::vector<FlagSpec> specs);
  void parse(int argc, char** argv);
  bool help() const { return help_; }
  std::string usage() const;

  bool has(const std::string& name) const;
  std::string str(const std::string& name, const std::string& def) const;
  int64_t i64(const std::string& name, int64_t def) const;
  double f64(const std::string& name, double def) const;
  std::vector<int64_t> i64_list(const std::string& name, std::vector<int64_t> def) const;
  const std::string& command() const { return command_; }

 private:
  const FlagSpec* find(const std::string& name) const;
  std::string command_, summary_;
  std::vector<FlagSpec> specs_;
  std::vector<std::pair<std::string, std::string>> values_;
  bool help_ = false;
};

int64_t parse_i64(const std::string& flag, const std::string& text);
double parse_f64(const std::string& flag, const std::string& text);

// ---------------------------------------------------------------- problem flags
// --layout --first --storage --act --dtype --out-dtype: how the kernel is asked.
std::vector<FlagSpec> kernel_flag_specs();
// --batch --alpha --bias --bias-dtype --preact --preact-dtype --clamp-alpha --clamp-limit.
std::vector<FlagSpec> extra_flag_specs();
// A problem of shape (m, k, u) with every flag of the two lists above that the
// command declared applied on top of the defaults.
Problem problem_from_flags(const Flags& f, int64_t m, int64_t k, int64_t u);

WeightLayout parse_layout(const std::string& text);
std::string layout_name(const WeightLayout& w);  // short: stacked, separate, g8, g1/up-first
Activation parse_activation(const std::string& text);
DType parse_dtype(const std::string& flag, const std::string& text);

// ---------------------------------------------------------------- device
struct DeviceInfo {
  int device = 0;
  cudaDeviceProp prop{};
  int driver_version = 0;
  int runtime_version = 0;
};
// Throws NoDevice when no device can be used, with CUDA's reason.
DeviceInfo require_device();
std::string cuda_version_string(int v);  // 12040 -> "12.4"
size_t cublaslt_version();

void cuda_check(cudaError_t err, const std::string& what);    // throws ToolError
void status_check(const Status& s, const std::string& what);  // throws ToolError

// Owns one cudaMalloc allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const std::string& what);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Owns a list of CUDA events.
class EventList {
 public:
  explicit EventList(size_t n);
  EventList(const EventList&) = delete;
  EventList& operator=(const EventList&) = delete;
  ~EventList();
  cudaEvent_t operator[](size_t i) const { return events_[i]; }
  size_t size() const { return events_.size(); }

 private:
  std::vector<cudaEvent_t> events_;
};

// Rows `rows` of a row-major device matrix (row stride ld elements, u
// columns used) copied to the host as double, [rows.size()][u]. Synchronizes
// `stream`.
std::vector<double> copy_rows(const void* y, DType t, int64_t ld, int64_t u, const std::vector<int64_t>& rows,
                              cudaStream_t stream);

// ---------------------------------------------------------------- misc
// The build's commit, or $GATEDMLP_GIT_COMMIT when set (e.g. for a binary
// built from a tree whose configure step predates the commit).
std::string git_commit();

struct MeanStd {
  double mean = 0, std = 0;
};
MeanStd mean_std(const std::vector<double>& v);  // sample std (n - 1); NaN if any value is
double median(std::vector<double> v);

std::string json_str(const std::string& s);  // quoted and escaped
std::string json_num(double v);              // null when not finite
std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
double gib(double bytes);
// Whether `need` bytes fit in the device's free memory now; if not, `note`
// says how much was needed and how much is free.
bool fits_in_memory(size_t need, std::string* note);

// ---------------------------------------------------------------- subcommands
int bench_main(int argc, char** argv);
// `gatedmlp bench --host` (host_bench.cpp): its flags (--host and the
// --host-* ones), and the mode itself on flags bench_main parsed.
std::vector<FlagSpec> host_bench_flag_specs();
int host_bench(const Flags& f);

// An empty kernel <<<1, 32>>> on `stream` (empty_kernel.cu): the floor a
// launch costs the host. The first form is the triple-chevron launch (its
// error, if any, is left for cudaGetLastError); the second launches it by
// cudaLaunchKernelEx, with a cluster-dimension attribute of 1 x 1 x 1 when
// `cluster_attr` (as the Hopper launcher does; needs sm_90) or with no
// attribute, and returns the launch's error.
void launch_empty_kernel(cudaStream_t stream);
cudaError_t launch_empty_kernel_ex(cudaStream_t stream, bool cluster_attr);
int accuracy_main(int argc, char** argv);
int info_main(int argc, char** argv);

}  // namespace gatedmlp::tool
