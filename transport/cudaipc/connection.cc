#include "transport/cudaipc/connection.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "common/log.h"
#include "transport/shm/endpoint.h"

namespace loom::transport::cudaipc {
namespace {

constexpr uint32_t kPiece = 1;
constexpr uint32_t kFree = 2;
constexpr uint32_t kPull = 3;
constexpr uint32_t kPulled = 4;
constexpr uint32_t kDeclined = 5;  // a kPull the receiver will not copy from: send it as pieces
constexpr size_t kControlRecvs = 2 * kSlots + 2;  // control receives kept posted
constexpr size_t kProbeBytes = 64;

std::string rankName(int peer) { return "rank " + std::to_string(peer); }

}  // namespace

// An inbox's device memory, freed with the last reference.
struct CudaIpcConnection::Inbox {
  Inbox(device::Api* api, void* base) : api(api), base(base) {}
  ~Inbox() { api->freeDevice(base); }
  device::Api* const api;
  void* const base;
};

// Registered device memory: where the peer finds it.
class CudaIpcConnection::PeerReadable final : public Region {
 public:
  PeerReadable(void* base, size_t bytes, void* allocation, const device::IpcHandle& handle)
      : Region(base, bytes, MemoryType::kDevice), allocation(allocation), handle(handle) {}
  void* const allocation;
  const device::IpcHandle handle;
};

namespace {

// The inboxes of this process by address, for peers in the same process.
struct LocalInboxes {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<void>> byAddress;
};
LocalInboxes& localInboxes() {
  static LocalInboxes* l = new LocalInboxes;  // used by destructors of static objects too
  return *l;
}

}  // namespace

uint64_t processNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd() ^ 1;
  }();
  return nonce;
}

CudaIpcConnection::CudaIpcConnection(int peerRank, device::Api* api) : peer_(peerRank), api_(api) {}

Result<std::unique_ptr<CudaIpcConnection>> CudaIpcConnection::create(int peerRank, device::Api* api,
                                                                     size_t slotBytes) {
  if (!api) return invalidUsage("the CUDA IPC transport needs a CUDA device");
  slotBytes = std::max<size_t>(4096, (slotBytes + 4095) / 4096 * 4096);
  std::unique_ptr<CudaIpcConnection> c(new CudaIpcConnection(peerRank, api));
  c->slotBytes_ = slotBytes;
  LOOM_ASSIGN_OR_RETURN(c->device_, api->currentDevice());
  LOOM_ASSIGN_OR_RETURN(void* base, api->allocDevice(slotBytes * kSlots));
  c->inbox_ = std::make_shared<Inbox>(api, base);
  LOOM_ASSIGN_OR_RETURN(c->local_.handle, api->ipcHandle(base));
  LOOM_ASSIGN_OR_RETURN(c->stream_, api->createStream());
  c->local_.processNonce = processNonce();
  c->local_.address = reinterpret_cast<uint64_t>(base);
  {
    std::lock_guard<std::mutex> lock(localInboxes().mutex);
    localInboxes().byAddress[c->local_.address] = c->inbox_;
  }
  c->local_.slotBytes = slotBytes;
  c->local_.slots = kSlots;
  shm::ShmConnection::Options control;
  control.fifoBytes = shm::kSlots * shm::kMinSlotBytes;
  control.singleCopyMin = 0;  // small messages only: never read the peer's memory
  LOOM_ASSIGN_OR_RETURN(c->control_, shm::ShmConnection::create(peerRank, control));
  shm::writeEndpoint(c->control_->local(), &c->local_.control);
  c->ready_ = net::UniqueFd(::eventfd(1, EFD_CLOEXEC));
  if (!c->ready_) return systemError("eventfd for the CUDA IPC connection: " + errnoText(errno));
  return c;
}

CudaIpcConnection::~CudaIpcConnection() {
  // Copies this side queued touch both inboxes: let them finish first
  // (they wait on nothing the peer controls).
  if (stream_) {
    (void)api_->synchronize(stream_);
    api_->destroyStream(stream_);
  }
  for (device::Event e : allEvents_) api_->destroyEvent(e);
  if (peerMapped_) api_->ipcClose(peerInbox_);
  for (auto& [handle, mapped] : peerBuffers_)
    if (mapped) api_->ipcClose(mapped);
  if (inbox_) {
    std::lock_guard<std::mutex> lock(localInboxes().mutex);
    localInboxes().byAddress.erase(local_.address);
  }
}

