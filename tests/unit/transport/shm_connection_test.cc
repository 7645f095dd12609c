// Tests of transport/shm/connection.h with both ranks as threads of this
// process: data paths, errors, wake-ups and the /dev/shm guarantee.
#include "transport/shm/connection.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "common/settings.h"
#include "shm_test_util.h"
#include "transport_test_util.h"

namespace loom::transport::shm {
namespace {

using testing::makePair;
using testing::Options;
using testing::Pair;

constexpr size_t kSmallFifo = 128 << 10;  // 16 KiB slots: multi-slot copies below 64 KiB

Options smallFifo(size_t singleCopyMin) {
  Options o;
  o.fifoBytes = kSmallFifo;
  o.singleCopyMin = singleCopyMin;
  return o;
}

Pair pairOrDie(const Options& a, const Options& b) {
  auto p = makePair(a, b);
  EXPECT_TRUE(p.isOk()) << p.status().toString();
  if (!p.isOk()) return Pair{};
  return std::move(p).value();
}

// Both directions at once, one thread per rank, every size class.
void exchangeBothWays(Pair& p, int rounds) {
  auto sizes = testing::mixedSizes(p.a->slotBytes(), rounds);
  Deadline d = Deadline::afterSeconds(120);
  Status sb;
  std::thread tb([&] { sb = testing::runExchange(*p.b, 2, sizes, 1, sizes, 4, d); });
  Status sa = testing::runExchange(*p.a, 1, sizes, 2, sizes, 4, d);
  tb.join();
  EXPECT_TRUE(sa.isOk()) << sa.toString();
  EXPECT_TRUE(sb.isOk()) << sb.toString();
  EXPECT_TRUE(p.a->idle());
  EXPECT_TRUE(p.b->idle());
}

// Progresses both ends until the send `s` and the receive `r` are done
// (30 s at most).
void progressUntilDone(Pair& p, const Transfer& s, const Transfer& r) {
  const Deadline d = Deadline::afterSeconds(30);
  while (!(s.done && r.done) && !d.expired()) {
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->progress().isOk());
  }
  ASSERT_TRUE(s.done && r.done);
}

TEST(Shm, SetupValuesAndKind) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(std::string(p.a->kind()), "shm");
  EXPECT_EQ(p.a->peer(), 1);
  EXPECT_EQ(p.b->peer(), 0);
  EXPECT_EQ(p.a->slotBytes(), kSmallFifo / kSlots);
  EXPECT_EQ(p.a->local().pid, ::getpid());
  EXPECT_NE(p.a->local().nonce, p.b->local().nonce);
  EXPECT_TRUE(p.a->attached());
  EXPECT_TRUE(p.a->idle());
  std::vector<pollfd> fds;
  p.a->pollFds(&fds);
  EXPECT_TRUE(fds.empty()) << "an idle connection has nothing to wait for";
}

TEST(Shm, MixedSizesBothWaysThreads) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  exchangeBothWays(p, 3);
  if (p.a->peerCanPull()) {
    // Unless copies ran slowly (a loaded machine) and so streamed instead.
    for (ShmConnection* c : {p.a.get(), p.b.get()}) {
      if (c->singleCopySends() == 0 && c->streamedOnce()) {
        std::printf("note: copies ran slowly here and streamed; single-copy was not exercised\n");
      } else {
        EXPECT_GT(c->singleCopySends(), 0u);
      }
    }
  } else {
    std::printf("note: process_vm_readv is not permitted here; single-copy was not exercised\n");
  }
}

TEST(Shm, MixedSizesDefaultOptions) {
  Pair p = pairOrDie(Options{}, Options{});
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(p.a->slotBytes(), Options{}.fifoBytes / kSlots);
  exchangeBothWays(p, 2);
}

TEST(Shm, FifoCopyFallbackCarriesEverything) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  EXPECT_FALSE(p.a->canPull());
  EXPECT_FALSE(p.a->peerCanPull());
  exchangeBothWays(p, 3);
  EXPECT_EQ(p.a->singleCopySends(), 0u);
  EXPECT_EQ(p.b->singleCopySends(), 0u);
}

