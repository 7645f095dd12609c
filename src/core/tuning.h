// Algorithm choice: which plan generator runs a collective.
//
// Each (collective, algorithm) has an alpha-beta estimate: hops * alpha +
// bytes moved per rank * beta, with alpha and beta from a table per link
// class (shared memory within a host, the network between hosts). The
// cheapest algorithm that can run the case and that the user allows
// (NCCL_ALGO) is taken.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "core/op.h"

namespace loom::core {

enum class Algorithm : uint8_t {
  kRing,    // ring (AllReduce, AllGather, ReduceScatter); pipelined chain (Broadcast, Reduce)
  kDirect,  // one-shot: every rank exchanges with every other rank at once
  kTwoShot,  // AllReduce: one-shot reduce-scatter, then one-shot all-gather
  kTree,     // AllReduce, Broadcast, Reduce: along binary trees (two on two channels)
  kDoubling,  // AllReduce: recursive doubling, whole vectors swapped in log2(n) rounds
  kHalving,   // AllReduce: reduce-scatter by recursive halving, all-gather by doubling (Rabenseifner)
  kHierarchical,  // AllReduce across hosts: ring inside each host, halving-doubling between hosts
};
inline constexpr int kAlgorithmCount = 7;
// "ring", "direct", "twoshot", "tree", "doubling", "halving", "hierarchical"
const char* algorithmName(Algorithm a);

// The five collectives that have algorithms, as indices 0..4.
inline constexpr int kCollectiveCount = 5;
int collectiveIndex(OpKind kind);  // -1 for point-to-point kinds

enum class LinkClass : uint8_t { kSharedMemory, kNetwork };
inline constexpr int kLinkClassCount = 2;
const char* linkClassName(LinkClass c);

// What the model charges on one link class: alpha (microseconds per
// sequential hop), a per-message overhead, beta (microseconds per byte a
// rank sends) and the cost of a byte read by a reduction.
struct LinkCost {
  double hopUs;
  double messageUs;
  double usPerByte;        // sent
  double usPerFoldedByte;  // read by a reduction
};
// The table (measured on 2-core hosts and over veth, see tuning.cc).
const LinkCost& tableCost(LinkClass c);

// The NCCL_ALGO setting: which algorithms each collective may use.
// Syntax (NCCL's): a comma-separated list of names, a leading ^ excludes
// them instead; sections "collective:list" separated by ';' apply to one
// collective each (allreduce, allgather, reducescatter, broadcast, reduce).
// Names are case-insensitive: NCCL's Ring and loom's ring, chain (= ring),
// direct, twoshot, tree (NCCL's Tree), doubling, halving (also rabenseifner). NCCL names loom does not have (CollnetDirect,
// CollnetChain, NVLS, NVLSTree, PAT) and unknown ones are ignored with a warning; a
// collective left with no algorithm keeps all of them, with a warning.
class AlgoFilter {
 public:
  AlgoFilter() { allowed_.fill(kAll); }
  static AlgoFilter parse(std::string_view text, std::vector<std::string>* warnings);
  bool allows(OpKind kind, Algorithm a) const;

 private:
  static constexpr uint8_t kAll = (1u << kAlgorithmCount) - 1;
  std::array<uint8_t, kCollectiveCount> allowed_;
};

// The NCCL_PROTO setting, mapped onto loom's paths: LL and LL128 (NCCL's
// low-latency protocols) are the latency path (core/latency.h), Simple the
// plans. Same list syntax as NCCL_ALGO (no per-collective sections).
// Excluding Simple cannot be honoured (large messages have no other path):
// a warning; so are unknown names.
struct ProtoChoice {
  bool latencyPath = true;
};
ProtoChoice parseProto(std::string_view text, std::vector<std::string>* warnings);

// What the choice depends on besides the operation.
struct TuningContext {
  int nranks = 1;
  LinkClass links = LinkClass::kSharedMemory;  // the slowest class the ranks use
  bool device = false;                         // cuda mode (buffers in device memory)
  // LOOM_DETERMINISTIC: reductions only by algorithms that fold every
  // element in rank order in one fan-in (direct, twoshot), so the bits do
  // not depend on the algorithm, the slicing or the channels.
  bool deterministic = false;
  AlgoFilter filter;
  // The pipeline slice plans use (Communicator::sliceBytes).
  size_t sliceBytes = size_t(512) << 10;
  // Hosts the ranks are on, and the ranks on each (0: not the same on all).
  int hosts = 1;
  int ranksPerHost = 0;
  bool shmInsideHosts = true;  // false: some rank turned shared memory off
  // Per link class: the table's costs, or what LOOM_CALIBRATE measured at
  // init (alpha and beta of the class the ranks use).
  std::array<LinkCost, kLinkClassCount> costs{tableCost(LinkClass::kSharedMemory), tableCost(LinkClass::kNetwork)};
};

// Whether `a` can run this case (an empty string), or why not.
std::string cannotRun(Algorithm a, OpKind kind, size_t bytes, const TuningContext& ctx);
// Estimated microseconds; `bytes` is the size of the whole vector (AllGather:
// the output, ReduceScatter: the input).
double estimateUs(Algorithm a, OpKind kind, size_t bytes, const TuningContext& ctx);

// Point-to-point traffic: `messages` messages of `bytes` in all, at once.
double pointToPointUs(size_t bytes, int messages, const TuningContext& ctx);

struct Choice {
  Algorithm algorithm = Algorithm::kRing;
  double estimateUs = 0;
};
// The cheapest algorithm that can run and NCCL_ALGO allows; when it allows
// none that can, the cheapest that can; when none can (a deterministic
// reduction on more than 32 ranks), ring.
Choice choose(OpKind kind, size_t bytes, const TuningContext& ctx);

// The vector size `choose` sees for an operation of `count` elements.
size_t tuningBytes(OpKind kind, size_t count, size_t elemSize, int nranks);

}  // namespace loom::core
