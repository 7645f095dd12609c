#include "transport/shm/connection.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/settings.h"
#include "kernels/reduce.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

namespace loom::transport::shm {
namespace {

// Single-copy bytes one progress() call moves at most, so it stays short.
constexpr size_t kPullBudget = size_t(8) << 20;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);
constexpr size_t kMaxFifoBytes = size_t(1) << 30;

uint64_t makeNonce() {
  uint64_t n = 0;
  if (::getrandom(&n, sizeof n, GRND_NONBLOCK) == ssize_t(sizeof n) && n != 0) return n;
  // No entropy yet: unique enough to tell this inbox from another process's.
  static std::atomic<uint64_t> counter{0};
  uint64_t t = uint64_t(Clock::now().time_since_epoch().count());
  return (t * 0x9E3779B97F4A7C15ULL) ^ (uint64_t(::getpid()) << 32) ^ ++counter;
}

// Yama ptrace_scope 1 only lets a process read another's memory when the
// target named it (or anyone) as its tracer. Done once per process; ignored
// where Yama is absent (EINVAL).
void allowPeerReads() {
  static std::once_flag once;
  std::call_once(once, [] { ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); });
}

std::atomic<bool> gLoggedNoPull{false};

}  // namespace

ShmConnection::Options ShmConnection::Options::fromSettings() {
  auto cfg = settings::current();
  Options o;
  int64_t fifo = cfg->getInt("LOOM_SHM_FIFO_BYTES");
  if (fifo > 0) o.fifoBytes = size_t(fifo);
  int64_t min = cfg->getInt("LOOM_SHM_SINGLE_COPY_MIN");
  o.singleCopyMin = min > 0 ? size_t(min) : 0;
  o.fusedSteps = cfg->getBool("LOOM_SHM_FUSED_STEPS");
  return o;
}

Result<std::unique_ptr<ShmConnection>> ShmConnection::create(int peerRank,
                                                             const Options& options) {
  if (options.fifoBytes < kSlots * kMinSlotBytes || options.fifoBytes > kMaxFifoBytes) {
    return invalidArgument("shared-memory FIFO of " + std::to_string(options.fifoBytes) +
                           " bytes (LOOM_SHM_FIFO_BYTES): use between " +
                           std::to_string(kSlots * kMinSlotBytes) + " and " +
                           std::to_string(kMaxFifoBytes) + " bytes");
  }
  const size_t slotBytes = options.fifoBytes / kSlots / kPageBytes * kPageBytes;
  LOOM_ASSIGN_OR_RETURN(Inbox mine, Inbox::create(slotBytes, makeNonce()));
  if (options.singleCopyMin > 0) allowPeerReads();
  return std::unique_ptr<ShmConnection>(new ShmConnection(peerRank, options, std::move(mine)));
}

ShmConnection::ShmConnection(int peerRank, const Options& options, Inbox mine)
    : peer_(peerRank), options_(options), mine_(std::move(mine)) {
  local_ = mine_.describe();
}

