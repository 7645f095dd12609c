// Tests of transport/net/socket.h: addresses, interface selection, connect,
// accept and the exact send/recv helpers.
#include "transport/net/socket.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport_test_util.h"

namespace loom::net {
namespace {

using namespace std::chrono_literals;

TEST(SocketAddress, ParsesIpv4AndPrintsItBack) {
  auto a = SocketAddress::parse("127.0.0.1:5678");
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a->family(), AF_INET);
  EXPECT_EQ(a->port(), 5678);
  EXPECT_EQ(a->toString(), "127.0.0.1:5678");
  EXPECT_TRUE(a->isLoopback());
  a->setPort(80);
  EXPECT_EQ(a->toString(), "127.0.0.1:80");
}

TEST(SocketAddress, ParsesBracketedIpv6) {
  auto a = SocketAddress::parse("[::1]:5678");
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a->family(), AF_INET6);
  EXPECT_EQ(a->port(), 5678);
  EXPECT_EQ(a->toString(), "[::1]:5678");
  EXPECT_TRUE(a->isLoopback());
  auto b = SocketAddress::parse("[fd00::2]:0");
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_EQ(b->toString(), "[fd00::2]:0");
  EXPECT_FALSE(b->isLoopback());
}

TEST(SocketAddress, ResolvesLocalhost) {
  auto a = SocketAddress::parse("localhost:1234");
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a->port(), 1234);
  EXPECT_TRUE(a->isLoopback()) << a->toString();
}

TEST(SocketAddress, RejectsBadInput) {
  const char* bad[] = {"",          "1.2.3.4",     "1.2.3.4:",    "1.2.3.4:70000",
                       "1.2.3.4:-1", "1.2.3.4:8a", ":80",         "::1:80",
                       "[::1]80",    "[::1",       "[::1]:",      "[1.2.3.4]:80",
                       "[zz::1]:80", "1.2.3.4:123456"};
  for (const char* text : bad) {
    auto a = SocketAddress::parse(text);
    EXPECT_FALSE(a.isOk()) << "'" << text << "' parsed as " << (a.isOk() ? a->toString() : "");
    if (!a.isOk()) {
      EXPECT_EQ(a.status().code(), Code::kInvalidArgument) << text;
      EXPECT_NE(a.status().message().find(text), std::string::npos)
          << "message should name the input: " << a.status().message();
    }
  }
}

TEST(SocketAddress, EncodeDecodeRoundTripsV4AndV6) {
  for (const char* text : {"10.1.2.3:65535", "[fe80::1:2]:7", "[2001:db8::42]:4242"}) {
    auto a = SocketAddress::parse(text);
    ASSERT_TRUE(a.isOk()) << text << ": " << a.status().toString();
    if (a->family() == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&a->storage)->sin6_scope_id = 3;
    }
    uint8_t buf[SocketAddress::kEncodedSize];
    std::memset(buf, 0xee, sizeof buf);
    a->encode(buf);
    auto b = SocketAddress::decode(buf);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    EXPECT_TRUE(*a == *b) << a->toString() << " vs " << b->toString();
    EXPECT_EQ(a->toString(), b->toString());
    EXPECT_EQ(b->len, a->len);
  }
  EXPECT_EQ(SocketAddress::kEncodedSize, 28u);
}

TEST(SocketAddress, EncodeUsesNetworkOrderPortAndFamilyTag) {
  auto a = SocketAddress::parse("1.2.3.4:258");
  ASSERT_TRUE(a.isOk());
  uint8_t buf[SocketAddress::kEncodedSize];
  a->encode(buf);
  EXPECT_EQ(buf[0], 4);
  EXPECT_EQ(buf[2], 1);
  EXPECT_EQ(buf[3], 2);
  EXPECT_EQ(buf[4], 1);
  EXPECT_EQ(buf[7], 4);
  SocketAddress empty;
  empty.encode(buf);
  auto e = SocketAddress::decode(buf);
  ASSERT_TRUE(e.isOk());
  EXPECT_EQ(e->family(), AF_UNSPEC);
}

TEST(SocketAddress, DecodeRejectsCorruptBytes) {
  uint8_t buf[SocketAddress::kEncodedSize] = {};
  buf[0] = 5;
  EXPECT_FALSE(SocketAddress::decode(buf).isOk());
  buf[0] = 4;
  buf[20] = 1;  // stray byte after an IPv4 address
  EXPECT_FALSE(SocketAddress::decode(buf).isOk());
  buf[20] = 0;
  buf[1] = 9;
  EXPECT_FALSE(SocketAddress::decode(buf).isOk());
}

