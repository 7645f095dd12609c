// loom-info --flight DIR: merges the flight recorder files of all ranks
// (src/core/flight_recorder.h gives the format) into one table.
#pragma once

#include <string>

namespace loom::info {

// Prints the merged view to stdout; returns the exit status (0, or 2 when
// the folder holds no readable file).
int mergeFlight(const std::string& dir);

}  // namespace loom::info