ShmConnection::~ShmConnection() {
  // Shared memory has no EOF: say so in our header and wake the peer.
  mine_.header()->closed.store(1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (theirs_.valid()) theirs_.signal();
}

std::string ShmConnection::describePeer() const {
  return "rank " + std::to_string(peer_) + " (pid " + std::to_string(peerPid_) + ")";
}

bool ShmConnection::peerCanPull() const {
  return theirs_.valid() &&
         theirs_.header()->pullState.load(std::memory_order_acquire) == kPullOk;
}

Status ShmConnection::attach(const ShmDescriptor& peer) {
  if (!error_.isOk()) return error_;
  if (attached_) {
    return invalidUsage("attach() called twice on the shared-memory connection to rank " +
                        std::to_string(peer_));
  }
  peerPid_ = pid_t(peer.pid);
  samePid_ = peerPid_ == ::getpid();
  if (!samePid_ && peer.pid > 0) {
    // Opened before the fds: once the nonce checks out, this pidfd is known
    // to be the process that owns them (no pid-reuse race).
    int fd = int(::syscall(SYS_pidfd_open, peerPid_, 0));
    if (fd >= 0) {
      pidfd_.reset(fd);
    } else if (errno == ESRCH) {
      return remoteError(describePeer() + " is not running here: it exited, or the ranks run in "
                         "different PID namespaces; run them in one or set NCCL_SHM_DISABLE=1");
    }  // ENOSYS/EPERM: fall back to kill(pid, 0).
  }
  LOOM_ASSIGN_OR_RETURN(theirs_, Inbox::open(peer, peer_));
  canPull_ = probePull();
  mine_.header()->pullState.store(canPull_ ? kPullOk : kPullNo, std::memory_order_release);
  attached_ = true;
  LOOM_INFO(log::kShm,
            "shm: connected to %s: FIFO %u x %zu bytes, single-copy receive %s, send from %zu "
            "bytes",
            describePeer().c_str(), kSlots, mine_.slotBytes(), canPull_ ? "on" : "off",
            options_.singleCopyMin);
  return Status::ok();
}

// Reads the magic and nonce of the peer's header from the peer's own address
// space: proves process_vm_readv works and reaches the right process.
bool ShmConnection::probePull() const {
  if (options_.singleCopyMin == 0) return false;
  const InboxHeader* h = theirs_.header();
  uint64_t got[2] = {0, 0};
  iovec local{got, sizeof got};
  iovec remote{reinterpret_cast<void*>(uintptr_t(h->ownerAddr)), sizeof got};
  ssize_t n = ::process_vm_readv(peerPid_, &local, 1, &remote, 1, 0);
  int err = n < 0 ? errno : 0;
  if (n == ssize_t(sizeof got) && got[0] == h->magic && got[1] == h->nonce) return true;
  if (!gLoggedNoPull.exchange(true)) {
    std::string why = n < 0 ? errnoText(err) : "it read unexpected bytes";
    LOOM_INFO(log::kShm,
              "shm: process_vm_readv from %s failed (%s): large messages are copied through the "
              "shared FIFO instead of single-copy. Single-copy needs ptrace access between the "
              "ranks (CAP_SYS_PTRACE in containers, kernel.yama.ptrace_scope <= 1)",
              describePeer().c_str(), why.c_str());
  }
  return false;
}

Status ShmConnection::fail(Status s) {
  if (error_.isOk()) error_ = std::move(s);
  return error_;
}

Status ShmConnection::checkState(const char* what) const {
  if (!error_.isOk()) return error_;
  if (!attached_) {
    return invalidUsage(std::string(what) + " on the shared-memory connection to rank " +
                        std::to_string(peer_) + " before attach()");
  }
  return Status::ok();
}

Status ShmConnection::queueSend(Transfer* t) {
  LOOM_TRY(checkState("send"));
  SendMsg m;
  m.t = t;
  m.seq = nextSendSeq_++;
  sends_.push(m);
  return Status::ok();
}

Status ShmConnection::queueRecv(Transfer* t) {
  LOOM_TRY(checkState("receive"));
  RecvMsg m;
  m.t = t;
  m.seq = nextRecvSeq_++;
  recvs_.push(m);
  return Status::ok();
}

Status ShmConnection::progress() {
  if (!error_.isOk()) return error_;
  if (!attached_) return Status::ok();
  const bool woke = armed_;
  if (armed_) {
    armed_ = false;
    mine_.header()->sleeping.store(0, std::memory_order_relaxed);
    mine_.drainWakeups();
  }
  if (idle()) return Status::ok();
  // Decided before moving bytes: what a dead peer published is still delivered.
  const bool gone = peerGone(woke);
  Status s = moveSends();
  if (s.isOk()) s = moveRecvs();
  wakePeer();
  if (!s.isOk()) return fail(std::move(s));
  if (gone && !idle()) {
    return fail(remoteError(describePeer() + " " + goneReason_ +
                            " while messages to or from it were pending: that rank failed or "
                            "was killed; check its log"));
  }
  return Status::ok();
}

bool ShmConnection::peerGone(bool force) {
  if (theirs_.header()->closed.load(std::memory_order_acquire) != 0) {
    goneReason_ = "closed its shared-memory connection";
    return true;
  }
  if (samePid_) return false;
  if (!force) {
    if ((++calls_ & 63u) != 0) return false;
    if (Clock::now() - lastLiveness_ < kLivenessPeriod) return false;
  }
  lastLiveness_ = Clock::now();
  bool dead;
  if (pidfd_) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    dead = ::poll(&p, 1, 0) > 0;
  } else {
    dead = ::kill(peerPid_, 0) != 0 && errno == ESRCH;
  }
  if (dead) goneReason_ = "exited";
  return dead;
}

