// alltoall_perf: block p of rank r's input lands as block r of rank p's
// output. ncclAlltoAll when the header and the library are 2.28 or newer,
// grouped ncclSend/ncclRecv otherwise (as nccl-tests does).
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class AlltoAll final : public Collective {
 public:
  const char* name() const override { return "alltoall"; }
  OpUse opUse() const override { return OpUse::kNone; }
  bool checksInPlace() const override { return false; }
  CollCounts counts(uint64_t count, size_t size, int n) const override {
    uint64_t block = alignDown16Bytes(count / uint64_t(n), size);
    return {block * uint64_t(n), block * uint64_t(n), block, 0, 0};
  }
  double algorithmBytes(uint64_t count, size_t size, int n) const override { return double(count * size) * n; }
  double busFactor(int n) const override { return double(n - 1) / n; }
  void fillInput(const DataArgs& a) const override {
    uint64_t block = a.counts.param;
    int n = a.spec.nranks;
    for (int peer = 0; peer < n; ++peer) {
      generateInput(a.spec, a.rank, (uint64_t(a.rank) * n + peer) * block, block,
                    elementAt(a.input, uint64_t(peer) * block, a.spec.type->size));
    }
  }
  void fillExpected(const DataArgs& a) const override {
    uint64_t block = a.counts.param;
    int n = a.spec.nranks;
    for (int peer = 0; peer < n; ++peer) {
      generateExpected(a.spec, (uint64_t(peer) * n + a.rank) * block, block,
                       elementAt(a.expected, uint64_t(peer) * block, a.spec.type->size));
    }
  }
  ncclResult_t run(const RunArgs& a) const override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (a.libraryVersion >= NCCL_VERSION(2, 28, 0)) {
      return ncclAlltoAll(a.send, a.recv, a.count, a.type, a.comm, a.stream);
    }
#endif
    size_t blockBytes = a.count * a.elementSize;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    ncclResult_t first = ncclSuccess;
    for (int peer = 0; peer < a.nranks && first == ncclSuccess; ++peer) {
      first = ncclSend(static_cast<const char*>(a.send) + peer * blockBytes, a.count, a.type, peer, a.comm, a.stream);
      if (first == ncclSuccess) {
        first = ncclRecv(static_cast<char*>(a.recv) + peer * blockBytes, a.count, a.type, peer, a.comm, a.stream);
      }
    }
    result = ncclGroupEnd();
    return first != ncclSuccess ? first : result;
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::AlltoAll()); }
