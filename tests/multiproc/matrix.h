// The collective matrix: one case = (collective, type, op, in/out of place,
// count, root) on a set of communicators whose ranks run as threads.
//
// For each case every rank's buffers are laid out as
//   [64 guard bytes][elements][64 guard bytes]
// and filled with a background pattern, the inputs are written, and an
// image of what every byte must hold afterwards is computed from the
// inputs alone (dtype_ref / reduce_ref). After the call the buffers must
// equal their images bit for bit: outputs exact (floating avg on 3 or 5
// ranks within kAvgToleranceUlp), and everything else, guards and send
// buffers included, unchanged.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "reduce_ref.h"

namespace loom::test {

enum class Coll {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecvRing,
  kSendRecvAllPairs,
};
const char* collName(Coll c);
bool collReduces(Coll c);
bool collRooted(Coll c);
bool collHasInPlace(Coll c);

struct Case {
  Coll coll = Coll::kAllReduce;
  ncclDataType_t type = ncclFloat32;
  Red red = Red::kNone;
  bool inPlace = false;
  size_t count = 0;  // NCCL's count argument (per rank or per peer where NCCL says so)
  int root = 0;
  int nranks = 1;
  uint64_t seed = 1;
  std::string describe() const;
};

// Communicators for n ranks, made once by ncclCommInitAll and reused by
// every case; rebuilt when a case leaves them broken. `env` (NAME=VALUE)
// is set in this process only while the communicators are created (loom
// reads its settings again through ncclResetDebugInit), e.g. to make them
// use TCP instead of shared memory.
class CommSet {
 public:
  explicit CommSet(int n, std::vector<std::string> env = {});
  ~CommSet();
  CommSet(const CommSet&) = delete;
  CommSet& operator=(const CommSet&) = delete;
  int size() const { return n_; }
  ncclComm_t operator[](int r) const { return comms_[size_t(r)]; }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // Aborts the communicators and creates new ones.
  void rebuild();

 private:
  void create();
  void release();
  int n_;
  std::vector<std::string> env_;
  std::vector<ncclComm_t> comms_;
  bool ok_ = false;
  std::string error_;
};

// The cases of one collective for one rank count (see matrix.cc for the
// counts and how the big ones are sampled).
std::vector<Case> casesFor(Coll coll, int nranks);

// Runs one case; returns what went wrong (empty: passed). Rebuilds `comms`
// when a call failed.
std::vector<std::string> runCase(CommSet& comms, const Case& c);

// Runs one case as rank `rank` only (the other ranks are other processes
// running the same case). Builds every rank's inputs, checks this rank's.
std::vector<std::string> runCaseAsRank(ncclComm_t comm, int rank, const Case& c);

}  // namespace loom::test
