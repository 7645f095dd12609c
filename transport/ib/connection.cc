#include "transport/ib/connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "common/log.h"
#include "common/settings.h"
#include "device/device.h"

namespace loom::transport::ib {
namespace {

constexpr uint32_t kCountMask = 0x7fffffffu;  // running counts are modulo 2^31
constexpr uint32_t kCreditFlag = 0x80000000u;

// wr_id: kind in the top byte, queue pair in the next, slot below.
enum WrKind : uint64_t { kData = 1, kCredit = 2, kProbe = 3, kRecv = 4 };
uint64_t wrId(WrKind kind, int qp, uint32_t slot) { return (uint64_t(kind) << 56) | (uint64_t(qp) << 32) | slot; }
WrKind wrKind(uint64_t id) { return WrKind(id >> 56); }
int wrQp(uint64_t id) { return int((id >> 32) & 0xff); }
uint32_t wrSlot(uint64_t id) { return uint32_t(id); }

int clampInt(int64_t v, int lo, int hi) { return int(std::clamp<int64_t>(v, lo, hi)); }

void freeAligned(void* p) { std::free(p); }

constexpr uint64_t kNoOwner = ~uint64_t(0);

// Memory registered with one connection: a verbs memory region its sends
// gather from. It keeps the device (and so the protection domain) open.
class IbRegion final : public Region {
 public:
  IbRegion(void* base, size_t bytes, MemoryType memory, const void* owner, std::shared_ptr<Device> device, ibv_mr* mr)
      : Region(base, bytes, memory), owner_(owner), device_(std::move(device)), mr_(mr) {}
  ~IbRegion() override { verbs()->deregMr(mr_); }
  const void* owner() const { return owner_; }
  uint32_t lkey() const { return mr_->lkey; }

