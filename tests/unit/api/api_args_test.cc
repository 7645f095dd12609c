// Bad arguments to every entry point of nccl.h, with real communicators (1
// and 2 ranks made by ncclCommInitAll, one process). Each call must return
// ncclInvalidArgument or ncclInvalidUsage at once - never crash, throw, or
// wait for a peer - and ncclGetLastError must name the function and the
// argument at fault.
//
// The 2-rank communicator is driven from one thread: a call that wrongly
// passed its checks would wait for rank 1, so LOOM_TIMEOUT_S is lowered to
// turn such a bug into a failure instead of a hang.
#include <gtest/gtest.h>
#include <loom/loom.h>
#include <nccl.h>

#include <chrono>
#include <cmath>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr ncclDataType_t kBadTypes[] = {ncclDataType_t(12), ncclDataType_t(-1), ncclDataType_t(1000)};
constexpr ncclRedOp_t kBadOps[] = {ncclRedOp_t(99), ncclRedOp_t(-1), ncclNumOps};

// Expects `rc` to be `want` and the last error to mention every word.
#define EXPECT_BAD(call, want, ...)                                                          \
  do {                                                                                       \
    const ncclResult_t rc_ = (call);                                                         \
    EXPECT_EQ(rc_, want) << #call;                                                           \
    const std::string msg_ = ncclGetLastError(nullptr);                                      \
    for (const char* w_ : {__VA_ARGS__})                                                     \
      EXPECT_NE(msg_.find(w_), std::string::npos) << #call << ": message lacks '" << w_      \
                                                  << "': " << msg_;                          \
  } while (0)

class ApiArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ncclCommInitAll(&one_, 1, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclCommInitAll(two_, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void TearDown() override {
    if (one_) {
      EXPECT_EQ(ncclCommDestroy(one_), ncclSuccess);
    }
    for (auto c : two_) {
      if (c) {
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
      }
    }
  }
  ncclComm_t one_ = nullptr;
  ncclComm_t two_[2] = {nullptr, nullptr};
  std::vector<float> a_ = std::vector<float>(64, 1.0f), b_ = std::vector<float>(64, 0.0f);
};

TEST_F(ApiArgs, LibraryCalls) {
  EXPECT_BAD(ncclGetVersion(nullptr), ncclInvalidArgument, "ncclGetVersion", "version");
  EXPECT_BAD(ncclGetUniqueId(nullptr), ncclInvalidArgument, "ncclGetUniqueId", "uniqueId");
  EXPECT_NE(ncclGetErrorString(ncclResult_t(99)), nullptr);
  EXPECT_NE(ncclGetErrorString(ncclResult_t(-1)), nullptr);
  EXPECT_NE(ncclGetLastError(nullptr), nullptr);
  void* p = nullptr;
  EXPECT_BAD(ncclMemAlloc(nullptr, 64), ncclInvalidArgument, "ncclMemAlloc", "ptr");
  EXPECT_BAD(ncclMemAlloc(&p, 0), ncclInvalidArgument, "ncclMemAlloc", "size");
  EXPECT_NE(ncclMemAlloc(&p, SIZE_MAX), ncclSuccess) << "an impossible size must fail, not crash";
  int local = 0;
  EXPECT_BAD(ncclMemFree(&local), ncclInvalidArgument, "ncclMemFree", "ptr");
  EXPECT_BAD(ncclMemFree(a_.data()), ncclInvalidArgument, "ncclMemFree", "ptr");
}

TEST_F(ApiArgs, InitCalls) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = nullptr;
  EXPECT_BAD(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument, "ncclCommInitRank", "comm");
  EXPECT_BAD(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_BAD(ncclCommInitRank(&c, -3, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_BAD(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument, "rank", "2");
  EXPECT_BAD(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument, "rank", "-1");
  ncclUniqueId zeros{};
  EXPECT_BAD(ncclCommInitRank(&c, 1, zeros, 0), ncclInvalidArgument, "ncclCommInitRank", "ncclUniqueId");

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0x12345678;
  EXPECT_BAD(ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument, "ncclCommInitRankConfig", "magic");
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 5;
  EXPECT_BAD(ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument, "blocking");
  // The values NCCL refuses, each named.
  const struct {
    void (*set)(ncclConfig_t*);
    const char* field;
  } refused[] = {
      {[](ncclConfig_t* k) { k->minCTAs = 0; }, "minCTAs is 0"},
      {[](ncclConfig_t* k) { k->maxCTAs = -2; }, "maxCTAs is -2"},
      {[](ncclConfig_t* k) { k->minCTAs = 8, k->maxCTAs = 4; }, "minCTAs 8 is more than maxCTAs 4"},
      {[](ncclConfig_t* k) { k->cgaClusterSize = -1; }, "cgaClusterSize"},
      {[](ncclConfig_t* k) { k->splitShare = 2; }, "splitShare"},
      {[](ncclConfig_t* k) { k->collnetEnable = 3; }, "collnetEnable"},
      {[](ncclConfig_t* k) { k->shrinkShare = -1; }, "shrinkShare"},
      {[](ncclConfig_t* k) { k->CTAPolicy = 8; }, "CTAPolicy"},
      {[](ncclConfig_t* k) { k->nvlsCTAs = 0; }, "nvlsCTAs"},
      {[](ncclConfig_t* k) { k->nChannelsPerNetPeer = 0; }, "nChannelsPerNetPeer"},
      {[](ncclConfig_t* k) { k->nvlinkCentricSched = 2; }, "nvlinkCentricSched"},
  };
  for (const auto& r : refused) {
    config = NCCL_CONFIG_INITIALIZER;
    r.set(&config);
    EXPECT_BAD(ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument, "config->", r.field);
  }
  // Accepted values work: a one-rank communicator with every field set.
  config = NCCL_CONFIG_INITIALIZER;
  config.cgaClusterSize = 2;
  config.minCTAs = 2;
  config.maxCTAs = 4;
  config.splitShare = 1;
  config.trafficClass = 106;
  config.collnetEnable = 0;
  config.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
  config.shrinkShare = 0;
  config.nvlsCTAs = 16;
  config.nChannelsPerNetPeer = 2;
  config.nvlinkCentricSched = 1;
  ASSERT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

  EXPECT_BAD(ncclCommInitRankScalable(&c, 2, 0, 1, nullptr, nullptr), ncclInvalidArgument,
             "ncclCommInitRankScalable", "commIds");
  EXPECT_BAD(ncclCommInitRankScalable(&c, 2, 0, 0, &id, nullptr), ncclInvalidArgument, "nId");
  EXPECT_BAD(ncclCommInitRankScalable(&c, 0, 0, 1, &id, nullptr), ncclInvalidArgument, "nranks");
  EXPECT_BAD(ncclCommInitRankScalable(&c, 2, 5, 1, &id, nullptr), ncclInvalidArgument, "rank");

  ncclComm_t many[2];
  const int badDev[2] = {0, -1};
  EXPECT_BAD(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "ncclCommInitAll", "comm");
  EXPECT_BAD(ncclCommInitAll(many, 0, nullptr), ncclInvalidArgument, "ndev");
  EXPECT_BAD(ncclCommInitAll(many, 2, badDev), ncclInvalidArgument, "devlist");
}

TEST_F(ApiArgs, SplitAndUnsupportedCalls) {
  ncclComm_t child = nullptr;
  EXPECT_BAD(ncclCommSplit(nullptr, 0, 0, &child, nullptr), ncclInvalidArgument, "ncclCommSplit", "comm");
  EXPECT_BAD(ncclCommSplit(one_, 0, 0, nullptr, nullptr), ncclInvalidArgument, "newcomm");
  EXPECT_BAD(ncclCommSplit(one_, -2, 0, &child, nullptr), ncclInvalidArgument, "color", "-2");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT_BAD(ncclCommSplit(one_, 0, 0, &child, &config), ncclInvalidArgument, "magic");
  int exclude[1] = {0};
  EXPECT_BAD(ncclCommShrink(nullptr, exclude, 1, &child, nullptr, 0), ncclInvalidArgument, "ncclCommShrink", "comm");
  EXPECT_BAD(ncclCommRevoke(nullptr, 0), ncclInvalidArgument, "ncclCommRevoke", "comm");
  ncclWindow_t win = nullptr;
  EXPECT_BAD(ncclCommWindowRegister(nullptr, a_.data(), 256, &win, 0), ncclInvalidArgument,
             "ncclCommWindowRegister", "comm");
  EXPECT_BAD(ncclCommWindowDeregister(nullptr, win), ncclInvalidArgument, "ncclCommWindowDeregister", "comm");
  EXPECT_BAD(ncclCommWindowRegister(one_, nullptr, 256, &win, 0), ncclInvalidArgument, "buff");
  EXPECT_BAD(ncclCommWindowRegister(one_, a_.data(), 256, nullptr, 0), ncclInvalidArgument, "win");
  EXPECT_BAD(ncclCommWindowRegister(one_, a_.data(), 0, &win, 0), ncclInvalidArgument, "size");
  EXPECT_BAD(ncclCommWindowRegister(one_, a_.data(), 256, &win, 4), ncclInvalidArgument, "winFlags 4");
  EXPECT_BAD(ncclCommWindowDeregister(one_, nullptr), ncclInvalidArgument, "win");
  // The communicator still works after all that.
  EXPECT_EQ(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, one_, nullptr), ncclSuccess);
}

TEST_F(ApiArgs, QueriesAndTeardown) {
  ncclResult_t async;
  int v = 0;
  EXPECT_BAD(ncclCommGetAsyncError(nullptr, &async), ncclInvalidArgument, "ncclCommGetAsyncError", "comm");
  EXPECT_BAD(ncclCommGetAsyncError(one_, nullptr), ncclInvalidArgument, "asyncError");
  EXPECT_BAD(ncclCommCount(nullptr, &v), ncclInvalidArgument, "ncclCommCount", "comm");
  EXPECT_BAD(ncclCommCount(one_, nullptr), ncclInvalidArgument, "count");
  EXPECT_BAD(ncclCommCuDevice(nullptr, &v), ncclInvalidArgument, "ncclCommCuDevice", "comm");
  EXPECT_BAD(ncclCommCuDevice(one_, nullptr), ncclInvalidArgument, "device");
  EXPECT_BAD(ncclCommUserRank(nullptr, &v), ncclInvalidArgument, "ncclCommUserRank", "comm");
  EXPECT_BAD(ncclCommUserRank(one_, nullptr), ncclInvalidArgument, "rank");
  EXPECT_BAD(ncclCommFinalize(nullptr), ncclInvalidArgument, "ncclCommFinalize", "comm");
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess) << "destroying NULL is a no-op";
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess) << "aborting NULL is a no-op";
  // A handle that is not a communicator at all.
  ncclComm_t fake = reinterpret_cast<ncclComm_t>(b_.data());
  EXPECT_BAD(ncclCommCount(fake, &v), ncclInvalidArgument, "ncclCommCount", "comm", "not a live communicator");
  EXPECT_BAD(ncclCommDestroy(fake), ncclInvalidArgument, "ncclCommDestroy", "comm");
}

