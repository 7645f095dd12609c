#include "emulated_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <execinfo.h>
#include <cstring>
#include <random>
#include <vector>

namespace loom::test {
namespace {

constexpr uintptr_t kDeviceTag = uintptr_t(1) << 61;
constexpr uint32_t kIpcMagic = 0x50494d45;  // "EMIP"

struct IpcFields {
  uint32_t magic;
  uint32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t bytes;
};
static_assert(sizeof(IpcFields) <= sizeof(device::IpcHandle));

size_t pageRound(size_t bytes) { return (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096; }
thread_local int tCurrentDevice = 0;

}  // namespace

struct EmulatedDevice::EventState {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> reached{0};
};

struct EmulatedDevice::Queue {
  explicit Queue(int maxDelayUs, uint64_t seed) : maxDelayUs(maxDelayUs), rng(seed) {
    worker = std::thread([this] { run(); });
  }
  ~Queue() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (capturing) {
        captured->items.push_back(std::move(f));
        return;
      }
      items.push_back(std::move(f));
      ++queued;
    }
    cv.notify_all();
  }
  void waitIdle() {
    std::unique_lock<std::mutex> lock(mutex);
    const uint64_t target = queued;
    cv.wait(lock, [&] { return finished >= target; });
  }
  // What is queued now: finished once finished() reaches it.
  uint64_t mark() {
    std::lock_guard<std::mutex> lock(mutex);
    return queued;
  }
  bool reached(uint64_t target, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_until(lock, deadline, [&] { return finished >= target; });
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mutex);
    return size_t(queued - finished);
  }
  void run() {
    for (;;) {
      std::function<void()> f;
      int delay = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stop || !items.empty(); });
        if (items.empty()) return;  // stopping, and nothing left
        f = std::move(items.front());
        items.pop_front();
        delay = maxDelayUs > 0 ? int(rng() % uint64_t(maxDelayUs + 1)) : 0;
      }
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      f();
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++finished;
      }
      cv.notify_all();
    }
  }

  const int maxDelayUs;
  int device = 0;  // current at createStream (the legacy stream: any)
  std::mt19937_64 rng;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<void()>> items;
  uint64_t queued = 0, finished = 0;
  bool stop = false;
  bool capturing = false;
  std::shared_ptr<Graph> captured;
  std::thread worker;
};

EmulatedDevice::EmulatedDevice(Options options)
    : options_(options), defaultStream_(std::make_shared<Queue>(options.maxDelayUs, 1)) {}

EmulatedDevice::~EmulatedDevice() {
  streams_.clear();
  defaultStream_.reset();
  for (auto& [p, a] : allocations_) {
    if (a.fd >= 0) {
      ::munmap(p, pageRound(a.bytes));
      ::close(a.fd);
    } else {
      std::free(p);
    }
  }
  for (auto& [p, bytes] : opened_) ::munmap(p, bytes);
}

EmulatedDevice::Queue* EmulatedDevice::queueOf(device::Stream stream) {
  if (!stream) return defaultStream_.get();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? nullptr : it->second.get();
}

Result<int> EmulatedDevice::currentDevice() { return tCurrentDevice; }

Status EmulatedDevice::setDevice(int device) {
  if (device < 0 || device >= options_.devices) return invalidArgument("no emulated device " + std::to_string(device));
  tCurrentDevice = device;
  return Status::ok();
}

Result<std::string> EmulatedDevice::deviceUuid(int device) {
  char hex[33];
  std::snprintf(hex, sizeof hex, "%032x", device + 1);
  return std::string(hex);
}

// Emulated devices sit at bus ids no topology lists: ranks on them are
// placed by their NUMA node alone.
Result<std::string> EmulatedDevice::pciBusId(int device) {
  char id[32];
  std::snprintf(id, sizeof id, "00ee:%02x:00.0", device & 0xff);
  return std::string(id);
}

Result<device::Stream> EmulatedDevice::createStream() {
  static std::atomic<uint64_t> seeds{100};
  auto q = std::make_shared<Queue>(options_.maxDelayUs, seeds++);
  void* handle = q.get();
  std::lock_guard<std::mutex> lock(mutex_);
  q->device = tCurrentDevice;
  streams_[handle] = std::move(q);
  return handle;
}

