// One-shot AllGather: every rank sends its block to every other rank and
// receives theirs straight into place, one stream per peer so that all
// receives are posted at once.
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan allGatherDirect(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  const int n = p.nranks;
  Plan plan = emptyPlan(p, size_t(n));
  const size_t es = elemSize(op), bytes = op.count * es;
  if (op.count == 0) return plan;
  auto& own = plan.streams[0].steps;
  for (int peer : othersFrom(p.rank, n))
    own.push_back(Step{.sendPeer = peer, .local = at(kSendBuf, 0, 1), .bytes = bytes, .singleCopy = p.singleCopy,
                        .pullAlways = p.cpusShared});
  own.push_back(Step{.local = at(kSendBuf, 0, 1), .out = at(kRecvBuf, size_t(p.rank) * op.count, es), .bytes = bytes});
  int stream = 1;
  for (int peer : othersFrom(p.rank, n))
    plan.streams[size_t(stream++)].steps.push_back(
        Step{.recvPeer = peer, .out = at(kRecvBuf, size_t(peer) * op.count, es), .bytes = bytes});
  return plan;
}

}  // namespace loom::core
