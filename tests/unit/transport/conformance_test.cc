// The transport conformance suite: what every backend's Connection must do
// (transport/connection.h), run over each backend. ctest label
// `conformance`.
//
// A backend joins the suite with a kit (below: LoopbackKit, TcpKit, ShmKit)
// and one line in kAllKits, plus one in kPeerKits when it connects two
// different ranks (loopback connects a rank to itself, so the tests of a
// peer that closes, dies or sends garbage do not apply to it). The verbs
// kit (IbKit) needs an active verbs port: this file is built a second time
// with LOOM_CONFORMANCE_IB for it, and the rdma tier runs that binary in a
// soft-RoCE guest (tests/rdma).
//
// A kit provides:
//   kName                 the backend's name, as Connection::kind() says it
//   makePair()            two connected halves in this process (b empty for
//                         a self connection: a talks to itself)
//   forkPeer(body, &a)    (peer kits) half a here, half b in a forked child
//                         that runs body(b, child) and exits with its result
//   garbage(pair, rng)    (peer kits) makes what a receives next garbage,
//                         as a broken or hostile peer would write it
//
// One thread drives both halves of a pair, so the tests are deterministic
// and need no locking; the child process of the death test is the
// exception.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm_test_util.h"
#if LOOM_CONFORMANCE_IB
#include "transport/ib/connection.h"
#include "transport/ib/transport.h"
#endif
#include "transport/shm/connection.h"
#include "transport/shm/transport.h"
#include "transport/transport.h"
#include "transport_test_util.h"

namespace loom::transport {
namespace {

using testing::checkPattern;
using testing::fillPattern;
using Child = shm::testing::ChildProcess;

struct Pair {
  std::unique_ptr<Connection> a;  // rank 0's half (its peer is rank 1)
  std::unique_ptr<Connection> b;  // rank 1's half; empty for a self connection
  Connection& A() { return *a; }
  Connection& B() { return b ? *b : *a; }
  bool self() const { return !b; }
  std::vector<int> peerFds;  // tcp: b's sockets (owned by b), for garbage()
};

// The forked peer's work: its half and its end of the pipes to the parent.
using PeerBody = std::function<int(Connection& b, Child& self)>;

// ---- kits ---------------------------------------------------------------------

// Both halves through a registry backend, as core sets them up: listen on
// both sides, then connect each half to the other's endpoint.
Result<Pair> pairThrough(const Backend& backend) {
  std::vector<uint8_t> ea, eb;
  Pair p;
  LOOM_ASSIGN_OR_RETURN(p.a, backend.listen(1, Selection{}, &ea));
  LOOM_ASSIGN_OR_RETURN(p.b, backend.listen(0, Selection{}, &eb));
  LOOM_TRY(backend.connect(*p.a, eb));
  LOOM_TRY(backend.connect(*p.b, ea));
  return p;
}

struct LoopbackKit {
  static constexpr const char* kName = "loopback";
  static Result<Pair> makePair() {
    Pair p;
    p.a = openSelf(0);  // as core opens it
    return p;
  }
};

struct TcpKit {
  static constexpr const char* kName = "tcp";
  static constexpr size_t kSockets = 2;  // striped, as between ranks by default
  static constexpr size_t kStripeMin = 64 << 10;

  static Result<Pair> makePair() {
    LOOM_ASSIGN_OR_RETURN(auto sets, testing::makeTcpSockets(kSockets));
    Pair p;
    for (const auto& fd : sets.b) p.peerFds.push_back(fd.get());
    p.a = openNetwork(1, std::move(sets.a), kStripeMin);  // as core opens it
    p.b = openNetwork(0, std::move(sets.b), kStripeMin);
    return p;
  }

  static Result<std::unique_ptr<Child>> forkPeer(const PeerBody& body, std::unique_ptr<Connection>* a) {
    LOOM_ASSIGN_OR_RETURN(auto sets, testing::makeTcpSockets(kSockets));
    LOOM_ASSIGN_OR_RETURN(auto child, Child::start([&](Child& self) {
      sets.a.clear();  // the child's copies of the parent's ends
      auto b = openNetwork(0, std::move(sets.b), kStripeMin);
      return body(*b, self);
    }));
    sets.b.clear();
    *a = openNetwork(1, std::move(sets.a), kStripeMin);
    return child;
  }

