// loom-info: what this build of loom is and how it is configured.
//
//   loom-info            version, features, every setting (type, default,
//                        current value and where it came from, doc)
//   loom-info -s NAME    one setting
//   loom-info --brief    version and features only
//   loom-info --flight DIR   merge the flight recorder files in DIR: who is
//                        behind, in which operation, and where ranks called
//                        different operations at the same sequence number
//   loom-info --trace DIR OUT   the same files as a Chrome trace (OUT), and
//                        each operation's run times
//   loom-info --plan COLLECTIVE NRANKS COUNT [...]   the plan of each rank
//   loom-info --algos [NRANKS] [--net]   the cost model's choices by size
#include <cstdio>
#include <cstring>
#include <string>

#include <loom/version.h>

#include "build_info.h"
#include "device/device.h"
#include "transport/registry.h"
#if LOOM_HAVE_VERBS
#include "transport/ib/transport.h"
#endif
#include "flight.h"
#include "plans.h"
#include "common/settings.h"
#include "kernels/cpu/cpu_isa.h"

namespace {

void printWrapped(const char* text, int indent, int width) {
  std::string line;
  std::string word;
  const char* p = text;
  auto flush = [&] {
    std::printf("%*s%s\n", indent, "", line.c_str());
    line.clear();
  };
  while (true) {
    if (*p == ' ' || *p == '\0') {
      if (!word.empty()) {
        if (!line.empty() && int(line.size() + 1 + word.size()) > width - indent) flush();
        if (!line.empty()) line += ' ';
        line += word;
        word.clear();
      }
      if (*p == '\0') break;
    } else {
      word += *p;
    }
    ++p;
  }
  if (!line.empty()) flush();
}

void printSetting(const loom::settings::Spec& s, const loom::settings::Config& cfg) {
  std::printf("%s\n", s.name);
  std::printf("    type %s, default \"%s\", subsystem %s\n", loom::settings::typeName(s.type), s.defaultValue,
              s.subsystem);
  std::printf("    value \"%s\" (%s)\n", cfg.text(s.name).c_str(),
              loom::settings::sourceName(cfg.source(s.name)));
  printWrapped(s.doc, 4, 80);
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--brief] [-s NAME] [--flight DIR] [--trace DIR OUT] [--plan COLLECTIVE NRANKS COUNT ...] "
               "[--algos [NRANKS] [--net]]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool brief = false;
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--brief")) brief = true;
    else if (!std::strcmp(argv[i], "-s") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--flight") && i + 1 < argc) return loom::info::mergeFlight(argv[++i]);
    else if (!std::strcmp(argv[i], "--trace") && i + 2 < argc) return loom::info::writeTrace(argv[i + 1], argv[i + 2]);
    else if (!std::strcmp(argv[i], "--plan")) return loom::info::printPlan(argc - i - 1, argv + i + 1);
    else if (!std::strcmp(argv[i], "--algos")) return loom::info::printAlgos(argc - i - 1, argv + i + 1);
    else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) return usage(argv[0]), 0;
    else return usage(argv[0]);
  }
  auto cfg = loom::settings::current();
  if (only) {
    const auto* spec = loom::settings::find(only);
    if (!spec) {
      std::fprintf(stderr, "loom-info: no setting named %s\n", only);
      return 1;
    }
    printSetting(*spec, *cfg);
    return 0;
  }
  std::printf("loom %s (NCCL API %s compatible, libnccl.so.2)\n", LOOM_VERSION_STRING,
              LOOM_NCCL_VERSION_STRING);
  std::printf("build: %s, %s\n", LOOM_BUILD_TYPE, LOOM_BUILD_COMPILER);
  std::printf("features:\n");
  std::printf("  cuda        %s\n", LOOM_BUILD_CUDA_ENABLED ? "compiled in" : "not compiled in");
  // What LOOM_DEVICE (unset or auto) gives here: cuda exactly when a device
  // answers.
  loom::device::Api* device = loom::device::api();
  const int gpus = device ? device->deviceCount() : 0;
  const std::string deviceBuffers = !LOOM_BUILD_CUDA_ENABLED ? "not in this build"
                                    : gpus > 0 ? std::to_string(gpus) + " CUDA device(s), the default here"
                                               : "no CUDA device answers here, so host is the default";
  std::printf("  buffers     host; device (cuda mode, ordered on streams): %s\n", deviceBuffers.c_str());
  std::string transports = "loopback (same rank)";
  for (const loom::transport::Backend* b : loom::transport::backends()) {
    std::string moves;
    for (auto m : {loom::transport::MemoryType::kHost, loom::transport::MemoryType::kHostPinned,
                   loom::transport::MemoryType::kDevice}) {
      if (b->moves(m)) moves += std::string(moves.empty() ? "" : ", ") + loom::transport::memoryTypeName(m);
    }
    transports += std::string(", ") + b->name() + " (" + moves + ")";
  }
  transports += ", tcp (sockets)";
  std::printf("  transports  %s\n", transports.c_str());
#if LOOM_HAVE_VERBS
  std::string whyNoPort;
  const auto ports = loom::transport::ib::usablePorts(&whyNoPort);
  std::string portText;
  for (const auto& port : ports) portText += (portText.empty() ? "" : "; ") + port.describe();
  std::printf("  verbs       %s\n", ports.empty() ? ("no usable port: " + whyNoPort).c_str() : portText.c_str());
#else
  std::printf("  verbs       not in this build (no infiniband/verbs.h when it was built)\n");
#endif
  std::printf("  kernels     host: %s (this CPU runs up to %s; LOOM_CPU_ISA)\n",
              loom::kernels::cpuIsaName(loom::kernels::defaultCpuKernelConfig().isa),
              loom::kernels::cpuIsaName(loom::kernels::detectedCpuIsa()));
  if (!cfg->unused().empty()) std::printf("  not read    %s (set here; loom does not use them)\n", cfg->unused().c_str());
  if (brief) return 0;
  std::printf("\nsettings (environment, then NCCL_CONF_FILE / ~/.nccl.conf / /etc/nccl.conf, then default):\n\n");
  for (const auto& s : loom::settings::table()) {
    printSetting(s, *cfg);
    std::printf("\n");
  }
  if (!cfg->warnings().empty()) std::printf("warnings: %s\n", cfg->warnings().c_str());
  return 0;
}
