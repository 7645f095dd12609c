#include "common/asymmetric_fence.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

namespace loom {
namespace {

// The store-buffer litmus test, one side light and the other heavy: each
// side stores its flag, fences, and loads the other's. Without the fences
// x86 lets both loads miss the other side's store; with them, at least one
// side must see the other's.
struct Litmus {
  std::atomic<int> x{0}, y{0};
  std::atomic<int> go{-1};    // the round the light side may run
  std::atomic<int> done{-1};  // the last round the light side finished
  std::atomic<int> seenY{0};  // its load, for that round
  std::atomic<bool> quit{false};  // the light side could not run
};

// Waits (spinning: the rounds are short) until `ready` holds; false when
// the other side gave up or a minute passed.
template <typename F>
bool spinUntil(const Litmus& l, F ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (unsigned n = 0; !ready(); ++n) {
    if (l.quit.load(std::memory_order_relaxed)) return false;
    if (n % 4096 == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return true;
}

void lightSide(Litmus& l, FenceScope scope, int rounds) {
  std::minstd_rand rng(7);
  for (int i = 0; i < rounds; ++i) {
    if (!spinUntil(l, [&] { return l.go.load(std::memory_order_acquire) == i; })) return;
    for (int spin = int(rng() % 64); spin > 0; --spin) std::atomic_signal_fence(std::memory_order_seq_cst);
    l.x.store(1, std::memory_order_relaxed);
    AsymmetricFence::light(scope);
    l.seenY.store(l.y.load(std::memory_order_relaxed), std::memory_order_relaxed);
    l.done.store(i, std::memory_order_release);
  }
}

// The heavy side; returns the rounds in which neither side saw the other,
// or -1 when the light side stopped or a membarrier failed.
int heavySide(Litmus& l, FenceScope scope, int rounds) {
  std::minstd_rand rng(11);
  int bad = 0;
  for (int i = 0; i < rounds; ++i) {
    l.x.store(0, std::memory_order_relaxed);
    l.y.store(0, std::memory_order_relaxed);
    l.go.store(i, std::memory_order_release);
    for (int spin = int(rng() % 256); spin > 0; --spin) std::atomic_signal_fence(std::memory_order_seq_cst);
    l.y.store(1, std::memory_order_relaxed);
    if (!AsymmetricFence::heavy(scope)) return -1;
    const int seenX = l.x.load(std::memory_order_relaxed);
    if (!spinUntil(l, [&] { return l.done.load(std::memory_order_acquire) == i; })) return -1;
    bad += seenX == 0 && l.seenY.load(std::memory_order_relaxed) == 0;
  }
  return bad;
}

constexpr int kRounds = 20000;

TEST(AsymmetricFence, ThreadsOfOneProcessNeverBothMiss) {
  if (!AsymmetricFence::enable(FenceScope::kProcess)) {
    GTEST_SKIP() << "this kernel refuses membarrier(PRIVATE_EXPEDITED): light() is a full fence here";
  }
  Litmus l;
  std::thread light([&] { lightSide(l, FenceScope::kProcess, kRounds); });
  const int bad = heavySide(l, FenceScope::kProcess, kRounds);
  light.join();
  EXPECT_EQ(bad, 0) << "rounds in which both sides missed the other's store";
}

// The board's case: the light side is another process, sharing the memory.
TEST(AsymmetricFence, ProcessesSharingMemoryNeverBothMiss) {
  if (!AsymmetricFence::enable(FenceScope::kProcesses)) {
    GTEST_SKIP() << "this kernel refuses membarrier(GLOBAL_EXPEDITED): light() is a full fence here";
  }
  void* mem = mmap(nullptr, sizeof(Litmus), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* l = new (mem) Litmus;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child inherits the registration (the kernel keeps it across
    // fork and drops it at exec; ranks that exec register for themselves).
    if (!AsymmetricFence::enable(FenceScope::kProcesses)) {
      l->quit = true;
      _exit(2);
    }
    lightSide(*l, FenceScope::kProcesses, kRounds);
    _exit(0);
  }
  const int bad = heavySide(*l, FenceScope::kProcesses, kRounds);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(bad, 0) << "rounds in which both sides missed the other's store";
  munmap(mem, sizeof(Litmus));
}

}  // namespace
}  // namespace loom
