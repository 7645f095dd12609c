// One-shot AllReduce: every rank sends its whole vector to every other rank
// and folds the n vectors in rank order. One hop: the latency path for small
// vectors (n-1 times the ring's bytes per rank). The sends and the fold run
// as two streams, so the fold's receives are posted while the sends wait.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan allReduceDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 2);
  const size_t bytes = op.count * elemSize(op);
  if (op.count == 0) return plan;
  for (int peer : othersFrom(p.rank, p.nranks))
    plan.streams[0].steps.push_back(Step{.sendPeer = peer, .local = at(kSendBuf, 0, 1), .bytes = bytes, .reduce = true});
  plan.streams[1].steps.push_back(foldAll(p.rank, p.nranks, at(kSendBuf, 0, 1), at(kRecvBuf, 0, 1), bytes));
  return plan;
}

}  // namespace loom::core
