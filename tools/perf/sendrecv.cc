// sendrecv_perf: a ring of point-to-point transfers, rank r sends to r+1 and
// receives from r-1. Like nccl-tests it loops over -o (names only) and does
// not check the in-place run.
#include "tools/perf/common.h"

namespace loom::perf {
namespace {

class SendRecv final : public Collective {
 public:
  const char* name() const override { return "sendrecv"; }
  OpUse opUse() const override { return OpUse::kNameOnly; }
  bool checksInPlace() const override { return false; }
  CollCounts counts(uint64_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algorithmBytes(uint64_t count, size_t size, int) const override { return double(count * size); }
  double busFactor(int) const override { return 1.0; }
  void fillInput(const DataArgs& a) const override {
    generateInput(a.spec, a.rank, uint64_t(a.rank) * a.counts.send, a.counts.send, a.input);
  }
  void fillExpected(const DataArgs& a) const override {
    uint64_t peer = uint64_t((a.rank - 1 + a.spec.nranks) % a.spec.nranks);
    generateExpected(a.spec, peer * a.counts.recv, a.counts.recv, a.expected);
  }
  ncclResult_t run(const RunArgs& a) const override {
    int sendPeer = (a.rank + 1) % a.nranks;
    int recvPeer = (a.rank - 1 + a.nranks) % a.nranks;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    ncclResult_t sendResult = ncclSend(a.send, a.count, a.type, sendPeer, a.comm, a.stream);
    ncclResult_t recvResult = ncclRecv(a.recv, a.count, a.type, recvPeer, a.comm, a.stream);
    result = ncclGroupEnd();
    if (sendResult != ncclSuccess) return sendResult;
    return recvResult != ncclSuccess ? recvResult : result;
  }
};

}  // namespace
}  // namespace loom::perf

int main(int argc, char** argv) { return loom::perf::perfMain(argc, argv, loom::perf::SendRecv()); }