  // Raw bytes on each of b's sockets (whichever carries a's next message),
  // as if b wrote them: no frame header can come out of them.
  static void garbage(Pair& p, std::mt19937& rng) {
    ASSERT_FALSE(p.peerFds.empty());
    for (int fd : p.peerFds) {
      std::vector<uint8_t> bytes(64 + rng() % 512);
      for (auto& x : bytes) x = uint8_t(rng());
      bytes[0] = uint8_t(~0x4C);  // never the first byte of the frame magic
      ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    }
  }
};

struct ShmKit {
  static constexpr const char* kName = "shm";

  static Result<Pair> makePair() { return pairThrough(shm::backend()); }

  static Result<std::unique_ptr<Child>> forkPeer(const PeerBody& body, std::unique_ptr<Connection>* a) {
    const Backend& backend = shm::backend();
    std::vector<uint8_t> ea;
    LOOM_ASSIGN_OR_RETURN(*a, backend.listen(1, Selection{}, &ea));
    LOOM_ASSIGN_OR_RETURN(auto child, Child::start([&](Child& self) {
      std::vector<uint8_t> eb;
      auto b = backend.listen(0, Selection{}, &eb);
      if (!b.isOk()) return 10;
      const uint32_t n = uint32_t(eb.size());
      if (!self.send(&n, sizeof n).isOk() || !self.send(eb.data(), n).isOk()) return 11;
      std::vector<uint8_t> peer(ea);  // the parent's endpoint, inherited
      if (!backend.connect(*b.value(), peer).isOk()) return 12;
      return body(*b.value(), self);
    }));
    uint32_t n = 0;
    LOOM_TRY(child->recv(&n, sizeof n, Deadline::afterSeconds(30)));
    if (n > 4096) return internalError("test: endpoint too large");
    std::vector<uint8_t> eb(n);
    LOOM_TRY(child->recv(eb.data(), n, Deadline::afterSeconds(30)));
    LOOM_TRY(backend.connect(**a, eb));
    return child;
  }

  // Random slot descriptors and counters in a's inbox, which b writes.
  static void garbage(Pair& p, std::mt19937& rng) {
    auto& mine = static_cast<shm::ShmConnection&>(p.A());
    shm::InboxHeader* h = shm::testing::mapInbox(mine);
    ASSERT_NE(h, nullptr);
    auto* desc = reinterpret_cast<uint8_t*>(h->desc);
    for (size_t i = 0; i < sizeof h->desc; ++i) desc[i] = uint8_t(rng());
    h->desc[0].seq = 1 + rng();  // never the first message's sequence number
    h->tail.store(h->head.load() + 1 + rng() % (2 * shm::kSlots));
    ::munmap(h, mine.local().inboxBytes);
  }
};

#if LOOM_CONFORMANCE_IB
// Through the registry's backend, on the first usable verbs port (in the
// guest: rxe0, both halves on it).
struct IbKit {
  static constexpr const char* kName = "ib";

  static Result<Pair> makePair() { return pairThrough(ib::backend()); }

