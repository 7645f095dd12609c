// Fuzz target `shm_inbox`: the shared-memory transport facing a hostile peer
// process, which can write anything into the inbox it shares with us.
//
// Each input gets a fresh attached pair of ShmConnections in this process:
// `a` is the side under test, `b` its (otherwise honest) peer. The input is
// a program for the peer: scribble a's inbox (tail, slot descriptors, slot
// data, any header byte), scribble the counters of b's inbox that a reads
// (head, closed, pullState, sleeping), send real messages from b, and have a post
// receives and sends and run progress(). a must turn every corruption into
// an error or deliver messages within the buffers it was given: never crash,
// hang, or touch memory outside them (ASan).
//
// Descriptor fuzzing (config bit 2): before a attaches, the descriptor b
// sent is altered (magic, nonce, size, version) and its two fd numbers are
// picked among the real memfds and wake pipes of this process, and b's
// inbox header may be scribbled. The pid always stays this process's:
// Inbox::open opens /proc/<pid>/fd/<n>, which must never reach another
// process or an arbitrary fd.
//
// Input: [config : u8] (bit 0: a reads single-copy, bit 1: b sends
// single-copy, bit 2: descriptor fuzzing, then its fields), then up to
// kMaxOps operations [op : u8 % kOps] with their operands (see Op).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "transport/shm/connection.h"

namespace {

using namespace loom::transport;
using namespace loom::transport::shm;

constexpr size_t kFifoBytes = kSlots * kPageBytes;  // the smallest FIFO: one page per slot
constexpr size_t kMaxMessage = 5 * kFifoBytes / 2;  // up to several rounds of the FIFO
constexpr int kMaxOps = 256;
constexpr int kFinalRounds = 4;

enum Op : uint8_t {
  kTailRelative,   // a's inbox tail = head + i16
  kTailAbsolute,   // a's inbox tail = u64
  kDesc,           // one SlotDesc of a's inbox
  kSlotData,       // bytes into one data slot of a's inbox
  kOwnHeaderByte,  // bytes anywhere in a's inbox header page
  kPeerHeaderByte, // bytes anywhere in b's inbox header page
  kPeerHead,       // b's inbox head (a's sends are acknowledged by it) = tail + i16
  kPeerFlag,       // b's inbox closed / pullState / sleeping = u32
  kRecv,           // a posts a receive (optionally into a sink)
  kSend,           // a posts a send
  kPeerSend,       // b posts a real send and runs progress()
  kProgress,       // a runs progress()
  kPeerProgress,   // b runs progress()
  kOps
};

void die(const char* what) {
  std::perror(what);
  std::abort();
}

// A process's view of an inbox, mapped the way its peer maps it.
class Mapped {
 public:
  explicit Mapped(const ShmDescriptor& d) : bytes_(d.inboxBytes) {
    const std::string path = "/proc/self/fd/" + std::to_string(d.memfd);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) die("open inbox");
    p_ = static_cast<uint8_t*>(::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    if (p_ == MAP_FAILED) die("mmap inbox");
  }
  ~Mapped() { ::munmap(p_, bytes_); }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;

  InboxHeader* header() const { return reinterpret_cast<InboxHeader*>(p_); }
  uint8_t* bytes() const { return p_; }
  size_t dataOffset() const { return bytes_ - kSlots * slotBytes(); }
  size_t slotBytes() const { return kFifoBytes / kSlots; }

 private:
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
};

// Checks the Sink contract: pieces in order, inside the message, each but
// the last on kSinkGrain boundaries.
class CheckingSink final : public Sink {
 public:
  explicit CheckingSink(size_t bytes) : bytes_(bytes) {}
  void consume(size_t offset, const void* data, size_t n) override {
    FUZZ_CHECK(offset == next_);
    FUZZ_CHECK(n > 0 && n <= bytes_ - offset);
    FUZZ_CHECK(offset % kSinkGrain == 0);
    volatile uint8_t touch = static_cast<const uint8_t*>(data)[n - 1];  // ASan: inside the slot
    (void)touch;
    next_ = offset + n;
  }
  size_t next() const { return next_; }