 private:
  const void* owner_;
  std::shared_ptr<Device> device_;
  ibv_mr* mr_;
};

}  // namespace

IbConnection::Options IbConnection::Options::fromSettings(int commClass) {
  auto cfg = settings::current();
  Options o;
  o.qps = clampInt(cfg->getInt("NCCL_IB_QPS_PER_CONNECTION"), 1, int(kMaxQps));
  o.fifoBytes = size_t(std::clamp<int64_t>(cfg->getInt("LOOM_IB_FIFO_BYTES"), 8192, int64_t(256) << 20));
  o.timeout = clampInt(cfg->getInt("NCCL_IB_TIMEOUT"), 1, 31);
  o.retryCount = clampInt(cfg->getInt("NCCL_IB_RETRY_CNT"), 0, 7);
  o.serviceLevel = clampInt(cfg->getInt("NCCL_IB_SL"), 0, 15);
  o.trafficClass = clampInt(cfg->getInt("NCCL_IB_TC"), 0, 255);
  if (commClass >= 0 && commClass <= 255 && !cfg->isSet("NCCL_IB_TC")) o.trafficClass = commClass;
  if (commClass >= 0 && commClass <= 15 && !cfg->isSet("NCCL_IB_SL")) o.serviceLevel = commClass;
  o.gpuDirect = gpuDirectWhyNot().empty();
  return o;
}

std::string IbConnection::gpuDirectWhyNot() {
  if (!settings::current()->getBool("LOOM_IB_GPUDIRECT")) return "LOOM_IB_GPUDIRECT=0";
  device::Api* api = device::api();
  if (!api || api->deviceCount() == 0) return "no CUDA device";
  const Verbs* v = verbs();
  if (!v || !v->regDmabufMr) return "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)";
  return "";
}

IbConnection::IbConnection(int peer, const PortInfo& port, const Options& options)
    : peer_(peer), port_(port), options_(options) {}

Result<std::unique_ptr<IbConnection>> IbConnection::create(int peer, const PortInfo& port, const Options& options) {
  std::unique_ptr<IbConnection> c(new IbConnection(peer, port, options));
  LOOM_TRY(c->setUp());
  return c;
}

std::string IbConnection::where() const {
  return port_.device + ":" + std::to_string(port_.port) + " to rank " + std::to_string(peer_);
}

Status IbConnection::setUp() {
  const Verbs* v = verbs();
  LOOM_ASSIGN_OR_RETURN(device_, Device::open(port_.device));
  const uint32_t perSlot = uint32_t(options_.fifoBytes / kSlots);
  slotBytes_ = std::max<uint32_t>(perSlot / 64 * 64, 64) - kSlotHeaderBytes;
  if (slotBytes_ == 0) slotBytes_ = 64;
  slotStride_ = kSlotHeaderBytes + slotBytes_;
  const size_t fifoBytes = size_t(slotStride_) * kSlots;
  const size_t alloc = (fifoBytes + 4095) / 4096 * 4096;
  fifo_ = {static_cast<uint8_t*>(std::aligned_alloc(4096, alloc)), freeAligned};
  stage_ = {static_cast<uint8_t*>(std::aligned_alloc(4096, alloc)), freeAligned};
  if (!fifo_ || !stage_) return systemError("out of memory for the verbs FIFO to rank " + std::to_string(peer_));
  std::memset(fifo_.get(), 0, alloc);
  std::memset(stage_.get(), 0, alloc);
  // A child forked later gets none of these pages, so copy-on-write never
  // moves them from under the adapter (kernels before 5.13).
  ::madvise(fifo_.get(), alloc, MADV_DONTFORK);
  ::madvise(stage_.get(), alloc, MADV_DONTFORK);
  fifoMr_ = regMemory(*v, device_->pd(), fifo_.get(), fifoBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!fifoMr_) return systemErrno("registering the verbs receive FIFO on " + where(), errno);
  stageMr_ = regMemory(*v, device_->pd(), stage_.get(), fifoBytes, IBV_ACCESS_LOCAL_WRITE);
  if (!stageMr_) return systemErrno("registering the verbs send staging area on " + where(), errno);

  // Each queue pair: kSlots data writes, kSlots credits and one probe out;
  // as many of the peer's coming in.
  sqDepth_ = int(2 * kSlots + 2);
  rqDepth_ = int(2 * kSlots + 2);
  if (port_.maxQpWr > 0 && port_.maxQpWr < sqDepth_) {
    return systemError("verbs device " + port_.device + " takes at most " + std::to_string(port_.maxQpWr) +
                       " work requests per queue, loom needs " + std::to_string(sqDepth_));
  }
  channel_ = v->createCompChannel(device_->context());
  if (!channel_) return systemErrno("creating a verbs completion channel on " + where(), errno);
  const int flags = ::fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return systemErrno("making the completion channel non-blocking on " + where(), errno);
  const int cqe = options_.qps * (sqDepth_ + rqDepth_);
  cq_ = v->createCq(device_->context(), cqe, nullptr, channel_, 0);
  if (!cq_) return systemErrno("creating a verbs completion queue of " + std::to_string(cqe) + " entries on " + where(), errno);

  std::mt19937 rng(std::random_device{}());
  local_.psn = rng() & 0xffffffu;
  for (int i = 0; i < options_.qps; ++i) {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = uint32_t(sqDepth_);
    init.cap.max_recv_wr = uint32_t(rqDepth_);
    init.cap.max_send_sge = 2;  // a zero-copy piece: header + payload
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = v->createQp(device_->pd(), &init);
    if (!qp) return systemErrno("creating a verbs queue pair on " + where(), errno);
    qps_.push_back(qp);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = uint8_t(port_.port);
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (int rc = v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return systemErrno("moving a verbs queue pair to INIT on " + where(), rc);
    local_.qpns.push_back(qp->qp_num);
  }
  sqUsed_.assign(qps_.size(), 0);
  for (size_t q = 0; q < qps_.size(); ++q) nextPiece_.push_back(q);
  slotOwner_.fill(kNoOwner);
  for (int i = 0; i < int(qps_.size()); ++i) LOOM_TRY(postRecv(i, rqDepth_));
  local_.lid = port_.lid;
  std::memcpy(local_.gid, port_.gid.raw, sizeof local_.gid);
  local_.mtu = uint8_t(port_.activeMtu);
  local_.ethernet = port_.ethernet ? 1 : 0;
  local_.fifoAddr = reinterpret_cast<uintptr_t>(fifo_.get());
  local_.fifoRkey = fifoMr_->rkey;
  local_.slots = kSlots;
  local_.slotStride = slotStride_;
  local_.device = port_.device + ":" + std::to_string(port_.port);
  return Status::ok();
}

IbConnection::~IbConnection() {
  const Verbs* v = verbs();
  if (!v) return;
  for (ibv_qp* qp : qps_) {
    if (device_) device_->forget(qp);
    v->destroyQp(qp);
  }
  if (cq_) {
    takeEvents();  // every event must be acknowledged before the queue goes
    v->destroyCq(cq_);
  }
  if (channel_) v->destroyCompChannel(channel_);
  if (copyStream_) device::api()->destroyStream(copyStream_);
  if (fifoMr_) v->deregMr(fifoMr_);
  if (stageMr_) v->deregMr(stageMr_);
}

Status IbConnection::attach(const IbEndpoint& peer) {
  if (peer.qpns.size() != qps_.size()) {
    return invalidUsage("rank " + std::to_string(peer_) + " uses " + std::to_string(peer.qpns.size()) +
                        " queue pairs per verbs connection, this rank " + std::to_string(qps_.size()) +
                        " (set NCCL_IB_QPS_PER_CONNECTION alike on every rank)");
  }
  if (bool(peer.ethernet) != port_.ethernet) {
    return remoteError("rank " + std::to_string(peer_) + "'s verbs port " + peer.device + " is " +
                       (peer.ethernet ? "RoCE" : "InfiniBand") + ", this rank's " + local_.device + " is not");
  }
  const Verbs* v = verbs();
  remote_ = peer;
  const auto mtu = ibv_mtu(std::min<int>(peer.mtu, int(port_.activeMtu)));
  for (size_t i = 0; i < qps_.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer.qpns[i];
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = uint8_t(port_.port);
    a.ah_attr.dlid = peer.lid;
    a.ah_attr.sl = uint8_t(options_.serviceLevel);
    if (port_.ethernet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.traffic_class = uint8_t(options_.trafficClass);
      std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, sizeof peer.gid);
      a.ah_attr.grh.sgid_index = uint8_t(port_.gidIndex);
      a.ah_attr.grh.hop_limit = 255;
    }
    int rc = v->modifyQp(qps_[i], &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc) {
      return systemErrno("connecting verbs queue pair " + std::to_string(qps_[i]->qp_num) + " on " + where() +
                             " (to RTR; GID index " + std::to_string(port_.gidIndex) + ")",
                         rc);
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = uint8_t(options_.timeout);
    a.retry_cnt = uint8_t(options_.retryCount);
    a.rnr_retry = 7;
    a.sq_psn = local_.psn;
    a.max_rd_atomic = 1;
    rc = v->modifyQp(qps_[i], &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc) return systemErrno("connecting verbs queue pair on " + where() + " (to RTS)", rc);
  }
  attached_ = true;
  lastHeard_ = Clock::now();
  // The class of service as the device holds it (what NCCL_IB_SL and
  // NCCL_IB_TC asked for, where it took them).
  ibv_qp_attr held{};
  ibv_qp_init_attr init{};
  std::string service = "service level ?, traffic class ?";
  if (v->queryQp(qps_[0], &held, IBV_QP_AV, &init) == 0) {
    service = "service level " + std::to_string(held.ah_attr.sl) + ", traffic class " +
              (port_.ethernet ? std::to_string(held.ah_attr.grh.traffic_class) : std::string("none (InfiniBand)"));
  }
  LOOM_INFO(log::kNet, "verbs connection %s ready: %zu queue pair(s), MTU code %d, %s, FIFO %u x %u bytes",
            where().c_str(), qps_.size(), int(mtu), service.c_str(), kSlots, slotStride_);
  return Status::ok();
}

Result<std::unique_ptr<Region>> IbConnection::registerMemory(void* base, size_t bytes, MemoryType memory) {
  if (base == nullptr || bytes == 0) return invalidArgument("registering an empty buffer");
  if (!moves(memory)) return invalidUsage(std::string("the verbs connection cannot move ") + memoryTypeName(memory) + " memory");
  if (memory == MemoryType::kDevice) {
    // GPUDirect (untested): the pages holding the buffer, exported as a
    // dma-buf. Where that fails the buffer still moves, through copies.
    device::Api* api = device::api();
    const uintptr_t page = 4096;
    const uintptr_t from = reinterpret_cast<uintptr_t>(base) / page * page;
    const uintptr_t to = (reinterpret_cast<uintptr_t>(base) + bytes + page - 1) / page * page;
    auto fd = api->dmabufFd(reinterpret_cast<void*>(from), to - from);
    if (!fd.isOk()) {
      LOOM_INFO(log::kNet, "verbs %s: device buffer not registered, it moves through copies: %s", where().c_str(),
                fd.status().message().c_str());
      return std::make_unique<Region>(base, bytes, memory);
    }
    ibv_mr* mr = verbs()->regDmabufMr(device_->pd(), 0, to - from, from, fd.value(), accessFlags(*verbs(), 0));
    const int err = errno;
    ::close(fd.value());
    if (!mr) return systemErrno("registering device memory with verbs (GPUDirect) on " + where(), err);
    return std::unique_ptr<Region>(new IbRegion(base, bytes, memory, this, device_, mr));
  }
  // Sends only read it: no access flags, so read-only memory registers too.
  ibv_mr* mr = regMemory(*verbs(), device_->pd(), base, bytes, 0);
  if (!mr) return systemErrno("registering " + std::to_string(bytes) + " bytes with verbs on " + where(), errno);
  return std::unique_ptr<Region>(new IbRegion(base, bytes, memory, this, device_, mr));
}

Status IbConnection::fail(Status s) {
  if (error_.isOk()) error_ = std::move(s);
  return error_;
}

Status IbConnection::queueSend(Transfer* t) {
  if (!error_.isOk()) return error_;
  sends_.push(t);
  return Status::ok();
}

Status IbConnection::queueRecv(Transfer* t) {
  if (!error_.isOk()) return error_;
  recvs_.push(t);
  return Status::ok();
}

bool IbConnection::idle() const {
  for (int used : sqUsed_)
    if (used) return false;
  return sends_.empty() && inFlight_.empty() && recvs_.empty() && freedReported_ == slotsTaken_;
}

void IbConnection::pollFds(std::vector<pollfd>* fds) const {
  if (channel_) fds->push_back({channel_->fd, POLLIN, 0});
}

Status IbConnection::postRecv(int qp, int count) {
  for (int i = 0; i < count; ++i) {
    ibv_recv_wr wr{};
    wr.wr_id = wrId(kRecv, qp, 0);
    wr.sg_list = nullptr;  // a write-with-immediate places nothing here
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qps_[size_t(qp)], &wr, &bad))
      return fail(systemErrno("posting a verbs receive on " + where(), rc));
  }
  return Status::ok();
}

