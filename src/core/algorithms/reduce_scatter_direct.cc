// One-shot ReduceScatter: every rank sends block q of its input to rank q
// and folds the n copies of its own block in rank order. Each rank sends
// and receives (n-1)/n of the vector, as in the ring, in one hop.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan reduceScatterDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 2);
  const size_t es = elemSize(op), bytes = op.count * es;
  if (op.count == 0) return plan;
  for (int peer : othersFrom(p.rank, p.nranks))
    plan.streams[0].steps.push_back(Step{.sendPeer = peer, .local = at(kSendBuf, size_t(peer) * op.count, es),
                                         .bytes = bytes, .reduce = true});
  plan.streams[1].steps.push_back(
      foldAll(p.rank, p.nranks, at(kSendBuf, size_t(p.rank) * op.count, es), at(kRecvBuf, 0, 1), bytes));
  return plan;
}

}  // namespace loom::core