  // The child makes its own half after the fork (verbs objects are not
  // shared across fork); the endpoints cross the pipes.
  static Result<std::unique_ptr<Child>> forkPeer(const PeerBody& body, std::unique_ptr<Connection>* a) {
    const Backend& backend = ib::backend();
    LOOM_ASSIGN_OR_RETURN(auto child, Child::start([&](Child& self) {
      std::vector<uint8_t> eb;
      auto b = backend.listen(0, Selection{}, &eb);
      if (!b.isOk()) return 10;
      const uint32_t n = uint32_t(eb.size());
      if (!self.send(&n, sizeof n).isOk() || !self.send(eb.data(), n).isOk()) return 11;
      uint32_t m = 0;
      if (!self.recv(&m, sizeof m, Deadline::afterSeconds(30)).isOk() || m > 4096) return 12;
      std::vector<uint8_t> ea(m);
      if (!self.recv(ea.data(), m, Deadline::afterSeconds(30)).isOk()) return 13;
      if (!backend.connect(*b.value(), ea).isOk()) return 14;
      return body(*b.value(), self);
    }));
    uint32_t n = 0;
    LOOM_TRY(child->recv(&n, sizeof n, Deadline::afterSeconds(30)));
    if (n > 4096) return internalError("test: endpoint too large");
    std::vector<uint8_t> eb(n), ea;
    LOOM_TRY(child->recv(eb.data(), n, Deadline::afterSeconds(30)));
    LOOM_ASSIGN_OR_RETURN(*a, backend.listen(1, Selection{}, &ea));
    const uint32_t m = uint32_t(ea.size());
    LOOM_TRY(child->send(&m, sizeof m));
    LOOM_TRY(child->send(ea.data(), m));
    LOOM_TRY(backend.connect(**a, eb));
    return child;
  }

  // b writes random bytes into a's next FIFO slot (or a slot out of turn)
  // over the wire, as a broken peer would.
  static void garbage(Pair& p, std::mt19937& rng) {
    auto& peer = static_cast<ib::IbConnection&>(p.B());
    std::vector<uint8_t> bytes(ib::kSlotHeaderBytes + rng() % 512);
    for (auto& x : bytes) x = uint8_t(rng());
    bytes[0] = uint8_t(~0x4C);  // never the first byte of the slot magic
    const uint32_t slot = rng() % 3 == 0 ? 1 + rng() % (ib::kSlots - 1) : 0;
    ASSERT_TRUE(peer.writeRawForTest(bytes.data(), uint32_t(bytes.size()), slot).isOk());
    ASSERT_TRUE(peer.progress().isOk());
  }
};
#endif

// ---- helpers ------------------------------------------------------------------

// Drives both halves until `finished` holds, a progress() fails (returned),
// or the deadline passes (an error saying so). Sleeps in poll() on both
// halves' fds between rounds, as the engine does.
Status drive(Pair& p, const std::function<bool()>& finished, Deadline deadline) {
  while (true) {
    LOOM_TRY(p.A().progress());
    if (!p.self()) LOOM_TRY(p.B().progress());
    if (finished()) return Status::ok();
    if (deadline.expired()) return remoteError("test: timed out");
    std::vector<pollfd> fds;
    p.A().pollFds(&fds);
    if (!p.self()) p.B().pollFds(&fds);
    if (fds.empty()) {
      std::this_thread::yield();
    } else {
      ::poll(fds.data(), fds.size(), 5);
    }
  }
}

// One message of a stream: its buffer and its transfer.
struct Msg {
  std::vector<uint8_t> buf;
  Transfer t;
};

std::vector<Msg> messages(const std::vector<size_t>& sizes, bool send, uint32_t stream) {
  std::vector<Msg> out(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i].buf.assign(sizes[i], 0xEE);
    if (send) fillPattern(out[i].buf.data(), sizes[i], stream, uint32_t(i));
    out[i].t.data = out[i].buf.data();
    out[i].t.bytes = sizes[i];
  }
  return out;
}

bool allDone(const std::vector<Msg>& ms) {
  return std::all_of(ms.begin(), ms.end(), [](const Msg& m) { return m.t.done; });
}

// Done flags are set in posting order: no message is done before an
// earlier one.
bool doneInOrder(const std::vector<Msg>& ms) {
  bool gap = false;
  for (const Msg& m : ms) {
    if (m.t.done && gap) return false;
    if (!m.t.done) gap = true;
  }
  return true;
}

std::vector<size_t> mixedSizes() {
  std::vector<size_t> s = {0,     1,          7,         24,        25,    4095, 4096,
                           4097,  65535,      65536,     65537,     0,     0,    1 << 20,
                           12345, (3 << 20) + 5, 16 << 10, (16 << 10) + 25, 999, 0, (64 << 10) - 1};
  for (int i = 0; i < 100; ++i) s.push_back(size_t(i * 7919 % 70001));
  return s;
}

// The number of open fds of this process.
int openFds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n - 1;  // the directory's own fd
}