Status IbConnection::postWrite(int qp, uint64_t id, uint32_t slot, uint32_t length, bool withImm, uint32_t imm,
                               const ibv_sge* payload) {
  ibv_sge sge[2]{};
  sge[0].addr = reinterpret_cast<uintptr_t>(stage_.get()) + uint64_t(slot) * slotStride_;
  sge[0].length = length;
  sge[0].lkey = stageMr_->lkey;
  if (payload) sge[1] = *payload;
  ibv_send_wr wr{};
  wr.wr_id = id;
  wr.sg_list = length ? sge : nullptr;
  wr.num_sge = length ? (payload ? 2 : 1) : 0;
  wr.opcode = withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote_.fifoAddr + uint64_t(slot) * slotStride_;
  wr.wr.rdma.rkey = remote_.fifoRkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qps_[size_t(qp)], &wr, &bad))
    return fail(systemErrno("posting a verbs write on " + where(), rc));
  ++sqUsed_[size_t(qp)];
  return Status::ok();
}

Status IbConnection::pollCompletions(int* seen) {
  *seen = 0;
  ibv_wc wc[16];
  for (;;) {
    const int n = ibv_poll_cq(cq_, 16, wc);
    if (n < 0) return fail(systemError("polling the verbs completion queue on " + where() + " failed"));
    if (n == 0) return Status::ok();
    *seen += n;
    // The cause, not its echo: a failure flushes the requests behind it,
    // which may come first in the batch.
    int cause = -1;
    for (int i = 0; i < n; ++i) {
      if (wc[i].status == IBV_WC_SUCCESS) continue;
      if (cause < 0 || (wc[cause].status == IBV_WC_WR_FLUSH_ERR && wc[i].status != IBV_WC_WR_FLUSH_ERR)) cause = i;
    }
    if (cause > 0) std::swap(wc[0], wc[cause]);
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      const WrKind kind = wrKind(c.wr_id);
      const int qp = wrQp(c.wr_id);
      if (c.status != IBV_WC_SUCCESS) {
        const char* what = kind == kRecv ? "a receive" : kind == kData ? "a data write" : kind == kCredit ? "a credit write" : "a liveness probe";
        std::string text = what + std::string(" on verbs ") + where() + " failed: " + wcStatusText(c.status) +
                           ", vendor error " + std::to_string(c.vendor_err);
        // A port that went down or a queue pair in error is the cause the
        // device reports on its own, maybe a moment after the completion:
        // name it first. (A failure path: waiting 50 ms here costs nothing.)
        Status cause = device_->pollEvents(port_.port, qps_);
        for (int wait = 0; wait < 10 && cause.isOk(); ++wait) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          cause = device_->pollEvents(port_.port, qps_);
        }
        if (!cause.isOk()) {
          text = cause.message() + "; " + text;
        } else if (c.status == IBV_WC_RETRY_EXC_ERR || c.status == IBV_WC_RNR_RETRY_EXC_ERR) {
          text += "; rank " + std::to_string(peer_) + " stopped answering (its process died, or the link is down)";
        }
        return fail(remoteError(text));
      }
      if (qp >= int(qps_.size())) return fail(internalError("verbs completion for an unknown queue pair on " + where()));
      if (kind == kRecv) {
        lastHeard_ = Clock::now();
        if (!(c.wc_flags & IBV_WC_WITH_IMM)) {
          return fail(remoteError("rank " + std::to_string(peer_) + " sent a verbs message without immediate data on " + where()));
        }
        const uint32_t imm = ntohl(c.imm_data);
        LOOM_TRY(postRecv(qp, 1));
        if (imm & kCreditFlag) {
          const uint32_t freed = imm & kCountMask;
          const uint32_t outstanding = (piecesSent_ - peerFreed_) & kCountMask;
          if (((freed - peerFreed_) & kCountMask) > outstanding) {
            return fail(remoteError("rank " + std::to_string(peer_) + " returned more verbs credits than it was owed on " + where()));
          }
          peerFreed_ = freed;
        } else {
          // Piece i goes over queue pair i % n into slot i % kSlots, and each
          // queue pair delivers in order: the slot its next piece takes.
          const bool outOfTurn = imm != nextPiece_[size_t(qp)] % kSlots;
          if (imm >= kSlots || arrived_[imm] || outOfTurn) {
            return fail(remoteError("rank " + std::to_string(peer_) + " wrote into verbs FIFO slot " + std::to_string(imm) +
                                    " out of turn on " + where()));
          }
          arrived_[imm] = true;
          nextPiece_[size_t(qp)] += qps_.size();
        }
      } else {
        --sqUsed_[size_t(qp)];
        if (kind == kData) {
          const uint32_t slot = wrSlot(c.wr_id) % kSlots;
          stageBusy_[slot] = false;
          if (slotOwner_[slot] != kNoOwner) {
            const uint64_t at = slotOwner_[slot] - retiredSends_;
            slotOwner_[slot] = kNoOwner;
            if (at >= inFlight_.size() || inFlight_[at].unfinished == 0)
              return fail(internalError("verbs send bookkeeping went wrong on " + where()));
            --inFlight_[at].unfinished;
          }
        }
        if (kind == kProbe) probing_ = false;
      }
    }
  }
}

