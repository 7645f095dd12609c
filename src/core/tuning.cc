#include "core/tuning.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace loom::core {
namespace {

constexpr const char* kCollectiveNames[kCollectiveCount] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                                          "reduce"};

// The cost table (LinkCost). Measured with the perf tools, each algorithm
// forced by NCCL_ALGO, on 2-core hosts (shared memory) and over veth between
// network namespaces (network). LOOM_CALIBRATE replaces alpha and beta of
// the class a communicator uses with its own measurement.
constexpr LinkCost kCosts[kLinkClassCount] = {
    {2.0, 0.3, 1.0 / 4000, 1.0 / 8000},   // shared memory
    {30.0, 2.0, 1.0 / 1000, 1.0 / 8000},  // network
};

// Largest message of the one-shot algorithms that send each message whole
// (AllReduce, AllGather, Broadcast): unpipelined, and an AllReduce's fan-in
// stages one message per peer at once.
constexpr size_t kDirectMaxMessageBytes = size_t(256) << 10;
// Fan-in steps stage every source in a slot of their own, beside the slots
// of the pre-multiplied sends before them (core/executor.h: 64 per stream).
constexpr int kDirectMaxRanks = 32;
// On a device every send may hold a slot (connections that cannot move
// device memory stage it): a twoshot fold finds a slice's results and the
// next slice's inputs in flight beside its own sources, 3(n-1) + 2 <= 64.
constexpr int kDeviceMaxTwoShotRanks = 21;
// Hierarchical on a device: 2R + 3 <= 64.
constexpr int kDeviceMaxRanksPerHost = 30;

double largestPowerOfTwo(double n) { return std::exp2(std::floor(std::log2(n))); }

// Hops from a tree's root to its deepest rank: a heap on one host; across
// hosts the topology's trees (core/algorithms/tree_common.h), binary over
// the hosts, each host's ranks a chain below its head. `rooted`: hung from
// a Broadcast's or Reduce's root, which may sit at the end of a chain on a
// leaf host: the path can climb to the top and go down again (hosts of
// unequal size count as the average: an estimate).
double treeDepth(const TuningContext& ctx, bool rooted) {
  const int n = std::max(1, ctx.nranks);
  if (ctx.hosts < 2) return std::ceil(std::log2(double(n)));
  const int perHost = ctx.ranksPerHost > 0 ? ctx.ranksPerHost : (n + ctx.hosts - 1) / ctx.hosts;
  const double down = std::floor(std::log2(double(ctx.hosts))) + (perHost - 1);
  return rooted ? 2 * down : down;
}

// Halving-doubling among n ranks on a vector of v bytes (halving_common.h):
// sequential rounds per slice (two more when n is not a power of two, for
// the ranks beyond it), and the bytes the busiest rank sends and folds.
struct HalvingCost {
  double rounds, sent, folded;
};
HalvingCost halvingCost(double n, double v) {
  const double pow2 = largestPowerOfTwo(n);
  const double extra = n > pow2 ? 1 : 0;
  const double ring = 2 * (pow2 - 1) / pow2 * v;
  return {2 * std::log2(pow2) + 2 * extra, ring + extra * v, ring + extra * 2 * v};
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Calls f(name) for each name of a comma-separated list, lower-cased.
template <class F>
void forEachName(std::string_view list, F&& f) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string name = lower(trim(list.substr(0, comma)));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (!name.empty()) f(name);
  }
}