Status EmulatedDevice::onCurrentDevice(device::Stream stream, const char* what) {
  const Queue* q = stream ? queueOf(stream) : nullptr;
  if (!q || q->device == tCurrentDevice) return Status::ok();
  return Status(Code::kCudaError, std::string("emulated ") + what + ": the stream belongs to device " +
                                      std::to_string(q->device) + " while device " + std::to_string(tCurrentDevice) +
                                      " is current (a kernel launch fails so on a GPU)");
}

void EmulatedDevice::destroyStream(device::Stream stream) {
  std::shared_ptr<Queue> q;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    q = std::move(it->second);
    streams_.erase(it);
  }
  // As cudaStreamDestroy: queued work still runs; the worker finishes it.
}

// cudaFree and cudaFreeHost wait until the device has finished everything
// queued before them, on every stream, and CUDA lists allocating device or
// pinned memory among the calls that synchronize implicitly too; mapping and
// unmapping a peer's memory change the same page tables. Whether a driver
// really waits in each case varies, so the emulation assumes it does: made
// while a gate waits for loom, these calls would hang on a GPU. Here the
// wait is bounded and a hang is reported as a crash, so the tests catch it.
void EmulatedDevice::implicitSynchronize(const char* call) {
  std::vector<std::pair<std::shared_ptr<Queue>, uint64_t>> marks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [handle, q] : streams_) marks.emplace_back(q, q->mark());
  }
  marks.emplace_back(defaultStream_, defaultStream_->mark());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (auto& [q, target] : marks) {
    if (q->reached(target, deadline)) continue;
    std::fprintf(stderr,
                 "emulated device: %s waited 30 s for a stream's earlier work (a gate, say) to finish; on a "
                 "GPU this call synchronizes the device and would hang here. Called from:\n",
                 call);
    void* frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);  // addr2line -e <binary> names the offsets
    std::abort();
  }
}

Status EmulatedDevice::synchronize(device::Stream stream) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  q->waitIdle();
  return Status::ok();
}

Result<void*> EmulatedDevice::allocDevice(size_t bytes) {
  implicitSynchronize("allocDevice (cudaMalloc)");
  const int fd = ::memfd_create("loom-emulated-device", MFD_CLOEXEC);
  if (fd < 0) return systemError("emulated device allocation: memfd_create failed");
  void* p = MAP_FAILED;
  if (::ftruncate(fd, off_t(pageRound(bytes))) == 0)
    p = ::mmap(nullptr, pageRound(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return systemError("emulated device allocation of " + std::to_string(bytes) + " bytes failed");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_[p] = Allocation{bytes, fd};
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kDeviceTag);
}

void EmulatedDevice::loadOnFirstLaunch(int device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (loaded_.count(device)) return;
  }
  implicitSynchronize("loading kernels at their first launch (CUDA's lazy loading)");
  std::lock_guard<std::mutex> lock(mutex_);
  loaded_.insert(device);
}

Status EmulatedDevice::loadKernels(int device) {
  loadOnFirstLaunch(device);
  return Status::ok();
}

void EmulatedDevice::freeDevice(void* p) {
  if (!p) return;
  implicitSynchronize("freeDevice (cudaFree)");
  void* host = hostView(p);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(host);
  if (it == allocations_.end() || it->second.fd < 0) return;
  ::munmap(host, pageRound(it->second.bytes));
  ::close(it->second.fd);
  allocations_.erase(it);
}

