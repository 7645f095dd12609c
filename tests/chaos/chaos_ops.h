// The random operations of the chaos suite: which operation comes next (the
// same on every rank, derived from a seed), and running one with its
// buffers filled and its result checked.
//
// Only the public C API (nccl.h) is used here.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::chaos {

// CLOCK_MONOTONIC in seconds: the clock of Python's time.monotonic(), so
// the driver can compare its kill time with the times the ranks print.
double monotonicSeconds();

enum class Kind {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kSendRecvRing,  // send to rank+1, receive from rank-1, in one group
  kTwoInGroup,    // an AllReduce and an AllGather in one group
  kSplit,         // split by rank % 2, one AllReduce on the child, destroy it
};

struct Op {
  Kind kind = Kind::kAllReduce;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  size_t count = 0;  // elements; per-rank block for the gathering kinds
  int root = 0;
  bool inPlace = false;
  uint32_t salt = 0;  // varies the values from one operation to the next
  // e.g. "AllReduce/float32/sum/n=1031/inplace", no spaces.
  std::string describe() const;
};

// What the sequence draws from.
struct Profile {
  size_t maxBytes = 8u << 20;  // the largest buffer an operation uses
  bool split = false;          // include kSplit
  bool soak = false;           // sizes mostly <= 64 KiB, sometimes up to maxBytes
};

// Operation number `index` of the sequence `seed`: a pure function, so all
// ranks that use the same seed issue matching calls.
Op planOp(uint64_t seed, uint64_t index, int nranks, const Profile& profile);

// Runs operations on one rank's communicator. Buffers are allocated once
// (4 x maxBytes). Not thread-safe; one Runner per rank.
class Runner {
 public:
  Runner(ncclComm_t comm, int rank, int nranks, size_t maxBytes);

  // Runs `op`; returns the first failing call's result or ncclSuccess.
  // After a failure, failTime() and failText() describe it (taken right
  // when the call returned). On success, mismatches found by the checks
  // are appended to `wrong`.
  ncclResult_t run(const Op& op, std::vector<std::string>* wrong);

  double failTime() const { return failTime_; }
  const std::string& failText() const { return failText_; }
  // The failure was on the child communicator of a kSplit (whose messages
  // number the ranks of the child), not on the communicator given here.
  bool failedOnChild() const { return failedOnChild_; }

 private:
  ncclResult_t fail(ncclResult_t rc);
  ncclResult_t runAllReduce(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runAllGather(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runReduceScatter(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runRooted(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runAlltoAll(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runSendRecv(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runTwoInGroup(const Op& op, std::vector<std::string>* wrong);
  ncclResult_t runSplit(const Op& op, std::vector<std::string>* wrong);

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  std::vector<int> all_;  // 0 .. nranks-1
  std::vector<unsigned char> send_, recv_, send2_, recv2_;
  double failTime_ = 0;
  std::string failText_;
  bool failedOnChild_ = false;
};

}  // namespace loom::chaos
