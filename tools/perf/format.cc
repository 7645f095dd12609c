#include "tools/perf/format.h"

#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace loom::perf {
namespace {

std::string printfString(const char* format, ...) __attribute__((format(printf, 1, 2)));

std::string printfString(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  int length = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string text(length > 0 ? size_t(length) : 0, '\0');
  if (length > 0) std::vsnprintf(text.data(), text.size() + 1, format, args);
  va_end(args);
  return text;
}

}  // namespace

std::string fitNumber(double value, int width, int decimals) {
  for (; decimals >= 0; --decimals) {
    std::string text = printfString("%*.*f", width, decimals, value);
    if (int(text.size()) <= width) return text;
  }
  // Exponent form, cut to the width like nccl-tests' snprintf(width + 1).
  std::string text = printfString(width >= 7 ? "%*.1e" : "%*.0e", width, value);
  if (int(text.size()) > width) text.resize(size_t(width));
  return text;
}

std::optional<uint64_t> parseSize(std::string_view text) {
  std::string copy(text);
  const char* begin = copy.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) return std::nullopt;
  while (*end == ' ') ++end;
  double units = 1;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K': units = 1024.0; ++end; break;
    case 'M': units = 1024.0 * 1024.0; ++end; break;
    case 'G': units = 1024.0 * 1024.0 * 1024.0; ++end; break;
    default: break;
  }
  std::string_view rest(end);
  if (units != 1 && (rest == "B" || rest == "b" || rest == "iB" || rest == "ib")) rest = {};
  if (!rest.empty()) return std::nullopt;
  double bytes = value * units;
  if (bytes >= 18446744073709551615.0) return std::nullopt;
  return uint64_t(bytes);
}

std::string runHeader(const RunDescription& run) {
  std::string out;
  // Not "# nccl-tests version": the tools are not nccl-tests, and scripts
  // key on the table, not on this line. The nccl-tests release whose format
  // is reproduced is named instead.
  out += printfString("# loom-tests version %s (nccl-tests %s compatible) nccl-headers=%d nccl-library=%d\n",
                      run.toolsVersion, kNcclTestsVersion, run.headerVersion, run.libraryVersion);
  out += printfString("# Collective test starting: %s\n", run.programName);
  bool factor = run.stepFactor > 1;
  out += printfString(
      "# nThread %d nGpus %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d unalign: %d\n",
      run.nThreads, run.nGpus, (unsigned long long)run.minBytes, (unsigned long long)run.maxBytes,
      (unsigned long long)(factor ? run.stepFactor : run.stepBytes), factor ? "factor" : "bytes",
      run.warmupIters, run.iters, run.aggIters, run.check, run.graphLaunches, run.unalign);
  if (run.blocking == 1) out += "# Blocking Enabled: wait and barrier after each inner iteration (-m) \n";
  if (run.blocking == 2) out += "# Blocking Enabled: wait after each inner iteration (-m), no barrier \n";
  if (run.blocking == 3) {
    out += "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n";
  }
  if (run.parallelInit) out += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
  out += "#\n";
  return out;
}

std::string deviceLine(int rank, int group, int pid, std::string_view host, int device,
                       std::string_view busId, std::string_view deviceName) {
  return printfString("#  Rank %2d Group %2d Pid %6d on %10.*s device %2d [%.*s] %.*s\n", rank, group, pid,
                      int(host.size()), host.data(), device, int(busId.size()), busId.data(),
                      int(deviceName.size()), deviceName.data());
}

std::string tableHeader(bool reportCputime, bool reportTimestamps) {
  const char* timeLabel = reportCputime ? "cputime" : "time";
  const char* stampLabel = reportTimestamps ? "timestamp" : "";
  const char* stampFormat = reportTimestamps ? "%Y-%m-%d %H:%M:%S" : "";
  int stampPad = reportTimestamps ? 19 : 0;
  std::string out = "#\n";
  out += printfString("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
                      "", "", "", "", "");
  out += printfString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count",
                      "type", "redop", "root", timeLabel, "algbw", "busbw", "#wrong", timeLabel, "algbw", "busbw",
                      "#wrong", stampPad, stampLabel);
  out += printfString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)",
                      "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
                      stampPad, stampFormat);
  return out;
}

std::string rowPrefix(uint64_t bytes, uint64_t count, std::string_view typeName, std::string_view opName,
                      int root) {
  return printfString("%12llu  %12llu  %8.*s  %6.*s  %6d", (unsigned long long)bytes, (unsigned long long)count,
                      int(typeName.size()), typeName.data(), int(opName.size()), opName.data(), root);
}

std::string rowBody(double timeUs, double algBw, double busBw, bool checked, int64_t wrong, int timeDecimals) {
  std::string time = fitNumber(timeUs, 7, timeDecimals);
  std::string alg = fitNumber(algBw, 6);
  std::string bus = fitNumber(busBw, 6);
  if (!checked) return printfString("  %7s  %6s  %6s    N/A", time.c_str(), alg.c_str(), bus.c_str());
  return printfString("  %7s  %6s  %6s  %6g", time.c_str(), alg.c_str(), bus.c_str(), double(wrong));
}

std::string rowTimestamp() {
  char buffer[64];
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", &local);
  return printfString("%21s", buffer);
}

namespace {

std::string memoryAmount(int64_t bytes) {
  double amount = double(bytes);
  const char* unit = " B";
  if (std::fabs(amount) >= 1024.0 * 1024.0 * 1024.0) {
    unit = " GB";
    amount /= 1024.0 * 1024.0 * 1024.0;
  } else if (std::fabs(amount) >= 1024.0 * 1024.0) {
    unit = " MB";
    amount /= 1024.0 * 1024.0;
  } else if (std::fabs(amount) >= 1024.0) {
    unit = " KB";
    amount /= 1024.0;
  }
  int decimals = std::fabs(amount) < 10.0 ? 2 : std::fabs(amount) < 100.0 ? 1 : 0;
  return printfString("%.*f%s", decimals, amount, unit);
}

}  // namespace

std::string memoryUsageLine(int64_t initialization, int64_t userAllocated, int64_t collective) {
  std::string usage = "Initialization " + memoryAmount(initialization) + " | User-Allocated " +
                      memoryAmount(userAllocated) + " | Collective " + memoryAmount(collective) + " | Total  " +
                      memoryAmount(initialization + userAllocated + collective);
  return printfString("# %-20s : %s\n", "GPU memory usage", usage.c_str());
}

std::string resultFooter(int64_t outOfBounds, double avgBusBw, double minBw, std::string_view programName) {
  std::string out;
  out += printfString("# %-20s : %lld %s\n", "Out of bounds values", (long long)outOfBounds,
                      outOfBounds ? "FAILED" : "OK");
  const char* bwVerdict = minBw < 0 ? "" : (avgBusBw < minBw * 0.9 ? "FAILED" : "OK");
  out += printfString("# %-20s : %g %s\n", "Avg bus bandwidth", avgBusBw, bwVerdict);
  out += "#\n";
  out += printfString("# Collective test concluded: %.*s\n", int(programName.size()), programName.data());
  return out;
}

}  // namespace loom::perf
