// Memory allocation and buffer registration (host mode: bookkeeping and
// validation; the CUDA path will register device memory).
#include <cstdlib>
#include <mutex>
#include <set>

#include "api/api.h"

using loom::Status;
using loom::core::Communicator;

namespace {

std::mutex gAllocMutex;
std::set<void*> gAllocations;  // live ncclMemAlloc pointers

}  // namespace

using namespace loom;
using namespace loom::api;

NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size) {
  return guard("ncclMemAlloc", [&]() -> Status {
    LOOM_TRY(checkPtr(ptr, "ptr"));
    if (size == 0) return loom::invalidArgument("size is 0");
    void* p = nullptr;
    if (posix_memalign(&p, 4096, size) != 0) {
      return loom::systemError("ncclMemAlloc: cannot allocate " + std::to_string(size) + " bytes of host memory");
    }
    std::lock_guard<std::mutex> lock(gAllocMutex);
    gAllocations.insert(p);
    *ptr = p;
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr) {
  return guard("ncclMemFree", [&]() -> Status {
    if (!ptr) return Status::ok();
    {
      std::lock_guard<std::mutex> lock(gAllocMutex);
      if (!gAllocations.erase(ptr)) {
        return loom::invalidArgument("ptr was not returned by ncclMemAlloc (or was freed already)");
      }
    }
    std::free(ptr);
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guard("ncclCommRegister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    LOOM_TRY(checkPtr(buff, "buff"));
    LOOM_TRY(checkPtr(handle, "handle"));
    if (size == 0) return loom::invalidArgument("size is 0");
    auto reg = std::make_unique<LoomRegistration>(LoomRegistration{buff, size});
    std::lock_guard<std::mutex> lock(comm->regMutex);
    *handle = reg.get();
    comm->registrations.insert(std::move(reg));
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    LOOM_TRY(checkPtr(handle, "handle"));
    std::lock_guard<std::mutex> lock(comm->regMutex);
    for (auto it = comm->registrations.begin(); it != comm->registrations.end(); ++it) {
      if (it->get() == handle) {
        comm->registrations.erase(it);
        return Status::ok();
      }
    }
    return loom::invalidArgument("handle was not returned by ncclCommRegister on this communicator");
  });
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
         int winFlags) {
  return guard("ncclCommWindowRegister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    return loom::invalidUsage("ncclCommWindowRegister (symmetric memory windows) is not supported by loom "
                              "yet; use ncclCommRegister");
  });
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  return guard("ncclCommWindowDeregister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    return loom::invalidUsage("ncclCommWindowDeregister is not supported by loom yet");
  });
}
