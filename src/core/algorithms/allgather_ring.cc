// Ring AllGather: each rank's block travels n-1 hops around the ring; every
// rank stores it and passes it on.
#include "core/algorithms/ring_common.h"

namespace loom::core {

Plan allGatherRing(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "ring");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks, r = p.rank;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const size_t whole = op.count;  // elements per rank
  const size_t nslices = sliceCount(whole, es, p.sliceBytes);
  const RingView ring(p);
  const int next = ring.next(), prev = ring.prev();
  const Range all{0, whole};
  for (size_t s = 0; s < nslices; ++s) {
    Range sl = slice(all, whole, nslices, s);
    auto blockAt = [&](int owner) { return at(kRecvBuf, size_t(mod(owner, n)) * whole + sl.begin, es); };
    steps.push_back(Step{.sendPeer = n > 1 ? next : -1, .local = at(kSendBuf, sl.begin, es),
                         .out = blockAt(r), .bytes = sl.size() * es, .singleCopy = n > 1 && p.singleCopy,
                         .pullAlways = p.cpusShared});
    for (int j = 1; j < n; ++j) {
      steps.push_back(Step{.recvPeer = prev, .sendPeer = j < n - 1 ? next : -1,
                           .out = blockAt(ring.rankAt(ring.self() - j)), .bytes = sl.size() * es});
    }
  }
  return plan;
}

}  // namespace loom::core
