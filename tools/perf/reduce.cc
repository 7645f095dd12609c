// reduce_perf: the root ends with the reduction; other ranks' output buffers
// must stay as they were.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class Reduce final : public Collective {
 public:
  const char* name() const override { return "reduce"; }
  OpUse opUse() const override { return OpUse::kReduce; }
  bool hasRoot() const override { return true; }
  CollCounts counts(uint64_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algorithmBytes(uint64_t count, size_t size, int) const override { return double(count * size); }
  double busFactor(int) const override { return 1.0; }
  void fillInput(const DataArgs& a) const override { generateInput(a.spec, a.rank, 0, a.counts.send, a.input); }
  void fillExpected(const DataArgs& a) const override {
    if (a.rank == a.root) generateExpected(a.spec, 0, a.counts.recv, a.expected);
  }
  ncclResult_t run(const RunArgs& a) const override {
    return ncclReduce(a.send, a.recv, a.count, a.type, a.op, a.root, a.comm, a.stream);
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::Reduce()); }
