// The gate: a one-thread kernel that holds back the rest of its stream until
// a host-written word reaches a value. The only device-side wait loom
// queues: the local host always releases it (the operation finished,
// failed, or was aborted), so it never depends on a peer being scheduled.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_kernel.cuh"

namespace loom::kernels::cuda::detail {
namespace {

__global__ void gateKernel(const volatile uint64_t* word, uint64_t value) {
  // Each read crosses the bus to pinned host memory: sleep between reads
  // so the poll costs neither the bus nor the SM anything measurable.
  while (*word < value) __nanosleep(2000);
}

// The same against a target the host writes before the gate starts (a
// graph's gate: each replay waits for a later value).
__global__ void gateIndirectKernel(const volatile uint64_t* word, const volatile uint64_t* target) {
  const uint64_t value = *target;
  while (*word < value) __nanosleep(2000);
}

}  // namespace

int launchGateIndirect(const uint64_t* word, const uint64_t* target, void* stream) {
  return launchKernel(gateIndirectKernel, 1, 1, stream, word, target);
}

int preloadGateKernels() {
  cudaFuncAttributes a;
  if (cudaError_t e = cudaFuncGetAttributes(&a, gateKernel); e != cudaSuccess) return int(e);
  return int(cudaFuncGetAttributes(&a, gateIndirectKernel));
}

int launchGate(const uint64_t* word, uint64_t value, void* stream) {
  return launchKernel(gateKernel, 1, 1, stream, word, value);
}

}  // namespace loom::kernels::cuda::detail
