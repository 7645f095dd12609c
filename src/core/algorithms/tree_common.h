// The trees of the tree generators.
//
// Ranks on several hosts (PlanParams::trees given): the topology's two
// trees (topology/schedule.h), channel c on tree c % 2. Each enters a host
// once, at its head rank, and hangs the host's other ranks from it in a
// chain; every host is inner in at most one of the two trees (NCCL's
// double binary tree). A Broadcast or Reduce hangs the tree from its root
// instead: the same edges, walked from there.
//
// Ranks on one host (no trees given; the topology's tree there would be a
// single chain, which the chain algorithms already are): a heap over the
// ring's order starting at the root's position (place i has children 2i+1
// and 2i+2), mirrored on odd channels, so that with two channels the inner
// nodes of one tree are mostly the leaves of the other.
#pragma once

#include <vector>

#include "core/algorithms/ring_common.h"

namespace loom::core::tree {

// For TreeView's root: the tree's own root (AllReduce).
inline constexpr int kOwnRoot = -1;

class TreeView {
 public:
  TreeView(const PlanParams& p, int root) {
    const int n = p.nranks;
    if (!p.trees.empty() && fromLinks(p.trees[size_t(p.ringIndex) % p.trees.size()], n, p.rank, root)) return;
    const ring::RingView ring(p);
    const int rootPos = ring.position(root == kOwnRoot ? ring.rankAt(0) : root);
    const bool mirrored = p.ringIndex % 2 == 1;
    // Heap place of a ring position, and the rank at a heap place.
    auto place = [&](int pos) { return mirrored ? ring::mod(rootPos - pos, n) : ring::mod(pos - rootPos, n); };
    auto rankAt = [&](int q) { return ring.rankAt(mirrored ? rootPos - q : rootPos + q); };
    const int self = place(ring.self());
    parent_ = self == 0 ? -1 : rankAt((self - 1) / 2);
    for (int c : {2 * self + 1, 2 * self + 2})
      if (c < n) children_.push_back(rankAt(c));
  }
  bool isRoot() const { return parent_ < 0; }
  int parent() const { return parent_; }
  const std::vector<int>& children() const { return children_; }

 private:
  // `parentOf`: each rank's parent in the topology's tree (-1 at its root).
  // Walks the tree's edges from `root` (kOwnRoot: the tree's root) to find
  // this rank's parent and children in the tree hung from there. A rank's
  // neighbours are taken in a fixed order (its old parent, then its old
  // children), so every rank derives the same tree. False (the heap is
  // used) for links that are not one tree over the ranks: communicators
  // pass only schedules that checkSchedule() accepted.
  bool fromLinks(const std::vector<int>& parentOf, int n, int self, int root) {
    if (int(parentOf.size()) != n || self < 0 || self >= n || root >= n) return false;
    std::vector<std::vector<int>> next(static_cast<size_t>(n));
    int roots = 0;
    for (int r = 0; r < n; ++r) {
      const int p = parentOf[size_t(r)];
      if (p >= n || p < -1) return false;
      if (p == -1 && ++roots == 1 && root == kOwnRoot) root = r;
      if (p >= 0) next[size_t(r)].push_back(p);
    }
    if (roots != 1 || root < 0) return false;
    for (int r = 0; r < n; ++r)
      if (parentOf[size_t(r)] >= 0) next[size_t(parentOf[size_t(r)])].push_back(r);
    std::vector<int> up(size_t(n), -2);  // -2: not reached yet
    std::vector<int> queue{root};
    up[size_t(root)] = -1;
    for (size_t i = 0; i < queue.size(); ++i) {
      for (int v : next[size_t(queue[i])]) {
        if (up[size_t(v)] != -2) continue;
        up[size_t(v)] = queue[i];
        queue.push_back(v);
      }
    }
    if (queue.size() != size_t(n)) return false;  // not connected, or a cycle
    parent_ = up[size_t(self)];
    for (int v : next[size_t(self)])
      if (v != parent_) children_.push_back(v);
    return true;
  }

  int parent_ = -1;
  std::vector<int> children_;
};

}  // namespace loom::core::tree
