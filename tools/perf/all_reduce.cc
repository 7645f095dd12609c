// all_reduce_perf: every rank ends with the reduction of all inputs.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class AllReduce final : public Collective {
 public:
  const char* name() const override { return "all_reduce"; }
  OpUse opUse() const override { return OpUse::kReduce; }
  CollCounts counts(uint64_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algorithmBytes(uint64_t count, size_t size, int) const override { return double(count * size); }
  double busFactor(int n) const override { return 2.0 * (n - 1) / n; }
  void fillInput(const DataArgs& a) const override { generateInput(a.spec, a.rank, 0, a.counts.send, a.input); }
  void fillExpected(const DataArgs& a) const override { generateExpected(a.spec, 0, a.counts.recv, a.expected); }
  ncclResult_t run(const RunArgs& a) const override {
    return ncclAllReduce(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::AllReduce()); }