// Reads the peer's consumer counter; only when the cached one says the FIFO
// is full or a single-copy send waits for its acknowledgement, so the fast
// path does not pull that cache line over.
Status ShmConnection::loadHead() {
  headSeen_ = theirs_.header()->head.load(std::memory_order_acquire);
  if (headSeen_ > tail_) {
    return remoteError(describePeer() + " consumed more shared-memory slots than were "
                       "published: its inbox is corrupted");
  }
  return Status::ok();
}

size_t ShmConnection::fusedStepBytes() const {
  if (!attached_ || !options_.fusedSteps) return 0;
  const size_t slot = std::max(mine_.slotBytes(), theirs_.slotBytes());
  const size_t fifo = std::min(mine_.slotBytes(), theirs_.slotBytes()) * kSlots;
  return fifo / 2 > slot ? fifo / 2 - slot : 0;
}

// The bytes of the next piece of `m` copied into the FIFO.
size_t ShmConnection::pieceOf(const SendMsg& m) const {
  const size_t bytes = m.t->bytes;
  return bytes <= kInlineBytes ? bytes : std::min(theirs_.slotBytes(), bytes - m.published);
}

// Writes the next piece of `m` into the slot of step tail_.
void ShmConnection::fillSlot(SendMsg& m, SlotDesc& d) {
  const size_t bytes = m.t->bytes;
  const auto* src = static_cast<const uint8_t*>(m.t->data);
  d.seq = m.seq;
  d.totalBytes = bytes;
  d.offset = m.published;
  d.addr = 0;
  if (m.pull) {
    d.kind = uint32_t(SlotKind::kPull);
    d.pieceBytes = 0;
    d.addr = reinterpret_cast<uintptr_t>(src);
    m.pullStep = tail_;
    m.published = bytes;
    ++singleCopySends_;
    return;
  }
  if (bytes <= kInlineBytes) {
    d.kind = uint32_t(SlotKind::kInline);
    d.pieceBytes = uint32_t(bytes);
    if (bytes > 0) {
      if (m.t->source) m.t->source->produce(0, d.inlineData, bytes);
      else std::memcpy(d.inlineData, src, bytes);
    }
  } else {
    const size_t piece = pieceOf(m);
    if (m.t->source) m.t->source->produce(m.published, theirs_.slot(tail_), piece);
    else handoff_.copy(theirs_.slot(tail_), src + m.published, piece);
    if (handoff_.streaming() && !streamedOnce_) {  // only copy() changes it
      streamedOnce_ = true;
      LOOM_INFO(log::kShm,
                "shm: copies into %s's FIFO run slowly (under %.0f GB/s): streaming them past the caches, "
                "and no single copy, until they run fast again",
                describePeer().c_str(), HandoffPolicy::kSlowBytesPerNs);
    }
    d.kind = uint32_t(SlotKind::kCopy);
    d.pieceBytes = uint32_t(piece);
  }
  m.published += d.pieceBytes;
  m.t->progressed = m.published;
}

// Publishes as many queued pieces as there are free slots, then completes
// sends in posting order (single-copy ones once the receiver consumed them).
Status ShmConnection::moveSends() {
  InboxHeader* h = theirs_.header();
  while (sendNext_ < sends_.size()) {
    if (tail_ - headSeen_ >= kSlots) {
      LOOM_TRY(loadHead());
      if (tail_ - headSeen_ >= kSlots) break;
    }
    SendMsg& m = sends_[sendNext_];
    // A produced message goes a piece at a time, as its source has it.
    if (m.t->source && m.t->source->ready() < m.published + pieceOf(m)) break;
    if (!m.started) {
      m.started = true;
      if (m.t->source) ++producedSends_;
      m.pull = !m.t->source && m.t->singleCopy && options_.singleCopyMin > 0 && m.t->bytes >= options_.singleCopyMin &&
               peerCanPull() && (m.t->pullAlways || handoff_.mayPull(m.t->bytes));
      if (m.pull && singleCopySends_ == 0) {
        LOOM_INFO(log::kShm, "shm: %s copies this rank's messages straight from its memory (single copy, "
                  "first one %zu bytes)", describePeer().c_str(), m.t->bytes);
      }
    }
    fillSlot(m, h->desc[tail_ % kSlots]);
    ++tail_;
    h->tail.store(tail_, std::memory_order_release);
    touched_ = true;
    if (m.published == m.t->bytes) ++sendNext_;
  }
  while (sendNext_ > 0) {
    SendMsg& m = sends_.front();
    if (m.pull) {
      if (headSeen_ <= m.pullStep) LOOM_TRY(loadHead());
      if (headSeen_ <= m.pullStep) break;
      m.t->progressed = m.t->bytes;
    }
    m.t->done = true;
    sends_.pop();
    --sendNext_;
  }
  return Status::ok();
}