TEST(Shm, OneSideWithoutSingleCopy) {
  // a never reads b's memory, so b copies through the FIFO; a still pulls.
  Pair p = pairOrDie(smallFifo(0), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  exchangeBothWays(p, 1);
  EXPECT_EQ(p.a->singleCopySends(), 0u);
  EXPECT_EQ(p.b->singleCopySends(), 0u);
}

// Records the pieces a sink receives and copies them to `out`.
struct RecordingSink final : Sink {
  std::vector<uint8_t>* out;
  std::vector<std::pair<size_t, size_t>> pieces;
  explicit RecordingSink(std::vector<uint8_t>* o) : out(o) {}
  void consume(size_t offset, const void* bytes, size_t n) override {
    pieces.emplace_back(offset, n);
    std::memcpy(out->data() + offset, bytes, n);
  }
};

// FIFO messages go to the sink in order, in whole-slot pieces, and `data`
// stays untouched; single-copy messages ignore the sink and land in `data`.
TEST(Shm, SinkGetsFifoMessagesPieceByPiece) {
  Pair p = pairOrDie(smallFifo(1 << 20), smallFifo(1 << 20));
  ASSERT_TRUE(p.a && p.b);
  const size_t slot = p.a->slotBytes();
  for (size_t bytes : {size_t(5), size_t(24), size_t(25), slot, 3 * slot + 40, size_t(2) << 20}) {
    std::vector<uint8_t> out(bytes), viaSink(bytes, 0), data(bytes, 0xee);
    for (size_t i = 0; i < bytes; ++i) out[i] = uint8_t(i * 7 + bytes);
    RecordingSink sink(&viaSink);
    Transfer s{out.data(), bytes}, r{data.data(), bytes};
    s.singleCopy = true;
    r.sink = &sink;
    const uint64_t pullsBefore = p.a->singleCopySends();
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    ASSERT_NO_FATAL_FAILURE(progressUntilDone(p, s, r)) << bytes;
    const bool pulled = p.a->singleCopySends() > pullsBefore;
    // Large enough to go single-copy, unless the copies before it ran
    // slowly (a loaded machine) and the sender streams instead.
    if (p.a->peerCanPull() && bytes >= (size_t(1) << 20) && !p.a->streamedOnce()) EXPECT_TRUE(pulled) << bytes;
    if (bytes < (size_t(1) << 20)) EXPECT_FALSE(pulled) << bytes;
    EXPECT_EQ(r.sunk, !pulled) << bytes;
    if (!r.sunk) {
      EXPECT_EQ(data, out) << bytes;
      EXPECT_TRUE(sink.pieces.empty());
      continue;
    }
    EXPECT_EQ(viaSink, out) << bytes;
    for (uint8_t x : data) ASSERT_EQ(x, 0xee) << "a sunk message must leave data untouched";
    size_t next = 0;
    for (auto [offset, n] : sink.pieces) {
      EXPECT_EQ(offset, next);
      EXPECT_EQ(n, std::min(slot, bytes - offset)) << "pieces fill whole slots but the last";
      EXPECT_EQ(offset % kSinkGrain, 0u);
      next += n;
    }
    EXPECT_EQ(next, bytes);
  }
}

// A sink that keeps where each piece lives, as a GPU kernel reading the FIFO
// later would.
struct LaterSink final : Sink {
  struct Piece {
    size_t offset;
    const uint8_t* at;
    size_t n;
  };
  std::vector<Piece> pieces;
  void consume(size_t offset, const void* bytes, size_t n) override {
    pieces.push_back(Piece{offset, static_cast<const uint8_t*>(bytes), n});
  }
  // True when every piece handed out still holds the message's bytes.
  bool intact(const std::vector<uint8_t>& message) const {
    for (const Piece& p : pieces)
      if (std::memcmp(p.at, message.data() + p.offset, p.n) != 0) return false;
    return true;
  }
};

// A held receive keeps its FIFO slots after it is done: the peer's next
// messages wait for room instead of overwriting pieces a late consumer
// still reads; release() frees them.
TEST(Shm, HeldSlotsStayValidUntilReleased) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  const size_t slot = p.a->slotBytes();
  std::vector<uint8_t> first(3 * slot), second(kSlots * slot), in(second.size());
  transport::testing::fillPattern(first.data(), first.size(), 1, 0);
  transport::testing::fillPattern(second.data(), second.size(), 2, 0);
  LaterSink sink;
  Transfer s1{first.data(), first.size()}, r1{nullptr, first.size()};
  std::vector<uint8_t> unused(first.size());
  r1.data = unused.data();
  r1.sink = &sink;
  r1.hold = true;
  ASSERT_TRUE(p.a->postSend(&s1).isOk());
  ASSERT_TRUE(p.b->postRecv(&r1).isOk());
  auto spin = [&](const std::function<bool()>& until, double seconds) {
    const Deadline d = Deadline::afterSeconds(seconds);
    while (!until() && !d.expired()) {
      EXPECT_TRUE(p.a->progress().isOk());
      EXPECT_TRUE(p.b->progress().isOk());
    }
    return until();
  };
  ASSERT_TRUE(spin([&] { return s1.done && r1.done; }, 10));
  ASSERT_EQ(sink.pieces.size(), 3u);
  // A whole FIFO's worth next: five slots are free, three are held.
  Transfer s2{second.data(), second.size()}, r2{in.data(), in.size()};
  ASSERT_TRUE(p.a->postSend(&s2).isOk());
  ASSERT_TRUE(p.b->postRecv(&r2).isOk());
  EXPECT_FALSE(spin([&] { return r2.done; }, 0.3)) << "the peer wrote over held slots";
  EXPECT_TRUE(sink.intact(first));
  EXPECT_EQ(r2.progressed, (kSlots - 3) * slot);
  ASSERT_TRUE(p.b->release(&r1).isOk());
  ASSERT_TRUE(spin([&] { return s2.done && r2.done; }, 10));
  EXPECT_EQ(in, second);
  EXPECT_TRUE(p.b->release(&r1).isOk()) << "a second release is a no-op";
}

