#include "core/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "common/log.h"

namespace loom::core {

using transport::Connection;
using transport::Transfer;

Result<std::byte*> Scratch::get(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes <= size_) return mem_;
  if (api_ && !warned_) {
    warned_ = true;
    LOOM_WARN("growing %s staging memory to %zu bytes while an operation runs (it was not reserved when the "
              "operation was queued): allocating it may wait for the whole device, and so for a stream that "
              "waits for this operation",
              kind_ == Kind::kDevice ? "device" : "pinned", bytes);
  }
  LOOM_TRY(grow(bytes));
  return mem_;
}

Status Scratch::reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes <= size_ ? Status::ok() : grow(bytes);
}

Status Scratch::grow(size_t bytes) {
  if (api_) {
    bytes = std::max(bytes, 2 * size_);
    const bool pinned = kind_ != Kind::kDevice;
    auto p = pinned ? api_->allocHost(bytes) : api_->allocDevice(bytes);
    if (!p.isOk()) {
      return p.takeStatus().addContext("allocating " + std::to_string(bytes) + " bytes of " +
                                       (pinned ? "pinned" : "device") +
                                       " staging memory (lower LOOM_CHUNK_BYTES / NCCL_BUFFSIZE)");
    }
    if (mem_) retired_.push_back(mem_);
    mem_ = static_cast<std::byte*>(p.value());
  } else {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes) != 0) {
      return systemError("cannot allocate " + std::to_string(bytes) +
                         " bytes of staging memory for this operation (out of host memory); lower "
                         "LOOM_CHUNK_BYTES / NCCL_BUFFSIZE or free memory");
    }
    release(mem_);
    mem_ = static_cast<std::byte*>(p);
  }
  size_ = bytes;
  return Status::ok();
}

Scratch::~Scratch() {
  for (std::byte* m : retired_) release(m);
  release(mem_);
}

void Scratch::release(std::byte* mem) {
  if (!mem) return;
  if (!api_) std::free(mem);
  else if (kind_ == Kind::kDevice) api_->freeDevice(mem);
  else api_->freeHost(mem);
}

void PlanRunner::ReduceSink::consume(size_t offset, const void* bytes, size_t n) {
  const void* partials[1] = {bytes};
  const size_t count = n / std::max<size_t>(1, kernels::dataTypeSize(reduction->type));
  if (!device) {
    kernels::reduce(*config, *reduction, dst + offset, partials, 1, local ? local + offset : nullptr, count, post);
    return;
  }
  Status s = device->api->reduceAsync(*reduction, dst + offset, partials, 1, local ? local + offset : nullptr, count,
                                      post, device->stream);
  if (error.isOk()) error = s;
}

void PlanRunner::FusedStep::start(const kernels::Reduction* reduction, const std::byte* local, bool post,
                                  std::byte* out, const kernels::CpuKernelConfig* outConfig) {
  reduction_ = reduction;
  local_ = local;
  post_ = post;
  out_ = out;
  outConfig_ = outConfig;
  pieces_.clear();
  cursor_ = 0;
  arrived_ = 0;
}

void PlanRunner::FusedStep::consume(size_t offset, const void* bytes, size_t n) {
  pieces_.push_back(Piece{offset, static_cast<const std::byte*>(bytes), n});
  arrived_ = offset + n;
}

// The pieces received and those sent may be cut differently (each side's
// FIFO slots); both start on multiples of kSinkGrain, so no element splits.
// The user buffer is written from what was just written to `to`, which
// sits in this core's cache.
void PlanRunner::FusedStep::produce(size_t offset, void* to, size_t n) {
  const size_t end = offset + n;
  auto* into = static_cast<std::byte*>(to);
  for (size_t i = cursor_; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const size_t lo = std::max(offset, p.offset), hi = std::min(end, p.offset + p.bytes);
    if (lo < hi) {
      std::byte* at = into + (lo - offset);
      const std::byte* from = p.at + (lo - p.offset);
      if (reduction_) {
        const void* partials[1] = {from};
        const size_t count = (hi - lo) / std::max<size_t>(1, kernels::dataTypeSize(reduction_->type));
        kernels::reduce(kernels::defaultCpuKernelConfig(), *reduction_, at, partials, 1,
                        local_ ? local_ + lo : nullptr, count, post_);
      } else {
        std::memcpy(at, from, hi - lo);
      }
      if (out_) kernels::copy(*outConfig_, out_ + lo, at, hi - lo);
    }
    if (p.offset + p.bytes > end) break;
    cursor_ = i + 1;
  }
}

