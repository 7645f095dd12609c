// all_gather_perf: rank r's block lands at r * count in every rank's output.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class AllGather final : public Collective {
 public:
  const char* name() const override { return "all_gather"; }
  OpUse opUse() const override { return OpUse::kNone; }
  CollCounts counts(uint64_t count, size_t size, int n) const override {
    uint64_t base = alignDown16Bytes(count / uint64_t(n), size);
    return {base, base * uint64_t(n), base, base, 0};
  }
  double algorithmBytes(uint64_t count, size_t size, int n) const override { return double(count * size) * n; }
  double busFactor(int n) const override { return double(n - 1) / n; }
  void fillInput(const DataArgs& a) const override {
    generateInput(a.spec, a.rank, uint64_t(a.rank) * a.counts.send, a.counts.send, a.input);
  }
  void fillExpected(const DataArgs& a) const override { generateExpected(a.spec, 0, a.counts.recv, a.expected); }
  ncclResult_t run(const RunArgs& a) const override {
    return ncclAllGather(a.send, a.recv, a.count, a.type, a.comm, a.stream);
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::AllGather()); }