TEST_F(ApiArgs, UseAfterDestroy) {
  ncclComm_t dead = one_;
  ASSERT_EQ(ncclCommDestroy(dead), ncclSuccess);
  one_ = nullptr;
  int v = 0;
  EXPECT_BAD(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, dead, nullptr), ncclInvalidArgument,
             "ncclAllReduce", "comm", "not a live communicator");
  EXPECT_BAD(ncclCommCount(dead, &v), ncclInvalidArgument, "comm");
  EXPECT_BAD(ncclCommDestroy(dead), ncclInvalidArgument, "ncclCommDestroy", "comm");
  EXPECT_BAD(ncclCommAbort(dead), ncclInvalidArgument, "ncclCommAbort", "comm");
  EXPECT_BAD(ncclSend(a_.data(), 1, ncclFloat32, 0, dead, nullptr), ncclInvalidArgument, "ncclSend", "comm");
}

TEST_F(ApiArgs, RegistrationAndReductionOps) {
  void* h = nullptr;
  EXPECT_BAD(ncclCommRegister(nullptr, a_.data(), 256, &h), ncclInvalidArgument, "ncclCommRegister", "comm");
  EXPECT_BAD(ncclCommRegister(one_, nullptr, 256, &h), ncclInvalidArgument, "buff");
  EXPECT_BAD(ncclCommRegister(one_, a_.data(), 256, nullptr), ncclInvalidArgument, "handle");
  EXPECT_BAD(ncclCommRegister(one_, a_.data(), 0, &h), ncclInvalidArgument, "size");
  EXPECT_BAD(ncclCommDeregister(one_, nullptr), ncclInvalidArgument, "ncclCommDeregister", "handle");
  EXPECT_BAD(ncclCommDeregister(one_, a_.data()), ncclInvalidArgument, "handle");
  EXPECT_BAD(ncclCommDeregister(nullptr, a_.data()), ncclInvalidArgument, "comm");
  // A window and a buffer registration are each undone by their own call,
  // on their own communicator, once.
  ncclWindow_t win = nullptr;
  ASSERT_EQ(ncclCommWindowRegister(one_, a_.data(), 256, &win, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  ASSERT_NE(win, nullptr);
  ASSERT_EQ(ncclCommRegister(one_, a_.data(), 256, &h), ncclSuccess);
  EXPECT_BAD(ncclCommDeregister(one_, win), ncclInvalidArgument, "ncclCommWindowDeregister");
  EXPECT_BAD(ncclCommWindowDeregister(one_, static_cast<ncclWindow_t>(h)), ncclInvalidArgument, "ncclCommDeregister");
  EXPECT_BAD(ncclCommWindowDeregister(two_[0], win), ncclInvalidArgument, "this communicator");
  EXPECT_EQ(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, one_, nullptr), ncclSuccess);
  EXPECT_EQ(b_[63], 1.0f);
  EXPECT_EQ(ncclCommWindowDeregister(one_, win), ncclSuccess);
  EXPECT_BAD(ncclCommWindowDeregister(one_, win), ncclInvalidArgument, "not returned by ncclCommWindowRegister");
  EXPECT_EQ(ncclCommDeregister(one_, h), ncclSuccess);

  ncclRedOp_t op;
  float scalar = 2;
  EXPECT_BAD(ncclRedOpCreatePreMulSum(nullptr, &scalar, ncclFloat32, ncclScalarHostImmediate, one_),
             ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "op");
  EXPECT_BAD(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat32, ncclScalarHostImmediate, one_),
             ncclInvalidArgument, "scalar");
  for (ncclDataType_t t : kBadTypes)
    EXPECT_BAD(ncclRedOpCreatePreMulSum(&op, &scalar, t, ncclScalarHostImmediate, one_), ncclInvalidArgument,
               "datatype");
  EXPECT_BAD(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarResidence_t(5), one_),
             ncclInvalidArgument, "residence");
  EXPECT_BAD(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, nullptr), ncclInvalidArgument,
             "comm");
  EXPECT_BAD(ncclRedOpDestroy(ncclSum, one_), ncclInvalidArgument, "ncclRedOpDestroy", "op");
  EXPECT_BAD(ncclRedOpDestroy(ncclRedOp_t(99), one_), ncclInvalidArgument, "op");
  // An op is valid only for its datatype and communicator.
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, one_), ncclSuccess);
  std::vector<double> d(8, 1.0);
  EXPECT_BAD(ncclAllReduce(d.data(), d.data(), 8, ncclFloat64, op, one_, nullptr), ncclInvalidArgument,
             "ncclAllReduce", "op");
  EXPECT_BAD(ncclRedOpDestroy(op, two_[0]), ncclInvalidArgument, "op");
  EXPECT_EQ(ncclRedOpDestroy(op, one_), ncclSuccess);
  EXPECT_BAD(ncclRedOpDestroy(op, nullptr), ncclInvalidArgument, "comm");
}

