// Merged point-to-point plan for one group on one communicator.
//
// Every message goes on a stream of its own (peer, direction), in call
// order, so both ends post the messages of a connection in the same order
// whatever order the group's calls were made in across directions. AllToAll,
// Gather and Scatter expand into sends and receives; a rank's exchange with
// itself is a local copy.
#include <map>

#include "core/algorithms/ring_common.h"

namespace loom::core {
namespace {

struct StreamKey {
  int peer;
  bool send;
  bool operator<(const StreamKey& o) const {
    return peer != o.peer ? peer < o.peer : send < o.send;
  }
};

class Builder {
 public:
  Builder(Plan* plan, size_t sliceBytes) : plan_(plan), sliceBytes_(sliceBytes) {}

  void send(int peer, int buf, size_t offset, size_t bytes) {
    forSlices(bytes, [&](size_t off, size_t len) {
      stream({peer, true}).push_back(Step{.sendPeer = peer, .local = {buf, offset + off}, .bytes = len});
    });
  }
  void recv(int peer, int buf, size_t offset, size_t bytes) {
    forSlices(bytes, [&](size_t off, size_t len) {
      stream({peer, false}).push_back(Step{.recvPeer = peer, .out = {buf, offset + off}, .bytes = len});
    });
  }
  // Self exchange: a copy on the send stream of the rank itself.
  void copy(int bufFrom, size_t offFrom, int bufTo, size_t offTo, size_t bytes) {
    if (bytes == 0) return;
    stream({plan_->rank, true}).push_back(
        Step{.local = {bufFrom, offFrom}, .out = {bufTo, offTo}, .bytes = bytes});
  }
  void finish() {
    for (auto& [key, steps] : streams_) plan_->streams.push_back(Stream{.steps = std::move(steps)});
  }

 private:
  std::vector<Step>& stream(StreamKey key) { return streams_[key]; }
  template <typename F>
  void forSlices(size_t bytes, F&& f) {
    if (bytes == 0) {  // still a message: the peer posts one too
      f(0, 0);
      return;
    }
    for (size_t off = 0; off < bytes; off += sliceBytes_) f(off, std::min(sliceBytes_, bytes - off));
  }
  Plan* plan_;
  size_t sliceBytes_;
  std::map<StreamKey, std::vector<Step>> streams_;
};

}  // namespace

Result<Plan> planPointToPoint(std::span<const OpDesc> ops, const PlanParams& p) {
  Plan plan;
  plan.rank = p.rank;
  plan.nranks = p.nranks;
  plan.nbuffers = int(ops.size()) * 2;
  plan.algorithm = "p2p";
  plan.hostRanks = hostRanksOf(p);
  // Slices are whole elements of every type (8 bytes covers all of them).
  Builder b(&plan, std::max<size_t>(8, p.sliceBytes / 8 * 8));
  const int r = p.rank, n = p.nranks;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpDesc& op = ops[i];
    const int sb = int(2 * i), rb = int(2 * i + 1);
    const size_t bytes = op.count * kernels::dataTypeSize(op.type);
    switch (op.kind) {
      case OpKind::kSend:
        b.send(op.root, sb, 0, bytes);
        break;
      case OpKind::kRecv:
        b.recv(op.root, rb, 0, bytes);
        break;
      case OpKind::kAllToAll:
        for (int q = 0; q < n; ++q) {
          if (q == r) {
            b.copy(sb, size_t(q) * bytes, rb, size_t(q) * bytes, bytes);
          } else {
            b.send(q, sb, size_t(q) * bytes, bytes);
            b.recv(q, rb, size_t(q) * bytes, bytes);
          }
        }
        break;
      case OpKind::kGather:
        if (r == op.root) {
          for (int q = 0; q < n; ++q) {
            if (q == r) b.copy(sb, 0, rb, size_t(q) * bytes, bytes);
            else b.recv(q, rb, size_t(q) * bytes, bytes);
          }
        } else {
          b.send(op.root, sb, 0, bytes);
        }
        break;
      case OpKind::kScatter:
        if (r == op.root) {
          for (int q = 0; q < n; ++q) {
            if (q == r) b.copy(sb, size_t(q) * bytes, rb, 0, bytes);
            else b.send(q, sb, size_t(q) * bytes, bytes);
          }
        } else {
          b.recv(op.root, rb, 0, bytes);
        }
        break;
      default:
        return internalError(std::string("planPointToPoint called for ") + opKindName(op.kind));
    }
  }
  b.finish();
  return plan;
}

}  // namespace loom::core
