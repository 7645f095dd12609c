// Ring ReduceScatter: the reduce-scatter half of ring AllReduce. Block c
// starts at rank c+1 and ends, fully reduced, in rank c's output.
#include "core/algorithms/ring_common.h"

namespace loom::core {

Plan reduceScatterRing(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "ring");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  const size_t rc = op.count;  // elements per rank
  if (rc == 0) return plan;
  const size_t nslices = sliceCount(rc, es, p.sliceBytes);
  const RingView ring(p);
  const int q = ring.self(), next = ring.next(), prev = ring.prev();
  const Range all{0, rc};
  for (size_t s = 0; s < nslices; ++s) {
    Range sl = slice(all, rc, nslices, s);
    // Block of the rank at ring position `pos`.
    auto input = [&](int pos) { return at(kSendBuf, size_t(ring.rankAt(pos)) * rc + sl.begin, es); };
    const size_t bytes = sl.size() * es;
    if (n == 1) {
      steps.push_back(Step{.local = input(q), .out = at(kRecvBuf, sl.begin, es), .bytes = bytes,
                           .reduce = true, .post = true});
      continue;
    }
    steps.push_back(Step{.sendPeer = next, .local = input(q - 1), .bytes = bytes, .reduce = true});
    for (int k = 1; k < n - 1; ++k) {
      steps.push_back(Step{.recvPeer = prev, .sendPeer = next, .local = input(q - 1 - k),
                           .bytes = bytes, .reduce = true});
    }
    steps.push_back(Step{.recvPeer = prev, .local = input(q), .out = at(kRecvBuf, sl.begin, es),
                         .bytes = bytes, .reduce = true, .post = true});
  }
  return plan;
}

}  // namespace loom::core