Status IbConnection::receive() {
  while (!recvs_.empty()) {
    const uint32_t slot = slotsTaken_ % kSlots;
    if (!arrived_[slot]) return Status::ok();
    Transfer* t = recvs_.front();
    const uint8_t* at = fifo_.get() + size_t(slot) * slotStride_;
    SlotHeader h;
    std::memcpy(&h, at, sizeof h);
    const bool valid = h.magic == kSlotMagic && h.slot == slot && h.pieceBytes <= slotBytes_ &&
                       h.offset <= h.totalBytes && h.pieceBytes <= h.totalBytes - h.offset;
    if (!valid) {
      return fail(remoteError("rank " + std::to_string(peer_) + " wrote a malformed verbs FIFO slot on " + where()));
    }
    if (h.seq != uint32_t(recvSeq_) || h.totalBytes != t->bytes || h.offset != t->progressed ||
        (h.pieceBytes == 0 && h.totalBytes != 0)) {
      return fail(remoteError("rank " + std::to_string(peer_) + " sent a message of " + std::to_string(h.totalBytes) +
                              " bytes where this rank posted a receive of " + std::to_string(t->bytes) +
                              " bytes (message " + std::to_string(recvSeq_) + " on verbs " + where() +
                              "; mismatched sizes or call orders)"));
    }
    if (h.pieceBytes) LOOM_TRY(copyOut(t, h.offset, at + kSlotHeaderBytes, h.pieceBytes));
    t->progressed += h.pieceBytes;
    arrived_[slot] = false;
    slotsTaken_ = (slotsTaken_ + 1) & kCountMask;
    if (t->progressed == t->bytes) {
      t->done = true;
      recvs_.pop();
      ++recvSeq_;
    }
  }
  return Status::ok();
}

