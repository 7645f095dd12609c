// PeerLink: how this rank gets a data connection to one peer, and the
// transport registry that picks the transport for the pair.
//
// Every pair first connects over TCP (the lower rank connects to the higher
// rank's listener; the sockets prove the secret). Then the registry's
// ordered table is consulted: the first transport that applies to the pair
// (same process rank: loopback; same host, host buffers: shm; else: tcp)
// may "upgrade" the link: both sides create their half, exchange a
// descriptor over the TCP connection, attach, and exchange a verdict; only
// when both sides succeeded is the new transport used, otherwise both keep
// TCP. The whole setup is a non-blocking state machine (advance()), so one
// thread can set up the links of several communicators at once, and the
// thread that drives it can check aborts, notices and timeouts meanwhile.
// Every rank listens before its peers learn its address, so a peer that
// keeps refusing connections is gone: that fails after a few seconds.
#pragma once

#include <array>
#include <memory>

#include "common/status.h"
#include "core/bootstrap.h"
#include "transport/connection.h"

namespace loom::core {

struct LinkOptions {
  int socketsPerPeer = 2;
  size_t stripeMin = 64 * 1024;
  bool shmEnabled = true;
  double connectTimeoutS = 300;
};

class PeerLink {
 public:
  PeerLink(int self, int peer, const LinkOptions& options);

  // One non-blocking step; *ready once the connection is established.
  Status advance(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* ready);
  // The connection, once ready (ownership moves to the caller).
  std::unique_ptr<transport::Connection> take();
  // Descriptors whose readiness lets advance() move on (besides the
  // bootstrap listener, which the caller polls).
  void pollFds(std::vector<pollfd>* fds) const;

 private:
  enum class Phase { kTcp, kOffer, kVerdict, kReady };
  // Fixed-size messages exchanged over TCP while upgrading.
  struct Offer {
    uint32_t magic;
    uint32_t transport;  // registry index of the proposed transport
    uint32_t ok;         // 0: this side cannot use it
    uint32_t length;
    std::array<uint8_t, 128> descriptor;
  };
  struct Verdict {
    uint32_t magic;
    uint32_t ok;
  };

  Status startTcp(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* done);
  Status connectSockets(Bootstrap& bootstrap, const std::atomic<bool>* abort);
  void startUpgrade(Bootstrap& bootstrap);
  Status finishOffer();
  Status finishVerdict();

  int self_, peer_;
  LinkOptions options_;
  Phase phase_ = Phase::kTcp;
  std::vector<net::UniqueFd> sockets_;  // connected or accepted so far
  // Lower rank side: the socket being connected, never blocking.
  net::UniqueFd connecting_;
  Clock::time_point firstAttempt_{};
  Clock::time_point retryAt_{};
  Clock::time_point refusedSince_{};
  int backoffMs_ = 1;
  int lastError_ = 0;
  std::unique_ptr<transport::Connection> tcp_;
  std::unique_ptr<transport::Connection> upgraded_;
  std::unique_ptr<transport::Connection> result_;
  Offer mine_{}, theirs_{};
  Verdict myVerdict_{}, theirVerdict_{};
  transport::Transfer sendOffer_, recvOffer_, sendVerdict_, recvVerdict_;
  int upgradeIndex_ = -1;  // registry entry being tried
};

}  // namespace loom::core
