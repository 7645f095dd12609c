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
  // Where ranks run, within loomrun's own CPU set of C cores (a core: all
  // of its hardware threads):
  //   share (the default): with 2 <= N <= C ranks, rank r gets cores
  //     [r*C/N, (r+1)*C/N), so no two ranks meet on a CPU and a rank's own
  //     threads (OpenMP, PyTorch) size themselves to its share; otherwise,
  //     and for ranks that will drive NVIDIA GPUs, wherever the kernel
  //     puts them;
  //   core: rank r runs on core r % C;
  //   none: wherever the kernel puts it.
  enum class Binding { kShare, kCore, kNone };
  Binding binding = Binding::kShare;
  std::vector<std::string> command;
  bool help = false;
};

Result<LaunchOptions> parseLaunchOptions(int argc, const char* const* argv);
std::string launchUsage();

}  // namespace loom::launcher