namespace {

// Whether a step of a reducing plan transforms its local input (pre-multiply,
// or the final division of an average).
bool transforms(const Step& s, const kernels::Reduction& reduction, bool reducing) {
  return reducing && s.reduce &&
         (reduction.op == kernels::RedOp::kPreMulSum || (s.post && reduction.op == kernels::RedOp::kSumPostDiv));
}

// A step that sends its `local` input (not a received or folded message).
bool sendsLocal(const Step& s) { return s.sendPeer >= 0 && s.recvPeer < 0 && s.fanIn.empty() && s.local.valid(); }

// Staging slots are whole multiples of 256 bytes.
size_t slotRound(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t PlanRunner::streamSlotBytes(const std::vector<Step>& steps, const kernels::Reduction& reduction,
                                   bool reducing, bool device) {
  size_t biggest = 0;
  for (const Step& s : steps) {
    // On a device, any message may pass through a slot (connections that
    // cannot move device memory).
    const bool slot = device ? (s.recvPeer >= 0 || s.sendPeer >= 0)
                      : s.recvPeer >= 0
                          ? (s.reduce || !s.out.valid())
                          : (transforms(s, reduction, reducing) && s.sendPeer >= 0 && !s.out.valid());
    if (slot || !s.fanIn.empty()) biggest = std::max(biggest, s.bytes);
  }
  return slotRound(biggest);
}

int PlanRunner::streamSlots(const std::vector<Step>& steps, const kernels::Reduction& reduction, bool reducing,
                            bool device) {
  // Transformed sends hold a slot each until they are done, which may take
  // until the peers' fan-ins: a fan-in must find its slots free beside the
  // ones sent since the previous fan-in (two-shot: a slice's sends, then
  // its fold). Sends with no fan-in after them need no more than kSlots: a
  // send waiting for a slot waits for earlier sends, which finish on their
  // own (a tree leaf's or a Reduce's pre-multiplied slices).
  int need = kSlots, transformedSends = 0;
  for (const Step& s : steps) {
    if (!s.fanIn.empty()) {
      need = std::max(need, transformedSends + int(s.fanIn.size()) + 2);
      transformedSends = 0;
    } else if (device ? s.sendPeer >= 0
                      : s.recvPeer < 0 && s.sendPeer >= 0 && !s.out.valid() && transforms(s, reduction, reducing)) {
      ++transformedSends;
    }
  }
  return need;
}

size_t PlanRunner::stagingBytes(const Plan& plan, const kernels::Reduction& reduction, bool reducing,
                                bool device) {
  size_t total = 0;
  for (const auto& stream : plan.streams)
    total += streamSlotBytes(stream.steps, reduction, reducing, device) *
             size_t(std::min(kMaxSlots, streamSlots(stream.steps, reduction, reducing, device)));
  return total;
}

Result<std::unique_ptr<PlanRunner>> PlanRunner::create(const Plan* plan, std::vector<std::byte*> buffers,
                                                       kernels::Reduction reduction, bool reducing,
                                                       std::span<Connection* const> conns, Scratch* scratch,
                                                       RegistrationCache* registrations, const DeviceContext* device) {
  std::unique_ptr<PlanRunner> r(new PlanRunner(plan, std::move(buffers), reduction, reducing, conns, device));
  for (const Stream& st : plan->streams) {
    if (const int slots = streamSlots(st.steps, reduction, reducing, device != nullptr); slots > kMaxSlots)
      return internalError("a plan stream needs " + std::to_string(slots) + " staging slots (at most " +
                           std::to_string(kMaxSlots) + ")");
  }
  LOOM_TRY(r->bindConnections());
  r->registrations_ = registrations;
  if (device) {
    r->slotsOnDevice_ = std::all_of(r->used_.begin(), r->used_.end(),
                                    [](Connection* c) { return c->moves(transport::MemoryType::kDevice); });
    scratch = r->slotsOnDevice_ ? device->onDevice : device->pinned;
    while (device->events->size() < r->streams_.size()) {
      LOOM_ASSIGN_OR_RETURN(device::Event e, device->api->createEvent());
      device->events->push_back(e);
    }
    for (size_t i = 0; i < r->streams_.size(); ++i) r->streams_[i].event = (*device->events)[i];
  }
  LOOM_TRY(r->bindSlots(scratch));
  return r;
}

Status PlanRunner::bindConnections() {
  // The connections the plan uses, each once; a missing one is a planner bug.
  used_.clear();
  Status missing;
  for (const Stream& st : plan_->streams) {
    for (const Step& s : st.steps) {
      s.forEachPeer([&](int peer) {
        const size_t link = linkIndex(peer, st.channel, plan_->nranks);
        Connection* c = st.channel >= 0 && link < conns_.size() ? conns_[link] : nullptr;
        if (!c) {
          if (missing.isOk())
            missing = internalError("a plan step uses rank " + std::to_string(peer) + " on channel " +
                                    std::to_string(st.channel) + ", which has no connection");
          return;
        }
        if (std::find(used_.begin(), used_.end(), c) == used_.end()) used_.push_back(c);
      });
    }
  }
  return missing;
}

Status PlanRunner::bindSlots(Scratch* scratch) {
  size_t total = 0;
  for (const auto& st : streams_) total += st.slotBytes * size_t(st.nslots);
  if (total == 0) return Status::ok();
  LOOM_ASSIGN_OR_RETURN(std::byte * base, scratch->get(total));
  for (auto& st : streams_) {
    st.slots = st.slotBytes ? base : nullptr;
    base += st.slotBytes * size_t(st.nslots);
  }
  return Status::ok();
}

Status PlanRunner::rebind(std::span<std::byte* const> buffers, const kernels::Reduction& reduction,
                          std::span<Connection* const> conns, Scratch* scratch) {
  if (device_ || !done()) return internalError("PlanRunner::rebind on a device runner or one still running");
  buffers_.assign(buffers.begin(), buffers.end());
  reduction_ = reduction;
  conns_ = conns;
  failedPeer_ = -1;
  chooseStreaming();  // in place or not may have changed
  layoutStreams();  // the slots depend on the reduction (a pre-multiply stages its sends)
  for (StreamState& st : streams_) {
    st.next = 0;
    st.phase = Phase::kStart;
    st.recv = Transfer{};
    st.fusing = false;
    st.fusedSend = Transfer{};
    st.recvSlot = -1;
    st.fanRecvs.clear();
    st.fanSlots.clear();
    st.result = nullptr;
    st.hold = -1;
    st.freeAfter.clear();
  }
  LOOM_TRY(bindConnections());
  return bindSlots(scratch);
}

PlanRunner::PlanRunner(const Plan* plan, std::vector<std::byte*> buffers, kernels::Reduction reduction,
                       bool reducing, std::span<Connection* const> conns, const DeviceContext* device)
    : plan_(plan), buffers_(std::move(buffers)), reduction_(reduction), reducing_(reducing),
      conns_(conns), device_(device), streams_(plan->streams.size()) {
  for (const Stream& stream : plan_->streams) {
    for (const Step& s : stream.steps) {
      if (s.out.valid()) written_ += s.bytes;
      if (s.out.buf == kRecvBuf) recvExtent_ = std::max(recvExtent_, s.out.offset + s.bytes);
      if (s.local.valid() && s.local.buf % 2 == 0) sendRead_ += s.bytes;  // send buffers: 0, 2, 4, ...
      if (s.local.buf == kSendBuf) sendExtent_ = std::max(sendExtent_, s.local.offset + s.bytes);
    }
  }
  const std::string_view algorithm = plan_->algorithm;
  fusable_ = !device_ && (algorithm == "ring" || algorithm == "chain");
  chooseStreaming();
  layoutStreams();
}

bool streamsResults(size_t written, size_t touched, int hostRanks, const kernels::CpuKernelConfig& config) {
  if (written < config.streamingMinBytes) return false;
  return config.cacheBytes == 0 || touched * size_t(std::max(1, hostRanks)) > config.cacheBytes / 4;
}

void PlanRunner::chooseStreaming() {
  const kernels::CpuKernelConfig& base = kernels::defaultCpuKernelConfig();
  outConfig_ = base;
  // The buffers this rank touches: its results and its input, counted once
  // where they overlap (in place).
  bool inPlace = false;
  if (plan_->nbuffers == 2) {
    const std::byte* send = buffers_[kSendBuf];
    const std::byte* recv = buffers_[kRecvBuf];
    inPlace = send && recv && send < recv + recvExtent_ && recv < send + sendExtent_;
  }
  const size_t touched = inPlace ? std::max(written_, sendRead_) : written_ + sendRead_;
  streamOutput_ = !device_ && streamsResults(written_, touched, plan_->hostRanks, base);
  if (streamOutput_) outConfig_.streamingMinBytes = 0;
}

void PlanRunner::layoutStreams() {
  const SendRegions sends = device_ ? SendRegions{} : sendRegions();
  for (size_t i = 0; i < plan_->streams.size(); ++i) {
    StreamState& st = streams_[i];
    st.channel = plan_->streams[i].channel;
    const auto& steps = plan_->streams[i].steps;
    st.singleCopy = std::any_of(steps.begin(), steps.end(), [](const Step& s) { return s.singleCopy; });
    st.slotBytes = streamSlotBytes(plan_->streams[i].steps, reduction_, reducing_, device_ != nullptr);
    st.nslots = std::min(kMaxSlots, streamSlots(plan_->streams[i].steps, reduction_, reducing_, device_ != nullptr));
    if (!device_) {
      // A receive straight into a region that a send of this plan reads
      // (grouped send/recv on one buffer, in-place AllToAll) would have to
      // wait for that send, which may wait for the peer's own such
      // receive: it lands in a slot instead (startStep), one is enough.
      const size_t overlapping = overlappingReceiveBytes(plan_->streams[i].steps, sends);
      st.overlaps = overlapping > 0;
      if (overlapping > 0 && st.slotBytes == 0) st.nslots = 1;
      st.slotBytes = std::max(st.slotBytes, slotRound(overlapping));
    }
    st.freeSlots = st.nslots == 64 ? ~uint64_t(0) : (uint64_t(1) << st.nslots) - 1;
  }
}

PlanRunner::SendRegions PlanRunner::sendRegions() const {
  SendRegions out;
  for (const Stream& stream : plan_->streams)
    for (const Step& s : stream.steps)
      if (sendsLocal(s) && s.bytes > 0)
        out.begins.push_back({ptr(s.local), ptr(s.local) + s.bytes});
  std::sort(out.begins.begin(), out.begins.end());
  // reach[i]: the furthest end among the first i + 1 regions.
  for (const auto& [begin, end] : out.begins) out.reach.push_back(out.reach.empty() ? end : std::max(out.reach.back(), end));
  return out;
}

size_t PlanRunner::overlappingReceiveBytes(const std::vector<Step>& steps, const SendRegions& sends) const {
  size_t biggest = 0;
  for (const Step& r : steps) {
    if (r.recvPeer < 0 || r.reduce || !r.out.valid() || r.bytes <= biggest) continue;
    const std::byte* begin = ptr(r.out);
    const std::byte* end = begin + r.bytes;
    // The sends that start before `end`; one of them overlaps when the
    // furthest of their ends passes `begin`.
    const auto first = std::lower_bound(sends.begins.begin(), sends.begins.end(), end,
                                        [](const auto& region, const std::byte* at) { return region.first < at; });
    const size_t before = size_t(first - sends.begins.begin());
    if (before > 0 && sends.reach[before - 1] > begin) biggest = r.bytes;
  }
  return biggest;
}

bool PlanRunner::deviceBusy() const {
  for (const auto& st : streams_)
    if (st.phase == Phase::kDeviceWait) return true;
  return false;
}

transport::MemoryType PlanRunner::memoryOf(const StreamState& st, const std::byte* p) const {
  if (!device_) return transport::MemoryType::kHost;
  if (!inSlots(st, p) || slotsOnDevice_) return transport::MemoryType::kDevice;
  return transport::MemoryType::kHostPinned;
}

bool PlanRunner::done() const {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].next < plan_->streams[i].steps.size() || !streams_[i].sends.empty()) return false;
  }
  return true;
}

