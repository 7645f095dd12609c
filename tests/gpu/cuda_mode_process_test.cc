// Cuda mode with ranks as processes (cuda_mode_rank.cc), each on its own
// emulated device: the device queues and gates over real process
// boundaries, and a peer that dies without a word.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mp_util.h"

namespace {

using loom::test::ChildProcess;

// Starts `n` ranks running `scenario` and waits at most `seconds` for each
// (ChildProcess kills and reaps what is left when it goes).
std::vector<std::unique_ptr<ChildProcess>> runJob(int n, const std::string& scenario, int seconds,
                                                  const std::vector<std::string>& extraEnv = {}) {
  std::random_device rd;
  std::vector<std::string> env = {
      "NCCL_COMM_ID=127.0.0.1:" + std::to_string(loom::test::freeLoopbackPort()),
      "LOOM_COMM_SECRET=cuda-mode-" + std::to_string(rd()) + std::to_string(rd()), "LOOM_TIMEOUT_S=60",
      "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,P2P"};
  env.insert(env.end(), extraEnv.begin(), extraEnv.end());
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(ChildProcess::start(LOOM_CUDA_MODE_RANK_PATH, {std::to_string(r), std::to_string(n), scenario}, env));
  }
  for (auto& k : ranks) EXPECT_TRUE(k->wait(seconds)) << "a rank is still running after " << seconds << " s";
  return ranks;
}

class CudaModeProcesses : public ::testing::TestWithParam<int> {};

// Every rank checked its results, and its connections went through `via`.
void expectOk(const std::vector<std::unique_ptr<ChildProcess>>& ranks, const std::string& via) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const ChildProcess& k = *ranks[r];
    const std::string out = k.output();
    EXPECT_TRUE(k.exitedNormally() && k.status() == 0) << "rank " << r << " status " << k.status() << ":\n" << out;
    EXPECT_NE(out.find("rank " + std::to_string(r) + ": ok"), std::string::npos) << out;
    EXPECT_NE(out.find("via " + via), std::string::npos) << "rank " << r << " did not use " << via << ":\n" << out;
  }
}

// The GPUs' memory is mapped between the processes (CUDA IPC). Every rank
// is on its process's emulated device 0, whose UUID is the same in each:
// the UUIDs travel in the rank info, and the ranks see that they share one.
TEST_P(CudaModeProcesses, CollectivesOnDeviceBuffers) {
  const int n = GetParam();
  auto ranks = runJob(n, "collectives", 120);
  expectOk(ranks, "cudaipc");
  const std::string shared = "(GPU 00000000000000000000000000000001), shared by " + std::to_string(n) + " rank(s)";
  for (auto& k : ranks) EXPECT_NE(k->output().find(shared), std::string::npos) << k->output();
  // The registered buffer: mapped at a call, never while an operation ran
  // (the emulated device would have stopped the job).
  for (auto& k : ranks) EXPECT_NE(k->output().find("registered: its messages are copied straight"), std::string::npos) << k->output();
}

// NCCL_P2P_DISABLE: shared memory through pinned host slots.
TEST_P(CudaModeProcesses, P2pDisabledUsesSharedMemory) {
  expectOk(runJob(GetParam(), "collectives", 120, {"NCCL_P2P_DISABLE=1"}), "shm");
}

// The network path: no CUDA IPC, no shared memory; pinned host slots over TCP.
TEST_P(CudaModeProcesses, NetworkPathUsesTcp) {
  expectOk(runJob(GetParam(), "collectives", 120, {"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"}), "tcp");
}

// Where CUDA IPC cannot map a peer's memory, the pair falls back to shared
// memory, logged, and the results are the same.
TEST_P(CudaModeProcesses, IpcThatFailsFallsBackToSharedMemory) {
  auto ranks = runJob(GetParam(), "collectives", 120, {"LOOM_TEST_EMULATED_IPC=off"});
  expectOk(ranks, "shm");
  EXPECT_NE(ranks[0]->output().find("cannot attach cudaipc"), std::string::npos) << ranks[0]->output();
}
INSTANTIATE_TEST_SUITE_P(Ranks, CudaModeProcesses, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "n" + std::to_string(i.param); });

TEST(CudaModeProcessFailure, PeerThatDiesReleasesTheOthersStreams) {
  auto ranks = runJob(3, "peer-dies", 120);
  for (int r = 0; r < 3; ++r) {
    const ChildProcess& k = *ranks[size_t(r)];
    const std::string out = k.output();
    if (r == 1) {
      EXPECT_TRUE(k.exitedNormally() && k.status() == 3) << out;
    } else {
      EXPECT_TRUE(k.exitedNormally() && k.status() == 0) << "rank " << r << " status " << k.status() << ":\n" << out;
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": ok"), std::string::npos) << out;
    }
  }
}

}  // namespace
