// Pins (CommRef): what keeps a communicator alive while a call other than a
// data call, a group or a job uses it, and the spin lock that guards the
// registry and the flight recorder.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/spin_mutex.h"
#include "core/communicator.h"

namespace loom::core {
namespace {

TEST(Pins, CloseWaitsForTheLastPinAndRefusesNewOnes) {
  auto c = std::make_unique<Communicator>(CommOptions{});
  ASSERT_TRUE(c->tryPin());
  c->addPin();
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    EXPECT_TRUE(c->closeAndWait(30));
    closed = true;
  });
  // Closing has begun once new pins are refused.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (c->tryPin()) {
    c->unpin();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "close never began refusing pins";
    std::this_thread::yield();
  }
  c->unpin();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(closed.load()) << "close returned with a pin still held";
  c->unpin();
  closer.join();
  EXPECT_TRUE(closed.load());
  EXPECT_FALSE(c->tryPin());
}

TEST(Pins, CloseGivesUpAfterItsTimeout) {
  auto c = std::make_unique<Communicator>(CommOptions{});
  ASSERT_TRUE(c->tryPin());
  EXPECT_FALSE(c->closeAndWait(0.05));
  c->unpin();
  EXPECT_TRUE(c->closeAndWait(1));
}

// Many threads pinning and unpinning while one closes: close returns only
// when every pin is gone, and no pin is taken after it began.
TEST(Pins, ManyThreadsAgainstOneClose) {
  auto c = std::make_unique<Communicator>(CommOptions{});
  std::atomic<bool> closing{false};
  std::atomic<int> lateTaken{0}, held{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 4; ++t) {
    users.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        const bool after = closing.load();
        if (!c->tryPin()) continue;
        ++held;
        if (after) ++lateTaken;
        std::this_thread::yield();
        --held;
        c->unpin();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(c->closeAndWait(30));
  EXPECT_EQ(held.load(), 0) << "close returned while pins were held";
  closing = true;
  for (auto& u : users) u.join();
  EXPECT_EQ(lateTaken.load(), 0);
}

TEST(SpinMutexTest, ExcludesAndTries) {
  SpinMutex m;
  int64_t counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50000; ++i) {
        std::lock_guard<SpinMutex> lock(m);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, 4 * 50000);
  ASSERT_TRUE(m.try_lock());
  EXPECT_FALSE(m.try_lock());
  m.unlock();
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

}  // namespace
}  // namespace loom::core
