// Hierarchical AllReduce for ranks spread over hosts, R on each: a ring
// reduce-scatter among the ranks of each host (shared memory) leaves local
// rank l with its host's sum of part l of the vector; the ranks of local
// index l on every host then run a halving-doubling AllReduce of that part
// among themselves (halving_common.h); a ring all-gather inside each host
// hands every rank the other parts. Between hosts each host sends 2(H-1)/H
// of the vector, split over its R ranks, in 2 log2(H) hops instead of the
// ring's 2(n-1) sequential steps.
//
// Ranks of a host are taken in rank order; every host must hold the same
// number of ranks (tuning.cc refuses other layouts; the generator falls
// back to the ring for them). The pre op is applied in the first phase,
// the post op by the last fold of the second. Folds follow the phases, not
// rank order: never under LOOM_DETERMINISTIC.
#include <algorithm>

#include "core/algorithms/halving_common.h"

namespace loom::core {

Plan allReduceHierarchical(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  const int n = p.nranks;
  if (p.hostOf.size() != size_t(n) || n == 1) return allReduceRing(op, p);
  std::vector<std::vector<int>> hosts;
  for (int r = 0; r < n; ++r) {
    const int h = p.hostOf[size_t(r)];
    if (h < 0 || h >= n) return allReduceRing(op, p);
    if (size_t(h) >= hosts.size()) hosts.resize(size_t(h) + 1);
    hosts[size_t(h)].push_back(r);
  }
  const size_t perHost = hosts[0].size();
  for (const auto& members : hosts)
    if (members.size() != perHost) return allReduceRing(op, p);
  Plan plan = emptyPlan(p, "hierarchical");
  auto& steps = plan.streams[0].steps;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const int R = int(perHost), H = int(hosts.size());
  const auto& mine = hosts[size_t(p.hostOf[size_t(p.rank)])];
  const int l = int(std::find(mine.begin(), mine.end(), p.rank) - mine.begin());
  const int next = mine[size_t(mod(l + 1, R))], prev = mine[size_t(mod(l - 1, R))];
  std::vector<int> group;  // local index l of every host, by host
  for (const auto& members : hosts) group.push_back(members[size_t(l)]);
  const int myHost = p.hostOf[size_t(p.rank)];
  const size_t maxPart = partition(op.count, R, 0, alignElems(op)).size();
  const size_t nslices = sliceCount(maxPart, es, p.sliceBytes);
  for (size_t s = 0; s < nslices; ++s) {
    auto piece = [&](int part) { return slice(partition(op.count, R, mod(part, R), alignElems(op)), maxPart, nslices, s); };
    const Range own = piece(l);
    int current = kSendBuf;
    bool partial = false;
    if (R > 1) {
      // Inside the host: part j starts at local rank j+1 and is summed up at
      // local rank j.
      Range c = piece(l - 1);
      steps.push_back(Step{.sendPeer = next, .local = at(kSendBuf, c.begin, es), .bytes = c.size() * es,
                           .reduce = true});
      for (int k = 1; k < R - 1; ++k) {
        c = piece(l - 1 - k);
        steps.push_back(Step{.recvPeer = prev, .sendPeer = next, .local = at(kSendBuf, c.begin, es),
                             .bytes = c.size() * es, .reduce = true});
      }
      steps.push_back(Step{.recvPeer = prev, .local = at(kSendBuf, own.begin, es), .out = at(kRecvBuf, own.begin, es),
                           .bytes = own.size() * es, .reduce = true, .post = H == 1});
      current = kRecvBuf;
      partial = true;
    }
    // Across hosts (every rank of the group has the same, possibly empty, part).
    if (H > 1 && own.size()) halving::appendAllReduce(steps, group, myHost, own, es, current, partial);
    if (R > 1) {
      steps.push_back(Step{.sendPeer = next, .local = at(kRecvBuf, own.begin, es), .bytes = own.size() * es});
      for (int j = 1; j < R; ++j) {
        const Range c = piece(l - j);
        steps.push_back(Step{.recvPeer = prev, .sendPeer = j < R - 1 ? next : -1, .out = at(kRecvBuf, c.begin, es),
                             .bytes = c.size() * es});
      }
    }
  }
  return plan;
}

}  // namespace loom::core