uint64_t memAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib << 10;
  return 0;
}

// ---- the suite for every backend -------------------------------------------------

// Test names carry the backend's name: Conformance/tcp.ZeroByte...
struct KitNames {
  template <typename Kit>
  static std::string GetName(int) {
    return Kit::kName;
  }
};

template <typename Kit>
class Conformance : public ::testing::Test {
 protected:
  Pair pair() {
    auto p = Kit::makePair();
    EXPECT_TRUE(p.isOk()) << p.status().toString();
    return p.isOk() ? std::move(p).value() : Pair{};
  }
};

#if LOOM_CONFORMANCE_IB
using kAllKits = ::testing::Types<IbKit>;
#else
using kAllKits = ::testing::Types<LoopbackKit, TcpKit, ShmKit>;
#endif
TYPED_TEST_SUITE(Conformance, kAllKits, KitNames);

TYPED_TEST(Conformance, KindNamesTheBackend) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  EXPECT_STREQ(p.A().kind(), TypeParam::kName);
  EXPECT_EQ(p.A().peer(), p.self() ? 0 : 1);
  if (!p.self()) {
    EXPECT_EQ(p.B().peer(), 0);
  }
  EXPECT_TRUE(p.A().idle());
}

// Every size class both ways, all posted before the first progress(): the
// receiver gets each message whole, in posting order, and done flags are
// set in posting order.
TYPED_TEST(Conformance, ManyOutstandingMixedSizesArriveInOrder) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  const auto sizes = mixedSizes();
  auto sendA = messages(sizes, true, 1), recvB = messages(sizes, false, 0);
  auto sendB = messages(sizes, true, 2), recvA = messages(sizes, false, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(p.A().postSend(&sendA[i].t).isOk());
    ASSERT_TRUE(p.B().postRecv(&recvB[i].t).isOk());
    if (!p.self()) {
      ASSERT_TRUE(p.B().postSend(&sendB[i].t).isOk());
      ASSERT_TRUE(p.A().postRecv(&recvA[i].t).isOk());
    }
  }
  bool ordered = true;
  Status s = drive(p, [&] {
    ordered = ordered && doneInOrder(sendA) && doneInOrder(recvB) && doneInOrder(sendB) && doneInOrder(recvA);
    return allDone(sendA) && allDone(recvB) && (p.self() || (allDone(sendB) && allDone(recvA)));
  }, Deadline::afterSeconds(60));
  ASSERT_TRUE(s.isOk()) << s.toString();
  EXPECT_TRUE(ordered);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(sendA[i].t.progressed, sizes[i]);
    EXPECT_EQ(recvB[i].t.progressed, sizes[i]);
    EXPECT_TRUE(checkPattern(recvB[i].buf.data(), sizes[i], 1, uint32_t(i))) << "message " << i;
    if (!p.self()) {
      EXPECT_TRUE(checkPattern(recvA[i].buf.data(), sizes[i], 2, uint32_t(i))) << "message " << i;
    }
  }
  EXPECT_TRUE(p.A().idle());
  EXPECT_TRUE(p.B().idle());
}

// Zero-byte messages are messages: each is matched, completes and moves
// nothing, between non-empty ones.
TYPED_TEST(Conformance, ZeroByteMessagesAreMatchedLikeOthers) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  const std::vector<size_t> sizes = {0, 5, 0, 0, 1 << 20, 0};
  auto sends = messages(sizes, true, 3), recvs = messages(sizes, false, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(p.A().postSend(&sends[i].t).isOk());
    ASSERT_TRUE(p.B().postRecv(&recvs[i].t).isOk());
  }
  Status s = drive(p, [&] { return allDone(sends) && allDone(recvs); }, Deadline::afterSeconds(30));
  ASSERT_TRUE(s.isOk()) << s.toString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(recvs[i].t.progressed, sizes[i]);
    EXPECT_TRUE(checkPattern(recvs[i].buf.data(), sizes[i], 3, uint32_t(i)));
  }
  // A zero-byte receive posted alone completes once its send arrives.
  Transfer s0{nullptr, 0}, r0{nullptr, 0};
  ASSERT_TRUE(p.B().postRecv(&r0).isOk());
  ASSERT_TRUE(p.A().postSend(&s0).isOk());
  s = drive(p, [&] { return s0.done && r0.done; }, Deadline::afterSeconds(10));
  EXPECT_TRUE(s.isOk()) << s.toString();
}