// The algorithms a comma-separated list names; unknown and foreign names
// add warnings.
uint8_t parseList(std::string_view list, std::vector<std::string>* warnings) {
  uint8_t mask = 0;
  forEachName(list, [&](const std::string& name) {
    if (name == "ring" || name == "chain") mask |= 1u << int(Algorithm::kRing);
    else if (name == "direct") mask |= 1u << int(Algorithm::kDirect);
    else if (name == "twoshot") mask |= 1u << int(Algorithm::kTwoShot);
    else if (name == "tree") mask |= 1u << int(Algorithm::kTree);
    else if (name == "doubling") mask |= 1u << int(Algorithm::kDoubling);
    else if (name == "halving" || name == "rabenseifner") mask |= 1u << int(Algorithm::kHalving);
    else if (name == "hierarchical") mask |= 1u << int(Algorithm::kHierarchical);
    else if (name == "collnetdirect" || name == "collnetchain" || name == "nvls" || name == "nvlstree" ||
             name == "pat")
      warnings->push_back("NCCL_ALGO: loom has no " + name + " algorithm; ignored");
    else warnings->push_back("NCCL_ALGO: unknown algorithm '" + name + "' ignored (loom has ring, direct, twoshot, tree, doubling, halving, hierarchical)");
  });
  return mask;
}

}  // namespace

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kTwoShot: return "twoshot";
    case Algorithm::kTree: return "tree";
    case Algorithm::kDoubling: return "doubling";
    case Algorithm::kHalving: return "halving";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "?";
}

const char* linkClassName(LinkClass c) { return c == LinkClass::kSharedMemory ? "shm" : "net"; }

const LinkCost& tableCost(LinkClass c) { return kCosts[size_t(c)]; }

int collectiveIndex(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce: return 0;
    case OpKind::kAllGather: return 1;
    case OpKind::kReduceScatter: return 2;
    case OpKind::kBroadcast: return 3;
    case OpKind::kReduce: return 4;
    default: return -1;
  }
}

AlgoFilter AlgoFilter::parse(std::string_view text, std::vector<std::string>* warnings) {
  AlgoFilter f;
  text = trim(text);
  if (text.empty()) return f;
  while (!text.empty()) {
    const size_t semi = text.find(';');
    std::string_view section = trim(text.substr(0, semi));
    text = semi == std::string_view::npos ? std::string_view() : text.substr(semi + 1);
    if (section.empty()) continue;
    int only = -1;  // the collective a "name:list" section applies to
    const size_t colon = section.find(':');
    if (colon != std::string_view::npos) {
      const std::string coll = lower(trim(section.substr(0, colon)));
      for (int i = 0; i < kCollectiveCount; ++i)
        if (coll == kCollectiveNames[i]) only = i;
      if (only < 0) {
        warnings->push_back("NCCL_ALGO: unknown collective '" + coll +
                            "' ignored (use allreduce, allgather, reducescatter, broadcast or reduce)");
        continue;
      }
      section = trim(section.substr(colon + 1));
    }
    const bool exclude = !section.empty() && section.front() == '^';
    if (exclude) section.remove_prefix(1);
    uint8_t mask = parseList(section, warnings);
    if (exclude) mask = uint8_t(kAll & ~mask);
    std::string emptied;
    for (int i = 0; i < kCollectiveCount; ++i) {
      if (only >= 0 && i != only) continue;
      f.allowed_[size_t(i)] = mask ? mask : kAll;
      if (!mask) emptied += std::string(emptied.empty() ? "" : ", ") + kCollectiveNames[i];
    }
    if (!emptied.empty())
      warnings->push_back("NCCL_ALGO leaves " + emptied + " no algorithm loom has; they keep all of them");
  }
  return f;
}

bool AlgoFilter::allows(OpKind kind, Algorithm a) const {
  const int i = collectiveIndex(kind);
  return i >= 0 && (allowed_[size_t(i)] >> int(a)) & 1u;
}

ProtoChoice parseProto(std::string_view text, std::vector<std::string>* warnings) {
  ProtoChoice p;
  text = trim(text);
  if (text.empty()) return p;
  const bool exclude = text.front() == '^';
  if (exclude) text.remove_prefix(1);
  bool ll = false, ll128 = false, simple = false;
  forEachName(text, [&](const std::string& name) {
    if (name == "ll") ll = true;
    else if (name == "ll128") ll128 = true;
    else if (name == "simple") simple = true;
    else warnings->push_back("NCCL_PROTO: unknown protocol '" + name + "' ignored (LL, LL128, Simple)");
  });
  // The latency path stands for both low-latency protocols: it stays while either does.
  const bool llAllowed = exclude ? !(ll && ll128) : (ll || ll128);
  const bool simpleAllowed = exclude ? !simple : simple;
  p.latencyPath = llAllowed;
  if (!simpleAllowed)
    warnings->push_back("NCCL_PROTO: loom cannot drop Simple (its plans carry everything the latency path does not); "
                        "it stays");
  return p;
}