 private:
  size_t bytes_;
  size_t next_ = 0;
};

struct Message {
  std::unique_ptr<uint8_t[]> buf;  // exactly t.bytes
  std::unique_ptr<CheckingSink> sink;
  Transfer t;
};

std::unique_ptr<Message> makeMessage(size_t bytes, bool withSink, uint8_t fill) {
  auto m = std::make_unique<Message>();
  if (bytes > 0) {
    m->buf.reset(new uint8_t[bytes]);
    std::memset(m->buf.get(), fill, bytes);
  }
  m->t.data = m->buf.get();
  m->t.bytes = bytes;
  if (withSink) {
    m->sink = std::make_unique<CheckingSink>(bytes);
    m->t.sink = m->sink.get();
  }
  return m;
}

// a's receives or sends: the Transfer contract, checked after progress().
void checkInOrder(const std::deque<std::unique_ptr<Message>>& msgs) {
  bool prevDone = true;
  for (const auto& m : msgs) {
    FUZZ_CHECK(m->t.progressed <= m->t.bytes);
    FUZZ_CHECK(!m->t.done || m->t.progressed == m->t.bytes);
    FUZZ_CHECK(!m->t.done || prevDone);
    if (m->sink && m->t.done && m->t.sunk) FUZZ_CHECK(m->sink->next() == m->t.bytes);
    prevDone = m->t.done;
  }
}

// Alters the descriptor of b before a attaches to it; fd numbers come from
// the real inbox fds of this process only.
ShmDescriptor fuzzDescriptor(loom::fuzz::Input& in, const ShmConnection& a, const ShmConnection& b,
                             Mapped& bInbox) {
  ShmDescriptor d = b.local();
  const int32_t fds[4] = {b.local().memfd, b.local().wakeFd, a.local().memfd, a.local().wakeFd};
  const uint8_t which = in.u8();
  d.memfd = fds[which & 3];
  d.wakeFd = fds[(which >> 2) & 3];
  if (which & 0x10) d.magic ^= in.u64();
  if (which & 0x20) d.nonce ^= in.u64();
  if (which & 0x40) d.inboxBytes ^= in.u64();
  if (which & 0x80) d.version ^= in.u32();
  // b rewrites the read-once part of its header before a looks at it.
  const uint8_t scribbles = in.u8() & 7;
  for (int i = 0; i < scribbles; ++i) {
    const size_t off = in.u8() % offsetof(InboxHeader, closed);
    std::string_view v = in.view(std::min<size_t>(in.u8() % 16, offsetof(InboxHeader, closed) - off));
    std::memcpy(bInbox.bytes() + off, v.data(), v.size());
  }
  return d;
}

void writeInto(loom::fuzz::Input& in, uint8_t* base, size_t regionBytes) {
  const size_t off = in.u16() % regionBytes;
  std::string_view v = in.view(std::min<size_t>(in.u8(), regionBytes - off));
  std::memcpy(base + off, v.data(), v.size());
}

// One input: the pair, the harness's views of both inboxes, and what was
// posted on the connections.
class Session {
 public:
  // Creates and attaches the pair; false when a refused b's descriptor.
  bool open(loom::fuzz::Input& in) {
    const uint8_t config = in.u8();
    ShmConnection::Options ao, bo;
    ao.fifoBytes = bo.fifoBytes = kFifoBytes;
    ao.singleCopyMin = (config & 1) ? 64 : 0;
    bo.singleCopyMin = (config & 2) ? 64 : 0;
    auto ca = ShmConnection::create(1, ao);
    auto cb = ShmConnection::create(0, bo);
    if (!ca.isOk() || !cb.isOk()) die("ShmConnection::create");
    a_ = std::move(ca.value());
    b_ = std::move(cb.value());
    aInbox_.emplace(a_->local());

    ShmDescriptor toA = b_->local();
    if (config & 4) toA = fuzzDescriptor(in, *a_, *b_, peerInbox());
    loom::Status s = a_->attach(toA);
    FUZZ_TRACE("shm: attach: %s\n", s.isOk() ? "ok" : s.message().c_str());
    if (!s.isOk()) {
      FUZZ_CHECK(s.code() == loom::Code::kRemoteError || s.code() == loom::Code::kSystemError);
      return false;
    }
    return b_->attach(a_->local()).isOk();
  }

  bool failed() const { return failed_; }