// A held receive bigger than the FIFO completes when its consumer releases
// pieces as it goes.
TEST(Shm, HeldReceiveLargerThanTheFifoCompletesWithReleasesAlongTheWay) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  const size_t bytes = 3 * kSmallFifo + 123;
  std::vector<uint8_t> out(bytes), got(bytes), unused(bytes);
  transport::testing::fillPattern(out.data(), bytes, 3, 0);
  LaterSink sink;
  Transfer s{out.data(), bytes}, r{unused.data(), bytes};
  r.sink = &sink;
  r.hold = true;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  size_t copied = 0;
  const Deadline d = Deadline::afterSeconds(30);
  while (!(s.done && r.done) && !d.expired()) {
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->progress().isOk());
    // The late consumer: finishes what it was handed, then releases it.
    for (; copied < sink.pieces.size(); ++copied) {
      const auto& piece = sink.pieces[copied];
      std::memcpy(got.data() + piece.offset, piece.at, piece.n);
    }
    ASSERT_TRUE(p.b->release(&r).isOk());
  }
  ASSERT_TRUE(s.done && r.done);
  EXPECT_EQ(got, out);
}

// A message short enough to travel in its slot's descriptor: a held
// receive's sink gets a pointer into the inbox, valid until release (not a
// copy on the receiver's stack).
TEST(Shm, HeldInlineMessageStaysValidUntilReleased) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> message(16), unused(16), next(16), in(16);
  transport::testing::fillPattern(message.data(), message.size(), 4, 0);
  transport::testing::fillPattern(next.data(), next.size(), 5, 0);
  LaterSink sink;
  Transfer s{message.data(), message.size()}, r{unused.data(), unused.size()};
  r.sink = &sink;
  r.hold = true;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  progressUntilDone(p, s, r);
  // More traffic through both ends (other stack frames), then the piece.
  Transfer s2{next.data(), next.size()}, r2{in.data(), in.size()};
  ASSERT_TRUE(p.a->postSend(&s2).isOk());
  ASSERT_TRUE(p.b->postRecv(&r2).isOk());
  progressUntilDone(p, s2, r2);
  ASSERT_EQ(sink.pieces.size(), 1u);
  EXPECT_TRUE(sink.intact(message));
  EXPECT_EQ(in, next);
  ASSERT_TRUE(p.b->release(&r).isOk());
}

// A producer whose bytes become ready when the test says so.
struct GatedSource final : Source {
  std::vector<uint8_t> message;
  size_t available = 0;
  std::vector<std::pair<size_t, size_t>> calls;  // (offset, bytes)
  size_t ready() const override { return available; }
  void produce(size_t offset, void* to, size_t n) override {
    calls.emplace_back(offset, n);
    std::memcpy(to, message.data() + offset, n);
  }
};

