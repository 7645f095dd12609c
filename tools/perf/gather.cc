// gather_perf: rank r's block lands at r * count in the root's output; the
// other ranks' output buffers must stay as they were.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class Gather final : public Collective {
 public:
  const char* name() const override { return "gather"; }
  OpUse opUse() const override { return OpUse::kNone; }
  bool hasRoot() const override { return true; }
  CollCounts counts(uint64_t count, size_t size, int n) const override {
    uint64_t block = alignDown16Bytes(count / uint64_t(n), size);
    return {block, block * uint64_t(n), block, block, 0};
  }
  double algorithmBytes(uint64_t count, size_t size, int n) const override { return double(count * size) * n; }
  double busFactor(int n) const override { return double(n - 1) / n; }
  void fillInput(const DataArgs& a) const override {
    generateInput(a.spec, a.rank, uint64_t(a.rank) * a.counts.send, a.counts.send, a.input);
  }
  void fillExpected(const DataArgs& a) const override {
    if (a.rank == a.root) generateExpected(a.spec, 0, a.counts.recv, a.expected);
  }
  ncclResult_t run(const RunArgs& a) const override {
    if (a.count == 0) return ncclSuccess;  // as nccl-tests
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (a.libraryVersion >= NCCL_VERSION(2, 28, 0)) {
      return ncclGather(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
    }
#endif
    size_t blockBytes = a.count * a.elementSize;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    ncclResult_t first = ncclSend(a.send, a.count, a.type, a.root, a.comm, a.stream);
    for (int peer = 0; a.rank == a.root && peer < a.nranks && first == ncclSuccess; ++peer) {
      first = ncclRecv(static_cast<char*>(a.recv) + peer * blockBytes, a.count, a.type, peer, a.comm, a.stream);
    }
    result = ncclGroupEnd();
    return first != ncclSuccess ? first : result;
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::Gather()); }
