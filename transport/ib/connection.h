// IbConnection: the Connection contract (transport/connection.h) over
// reliable-connected verbs queue pairs (InfiniBand or RoCE).
//
// Data path. Each side owns a receive FIFO of kSlots slots in registered
// memory; the peer writes into it with RDMA write-with-immediate, one slot
// per write: a 64-byte SlotHeader {magic, message sequence, total bytes,
// offset, piece bytes} followed by up to slotBytes of payload. Messages
// bigger than a slot take several; an empty message still takes one. The
// sender copies each piece into a registered staging slot and writes from
// there (so any host buffer can be sent, none needs registering), and picks
// slots round-robin (slot = piece number % kSlots, queue pair = piece
// number % queue pairs). A send whose buffer this connection registered
// (registerMemory: a verbs memory region; core does it for ncclCommRegister
// buffers) skips the copy: the write gathers the header from the staging
// slot and the payload straight from the buffer. Either way a send is done
// once its writes completed, that is once the peer acknowledged them, so
// nothing is lost when a rank destroys its communicator right after its
// last send (done flags stay in posting order). The immediate is the slot index; the receiver
// takes slots in order, checks each header against the receive it posted
// (a size the peer did not post is an error), copies the payload out and
// frees the slot.
//
// Flow control. The sender never has more than kSlots pieces unanswered:
// the receiver returns credits as zero-byte writes-with-immediate whose
// immediate (top bit set) is the running count of slots it freed, modulo
// 2^31. Each credit message reports at least one slot, so neither side ever
// has more than 2 x kSlots messages coming; every queue pair keeps that many
// receives posted.
//
// Waiting. pollFds() is the completion channel: the completion queue is
// armed before progress() returns with nothing left to do, so a blocked
// waiter wakes on the next completion.
//
// Failures. A failed work completion, an async event about this queue pair
// or its port, or a malformed message is a sticky error naming the device,
// port, peer rank and the decoded status. A peer that dies is noticed by a
// zero-byte probe write, sent after a second without traffic while this
// side waits: it fails once NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT expire (or
// loom's own bound on the probe, see probeLimitS(), for providers that
// retry forever).
//
// Device buffers: the engine stages them through pinned host memory
// (transport/registry.h), unless LOOM_IB_GPUDIRECT=1 (UNTESTED: no machine
// we test on has a GPU and an RDMA NIC): then the connection moves them
// itself. Sends from device buffers registered with it (ncclCommRegister:
// the allocation's pages through a dma-buf the driver exports,
// ibv_reg_dmabuf_mr) are gathered straight from device memory; other
// device buffers are copied into the staging slots, and received pieces
// from the host FIFO into device memory, on a stream of the connection's
// own. Nothing is registered implicitly: a cached registration of memory
// that was freed and allocated again would send stale pages.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/time.h"
#include "transport/connection.h"
#include "transport/ib/device.h"
#include "transport/ib/endpoint.h"
#include "transport/ring.h"

namespace loom::transport::ib {

inline constexpr uint32_t kSlots = 8;
inline constexpr uint32_t kSlotHeaderBytes = 64;

struct SlotHeader {
  uint32_t magic;
  uint32_t seq;  // low 32 bits of the message's sequence number
  uint64_t totalBytes;
  uint64_t offset;
  uint32_t pieceBytes;
  uint32_t slot;
  uint8_t pad[32];
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes);
inline constexpr uint32_t kSlotMagic = 0x42494F4Cu;  // "LOIB"

class IbConnection final : public Connection {
 public:
  struct Options {
    int qps = 1;                 // NCCL_IB_QPS_PER_CONNECTION
    size_t fifoBytes = 1 << 20;  // LOOM_IB_FIFO_BYTES
    int timeout = 20;            // NCCL_IB_TIMEOUT
    int retryCount = 7;          // NCCL_IB_RETRY_CNT
    int serviceLevel = 0;        // NCCL_IB_SL
    int trafficClass = 0;        // NCCL_IB_TC (RoCE: the GRH's; InfiniBand routes without one)
    double probeAfterS = 1;      // quiet time before a liveness probe
    bool gpuDirect = false;      // LOOM_IB_GPUDIRECT, where gpuDirectWhyNot() is ""
    // `commClass`: the communicator's ncclConfig_t.trafficClass (-1: none),
    // its traffic class where NCCL_IB_TC is unset and, when 0 .. 15, its
    // service level where NCCL_IB_SL is unset (NCCL's order).
    static Options fromSettings(int commClass = -1);
  };
  // Why this process cannot move device buffers over verbs itself ("" when
  // it can): LOOM_IB_GPUDIRECT off, no CUDA device, no dma-buf registration
  // in libibverbs.
  static std::string gpuDirectWhyNot();