Result<device::IpcHandle> EmulatedDevice::ipcHandle(void* base) {
  if (refuseExport_.load()) {
    return Status(Code::kCudaError, "emulated ipcHandle: this memory cannot be exported (as cudaMallocAsync's)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(hostView(base));
  if (!isDevicePointer(base) || it == allocations_.end()) {
    return invalidArgument("emulated ipcHandle: not the base of a device allocation");
  }
  IpcFields f{kIpcMagic, uint32_t(::getpid()), it->second.fd, 0, it->second.bytes};
  device::IpcHandle h{};
  std::memcpy(h.data(), &f, sizeof f);
  return h;
}

Result<device::Api::Range> EmulatedDevice::addressRange(const void* p) {
  const auto* host = static_cast<const char*>(hostView(p));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.upper_bound(const_cast<char*>(host));
  if (isDevicePointer(p) && it != allocations_.begin()) {
    --it;
    const auto* base = static_cast<const char*>(it->first);
    if (it->second.fd >= 0 && host < base + std::max<size_t>(it->second.bytes, 1)) {
      return Range{reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(it->first) | kDeviceTag), it->second.bytes};
    }
  }
  return Status(Code::kCudaError, "emulated addressRange: not device memory");
}

Result<void*> EmulatedDevice::ipcOpen(const device::IpcHandle& handle) {
  IpcFields f{};
  std::memcpy(&f, handle.data(), sizeof f);
  if (f.magic != kIpcMagic) return invalidArgument("emulated ipcOpen: not an emulated IPC handle");
  if (!options_.ipcWorks) return Status(Code::kCudaError, "emulated ipcOpen: IPC is switched off for this test");
  implicitSynchronize("ipcOpen (cudaIpcOpenMemHandle)");
  const std::string path = "/proc/" + std::to_string(f.pid) + "/fd/" + std::to_string(f.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return systemError("emulated ipcOpen: cannot open " + path);
  void* p = ::mmap(nullptr, pageRound(f.bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return systemError("emulated ipcOpen: cannot map " + path);
  std::lock_guard<std::mutex> lock(mutex_);
  opened_[p] = pageRound(f.bytes);
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kDeviceTag);
}

void EmulatedDevice::ipcClose(void* mapped) {
  implicitSynchronize("ipcClose (cudaIpcCloseMemHandle)");
  void* host = hostView(mapped);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = opened_.find(host);
  if (it == opened_.end()) return;
  ::munmap(host, it->second);
  opened_.erase(it);
}

Result<void*> EmulatedDevice::allocHost(size_t bytes) {
  implicitSynchronize("allocHost (cudaMallocHost)");
  void* p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (!p) return systemError("emulated pinned allocation failed");
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_[p] = Allocation{bytes, -1};
  return p;
}

void EmulatedDevice::freeHost(void* p) {
  if (!p) return;
  implicitSynchronize("freeHost (cudaFreeHost)");
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(p);
  if (it == allocations_.end() || it->second.fd >= 0) return;
  allocations_.erase(it);
  std::free(p);
}

Status EmulatedDevice::copyAsync(void* dst, const void* src, size_t bytes, device::Stream stream) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  if (bytes == 0) return Status::ok();
  q->push([d = hostView(dst), s = hostView(src), bytes] { std::memmove(d, s, bytes); });
  return Status::ok();
}

Status EmulatedDevice::reduceAsync(const kernels::Reduction& r, void* dst, const void* const* partials,
                                   int npartials, const void* local, size_t count, bool applyPost,
                                   device::Stream stream) {
  loadOnFirstLaunch(tCurrentDevice);
  LOOM_TRY(onCurrentDevice(stream, "reduce kernel"));
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  if (npartials < 0) return invalidArgument("emulated reduce: bad source count");
  // As the CUDA launcher does (kernels/cuda/cuda_kernels.cc): at most 8
  // sources a launch, the local input last; after the first launch dst
  // carries the chain (rounded to the type in between).
  constexpr int kPerLaunch = 8;
  const int nsources = npartials + (local ? 1 : 0);
  void* d = hostView(dst);
  int next = 0;
  while (next < nsources) {
    std::vector<const void*> sources;
    if (next > 0) sources.push_back(d);
    const void* last = nullptr;
    while (next < nsources && int(sources.size()) + (last ? 1 : 0) < kPerLaunch) {
      if (next < npartials) sources.push_back(hostView(partials[next]));
      else last = hostView(local);
      ++next;
    }
    const bool post = next == nsources && applyPost;
    ++reduceLaunches_;
    q->push([r, d, sources, last, count, post] {
      kernels::reduce(r, d, sources.data(), int(sources.size()), last, count, post);
    });
  }
  return Status::ok();
}

Result<device::Event> EmulatedDevice::createEvent() {
  auto e = std::make_shared<EventState>();
  void* handle = e.get();
  std::lock_guard<std::mutex> lock(mutex_);
  events_[handle] = std::move(e);
  return handle;
}

void EmulatedDevice::destroyEvent(device::Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.erase(event);
}

Status EmulatedDevice::recordEvent(device::Event event, device::Stream stream) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  std::shared_ptr<EventState> e;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = events_.find(event);
    if (it == events_.end()) return invalidArgument("unknown emulated event");
    e = it->second;
  }
  const uint64_t mark = ++e->recorded;
  q->push([e, mark] {
    uint64_t seen = e->reached.load();
    while (seen < mark && !e->reached.compare_exchange_weak(seen, mark)) {
    }
  });
  return Status::ok();
}