Result<std::unique_ptr<Region>> CudaIpcConnection::registerMemory(void* base, size_t bytes, MemoryType memory) {
  if (memory != MemoryType::kDevice) return Connection::registerMemory(base, bytes, memory);
  if (base == nullptr || bytes == 0) return invalidArgument("registering an empty buffer");
  LOOM_ASSIGN_OR_RETURN(device::Api::Range range, api_->addressRange(base));
  const auto* b = static_cast<const std::byte*>(base);
  const auto* a = static_cast<const std::byte*>(range.base);
  if (b < a || size_t(b - a) + bytes > range.bytes) {
    return invalidArgument("the registered buffer spans more than one device allocation");
  }
  auto handle = api_->ipcHandle(range.base);
  if (!handle.isOk()) {
    // Memory CUDA IPC cannot export (cudaMallocAsync pools, cuMem* virtual
    // memory such as PyTorch's expandable segments): it stays usable,
    // through the inbox, as if it were not registered.
    LOOM_INFO(log::kP2p, "a registered buffer of %zu bytes cannot be shared with %s through CUDA IPC (%s): its "
              "messages go through the inbox", bytes, rankName(peer_).c_str(), handle.status().message().c_str());
    return Connection::registerMemory(base, bytes, memory);
  }
  return std::unique_ptr<Region>(new PeerReadable(base, bytes, range.base, handle.value()));
}

Status CudaIpcConnection::attach(const Descriptor& peer) {
  if (attached_) return internalError("CUDA IPC connection attached twice");
  if (peer.slots != kSlots || peer.slotBytes == 0 || peer.slotBytes > (uint64_t(1) << 30) ||
      peer.slotBytes % 4096 != 0) {
    return remoteError(rankName(peer_) + " sent a CUDA IPC endpoint with " + std::to_string(peer.slots) +
                       " slots of " + std::to_string(peer.slotBytes) + " bytes (different loom versions?)");
  }
  LOOM_ASSIGN_OR_RETURN(shm::ShmDescriptor control, shm::readEndpoint(peer.control));
  if (peer.processNonce == processNonce()) {
    // The same process: the inbox itself, shared.
    {
      std::lock_guard<std::mutex> lock(localInboxes().mutex);
      auto it = localInboxes().byAddress.find(peer.address);
      if (it != localInboxes().byAddress.end()) peerShared_ = std::static_pointer_cast<Inbox>(it->second.lock());
    }
    if (!peerShared_) return remoteError(rankName(peer_) + "'s CUDA IPC inbox is gone (it left the communicator)");
    peerInbox_ = peerShared_->base;
  } else {
    auto mapped = api_->ipcOpen(peer.handle);
    if (!mapped.isOk()) return mapped.takeStatus().addContext("mapping " + rankName(peer_) + "'s inbox");
    peerInbox_ = mapped.value();
    peerMapped_ = true;
  }
  slotBytes_ = std::min<uint64_t>(slotBytes_, peer.slotBytes);  // each side writes only what both hold
  LOOM_TRY(probe());
  LOOM_TRY(control_->attach(control));
  for (size_t i = 0; i < kControlRecvs; ++i) {
    incoming_.emplace_back();
    LOOM_TRY(postControlRecv(incoming_.back()));
  }
  attached_ = true;
  return Status::ok();
}

