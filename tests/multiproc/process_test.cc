// The public API with real processes: each rank is a loom_mp_rank process
// started with fork + exec, meeting through NCCL_COMM_ID=127.0.0.1:<port>
// (with a fresh LOOM_COMM_SECRET) or through a unique id made here and
// passed on the command line. Each rank checks its own results bit for bit
// (the same case builder as the thread matrix) and reports a RESULT line.
#include <gtest/gtest.h>
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <tuple>

#include "mp_util.h"

namespace loom::test {
namespace {

const char* const kRankBinary = LOOM_MP_RANK_PATH;

std::string freshSecret() {
  std::random_device rd;
  return "mp-" + std::to_string(rd()) + "-" + std::to_string(rd());
}

class ProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    kids_.clear();  // kills and reaps anything still running
    EXPECT_TRUE(childrenOf(getpid()).empty()) << "child processes were left behind";
  }

  ChildProcess& spawn(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    auto child = ChildProcess::start(kRankBinary, args, env);
    EXPECT_NE(child, nullptr) << "cannot start " << kRankBinary;
    if (!child) std::abort();
    kids_.push_back(std::move(child));
    return *kids_.back();
  }

  // Waits for every child; each must exit 0 with RESULT code=0.
  void expectAllSucceed(double timeoutS) {
    for (size_t i = 0; i < kids_.size(); ++i) {
      ChildProcess& k = *kids_[i];
      const bool exited = k.wait(timeoutS);
      EXPECT_TRUE(exited) << "process " << i << " still running after " << timeoutS << " s:\n" << k.output();
      if (!exited) continue;
      EXPECT_EQ(k.status(), 0) << "process " << i << " output:\n" << k.output();
      EXPECT_EQ(resultField(k.output(), "code"), "0") << "process " << i << " output:\n" << k.output();
    }
  }

  std::vector<std::unique_ptr<ChildProcess>> kids_;
};

// (nranks, transport): loom's default between processes of one host
// (shared memory), or TCP with NCCL_SHM_DISABLE=1.
class ProcessRanks : public ProcessTest, public ::testing::WithParamInterface<std::tuple<int, std::string>> {};

// float sum AllReduce (in and out of place, 1031 and 1 Mi elements),
// AllGather, Broadcast from the last rank, ReduceScatter, AlltoAll, Send/Recv
// ring and all pairs, bfloat16 avg, Reduce, Gather, Scatter.
TEST_P(ProcessRanks, RepresentativeCollectivesThroughCommId) {
  const int n = std::get<0>(GetParam());
  const bool tcp = std::get<1>(GetParam()) == "tcp";
  const int port = freeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::vector<std::string> env = {"NCCL_COMM_ID=127.0.0.1:" + std::to_string(port),
                                        "LOOM_COMM_SECRET=" + freshSecret(), "LOOM_TIMEOUT_S=60",
                                        tcp ? "NCCL_SHM_DISABLE=1" : "NCCL_SHM_DISABLE=0"};
  for (int r = 0; r < n; ++r)
    spawn({"suite", "rank=" + std::to_string(r), "nranks=" + std::to_string(n)}, env);
  expectAllSucceed(100);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ProcessRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8), ::testing::Values("default", "tcp")),
                         [](const ::testing::TestParamInfo<ProcessRanks::ParamType>& info) {
                           const std::string& t = std::get<1>(info.param);
                           return "n" + std::to_string(std::get<0>(info.param)) + (t == "tcp" ? "_tcp" : "");
                         });

// The unique id made by this process (whose rendezvous root then runs
// here), handed to the ranks on their command lines.
TEST_F(ProcessTest, UniqueIdFromParent) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const int n = 3;
  for (int r = 0; r < n; ++r)
    spawn({"suite", "rank=" + std::to_string(r), "nranks=" + std::to_string(n), "id=" + idToHex(id)},
          {"LOOM_TIMEOUT_S=60"});
  expectAllSucceed(100);
}

