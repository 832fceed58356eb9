// The empty kernel `gatedmlp bench --host` times its launches against: what
// any launch costs the host, below which run() cannot go.
#include <cuda_runtime.h>

#include "common.hpp"

namespace gatedmlp::tool {
namespace {

__global__ void empty_kernel() {}

}  // namespace

void launch_empty_kernel(cudaStream_t stream) { empty_kernel<<<1, 32, 0, stream>>>(); }

cudaError_t launch_empty_kernel_ex(cudaStream_t stream, bool cluster_attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1, 1, 1);
  cfg.blockDim = dim3(32, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = cluster_attr ? attr : nullptr;
  cfg.numAttrs = cluster_attr ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, empty_kernel);
}

}  // namespace gatedmlp::tool
