// Error strings, the last error, and debug re-initialisation.
#include "api/api.h"
#include "common/log.h"
#include "common/settings.h"

using namespace loom::api;

NCCL_API(const char*, ncclGetErrorString, ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the loom developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

NCCL_API(const char*, ncclGetLastError, ncclComm_t comm) {
  (void)comm;  // one process-wide last error, as NCCL
  try {
    return lastError();
  } catch (...) {
    return "ncclGetLastError: out of memory while copying the last error";
  }
}

// No exception may leave a C entry point; a failed reload keeps the old
// settings.
static void resetDebug() noexcept {
  try {
    loom::settings::reload();
    loom::log::reset();
  } catch (...) {
  }
}

NCCL_API(void, ncclResetDebugInit) { resetDebug(); }

// NVIDIA's library exports this helper too (it matches the nccl* pattern).
extern "C" __attribute__((visibility("default"))) void ncclResetDebugInitInternal() { resetDebug(); }