// A receive posted with another size than its send is an error, not a
// silent truncation.
TYPED_TEST(Conformance, SizeMismatchIsAnError) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  std::vector<uint8_t> out(100, 1), in(200, 2);
  Transfer s{out.data(), out.size()}, r{in.data(), in.size()};
  ASSERT_TRUE(p.A().postSend(&s).isOk());
  ASSERT_TRUE(p.B().postRecv(&r).isOk());
  Status st = drive(p, [&] { return s.done && r.done; }, Deadline::afterSeconds(10));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message(), "test: timed out") << "the mismatch was never detected";
  EXPECT_FALSE(r.done);
  // Sticky: the next call fails the same way.
  Status again = p.B().progress();
  if (p.self() || !again.isOk()) {
    EXPECT_EQ(again.code(), st.code());
  }
}

// A sender that runs far ahead of its receiver is held back (no backend
// buffers without bound), and every message still arrives intact when the
// receiver posts one at a time, late.
TYPED_TEST(Conformance, BackPressureHoldsTheSenderAndLosesNothing) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  const std::vector<size_t> sizes(192, size_t(256) << 10);  // 48 MiB
  auto sends = messages(sizes, true, 4), recvs = messages(sizes, false, 0);
  for (auto& m : sends) ASSERT_TRUE(p.A().postSend(&m.t).isOk());
  // Nobody receives for a while.
  const auto until = Clock::now() + std::chrono::milliseconds(300);
  while (Clock::now() < until) {
    ASSERT_TRUE(p.A().progress().isOk());
    if (!p.self()) {
      ASSERT_TRUE(p.B().progress().isOk());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const size_t doneEarly = size_t(std::count_if(sends.begin(), sends.end(), [](const Msg& m) { return m.t.done; }));
  EXPECT_LT(doneEarly, sends.size()) << "48 MiB were taken with no receive posted";
  // The receiver posts one message at a time and checks it.
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(p.B().postRecv(&recvs[i].t).isOk());
    Status s = drive(p, [&] { return recvs[i].t.done; }, Deadline::afterSeconds(30));
    ASSERT_TRUE(s.isOk()) << "message " << i << ": " << s.toString();
    ASSERT_TRUE(checkPattern(recvs[i].buf.data(), sizes[i], 4, uint32_t(i))) << "message " << i;
  }
  Status s = drive(p, [&] { return allDone(sends); }, Deadline::afterSeconds(30));
  EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_TRUE(doneInOrder(sends));
}

// Memory types: a backend refuses memory it cannot move (every backend
// here moves host memory only), registration hands out a region that
// transfers may carry, and a region that does not hold the buffer is an
// error. Nothing refused is queued.
TYPED_TEST(Conformance, MemoryTypesAndRegisteredRegions) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  EXPECT_TRUE(p.A().moves(MemoryType::kHost));
  EXPECT_TRUE(p.A().moves(MemoryType::kHostPinned));
  EXPECT_FALSE(p.A().moves(MemoryType::kDevice));
  std::vector<uint8_t> out(4096), in(4096);
  fillPattern(out.data(), out.size(), 5, 0);

  Transfer dev{out.data(), out.size()};
  dev.memory = MemoryType::kDevice;
  Status refused = p.A().postSend(&dev);
  EXPECT_EQ(refused.code(), Code::kInvalidUsage) << refused.toString();
  EXPECT_NE(refused.message().find("device memory"), std::string::npos) << refused.message();
  EXPECT_FALSE(p.A().registerMemory(out.data(), out.size(), MemoryType::kDevice).isOk());
  EXPECT_TRUE(p.A().idle());

  auto sendRegion = p.A().registerMemory(out.data(), out.size(), MemoryType::kHost);
  auto recvRegion = p.B().registerMemory(in.data(), in.size(), MemoryType::kHost);
  ASSERT_TRUE(sendRegion.isOk()) << sendRegion.status().toString();
  ASSERT_TRUE(recvRegion.isOk()) << recvRegion.status().toString();
  Transfer outside{out.data() + 1, out.size()};
  outside.region = sendRegion.value().get();
  EXPECT_EQ(p.A().postSend(&outside).code(), Code::kInvalidArgument) << "one byte past the region";
  EXPECT_TRUE(p.A().idle());

  Transfer s{out.data(), out.size()}, r{in.data(), in.size()};
  s.region = sendRegion.value().get();
  r.region = recvRegion.value().get();
  ASSERT_TRUE(p.A().postSend(&s).isOk());
  ASSERT_TRUE(p.B().postRecv(&r).isOk());
  Status st = drive(p, [&] { return s.done && r.done; }, Deadline::afterSeconds(10));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_TRUE(checkPattern(in.data(), in.size(), 5, 0));
}

