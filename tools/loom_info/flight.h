// loom-info --flight DIR: merges the flight recorder files of all ranks
// (src/core/flight_recorder.h gives the format) into one table.
#pragma once

#include <string>

namespace loom::info {

// Prints the merged view to stdout; returns the exit status (0, or 2 when
// the folder holds no readable file).
int mergeFlight(const std::string& dir);

// loom-info --trace DIR OUT: the same files as a Chrome trace (Trace Event
// format, for Perfetto or chrome://tracing): a process per host and pid, a
// row per communicator and rank, a slice per operation from start to end
// (a mark for one never started); then, per communicator, each
// operation's calls and their median, p99 and longest run times. Returns
// 0, 1 when OUT cannot be written, 2 when DIR holds no readable file.
int writeTrace(const std::string& dir, const std::string& path);

}  // namespace loom::info
