// Communicators forced onto verbs (NCCL_NET=IB NCCL_SHM_DISABLE=1), through
// the public API, inside the soft-RoCE guest (tests/rdma/in_guest.sh runs
// this binary; it needs an active verbs port). Checked: collectives are
// right over verbs, every queue pair, completion queue, memory region and
// protection domain is gone after ncclCommDestroy and after ncclCommAbort
// (the device's resource counts, as `rdma resource show` gives them, are
// back where they started), ncclCommRegister'd buffers become memory
// regions and go again at ncclCommDeregister, a verbs requirement that
// cannot be met fails init instead of falling back to sockets, and an
// ncclConfig_t's trafficClass reaches the queue pairs.
#include <gtest/gtest.h>
#include <nccl.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mp_util.h"

namespace {

using loom::test::onRanks;
using loom::test::ScopedEnv;

// The device's resource counts ("pd 1 cq 2 qp 3 cm_id 0 mr 4 ctx 1 ...").
std::map<std::string, long> resources() {
  std::map<std::string, long> out;
  FILE* p = ::popen("rdma resource show 2>&1", "r");
  if (!p) return out;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string word;
    std::vector<std::string> words;
    while (in >> word) words.push_back(word);
    for (size_t i = 0; i + 1 < words.size(); ++i) {
      char* end = nullptr;
      const long v = std::strtol(words[i + 1].c_str(), &end, 10);
      if (end && *end == '\0' && !words[i + 1].empty()) out[words[i]] += v;
    }
  }
  ::pclose(p);
  return out;
}

std::string show(const std::map<std::string, long>& r) {
  std::string s;
  for (const char* k : {"ctx", "pd", "cq", "qp", "mr"}) {
    auto it = r.find(k);
    s += std::string(k) + " " + (it == r.end() ? "?" : std::to_string(it->second)) + "  ";
  }
  return s;
}

void expectBaseline(const std::map<std::string, long>& before, const char* when) {
  const auto after = resources();
  for (const char* k : {"ctx", "pd", "cq", "qp", "mr"}) {
    ASSERT_TRUE(before.count(k)) << "rdma resource show gave no '" << k << "' count: " << show(before);
    EXPECT_EQ(after.at(k), before.at(k)) << k << " left behind " << when << ": before " << show(before)
                                         << ", after " << show(after);
  }
}

// 3 ranks as threads, every pair over verbs: AllReduce, AllGather and a
// Broadcast; then destroy or abort.
void runOnVerbs(bool abort) {
  ScopedEnv env({"NCCL_NET=IB", "NCCL_SHM_DISABLE=1"});
  const auto before = resources();
  constexpr int n = 3;
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess) << ncclGetLastError(nullptr);
  const size_t count = (256 << 10) + 3;
  std::vector<std::vector<float>> in(n), out(n), gathered(n);
  onRanks(n, [&](int r) {
    in[size_t(r)].assign(count, float(r + 1));
    out[size_t(r)].assign(count, 0);
    gathered[size_t(r)].assign(count * n, 0);
    EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclFloat, ncclSum, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
    EXPECT_EQ(ncclAllGather(in[size_t(r)].data(), gathered[size_t(r)].data(), count, ncclFloat, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
    EXPECT_EQ(ncclBroadcast(in[size_t(r)].data(), in[size_t(r)].data(), count, ncclFloat, 2, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
  });
  auto during = resources();
  EXPECT_GT(during["qp"], before.count("qp") ? before.at("qp") : 0) << "no queue pairs: verbs were not used";
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; i += 997) {
      ASSERT_EQ(out[size_t(r)][i], 6.0f) << "rank " << r << " element " << i;
      for (int p = 0; p < n; ++p) ASSERT_EQ(gathered[size_t(r)][size_t(p) * count + i], float(p + 1));
      ASSERT_EQ(in[size_t(r)][i], 3.0f);
    }
  }
  for (ncclComm_t c : comms) EXPECT_EQ(abort ? ncclCommAbort(c) : ncclCommDestroy(c), ncclSuccess);
  expectBaseline(before, abort ? "after ncclCommAbort" : "after ncclCommDestroy");
}

TEST(IbComm, CollectivesOverVerbsLeaveNothingAfterDestroy) { runOnVerbs(false); }
TEST(IbComm, CollectivesOverVerbsLeaveNothingAfterAbort) { runOnVerbs(true); }

// ncclCommRegister'd buffers: each verbs connection registers them (a
// memory region each; sends are then written straight from them) and
// ncclCommDeregister releases the regions again; results stay right.
TEST(IbComm, RegisteredBuffersBecomeMemoryRegions) {
  ScopedEnv env({"NCCL_NET=IB", "NCCL_SHM_DISABLE=1"});
  const auto before = resources();
  constexpr int n = 2;
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess) << ncclGetLastError(nullptr);
  const size_t count = (1 << 20) + 5;
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<void*> handles(2 * n, nullptr);
  for (int r = 0; r < n; ++r) {
    in[size_t(r)].assign(count, float(r + 1));
    out[size_t(r)].assign(count, 0);
    ASSERT_EQ(ncclCommRegister(comms[size_t(r)], in[size_t(r)].data(), count * sizeof(float), &handles[2 * size_t(r)]),
              ncclSuccess);
    ASSERT_EQ(ncclCommRegister(comms[size_t(r)], out[size_t(r)].data(), count * sizeof(float),
                               &handles[2 * size_t(r) + 1]),
              ncclSuccess);
  }
  const long mrsBefore = resources()["mr"];
  for (int round = 0; round < 3; ++round) {
    onRanks(n, [&](int r) {
      EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclFloat, ncclSum,
                              comms[size_t(r)], nullptr),
                ncclSuccess);
    });
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(out[size_t(r)][i], 3.0f) << "rank " << r << " element " << i;
  }
  EXPECT_GT(resources()["mr"], mrsBefore) << "no memory region for the registered buffers";
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommDeregister(comms[size_t(r)], handles[2 * size_t(r)]), ncclSuccess);
    EXPECT_EQ(ncclCommDeregister(comms[size_t(r)], handles[2 * size_t(r) + 1]), ncclSuccess);
  }
  EXPECT_EQ(resources()["mr"], mrsBefore) << "ncclCommDeregister left memory regions";
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  expectBaseline(before, "after registering, deregistering and ncclCommDestroy");
}