size_t tuningBytes(OpKind kind, size_t count, size_t elemSize, int nranks) {
  const size_t bytes = count * elemSize;
  return kind == OpKind::kAllGather || kind == OpKind::kReduceScatter ? bytes * size_t(nranks) : bytes;
}

std::string cannotRun(Algorithm a, OpKind kind, size_t bytes, const TuningContext& ctx) {
  if (collectiveIndex(kind) < 0) return std::string(opKindName(kind)) + " has no collective algorithms";
  const bool reducing = isReducing(kind);
  if (a == Algorithm::kRing) {
    if (ctx.deterministic && reducing) return "ring does not fold in rank order (LOOM_DETERMINISTIC=1)";
    return "";
  }
  // The fan-in algorithms.
  if (a == Algorithm::kTwoShot && kind != OpKind::kAllReduce) return "twoshot is an AllReduce";
  if (a == Algorithm::kHierarchical) {
    if (kind != OpKind::kAllReduce) return "hierarchical is an AllReduce";
    if (ctx.hosts < 2) return "hierarchical needs ranks on several hosts";
    if (ctx.ranksPerHost < 2) return "hierarchical needs the same number of ranks, at least 2, on every host";
    if (ctx.deterministic) return "hierarchical folds phase by phase, not in rank order (LOOM_DETERMINISTIC=1)";
    // On a device every send may hold a staging slot until it is done
    // (core/executor.h): a host's 2R sends between folds, beside the fold's.
    if (ctx.device && ctx.ranksPerHost > kDeviceMaxRanksPerHost)
      return "hierarchical runs up to " + std::to_string(kDeviceMaxRanksPerHost) +
             " ranks per host on device buffers";
    return "";
  }
  if (a == Algorithm::kDoubling || a == Algorithm::kHalving) {
    const std::string name = algorithmName(a);
    if (kind != OpKind::kAllReduce) return name + " is an AllReduce";
    if (ctx.deterministic) return name + " folds round by round, not in rank order (LOOM_DETERMINISTIC=1)";
    return "";
  }
  if (a == Algorithm::kTree) {
    if (kind == OpKind::kAllGather || kind == OpKind::kReduceScatter)
      return "tree runs AllReduce, Broadcast and Reduce";
    if (ctx.deterministic && reducing) return "tree folds along the tree, not in rank order (LOOM_DETERMINISTIC=1)";
    return "";
  }
  if (ctx.nranks > kDirectMaxRanks)
    return std::string(algorithmName(a)) + " runs up to " + std::to_string(kDirectMaxRanks) + " ranks";
  if (a == Algorithm::kTwoShot && ctx.device && ctx.nranks > kDeviceMaxTwoShotRanks)
    return "twoshot runs up to " + std::to_string(kDeviceMaxTwoShotRanks) + " ranks on device buffers";
  // Direct ReduceScatter and Reduce go slice by slice; the others send
  // each message whole.
  const bool whole = a == Algorithm::kDirect && kind != OpKind::kReduceScatter && kind != OpKind::kReduce;
  const size_t perPeer = kind == OpKind::kAllGather ? bytes / size_t(std::max(1, ctx.nranks)) : bytes;
  if (whole && perPeer > kDirectMaxMessageBytes)
    return "direct sends each message whole, unpipelined: it runs messages up to " +
           std::to_string(kDirectMaxMessageBytes >> 10) + " KiB (the ring pipelines larger ones)";
  return "";
}

