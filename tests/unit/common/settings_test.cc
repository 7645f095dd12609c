#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>

#include "common/settings.h"

namespace loom::settings {
namespace {

class SettingsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("LOOM_TIMEOUT_S");
    unsetenv("NCCL_CONF_FILE");
    unsetenv("LOOM_SOCKETS_PER_PEER");
    unsetenv("NCCL_DEBUG");
    reload();
  }
};

TEST_F(SettingsTest, TableIsWellFormed) {
  std::set<std::string> names;
  for (const Spec& s : table()) {
    std::string name = s.name;
    EXPECT_TRUE(name.rfind("NCCL_", 0) == 0 || name.rfind("LOOM_", 0) == 0) << name;
    EXPECT_TRUE(names.insert(name).second) << "declared twice: " << name;
    EXPECT_GT(std::string(s.doc).size(), 20u) << name << " needs a doc";
    EXPECT_NE(find(name), nullptr);
  }
  EXPECT_EQ(find("NCCL_NO_SUCH_SETTING"), nullptr);
}

TEST_F(SettingsTest, DefaultsApply) {
  reload();
  auto cfg = current();
  EXPECT_EQ(cfg->getInt("LOOM_TIMEOUT_S"), 1800);
  EXPECT_EQ(cfg->source("LOOM_TIMEOUT_S"), Source::kDefault);
  EXPECT_FALSE(cfg->isSet("LOOM_TIMEOUT_S"));
}

TEST_F(SettingsTest, EnvironmentWins) {
  setenv("LOOM_TIMEOUT_S", "17", 1);
  reload();
  EXPECT_EQ(current()->getInt("LOOM_TIMEOUT_S"), 17);
  EXPECT_EQ(current()->source("LOOM_TIMEOUT_S"), Source::kEnvironment);
}

TEST_F(SettingsTest, ReadOnceUntilReload) {
  reload();
  auto before = current();
  setenv("LOOM_TIMEOUT_S", "5", 1);
  EXPECT_EQ(current()->getInt("LOOM_TIMEOUT_S"), before->getInt("LOOM_TIMEOUT_S"));
  reload();
  EXPECT_EQ(current()->getInt("LOOM_TIMEOUT_S"), 5);
  EXPECT_EQ(before->getInt("LOOM_TIMEOUT_S"), 1800) << "an old snapshot never changes";
}

TEST_F(SettingsTest, BadNumberFallsBackWithWarning) {
  setenv("LOOM_SOCKETS_PER_PEER", "four", 1);
  reload();
  EXPECT_EQ(current()->getInt("LOOM_SOCKETS_PER_PEER"), 2);
  EXPECT_NE(current()->warnings().find("LOOM_SOCKETS_PER_PEER"), std::string::npos);
}

TEST_F(SettingsTest, ConfFileIsReadAndEnvOverridesIt) {
  char path[] = "/tmp/loom-conf-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream f(path);
    f << "# comment\nLOOM_TIMEOUT_S = 99\nNCCL_DEBUG=INFO\nUNKNOWN=1\n";
  }
  setenv("NCCL_CONF_FILE", path, 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  reload();
  EXPECT_EQ(current()->getInt("LOOM_TIMEOUT_S"), 99);
  EXPECT_EQ(current()->source("LOOM_TIMEOUT_S"), Source::kConfFile);
  EXPECT_EQ(current()->getString("NCCL_DEBUG"), "WARN");
  unlink(path);
}

// NCCL_* names loom does not read, from the environment and a conf file,
// are listed once each; loom's own, nccl-tests' (NCCL_TESTS_*, read by the
// perf tools) and other programs' prefixes are not.
TEST_F(SettingsTest, UnusedNcclNamesAreListed) {
  auto none = [](const char*) -> const char* { return nullptr; };
  auto cfg = build(none, {{"NCCL_NVLS_ENABLE", "0"}, {"NCCL_DEBUG", "INFO"}, {"LOOM_NO_SUCH", "1"}},
                   {"NCCL_IB_ADAPTIVE_ROUTING", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "TORCH_NCCL_BLOCKING_WAIT",
                    "NCCL_TESTS_MIN_BW"});
  EXPECT_EQ(cfg->unused(), "NCCL_IB_ADAPTIVE_ROUTING, NCCL_NVLS_ENABLE");
  EXPECT_EQ(build(none, {})->unused(), "");
  setenv("NCCL_NO_SUCH_KNOB", "1", 1);
  reload();
  EXPECT_NE(current()->unused().find("NCCL_NO_SUCH_KNOB"), std::string::npos) << current()->unused();
  unsetenv("NCCL_NO_SUCH_KNOB");
  reload();
  EXPECT_EQ(current()->unused().find("NCCL_NO_SUCH_KNOB"), std::string::npos);
}

}  // namespace
}  // namespace loom::settings
