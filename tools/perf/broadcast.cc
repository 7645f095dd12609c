// broadcast_perf: the root's buffer reaches every rank.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class Broadcast final : public Collective {
 public:
  const char* name() const override { return "broadcast"; }
  OpUse opUse() const override { return OpUse::kNone; }
  bool hasRoot() const override { return true; }
  CollCounts counts(uint64_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algorithmBytes(uint64_t count, size_t size, int) const override { return double(count * size); }
  double busFactor(int) const override { return 1.0; }
  // Only the root's input is meaningful; the others stay zero.
  void fillInput(const DataArgs& a) const override {
    if (a.rank == a.root) generateInput(a.spec, a.rank, 0, a.counts.send, a.input);
  }
  void fillExpected(const DataArgs& a) const override { generateExpected(a.spec, 0, a.counts.recv, a.expected); }
  ncclResult_t run(const RunArgs& a) const override {
    return ncclBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::Broadcast()); }
