// Helpers for the shared-memory transport tests and measurements: connected
// pairs in one process, a forked peer process with descriptor pipes, an
// exchange driver that verifies data, and the /dev/shm listing.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/shm/connection.h"

namespace loom::transport::shm::testing {

using Options = ShmConnection::Options;

struct Pair {
  std::unique_ptr<ShmConnection> a;  // rank 0's connection to rank 1
  std::unique_ptr<ShmConnection> b;  // rank 1's connection to rank 0
};

// Two attached connections of this process, as two ranks would hold them.
Result<Pair> makePair(const Options& a, const Options& b);

// Sends sendSizes[i] (pattern sendStream, i) and receives recvSizes[j]
// (pattern recvStream, j, verified), keeping up to `window` messages in flight
// per direction. When a round moves nothing it blocks in poll() on pollFds()
// for up to 50 ms, like the engine. Fails on a transport error, bad data or
// the deadline.
Status runExchange(Connection& c, uint32_t sendStream, const std::vector<size_t>& sendSizes,
                   uint32_t recvStream, const std::vector<size_t>& recvSizes, size_t window,
                   Deadline deadline);

// `rounds` ping-pongs of `bytes`: the pinger sends then receives, the ponger
// receives then sends. When `blocking`, every wait is a poll() on pollFds()
// (50 ms timeout); otherwise it spins on progress().
Status pingPong(Connection& c, bool pinger, size_t bytes, int rounds, bool blocking,
                Deadline deadline);

// Sizes that exercise every path for a FIFO of `slotBytes` slots: 0, 1, odd,
// slot-sized, multi-slot, and multi-MiB (single-copy where enabled), over
// `rounds` rounds in a fixed shuffled order.
std::vector<size_t> mixedSizes(size_t slotBytes, int rounds);

// A forked child running `body` (its return value is the exit status), with
// one pipe each way to swap descriptors and sync points.
class ChildProcess {
 public:
  // The child sees its own ends of the pipes through `self`.
  static Result<std::unique_ptr<ChildProcess>> start(std::function<int(ChildProcess& self)> body);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Pipe messages (either side): exact writes and deadline-bounded reads.
  Status send(const void* data, size_t bytes);
  Status recv(void* data, size_t bytes, Deadline deadline);
  // Sends our descriptor, receives the other side's, attaches `c` to it, then
  // waits until the other side has attached too.
  Status connect(ShmConnection& c, Deadline deadline);
  // Parent: the exit status (or -signal) once the child ended, or an error at
  // the deadline (then the child is killed).
  Result<int> wait(Deadline deadline);
  void kill(int sig);

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int readFd_ = -1;
  int writeFd_ = -1;
};

// Names in /dev/shm now (empty when it does not exist).
std::set<std::string> devShmEntries();
// True when a mapping or an open fd of this process lives in /dev/shm.
bool usesDevShm();

// Maps the inbox a connection owns, as its peer (or anyone) can: every
// byte of its header is writable from outside. Null on failure; unmap
// with munmap(p, c.local().inboxBytes).
InboxHeader* mapInbox(const ShmConnection& c);

}  // namespace loom::transport::shm::testing
