// Internal: the boundary between cuda_kernels.cc (C++, Status, argument
// checks) and reduce.cu (device code). Plain C++, no CUDA types, so either
// side can be compiled by its own compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/datatype.h"

namespace loom::kernels::cuda::detail {

// Sources one kernel launch combines; longer chains take several launches.
inline constexpr int kMaxSourcesPerLaunch = 8;

struct ReduceLaunch {
  DataType type;
  RedOp op;
  uint64_t scalar;   // Reduction::scalar
  uint64_t divisor;  // >= 1
  bool fp32;         // Accumulation::kFloat32 (narrow float sums only)
  void* dst;
  const void* sources[kMaxSourcesPerLaunch];  // in chain order
  int nsources;       // 1..kMaxSourcesPerLaunch
  bool lastIsLocal;   // the last source gets the pre step (kPreMulSum)
  bool applyPost;
  size_t count;
  int blocks;
  int threads;
};

struct CopyLaunch {
  void* dsts[kMaxSourcesPerLaunch];
  int ndsts;  // 1..kMaxSourcesPerLaunch
  const void* src;
  size_t bytes;
  int blocks;
  int threads;
};

// Queue the kernel on `stream` (a cudaStream_t). Return a cudaError_t value.
int launchReduce(const ReduceLaunch& launch, void* stream);
int launchCopy(const CopyLaunch& launch, void* stream);
// One thread waiting until *word >= value (word: pinned, mapped host memory).
int launchGate(const uint64_t* word, uint64_t value, void* stream);
// The same until *word >= *target (read when the kernel starts).
int launchGateIndirect(const uint64_t* word, const uint64_t* target, void* stream);

// Load every kernel of reduce.cu / gate.cu on the current device now. With
// lazy loading (CUDA's default since 12.2) a kernel is loaded at its first
// launch, and loading may wait for the whole device: launched while a gate
// holds a stream for the host, it would never return. Return a cudaError_t.
int preloadReduceKernels();
int preloadGateKernels();

}  // namespace loom::kernels::cuda::detail
