// Tests of transport/tcp/connection.h over real TCP sockets on 127.0.0.1,
// with each side driven by its own thread.
#include "transport/tcp/connection.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <memory>
#include <numeric>
#include <thread>

#include "transport_test_util.h"

namespace loom::transport::tcp {
namespace {

using testing::checkPattern;
using testing::fillPattern;
using testing::makeTcpSockets;
using testing::waitAll;
using testing::waitForError;

constexpr int kRankA = 0;
constexpr int kRankB = 1;

struct Pair {
  std::unique_ptr<TcpConnection> a;  // rank A's connection to B
  std::unique_ptr<TcpConnection> b;  // rank B's connection to A
};

Pair makePair(size_t sockets, size_t stripeMin) {
  auto sets = makeTcpSockets(sockets);
  EXPECT_TRUE(sets.isOk()) << sets.status().toString();
  Pair p;
  if (!sets.isOk()) return p;
  p.a = std::make_unique<TcpConnection>(kRankB, std::move(sets->a), stripeMin);
  p.b = std::make_unique<TcpConnection>(kRankA, std::move(sets->b), stripeMin);
  return p;
}

// Sends and receives `sizes` in both directions at once; each side checks
// what it received.
struct Stream {
  std::vector<std::vector<uint8_t>> sendBufs, recvBufs;
  std::vector<Transfer> sends, recvs;
};

Stream makeStream(const std::vector<size_t>& sizes, uint32_t sendStream) {
  Stream s;
  s.sendBufs.resize(sizes.size());
  s.recvBufs.resize(sizes.size());
  s.sends.resize(sizes.size());
  s.recvs.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    s.sendBufs[i].resize(sizes[i]);
    fillPattern(s.sendBufs[i].data(), sizes[i], sendStream, uint32_t(i));
    s.recvBufs[i].assign(sizes[i], 0);
    s.sends[i].data = s.sendBufs[i].data();
    s.sends[i].bytes = sizes[i];
    s.recvs[i].data = s.recvBufs[i].data();
    s.recvs[i].bytes = sizes[i];
  }
  return s;
}

// Posts everything up front, then progresses until done.
Status runSide(TcpConnection& c, Stream& s) {
  std::vector<Transfer*> all;
  for (size_t i = 0; i < s.sends.size(); ++i) {
    LOOM_TRY(c.postSend(&s.sends[i]));
    LOOM_TRY(c.postRecv(&s.recvs[i]));
    all.push_back(&s.sends[i]);
    all.push_back(&s.recvs[i]);
  }
  return waitAll(c, all, Deadline::afterSeconds(120));
}

std::vector<size_t> mixedSizes() {
  std::vector<size_t> sizes = {0,     1,     7,         4095,      4096,     4097,   65535,
                               65536, 65537, 3u << 20,  0,         1,        123457, (5u << 20) + 3,
                               24,    23,    16 * 1024, 16 * 1024 + 25, 0,  999,    (64u << 10) - 1};
  for (int i = 0; i < 200; ++i) sizes.push_back(size_t(i * 37 % 3001));
  return sizes;
}

class TcpMixed : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

TEST_P(TcpMixed, ManyMixedSizesBothDirectionsConcurrently) {
  auto [sockets, stripeMin] = GetParam();
  Pair p = makePair(sockets, stripeMin);
  ASSERT_TRUE(p.a && p.b);
  std::vector<size_t> sizes = mixedSizes();
  Stream sa = makeStream(sizes, 100);  // A sends stream 100
  Stream sb = makeStream(sizes, 200);  // B sends stream 200
  Status stB;
  std::thread tb([&] { stB = runSide(*p.b, sb); });
  Status stA = runSide(*p.a, sa);
  tb.join();
  ASSERT_TRUE(stA.isOk()) << stA.toString();
  ASSERT_TRUE(stB.isOk()) << stB.toString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(sa.sends[i].done && sa.recvs[i].done && sb.sends[i].done && sb.recvs[i].done);
    EXPECT_EQ(sa.recvs[i].progressed, sizes[i]);
    EXPECT_EQ(sb.sends[i].progressed, sizes[i]);
    EXPECT_TRUE(checkPattern(sa.recvBufs[i].data(), sizes[i], 200, uint32_t(i))) << "msg " << i;
    EXPECT_TRUE(checkPattern(sb.recvBufs[i].data(), sizes[i], 100, uint32_t(i))) << "msg " << i;
  }
  EXPECT_TRUE(p.a->idle());
  EXPECT_TRUE(p.b->idle());
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t(0));
  auto sent = p.a->bytesSentPerSocket();
  auto recv = p.b->bytesReceivedPerSocket();
  EXPECT_EQ(std::accumulate(sent.begin(), sent.end(), uint64_t(0)), total);
  EXPECT_EQ(sent, recv);
}

