// Helpers shared by the one-shot ("direct") generators: every rank talks to
// every other rank at once, so an operation takes one message hop instead
// of the ring's n-1 or 2(n-1). Reductions fold the ranks' contributions in
// rank order in one fan-in step (core/plan.h), so every rank computes the
// same bits whatever its place (on a device too: the fold is one kernel).
#pragma once

#include "core/algorithms/ring_common.h"

namespace loom::core::direct {

using ring::at;
using ring::elemSize;

// Ranks other than `self`, starting after it (spreads who talks to whom first).
inline std::vector<int> othersFrom(int self, int n) {
  std::vector<int> out;
  for (int k = 1; k < n; ++k) out.push_back((self + k) % n);
  return out;
}
// Ranks other than `self`, in rank order.
inline std::vector<int> othersInOrder(int self, int n) {
  std::vector<int> out;
  for (int q = 0; q < n; ++q)
    if (q != self) out.push_back(q);
  return out;
}

// The fold of every rank's `bytes` at local/out, this rank's own at its
// rank's place: out = post(x_0 (+) x_1 (+) ... (+) x_{n-1}).
inline Step foldAll(int self, int n, BufRef local, BufRef out, size_t bytes) {
  Step s{.local = local, .out = out, .bytes = bytes, .reduce = true, .post = true};
  s.fanIn = othersInOrder(self, n);
  s.localAt = s.fanIn.empty() ? -1 : self;
  return s;
}

inline Plan emptyPlan(const PlanParams& p, size_t streams) {
  Plan plan = ring::emptyPlan(p, "direct");
  plan.streams.resize(streams);
  return plan;
}

}  // namespace loom::core::direct
