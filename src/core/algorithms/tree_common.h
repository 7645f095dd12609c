// The binary trees of the tree generators: a heap over the ring's order
// starting at the root's position (place i has children 2i+1 and 2i+2),
// mirrored on odd channels, so that with two channels the inner nodes of
// one tree are mostly the leaves of the other (NCCL's double binary tree).
#pragma once

#include <vector>

#include "core/algorithms/ring_common.h"

namespace loom::core::tree {

class TreeView {
 public:
  TreeView(const PlanParams& p, int root)
      : ring_(p), n_(p.nranks), rootPos_(ring_.position(root)), mirrored_(p.ringIndex % 2 == 1) {
    self_ = place(ring_.self());
  }
  bool isRoot() const { return self_ == 0; }
  int parent() const { return self_ == 0 ? -1 : rankAt((self_ - 1) / 2); }
  std::vector<int> children() const {
    std::vector<int> out;
    for (int c : {2 * self_ + 1, 2 * self_ + 2})
      if (c < n_) out.push_back(rankAt(c));
    return out;
  }

 private:
  int place(int position) const {
    return mirrored_ ? ring::mod(rootPos_ - position, n_) : ring::mod(position - rootPos_, n_);
  }
  int rankAt(int treePlace) const { return ring_.rankAt(mirrored_ ? rootPos_ - treePlace : rootPos_ + treePlace); }
  ring::RingView ring_;
  int n_;
  int rootPos_;
  bool mirrored_;
  int self_ = 0;
};

}  // namespace loom::core::tree
