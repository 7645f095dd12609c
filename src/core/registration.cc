#include "core/registration.h"

#include <string>

namespace loom::core {

using transport::Connection;
using transport::MemoryType;
using transport::Region;

uint64_t RegistrationCache::add(void* base, size_t bytes, MemoryType memory, Kind kind) {
  static std::atomic<uint64_t> next{1};
  const uint64_t handle = next.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  users_.emplace(handle, User{base, bytes, memory, kind, {}});
  hasUser_.store(true, std::memory_order_relaxed);
  return handle;
}

Status RegistrationCache::remove(uint64_t handle, Kind kind) {
  const bool window = kind == Kind::kWindow;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = users_.find(handle);
  if (it == users_.end()) {
    return invalidArgument(window ? "win was not returned by ncclCommWindowRegister on this communicator"
                                  : "handle was not returned by ncclCommRegister on this communicator");
  }
  if (it->second.kind != kind) {
    return invalidArgument(window ? "win is an ncclCommRegister handle: release it with ncclCommDeregister"
                                  : "handle is a window: release it with ncclCommWindowDeregister");
  }
  users_.erase(it);  // its regions deregister as they are destroyed
  hasUser_.store(!users_.empty(), std::memory_order_relaxed);
  return Status::ok();
}

Result<const Region*> RegistrationCache::find(Connection& c, const void* p, size_t n, MemoryType memory) {
  const bool implicit = c.needsRegistration();
  if (n == 0 || (!implicit && !hasUser_.load(std::memory_order_relaxed))) return static_cast<const Region*>(nullptr);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [handle, u] : users_) {
    if (u.memory != memory || !Region::spans(u.base, u.bytes, p, n)) continue;
    auto& region = u.regions[&c];
    if (!region) {
      auto r = c.registerMemory(u.base, u.bytes, memory);
      if (!r.isOk()) {
        u.regions.erase(&c);
        return r.takeStatus();
      }
      region = std::move(r.value());
      ++registered_;
    }
    return static_cast<const Region*>(region.get());
  }
  if (!implicit) return static_cast<const Region*>(nullptr);
  for (auto it = implicit_.begin(); it != implicit_.end(); ++it) {
    if (it->conn != &c || it->region->memory() != memory || !it->region->holds(p, n)) continue;
    implicit_.splice(implicit_.begin(), implicit_, it);  // most recently used
    return static_cast<const Region*>(implicit_.front().region.get());
  }
  // Exactly the transfer's bytes: the caller's allocation is unknown here.
  LOOM_ASSIGN_OR_RETURN(auto region, c.registerMemory(const_cast<void*>(p), n, memory));
  ++registered_;
  implicitBytes_ += region->bytes();  // what eviction subtracts
  implicit_.push_front(Implicit{&c, std::move(region)});
  evictLocked();
  return static_cast<const Region*>(implicit_.front().region.get());
}

// Oldest first, never the entry just added.
void RegistrationCache::evictLocked() {
  while (implicitBytes_ > budget_ && implicit_.size() > 1) {
    implicitBytes_ -= implicit_.back().region->bytes();
    implicit_.pop_back();
    ++evicted_;
  }
}

void RegistrationCache::drop(const Connection* c) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [handle, u] : users_) u.regions.erase(c);
  for (auto it = implicit_.begin(); it != implicit_.end();) {
    if (it->conn == c) {
      implicitBytes_ -= it->region->bytes();
      it = implicit_.erase(it);
    } else {
      ++it;
    }
  }
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s;
  s.userRegistrations = users_.size();
  for (const auto& [handle, u] : users_) s.regions += u.regions.size();
  s.regions += implicit_.size();
  s.registered = registered_;
  s.implicitBytes = implicitBytes_;
  s.evicted = evicted_;
  return s;
}

}  // namespace loom::core