// A produced send publishes a piece only once its source has all of it,
// writes every piece through the source (never reading `data`), and a
// waiter is not woken for a piece its source does not have yet.
TEST(Shm, ProducedSendGoesAsItsSourceHasIt) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  EXPECT_TRUE(p.a->produces());
  const size_t slot = p.a->slotBytes();
  EXPECT_EQ(p.a->fusedStepBytes(), kSmallFifo / 2 - slot);
  GatedSource source;
  source.message.resize(3 * slot + 100);
  transport::testing::fillPattern(source.message.data(), source.message.size(), 6, 0);
  std::vector<uint8_t> decoy(source.message.size(), 0xee), in(source.message.size());
  Transfer s{decoy.data(), decoy.size()}, r{in.data(), in.size()};
  s.source = &source;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->progress().isOk());
  }
  EXPECT_TRUE(source.calls.empty());
  EXPECT_EQ(r.progressed, 0u);
  std::vector<pollfd> fds;
  p.a->pollFds(&fds);
  EXPECT_EQ(::poll(fds.data(), fds.size(), 0), 0) << "nothing to do until the source has a piece";
  ASSERT_TRUE(p.a->progress().isOk());
  source.available = 2 * slot - 1;  // one whole piece
  ASSERT_TRUE(p.a->progress().isOk());
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_EQ(source.calls.size(), 1u);
  EXPECT_EQ(r.progressed, slot);
  source.available = source.message.size();
  progressUntilDone(p, s, r);
  EXPECT_EQ(in, source.message);
  const std::vector<std::pair<size_t, size_t>> pieces = {{0, slot}, {slot, slot}, {2 * slot, slot}, {3 * slot, 100}};
  EXPECT_EQ(source.calls, pieces);
  EXPECT_EQ(p.a->producedSends(), 1u);
  // A message that fits its descriptor is produced there.
  GatedSource tiny;
  tiny.message = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  tiny.available = tiny.message.size();
  std::vector<uint8_t> tinyIn(10);
  Transfer ts{decoy.data(), 10}, tr{tinyIn.data(), 10};
  ts.source = &tiny;
  ASSERT_TRUE(p.a->postSend(&ts).isOk());
  ASSERT_TRUE(p.b->postRecv(&tr).isOk());
  progressUntilDone(p, ts, tr);
  EXPECT_EQ(tinyIn, tiny.message);
}

TEST(Shm, NoFusedStepsWhenTurnedOff) {
  Options off = smallFifo(0);
  off.fusedSteps = false;
  Pair p = pairOrDie(off, smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  EXPECT_EQ(p.a->fusedStepBytes(), 0u);
  EXPECT_GT(p.b->fusedStepBytes(), 0u);
}

TEST(Shm, SizeMismatchIsStickyErrorAndWritesNothing) {
  for (size_t bytes : {size_t(8), size_t(1) << 20}) {
    Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
    ASSERT_TRUE(p.a && p.b);
    std::vector<uint8_t> out(bytes, 1), in(2 * bytes, 2);
    Transfer s{out.data(), bytes}, r{in.data(), 2 * bytes};
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    Status err = p.b->progress();
    ASSERT_FALSE(err.isOk());
    EXPECT_EQ(err.code(), Code::kRemoteError);
    std::string want = std::to_string(bytes) + "-byte message where a " +
                       std::to_string(2 * bytes) + "-byte receive";
    EXPECT_NE(err.message().find(want), std::string::npos) << err.message();
    for (uint8_t x : in) ASSERT_EQ(x, 2);
    EXPECT_FALSE(r.done);
    EXPECT_EQ(p.b->progress().message(), err.message());
    Transfer more{in.data(), 1};
    EXPECT_EQ(p.b->postRecv(&more).message(), err.message());
    std::vector<pollfd> fds;
    p.b->pollFds(&fds);
    EXPECT_TRUE(fds.empty());
  }
}

using testing::mapInbox;

// A buggy or hostile peer scribbles over the shared header of an inbox.
// The layout fields are ignored after setup (both the reader and the
// writer keep their own validated copy), and bad counters or slot
// descriptors are errors naming the peer, never out-of-bounds accesses.
TEST(Shm, ScribbledInboxHeaderIsAnErrorNotACrash) {
  const size_t bytes = 200000;  // several slots
  {
    Pair p = pairOrDie(smallFifo(0), smallFifo(0));
    InboxHeader* h = mapInbox(*p.b);
    ASSERT_NE(h, nullptr);
    h->slotBytes = uint64_t(1) << 40;
    h->dataOffset = uint64_t(1) << 41;
    h->slots = 1000;
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = uint8_t(i * 7);
    Transfer s{out.data(), bytes}, r{in.data(), bytes};
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    ASSERT_NO_FATAL_FAILURE(progressUntilDone(p, s, r));
    EXPECT_EQ(in, out);
    ::munmap(h, p.b->local().inboxBytes);
  }
  for (int how = 0; how < 3; ++how) {
    SCOPED_TRACE("scribble " + std::to_string(how));
    Pair p = pairOrDie(smallFifo(0), smallFifo(0));
    InboxHeader* h = mapInbox(*p.b);
    ASSERT_NE(h, nullptr);
    std::vector<uint8_t> out(bytes, 1), in(bytes, 2);
    Transfer s{out.data(), bytes}, r{in.data(), bytes};
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.a->progress().isOk());  // publishes the first slots
    if (how == 0) h->tail.store(uint64_t(1) << 50);
    if (how == 1) h->desc[0].pieceBytes = 0xffffffffu;
    if (how == 2) h->desc[0].offset = uint64_t(1) << 45;
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    Status err = p.b->progress();
    ASSERT_FALSE(err.isOk());
    EXPECT_EQ(err.code(), Code::kRemoteError);
    EXPECT_NE(err.message().find("rank 0"), std::string::npos) << err.message();
    for (uint8_t x : in) ASSERT_EQ(x, 2);
    ::munmap(h, p.b->local().inboxBytes);
  }
}

