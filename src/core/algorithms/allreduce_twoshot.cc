// Two-shot AllReduce: a one-shot reduce-scatter (every rank folds its block
// from everyone's input, in rank order) and then a one-shot all-gather of
// the folded blocks. Two hops per slice whatever the rank count, the ring's
// bytes per rank, and every element folded in rank order in one fan-in (the
// same bits as the direct algorithm: LOOM_DETERMINISTIC's large-vector
// AllReduce). Slices run one after another on one stream, so each
// connection carries a slice's reduce-scatter message, then its all-gather
// message, in the same order on both sides.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan allReduceTwoShot(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = ring::emptyPlan(p, "twoshot");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks, r = p.rank;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  if (n == 1) {
    steps.push_back(ring::soloAllReduce(op));
    return plan;
  }
  const size_t align = ring::alignElems(op);
  const size_t maxPart = partition(op.count, n, 0, align).size();
  const size_t nslices = sliceCount(maxPart, es, p.sliceBytes);
  const std::vector<int> others = othersFrom(r, n);
  for (size_t s = 0; s < nslices; ++s) {
    auto piece = [&](int block) { return slice(partition(op.count, n, block, align), maxPart, nslices, s); };
    for (int q : others) {
      const Range c = piece(q);
      if (c.size()) steps.push_back(Step{.sendPeer = q, .local = at(kSendBuf, c.begin, es), .bytes = c.size() * es, .reduce = true});
    }
    const Range mine = piece(r);
    if (mine.size()) {
      steps.push_back(foldAll(r, n, at(kSendBuf, mine.begin, es), at(kRecvBuf, mine.begin, es), mine.size() * es));
      for (int q : others) steps.push_back(Step{.sendPeer = q, .local = at(kRecvBuf, mine.begin, es), .bytes = mine.size() * es});
    }
    for (int q : others) {
      const Range c = piece(q);
      if (c.size()) steps.push_back(Step{.recvPeer = q, .out = at(kRecvBuf, c.begin, es), .bytes = c.size() * es});
    }
  }
  return plan;
}

}  // namespace loom::core
