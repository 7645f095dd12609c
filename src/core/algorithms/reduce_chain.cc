// Pipelined chain Reduce: partial results flow along the ring from the rank
// after the root to the root; each rank adds its contribution and passes the
// slice on; the root applies the post op and stores the result.
#include "core/algorithms/ring_common.h"

namespace loom::core {

Plan reduceChain(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "chain");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const RingView ring(p);
  const int pos = mod(ring.self() - ring.position(op.root) - 1, n);  // 0 = start of the chain, n-1 = root
  const int next = ring.next(), prev = ring.prev();
  const size_t nslices = sliceCount(op.count, es, p.sliceBytes);
  const Range all{0, op.count};
  for (size_t s = 0; s < nslices; ++s) {
    Range sl = slice(all, op.count, nslices, s);
    Step st{.local = at(kSendBuf, sl.begin, es), .bytes = sl.size() * es, .reduce = true};
    if (pos > 0) st.recvPeer = prev;
    if (pos < n - 1) {
      st.sendPeer = next;
    } else {
      st.out = at(kRecvBuf, sl.begin, es);
      st.post = true;
    }
    steps.push_back(st);
  }
  return plan;
}

}  // namespace loom::core
