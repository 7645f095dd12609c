#include "common/biased_mutex.h"

#include <sched.h>

#include <chrono>
#include <thread>

namespace loom {

void BiasedMutex::lockSlow() noexcept {
  inner_.lock();
  if (revoked_.load(std::memory_order_relaxed)) return;
  const pthread_t me = pthread_self();
  const pthread_t owner = owner_.load(std::memory_order_relaxed);
  if (owner == 0) {
    owner_.store(me, std::memory_order_relaxed);  // its next lock() takes the bias
    return;
  }
  // Another thread holds the bias: revoke it, then wait until that thread
  // is not inside (it may hold the lock for a whole collective).
  revoked_.store(true, std::memory_order_relaxed);
  while (!AsymmetricFence::heavy(FenceScope::kProcess)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; inside_.load(std::memory_order_acquire); ++i) {
    if (i < 64) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace loom