TEST(Shm, PostBeforeAttachAndAttachTwiceAreErrors) {
  auto a = ShmConnection::create(1, smallFifo(65536));
  auto b = ShmConnection::create(0, smallFifo(65536));
  ASSERT_TRUE(a.isOk() && b.isOk());
  uint8_t x = 0;
  Transfer t{&x, 1};
  EXPECT_EQ((*a)->postSend(&t).code(), Code::kInvalidUsage);
  EXPECT_TRUE((*a)->progress().isOk());
  ASSERT_TRUE((*a)->attach((*b)->local()).isOk());
  EXPECT_EQ((*a)->attach((*b)->local()).code(), Code::kInvalidUsage);
}

TEST(Shm, AttachRejectsWrongObjects) {
  auto a = ShmConnection::create(1, smallFifo(65536));
  auto b = ShmConnection::create(0, smallFifo(65536));
  ASSERT_TRUE(a.isOk() && b.isOk());
  ShmDescriptor d = (*b)->local();
  d.nonce ^= 1;
  Status s = (*a)->attach(d);
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("not that rank's inbox"), std::string::npos) << s.message();

  d = (*b)->local();
  d.memfd = d.wakeFd;  // a pipe, not a memfd
  s = (*a)->attach(d);
  EXPECT_FALSE(s.isOk());

  d = (*b)->local();
  d.memfd = 100000;  // no such fd
  s = (*a)->attach(d);
  EXPECT_EQ(s.code(), Code::kRemoteError);
  EXPECT_NE(s.message().find("NCCL_SHM_DISABLE"), std::string::npos) << s.message();

  d = (*b)->local();
  d.magic = 0;
  EXPECT_FALSE((*a)->attach(d).isOk());
  EXPECT_FALSE((*a)->attached());
  EXPECT_TRUE((*a)->attach((*b)->local()).isOk());
}

TEST(Shm, OptionsFromSettings) {
  Options d = Options::fromSettings();
  EXPECT_EQ(d.fifoBytes, size_t(2) << 20);
  EXPECT_EQ(d.singleCopyMin, size_t(65536));
  setenv("LOOM_SHM_FIFO_BYTES", "262144", 1);
  setenv("LOOM_SHM_SINGLE_COPY_MIN", "131072", 1);
  settings::reload();
  Options o = Options::fromSettings();
  unsetenv("LOOM_SHM_FIFO_BYTES");
  unsetenv("LOOM_SHM_SINGLE_COPY_MIN");
  settings::reload();
  EXPECT_EQ(o.fifoBytes, size_t(262144));
  EXPECT_EQ(o.singleCopyMin, size_t(131072));
}

TEST(Shm, BadOptionsAreRejected) {
  Options o;
  o.fifoBytes = 1000;
  auto c = ShmConnection::create(0, o);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("LOOM_SHM_FIFO_BYTES"), std::string::npos);
}