Status IbConnection::copyOut(Transfer* t, size_t offset, const uint8_t* from, size_t n) {
  uint8_t* to = static_cast<uint8_t*>(t->data) + offset;
  if (t->memory != MemoryType::kDevice) {
    std::memcpy(to, from, n);
    return Status::ok();
  }
  return deviceCopy(to, from, n);
}

Status IbConnection::copyIn(const Transfer* t, size_t offset, uint8_t* to, size_t n) {
  const uint8_t* from = static_cast<const uint8_t*>(t->data) + offset;
  if (t->memory != MemoryType::kDevice) {
    std::memcpy(to, from, n);
    return Status::ok();
  }
  return deviceCopy(to, from, n);
}

// GPUDirect only (untested): a copy between device memory and the FIFO or
// the staging slots, finished before it returns.
Status IbConnection::deviceCopy(void* to, const void* from, size_t n) {
  device::Api* api = device::api();
  if (!copyStream_) {
    auto stream = api->createStream();
    if (!stream.isOk()) return fail(stream.takeStatus().addContext("GPUDirect on verbs " + where()));
    copyStream_ = stream.value();
  }
  Status s = api->copyAsync(to, from, n, copyStream_);
  if (s.isOk()) s = api->synchronize(copyStream_);
  if (!s.isOk()) return fail(s.addContext("copying between device and host memory on verbs " + where()));
  return Status::ok();
}

