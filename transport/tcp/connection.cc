#include "transport/tcp/connection.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace loom::transport::tcp {

namespace {

constexpr size_t kHeaderBytes = sizeof(FrameHeader);
constexpr int kMaxIov = 64;

size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// The errors of a socket whose peer stopped answering (keepalive, or no
// route to it any more) rather than closed or reset it.
bool lostPeer(int err) { return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN; }

}  // namespace

size_t planMessage(uint64_t seq, size_t bytes, size_t sockets, size_t stripeMin, PiecePlan* out) {
  size_t n = sockets == 0 ? 1 : sockets;
  if (stripeMin == 0) stripeMin = 1;
  if (n == 1 || bytes == 0 || bytes < stripeMin) {
    out[0] = PiecePlan{uint32_t(seq % n), 0, bytes};
    return 1;
  }
  size_t chunk = ceilDiv(ceilDiv(bytes, n), kStripeAlign) * kStripeAlign;
  size_t start = size_t(seq % n);
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t off = i * chunk;
    if (off >= bytes) break;
    out[count++] = PiecePlan{uint32_t((start + i) % n), off, std::min(chunk, bytes - off)};
  }
  return count;
}

TcpConnection::TcpConnection(int peerRank, std::vector<net::UniqueFd> sockets, size_t stripeMin)
    : peer_(peerRank), stripeMin_(stripeMin == 0 ? 1 : stripeMin) {
  socks_.resize(sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i) {
    Socket& k = socks_[i];
    k.fd = std::move(sockets[i]);
    k.stage = std::make_unique<uint8_t[]>(kStageBytes);
    if (!error_.isOk()) continue;
    if (!k.fd.valid()) {
      error_ = internalError("TcpConnection to rank " + std::to_string(peer_) +
                             " was given an invalid socket at index " + std::to_string(i));
      continue;
    }
    Status s = net::setNonBlocking(k.fd.get());
    if (s.isOk()) s = net::setNoDelay(k.fd.get());
    if (!s.isOk()) error_ = s.addContext("setting up the connection to rank " + std::to_string(peer_));
  }
  if (socks_.empty() && error_.isOk()) {
    error_ = internalError("TcpConnection to rank " + std::to_string(peer_) +
                           " was given no sockets");
  }
  plan_.resize(std::max<size_t>(socks_.size(), 1));
}

TcpConnection::~TcpConnection() = default;

std::vector<uint64_t> TcpConnection::bytesSentPerSocket() const {
  std::vector<uint64_t> out;
  for (const Socket& k : socks_) out.push_back(k.bytesSent);
  return out;
}

std::vector<uint64_t> TcpConnection::bytesReceivedPerSocket() const {
  std::vector<uint64_t> out;
  for (const Socket& k : socks_) out.push_back(k.bytesReceived);
  return out;
}

Status TcpConnection::fail(Status s) {
  if (error_.isOk()) error_ = std::move(s);
  return error_;
}

Status TcpConnection::queueSend(Transfer* t) {
  if (!error_.isOk()) return error_;
  uint64_t seq = nextSendSeq_++;
  size_t n = planMessage(seq, t->bytes, socks_.size(), stripeMin_, plan_.data());
  for (size_t i = 0; i < n; ++i) {
    const PiecePlan& pp = plan_[i];
    SendPiece piece;
    piece.t = t;
    piece.seq = seq;
    piece.data = static_cast<const uint8_t*>(t->data) + pp.offset;
    piece.header = FrameHeader{kFrameMagic, uint32_t(seq), t->bytes, pp.length};
    socks_[pp.socket].sendQ.push(piece);
  }
  sendMsgs_.push(Message{t, uint32_t(n)});
  return Status::ok();
}

Status TcpConnection::queueRecv(Transfer* t) {
  if (!error_.isOk()) return error_;
  uint64_t seq = nextRecvSeq_++;
  size_t n = planMessage(seq, t->bytes, socks_.size(), stripeMin_, plan_.data());
  for (size_t i = 0; i < n; ++i) {
    const PiecePlan& pp = plan_[i];
    RecvPiece piece;
    piece.t = t;
    piece.seq = seq;
    piece.data = static_cast<uint8_t*>(t->data) + pp.offset;
    piece.length = pp.length;
    socks_[pp.socket].recvQ.push(piece);
  }
  recvMsgs_.push(Message{t, uint32_t(n)});
  return Status::ok();
}

Status TcpConnection::progress() {
  if (!error_.isOk()) return error_;
  for (size_t s = 0; s < socks_.size(); ++s) {
    if (!socks_[s].sendQ.empty()) {
      Status st = sendOn(s);
      if (!st.isOk()) return fail(std::move(st));
    }
    if (!socks_[s].recvQ.empty()) {
      Status st = recvOn(s);
      if (!st.isOk()) return fail(std::move(st));
    }
  }
  return Status::ok();
}

