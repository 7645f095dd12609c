// Shared pieces of the C ABI layer: the ncclComm handle, the registry of
// live handles (so a destroyed or bogus handle is an error, not a crash),
// the entry-point wrapper and argument checks.
//
// Only src/api/ says extern "C". Every entry point is
//   NCCL_API(ret, ncclName, params...) { return guard("ncclName", [&] { ... }); }
// which defines pncclName and makes ncclName a weak alias of it, converts
// Status to ncclResult_t, records the message for ncclGetLastError, and
// catches anything the standard library throws.
#pragma once

#include <nccl.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"
#include "common/time.h"
#include "core/communicator.h"

struct ncclComm {
  std::unique_ptr<loom::core::Communicator> impl;
};

#define NCCL_API(ret, func, ...)                                                       \
  extern "C" __attribute__((visibility("default"))) ret p##func(__VA_ARGS__);          \
  extern "C" __attribute__((visibility("default"), weak, alias("p" #func))) ret func(  \
      __VA_ARGS__);                                                                    \
  extern "C" __attribute__((visibility("default"))) ret p##func(__VA_ARGS__)

namespace loom::api {

ncclResult_t toNccl(Code code);
// Records the message of a failed call (ncclGetLastError) and logs it.
void recordError(const char* func, const Status& status);
const char* lastError();

template <typename F>
ncclResult_t guard(const char* func, F&& body) noexcept {
  try {
    Status s = body();
    if (!s.isOk() && s.code() != Code::kInProgress) recordError(func, s);
    return toNccl(s.code());
  } catch (const std::bad_alloc&) {
    recordError(func, systemError("out of host memory"));
    return ncclSystemError;
  } catch (const std::exception& e) {
    recordError(func, internalError(std::string("unexpected exception: ") + e.what()));
    return ncclInternalError;
  } catch (...) {
    recordError(func, internalError("unexpected exception"));
    return ncclInternalError;
  }
}

// Handle registry. A call other than a data call looks its handle up and
// pins it for the whole call (core::CommRef); data calls hold it through a
// CallScope. Destroy and abort remove it from the registry first (so
// exactly one of two racing teardowns wins), then wait for both.
void registerComm(ncclComm* comm);
// The pinned communicator behind a handle, or an error naming `arg`. A
// handle inherited through fork() is kInvalidUsage.
Result<core::CommRef> lookup(const ncclComm* comm, const char* arg = "comm");
// Same, and also refuses a communicator whose sticky error is set.
Result<core::CommRef> lookupUsable(const ncclComm* comm);
// Removes a handle from the registry (the caller then owns it) for destroy
// or abort; an error when it is not live or not this process's.
Result<ncclComm*> takeHandle(const ncclComm* comm);

// A data call's hold on its communicator, the path of every collective:
// no lock and no atomic read-modify-write on the way in or out, where a pin
// costs three (registry lock, pin, unpin). The calling thread names the
// handle in a slot of its own and finds it in a small cache of handles
// it saw live, valid while the registry has lost none since; a teardown
// removes the handle first (takeHandle), then waits until no slot names it
// (waitForCalls). An operation that outlives the call (a group's, a
// device queue's) pins the communicator for that (core::enqueue).
struct CallSlot;
class CallScope {
 public:
  explicit CallScope(const ncclComm* comm);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  // lookupUsable()'s checks and errors; the communicator stays valid until
  // the scope ends.
  Result<core::Communicator*> usable();

 private:
  CallSlot* slot_;
  const ncclComm* comm_;
};
// After takeHandle(comm): waits until no thread is inside a data call on
// it; false when one still is at `deadline` (or the fence this needs
// failed): its memory must then be kept.
bool waitForCalls(const ncclComm* comm, Deadline deadline);

// The argument checks every data call makes: inline, so that the common
// case (a valid argument) costs a compare; the error is built out of line.
Status nullArgument(const char* arg);
Status badType(ncclDataType_t type);
Status badRank(int r, int nranks, const char* arg);
inline Status checkPtr(const void* p, const char* arg) { return p ? Status::ok() : nullArgument(arg); }
inline Status checkType(ncclDataType_t type) {
  return int(type) >= 0 && int(type) < int(ncclNumTypes) ? Status::ok() : badType(type);
}
inline Status checkRank(int r, int nranks, const char* arg) {
  return r >= 0 && r < nranks ? Status::ok() : badRank(r, nranks, arg);
}

}  // namespace loom::api