Result<bool> EmulatedDevice::eventDone(device::Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return invalidArgument("unknown emulated event");
  return it->second->reached.load() >= it->second->recorded.load();
}

Status EmulatedDevice::launchHostFunc(device::Stream stream, void (*fn)(void*), void* arg) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  q->push([fn, arg] { fn(arg); });
  return Status::ok();
}

Status EmulatedDevice::launchGate(device::Stream stream, const uint64_t* word, uint64_t value) {
  loadOnFirstLaunch(tCurrentDevice);
  LOOM_TRY(onCurrentDevice(stream, "gate kernel"));
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  q->push([word, value] {
    while (device::readGateWord(word) < value) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  return Status::ok();
}

Status EmulatedDevice::launchGateIndirect(device::Stream stream, const uint64_t* word, const uint64_t* target) {
  loadOnFirstLaunch(tCurrentDevice);
  LOOM_TRY(onCurrentDevice(stream, "gate kernel"));
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  q->push([word, target] {
    const uint64_t value = device::readGateWord(target);
    while (device::readGateWord(word) < value) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  return Status::ok();
}

Status EmulatedDevice::retainWithGraph(device::Stream stream, std::shared_ptr<void> object) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  std::lock_guard<std::mutex> lock(q->mutex);
  if (!q->capturing) return Status(Code::kInvalidUsage, "the stream is not being captured");
  q->captured->retained.push_back(std::move(object));
  return Status::ok();
}

Result<device::Capture> EmulatedDevice::captureStatus(device::Stream stream) {
  Queue* q = queueOf(stream);
  if (!q) return invalidArgument("unknown emulated stream");
  std::lock_guard<std::mutex> lock(q->mutex);
  return q->capturing ? device::Capture::kActive : device::Capture::kNone;
}

void EmulatedDevice::launch(device::Stream stream, std::function<void()> work) {
  if (Queue* q = queueOf(stream)) q->push(std::move(work));
}

void* EmulatedDevice::hostView(const void* p) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~kDeviceTag);
}

bool EmulatedDevice::isDevicePointer(const void* p) { return (reinterpret_cast<uintptr_t>(p) & kDeviceTag) != 0; }

void EmulatedDevice::beginCapture(device::Stream stream) {
  Queue* q = queueOf(stream);
  std::lock_guard<std::mutex> lock(q->mutex);
  q->capturing = true;
  q->captured = std::make_shared<Graph>();
}

std::shared_ptr<EmulatedDevice::Graph> EmulatedDevice::endCapture(device::Stream stream) {
  Queue* q = queueOf(stream);
  std::lock_guard<std::mutex> lock(q->mutex);
  q->capturing = false;
  return std::move(q->captured);
}

void EmulatedDevice::launchGraph(const Graph& graph, device::Stream stream) {
  Queue* q = queueOf(stream);
  for (const auto& item : graph.items) q->push(item);
}

size_t EmulatedDevice::pending(device::Stream stream) {
  Queue* q = queueOf(stream);
  return q ? q->pending() : 0;
}

size_t EmulatedDevice::liveEvents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

size_t EmulatedDevice::liveAllocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_.size() + opened_.size();
}

}  // namespace loom::test
