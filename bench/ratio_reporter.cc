#include "bench/ratio_reporter.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace loom::bench {

void RatioReporter::addBaseline(const std::string& name, const std::string& row, const std::string& column) {
  entries_[name] = Entry{"", row, column, true};
}

void RatioReporter::addKernel(const std::string& name, const std::string& baseline, const std::string& row,
                              const std::string& column, bool inSummary) {
  entries_[name] = Entry{baseline, row, column, inSummary};
}

void RatioReporter::remember(const Entry& e, const Cell& cell) {
  if (!e.inSummary) return;
  if (std::find(rows_.begin(), rows_.end(), e.row) == rows_.end()) rows_.push_back(e.row);
  if (std::find(columns_.begin(), columns_.end(), e.column) == columns_.end()) columns_.push_back(e.column);
  table_[e.row][e.column] = cell;
}

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  std::vector<Run> out = runs;
  for (Run& run : out) {
    const auto it = entries_.find(run.run_name.function_name);
    const auto gbsIt = run.counters.find("GB/s");
    if (it == entries_.end() || gbsIt == run.counters.end() || run.error_occurred) continue;
    const Entry& e = it->second;
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    const bool single = run.run_type == Run::RT_Iteration;
    if (!median && !single) continue;
    const double gbs = gbsIt->second.value;
    // The summary keeps the median when there are repetitions, else the run.
    const bool representative = median || run.repetitions <= 1;
    if (e.baseline.empty()) {
      if (representative) {
        baselineGbs_[run.run_name.function_name] = gbs;
        remember(e, Cell{gbs, 1.0});
      }
      continue;
    }
    const auto base = baselineGbs_.find(e.baseline);
    if (base == baselineGbs_.end() || base->second <= 0) continue;
    const double ratio = gbs / base->second;
    run.counters["x_base"] = benchmark::Counter(ratio);
    if (representative) remember(e, Cell{gbs, ratio});
  }
  ConsoleReporter::ReportRuns(out);
}

void RatioReporter::Finalize() {
  ConsoleReporter::Finalize();
  if (rows_.empty()) return;
  std::ostream& os = GetOutputStream();
  size_t rowWidth = 4;
  for (const auto& r : rows_) rowWidth = std::max(rowWidth, r.size());
  char buf[64];
  os << "\nSummary: GB/s (bytes read + written, 1e9/s) and ratio to the baseline of the same size"
     << " (medians when repeated)\n";
  os << std::string(rowWidth, ' ');
  for (const auto& c : columns_) {
    std::snprintf(buf, sizeof buf, " %16s", c.c_str());
    os << buf;
  }
  os << "\n";
  for (const auto& r : rows_) {
    os << r << std::string(rowWidth - r.size(), ' ');
    for (const auto& c : columns_) {
      const auto& row = table_[r];
      const auto cell = row.find(c);
      if (cell == row.end()) {
        std::snprintf(buf, sizeof buf, " %16s", "-");
      } else {
        std::snprintf(buf, sizeof buf, " %8.2f (x%4.2f)", cell->second.gbs, cell->second.ratio);
      }
      os << buf;
    }
    os << "\n";
  }
  os.flush();
}

}  // namespace loom::bench
