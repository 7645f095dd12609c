// The CUDA calls loom makes, as one small table (device::Api), so that the
// engine's device path (core/device_queue.h) never names the CUDA runtime.
//
// Two tables exist: CUDA's (cuda_api.cc, only in builds with CUDA: the
// runtime is linked statically and reaches the driver at run time, so a
// machine without one still loads loom), and, in the tests only, a host
// emulation (tests/gpu/emulated_device.h) whose streams are queues run by
// worker threads with random delays. Nothing else calls CUDA for the
// engine, so the emulation exercises every ordering decision the engine
// makes.
//
// Pointers: streams and events are the runtime's handles as opaque values
// (a cudaStream_t; nullptr is the legacy default stream). "Device memory"
// is whatever allocDevice returns; loom itself never dereferences it on the
// host, only hands it to copyAsync and the kernels.
//
// Thread safety: every call may be made from any thread at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/reduce.h"

namespace loom::device {

using Stream = void*;

// Sources one reduction kernel launch folds (kernels/cuda/launch.h's
// kMaxSourcesPerLaunch; reduceAsync chains more).
inline constexpr int kSourcesPerLaunch = 8;
using Event = void*;
// What another process of this host opens to reach device memory (the
// runtime's cudaIpcMemHandle_t, 64 bytes).
using IpcHandle = std::array<uint8_t, 64>;

enum class Capture { kNone, kActive, kInvalidated };

class Api {
 public:
  virtual ~Api() = default;
  virtual const char* name() const = 0;  // "cuda", "emulated"

  // Devices present; 0 without a GPU or driver (never fails).
  virtual int deviceCount() = 0;
  // Ok where a driver answers or none is installed; an error where one is
  // installed but cannot be used (older than the runtime, devices busy or
  // failing): deviceCount() then says 0 too, and a communicator that would
  // otherwise take host mode for device buffers fails with this instead.
  virtual Status checkDriver() { return Status::ok(); }
  // The calling thread's current device.
  virtual Result<int> currentDevice() = 0;
  // Whether the calling thread has a CUDA context current. Without one,
  // currentDevice() says 0 and setting device 0 would create its context.
  virtual bool contextCurrent() { return true; }
  virtual Status setDevice(int device) = 0;
  // The device's UUID, 32 hex digits.
  virtual Result<std::string> deviceUuid(int device) = 0;
  // The device's PCI bus id ("0000:18:00.0"), to place it in the topology.
  virtual Result<std::string> pciBusId(int device) = 0;

  // Loads loom's kernels on `device` now (the calling thread's current device
  // is left as it was). Launches load them too, but lazily loading a kernel
  // can wait for the whole device: done at init, a first operation neither
  // waits for the user's running kernels nor hangs behind a gate.
  virtual Status loadKernels(int device) = 0;

  // A stream owned by loom, not synchronizing with the legacy default stream.
  virtual Result<Stream> createStream() = 0;
  virtual void destroyStream(Stream stream) = 0;
  // Blocks until everything queued on `stream` has run.
  virtual Status synchronize(Stream stream) = 0;

  virtual Result<void*> allocDevice(size_t bytes) = 0;
  virtual void freeDevice(void* p) = 0;
  // Pinned host memory the device can read and write through the same
  // address (unified addressing: every 64-bit CUDA platform).
  virtual Result<void*> allocHost(size_t bytes) = 0;
  virtual void freeHost(void* p) = 0;
  // Queues a copy between any two of host memory, pinned host memory and
  // device memory (the direction follows from the addresses).
  virtual Status copyAsync(void* dst, const void* src, size_t bytes, Stream stream) = 0;

  // Queues loom's reduction kernel on `stream`: kernels::reduce()'s
  // contract (kernels/reduce.h) on memory the device reads and writes
  // (device memory, allocHost memory). `partials` is a host array of
  // pointers, read before the call returns. More than kSourcesPerLaunch
  // sources (the local input included, last) run as several launches
  // chained through dst: then dst may alias only the first source.
  virtual Status reduceAsync(const kernels::Reduction& r, void* dst, const void* const* partials, int npartials,
                             const void* local, size_t count, bool applyPost, Stream stream) = 0;