void PlanRunner::waitingOn(std::vector<int>* peers) const {
  for (size_t i = 0; i < streams_.size(); ++i) {
    const auto& st = streams_[i];
    const auto& steps = plan_->streams[i].steps;
    if (st.next < steps.size() && st.phase == Phase::kReceiving) {
      const Step& step = steps[st.next];
      if (step.recvPeer >= 0) peers->push_back(step.recvPeer);
      for (size_t k = 0; k < st.fanRecvs.size(); ++k)
        if (!st.fanRecvs[k].done) peers->push_back(step.fanIn[k]);
      if (st.fusing && !st.fusedSend.done) peers->push_back(step.sendPeer);
    }
    for (const auto& ps : st.sends) {
      if (!ps.xfer.done) peers->push_back(ps.peer);
    }
  }
  std::sort(peers->begin(), peers->end());
  peers->erase(std::unique(peers->begin(), peers->end()), peers->end());
}

Status PlanRunner::advance(bool* progressed) {
  for (Connection* c : used_) {
    Status s = c->progress();
    if (!s.isOk()) {
      failedPeer_ = c->peer();
      return s;
    }
  }
  for (size_t i = 0; i < streams_.size(); ++i) LOOM_TRY(advanceStream(i, streams_[i], progressed));
  return Status::ok();
}

