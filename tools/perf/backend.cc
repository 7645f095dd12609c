#include "tools/perf/backend.h"

#include <cstdlib>
#include <cstring>

namespace loom::perf {
namespace {

// Host memory: plain malloc'ed buffers; loom's host mode takes host pointers
// and completes every call before it returns, so streams are never waited on.
class HostBackend final : public Backend {
 public:
  bool isDevice() const override { return false; }
  int deviceCount() const override { return 0; }
  Result<DeviceDescription> describe(int) const override { return DeviceDescription{"host", "CPU", 0}; }
  Status setDevice(int) override { return Status::ok(); }

  Result<void*> allocate(size_t bytes) override {
    // At least one byte so zero-sized tests still get distinct pointers;
    // 64-byte alignment like device allocations.
    void* pointer = std::aligned_alloc(64, ((bytes ? bytes : 1) + 63) / 64 * 64);
    if (pointer == nullptr) {
      return systemError("cannot allocate " + std::to_string(bytes) + " bytes of host memory; lower -e (maxbytes)");
    }
    // Touch every page now: untouched memory reads as the kernel's shared
    // zero page, which is always cached and would flatter every timing that
    // reads a buffer no earlier call wrote (out-of-place sends without -c).
    std::memset(pointer, 0, bytes);
    return pointer;
  }
  void release(void* pointer) override { std::free(pointer); }
  Status copyIn(void* destination, const void* hostSource, size_t bytes) override {
    if (bytes) std::memcpy(destination, hostSource, bytes);
    return Status::ok();
  }
  Status copyOut(void* hostDestination, const void* source, size_t bytes) override {
    if (bytes) std::memcpy(hostDestination, source, bytes);
    return Status::ok();
  }
  Result<Stream> createStream(bool) override { return Stream(nullptr); }
  void destroyStream(Stream) override {}
  Result<bool> streamDone(Stream) override { return true; }
  Result<uint64_t> freeMemory() override { return invalidUsage("host buffers have no device memory to report"); }
};

}  // namespace

std::unique_ptr<Backend> makeHostBackend() { return std::make_unique<HostBackend>(); }

Result<Buffer> Buffer::allocate(Backend* backend, size_t bytes) {
  LOOM_ASSIGN_OR_RETURN(void* pointer, backend->allocate(bytes));
  return Buffer(backend, pointer, bytes);
}

void Buffer::reset() {
  if (pointer_ != nullptr) backend_->release(pointer_);
  pointer_ = nullptr;
  bytes_ = 0;
}

}  // namespace loom::perf
