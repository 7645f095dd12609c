// One test thread: drives its ranks (-g of them) through the size sweep of
// every type, op and root, timing, checking and (on the printing thread)
// printing each row. Mirrors nccl-tests' TimeTest/BenchTime/startColl.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "nccl.h"
#include "tools/perf/backend.h"
#include "tools/perf/collective.h"
#include "tools/perf/environment.h"
#include "tools/perf/options.h"
#include "tools/perf/run_state.h"

namespace loom::perf {

// One rank of this process and everything the tests hold for it.
struct RankSlot {
  int rank = 0;     // global rank
  int device = -1;  // CUDA device, -1 for host buffers
  ncclComm_t comm = nullptr;
  Stream stream = nullptr;
  Buffer send;     // maxBytes (+ unalign padding)
  Buffer recv;
  Buffer scratch;  // small buffer for combining timings and counts
  std::vector<char> expected;  // host image of the result region
  void* sendHandle = nullptr;  // -R registration handles
  void* recvHandle = nullptr;
  ncclRedOp_t preMulOp = ncclSum;
  bool hasPreMulOp = false;
};

// What all threads of the process share (read-only during the run, except
// the tallies that only thread 0 writes).
struct RunContext {
  const Options* options;
  const Collective* collective;
  const LaunchEnv* env;
  Backend* backend;
  RunState* state;
  const char* programName;
  std::string host;
  int nThreads;
  int nGpus;
  int nProcs;
  int procRank;
  int totalRanks;
  int libraryVersion;
  uint64_t maxBytes;  // after any reduction for device memory
  ncclUniqueId uniqueId;
  std::string headerText;  // version lines up to "# Using devices"
  // Written by thread 0 only.
  double busBwSum = 0;
  int busBwCount = 0;
  int64_t outOfBounds = 0;
};

// The config every communicator is created with (nccl-tests' choices: -x
// sets CTAPolicy; 2.28 headers ask for nvlinkCentricSched).
ncclConfig_t makeCommConfig(const Options& options);
// Waits while a non-blocking communicator reports ncclInProgress.
Status waitCommReady(ncclComm_t comm, RunState& state);

class Worker {
 public:
  Worker(RunContext& context, int thread, std::vector<RankSlot*> slots);
  // Runs the thread's part of the test; the first error is also recorded in
  // the RunState (which aborts the communicators).
  Status run();

 private:
  enum class Combine { kRank0, kAverage, kMin, kMax, kSum };

  Status initComms();
  Status exchangeDeviceLines(std::string* lines);
  Status allocateBuffers();
  Status registerBuffers();
  Status deregisterBuffers();
  Status runAllTests();
  Status timeTest(const TypeInfo& type, Op op, int root);
  Status benchTime(bool inPlace);
  void setupSize(uint64_t bytes);
  Status startColl(int iter, bool inPlace);
  Status completeColl();
  Status waitAll();
  Status barrier();
  Result<double> combine(const std::vector<double>& perSlot, Combine mode);
  Status prepareData(uint64_t seed, bool inPlace);
  Result<int64_t> countWrong(bool inPlace);
  Status createPreMulOps();
  Status destroyPreMulOps();
  void print(const std::string& text) const;
  Status ncclFailure(ncclResult_t result, ncclComm_t comm, int line);

  RunContext& ctx_;
  const Options& opts_;
  const int thread_;
  const bool printer_;
  std::vector<RankSlot*> slots_;

  // The test in progress.
  const TypeInfo* type_ = nullptr;
  Op op_ = Op::kSum;
  int root_ = -1;
  uint64_t sizeBytes_ = 0;
  CollCounts counts_;
  uint64_t shiftBytes_ = 0, shiftSteps_ = 1;  // setupSize(): buffer offsets per call (startColl)
  std::vector<std::array<RunArgs, 2>> calls_;  // setupSize(): per slot, out of place and in place, at shift 0
  uint64_t seedCounter_ = 0;
};

}  // namespace loom::perf
