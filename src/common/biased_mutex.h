// A mutex biased towards the first thread that takes it (a communicator's
// operation lock: nearly always taken by one thread, once per call). That
// thread locks and unlocks with plain stores and a compiler barrier. Any
// atomic read-modify-write, as a plain mutex makes, is a full fence on
// x86: it waits until every earlier store has reached its cache line, and
// on a tiny collective those are the flags and data its peers are reading,
// a cross-core transfer on every call.
//
// The first other thread to lock it revokes the bias for good: it marks
// the mutex revoked, makes the owner's stores visible with a heavy
// asymmetric fence (membarrier), and waits until the owner is not inside.
// From then on every thread takes the futex mutex underneath. Meets
// BasicLockable (std::lock_guard, std::unique_lock).
#pragma once

#include <pthread.h>

#include <atomic>

#include "common/asymmetric_fence.h"
#include "common/futex_mutex.h"

namespace loom {

class BiasedMutex {
 public:
  void lock() noexcept {
    if (owner_.load(std::memory_order_relaxed) == pthread_self() && !revoked_.load(std::memory_order_relaxed)) {
      // Dekker's pattern with the revoker (lockSlow): each stores its flag,
      // fences, then looks at the other's; at least one sees the other.
      inside_.store(true, std::memory_order_relaxed);
      AsymmetricFence::light(FenceScope::kProcess);
      if (!revoked_.load(std::memory_order_relaxed)) {
        biased_ = true;
        return;
      }
      inside_.store(false, std::memory_order_release);
    }
    lockSlow();
  }
  void unlock() noexcept {
    if (biased_) {
      biased_ = false;
      inside_.store(false, std::memory_order_release);
      return;
    }
    inner_.unlock();
  }

 private:
  void lockSlow() noexcept;

  static_assert(std::atomic<pthread_t>::is_always_lock_free);
  std::atomic<pthread_t> owner_{0};     // the thread it is biased to (0: none yet)
  std::atomic<bool> inside_{false};     // the owner holds it through the bias
  std::atomic<bool> revoked_{false};    // the bias is gone: everyone takes inner_
  bool biased_ = false;                 // the holder's: taken through the bias
  FutexMutex inner_;
};

}  // namespace loom