Status ShmConnection::checkSlot(const RecvMsg& m, const SlotDesc& d) const {
  if (d.seq != m.seq) {
    return remoteError(describePeer() + " published message #" + std::to_string(d.seq) +
                       " where #" + std::to_string(m.seq) +
                       " was expected: the shared-memory FIFO is corrupted");
  }
  if (d.totalBytes != m.t->bytes) {
    return remoteError(describePeer() + " sent a " + std::to_string(d.totalBytes) +
                       "-byte message where a " + std::to_string(m.t->bytes) +
                       "-byte receive was posted: the ranks called different collectives or "
                       "counts");
  }
  if (d.kind == uint32_t(SlotKind::kCopy)) {
    // Every piece fills a whole slot but the last (sinks rely on it).
    const bool ok = d.offset == m.received && d.offset < d.totalBytes &&
                    d.pieceBytes == std::min<uint64_t>(mine_.slotBytes(), d.totalBytes - d.offset);
    if (ok) return Status::ok();
  } else if (d.kind == uint32_t(SlotKind::kInline)) {
    if (d.totalBytes <= kInlineBytes && d.pieceBytes == d.totalBytes && m.received == 0) {
      return Status::ok();
    }
  } else if (d.kind == uint32_t(SlotKind::kPull)) {
    if (!canPull_) {
      return remoteError(describePeer() + " sent a single-copy message although this process "
                         "said it cannot read that rank's memory: run the same loom build on "
                         "all ranks");
    }
    // A whole message only: never the rest of one partly delivered by copy
    // (its first pieces may already have gone to a sink).
    if (d.addr != 0 && d.totalBytes > 0 && (m.received == 0 || m.pulling)) return Status::ok();
  }
  return remoteError(describePeer() + " published a malformed shared-memory slot (kind " +
                     std::to_string(d.kind) + "): its inbox is corrupted");
}

// Copies the rest of a single-copy message from the sender's memory, at most
// *budget bytes; *finished once all of it is here.
Status ShmConnection::pull(RecvMsg& m, const SlotDesc& d, size_t* budget, bool* finished) {
  *finished = false;
  auto* dst = static_cast<uint8_t*>(m.t->data);
  while (m.received < m.t->bytes) {
    if (*budget == 0) return Status::ok();
    const size_t n = std::min(m.t->bytes - m.received, *budget);
    iovec local{dst + m.received, n};
    iovec remote{reinterpret_cast<void*>(uintptr_t(d.addr + m.received)), n};
    ssize_t r = ::process_vm_readv(peerPid_, &local, 1, &remote, 1, 0);
    if (r <= 0) {
      int err = r < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      if (err == ESRCH) {
        return remoteError(describePeer() + " exited during a single-copy transfer: that rank "
                           "failed or was killed; check its log");
      }
      if (err == EFAULT) {
        return remoteError(describePeer() + "'s send buffer of " + std::to_string(m.t->bytes) +
                           " bytes is not readable from this process: that rank freed it before "
                           "its send completed, or it is not host memory");
      }
      return systemErrno("single-copy receive from " + describePeer() + " (process_vm_readv)",
                         err);
    }
    m.received += size_t(r);
    m.t->progressed = m.received;
    *budget -= std::min(*budget, size_t(r));
  }
  // A sender that closed may have freed the buffer while we read it.
  if (theirs_.header()->closed.load(std::memory_order_acquire) != 0) {
    return remoteError(describePeer() + " closed its connection during a single-copy transfer; "
                       "the received data cannot be trusted");
  }
  *finished = true;
  return Status::ok();
}