// Rings from the topology: 2 "hosts" (NCCL_HOSTID) x 3 ranks, numbered
// alternately (rank r on host r % 2), each host loaded from the 2-socket
// fixture (two 100 GbE NICs). Rank order would cross between the hosts at
// every step; the schedule's two rings cross each host boundary once per
// direction, and every collective is still right.
TEST_F(ProcessTest, RingsFromTheTopologyCrossEachHostOnce) {
  const int n = 6;
  const int port = freeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string secret = freshSecret();
  char dump[] = "/tmp/loom-topo-dump-XXXXXX";
  const int fd = mkstemp(dump);
  ASSERT_GE(fd, 0);
  close(fd);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env = {"NCCL_COMM_ID=127.0.0.1:" + std::to_string(port), "LOOM_COMM_SECRET=" + secret,
                                    "LOOM_TIMEOUT_S=60", "NCCL_HOSTID=host" + std::to_string(r % 2),
                                    std::string("NCCL_TOPO_FILE=") + LOOM_TOPO_FIXTURES + "/cpu-2socket.xml",
                                    "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=GRAPH,INIT"};
    // Host 0's first rank writes its topology (host 1's would too: only
    // rank 0 is told where, so the file has one writer).
    if (r == 0) env.push_back(std::string("NCCL_TOPO_DUMP_FILE=") + dump);
    spawn({"suite", "rank=" + std::to_string(r), "nranks=" + std::to_string(n)}, env);
  }
  expectAllSucceed(100);
  std::ifstream written(dump);
  const std::string xml((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  std::remove(dump);
  EXPECT_NE(xml.find("<system version=\"1\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("name=\"ens2f0\""), std::string::npos) << xml;
  const std::string out = kids_[0]->output();
  int rings = 0;
  for (size_t at = out.find("Channel "); at != std::string::npos; at = out.find("Channel ", at + 1)) {
    const size_t colon = out.find(':', at);
    const size_t eol = out.find('\n', at);
    std::vector<int> order;
    std::istringstream ranks(out.substr(colon + 1, eol - colon - 1));
    for (int r; ranks >> r;) order.push_back(r);
    ASSERT_EQ(order.size(), size_t(n)) << out.substr(at, eol - at);
    int crossings = 0;
    for (int i = 0; i < n; ++i) crossings += order[size_t(i)] % 2 != order[size_t((i + 1) % n)] % 2;
    EXPECT_EQ(crossings, 2) << out.substr(at, eol - at);
    ++rings;
  }
  EXPECT_EQ(rings, 2) << out;  // one ring per 100 GbE NIC; the 1 GbE port is left out
  // Every rank logs its place in both trees, NCCL's way.
  for (const auto& k : kids_) EXPECT_NE(k->output().find("Trees [0] "), std::string::npos) << k->output();
  EXPECT_NE(out.find("topology loaded from"), std::string::npos) << out;
  // Where each rank's init time went, NCCL's "Init timings" way: these
  // ranks span two "hosts", so no board, but a rendezvous and connections.
  for (const auto& k : kids_) {
    const std::string& o = k->output();
    const size_t at = o.find(" init timings: ");
    ASSERT_NE(at, std::string::npos) << o;
    const std::string line = o.substr(at, o.find('\n', at) - at);
    EXPECT_NE(line.find(" ms: "), std::string::npos) << line;
    EXPECT_NE(line.find("rendezvous "), std::string::npos) << line;
    EXPECT_NE(line.find("connections "), std::string::npos) << line;
  }
}

// The CPUs this process may run on.
std::vector<int> allowedCpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Runs `spawnAll` with this process (and so the children it forks) bound
// to `cpu`, then restores its CPUs.
template <typename F>
void spawnBoundTo(int cpu, F spawnAll) {
  cpu_set_t old, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof old, &old), 0);
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  spawnAll();
  ASSERT_EQ(sched_setaffinity(0, sizeof old, &old), 0);
}

