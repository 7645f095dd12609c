#include "core/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace loom::core {

using transport::Connection;
using transport::Transfer;

Result<std::byte*> Scratch::get(size_t bytes) {
  if (bytes > size_) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes) != 0) {
      return systemError("cannot allocate " + std::to_string(bytes) +
                         " bytes of staging memory for this operation (out of host memory); lower "
                         "LOOM_CHUNK_BYTES / NCCL_BUFFSIZE or free memory");
    }
    mem_.reset(static_cast<std::byte*>(p));
    size_ = bytes;
  }
  return mem_.get();
}

void Scratch::Free::operator()(std::byte* p) const { std::free(p); }

void PlanRunner::ReduceSink::consume(size_t offset, const void* bytes, size_t n) {
  const void* partials[1] = {bytes};
  const size_t count = n / std::max<size_t>(1, kernels::dataTypeSize(reduction->type));
  kernels::reduce(*reduction, dst + offset, partials, 1, local ? local + offset : nullptr, count, post);
}

namespace {

// Whether a step of a reducing plan transforms its local input (pre-multiply,
// or the final division of an average).
bool transforms(const Step& s, const kernels::Reduction& reduction, bool reducing) {
  return reducing && s.reduce &&
         (reduction.op == kernels::RedOp::kPreMulSum || (s.post && reduction.op == kernels::RedOp::kSumPostDiv));
}

}  // namespace

size_t PlanRunner::streamSlotBytes(const std::vector<Step>& steps, const kernels::Reduction& reduction,
                                   bool reducing) {
  size_t biggest = 0;
  for (const Step& s : steps) {
    const bool slot = s.recvPeer >= 0 ? (s.reduce || !s.out.valid())
                                      : (transforms(s, reduction, reducing) && s.sendPeer >= 0 && !s.out.valid());
    if (slot) biggest = std::max(biggest, s.bytes);
  }
  return (biggest + 63) / 64 * 64;
}

size_t PlanRunner::stagingBytes(const Plan& plan, const kernels::Reduction& reduction, bool reducing) {
  size_t total = 0;
  for (const auto& stream : plan.streams) total += streamSlotBytes(stream.steps, reduction, reducing) * kSlots;
  return total;
}

Result<std::unique_ptr<PlanRunner>> PlanRunner::create(const Plan* plan, std::vector<std::byte*> buffers,
                                                       kernels::Reduction reduction, bool reducing,
                                                       std::span<Connection* const> conns, Scratch* scratch,
                                                       RegistrationCache* registrations) {
  std::unique_ptr<PlanRunner> r(new PlanRunner(plan, std::move(buffers), reduction, reducing, conns));
  // The connections the plan uses, each once; a missing one is a planner bug.
  for (const Stream& st : plan->streams) {
    for (const Step& s : st.steps) {
      for (int peer : {s.recvPeer, s.sendPeer}) {
        if (peer < 0) continue;
        const size_t link = linkIndex(peer, st.channel, plan->nranks);
        Connection* c = st.channel >= 0 && link < conns.size() ? conns[link] : nullptr;
        if (!c) {
          return internalError("a plan step uses rank " + std::to_string(peer) + " on channel " +
                               std::to_string(st.channel) + ", which has no connection");
        }
        if (std::find(r->used_.begin(), r->used_.end(), c) == r->used_.end()) r->used_.push_back(c);
      }
    }
  }
  r->registrations_ = registrations;
  size_t total = 0;
  for (const auto& st : r->streams_) total += st.slotBytes * kSlots;
  if (total == 0) return r;
  LOOM_ASSIGN_OR_RETURN(std::byte * base, scratch->get(total));
  for (auto& st : r->streams_) {
    st.slots = st.slotBytes ? base : nullptr;
    base += st.slotBytes * kSlots;
  }
  return r;
}

PlanRunner::PlanRunner(const Plan* plan, std::vector<std::byte*> buffers, kernels::Reduction reduction,
                       bool reducing, std::span<Connection* const> conns)
    : plan_(plan), buffers_(std::move(buffers)), reduction_(reduction), reducing_(reducing),
      conns_(conns), streams_(plan->streams.size()) {
  for (size_t i = 0; i < plan->streams.size(); ++i) {
    streams_[i].channel = plan->streams[i].channel;
    streams_[i].slotBytes = streamSlotBytes(plan->streams[i].steps, reduction_, reducing_);
  }
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
    if (st.next < steps.size() && st.phase == Phase::kReceiving) peers->push_back(steps[st.next].recvPeer);
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
  int slot = __builtin_ctz(st.freeSlots);
  st.freeSlots &= ~(1u << slot);
  return slot;
}