Status IbConnection::returnCredits() {
  if (freedReported_ == slotsTaken_) return Status::ok();
  // Credits go on the first queue pair. Counts are cumulative: when its
  // send queue is full, the next credit message says it all.
  if (sqUsed_[0] >= sqDepth_ - 1) return Status::ok();
  LOOM_TRY(postWrite(0, wrId(kCredit, 0, 0), 0, 0, true, kCreditFlag | slotsTaken_));
  freedReported_ = slotsTaken_;
  return Status::ok();
}

Status IbConnection::send() {
  while (!sends_.empty()) {
    Transfer* t = sends_.front();
    const uint32_t slot = uint32_t(piecesPosted_ % kSlots);
    const int qp = int(piecesPosted_ % qps_.size());
    const uint32_t outstanding = (piecesSent_ - peerFreed_) & kCountMask;
    if (outstanding >= kSlots || stageBusy_[slot] || sqUsed_[size_t(qp)] >= sqDepth_ - 2) break;
    // A buffer this connection registered is written from where it is.
    const auto* region = dynamic_cast<const IbRegion*>(t->region);
    if (region && region->owner() != this) region = nullptr;
    // Every send is done once its writes completed, that is once the peer
    // acknowledged them: a rank that returns from its last send and
    // destroys the communicator at once loses nothing still queued.
    if (sendOffset_ == 0) inFlight_.push(InFlight{t, 0, false});
    const size_t piece = std::min<size_t>(slotBytes_, t->bytes - sendOffset_);
    uint8_t* at = stage_.get() + size_t(slot) * slotStride_;
    SlotHeader h{};
    h.magic = kSlotMagic;
    h.seq = uint32_t(sendSeq_);
    h.totalBytes = t->bytes;
    h.offset = sendOffset_;
    h.pieceBytes = uint32_t(piece);
    h.slot = slot;
    std::memcpy(at, &h, sizeof h);
    const uint8_t* from = static_cast<const uint8_t*>(t->data) + sendOffset_;
    if (region) {
      ibv_sge payload{reinterpret_cast<uintptr_t>(from), uint32_t(piece), region->lkey()};
      LOOM_TRY(postWrite(qp, wrId(kData, qp, slot), slot, kSlotHeaderBytes, true, slot, piece ? &payload : nullptr));
      ++inFlight_.back().unfinished;
      slotOwner_[slot] = retiredSends_ + inFlight_.size() - 1;
    } else {
      if (piece) LOOM_TRY(copyIn(t, sendOffset_, at + kSlotHeaderBytes, piece));
      LOOM_TRY(postWrite(qp, wrId(kData, qp, slot), slot, uint32_t(kSlotHeaderBytes + piece), true, slot));
      ++inFlight_.back().unfinished;
      slotOwner_[slot] = retiredSends_ + inFlight_.size() - 1;
    }
    stageBusy_[slot] = true;
    piecesSent_ = (piecesSent_ + 1) & kCountMask;
    ++piecesPosted_;
    sendOffset_ += piece;
    t->progressed = sendOffset_;
    if (sendOffset_ == t->bytes) {
      sends_.pop();
      ++sendSeq_;
      sendOffset_ = 0;
      inFlight_.back().posted = true;
    }
  }
  retireSends();
  return Status::ok();
}

