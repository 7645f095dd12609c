#include "common/biased_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {
namespace {

class BiasedMutexTest : public ::testing::Test {
 protected:
  // The fast path as the library runs it: a compiler barrier, with the
  // revoker's membarrier (where the kernel refuses, both are full fences).
  void SetUp() override { (void)AsymmetricFence::enable(FenceScope::kProcess); }
};

// The owner holds it through the bias; a second thread that wants it must
// wait until the owner lets go, then gets it, and the owner afterwards
// goes on through the mutex underneath.
TEST_F(BiasedMutexTest, ASecondThreadWaitsForTheOwnerToLetGo) {
  BiasedMutex m;
  long counter = 0;  // guarded by m
  for (int i = 0; i < 1000; ++i) {  // the first lock biases it to this thread
    std::lock_guard<BiasedMutex> lock(m);
    ++counter;
  }
  m.lock();
  std::atomic<bool> got{false};
  std::thread other([&] {
    std::lock_guard<BiasedMutex> lock(m);
    got = true;
    ++counter;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load());
  ++counter;
  m.unlock();
  other.join();
  EXPECT_TRUE(got.load());
  std::lock_guard<BiasedMutex> lock(m);
  EXPECT_EQ(counter, 1002);
}

// The owner runs in a loop on the fast path while other threads arrive
// and revoke the bias at some moment of it; every increment made under the
// lock survives. Many fresh mutexes, so that revocations land at many
// points of the owner's loop.
TEST_F(BiasedMutexTest, ExcludesWhileTheBiasIsRevoked) {
  constexpr int kMutexes = 200, kRounds = 2000, kOthers = 2;
  for (int round = 0; round < kMutexes; ++round) {
    BiasedMutex m;
    long counter = 0;  // guarded by m
    auto work = [&](int rounds) {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<BiasedMutex> lock(m);
        const long seen = counter;
        if (i % 512 == 0) std::this_thread::yield();
        counter = seen + 1;
      }
    };
    work(1);  // biased to this thread
    std::vector<std::thread> others;
    for (int t = 0; t < kOthers; ++t) others.emplace_back(work, kRounds / 4);
    work(kRounds);
    for (auto& t : others) t.join();
    ASSERT_EQ(counter, 1 + kRounds + long(kOthers) * (kRounds / 4)) << "mutex " << round;
  }
}

}  // namespace
}  // namespace loom