int PlanRunner::takeSlot(StreamState& st) {
  if (st.freeSlots == 0) return -1;
  int slot = __builtin_ctzll(st.freeSlots);
  st.freeSlots &= ~(uint64_t(1) << slot);
  return slot;
}

void PlanRunner::retireSends(StreamState& st, bool* progressed) {
  while (!st.sends.empty() && st.sends.front().xfer.done) {
    if (st.sends.front().slot >= 0) freeSlot(st, st.sends.front().slot);
    st.sends.pop_front();
    *progressed = true;
  }
}

bool PlanRunner::readPending(const StreamState& self, const std::byte* begin, size_t bytes) const {
  const std::byte* end = begin + bytes;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (&streams_[i] == &self) continue;
    const auto& steps = plan_->streams[i].steps;
    for (size_t k = streams_[i].next; k < steps.size(); ++k) {
      const Step& s = steps[k];
      if (!sendsLocal(s)) continue;
      const std::byte* from = ptr(s.local);
      if (from < end && begin < from + s.bytes) return true;
    }
  }
  return false;
}

bool PlanRunner::writeBlocked(const std::byte* begin, size_t bytes) const {
  const std::byte* end = begin + bytes;
  for (const auto& st : streams_) {
    for (const auto& ps : st.sends) {
      if (!ps.xfer.done && ps.begin < end && begin < ps.end) return true;
    }
  }
  return false;
}

Status PlanRunner::advanceStream(size_t index, StreamState& st, bool* progressed) {
  const auto& steps = plan_->streams[index].steps;
  retireSends(st, progressed);
  while (st.next < steps.size()) {
    const Step& step = steps[st.next];
    if (st.phase == Phase::kStart) {
      Status err;
      if (!startStep(step, st, &err)) {
        LOOM_TRY(err);
        break;
      }
      *progressed = true;
    }
    if (st.phase == Phase::kReceiving && st.fusing) {
      LOOM_ASSIGN_OR_RETURN(bool finished, finishFused(step, st));
      if (!finished) break;
      st.phase = Phase::kStart;
      ++st.next;
      *progressed = true;
      retireSends(st, progressed);
      continue;
    }
    if (st.phase == Phase::kReceiving) {
      if (step.fanIn.empty() ? !st.recv.done
                             : !std::all_of(st.fanRecvs.begin(), st.fanRecvs.end(),
                                            [](const Transfer& t) { return t.done; }))
        break;
      st.phase = Phase::kCompute;
      *progressed = true;
    }
    if (st.phase == Phase::kCompute) {
      Status err = !step.fanIn.empty() ? (device_ ? computeFanInOnDevice(step, st) : computeFanIn(step, st))
                   : device_             ? computeOnDevice(step, st)
                                         : compute(step, st);
      if (err.code() == Code::kInProgress) break;  // blocked on a slot or a hazard
      LOOM_TRY(err);
      *progressed = true;
    }
    if (st.phase == Phase::kDeviceWait) {
      LOOM_ASSIGN_OR_RETURN(bool fired, device_->api->eventDone(st.event));
      if (!fired) break;
      st.phase = Phase::kFinish;
    }
    LOOM_TRY(finish(step, st));
    st.phase = Phase::kStart;
    ++st.next;
    *progressed = true;
    retireSends(st, progressed);
  }
  return Status::ok();
}

