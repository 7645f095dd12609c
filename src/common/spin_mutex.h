// A lock for short critical sections on the path of every operation (the
// communicator registry, the flight recorder): taking it is one atomic
// exchange and releasing it a plain store, where a pthread mutex costs an
// atomic each way plus a call. A waiter spins briefly, then yields; holders
// never block or run long while holding it. Meets BasicLockable and
// Lockable, so std::lock_guard and std::unique_lock take it.
#pragma once

#include <sched.h>

#include <atomic>

#include "common/cpu_relax.h"

namespace loom {

class SpinMutex {
 public:
  void lock() noexcept {
    for (int round = 0; held_.exchange(true, std::memory_order_acquire); ) {
      // Wait on a plain load (no cache line ping-pong), then try again.
      while (held_.load(std::memory_order_relaxed)) {
        if (++round < kSpins) cpuRelax();
        else sched_yield();
      }
    }
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  static constexpr int kSpins = 128;
  std::atomic<bool> held_{false};
};

}  // namespace loom
