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
//   test helpers translate. Each allocation is a memfd mapping, so another
//   process can map it through its IPC handle (/proc/<pid>/fd/<fd>), as
//   CUDA IPC maps a peer's memory.
// - Kernels (reduceAsync) run the host kernels on the stream's worker;
//   events are counters that the worker advances.
// - Calls that may synchronize the device on a GPU (freeing and allocating
//   device or pinned memory, opening and closing a peer's memory, a
//   kernel's first launch without loadKernels) wait for every stream's
//   earlier work, and report a would-be hang as a crash after 30 s.
// - A stream belongs to the device current when it was created; a kernel
//   launched on it while another device is current fails, as on a GPU.
// - Graph capture: between beginCapture and endCapture a stream records
//   what is queued on it instead of running it; launchGraph queues the
//   recording again, as often as asked. Objects retained with the graph
//   live as long as the returned Graph.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"

namespace loom::test {

class EmulatedDevice final : public device::Api {
 public:
  struct Options {
    int devices = 1;
    int maxDelayUs = 1000;
    // false: ipcOpen fails, as CUDA IPC does where containers forbid it.
    bool ipcWorks = true;
    // Non-empty: a driver that is installed but cannot be used (checkDriver
    // fails with this, deviceCount says 0), as one older than the runtime.
    std::string driverError;

    static Options with(int devices, int maxDelayUs, bool ipcWorks = true) {
      Options o;
      o.devices = devices;
      o.maxDelayUs = maxDelayUs;
      o.ipcWorks = ipcWorks;
      return o;
    }
  };
  explicit EmulatedDevice(Options options);
  EmulatedDevice() : EmulatedDevice(Options{}) {}
  ~EmulatedDevice() override;

  const char* name() const override { return "emulated"; }
  int deviceCount() override { return options_.driverError.empty() ? options_.devices : 0; }
  Status checkDriver() override {
    return options_.driverError.empty() ? Status::ok() : Status(Code::kCudaError, options_.driverError);
  }
  Result<int> currentDevice() override;
  Status setDevice(int device) override;
  Result<std::string> deviceUuid(int device) override;
  Result<std::string> pciBusId(int device) override;
  Status loadKernels(int device) override;
  Result<device::Stream> createStream() override;
  void destroyStream(device::Stream stream) override;
  Status synchronize(device::Stream stream) override;
  Result<void*> allocDevice(size_t bytes) override;
  void freeDevice(void* p) override;
  Result<void*> allocHost(size_t bytes) override;
  void freeHost(void* p) override;
  Status copyAsync(void* dst, const void* src, size_t bytes, device::Stream stream) override;
  Status reduceAsync(const kernels::Reduction& r, void* dst, const void* const* partials, int npartials,
                     const void* local, size_t count, bool applyPost, device::Stream stream) override;
  Result<device::Event> createEvent() override;
  void destroyEvent(device::Event event) override;
  Status recordEvent(device::Event event, device::Stream stream) override;
  Result<bool> eventDone(device::Event event) override;
  Result<device::IpcHandle> ipcHandle(void* base) override;
  // true: ipcHandle fails, as on memory CUDA IPC cannot export
  // (cudaMallocAsync pools, cuMem* virtual memory).
  void refuseIpcExport(bool refuse) { refuseExport_.store(refuse); }
  Result<Range> addressRange(const void* p) override;
  Result<void*> ipcOpen(const device::IpcHandle& handle) override;
  void ipcClose(void* mapped) override;
  Status launchHostFunc(device::Stream stream, void (*fn)(void*), void* arg) override;
  Status launchGate(device::Stream stream, const uint64_t* word, uint64_t value) override;
  Status launchGateIndirect(device::Stream stream, const uint64_t* word, const uint64_t* target) override;
  Result<device::Capture> captureStatus(device::Stream stream) override;
  Status retainWithGraph(device::Stream stream, std::shared_ptr<void> object) override;

  // ---- for the tests ----
  // Queues `work` on `stream` as a kernel would be (it may touch device
  // memory through hostView).
  void launch(device::Stream stream, std::function<void()> work);
  // The host address behind a device pointer (identity for host pointers).
  static void* hostView(const void* p);
  static bool isDevicePointer(const void* p);
  struct Graph {
    std::vector<std::function<void()>> items;
    std::vector<std::shared_ptr<void>> retained;
  };
  void beginCapture(device::Stream stream);
  std::shared_ptr<Graph> endCapture(device::Stream stream);
  void launchGraph(const Graph& graph, device::Stream stream);
  // Items (gates included) queued on `stream` and not yet finished.
  size_t pending(device::Stream stream);
  // Allocations not yet freed (device and pinned host) and peers' memory
  // still mapped.
  size_t liveAllocations() const;
  // Events created and not yet destroyed.
  size_t liveEvents() const;
  // Reduction kernels launched.
  uint64_t reduceLaunches() const { return reduceLaunches_.load(); }

 private:
  struct Queue;
  struct EventState;
  Queue* queueOf(device::Stream stream);
  // As CUDA: a kernel launch fails on a stream of another device than the
  // calling thread's current one (the legacy stream follows the thread).
  Status onCurrentDevice(device::Stream stream, const char* what);
  void implicitSynchronize(const char* call);
  // As CUDA's lazy loading: the first kernel on a device (unless
  // loadKernels came first) waits for the device like cudaFree.
  void loadOnFirstLaunch(int device);

  Options options_;
  std::shared_ptr<Queue> defaultStream_;  // the legacy default stream (nullptr)
  mutable std::mutex mutex_;
  std::map<void*, std::shared_ptr<Queue>> streams_;
  struct Allocation {
    size_t bytes;
    int fd;  // device memory: its memfd; pinned host memory: -1
  };
  std::map<void*, Allocation> allocations_;
  std::map<void*, size_t> opened_;  // peers' memory mapped by ipcOpen
  std::map<void*, std::shared_ptr<EventState>> events_;
  std::set<int> loaded_;  // devices whose kernels are loaded
  std::atomic<uint64_t> reduceLaunches_{0};
  std::atomic<bool> refuseExport_{false};
};

}  // namespace loom::test
