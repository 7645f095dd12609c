// device::Api on the CUDA runtime (linked statically: it finds the driver
// when first called, and reports "no device" where there is none).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "device/device.h"
#include "kernels/cuda/cuda_kernels.h"

namespace loom::device {
namespace {

// While another thread captures a graph in cudaStreamCaptureModeGlobal (as
// PyTorch does), "unsafe" calls such as allocations and queries fail on
// every thread. loom's own calls never belong to a user's capture: each
// runs in relaxed mode for the calling thread, as NCCL's do.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

Status failure(const char* what, cudaError_t e) {
  return Status(Code::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(e));
}

// A driver call (no runtime equivalent), reached through the runtime's
// entry point lookup: the library links no libcuda. Null when the driver
// lacks it.
template <typename F>
F driverEntryPoint(const char* name, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

class CudaApi final : public Api {
 public:
  const char* name() const override { return "cuda"; }

  int deviceCount() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // not sticky
      return 0;
    }
    return n;
  }

  Status checkDriver() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorStubLibrary) return Status::ok();
    cudaGetLastError();
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    // No driver at all reads as an insufficient one of version 0.
    if (e == cudaErrorInsufficientDriver && driver == 0) return Status::ok();
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    std::string why = std::string("the CUDA driver cannot be used: ") + cudaGetErrorString(e);
    if (e == cudaErrorInsufficientDriver) {
      why = "the CUDA driver here (CUDA " + version(driver) + ") is older than the CUDA runtime this loom was "
            "built with (" + version(CUDART_VERSION) + ")";
    }
    return Status(Code::kCudaError, why + ": install a newer driver, or set LOOM_DEVICE=host to use host "
                                          "buffers only");
  }

  Result<int> currentDevice() override {
    int d = 0;
    if (cudaError_t e = cudaGetDevice(&d); e != cudaSuccess) return failure("cudaGetDevice", e);
    return d;
  }

  bool contextCurrent() override {
    using GetCurrent = int (*)(void**);
    static const GetCurrent getCurrent = driverEntryPoint<GetCurrent>("cuCtxGetCurrent", 4000);
    void* context = nullptr;
    if (getCurrent == nullptr || getCurrent(&context) != 0) return true;  // unknown: as if there were one
    return context != nullptr;
  }

  Status setDevice(int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return failure("cudaSetDevice", e);
    return Status::ok();
  }

  Result<std::string> pciBusId(int device) override {
    char id[32] = {};
    if (cudaError_t e = cudaDeviceGetPCIBusId(id, sizeof id, device); e != cudaSuccess) {
      return failure("cudaDeviceGetPCIBusId", e);
    }
    return std::string(id);
  }

  Result<std::string> deviceUuid(int device) override {
    cudaDeviceProp prop{};
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
      return failure("cudaGetDeviceProperties", e);
    }
    std::string hex;
    char byte[3];
    for (unsigned char c : prop.uuid.bytes) {
      std::snprintf(byte, sizeof byte, "%02x", c);
      hex += byte;
    }
    return hex;
  }

  Status loadKernels(int device) override {
    RelaxedCapture relaxed;
    ScopedDevice bound(this, device);
    LOOM_TRY(bound.status());
    return kernels::cuda::loadKernels();
  }

  Result<Stream> createStream() override {
    RelaxedCapture relaxed;
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      return failure("cudaStreamCreateWithFlags", e);
    }
    return static_cast<Stream>(s);
  }

  void destroyStream(Stream stream) override {
    RelaxedCapture relaxed;
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  Status synchronize(Stream stream) override {
    RelaxedCapture relaxed;
    if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
      return failure("cudaStreamSynchronize", e);
    }
    return Status::ok();
  }

  Result<void*> allocDevice(size_t bytes) override {
    RelaxedCapture relaxed;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) return failure("cudaMalloc", e);
    return p;
  }

  void freeDevice(void* p) override {
    RelaxedCapture relaxed;
    cudaFree(p);
  }

  Result<void*> allocHost(size_t bytes) override {
    RelaxedCapture relaxed;
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable); e != cudaSuccess) {
      return failure("cudaHostAlloc", e);
    }
    return p;
  }

  void freeHost(void* p) override {
    RelaxedCapture relaxed;
    cudaFreeHost(p);
  }

  Status copyAsync(void* dst, const void* src, size_t bytes, Stream stream) override {
    RelaxedCapture relaxed;
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      return failure("cudaMemcpyAsync", e);
    }
    return Status::ok();
  }

  Status reduceAsync(const kernels::Reduction& r, void* dst, const void* const* partials, int npartials,
                     const void* local, size_t count, bool applyPost, Stream stream) override {
    RelaxedCapture relaxed;
    return kernels::cuda::reduce(r, dst, partials, npartials, local, count, applyPost, stream);
  }

  Result<Event> createEvent() override {
    RelaxedCapture relaxed;
    cudaEvent_t e = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
      return failure("cudaEventCreateWithFlags", err);
    }
    return static_cast<Event>(e);
  }

  void destroyEvent(Event event) override {
    RelaxedCapture relaxed;
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }

  Status recordEvent(Event event, Stream stream) override {
    RelaxedCapture relaxed;
    if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      return failure("cudaEventRecord", e);
    }
    return Status::ok();
  }

  Result<bool> eventDone(Event event) override {
    RelaxedCapture relaxed;
    switch (cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event))) {
      case cudaSuccess: return true;
      case cudaErrorNotReady: return false;
      default: return failure("cudaEventQuery", e);
    }
  }

  Result<IpcHandle> ipcHandle(void* base) override {
    RelaxedCapture relaxed;
    cudaIpcMemHandle_t h{};
    if (cudaError_t e = cudaIpcGetMemHandle(&h, base); e != cudaSuccess) return failure("cudaIpcGetMemHandle", e);
    IpcHandle out{};
    static_assert(sizeof h == sizeof out);
    std::memcpy(out.data(), &h, sizeof h);
    return out;
  }

  Result<Range> addressRange(const void* p) override {
    RelaxedCapture relaxed;
    using GetRange = int (*)(unsigned long long*, size_t*, unsigned long long);
    static const GetRange getRange = driverEntryPoint<GetRange>("cuMemGetAddressRange", 12000);
    if (!getRange) return Status(Code::kCudaError, "the driver has no cuMemGetAddressRange");
    unsigned long long base = 0;
    size_t bytes = 0;
    if (int e = getRange(&base, &bytes, reinterpret_cast<unsigned long long>(p)); e != 0) {
      return Status(Code::kCudaError, "cuMemGetAddressRange failed (error " + std::to_string(e) +
                                          "): the pointer is not device memory");
    }
    return Range{reinterpret_cast<void*>(base), bytes};
  }

  Result<int> dmabufFd(const void* base, size_t bytes) override {
    RelaxedCapture relaxed;
    // cuMemGetHandleForAddressRange: CUDA 11.7 and later.
    using GetHandle = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
    static const GetHandle getHandle = driverEntryPoint<GetHandle>("cuMemGetHandleForAddressRange", 11070);
    if (!getHandle) return Status(Code::kCudaError, "the driver has no cuMemGetHandleForAddressRange");
    constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
    int fd = -1;
    if (int e = getHandle(&fd, reinterpret_cast<unsigned long long>(base), bytes, kDmaBufFd, 0); e != 0) {
      return Status(Code::kCudaError, "cuMemGetHandleForAddressRange failed (error " + std::to_string(e) +
                                          "): the driver or kernel cannot export this memory as a dma-buf");
    }
    return fd;
  }

  Result<void*> ipcOpen(const IpcHandle& handle) override {
    RelaxedCapture relaxed;
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.data(), sizeof h);
    void* p = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      return failure("cudaIpcOpenMemHandle", e);
    }
    return p;
  }

  void ipcClose(void* mapped) override {
    RelaxedCapture relaxed;
    cudaIpcCloseMemHandle(mapped);
  }

  Status launchHostFunc(Stream stream, void (*fn)(void*), void* arg) override {
    if (cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg); e != cudaSuccess) {
      return failure("cudaLaunchHostFunc", e);
    }
    return Status::ok();
  }

  Status launchGate(Stream stream, const uint64_t* word, uint64_t value) override {
    return kernels::cuda::gate(word, value, stream);
  }

  Status launchGateIndirect(Stream stream, const uint64_t* word, const uint64_t* target) override {
    return kernels::cuda::gateIndirect(word, target, stream);
  }

  Status retainWithGraph(Stream stream, std::shared_ptr<void> object) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    if (cudaError_t e = cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, nullptr, &graph);
        e != cudaSuccess) {
      return failure("cudaStreamGetCaptureInfo", e);
    }
    if (status != cudaStreamCaptureStatusActive || !graph) {
      return Status(Code::kInvalidUsage, "the stream is not being captured");
    }
    auto* held = new std::shared_ptr<void>(std::move(object));
    cudaUserObject_t user = nullptr;
    if (cudaError_t e = cudaUserObjectCreate(
            &user, held, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); }, 1,
            cudaUserObjectNoDestructorSync);
        e != cudaSuccess) {
      delete held;
      return failure("cudaUserObjectCreate", e);
    }
    if (cudaError_t e = cudaGraphRetainUserObject(graph, user, 1, cudaGraphUserObjectMove); e != cudaSuccess) {
      cudaUserObjectRelease(user, 1);
      return failure("cudaGraphRetainUserObject", e);
    }
    return Status::ok();
  }

  Result<Capture> captureStatus(Stream stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status); e != cudaSuccess) {
      return failure("cudaStreamIsCapturing", e);
    }
    switch (status) {
      case cudaStreamCaptureStatusActive: return Capture::kActive;
      case cudaStreamCaptureStatusInvalidated: return Capture::kInvalidated;
      default: return Capture::kNone;
    }
  }
};

}  // namespace

Api* cudaApi() {
  static CudaApi table;
  return &table;
}

}  // namespace loom::device
