// Command-line options of the perf tools: nccl-tests' flags, long names and
// defaults. GPU-only flags are accepted; Options records what loom does with
// each (see usageText()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "nccl.h"
#include "tools/perf/datatypes.h"

namespace loom::perf {

struct Options {
  int nThreads = 1;
  int nGpus = 1;
  uint64_t minBytes = 32ull << 20;
  uint64_t maxBytes = 32ull << 20;
  uint64_t stepBytes = 1ull << 20;
  uint64_t stepFactor = 1;
  int iters = 20;
  int warmupIters = 1;
  int aggIters = 1;
  int runCycles = 1;  // 0: repeat forever
  bool parallelInit = false;
  int check = 1;
  std::optional<Op> op = Op::kSum;                    // nullopt: "all"
  std::optional<ncclDataType_t> type = ncclFloat32;   // nullopt: "all"
  int root = 0;                                       // -1: every root
  int blocking = 0;
  bool streamNull = false;
  int timeoutSeconds = 0;
  bool reportCputime = false;
  bool reportTimestamps = false;
  int average = 1;  // 0 rank 0, 1 avg, 2 min, 3 max
  int localRegister = 0;
  int ctaPolicy = -1;  // -1: leave config.CTAPolicy undefined
  int memoryReport = 0;
  int unalign = 0;
  // loom's own (--time_decimals, no short form): decimals of the time
  // columns, 2 as in nccl-tests; fewer where the number would not fit.
  int timeDecimals = 2;
  bool help = false;

  // Flags loom accepts but does not act on; each entry is a note printed as
  // a "# ..." line before the header so the run says what was ignored.
  std::vector<std::string> ignoredNotes;
};

// Parses argv[1..argc). Errors name the flag and the accepted values.
Result<Options> parseOptions(int argc, const char* const* argv);

// The -h text: nccl-tests' flags, plus what loom does with the GPU-only ones.
std::string usageText(const char* programName);

}  // namespace loom::perf
