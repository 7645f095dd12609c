// RegistrationCache: the memory a communicator's transfers may carry as a
// registered region (transport::Transfer::region).
//
// Two kinds of entries:
//  - user registrations (ncclCommRegister): a buffer the application
//    promises to reuse. Each connection registers it on first use; the
//    regions live until ncclCommDeregister.
//  - implicit registrations: a buffer met by a transfer on a connection
//    whose backend cannot move unregistered memory
//    (Connection::needsRegistration). Registered on first use and kept,
//    least recently used first out, up to a byte budget, so that a training
//    loop that reuses its buffers registers each once.
// A connection that needs no registration and a buffer in no user
// registration cost one relaxed atomic load (find() returns null): the
// small-message path stays free of locks.
//
// Regions are per connection; drop() forgets a connection's (before it is
// destroyed). Thread-safe: registration calls may come from another thread
// than the one running operations.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/status.h"
#include "transport/transport.h"

namespace loom::core {

class RegistrationCache {
 public:
  explicit RegistrationCache(size_t implicitBudgetBytes) : budget_(implicitBudgetBytes) {}
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A user registration comes from ncclCommRegister or, as a window, from
  // ncclCommWindowRegister; each is undone only by its own call.
  enum class Kind { kBuffer, kWindow };
  // A handle for remove(), unique in the process (a handle of another
  // communicator is refused). Overlapping registrations are allowed; the
  // one registered first wins a lookup.
  uint64_t add(void* base, size_t bytes, transport::MemoryType memory, Kind kind = Kind::kBuffer);
  // ncclCommDeregister / ncclCommWindowDeregister: releases its regions on
  // every connection. Unknown handles, and handles of the other kind, are
  // an error. The caller guarantees no transfer still uses it.
  Status remove(uint64_t handle, Kind kind = Kind::kBuffer);

  // The region of `c` holding [p, p + n), registered with `c` on first use;
  // null when no registration is wanted (see above). Errors come from the
  // backend's registerMemory.
  Result<const transport::Region*> find(transport::Connection& c, const void* p, size_t n,
                                        transport::MemoryType memory);
  // Forgets the regions of `c` (it is about to be destroyed).
  void drop(const transport::Connection* c);

  struct Stats {
    uint64_t userRegistrations = 0;  // live ncclCommRegister handles
    uint64_t regions = 0;            // live regions, all connections
    uint64_t registered = 0;         // registerMemory calls so far
    uint64_t implicitBytes = 0;      // bytes of live implicit regions
    uint64_t evicted = 0;            // implicit regions evicted so far
  };
  Stats stats() const;

 private:
  struct User {
    void* base;
    size_t bytes;
    transport::MemoryType memory;
    Kind kind;
    std::map<const transport::Connection*, std::unique_ptr<transport::Region>> regions;
  };
  struct Implicit {
    const transport::Connection* conn;
    std::unique_ptr<transport::Region> region;
  };
  void evictLocked();

  const size_t budget_;
  std::atomic<bool> hasUser_{false};
  mutable std::mutex mutex_;
  std::map<uint64_t, User> users_;  // by handle: registration order
  std::list<Implicit> implicit_;    // most recently used first
  size_t implicitBytes_ = 0;
  uint64_t registered_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace loom::core
