#include "api/api.h"

#include <pthread.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/asymmetric_fence.h"
#include "common/log.h"
#include "common/spin_mutex.h"

namespace loom::api {
namespace {

SpinMutex gMutex;  // guards gComms, gLastError and gSlots
std::set<const ncclComm*> gComms;
std::string gLastError;
// Bumped (under gMutex) whenever a handle leaves gComms: a thread's cached
// handles are good while it has not changed.
alignas(64) std::atomic<uint64_t> gGeneration{1};

}  // namespace

// One per thread that made a data call; reused after the thread exits.
struct alignas(64) CallSlot {
  std::atomic<const ncclComm*> inCall{nullptr};  // written by its thread only
  struct Cached {
    const ncclComm* handle = nullptr;
    core::Communicator* comm = nullptr;
    uint64_t generation = 0;
  };
  std::array<Cached, 4> cache;  // its thread's alone
  unsigned next = 0;
  bool owned = false;  // gMutex
};

namespace {

// Slots are never freed, not even at exit (a thread may still be in a
// call, or end after the library's statics): a teardown scans them without
// the lock.
std::vector<std::unique_ptr<CallSlot>>& gSlots = *new std::vector<std::unique_ptr<CallSlot>>;
// The calling thread's slot (a plain pointer: every data call reads it, and
// a thread_local with a destructor costs a guard on each access);
// tSlotRelease gives it back when the thread exits.
thread_local CallSlot* tSlot = nullptr;
struct SlotRelease {
  ~SlotRelease() {
    if (!tSlot) return;
    std::lock_guard<SpinMutex> lock(gMutex);
    tSlot->cache = {};
    tSlot->owned = false;
    tSlot = nullptr;
  }
};
thread_local SlotRelease tSlotRelease;

CallSlot* claimSlot() {
  (void)&tSlotRelease;  // constructs it, so that its destructor runs at thread exit
  std::lock_guard<SpinMutex> lock(gMutex);
  for (auto& s : gSlots) {
    if (!s->owned) {
      s->owned = true;
      return tSlot = s.get();
    }
  }
  gSlots.push_back(std::make_unique<CallSlot>());
  gSlots.back()->owned = true;
  return tSlot = gSlots.back().get();
}

// fork(): the child's only thread keeps its slot; the others' threads do
// not exist there, so their slots are free. gMutex is held across the fork,
// so that the child never inherits it held by a thread it does not have.
void lockForFork() { gMutex.lock(); }
void unlockAfterFork() { gMutex.unlock(); }
void resetSlotsInChild() {
  for (auto& s : gSlots) {
    if (s.get() == tSlot) continue;
    s->inCall.store(nullptr, std::memory_order_relaxed);
    s->cache = {};
    s->owned = false;
  }
  gMutex.unlock();
}

}  // namespace

ncclResult_t toNccl(Code code) { return ncclResult_t(int(code)); }

void recordError(const char* func, const Status& status) {
  std::string text = std::string(func) + ": " + status.message();
  LOOM_WARN("%s", (text + (status.toString().size() > status.message().size()
                               ? " " + status.toString().substr(status.message().size())
                               : ""))
                      .c_str());
  std::lock_guard<SpinMutex> lock(gMutex);
  gLastError = std::move(text);
}

const char* lastError() {
  std::lock_guard<SpinMutex> lock(gMutex);
  thread_local std::string copy;
  copy = gLastError;
  return copy.c_str();
}

void registerComm(ncclComm* comm) {
  static std::once_flag forkHandlers;
  std::call_once(forkHandlers, [] { pthread_atfork(lockForFork, unlockAfterFork, resetSlotsInChild); });
  AsymmetricFence::enable(FenceScope::kProcess);  // before any call can use the handle
  std::lock_guard<SpinMutex> lock(gMutex);
  gComms.insert(comm);
}

namespace {

Status notLive(const char* arg) {
  return invalidArgument(std::string(arg) +
                         " is not a live communicator (it was destroyed, aborted, or never created)");
}

Status forked(const char* arg, const core::Communicator& c) {
  return invalidUsage(std::string(arg) + " was created by process " + std::to_string(c.ownerPid()) +
                      " and this process (" + std::to_string(getpid()) +
                      ") inherited it through fork(); a communicator cannot be used, destroyed or aborted in a "
                      "forked child: create a new one there");
}

// The communicator behind a registered handle (gMutex held), without
// touching the handle unless it is one.
Result<core::Communicator*> registered(const ncclComm* comm, const char* arg) {
  if (!gComms.count(comm) || !comm->impl) return notLive(arg);
  return comm->impl.get();
}

}  // namespace

Result<core::CommRef> lookup(const ncclComm* comm, const char* arg) {
  if (!comm) return nullArgument(arg);
  std::lock_guard<SpinMutex> lock(gMutex);
  LOOM_ASSIGN_OR_RETURN(core::Communicator* c, registered(comm, arg));
  if (c->forkedAway()) return forked(arg, *c);
  if (!c->tryPin()) return notLive(arg);
  return core::CommRef::adopt(c);
}

Result<ncclComm*> takeHandle(const ncclComm* comm) {
  std::lock_guard<SpinMutex> lock(gMutex);
  LOOM_ASSIGN_OR_RETURN(core::Communicator* c, registered(comm, "comm"));
  if (c->forkedAway()) return forked("comm", *c);
  gComms.erase(comm);
  gGeneration.fetch_add(1, std::memory_order_seq_cst);
  return const_cast<ncclComm*>(comm);
}

namespace {

// The part of lookupUsable after the lookup, for a communicator that is
// not usable at once.
Status checkUsable(core::Communicator& c) {
  Status s = c.asyncError();
  if (s.code() == Code::kInProgress) {
    s = c.waitReady();  // host mode: calls block, so wait for a pending init
  }
  if (!s.isOk()) {
    return Status(s.code(), "the communicator has failed earlier and cannot be used: " + s.message());
  }
  return Status::ok();
}

}  // namespace

Result<core::CommRef> lookupUsable(const ncclComm* comm) {
  LOOM_ASSIGN_OR_RETURN(core::CommRef c, lookup(comm));
  if (!c->usableNow()) LOOM_TRY(checkUsable(*c));
  return c;
}

CallScope::CallScope(const ncclComm* comm) : slot_(tSlot ? tSlot : claimSlot()), comm_(comm) {
  slot_->inCall.store(comm, std::memory_order_relaxed);
  // Against takeHandle's bump of the generation and waitForCalls' look at
  // the slot: either this call sees the new generation, or the teardown
  // sees this call.
  AsymmetricFence::light(FenceScope::kProcess);
}

CallScope::~CallScope() { slot_->inCall.store(nullptr, std::memory_order_release); }

Result<core::Communicator*> CallScope::usable() {
  if (!comm_) return nullArgument("comm");
  core::Communicator* c = nullptr;
  const uint64_t generation = gGeneration.load(std::memory_order_acquire);
  for (const CallSlot::Cached& e : slot_->cache) {
    if (e.handle == comm_ && e.generation == generation) {
      c = e.comm;
      break;
    }
  }
  if (!c) {
    std::lock_guard<SpinMutex> lock(gMutex);
    LOOM_ASSIGN_OR_RETURN(c, registered(comm_, "comm"));
    slot_->cache[slot_->next++ % slot_->cache.size()] = {comm_, c, gGeneration.load(std::memory_order_relaxed)};
  }
  if (c->forkedAway()) return forked("comm", *c);
  if (!c->usableNow()) LOOM_TRY(checkUsable(*c));
  return c;
}

bool waitForCalls(const ncclComm* comm, Deadline deadline) {
  // Without the fence a call that read the old generation may go unseen.
  if (!AsymmetricFence::heavy(FenceScope::kProcess)) return false;
  std::vector<CallSlot*> slots;
  {
    std::lock_guard<SpinMutex> lock(gMutex);
    for (auto& s : gSlots) slots.push_back(s.get());
  }
  for (CallSlot* s : slots) {
    while (s->inCall.load(std::memory_order_acquire) == comm) {
      if (deadline.expired()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return true;
}

Status nullArgument(const char* arg) { return invalidArgument(std::string(arg) + " is NULL"); }

Status badType(ncclDataType_t type) {
  return invalidArgument("datatype " + std::to_string(int(type)) + " is not a valid ncclDataType_t (0.." +
                         std::to_string(int(ncclNumTypes) - 1) + ")");
}

Status badRank(int r, int nranks, const char* arg) {
  return invalidArgument(std::string(arg) + " " + std::to_string(r) + " is out of range: the communicator has " +
                         std::to_string(nranks) + " ranks");
}

}  // namespace loom::api