// Writes a probe into the peer's inbox and reads it back: proves the
// mapping before the pair commits to it.
Status CudaIpcConnection::probe() {
  // Ordinary host memory: freeing pinned memory here (cudaFreeHost) would
  // wait for the whole device, users' streams gated on loom included.
  std::vector<uint8_t> host(2 * kProbeBytes);
  uint8_t* bytes = host.data();
  const uint64_t seed = processNonce() ^ uint64_t(peer_) * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < kProbeBytes; ++i) bytes[i] = uint8_t(seed >> (8 * (i % 8))) ^ uint8_t(i);
  std::memset(bytes + kProbeBytes, 0, kProbeBytes);
  Status s = api_->copyAsync(peerInbox_, bytes, kProbeBytes, stream_);
  if (s.isOk()) s = api_->copyAsync(bytes + kProbeBytes, peerInbox_, kProbeBytes, stream_);
  if (s.isOk()) s = api_->synchronize(stream_);
  if (s.isOk() && std::memcmp(bytes, bytes + kProbeBytes, kProbeBytes) != 0) {
    s = Status(Code::kCudaError, "bytes written into " + rankName(peer_) + "'s inbox read back different");
  }
  return s.isOk() ? s : s.addContext("probing the CUDA IPC mapping of " + rankName(peer_) + "'s inbox");
}

Status CudaIpcConnection::fail(Status s) {
  if (error_.isOk()) error_ = s;
  return error_;
}

Result<device::Event> CudaIpcConnection::event() {
  if (!freeEvents_.empty()) {
    device::Event e = freeEvents_.back();
    freeEvents_.pop_back();
    return e;
  }
  LOOM_ASSIGN_OR_RETURN(device::Event e, api_->createEvent());
  allEvents_.push_back(e);
  return e;
}

Status CudaIpcConnection::queueSend(Transfer* t) {
  if (!error_.isOk()) return error_;
  if (!attached_) return invalidUsage("CUDA IPC connection used before attach");
  sends_.push_back(t);
  return Status::ok();
}

Status CudaIpcConnection::queueRecv(Transfer* t) {
  if (!error_.isOk()) return error_;
  if (!attached_) return invalidUsage("CUDA IPC connection used before attach");
  recvs_.push_back(t);
  return Status::ok();
}

Status CudaIpcConnection::postControl(const Control& c) {
  outgoing_.emplace_back();
  Outgoing& o = outgoing_.back();
  o.msg = c;
  o.t.data = &o.msg;
  o.t.bytes = sizeof o.msg;
  return control_->postSend(&o.t);
}

Status CudaIpcConnection::postControlRecv(Incoming& in) {
  in.t = Transfer{};
  in.t.data = &in.msg;
  in.t.bytes = sizeof in.msg;
  return control_->postRecv(&in.t);
}

// Control messages that arrived, in order: announced pieces and freed slots.
Status CudaIpcConnection::takeControl() {
  while (!incoming_.empty() && incoming_.front().t.done) {
    const Control c = incoming_.front().msg;
    incoming_.pop_front();
    if (c.kind == kFree) {
      if (piecesQueued_ - slotsFreed_ == 0 || c.slot != slotsFreed_ % kSlots) {
        return remoteError(rankName(peer_) + " gave back CUDA IPC slot " + std::to_string(c.slot) +
                           " out of turn (different loom versions or a corrupted peer?)");
      }
      ++slotsFreed_;
    } else if (c.kind == kPiece || c.kind == kPull) {
      announced_.push_back(c);
    } else if (c.kind == kPulled || c.kind == kDeclined) {
      if (!pulling_ || sends_.empty() || sends_.front() != pulling_ || c.bytes != pulling_->bytes) {
        return remoteError(rankName(peer_) + " answered a direct copy that was not offered "
                           "(different loom versions or a corrupted peer?)");
      }
      if (c.kind == kPulled) {
        pulling_->progressed = pulling_->bytes;
        pulling_->done = true;
        sends_.pop_front();
      } else {
        declined_ = pulling_;  // moveSends sends it again, as pieces
        --directSends_;
      }
      --sendQueued_;
      pulling_ = nullptr;
    } else {
      return remoteError(rankName(peer_) + " sent an unknown CUDA IPC control message (kind " +
                         std::to_string(c.kind) + ")");
    }
    if (!controlError_.isOk()) continue;  // the peer is gone: nothing more arrives
    incoming_.emplace_back();
    LOOM_TRY(postControlRecv(incoming_.back()));
  }
  return Status::ok();
}

