// Tree Reduce: slices are folded up a tree hung from the root
// (tree_common.h): a rank folds its children's partial results into its
// own input and sends that to its parent; the root keeps the result. On
// one host log2(n) hops instead of the chain's n-1; across hosts the
// topology's tree. Pipelined slice by slice. Folds
// follow the tree, not rank order: never under LOOM_DETERMINISTIC. Host
// buffers only (fan-in steps).
#include "core/algorithms/tree_common.h"

namespace loom::core {

Plan reduceTree(const OpDesc& op, const PlanParams& p) {
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
    Step st{.local = at(kSendBuf, sl.begin, es), .bytes = bytes, .reduce = true};
    if (parent < 0) {
      st.out = at(kRecvBuf, sl.begin, es);
      st.post = true;
    } else {
      st.sendPeer = parent;
    }
    // A leaf has nothing to fold: it sends its input (a lone root of one
    // rank copies it).
    if (!children.empty()) {
      st.fanIn = children;
      st.localAt = 0;
    }
    steps.push_back(st);
  });
  return plan;
}

}  // namespace loom::core
