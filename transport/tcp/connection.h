// TcpConnection: the Connection contract (transport/connection.h) over one or
// more TCP sockets to the same peer.
//
// Wire format. Every piece of every message is preceded by a 24-byte
// FrameHeader {magic, low 32 bits of the message sequence number, total
// message bytes, piece bytes} in host byte order (all ranks of a job share an
// architecture). A message of at least stripeMin bytes is cut into contiguous
// pieces, one per socket, of ceil(bytes / sockets) rounded up to 4 KiB (the
// last pieces may be shorter; empty pieces are not sent); piece i goes over
// socket (seq + i) % sockets. A smaller message (or any message when there is
// one socket) goes whole over socket seq % sockets. Both sides compute the
// same plan from the sizes they posted, so each socket carries its pieces in
// sequence order. Zero-byte messages still send a header.
//
// Safety. The receiver validates each header against the receive it posted
// (magic, sequence, total size, piece size) before any payload byte is
// written to the receive buffer; a mismatch is a sticky kRemoteError that
// names the peer rank and the likely cause. Peer close (EOF, ECONNRESET,
// EPIPE) is kRemoteError "rank N closed its connection". No SIGPIPE: sends use
// MSG_NOSIGNAL.
//
// Performance. Payloads are sent straight from and received straight into the
// Transfer's buffer (sendmsg with header+payload iovecs of several queued
// pieces; readv of payload plus a small per-socket staging area that catches
// the following headers). Only bytes that land in the staging area while a
// header is expected (at most kStageBytes per read) are copied. Queues are
// rings that stop allocating once grown.
//
// Completion. Transfers are marked done in posting order per direction, even
// though pieces on different sockets may finish out of order. progressed
// counts payload bytes moved so far.
//
// Threading: like every Connection, used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/connection.h"
#include "transport/ring.h"
#include "transport/net/socket.h"

namespace loom::transport::tcp {

struct FrameHeader {
  uint32_t magic;
  uint32_t seq;          // low 32 bits of the message sequence number
  uint64_t totalBytes;   // size of the whole message
  uint64_t pieceBytes;   // payload bytes that follow this header
};
static_assert(sizeof(FrameHeader) == 24, "FrameHeader must be packed to 24 bytes");

inline constexpr uint32_t kFrameMagic = 0x4D4F4F4Cu;  // "LOOM" in little-endian memory
inline constexpr size_t kStripeAlign = 4096;
inline constexpr size_t kStageBytes = 16 * 1024;

// One piece of a message as both sides plan it.
struct PiecePlan {
  uint32_t socket;
  size_t offset;
  size_t length;
};

// Fills out[0..n) with the pieces of message `seq` of `bytes` bytes over
// `sockets` sockets and returns n (1 <= n <= sockets). out must hold
// `sockets` entries. stripeMin 0 is treated as 1.
size_t planMessage(uint64_t seq, size_t bytes, size_t sockets, size_t stripeMin, PiecePlan* out);

class TcpConnection final : public Connection {
 public:
  // `sockets`: connected, authenticated sockets to `peerRank`, in the index
  // order both sides agreed on. They are made non-blocking with TCP_NODELAY
  // (a failure there becomes the connection's sticky error).
  TcpConnection(int peerRank, std::vector<net::UniqueFd> sockets, size_t stripeMin);
  ~TcpConnection() override;
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  int peer() const override { return peer_; }
  const char* kind() const override { return "tcp"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice; }
  Status progress() override;
  // Each socket with a pending receive gets POLLIN, with a pending send
  // POLLOUT. Sockets with nothing pending are not listed. When a socket's
  // staging area already holds bytes a pending receive can use (which only
  // happens when a receive was posted after the last progress()), POLLOUT is
  // added too so the waiter wakes at once; still, call progress() after
  // posting and before waiting.
  void pollFds(std::vector<pollfd>* fds) const override;
  bool idle() const override { return sendMsgs_.empty() && recvMsgs_.empty(); }

  size_t numSockets() const { return socks_.size(); }
  size_t stripeMin() const { return stripeMin_; }
  // Payload bytes (headers excluded) moved over each socket so far.
  std::vector<uint64_t> bytesSentPerSocket() const;
  std::vector<uint64_t> bytesReceivedPerSocket() const;

 protected:
  Status queueSend(Transfer* t) override;
  Status queueRecv(Transfer* t) override;

 private:
  struct Message {
    Transfer* t = nullptr;
    uint32_t piecesLeft = 0;
  };
  struct SendPiece {
    Transfer* t = nullptr;
    uint64_t seq = 0;
    const uint8_t* data = nullptr;  // start of this piece's payload
    size_t sent = 0;                // bytes of header + payload written
    FrameHeader header{};
  };
  struct RecvPiece {
    Transfer* t = nullptr;
    uint64_t seq = 0;
    uint8_t* data = nullptr;  // start of this piece's payload
    size_t length = 0;
    size_t received = 0;  // payload bytes
    bool headerDone = false;
  };
  struct Socket {
    net::UniqueFd fd;
    Ring<SendPiece> sendQ;
    Ring<RecvPiece> recvQ;
    std::unique_ptr<uint8_t[]> stage;  // kStageBytes
    size_t stageBegin = 0;
    size_t stageEnd = 0;
    uint64_t bytesSent = 0;
    uint64_t bytesReceived = 0;
    size_t staged() const { return stageEnd - stageBegin; }
  };

  Status fail(Status s);
  Status sendOn(size_t s);
  Status recvOn(size_t s);
  // Reads more bytes into the staging area; *got false when none available.
  Status fillStage(size_t s, bool* got);
  Status readPayload(size_t s, RecvPiece& p, bool* blocked);
  Status checkHeader(size_t s, const RecvPiece& p, const FrameHeader& h) const;
  Status closedError(size_t s, int err) const;
  void pieceDone(Ring<Message>& msgs, uint64_t& firstSeq, uint64_t seq);
  bool stageUseful(const Socket& k) const;

  int peer_;
  size_t stripeMin_;
  std::vector<Socket> socks_;
  std::vector<PiecePlan> plan_;  // scratch, one entry per socket
  Ring<Message> sendMsgs_;       // index = seq - sendFirst_
  Ring<Message> recvMsgs_;
  uint64_t sendFirst_ = 0;       // seq of sendMsgs_.front()
  uint64_t recvFirst_ = 0;
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  Status error_;                 // sticky
};

}  // namespace loom::transport::tcp
