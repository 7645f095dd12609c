#include "core/simulator.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/executor.h"

namespace loom::core {
namespace {

using transport::Transfer;

// Messages from one rank to another, in posting order.
// A FIFO that costs nothing while empty (a simulation of a thousand ranks
// has millions of them).
class Queue {
 public:
  bool empty() const { return head_ == items_.size(); }
  Transfer* front() const { return items_[head_]; }
  void push_back(Transfer* t) { items_.push_back(t); }
  void pop_front() {
    if (++head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    }
  }

 private:
  std::vector<Transfer*> items_;
  size_t head_ = 0;
};

struct Wire {
  Queue sends;
  Queue recvs;

  Status match(int from, int to) {
    while (!sends.empty() && !recvs.empty()) {
      Transfer* s = sends.front();
      Transfer* r = recvs.front();
      if (s->bytes != r->bytes) {
        return remoteError("simulator: rank " + std::to_string(from) + " sent " +
                           std::to_string(s->bytes) + " bytes where rank " + std::to_string(to) +
                           " posted a receive of " + std::to_string(r->bytes));
      }
      if (s->bytes) std::memcpy(r->data, s->data, s->bytes);
      s->progressed = r->progressed = s->bytes;
      s->done = r->done = true;
      sends.pop_front();
      recvs.pop_front();
    }
    return Status::ok();
  }
};

class SimConnection : public transport::Connection {
 public:
  SimConnection(int self, int peer, Wire* out, Wire* in) : self_(self), peer_(peer), out_(out), in_(in) {}
  int peer() const override { return peer_; }
  const char* kind() const override { return "sim"; }
  bool moves(transport::MemoryType) const override { return true; }
  Status progress() override {
    LOOM_TRY(out_->match(self_, peer_));
    return in_->match(peer_, self_);
  }
  void pollFds(std::vector<pollfd>*) const override {}
  bool idle() const override { return out_->sends.empty() && in_->recvs.empty(); }

 protected:
  Status queueSend(Transfer* t) override {
    out_->sends.push_back(t);
    return Status::ok();
  }
  Status queueRecv(Transfer* t) override {
    in_->recvs.push_back(t);
    return Status::ok();
  }

 private:
  int self_, peer_;
  Wire* out_;
  Wire* in_;
};

}  // namespace

Status simulate(const std::vector<Plan>& plans, const std::vector<std::vector<std::byte*>>& buffers,
                const kernels::Reduction& reduction, bool reducing) {
  const int n = int(plans.size());
  int nch = 1;
  for (const Plan& p : plans)
    for (const Stream& st : p.streams) nch = std::max(nch, st.channel + 1);
  // wires[(channel * n + from) * n + to]; each rank's table as linkIndex().
  // Wires and connections for the (channel, rank, peer) triples the plans
  // use only: all n x n of them would not fit at a thousand ranks.
  std::unordered_map<uint64_t, std::unique_ptr<Wire>> wires;
  auto wire = [&](int c, int from, int to) {
    auto& w = wires[(uint64_t(c) * uint64_t(n) + uint64_t(from)) * uint64_t(n) + uint64_t(to)];
    if (!w) w = std::make_unique<Wire>();
    return w.get();
  };
  std::vector<std::unique_ptr<SimConnection>> owned;
  std::vector<std::vector<transport::Connection*>> conns(static_cast<size_t>(n));
  for (int a = 0; a < n; ++a) {
    conns[size_t(a)].resize(size_t(nch) * size_t(n));
    for (const Stream& st : plans[size_t(a)].streams) {
      if (st.channel < 0) continue;
      for (const Step& step : st.steps) {
        step.forEachPeer([&](int b) {
          if (b >= n) return;
          transport::Connection*& slot = conns[size_t(a)][linkIndex(b, st.channel, n)];
          if (slot) return;
          owned.push_back(std::make_unique<SimConnection>(a, b, wire(st.channel, a, b), wire(st.channel, b, a)));
          slot = owned.back().get();
        });
      }
    }
  }
  std::vector<Scratch> scratch(static_cast<size_t>(n));
  std::vector<std::unique_ptr<PlanRunner>> runners;
  for (int r = 0; r < n; ++r) {
    LOOM_ASSIGN_OR_RETURN(auto runner, PlanRunner::create(&plans[size_t(r)], buffers[size_t(r)], reduction,
                                                          reducing, conns[size_t(r)], &scratch[size_t(r)]));
    runners.push_back(std::move(runner));
  }
  for (;;) {
    bool progressed = false, allDone = true;
    for (int r = 0; r < n; ++r) {
      LOOM_TRY(runners[size_t(r)]->advance(&progressed).addContext("rank " + std::to_string(r)));
      allDone = allDone && runners[size_t(r)]->done();
    }
    if (allDone) return Status::ok();
    if (!progressed) {
      std::string stuck;
      for (int r = 0; r < n; ++r) {
        if (!runners[size_t(r)]->done()) stuck += dumpPlan(plans[size_t(r)]);
      }
      return internalError("simulator: no rank can make progress (deadlock); stuck plans:\n" + stuck);
    }
  }
}

}  // namespace loom::core
