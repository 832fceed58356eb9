// Timing experiment (h88, docs/notes/drop-in-and-decode.md): where the
// binding's host time goes between the call's entry and the launch. Compiled
// in only with -DGATEDMLP_PY_TIMERS; otherwise every GATEDMLP_LAP is empty
// and the module has no _stage_timers().
#pragma once

#ifdef GATEDMLP_PY_TIMERS
#include <array>
#include <chrono>
#include <cstdint>

namespace gatedmlp::py::stage_timers {

// In call order; each lap charges the time since the previous one.
enum Stage { kImport, kOptions, kDescribe, kArguments, kViews, kGuard, kWorkspace, kProducers, kRun, kCheck, kCount };
inline constexpr const char* kNames[kCount] = {"import tensors", "options", "describe", "arguments", "views vector",
                                                "device guard",
                                                "workspace", "producers", "GIL release + run()", "check"};

inline std::array<int64_t, kCount> g_ns{};
inline int64_t g_calls = 0;
inline thread_local std::chrono::steady_clock::time_point t_last;

inline void start() {
  ++g_calls;
  t_last = std::chrono::steady_clock::now();
}
inline void lap(Stage s) {
  const auto now = std::chrono::steady_clock::now();
  g_ns[s] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - t_last).count();
  t_last = now;
}

}  // namespace gatedmlp::py::stage_timers

#define GATEDMLP_LAP_START() ::gatedmlp::py::stage_timers::start()
#define GATEDMLP_LAP(stage) ::gatedmlp::py::stage_timers::lap(::gatedmlp::py::stage_timers::stage)
#else
#define GATEDMLP_LAP_START() ((void)0)
#define GATEDMLP_LAP(stage) ((void)0)
#endif