INSTANTIATE_TEST_SUITE_P(SocketsAndStripe, TcpMixed,
                         ::testing::Values(std::make_pair(size_t(1), size_t(65536)),
                                           std::make_pair(size_t(2), size_t(65536)),
                                           std::make_pair(size_t(4), size_t(1)),
                                           std::make_pair(size_t(3), size_t(4096))));

TEST(Tcp, ReceivesPostedLateOneAtATime) {
  // A sends everything at once; B posts each receive only after the previous
  // one completed, so headers and payloads wait in B's staging area and socket.
  Pair p = makePair(2, 8192);
  ASSERT_TRUE(p.a && p.b);
  std::vector<size_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(size_t(i % 7 == 0 ? 20000 + i : i * 3));
  Stream sa = makeStream(sizes, 7);
  Stream sb = makeStream(sizes, 8);
  Status stA;
  std::thread ta([&] {
    std::vector<Transfer*> all;
    for (auto& t : sa.sends) {
      stA = p.a->postSend(&t);
      if (!stA.isOk()) return;
      all.push_back(&t);
    }
    stA = waitAll(*p.a, all, Deadline::afterSeconds(120));
  });
  Status stB;
  for (size_t i = 0; i < sizes.size() && stB.isOk(); ++i) {
    stB = p.b->postRecv(&sb.recvs[i]);
    if (stB.isOk()) stB = waitAll(*p.b, {&sb.recvs[i]}, Deadline::afterSeconds(120));
  }
  ta.join();
  ASSERT_TRUE(stA.isOk()) << stA.toString();
  ASSERT_TRUE(stB.isOk()) << stB.toString();
  for (size_t i = 0; i < sizes.size(); ++i)
    EXPECT_TRUE(checkPattern(sb.recvBufs[i].data(), sizes[i], 7, uint32_t(i))) << i;
}

TEST(Tcp, DoneFlagsFollowPostingOrder) {
  Pair p = makePair(4, 4096);
  ASSERT_TRUE(p.a && p.b);
  std::vector<size_t> sizes = {1 << 20, 10, 20, 30};
  Stream sa = makeStream(sizes, 1);
  Stream sb = makeStream(sizes, 2);
  for (auto& t : sa.sends) ASSERT_TRUE(p.a->postSend(&t).isOk());
  for (auto& t : sb.recvs) ASSERT_TRUE(p.b->postRecv(&t).isOk());
  std::thread ta([&] {
    std::vector<Transfer*> all;
    for (auto& t : sa.sends) all.push_back(&t);
    waitAll(*p.a, all, Deadline::afterSeconds(60)).ignore();
  });
  Deadline d = Deadline::afterSeconds(60);
  while (!sb.recvs.back().done && !d.expired()) {
    ASSERT_TRUE(p.b->progress().isOk());
    for (size_t i = 1; i < sizes.size(); ++i)
      if (sb.recvs[i].done) {
        ASSERT_TRUE(sb.recvs[i - 1].done) << "message " << i << " before " << i - 1;
      }
  }
  ta.join();
  EXPECT_TRUE(sb.recvs.back().done);
}