// AllGather's own blocks go single-copy over shared memory (the peer reads
// them with process_vm_readv; NCCL_DEBUG=INFO says so once per connection):
// ranks on one CPU always, ranks with a CPU each unless the sender's copies
// into the FIFO ran slowly (transport/shm/handoff.h; it says so at INFO);
// never with LOOM_SHM_SINGLE_COPY_MIN=0, or where process_vm_readv is not
// permitted. The suite above checks the data.
TEST_F(ProcessTest, AllGatherGoesSingleCopyOverSharedMemory) {
  const std::vector<int> cpus = allowedCpus();
  ASSERT_FALSE(cpus.empty());
  struct Case {
    const char* min;
    bool shareCpu;
  };
  std::vector<Case> cases{{"65536", true}, {"0", true}};
  if (cpus.size() >= 2) cases.insert(cases.end(), {{"65536", false}, {"0", false}});
  else std::printf("note: one CPU here; ranks with a CPU each were not tried\n");
  for (const Case& c : cases) {
    const char* min = c.min;
    SCOPED_TRACE(std::string("LOOM_SHM_SINGLE_COPY_MIN=") + min + (c.shareCpu ? ", one CPU" : ", a CPU each"));
    kids_.clear();
    const int port = freeLoopbackPort();
    ASSERT_GT(port, 0);
    const std::vector<std::string> env = {"NCCL_COMM_ID=127.0.0.1:" + std::to_string(port),
                                          "LOOM_COMM_SECRET=" + freshSecret(), "LOOM_TIMEOUT_S=60",
                                          "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=SHM",
                                          std::string("LOOM_SHM_SINGLE_COPY_MIN=") + min};
    // Two of each collective, AllGather with blocks of 256 KiB.
    for (int r = 0; r < 2; ++r) {
      spawnBoundTo(cpus[c.shareCpu ? 0 : size_t(r)], [&] {
        spawn({"loop", "rank=" + std::to_string(r), "nranks=2", "steps=10", "count=65536"}, env);
      });
    }
    ASSERT_FALSE(HasFatalFailure());
    expectAllSucceed(60);
    for (const auto& k : kids_) {
      const std::string out = k->output();
      const bool single = out.find("straight from its memory (single copy") != std::string::npos;
      if (std::string(min) == "0") {
        EXPECT_FALSE(single) << out;
      } else if (out.find("single-copy receive on") == std::string::npos) {
        std::printf("note: process_vm_readv is not permitted here; single copy was not exercised\n");
      } else if (!single && !c.shareCpu && out.find("run slowly") != std::string::npos) {
        std::printf("note: copies into the FIFO ran slowly here, so they streamed instead of going single-copy\n");
      } else {
        EXPECT_TRUE(single) << out;
      }
    }
  }
}

// Where no GPU driver is present, auto means host.
bool gpuDriverPresent() { return ::access("/dev/nvidiactl", F_OK) == 0; }

// LOOM_DEVICE=host on one rank and the default (auto: host without a GPU)
// on the other agree.
TEST_F(ProcessTest, DeviceHostAndAutoAgree) {
  if (gpuDriverPresent()) GTEST_SKIP() << "skipped: this machine has a GPU driver, so auto may mean cuda";
  const int port = freeLoopbackPort();
  const std::string secret = freshSecret();
  const std::string commId = "NCCL_COMM_ID=127.0.0.1:" + std::to_string(port);
  spawn({"init", "rank=0", "nranks=2"}, {commId, "LOOM_COMM_SECRET=" + secret, "LOOM_DEVICE=host"});
  spawn({"init", "rank=1", "nranks=2"}, {commId, "LOOM_COMM_SECRET=" + secret, "LOOM_DEVICE=auto"});
  expectAllSucceed(60);
}

// Without a usable CUDA device (or without CUDA in the build) asking for
// cuda mode must fail init with a message that says so, not crash or hang.
TEST_F(ProcessTest, DeviceCudaFailsClearly) {
  if (gpuDriverPresent()) GTEST_SKIP() << "skipped: this machine has a GPU driver, so cuda mode may work";
  ChildProcess& k = spawn({"init", "rank=0", "nranks=1"}, {"LOOM_DEVICE=cuda"});
  ASSERT_TRUE(k.wait(60)) << k.output();
  const std::string out = k.output();
  EXPECT_EQ(k.status(), 0) << out;  // the helper ran to the end
  const std::string code = resultField(out, "code");
  EXPECT_NE(code, "0") << out;
  EXPECT_NE(code, "") << out;
  const std::string error = resultField(out, "error");
  EXPECT_TRUE(error.find("cuda") != std::string::npos || error.find("CUDA") != std::string::npos) << error;
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
