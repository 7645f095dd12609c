// Internal, device side: queue one kernel and return the error of that
// launch alone. A `<<<...>>>` launch reports through cudaGetLastError,
// which also returns what any earlier runtime call of this thread left
// there: a cudaIpcOpenMemHandle failure that loom tolerates and falls back
// from, or a "not ready" from polling an event, would then fail a launch
// that worked.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace loom::kernels::cuda::detail {

template <typename... Params, typename... Args>
int launchKernel(void (*kernel)(Params...), int blocks, int threads, void* stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(unsigned(threads));
  config.stream = static_cast<cudaStream_t>(stream);
  return int(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace loom::kernels::cuda::detail