bool PlanRunner::startStep(const Step& step, StreamState& st, Status* error) {
  if (!step.fanIn.empty()) return startFanIn(step, st, error);
  if (step.recvPeer < 0) {
    st.phase = Phase::kCompute;
    return true;
  }
  if (fuses(step, st)) return startFused(step, st, error);
  Connection* c = conn(st, step.recvPeer);
  std::byte* target;
  // On a device, only a connection that moves device memory receives
  // straight into a user buffer.
  const bool direct = !step.reduce && step.out.valid() && (!device_ || c->moves(transport::MemoryType::kDevice));
  // A direct receive whose region a send still reads goes to a slot where
  // the stream has one (layoutStreams): waiting could deadlock.
  const bool blocked = direct && (writeBlocked(ptr(step.out), step.bytes) ||
                                  (st.overlaps && readPending(st, ptr(step.out), step.bytes)));
  if (blocked && !(st.slots && st.slotBytes >= step.bytes && !device_)) return false;
  if (direct && !blocked) {
    target = ptr(step.out);
    st.recvSlot = -1;
  } else {
    st.recvSlot = takeSlot(st);
    if (st.recvSlot < 0) return false;
    target = slot(st, st.recvSlot);
  }
  st.recv = Transfer{};
  st.recv.data = target;
  st.recv.bytes = step.bytes;
  st.recv.memory = memoryOf(st, target);
  st.recv.stream = streamOutput_ && st.recvSlot < 0 && step.sendPeer < 0;
  // On a device only a connection that moves device memory can hand over
  // its own memory (the kernels must reach it).
  if (step.reduce && (!device_ || c->moves(transport::MemoryType::kDevice))) {
    // The step's reduction, run by the transport straight from its own
    // memory when it can, else by compute() from the staging slot. Offered
    // only when the output is not still being sent.
    st.sink.reduction = &reduction_;
    st.sink.dst = step.out.valid() ? ptr(step.out) : target;
    st.sink.local = step.local.valid() ? ptr(step.local) : nullptr;
    st.sink.post = step.post;
    st.sink.config = step.out.valid() ? &resultConfig(step) : &kernels::defaultCpuKernelConfig();
    st.sink.device = device_;
    st.sink.error = Status::ok();
    if (!step.out.valid() || !writeBlocked(st.sink.dst, step.bytes)) {
      st.recv.sink = &st.sink;
      st.recv.hold = device_ != nullptr;
    }
  }
  if (!postReceive(step.recvPeer, *c, st.recv, error)) return false;
  st.phase = Phase::kReceiving;
  return true;
}

// Host rings and chains only. In a ring, every rank holds at most one
// message of its inbox while it writes the next rank's, and the inboxes
// hold two (Connection::fusedStepBytes), so the ring never has every inbox
// full at once; a chain has no cycle to fill. (Trees and the one-shot plans
// depend on each other in other shapes; they go through slots.) Not in a
// stream whose sends may go single-copy (AllGather's own blocks): those
// arrive whole, in the receiver's buffer.
bool PlanRunner::fuses(const Step& step, const StreamState& st) const {
  // A step that keeps its result finishes, unfused, once its message has
  // arrived (its send drains while the next step runs); fused, only once
  // the next rank's FIFO has taken all of it. For shorter messages that
  // cost more than the copy saves where ranks share cores (8 ranks on 2
  // cores, AllReduce of 1 MiB: 128 KiB messages, 1.1-1.3x the time, twice the
  // context switches; of 16 MiB: 512 KiB messages, 0.67x).
  constexpr size_t kKeepingMinBytes = size_t(512) << 10;
  if (step.out.valid() && step.bytes < kKeepingMinBytes) return false;
  if (!fusable_ || step.sendPeer < 0 || step.recvPeer < 0 || !step.fanIn.empty() || st.singleCopy) return false;
  if (landsInSlot(step) && st.slotBytes < step.bytes) return false;
  if (step.out.valid()) {
    const std::byte* out = ptr(step.out);
    if (writeBlocked(out, step.bytes) || (st.overlaps && readPending(st, out, step.bytes))) return false;
  }
  Connection* in = conn(st, step.recvPeer);
  Connection* out = conn(st, step.sendPeer);
  return out->produces() && step.bytes <= in->fusedStepBytes() && step.bytes <= out->fusedStepBytes();
}

// Posts the fused step's receive (handing its pieces to st.fused, held) and
// its send (produced by st.fused). Should a transport deliver the message
// whole instead, it lands in the step's output, or a staging slot where the
// step folds (finishFused passes it on then).
bool PlanRunner::startFused(const Step& step, StreamState& st, Status* error) {
  std::byte* landing = nullptr;
  st.recvSlot = -1;
  if (landsInSlot(step)) {
    st.recvSlot = takeSlot(st);
    if (st.recvSlot < 0) return false;
    landing = slot(st, st.recvSlot);
  } else {
    landing = ptr(step.out);
  }
  const std::byte* local = step.reduce && step.local.valid() ? ptr(step.local) : nullptr;
  std::byte* result = step.out.valid() ? ptr(step.out) : nullptr;
  // In place, the output's lines were just read (the local input): stores
  // that bypass the caches would evict them first.
  const bool inPlace = result && local && result < local + step.bytes && local < result + step.bytes;
  st.fused.start(step.reduce ? &reduction_ : nullptr, local, step.post, result,
                 inPlace ? &kernels::defaultCpuKernelConfig() : &outConfig_);
  st.recv = Transfer{};
  st.recv.data = landing;
  st.recv.bytes = step.bytes;
  st.recv.memory = memoryOf(st, landing);
  st.recv.sink = &st.fused;
  st.recv.hold = true;
  st.fusedSend = Transfer{};
  st.fusedSend.data = landing;  // not read: the source writes every byte
  st.fusedSend.bytes = step.bytes;
  st.fusedSend.memory = st.recv.memory;
  st.fusedSend.source = &st.fused;
  st.fusing = true;
  st.phase = Phase::kReceiving;
  Connection* in = conn(st, step.recvPeer);
  Connection* out = conn(st, step.sendPeer);
  Status attached = attachRegion(*in, st.recv);
  return succeeded(step.recvPeer, attached.isOk() ? in->postRecv(&st.recv) : attached, error) &&
         succeeded(step.sendPeer, out->postSend(&st.fusedSend), error) &&
         succeeded(step.recvPeer, in->progress(), error) && succeeded(step.sendPeer, out->progress(), error);
}

