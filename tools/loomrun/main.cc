// loomrun: starts N local ranks of a command that rendezvous on their own
// (see launchUsage()).
#include <cstdio>

#include "tools/loomrun/launch_options.h"
#include "tools/loomrun/launcher.h"

int main(int argc, char** argv) {
  using namespace loom::launcher;
  loom::Result<LaunchOptions> options = parseLaunchOptions(argc, argv);
  if (!options.isOk()) {
    std::fprintf(stderr, "loomrun: %s\n", options.status().message().c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(launchUsage().c_str(), stdout);
    return 0;
  }
  Launcher launcher(std::move(options.value()));
  loom::Result<int> status = launcher.run();
  if (!status.isOk()) {
    std::fprintf(stderr, "loomrun: %s\n", status.status().message().c_str());
    return 1;
  }
  return status.value();
}
