// ShmConnection: the Connection contract (transport/connection.h) between two
// ranks of one host (two processes, or two threads of one process) through
// shared memory, for host buffers.
//
// Setup. Each side create()s its inbox (transport/shm/inbox.h: a memfd FIFO
// of kSlots slots plus a wake pipe) and gives local() to the peer over the
// authenticated bootstrap; each side then calls attach() with the peer's
// descriptor, which opens the peer's inbox through /proc/<pid>/fd. Both sides
// must attach successfully before either uses the connection; when one
// side's attach fails, both must fall back to another transport, so the
// caller agrees on the outcome over the bootstrap. post*() before attach()
// is an error.
//
// Data. A message goes into the peer's inbox in posting order. Messages are
// copied into slots (several consecutive slots when bigger than one; up to
// kInlineBytes inside the slot's descriptor line) and copied out by the
// receiver; the send is done once its last piece is in the FIFO. A message
// the plan hints (Transfer::singleCopy) of at least singleCopyMin bytes is
// single-copy instead, unless the handoff policy (handoff.h) refuses it
// (while copies into the FIFO stream, and one message in 32, which it
// times; never with Transfer::pullAlways): the sender publishes its address in one slot, the
// receiver copies it with process_vm_readv straight from the sender's memory
// into the posted receive buffer, then consumes the slot, which is the
// acknowledgement that completes the send. attach() probes whether this
// process may read the peer's memory (ptrace rules; containers often forbid
// it); when not, the peer sends everything through the FIFO (logged once at
// INFO). The receiver checks every slot (sequence number, total size, piece
// bounds) before writing a byte of it: a size mismatch is a sticky
// kRemoteError.
//
// Waiting. The fast path makes no syscall. pollFds() first sets the
// `sleeping` flag in this side's inbox, then rechecks the shared counters:
// when progress() can already move something, it adds an always-writable fd
// so the waiter's poll returns at once; otherwise it lists the wake pipe (and
// the peer's pidfd). The peer, after publishing a slot or freeing one, writes
// to the wake pipe only when it finds that flag set (and clears it). Both
// sides order their store and load with seq_cst fences, so no wake-up is lost.
//
// Failure. Shared memory has no EOF. A peer that destroys its connection sets
// `closed` in its inbox header and wakes this side; a peer process that dies
// is seen through its pidfd (or kill(pid, 0) where pidfd_open is not
// available), checked by progress() at most every ~100 ms while something is
// pending and whenever it returns from a blocking wait; the pidfd is also in
// pollFds(). Either becomes a sticky kRemoteError once a posted transfer can
// no longer finish; messages already in the FIFO are still delivered.
//
// Threading: like every Connection, used by one thread at a time; the two
// sides may run in different threads or processes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/time.h"
#include "transport/connection.h"
#include "transport/ring.h"
#include "transport/shm/handoff.h"
#include "transport/shm/inbox.h"

namespace loom::transport::shm {

class ShmConnection final : public Connection {
 public:
  struct Options {
    // Bytes of this side's inbox FIFO, split into kSlots slots (rounded down
    // to whole pages, at least one page per slot).
    size_t fifoBytes = size_t(2) << 20;
    // Smallest hinted message (Transfer::singleCopy) this side sends
    // single-copy. 0 = no single-copy touching this side: it sends
    // everything through the FIFO and does not read the peer's memory (so
    // the peer copies through the FIFO as well).
    size_t singleCopyMin = size_t(64) << 10;
    // Whether plans may fuse ring steps over this connection
    // (fusedStepBytes(); the transport's side is Transfer::source and hold).
    bool fusedSteps = true;
    // From LOOM_SHM_FIFO_BYTES, LOOM_SHM_SINGLE_COPY_MIN and LOOM_SHM_FUSED_STEPS.
    static Options fromSettings();
  };

  // Creates this side's inbox for the connection to `peerRank`. When
  // single-copy is enabled, also lets same-user processes read this process's
  // memory (prctl PR_SET_PTRACER_ANY, once per process; Yama scope 1 needs it).
  static Result<std::unique_ptr<ShmConnection>> create(int peerRank, const Options& options);
  ~ShmConnection() override;
  ShmConnection(const ShmConnection&) = delete;
  ShmConnection& operator=(const ShmConnection&) = delete;

  // What the peer needs to attach; valid for the life of this object.
  const ShmDescriptor& local() const { return local_; }
  // Opens the peer's inbox and probes single-copy. Call once per side.
  Status attach(const ShmDescriptor& peer);
  bool attached() const { return attached_; }

