// Tree AllReduce: each slice is folded up a tree (a node folds its
// children's partial sums into its own input and sends the result to its
// parent) and the root's result is sent back down it, the slices pipelined
// through the tree's levels: 2 log2(n) hops on one host instead of the
// ring's 2(n-1).
//
// The trees (tree_common.h): across hosts the topology's two trees, on one
// host a heap rooted at the ring's first rank. With two channels
// (NCCL_MIN_NCHANNELS=2) the halves of the vector take the two trees and
// share the work as NCCL's double binary tree does.
//
// Two streams: "up" (this rank's fold and its send to the parent; the
// root's fold and its sends to its children) and "down" (the receive from
// the parent and the sends to the children). Each direction of each tree
// edge is used by one stream on each side, so messages match in order.
// Folds follow the tree, not rank order: never under LOOM_DETERMINISTIC.
#include "core/algorithms/direct_common.h"
#include "core/algorithms/tree_common.h"

namespace loom::core {

Plan allReduceTree(const OpDesc& op, const PlanParams& p) {
  using namespace direct;
  Plan plan = ring::emptyPlan(p, "tree");
  plan.streams.resize(2);
  auto& up = plan.streams[0].steps;
  auto& down = plan.streams[1].steps;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  if (p.nranks == 1) {
    up.push_back(ring::soloAllReduce(op));
    return plan;
  }
  const tree::TreeView tree(p, tree::kOwnRoot);
  const int parent = tree.parent();
  const std::vector<int> children = tree.children();
  ring::forEachSlice(op, p.sliceBytes, [&](Range c) {
    const size_t bytes = c.size() * es;
    const BufRef input = at(kSendBuf, c.begin, es), result = at(kRecvBuf, c.begin, es);
    if (parent < 0) {
      // The root: fold, then send the result down.
      Step fold{.local = input, .out = result, .bytes = bytes, .reduce = true, .post = true};
      fold.fanIn = children;
      fold.localAt = 0;
      up.push_back(fold);
      for (int child : children) up.push_back(Step{.sendPeer = child, .local = result, .bytes = bytes});
      return;
    }
    if (children.empty()) {
      up.push_back(Step{.sendPeer = parent, .local = input, .bytes = bytes, .reduce = true});
    } else {
      Step fold{.sendPeer = parent, .local = input, .bytes = bytes, .reduce = true};
      fold.fanIn = children;
      fold.localAt = 0;
      up.push_back(fold);
    }
    down.push_back(Step{.recvPeer = parent, .out = result, .bytes = bytes});
    for (int child : children) down.push_back(Step{.sendPeer = child, .local = result, .bytes = bytes});
  });
  return plan;
}

}  // namespace loom::core