double estimateUs(Algorithm a, OpKind kind, size_t bytes, const TuningContext& ctx) {
  const LinkCost& c = ctx.costs[size_t(ctx.links)];
  const double n = double(std::max(1, ctx.nranks)), s = double(bytes);
  const double sliceBytes = double(std::max<size_t>(ctx.sliceBytes, 4096));
  if (n == 1) return c.messageUs + s * c.usPerByte;
  // Sequential hops; messages, bytes sent and bytes folded by the busiest rank.
  double hops = 0, messages = 0, sent = 0, folded = 0;
  const bool ring = a == Algorithm::kRing;
  switch (kind) {
    case OpKind::kAllReduce:
      if (a == Algorithm::kDoubling) {
        // log2(p) rounds of whole-vector swaps (two more hops when n is
        // not a power of two); slices go one after another.
        const double pow2 = largestPowerOfTwo(n);
        const double rounds = std::log2(pow2) + (n > pow2 ? 2 : 0);
        const double slices = std::max(1.0, std::ceil(s / sliceBytes));
        hops = rounds * slices;
        messages = rounds * slices;
        sent = rounds * s;
        folded = 2 * rounds * s;
        break;
      }
      if (a == Algorithm::kHierarchical) {
        // Per slice of each rank's 1/R part, one after another: a ring of R
        // inside each host (shared memory, unless a rank turned it off),
        // then halving among the H hosts over the network. The R ranks of
        // a host share its network link, which so carries the halving's
        // bytes for the whole vector.
        const double R = std::max(1, ctx.ranksPerHost), H = std::max(1, ctx.hosts);
        const LinkCost& local = ctx.costs[size_t(ctx.shmInsideHosts ? LinkClass::kSharedMemory : LinkClass::kNetwork)];
        const double part = s / R;
        const double slices = std::max(1.0, std::ceil(part / sliceBytes));
        const double inside = 2 * (R - 1) * slices * (local.hopUs + local.messageUs) +
                              2 * (R - 1) / R * s * (local.usPerByte + local.usPerFoldedByte);
        const HalvingCost across = halvingCost(H, s);
        hops = across.rounds * slices;
        messages = hops;
        sent = across.sent;
        folded = halvingCost(H, part).folded;
        return inside + hops * c.hopUs + messages * c.messageUs + sent * c.usPerByte + folded * c.usPerFoldedByte;
      }
      if (a == Algorithm::kHalving) {
        // log2(p) rounds down and as many back up per slice (two more hops
        // when n is not a power of two), slices of twice the slice size one
        // after another; the ring's bytes, plus the vector in and out at a
        // rank that stands in for one beyond p. On shared memory, like
        // twoshot, its slices do not overlap: a quarter more per byte than
        // the pipelined ring (measured on 4 and 8 ranks: 1.07-1.6x the
        // ring's time from 1 to 16 MiB). Over the network it beat the ring
        // from 16 KiB to 4 MiB on 4 and 8 hosts (network namespaces sharing
        // 2 cores); the model takes it up to 256 KiB there.
        const double perByte = ctx.links == LinkClass::kSharedMemory ? 1.25 : 1.0;
        const HalvingCost h = halvingCost(n, s);
        const double slices = std::max(1.0, std::ceil(s / (2 * sliceBytes)));
        hops = h.rounds * slices;
        messages = hops;
        sent = perByte * h.sent;
        folded = perByte * h.folded;
        break;
      }
      if (a == Algorithm::kTree) {
        // Up and down the tree, the slices pipelined behind each other; an
        // inner node takes two messages and sends one per slice going up,
        // the reverse coming down, and folds three vectors (a host's head
        // in the topology's trees has up to three children: a little more).
        const double depth = treeDepth(ctx, false);
        const double slices = std::max(1.0, std::ceil(s / sliceBytes));
        hops = 2 * depth + (slices - 1);
        messages = 6 * slices;
        sent = 3 * s;
        folded = 3 * s;
        break;
      }
      if (a == Algorithm::kTwoShot) {
        // Slices run one after another, two hops each.
        // Slices run one after another, each an exchange every rank takes
        // part in (n hops when ranks share CPUs), and they do not overlap:
        // a quarter more per byte than the pipelined ring (measured).
        const double slices = std::max(1.0, std::ceil(s / n / sliceBytes));
        hops = n * slices;
        messages = 2 * (n - 1) * slices;
        sent = 1.25 * 2 * (n - 1) / n * s;
        folded = s;
        break;
      }
      hops = ring ? 2 * (n - 1) : 1;
      messages = ring ? 2 * (n - 1) : n - 1;
      sent = ring ? 2 * (n - 1) / n * s : (n - 1) * s;
      folded = ring ? 2 * (n - 1) / n * s : n * s;
      break;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      hops = ring ? n - 1 : 1;
      messages = n - 1;
      sent = (n - 1) / n * s;
      folded = kind == OpKind::kReduceScatter ? (ring ? 2 * (n - 1) / n * s : s) : 0;
      break;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      if (a == Algorithm::kTree) {
        // Down (up) the tree, slices pipelined; an inner rank sends every
        // byte twice (Broadcast), or takes two messages and folds three
        // vectors (Reduce).
        const double slices = std::max(1.0, std::ceil(s / sliceBytes));
        hops = treeDepth(ctx, true) + (slices - 1);
        messages = (kind == OpKind::kBroadcast ? 2 : 3) * slices;
        sent = kind == OpKind::kBroadcast ? 2 * s : s;
        folded = kind == OpKind::kReduce ? 3 * s : 0;
        break;
      }
      hops = ring ? n - 1 : 1;
      messages = ring ? 1 : n - 1;
      sent = ring ? s : (n - 1) * s;  // the busiest rank: the root of a direct one
      folded = kind == OpKind::kReduce ? (ring ? 2 * s : n * s) : 0;
      break;
    default: return std::numeric_limits<double>::infinity();
  }
  // Direct ReduceScatter and Reduce go slice by slice, in lockstep like
  // twoshot's slices; on 2-core hosts that costs them about half again as
  // much per byte as the pipelined ring once there are several slices.
  if (a == Algorithm::kDirect && (kind == OpKind::kReduceScatter || kind == OpKind::kReduce)) {
    const double perPeer = kind == OpKind::kReduceScatter ? s / n : s;
    const double slices = std::ceil(perPeer / sliceBytes);
    if (slices > 1) {
      hops = n * slices;
      messages *= slices;
      sent *= 1.5;
      folded *= 1.5;
    }
  }
  return hops * c.hopUs + messages * c.messageUs + sent * c.usPerByte + folded * c.usPerFoldedByte;
}

