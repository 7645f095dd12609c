// Memory allocation and buffer registration. ncclCommRegister and
// ncclCommWindowRegister hand the buffer to the communicator's registration
// cache (core/registration.h): each connection registers it when a transfer
// first uses it.
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <map>

#include "api/api.h"
#include "core/mode.h"
#include "device/device.h"

using loom::Status;
using loom::core::Communicator;

namespace {

std::mutex gAllocMutex;
std::map<void*, loom::device::Api*> gAllocations;  // live ncclMemAlloc pointers: the table for device memory

// What a registered buffer holds: host memory in host mode, device memory
// in cuda mode.
loom::transport::MemoryType memoryOf(const Communicator& comm) {
  return comm.mode() == loom::core::Mode::kCuda ? loom::transport::MemoryType::kDevice
                                                : loom::transport::MemoryType::kHost;
}

// ncclCommRegister and ncclCommWindowRegister: the checks they share, then
// the buffer into the registration cache as `kind`; returns its handle.
// The communicator's init must be done (its mode says what the buffer
// holds): on a non-blocking one still initializing this is an error, as
// in NCCL.
loom::Result<uint64_t> registerBuffer(ncclComm_t comm, void* buff, size_t size, const void* out, const char* outName,
                                      loom::core::RegistrationCache::Kind kind) {
  LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, loom::api::lookup(comm));
  LOOM_TRY(loom::api::checkPtr(buff, "buff"));
  LOOM_TRY(loom::api::checkPtr(out, outName));
  if (size == 0) return loom::invalidArgument("size is 0");
  Status state = pinned->asyncError();
  if (state.code() == loom::Code::kInProgress) {
    // Not describe(): the init is still setting the rank it prints.
    return loom::invalidArgument("the communicator is still initializing (a non-blocking init, or one in a "
                                 "group not ended yet): register buffers once ncclGroupEnd has returned and "
                                 "ncclCommGetAsyncError reports ncclSuccess");
  }
  LOOM_TRY(state);
  return pinned->registrations().add(buff, size, memoryOf(*pinned), kind);
}

}  // namespace

using namespace loom;
using namespace loom::api;

// Device memory of the current device where new communicators would be in
// cuda mode (LOOM_DEVICE), else page-aligned host memory.
NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size) {
  return guard("ncclMemAlloc", [&]() -> Status {
    LOOM_TRY(checkPtr(ptr, "ptr"));
    if (size == 0) return loom::invalidArgument("size is 0");
    LOOM_ASSIGN_OR_RETURN(core::Mode mode, core::resolveMode(core::CommOptions::fromSettings().device));
    void* p = nullptr;
    device::Api* table = nullptr;
    if (mode == core::Mode::kCuda) {
      table = device::api();
      LOOM_ASSIGN_OR_RETURN(p, table->allocDevice(size));
    } else if (posix_memalign(&p, 4096, size) != 0) {
      return loom::systemError("ncclMemAlloc: cannot allocate " + std::to_string(size) + " bytes of host memory");
    }
    std::lock_guard<std::mutex> lock(gAllocMutex);
    gAllocations[p] = table;
    *ptr = p;
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr) {
  return guard("ncclMemFree", [&]() -> Status {
    if (!ptr) return Status::ok();
    device::Api* table = nullptr;
    {
      std::lock_guard<std::mutex> lock(gAllocMutex);
      auto it = gAllocations.find(ptr);
      if (it == gAllocations.end()) {
        return loom::invalidArgument("ptr was not returned by ncclMemAlloc (or was freed already)");
      }
      table = it->second;
      gAllocations.erase(it);
    }
    if (table) table->freeDevice(ptr);
    else std::free(ptr);
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guard("ncclCommRegister", [&]() -> Status {
    // Each connection registers it when a transfer first uses it
    // (core/registration.h); a CUDA IPC connection's peer then copies
    // straight out of it.
    LOOM_ASSIGN_OR_RETURN(uint64_t h, registerBuffer(comm, buff, size, handle, "handle",
                                                     core::RegistrationCache::Kind::kBuffer));
    *handle = reinterpret_cast<void*>(uintptr_t(h));
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    LOOM_TRY(checkPtr(handle, "handle"));
    return pinned->registrations().remove(uint64_t(reinterpret_cast<uintptr_t>(handle)));
  });
}

// A window is a registration (the same effect as ncclCommRegister: each
// connection registers the buffer when a transfer first uses it, and a
// registered buffer skips a copy) undone only by ncclCommWindowDeregister.
// NCCL runs symmetric kernels on NCCL_WIN_COLL_SYMMETRIC windows; loom has
// none, so the flag changes nothing. Sizes are not compared across ranks:
// the call needs no communication, in a group or not.
NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
         int winFlags) {
  return guard("ncclCommWindowRegister", [&]() -> Status {
    if ((winFlags & ~NCCL_WIN_COLL_SYMMETRIC) != 0) {
      return loom::invalidArgument("winFlags " + std::to_string(winFlags) +
                                   ": only NCCL_WIN_DEFAULT and NCCL_WIN_COLL_SYMMETRIC are defined");
    }
    LOOM_ASSIGN_OR_RETURN(uint64_t h, registerBuffer(comm, buff, size, win, "win",
                                                     core::RegistrationCache::Kind::kWindow));
    *win = reinterpret_cast<ncclWindow_t>(uintptr_t(h));
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  return guard("ncclCommWindowDeregister", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    LOOM_TRY(checkPtr(win, "win"));
    return pinned->registrations().remove(uint64_t(reinterpret_cast<uintptr_t>(win)),
                                          core::RegistrationCache::Kind::kWindow);
  });
}

// NCCL's device API (nccl_device.h: kernels that communicate from the GPU)
// is not implemented. Its two host entry points that return an
// ncclResult_t are exported anyway, so a program linked against NCCL 2.28
// that calls them (PyTorch's symmetric memory, say) gets this error through
// loom instead of dying on a missing symbol. Their structure arguments are
// never touched, so they are opaque here.
NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const void* requirements, void* devComm) {
  return guard("ncclDevCommCreate", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    return loom::invalidUsage("ncclDevCommCreate: NCCL's device API (nccl_device.h, GPU-initiated "
                              "communication) is not supported by loom");
  });
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const void* devComm) {
  return guard("ncclDevCommDestroy", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef pinned, lookup(comm));
    return loom::invalidUsage("ncclDevCommDestroy: NCCL's device API is not supported by loom");
  });
}
