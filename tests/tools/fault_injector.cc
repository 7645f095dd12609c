// Test double loaded with LD_PRELOAD in front of the library: wraps
// ncclAllReduce to inject one fault so the perf tools' error paths can be
// tested. Data calls only (not float64: the tools combine their timings and
// counts with float64 allreduces, which stay untouched).
//
//   LOOM_PERF_FAULT=corrupt  the rank's results get one flipped bit
//   LOOM_PERF_FAULT=fail     the rank's call returns ncclInternalError
//   LOOM_PERF_FAULT=hang     the rank's call sleeps LOOM_PERF_FAULT_SECONDS
//                            (default 8), then returns ncclRemoteError
//   LOOM_PERF_FAULT_RANK=r   the global rank that misbehaves (default 1)
//
// Test-only code: it reads its switches straight from the environment.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "nccl.h"

namespace {

struct Fault {
  std::string mode;
  int rank = 1;
  int seconds = 8;
};

const Fault& fault() {
  static const Fault value = [] {
    Fault f;
    if (const char* mode = std::getenv("LOOM_PERF_FAULT")) f.mode = mode;
    if (const char* rank = std::getenv("LOOM_PERF_FAULT_RANK")) f.rank = std::atoi(rank);
    if (const char* seconds = std::getenv("LOOM_PERF_FAULT_SECONDS")) f.seconds = std::atoi(seconds);
    return f;
  }();
  return value;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff,
                                                                             size_t count, ncclDataType_t datatype,
                                                                             ncclRedOp_t op, ncclComm_t comm,
                                                                             cudaStream_t stream) {
  int rank = -1;
  const Fault& f = fault();
  if (datatype != ncclFloat64 && pncclCommUserRank(comm, &rank) == ncclSuccess && rank == f.rank) {
    if (f.mode == "fail") return ncclInternalError;
    if (f.mode == "hang") {
      sleep(unsigned(f.seconds));
      return ncclRemoteError;  // the communicator was aborted meanwhile: do not touch it
    }
    if (f.mode == "corrupt") {
      ncclResult_t result = pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
      if (result == ncclSuccess && count > 0) static_cast<unsigned char*>(recvbuff)[0] ^= 0x40;  // host mode
      return result;
    }
  }
  return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