  int peer() const override { return peer_; }
  const char* kind() const override { return "shm"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice; }
  bool produces() const override { return true; }
  // Up to half of the smaller FIFO, less a slot: a rank's inbox then holds
  // the message it folds and the next one in full. 0 without
  // Options::fusedSteps.
  size_t fusedStepBytes() const override;
  Status progress() override;
  void pollFds(std::vector<pollfd>* fds) const override;
  bool idle() const override { return sends_.empty() && recvs_.empty(); }
  // Frees the FIFO slots of the pieces handed so far to a held receive's
  // sink (Transfer::hold); `head` then moves past them once every earlier
  // held piece is free too.
  Status release(Transfer* t) override;

  // True when this process may read the peer's memory (decided by attach()).
  bool canPull() const { return canPull_; }
  // True when the peer has said it may read this process's memory, so this
  // side's large sends go single-copy (false until the peer has attached).
  bool peerCanPull() const;
  size_t slotBytes() const { return mine_.slotBytes(); }
  // Counters for tests and logs.
  uint64_t wakeupsSent() const { return wakeupsSent_; }
  uint64_t singleCopySends() const { return singleCopySends_; }
  uint64_t producedSends() const { return producedSends_; }  // Transfer::source
  // Whether copies into the peer's FIFO ever ran slowly enough to stream
  // (then hinted messages were copied, not sent single-copy).
  bool streamedOnce() const { return streamedOnce_; }

 protected:
  Status queueSend(Transfer* t) override;
  Status queueRecv(Transfer* t) override;

 private:
  struct SendMsg {
    Transfer* t = nullptr;
    uint64_t seq = 0;
    size_t published = 0;   // bytes put into the FIFO (all of them for kPull)
    uint64_t pullStep = 0;  // kPull: the step of its slot; acked once head passes it
    bool pull = false;
    bool started = false;
  };
  struct RecvMsg {
    Transfer* t = nullptr;
    uint64_t seq = 0;
    size_t received = 0;
    bool pulling = false;  // its single-copy slot was accepted (pull() may take several calls)
  };

  ShmConnection(int peerRank, const Options& options, Inbox mine);
  Status fail(Status s);
  Status checkState(const char* what) const;
  Status loadHead();
  size_t pieceOf(const SendMsg& m) const;
  void fillSlot(SendMsg& m, SlotDesc& d);
  Status moveSends();
  Status moveRecvs();
  Status checkSlot(const RecvMsg& m, const SlotDesc& d) const;
  Status pull(RecvMsg& m, const SlotDesc& d, size_t* budget, bool* finished);
  bool probePull() const;
  void publishHead();
  bool peerGone(bool force);
  bool actionable() const;
  void wakePeer();
  std::string describePeer() const;

  int peer_;
  Options options_;
  Inbox mine_;    // the peer writes here, this side reads
  Inbox theirs_;  // this side writes here (the peer's inbox)
  ShmDescriptor local_;
  bool attached_ = false;
  pid_t peerPid_ = 0;
  bool samePid_ = false;
  net::UniqueFd pidfd_;  // the peer process; invalid when same process or unavailable
  bool canPull_ = false;

  Ring<SendMsg> sends_;  // posted, not done, in posting order
  size_t sendNext_ = 0;  // index in sends_ of the first message not fully published
  Ring<RecvMsg> recvs_;
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  uint64_t tail_ = 0;      // steps published into theirs_
  uint64_t headSeen_ = 0;  // last theirs_ head read (refreshed only when needed)
  uint64_t head_ = 0;      // steps consumed from mine_
  // Slots of held receives not yet released, in FIFO order. The head the
  // peer sees stops at the first of them.
  struct Held {
    Transfer* t;
    uint64_t first, end;  // steps [first, end) still held
    bool done;            // the receive is complete: no more pieces join
  };
  std::deque<Held> held_;
  uint64_t published_ = 0;  // head as stored for the peer
  uint64_t tailSeen_ = 0;  // last mine_ tail read
  bool touched_ = false;   // a counter the peer may wait on moved
  mutable bool armed_ = false;  // pollFds set `sleeping`; progress clears it

  uint32_t calls_ = 0;
  Clock::time_point lastLiveness_{};
  std::string goneReason_;
  uint64_t wakeupsSent_ = 0;
  uint64_t singleCopySends_ = 0;
  uint64_t producedSends_ = 0;
  HandoffPolicy handoff_;  // how pieces are copied into the peer's inbox
  bool streamedOnce_ = false;  // it switched to streaming (logged once, at INFO)
  Status error_;  // sticky
};

}  // namespace loom::transport::shm
