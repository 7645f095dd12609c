// Reduce-scatter by recursive halving, then all-gather by recursive
// doubling (Rabenseifner's AllReduce). With p a power of two, the rank at
// ring position q swaps half of its current range with position q XOR d for
// d = p/2, p/4, ..., 1, keeping the lower half when bit d of q is clear and
// folding the half it gets into the one it keeps; after log2(p) rounds each
// rank holds the finished result of a 1/p block. The rounds then run in
// reverse, each rank sending everything it holds and receiving its
// partner's part, until every rank holds the whole vector. The ring's bytes
// (2(p-1)/p of the vector per rank) in 2 log2(p) hops instead of 2(p-1).
//
// Any rank count: the n - p ranks at positions p.. hand their input to
// position - p first and get the result back at the end, as in recursive
// doubling (allreduce_doubling.cc). Partners split a range alike (they
// share every higher bit), so both sides agree on every message's size;
// empty halves (vectors shorter than p elements) send nothing. Folds
// follow the rounds, not rank order: never under LOOM_DETERMINISTIC. Host
// buffers only (fan-in steps).
#include "core/algorithms/direct_common.h"

namespace loom::core {

Plan allReduceHalving(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = ring::emptyPlan(p, "halving");
  auto& steps = plan.streams[0].steps;
  const int n = p.nranks;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  if (n == 1) {
    steps.push_back(ring::soloAllReduce(op));
    return plan;
  }
  const ring::RingView ring(p);
  const int me = ring.self();
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;
  struct Round {
    int partner;
    Range keep, give;
  };
  std::vector<Round> rounds;
  // Slices of twice the slice size: no message of the halving and doubling
  // rounds is larger than a slice (the hand-over beyond a power of two
  // carries the whole slice).
  ring::forEachSlice(op, 2 * p.sliceBytes, [&](Range c) {
    const size_t bytes = c.size() * es;
    if (me >= pow2) {
      const int helper = ring.rankAt(me - pow2);
      steps.push_back(Step{.sendPeer = helper, .local = at(kSendBuf, c.begin, es), .bytes = bytes, .reduce = true});
      steps.push_back(Step{.recvPeer = helper, .out = at(kRecvBuf, c.begin, es), .bytes = bytes});
      return;
    }
    int current = kSendBuf;  // where this rank's running values of its range are
    bool partial = false;
    if (me < extra) {
      Step fold{.local = at(kSendBuf, c.begin, es), .out = at(kRecvBuf, c.begin, es), .bytes = bytes, .reduce = true};
      fold.fanIn = {ring.rankAt(me + pow2)};
      fold.localAt = 0;  // the lower position first
      steps.push_back(fold);
      current = kRecvBuf;
      partial = true;
    }
    rounds.clear();
    Range range = c;
    for (int d = pow2 / 2; d >= 1; d /= 2) {
      const int partnerPos = me ^ d;
      const Range lower{range.begin, range.begin + (range.size() + 1) / 2}, upper{lower.end, range.end};
      const bool keepLower = (me & d) == 0;
      Round r{ring.rankAt(partnerPos), keepLower ? lower : upper, keepLower ? upper : lower};
      if (r.give.size())
        steps.push_back(Step{.sendPeer = r.partner, .local = at(current, r.give.begin, es), .bytes = r.give.size() * es,
                             .reduce = !partial});
      if (r.keep.size()) {
        Step fold{.local = at(current, r.keep.begin, es), .out = at(kRecvBuf, r.keep.begin, es),
                  .bytes = r.keep.size() * es, .reduce = true, .post = d == 1};
        fold.fanIn = {r.partner};
        fold.localAt = me < partnerPos ? 0 : 1;
        fold.localPartial = partial;
        steps.push_back(fold);
      }
      rounds.push_back(r);
      range = r.keep;
      current = kRecvBuf;
      partial = true;
    }
    // Back up: what this rank kept in a round is what it holds before the
    // matching round of the gather; the partner holds the rest.
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      if (r->keep.size())
        steps.push_back(Step{.sendPeer = r->partner, .local = at(kRecvBuf, r->keep.begin, es),
                             .bytes = r->keep.size() * es});
      if (r->give.size())
        steps.push_back(Step{.recvPeer = r->partner, .out = at(kRecvBuf, r->give.begin, es),
                             .bytes = r->give.size() * es});
    }
    if (me < extra)
      steps.push_back(Step{.sendPeer = ring.rankAt(me + pow2), .local = at(kRecvBuf, c.begin, es), .bytes = bytes});
  });
  return plan;
}

}  // namespace loom::core
