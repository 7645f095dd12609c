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
#include <vector>

#include "common/status.h"

namespace loom::transport {

// A consumer of received bytes (see Transfer::sink).
class Sink {
 public:
  virtual ~Sink() = default;
  // Bytes [offset, offset + n) of the message, valid only during the call.
  // Pieces arrive in order; every piece but the last starts and ends on a
  // multiple of kSinkGrain bytes.
  virtual void consume(size_t offset, const void* bytes, size_t n) = 0;
};
inline constexpr size_t kSinkGrain = 64;

struct Transfer {
  void* data = nullptr;  // send: source bytes (not modified); recv: destination
  size_t bytes = 0;
  // Receive only, optional. A transport whose received bytes already sit in
  // memory it owns (shared memory) may hand the whole message to the sink
  // piece by piece instead of copying it into `data`, saving a pass over the
  // data (a reduction reads straight from the FIFO). It then sets `sunk` and
  // leaves `data` untouched; otherwise everything lands in `data`.
  Sink* sink = nullptr;
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

  virtual Status postSend(Transfer* t) = 0;
  virtual Status postRecv(Transfer* t) = 0;
  // Moves as many bytes as possible right now; never blocks.
  virtual Status progress() = 0;
  // Appends the fds (with events) whose readiness means progress() can move
  // bytes; used for blocking waits. Transports without fds append nothing
  // (the waiter then spins and yields).
  virtual void pollFds(std::vector<pollfd>* fds) const = 0;
  // True when nothing is queued in either direction.
  virtual bool idle() const = 0;
};

}  // namespace loom::transport