double pointToPointUs(size_t bytes, int messages, const TuningContext& ctx) {
  const LinkCost& c = ctx.costs[size_t(ctx.links)];
  return c.hopUs + messages * c.messageUs + double(bytes) * c.usPerByte;
}

Choice choose(OpKind kind, size_t bytes, const TuningContext& ctx) {
  Choice best{Algorithm::kRing, std::numeric_limits<double>::infinity()};
  // NCCL_ALGO first; when it allows nothing that can run, any algorithm.
  for (bool filtered : {true, false}) {
    // On a tie the one-shot algorithm wins (on one host it runs on the board).
    for (Algorithm a :
         {Algorithm::kDirect, Algorithm::kTwoShot, Algorithm::kDoubling, Algorithm::kHalving, Algorithm::kHierarchical,
          Algorithm::kTree, Algorithm::kRing}) {
      if ((filtered && !ctx.filter.allows(kind, a)) || !cannotRun(a, kind, bytes, ctx).empty()) continue;
      const double t = estimateUs(a, kind, bytes, ctx);
      if (t < best.estimateUs) best = Choice{a, t};
    }
    if (best.estimateUs != std::numeric_limits<double>::infinity()) return best;
  }
  // Nothing can run it (a deterministic reduction on more than 32 ranks):
  // the ring, which the caller refuses when it must be deterministic.
  return Choice{Algorithm::kRing, estimateUs(Algorithm::kRing, kind, bytes, ctx)};
}

}  // namespace loom::core