Result<bool> PlanRunner::finishFused(const Step& step, StreamState& st) {
  if (!st.recv.done) return false;
  Connection* out = conn(st, step.sendPeer);
  if (!st.recv.sunk && st.fused.ready() < step.bytes) {
    st.fused.consume(0, static_cast<std::byte*>(st.recv.data), step.bytes);  // it came whole
    if (Status s = out->progress(); !s.isOk()) {
      failedPeer_ = step.sendPeer;
      return s;
    }
  }
  if (!st.fusedSend.done) return false;
  st.recv.hold = false;
  if (Status s = conn(st, step.recvPeer)->release(&st.recv); !s.isOk()) {
    failedPeer_ = step.recvPeer;
    return s;
  }
  if (st.recvSlot >= 0) freeSlot(st, st.recvSlot);
  st.recvSlot = -1;
  st.fusing = false;
  return true;
}

bool PlanRunner::postReceive(int peer, Connection& c, Transfer& t, Status* error) {
  Status s = attachRegion(c, t);
  if (s.isOk()) s = c.postRecv(&t);
  if (s.isOk()) s = c.progress();
  return succeeded(peer, std::move(s), error);
}

// Posts every receive of a fan-in step at once, each into a slot of its own
// (they are folded together once all have arrived).
bool PlanRunner::startFanIn(const Step& step, StreamState& st, Status* error) {
  const size_t n = step.fanIn.size();
  if (size_t(__builtin_popcountll(st.freeSlots)) < n) return false;
  st.fanRecvs.assign(n, Transfer{});
  st.fanSlots.resize(n);
  for (size_t k = 0; k < n; ++k) {
    st.fanSlots[k] = takeSlot(st);
    Transfer& t = st.fanRecvs[k];
    t.data = slot(st, st.fanSlots[k]);
    t.bytes = step.bytes;
    t.memory = memoryOf(st, slot(st, st.fanSlots[k]));
    if (!postReceive(step.fanIn[k], *conn(st, step.fanIn[k]), t, error)) return false;
  }
  st.phase = Phase::kReceiving;
  return true;
}

// Folds a fan-in step's messages and local input in the step's order, in
// one pass (one call: every rank folding the same list gets the same bits).
Status PlanRunner::computeFanIn(const Step& step, StreamState& st) {
  const Status kBlocked(Code::kInProgress, "");
  const size_t count = elements(step);
  std::byte* dst = step.out.valid() ? ptr(step.out) : nullptr;
  if (dst && (writeBlocked(dst, step.bytes) || readPending(st, dst, step.bytes))) return kBlocked;
  const bool pre = premultipliesLocal(step);
  const int needed = (dst ? 0 : 1) + (pre ? 1 : 0);
  if (__builtin_popcountll(st.freeSlots) < needed) return kBlocked;
  int hold = -1, preSlot = -1;
  if (!dst) {
    hold = takeSlot(st);
    dst = slot(st, hold);
  }
  const std::byte* local = step.localAt >= 0 ? ptr(step.local) : nullptr;
  if (pre) {
    preSlot = takeSlot(st);
    kernels::reduce(reduction_, slot(st, preSlot), nullptr, 0, local, count, false);
    local = slot(st, preSlot);
  }
  const void* sources[kMaxSlots];
  kernels::Reduction fold;
  const int nsources = foldSources(step, st, st.fanSlots, local, sources, &fold);
  kernels::reduce(hold < 0 ? resultConfig(step) : kernels::defaultCpuKernelConfig(), fold, dst, sources, nsources,
                  nullptr, count, step.post);
  for (int s : st.fanSlots) freeSlot(st, s);
  if (preSlot >= 0) freeSlot(st, preSlot);
  st.fanSlots.clear();
  st.result = dst;
  st.hold = hold;
  st.phase = Phase::kFinish;
  return Status::ok();
}

int PlanRunner::foldSources(const Step& step, const StreamState& st, const std::vector<int>& fanSlots,
                            const std::byte* local, const void** out, kernels::Reduction* fold) const {
  int n = 0;
  for (size_t k = 0; k <= step.fanIn.size(); ++k) {
    if (int(k) == step.localAt) out[n++] = local;
    if (k < step.fanIn.size()) out[n++] = slot(st, fanSlots[k]);
  }
  *fold = reduction_;
  if (fold->op == kernels::RedOp::kPreMulSum) fold->op = kernels::RedOp::kSum;
  return n;
}

