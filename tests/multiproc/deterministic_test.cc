// LOOM_DETERMINISTIC=1 (ranks as threads of this process): a reduction's
// bits do not depend on the algorithm, the slicing, the channels or the
// latency path. Random float, half and bfloat16 inputs (sums that depend on
// the order) go through AllReduce, ReduceScatter and Reduce under several
// configurations, each on fresh communicators (settings are read at init;
// ncclResetDebugInit re-reads them); every configuration and every rank
// must give the same bytes. The ring, which folds in ring order, gives
// different bits for the same inputs: the test shows that it would notice.
#include <gtest/gtest.h>
#include <nccl.h>
#include <stdlib.h>

#include "mp_util.h"

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Config {
  const char* name;
  std::vector<std::pair<const char*, const char*>> env;
};

// Bytes of one rank's result for each (collective, type, count) case.
using Results = std::vector<std::vector<std::vector<uint8_t>>>;  // [case][rank] -> bytes

struct Case {
  const char* coll;
  ncclDataType_t type;
  size_t count;  // elements per rank's output block (AllReduce, Reduce: the vector)
};

size_t typeBytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }

Results runAll(const Config& config, int n, const std::vector<Case>& cases) {
  for (const auto& [k, v] : config.env) setenv(k, v, 1);
  ncclResetDebugInit();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  Results results(cases.size(), std::vector<std::vector<uint8_t>>(static_cast<size_t>(n)));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (size_t c = 0; c < cases.size(); ++c) {
        const Case& k = cases[c];
        const size_t es = typeBytes(k.type);
        const bool rs = !std::strcmp(k.coll, "reducescatter");
        const size_t inElems = rs ? k.count * size_t(n) : k.count;
        std::vector<uint8_t> in = loom::test::orderSensitiveInput(k.type, inElems, r), out(k.count * es, 0xEE);
        ncclResult_t rc;
        if (rs) rc = ncclReduceScatter(in.data(), out.data(), k.count, k.type, ncclSum, comms[size_t(r)], nullptr);
        else if (!std::strcmp(k.coll, "reduce"))
          rc = ncclReduce(in.data(), out.data(), k.count, k.type, ncclSum, n - 1, comms[size_t(r)], nullptr);
        else rc = ncclAllReduce(in.data(), out.data(), k.count, k.type, ncclSum, comms[size_t(r)], nullptr);
        EXPECT_EQ(rc, ncclSuccess) << config.name << ": " << ncclGetLastError(comms[size_t(r)]);
        results[c][size_t(r)] = std::move(out);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (const auto& [k, v] : config.env) unsetenv(k);
  return results;
}

TEST(Deterministic, SameBitsWhateverAlgorithmSlicingChannelsOrPath) {
  const int n = 4;
  std::vector<Case> cases;
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16})
    for (size_t count : {size_t(3), size_t(1000), size_t(70001), size_t(600000)}) {
      cases.push_back({"allreduce", t, count});
      cases.push_back({"reducescatter", t, count / 4 + 1});
      cases.push_back({"reduce", t, count});
    }
  const std::vector<Config> configs = {
      {"default", {{"LOOM_DETERMINISTIC", "1"}}},
      {"no latency path", {{"LOOM_DETERMINISTIC", "1"}, {"LOOM_LATENCY_PATH", "0"}}},
      {"direct", {{"LOOM_DETERMINISTIC", "1"}, {"NCCL_ALGO", "direct"}, {"LOOM_LATENCY_PATH", "0"}}},
      {"twoshot, small slices, 3 channels",
       {{"LOOM_DETERMINISTIC", "1"}, {"NCCL_ALGO", "twoshot"}, {"LOOM_CHUNK_BYTES", "4096"},
        {"NCCL_MIN_NCHANNELS", "3"}}},
      {"ring asked for", {{"LOOM_DETERMINISTIC", "1"}, {"NCCL_ALGO", "ring"}, {"LOOM_CHUNK_BYTES", "65536"}}},
  };
  std::vector<Results> all;
  for (const Config& c : configs) {
    all.push_back(runAll(c, n, cases));
    if (HasFailure()) return;
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    const bool reduce = !std::strcmp(cases[c].coll, "reduce");
    const auto& want = all[0][c][size_t(n - 1)];
    for (size_t k = 0; k < configs.size(); ++k)
      for (int r = 0; r < n; ++r) {
        if (reduce && r != n - 1) continue;  // only the root has a result
        // AllReduce: every rank the same; ReduceScatter: its own block, compared across configurations.
        const auto& got = all[k][c][size_t(r)];
        const auto& ref = !std::strcmp(cases[c].coll, "reducescatter") ? all[0][c][size_t(r)] : want;
        ASSERT_EQ(got, ref) << cases[c].coll << " of " << cases[c].count << " x type " << int(cases[c].type)
                            << ": configuration '" << configs[k].name << "', rank " << r << " differs";
      }
  }
}

// Without the mode, the ring folds in ring order: for these inputs its bits
// differ from the rank-order fold somewhere (so the test above can fail).
TEST(Deterministic, TheRingFoldsInAnotherOrder) {
  const int n = 4;
  const std::vector<Case> cases = {{"allreduce", ncclBfloat16, 70001}};
  const Results ring = runAll({"ring", {{"NCCL_ALGO", "ring"}}}, n, cases);
  const Results ordered = runAll({"deterministic", {{"LOOM_DETERMINISTIC", "1"}}}, n, cases);
  EXPECT_NE(ring[0][0], ordered[0][0]);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