// Every data call on a 1-rank and a 2-rank communicator.
TEST_F(ApiArgs, CollectivesAndPointToPoint) {
  for (ncclComm_t comm : {one_, two_[0]}) {
    int n = 0;
    ASSERT_EQ(ncclCommCount(comm, &n), ncclSuccess);
    SCOPED_TRACE("nranks " + std::to_string(n));
    float* a = a_.data();
    float* b = b_.data();
    const ncclDataType_t f = ncclFloat32;
    // NULL communicator.
    EXPECT_BAD(ncclAllReduce(a, b, 4, f, ncclSum, nullptr, nullptr), ncclInvalidArgument, "ncclAllReduce", "comm");
    EXPECT_BAD(ncclReduce(a, b, 4, f, ncclSum, 0, nullptr, nullptr), ncclInvalidArgument, "ncclReduce", "comm");
    EXPECT_BAD(ncclReduceScatter(a, b, 4, f, ncclSum, nullptr, nullptr), ncclInvalidArgument, "comm");
    EXPECT_BAD(ncclAllGather(a, b, 4, f, nullptr, nullptr), ncclInvalidArgument, "ncclAllGather", "comm");
    EXPECT_BAD(ncclBroadcast(a, b, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclBroadcast", "comm");
    EXPECT_BAD(ncclBcast(a, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclBcast", "comm");
    EXPECT_BAD(ncclAlltoAll(a, b, 4, f, nullptr, nullptr), ncclInvalidArgument, "ncclAlltoAll", "comm");
    EXPECT_BAD(ncclGather(a, b, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclGather", "comm");
    EXPECT_BAD(ncclScatter(a, b, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclScatter", "comm");
    EXPECT_BAD(ncclSend(a, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclSend", "comm");
    EXPECT_BAD(ncclRecv(b, 4, f, 0, nullptr, nullptr), ncclInvalidArgument, "ncclRecv", "comm");
    // NULL buffers where data is needed.
    EXPECT_BAD(ncclAllReduce(nullptr, b, 4, f, ncclSum, comm, nullptr), ncclInvalidArgument, "sendbuff");
    EXPECT_BAD(ncclAllReduce(a, nullptr, 4, f, ncclSum, comm, nullptr), ncclInvalidArgument, "recvbuff");
    EXPECT_BAD(ncclReduceScatter(nullptr, b, 4, f, ncclSum, comm, nullptr), ncclInvalidArgument, "sendbuff");
    EXPECT_BAD(ncclAllGather(a, nullptr, 4, f, comm, nullptr), ncclInvalidArgument, "recvbuff");
    EXPECT_BAD(ncclBroadcast(nullptr, b, 4, f, 0, comm, nullptr), ncclInvalidArgument, "sendbuff");  // rank 0 is root
    EXPECT_BAD(ncclBcast(nullptr, 4, f, 0, comm, nullptr), ncclInvalidArgument, "ncclBcast");
    EXPECT_BAD(ncclReduce(a, nullptr, 4, f, ncclSum, 0, comm, nullptr), ncclInvalidArgument, "recvbuff");
    EXPECT_BAD(ncclAlltoAll(nullptr, b, 4, f, comm, nullptr), ncclInvalidArgument, "sendbuff");
    EXPECT_BAD(ncclGather(a, nullptr, 4, f, 0, comm, nullptr), ncclInvalidArgument, "recvbuff");
    EXPECT_BAD(ncclScatter(nullptr, b, 4, f, 0, comm, nullptr), ncclInvalidArgument, "sendbuff");
    EXPECT_BAD(ncclSend(nullptr, 4, f, 0, comm, nullptr), ncclInvalidArgument, "ncclSend", "sendbuff");
    EXPECT_BAD(ncclRecv(nullptr, 4, f, 0, comm, nullptr), ncclInvalidArgument, "ncclRecv", "recvbuff");
    // Bad datatypes.
    for (ncclDataType_t t : kBadTypes) {
      EXPECT_BAD(ncclAllReduce(a, b, 4, t, ncclSum, comm, nullptr), ncclInvalidArgument, "datatype");
      EXPECT_BAD(ncclAllGather(a, b, 4, t, comm, nullptr), ncclInvalidArgument, "datatype");
      EXPECT_BAD(ncclBroadcast(a, b, 4, t, 0, comm, nullptr), ncclInvalidArgument, "datatype");
      EXPECT_BAD(ncclSend(a, 4, t, 0, comm, nullptr), ncclInvalidArgument, "datatype");
      EXPECT_BAD(ncclRecv(b, 4, t, 0, comm, nullptr), ncclInvalidArgument, "datatype");
      EXPECT_BAD(ncclAlltoAll(a, b, 1, t, comm, nullptr), ncclInvalidArgument, "datatype");
    }
    // Bad reduction ops.
    for (ncclRedOp_t op : kBadOps) {
      EXPECT_BAD(ncclAllReduce(a, b, 4, f, op, comm, nullptr), ncclInvalidArgument, "ncclAllReduce", "op");
      EXPECT_BAD(ncclReduce(a, b, 4, f, op, 0, comm, nullptr), ncclInvalidArgument, "op");
      EXPECT_BAD(ncclReduceScatter(a, b, 4, f, op, comm, nullptr), ncclInvalidArgument, "op");
    }
    // Bad roots and peers.
    for (int bad : {-1, n, 1000}) {
      EXPECT_BAD(ncclBroadcast(a, b, 4, f, bad, comm, nullptr), ncclInvalidArgument, "ncclBroadcast", "root");
      EXPECT_BAD(ncclBcast(a, 4, f, bad, comm, nullptr), ncclInvalidArgument, "root");
      EXPECT_BAD(ncclReduce(a, b, 4, f, ncclSum, bad, comm, nullptr), ncclInvalidArgument, "root");
      EXPECT_BAD(ncclGather(a, b, 1, f, bad, comm, nullptr), ncclInvalidArgument, "root");
      EXPECT_BAD(ncclScatter(a, b, 1, f, bad, comm, nullptr), ncclInvalidArgument, "root");
      EXPECT_BAD(ncclSend(a, 4, f, bad, comm, nullptr), ncclInvalidArgument, "ncclSend", "peer");
      EXPECT_BAD(ncclRecv(b, 4, f, bad, comm, nullptr), ncclInvalidArgument, "ncclRecv", "peer");
    }
    // Counts whose byte size overflows.
    for (size_t count : {SIZE_MAX, SIZE_MAX / 2}) {
      EXPECT_BAD(ncclAllReduce(a, b, count, f, ncclSum, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclAllGather(a, b, count, f, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclReduceScatter(a, b, count, f, ncclSum, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclBroadcast(a, b, count, f, 0, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclAlltoAll(a, b, count, f, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclSend(a, count, f, 0, comm, nullptr), ncclInvalidArgument, "count");
      EXPECT_BAD(ncclRecv(b, count, f, 0, comm, nullptr), ncclInvalidArgument, "count");
    }
    // Nothing above reached the peer: the communicator is still healthy.
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
  }
  EXPECT_EQ(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, one_, nullptr), ncclSuccess);
  EXPECT_EQ(b_[63], 1.0f);
}

TEST_F(ApiArgs, Groups) {
  EXPECT_BAD(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd", "ncclGroupStart");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_BAD(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd", "ncclGroupStart");
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_BAD(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument, "simInfo");
  sim.magic = 1;
  EXPECT_BAD(ncclGroupSimulateEnd(&sim), ncclInvalidArgument, "magic");
  // A bad call inside a group is reported by the call (or by the group end);
  // either way the group can still be closed and nothing runs.
  const ncclResult_t inGroup = ncclAllReduce(a_.data(), b_.data(), 4, ncclDataType_t(42), ncclSum, one_, nullptr);
  const ncclResult_t end = ncclGroupEnd();
  EXPECT_TRUE(inGroup == ncclInvalidArgument || end == ncclInvalidArgument) << inGroup << " " << end;
  EXPECT_BAD(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd");  // the group is closed
  EXPECT_EQ(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, one_, nullptr), ncclSuccess);
}

// loomCommSetTimeout: checked arguments, the value read back, and an
// operation that waits for a peer failing after the new timeout, not after
// LOOM_TIMEOUT_S's 20 s.
TEST_F(ApiArgs, LoomCommTimeout) {
  double seconds = -1;
  EXPECT_BAD(loomCommSetTimeout(nullptr, 1.0), ncclInvalidArgument, "loomCommSetTimeout", "comm");
  EXPECT_BAD(loomCommSetTimeout(one_, -1.0), ncclInvalidArgument, "loomCommSetTimeout", "seconds");
  EXPECT_BAD(loomCommSetTimeout(one_, std::nan("")), ncclInvalidArgument, "seconds");
  EXPECT_BAD(loomCommGetTimeout(one_, nullptr), ncclInvalidArgument, "loomCommGetTimeout", "seconds");
  ASSERT_EQ(loomCommGetTimeout(one_, &seconds), ncclSuccess);
  EXPECT_EQ(seconds, 20.0);  // LOOM_TIMEOUT_S
  ASSERT_EQ(loomCommSetTimeout(one_, 2.5), ncclSuccess);
  ASSERT_EQ(loomCommGetTimeout(one_, &seconds), ncclSuccess);
  EXPECT_EQ(seconds, 2.5);

  // Rank 0 of the pair alone: its AllReduce waits for rank 1 (driven by no
  // one), and gives up after a second.
  ASSERT_EQ(loomCommSetTimeout(two_[0], 1.0), ncclSuccess);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclAllReduce(a_.data(), b_.data(), 64, ncclFloat32, ncclSum, two_[0], nullptr), ncclRemoteError);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10.0);
  EXPECT_NE(std::string(ncclGetLastError(two_[0])).find("made no progress for 1 s"), std::string::npos)
      << ncclGetLastError(two_[0]);
  for (auto& c : two_) {  // failed: abort rather than destroy
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
    c = nullptr;
  }
}

}  // namespace

int main(int argc, char** argv) {
  setenv("LOOM_TIMEOUT_S", "20", 0);  // see the comment at the top
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