TEST(Tcp, LargeMessagesAreStripedSmallOnesAreNot) {
  constexpr size_t kSockets = 4;
  Pair p = makePair(kSockets, 65536);
  ASSERT_TRUE(p.a && p.b);
  // Large: 1 MiB + 5 over 4 sockets, every socket gets a share.
  Stream big = makeStream({(1u << 20) + 5}, 3);
  ASSERT_TRUE(p.a->postSend(&big.sends[0]).isOk());
  ASSERT_TRUE(p.b->postRecv(&big.recvs[0]).isOk());
  Status sb;
  std::thread tb([&] { sb = waitAll(*p.b, {&big.recvs[0]}, Deadline::afterSeconds(60)); });
  Status sa = waitAll(*p.a, {&big.sends[0]}, Deadline::afterSeconds(60));
  tb.join();
  ASSERT_TRUE(sa.isOk()) << sa.toString();
  ASSERT_TRUE(sb.isOk()) << sb.toString();
  EXPECT_TRUE(checkPattern(big.recvBufs[0].data(), big.recvBufs[0].size(), 3, 0));
  std::vector<uint64_t> sent = p.a->bytesSentPerSocket();
  ASSERT_EQ(sent.size(), kSockets);
  for (size_t i = 0; i < kSockets; ++i) {
    EXPECT_GT(sent[i], 0u) << "socket " << i << " carried no part of the large message";
    EXPECT_LE(sent[i], (1u << 20) / 2) << "socket " << i << " carried more than half";
  }
  EXPECT_EQ(p.b->bytesReceivedPerSocket(), sent);

  // Small messages: each goes whole over exactly one socket.
  for (int m = 0; m < 6; ++m) {
    std::vector<uint64_t> before = p.a->bytesSentPerSocket();
    Stream small = makeStream({1000}, 10 + m);
    ASSERT_TRUE(p.a->postSend(&small.sends[0]).isOk());
    ASSERT_TRUE(p.b->postRecv(&small.recvs[0]).isOk());
    std::thread t2([&] { sb = waitAll(*p.b, {&small.recvs[0]}, Deadline::afterSeconds(60)); });
    sa = waitAll(*p.a, {&small.sends[0]}, Deadline::afterSeconds(60));
    t2.join();
    ASSERT_TRUE(sa.isOk() && sb.isOk()) << sa.toString() << sb.toString();
    std::vector<uint64_t> after = p.a->bytesSentPerSocket();
    int changed = 0;
    for (size_t i = 0; i < kSockets; ++i) {
      if (after[i] != before[i]) {
        ++changed;
        EXPECT_EQ(after[i] - before[i], 1000u);
      }
    }
    EXPECT_EQ(changed, 1) << "a small message was split over sockets";
    EXPECT_TRUE(checkPattern(small.recvBufs[0].data(), 1000, 10 + m, 0));
  }
}

TEST(Tcp, PlanCoversMessageExactly) {
  PiecePlan plan[8];
  for (size_t sockets : {1, 2, 3, 8}) {
    for (size_t bytes : {size_t(0), size_t(1), size_t(4096), size_t(5000), size_t(1 << 20) + 1}) {
      for (uint64_t seq : {0, 1, 5}) {
        size_t n = planMessage(seq, bytes, sockets, 1, plan);
        ASSERT_GE(n, 1u);
        ASSERT_LE(n, sockets);
        size_t off = 0;
        std::vector<bool> used(sockets, false);
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(plan[i].offset, off);
          EXPECT_LT(plan[i].socket, sockets);
          EXPECT_FALSE(used[plan[i].socket]) << "two pieces on one socket";
          used[plan[i].socket] = true;
          if (i + 1 < n) {
            EXPECT_EQ(plan[i].length % kStripeAlign, 0u);
          }
          off += plan[i].length;
        }
        EXPECT_EQ(off, bytes);
      }
    }
  }
}

// The receive side of a mismatch must fail, name the sizes and leave the
// receive buffer untouched.
void expectMismatch(size_t sockets, size_t stripeMin, size_t sendBytes, size_t recvBytes,
                    const char* expectedText) {
  Pair p = makePair(sockets, stripeMin);
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> src(sendBytes, 0x11), dst(recvBytes, 0xAB);
  Transfer s{src.data(), src.size()};
  Transfer r{dst.data(), dst.size()};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  std::thread ta([&] { waitAll(*p.a, {&s}, Deadline::afterSeconds(10)).ignore(); });
  Status err = waitForError(*p.b, Deadline::afterSeconds(60));
  ta.join();
  ASSERT_FALSE(err.isOk()) << "size mismatch went unnoticed";
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 0"), std::string::npos) << err.message();
  if (expectedText) {
    EXPECT_NE(err.message().find(expectedText), std::string::npos) << err.message();
  }
  EXPECT_FALSE(r.done);
  for (uint8_t b : dst) ASSERT_EQ(b, 0xAB) << "receive buffer was written despite the mismatch";
  // Sticky: every later call reports the same error.
  Transfer r2{dst.data(), 1};
  Status again = p.b->postRecv(&r2);
  EXPECT_EQ(again.message(), err.message());
  EXPECT_EQ(p.b->progress().message(), err.message());
}

TEST(Tcp, SizeMismatchIsAnErrorNotCorruption) {
  expectMismatch(1, 65536, 4096, 8192,
                 "rank 0 sent a 4096-byte message where a 8192-byte receive was posted");
}

TEST(Tcp, SizeMismatchStripedVersusWhole) {
  expectMismatch(4, 65536, 1 << 20, 4096, "1048576-byte message where a 4096-byte receive");
  expectMismatch(4, 65536, 8192, 1 << 20, nullptr);
  expectMismatch(4, 65536, 1 << 20, (1 << 20) - 4096, nullptr);
}

