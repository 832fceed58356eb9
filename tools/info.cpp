// `gatedmlp info`: the device, and which kernel path and config a problem
// gets from the dispatcher. With no usable GPU it says so and exits 2.
//
//   gatedmlp info                                  # Llama-3 8B gate/up at M = 4096
//   gatedmlp info --m 16 --k 8192 --u 28672 --layout g32 --first up
#include <cstdio>

#include "common.hpp"

namespace gatedmlp::tool {

int info_main(int argc, char** argv) {
  std::vector<FlagSpec> specs = {
      {"m", "M", "rows of X (default 4096)"},
      {"k", "K", "input features (default 4096)"},
      {"u", "U", "output features per half (default 14336)"},
  };
  for (auto& s : kernel_flag_specs()) specs.push_back(s);
  for (auto& s : extra_flag_specs()) specs.push_back(s);
  Flags f("info", "Print the CUDA device and the kernel path and config a problem would run with.", specs);
  f.parse(argc, argv);
  if (f.help()) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  const Problem p = problem_from_flags(f, f.i64("m", 4096), f.i64("k", 4096), f.i64("u", 14336));

  const DeviceInfo d = require_device();
  const cudaDeviceProp& prop = d.prop;
  std::printf("device            %d: %s\n", d.device, prop.name);
  std::printf("compute           sm_%d%d (%d.%d), %d SMs\n", prop.major, prop.minor, prop.major, prop.minor,
              prop.multiProcessorCount);
  std::printf("memory            %.1f GiB, %d-bit bus\n", gib(static_cast<double>(prop.totalGlobalMem)),
              prop.memoryBusWidth);
  std::printf("L2 cache          %.1f MiB (persisting max %.1f MiB)\n", prop.l2CacheSize / 1048576.0,
              prop.persistingL2CacheMaxSize / 1048576.0);
  std::printf("shared memory     %zu KiB per SM, %zu KiB per block (opt-in)\n", prop.sharedMemPerMultiprocessor / 1024,
              prop.sharedMemPerBlockOptin / 1024);
  std::printf("registers         %d per SM\n", prop.regsPerMultiprocessor);
  std::printf("driver / runtime  CUDA %s / %s\n", cuda_version_string(d.driver_version).c_str(),
              cuda_version_string(d.runtime_version).c_str());
  std::printf("cuBLASLt          %zu\n", cublaslt_version());
  std::printf("build             commit %s\n", git_commit().c_str());
  std::printf("\nproblem           %s\n", to_string(p).c_str());

  const Status support = check_support(p);
  if (!support.ok()) {
    std::printf("check_support     %s: %s\n", to_string(support.code()), support.message().c_str());
    return 1;
  }
  std::printf("check_support     ok\n");
  std::printf("workspace         %zu bytes\n", workspace_size(p));
  Config cfg;
  const Status planned = plan(p, &cfg, d.device);
  if (!planned.ok()) {
    std::printf("plan              %s: %s\n", to_string(planned.code()), planned.message().c_str());
    return 1;
  }
  std::printf("path              %s\n", to_string(cfg.path));
  std::printf("config            %s\n", to_string(cfg).c_str());
  if (!cfg.reason.empty()) std::printf("why               %s\n", cfg.reason.c_str());
  return 0;
}

}  // namespace gatedmlp::tool
