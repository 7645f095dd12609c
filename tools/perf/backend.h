// Where the test buffers live: host memory (loom's host mode: host pointers,
// the stream is ignored and calls complete before they return) or CUDA
// device memory (built with CUDA and a usable device). The rest of the tools
// only talk to this interface, so a host-only build needs no CUDA at all.
//
// Threading: a Backend is shared by all test threads. CUDA's current device
// is per thread, so callers use setDevice() before touching a rank's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/status.h"
#include "nccl.h"

namespace loom::perf {

using Stream = cudaStream_t;

struct DeviceDescription {
  std::string busId;  // "0000:1b:00" for a GPU, "host" for host memory
  std::string name;   // "NVIDIA H200", "CPU"
  uint64_t totalMemory = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual bool isDevice() const = 0;
  virtual int deviceCount() const = 0;  // 0 for host memory
  virtual Result<DeviceDescription> describe(int device) const = 0;
  virtual Status setDevice(int device) = 0;

  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void release(void* pointer) = 0;
  // Synchronous copies between host memory and a buffer of this backend.
  virtual Status copyIn(void* destination, const void* hostSource, size_t bytes) = 0;
  virtual Status copyOut(void* hostDestination, const void* source, size_t bytes) = 0;

  virtual Result<Stream> createStream(bool nullStream) = 0;
  virtual void destroyStream(Stream stream) = 0;
  // true once all work queued on `stream` finished.
  virtual Result<bool> streamDone(Stream stream) = 0;
  // Free memory of the current device (CUDA only).
  virtual Result<uint64_t> freeMemory() = 0;
};

std::unique_ptr<Backend> makeHostBackend();
// A CUDA backend, or nullptr with the reason in *why: built without CUDA,
// cudaGetDeviceCount failed, or no device.
std::unique_ptr<Backend> makeCudaBackend(std::string* why);

// One allocation of a backend, freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, void* pointer, size_t bytes) : backend_(backend), pointer_(pointer), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(backend_, other.backend_);
      std::swap(pointer_, other.pointer_);
      std::swap(bytes_, other.bytes_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  static Result<Buffer> allocate(Backend* backend, size_t bytes);
  char* data() const { return static_cast<char*>(pointer_); }
  size_t size() const { return bytes_; }
  void reset();

 private:
  Backend* backend_ = nullptr;
  void* pointer_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace loom::perf
