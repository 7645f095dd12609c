#include "tools/perf/environment.h"

#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <string_view>

namespace loom::perf {
namespace {

const char* get(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

Result<int> parseNonNegative(const char* name, const char* text) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || errno == ERANGE || value < 0 || value > (1L << 30)) {
    return invalidArgument(std::string(name) + "='" + text + "' is not a non-negative integer");
  }
  return int(value);
}

struct RankPair {
  const char* rank;
  const char* size;
};

constexpr RankPair kRankPairs[] = {
    {"LOOM_RANK", "LOOM_WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI_RANK", "PMI_SIZE"},
    {"RANK", "WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};

constexpr const char* kLocalRankNames[] = {"LOOM_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "LOCAL_RANK", "SLURM_LOCALID"};

}  // namespace

Result<LaunchEnv> readLaunchEnv() {
  LaunchEnv env;
  const RankPair* chosen = nullptr;
  for (const RankPair& pair : kRankPairs) {
    const char* rank = get(pair.rank);
    const char* size = get(pair.size);
    if (rank == nullptr && size == nullptr) continue;
    if (rank == nullptr || size == nullptr) {
      return invalidArgument(std::string(rank ? pair.rank : pair.size) + " is set but " +
                             (rank ? pair.size : pair.rank) + " is not; set both or neither");
    }
    LOOM_ASSIGN_OR_RETURN(env.procRank, parseNonNegative(pair.rank, rank));
    LOOM_ASSIGN_OR_RETURN(env.nProcs, parseNonNegative(pair.size, size));
    if (env.nProcs < 1) {
      return invalidArgument(std::string(pair.size) + "=" + size + ": the number of processes must be at least 1");
    }
    if (env.procRank >= env.nProcs) {
      return invalidArgument(std::string(pair.rank) + "=" + rank + " is not below " + pair.size + "=" + size +
                             " (process ranks run from 0 to " + std::to_string(env.nProcs - 1) + ")");
    }
    env.rankSource = std::string(pair.rank) + "/" + pair.size;
    chosen = &pair;
    break;
  }
  // The pairs after the one used, read only to point out a disagreement.
  for (const RankPair* pair = chosen == nullptr ? std::end(kRankPairs) : chosen + 1; pair != std::end(kRankPairs);
       ++pair) {
    if (std::string_view(pair->size) == "SLURM_NTASKS") continue;
    const char* rank = get(pair->rank);
    const char* size = get(pair->size);
    if (rank == nullptr || size == nullptr) continue;
    Result<int> otherRank = parseNonNegative(pair->rank, rank);
    Result<int> otherSize = parseNonNegative(pair->size, size);
    if (otherRank.isOk() && otherSize.isOk() && otherRank.value() == env.procRank && otherSize.value() == env.nProcs) {
      continue;
    }
    env.ignoredPairs.push_back(std::string(pair->rank) + "=" + rank + " " + pair->size + "=" + size + " are ignored: " +
                               env.rankSource + " come first and say rank " + std::to_string(env.procRank) + " of " +
                               std::to_string(env.nProcs) + " (unset stale launcher variables if that is wrong)");
  }
  env.localRank = env.procRank;
  for (const char* name : kLocalRankNames) {
    if (const char* value = get(name)) {
      LOOM_ASSIGN_OR_RETURN(env.localRank, parseNonNegative(name, value));
      break;
    }
  }
  env.hasCommId = get("NCCL_COMM_ID") != nullptr;
  if (const char* mode = get("LOOM_DEVICE")) env.deviceMode = mode;
  if (env.deviceMode != "auto" && env.deviceMode != "host" && env.deviceMode != "cuda") {
    return invalidArgument("LOOM_DEVICE='" + env.deviceMode + "' is not one of auto, host, cuda");
  }
  if (const char* device = get("NCCL_TESTS_DEVICE")) {
    LOOM_ASSIGN_OR_RETURN(int first, parseNonNegative("NCCL_TESTS_DEVICE", device));
    env.firstDevice = first;
  }
  if (const char* minBw = get("NCCL_TESTS_MIN_BW")) env.minBusBw = std::atof(minBw);
  return env;
}

}  // namespace loom::perf