  void apply(Op op, loom::fuzz::Input& in) {
    InboxHeader* ah = aInbox_->header();
    switch (op) {
      case kTailRelative:
        ah->tail.store(ah->head.load() + uint64_t(int64_t(int16_t(in.u16()))));
        break;
      case kTailAbsolute:
        ah->tail.store(in.u64());
        break;
      case kDesc:
        in.bytes(&ah->desc[in.u8() % kSlots], sizeof(SlotDesc));
        break;
      case kSlotData: {
        const size_t slot = in.u8() % kSlots;
        writeInto(in, aInbox_->bytes() + aInbox_->dataOffset() + slot * aInbox_->slotBytes(),
                  aInbox_->slotBytes());
        break;
      }
      case kOwnHeaderByte:
        writeInto(in, aInbox_->bytes(), aInbox_->dataOffset());
        break;
      case kPeerHeaderByte:
        writeInto(in, peerInbox().bytes(), peerInbox().dataOffset());
        break;
      case kPeerHead: {
        InboxHeader* bh = peerInbox().header();
        bh->head.store(bh->tail.load() + uint64_t(int64_t(int16_t(in.u16()))));
        break;
      }
      case kPeerFlag: {
        const uint8_t which = in.u8() % 3;
        const uint32_t v = in.u32();
        InboxHeader* bh = peerInbox().header();
        if (which == 0) bh->closed.store(v);
        if (which == 1) bh->pullState.store(v);
        if (which == 2) bh->sleeping.store(v);
        break;
      }
      case kRecv: {
        const bool sink = in.u8() & 1;
        recvs_.push_back(makeMessage(in.u32() % (kMaxMessage + 1), sink, 0xEE));
        FUZZ_CHECK(a_->postRecv(&recvs_.back()->t).isOk());
        break;
      }
      case kSend:
        sends_.push_back(makeMessage(in.u32() % (kMaxMessage + 1), false, 0x5A));
        sends_.back()->t.singleCopy = true;  // a plan's hint: single-copy where the options allow
        FUZZ_CHECK(a_->postSend(&sends_.back()->t).isOk());
        break;
      case kPeerSend:
        peerSends_.push_back(makeMessage(in.u32() % (kMaxMessage + 1), false, 0xA5));
        peerSends_.back()->t.singleCopy = true;
        if (b_->postSend(&peerSends_.back()->t).isOk()) (void)b_->progress();
        break;
      case kProgress:
        progress();
        break;
      case kPeerProgress:
        (void)b_->progress();
        break;
      case kOps:
        break;
    }
  }

  // a's progress() and the contract checks after it.
  void progress() {
    loom::Status s = a_->progress();
    checkInOrder(recvs_);
    checkInOrder(sends_);
    std::vector<pollfd> fds;
    a_->pollFds(&fds);
    if (s.isOk()) return;
    FUZZ_TRACE("shm: progress: %s\n", s.message().c_str());
    FUZZ_CHECK(s.code() == loom::Code::kRemoteError || s.code() == loom::Code::kSystemError);
    FUZZ_CHECK(a_->progress().code() == s.code());  // sticky
    failed_ = true;
  }

  // A few more rounds for what is still pending.
  void finish() {
    for (int i = 0; i < kFinalRounds && !failed_ && !a_->idle(); ++i) {
      (void)b_->progress();
      progress();
    }
    for (const auto& m : recvs_) {
      FUZZ_TRACE("shm: receive of %zu: %zu bytes%s%s\n", m->t.bytes, m->t.progressed,
                 m->t.done ? ", done" : "", m->t.sunk ? ", sunk" : "");
    }
  }

 private:
  // Mapped on first use: most inputs never touch b's inbox.
  Mapped& peerInbox() {
    if (!bInbox_) bInbox_.emplace(b_->local());
    return *bInbox_;
  }

  // Declared first, destroyed last: transfers outlive the connections.
  std::deque<std::unique_ptr<Message>> recvs_, sends_, peerSends_;
  std::unique_ptr<ShmConnection> a_, b_;
  std::optional<Mapped> aInbox_, bInbox_;
  bool failed_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::Input in(data, size);
  Session session;
  if (!session.open(in)) return 0;
  for (int i = 0; i < kMaxOps && !session.failed() && !in.empty(); ++i) session.apply(Op(in.u8() % kOps), in);
  session.finish();
  return 0;
}
