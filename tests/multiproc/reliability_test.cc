// Reliability through the public API (ranks as threads of this process):
// each test pins one fault that a review of the library found, and fails
// (or crashes, or hangs until its bound, or is flagged by ASan/TSan) on the
// code before its fix.
//
//  - teardown racing calls: abort and destroy of one handle from several
//    threads while calls use it (use after free / double free before);
//  - abort of a communicator whose non-blocking split waits for a peer, and
//    of the parent of such a split (blocked for the init timeout before);
//  - two splits of one parent in one group, blocking and non-blocking
//    (matched by thread scheduling before);
//  - a send to a peer that is gone (blocked for the init timeout, with the
//    watchdog's ncclCommGetAsyncError blocked too, before);
//  - a split whose peers failed (waited for the init timeout before);
//  - a grouped init whose sibling fails (waited for the root's deadline);
//  - NCCL_COMM_ID rank 0 failing, then retrying on the same port
//    (EADDRINUSE before); a unique id nobody uses (its root never ended);
//  - ncclResetDebugInit racing setting reads (ASan: use after free before);
//  - fork() after init: the child cannot use, destroy or abort inherited
//    communicators, and the parent's keep working (broken before).
//
// Time bounds here tell "ends" from "hangs"; they are far above what the
// paths need.
#include <gtest/gtest.h>
#include <nccl.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "mp_util.h"

namespace loom::test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kEndsWithinS = 15;

bool namesRank(const std::string& text, int rank) {
  return std::regex_search(text, std::regex("rank " + std::to_string(rank) + "([^0-9]|$)"));
}

// Threads of this process named `name` (loom names its threads).
int threadsNamed(const std::string& name) {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string text;
      std::getline(comm, text);
      n += text == name;
    }
    closedir(d);
  }
  return n;
}

std::vector<ncclComm_t> initAll(int n) {
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  return comms;
}

// All ranks AllReduce `count` ints (rank + 1 each) and check the sum.
void allReduceOk(const std::vector<ncclComm_t>& comms, size_t count = 1000) {
  const int n = int(comms.size());
  onRanks(n, [&](int r) {
    std::vector<int32_t> x(count, r + 1), y(count, -1);
    ASSERT_EQ(ncclAllReduce(x.data(), y.data(), count, ncclInt32, ncclSum, comms[size_t(r)], nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], n * (n + 1) / 2) << "rank " << r << " element " << i;
  });
}

// Abort and destroy race each other while both ranks keep calling
// collectives and queries on the communicators; exactly one teardown wins,
// the loser and every later call get ncclInvalidArgument, and nothing
// crashes (ASan: no use after free, no double free).
TEST(Reliability, TeardownRacesCallsAndOtherTeardowns) {
  for (int round = 0; round < 20; ++round) {
    auto comms = initAll(2);
    std::atomic<bool> stop{false};
    auto user = [&](ncclComm_t c) {
      std::vector<float> x(4096, 1.0f), y(4096);
      int count = 0;
      while (!stop.load()) {
        // Either runs, fails (peer gone, aborted), or finds a dead handle:
        // all must be safe.
        ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, c, nullptr);
        ncclResult_t err;
        ncclCommGetAsyncError(c, &err);
        ncclCommCount(c, &count);
        void* handle = nullptr;
        if (ncclCommRegister(c, x.data(), x.size() * sizeof(float), &handle) == ncclSuccess)
          ncclCommDeregister(c, handle);
      }
    };
    std::thread u0(user, comms[0]), u1(user, comms[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 5 * 10));
    ncclResult_t rcAbort = ncclSuccess, rcDestroy = ncclSuccess;
    std::thread aborter([&] { rcAbort = ncclCommAbort(comms[0]); });
    std::thread destroyer([&] { rcDestroy = ncclCommDestroy(comms[0]); });
    aborter.join();
    destroyer.join();
    stop = true;
    u0.join();
    u1.join();
    EXPECT_TRUE((rcAbort == ncclSuccess) != (rcDestroy == ncclSuccess))
        << "abort " << rcAbort << ", destroy " << rcDestroy << ": exactly one teardown must win";
    EXPECT_TRUE(rcAbort == ncclInvalidArgument || rcDestroy == ncclInvalidArgument);
    int count = 0;
    EXPECT_EQ(ncclCommCount(comms[0], &count), ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  }
}

