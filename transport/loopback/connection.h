// LoopbackConnection: the Connection contract (transport/connection.h) for a
// rank talking to itself. progress() pairs the oldest posted send with the
// oldest posted receive and copies the bytes with memcpy; there are no fds
// (pollFds appends nothing, so a waiter spins and yields). Sizes must match
// exactly, as on any other transport: a mismatch is a sticky error.
// Threading: used by one thread at a time.
#pragma once

#include "transport/connection.h"
#include "transport/ring.h"

namespace loom::transport::loopback {

class LoopbackConnection final : public Connection {
 public:
  explicit LoopbackConnection(int selfRank) : self_(selfRank) {}

  int peer() const override { return self_; }
  const char* kind() const override { return "loopback"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice; }
  Status progress() override;
  void pollFds(std::vector<pollfd>* fds) const override {}
  bool idle() const override { return sends_.empty() && recvs_.empty(); }

 protected:
  Status queueSend(Transfer* t) override { return queue(t, sends_); }
  Status queueRecv(Transfer* t) override { return queue(t, recvs_); }

 private:
  Status queue(Transfer* t, Ring<Transfer*>& q);

  int self_;
  Ring<Transfer*> sends_;
  Ring<Transfer*> recvs_;
  Status error_;  // sticky
};

}  // namespace loom::transport::loopback
