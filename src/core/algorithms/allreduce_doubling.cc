// Recursive-doubling AllReduce: in round k (k = 1, 2, 4, ...) each rank
// swaps its whole running result with the rank k places away (positions in
// the ring's order, XOR k) and folds the two, lower position first, so the
// partners get the same bits; after log2(p) rounds every rank holds the
// result. Half the tree's hops and no second pass down, but every round
// moves the whole vector: for small vectors on many ranks.
//
// Any rank count: with p the largest power of two <= n, the n - p ranks at
// positions p.. first hand their input to position - p, which folds it in,
// and get the result back from it at the end (two more hops).
// Pre-multiplied sums multiply each input once (the first send of a raw
// input, or the first fold); later rounds fold partial results
// (Step::localPartial). Folds follow the rounds, not rank order: never
// under LOOM_DETERMINISTIC.
#include "core/algorithms/halving_common.h"

namespace loom::core {

Plan allReduceDoubling(const OpDesc& op, const PlanParams& p) {
  using ring::at;
  using ring::elemSize;
  Plan plan = ring::emptyPlan(p, "doubling");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  if (n == 1) {
    steps.push_back(ring::soloAllReduce(op));
    return plan;
  }
  const ring::RingView ring(p);
  const int me = ring.self();
  std::vector<int> group(static_cast<size_t>(n));  // ranks by ring position
  for (int q = 0; q < n; ++q) group[size_t(q)] = ring.rankAt(q);
  const int pow2 = halving::largestPowerOfTwo(n);
  ring::forEachSlice(op, p.sliceBytes, [&](Range c) {
    const size_t bytes = c.size() * es;
    int current = kSendBuf;
    bool partial = false;
    if (halving::appendStandAside(steps, group, me, pow2, c, es, current, partial)) return;
    halving::appendFoldIn(steps, group, me, pow2, c, es, &current, &partial);
    const BufRef result = at(kRecvBuf, c.begin, es);
    for (int k = 1; k < pow2; k *= 2) {
      const int partnerPos = me ^ k;
      const int partner = group[size_t(partnerPos)];
      // A raw input leaves pre-multiplied; a partial result as it is.
      steps.push_back(
          Step{.sendPeer = partner, .local = at(current, c.begin, es), .bytes = bytes, .reduce = !partial});
      Step fold{.local = at(current, c.begin, es), .out = result, .bytes = bytes, .reduce = true,
                .post = k * 2 == pow2};
      fold.fanIn = {partner};
      fold.localAt = me < partnerPos ? 0 : 1;
      fold.localPartial = partial;
      steps.push_back(fold);
      current = kRecvBuf;
      partial = true;
    }
    halving::appendHandBack(steps, group, me, pow2, c, es);
  });
  return plan;
}

}  // namespace loom::core
