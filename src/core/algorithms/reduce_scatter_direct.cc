// One-shot ReduceScatter: every rank sends block q of its input to rank q
// and folds the n copies of its own block in rank order. Each rank sends
// and receives (n-1)/n of the vector, as in the ring, in one hop. Blocks
// larger than a slice go slice by slice (a fan-in stages one message per
// peer).
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan reduceScatterDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = emptyPlan(p, 2);
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const size_t nslices = sliceCount(op.count, es, p.sliceBytes);
  const Range all{0, op.count};
  for (size_t sl = 0; sl < nslices; ++sl) {
    const Range c = slice(all, op.count, nslices, sl);
    for (int peer : othersFrom(p.rank, p.nranks))
      plan.streams[0].steps.push_back(Step{.sendPeer = peer,
                                           .local = at(kSendBuf, size_t(peer) * op.count + c.begin, es),
                                           .bytes = c.size() * es, .reduce = true});
    plan.streams[1].steps.push_back(foldAll(p.rank, p.nranks, at(kSendBuf, size_t(p.rank) * op.count + c.begin, es),
                                            at(kRecvBuf, c.begin, es), c.size() * es));
  }
  return plan;
}

}  // namespace loom::core