// Consumes published slots into the posted receives, in order.
Status ShmConnection::moveRecvs() {
  InboxHeader* h = mine_.header();
  size_t budget = kPullBudget;
  while (!recvs_.empty()) {
    if (head_ == tailSeen_) {
      tailSeen_ = h->tail.load(std::memory_order_acquire);
      if (head_ == tailSeen_) break;
      if (tailSeen_ < head_ || tailSeen_ - head_ > kSlots) {
        return remoteError(describePeer() + " published more shared-memory slots than exist: "
                           "this side's inbox is corrupted");
      }
    }
    RecvMsg& m = recvs_.front();
    const SlotDesc d = h->desc[head_ % kSlots];
    LOOM_TRY(checkSlot(m, d));
    if (d.kind != uint32_t(SlotKind::kPull)) {
      // Inline data is read where it lies (a held receive's sink keeps the
      // pointer); its size is the checked copy's.
      const uint8_t* src =
          d.kind == uint32_t(SlotKind::kInline) ? h->desc[head_ % kSlots].inlineData : mine_.slot(head_);
      if (m.t->sink != nullptr) {
        // Slot pieces start at multiples of the slot size (whole pages).
        if (d.pieceBytes > 0) m.t->sink->consume(m.received, src, d.pieceBytes);
        m.t->sunk = true;
        if (m.t->hold) {  // the slot stays ours until release()
          if (held_.empty() || held_.back().t != m.t || held_.back().done) {
            held_.push_back(Held{m.t, head_, head_ + 1, false});
          } else {
            held_.back().end = head_ + 1;  // a message's slots are consecutive
          }
        }
      } else if (d.pieceBytes > 0) {
        uint8_t* dst = static_cast<uint8_t*>(m.t->data) + m.received;
        if (m.t->stream) kernels::copyPastCaches(dst, src, d.pieceBytes);
        else std::memcpy(dst, src, d.pieceBytes);
      }
      m.received += d.pieceBytes;
      m.t->progressed = m.received;
    } else {
      bool finished = false;
      m.pulling = true;
      LOOM_TRY(pull(m, d, &budget, &finished));
      if (!finished) break;
    }
    ++head_;
    if (m.received == m.t->bytes) {
      if (!held_.empty() && held_.back().t == m.t) held_.back().done = true;
      m.t->done = true;
      recvs_.pop();
    }
    publishHead();
  }
  return Status::ok();
}

// Stores the head for the writer: past every consumed slot, but not past
// the first slot a held receive still keeps.
void ShmConnection::publishHead() {
  while (!held_.empty() && held_.front().done && held_.front().first == held_.front().end) held_.pop_front();
  uint64_t head = head_;
  for (const Held& e : held_) {
    if (e.first < e.end) {
      head = e.first;
      break;
    }
  }
  if (head == published_) return;
  published_ = head;
  mine_.header()->head.store(head, std::memory_order_release);
  touched_ = true;
}

Status ShmConnection::release(Transfer* t) {
  if (!error_.isOk()) return error_;
  for (Held& e : held_) {
    if (e.t == t) e.first = e.end;
  }
  publishHead();
  wakePeer();  // a writer may be waiting for these slots
  return Status::ok();
}

// After moving a counter the peer may wait on: wake it if it said it sleeps.
// The fence pairs with the one in pollFds(): either the peer sees our counter
// in its recheck, or we see its flag here.
void ShmConnection::wakePeer() {
  if (!touched_) return;
  touched_ = false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic<uint32_t>& sleeping = theirs_.header()->sleeping;
  if (sleeping.load(std::memory_order_relaxed) != 0 &&
      sleeping.exchange(0, std::memory_order_acq_rel) != 0) {
    theirs_.signal();
    ++wakeupsSent_;
  }
}

// Whether progress() could move something right now (read after `sleeping`
// was set, so anything the peer does later wakes us through the pipe).
bool ShmConnection::actionable() const {
  if (theirs_.header()->closed.load(std::memory_order_acquire) != 0) return true;
  if (!recvs_.empty() && mine_.header()->tail.load(std::memory_order_acquire) != head_) {
    return true;
  }
  if (!sends_.empty()) {
    const uint64_t head = theirs_.header()->head.load(std::memory_order_acquire);
    // A produced message's next piece may wait for its source, which
    // moves with another connection (whose own fds wake the waiter).
    if (sendNext_ < sends_.size() && tail_ - head < kSlots) {
      const SendMsg& m = sends_[sendNext_];
      if (!m.t->source || m.t->source->ready() >= m.published + pieceOf(m)) return true;
    }
    if (sendNext_ > 0 && (!sends_.front().pull || head > sends_.front().pullStep)) return true;
  }
  return false;
}

void ShmConnection::pollFds(std::vector<pollfd>* fds) const {
  if (!error_.isOk() || !attached_ || idle()) return;
  mine_.header()->sleeping.store(1, std::memory_order_seq_cst);
  armed_ = true;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  fds->push_back(pollfd{mine_.wakeReadFd(), POLLIN, 0});
  if (pidfd_) fds->push_back(pollfd{pidfd_.get(), POLLIN, 0});
  if (actionable()) fds->push_back(pollfd{mine_.wakeWriteFd(), POLLOUT, 0});
}

}  // namespace loom::transport::shm
