// One-shot Reduce: every rank sends its vector to the root, which folds the
// n vectors in rank order, slice by slice (a fan-in stages one message per
// peer).
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan reduceDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 1);
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  auto& steps = plan.streams[0].steps;
  const size_t nslices = sliceCount(op.count, es, p.sliceBytes);
  const Range all{0, op.count};
  for (size_t s = 0; s < nslices; ++s) {
    const Range c = slice(all, op.count, nslices, s);
    if (p.rank == op.root)
      steps.push_back(foldAll(p.rank, p.nranks, at(kSendBuf, c.begin, es), at(kRecvBuf, c.begin, es), c.size() * es));
    else
      steps.push_back(Step{.sendPeer = op.root, .local = at(kSendBuf, c.begin, es), .bytes = c.size() * es, .reduce = true});
  }
  return plan;
}

}  // namespace loom::core