// ---- interfaces ----

bool hasLoopbackInterface() {
  auto all = findInterfaces("lo", "");
  return all.isOk();
}

TEST(Interfaces, DefaultListsLoopbackLast) {
  auto all = findInterfaces("", "");
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  ASSERT_FALSE(all->empty());
  bool seenLoopback = false;
  for (const Interface& itf : *all) {
    if (seenLoopback) {
      EXPECT_TRUE(itf.loopback) << itf.name << " listed after loopback";
    }
    seenLoopback = seenLoopback || itf.loopback;
    EXPECT_EQ(itf.addr.port(), 0);
    EXPECT_NE(itf.addr.family(), AF_UNSPEC);
  }
}

TEST(Interfaces, PrefixSelects) {
  if (!hasLoopbackInterface()) GTEST_SKIP() << "no interface named lo* on this host";
  auto lo = findInterfaces("lo", "");
  ASSERT_TRUE(lo.isOk());
  for (const Interface& itf : *lo) EXPECT_EQ(itf.name.rfind("lo", 0), 0u) << itf.name;
}

TEST(Interfaces, ExcludeRemoves) {
  auto all = findInterfaces("", "");
  ASSERT_TRUE(all.isOk());
  auto rest = findInterfaces("^lo", "");
  if (!rest.isOk()) {
    // Only loopback exists: the error still lists what is there.
    EXPECT_NE(rest.status().message().find("^lo"), std::string::npos);
    return;
  }
  for (const Interface& itf : *rest) EXPECT_NE(itf.name.rfind("lo", 0), 0u) << itf.name;
  size_t loCount = 0;
  for (const Interface& itf : *all) loCount += itf.name.rfind("lo", 0) == 0;
  EXPECT_EQ(rest->size() + loCount, all->size());
}

TEST(Interfaces, ExactMatchesWholeNameOnly) {
  if (!hasLoopbackInterface()) GTEST_SKIP() << "no interface named lo* on this host";
  auto all = findInterfaces("lo", "");
  ASSERT_TRUE(all.isOk());
  std::string name = all->front().name;
  auto exact = findInterfaces("=" + name, "");
  ASSERT_TRUE(exact.isOk()) << exact.status().toString();
  ASSERT_EQ(exact->size(), 1u);
  EXPECT_EQ(exact->front().name, name);
  auto partial = findInterfaces("=" + name.substr(0, name.size() - 1), "");
  EXPECT_FALSE(partial.isOk()) << "=" << name.substr(0, name.size() - 1) << " matched";
}

TEST(Interfaces, NonexistentNameErrorListsInterfaces) {
  auto all = findInterfaces("", "");
  ASSERT_TRUE(all.isOk());
  auto none = findInterfaces("nosuchif0", "");
  ASSERT_FALSE(none.isOk());
  const std::string& msg = none.status().message();
  EXPECT_NE(msg.find("NCCL_SOCKET_IFNAME='nosuchif0'"), std::string::npos) << msg;
  for (const Interface& itf : *all) EXPECT_NE(msg.find(itf.name), std::string::npos) << msg;
}