// computeFanIn's fold as kernels on the context's stream (the sources are
// device memory or pinned slots the kernels reach), then an event; the slots
// the kernels read are freed at kFinish. A result a connection cannot send
// from device memory is copied to a slot.
Status PlanRunner::computeFanInOnDevice(const Step& step, StreamState& st) {
  const Status kBlocked(Code::kInProgress, "");
  device::Api* api = device_->api;
  const device::Stream stream = device_->stream;
  const size_t count = elements(step);
  const bool stageSend = stagedSend(step, st);
  std::byte* dst = step.out.valid() ? ptr(step.out) : nullptr;
  if (dst && (writeBlocked(dst, step.bytes) || readPending(st, dst, step.bytes))) return kBlocked;
  const bool pre = premultipliesLocal(step);
  // More sources than one launch takes chain through dst (device.h): the
  // local input, when it is dst (in place) and not the first source, would
  // be read after it was overwritten; the fold then goes to a slot first.
  const int sourceCount = int(step.fanIn.size()) + (step.localAt >= 0 ? 1 : 0);
  const bool viaSlot = dst && sourceCount > device::kSourcesPerLaunch && step.localAt > 0 && !pre &&
                       ptr(step.local) < dst + step.bytes && dst < ptr(step.local) + step.bytes;
  const int needed = (dst && !viaSlot ? (stageSend ? 1 : 0) : 1) + (pre ? 1 : 0);
  if (__builtin_popcountll(st.freeSlots) < needed) return kBlocked;
  int hold = -1;
  std::byte* userOut = nullptr;  // where a fold into a slot is copied to
  if (viaSlot) {
    userOut = dst;
    dst = nullptr;
  }
  if (!dst) {
    hold = takeSlot(st);
    dst = slot(st, hold);
  }
  st.freeAfter.swap(st.fanSlots);  // the kernels read them
  const std::byte* local = step.localAt >= 0 ? ptr(step.local) : nullptr;
  if (pre) {
    const int preSlot = takeSlot(st);
    st.freeAfter.push_back(preSlot);
    LOOM_TRY(api->reduceAsync(reduction_, slot(st, preSlot), nullptr, 0, local, count, false, stream));
    local = slot(st, preSlot);
  }
  const void* sources[kMaxSlots];
  kernels::Reduction fold;
  const int nsources = foldSources(step, st, st.freeAfter, local, sources, &fold);
  LOOM_TRY(api->reduceAsync(fold, dst, sources, nsources, nullptr, count, step.post, stream));
  const std::byte* result = dst;
  if (userOut) {
    LOOM_TRY(api->copyAsync(userOut, dst, step.bytes, stream));
    if (!stageSend) {  // the slot is read by the copy only
      st.freeAfter.push_back(hold);
      hold = -1;
      result = userOut;
    }
  }
  if (stageSend && !inSlots(st, result)) {
    hold = takeSlot(st);
    LOOM_TRY(api->copyAsync(slot(st, hold), result, step.bytes, stream));
    result = slot(st, hold);
  }
  st.result = result;
  st.hold = hold;
  LOOM_TRY(api->recordEvent(st.event, stream));
  st.phase = Phase::kDeviceWait;
  return Status::ok();
}

// Produces the step's result on the host (finish() posts it). Returns
// kInProgress when it must wait (no free slot, or the output region is
// still being sent).
Status PlanRunner::compute(const Step& step, StreamState& st) {
  const Status kBlocked(Code::kInProgress, "");
  const size_t count = elements(step);
  const std::byte* result = nullptr;
  int hold = -1;       // staging slot that holds the result
  int freeAfter = -1;  // staging slot read by the computation
  if (step.recvPeer >= 0) {
    std::byte* in = st.recvSlot >= 0 ? slot(st, st.recvSlot) : ptr(step.out);
    if (step.reduce) {
      std::byte* dst = st.sink.dst;
      if (!st.recv.sunk) {  // else the transport already ran the sink
        if (step.out.valid() && writeBlocked(dst, step.bytes)) return kBlocked;
        st.sink.consume(0, in, step.bytes);
      }
      result = dst;
      if (dst == in) hold = st.recvSlot;
      else freeAfter = st.recvSlot;
    } else {
      // Staged because its region was still being sent (startStep).
      if (st.recvSlot >= 0 && step.out.valid()) {
        if (writeBlocked(ptr(step.out), step.bytes) || readPending(st, ptr(step.out), step.bytes)) return kBlocked;
        kernels::copy(outConfig_, ptr(step.out), in, step.bytes);
      }
      result = in;
      hold = st.recvSlot;
    }
    st.recvSlot = -1;
  } else {
    std::byte* src = ptr(step.local);
    const bool transform = transforms(step, reduction_, reducing_);
    if (step.out.valid()) {
      std::byte* dst = ptr(step.out);
      if ((transform || dst != src) && writeBlocked(dst, step.bytes)) return kBlocked;
      // A plain copy: the send leaves from the input, not from the copy
      // just written, whose lines sit dirty in this core's cache, where a
      // peer that copies straight from them reads them at about half the
      // speed (2-rank AllGather of 1 MiB, single copy: 76-91 -> 45-48 us).
      if (transform) kernels::reduce(resultConfig(step), reduction_, dst, nullptr, 0, src, count, step.post);
      else if (dst != src) kernels::copy(outConfig_, dst, src, step.bytes);
      result = transform ? dst : src;
    } else if (transform && step.sendPeer >= 0) {
      hold = takeSlot(st);
      if (hold < 0) return kBlocked;
      std::byte* dst = slot(st, hold);
      kernels::reduce(reduction_, dst, nullptr, 0, src, count, step.post);
      result = dst;
    } else {
      result = src;
    }
  }
  st.result = result;
  st.hold = hold;
  if (freeAfter >= 0) st.freeAfter.push_back(freeAfter);
  st.phase = Phase::kFinish;
  return Status::ok();
}

