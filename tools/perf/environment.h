// What the perf tools read from the environment, read in one place: the
// process's rank and count from whichever launcher started it, and a few
// nccl-tests and loom variables.
//
// The tools are separate programs that only use nccl.h, so they do not use
// the library's settings table; this file is their one getenv() site.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::perf {

struct LaunchEnv {
  int procRank = 0;
  int nProcs = 1;
  int localRank = 0;       // rank among the processes on this host
  std::string rankSource;  // "LOOM_RANK/LOOM_WORLD_SIZE", ..., or "" (single process)
  // Another launcher's pair that is set too and says otherwise (stale
  // variables, or one launcher started inside another): one line each, for
  // stderr. SLURM's pair is left out: it describes the allocation that the
  // other launchers usually run inside.
  std::vector<std::string> ignoredPairs;
  bool hasCommId = false;  // NCCL_COMM_ID is set
  std::string deviceMode = "auto";  // LOOM_DEVICE: auto, host or cuda
  std::optional<int> firstDevice;   // NCCL_TESTS_DEVICE
  double minBusBw = -1;             // NCCL_TESTS_MIN_BW; < 0 when unset
};

// Rank and size come from the first pair that is set, in this order:
// LOOM_RANK/LOOM_WORLD_SIZE, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE,
// PMI_RANK/PMI_SIZE, RANK/WORLD_SIZE (torchrun), SLURM_PROCID/SLURM_NTASKS.
// The local rank from LOOM_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, LOCAL_RANK or SLURM_LOCALID, else the process rank.
// A size below 1, a rank not below the size, a rank without its size (or
// the reverse) or a value that is not a number is an error that names the
// variables.
Result<LaunchEnv> readLaunchEnv();

}  // namespace loom::perf
