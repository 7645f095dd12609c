// Ranks in different PID namespaces on one host (containers that share the
// hostname and kernel but not the PID namespace): a pid seen in the rank
// table means nothing to a peer in another namespace, so no liveness check
// may use it. One rank runs under `unshare --pid --fork --mount-proc`, the
// other does not; one of them is stopped with SIGSTOP for 4 s in the middle
// of a loop of collectives, then continued: both must finish the loop
// correctly (shared memory cannot attach across the namespaces, so the pair
// falls back to TCP; either transport is fine, the run must complete).
//
// The loop used to fail within a second of the stop when the stopped rank
// was outside the namespace: its peer probed the pid with kill(pid, 0),
// which does not exist in the peer's namespace, and declared it gone.
//
// Needs root (or user namespaces) for unshare; skipped, saying so, when
// unshare cannot run here. LOOM_PIDNS_RUNS repeats each case (default 2).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "mp_util.h"
#include "rank_processes.h"

namespace loom::test {
namespace {

constexpr const char* kUnshare = "/usr/bin/unshare";
constexpr double kEndsWithinS = 120;

bool unshareWorks() {
  if (access(kUnshare, X_OK) != 0) return false;
  auto probe = ChildProcess::start(kUnshare, {"--pid", "--fork", "--mount-proc", "/bin/true"}, {});
  return probe && probe->wait(20) && probe->status() == 0;
}

// Waits until `k` printed "INIT ok" (or ended).
bool waitInit(ChildProcess& k, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (secondsSince(t0) < seconds) {
    if (k.output().find("INIT ok") != std::string::npos) return true;
    if (!k.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class PidNamespace : public RankProcessTest, public ::testing::WithParamInterface<int> {};

// Param: which rank is stopped (0: the one outside the namespace, 1: the one
// inside it).
TEST_P(PidNamespace, StoppedPeerInAnotherNamespaceIsNotDeclaredGone) {
  if (!unshareWorks()) GTEST_SKIP() << "unshare --pid --fork --mount-proc cannot run here (needs root)";
  const int stopped = GetParam();
  const char* runsEnv = std::getenv("LOOM_PIDNS_RUNS");
  const int runs = runsEnv ? std::max(1, std::atoi(runsEnv)) : 2;
  for (int run = 0; run < runs; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    std::random_device rd;
    const std::vector<std::string> env = {
        "NCCL_COMM_ID=127.0.0.1:" + std::to_string(freeLoopbackPort()),
        "LOOM_COMM_SECRET=pidns-" + std::to_string(rd()) + "-" + std::to_string(rd()), "LOOM_TIMEOUT_S=60"};
    const std::vector<std::string> loop = {"loop", "nranks=2", "steps=20000", "count=4096", "limit_s=100000"};
    auto args = [&](int r) {
      std::vector<std::string> a = loop;
      a.push_back("rank=" + std::to_string(r));
      return a;
    };
    ChildProcess& outside = spawn(args(0), env);
    std::vector<std::string> inner = {"--pid", "--fork", "--mount-proc", LOOM_MP_RANK_PATH};
    for (const std::string& a : args(1)) inner.push_back(a);
    auto wrapped = ChildProcess::start(kUnshare, inner, env);
    ASSERT_TRUE(wrapped);
    ASSERT_TRUE(waitInit(outside, 60)) << outside.output();
    ASSERT_TRUE(waitInit(*wrapped, 60)) << wrapped->output();
    // The namespaced rank is unshare's child (unshare --fork waits for it).
    pid_t target = outside.pid();
    if (stopped == 1) {
      auto kids = childrenOf(wrapped->pid());
      ASSERT_EQ(kids.size(), 1u) << "cannot find the rank inside the namespace";
      target = kids[0];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::kill(target, SIGSTOP), 0);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    ASSERT_EQ(::kill(target, SIGCONT), 0);
    for (ChildProcess* k : {&outside, wrapped.get()}) {
      ASSERT_TRUE(k->wait(kEndsWithinS)) << "a rank did not finish:\n" << k->output();
      EXPECT_EQ(k->status(), 0) << k->output();
      EXPECT_EQ(resultField(k->output(), "code"), "0") << k->output();
      EXPECT_EQ(resultField(k->output(), "step"), "20000") << k->output();
    }
    kids_.push_back(std::move(wrapped));
    kids_.clear();
  }
}

INSTANTIATE_TEST_SUITE_P(Stop, PidNamespace, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("RankOutsideTheNamespace")
                                                  : std::string("RankInsideTheNamespace");
                         });

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