  // This side's half on `port`, its queue pairs in INIT with receives
  // posted; endpoint() says how to reach it.
  static Result<std::unique_ptr<IbConnection>> create(int peer, const PortInfo& port, const Options& options);
  ~IbConnection() override;
  IbConnection(const IbConnection&) = delete;
  IbConnection& operator=(const IbConnection&) = delete;

  const IbEndpoint& endpoint() const { return local_; }
  uint32_t slotStride() const { return slotStride_; }
  // Moves the queue pairs to RTS towards the peer's endpoint.
  Status attach(const IbEndpoint& peer);
  // Tests only: writes `n` bytes (at most a slot's stride) into the peer's
  // FIFO slot `slot`, announced as that slot, as a broken or hostile peer
  // would, bypassing every check of this side.
  Status writeRawForTest(const void* bytes, uint32_t n, uint32_t slot);

  int peer() const override { return peer_; }
  const char* kind() const override { return "ib"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice || options_.gpuDirect; }
  Status progress() override;
  void pollFds(std::vector<pollfd>* fds) const override;
  bool idle() const override;
  Result<std::unique_ptr<Region>> registerMemory(void* base, size_t bytes, MemoryType memory) override;

 protected:
  Status queueSend(Transfer* t) override;
  Status queueRecv(Transfer* t) override;

 private:
  IbConnection(int peer, const PortInfo& port, const Options& options);
  Status setUp();
  Status fail(Status s);
  std::string where() const;  // "rxe0:1 to rank 3"
  Status pollCompletions(int* seen);
  Status receive();
  Status send();
  Status returnCredits();
  Status probe();
  double probeLimitS() const;
  // A write from staging slot `slot` (`length` bytes) into the peer's slot
  // of that number; with `payload`, `payloadBytes` more gathered from it.
  Status postWrite(int qp, uint64_t wrId, uint32_t slot, uint32_t length, bool withImm, uint32_t imm,
                   const ibv_sge* payload = nullptr);
  void retireSends();
  // Bytes of a received piece into the transfer's buffer, and of a piece to
  // send out of it (host or device memory).
  Status copyOut(Transfer* t, size_t offset, const uint8_t* from, size_t n);
  Status copyIn(const Transfer* t, size_t offset, uint8_t* to, size_t n);
  Status deviceCopy(void* to, const void* from, size_t n);
  Status postRecv(int qp, int count);
  int takeEvents();  // channel events waiting, taken and acknowledged
  Status arm();

  int peer_;
  PortInfo port_;
  Options options_;
  std::shared_ptr<Device> device_;
  uint32_t slotBytes_ = 0;   // payload bytes per slot
  uint32_t slotStride_ = 0;  // header + payload, a multiple of 64
  int sqDepth_ = 0, rqDepth_ = 0;

  // Verbs resources, released in the destructor in reverse order.
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::unique_ptr<uint8_t[], void (*)(void*)> fifo_{nullptr, nullptr};
  std::unique_ptr<uint8_t[], void (*)(void*)> stage_{nullptr, nullptr};
  ibv_mr* fifoMr_ = nullptr;
  ibv_mr* stageMr_ = nullptr;

  IbEndpoint local_, remote_;
  bool attached_ = false;
  Status error_;

  // Send side.
  Ring<Transfer*> sends_;
  uint64_t sendSeq_ = 0;       // messages fully staged
  size_t sendOffset_ = 0;      // of the front message
  uint32_t piecesSent_ = 0;    // running count, modulo 2^31
  uint64_t piecesPosted_ = 0;  // the same, whole: piece i takes slot i % kSlots, queue pair i % n
  uint32_t peerFreed_ = 0;     // the peer's running count of freed slots
  std::array<bool, kSlots> stageBusy_{};  // a write from this staging slot is unfinished
  std::vector<int> sqUsed_;    // per queue pair
  // Sends being written: from their first piece posted until every write
  // of theirs completed, in posting order; the front's id is retiredSends_,
  // slotOwner_ names the entry the write from a staging slot belongs to.
  struct InFlight {
    Transfer* t;
    uint32_t unfinished;  // zero-copy writes not yet completed
    bool posted;          // every piece posted
  };
  Ring<InFlight> inFlight_;
  uint64_t retiredSends_ = 0;
  std::array<uint64_t, kSlots> slotOwner_{};
  bool probing_ = false;
  Clock::time_point probeSentAt_{};

  // Receive side.
  Ring<Transfer*> recvs_;
  uint64_t recvSeq_ = 0;
  uint32_t slotsTaken_ = 0;    // running count, modulo 2^31
  uint32_t freedReported_ = 0;
  std::array<bool, kSlots> arrived_{};
  std::vector<uint64_t> nextPiece_;  // per queue pair: the next piece it delivers

  bool armed_ = false;
  bool completedSinceArm_ = false;
  Clock::time_point lastHeard_{};
  Clock::time_point nextEventCheck_{};
  void* copyStream_ = nullptr;  // GPUDirect: received pieces go to device memory on it
};

}  // namespace loom::transport::ib
