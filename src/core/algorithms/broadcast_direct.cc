// One-shot Broadcast: the root sends the whole vector to every rank at
// once; the others receive it straight into their output.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan broadcastDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 1);
  const size_t bytes = op.count * elemSize(op);
  if (op.count == 0) return plan;
  auto& steps = plan.streams[0].steps;
  if (p.rank != op.root) {
    steps.push_back(Step{.recvPeer = op.root, .out = at(kRecvBuf, 0, 1), .bytes = bytes});
    return plan;
  }
  for (int peer : othersFrom(p.rank, p.nranks))
    steps.push_back(Step{.sendPeer = peer, .local = at(kSendBuf, 0, 1), .bytes = bytes});
  steps.push_back(Step{.local = at(kSendBuf, 0, 1), .out = at(kRecvBuf, 0, 1), .bytes = bytes});
  return plan;
}

}  // namespace loom::core
