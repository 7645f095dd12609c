#include <gtest/gtest.h>

#include "common/status.h"

namespace loom {
namespace {

Status failsDeep() { return invalidArgument("count is too large"); }
Status failsMiddle() {
  LOOM_TRY(failsDeep());
  return Status::ok();
}
Result<int> value(bool ok) {
  if (!ok) return remoteError("rank 3 is gone");
  return 42;
}
Status usesValue(bool ok, int* out) {
  LOOM_ASSIGN_OR_RETURN(int v, value(ok));
  *out = v;
  return Status::ok();
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.code(), Code::kSuccess);
  EXPECT_EQ(s.message(), "");
}

TEST(Status, CodesMatchNcclResultValues) {
  EXPECT_EQ(int(Code::kCudaError), 1);
  EXPECT_EQ(int(Code::kSystemError), 2);
  EXPECT_EQ(int(Code::kInternalError), 3);
  EXPECT_EQ(int(Code::kInvalidArgument), 4);
  EXPECT_EQ(int(Code::kInvalidUsage), 5);
  EXPECT_EQ(int(Code::kRemoteError), 6);
  EXPECT_EQ(int(Code::kInProgress), 7);
}

TEST(Status, TryPropagatesWithTrail) {
  Status s = failsMiddle();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "count is too large");
  EXPECT_NE(s.toString().find("status_test.cc"), std::string::npos) << s.toString();
}

TEST(Status, ContextPrefixesTheMessage) {
  Status s = remoteError("peer closed");
  s.addContext("AllReduce #3");
  EXPECT_EQ(s.message(), "AllReduce #3: peer closed");
}

TEST(Status, CopiesDoNotShareTrailEdits) {
  Status a = internalError("x");
  Status b = a;
  b.addContext("more");
  EXPECT_EQ(a.message(), "x");
  EXPECT_EQ(b.message(), "more: x");
}

TEST(Result, ValueOrError) {
  int v = 0;
  EXPECT_TRUE(usesValue(true, &v).isOk());
  EXPECT_EQ(v, 42);
  Status s = usesValue(false, &v);
  EXPECT_EQ(s.code(), Code::kRemoteError);
}

TEST(Status, ErrnoMessage) {
  Status s = systemErrno("connect to 1.2.3.4:5", ECONNREFUSED);
  EXPECT_EQ(s.code(), Code::kSystemError);
  EXPECT_NE(s.message().find("connect to 1.2.3.4:5"), std::string::npos);
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