TEST(Shm, ClosedPeerDeliversWhatItSentThenFails) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> out(100), in(100);
  transport::testing::fillPattern(out.data(), 100, 3, 0);
  Transfer s{out.data(), 100};
  ASSERT_TRUE(p.b->postSend(&s).isOk());
  ASSERT_TRUE(p.b->progress().isOk());
  ASSERT_TRUE(s.done);
  p.b.reset();  // b closes
  Transfer r{in.data(), 100};
  ASSERT_TRUE(p.a->postRecv(&r).isOk());
  ASSERT_TRUE(p.a->progress().isOk()) << "published data is still delivered";
  EXPECT_TRUE(r.done);
  EXPECT_TRUE(transport::testing::checkPattern(in.data(), 100, 3, 0));
  EXPECT_TRUE(p.a->progress().isOk()) << "an idle connection to a closed peer is not an error";
  Transfer r2{in.data(), 100};
  ASSERT_TRUE(p.a->postRecv(&r2).isOk());
  Status err = p.a->progress();
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 1"), std::string::npos) << err.message();
  EXPECT_NE(err.message().find("closed"), std::string::npos) << err.message();
}

TEST(Shm, ClosingWakesASleepingPeer) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  uint8_t x;
  Transfer r{&x, 1};
  ASSERT_TRUE(p.a->postRecv(&r).isOk());
  ASSERT_TRUE(p.a->progress().isOk());
  std::vector<pollfd> fds;
  p.a->pollFds(&fds);
  ASSERT_FALSE(fds.empty());
  EXPECT_EQ(::poll(fds.data(), fds.size(), 0), 0);
  p.b.reset();
  EXPECT_GT(::poll(fds.data(), fds.size(), 0), 0);
  EXPECT_EQ(p.a->progress().code(), Code::kRemoteError);
}

TEST(Shm, NoWakeupSyscallsWhileNobodySleeps) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> out(64, 1), in(64);
  for (int i = 0; i < 200; ++i) {
    Transfer s{out.data(), 64}, r{in.data(), 64};
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    for (int k = 0; k < 1000 && !(s.done && r.done); ++k) {
      ASSERT_TRUE(p.a->progress().isOk());
      ASSERT_TRUE(p.b->progress().isOk());
    }
    ASSERT_TRUE(s.done && r.done);
  }
  EXPECT_EQ(p.a->wakeupsSent(), 0u);
  EXPECT_EQ(p.b->wakeupsSent(), 0u);
}

TEST(Shm, SleepingReceiverIsWokenBySend) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  uint64_t out = 0x1122334455667788ull, in = 0;
  Transfer r{&in, 8}, s{&out, 8};
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  ASSERT_TRUE(p.b->progress().isOk());
  std::vector<pollfd> fds;
  p.b->pollFds(&fds);
  ASSERT_FALSE(fds.empty());
  EXPECT_EQ(::poll(fds.data(), fds.size(), 0), 0) << "nothing to do yet";
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.a->progress().isOk());
  EXPECT_EQ(p.a->wakeupsSent(), 1u);
  EXPECT_GT(::poll(fds.data(), fds.size(), 0), 0) << "the send must wake the receiver";
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_TRUE(r.done);
  EXPECT_EQ(in, out);
  // Woken and drained: the next wait blocks again.
  Transfer r2{&in, 8};
  ASSERT_TRUE(p.b->postRecv(&r2).isOk());
  fds.clear();
  p.b->pollFds(&fds);
  EXPECT_EQ(::poll(fds.data(), fds.size(), 0), 0);
}

TEST(Shm, DataAlreadyThereMakesPollReturnAtOnce) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  uint32_t out = 5, in = 0;
  Transfer s{&out, 4}, r{&in, 4};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.a->progress().isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());  // no progress() before waiting
  std::vector<pollfd> fds;
  p.b->pollFds(&fds);
  EXPECT_GT(::poll(fds.data(), fds.size(), 0), 0);
  EXPECT_EQ(p.a->wakeupsSent(), 0u);
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_EQ(in, 5u);
}

