// Helpers shared by the ring and chain generators.
#pragma once

#include "core/planner.h"
#include "kernels/datatype.h"

namespace loom::core::ring {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline size_t elemSize(const OpDesc& op) { return kernels::dataTypeSize(op.type); }
// Per-rank parts are aligned to 64 bytes so kernels see aligned blocks.
inline size_t alignElems(const OpDesc& op) { return 64 / elemSize(op); }

inline Plan emptyPlan(const PlanParams& p, const char* algorithm) {
  Plan plan;
  plan.rank = p.rank;
  plan.nranks = p.nranks;
  plan.algorithm = algorithm;
  plan.streams.resize(1);
  return plan;
}

inline BufRef at(int buf, size_t elem, size_t esize) { return BufRef{buf, elem * esize}; }

// A lone rank's AllReduce: its input, the reduction's pre and post
// applied, into its output.
inline Step soloAllReduce(const OpDesc& op) {
  const size_t es = elemSize(op);
  return Step{.local = at(kSendBuf, 0, es), .out = at(kRecvBuf, 0, es), .bytes = op.count * es, .reduce = true,
              .post = true};
}

// Calls f(range) for the slices of the whole vector in order, at most
// sliceBytes each (empty ones skipped).
template <class F>
void forEachSlice(const OpDesc& op, size_t sliceBytes, F&& f) {
  const Range all{0, op.count};
  const size_t nslices = sliceCount(op.count, elemSize(op), sliceBytes);
  for (size_t s = 0; s < nslices; ++s) {
    const Range c = slice(all, op.count, nslices, s);
    if (c.size()) f(c);
  }
}

// The ring a plan follows: positions 0..n-1 and the ranks on them. The
// generators work in positions, and name ranks only for peers and for the
// blocks that belong to a rank (AllGather, ReduceScatter).
class RingView {
 public:
  explicit RingView(const PlanParams& p) : n_(p.nranks) {
    if (!p.rings.empty()) order_ = &p.rings[size_t(p.ringIndex) % p.rings.size()];
    self_ = position(p.rank);
  }
  int self() const { return self_; }
  int rankAt(int position) const {
    const int q = mod(position, n_);
    return order_ ? (*order_)[size_t(q)] : q;
  }
  int position(int rank) const {
    if (!order_) return rank;
    for (int q = 0; q < n_; ++q) {
      if ((*order_)[size_t(q)] == rank) return q;
    }
    return rank;  // not reached for a permutation
  }
  int next() const { return rankAt(self_ + 1); }
  int prev() const { return rankAt(self_ - 1); }

 private:
  int n_;
  const std::vector<int>* order_ = nullptr;
  int self_ = 0;
};

}  // namespace loom::core::ring
