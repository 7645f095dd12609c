#include "tools/loomrun/launch_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace loom::launcher {
namespace {

Result<double> parseSeconds(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value) || value < 0) {
    return invalidArgument(flag + " expects a number of seconds, got '" + text + "'");
  }
  return value;
}

Result<LaunchOptions::Binding> parseBinding(const char* text) {
  if (std::strcmp(text, "share") == 0) return LaunchOptions::Binding::kShare;
  if (std::strcmp(text, "core") == 0) return LaunchOptions::Binding::kCore;
  if (std::strcmp(text, "none") == 0) return LaunchOptions::Binding::kNone;
  return invalidArgument(std::string("--bind-to expects share, core or none, got '") + text + "'");
}

}  // namespace

Result<LaunchOptions> parseLaunchOptions(int argc, const char* const* argv) {
  LaunchOptions options;
  int i = 1;
  auto value = [&](const std::string& flag) -> Result<std::string> {
    if (i + 1 >= argc) return invalidArgument(flag + " needs a value");
    return std::string(argv[++i]);
  };
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the command starts here
    if (arg == "-h" || arg == "--help") {
      options.help = true;
    } else if (arg == "-n" || arg == "-np" || arg == "--np") {
      LOOM_ASSIGN_OR_RETURN(std::string text, value(arg));
      char* end = nullptr;
      long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1 || n > 4096) {
        return invalidArgument(arg + " expects a rank count from 1 to 4096, got '" + text + "'");
      }
      options.nranks = int(n);
    } else if (arg == "--tag") {
      options.tag = true;
    } else if (arg == "--output") {
      LOOM_ASSIGN_OR_RETURN(options.outputDir, value(arg));
    } else if (arg == "--timeout") {
      LOOM_ASSIGN_OR_RETURN(std::string text, value(arg));
      LOOM_ASSIGN_OR_RETURN(options.timeoutSeconds, parseSeconds(arg, text));
    } else if (arg == "--bind-to") {
      LOOM_ASSIGN_OR_RETURN(std::string text, value(arg));
      LOOM_ASSIGN_OR_RETURN(options.binding, parseBinding(text.c_str()));
    } else if (arg == "--grace") {
      LOOM_ASSIGN_OR_RETURN(std::string text, value(arg));
      LOOM_ASSIGN_OR_RETURN(options.graceSeconds, parseSeconds(arg, text));
    } else {
      return invalidArgument("unknown option '" + arg + "'; run loomrun -h for the list");
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.help) return options;
  if (options.nranks == 0) return invalidArgument("give the number of ranks with -n N");
  if (options.command.empty()) return invalidArgument("give the command to run after the options");
  return options;
}

std::string launchUsage() {
  return R"(USAGE: loomrun -n N [--tag] [--output DIR] [--timeout SECONDS] [--grace SECONDS]
               [--bind-to share|core|none] [--] command [args...]

Starts N local processes of `command` that find each other on their own. Each gets
  LOOM_RANK=0..N-1, LOOM_WORLD_SIZE=N, LOOM_LOCAL_RANK=LOOM_RANK,
  NCCL_COMM_ID=127.0.0.1:<a free port>   (the rendezvous; replaces any value set),
  LOOM_COMM_SECRET=<fresh random hex>    (proves connections come from this job),
and stdin from /dev/null.

  -n, --np N         number of ranks (processes)
  --tag              prefix every output line with "[rank] " (stdout and stderr kept apart)
  --output DIR       write DIR/rank.<r>.out and DIR/rank.<r>.err instead (creates DIR)
  --timeout SECONDS  stop every rank after this long and exit with 124
  --grace SECONDS    time between SIGTERM and SIGKILL when stopping ranks (default 3)
  --bind-to share    (the default) when the N >= 2 ranks fit on the C cores loomrun may
                     use, rank r runs on its own share of them, cores r*C/N to
                     (r+1)*C/N - 1 (a core: all of its hardware threads; a package's
                     cores side by side), so no two ranks meet on a CPU and each rank's
                     thread pools size themselves to its share. More ranks than cores
                     are spread as with core. The kernel places the ranks on a host
                     with an NVIDIA GPU unless LOOM_DEVICE=host (a GPU rank belongs
                     near its GPU)
  --bind-to core     run rank r on core r % C (in the order above): ranks spread evenly,
                     also when they outnumber the cores
  --bind-to none     the kernel places every rank
  -h, --help         this text

When a rank exits with a non-zero status or is killed by a signal, loomrun stops the
others (SIGTERM, then SIGKILL after the grace period) and exits with that rank's
status (128 + signal number for a signal). SIGINT, SIGTERM and SIGHUP sent to loomrun
are forwarded to every rank (a second one kills them at once); loomrun then exits with
128 + that signal. Ranks run in their own process groups and die with loomrun even if
it is killed.
)";
}

}  // namespace loom::launcher
