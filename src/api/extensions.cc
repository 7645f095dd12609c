// loom's extensions (include/loom/loom.h): plain exported C functions, no
// pnccl-style profiling twins (NCCL has none of these to wrap).
#include <loom/loom.h>

#include <cmath>
#include <cstring>

#include "api/api.h"

static_assert(sizeof(loomBufferMode_t) == sizeof(int), "loomBufferMode_t is read as an int");

#define LOOM_API(ret, func, ...) extern "C" __attribute__((visibility("default"))) ret func(__VA_ARGS__)

using namespace loom;
using namespace loom::api;

LOOM_API(ncclResult_t, loomSetBufferMode, loomBufferMode_t mode) {
  return guard("loomSetBufferMode", [&]() -> Status {
    // As an int: a C caller may pass any value, which C++ may not load as the enum.
    int value = 0;
    std::memcpy(&value, &mode, sizeof value);
    switch (value) {
      case loomBufferModeDefault: core::setThreadDevice(""); return Status::ok();
      case loomBufferModeHost: core::setThreadDevice("host"); return Status::ok();
      case loomBufferModeCuda: core::setThreadDevice("cuda"); return Status::ok();
    }
    return invalidArgument("mode " + std::to_string(value) + " is not a loomBufferMode_t");
  });
}

LOOM_API(ncclResult_t, loomCommGetBufferMode, const ncclComm_t comm, loomBufferMode_t* mode) {
  return guard("loomCommGetBufferMode", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(core::CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(mode, "mode"));
    *mode = c->mode() == core::Mode::kCuda ? loomBufferModeCuda : loomBufferModeHost;
    return Status::ok();
  });
}

LOOM_API(ncclResult_t, loomCommSetTimeout, ncclComm_t comm, double seconds) {
  return guard("loomCommSetTimeout", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(core::CommRef c, lookup(comm));
    if (!std::isfinite(seconds) || seconds < 0) {
      return invalidArgument("seconds " + std::to_string(seconds) + " is not a timeout (0 or more; 0 = none)");
    }
    c->setTimeoutS(seconds);
    return Status::ok();
  });
}

LOOM_API(ncclResult_t, loomCommGetTimeout, const ncclComm_t comm, double* seconds) {
  return guard("loomCommGetTimeout", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(core::CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(seconds, "seconds"));
    *seconds = c->timeoutS();
    return Status::ok();
  });
}