TEST(Shm, SenderWaitingForSlotsIsWoken) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  const size_t n = kSlots + 2;
  std::vector<uint8_t> out(64, 3), in(64 * n);
  std::vector<Transfer> s(n), r(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = Transfer{out.data(), 64};
    ASSERT_TRUE(p.a->postSend(&s[i]).isOk());
  }
  ASSERT_TRUE(p.a->progress().isOk());
  EXPECT_TRUE(s[kSlots - 1].done);
  EXPECT_FALSE(s[kSlots].done) << "the FIFO holds kSlots messages";
  std::vector<pollfd> fds;
  p.a->pollFds(&fds);
  EXPECT_EQ(::poll(fds.data(), fds.size(), 0), 0);
  for (size_t i = 0; i < n; ++i) {
    r[i] = Transfer{in.data() + 64 * i, 64};
    ASSERT_TRUE(p.b->postRecv(&r[i]).isOk());
  }
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_EQ(p.b->wakeupsSent(), 1u);
  EXPECT_GT(::poll(fds.data(), fds.size(), 0), 0) << "freed slots must wake the sender";
  ASSERT_TRUE(p.a->progress().isOk());
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_TRUE(s[n - 1].done && r[n - 1].done);
}

TEST(Shm, SingleCopySendCompletesOnlyAfterTheReceiverCopied) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  if (!p.a->peerCanPull()) GTEST_SKIP() << "process_vm_readv is not permitted here";
  const size_t bytes = 1 << 20;
  std::vector<uint8_t> out(bytes), in(bytes);
  transport::testing::fillPattern(out.data(), bytes, 4, 0);
  Transfer s{out.data(), bytes}, r{in.data(), bytes};
  s.singleCopy = true;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.a->progress().isOk());
  EXPECT_FALSE(s.done) << "the buffer is read by the receiver later";
  EXPECT_EQ(p.a->singleCopySends(), 1u);
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  ASSERT_TRUE(p.b->progress().isOk());
  EXPECT_TRUE(r.done);
  ASSERT_TRUE(p.a->progress().isOk());
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.progressed, bytes);
  EXPECT_TRUE(transport::testing::checkPattern(in.data(), bytes, 4, 0));
}

// Without the plan's hint a message goes through the FIFO, however large:
// a receiver that folds it reads it from there (its sink).
TEST(Shm, SendsWithoutTheHintAreCopiedThroughTheFifo) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  if (!p.a->peerCanPull()) GTEST_SKIP() << "process_vm_readv is not permitted here";
  const size_t bytes = 1 << 20;
  std::vector<uint8_t> out(bytes), viaSink(bytes), data(bytes, 0xee);
  transport::testing::fillPattern(out.data(), bytes, 5, 0);
  RecordingSink sink(&viaSink);
  Transfer s{out.data(), bytes}, r{data.data(), bytes};
  r.sink = &sink;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  ASSERT_NO_FATAL_FAILURE(progressUntilDone(p, s, r));
  EXPECT_EQ(p.a->singleCopySends(), 0u);
  EXPECT_TRUE(r.sunk);
  EXPECT_TRUE(transport::testing::checkPattern(viaSink.data(), bytes, 5, 0));
}

// A receive with the stream hint (a large operation's output) is copied out
// of the FIFO with streaming stores: every byte arrives, also at a
// destination that is not line aligned and a length that is not a whole
// number of lines, and nothing beside it is written.
TEST(Shm, StreamedReceivesArriveWhole) {
  Pair p = pairOrDie(smallFifo(0), smallFifo(0));
  ASSERT_TRUE(p.a && p.b);
  for (size_t misalign : {size_t(0), size_t(1), size_t(24)}) {
    const size_t bytes = 3 * (kSmallFifo / kSlots) + 1000;  // several slots and a ragged tail
    std::vector<uint8_t> out(bytes), in(bytes + 192, 0xee);
    transport::testing::fillPattern(out.data(), bytes, 9, 0);
    // A cache-line boundary plus `misalign`, with untouched bytes around.
    uint8_t* line = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(in.data()) + 64 + 63) & ~uintptr_t(63));
    uint8_t* dst = line + misalign;
    Transfer s{out.data(), bytes}, r{dst, bytes};
    r.stream = true;
    ASSERT_TRUE(p.a->postSend(&s).isOk());
    ASSERT_TRUE(p.b->postRecv(&r).isOk());
    ASSERT_NO_FATAL_FAILURE(progressUntilDone(p, s, r));
    EXPECT_TRUE(transport::testing::checkPattern(dst, bytes, 9, 0)) << "misaligned by " << misalign;
    for (uint8_t* q = in.data(); q < dst; ++q) ASSERT_EQ(*q, 0xee) << "written before the destination";
    for (uint8_t* q = dst + bytes; q < in.data() + in.size(); ++q) ASSERT_EQ(*q, 0xee) << "written after it";
  }
}