void IbConnection::retireSends() {
  while (!inFlight_.empty() && inFlight_.front().posted && inFlight_.front().unfinished == 0) {
    inFlight_.front().t->done = true;
    inFlight_.pop();
    ++retiredSends_;
  }
}

// How long a probe may go unanswered: the transport's own retries (4.096 us
// x 2^timeout per try, retry count + 1 tries) and half as much again. Some
// providers (rxe) retry forever at a count of 7, so loom keeps its own
// bound rather than wait for a failed completion.
double IbConnection::probeLimitS() const {
  const double perTry = 4.096e-6 * double(uint64_t(1) << options_.timeout);
  return std::max(2.0, 1.5 * perTry * double(options_.retryCount + 1));
}

Status IbConnection::writeRawForTest(const void* bytes, uint32_t n, uint32_t slot) {
  slot %= kSlots;
  n = std::min(n, slotStride_);
  std::memcpy(stage_.get() + size_t(slot) * slotStride_, bytes, n);
  LOOM_TRY(postWrite(0, wrId(kData, 0, slot), slot, n, true, slot));
  stageBusy_[slot] = true;
  slotOwner_[slot] = kNoOwner;
  piecesSent_ = (piecesSent_ + 1) & kCountMask;
  ++piecesPosted_;
  return Status::ok();
}

