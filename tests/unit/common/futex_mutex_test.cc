#include "common/futex_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {
namespace {

// More threads than this machine's cores, each holding the lock across a
// yield now and then: waiters find it held and sleep, and every increment
// made under it survives.
TEST(FutexMutex, ExcludesAndWakesSleepers) {
  FutexMutex m;
  long counter = 0;  // guarded by m
  constexpr int kThreads = 6, kRounds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard<FutexMutex> lock(m);
        const long seen = counter;
        if (i % 256 == 0) std::this_thread::yield();
        counter = seen + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, long(kThreads) * kRounds);
}

// A waiter blocks for as long as the holder keeps the lock, and takes it as
// soon as it is released.
TEST(FutexMutex, WaiterBlocksUntilUnlock) {
  FutexMutex m;
  m.lock();
  EXPECT_FALSE(m.try_lock());
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    std::lock_guard<FutexMutex> lock(m);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load());
  m.unlock();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

}  // namespace
}  // namespace loom