// The same on the device: queues the step's kernels and copies on the
// context's stream, then an event; advanceStream() waits for it before
// finish(). Every check that can block comes before the first launch, so a
// blocked step is retried from scratch.
Status PlanRunner::computeOnDevice(const Step& step, StreamState& st) {
  const Status kBlocked(Code::kInProgress, "");
  device::Api* api = device_->api;
  const device::Stream stream = device_->stream;
  const size_t count = elements(step);
  const bool stageSend = stagedSend(step, st);
  const bool transform = step.recvPeer < 0 && transforms(step, reduction_, reducing_);

  // What the step writes and the slots it needs, before anything is queued.
  std::byte* in = nullptr;
  std::byte* dst = nullptr;  // a user-buffer region written, or null
  bool resultInSlot = false;
  int slotsNeeded = 0;
  if (step.recvPeer >= 0) {
    in = st.recvSlot >= 0 ? slot(st, st.recvSlot) : ptr(step.out);
    if (step.reduce) {
      dst = step.out.valid() ? ptr(step.out) : nullptr;
      resultInSlot = !dst;
    } else {
      dst = st.recvSlot >= 0 && step.out.valid() ? ptr(step.out) : nullptr;
      resultInSlot = st.recvSlot >= 0;  // sends leave from the slot holding the message
    }
  } else if (step.out.valid()) {
    dst = ptr(step.out);
    if (!transform && dst == ptr(step.local)) dst = nullptr;  // nothing to write
  } else if (transform && step.sendPeer >= 0) {
    resultInSlot = true;
    ++slotsNeeded;
  }
  if (stageSend && !resultInSlot) ++slotsNeeded;
  const bool sunk = step.recvPeer >= 0 && step.reduce && st.recv.sunk;  // the kernels are queued already
  if (dst && !sunk && writeBlocked(dst, step.bytes)) return kBlocked;
  if (__builtin_popcountll(st.freeSlots) < slotsNeeded) return kBlocked;
  if (sunk) LOOM_TRY(st.sink.error);

  bool launched = false;
  auto reduceInto = [&](std::byte* out, const std::byte* partial, const std::byte* local) -> Status {
    const void* partials[1] = {partial};
    launched = true;
    return api->reduceAsync(reduction_, out, partials, partial ? 1 : 0, local, count, step.post, stream);
  };
  auto copyInto = [&](std::byte* out, const std::byte* src) -> Status {
    launched = true;
    return api->copyAsync(out, src, step.bytes, stream);
  };
  const std::byte* result = nullptr;
  int hold = -1, freeAfter = -1;
  if (step.recvPeer >= 0) {
    if (step.reduce) {
      std::byte* out = dst ? dst : in;
      if (sunk) launched = true;  // wait for the kernels consume() queued
      else LOOM_TRY(reduceInto(out, in, step.local.valid() ? ptr(step.local) : nullptr));
      result = out;
      if (dst) freeAfter = st.recvSlot;
      else hold = st.recvSlot;
    } else {
      if (dst) LOOM_TRY(copyInto(dst, in));
      result = in;
      hold = st.recvSlot;
    }
    st.recvSlot = -1;
  } else {
    std::byte* src = ptr(step.local);
    if (step.out.valid()) {
      if (transform) LOOM_TRY(reduceInto(dst, nullptr, src));
      else if (dst) LOOM_TRY(copyInto(dst, src));
      result = ptr(step.out);
    } else if (resultInSlot) {
      hold = takeSlot(st);
      LOOM_TRY(reduceInto(slot(st, hold), nullptr, src));
      result = slot(st, hold);
    } else {
      result = src;
    }
  }
  if (stageSend && !inSlots(st, result)) {
    hold = takeSlot(st);
    LOOM_TRY(copyInto(slot(st, hold), result));
    result = slot(st, hold);
  }
  st.result = result;
  st.hold = hold;
  if (freeAfter >= 0) st.freeAfter.push_back(freeAfter);
  if (!launched) {
    st.phase = Phase::kFinish;
    return Status::ok();
  }
  LOOM_TRY(api->recordEvent(st.event, stream));
  st.phase = Phase::kDeviceWait;
  return Status::ok();
}

// Posts the computed result (kFinish) and frees what the step no longer needs.
Status PlanRunner::finish(const Step& step, StreamState& st) {
  if (st.recv.hold) {  // the kernels that read the transport's memory are done
    st.recv.hold = false;
    Status s = conn(st, step.recvPeer)->release(&st.recv);
    if (!s.isOk()) {
      failedPeer_ = step.recvPeer;
      return s;
    }
  }
  for (int s : st.freeAfter) freeSlot(st, s);
  st.freeAfter.clear();
  const int hold = st.hold;
  st.hold = -1;
  if (step.sendPeer < 0) {
    if (hold >= 0) freeSlot(st, hold);
    return Status::ok();
  }
  const std::byte* result = st.result;
  st.sends.push_back(PendingSend{{}, result, result + step.bytes, hold, step.sendPeer});
  PendingSend& ps = st.sends.back();
  ps.xfer.data = const_cast<std::byte*>(result);
  ps.xfer.bytes = step.bytes;
  ps.xfer.memory = memoryOf(st, result);
  // Pageable host memory only: pinned staging slots and device memory may
  // be mapped in ways process_vm_readv cannot read. Not when this rank
  // streams its output (streamOutput_: its receivers do too, unless their
  // buffers differ in size or place): a FIFO copy with streaming stores
  // then beats the kernel's plain one (2-rank AllGather of 16 MiB:
  // 1.4-2.4 -> 0.87-1.15 ms). Either way the transfer works.
  ps.xfer.singleCopy = step.singleCopy && !streamOutput_ && ps.xfer.memory == transport::MemoryType::kHost;
  ps.xfer.pullAlways = ps.xfer.singleCopy && step.pullAlways;
  Connection* c = conn(st, step.sendPeer);
  Status s = attachRegion(*c, ps.xfer);
  if (s.isOk()) s = c->postSend(&ps.xfer);
  if (s.isOk()) s = c->progress();
  if (!s.isOk()) failedPeer_ = step.sendPeer;
  return s;
}

Status PlanRunner::attachRegion(Connection& c, transport::Transfer& t) {
  if (!registrations_) return Status::ok();
  LOOM_ASSIGN_OR_RETURN(t.region, registrations_->find(c, t.data, t.bytes, t.memory));
  return Status::ok();
}

}  // namespace loom::core
