#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 4;  // enough resident warps to keep loads in flight
constexpr int kMaxDevices = 64;

Status cudaFailure(const char* what, cudaError_t error) {
  return Status(Code::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(error) +
                                      " (check that the pointers are device memory of the current device and "
                                      "that the stream belongs to it)");
}

// Blocks for `work` items: enough to fill the device, no more (grid-stride).
Result<int> gridFor(size_t work) {
  static std::atomic<int> smCounts[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cudaFailure("cudaGetDevice", e);
  int sms = device < kMaxDevices ? smCounts[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) {
      return cudaFailure("cudaDeviceGetAttribute(multiProcessorCount)", e);
    }
    if (device < kMaxDevices) smCounts[device].store(sms, std::memory_order_relaxed);
  }
  const size_t wanted = (work + kThreads - 1) / kThreads;
  return int(std::max<size_t>(1, std::min<size_t>(wanted, size_t(sms) * kBlocksPerSm)));
}

bool isPlainCopy(const Reduction& r, int npartials, const void* local, bool applyPost) {
  const int nsources = npartials + (local != nullptr ? 1 : 0);
  if (nsources != 1) return false;
  if (r.op == RedOp::kPreMulSum && local != nullptr) return false;
  if (r.op == RedOp::kSumPostDiv && applyPost) return false;
  return true;
}

bool useFloat32(Accumulation a) {
  if (a == Accumulation::kDefault) return defaultAccumulateInFloat32();
  return a == Accumulation::kFloat32;
}

}  // namespace

Status loadKernels() {
  static std::atomic<bool> loaded[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cudaFailure("cudaGetDevice", e);
  if (device < kMaxDevices && loaded[device].load(std::memory_order_acquire)) return Status::ok();
  // Several threads may load at once: loading twice is harmless.
  if (int e = detail::preloadGateKernels(); e != cudaSuccess) {
    return cudaFailure("loading loom's gate kernels", cudaError_t(e));
  }
  if (int e = detail::preloadReduceKernels(); e != cudaSuccess) {
    return cudaFailure("loading loom's reduction kernels", cudaError_t(e));
  }
  if (device < kMaxDevices) loaded[device].store(true, std::memory_order_release);
  return Status::ok();
}

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

Status reduce(const Reduction& r, void* dst, const void* const* partials, int npartials, const void* local,
              size_t count, bool applyPost, void* stream) {
  if (count == 0 || (npartials <= 0 && local == nullptr)) return Status::ok();
  if (npartials < 0) npartials = 0;
  LOOM_TRY(loadKernels());
  if (isPlainCopy(r, npartials, local, applyPost)) {
    void* dsts[] = {dst};
    return copyToMany(dsts, 1, npartials > 0 ? partials[0] : local, count * dataTypeSize(r.type), stream);
  }
  const int nsources = npartials + (local != nullptr ? 1 : 0);
  LOOM_ASSIGN_OR_RETURN(const int blocks, gridFor(count));
  detail::ReduceLaunch l{};
  l.type = r.type;
  l.op = r.op;
  l.scalar = r.scalar;
  l.divisor = r.divisor == 0 ? 1 : r.divisor;
  l.fp32 = useFloat32(r.accumulation);
  l.dst = dst;
  l.count = count;
  l.blocks = blocks;
  l.threads = kThreads;
  // Sources in chain order; after the first launch, dst carries the chain.
  int next = 0;
  while (next < nsources) {
    l.nsources = 0;
    if (next > 0) l.sources[l.nsources++] = dst;
    while (next < nsources && l.nsources < detail::kMaxSourcesPerLaunch) {
      l.sources[l.nsources++] = next < npartials ? partials[next] : local;
      ++next;
    }
    l.lastIsLocal = next == nsources && local != nullptr;
    l.applyPost = next == nsources && applyPost;
    if (int e = detail::launchReduce(l, stream); e != cudaSuccess) {
      return cudaFailure("reduce kernel launch", cudaError_t(e));
    }
  }
  return Status::ok();
}

Status copyToMany(void* const* dsts, int ndsts, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || ndsts <= 0) return Status::ok();
  LOOM_TRY(loadKernels());
  const auto s = static_cast<cudaStream_t>(stream);
  detail::CopyLaunch l{};
  l.src = src;
  l.bytes = bytes;
  l.threads = kThreads;
  for (int d = 0; d < ndsts; ++d) {
    if (dsts[d] != src) l.dsts[l.ndsts++] = dsts[d];
    const bool flush = l.ndsts == detail::kMaxSourcesPerLaunch || (d == ndsts - 1 && l.ndsts > 0);
    if (!flush) continue;
    if (l.ndsts == 1) {
      if (cudaError_t e = cudaMemcpyAsync(l.dsts[0], src, bytes, cudaMemcpyDefault, s); e != cudaSuccess) {
        return cudaFailure("cudaMemcpyAsync", e);
      }
    } else {
      LOOM_ASSIGN_OR_RETURN(l.blocks, gridFor(bytes / 16 + 1));
      if (int e = detail::launchCopy(l, stream); e != cudaSuccess) {
        return cudaFailure("copy kernel launch", cudaError_t(e));
      }
    }
    l.ndsts = 0;
  }
  return Status::ok();
}

Status gate(const uint64_t* word, uint64_t value, void* stream) {
  LOOM_TRY(loadKernels());
  if (int e = detail::launchGate(word, value, stream); e != cudaSuccess) {
    return cudaFailure("gate kernel launch", cudaError_t(e));
  }
  return Status::ok();
}

Status gateIndirect(const uint64_t* word, const uint64_t* target, void* stream) {
  LOOM_TRY(loadKernels());
  if (int e = detail::launchGateIndirect(word, target, stream); e != cudaSuccess) {
    return cudaFailure("gate kernel launch", cudaError_t(e));
  }
  return Status::ok();
}

}  // namespace loom::kernels::cuda
