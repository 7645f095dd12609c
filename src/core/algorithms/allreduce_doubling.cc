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
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan allReduceDoubling(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
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
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;
  ring::forEachSlice(op, p.sliceBytes, [&](Range c) {
    const size_t bytes = c.size() * es;
    const BufRef input = at(kSendBuf, c.begin, es), result = at(kRecvBuf, c.begin, es);
    if (me >= pow2) {
      // Hand the input over, get the result back.
      const int helper = ring.rankAt(me - pow2);
      steps.push_back(Step{.sendPeer = helper, .local = input, .bytes = bytes, .reduce = true});
      steps.push_back(Step{.recvPeer = helper, .out = result, .bytes = bytes});
      return;
    }
    BufRef current = input;
    bool partial = false;
    if (me < extra) {
      Step fold{.local = input, .out = result, .bytes = bytes, .reduce = true};
      fold.fanIn = {ring.rankAt(me + pow2)};
      fold.localAt = 0;  // the lower position first
      steps.push_back(fold);
      current = result;
      partial = true;
    }
    for (int k = 1; k < pow2; k *= 2) {
      const int partnerPos = me ^ k;
      const int partner = ring.rankAt(partnerPos);
      // A raw input leaves pre-multiplied; a partial result as it is.
      steps.push_back(Step{.sendPeer = partner, .local = current, .bytes = bytes, .reduce = !partial});
      Step fold{.local = current, .out = result, .bytes = bytes, .reduce = true, .post = k * 2 == pow2};
      fold.fanIn = {partner};
      fold.localAt = me < partnerPos ? 0 : 1;
      fold.localPartial = partial;
      steps.push_back(fold);
      current = result;
      partial = true;
    }
    if (me < extra) steps.push_back(Step{.sendPeer = ring.rankAt(me + pow2), .local = result, .bytes = bytes});
  });
  return plan;
}

}  // namespace loom::core
