// reduce_scatter_perf: rank r ends with block r of the reduction.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class ReduceScatter final : public Collective {
 public:
  const char* name() const override { return "reduce_scatter"; }
  OpUse opUse() const override { return OpUse::kReduce; }
  CollCounts counts(uint64_t count, size_t size, int n) const override {
    uint64_t base = alignDown16Bytes(count / uint64_t(n), size);
    return {base * uint64_t(n), base, base, 0, base};
  }
  double algorithmBytes(uint64_t count, size_t size, int n) const override { return double(count * size) * n; }
  double busFactor(int n) const override { return double(n - 1) / n; }
  void fillInput(const DataArgs& a) const override { generateInput(a.spec, a.rank, 0, a.counts.send, a.input); }
  void fillExpected(const DataArgs& a) const override {
    generateExpected(a.spec, uint64_t(a.rank) * a.counts.recv, a.counts.recv, a.expected);
  }
  ncclResult_t run(const RunArgs& a) const override {
    return ncclReduceScatter(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::ReduceScatter()); }
