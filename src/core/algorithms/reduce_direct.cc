// One-shot Reduce: every rank sends its vector to the root, which folds the
// n vectors in rank order.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan reduceDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 1);
  const size_t bytes = op.count * elemSize(op);
  if (op.count == 0) return plan;
  auto& steps = plan.streams[0].steps;
  if (p.rank == op.root) steps.push_back(foldAll(p.rank, p.nranks, at(kSendBuf, 0, 1), at(kRecvBuf, 0, 1), bytes));
  else steps.push_back(Step{.sendPeer = op.root, .local = at(kSendBuf, 0, 1), .bytes = bytes, .reduce = true});
  return plan;
}

}  // namespace loom::core
