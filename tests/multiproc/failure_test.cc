// Failures end, never hang.
//
//  - A rank killed with SIGKILL in the middle of a loop of collectives: every
//    survivor, neighbour or not, returns ncclRemoteError within a generous
//    bound and its ncclGetLastError names the lost rank (by its number: the
//    TCP path's messages carry no pid), over shared memory and over TCP.
//  - A rank that never joins: init fails after LOOM_INIT_TIMEOUT_S, naming
//    the missing rank.
//  - A peer that never calls an AllReduce: LOOM_TIMEOUT_S ends it, naming
//    the rank waited for.
//  - ncclCommAbort from another thread wakes a rank blocked in AllReduce.
// After each test no child process may be left.
//
// The time bounds asserted here (30 s) are far above what these paths need
// (well under a second to a few seconds); they only tell "ends" from
// "hangs", not fast from slow.
#include <dirent.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <regex>
#include <thread>
#include <tuple>

#include "mp_util.h"
#include "rank_processes.h"

namespace loom::test {
namespace {

constexpr double kEndsWithinS = 30;

std::string freshSecret() {
  std::random_device rd;
  return "mp-" + std::to_string(rd()) + "-" + std::to_string(rd());
}

// "rank 2" as a whole word (not "rank 21").
bool namesRank(const std::string& text, int rank) {
  return std::regex_search(text, std::regex("rank " + std::to_string(rank) + "([^0-9]|$)"));
}

// The stall inspector's warnings in a rank's output, one line each.
std::vector<std::string> stallWarnings(const std::string& out) {
  std::vector<std::string> lines;
  for (size_t at = out.find("has made no progress for"); at != std::string::npos;
       at = out.find("has made no progress for", at + 1)) {
    const size_t bol = out.rfind('\n', at) + 1;
    lines.push_back(out.substr(bol, out.find('\n', at) - bol));
  }
  return lines;
}

class FailureTest : public RankProcessTest {
 protected:
  std::vector<std::string> commEnv(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> env = {"NCCL_COMM_ID=127.0.0.1:" + std::to_string(port_),
                                    "LOOM_COMM_SECRET=" + secret_};
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }
  int port_ = freeLoopbackPort();
  std::string secret_ = freshSecret();
};

// (nranks, transport): "shm" is the default on one host; "tcp" disables
// shared memory so the sockets path is tested too; "board" is shm with
// vectors small enough for the latency path (core/latency.h).
class KillRank : public FailureTest, public ::testing::WithParamInterface<std::tuple<int, std::string>> {};

TEST_P(KillRank, EverySurvivorGetsRemoteErrorNamingTheLostRank) {
  const int n = std::get<0>(GetParam());
  const bool tcp = std::get<1>(GetParam()) == "tcp";
  const bool board = std::get<1>(GetParam()) == "board";
  std::random_device rd;
  const unsigned seed = rd();
  const int victim = int(seed % unsigned(n));
  int killStep = int((seed >> 8) % 25);
  // The loop's steps cycle AllReduce, AllGather, Broadcast, ReduceScatter,
  // send/recv: for the board, the survivors' next step needs every rank.
  // Over shared memory, AllGather's 64 KiB blocks go single-copy: a send can
  // be waiting for the victim to copy it.
  if (board) killStep = killStep / 5 * 5 + (killStep % 3 == 2 ? 3 : killStep % 3);
  SCOPED_TRACE("nranks " + std::to_string(n) + ", rank " + std::to_string(victim) + " killed before step " +
               std::to_string(killStep) + " (seed " + std::to_string(seed) + ")");
  for (int r = 0; r < n; ++r) {
    spawn({"loop", "rank=" + std::to_string(r), "nranks=" + std::to_string(n), "victim=" + std::to_string(victim),
           "kill_step=" + std::to_string(killStep), board ? "count=16" : "count=16384", "limit_s=90"},
          commEnv({tcp ? "NCCL_SHM_DISABLE=1" : "NCCL_SHM_DISABLE=0"}));
  }
  ChildProcess& dead = *kids_[size_t(victim)];
  ASSERT_TRUE(dead.wait(60)) << "the victim did not reach its kill step:\n" << dead.output();
  ASSERT_EQ(dead.status(), -SIGKILL) << dead.output();
  const std::string victimPid = std::to_string(dead.pid());
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << "rank " << r << " still running " << kEndsWithinS
                                      << " s after rank " << victim << " died:\n" << k.output();
    const std::string out = k.output();
    EXPECT_EQ(k.status(), 0) << "rank " << r << ":\n" << out;
    EXPECT_EQ(resultField(out, "code"), std::to_string(int(ncclRemoteError))) << "rank " << r << ":\n" << out;
    const std::string error = resultField(out, "error");
    EXPECT_TRUE(namesRank(error, victim))
        << "rank " << r << "'s ncclGetLastError does not name the lost rank " << victim << " (pid " << victimPid
        << "): " << error;
    EXPECT_NE(out.find("ABORTED"), std::string::npos) << "rank " << r << ": ncclCommAbort did not return:\n" << out;
    // The board saw the victim's process end (its pidfd), or a peer said so.
    if (board) {
      EXPECT_NE(error.find("exited during"), std::string::npos) << "rank " << r << ": " << error;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, KillRank,
                         ::testing::Combine(::testing::Values(3, 5), ::testing::Values("shm", "tcp", "board")),
                         [](const ::testing::TestParamInfo<KillRank::ParamType>& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

// Ranks 0 and 1 of 3 start; rank 2 never does.
TEST_F(FailureTest, MissingRankEndsInitAfterInitTimeout) {
  for (int r = 0; r < 2; ++r)
    spawn({"init", "rank=" + std::to_string(r), "nranks=3"}, commEnv({"LOOM_INIT_TIMEOUT_S=3"}));
  for (int r = 0; r < 2; ++r) {
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << "rank " << r << " init did not end:\n" << k.output();
    const std::string out = k.output();
    const std::string code = resultField(out, "code");
    EXPECT_TRUE(code != "" && code != "0") << "rank " << r << ":\n" << out;
    const std::string error = resultField(out, "error");
    EXPECT_NE(error.find("missing ranks: 2"), std::string::npos) << "rank " << r << ": " << error;
  }
}

// Ranks whose settings disagree on the latency path (LOOM_LATENCY_PATH,
// NCCL_PROTO, NCCL_SHM_DISABLE) still initialize in step and agree on where
// each collective runs: small collectives and send/recv in a loop, no hang.
TEST_F(FailureTest, LatencyPathSettingsThatDifferStillMeet) {
  const std::vector<std::vector<std::string>> envs = {
      {"LOOM_LATENCY_PATH=1"}, {"LOOM_LATENCY_PATH=0"}, {"NCCL_PROTO=LL,Simple"}};
  for (int r = 0; r < 3; ++r)
    spawn({"loop", "rank=" + std::to_string(r), "nranks=3", "steps=60", "count=16", "limit_s=60"},
          commEnv(envs[size_t(r)]));
  for (int r = 0; r < 3; ++r) {
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << "rank " << r << " did not finish:\n" << k.output();
    EXPECT_EQ(k.status(), 0) << k.output();
    EXPECT_EQ(resultField(k.output(), "code"), "0") << k.output();
  }
}

// One rank with shared memory off puts the communicator on TCP for every
// rank: all plan with the network's slices and algorithms (1 MiB per rank:
// several slices), so their messages match.
TEST_F(FailureTest, ShmSettingsThatDifferStillMeet) {
  const std::vector<std::vector<std::string>> envs = {{"NCCL_SHM_DISABLE=1"}, {"NCCL_SHM_DISABLE=0"}};
  for (int r = 0; r < 2; ++r)
    spawn({"loop", "rank=" + std::to_string(r), "nranks=2", "steps=10", "count=262144", "limit_s=60"},
          commEnv(envs[size_t(r)]));
  for (int r = 0; r < 2; ++r) {
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << "rank " << r << " did not finish:\n" << k.output();
    EXPECT_EQ(k.status(), 0) << k.output();
    EXPECT_EQ(resultField(k.output(), "code"), "0") << k.output();
  }
}

// LOOM_CALIBRATE on every rank: each measures, all adopt the slowest rank's
// figures (the same line on every rank), and a checked AllReduce follows;
// a non-blocking init reports success only after its rank calibrated. Set
// on one rank only, nobody measures (a rank that did would wait for peers
// that never join) and the AllReduce still runs.
TEST_F(FailureTest, CalibrationRunsOnlyWhenEveryRankAsksAndAllAgree) {
  auto calibratedLine = [](const std::string& out) {
    const size_t at = out.find("calibrated ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  for (bool everyone : {true, false}) {
    kids_.clear();
    port_ = freeLoopbackPort();
    for (int r = 0; r < 3; ++r) {
      const bool asks = everyone || r == 0;
      spawn({"init", "rank=" + std::to_string(r), "nranks=3", "nonblocking=" + std::to_string(r % 2)},
            commEnv({asks ? "LOOM_CALIBRATE=1" : "LOOM_CALIBRATE=0", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=TUNING"}));
    }
    std::string first;
    for (int r = 0; r < 3; ++r) {
      ChildProcess& k = *kids_[size_t(r)];
      ASSERT_TRUE(k.wait(kEndsWithinS)) << "rank " << r << " did not finish:\n" << k.output();
      const std::string out = k.output();
      EXPECT_EQ(k.status(), 0) << out;
      EXPECT_EQ(resultField(out, "code"), "0") << out;
      EXPECT_EQ(resultField(out, "error"), "") << out;  // the AllReduce's check
      const std::string line = calibratedLine(out);
      if (!everyone) {
        EXPECT_EQ(line, "") << out;
        EXPECT_NE(out.find("LOOM_CALIBRATE ignored: not every rank sets it"), std::string::npos) << out;
        continue;
      }
      ASSERT_NE(line, "") << out;
      EXPECT_NE(line.find("calibrated shm links"), std::string::npos) << line;
      // Logged by the init before the communicator is ready (stdout and
      // stderr share one pipe, in order).
      EXPECT_LT(out.find("calibrated "), out.find("INIT ok")) << out;
      if (r == 0) first = line;
      else EXPECT_EQ(line, first) << "rank " << r << " adopted other figures than rank 0";
    }
  }
}

// Rank 1 sleeps instead of joining the AllReduce; rank 0 gives up after
// LOOM_TIMEOUT_S=2 and says it waits for rank 1.
TEST_F(FailureTest, OperationTimeoutNamesTheRankWaitedFor) {
  for (int r = 0; r < 2; ++r)
    spawn({"skip", "rank=" + std::to_string(r), "nranks=2", "skipper=1", "sleep=4"}, commEnv({"LOOM_TIMEOUT_S=2"}));
  ChildProcess& waiter = *kids_[0];
  ASSERT_TRUE(waiter.wait(kEndsWithinS)) << waiter.output();
  const std::string out = waiter.output();
  EXPECT_EQ(waiter.status(), 0) << out;
  EXPECT_EQ(resultField(out, "code"), std::to_string(int(ncclRemoteError))) << out;
  const std::string error = resultField(out, "error");
  EXPECT_TRUE(namesRank(error, 1)) << error;
  EXPECT_NE(error.find("LOOM_TIMEOUT_S"), std::string::npos) << error;
  EXPECT_GE(std::stod("0" + resultField(out, "seconds")), 1.0) << "gave up before the timeout: " << out;
  ChildProcess& sleeper = *kids_[1];
  ASSERT_TRUE(sleeper.wait(kEndsWithinS)) << sleeper.output();
  EXPECT_EQ(sleeper.status(), 0) << sleeper.output();
}

// The stall inspector with a rank frozen by SIGSTOP in the middle of a loop
// of collectives: while it is stopped the others warn, naming it (or a rank
// that waits for it); after SIGCONT the loop goes on and every rank ends
// without an error.
TEST_F(FailureTest, StoppedRankIsNamedByStallWarningsAndTheRunCompletes) {
  for (int r = 0; r < 3; ++r)
    spawn({"loop", "rank=" + std::to_string(r), "nranks=3", "limit_s=7", "count=1024", "agree=1"},
          commEnv({"LOOM_STALL_WARN_S=1", "LOOM_TIMEOUT_S=60", "NCCL_DEBUG=WARN"}));
  const auto start = std::chrono::steady_clock::now();
  auto joined = [&] {
    for (auto& k : kids_)
      if (k->output().find("INIT ok") == std::string::npos) return false;
    return true;
  };
  while (!joined() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(joined()) << kids_[0]->output();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kids_[1]->kill(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  kids_[1]->kill(SIGCONT);
  int namesStopped = 0;
  for (int r = 0; r < 3; ++r) {
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << k.output();
    const std::string out = k.output();
    EXPECT_EQ(k.status(), 0) << out;
    EXPECT_EQ(resultField(out, "code"), "0") << out;
    if (r == 1) continue;
    const std::vector<std::string> warnings = stallWarnings(out);
    for (const std::string& line : warnings)
      namesStopped += namesRank(line, 1) && line.find("pid " + std::to_string(kids_[1]->pid())) != std::string::npos;
    EXPECT_GE(warnings.size(), 1u) << "rank " << r << " was stopped behind rank 1 for 3.5 s:\n" << out;
  }
  EXPECT_GE(namesStopped, 1) << "no warning named the stopped rank 1";
}

// The stall inspector: rank 1 joins an AllReduce 5 s late. With
// LOOM_STALL_WARN_S=1 the waiting ranks log a WARN each second naming the
// operation with its sequence number and rank 1 (host, pid); then the
// AllReduce completes with the right sum and no async error.
TEST_F(FailureTest, StallWarningsNameTheLateRankAndNothingFails) {
  for (int r = 0; r < 3; ++r)
    spawn({"late", "rank=" + std::to_string(r), "nranks=3", "late=1", "sleep=5"},
          commEnv({"LOOM_STALL_WARN_S=1", "LOOM_TIMEOUT_S=60", "NCCL_DEBUG=WARN"}));
  int namesLate = 0;
  for (int r = 0; r < 3; ++r) {
    ChildProcess& k = *kids_[size_t(r)];
    ASSERT_TRUE(k.wait(kEndsWithinS)) << k.output();
    const std::string out = k.output();
    EXPECT_EQ(k.status(), 0) << out;
    EXPECT_EQ(resultField(out, "code"), "0") << out;
    const std::vector<std::string> lines = stallWarnings(out);
    const int warnings = int(lines.size());
    for (const std::string& line : lines) {
      EXPECT_NE(line.find("AllReduce #"), std::string::npos) << line;
      EXPECT_NE(line.find("LOOM_STALL_WARN_S=1"), std::string::npos) << line;
      // Each names the peer it waits for directly, with host and pid: rank
      // 1, or a rank that itself waits for rank 1.
      bool namesPeer = false;
      for (int p = 0; p < 3; ++p) {
        if (p != r && namesRank(line, p) && line.find("pid " + std::to_string(kids_[size_t(p)]->pid())) != std::string::npos) {
          namesPeer = true;
          namesLate += p == 1;
        }
      }
      EXPECT_TRUE(namesPeer) << line;
    }
    if (r == 1) {
      EXPECT_EQ(warnings, 0) << "the late rank itself waited for nobody:\n" << out;
    } else {
      EXPECT_GE(warnings, 2) << out;
      EXPECT_LE(warnings, 6) << "one warning per period:\n" << out;
    }
  }
  EXPECT_GT(namesLate, 0) << "no warning named the late rank 1";
}

// The flight recorder: three AllReduces go through, then rank 1 stops
// joining. Ranks 0 and 2 fail at the LOOM_TIMEOUT_S timeout and write their
// recorders; rank 1, asked by LOOM_FLIGHT_RECORDER_SIGNAL=USR1 while it
// sleeps, writes its own and keeps going. loom-info --flight then says
// rank 1 is behind, having finished #3, while the others failed in #4.
TEST_F(FailureTest, FlightRecorderDumpsOnTimeoutAndSignalAndNamesTheRankBehind) {
  char dir[] = "/tmp/loom-flight-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  for (int r = 0; r < 3; ++r)
    spawn({"skip", "rank=" + std::to_string(r), "nranks=3", "skipper=1", "sleep=8", "before=3"},
          commEnv({"LOOM_TIMEOUT_S=4", std::string("LOOM_FLIGHT_RECORDER_DIR=") + dir,
                   "LOOM_FLIGHT_RECORDER_SIGNAL=USR1"}));
  ChildProcess& sleeper = *kids_[1];
  const auto t0 = std::chrono::steady_clock::now();
  while (sleeper.output().find("SKIPPING") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(sleeper.output().find("SKIPPING"), std::string::npos) << sleeper.output();
  sleeper.kill(SIGUSR1);
  for (auto& k : kids_) {
    ASSERT_TRUE(k->wait(kEndsWithinS)) << k->output();
    EXPECT_EQ(k->status(), 0) << k->output();  // the signal did not end rank 1
  }
  const std::vector<std::string> files = flightFiles(dir);
  EXPECT_EQ(files.size(), 3u);
  auto merged = ChildProcess::start(LOOM_INFO_PATH, {"--flight", dir}, {});
  ASSERT_NE(merged, nullptr);
  ASSERT_TRUE(merged->wait(kEndsWithinS));
  const std::string out = merged->output();
  EXPECT_EQ(merged->status(), 0) << out;
  EXPECT_NE(out.find("3 file(s), 1 communicator(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 (host"), std::string::npos) << out;
  EXPECT_NE(out.find("has not called collective 4: its latest is AllReduce #3 done"), std::string::npos) << out;
  EXPECT_NE(out.find("AllReduce #4 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("behind (the others reached collective 4, AllReduce #4 on rank 0; finished up to collective 3)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("signal 10"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank called the same collectives in the same order"), std::string::npos) << out;
  for (const auto& f : files) std::remove(f.c_str());
  rmdir(dir);
}

// The merge on files written by hand: rank 1 called a Broadcast where the
// others called an AllReduce (their second collective), rank 0's extra Send
// shifts its sequence numbers but not its collectives, and rank 2 wrote no
// file.
TEST_F(FailureTest, FlightMergeFindsDifferentOperationsAtOneSequenceNumber) {
  char dir[] = "/tmp/loom-flight-merge-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto write = [&](int rank, const char* second) {
    const std::string path = std::string(dir) + "/loom-flight-00000000000000aa-rank" + std::to_string(rank) + ".json";
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "{\"loom_flight_recorder\":1,\"comm\":\"00000000000000aa\",\"rank\":%d,\"nranks\":4,"
                    "\"host\":\"h%d\",\"pid\":%d,\"reason\":\"made no \\\"progress\\\"\"}\n", rank, rank, 100 + rank);
    std::fprintf(f, "{\"seq\":1,\"coll\":1,\"kind\":\"AllReduce\",\"count\":8,\"type\":\"float\",\"op\":\"sum\",\"root\":-1,"
                    "\"state\":\"done\",\"enqueue_us\":1,\"start_us\":2,\"end_us\":3}\n");
    std::fprintf(f, "%s\n", second);
    std::fclose(f);
  };
  const char* allReduce = "{\"seq\":2,\"coll\":2,\"kind\":\"AllReduce\",\"count\":8,\"type\":\"float\",\"op\":\"sum\",\"root\":-1,"
                          "\"state\":\"failed\",\"enqueue_us\":4,\"start_us\":5,\"end_us\":6}";
  // Rank 0 also sent to a peer before (point-to-point: no collective
  // number), so its AllReduce is #3 there.
  write(0, "{\"seq\":2,\"coll\":0,\"kind\":\"Send\",\"count\":4,\"type\":\"float\",\"op\":\"\",\"root\":1,"
           "\"state\":\"done\",\"enqueue_us\":4,\"start_us\":5,\"end_us\":6}\n"
           "{\"seq\":3,\"coll\":2,\"kind\":\"AllReduce\",\"count\":8,\"type\":\"float\",\"op\":\"sum\",\"root\":-1,"
           "\"state\":\"failed\",\"enqueue_us\":7,\"start_us\":8,\"end_us\":9}");
  write(1, "{\"seq\":2,\"coll\":2,\"kind\":\"Broadcast\",\"count\":8,\"type\":\"float\",\"op\":\"\",\"root\":0,"
           "\"state\":\"running\",\"enqueue_us\":4,\"start_us\":5,\"end_us\":0}");
  write(3, allReduce);
  {
    FILE* junk = std::fopen((std::string(dir) + "/loom-flight-junk.json").c_str(), "w");
    ASSERT_NE(junk, nullptr);
    std::fputs("not json\n", junk);
    std::fclose(junk);
  }
  auto merged = ChildProcess::start(LOOM_INFO_PATH, {"--flight", dir}, {});
  ASSERT_NE(merged, nullptr);
  ASSERT_TRUE(merged->wait(kEndsWithinS));
  const std::string out = merged->output();
  EXPECT_EQ(merged->status(), 0) << out;
  EXPECT_NE(out.find("MISMATCH at collective 2: [rank 0,3: AllReduce 8 x float sum] [rank 1: Broadcast 8 x float root 0]"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("no file from rank(s) 2"), std::string::npos) << out;
  EXPECT_NE(out.find("loom-flight-junk.json is not a flight recorder file"), std::string::npos) << out;
  EXPECT_NE(out.find("made no \"progress\""), std::string::npos) << out;
  // The same files as a Chrome trace: times from the first call (rank 0's
  // AllReduce, called at 1 us, ran from 2 to 3), a begin without an end
  // for rank 1's running Broadcast, a row per rank named after it.
  const std::string tracePath = std::string(dir) + "/trace.json";
  auto trace = ChildProcess::start(LOOM_INFO_PATH, {"--trace", dir, tracePath}, {});
  ASSERT_NE(trace, nullptr);
  ASSERT_TRUE(trace->wait(kEndsWithinS));
  EXPECT_EQ(trace->status(), 0) << trace->output();
  EXPECT_NE(trace->output().find("7 operation(s) from 3 file(s), 1 communicator(s)"), std::string::npos)
      << trace->output();
  EXPECT_NE(trace->output().find("AllReduce 8 x float sum"), std::string::npos) << trace->output();
  const std::string json = readText(tracePath);
  EXPECT_NE(json.find("\"name\":\"AllReduce\",\"cat\":\"loom\",\"pid\":1,\"tid\":1,\"ph\":\"X\",\"ts\":1,\"dur\":1"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"name\":\"Broadcast\",\"cat\":\"loom\",\"pid\":2,\"tid\":1,\"ph\":\"B\",\"ts\":4"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"comm 00000000000000aa rank 3/4\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"name\":\"host h1, pid 101\"}"), std::string::npos) << json;
  std::remove(tracePath.c_str());
  for (const char* name : {"rank0", "rank1", "rank3"})
    std::remove((std::string(dir) + "/loom-flight-00000000000000aa-" + name + ".json").c_str());
  std::remove((std::string(dir) + "/loom-flight-junk.json").c_str());
  rmdir(dir);
  // An empty folder is an error.
  auto none = ChildProcess::start(LOOM_INFO_PATH, {"--flight", "/nonexistent-flight-dir"}, {});
  ASSERT_TRUE(none->wait(kEndsWithinS));
  EXPECT_EQ(none->status(), 2) << none->output();
}

// LOOM_FLIGHT_RECORDER_AT_DESTROY: two healthy ranks write their recorders
// as ncclCommDestroy ends the communicator, and loom-info --trace turns
// them into a trace that a JSON parser reads (python3 where there is one).
TEST_F(FailureTest, FlightRecordersWrittenAtDestroyMakeATrace) {
  char dir[] = "/tmp/loom-flight-destroy-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  for (int r = 0; r < 2; ++r)
    spawn({"init", "rank=" + std::to_string(r), "nranks=2"},
          commEnv({std::string("LOOM_FLIGHT_RECORDER_DIR=") + dir, "LOOM_FLIGHT_RECORDER_AT_DESTROY=1"}));
  for (auto& k : kids_) {
    ASSERT_TRUE(k->wait(kEndsWithinS)) << k->output();
    EXPECT_EQ(k->status(), 0) << k->output();
  }
  const std::vector<std::string> files = flightFiles(dir);
  ASSERT_EQ(files.size(), 2u);
  for (const auto& path : files) {
    const std::string text = readText(path);
    EXPECT_NE(text.find("\"reason\":\"ncclCommDestroy ended the communicator\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"kind\":\"AllReduce\",\"count\":1024,\"type\":\"float\",\"op\":\"sum\",\"root\":-1,"
                        "\"state\":\"done\""),
              std::string::npos)
        << text;
  }
  const std::string tracePath = std::string(dir) + "/trace.json";
  auto trace = ChildProcess::start(LOOM_INFO_PATH, {"--trace", dir, tracePath}, {});
  ASSERT_NE(trace, nullptr);
  ASSERT_TRUE(trace->wait(kEndsWithinS));
  EXPECT_EQ(trace->status(), 0) << trace->output();
  EXPECT_NE(trace->output().find("from 2 file(s), 1 communicator(s)"), std::string::npos) << trace->output();
  EXPECT_NE(trace->output().find("AllReduce 1024 x float sum"), std::string::npos) << trace->output();
  if (access("/usr/bin/python3", X_OK) == 0) {
    auto parse = ChildProcess::start("/usr/bin/python3",
                                     {"-c",
                                      "import json, sys; t = json.load(open(sys.argv[1])); "
                                      "print('slices', sum(e['ph'] == 'X' for e in t['traceEvents']))",
                                      tracePath},
                                     {});
    ASSERT_NE(parse, nullptr);
    ASSERT_TRUE(parse->wait(kEndsWithinS));
    EXPECT_EQ(parse->status(), 0) << parse->output();
    EXPECT_NE(parse->output().find("slices 2"), std::string::npos) << parse->output();
  }
  for (const auto& f : files) std::remove(f.c_str());
  std::remove(tracePath.c_str());
  rmdir(dir);
}

// Rank 0 (a thread) is blocked in an AllReduce that rank 1 never joins;
// ncclCommAbort from another thread must make it return.
TEST_F(FailureTest, AbortFromAnotherThreadWakesABlockedAllReduce) {
  ncclComm_t comms[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<float> x(1 << 16, 1.0f), y(1 << 16);
  std::atomic<bool> returned{false};
  ncclResult_t rc = ncclSuccess;
  auto start = std::chrono::steady_clock::now();
  std::thread blocked([&] {
    rc = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comms[0], nullptr);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(returned.load()) << "the AllReduce returned although its peer never called it";
  const auto abortStart = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess) << ncclGetLastError(nullptr);
  const double abortS = secondsSince(abortStart);
  blocked.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(abortS, kEndsWithinS);
  EXPECT_LT(secondsSince(start), kEndsWithinS);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess) << ncclGetLastError(nullptr);
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
