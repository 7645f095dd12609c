// The shared driver of the perf tools: parses nccl-tests' flags, sets up
// ranks (processes x threads x ranks per thread), buffers and communicators,
// runs the size sweep, checks the results and prints nccl-tests' table.
//
// Each tool's main() is one line: return loom::perf::perfMain(argc, argv, X());
#pragma once

#include "tools/perf/collective.h"

namespace loom::perf {

// Exit status: 0 on success; otherwise nccl-tests' codes: 1 internal error,
// 2 CUDA error, 3 NCCL error, 4 timeout, 6 invalid usage, 7 wrong results
// or average bus bandwidth below NCCL_TESTS_MIN_BW.
int perfMain(int argc, char** argv, const Collective& collective);

}  // namespace loom::perf