TEST(Interfaces, FamilyFilterAndBadFamily) {
  auto v4 = findInterfaces("", "AF_INET");
  if (v4.isOk()) {
    for (const Interface& itf : *v4) EXPECT_EQ(itf.addr.family(), AF_INET) << itf.name;
  }
  auto v6 = findInterfaces("", "AF_INET6");
  if (v6.isOk()) {
    for (const Interface& itf : *v6) EXPECT_EQ(itf.addr.family(), AF_INET6) << itf.name;
  } else {
    EXPECT_NE(v6.status().message().find("AF_INET6"), std::string::npos);
  }
  auto bad = findInterfaces("", "AF_FOO");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

TEST(Interfaces, ChooseLoopbackForLoopbackRendezvous) {
  auto reach = SocketAddress::parse("127.0.0.1:1");
  ASSERT_TRUE(reach.isOk());
  auto itf = chooseInterface("", "", &*reach);
  ASSERT_TRUE(itf.isOk()) << itf.status().toString();
  auto all = findInterfaces("", "AF_INET");
  bool anyLoopback = false;
  if (all.isOk())
    for (const Interface& i : *all) anyLoopback = anyLoopback || i.loopback;
  if (!anyLoopback) GTEST_SKIP() << "no IPv4 loopback interface on this host";
  EXPECT_TRUE(itf->loopback) << itf->name;
}

TEST(Interfaces, ChooseSameSubnetAsRendezvous) {
  auto all = findInterfaces("", "AF_INET");
  if (!all.isOk()) GTEST_SKIP() << "no IPv4 interface";
  const Interface* target = nullptr;
  for (const Interface& i : *all)
    if (!i.loopback && i.netmask.family() == AF_INET) target = &i;  // the last one
  if (target == nullptr) GTEST_SKIP() << "no non-loopback IPv4 interface with a netmask";
  SocketAddress reach = target->addr;
  reach.setPort(9999);
  ASSERT_TRUE(target->sameSubnet(reach));
  auto chosen = chooseInterface("", "", &reach);
  ASSERT_TRUE(chosen.isOk()) << chosen.status().toString();
  EXPECT_TRUE(chosen->sameSubnet(reach)) << chosen->name;
  // An explicit spec wins over the rendezvous address.
  auto spec = chooseInterface("lo", "", &reach);
  if (spec.isOk()) {
    EXPECT_EQ(spec->name.rfind("lo", 0), 0u);
  }
}

// ---- connect / accept / send / recv ----

// A port on 127.0.0.1 that is bound (so nobody else takes it) but not
// listening: connecting to it is refused.
struct RefusingPort {
  UniqueFd fd;
  SocketAddress addr;
};

RefusingPort makeRefusingPort() {
  RefusingPort r;
  r.fd.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  auto any = SocketAddress::parse("127.0.0.1:0");
  EXPECT_EQ(::bind(r.fd.get(), reinterpret_cast<const sockaddr*>(&any->storage), any->len), 0);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(r.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  r.addr = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
  return r;
}

TEST(Connect, RefusedUntilDeadlineNamesTheAddress) {
  RefusingPort port = makeRefusingPort();
  auto c = connectTo(port.addr, Deadline::afterMs(300), nullptr);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), Code::kRemoteError);
  EXPECT_NE(c.status().message().find(port.addr.toString()), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("refused"), std::string::npos) << c.status().message();
}

TEST(Connect, AbortFlagStopsRetrying) {
  RefusingPort port = makeRefusingPort();
  std::atomic<bool> abort{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    abort.store(true);
  });
  auto c = connectTo(port.addr, Deadline::afterSeconds(120), &abort);
  setter.join();
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("aborted"), std::string::npos) << c.status().message();
}

TEST(Connect, AbortAlreadySetReturnsAtOnce) {
  RefusingPort port = makeRefusingPort();
  std::atomic<bool> abort{true};
  auto c = connectTo(port.addr, Deadline::never(), &abort);
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("aborted"), std::string::npos);
  EXPECT_EQ(c.status().code(), Code::kInvalidUsage);  // an abort has one code everywhere
}

TEST(Connect, RetriesUntilTheListenerAppears) {
  RefusingPort port = makeRefusingPort();
  int one = 1;
  ::setsockopt(port.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    ::listen(port.fd.get(), 16);
  });
  auto c = connectTo(port.addr, Deadline::afterSeconds(60), nullptr);
  late.join();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_TRUE(c->valid());
}

