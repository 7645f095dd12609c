// CudaIpcConnection: the Connection contract (transport/connection.h)
// between two cuda-mode ranks of one host, for device buffers: the bytes go
// from GPU memory to GPU memory, never through the host.
//
// Setup. Each side allocates an inbox in its device memory (kSlots slots)
// and a shared-memory connection (transport/shm) for control messages, and
// sends the peer an endpoint: the inbox's CUDA IPC handle (or, between
// ranks of one process, its address: the runtime refuses to open a
// process's own handles), the shm descriptor, and a nonce naming the
// process. attach() maps the peer's inbox and proves it works before the
// connection is used: it writes a probe into the peer's inbox and reads it
// back. A side whose attach fails reports it in the registry's verdict and
// the pair moves on to the next backend (shared memory through pinned host
// slots), logged at INFO.
//
// Data. A message is cut into pieces of at most one slot. The sender copies
// each piece from its buffer into the next slot of the peer's inbox on a
// stream of its own, and once the copy's event fired tells the peer, over
// the control connection, which slot holds which bytes of which message. The
// receiver copies the piece from its inbox into the posted buffer and, once
// that copy fired, gives the slot back with a control message. Slots are
// used round robin, so the sender needs no more than a count of the slots
// the receiver gave back. A send is done when its last piece is announced;
// a receive when its last piece has landed. The receiver checks every
// announcement (slot, message size, offset) before copying: a size the peer
// did not post is a sticky kRemoteError. Copies are queued by progress()
// only, never waited for: the host never blocks on the device.
//
// Registered buffers (ncclCommRegister): a send of at least one slot from
// device memory registered with the connection (registerMemory) skips the
// inboxes: the sender announces where its buffer is (the allocation's IPC
// handle and the offset, or the address between ranks of one process) and
// the receiver copies it straight into the posted buffer, then says so; the
// send is done at that word, and later sends wait for it (order). One copy
// instead of two.
//
// Sinks (Transfer::sink with hold): a receive that reduces and fits the
// inbox hands each piece to the sink where it lies in the inbox and gives
// the slot back only at release(): the reduction kernel reads the peer's
// bytes without a copy first. (Direct copies from registered buffers are
// never handed over: that buffer may be on another GPU of this process.)
//
// Failure. The control connection carries shm's guarantees: a peer that
// closes or dies is noticed by progress() within a bounded time (pidfd),
// and its errors become this connection's, sticky.
//
// Lifetime: a peer's queued copies may still write into this side's inbox
// after this side is destroyed (an abort, say). Between processes the
// mapping keeps the memory; between ranks of one process the inbox is
// shared (the peer holds a reference), so it is freed by whichever side
// goes last, after its stream has finished.
//
// Memory: moves every type the CUDA runtime copies (device, pinned host,
// host); the engine hands it device buffers and pinned slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "transport/connection.h"
#include "transport/net/socket.h"
#include "transport/shm/connection.h"

namespace loom::transport::cudaipc {

inline constexpr uint32_t kSlots = 8;

// What the peer needs to attach (the endpoint's fields).
struct Descriptor {
  uint64_t processNonce = 0;  // equal: same process, use `address`
  uint64_t address = 0;       // the inbox's device address in that process
  device::IpcHandle handle{};  // its CUDA IPC handle
  uint64_t slotBytes = 0;
  uint32_t slots = 0;
  std::vector<uint8_t> control;  // the shm endpoint of the control connection
};

// This process's nonce (random, drawn once).
uint64_t processNonce();

class CudaIpcConnection final : public Connection {
 public:
  // Allocates this side's inbox (slots of slotBytes) on the calling thread's
  // current device, and the control connection's half.
  static Result<std::unique_ptr<CudaIpcConnection>> create(int peerRank, device::Api* api, size_t slotBytes);
  ~CudaIpcConnection() override;
  CudaIpcConnection(const CudaIpcConnection&) = delete;
  CudaIpcConnection& operator=(const CudaIpcConnection&) = delete;

  const Descriptor& local() const { return local_; }
  // Maps the peer's inbox, attaches the control connection and probes the
  // mapping (write, read back). Call once.
  Status attach(const Descriptor& peer);

  int peer() const override { return peer_; }
  const char* kind() const override { return "cudaipc"; }
  bool moves(MemoryType) const override { return true; }
  Status progress() override;
  void pollFds(std::vector<pollfd>* fds) const override;
  // Nothing queued, and every control message handed to the peer.
  bool idle() const override { return sends_.empty() && recvs_.empty() && outgoing_.empty(); }
  Status quiesce() override { return api_->synchronize(stream_); }
  // The sink's kernels are done with the pieces of `t`: their slots (or the
  // peer's registered buffer) go back to the peer, in order.
  Status release(Transfer* t) override;
  // Device memory: a region the peer can read (its allocation's IPC handle).
  Result<std::unique_ptr<Region>> registerMemory(void* base, size_t bytes, MemoryType memory) override;
  // Whether a registered buffer of a peer process is mapped only by
  // prepare(): progress() then declines to copy from one not mapped yet, and
  // the peer sends that message through the inbox. The engine's connections
  // do (a user's stream may wait on the operation, and mapping may wait for
  // the whole device); by default progress() maps it.
  void deferMapping(bool on) { deferMaps_ = on; }
  // Maps the registered buffers that progress() declined to copy from.
  Status prepare() override;

