// The transport interface: a Connection moves ordered messages between this
// rank and one peer. Transports know nothing of collectives.
//
// Contract:
//  - Messages are matched in posting order, separately per direction. The
//    receiver posts the same sizes in the same order as the sender; a size
//    mismatch is detected and reported as an error, never silently accepted.
//  - post*() only queues; progress() moves bytes without ever blocking and
//    marks Transfers done. A Transfer is owned by the caller and must stay
//    alive and unmoved until it is done or the Connection is destroyed.
//  - Errors (peer closed, bad frame, I/O error) are sticky: once progress()
//    failed, every later call returns the same Status.
//  - A Connection is used by one thread at a time.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"

namespace loom::transport {

// Where a transfer's bytes live. Each connection says which it moves
// (Connection::moves); posting a transfer of another kind is an error.
enum class MemoryType : uint8_t {
  kHost,        // pageable host memory
  kHostPinned,  // page-locked host memory (cudaHostAlloc, ncclMemAlloc in cuda mode)
  kDevice,      // GPU memory
};
const char* memoryTypeName(MemoryType m);

// Memory registered with a connection (Connection::registerMemory): what
// its backend needs to move bytes of it without setting anything up per
// transfer (a verbs memory region's keys, a CUDA IPC handle). Destroying
// it deregisters. Backends that need nothing hand out this base class.
class Region {
 public:
  Region(void* base, size_t bytes, MemoryType memory) : base_(base), bytes_(bytes), memory_(memory) {}
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  MemoryType memory() const { return memory_; }
  // True when [p, p + n) lies inside the region.
  bool holds(const void* p, size_t n) const { return spans(base_, bytes_, p, n); }
  static bool spans(const void* base, size_t bytes, const void* p, size_t n);

 private:
  void* base_;
  size_t bytes_;
  MemoryType memory_;
};

// A consumer of received bytes (see Transfer::sink).
class Sink {
 public:
  virtual ~Sink() = default;
  // Bytes [offset, offset + n) of the message, valid only during the call
  // unless the transfer holds (Transfer::hold): then until it is released.
  // Pieces arrive in order; every piece but the last starts and ends on a
  // multiple of kSinkGrain bytes.
  virtual void consume(size_t offset, const void* bytes, size_t n) = 0;
};
inline constexpr size_t kSinkGrain = 64;

// A producer of a send's bytes (see Transfer::source).
class Source {
 public:
  virtual ~Source() = default;
  // How many leading bytes of the message can be produced now; grows until
  // it reaches the message size.
  virtual size_t ready() const = 0;
  // Writes bytes [offset, offset + n) of the message to `to` (memory of the
  // transport's). Called in order, only within ready().
  virtual void produce(size_t offset, void* to, size_t n) = 0;
};

struct Transfer {
  void* data = nullptr;  // send: source bytes (not modified); recv: destination
  size_t bytes = 0;
  MemoryType memory = MemoryType::kHost;  // where `data` lives
  // Optional: memory this connection registered that holds [data, data +
  // bytes); a backend that needs registration uses it instead of its own.
  const Region* region = nullptr;
  // Receive only, optional. A transport whose received bytes already sit in
  // memory it owns (shared memory) may hand the whole message to the sink
  // piece by piece instead of copying it into `data`, saving a pass over the
  // data (a reduction reads straight from the FIFO). It then sets `sunk` and
  // leaves `data` untouched; otherwise everything lands in `data`.
  Sink* sink = nullptr;
  // Receive with a sink only: the consumer finishes later (a GPU kernel
  // reading the pieces it was handed). The transport keeps the memory of
  // the pieces it handed to the sink until Connection::release(this), even
  // after the transfer is done; the peer's later messages wait for room.
  bool hold = false;
  // Send only, and only on a connection that produces() (else an error):
  // the message's bytes come from the source, written piece by piece
  // straight into the transport's memory (shared memory: the peer's FIFO)
  // as Source::ready() covers them, saving a pass over the data (a
  // reduction writes into the peer's FIFO instead of a staging buffer that
  // is then copied there). `data` is then not read.
  Source* source = nullptr;
  // Send only, a hint from the plan (core::Step::singleCopy): the receiver
  // stores these bytes as they are, so a transport that can let it copy
  // them straight from `data` (shared memory, LOOM_SHM_SINGLE_COPY_MIN) may.
  bool singleCopy = false;
  // With singleCopy: take it whenever the transport can, even where it
  // would rather copy (shared memory while its copies stream): the ranks
  // share CPUs, and one copy instead of two saves CPU time another rank
  // needs (core::Step::pullAlways).
  bool pullAlways = false;
  // Receive only, a hint: `data` is not read again soon (the operation
  // writes more than the caches hold), so a transport that copies into it
  // may do so with streaming stores.
  bool stream = false;
  // Set by the transport.
  size_t progressed = 0;  // bytes moved so far
  bool done = false;
  bool sunk = false;
};

class Connection {
 public:
  virtual ~Connection() = default;

