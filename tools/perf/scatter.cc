// scatter_perf: block r of the root's input lands in rank r's output.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class Scatter final : public Collective {
 public:
  const char* name() const override { return "scatter"; }
  OpUse opUse() const override { return OpUse::kNone; }
  bool hasRoot() const override { return true; }
  CollCounts counts(uint64_t count, size_t size, int n) const override {
    uint64_t block = alignDown16Bytes(count / uint64_t(n), size);
    return {block * uint64_t(n), block, block, 0, block};
  }
  double algorithmBytes(uint64_t count, size_t size, int n) const override { return double(count * size) * n; }
  double busFactor(int n) const override { return double(n - 1) / n; }
  // Only the root's input is meaningful; the others stay zero.
  void fillInput(const DataArgs& a) const override {
    if (a.rank == a.root) generateInput(a.spec, a.rank, 0, a.counts.send, a.input);
  }
  void fillExpected(const DataArgs& a) const override {
    generateExpected(a.spec, uint64_t(a.rank) * a.counts.recv, a.counts.recv, a.expected);
  }
  ncclResult_t run(const RunArgs& a) const override {
    if (a.count == 0) return ncclSuccess;  // as nccl-tests
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (a.libraryVersion >= NCCL_VERSION(2, 28, 0)) {
      return ncclScatter(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
    }
#endif
    size_t blockBytes = a.count * a.elementSize;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    ncclResult_t first = ncclSuccess;
    for (int peer = 0; a.rank == a.root && peer < a.nranks && first == ncclSuccess; ++peer) {
      first = ncclSend(static_cast<const char*>(a.send) + peer * blockBytes, a.count, a.type, peer, a.comm, a.stream);
    }
    if (first == ncclSuccess) first = ncclRecv(a.recv, a.count, a.type, a.root, a.comm, a.stream);
    result = ncclGroupEnd();
    return first != ncclSuccess ? first : result;
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::Scatter()); }