// A peer that died answers nothing: while this side waits on it, a
// zero-byte write now and then makes the queue pair find out (it fails
// after the transport's retries).
Status IbConnection::probe() {
  if (probing_ && secondsSince(probeSentAt_) > probeLimitS()) {
    char text[64];
    std::snprintf(text, sizeof text, "%.1f s", probeLimitS());
    return fail(remoteError("rank " + std::to_string(peer_) + " stopped answering on verbs " + where() +
                            ": a liveness probe had no acknowledgement after " + text + " (NCCL_IB_TIMEOUT=" +
                            std::to_string(options_.timeout) + ", NCCL_IB_RETRY_CNT=" +
                            std::to_string(options_.retryCount) + "); its process died or the link is down"));
  }
  if (probing_ || (recvs_.empty() && sends_.empty() && inFlight_.empty())) return Status::ok();
  if (secondsSince(lastHeard_) < options_.probeAfterS) return Status::ok();
  if (sqUsed_[0] >= sqDepth_ - 1) return Status::ok();
  LOOM_TRY(postWrite(0, wrId(kProbe, 0, 0), 0, 0, false, 0));
  probing_ = true;
  probeSentAt_ = lastHeard_ = Clock::now();
  return Status::ok();
}

int IbConnection::takeEvents() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  int got = 0;
  while (verbs()->getCqEvent(channel_, &cq, &context) == 0) ++got;
  if (got) verbs()->ackCqEvents(cq_, unsigned(got));
  return got;
}

Status IbConnection::arm() {
  if (int rc = ibv_req_notify_cq(cq_, 0)) return fail(systemErrno("arming the verbs completion queue on " + where(), rc));
  armed_ = true;
  completedSinceArm_ = false;
  return Status::ok();
}

Status IbConnection::progress() {
  if (!error_.isOk()) return error_;
  if (!attached_) return Status::ok();
  const auto now = Clock::now();
  if (now >= nextEventCheck_) {
    nextEventCheck_ = now + std::chrono::milliseconds(50);
    if (Status s = device_->pollEvents(port_.port, qps_); !s.isOk()) {
      return fail(s.addContext("verbs " + where()));
    }
  }
  for (int round = 0; round < 64; ++round) {
    // A completion came after arming, so the channel has (or is about to
    // have) an event: take it, so the fd goes quiet, and arm again below.
    if (armed_ && completedSinceArm_ && takeEvents() > 0) armed_ = false;
    int seen = 0;
    LOOM_TRY(pollCompletions(&seen));
    if (seen && armed_) completedSinceArm_ = true;
    LOOM_TRY(receive());
    LOOM_TRY(returnCredits());
    LOOM_TRY(send());
    LOOM_TRY(probe());
    if (seen) continue;
    if (armed_) return Status::ok();
    // Nothing came: arm, then look once more (a completion that landed
    // before arming raises no event).
    LOOM_TRY(arm());
  }
  // Completions kept coming: arm now and take what came before arming, so
  // that a waiter blocking next wakes on anything later.
  if (!armed_) {
    LOOM_TRY(arm());
    int seen = 0;
    LOOM_TRY(pollCompletions(&seen));
    if (seen) completedSinceArm_ = true;
    LOOM_TRY(receive());
    LOOM_TRY(returnCredits());
    LOOM_TRY(send());
  }
  return Status::ok();
}

}  // namespace loom::transport::ib
