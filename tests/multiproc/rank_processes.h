// A gtest fixture for tests that run ranks as processes of loom_mp_rank
// (LOOM_MP_RANK_PATH, which the test target defines): spawn() starts one,
// and after each test every child is killed and reaped, and the test fails
// if any process of ours is still around.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "mp_util.h"

namespace loom::test {

class RankProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    kids_.clear();
    EXPECT_TRUE(childrenOf(getpid()).empty()) << "child processes were left behind";
  }
  ChildProcess& spawn(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    auto child = ChildProcess::start(LOOM_MP_RANK_PATH, args, env);
    if (!child) std::abort();
    kids_.push_back(std::move(child));
    return *kids_.back();
  }
  std::vector<std::unique_ptr<ChildProcess>> kids_;
};

}  // namespace loom::test
