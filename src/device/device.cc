#include "device/device.h"

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace loom::device {
namespace {

std::atomic<Api*> gTestTable{nullptr};

// One word per 128 bytes: a gate's reads never share a line with another
// communicator's writes.
constexpr size_t kWordStride = 128 / sizeof(uint64_t);
constexpr size_t kPageBytes = 4096;

struct WordPool {
  std::mutex mutex;
  std::map<Api*, std::vector<uint64_t*>> free;  // never returned to the table: see device.h
};

WordPool& pool() {
  static WordPool* p = new WordPool;  // outlives every static destructor that might release a word
  return *p;
}

}  // namespace

Api* api() {
  if (Api* t = gTestTable.load(std::memory_order_acquire)) return t;
#ifdef LOOM_DEVICE_HAVE_CUDA
  return cudaApi();
#else
  return nullptr;
#endif
}

void setApiForTesting(Api* table) { gTestTable.store(table, std::memory_order_release); }

ScopedDevice::ScopedDevice(Api* table, int device) : table_(table) {
  auto current = table_->currentDevice();
  if (!current.isOk()) {
    status_ = current.takeStatus();
    return;
  }
  if (current.value() == device) return;  // nothing to change, nothing to restore
  // A thread with no context current (one of loom's, or a user's that never
  // used CUDA) reads device 0; restoring that would create a context there.
  if (table_->contextCurrent()) previous_ = current.value();
  status_ = table_->setDevice(device);
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) (void)table_->setDevice(previous_);
}

Result<uint64_t*> acquireGateWord(Api* table) {
  WordPool& p = pool();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      std::vector<uint64_t*>& free = p.free[table];
      if (!free.empty()) {
        uint64_t* w = free.back();
        free.pop_back();
        return w;
      }
    }
    // A new page, allocated outside the lock: releaseGateWord runs on CUDA's
    // callback thread too (a graph's replay object going away), which must
    // never wait behind a driver call.
    LOOM_ASSIGN_OR_RETURN(void* page, table->allocHost(kPageBytes));
    auto* words = static_cast<uint64_t*>(page);
    std::lock_guard<std::mutex> lock(p.mutex);
    std::vector<uint64_t*>& free = p.free[table];
    for (size_t i = 0; i + kWordStride <= kPageBytes / sizeof(uint64_t); i += kWordStride) {
      words[i] = 0;
      free.push_back(words + i);
    }
  }
}

void releaseGateWord(Api* table, uint64_t* word) {
  WordPool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.free[table].push_back(word);
}

void raiseGateWord(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t> w(*word);
  uint64_t seen = w.load(std::memory_order_relaxed);
  while (seen < value && !w.compare_exchange_weak(seen, value, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

uint64_t readGateWord(const uint64_t* word) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

}  // namespace loom::device