// Queues copies of the next pieces into free slots of the peer's inbox and
// announces those whose copies fired, in order.
Status CudaIpcConnection::moveSends() {
  while (sendQueued_ < sends_.size() && !pulling_) {
    Transfer* t = sends_[sendQueued_];
    const auto* readable = dynamic_cast<const PeerReadable*>(t->region);
    if (readable && t != declined_ && sendOffset_ == 0 && t->bytes >= slotBytes_ &&
        t->memory == MemoryType::kDevice) {
      // Registered: the peer copies it from here (later sends wait).
      Control c{kPull, 0, t->bytes, t->bytes, 0, 0, readable->handle};
      c.address = peerShared_ ? reinterpret_cast<uint64_t>(t->data)
                              : uint64_t(static_cast<const std::byte*>(t->data) -
                                         static_cast<const std::byte*>(readable->allocation));
      sendCopies_.push_back(Copy{nullptr, t, c});
      pulling_ = t;
      ++sendQueued_;
      ++directSends_;
      break;
    }
    if (t->bytes == 0) {
      sendCopies_.push_back(Copy{nullptr, t, Control{kPiece, 0, 0, 0, 0, 0, {}}});
      ++sendQueued_;
      continue;
    }
    if (piecesQueued_ - slotsFreed_ >= kSlots) break;
    const uint32_t slot = uint32_t(piecesQueued_ % kSlots);
    const size_t n = std::min<size_t>(slotBytes_, t->bytes - sendOffset_);
    LOOM_ASSIGN_OR_RETURN(device::Event e, event());
    auto* dst = static_cast<std::byte*>(peerInbox_) + size_t(slot) * slotBytes_;
    LOOM_TRY(api_->copyAsync(dst, static_cast<const std::byte*>(t->data) + sendOffset_, n, stream_));
    LOOM_TRY(api_->recordEvent(e, stream_));
    sendCopies_.push_back(Copy{e, t, Control{kPiece, slot, n, t->bytes, sendOffset_, 0, {}}});
    ++piecesQueued_;
    sendOffset_ += n;
    if (sendOffset_ == t->bytes) {
      sendOffset_ = 0;
      ++sendQueued_;
    }
  }
  while (!sendCopies_.empty()) {
    Copy& c = sendCopies_.front();
    if (c.event) {
      LOOM_ASSIGN_OR_RETURN(bool fired, api_->eventDone(c.event));
      if (!fired) break;
      freeEvents_.push_back(c.event);
    }
    LOOM_TRY(postControl(c.piece));
    if (c.piece.kind == kPull) {  // done when the peer has copied it
      sendCopies_.pop_front();
      continue;
    }
    Transfer* t = c.t;
    t->progressed = c.piece.offset + c.piece.bytes;
    sendCopies_.pop_front();
    if (t->progressed == t->bytes) {
      t->done = true;
      if (t == declined_) declined_ = nullptr;  // the Transfer may carry a later send
      sends_.pop_front();  // sends finish in order: it is the front
      --sendQueued_;
    }
  }
  return Status::ok();
}

