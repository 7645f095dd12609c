// A host emulation of device::Api, for the tests only (never shipped as a
// mode): it lets the cuda-mode orchestration (device queues, gates, host
// functions, abort, capture refusal) run on machines without a GPU.
//
// - Streams are FIFO queues, each run by a worker thread that sleeps a
//   random 0..maxDelayUs before every item, so the engine's ordering
//   decisions meet the timings a real device produces, and worse.
// - Device memory is host memory behind a tagged address (bit 61 set, a
//   non-canonical x86-64 address): any host code that dereferences a
//   device pointer crashes at once instead of passing. copyAsync and the
//   test helpers translate.
// - Graph capture is a flag per stream (beginCapture / endCapture).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "device/device.h"

namespace loom::test {

class EmulatedDevice final : public device::Api {
 public:
  struct Options {
    int devices = 1;
    int maxDelayUs = 1000;
  };
  explicit EmulatedDevice(Options options);
  EmulatedDevice() : EmulatedDevice(Options{}) {}
  ~EmulatedDevice() override;

  const char* name() const override { return "emulated"; }
  int deviceCount() override { return options_.devices; }
  Result<int> currentDevice() override;
  Status setDevice(int device) override;
  Result<std::string> deviceUuid(int device) override;
  Result<device::Stream> createStream() override;
  void destroyStream(device::Stream stream) override;
  Status synchronize(device::Stream stream) override;
  Result<void*> allocDevice(size_t bytes) override;
  void freeDevice(void* p) override;
  Result<void*> allocHost(size_t bytes) override;
  void freeHost(void* p) override;
  Status copyAsync(void* dst, const void* src, size_t bytes, device::Stream stream) override;
  Status launchHostFunc(device::Stream stream, void (*fn)(void*), void* arg) override;
  Status launchGate(device::Stream stream, const uint64_t* word, uint64_t value) override;
  Result<device::Capture> captureStatus(device::Stream stream) override;

  // ---- for the tests ----
  // Queues `work` on `stream` as a kernel would be (it may touch device
  // memory through hostView).
  void launch(device::Stream stream, std::function<void()> work);
  // The host address behind a device pointer (identity for host pointers).
  static void* hostView(const void* p);
  static bool isDevicePointer(const void* p);
  void beginCapture(device::Stream stream);
  void endCapture(device::Stream stream);
  // Items (gates included) queued on `stream` and not yet finished.
  size_t pending(device::Stream stream);
  // Allocations not yet freed (device and pinned host).
  size_t liveAllocations() const;

 private:
  struct Queue;
  Queue* queueOf(device::Stream stream);

  Options options_;
  std::unique_ptr<Queue> defaultStream_;  // the legacy default stream (nullptr)
  mutable std::mutex mutex_;
  std::map<void*, std::unique_ptr<Queue>> streams_;
  std::map<void*, size_t> allocations_;
};

}  // namespace loom::test
