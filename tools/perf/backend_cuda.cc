// CUDA device buffers through the CUDA runtime. No kernels: inputs are built
// on the host and copied in, results copied out and checked on the host.
#include <cuda_runtime.h>

#include <cstdio>

#include "tools/perf/backend.h"

namespace loom::perf {
namespace {

Status cudaFailure(const char* what, cudaError_t error) {
  return Status(Code::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(error));
}

#define PERF_CUDA_TRY(what, call)                      \
  do {                                                 \
    cudaError_t perf_cuda_error_ = (call);             \
    if (perf_cuda_error_ != cudaSuccess) return cudaFailure(what, perf_cuda_error_); \
  } while (0)

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int count) : count_(count) {}
  bool isDevice() const override { return true; }
  int deviceCount() const override { return count_; }

  Result<DeviceDescription> describe(int device) const override {
    cudaDeviceProp prop{};
    PERF_CUDA_TRY("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
    char busId[32];
    std::snprintf(busId, sizeof busId, "%04x:%02x:%02x", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    return DeviceDescription{busId, prop.name, uint64_t(prop.totalGlobalMem)};
  }
  Status setDevice(int device) override {
    PERF_CUDA_TRY("cudaSetDevice", cudaSetDevice(device));
    return Status::ok();
  }

  Result<void*> allocate(size_t bytes) override {
    void* pointer = nullptr;
    PERF_CUDA_TRY("cudaMalloc", cudaMalloc(&pointer, bytes ? bytes : 1));
    return pointer;
  }
  void release(void* pointer) override { cudaFree(pointer); }
  Status copyIn(void* destination, const void* hostSource, size_t bytes) override {
    PERF_CUDA_TRY("cudaMemcpy to device", cudaMemcpy(destination, hostSource, bytes, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the DMA lands, and
    // the tests' non-blocking streams do not wait for the legacy stream: wait
    // for that stream alone. Not the whole device: another rank's thread may
    // have a collective queued whose gate waits for this thread's next call.
    PERF_CUDA_TRY("cudaStreamSynchronize", cudaStreamSynchronize(cudaStreamLegacy));
    return Status::ok();
  }
  Status copyOut(void* hostDestination, const void* source, size_t bytes) override {
    PERF_CUDA_TRY("cudaMemcpy from device", cudaMemcpy(hostDestination, source, bytes, cudaMemcpyDeviceToHost));
    return Status::ok();
  }

  Result<Stream> createStream(bool nullStream) override {
    if (nullStream) return Stream(nullptr);
    cudaStream_t stream = nullptr;
    PERF_CUDA_TRY("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }
  void destroyStream(Stream stream) override {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  Result<bool> streamDone(Stream stream) override {
    cudaError_t error = cudaStreamQuery(stream);
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) return false;
    return cudaFailure("cudaStreamQuery", error);
  }
  Result<uint64_t> freeMemory() override {
    size_t freeBytes = 0, totalBytes = 0;
    PERF_CUDA_TRY("cudaMemGetInfo", cudaMemGetInfo(&freeBytes, &totalBytes));
    return uint64_t(freeBytes);
  }

 private:
  int count_;
};

}  // namespace

std::unique_ptr<Backend> makeCudaBackend(std::string* why) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error);
    return nullptr;
  }
  if (count == 0) {
    *why = "no CUDA device";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(count);
}

}  // namespace loom::perf