bool TcpConnection::stageUseful(const Socket& k) const {
  if (k.recvQ.empty()) return false;
  const RecvPiece& p = k.recvQ.front();
  return p.headerDone ? (k.staged() > 0 || p.received == p.length) : k.staged() >= kHeaderBytes;
}

void TcpConnection::pollFds(std::vector<pollfd>* fds) const {
  if (!error_.isOk()) return;
  for (const Socket& k : socks_) {
    short events = 0;
    if (!k.recvQ.empty()) events |= POLLIN;
    if (!k.sendQ.empty() || stageUseful(k)) events |= POLLOUT;
    if (events != 0) fds->push_back(pollfd{k.fd.get(), events, 0});
  }
}

void TcpConnection::pieceDone(Ring<Message>& msgs, uint64_t& firstSeq, uint64_t seq) {
  --msgs[size_t(seq - firstSeq)].piecesLeft;
  // Done flags are set in posting order.
  while (!msgs.empty() && msgs.front().piecesLeft == 0) {
    msgs.front().t->done = true;
    msgs.pop();
    ++firstSeq;
  }
}

Status TcpConnection::closedError(size_t s, int err) const {
  if (lostPeer(err)) {
    return remoteError("rank " + std::to_string(peer_) + " stopped answering on socket " + std::to_string(s) +
                       " of " + std::to_string(socks_.size()) +
                       " (" + errnoText(err) + "): its host or the network to it is down");
  }
  std::string msg = "rank " + std::to_string(peer_) + " closed its connection";
  if (err != 0) msg += " (" + errnoText(err) + ")";
  msg += " on socket " + std::to_string(s) + " of " + std::to_string(socks_.size()) +
         "; that rank exited or failed: check its log";
  return remoteError(std::move(msg));
}

// Writes as much of the socket's queued pieces as the kernel takes, several
// pieces (header and payload iovecs) per sendmsg.
Status TcpConnection::sendOn(size_t s) {
  Socket& k = socks_[s];
  while (!k.sendQ.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (size_t i = 0; i < k.sendQ.size() && n + 2 <= kMaxIov; ++i) {
      SendPiece& p = k.sendQ[i];
      if (p.sent < kHeaderBytes) {
        iov[n++] = iovec{reinterpret_cast<uint8_t*>(&p.header) + p.sent, kHeaderBytes - p.sent};
        want += kHeaderBytes - p.sent;
      }
      size_t off = p.sent > kHeaderBytes ? p.sent - kHeaderBytes : 0;
      if (p.header.pieceBytes > off) {
        iov[n++] = iovec{const_cast<uint8_t*>(p.data) + off, p.header.pieceBytes - off};
        want += p.header.pieceBytes - off;
      }
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = size_t(n);
    ssize_t w = ::sendmsg(k.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return Status::ok();
      if (err == EPIPE || err == ECONNRESET || lostPeer(err)) return closedError(s, err);
      return systemErrno("sending to rank " + std::to_string(peer_) + " on socket " +
                             std::to_string(s),
                         err);
    }
    size_t left = size_t(w);
    while (left > 0) {
      SendPiece& p = k.sendQ.front();
      size_t take = std::min(left, kHeaderBytes + p.header.pieceBytes - p.sent);
      size_t before = p.sent > kHeaderBytes ? p.sent - kHeaderBytes : 0;
      p.sent += take;
      size_t after = p.sent > kHeaderBytes ? p.sent - kHeaderBytes : 0;
      p.t->progressed += after - before;
      k.bytesSent += after - before;
      left -= take;
      if (p.sent == kHeaderBytes + p.header.pieceBytes) {
        uint64_t seq = p.seq;
        k.sendQ.pop();
        pieceDone(sendMsgs_, sendFirst_, seq);
      }
    }
    if (size_t(w) < want) return Status::ok();  // socket buffer full
  }
  return Status::ok();
}

Status TcpConnection::checkHeader(size_t s, const RecvPiece& p, const FrameHeader& h) const {
  std::string who = "rank " + std::to_string(peer_);
  std::string where = " on socket " + std::to_string(s);
  if (h.magic != kFrameMagic) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "bad frame magic 0x%08" PRIx32 ", expected 0x%08" PRIx32,
                  h.magic, kFrameMagic);
    return remoteError(who + " sent bytes that are not a loom frame header" + where + " (" + buf +
                       "): the stream is corrupted or the peer is not loom; no data was "
                       "delivered");
  }
  if (h.seq != uint32_t(p.seq)) {
    return remoteError(who + " sent message #" + std::to_string(h.seq) + where +
                       " where message #" + std::to_string(uint32_t(p.seq)) +
                       " was expected: the ranks are out of step (they called different "
                       "collectives or counts)");
  }
  if (h.totalBytes != p.t->bytes) {
    return remoteError(who + " sent a " + std::to_string(h.totalBytes) + "-byte message where a " +
                       std::to_string(p.t->bytes) +
                       "-byte receive was posted: the ranks called different collectives or "
                       "counts");
  }
  if (h.pieceBytes != p.length) {
    return remoteError(who + " sent a " + std::to_string(h.pieceBytes) + "-byte piece of a " +
                       std::to_string(h.totalBytes) + "-byte message" + where + " where a " +
                       std::to_string(p.length) +
                       "-byte piece was expected: the ranks use different "
                       "LOOM_SOCKETS_PER_PEER or LOOM_SOCKET_STRIPE_MIN");
  }
  return Status::ok();
}

