// PeerLink: how this rank gets a data connection to one peer.
//
// Every pair first connects over the network (sockets: the lower rank
// connects to the higher rank's listener, each socket proves the secret;
// the registry's openNetwork() carries data over them). Then the transport
// registry (transport/registry.h) is asked for a backend that applies to
// the pair; when one does, the link "upgrades": both sides listen() on it,
// send an offer (the backend's name and their endpoint) over the network
// connection, connect() the peer's endpoint, and exchange a verdict; only
// when both sides succeeded is the new backend used, otherwise both keep
// the network connection. The whole setup is a non-blocking state machine
// (advance()), so one thread can set up the links of several communicators
// at once, and the thread that drives it can check aborts, notices and
// timeouts meanwhile.
// Every rank listens before its peers learn its address, so a peer that
// keeps refusing connections is gone: that fails after a few seconds.
#pragma once

#include <array>
#include <memory>

#include "common/status.h"
#include "core/bootstrap.h"
#include "transport/transport.h"

namespace loom::core {

struct LinkOptions {
  int socketsPerPeer = 2;
  size_t stripeMin = 64 * 1024;
  transport::Selection selection;  // which backends may replace the network
  double connectTimeoutS = 300;
  // TCP sockets: a peer unreachable this long fails them (net::watchPeer).
  double deadPeerS = 0;
};

class PeerLink {
 public:
  // The connection to `peer` on `channel` (each channel has its own).
  PeerLink(int self, int peer, int channel, const LinkOptions& options);

  // One non-blocking step; *ready once the connection is established.
  Status advance(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* ready);
  // The connection, once ready (ownership moves to the caller).
  std::unique_ptr<transport::Connection> take();
  // Descriptors whose readiness lets advance() move on (besides the
  // bootstrap listener, which the caller polls).
  void pollFds(std::vector<pollfd>* fds) const;

 private:
  enum class Phase { kNetwork, kOffer, kEndpoint, kVerdict, kReady };
  // Exchanged over the network connection while upgrading: the offer's fixed part, then
  // `length` bytes of endpoint, then the verdict.
  struct Offer {
    uint32_t magic;
    uint32_t ok;      // 0: this side cannot use the backend
    uint32_t length;  // endpoint bytes that follow (0 when !ok)
    uint32_t reserved;
    char backend[16];  // the backend's name, NUL-padded
  };
  struct Verdict {
    uint32_t magic;
    uint32_t ok;
  };

  Status startNetwork(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* done);
  Status connectSockets(Bootstrap& bootstrap, const std::atomic<bool>* abort);
  Status startUpgrade(Bootstrap& bootstrap);
  Status finishOffer();
  Status finishEndpoint();
  Status finishVerdict(Bootstrap& bootstrap);

  int self_, peer_, channel_;
  LinkOptions options_;
  Phase phase_ = Phase::kNetwork;
  std::vector<net::UniqueFd> sockets_;  // connected or accepted so far
  // Lower rank side: the socket being connected, never blocking.
  net::UniqueFd connecting_;
  Clock::time_point firstAttempt_{};
  Clock::time_point retryAt_{};
  Clock::time_point refusedSince_{};
  int backoffMs_ = 1;
  int lastError_ = 0;
  std::unique_ptr<transport::Connection> network_;
  std::unique_ptr<transport::Connection> upgraded_;
  std::unique_ptr<transport::Connection> result_;
  Offer mine_{}, theirs_{};
  std::vector<uint8_t> myEndpoint_, theirEndpoint_;
  Verdict myVerdict_{}, theirVerdict_{};
  transport::Transfer sendOffer_, recvOffer_, sendEndpoint_, recvEndpoint_, sendVerdict_, recvVerdict_;
  const transport::Backend* backend_ = nullptr;  // the one being tried
};

}  // namespace loom::core