// ncclCommAbort while another thread is blocked in a collective that its
// peer never joins, and a third keeps querying: abort returns and releases
// the blocked call within a second.
TEST(Reliability, AbortReleasesABlockedCallWithinASecond) {
  for (int round = 0; round < 10; ++round) {
    auto comms = initAll(2);
    std::atomic<bool> returned{false}, stop{false};
    std::thread blocked([&] {
      std::vector<float> x(1 << 16, 1.0f), y(1 << 16);
      ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comms[0], nullptr);
      returned = true;
    });
    std::thread querier([&] {
      int count;
      while (!stop.load()) ncclCommCount(comms[0], &count);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + round * 10));
    EXPECT_FALSE(returned.load());
    const auto t0 = Clock::now();
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
    const double abortS = secondsSince(t0);
    blocked.join();
    const double releaseS = secondsSince(t0);
    stop = true;
    querier.join();
    EXPECT_LT(abortS, 1.0);
    EXPECT_LT(releaseS, 1.0);
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  }
}

// Destroying a communicator whose operations the calling thread's open
// group still holds is refused (it would free what the group will use).
TEST(Reliability, DestroyInsideTheGroupThatHoldsItsOperationsIsRefused) {
  auto comms = initAll(2);
  std::vector<float> x(64, 1.0f), y0(64), y1(64);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(x.data(), y0.data(), 64, ncclFloat32, ncclSum, comms[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(x.data(), y1.data(), 64, ncclFloat32, ncclSum, comms[1], nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclGroupEnd"), std::string::npos);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(y0[0], 2.0f);
  EXPECT_EQ(y1[0], 2.0f);
  for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

ncclConfig_t nonBlocking() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Rank 0 starts a non-blocking split that rank 1 never joins: aborting the
// child, or the parent, releases it at once.
TEST(Reliability, AbortEndsANonBlockingSplitWaitingForItsPeer) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=60"});
  for (bool abortParent : {false, true}) {
    SCOPED_TRACE(abortParent ? "abort the parent" : "abort the child");
    auto comms = initAll(2);
    ncclConfig_t config = nonBlocking();
    ncclComm_t child = nullptr;
    ncclResult_t rc = ncclCommSplit(comms[0], 0, 0, &child, &config);
    ASSERT_TRUE(rc == ncclInProgress || rc == ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_NE(child, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(child, &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "the split finished although rank 1 never called it";
    const auto t0 = Clock::now();
    if (abortParent) {
      EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess) << ncclGetLastError(nullptr);
      EXPECT_LT(secondsSince(t0), kEndsWithinS);
      // The child's setup was aborted with its parent: it reports an error.
      for (int i = 0; i < 200 && state == ncclInProgress; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ASSERT_EQ(ncclCommGetAsyncError(child, &state), ncclSuccess);
      }
      EXPECT_NE(state, ncclInProgress);
      EXPECT_NE(state, ncclSuccess);
      EXPECT_EQ(ncclCommAbort(child), ncclSuccess);
    } else {
      EXPECT_EQ(ncclCommAbort(child), ncclSuccess) << ncclGetLastError(nullptr);
      EXPECT_LT(secondsSince(t0), kEndsWithinS);
      EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
    }
    EXPECT_LT(secondsSince(t0), kEndsWithinS);
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  }
}

// Several threads wait for one non-blocking init at once (each call on a
// communicator whose init is pending waits for it); they used to race to
// join the init thread.
TEST(Reliability, ManyThreadsWaitForOneNonBlockingInit) {
  for (int round = 0; round < 5; ++round) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = nonBlocking();
    ncclComm_t a = nullptr, b = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&a, 2, id, 0, &config), ncclInProgress);
    std::vector<ncclResult_t> rc(6, ncclInternalError);
    std::vector<std::thread> waiters;
    for (size_t i = 0; i < rc.size(); ++i) waiters.emplace_back([&, i] { rc[i] = ncclCommFinalize(a); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(ncclCommInitRankConfig(&b, 2, id, 1, &config), ncclInProgress);
    for (auto& t : waiters) t.join();
    for (ncclResult_t r : rc) EXPECT_EQ(r, ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(ncclCommFinalize(b), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(a), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(b), ncclSuccess);
  }
}

// A thread waits for a non-blocking init whose peer never comes; abort from
// another thread returns, and releases the waiter, within a second.
TEST(Reliability, AbortReleasesAThreadWaitingForAnInit) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=60"});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = nonBlocking();
  ncclComm_t a = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&a, 2, id, 0, &config), ncclInProgress);
  ncclResult_t rc = ncclSuccess;
  Clock::time_point returnedAt{};
  std::thread waiter([&] {
    float x = 1, y = 0;
    rc = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, a, nullptr);  // waits for the init first
    returnedAt = Clock::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(a), ncclSuccess);
  const double abortS = secondsSince(t0);
  waiter.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(abortS, 1.0);
  EXPECT_LT(std::chrono::duration<double>(returnedAt - t0).count(), 1.0);
}

// A thread is blocked in a (blocking) ncclCommSplit that the other rank
// never calls; aborting the parent from another thread releases it and
// returns within a second.
TEST(Reliability, AbortReleasesAThreadBlockedInASplit) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=60"});
  auto comms = initAll(2);
  ncclResult_t rc = ncclSuccess;
  Clock::time_point returnedAt{};
  std::thread splitter([&] {
    ncclComm_t child = nullptr;
    rc = ncclCommSplit(comms[0], 0, 0, &child, nullptr);
    returnedAt = Clock::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  const double abortS = secondsSince(t0);
  splitter.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(abortS, 1.0);
  EXPECT_LT(std::chrono::duration<double>(returnedAt - t0).count(), 1.0);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
}

// Two splits of one parent in one group: every rank must get the same pair,
// in call order, whatever order their threads run in.
void twoSplitsInOneGroup(bool blocking) {
  const int n = 4;
  auto comms = initAll(n);
  std::vector<ncclComm_t> all(n), halves(n);
  onRanks(n, [&](int r) {
    ncclConfig_t config = blocking ? ncclConfig_t(NCCL_CONFIG_INITIALIZER) : nonBlocking();
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ncclResult_t a = ncclCommSplit(comms[size_t(r)], 7, n - r, &all[size_t(r)], &config);
    ncclResult_t b = ncclCommSplit(comms[size_t(r)], r % 2, r, &halves[size_t(r)], &config);
    ncclResult_t e = ncclGroupEnd();
    ASSERT_TRUE(a == ncclSuccess || a == ncclInProgress) << ncclGetLastError(nullptr);
    ASSERT_TRUE(b == ncclSuccess || b == ncclInProgress) << ncclGetLastError(nullptr);
    ASSERT_TRUE(e == ncclSuccess || e == ncclInProgress) << ncclGetLastError(nullptr);
    for (ncclComm_t c : {all[size_t(r)], halves[size_t(r)]}) {
      ncclResult_t state = ncclInProgress;
      const auto t0 = Clock::now();
      while (state == ncclInProgress && secondsSince(t0) < 60) {
        ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_EQ(state, ncclSuccess) << ncclGetLastError(nullptr);
    }
    int count = 0, rank = -1;
    ASSERT_EQ(ncclCommCount(all[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(count, n);
    ASSERT_EQ(ncclCommUserRank(all[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(rank, n - 1 - r);  // keys n - r order the ranks backwards
    ASSERT_EQ(ncclCommCount(halves[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(count, n / 2);
    ASSERT_EQ(ncclCommUserRank(halves[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(rank, r / 2);
  });
  // The members really are those: sums over each communicator.
  onRanks(n, [&](int r) {
    int32_t one = 1, sum = 0, mine = r, half = 0;
    EXPECT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, all[size_t(r)], nullptr), ncclSuccess);
    EXPECT_EQ(sum, n);
    EXPECT_EQ(ncclAllReduce(&mine, &half, 1, ncclInt32, ncclSum, halves[size_t(r)], nullptr), ncclSuccess);
    EXPECT_EQ(half, r % 2 == 0 ? 0 + 2 : 1 + 3);
  });
  for (auto* v : {&all, &halves, &comms})
    for (ncclComm_t c : *v) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(Reliability, TwoBlockingSplitsInOneGroupMatchByCallOrder) {
  for (int i = 0; i < 10; ++i) twoSplitsInOneGroup(true);
}

TEST(Reliability, TwoNonBlockingSplitsInOneGroupMatchByCallOrder) {
  for (int i = 0; i < 10; ++i) twoSplitsInOneGroup(false);
}

// A non-blocking split followed at once by collectives on the parent (no
// wait for the split): no deadlock, the collectives run after the split's
// exchange on every rank.
TEST(Reliability, NonBlockingSplitThenCollectivesOnTheParent) {
  const int n = 3;
  auto comms = initAll(n);
  std::vector<ncclComm_t> kids(n);
  onRanks(n, [&](int r) {
    ncclConfig_t config = nonBlocking();
    ncclResult_t rc = ncclCommSplit(comms[size_t(r)], 0, r, &kids[size_t(r)], &config);
    ASSERT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << ncclGetLastError(nullptr);
    for (int i = 0; i < 5; ++i) {
      int32_t one = 1, sum = 0;
      ASSERT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comms[size_t(r)], nullptr), ncclSuccess)
          << ncclGetLastError(nullptr);
      ASSERT_EQ(sum, n);
    }
  });
  allReduceOk(kids);
  for (auto* v : {&kids, &comms})
    for (ncclComm_t c : *v) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Rank 2 destroys its communicator after init; rank 0's first Send to it
// connects lazily and must fail within seconds naming rank 2, while a
// watchdog thread's ncclCommGetAsyncError never blocks.
TEST(Reliability, LazyConnectToAGonePeerFailsFastAndNeverBlocksTheWatchdog) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=120"});
  const int n = 4;  // ranks 0 and 2 are not ring neighbours: no connection yet
  auto comms = initAll(n);
  ASSERT_EQ(ncclCommDestroy(comms[2]), ncclSuccess);
  std::atomic<bool> done{false};
  double longestPoll = 0;
  std::thread watchdog([&] {
    while (!done.load()) {
      const auto t0 = Clock::now();
      ncclResult_t state;
      ncclCommGetAsyncError(comms[0], &state);
      longestPoll = std::max(longestPoll, secondsSince(t0));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<float> x(1024, 1.0f);
  const auto t0 = Clock::now();
  ncclResult_t rc = ncclSend(x.data(), x.size(), ncclFloat32, 2, comms[0], nullptr);
  const double took = secondsSince(t0);
  const std::string error = ncclGetLastError(nullptr);
  done = true;
  watchdog.join();
  EXPECT_EQ(rc, ncclRemoteError) << error;
  EXPECT_TRUE(namesRank(error, 2)) << error;
  EXPECT_LT(took, kEndsWithinS) << error;
  EXPECT_LT(longestPoll, 1.0) << "ncclCommGetAsyncError blocked while a connect was pending";
  for (int r : {0, 1, 3}) EXPECT_EQ(ncclCommAbort(comms[size_t(r)]), ncclSuccess);
}

// Ranks 0..2 split while rank 3 runs an AllReduce instead, which times out
// (LOOM_TIMEOUT_S=2) and tells every rank so: the split's exchange sees
// that notice and ends within seconds, not at the init timeout.
TEST(Reliability, SplitEndsOnAPeersFailureNotice) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=120", "LOOM_TIMEOUT_S=2"});
  const int n = 4;
  auto comms = initAll(n);
  std::vector<ncclResult_t> rc(n, ncclSuccess);
  std::vector<double> took(n, 0);
  std::vector<std::string> errors(n);
  onRanks(n, [&](int r) {
    const auto t0 = Clock::now();
    if (r == 3) {
      std::vector<float> x(1024, 1.0f), y(1024);
      rc[3] = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comms[3], nullptr);
    } else {
      ncclComm_t child = nullptr;
      rc[size_t(r)] = ncclCommSplit(comms[size_t(r)], 0, r, &child, nullptr);
      if (child) ncclCommAbort(child);
    }
    took[size_t(r)] = secondsSince(t0);
    errors[size_t(r)] = ncclGetLastError(nullptr);
  });
  EXPECT_EQ(rc[3], ncclRemoteError) << errors[3];
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(rc[size_t(r)], ncclSuccess) << "rank " << r;
    EXPECT_LT(took[size_t(r)], kEndsWithinS) << "rank " << r << ": " << errors[size_t(r)];
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

// Ranks 0 and 1 run an AllReduce that rank 2 never joins; they time out
// (LOOM_TIMEOUT_S=2) and tell rank 2, which runs nothing and only polls
// ncclCommGetAsyncError, as a framework's watchdog does, many times a
// millisecond: it sees the notice (the polls check the listener at most
// once a millisecond) and reports it as an error.
TEST(Reliability, AnIdleRankSeesAPeersFailureNoticeThroughGetAsyncError) {
  ScopedEnv env({"LOOM_TIMEOUT_S=2"});
  const int n = 3;
  auto comms = initAll(n);
  std::vector<ncclResult_t> rc(n, ncclSuccess);
  ncclResult_t seen = ncclSuccess;
  double took = 0;
  onRanks(n, [&](int r) {
    if (r < 2) {
      std::vector<float> x(1024, 1.0f), y(1024);
      rc[size_t(r)] = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comms[size_t(r)], nullptr);
      return;
    }
    const auto t0 = Clock::now();
    while (seen == ncclSuccess && secondsSince(t0) < kEndsWithinS) {
      ASSERT_EQ(ncclCommGetAsyncError(comms[2], &seen), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::microseconds(100));  // leave the CPUs to the others
    }
    took = secondsSince(t0);
  });
  EXPECT_NE(rc[0], ncclSuccess);
  EXPECT_NE(rc[1], ncclSuccess);
  EXPECT_EQ(seen, ncclRemoteError) << ncclGetLastError(comms[2]);
  EXPECT_LT(took, kEndsWithinS);
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

// One init of a group is refused by the rendezvous (it claims another
// nranks); its sibling, waiting for that rank, is aborted at once instead
// of waiting for the init timeout.
TEST(Reliability, GroupedInitFailureEndsItsSiblings) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=120"});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t a = nullptr, b = nullptr;
  const auto t0 = Clock::now();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&a, 2, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&b, 3, id, 1), ncclSuccess);
  ncclResult_t rc = ncclGroupEnd();
  const std::string error = ncclGetLastError(nullptr);
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_NE(error.find("nranks"), std::string::npos) << error;
  EXPECT_LT(secondsSince(t0), kEndsWithinS) << error;
  ncclCommAbort(a);
  ncclCommAbort(b);
}

// With NCCL_COMM_ID, rank 0 owns the rendezvous on the fixed port: when
// its init is aborted the port is free again at once, so a retry can
// listen there (it used to stay taken until the root's deadline).
TEST(Reliability, AbortedRankZeroFreesTheCommIdPort) {
  ScopedEnv env({"NCCL_COMM_ID=127.0.0.1:" + std::to_string(freeLoopbackPort()), "LOOM_INIT_TIMEOUT_S=60"});
  for (int attempt = 0; attempt < 3; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = nonBlocking();
    ncclComm_t c = nullptr;
    ncclResult_t rc = ncclCommInitRankConfig(&c, 2, id, 0, &config);
    ASSERT_EQ(rc, ncclInProgress) << ncclGetLastError(nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << ncclGetLastError(nullptr);  // waiting for rank 1, port held
    const auto t0 = Clock::now();
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
    EXPECT_LT(secondsSince(t0), kEndsWithinS);
  }
}

// A unique id nobody uses: its root ends at the init timeout, taking its
// thread (and port) with it.
TEST(Reliability, UnusedUniqueIdRootEndsAtTheInitTimeout) {
  ScopedEnv env({"LOOM_INIT_TIMEOUT_S=1"});
  const int before = threadsNamed("loom-root");  // earlier tests' roots, when run in one process
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(threadsNamed("loom-root"), before + 1);
  const auto t0 = Clock::now();
  while (threadsNamed("loom-root") > before && secondsSince(t0) < kEndsWithinS)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(threadsNamed("loom-root"), before) << "the rendezvous thread of an unused unique id is still running";
}

// ncclResetDebugInit replaces the settings snapshot while other threads
// read settings (ASan flagged the strings read by reference before).
TEST(Reliability, ResetDebugInitRacesSettingReads) {
  ScopedEnv env({"NCCL_COMM_ID=127.0.0.1:" + std::to_string(freeLoopbackPort())});
  std::atomic<bool> stop{false};
  std::thread resetter([&] {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // deprecated, still exported and used
    while (!stop.load()) ncclResetDebugInit();
#pragma GCC diagnostic pop
  });
  for (int i = 0; i < 20000; ++i) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  stop = true;
  resetter.join();
}

// Data calls find their communicator in a cache of live handles that each
// thread keeps: a handle this thread used and then destroyed (itself, or
// another thread) is refused like any dead handle, and a new communicator
// that the allocator puts at the same address works.
TEST(Reliability, DataCallsRefuseADeadHandleThisThreadUsed) {
  float x = 1, y = 0;
  for (int round = 0; round < 40; ++round) {
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommInitAll(&c, 1, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(y, 1.0f);
    if (round % 2) {
      ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    } else {
      std::thread([c] { EXPECT_EQ(ncclCommAbort(c), ncclSuccess); }).join();
    }
    EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, nullptr), ncclInvalidArgument) << "round " << round;
    EXPECT_EQ(ncclBroadcast(&x, &y, 1, ncclFloat32, 0, c, nullptr), ncclInvalidArgument) << "round " << round;
  }
}

// A child forked after init (DataLoader workers are) gets ncclInvalidUsage
// from every call on an inherited communicator, including destroy and
// abort, and touches nothing the parent shares: the parent's ranks go on.
TEST(Reliability, ForkedChildCannotTouchInheritedCommunicators) {
  auto comms = initAll(2);
  allReduceOk(comms);  // shared memory (or TCP) connections exist now
  // One this thread has called on, so that its cache of live handles,
  // which the child inherits, names it.
  auto solo = initAll(1);
  float one = 1, sum = 0;
  ASSERT_EQ(ncclAllReduce(&one, &sum, 1, ncclFloat32, ncclSum, solo[0], nullptr), ncclSuccess);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int bad = 0;
    float x = 1, y = 0;
    if (ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comms[0], nullptr) != ncclInvalidUsage) bad |= 1;
    if (std::string(ncclGetLastError(nullptr)).find("fork") == std::string::npos) bad |= 2;
    if (ncclCommDestroy(comms[0]) != ncclInvalidUsage) bad |= 4;
    if (ncclCommAbort(comms[1]) != ncclInvalidUsage) bad |= 8;
    if (ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, solo[0], nullptr) != ncclInvalidUsage) bad |= 16;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bit mask of the child's failed checks";
  allReduceOk(comms, 300000);  // several FIFO slots' worth
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&one, &sum, 1, ncclFloat32, ncclSum, solo[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(solo[0]), ncclSuccess);
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
