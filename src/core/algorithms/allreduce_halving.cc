// Reduce-scatter by recursive halving, then all-gather by recursive
// doubling (Rabenseifner's AllReduce). With p a power of two, the rank at
// ring position q swaps half of its current range with position q XOR d for
// d = p/2, p/4, ..., 1, keeping the lower half when bit d of q is clear and
// folding the half it gets into the one it keeps; after log2(p) rounds each
// rank holds the finished result of a 1/p block. The rounds then run in
// reverse, each rank sending everything it holds and receiving its
// partner's part, until every rank holds the whole vector. The ring's bytes
// (2(p-1)/p of the vector per rank) in 2 log2(p) hops instead of 2(p-1).
//
// Any rank count: the n - p ranks at positions p.. hand their input to
// position - p first and get the result back at the end, as in recursive
// doubling (allreduce_doubling.cc). Partners split a range alike (they
// share every higher bit), so both sides agree on every message's size;
// empty halves (vectors shorter than p elements) send nothing. Folds
// follow the rounds, not rank order: never under LOOM_DETERMINISTIC.
#include "core/algorithms/halving_common.h"

namespace loom::core {

Plan allReduceHalving(const OpDesc& op, const PlanParams& p) {
  Plan plan = ring::emptyPlan(p, "halving");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = ring::elemSize(op);
  if (op.count == 0) return plan;
  if (n == 1) {
    steps.push_back(ring::soloAllReduce(op));
    return plan;
  }
  const ring::RingView ring(p);
  std::vector<int> group(static_cast<size_t>(n));  // ranks by ring position
  for (int q = 0; q < n; ++q) group[size_t(q)] = ring.rankAt(q);
  // Slices of twice the slice size: no message of the halving and doubling
  // rounds is larger than a slice (the hand-over beyond a power of two
  // carries the whole slice).
  ring::forEachSlice(op, 2 * p.sliceBytes, [&](Range c) {
    halving::appendAllReduce(steps, group, ring.self(), c, es, kSendBuf, false);
  });
  return plan;
}

}  // namespace loom::core
