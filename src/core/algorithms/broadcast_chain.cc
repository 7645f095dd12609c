// Pipelined chain Broadcast: the root sends slices to the next rank in ring
// order; every rank stores each slice and forwards it, the last one only
// stores it.
#include "core/algorithms/ring_common.h"

namespace loom::core {

Plan broadcastChain(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "chain");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const RingView ring(p);
  const int pos = mod(ring.self() - ring.position(op.root), n);  // 0 = root, n-1 = end of the chain
  const int next = ring.next(), prev = ring.prev();
  const size_t nslices = sliceCount(op.count, es, p.sliceBytes);
  const Range all{0, op.count};
  for (size_t s = 0; s < nslices; ++s) {
    Range sl = slice(all, op.count, nslices, s);
    Step st{.out = at(kRecvBuf, sl.begin, es), .bytes = sl.size() * es};
    if (pos == 0) {
      st.local = at(kSendBuf, sl.begin, es);
    } else {
      st.recvPeer = prev;
    }
    if (pos < n - 1) st.sendPeer = next;
    steps.push_back(st);
  }
  return plan;
}

}  // namespace loom::core
