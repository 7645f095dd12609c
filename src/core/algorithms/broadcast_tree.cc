// Tree Broadcast: slices go down a tree hung from the root (tree_common.h),
// each rank storing a slice and sending it on to its children: on one host
// log2(n) hops instead of the chain's n-1, each inner rank sending every
// byte twice; across hosts the topology's tree, which crosses each host
// boundary once. Pipelined: a rank forwards slice s while slice s+1 comes
// in.
#include "core/algorithms/tree_common.h"

namespace loom::core {

Plan broadcastTree(const OpDesc& op, const PlanParams& p) {
  using namespace ring;
  Plan plan = emptyPlan(p, "tree");
  auto& steps = plan.streams[0].steps;
  const size_t es = elemSize(op);
  if (op.count == 0) return plan;
  const tree::TreeView tree(p, op.root);
  const int parent = tree.parent();
  const std::vector<int> children = tree.children();
  ring::forEachSlice(op, p.sliceBytes, [&](Range sl) {
    const size_t bytes = sl.size() * es;
    const BufRef result = at(kRecvBuf, sl.begin, es);
    // Store the slice (from the input at the root, from the parent
    // elsewhere) and send it to the first child; then to the others.
    Step first{.out = result, .bytes = bytes};
    if (parent < 0) first.local = at(kSendBuf, sl.begin, es);
    else first.recvPeer = parent;
    if (!children.empty()) first.sendPeer = children[0];
    steps.push_back(first);
    for (size_t c = 1; c < children.size(); ++c)
      steps.push_back(Step{.sendPeer = children[c], .local = result, .bytes = bytes});
  });
  return plan;
}

}  // namespace loom::core
