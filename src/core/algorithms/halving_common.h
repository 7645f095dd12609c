// The halving-doubling AllReduce of one range among a group of ranks
// (allreduce_halving.cc), shared with the hierarchical plans, which run it
// among the ranks of equal local index across hosts; and how the ranks
// beyond a power of two stand aside, shared with recursive doubling.
#pragma once

#include <span>
#include <vector>

#include "core/algorithms/ring_common.h"

namespace loom::core::halving {

inline int largestPowerOfTwo(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The ranks at positions pow2.. of a group of n stand aside: each hands its
// values (at `current`, raw unless `partial`) to position - pow2 and gets
// the result back into the receive buffer. Appends those steps and returns
// true for such a rank, false for the others.
inline bool appendStandAside(std::vector<Step>& steps, std::span<const int> group, int me, int pow2, Range c,
                             size_t es, int current, bool partial) {
  if (me < pow2) return false;
  const int helper = group[size_t(me - pow2)];
  const size_t bytes = c.size() * es;
  steps.push_back(Step{.sendPeer = helper, .local = ring::at(current, c.begin, es), .bytes = bytes,
                       .reduce = !partial});
  steps.push_back(Step{.recvPeer = helper, .out = ring::at(kRecvBuf, c.begin, es), .bytes = bytes});
  return true;
}

// Position me < n - pow2 folds in the values of position me + pow2 (its own
// first) into the receive buffer, which then holds a partial result.
inline void appendFoldIn(std::vector<Step>& steps, std::span<const int> group, int me, int pow2, Range c, size_t es,
                         int* current, bool* partial) {
  if (me + pow2 >= int(group.size())) return;
  Step fold{.local = ring::at(*current, c.begin, es), .out = ring::at(kRecvBuf, c.begin, es), .bytes = c.size() * es,
            .reduce = true};
  fold.fanIn = {group[size_t(me + pow2)]};
  fold.localAt = 0;
  fold.localPartial = *partial;
  steps.push_back(fold);
  *current = kRecvBuf;
  *partial = true;
}

// ... and hands the result back at the end.
inline void appendHandBack(std::vector<Step>& steps, std::span<const int> group, int me, int pow2, Range c,
                           size_t es) {
  if (me + pow2 < int(group.size()))
    steps.push_back(Step{.sendPeer = group[size_t(me + pow2)], .local = ring::at(kRecvBuf, c.begin, es),
                         .bytes = c.size() * es});
}

// Appends to `steps` this rank's part of an AllReduce of the elements `c`
// among `group` (ranks by position; this rank at position `me`). The
// values start at `current` (kSendBuf or kRecvBuf): raw inputs, or partial
// results with the reduction's pre op applied already (`partial`). The
// result, post op applied, ends in the receive buffer at `c`.
inline void appendAllReduce(std::vector<Step>& steps, std::span<const int> group, int me, Range c, size_t es,
                            int current, bool partial) {
  using ring::at;
  const int pow2 = largestPowerOfTwo(int(group.size()));
  if (appendStandAside(steps, group, me, pow2, c, es, current, partial)) return;
  appendFoldIn(steps, group, me, pow2, c, es, &current, &partial);
  struct Round {
    int partner;
    Range keep, give;
  };
  std::vector<Round> rounds;
  Range range = c;
  for (int d = pow2 / 2; d >= 1; d /= 2) {
    const int partnerPos = me ^ d;
    const Range lower{range.begin, range.begin + (range.size() + 1) / 2}, upper{lower.end, range.end};
    const bool keepLower = (me & d) == 0;
    Round r{group[size_t(partnerPos)], keepLower ? lower : upper, keepLower ? upper : lower};
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
  appendHandBack(steps, group, me, pow2, c, es);
}

}  // namespace loom::core::halving
