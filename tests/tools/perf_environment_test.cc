// Where the perf tools take their rank and size from, and in which order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tools/perf/environment.h"

namespace loom::perf {
namespace {

const std::vector<std::string> kNames = {
    "LOOM_RANK", "LOOM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK",
    "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "LOOM_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
    "LOCAL_RANK", "SLURM_LOCALID", "NCCL_COMM_ID", "LOOM_DEVICE", "NCCL_TESTS_DEVICE", "NCCL_TESTS_MIN_BW"};

class LaunchEnvTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& name : kNames) {
      if (const char* value = std::getenv(name.c_str())) saved_.push_back({name, value});
      unsetenv(name.c_str());
    }
  }
  void TearDown() override {
    for (const std::string& name : kNames) unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(LaunchEnvTest, SingleProcessWithoutLauncher) {
  Result<LaunchEnv> env = readLaunchEnv();
  ASSERT_TRUE(env.isOk());
  EXPECT_EQ(env->procRank, 0);
  EXPECT_EQ(env->nProcs, 1);
  EXPECT_EQ(env->rankSource, "");
  EXPECT_FALSE(env->hasCommId);
  EXPECT_EQ(env->deviceMode, "auto");
  EXPECT_LT(env->minBusBw, 0);
}

TEST_F(LaunchEnvTest, PrecedenceLoomThenMpiThenPmiThenTorchrunThenSlurm) {
  setenv("SLURM_PROCID", "4", 1);
  setenv("SLURM_NTASKS", "8", 1);
  EXPECT_EQ(readLaunchEnv()->procRank, 4);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  EXPECT_EQ(readLaunchEnv()->procRank, 3);
  setenv("PMI_RANK", "2", 1);
  setenv("PMI_SIZE", "8", 1);
  EXPECT_EQ(readLaunchEnv()->procRank, 2);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  EXPECT_EQ(readLaunchEnv()->procRank, 1);
  setenv("LOOM_RANK", "5", 1);
  setenv("LOOM_WORLD_SIZE", "6", 1);
  Result<LaunchEnv> env = readLaunchEnv();
  ASSERT_TRUE(env.isOk());
  EXPECT_EQ(env->procRank, 5);
  EXPECT_EQ(env->nProcs, 6);
  EXPECT_EQ(env->rankSource, "LOOM_RANK/LOOM_WORLD_SIZE");
  EXPECT_EQ(env->localRank, 5) << "without a local rank variable, the process rank";
  setenv("LOCAL_RANK", "1", 1);
  EXPECT_EQ(readLaunchEnv()->localRank, 1);
  setenv("LOOM_LOCAL_RANK", "0", 1);
  EXPECT_EQ(readLaunchEnv()->localRank, 0);
}

TEST_F(LaunchEnvTest, RejectsHalfPairsAndRanksOutOfRange) {
  setenv("LOOM_RANK", "0", 1);
  Result<LaunchEnv> half = readLaunchEnv();
  ASSERT_FALSE(half.isOk());
  EXPECT_NE(half.status().message().find("LOOM_WORLD_SIZE"), std::string::npos);
  setenv("LOOM_WORLD_SIZE", "2", 1);
  setenv("LOOM_RANK", "2", 1);
  EXPECT_FALSE(readLaunchEnv().isOk());
  setenv("LOOM_RANK", "x", 1);
  EXPECT_FALSE(readLaunchEnv().isOk());
}

TEST_F(LaunchEnvTest, DeviceModeRendezvousAndNcclTestsVariables) {
  setenv("NCCL_COMM_ID", "127.0.0.1:1234", 1);
  setenv("LOOM_DEVICE", "host", 1);
  setenv("NCCL_TESTS_DEVICE", "2", 1);
  setenv("NCCL_TESTS_MIN_BW", "12.5", 1);
  Result<LaunchEnv> env = readLaunchEnv();
  ASSERT_TRUE(env.isOk());
  EXPECT_TRUE(env->hasCommId);
  EXPECT_EQ(env->deviceMode, "host");
  EXPECT_EQ(env->firstDevice, 2);
  EXPECT_EQ(env->minBusBw, 12.5);
  setenv("LOOM_DEVICE", "gpu", 1);
  EXPECT_FALSE(readLaunchEnv().isOk());
}

}  // namespace
}  // namespace loom::perf
