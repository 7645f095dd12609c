#include "plans.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/settings.h"
#include "core/planner.h"
#include "core/tuning.h"
#include "kernels/datatype.h"
#include "topology/schedule.h"

namespace loom::info {
namespace {

using core::Algorithm;
using core::OpKind;

struct Named {
  const char* name;
  OpKind kind;
};
constexpr Named kCollectives[] = {{"allreduce", OpKind::kAllReduce},
                                  {"allgather", OpKind::kAllGather},
                                  {"reducescatter", OpKind::kReduceScatter},
                                  {"broadcast", OpKind::kBroadcast},
                                  {"reduce", OpKind::kReduce}};

bool findCollective(const char* name, OpKind* kind) {
  for (const Named& c : kCollectives) {
    if (!std::strcmp(name, c.name)) {
      *kind = c.kind;
      return true;
    }
  }
  return false;
}

bool findType(const char* name, kernels::DataType* type) {
  for (int t = 0; t < kernels::kNumDataTypes; ++t) {
    if (!std::strcmp(name, kernels::dataTypeName(kernels::DataType(t)))) {
      *type = kernels::DataType(t);
      return true;
    }
  }
  return false;
}

// The NCCL_ALGO of the environment (warnings printed).
core::AlgoFilter filterFromSettings() {
  std::vector<std::string> warnings;
  core::AlgoFilter f = core::AlgoFilter::parse(settings::current()->getString("NCCL_ALGO"), &warnings);
  for (const auto& w : warnings) std::fprintf(stderr, "loom-info: %s\n", w.c_str());
  return f;
}

std::string human(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = double(bytes);
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v == double(size_t(v)) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

int planUsage() {
  std::fprintf(stderr,
               "usage: loom-info --plan COLLECTIVE NRANKS COUNT [--rank R] [--algo ring|direct|twoshot|tree|doubling|halving|hierarchical] "
               "[--root R] [--type T] [--hosts H]\n  COLLECTIVE: allreduce, allgather, reducescatter, broadcast, reduce; "
               "COUNT in elements (nccl-tests' meaning); --hosts: ranks in H equal blocks of consecutive ranks, one per "
               "host; default: every rank, the algorithm the cost model picks\n");
  return 2;
}

}  // namespace

int printPlan(int argc, char** argv) {
  if (argc < 3) return planUsage();
  core::OpDesc op;
  if (!findCollective(argv[0], &op.kind)) return planUsage();
  const int nranks = std::atoi(argv[1]);
  op.count = size_t(std::strtoull(argv[2], nullptr, 10));
  if (nranks < 1 || nranks > 4096) return planUsage();
  int only = -1, hosts = 1;
  const char* algo = nullptr;
  op.type = kernels::DataType::kFloat32;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rank") && i + 1 < argc) only = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--hosts") && i + 1 < argc) hosts = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--algo") && i + 1 < argc) algo = argv[++i];
    else if (!std::strcmp(argv[i], "--root") && i + 1 < argc) op.root = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--type") && i + 1 < argc) {
      if (!findType(argv[++i], &op.type)) return planUsage();
    } else return planUsage();
  }
  if (only >= nranks || op.root < 0 || op.root >= nranks || hosts < 1 || hosts > nranks || nranks % hosts)
    return planUsage();
  op.reduction = kernels::Reduction{op.type, kernels::RedOp::kSum, 0, 1};
  core::TuningContext ctx;
  ctx.nranks = nranks;
  ctx.filter = filterFromSettings();
  std::vector<int> hostOf;
  if (hosts > 1) {
    for (int r = 0; r < nranks; ++r) hostOf.push_back(r / (nranks / hosts));
    ctx.links = core::LinkClass::kNetwork;
    ctx.sliceBytes = size_t(128) << 10;  // a network communicator's default slice
    ctx.hosts = hosts;
    ctx.ranksPerHost = nranks / hosts;
  }
  ctx.deterministic = settings::current()->getBool("LOOM_DETERMINISTIC");
  const size_t bytes = core::tuningBytes(op.kind, op.count, kernels::dataTypeSize(op.type), nranks);
  core::PlanParams params;
  params.nranks = nranks;
  params.sliceBytes = hosts > 1 ? ctx.sliceBytes
                                : size_t(std::max<int64_t>(settings::current()->getInt("NCCL_BUFFSIZE") / 8, 64 * 1024));
  params.hostOf = hostOf;
  // Across hosts, the rings and trees a communicator would take from the
  // topology's schedule (hosts with no NIC data, each rank on NUMA node 0).
  std::vector<std::vector<int>> rings, trees;
  if (hosts > 1) {
    topology::Layout layout;
    layout.hosts.resize(size_t(hosts));
    for (int h = 0; h < hosts; ++h) layout.hosts[size_t(h)].name = "host" + std::to_string(h);
    for (int r = 0; r < nranks; ++r) layout.ranks.push_back(topology::cpuRank(hostOf[size_t(r)], 0));
    const topology::Schedule schedule = topology::buildSchedule(layout);
    rings = topology::ringOrders(schedule);
    trees = topology::treeParents(schedule);
    params.rings = rings;
    params.trees = trees;
  }
  if (algo) {
    if (!std::strcmp(algo, "ring") || !std::strcmp(algo, "chain")) params.algorithm = Algorithm::kRing;
    else if (!std::strcmp(algo, "direct")) params.algorithm = Algorithm::kDirect;
    else if (!std::strcmp(algo, "twoshot")) params.algorithm = Algorithm::kTwoShot;
    else if (!std::strcmp(algo, "tree")) params.algorithm = Algorithm::kTree;
    else if (!std::strcmp(algo, "doubling")) params.algorithm = Algorithm::kDoubling;
    else if (!std::strcmp(algo, "halving") || !std::strcmp(algo, "rabenseifner")) params.algorithm = Algorithm::kHalving;
    else if (!std::strcmp(algo, "hierarchical")) params.algorithm = Algorithm::kHierarchical;
    else return planUsage();
    const std::string why = core::cannotRun(params.algorithm, op.kind, bytes, ctx);
    if (!why.empty()) std::printf("# note: the cost model would not use it here: %s\n", why.c_str());
  } else {
    const core::Choice c = core::choose(op.kind, bytes, ctx);
    params.algorithm = c.algorithm;
    std::printf("# %s of %s on %d ranks (%s): %s, estimated %.1f us\n", argv[0], human(bytes).c_str(), nranks,
                core::linkClassName(ctx.links), core::algorithmName(c.algorithm), c.estimateUs);
  }
  for (int r = 0; r < nranks; ++r) {
    if (only >= 0 && r != only) continue;
    params.rank = r;
    auto plan = core::planCollective(op, params);
    if (!plan.isOk()) {
      std::fprintf(stderr, "loom-info: %s\n", plan.status().message().c_str());
      return 1;
    }
    std::printf("%s", core::dumpPlan(plan.value()).c_str());
  }
  return 0;
}

