// Full matrix of collectives over the public API, ranks as threads:
// every collective x 12 data types x every op (reducing ones) x in/out of
// place x counts {0, 1, 1031, not a multiple of nranks, a few MiB} x roots
// {0, middle, last}, for 1, 2, 3, 4, 5 and 8 ranks over loom's default
// transport between threads (shared memory), and for 3 and 5 ranks over TCP
// (NCCL_SHM_DISABLE=1). One test per (collective, nranks, transport); a
// failure names the exact case (with its seed). See matrix.cc for which
// cases are sampled rather than crossed in full (big counts, Reduce roots).
//
// Also checks the test's own reference codecs (dtype_ref) against known
// encodings, so a wrong reference cannot make wrong results look right.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>

#include "dtype_ref.h"
#include "matrix.h"

namespace loom::test {
namespace {

TEST(ReferenceCodec, KnownEncodings) {
  EXPECT_EQ(encodeFloat(ncclFloat16, 1.0), 0x3c00u);
  EXPECT_EQ(encodeFloat(ncclFloat16, -2.0), 0xc000u);
  EXPECT_EQ(encodeFloat(ncclFloat16, 65504.0), 0x7bffu);
  EXPECT_EQ(encodeFloat(ncclFloat16, std::ldexp(1.0, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(encodeFloat(ncclBfloat16, 1.0), 0x3f80u);
  EXPECT_EQ(encodeFloat(ncclBfloat16, -0.5), 0xbf00u);
  EXPECT_EQ(encodeFloat(ncclFloat8e4m3, 1.0), 0x38u);
  EXPECT_EQ(encodeFloat(ncclFloat8e4m3, 448.0), 0x7eu);  // largest e4m3
  EXPECT_EQ(encodeFloat(ncclFloat8e4m3, std::ldexp(1.0, -9)), 0x01u);
  EXPECT_EQ(encodeFloat(ncclFloat8e5m2, 1.0), 0x3cu);
  EXPECT_EQ(encodeFloat(ncclFloat8e5m2, 57344.0), 0x7bu);  // largest e5m2
  EXPECT_EQ(encodeFloat(ncclFloat8e5m2, -0.25), 0xb4u);
  EXPECT_TRUE(std::isnan(decodeFloat(ncclFloat8e4m3, 0x7f)));
  EXPECT_EQ(decodeFloat(ncclFloat8e4m3, 0x7e), 448.0);
  EXPECT_TRUE(std::isinf(decodeFloat(ncclFloat8e5m2, 0x7c)));
  EXPECT_TRUE(std::isnan(decodeFloat(ncclFloat8e5m2, 0x7d)));
  // Ties go to even: 1 + 2^-4 lies halfway between two e4m3 values.
  EXPECT_EQ(encodeFloat(ncclFloat8e4m3, 1.0625), 0x38u);
  EXPECT_EQ(encodeFloat(ncclFloat8e4m3, 1.1875), 0x3au);
  EXPECT_EQ(ulpAt(ncclFloat8e4m3, 1.0), 0.125);
  EXPECT_EQ(ulpAt(ncclBfloat16, 3.0), 1.0 / 64);
}

TEST(ReferenceCodec, EveryNarrowPatternRoundTrips) {
  for (ncclDataType_t t : {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2}) {
    const uint64_t n = uint64_t(1) << (8 * typeInfo(t).size);
    for (uint64_t b = 0; b < n; ++b) {
      if (isNanBits(t, b)) continue;
      bool exact = false;
      ASSERT_EQ(encodeFloat(t, decodeFloat(t, b), &exact), b) << typeInfo(t).name << " bits " << b;
      ASSERT_TRUE(exact);
    }
  }
}

// (nranks, transport): "shm" is loom's default between ranks of one host;
// "tcp" sets NCCL_SHM_DISABLE=1 for the communicators of that instance.
struct MatrixParam {
  int n;
  const char* transport;
};

void PrintTo(const MatrixParam& p, std::ostream* os) { *os << p.n << " ranks, " << p.transport << " transport"; }

std::map<std::string, std::unique_ptr<CommSet>>& commCache() {
  static std::map<std::string, std::unique_ptr<CommSet>> cache;
  return cache;
}

// Communicators are made once per (rank count, transport) and shared by
// every test of this process (ctest runs each test in its own process,
// where this is one init per test).
CommSet& commsFor(const MatrixParam& p) {
  auto& slot = commCache()[std::to_string(p.n) + p.transport];
  if (!slot) {
    std::vector<std::string> env;
    const std::string t = p.transport;
    if (t == "tcp") env.push_back("NCCL_SHM_DISABLE=1");
    // The tree algorithms, forced (the model picks them on many ranks
    // only); tree2: two channels, NCCL's double binary tree.
    if (t == "tree" || t == "tree2") env.push_back("NCCL_ALGO=allreduce:tree;broadcast:tree;reduce:tree");
    if (t == "tree2") env.push_back("NCCL_MIN_NCHANNELS=2");
    if (t == "doubling") env.push_back("NCCL_ALGO=allreduce:doubling");
    if (t == "halving") env.push_back("NCCL_ALGO=allreduce:rabenseifner");
    slot = std::make_unique<CommSet>(p.n, env);
  }
  return *slot;
}

class Matrix : public ::testing::TestWithParam<MatrixParam> {
 protected:
  void run(Coll coll) {
    const int n = GetParam().n;
    CommSet& comms = commsFor(GetParam());
    ASSERT_TRUE(comms.ok()) << comms.error();
    const std::vector<Case> cases = casesFor(coll, n);
    int failedCases = 0;
    for (const Case& c : cases) {
      std::vector<std::string> problems = runCase(comms, c);
      if (problems.empty()) continue;
      std::string text;
      for (const auto& p : problems) text += "\n    " + p;
      ADD_FAILURE() << "case " << c.describe() << ":" << text;
      if (++failedCases >= 20) {
        FAIL() << "stopping after 20 failed cases of " << cases.size();
      }
    }
    RecordProperty("cases", int(cases.size()));
  }
};

TEST_P(Matrix, AllReduce) { run(Coll::kAllReduce); }
TEST_P(Matrix, AllGather) { run(Coll::kAllGather); }
TEST_P(Matrix, ReduceScatter) { run(Coll::kReduceScatter); }
TEST_P(Matrix, Broadcast) { run(Coll::kBroadcast); }
TEST_P(Matrix, Reduce) { run(Coll::kReduce); }
TEST_P(Matrix, AlltoAll) { run(Coll::kAlltoAll); }
TEST_P(Matrix, Gather) { run(Coll::kGather); }
TEST_P(Matrix, Scatter) { run(Coll::kScatter); }
TEST_P(Matrix, SendRecvRing) { run(Coll::kSendRecvRing); }
TEST_P(Matrix, SendRecvAllPairs) { run(Coll::kSendRecvAllPairs); }

std::string paramName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const std::string t = info.param.transport;
  return "n" + std::to_string(info.param.n) + (t == "default" ? "" : "_" + t);
}

// Every rank count over loom's default transport (shared memory between
// the threads of this process), and two rank counts over TCP.
INSTANTIATE_TEST_SUITE_P(Ranks, Matrix,
                         ::testing::Values(MatrixParam{1, "default"}, MatrixParam{2, "default"},
                                           MatrixParam{3, "default"}, MatrixParam{4, "default"},
                                           MatrixParam{5, "default"}, MatrixParam{8, "default"},
                                           MatrixParam{3, "tcp"}, MatrixParam{5, "tcp"}),
                         paramName);

// The tree algorithms over every case of the matrix (types, ops, counts,
// roots, in place or not), one and two trees.
class MatrixTree : public Matrix {};
TEST_P(MatrixTree, AllReduce) { run(Coll::kAllReduce); }
TEST_P(MatrixTree, Broadcast) { run(Coll::kBroadcast); }
TEST_P(MatrixTree, Reduce) { run(Coll::kReduce); }
// Recursive doubling over every AllReduce case: a power of two and not.
class MatrixDoubling : public Matrix {};
TEST_P(MatrixDoubling, AllReduce) { run(Coll::kAllReduce); }
INSTANTIATE_TEST_SUITE_P(Ranks, MatrixDoubling,
                         ::testing::Values(MatrixParam{4, "doubling"}, MatrixParam{5, "doubling"},
                                           MatrixParam{7, "doubling"}),
                         paramName);

// Halving-doubling over every AllReduce case: a power of two and not.
class MatrixHalving : public Matrix {};
TEST_P(MatrixHalving, AllReduce) { run(Coll::kAllReduce); }
INSTANTIATE_TEST_SUITE_P(Ranks, MatrixHalving,
                         ::testing::Values(MatrixParam{4, "halving"}, MatrixParam{6, "halving"}), paramName);

INSTANTIATE_TEST_SUITE_P(Ranks, MatrixTree,
                         ::testing::Values(MatrixParam{3, "tree"}, MatrixParam{5, "tree"}, MatrixParam{8, "tree"},
                                           MatrixParam{6, "tree2"}),
                         paramName);

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  // A wrong result must fail the case, not hang it: a rank left waiting
  // gives up after 60 s without progress (overridable from outside).
  setenv("LOOM_TIMEOUT_S", "60", 0);
#ifdef LOOM_TEST_SANITIZED
  setenv("LOOM_CHUNK_BYTES", "65536", 0);  // see kBigBytes in matrix.cc
  // Slices of 64 KiB or less: AllGather still goes single-copy here (where
  // the handoff policy lets it: transport/shm/handoff.h).
  setenv("LOOM_SHM_SINGLE_COPY_MIN", "16384", 0);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  loom::test::commCache().clear();
  return rc;
}