TEST(Shm, UnreadableSendBufferIsAnError) {
  Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
  ASSERT_TRUE(p.a && p.b);
  if (!p.a->peerCanPull()) GTEST_SKIP() << "process_vm_readv is not permitted here";
  const size_t bytes = 1 << 20;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  std::vector<uint8_t> in(bytes);
  Transfer s{mem, bytes}, r{in.data(), bytes};
  s.singleCopy = true;
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.a->progress().isOk());
  ASSERT_EQ(::munmap(mem, bytes), 0);  // breaks the contract on purpose
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  Status err = p.b->progress();
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("not readable"), std::string::npos) << err.message();
  EXPECT_FALSE(r.done);
}

TEST(Shm, SendsBeforeThePeerAttachedAreDelivered) {
  auto a = ShmConnection::create(1, smallFifo(65536));
  auto b = ShmConnection::create(0, smallFifo(65536));
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE((*a)->attach((*b)->local()).isOk());
  EXPECT_FALSE((*a)->peerCanPull()) << "b has not probed yet";
  const std::vector<size_t> sizes = {0, 5, 100000};
  std::vector<std::vector<uint8_t>> out(sizes.size()), in(sizes.size());
  std::vector<Transfer> s(sizes.size()), r(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i].resize(sizes[i] + 1);
    in[i].resize(sizes[i] + 1);
    transport::testing::fillPattern(out[i].data(), sizes[i], 6, uint32_t(i));
    s[i] = Transfer{out[i].data(), sizes[i]};
    ASSERT_TRUE((*a)->postSend(&s[i]).isOk());
  }
  ASSERT_TRUE((*a)->progress().isOk());
  ASSERT_TRUE((*b)->attach((*a)->local()).isOk());
  std::vector<Transfer*> all;
  for (size_t i = 0; i < sizes.size(); ++i) {
    r[i] = Transfer{in[i].data(), sizes[i]};
    ASSERT_TRUE((*b)->postRecv(&r[i]).isOk());
    all.push_back(&r[i]);
  }
  std::thread ta([&] {
    std::vector<Transfer*> sends;
    for (auto& t : s) sends.push_back(&t);
    EXPECT_TRUE(transport::testing::waitAll(**a, sends, Deadline::afterSeconds(30)).isOk());
  });
  Status st = transport::testing::waitAll(**b, all, Deadline::afterSeconds(30));
  ta.join();
  ASSERT_TRUE(st.isOk()) << st.toString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(transport::testing::checkPattern(in[i].data(), sizes[i], 6, uint32_t(i)));
  }
  EXPECT_EQ((*a)->singleCopySends(), 0u);
}

TEST(Shm, BlockingPingPongThreadsIsNotPacedByTimeouts) {
  Pair p = pairOrDie(Options{}, Options{});
  ASSERT_TRUE(p.a && p.b);
  const int rounds = 1000;
  Deadline d = Deadline::afterSeconds(120);
  auto t0 = std::chrono::steady_clock::now();
  Status sb;
  std::thread tb([&] { sb = testing::pingPong(*p.b, false, 8, rounds, true, d); });
  Status sa = testing::pingPong(*p.a, true, 8, rounds, true, d);
  tb.join();
  double secs = secondsSince(t0);
  ASSERT_TRUE(sa.isOk()) << sa.toString();
  ASSERT_TRUE(sb.isOk()) << sb.toString();
  std::printf("1000 blocking ping-pongs between threads: %.3f s\n", secs);
  // A lost wake-up costs a 50 ms poll timeout; 1000 of them would take 50 s.
  EXPECT_LT(secs, 25.0);
  EXPECT_GT(p.a->wakeupsSent() + p.b->wakeupsSent(), 0u);
}

TEST(Shm, NothingInDevShm) {
  auto before = testing::devShmEntries();
  {
    Pair p = pairOrDie(smallFifo(65536), smallFifo(65536));
    ASSERT_TRUE(p.a && p.b);
    exchangeBothWays(p, 1);
    EXPECT_EQ(testing::devShmEntries(), before);
    EXPECT_FALSE(testing::usesDevShm());
  }
  EXPECT_EQ(testing::devShmEntries(), before);
  EXPECT_FALSE(testing::usesDevShm());
}

}  // namespace
}  // namespace loom::transport::shm
