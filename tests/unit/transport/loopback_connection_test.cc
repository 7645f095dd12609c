// Tests of transport/loopback/connection.h.
#include "transport/loopback/connection.h"

#include <gtest/gtest.h>

#include <vector>

#include "transport_test_util.h"

namespace loom::transport::loopback {
namespace {

TEST(Loopback, MatchesSendsWithReceivesInOrder) {
  LoopbackConnection c(4);
  EXPECT_EQ(c.peer(), 4);
  EXPECT_EQ(std::string(c.kind()), "loopback");
  std::vector<size_t> sizes = {0, 1, 4096, 100000};
  std::vector<std::vector<uint8_t>> src(sizes.size()), dst(sizes.size());
  std::vector<Transfer> s(sizes.size()), r(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    src[i].resize(sizes[i]);
    testing::fillPattern(src[i].data(), sizes[i], 9, uint32_t(i));
    dst[i].assign(sizes[i], 0);
    s[i] = Transfer{src[i].data(), sizes[i]};
    r[i] = Transfer{dst[i].data(), sizes[i]};
    ASSERT_TRUE(c.postSend(&s[i]).isOk());
  }
  // post* only queues.
  EXPECT_FALSE(s[0].done);
  EXPECT_FALSE(c.idle());
  for (auto& t : r) ASSERT_TRUE(c.postRecv(&t).isOk());
  ASSERT_TRUE(c.progress().isOk());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(s[i].done && r[i].done);
    EXPECT_EQ(r[i].progressed, sizes[i]);
    EXPECT_TRUE(testing::checkPattern(dst[i].data(), sizes[i], 9, uint32_t(i)));
  }
  EXPECT_TRUE(c.idle());
  std::vector<pollfd> fds;
  c.pollFds(&fds);
  EXPECT_TRUE(fds.empty());
}

// Only a connection that produces() takes a send from a producer.
TEST(Loopback, SendFromAProducerIsRefused) {
  struct NoSource final : Source {
    size_t ready() const override { return 4; }
    void produce(size_t, void*, size_t) override { ADD_FAILURE() << "produce called"; }
  } source;
  LoopbackConnection c(0);
  EXPECT_FALSE(c.produces());
  EXPECT_EQ(c.fusedStepBytes(), 0u);
  uint32_t out = 1;
  Transfer s{&out, 4};
  s.source = &source;
  Status st = c.postSend(&s);
  EXPECT_EQ(st.code(), Code::kInvalidUsage) << st.toString();
}

TEST(Loopback, ReceivePostedFirstWaitsForSend) {
  LoopbackConnection c(0);
  uint32_t in = 0, out = 0xdeadbeef;
  Transfer r{&in, 4}, s{&out, 4};
  ASSERT_TRUE(c.postRecv(&r).isOk());
  ASSERT_TRUE(c.progress().isOk());
  EXPECT_FALSE(r.done);
  ASSERT_TRUE(c.postSend(&s).isOk());
  ASSERT_TRUE(c.progress().isOk());
  EXPECT_TRUE(r.done);
  EXPECT_EQ(in, 0xdeadbeefu);
}

TEST(Loopback, SizeMismatchIsStickyError) {
  LoopbackConnection c(2);
  std::vector<uint8_t> a(8, 1), b(16, 2);
  Transfer s{a.data(), a.size()}, r{b.data(), b.size()};
  ASSERT_TRUE(c.postSend(&s).isOk());
  ASSERT_TRUE(c.postRecv(&r).isOk());
  Status err = c.progress();
  ASSERT_FALSE(err.isOk());
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("8-byte message where a 16-byte receive"), std::string::npos)
      << err.message();
  for (uint8_t x : b) EXPECT_EQ(x, 2);
  EXPECT_EQ(c.progress().message(), err.message());
  Transfer more{a.data(), 1};
  EXPECT_EQ(c.postSend(&more).message(), err.message());
}

TEST(Loopback, InPlaceSendIsAllowed) {
  LoopbackConnection c(0);
  std::vector<uint8_t> buf = {1, 2, 3};
  Transfer s{buf.data(), 3}, r{buf.data(), 3};
  ASSERT_TRUE(c.postSend(&s).isOk());
  ASSERT_TRUE(c.postRecv(&r).isOk());
  ASSERT_TRUE(c.progress().isOk());
  EXPECT_TRUE(r.done);
  EXPECT_EQ(buf[2], 3);
}

}  // namespace
}  // namespace loom::transport::loopback