  // Counters for tests.
  uint64_t directSends() const { return directSends_; }
  uint64_t declinedPulls() const { return declinedPulls_; }
  uint64_t piecesSunk() const { return piecesSunk_; }

 protected:
  Status queueSend(Transfer* t) override;
  Status queueRecv(Transfer* t) override;

 private:
  // A control message (both directions).
  struct Control {
    uint32_t kind;  // kPiece, kFree, kPull, kPulled, kDeclined
    uint32_t slot;
    uint64_t bytes;    // of the piece
    uint64_t total;    // of its message
    uint64_t offset;   // of the piece in its message
    uint64_t address;  // kPull: the buffer's address (same process) or offset in its allocation
    device::IpcHandle handle;  // kPull: the allocation's
  };
  class PeerReadable;
  struct Outgoing {
    Control msg;
    Transfer t;
  };
  struct Incoming {
    Control msg;
    Transfer t;
  };
  struct Copy {  // a queued device copy (or a piece handed to a sink) and what its end means
    device::Event event;
    Transfer* t;  // the send or receive it belongs to
    Control piece;
    bool held = false;      // handed to t's sink: the slot waits for release(t)
    bool released = false;
  };

  struct Inbox;
  CudaIpcConnection(int peerRank, device::Api* api);
  Status fail(Status s);
  Status postControl(const Control& c);
  Result<const std::byte*> pullSource(const Control& c);
  void sinkPiece(Transfer* t, const Control& p, const std::byte* where);
  Status postControlRecv(Incoming& in);
  Status takeControl();
  Status moveSends();
  Status moveRecvs();
  Result<device::Event> event();
  Status probe();

  const int peer_;
  device::Api* const api_;
  int device_ = -1;  // the device current at create(): prepare() maps onto it
  Descriptor local_;
  std::shared_ptr<Inbox> inbox_;      // this side's, the peer writes into it
  std::shared_ptr<Inbox> peerShared_;  // the peer's, when in this process
  void* peerInbox_ = nullptr;          // where this side writes
  bool peerMapped_ = false;            // ipcOpen'ed: close it
  uint64_t slotBytes_ = 0;
  device::Stream stream_ = nullptr;
  std::vector<device::Event> freeEvents_;
  std::vector<device::Event> allEvents_;
  std::unique_ptr<shm::ShmConnection> control_;
  net::UniqueFd ready_;  // always readable: polled while copies are queued
  bool attached_ = false;

  std::deque<Transfer*> sends_;  // posted, not done
  std::deque<Transfer*> recvs_;
  std::deque<Copy> sendCopies_;  // in order; announced when fired
  std::deque<Copy> recvCopies_;  // in order; slot freed when fired
  size_t sendQueued_ = 0;        // sends_ before this index have all their pieces queued
  size_t sendOffset_ = 0;        // bytes of sends_[sendQueued_] queued
  uint64_t piecesQueued_ = 0;    // slots filled in the peer's inbox (round robin)
  uint64_t slotsFreed_ = 0;      // slots the peer gave back
  std::deque<Control> announced_;  // pieces in this side's inbox, not yet copied out
  uint64_t slotsReceived_ = 0;     // pieces copied out of this side's inbox (round robin)
  size_t recvOffset_ = 0;        // bytes of the first receive not fully queued
  std::deque<Outgoing> outgoing_;  // control sends in flight
  std::deque<Incoming> incoming_;  // control receives posted
  Transfer* pulling_ = nullptr;  // a send the peer is copying from (kPull), until kPulled
  Transfer* declined_ = nullptr;  // a send the peer would not copy from (kDeclined): goes through the inbox
  bool deferMaps_ = false;
  std::mutex mapMutex_;  // prepare() beside progress(): the two below
  // The peer's registered allocations, mapped (nullptr: mapping failed, never again).
  std::map<device::IpcHandle, void*> peerBuffers_;
  std::vector<device::IpcHandle> wanted_;  // declined, for prepare() to map
  std::atomic<bool> anyWanted_{false};      // prepare()'s look without the lock
  uint64_t directSends_ = 0;
  uint64_t declinedPulls_ = 0;
  uint64_t piecesSunk_ = 0;
  Status controlError_;  // the control connection failed (the peer closed or died)
  Status error_;         // sticky
};

}  // namespace loom::transport::cudaipc