  virtual int peer() const = 0;           // the peer's rank in the communicator
  virtual const char* kind() const = 0;   // "tcp", "loopback", ...

  // Queue a message. What every backend requires is checked here, once:
  // a transfer, a buffer for its bytes, a memory type this connection
  // moves, a region (if any) of that type holding the buffer. Then the
  // backend queues it (queueSend/queueRecv), after its own checks.
  Status postSend(Transfer* t);
  Status postRecv(Transfer* t);
  // The memory types this connection can move.
  virtual bool moves(MemoryType m) const = 0;
  // Registers [base, base + bytes) for later transfers (Transfer::region).
  // Backends that need no registration return a plain Region; a memory
  // type the connection cannot move is an error.
  virtual Result<std::unique_ptr<Region>> registerMemory(void* base, size_t bytes, MemoryType memory);
  // True when the backend honours Transfer::source (a send's bytes written
  // by a producer into the transport's own memory).
  virtual bool produces() const { return false; }
  // For a plan that fuses a ring's steps (core's PlanRunner): the largest
  // message that may stay held in this connection's inbox (Transfer::hold)
  // while the step writes the next rank's, such that no ring of such steps
  // can fill every inbox at once. 0: no fused steps on this connection.
  virtual size_t fusedStepBytes() const { return 0; }
  // True when the backend cannot move memory it has not registered: core
  // then registers every buffer before it posts it (core/registration.h).
  virtual bool needsRegistration() const { return false; }
  // Moves as many bytes as possible right now; never blocks.
  virtual Status progress() = 0;
  // Appends the fds (with events) whose readiness means progress() can move
  // bytes; used for blocking waits. Transports without fds append nothing
  // (the waiter then spins and yields).
  virtual void pollFds(std::vector<pollfd>* fds) const = 0;
  // True when nothing is queued in either direction.
  virtual bool idle() const = 0;
  // The consumer of a done, held receive (Transfer::hold) is finished with
  // the pieces it was handed: the transport may reuse their memory. Any
  // order; a transfer never held (or already released, or on a backend
  // that never hands out its memory) is a no-op.
  virtual Status release(Transfer* t) { return Status::ok(); }
  // Blocks until the device work this connection queued (copies from and
  // into posted buffers) has finished, whatever became of the transfers.
  // The engine calls it before handing buffers back to their owner after a
  // failure. Backends that queue no device work have nothing to wait for.
  virtual Status quiesce() { return Status::ok(); }
  // Any thread, while no user stream can be waiting on this connection's
  // operations (cuda mode: at a call, before its gates are queued): makes
  // what the transport put off because it may wait for the whole device,
  // such as mapping memory a peer offered. May run beside progress().
  virtual Status prepare() { return Status::ok(); }

 protected:
  // The backend's half of postSend/postRecv: the transfer passed the
  // common checks and is reset (nothing progressed, not done, not sunk).
  virtual Status queueSend(Transfer* t) = 0;
  virtual Status queueRecv(Transfer* t) = 0;

 private:
  Status checkPost(Transfer* t, const char* what) const;
};

}  // namespace loom::transport
