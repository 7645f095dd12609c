// Console output of Google Benchmark plus loom's bandwidth bookkeeping:
// every kernel benchmark names a baseline benchmark (STREAM add, memcpy,
// cudaMemcpy D2D) measured in the same run at the same size; the reporter
// adds its ratio to the baseline as the counter "x_base" and prints a
// summary table when the run ends.
//
// Every benchmark must set the counter "GB/s" (bytes read + written per
// second, 1e9 bytes). With --benchmark_repetitions the ratios and the summary
// use medians.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace loom::bench {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // A baseline benchmark: its GB/s is what others are compared with.
  void addBaseline(const std::string& name, const std::string& row, const std::string& column);
  // A measured benchmark compared with `baseline` (a name given to addBaseline).
  void addKernel(const std::string& name, const std::string& baseline, const std::string& row,
                 const std::string& column, bool inSummary);

  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override;

 private:
  struct Entry {
    std::string baseline;  // empty for a baseline
    std::string row;
    std::string column;
    bool inSummary = true;
  };
  struct Cell {
    double gbs = 0;
    double ratio = 0;
  };
  void remember(const Entry& e, const Cell& cell);

  std::map<std::string, Entry> entries_;
  std::map<std::string, double> baselineGbs_;  // by baseline name: latest median (or single run)
  std::map<std::string, std::map<std::string, Cell>> table_;
  std::vector<std::string> rows_;
  std::vector<std::string> columns_;
};

}  // namespace loom::bench