Status TcpConnection::fillStage(size_t s, bool* got) {
  Socket& k = socks_[s];
  *got = false;
  if (k.staged() == 0) {
    k.stageBegin = k.stageEnd = 0;
  } else if (kStageBytes - k.stageEnd < kHeaderBytes) {
    std::memmove(k.stage.get(), k.stage.get() + k.stageBegin, k.staged());
    k.stageEnd -= k.stageBegin;
    k.stageBegin = 0;
  }
  while (true) {
    ssize_t r = ::recv(k.fd.get(), k.stage.get() + k.stageEnd, kStageBytes - k.stageEnd,
                       MSG_DONTWAIT);
    if (r > 0) {
      k.stageEnd += size_t(r);
      *got = true;
      return Status::ok();
    }
    if (r == 0) return closedError(s, 0);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return Status::ok();
    if (err == ECONNRESET || lostPeer(err)) return closedError(s, err);
    return systemErrno("receiving from rank " + std::to_string(peer_) + " on socket " +
                           std::to_string(s),
                       err);
  }
}

// Moves payload of the front piece: first from the staging area, then with
// one readv straight into the buffer (plus the staging area for what follows).
Status TcpConnection::readPayload(size_t s, RecvPiece& p, bool* blocked) {
  Socket& k = socks_[s];
  *blocked = false;
  size_t left = p.length - p.received;
  if (k.staged() > 0) {
    size_t take = std::min(left, k.staged());
    std::memcpy(p.data + p.received, k.stage.get() + k.stageBegin, take);
    k.stageBegin += take;
    p.received += take;
    p.t->progressed += take;
    k.bytesReceived += take;
    return Status::ok();
  }
  k.stageBegin = k.stageEnd = 0;
  iovec iov[2] = {{p.data + p.received, left}, {k.stage.get(), kStageBytes}};
  while (true) {
    ssize_t r = ::readv(k.fd.get(), iov, 2);
    if (r > 0) {
      size_t direct = std::min(left, size_t(r));
      p.received += direct;
      p.t->progressed += direct;
      k.bytesReceived += direct;
      k.stageEnd = size_t(r) - direct;
      // A short read drained the socket: another readv would only say EAGAIN.
      *blocked = size_t(r) < left;
      return Status::ok();
    }
    if (r == 0) return closedError(s, 0);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      *blocked = true;
      return Status::ok();
    }
    if (err == ECONNRESET || lostPeer(err)) return closedError(s, err);
    return systemErrno("receiving from rank " + std::to_string(peer_) + " on socket " +
                           std::to_string(s),
                       err);
  }
}

Status TcpConnection::recvOn(size_t s) {
  Socket& k = socks_[s];
  while (!k.recvQ.empty()) {
    RecvPiece& p = k.recvQ.front();
    if (!p.headerDone) {
      if (k.staged() < kHeaderBytes) {
        bool got = false;
        LOOM_TRY(fillStage(s, &got));
        if (!got) return Status::ok();
        continue;
      }
      FrameHeader h;
      std::memcpy(&h, k.stage.get() + k.stageBegin, kHeaderBytes);
      LOOM_TRY(checkHeader(s, p, h));
      k.stageBegin += kHeaderBytes;
      p.headerDone = true;
    }
    if (p.received < p.length) {
      bool blocked = false;
      LOOM_TRY(readPayload(s, p, &blocked));
      if (blocked) return Status::ok();
      if (p.received < p.length) continue;
    }
    uint64_t seq = p.seq;
    k.recvQ.pop();
    pieceDone(recvMsgs_, recvFirst_, seq);
  }
  return Status::ok();
}

}  // namespace loom::transport::tcp