// Sends from registered buffers (which a backend may send without copying:
// verbs gathers them straight from the buffer) mixed with unregistered
// ones, several slots long and empty: all arrive intact, and done flags
// keep posting order whatever finishes first.
TYPED_TEST(Conformance, RegisteredAndPlainSendsKeepTheirOrder) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  const std::vector<size_t> sizes = {(1 << 20) + 7, 100, 0, (3 << 20) + 1, 64, 0, 5000, (1 << 20), 1};
  auto sends = messages(sizes, true, 6), recvs = messages(sizes, false, 0);
  std::vector<std::unique_ptr<Region>> regions;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i % 2 == 0 && sizes[i] > 0) {
      auto r = p.A().registerMemory(sends[i].buf.data(), sizes[i], MemoryType::kHost);
      ASSERT_TRUE(r.isOk()) << r.status().toString();
      sends[i].t.region = r.value().get();
      regions.push_back(std::move(r.value()));
    }
    ASSERT_TRUE(p.A().postSend(&sends[i].t).isOk());
  }
  bool ordered = true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(p.B().postRecv(&recvs[i].t).isOk());
    Status s = drive(p, [&] {
      ordered = ordered && doneInOrder(sends);
      return recvs[i].t.done;
    }, Deadline::afterSeconds(60));
    ASSERT_TRUE(s.isOk()) << "message " << i << ": " << s.toString();
    EXPECT_TRUE(checkPattern(recvs[i].buf.data(), sizes[i], 6, uint32_t(i))) << "message " << i;
  }
  Status s = drive(p, [&] {
    ordered = ordered && doneInOrder(sends);
    return allDone(sends);
  }, Deadline::afterSeconds(30));
  ASSERT_TRUE(s.isOk()) << s.toString();
  EXPECT_TRUE(ordered);
  EXPECT_TRUE(p.A().idle());
}

