// Command line of loomrun: `loomrun -n N [options] [--] command args...`.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace loom::launcher {

struct LaunchOptions {
  int nranks = 0;
  bool tag = false;          // prefix output lines with "[rank] "
  std::string outputDir;     // write DIR/rank.N.out and .err instead
  double timeoutSeconds = 0; // 0: no limit
  double graceSeconds = 3;   // SIGTERM to SIGKILL
  // --bind-to core: rank r runs on core r % cores of loomrun's own CPU set
  // (all of that core's hardware threads); none: wherever the kernel puts it.
  bool bindToCore = false;
  std::vector<std::string> command;
  bool help = false;
};

Result<LaunchOptions> parseLaunchOptions(int argc, const char* const* argv);
std::string launchUsage();

}  // namespace loom::launcher
