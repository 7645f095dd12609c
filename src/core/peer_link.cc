#include "core/peer_link.h"

#include <cstring>

#include "common/log.h"
#include "core/mode.h"

namespace loom::core {
namespace {

using transport::Connection;
constexpr uint32_t kOfferMagic = 0x7266664f;    // "Offr"
constexpr uint32_t kVerdictMagic = 0x74636556;  // "Vect"
constexpr uint32_t kMaxEndpointBytes = 4096;

transport::PeerView viewOf(int rank, const wire::RankInfo& info) {
  transport::PeerView v;
  v.rank = rank;
  v.hostHash = info.hostHash;
  v.pid = info.pid;
  v.memory = info.mode == uint32_t(Mode::kHost) ? transport::MemoryType::kHost : transport::MemoryType::kDevice;
  v.transports = info.transports;
  return v;
}

}  // namespace

PeerLink::PeerLink(int self, int peer, int channel, const LinkOptions& options)
    : self_(self), peer_(peer), channel_(channel), options_(options) {}

std::unique_ptr<Connection> PeerLink::take() { return std::move(result_); }

void PeerLink::pollFds(std::vector<pollfd>* fds) const {
  if (connecting_) fds->push_back({connecting_.get(), POLLOUT, 0});
  if ((phase_ == Phase::kOffer || phase_ == Phase::kEndpoint || phase_ == Phase::kVerdict) && network_) {
    network_->pollFds(fds);
  }
}

Status PeerLink::advance(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* ready) {
  *ready = false;
  // Each phase runs the next at once when it finished: a phase whose
  // transfers completed inside the previous one's progress() has no fd
  // left to wake a poll.
  for (;;) {
    switch (phase_) {
      case Phase::kNetwork: {
        if (peer_ == self_) {
          result_ = transport::openSelf(self_);
          phase_ = Phase::kReady;
          continue;
        }
        bool done = false;
        LOOM_TRY(startNetwork(bootstrap, abort, &done));
        if (!done) return Status::ok();
        LOOM_TRY(startUpgrade(bootstrap));
        continue;
      }
      case Phase::kOffer:
        LOOM_TRY(network_->progress());
        if (!sendOffer_.done || !recvOffer_.done) return Status::ok();
        LOOM_TRY(finishOffer());
        continue;
      case Phase::kEndpoint:
        LOOM_TRY(network_->progress());
        if (!sendEndpoint_.done || !recvEndpoint_.done) return Status::ok();
        LOOM_TRY(finishEndpoint());
        continue;
      case Phase::kVerdict:
        LOOM_TRY(network_->progress());
        if (!sendVerdict_.done || !recvVerdict_.done) return Status::ok();
        LOOM_TRY(finishVerdict(bootstrap));
        continue;
      case Phase::kReady:
        *ready = true;
        return Status::ok();
    }
  }
}

// The lower rank connects all sockets; the higher one collects them from
// its listener as they arrive.
Status PeerLink::startNetwork(Bootstrap& bootstrap, const std::atomic<bool>* abort, bool* done) {
  const int nsock = options_.socketsPerPeer;
  if (self_ < peer_) {
    LOOM_TRY(connectSockets(bootstrap, abort));
    if (int(sockets_.size()) < nsock) return Status::ok();
  } else {
    bootstrap.service();
    const auto channel = uint32_t(channel_);
    while (auto fd = bootstrap.take(wire::HelloKind::kData, peer_, channel, uint32_t(sockets_.size()))) {
      sockets_.push_back(std::move(*fd));
    }
    const int expected = bootstrap.socketCount(peer_, channel);
    if (expected == 0 || int(sockets_.size()) < expected) return Status::ok();
  }
  for (const net::UniqueFd& fd : sockets_) LOOM_TRY(net::watchPeer(fd.get(), options_.deadPeerS));
  network_ = transport::openNetwork(peer_, std::move(sockets_), options_.stripeMin);
  *done = true;
  return Status::ok();
}

// Connects the data sockets one at a time without blocking: start a
// connect, come back when it finished, send the hello, next one.
Status PeerLink::connectSockets(Bootstrap& bootstrap, const std::atomic<bool>* abort) {
  constexpr double kRefusedLimitS = 3;
  constexpr int kMaxBackoffMs = 100;
  const int nsock = options_.socketsPerPeer;
  const auto now = Clock::now();
  if (firstAttempt_ == Clock::time_point{}) firstAttempt_ = now;
  while (int(sockets_.size()) < nsock) {
    if (!connecting_) {
      if (now < retryAt_) return Status::ok();
      LOOM_ASSIGN_OR_RETURN(auto addr, bootstrap.peerAddress(peer_));
      int err = 0;
      auto fd = net::startConnect(addr, &err);
      if (!fd.isOk()) return fd.takeStatus().addContext("connecting to " + bootstrap.describe(peer_));
      connecting_ = std::move(fd.value());
      if (!connecting_) lastError_ = err;
    }
    int state = connecting_ ? net::finishConnect(connecting_.get()) : lastError_;
    if (state == EINPROGRESS) {
      if (secondsSince(firstAttempt_) > options_.connectTimeoutS) {
        return remoteError("could not connect to " + bootstrap.describe(peer_) + " within " +
                           std::to_string(int(options_.connectTimeoutS)) +
                           " s; check that no firewall blocks its port");
      }
      return Status::ok();
    }
    if (state != 0) {
      connecting_.reset();
      lastError_ = state;
      if (refusedSince_ == Clock::time_point{}) refusedSince_ = now;
      if (secondsSince(refusedSince_) > kRefusedLimitS) {
        return remoteError(bootstrap.describe(peer_) + " refuses connections (" + errnoText(state) +
                           " for " + std::to_string(int(kRefusedLimitS)) +
                           " s): its process exited or it destroyed the communicator");
      }
      retryAt_ = now + std::chrono::milliseconds(backoffMs_);
      backoffMs_ = std::min(backoffMs_ * 2, kMaxBackoffMs);
      return Status::ok();
    }
    refusedSince_ = {};
    backoffMs_ = 1;
    // A fresh socket's buffer takes the hello at once; the deadline only
    // guards against a peer that accepted and then stopped reading.
    Status s = bootstrap.sendHello(connecting_.get(), peer_, wire::HelloKind::kData, uint32_t(channel_),
                                   uint32_t(sockets_.size()), uint32_t(nsock), nullptr, 0,
                                   Deadline::afterSeconds(10), abort);
    if (!s.isOk()) return s.addContext("connecting to " + bootstrap.describe(peer_));
    sockets_.push_back(std::move(connecting_));
  }
  return Status::ok();
}

// Offers the best backend after the one tried last (none: the best of all).
Status PeerLink::startUpgrade(Bootstrap& bootstrap) {
  std::string reasons;
  backend_ = transport::choose(viewOf(self_, bootstrap.peer(self_)), viewOf(peer_, bootstrap.peer(peer_)),
                               options_.selection, &reasons, backend_);
  if (!backend_) {
    // NCCL_NET=IB is a requirement: a pair that no same-host backend took
    // and verbs could not connect fails instead of using its sockets.
    if (options_.selection.requiresVerbs()) {
      return invalidUsage(options_.selection.describeNet() + " asks for verbs, but rank " + std::to_string(self_) +
                          " cannot reach rank " + std::to_string(peer_) + " over them: " + reasons);
    }
    LOOM_INFO(log::kInit, "rank %d: %s to rank %d (%s)", self_, network_->kind(), peer_, reasons.c_str());
    result_ = std::move(network_);
    phase_ = Phase::kReady;
    return Status::ok();
  }
  mine_ = Offer{kOfferMagic, 1, 0, 0, {}};
  std::strncpy(mine_.backend, backend_->name(), sizeof mine_.backend - 1);
  auto conn = backend_->listen(peer_, options_.selection, &myEndpoint_);
  if (conn.isOk() && myEndpoint_.size() <= kMaxEndpointBytes) {
    upgraded_ = std::move(conn.value());
    mine_.length = uint32_t(myEndpoint_.size());
  } else {
    mine_.ok = 0;
    myEndpoint_.clear();
    LOOM_WARN("rank %d: %s transport to rank %d unavailable, trying the next transport: %s", self_,
              backend_->name(), peer_, conn.isOk() ? "its endpoint is too large" : conn.status().message().c_str());
  }
  sendOffer_ = transport::Transfer{&mine_, sizeof mine_};
  recvOffer_ = transport::Transfer{&theirs_, sizeof theirs_};
  sendEndpoint_ = transport::Transfer{myEndpoint_.data(), myEndpoint_.size()};
  sendEndpoint_.done = mine_.length == 0;  // nothing to send
  Status s = network_->postSend(&sendOffer_);
  if (s.isOk() && !sendEndpoint_.done) s = network_->postSend(&sendEndpoint_);
  if (s.isOk()) s = network_->postRecv(&recvOffer_);
  phase_ = Phase::kOffer;
  return s;
}

// The peer's offer is in: receive its endpoint (if any).
Status PeerLink::finishOffer() {
  if (theirs_.magic != kOfferMagic || theirs_.length > kMaxEndpointBytes || (!theirs_.ok && theirs_.length != 0) ||
      ::strnlen(theirs_.backend, sizeof theirs_.backend) == sizeof theirs_.backend ||
      std::strcmp(theirs_.backend, mine_.backend) != 0) {
    return remoteError("rank " + std::to_string(peer_) +
                       " answered the transport negotiation with an unexpected message "
                       "(different loom versions or settings?)");
  }
  theirEndpoint_.assign(theirs_.length, 0);
  recvEndpoint_ = transport::Transfer{theirEndpoint_.data(), theirEndpoint_.size()};
  recvEndpoint_.done = theirs_.length == 0;  // nothing to receive
  if (!recvEndpoint_.done) LOOM_TRY(network_->postRecv(&recvEndpoint_));
  phase_ = Phase::kEndpoint;
  return Status::ok();
}

// Both endpoints are known: connect, and tell the peer whether it worked.
Status PeerLink::finishEndpoint() {
  myVerdict_ = Verdict{kVerdictMagic, 0};
  if (mine_.ok && theirs_.ok && upgraded_) {
    Status s = backend_->connect(*upgraded_, theirEndpoint_);
    if (s.isOk()) {
      myVerdict_.ok = 1;
    } else {
      LOOM_INFO(log::kInit, "rank %d: cannot attach %s to rank %d, trying the next transport: %s", self_,
                backend_->name(), peer_, s.message().c_str());
    }
  }
  sendVerdict_ = transport::Transfer{&myVerdict_, sizeof myVerdict_};
  recvVerdict_ = transport::Transfer{&theirVerdict_, sizeof theirVerdict_};
  LOOM_TRY(network_->postSend(&sendVerdict_));
  LOOM_TRY(network_->postRecv(&recvVerdict_));
  phase_ = Phase::kVerdict;
  return Status::ok();
}

// Both verdicts are in: use the new connection, or (one side failed) try
// the next backend; both sides reach the same choice.
Status PeerLink::finishVerdict(Bootstrap& bootstrap) {
  if (theirVerdict_.magic != kVerdictMagic) {
    return remoteError("rank " + std::to_string(peer_) + " sent a bad transport verdict");
  }
  if (myVerdict_.ok && theirVerdict_.ok) {
    result_ = std::move(upgraded_);
    network_.reset();  // both sides have read everything: closing sends no reset
    phase_ = Phase::kReady;
    return Status::ok();
  }
  if (myVerdict_.ok) {
    LOOM_INFO(log::kInit, "rank %d: rank %d could not attach %s; trying the next transport", self_, peer_,
              backend_->name());
  }
  upgraded_.reset();
  return startUpgrade(bootstrap);
}

}  // namespace loom::core