TEST(Connect, RejectsPortZeroAndEmptyAddress) {
  auto a = SocketAddress::parse("127.0.0.1:0");
  EXPECT_EQ(connectTo(*a, Deadline::afterMs(100), nullptr).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(connectTo(SocketAddress(), Deadline::afterMs(100), nullptr).status().code(),
            Code::kInvalidArgument);
}

TEST(Listen, EphemeralPortAndAcceptNoneWhenIdle) {
  auto any = SocketAddress::parse("127.0.0.1:0");
  SocketAddress bound;
  auto l = listenOn(*any, &bound);
  ASSERT_TRUE(l.isOk()) << l.status().toString();
  EXPECT_NE(bound.port(), 0);
  auto none = acceptOne(l->get());
  ASSERT_TRUE(none.isOk());
  EXPECT_FALSE(none->valid());
  // A second listener on the same port fails with a message naming it.
  auto again = listenOn(bound, nullptr);
  ASSERT_FALSE(again.isOk());
  EXPECT_NE(again.status().message().find(bound.toString()), std::string::npos);
}

TEST(SendRecvAll, RoundTripAndPeerClose) {
  auto sets = transport::testing::makeTcpSockets(1);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  std::vector<uint8_t> out(3 << 20), in(out.size());
  transport::testing::fillPattern(out.data(), out.size(), 1, 2);
  Status sent;
  std::thread sender([&] {
    sent = sendAll(sets->a[0].get(), out.data(), out.size(), Deadline::afterSeconds(60), nullptr);
  });
  Status got = recvAll(sets->b[0].get(), in.data(), in.size(), Deadline::afterSeconds(60), nullptr);
  sender.join();
  ASSERT_TRUE(sent.isOk()) << sent.toString();
  ASSERT_TRUE(got.isOk()) << got.toString();
  EXPECT_TRUE(transport::testing::checkPattern(in.data(), in.size(), 1, 2));

  sets->a[0].reset();
  uint8_t byte;
  Status eof = recvAll(sets->b[0].get(), &byte, 1, Deadline::afterSeconds(60), nullptr);
  ASSERT_FALSE(eof.isOk());
  EXPECT_EQ(eof.code(), Code::kRemoteError);
  EXPECT_NE(eof.message().find("peer closed the connection"), std::string::npos) << eof.message();
}

TEST(SendRecvAll, RecvTimesOutAndHonoursAbort) {
  auto sets = transport::testing::makeTcpSockets(1);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  uint8_t byte;
  Status t = recvAll(sets->b[0].get(), &byte, 1, Deadline::afterMs(200), nullptr);
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.message().find("timed out"), std::string::npos) << t.message();
  std::atomic<bool> abort{true};
  Status a = recvAll(sets->b[0].get(), &byte, 1, Deadline::never(), &abort);
  ASSERT_FALSE(a.isOk());
  EXPECT_NE(a.message().find("aborted"), std::string::npos) << a.message();
  EXPECT_EQ(a.code(), Code::kInvalidUsage);
}

TEST(SendRecvAll, SendToClosedPeerIsRemoteErrorNotSigpipe) {
  auto sets = transport::testing::makeTcpSockets(1);
  ASSERT_TRUE(sets.isOk()) << sets.status().toString();
  sets->b[0].reset();
  std::vector<uint8_t> big(8 << 20, 7);
  Status s;
  // The first send may still succeed into the kernel buffer; keep sending.
  for (int i = 0; i < 20 && s.isOk(); ++i)
    s = sendAll(sets->a[0].get(), big.data(), big.size(), Deadline::afterSeconds(30), nullptr);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
}

// Out of fds, a pending connection keeps the listener readable: the gate
// stops accepting for a while (pollable() false) instead of letting a poll
// loop spin, and accepts again once fds are free.
TEST(AcceptGate, BacksOffWhenOutOfFdsThenAcceptsAgain) {
  auto any = SocketAddress::parse("127.0.0.1:0");
  SocketAddress bound;
  auto l = listenOn(*any, &bound);
  ASSERT_TRUE(l.isOk()) << l.status().toString();
  auto client = connectTo(bound, Deadline::afterSeconds(10), nullptr);
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  AcceptGate gate;
  EXPECT_GE(gate.maxPending(), 16u);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<int> filler;
  {
    // Use up every fd below a lowered limit.
    rlimit low = saved;
    low.rlim_cur = 256;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    for (int fd; (fd = ::dup(0)) >= 0;) filler.push_back(fd);
    ASSERT_EQ(errno, EMFILE);
  }
  auto none = gate.accept(l->get());
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(none.isOk()) << none.status().toString();
  EXPECT_FALSE(none->valid());
  EXPECT_EQ(gate.backoffs(), 1u);
  EXPECT_FALSE(gate.pollable());
  EXPECT_GT(gate.backoffMsLeft(), 0);
  EXPECT_FALSE(gate.accept(l->get())->valid()) << "accepted while backing off";
  std::this_thread::sleep_for(std::chrono::milliseconds(gate.backoffMsLeft() + 5));
  EXPECT_TRUE(gate.pollable());
  auto got = gate.accept(l->get());
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_TRUE(got->valid());
}

}  // namespace
}  // namespace loom::net
