#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/log.h"
#include "common/settings.h"

namespace loom::log {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class LogTest : public ::testing::Test {
 protected:
  void configure(const char* level, const char* subsys) {
    path_ = "/tmp/loom-log-test-%p.txt";
    setenv("NCCL_DEBUG_FILE", path_.c_str(), 1);
    if (level) setenv("NCCL_DEBUG", level, 1); else unsetenv("NCCL_DEBUG");
    if (subsys) setenv("NCCL_DEBUG_SUBSYS", subsys, 1); else unsetenv("NCCL_DEBUG_SUBSYS");
    settings::reload();
    reset();
    real_ = "/tmp/loom-log-test-" + std::to_string(getpid()) + ".txt";
  }
  void TearDown() override {
    unsetenv("NCCL_DEBUG_FILE");
    unsetenv("NCCL_DEBUG");
    unsetenv("NCCL_DEBUG_SUBSYS");
    settings::reload();
    reset();
    unlink(real_.c_str());
  }
  std::string path_, real_;
};

TEST_F(LogTest, InfoLinesHaveNcclPrefixAndPidInFileName) {
  configure("INFO", "INIT");
  ScopedRank rank(3);
  LOOM_INFO(kInit, "hello %d", 42);
  LOOM_INFO(kNet, "filtered out");
  std::string text = slurp(real_);
  EXPECT_NE(text.find("[3] NCCL INFO hello 42"), std::string::npos) << text;
  EXPECT_EQ(text.find("filtered out"), std::string::npos) << text;
  EXPECT_NE(text.find(":" + std::to_string(getpid()) + ":"), std::string::npos) << text;
}

TEST_F(LogTest, CaretExcludesSubsystems) {
  configure("INFO", "^NET");
  LOOM_INFO(kNet, "net line");
  LOOM_INFO(kColl, "coll line");
  std::string text = slurp(real_);
  EXPECT_EQ(text.find("net line"), std::string::npos);
  EXPECT_NE(text.find("coll line"), std::string::npos);
}

TEST_F(LogTest, WarnLevelHidesInfoButKeepsLastWarning) {
  configure("WARN", nullptr);
  LOOM_INFO(kInit, "quiet");
  LOOM_WARN("loud %s", "warning");
  std::string text = slurp(real_);
  EXPECT_EQ(text.find("quiet"), std::string::npos);
  EXPECT_NE(text.find("NCCL WARN loud warning"), std::string::npos);
  EXPECT_STREQ(lastWarning(), "loud warning");
}

TEST_F(LogTest, UnsetPrintsNothingButRemembersWarnings) {
  configure(nullptr, nullptr);
  LOOM_WARN("silent warning");
  EXPECT_EQ(slurp(real_).find("silent warning"), std::string::npos);
  EXPECT_STREQ(lastWarning(), "silent warning");
}

TEST_F(LogTest, DisabledLevelDoesNotEvaluateArguments) {
  configure("WARN", nullptr);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  LOOM_INFO(kInit, "%d", count());
  EXPECT_EQ(evaluated, 0);
}

TEST_F(LogTest, VersionLevelPrintsTheVersionLine) {
  configure("VERSION", nullptr);
  EXPECT_EQ(level(), Level::kVersion);
}

}  // namespace
}  // namespace loom::log