// One message over 2^31 bytes, both ways where the backend connects two
// ranks: no 32-bit size or offset anywhere. Every 1 KiB of the buffer
// carries its own offset, so a lost, repeated or misplaced piece shows.
TYPED_TEST(Conformance, MessageOverTwoGiB) {
  constexpr size_t kBytes = (size_t(1) << 31) + 4099;
  constexpr size_t kMark = 1024;
  const size_t need = 2 * kBytes + (size_t(1) << 30);
  if (memAvailableBytes() < need) {
    GTEST_SKIP() << "needs " << (need >> 20) << " MiB of available memory, this machine has "
                 << (memAvailableBytes() >> 20);
  }
  Pair p = this->pair();
  ASSERT_TRUE(p.a);
  auto map = [](size_t n) {
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  };
  uint8_t* out = map(kBytes);
  uint8_t* in = map(kBytes);
  ASSERT_TRUE(out && in);
  for (size_t off = 0; off + sizeof(uint64_t) <= kBytes; off += kMark) {
    const uint64_t v = off * 0x9E3779B97F4A7C15ull + 1;
    std::memcpy(out + off, &v, sizeof v);
  }
  out[kBytes - 1] = 0xA5;
  Transfer s{out, kBytes}, r{in, kBytes};
  ASSERT_TRUE(p.A().postSend(&s).isOk());
  ASSERT_TRUE(p.B().postRecv(&r).isOk());
  Status st = drive(p, [&] { return s.done && r.done; }, Deadline::afterSeconds(300));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(r.progressed, kBytes);
  size_t bad = 0;
  for (size_t off = 0; off + sizeof(uint64_t) <= kBytes; off += kMark) {
    uint64_t v;
    std::memcpy(&v, in + off, sizeof v);
    if (v != off * 0x9E3779B97F4A7C15ull + 1 && ++bad < 5) ADD_FAILURE() << "wrong bytes at offset " << off;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(in[kBytes - 1], 0xA5);
  ::munmap(out, kBytes);
  ::munmap(in, kBytes);
}

// ---- the suite for backends between two ranks ----------------------------------

template <typename Kit>
class PeerConformance : public Conformance<Kit> {};

#if LOOM_CONFORMANCE_IB
using kPeerKits = ::testing::Types<IbKit>;
#else
using kPeerKits = ::testing::Types<TcpKit, ShmKit>;
#endif
TYPED_TEST_SUITE(PeerConformance, kPeerKits, KitNames);

// Drives `c` alone until progress() fails; the failure, or an error saying
// it never came.
Status waitForFailure(Connection& c, Deadline deadline) {
  while (true) {
    Status s = c.progress();
    if (!s.isOk()) return s;
    if (deadline.expired()) return Status::ok();
    std::vector<pollfd> fds;
    c.pollFds(&fds);
    if (fds.empty()) {
      std::this_thread::yield();
    } else {
      ::poll(fds.data(), fds.size(), 20);
    }
  }
}

// The peer destroys its half in the middle of a large message in each
// direction: both pending transfers fail with a remote error naming the
// peer, soon; nothing hangs.
TYPED_TEST(PeerConformance, PeerClosingMidTransferFailsPendingWork) {
  Pair p = this->pair();
  ASSERT_TRUE(p.a && p.b);
  const size_t big = size_t(64) << 20;
  std::vector<uint8_t> outA(big, 1), inA(big), inB(big);
  Transfer sendA{outA.data(), big}, recvB{inB.data(), big}, recvA{inA.data(), big};
  ASSERT_TRUE(p.A().postSend(&sendA).isOk());
  ASSERT_TRUE(p.A().postRecv(&recvA).isOk());
  ASSERT_TRUE(p.B().postRecv(&recvB).isOk());
  Status s = drive(p, [&] { return recvB.progressed > 0; }, Deadline::afterSeconds(30));
  ASSERT_TRUE(s.isOk()) << s.toString();
  ASSERT_FALSE(sendA.done);
  p.b.reset();
  const auto start = Clock::now();
  Status err = waitForFailure(p.A(), Deadline::afterSeconds(15));
  ASSERT_FALSE(err.isOk()) << "no error 15 s after the peer closed";
  EXPECT_LT(secondsSince(start), 5.0);
  EXPECT_EQ(err.code(), Code::kRemoteError) << err.toString();
  EXPECT_NE(err.message().find("rank 1"), std::string::npos) << err.message();
  EXPECT_FALSE(sendA.done && recvA.done);
}

// The peer process is killed (SIGKILL) while a large message flows to it:
// the sender fails soon with a remote error naming the peer. The peer runs
// in a forked child and stops receiving once it has some bytes, so it dies
// with the message half-taken and no destructor of its half runs.
TYPED_TEST(PeerConformance, PeerDyingMidTransferFailsPendingWork) {
  const size_t big = size_t(64) << 20;
  std::unique_ptr<Connection> a;
  auto child = TypeParam::forkPeer(
      [&](Connection& b, Child& self) {
        std::vector<uint8_t> in(big);
        Transfer r{in.data(), big};
        if (!b.postRecv(&r).isOk()) return 20;
        const Deadline d = Deadline::afterSeconds(30);
        while (r.progressed == 0) {
          if (!b.progress().isOk() || d.expired()) return 21;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        const char got = 'R';
        if (!self.send(&got, 1).isOk()) return 22;
        while (true) ::pause();  // until the parent kills this process
      },
      &a);
  ASSERT_TRUE(child.isOk()) << child.status().toString();
  std::vector<uint8_t> out(big, 7);
  Transfer s{out.data(), big};
  ASSERT_TRUE(a->postSend(&s).isOk());
  const Deadline d = Deadline::afterSeconds(30);
  char got = 0;
  while (!child.value()->recv(&got, 1, Deadline::afterMs(2)).isOk()) {
    ASSERT_TRUE(a->progress().isOk());
    ASSERT_FALSE(d.expired()) << "the child never received a byte";
  }
  ASSERT_EQ(got, 'R');
  child.value()->kill(SIGKILL);
  auto status = child.value()->wait(Deadline::afterSeconds(10));
  ASSERT_TRUE(status.isOk());
  EXPECT_EQ(status.value(), -SIGKILL);
  const auto start = Clock::now();
  Status err = waitForFailure(*a, Deadline::afterSeconds(15));
  ASSERT_FALSE(err.isOk()) << "no error 15 s after the peer died";
  EXPECT_LT(secondsSince(start), 5.0);
  EXPECT_EQ(err.code(), Code::kRemoteError) << err.toString();
  EXPECT_NE(err.message().find("rank 1"), std::string::npos) << err.message();
  EXPECT_FALSE(s.done);
}

// Abort: a half destroyed with transfers outstanding both ways returns at
// once and releases everything it held (fds, mappings), and the other half
// then fails instead of waiting forever.
TYPED_TEST(PeerConformance, DestroyingWithWorkOutstandingIsPromptAndClean) {
  const int fdsBefore = openFds();
  {
    Pair p = this->pair();
    ASSERT_TRUE(p.a && p.b);
    const size_t big = size_t(32) << 20;
    std::vector<uint8_t> outA(big, 1), inA(big), outB(big, 2), inB(big);
    Transfer sendA{outA.data(), big}, recvA{inA.data(), big}, sendB{outB.data(), big}, recvB{inB.data(), big};
    ASSERT_TRUE(p.A().postSend(&sendA).isOk());
    ASSERT_TRUE(p.A().postRecv(&recvA).isOk());
    ASSERT_TRUE(p.B().postSend(&sendB).isOk());
    ASSERT_TRUE(p.B().postRecv(&recvB).isOk());
    Status s = drive(p, [&] { return recvA.progressed > 0 && recvB.progressed > 0; }, Deadline::afterSeconds(30));
    ASSERT_TRUE(s.isOk()) << s.toString();
    const auto start = Clock::now();
    p.a.reset();
    EXPECT_LT(secondsSince(start), 1.0);
    Status err = waitForFailure(*p.b, Deadline::afterSeconds(15));
    EXPECT_FALSE(err.isOk()) << "the survivor never noticed";
  }
  EXPECT_EQ(openFds(), fdsBefore) << "descriptors left open";
  EXPECT_FALSE(shm::testing::usesDevShm());
}

// Garbage where the peer's next message should be: an error naming the
// peer, never a crash, a hang, or bytes written into the receive buffer.
TYPED_TEST(PeerConformance, GarbageFromThePeerIsAnErrorNotACrash) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Pair p = this->pair();
    ASSERT_TRUE(p.a && p.b);
    std::mt19937 rng(seed);
    TypeParam::garbage(p, rng);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<uint8_t> in(4096, 0x5A);
    Transfer r{in.data(), in.size()};
    ASSERT_TRUE(p.A().postRecv(&r).isOk());
    Status err = waitForFailure(p.A(), Deadline::afterSeconds(10));
    ASSERT_FALSE(err.isOk()) << "garbage was accepted or ignored";
    EXPECT_EQ(err.code(), Code::kRemoteError) << err.toString();
    EXPECT_NE(err.message().find("rank 1"), std::string::npos) << err.message();
    EXPECT_FALSE(r.done);
    EXPECT_TRUE(std::all_of(in.begin(), in.end(), [](uint8_t x) { return x == 0x5A; }))
        << "garbage reached the receive buffer";
  }
}

}  // namespace
}  // namespace loom::transport
