// What one perf tool tests: the sizes it derives from a byte count, its bus
// bandwidth correction, the data it puts in and expects back, and the NCCL
// call itself. One small file per collective implements this; common.cc
// runs everything else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl.h"
#include "tools/perf/verifiable.h"

namespace loom::perf {

// Element counts for one size, per rank (nccl-tests' getCollByteCount).
struct CollCounts {
  uint64_t send = 0;   // elements in the send buffer
  uint64_t recv = 0;   // elements in the result region
  uint64_t param = 0;  // the count passed to NCCL (printed as "count")
  // In-place: the send data starts at recvbuff + sendInplaceOffset * rank
  // elements, the result at recvbuff + recvInplaceOffset * rank.
  uint64_t sendInplaceOffset = 0;
  uint64_t recvInplaceOffset = 0;
};

// How a tool uses the reduction operation.
enum class OpUse {
  kReduce,    // runs each -o op and checks reductions
  kNameOnly,  // loops over -o like nccl-tests' sendrecv, but moves data only
  kNone,      // prints "none"
};

struct DataArgs {
  GenSpec spec;  // type, op (Op::kNone for data movement), nranks, seed
  int rank;
  int root;
  CollCounts counts;
  void* input;     // counts.send elements to fill
  void* expected;  // counts.recv elements; holds the region's contents before
                   // the op, collectives overwrite what the op defines
};

struct RunArgs {
  const void* send;
  void* recv;
  uint64_t count;  // CollCounts::param
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  int rank;
  int nranks;
  size_t elementSize;
  int libraryVersion;  // ncclGetVersion(), for calls newer libraries add
  ncclComm_t comm;
  cudaStream_t stream;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual const char* name() const = 0;  // "all_reduce"
  virtual OpUse opUse() const = 0;
  virtual bool hasRoot() const { return false; }
  // nccl-tests does not check in-place alltoall and sendrecv.
  virtual bool checksInPlace() const { return true; }

  virtual CollCounts counts(uint64_t count, size_t elementSize, int nranks) const = 0;
  // Bytes counted in algbw for one op, and the busbw factor.
  virtual double algorithmBytes(uint64_t paramCount, size_t elementSize, int nranks) const = 0;
  virtual double busFactor(int nranks) const = 0;

  virtual void fillInput(const DataArgs& args) const = 0;
  virtual void fillExpected(const DataArgs& args) const = 0;
  virtual ncclResult_t run(const RunArgs& args) const = 0;
};

// Helpers for the collective files.
inline void* elementAt(void* base, uint64_t index, size_t elementSize) {
  return static_cast<char*>(base) + index * elementSize;
}
inline uint64_t alignDown16Bytes(uint64_t count, size_t elementSize) {
  return count & ~uint64_t(16 / elementSize - 1);
}

}  // namespace loom::perf
