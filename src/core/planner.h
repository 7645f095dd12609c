// Algorithms are generators of plans: (operation, rank, nranks) -> Plan.
// They need no communicator and no network, so the simulator can run the
// plans of all ranks in one process and check every algorithm.
#pragma once

#include <span>
#include <vector>

#include "common/status.h"
#include "core/op.h"
#include "core/plan.h"
#include "core/tuning.h"

namespace loom::core {

struct PlanParams {
  int rank = 0;
  int nranks = 1;
  size_t sliceBytes = 512 * 1024;  // largest message a step sends
  int channels = 1;                // connections per pair a collective may spread over
  size_t channelMinBytes = 256 * 1024;  // a channel carries at least this much
  // Ring orders from the topology's schedule (each a permutation of the
  // ranks); channel c follows rings[c % size]. Empty: rank order. Chains
  // (Broadcast, Reduce) run along the ring from the root.
  std::span<const std::vector<int>> rings{};
  int ringIndex = 0;  // which ring a one-channel plan follows
  // The host of each rank (0..hosts-1), for hierarchical plans; empty: one host.
  std::span<const int> hostOf{};
  // The topology's two trees when the ranks span hosts (each rank's parent,
  // -1 at the root); channel c follows trees[c % size]. Empty: the tree
  // algorithms use heaps over the ring order (core/algorithms/tree_common.h).
  std::span<const std::vector<int>> trees{};
  Algorithm algorithm = Algorithm::kRing;  // chosen by core/tuning.h
  // Whether AllGather may send a rank's own blocks single-copy (the
  // receiver reads them from the sender's buffer, where the transport can
  // and wants to: transport/shm/handoff.h). Off only in tests.
  bool singleCopy = true;
  // Whether this rank's CPUs also run other ranks of the host
  // (Communicator::cpusShared): single copy then goes whenever it can
  // (Step::pullAlways), since it saves CPU time that they would use.
  bool cpusShared = false;
};

// A collective (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce).
Result<Plan> planCollective(const OpDesc& op, const PlanParams& params);
// Plan::hostRanks: the ranks on params.rank's host (all of them without hostOf).
int hostRanksOf(const PlanParams& params);
// The point-to-point calls of one group on one communicator, merged: Send,
// Recv, AllToAll, Gather and Scatter (the last three expand into sends and
// receives). Op i uses buffers 2i (send side) and 2i+1 (receive side).
Result<Plan> planPointToPoint(std::span<const OpDesc> ops, const PlanParams& params);

// Per-algorithm generators (algorithms/<collective>_<algorithm>.cc).
Plan allReduceRing(const OpDesc& op, const PlanParams& p);
Plan allGatherRing(const OpDesc& op, const PlanParams& p);
Plan reduceScatterRing(const OpDesc& op, const PlanParams& p);
Plan broadcastChain(const OpDesc& op, const PlanParams& p);
Plan reduceChain(const OpDesc& op, const PlanParams& p);
Plan allReduceDirect(const OpDesc& op, const PlanParams& p);
Plan allReduceTwoShot(const OpDesc& op, const PlanParams& p);
Plan allReduceTree(const OpDesc& op, const PlanParams& p);
Plan allReduceDoubling(const OpDesc& op, const PlanParams& p);
Plan allReduceHalving(const OpDesc& op, const PlanParams& p);
Plan allReduceHierarchical(const OpDesc& op, const PlanParams& p);
Plan broadcastTree(const OpDesc& op, const PlanParams& p);
Plan reduceTree(const OpDesc& op, const PlanParams& p);
Plan allGatherDirect(const OpDesc& op, const PlanParams& p);
Plan reduceScatterDirect(const OpDesc& op, const PlanParams& p);
Plan broadcastDirect(const OpDesc& op, const PlanParams& p);
Plan reduceDirect(const OpDesc& op, const PlanParams& p);

// Shared arithmetic for generators.
struct Range {
  size_t begin = 0;  // elements
  size_t end = 0;
  size_t size() const { return end - begin; }
};
// Part i of n of [0, count): equal parts rounded up to `align` elements, so
// the last parts may be short or empty.
Range partition(size_t count, int n, int i, size_t align);
// Number of slices needed so no slice of a part of `maxElems` elements is
// bigger than sliceBytes, and slice s of `part`.
size_t sliceCount(size_t maxElems, size_t elemSize, size_t sliceBytes);
Range slice(Range part, size_t maxElems, size_t nslices, size_t s);

}  // namespace loom::core
