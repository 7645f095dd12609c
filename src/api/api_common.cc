#include "api/api.h"

#include <unistd.h>

#include <cstdio>

#include "common/log.h"
#include "common/spin_mutex.h"

namespace loom::api {
namespace {

SpinMutex gMutex;  // guards gComms and gLastError
std::set<const ncclComm*> gComms;
std::string gLastError;

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

}  // namespace

Result<core::CommRef> lookup(const ncclComm* comm, const char* arg) {
  if (!comm) return invalidArgument(std::string(arg) + " is NULL");
  std::lock_guard<SpinMutex> lock(gMutex);
  if (!gComms.count(comm) || !comm->impl) return notLive(arg);
  core::Communicator* c = comm->impl.get();
  if (c->forkedAway()) return forked(arg, *c);
  if (!c->tryPin()) return notLive(arg);
  return core::CommRef::adopt(c);
}

Result<ncclComm*> takeHandle(const ncclComm* comm) {
  std::lock_guard<SpinMutex> lock(gMutex);
  if (!gComms.count(comm) || !comm->impl) return notLive("comm");
  if (comm->impl->forkedAway()) return forked("comm", *comm->impl);
  gComms.erase(comm);
  return const_cast<ncclComm*>(comm);
}

Result<core::CommRef> lookupUsable(const ncclComm* comm) {
  LOOM_ASSIGN_OR_RETURN(core::CommRef c, lookup(comm));
  if (c->usableNow()) return c;
  Status s = c->asyncError();
  if (s.code() == Code::kInProgress) {
    s = c->waitReady();  // host mode: calls block, so wait for a pending init
  }
  if (!s.isOk()) {
    return Status(s.code(), "the communicator has failed earlier and cannot be used: " + s.message());
  }
  return c;
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
