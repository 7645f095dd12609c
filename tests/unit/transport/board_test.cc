// The shared-memory board (transport/shm/board.h): opened through /proc by
// a second mapping as another rank would, sequence words and slots seen on
// both sides, sleeping waiters woken, members that leave or die seen, and
// descriptors that do not describe the board refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/asymmetric_fence.h"
#include "transport/shm/board.h"

namespace loom::transport::shm {
namespace {

using namespace std::chrono_literals;

// Forks a process that opens the board `d` describes, joins it as member 1
// and exits with body(its board); the parent gets the child's pid.
template <typename F>
pid_t forkMember(const BoardDescriptor& d, F body) {
  const pid_t child = fork();
  if (child == 0) {
    auto mine = Board::open(d);
    if (!mine.isOk()) _exit(2);
    mine->join(1);
    _exit(body(*mine));
  }
  return child;
}

TEST(Board, MembersSeeEachOthersSlotsAndSequences) {
  auto leader = Board::create(3, 4096);
  ASSERT_TRUE(leader.isOk()) << leader.status().message();
  auto other = Board::open(leader->describe());
  ASSERT_TRUE(other.isOk()) << other.status().message();
  leader->join(0);
  other->join(2);
  EXPECT_EQ(other->members(), 3);
  EXPECT_EQ(other->slotBytes(), 4096u);
  // Distinct slots per member and per operation parity.
  EXPECT_NE(leader->data(0, 1), leader->data(0, 2));
  EXPECT_NE(leader->data(0, 1), leader->data(1, 1));
  std::memcpy(other->data(2, 1), "hello", 6);
  EXPECT_EQ(leader->seen(2), 0u);
  other->publish(2, 1);
  EXPECT_EQ(leader->seen(2), 1u);
  EXPECT_TRUE(leader->wait(2, 1, 0, 0));
  EXPECT_FALSE(leader->wait(2, 2, 10, 0));
  EXPECT_STREQ(reinterpret_cast<const char*>(leader->data(2, 1)), "hello");
  EXPECT_EQ(leader->data(2, 1 + kBoardSlots), leader->data(2, 1));  // slots are used in turn
  leader->closeShared();  // the mappings stay valid
  other->publish(2, 2);
  EXPECT_EQ(leader->seen(2), 2u);
}

// Inline lines and cells: data and stamp together per (member, turn), apart
// from the slots, from each other and from every other member's; four cells
// of consecutive operations share a line. A stamp names one operation, so
// the next use of a line or cell (inlineTurns() later) is not mistaken for
// it.
TEST(Board, InlineLinesAndCellsCarrySmallDataWithTheirStamp) {
  auto leader = Board::create(3, 4096);
  ASSERT_TRUE(leader.isOk()) << leader.status().message();
  auto other = Board::open(leader->describe());
  ASSERT_TRUE(other.isOk()) << other.status().message();
  leader->join(0);
  other->join(1);
  const std::byte* slotsBegin = leader->data(0, 0);
  const std::byte* slotsEnd = leader->data(2, kBoardSlots - 1) + 4096;
  // Every stamp and its data, as [begin, end) ranges: none overlaps another
  // or a slot.
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;
  for (InlinePlace p : {InlinePlace::kLine, InlinePlace::kCell}) {
    const size_t bytes = p == InlinePlace::kLine ? kBoardInlineBytes : kBoardCellBytes;
    SCOPED_TRACE(p == InlinePlace::kLine ? "lines" : "cells");
    EXPECT_FALSE(leader->inlineStamped(p, 1, 1, 1));  // fresh ones hold stamp 0
    for (int m = 0; m < 3; ++m) {
      for (uint64_t s = 1; s <= inlineTurns(p); ++s) {
        const std::byte* data = leader->inlineData(p, m, s);
        EXPECT_TRUE(data + bytes <= slotsBegin || data >= slotsEnd) << m << " " << s;
        ranges.emplace_back(data - 8, data + bytes);
      }
    }
    std::memcpy(other->inlineData(p, 1, 3), "inline", 7);
    EXPECT_FALSE(leader->inlineStamped(p, 1, 3, 3));
    other->stampInline(p, 1, 3, 3);
    EXPECT_TRUE(leader->inlineStamped(p, 1, 3, 3));
    EXPECT_TRUE(leader->waitInline(p, 1, 3, 3, 0));
    EXPECT_STREQ(reinterpret_cast<const char*>(leader->inlineData(p, 1, 3)), "inline");
    EXPECT_FALSE(leader->inlineStamped(p, 1, 3, 3 + inlineTurns(p)));  // the same place, a later operation
    EXPECT_FALSE(leader->waitInline(p, 1, 4, 4, 10));
    other->stampInline(p, 1, 3 + inlineTurns(p), 3 + inlineTurns(p));
    EXPECT_TRUE(leader->inlineStamped(p, 1, 3 + inlineTurns(p), 3 + inlineTurns(p)));
    EXPECT_FALSE(leader->inlineStamped(p, 1, 3, 3));
  }
  // An operation may spread its data over several lines: the place and the
  // operation a stamp names are apart.
  std::memcpy(other->inlineData(InlinePlace::kLine, 1, 5 * 7 + 4), "fifth", 6);
  other->stampInline(InlinePlace::kLine, 1, 5 * 7 + 4, 7);
  EXPECT_TRUE(leader->inlineStamped(InlinePlace::kLine, 1, 5 * 7 + 4, 7));
  EXPECT_FALSE(leader->inlineStamped(InlinePlace::kLine, 1, 7, 7));
  EXPECT_FALSE(leader->inlineStamped(InlinePlace::kLine, 1, 5 * 7 + 4, 5 * 7 + 4));
  EXPECT_STREQ(reinterpret_cast<const char*>(leader->inlineData(InlinePlace::kLine, 1, 5 * 7 + 4)), "fifth");
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first) << i;
  const auto lineOf = [&](uint64_t s) { return uintptr_t(leader->inlineData(InlinePlace::kCell, 2, s)) / 64; };
  EXPECT_EQ(lineOf(4), lineOf(7));
  EXPECT_NE(lineOf(7), lineOf(8));
  EXPECT_EQ(leader->seen(1), 0u);  // stamping is not publishing
  // The most members a board holds: their lines and cells still end before
  // the first slot.
  auto full = Board::create(kBoardMaxMembers, 4096);
  ASSERT_TRUE(full.isOk()) << full.status().message();
  EXPECT_LE(full->inlineData(InlinePlace::kCell, kBoardMaxMembers - 1, kBoardCells - 1) + kBoardCellBytes,
            full->data(0, 0));
  EXPECT_LE(full->inlineData(InlinePlace::kLine, kBoardMaxMembers - 1, kBoardInlineSlots - 1) + kBoardInlineBytes,
            full->data(0, 0));
}

TEST(Board, SleepingWaiterIsWokenByThePublisher) {
  auto leader = Board::create(2, 4096);
  ASSERT_TRUE(leader.isOk());
  auto other = Board::open(leader->describe());
  ASSERT_TRUE(other.isOk());
  std::atomic<bool> woke{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { woke = leader->wait(1, 5, 0, 5000); });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(woke.load());
  other->publish(1, 5);
  waiter.join();
  EXPECT_TRUE(woke.load());
  // Woken by the futex, not by the 5 s sleep running out.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  // A timed-out sleep says so.
  EXPECT_FALSE(leader->wait(1, 6, 0, 20));
}

// Publishing without a full fence (every member fences asymmetrically): two
// processes take turns, each sleeping on the futex until the other
// publishes. A wake-up missed would cost that round the whole 2 s sleep.
// (The race it guards against is narrow and rarely met here; the fence
// itself is tested by the store-buffer litmus in asymmetric_fence_test.cc.
// This checks the board's use of it end to end.)
TEST(Board, AsymmetricFenceLosesNoWakeUp) {
  if (!AsymmetricFence::enable(FenceScope::kProcesses)) {
    GTEST_SKIP() << "this kernel refuses membarrier(GLOBAL_EXPEDITED): the board keeps its full fence";
  }
  auto leader = Board::create(2, 4096);
  ASSERT_TRUE(leader.isOk());
  leader->join(0);
  leader->setAsymmetricFence(true);
  const BoardDescriptor d = leader->describe();
  constexpr uint64_t kRounds = 2000;
  constexpr int kSleepMs = 2000;
  const pid_t child = forkMember(d, [&](Board& mine) {
    mine.setAsymmetricFence(true);
    for (uint64_t s = 1; s <= kRounds; ++s) {
      if (!mine.wait(0, s, 0, kSleepMs)) return 3;
      mine.publish(1, s);
    }
    return 0;
  });
  ASSERT_GE(child, 0);
  double slowestS = 0;
  bool answered = true;
  for (uint64_t s = 1; s <= kRounds && answered; ++s) {
    const auto start = std::chrono::steady_clock::now();
    leader->publish(0, s);
    answered = leader->wait(1, s, 0, kSleepMs) || leader->wait(1, s, 0, kSleepMs);
    slowestS = std::max(slowestS, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(answered);
  EXPECT_LT(slowestS, 1.0) << "a round slept until its timeout: a wake-up was missed";
}

TEST(Board, MemberThatLeavesIsClosedAndWakesItsWaiters) {
  auto leader = Board::create(2, 4096);
  ASSERT_TRUE(leader.isOk());
  leader->join(0);
  std::atomic<bool> sawPublish{true};
  {
    auto other = Board::open(leader->describe());
    ASSERT_TRUE(other.isOk());
    other->join(1);
    EXPECT_FALSE(leader->closed(1));
    std::thread waiter([&] { sawPublish = leader->wait(1, 1, 0, 5000); });
    std::this_thread::sleep_for(50ms);
    // `other` is destroyed here: member 1 leaves.
    other = Result<Board>(internalError("gone"));
    waiter.join();
  }
  EXPECT_FALSE(sawPublish.load());
  EXPECT_TRUE(leader->closed(1));
  EXPECT_FALSE(leader->closed(0));
}

TEST(Board, MemberProcessThatDiesIsClosed) {
  auto leader = Board::create(2, 4096);
  ASSERT_TRUE(leader.isOk());
  leader->join(0);
  const BoardDescriptor d = leader->describe();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = forkMember(d, [&](Board&) {
    char c = 1;
    if (write(ready[1], &c, 1) != 1) return 3;
    pause();  // killed below, never leaves cleanly
    return 0;
  });
  ASSERT_GE(child, 0);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  leader->watchMembers();
  EXPECT_FALSE(leader->closed(1));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(leader->closed(1));
  EXPECT_FALSE(leader->alive(1));
  close(ready[0]);
  close(ready[1]);
}

TEST(Board, ForeignDescriptorsAreRefused) {
  auto leader = Board::create(2, 4096);
  ASSERT_TRUE(leader.isOk());
  BoardDescriptor d = leader->describe();
  BoardDescriptor bad = d;
  bad.nonce ^= 1;
  EXPECT_FALSE(Board::open(bad).isOk());
  bad = d;
  bad.members = 3;  // the size no longer matches
  EXPECT_FALSE(Board::open(bad).isOk());
  bad = d;
  bad.magic = 0;
  EXPECT_FALSE(Board::open(bad).isOk());
  bad = d;
  bad.memfd = 0;  // stdin is not the board
  EXPECT_FALSE(Board::open(bad).isOk());
  EXPECT_FALSE(Board::create(0, 4096).isOk());
  EXPECT_FALSE(Board::create(2, 100).isOk());
  EXPECT_FALSE(Board::create(kBoardMaxMembers + 1, 4096).isOk());
}

}  // namespace
}  // namespace loom::transport::shm
