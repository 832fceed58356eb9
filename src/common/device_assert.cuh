// A device-side assertion that release builds keep: what assert() compiles
// to in device code, called directly because release builds define NDEBUG.
// The kernel stops with cudaErrorAssert, which the stream reports at its
// next synchronisation and which ends the CUDA context, as an out-of-range
// index in a PyTorch kernel does (Arguments::index_trap).
#pragma once

extern "C" __host__ __device__ void __assert_fail(const char*, const char*, unsigned int, const char*) __THROW;

namespace gatedmlp::detail {

__device__ __noinline__ inline void device_assert_fail(const char* what, const char* file, unsigned line) {
  __assert_fail(what, file, line, "gatedmlp kernel");
}

}  // namespace gatedmlp::detail