// Copies announced pieces out of this side's inbox into the posted
// receives, and gives each slot back once its copy fired.
Status CudaIpcConnection::moveRecvs() {
  size_t queued = 0;  // receives before this index have all their pieces queued
  for (const Copy& c : recvCopies_)
    if (c.piece.offset + c.piece.bytes == c.piece.total) ++queued;
  while (!announced_.empty() && queued < recvs_.size()) {
    Transfer* t = recvs_[queued];
    const Control p = announced_.front();
    if (p.total != t->bytes) {
      return remoteError(rankName(peer_) + " sent a " + std::to_string(p.total) + "-byte message where a " +
                         std::to_string(t->bytes) + "-byte receive was posted (mismatched calls on the two ranks)");
    }
    if (p.kind == kPull) {
      if (recvOffset_ != 0 || p.bytes != p.total) {
        return remoteError(rankName(peer_) + " offered a direct copy out of order (different loom versions?)");
      }
      // Copied, never handed to a sink: the peer's buffer may be on another
      // GPU of this process, which a kernel here may not reach.
      LOOM_ASSIGN_OR_RETURN(const std::byte* src, pullSource(p));
      if (!src) {
        // Not mapped, and not to be mapped now: the peer sends it through
        // the inbox instead (its pieces follow for the same receive).
        ++declinedPulls_;
        if (controlError_.isOk()) LOOM_TRY(postControl(Control{kDeclined, 0, p.bytes, p.total, 0, 0, {}}));
        announced_.pop_front();
        continue;
      }
      LOOM_ASSIGN_OR_RETURN(device::Event e, event());
      LOOM_TRY(api_->copyAsync(t->data, src, p.bytes, stream_));
      LOOM_TRY(api_->recordEvent(e, stream_));
      recvCopies_.push_back(Copy{e, t, p});
      announced_.pop_front();
      ++queued;
      continue;
    }
    if (p.offset != recvOffset_ || p.bytes > slotBytes_ || p.offset + p.bytes > p.total ||
        (p.bytes > 0 && p.slot != (slotsReceived_ % kSlots))) {
      return remoteError(rankName(peer_) + " announced a CUDA IPC piece out of order (different loom versions?)");
    }
    device::Event e = nullptr;
    const auto* src = static_cast<const std::byte*>(inbox_->base) + size_t(p.slot) * slotBytes_;
    // Held pieces keep their slots until the whole receive is released: only
    // a receive that fits the inbox can be held, else the sender stalls.
    if (p.bytes > 0 && t->sink && t->hold && t->bytes <= uint64_t(kSlots) * slotBytes_) {
      sinkPiece(t, p, src);
      ++slotsReceived_;
    } else {
      if (p.bytes > 0) {
        LOOM_ASSIGN_OR_RETURN(e, event());
        LOOM_TRY(api_->copyAsync(static_cast<std::byte*>(t->data) + p.offset, src, p.bytes, stream_));
        LOOM_TRY(api_->recordEvent(e, stream_));
        ++slotsReceived_;
      }
      recvCopies_.push_back(Copy{e, t, p});
    }
    announced_.pop_front();
    recvOffset_ += size_t(p.bytes);
    if (recvOffset_ == t->bytes) {
      recvOffset_ = 0;
      ++queued;
    }
  }
  // In order: slots go back to the peer in the order it filled them.
  while (!recvCopies_.empty()) {
    Copy& c = recvCopies_.front();
    if (c.held && !c.released) break;
    if (c.event) {
      LOOM_ASSIGN_OR_RETURN(bool fired, api_->eventDone(c.event));
      if (!fired) break;
      freeEvents_.push_back(c.event);
    }
    if (c.event || c.held) {
      const Control done{c.piece.kind == kPull ? kPulled : kFree, c.piece.slot, c.piece.bytes, 0, 0, 0, {}};
      if (controlError_.isOk()) LOOM_TRY(postControl(done));
    }
    Transfer* t = c.t;
    const bool last = c.piece.offset + c.piece.bytes == c.piece.total;
    const bool held = c.held;
    if (!held) t->progressed = c.piece.offset + c.piece.bytes;
    recvCopies_.pop_front();  // `c` is gone from here on
    if (last) {
      // A held receive was done when its last piece was handed over; its
      // Transfer may already carry the caller's next receive.
      if (!held) t->done = true;
      recvs_.pop_front();
    }
  }
  return Status::ok();
}

// Hands a piece to the receive's sink where it lies; its slot stays taken
// until release(t). The receive is done once all its pieces were handed.
void CudaIpcConnection::sinkPiece(Transfer* t, const Control& p, const std::byte* where) {
  t->sink->consume(size_t(p.offset), where, size_t(p.bytes));
  t->sunk = true;
  t->progressed = p.offset + p.bytes;
  if (t->progressed == t->bytes) t->done = true;
  Copy c{nullptr, t, p};
  c.held = true;
  recvCopies_.push_back(c);
  ++piecesSunk_;
}

Status CudaIpcConnection::release(Transfer* t) {
  // The oldest held message of `t` (its Transfer may be reused later).
  bool any = false;
  for (Copy& c : recvCopies_) {
    if (c.t != t || !c.held || c.released) continue;
    c.released = true;
    any = true;
    if (c.piece.offset + c.piece.bytes == c.piece.total) break;
  }
  // Give the slots back now: the caller may be done with this connection
  // for a while (the operation's last step), and the peer waits for them.
  return any ? progress() : error_;
}

