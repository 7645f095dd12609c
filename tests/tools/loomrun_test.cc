// loomrun without the library: environment, output handling, exit status
// propagation, stopping the other ranks and leaving no process behind.
// Ranks are small shell scripts.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/loomrun/launcher.h"

namespace {

namespace fs = std::filesystem;
using loom::launcher::cpusPerRank;
using loom::launcher::LaunchOptions;
using Clock = std::chrono::steady_clock;

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A process is gone when it no longer exists or is a zombie nobody reaped
// (a container's init may not reap orphans).
bool goneNow(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

// Gone (or a zombie) within a few seconds: a SIGKILL sent to a process
// group takes effect when each member next runs, which on a loaded machine
// can be after loomrun itself has exited (its ranks' children are not its
// to wait for).
bool processGone(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (goneNow(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return goneNow(pid);
}

// "0-2,5" (a /proc/self/status Cpus_allowed_list) as a set of CPUs.
std::set<int> cpuList(const std::string& text) {
  std::set<int> out;
  std::istringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) {
    const size_t dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int c = first; c <= last; ++c) out.insert(c);
  }
  return out;
}

class LoomrunTest : public testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loomrun_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts loomrun with `args`; stdout and stderr go to files in dir_.
  pid_t start(const std::vector<std::string>& args) {
    pid_t pid = fork();
    if (pid == 0) {
      int out = open((dir_ / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open((dir_ / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, STDOUT_FILENO);
      dup2(err, STDERR_FILENO);
      std::vector<char*> argv{const_cast<char*>(LOOMRUN_PATH)};
      for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(LOOMRUN_PATH, argv.data());
      _exit(126);
    }
    return pid;
  }

  // Waits for loomrun; fails the test (and kills it) after `limitSeconds`,
  // a liveness bound far above what any of these runs needs.
  int finish(pid_t pid, int limitSeconds = 60) {
    auto deadline = Clock::now() + std::chrono::seconds(limitSeconds);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "loomrun did not finish within " << limitSeconds << " s";
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    out_ = readFile(dir_ / "stdout");
    err_ = readFile(dir_ / "stderr");
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
  }

  int runLoomrun(const std::vector<std::string>& args) { return finish(start(args)); }

  // The CPU sets loomrun's n ranks run on, with these --bind-to arguments.
  std::vector<std::set<int>> rankCpuSets(const fs::path& outDir, int n, const std::vector<std::string>& bind) {
    std::vector<std::string> args{"-n", std::to_string(n), "--output", outDir.string()};
    args.insert(args.end(), bind.begin(), bind.end());
    args.insert(args.end(), {"--", "sh", "-c", "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status"});
    EXPECT_EQ(runLoomrun(args), 0) << err_;
    std::vector<std::set<int>> sets;
    for (int r = 0; r < n; ++r) {
      std::string text = readFile(outDir / ("rank." + std::to_string(r) + ".out"));
      while (!text.empty() && text.back() == '\n') text.pop_back();
      sets.push_back(text.empty() ? std::set<int>{} : cpuList(text));
    }
    return sets;
  }

  // Ranks write their shell's pid to dir_/pid.<rank> first.
  std::string pidFileScript(const std::string& rest) {
    return "echo $$ > " + (dir_ / "pid.").string() + "$LOOM_RANK; " + rest;
  }
  std::vector<pid_t> rankPids(int n) {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      std::string text = readFile(dir_ / ("pid." + std::to_string(r)));
      if (!text.empty()) pids.push_back(pid_t(std::stol(text)));
    }
    return pids;
  }
  bool waitForPidFiles(int n) {
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      if (int(rankPids(n).size()) == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  fs::path dir_;
  std::string out_;
  std::string err_;
};

TEST_F(LoomrunTest, ExportsRankEnvironmentAndAFreshRendezvous) {
  fs::path outDir = dir_ / "env";
  ASSERT_EQ(runLoomrun({"-n", "3", "--output", outDir.string(), "--", "env"}), 0) << err_;
  std::string commId, secret;
  for (int r = 0; r < 3; ++r) {
    std::map<std::string, std::string> env;
    std::istringstream lines(readFile(outDir / ("rank." + std::to_string(r) + ".out")));
    for (std::string line; std::getline(lines, line);) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    EXPECT_EQ(env["LOOM_RANK"], std::to_string(r));
    EXPECT_EQ(env["LOOM_WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOOM_LOCAL_RANK"], std::to_string(r));
    EXPECT_TRUE(std::regex_match(env["NCCL_COMM_ID"], std::regex(R"(127\.0\.0\.1:[1-9][0-9]*)"))) << env["NCCL_COMM_ID"];
    EXPECT_TRUE(std::regex_match(env["LOOM_COMM_SECRET"], std::regex("[0-9a-f]{32}"))) << env["LOOM_COMM_SECRET"];
    if (r == 0) {
      commId = env["NCCL_COMM_ID"];
      secret = env["LOOM_COMM_SECRET"];
    }
    EXPECT_EQ(env["NCCL_COMM_ID"], commId);
    EXPECT_EQ(env["LOOM_COMM_SECRET"], secret);
  }
  ASSERT_EQ(runLoomrun({"-n", "1", "--output", outDir.string(), "--", "sh", "-c", "echo $LOOM_COMM_SECRET"}), 0);
  std::string second = readFile(outDir / "rank.0.out");
  EXPECT_EQ(second.size(), 33u);
  EXPECT_NE(second.substr(0, 32), secret) << "every job gets a new secret";
}

TEST_F(LoomrunTest, TagPrefixesEveryLineAndKeepsStreamsApart) {
  ASSERT_EQ(runLoomrun({"-n", "2", "--tag", "--", "sh", "-c",
                        "echo out$LOOM_RANK; echo err$LOOM_RANK >&2; echo second$LOOM_RANK; printf tail$LOOM_RANK"}),
            0)
      << err_;
  for (int r = 0; r < 2; ++r) {
    std::string tag = "[" + std::to_string(r) + "] ";
    std::string rank = std::to_string(r);
    EXPECT_NE(out_.find(tag + "out" + rank + "\n"), std::string::npos) << out_;
    EXPECT_NE(out_.find(tag + "second" + rank + "\n"), std::string::npos) << out_;
    EXPECT_NE(out_.find(tag + "tail" + rank + "\n"), std::string::npos) << "unterminated last line: " << out_;
    EXPECT_NE(err_.find(tag + "err" + rank + "\n"), std::string::npos) << err_;
    EXPECT_EQ(out_.find("err" + rank), std::string::npos) << "stderr leaked into stdout";
  }
  std::istringstream lines(out_);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(std::regex_match(line, std::regex(R"(\[[01]\] \S+)"))) << line;
  }
}

TEST_F(LoomrunTest, OutputWritesOneFilePairPerRankAndCreatesTheFolder) {
  fs::path outDir = dir_ / "nested" / "logs";
  ASSERT_EQ(runLoomrun({"-n", "3", "--output", outDir.string(), "--", "sh", "-c",
                        "echo hello $LOOM_RANK; echo oops $LOOM_RANK >&2"}),
            0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(readFile(outDir / ("rank." + std::to_string(r) + ".out")), "hello " + std::to_string(r) + "\n");
    EXPECT_EQ(readFile(outDir / ("rank." + std::to_string(r) + ".err")), "oops " + std::to_string(r) + "\n");
  }
  EXPECT_EQ(out_, "");
}


std::set<int> allowedCpus() {
  cpu_set_t mine;
  EXPECT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) allowed.insert(c);
  return allowed;
}

// --bind-to core: the first ranks get one core each (disjoint CPU sets that
// together are everything loomrun may use), later ones wrap around; with
// none every rank may run anywhere.
TEST_F(LoomrunTest, BindToCoreSpreadsRanksOverTheAllowedCores) {
  const std::set<int> allowed = allowedCpus();
  const int n = int(allowed.size()) + 1;  // at least one rank more than cores
  for (const auto& s : rankCpuSets(dir_ / "free", n, {"--bind-to", "none"})) EXPECT_EQ(s, allowed);
  const std::vector<std::set<int>> bound = rankCpuSets(dir_ / "bound", n, {"--bind-to", "core"});
  // The cores: the distinct sets in rank order, until the first repeat.
  size_t cores = 0;
  while (cores < bound.size() && (cores == 0 || bound[cores] != bound[0])) ++cores;
  ASSERT_GE(cores, 1u);
  ASSERT_LT(cores, bound.size()) << "no rank wrapped around to the first core";
  std::set<int> all;
  for (size_t r = 0; r < cores; ++r) {
    EXPECT_FALSE(bound[r].empty()) << "rank " << r;
    for (int c : bound[r]) EXPECT_TRUE(all.insert(c).second) << "CPU " << c << " is on two ranks' cores";
  }
  EXPECT_EQ(all, allowed);
  for (size_t r = cores; r < bound.size(); ++r) EXPECT_EQ(bound[r], bound[r % cores]) << "rank " << r;
  EXPECT_EQ(runLoomrun({"-n", "2", "--bind-to", "socket", "true"}), 2);
  EXPECT_NE(err_.find("--bind-to expects share, core or none"), std::string::npos) << err_;
}

// The shares on made-up machines: 4 cores of 2 hardware threads (CPU c and
// c + 4 on core c), and 3 single-thread cores.
TEST(CpusPerRank, SharesCoresEquallyWhenRanksFitAndWrapsForCore) {
  using Binding = LaunchOptions::Binding;
  using Sets = std::vector<std::vector<int>>;
  const Sets smt{{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  EXPECT_EQ(cpusPerRank(Binding::kShare, smt, 2), (Sets{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  EXPECT_EQ(cpusPerRank(Binding::kShare, smt, 3), (Sets{{0, 4}, {1, 5}, {2, 6, 3, 7}}));
  EXPECT_EQ(cpusPerRank(Binding::kShare, smt, 4), (Sets{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // More ranks than cores: spread as --bind-to core does.
  EXPECT_EQ(cpusPerRank(Binding::kShare, smt, 5), (Sets{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}}));
  EXPECT_EQ(cpusPerRank(Binding::kShare, smt, 1), Sets(1));  // one rank: its share is everything
  EXPECT_EQ(cpusPerRank(Binding::kCore, smt, 5), (Sets{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}}));
  EXPECT_EQ(cpusPerRank(Binding::kNone, smt, 2), Sets(2));
  const Sets three{{0}, {1}, {2}};
  EXPECT_EQ(cpusPerRank(Binding::kShare, three, 2), (Sets{{0}, {1, 2}}));
  EXPECT_EQ(cpusPerRank(Binding::kShare, three, 3), (Sets{{0}, {1}, {2}}));
}

// The default (share), end to end: ranks that fit on the cores get
// disjoint shares of them, equal to a core, together all of loomrun's CPUs;
// one rank runs anywhere; more ranks than cores are spread as with
// --bind-to core (which BindToCoreSpreadsRanksOverTheAllowedCores checks).
TEST_F(LoomrunTest, ByDefaultRanksThatFitGetEqualSharesOfTheCores) {
  setenv("LOOM_DEVICE", "host", 1);  // on a GPU host the default leaves GPU ranks unbound
  const std::set<int> allowed = allowedCpus();
  // The cores of those CPUs, and how many hardware threads the largest has.
  std::map<std::pair<std::string, std::string>, int> cores;
  for (int cpu : allowed) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string package = readFile(base + "physical_package_id"), core = readFile(base + "core_id");
    if (package.empty() || core.empty()) package = core = "cpu" + std::to_string(cpu);
    ++cores[{package, core}];
  }
  int threadsPerCore = 0;
  for (const auto& [key, threads] : cores) threadsPerCore = std::max(threadsPerCore, threads);
  const int ncores = int(cores.size());
  for (int n : {1, 2, 3, ncores, ncores + 1}) {
    const std::vector<std::set<int>> sets = rankCpuSets(dir_ / ("n" + std::to_string(n)), n, {});
    if (n < 2) {
      for (const auto& s : sets) EXPECT_EQ(s, allowed) << "one rank: not bound";
      continue;
    }
    if (n > ncores) {
      EXPECT_EQ(sets, rankCpuSets(dir_ / "core", n, {"--bind-to", "core"})) << n << " ranks on " << ncores << " cores";
      continue;
    }
    std::set<int> all;
    size_t smallest = allowed.size(), largest = 0;
    for (int r = 0; r < n; ++r) {
      const std::set<int>& s = sets[size_t(r)];
      EXPECT_FALSE(s.empty()) << "rank " << r;
      for (int c : s) EXPECT_TRUE(all.insert(c).second) << "CPU " << c << " is in two ranks' shares";
      smallest = std::min(smallest, s.size());
      largest = std::max(largest, s.size());
    }
    EXPECT_EQ(all, allowed) << n << " ranks";
    EXPECT_LE(largest - smallest, size_t(threadsPerCore)) << n << " ranks: shares differ by more than a core";
  }
}

TEST_F(LoomrunTest, FailingRankStatusIsReturnedAndTheOthersStopped) {
  int status = runLoomrun({"-n", "3", "--", "sh", "-c",
                           pidFileScript("if [ $LOOM_RANK = 1 ]; then sleep 0.2; exit 7; fi; sleep 300")});
  EXPECT_EQ(status, 7);
  EXPECT_TRUE(std::regex_search(err_, std::regex(R"(loomrun: rank 1 \(pid \d+\) exited with status 7; )"
                                                 R"(stopping the other 2 ranks)")))
      << err_;
  std::vector<pid_t> pids = rankPids(3);
  ASSERT_EQ(pids.size(), 3u);
  for (pid_t pid : pids) EXPECT_TRUE(processGone(pid)) << "pid " << pid << " survived";
}

TEST_F(LoomrunTest, RankKilledBySignalIsNamedAndGivesSignalStatus) {
  int status = runLoomrun({"-n", "4", "--", "sh", "-c",
                           pidFileScript("if [ $LOOM_RANK = 2 ]; then sleep 0.2; kill -9 $$; fi; sleep 300")});
  EXPECT_EQ(status, 128 + SIGKILL);
  EXPECT_TRUE(std::regex_search(err_, std::regex(R"(loomrun: rank 2 \(pid \d+\) was killed by signal SIGKILL)")))
      << err_;
  for (pid_t pid : rankPids(4)) EXPECT_TRUE(processGone(pid)) << "pid " << pid << " survived";
}

TEST_F(LoomrunTest, AllRanksSucceedingGivesZero) {
  EXPECT_EQ(runLoomrun({"-n", "5", "--", "true"}), 0);
  EXPECT_EQ(err_, "");
}

TEST_F(LoomrunTest, InterruptStopsEveryRankEvenOnesIgnoringTerm) {
  // The ranks ignore SIGINT and SIGTERM, and have a child of their own:
  // only the SIGKILL after the grace period, sent to each process group,
  // ends them all.
  pid_t loomrun = start({"-n", "3", "--grace", "1", "--", "sh", "-c",
                         pidFileScript("trap '' INT TERM; sleep 300 & echo $! > " + (dir_ / "child.").string() +
                                       "$LOOM_RANK; wait")});
  ASSERT_TRUE(waitForPidFiles(3));
  kill(loomrun, SIGINT);
  EXPECT_EQ(finish(loomrun), 128 + SIGINT);
  EXPECT_NE(err_.find("loomrun: received SIGINT; stopping 3 ranks"), std::string::npos) << err_;
  for (pid_t pid : rankPids(3)) EXPECT_TRUE(processGone(pid)) << "rank pid " << pid << " survived";
  for (int r = 0; r < 3; ++r) {
    std::string text = readFile(dir_ / ("child." + std::to_string(r)));
    if (!text.empty()) {
      EXPECT_TRUE(processGone(pid_t(std::stol(text)))) << "grandchild of rank " << r << " survived";
    }
  }
}

TEST_F(LoomrunTest, TerminateIsForwarded) {
  pid_t loomrun = start({"-n", "2", "--", "sh", "-c", pidFileScript("sleep 300")});
  ASSERT_TRUE(waitForPidFiles(2));
  kill(loomrun, SIGTERM);
  EXPECT_EQ(finish(loomrun), 128 + SIGTERM);
  for (pid_t pid : rankPids(2)) EXPECT_TRUE(processGone(pid));
}

TEST_F(LoomrunTest, TimeoutStopsTheJobWith124) {
  EXPECT_EQ(runLoomrun({"-n", "2", "--timeout", "0.5", "--grace", "1", "--", "sh", "-c", pidFileScript("sleep 300")}),
            124);
  EXPECT_NE(err_.find("loomrun: timeout"), std::string::npos) << err_;
  for (pid_t pid : rankPids(2)) EXPECT_TRUE(processGone(pid));
}

TEST_F(LoomrunTest, UsageErrorsAndMissingCommands) {
  EXPECT_EQ(runLoomrun({"true"}), 2);
  EXPECT_NE(err_.find("-n"), std::string::npos) << err_;
  EXPECT_EQ(runLoomrun({"-n", "0", "true"}), 2);
  EXPECT_EQ(runLoomrun({"-n", "2", "--bogus", "true"}), 2);
  EXPECT_EQ(runLoomrun({"-n", "2"}), 2);
  EXPECT_EQ(runLoomrun({"-n", "2", "--", "/nonexistent/command"}), 127);
  EXPECT_NE(err_.find("cannot run '/nonexistent/command'"), std::string::npos) << err_;
  EXPECT_EQ(runLoomrun({"-h"}), 0);
  EXPECT_NE(out_.find("USAGE: loomrun"), std::string::npos);
}

}  // namespace
