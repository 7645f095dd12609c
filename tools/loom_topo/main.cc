// loom-topo: what loom sees of a machine and the rings and trees it builds.
//
//   loom-topo                          detect this machine (or load
//                                      NCCL_TOPO_FILE), print it and the
//                                      schedule of one host
//   loom-topo --topo F [--topo G ...]  load topology files, one per host
//                                      (the last one repeats for the rest)
//   --hosts N --ranks-per-host R       the layout to schedule (ranks go on
//                                      the GPUs in order, else over the NUMA
//                                      nodes)
//   --method auto|hwloc|sysfs          how to detect
//   --dump FILE                        write the (first) topology as NCCL XML
//   --dot FILE                         graphviz picture of the machine
//   --schedule-dot FILE                graphviz picture of the rings and trees
// FILE may be "-" for standard output. Exit status 0, 1 when the schedule
// fails its checks, 2 on bad arguments or a topology that does not load.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/settings.h"
#include "topology/detect.h"
#include "topology/schedule.h"

namespace {

using namespace loom::topology;

int usage(const char* why) {
  std::fprintf(stderr,
               "loom-topo: %s\nusage: loom-topo [--topo FILE]... [--hosts N] [--ranks-per-host R]\n"
               "                 [--method auto|hwloc|sysfs] [--dump FILE] [--dot FILE] [--schedule-dot FILE]\n",
               why);
  return 2;
}

bool writeOut(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return true;
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "loom-topo: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

int positive(const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  return (end && *end == '\0' && v > 0 && v <= 1 << 16) ? int(v) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string dump, dot, scheduleDotPath, method = "auto";
  int hosts = 1, perHost = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") {
      usage("topology and schedules");
      return 0;
    } else if (a == "--topo" && (v = next())) {
      files.push_back(v);
    } else if (a == "--hosts" && (v = next())) {
      if ((hosts = positive(v)) < 0) return usage("--hosts takes a positive number");
    } else if (a == "--ranks-per-host" && (v = next())) {
      if ((perHost = positive(v)) < 0) return usage("--ranks-per-host takes a positive number");
    } else if (a == "--method" && (v = next())) {
      method = v;
    } else if (a == "--dump" && (v = next())) {
      dump = v;
    } else if (a == "--dot" && (v = next())) {
      dot = v;
    } else if (a == "--schedule-dot" && (v = next())) {
      scheduleDotPath = v;
    } else {
      return usage(("unknown or incomplete argument '" + a + "'").c_str());
    }
  }
  if (files.empty()) {
    const std::string env = loom::settings::current()->getString("NCCL_TOPO_FILE");
    if (!env.empty()) files.push_back(env);
  }

  std::vector<Topology> topos;
  if (files.empty()) {
    DetectOptions options;
    options.method = method;
    auto t = detect(options);
    if (!t.isOk()) {
      std::fprintf(stderr, "loom-topo: detection failed: %s\n", t.status().message().c_str());
      return 2;
    }
    std::printf("detected with %s on this machine\n", t->source.c_str());
    topos.push_back(std::move(t).value());
  } else {
    for (const auto& f : files) {
      auto t = loadFile(f);
      if (!t.isOk()) {
        std::fprintf(stderr, "loom-topo: %s\n", t.status().message().c_str());
        return 2;
      }
      topos.push_back(std::move(t).value());
    }
  }
  for (size_t i = 0; i < topos.size(); ++i) {
    if (topos.size() > 1) std::printf("host %zu: ", i);
    std::fputs(describe(topos[i]).c_str(), stdout);
  }
  if (!dump.empty() && !writeOut(dump, xml::write(topos[0].xml))) return 2;
  if (!dot.empty() && !writeOut(dot, topologyDot(topos[0]))) return 2;

  while (int(topos.size()) < hosts) topos.push_back(topos.back());
  topos.resize(size_t(hosts));
  if (perHost == 0) {
    const size_t gpus = topos[0].ofType(NodeType::kGpu).size();
    perHost = int(gpus ? gpus : size_t(std::max(2, topos[0].numaCount())));
  }
  const Layout layout = spreadLayout(topos, perHost);
  const Schedule s = buildSchedule(layout);
  std::printf("\nschedule for %d host(s) x %d rank(s)\n", hosts, perHost);
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    const auto nics = usableNics(layout.hosts[h]);
    std::string list;
    for (const auto& n : nics) list += (list.empty() ? "" : ", ") + n;
    if (h < 4 || h + 1 == layout.hosts.size()) {
      std::printf("  host %zu: ranks %zu-%zu, NICs used: %s\n", h, h * size_t(perHost), (h + 1) * size_t(perHost) - 1,
                  list.empty() ? "none" : list.c_str());
    } else if (h == 4) {
      std::printf("  ...\n");
    }
  }
  const auto lines = ringLines(s);
  for (size_t c = 0; c < lines.size(); ++c) {
    std::string exits;
    for (size_t h = 0; h < s.rings[c].exitNic.size() && h < 4; ++h) {
      exits += (exits.empty() ? "" : ", ") + std::string("host ") + std::to_string(h) + " via " +
               (s.rings[c].exitNic[h].empty() ? "-" : s.rings[c].exitNic[h]);
    }
    std::printf("  %s%s%s%s\n", lines[c].c_str(), hosts > 1 ? "   (leaves " : "", hosts > 1 ? exits.c_str() : "",
                hosts > 1 ? (s.rings[c].exitNic.size() > 4 ? ", ...)" : ")") : "");
  }
  const int n = int(layout.ranks.size());
  for (int r = 0; r < n; ++r) {
    if (n > 40 && r >= 16 && r < n - 8) {
      if (r == 16) std::printf("  ...\n");
      continue;
    }
    std::printf("  %s\n", treeLine(s, r).c_str());
  }
  std::printf("  tree depth across hosts: %d and %d\n", hostDepth(layout, s.trees[0]), hostDepth(layout, s.trees[1]));
  if (!scheduleDotPath.empty() && !writeOut(scheduleDotPath, scheduleDot(layout, s))) return 2;
  const auto check = checkSchedule(layout, s);
  std::printf("check: %s\n", check.isOk() ? "ok" : check.message().c_str());
  return check.isOk() ? 0 : 1;
}