TEST(Tcp, PeerClosesMidMessage) {
  Pair p = makePair(2, 65536);
  ASSERT_TRUE(p.a && p.b);
  const size_t kBytes = 64u << 20;
  std::vector<uint8_t> src(kBytes, 1), dst(kBytes);
  Transfer s{src.data(), kBytes};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(p.a->progress().isOk());
  ASSERT_GT(s.progressed, 0u);
  ASSERT_LT(s.progressed, kBytes) << "the kernel took everything; cannot test a partial message";
  p.a.reset();  // rank 0 goes away mid-message

  Transfer r{dst.data(), kBytes};
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  Status err = waitForError(*p.b, Deadline::afterSeconds(60));
  ASSERT_FALSE(err.isOk()) << "peer close went unnoticed";
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 0 closed its connection"), std::string::npos)
      << err.message();
  EXPECT_FALSE(r.done);
}

TEST(Tcp, SenderSeesReceiverClose) {
  Pair p = makePair(2, 65536);
  ASSERT_TRUE(p.a && p.b);
  const size_t kBytes = 64u << 20;
  std::vector<uint8_t> src(kBytes, 1);
  p.b.reset();  // rank 1 goes away; rank 0 keeps sending (must not get SIGPIPE)
  Transfer s{src.data(), kBytes};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  Status err = waitForError(*p.a, Deadline::afterSeconds(60));
  ASSERT_FALSE(err.isOk());
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 1 closed its connection"), std::string::npos)
      << err.message();
}

TEST(Tcp, GarbageInsteadOfHeaderIsAnError) {
  auto sets = makeTcpSockets(1);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  TcpConnection c(5, std::move(sets->b), 65536);
  std::vector<uint8_t> dst(100, 0xCD);
  Transfer r{dst.data(), dst.size()};
  ASSERT_TRUE(c.postRecv(&r).isOk());
  std::string garbage(200, 'x');
  ASSERT_TRUE(net::sendAll(sets->a[0].get(), garbage.data(), garbage.size(),
                           Deadline::afterSeconds(10), nullptr)
                  .isOk());
  Status err = waitForError(c, Deadline::afterSeconds(60));
  ASSERT_FALSE(err.isOk());
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 5 sent bytes that are not a loom frame"), std::string::npos)
      << err.message();
  for (uint8_t b : dst) ASSERT_EQ(b, 0xCD);
}

TEST(Tcp, WrongPieceSizeNamesTheSettings) {
  // Same total, different striping threshold: the piece sizes disagree.
  auto sets = makeTcpSockets(2);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  TcpConnection a(1, std::move(sets->a), 4096);     // stripes 64 KiB
  TcpConnection b(0, std::move(sets->b), 1 << 20);  // does not
  std::vector<uint8_t> src(65536, 3), dst(65536, 0xEE);
  Transfer s{src.data(), src.size()};
  Transfer r{dst.data(), dst.size()};
  ASSERT_TRUE(a.postSend(&s).isOk());
  ASSERT_TRUE(b.postRecv(&r).isOk());
  std::thread ta([&] { waitAll(a, {&s}, Deadline::afterSeconds(10)).ignore(); });
  Status err = waitForError(b, Deadline::afterSeconds(60));
  ta.join();
  ASSERT_FALSE(err.isOk());
  EXPECT_NE(err.message().find("LOOM_SOCKET_STRIPE_MIN"), std::string::npos) << err.message();
}

TEST(Tcp, PollFdsReflectPendingDirections) {
  Pair p = makePair(2, 65536);
  ASSERT_TRUE(p.a && p.b);
  std::vector<pollfd> fds;
  p.a->pollFds(&fds);
  EXPECT_TRUE(fds.empty());
  EXPECT_TRUE(p.a->idle());
  std::vector<uint8_t> buf(10);
  Transfer r{buf.data(), buf.size()};
  ASSERT_TRUE(p.a->postRecv(&r).isOk());
  EXPECT_FALSE(p.a->idle());
  p.a->pollFds(&fds);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_TRUE(fds[0].events & POLLIN);
  EXPECT_FALSE(fds[0].events & POLLOUT);
  EXPECT_EQ(std::string(p.a->kind()), "tcp");
  EXPECT_EQ(p.a->peer(), kRankB);
}

TEST(Tcp, InvalidPostsAreRejected) {
  Pair p = makePair(1, 65536);
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(p.a->postSend(nullptr).code(), Code::kInvalidArgument);
  Transfer t{nullptr, 5};
  EXPECT_EQ(p.a->postRecv(&t).code(), Code::kInvalidArgument);
  std::vector<net::UniqueFd> none;
  TcpConnection empty(3, std::move(none), 1);
  EXPECT_FALSE(empty.progress().isOk());
}

}  // namespace
}  // namespace loom::transport::tcp
