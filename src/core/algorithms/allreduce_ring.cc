// Ring AllReduce: a reduce-scatter followed by an all-gather around the ring.
// Chunk c of the vector starts at rank c+1, collects every rank's
// contribution on its way and is complete at rank c, which then passes the
// result on until every rank has it. Each chunk is cut into slices that are
// pipelined around the ring.
#include "core/algorithms/ring_common.h"

namespace loom::core {

Plan allReduceRing(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "ring");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  if (n == 1) {
    steps.push_back(Step{.local = at(kSendBuf, 0, es), .out = at(kRecvBuf, 0, es),
                         .bytes = op.count * es, .reduce = true, .post = true});
    return plan;
  }
  const size_t maxPart = partition(op.count, n, 0, alignElems(op)).size();
  const size_t nslices = sliceCount(maxPart, es, p.sliceBytes);
  const RingView ring(p);
  const int q = ring.self(), next = ring.next(), prev = ring.prev();
  for (size_t s = 0; s < nslices; ++s) {
    auto piece = [&](int chunk) {
      return slice(partition(op.count, n, mod(chunk, n), alignElems(op)), maxPart, nslices, s);
    };
    // Reduce-scatter phase: n steps, the first only sends.
    // Chunks are numbered by ring position.
    Range c = piece(q - 1);
    steps.push_back(Step{.sendPeer = next, .local = at(kSendBuf, c.begin, es),
                         .bytes = c.size() * es, .reduce = true});
    for (int k = 1; k < n - 1; ++k) {
      c = piece(q - 1 - k);
      steps.push_back(Step{.recvPeer = prev, .sendPeer = next, .local = at(kSendBuf, c.begin, es),
                           .bytes = c.size() * es, .reduce = true});
    }
    c = piece(q);
    steps.push_back(Step{.recvPeer = prev, .sendPeer = next, .local = at(kSendBuf, c.begin, es),
                         .out = at(kRecvBuf, c.begin, es), .bytes = c.size() * es,
                         .reduce = true, .post = true});
    // All-gather phase: pass the finished chunks on.
    for (int j = 1; j < n; ++j) {
      c = piece(q - j);
      steps.push_back(Step{.recvPeer = prev, .sendPeer = j < n - 1 ? next : -1,
                           .out = at(kRecvBuf, c.begin, es), .bytes = c.size() * es});
    }
  }
  return plan;
}

}  // namespace loom::core