// The control connection keeps receives posted at all times, so a peer
// that closes it after its last message (a normal end) makes it fail: that
// only matters when this side still needs the peer. Pieces already
// announced are still delivered: their bytes are in this side's inbox.
// Where a kPull's bytes are in this process: the address itself between
// ranks of one process, else the peer's allocation, mapped once.
// Null when it is not mapped and deferMaps_ says not now (prepare() will),
// or when mapping it failed before.
Result<const std::byte*> CudaIpcConnection::pullSource(const Control& c) {
  if (peerShared_) return reinterpret_cast<const std::byte*>(c.address);
  std::lock_guard<std::mutex> lock(mapMutex_);
  auto it = peerBuffers_.find(c.handle);
  if (it == peerBuffers_.end()) {
    if (deferMaps_) {
      if (std::find(wanted_.begin(), wanted_.end(), c.handle) == wanted_.end()) {
        LOOM_INFO(log::kP2p, "%s offered a direct copy from a buffer not mapped here: it comes through the inbox, "
                  "and the buffer is mapped at this rank's next call",
                  rankName(peer_).c_str());
        wanted_.push_back(c.handle);
      }
      anyWanted_.store(true, std::memory_order_release);
      return nullptr;
    }
    auto mapped = api_->ipcOpen(c.handle);
    if (!mapped.isOk()) return mapped.takeStatus().addContext("mapping " + rankName(peer_) + "'s registered buffer");
    it = peerBuffers_.emplace(c.handle, mapped.value()).first;
  }
  return it->second ? static_cast<const std::byte*>(it->second) + c.address : nullptr;
}

Status CudaIpcConnection::prepare() {
  if (!anyWanted_.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lock(mapMutex_);
  anyWanted_.store(false, std::memory_order_relaxed);
  device::ScopedDevice bound(api_, device_);  // the caller's thread may have another device current
  LOOM_TRY(bound.status());
  for (const device::IpcHandle& h : wanted_) {
    if (peerBuffers_.count(h)) continue;
    auto mapped = api_->ipcOpen(h);
    if (mapped.isOk()) {
      LOOM_INFO(log::kP2p, "mapped a buffer that %s registered: its messages are copied straight out of it",
                rankName(peer_).c_str());
    } else {  // its messages keep going through the inbox
      LOOM_INFO(log::kP2p, "cannot map a buffer that %s registered (%s): its messages go through the inbox",
                rankName(peer_).c_str(), mapped.status().message().c_str());
    }
    peerBuffers_.emplace(h, mapped.isOk() ? mapped.value() : nullptr);
  }
  wanted_.clear();
  return Status::ok();
}

Status CudaIpcConnection::progress() {
  if (!error_.isOk()) return error_;
  if (!attached_) return Status::ok();
  if (controlError_.isOk()) controlError_ = control_->progress();
  Status s = takeControl();
  if (s.isOk()) s = moveRecvs();
  if (s.isOk() && controlError_.isOk()) s = moveSends();
  if (s.isOk() && controlError_.isOk()) controlError_ = control_->progress();
  if (!s.isOk()) return fail(s);
  if (!controlError_.isOk()) {
    const bool waitingForPeer = !sends_.empty() || (!recvs_.empty() && announced_.empty() && recvCopies_.empty());
    if (waitingForPeer) return fail(controlError_);
  }
  while (!outgoing_.empty() && outgoing_.front().t.done) outgoing_.pop_front();
  return Status::ok();
}

void CudaIpcConnection::pollFds(std::vector<pollfd>* fds) const {
  if (!error_.isOk() || !attached_) return;
  // Queued copies end without waking any fd: have the waiter look again soon.
  if (!sendCopies_.empty() || !recvCopies_.empty()) fds->push_back(pollfd{ready_.get(), POLLIN, 0});
  control_->pollFds(fds);
}

}  // namespace loom::transport::cudaipc