void PlanRunner::retireSends(StreamState& st, bool* progressed) {
  while (!st.sends.empty() && st.sends.front().xfer.done) {
    if (st.sends.front().slot >= 0) st.freeSlots |= 1u << st.sends.front().slot;
    st.sends.pop_front();
    *progressed = true;
  }
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
    if (st.phase == Phase::kReceiving) {
      if (!st.recv.done) break;
      st.phase = Phase::kCompute;
      *progressed = true;
    }
    Status err = compute(step, st);
    if (err.code() == Code::kInProgress) break;  // blocked on a slot or a hazard
    LOOM_TRY(err);
    st.phase = Phase::kStart;
    ++st.next;
    *progressed = true;
    retireSends(st, progressed);
  }
  return Status::ok();
}

bool PlanRunner::startStep(const Step& step, StreamState& st, Status* error) {
  if (step.recvPeer < 0) {
    st.phase = Phase::kCompute;
    return true;
  }
  std::byte* target;
  const bool direct = !step.reduce && step.out.valid();
  if (direct) {
    target = ptr(step.out);
    if (writeBlocked(target, step.bytes)) return false;
    st.recvSlot = -1;
  } else {
    st.recvSlot = takeSlot(st);
    if (st.recvSlot < 0) return false;
    target = st.slots + size_t(st.recvSlot) * st.slotBytes;
  }
  st.recv = Transfer{};
  st.recv.data = target;
  st.recv.bytes = step.bytes;
  if (step.reduce) {
    // The step's reduction, run by the transport straight from its own
    // memory when it can, else by compute() from the staging slot. Offered
    // only when the output is not still being sent.
    st.sink.reduction = &reduction_;
    st.sink.dst = step.out.valid() ? ptr(step.out) : target;
    st.sink.local = step.local.valid() ? ptr(step.local) : nullptr;
    st.sink.post = step.post;
    if (!step.out.valid() || !writeBlocked(st.sink.dst, step.bytes)) st.recv.sink = &st.sink;
  }
  Connection* c = conn(st, step.recvPeer);
  *error = attachRegion(*c, st.recv);
  if (error->isOk()) *error = c->postRecv(&st.recv);
  if (error->isOk()) *error = c->progress();
  if (!error->isOk()) {
    failedPeer_ = step.recvPeer;
    return false;
  }
  st.phase = Phase::kReceiving;
  return true;
}

// Produces the step's result and posts its send. Returns kInProgress when it
// must wait (no free slot, or the output region is still being sent).
Status PlanRunner::compute(const Step& step, StreamState& st) {
  const Status kBlocked(Code::kInProgress, "");
  const size_t count = step.bytes / std::max<size_t>(1, kernels::dataTypeSize(reduction_.type));
  const std::byte* result = nullptr;
  int hold = -1;  // staging slot that holds the result
  if (step.recvPeer >= 0) {
    std::byte* in = st.recvSlot >= 0 ? st.slots + size_t(st.recvSlot) * st.slotBytes : ptr(step.out);
    if (step.reduce) {
      std::byte* dst = st.sink.dst;
      if (!st.recv.sunk) {  // else the transport already ran the sink
        if (step.out.valid() && writeBlocked(dst, step.bytes)) return kBlocked;
        st.sink.consume(0, in, step.bytes);
      }
      result = dst;
      if (dst == in) hold = st.recvSlot;
      else if (st.recvSlot >= 0) st.freeSlots |= 1u << st.recvSlot;
    } else {
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
      if (transform) kernels::reduce(reduction_, dst, nullptr, 0, src, count, step.post);
      else if (dst != src) kernels::copy(dst, src, step.bytes);
      result = dst;
    } else if (transform && step.sendPeer >= 0) {
      hold = takeSlot(st);
      if (hold < 0) return kBlocked;
      std::byte* dst = st.slots + size_t(hold) * st.slotBytes;
      kernels::reduce(reduction_, dst, nullptr, 0, src, count, step.post);
      result = dst;
    } else {
      result = src;
    }
  }
  if (step.sendPeer < 0) {
    if (hold >= 0) st.freeSlots |= 1u << hold;
    return Status::ok();
  }
  st.sends.push_back(PendingSend{{}, result, result + step.bytes, hold, step.sendPeer});
  PendingSend& ps = st.sends.back();
  ps.xfer.data = const_cast<std::byte*>(result);
  ps.xfer.bytes = step.bytes;
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
