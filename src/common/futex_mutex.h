// A mutex for locks that every call takes but that may be held long (a
// communicator's operation lock: held for a whole collective). Uncontended,
// locking is one compare-exchange and unlocking one exchange, inline, where
// a pthread mutex spends some fifty instructions in calls; a waiter sleeps on
// a private futex instead of spinning. The word is 0 (free), 1 (held) or 2
// (held, and someone may be sleeping: unlock then wakes one). Meets
// BasicLockable and Lockable, so std::lock_guard and std::unique_lock take it.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace loom {

class FutexMutex {
 public:
  void lock() noexcept {
    int expected = 0;
    if (!word_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) lockSlow(expected);
  }
  bool try_lock() noexcept {
    int expected = 0;
    return word_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (word_.exchange(0, std::memory_order_release) == 2) wakeOne();
  }

 private:
  void lockSlow(int seen) noexcept {
    // Mark the word contended before sleeping, so that the holder's unlock
    // wakes a sleeper; whoever takes it this way keeps the mark (a spurious
    // wake at worst).
    if (seen != 2) seen = word_.exchange(2, std::memory_order_acquire);
    while (seen != 0) {
      ::syscall(SYS_futex, reinterpret_cast<int*>(&word_), FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
      seen = word_.exchange(2, std::memory_order_acquire);
    }
  }
  void wakeOne() noexcept {
    ::syscall(SYS_futex, reinterpret_cast<int*>(&word_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

  static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
  std::atomic<int> word_{0};
};

}  // namespace loom
