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
  Result<LaunchEnv> beyond = readLaunchEnv();
  ASSERT_FALSE(beyond.isOk());
  EXPECT_NE(
      beyond.status().message().find("LOOM_RANK=2 is not below LOOM_WORLD_SIZE=2 (process ranks run from 0 to 1)"),
      std::string::npos)
      << beyond.status().message();
  setenv("LOOM_RANK", "x", 1);
  EXPECT_FALSE(readLaunchEnv().isOk());
  setenv("LOOM_RANK", "0", 1);
  setenv("LOOM_WORLD_SIZE", "0", 1);
  Result<LaunchEnv> empty = readLaunchEnv();
  ASSERT_FALSE(empty.isOk());
  EXPECT_NE(empty.status().message().find("LOOM_WORLD_SIZE=0: the number of processes must be at least 1"),
            std::string::npos)
      << empty.status().message();
}

// Stale variables of one launcher under another (LOOM_RANK exported in the
// shell that runs mpirun) make every process rank 0 of a world of its own;
// the tool says which pair it used and which it ignored.
TEST_F(LaunchEnvTest, NotesOtherLaunchersPairsThatDisagree) {
  setenv("LOOM_RANK", "0", 1);
  setenv("LOOM_WORLD_SIZE", "1", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("PMI_RANK", "0", 1);  // half a pair: not a launcher's, ignored quietly
  setenv("RANK", "0", 1);      // agrees: nothing to say
  setenv("WORLD_SIZE", "1", 1);
  setenv("SLURM_PROCID", "3", 1);  // the allocation around the launcher: differs by design
  setenv("SLURM_NTASKS", "8", 1);
  Result<LaunchEnv> env = readLaunchEnv();
  ASSERT_TRUE(env.isOk()) << env.status().message();
  EXPECT_EQ(env->procRank, 0);
  EXPECT_EQ(env->nProcs, 1);
  ASSERT_EQ(env->ignoredPairs.size(), 1u);
  EXPECT_EQ(env->ignoredPairs[0],
            "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 are ignored: LOOM_RANK/LOOM_WORLD_SIZE come first and say "
            "rank 0 of 1 (unset stale launcher variables if that is wrong)");
  setenv("WORLD_SIZE", "x", 1);  // not a number in an ignored pair: noted, not an error
  env = readLaunchEnv();
  ASSERT_TRUE(env.isOk());
  EXPECT_EQ(env->ignoredPairs.size(), 2u);
  unsetenv("LOOM_RANK");
  unsetenv("LOOM_WORLD_SIZE");
  unsetenv("WORLD_SIZE");
  unsetenv("RANK");
  env = readLaunchEnv();
  ASSERT_TRUE(env.isOk());
  EXPECT_EQ(env->rankSource, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE");
  EXPECT_TRUE(env->ignoredPairs.empty());
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
