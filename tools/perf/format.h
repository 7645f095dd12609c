// Text output of the perf tools, line for line in nccl-tests 2.19.6's format
// so that scripts written for nccl-tests parse it unchanged: header lines,
// the result table (column widths, number fitting) and the footer.
//
// Every function returns the text (with its trailing newline where the line
// is complete); the caller decides which thread prints it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::perf {

// The nccl-tests release whose output format these functions reproduce.
inline constexpr const char* kNcclTestsVersion = "2.19.6";

// Fits `value` into exactly `width` characters the way nccl-tests does:
// "%.2f", else "%.1f", else "%.0f", else an exponent form cut to the width
// (starting from `decimals` instead of 2 where asked).
std::string fitNumber(double value, int width, int decimals = 2);

// Parses a size with an optional binary suffix: "8", "0.5G", "64K", "1M",
// "2GB", "4KiB". Returns nothing for malformed input or negative values.
std::optional<uint64_t> parseSize(std::string_view text);

struct RunDescription {
  const char* programName;   // "all_reduce_perf"
  const char* toolsVersion;  // loom's version
  int headerVersion;         // NCCL_VERSION_CODE the tool was built with
  int libraryVersion;        // ncclGetVersion()
  int nThreads;
  int nGpus;
  uint64_t minBytes;
  uint64_t maxBytes;
  uint64_t stepBytes;
  uint64_t stepFactor;
  int warmupIters;
  int iters;
  int aggIters;
  int check;
  int graphLaunches;
  int unalign;
  int blocking;
  bool parallelInit;
};

// Lines from the version line down to the "#" before "# Using devices".
std::string runHeader(const RunDescription& run);

// One "#  Rank ..." line. `busId` is "0000:1b:00" for a GPU; host ranks pass
// "host" and device -1.
std::string deviceLine(int rank, int group, int pid, std::string_view host, int device,
                       std::string_view busId, std::string_view deviceName);

// The "#" line and the three table header lines.
std::string tableHeader(bool reportCputime, bool reportTimestamps);

// Row start: size, count, type, redop, root.
std::string rowPrefix(uint64_t bytes, uint64_t count, std::string_view typeName,
                      std::string_view opName, int root);
// One placement's columns: time, algbw, busbw, #wrong ("N/A" when unchecked).
std::string rowBody(double timeUs, double algBw, double busBw, bool checked, int64_t wrong, int timeDecimals = 2);
// The timestamp column that -S adds after the in-place columns.
std::string rowTimestamp();

// "# GPU memory usage     : Initialization X | User-Allocated Y | Collective Z
// | Total  T" with nccl-tests' unit choice (B, KB, MB, GB; 2, 1 or 0 decimals).
std::string memoryUsageLine(int64_t initialization, int64_t userAllocated, int64_t collective);

// "# Out of bounds values" up to "# Collective test concluded". `minBw` < 0
// means no NCCL_TESTS_MIN_BW check.
std::string resultFooter(int64_t outOfBounds, double avgBusBw, double minBw,
                         std::string_view programName);

}  // namespace loom::perf