  // Events mark a point in a stream: the host asks, without blocking,
  // whether the work queued before it has run.
  virtual Result<Event> createEvent() = 0;
  virtual void destroyEvent(Event event) = 0;
  virtual Status recordEvent(Event event, Stream stream) = 0;
  // True once the work queued before the latest recordEvent has finished
  // (and for an event never recorded).
  virtual Result<bool> eventDone(Event event) = 0;

  // Device memory shared between processes of one host (CUDA IPC): the
  // handle of an allocDevice allocation (its base), and the peer's side,
  // which maps it (not in the process that allocated it: there the pointer
  // itself is used) until ipcClose.
  virtual Result<IpcHandle> ipcHandle(void* base) = 0;
  // The allocDevice (or cudaMalloc) allocation holding `p`: its base and size.
  struct Range {
    void* base;
    size_t bytes;
  };
  virtual Result<Range> addressRange(const void* p) = 0;
  // A dma-buf file descriptor for device memory [base, base + bytes)
  // (page-aligned), which a NIC can register (GPUDirect RDMA over verbs);
  // the caller closes it. Only where the driver exports dma-bufs.
  virtual Result<int> dmabufFd(const void* base, size_t bytes) {
    return Status(Code::kCudaError, std::string(name()) + " device memory cannot be exported as a dma-buf");
  }
  virtual Result<void*> ipcOpen(const IpcHandle& handle) = 0;
  virtual void ipcClose(void* mapped) = 0;

  // Queues fn(arg) on `stream`: it runs on a thread of the runtime once the
  // work queued before it has finished, and must not call this table.
  virtual Status launchHostFunc(Stream stream, void (*fn)(void*), void* arg) = 0;
  // Queues a gate on `stream`: work queued after it starts only once
  // *word >= value. `word` is in allocHost memory; the host writes it.
  virtual Status launchGate(Stream stream, const uint64_t* word, uint64_t value) = 0;
  // The same until *word >= *target, reading *target when the gate starts
  // (a graph's gate: the host function before it sets the target of each
  // replay). Both words in allocHost memory.
  virtual Status launchGateIndirect(Stream stream, const uint64_t* word, const uint64_t* target) = 0;
  // Whether `stream` is being captured into a graph.
  virtual Result<Capture> captureStatus(Stream stream) = 0;
  // Keeps `object` alive as long as the graph being captured on `stream`
  // (and its executable instances) exist. Its destructor then runs on a
  // thread of the runtime and must not call this table.
  virtual Status retainWithGraph(Stream stream, std::shared_ptr<void> object) = 0;
};

// The table the engine uses: a test's, when one was installed; else CUDA's,
// in a build with CUDA; else nullptr (host mode only).
Api* api();
// Tests only: installs `table` (nullptr: back to the default). Not thread
// safe against concurrent api() users; call it before creating communicators.
void setApiForTesting(Api* table);

// Makes `device` the calling thread's current device while it lives, then
// puts the previous one back (an init running on the caller's thread must
// not change its device).
class ScopedDevice {
 public:
  ScopedDevice(Api* table, int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  Api* table_;
  int previous_ = -1;
  Status status_;
};

// Gate words: uint64_t counters in allocHost memory of `table` that gates
// (Api::launchGate) read. A gate queued on a user's stream may run at any
// later time, even after its communicator is gone, so a word is never
// freed and never goes backwards: its owner only raises it, and the next
// owner continues from the value it finds. The pages live as long as the
// process.
Result<uint64_t*> acquireGateWord(Api* table);
void releaseGateWord(Api* table, uint64_t* word);
// Raises *word to at least `value` (release order), never lowers it.
void raiseGateWord(uint64_t* word, uint64_t value);
uint64_t readGateWord(const uint64_t* word);

#ifdef LOOM_DEVICE_HAVE_CUDA
// CUDA's table (cuda_api.cc); one per process.
Api* cudaApi();
#endif

}  // namespace loom::device