int printAlgos(int argc, char** argv) {
  core::TuningContext ctx;
  ctx.nranks = 8;
  int hosts = 1;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--net")) {
      ctx.links = core::LinkClass::kNetwork;
      ctx.sliceBytes = size_t(128) << 10;  // a network communicator's default slice
    } else if (!std::strcmp(argv[i], "--hosts") && i + 1 < argc) {
      hosts = std::atoi(argv[++i]);
    } else if (std::atoi(argv[i]) > 0) {
      ctx.nranks = std::atoi(argv[i]);
    } else {
      std::fprintf(stderr, "usage: loom-info --algos [NRANKS] [--net] [--hosts H]\n");
      return 2;
    }
  }
  if (hosts > 1) {
    // Ranks spread evenly over H hosts (--net implied).
    ctx.links = core::LinkClass::kNetwork;
    ctx.sliceBytes = size_t(128) << 10;
    ctx.hosts = hosts;
    ctx.ranksPerHost = ctx.nranks % hosts ? 0 : ctx.nranks / hosts;
  }
  ctx.filter = filterFromSettings();
  ctx.deterministic = settings::current()->getBool("LOOM_DETERMINISTIC");
  std::printf("# %d ranks over %s%s; estimates in us, '*' = the choice; '-' = cannot run (or NCCL_ALGO)\n",
              ctx.nranks, core::linkClassName(ctx.links), ctx.deterministic ? " (LOOM_DETERMINISTIC=1)" : "");
  for (const Named& c : kCollectives) {
    std::printf("\n%s\n%12s %12s %12s %12s %12s %12s %12s %12s  %s\n", c.name, "size", "ring", "direct", "twoshot",
                "tree", "doubling", "halving", "hierarchical", "choice");
    Algorithm last = Algorithm::kRing;
    std::vector<std::string> crossovers;
    for (size_t bytes = 8; bytes <= (size_t(1) << 30); bytes *= 2) {
      const core::Choice choice = core::choose(c.kind, bytes, ctx);
      if (bytes > 8 && choice.algorithm != last)
        crossovers.push_back(std::string(core::algorithmName(last)) + " -> " + core::algorithmName(choice.algorithm) +
                             " at " + human(bytes));
      last = choice.algorithm;
      if (bytes != 8 && (bytes & 0x5555555555555555ull) == 0) continue;  // every 4th power of two
      char cells[core::kAlgorithmCount][32];
      for (Algorithm a :
           {Algorithm::kRing, Algorithm::kDirect, Algorithm::kTwoShot, Algorithm::kTree, Algorithm::kDoubling,
            Algorithm::kHalving, Algorithm::kHierarchical}) {
        const bool runs = core::cannotRun(a, c.kind, bytes, ctx).empty() && ctx.filter.allows(c.kind, a);
        if (runs) std::snprintf(cells[int(a)], sizeof cells[0], "%.1f%s", core::estimateUs(a, c.kind, bytes, ctx),
                                choice.algorithm == a ? "*" : "");
        else std::snprintf(cells[int(a)], sizeof cells[0], "-");
      }
      std::printf("%12s %12s %12s %12s %12s %12s %12s %12s  %s\n", human(bytes).c_str(), cells[0], cells[1], cells[2],
                  cells[3], cells[4], cells[5], cells[6], core::algorithmName(choice.algorithm));
    }
    for (const auto& x : crossovers) std::printf("  crossover: %s\n", x.c_str());
  }
  return 0;
}

}  // namespace loom::info