// NCCL_NET=IB where no port qualifies: init fails, naming why, and no
// socket connection stands in for verbs.
TEST(IbComm, UnmetVerbsRequirementFailsInit) {
  ScopedEnv env({"NCCL_NET=IB", "NCCL_SHM_DISABLE=1", "NCCL_IB_HCA=^rxe"});
  std::vector<ncclComm_t> comms(2);
  std::vector<int> devs(2, 0);
  EXPECT_NE(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess);
  const std::string why = ncclGetLastError(nullptr);
  EXPECT_NE(why.find("NCCL_NET=IB"), std::string::npos) << why;
  EXPECT_NE(why.find("NCCL_IB_HCA"), std::string::npos) << why;
}

// ncclConfig_t.trafficClass is the queue pairs' traffic class unless
// NCCL_IB_TC is set, which wins as in NCCL. Each connection logs what the
// device holds once connected.
std::string connectWithTrafficClass(int trafficClass, std::vector<std::string> extraEnv) {
  char path[] = "/tmp/loom-ib-tc-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "mkstemp failed";
  close(fd);
  {
    extraEnv.insert(extraEnv.end(), {"NCCL_NET=IB", "NCCL_SHM_DISABLE=1", "NCCL_DEBUG=INFO",
                                     "NCCL_DEBUG_SUBSYS=NET", std::string("NCCL_DEBUG_FILE=") + path});
    ScopedEnv env(extraEnv);
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::vector<ncclComm_t> comms(2, nullptr);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.trafficClass = trafficClass;
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(ncclCommInitRankConfig(&comms[size_t(r)], 2, id, r, &config), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    onRanks(2, [&](int r) {
      int32_t one = 1, sum = 0;
      EXPECT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comms[size_t(r)], nullptr), ncclSuccess);
      EXPECT_EQ(sum, 2);
    });
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  std::ifstream in(path);
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  return log;
}

void expectEveryConnection(const std::string& log, const std::string& held) {
  size_t connections = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("verbs connection") == std::string::npos || line.find("ready") == std::string::npos) continue;
    ++connections;
    EXPECT_NE(line.find(held), std::string::npos) << line;
  }
  EXPECT_GE(connections, 2u) << log;
}

TEST(IbComm, ConfigTrafficClassReachesTheQueuePairs) {
  expectEveryConnection(connectWithTrafficClass(96, {}), "traffic class 96");
  expectEveryConnection(connectWithTrafficClass(96, {"NCCL_IB_TC=106"}), "traffic class 106");
}

}  // namespace
