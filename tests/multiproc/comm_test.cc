// Communicator features through the public API (ranks as threads unless
// said otherwise): non-blocking init, grouped init and collectives driven
// from one thread, ncclCommInitRankScalable, ncclCommSplit, finalize and
// destroy, queries, ncclMemAlloc/Free, registration, premulsum scalars that
// change after the op is created, ncclBcast, ncclGroupSimulateEnd, and the
// calls loom does not support yet.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mp_util.h"

namespace loom::test {
namespace {

constexpr double kEndsWithinS = 30;  // "does not hang", not a speed bound

std::vector<ncclComm_t> initAll(int n) {
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  return comms;
}

void destroyAll(std::vector<ncclComm_t>& comms) {
  for (auto& c : comms) {
    if (c) {
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess) << ncclGetLastError(c);
    }
    c = nullptr;
  }
}

// Every rank contributes base + rank at each element; checks the sum.
void allReduceAndCheck(const std::vector<ncclComm_t>& comms, size_t count = 4099) {
  const int n = int(comms.size());
  std::vector<std::vector<float>> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  onRanks(n, [&](int r) {
    in[size_t(r)].resize(count);
    out[size_t(r)].assign(count, -1.0f);
    for (size_t i = 0; i < count; ++i) in[size_t(r)][i] = float(i % 100 + size_t(r));
    EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclFloat32, ncclSum,
                            comms[size_t(r)], nullptr),
              ncclSuccess)
        << ncclGetLastError(comms[size_t(r)]);
  });
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      const float want = float(n * int(i % 100) + n * (n - 1) / 2);
      ASSERT_EQ(out[size_t(r)][i], want) << "rank " << r << " element " << i;
    }
}

// NCCL_NET is required, not a hint: a network backend that cannot be used
// fails init at once, saying why; NCCL's name for the one that exists works.
TEST(CommFeatures, NcclNetNamesARequiredNetwork) {
  for (const char* net : {"NCCL_NET=IB", "NCCL_NET=Nonsense"}) {
    ScopedEnv env({net});
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument) << net;
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::strstr(ncclGetLastError(nullptr), net), nullptr) << ncclGetLastError(nullptr);
  }
  ScopedEnv env({"NCCL_NET=Socket", "NCCL_SHM_DISABLE=1"});
  std::vector<ncclComm_t> comms(2);
  std::vector<int> devs = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess) << ncclGetLastError(nullptr);
  onRanks(2, [&](int r) {
    int32_t one = 1, sum = 0;
    EXPECT_EQ(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comms[size_t(r)], nullptr), ncclSuccess);
    EXPECT_EQ(sum, 2);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// NCCL_TOPO_FILE that cannot be read fails init with the file, line and
// element; a good one is used.
TEST(CommFeatures, TopologyFileIsReadAtInit) {
  char path[] = "/tmp/loom-topo-file-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string bad = "<system version=\"1\">\n  <cpu numaid=\"x\"/>\n</system>\n";
  ASSERT_EQ(write(fd, bad.data(), bad.size()), ssize_t(bad.size()));
  close(fd);
  {
    ScopedEnv env({std::string("NCCL_TOPO_FILE=") + path});
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    const std::string err = ncclGetLastError(nullptr);
    EXPECT_NE(err.find(std::string(path) + ":2: <cpu numaid=\"x\">"), std::string::npos) << err;
  }
  FILE* f = std::fopen(path, "w");
  ASSERT_NE(f, nullptr);
  std::fputs("<system version=\"1\"><cpu numaid=\"0\"><nic><net name=\"n0\" speed=\"100000\"/></nic></cpu>"
             "</system>\n", f);
  std::fclose(f);
  {
    ScopedEnv env({std::string("NCCL_TOPO_FILE=") + path});
    auto comms = initAll(2);
    allReduceAndCheck(comms, 100);
    destroyAll(comms);
  }
  std::remove(path);
}

// Sockets this process holds (each rank's TCP connections, bootstrap ones).
int socketFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    char link[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(path.c_str(), link, sizeof link - 1) > 0 && std::strncmp(link, "socket:", 7) == 0) ++n;
  }
  ::closedir(d);
  return n;
}

// Channels: NCCL_MIN_NCHANNELS=3 gives a large AllReduce three connections
// per pair (opened when first used: here 2 more channels x 2 sockets per
// connection x 2 ranks), with the right result, on TCP and on shared memory.
TEST(CommFeatures, ChannelsOpenOneConnectionPerPeerAndChannel) {
  for (const char* shm : {"NCCL_SHM_DISABLE=1", "NCCL_SHM_DISABLE=0"}) {
    SCOPED_TRACE(shm);
    ScopedEnv env({"NCCL_MIN_NCHANNELS=3", "LOOM_SOCKETS_PER_PEER=2", shm});
    std::vector<ncclComm_t> comms(2);
    std::vector<int> devs = {0, 0};
    ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess) << ncclGetLastError(nullptr);
    allReduceAndCheck(comms, 1000);  // small: channel 0 only
    const int before = socketFds();
    allReduceAndCheck(comms, size_t(3) << 20);  // 12 MiB: 4 MiB per channel
    const int after = socketFds();
    if (std::strcmp(shm, "NCCL_SHM_DISABLE=1") == 0) {
      EXPECT_EQ(after - before, 2 * 2 * 2);
    }
    allReduceAndCheck(comms, size_t(3) << 20);  // again, on the same connections
    EXPECT_EQ(socketFds(), after);
    destroyAll(comms);
  }
}

// Two ranks as threads, each with `config`.
ncclResult_t initWithConfig(std::vector<ncclComm_t>* comms, const ncclConfig_t& config) {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return r;
  comms->assign(2, nullptr);
  ncclConfig_t copy = config;
  ncclResult_t first = ncclGroupStart();
  for (int r = 0; r < 2; ++r) {
    ncclResult_t res = ncclCommInitRankConfig(&(*comms)[size_t(r)], 2, id, r, &copy);
    if (first == ncclSuccess) first = res;
  }
  ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

// ncclConfig_t's minCTAs opens channels as NCCL_MIN_NCHANNELS does (here 3
// over TCP: 2 more connections x 2 sockets x 2 ranks once a large message
// needs them), and netName names a required network as NCCL_NET does,
// which, set, wins over it as in NCCL.
TEST(CommFeatures, ConfigChannelsAndNetworkReachTheCommunicator) {
  ScopedEnv env({"NCCL_SHM_DISABLE=1", "LOOM_SOCKETS_PER_PEER=2"});
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.minCTAs = 3;
  config.maxCTAs = 8;
  config.netName = "Socket";
  std::vector<ncclComm_t> comms;
  ASSERT_EQ(initWithConfig(&comms, config), ncclSuccess) << ncclGetLastError(nullptr);
  allReduceAndCheck(comms, 1000);
  const int before = socketFds();
  allReduceAndCheck(comms, size_t(3) << 20);
  EXPECT_EQ(socketFds() - before, 2 * 2 * 2);
  destroyAll(comms);

  config = NCCL_CONFIG_INITIALIZER;
  config.netName = "Nonsense";
  EXPECT_EQ(initWithConfig(&comms, config), ncclInvalidArgument);
  EXPECT_NE(std::strstr(ncclGetLastError(nullptr), "ncclConfig_t.netName=Nonsense"), nullptr)
      << ncclGetLastError(nullptr);
  ScopedEnv net({"NCCL_NET=Socket"});
  ASSERT_EQ(initWithConfig(&comms, config), ncclSuccess) << ncclGetLastError(nullptr);
  allReduceAndCheck(comms, 1000);
  destroyAll(comms);
}

// A split with a config takes its channels from that config, as in NCCL,
// not from its parent's: a parent capped at 1 channel, a child asking for
// 3 (2 more connections x 2 sockets x 2 ranks once a large message needs
// them, over TCP).
TEST(CommFeatures, SplitConfigChannelsAreTheChilds) {
  ScopedEnv env({"NCCL_SHM_DISABLE=1", "LOOM_SOCKETS_PER_PEER=2"});
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.maxCTAs = 1;
  std::vector<ncclComm_t> parents, kids(2, nullptr);
  ASSERT_EQ(initWithConfig(&parents, config), ncclSuccess) << ncclGetLastError(nullptr);
  onRanks(2, [&](int r) {
    ncclConfig_t child = NCCL_CONFIG_INITIALIZER;
    child.minCTAs = 3;
    EXPECT_EQ(ncclCommSplit(parents[size_t(r)], 0, r, &kids[size_t(r)], &child), ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  ASSERT_NE(kids[0], nullptr);
  ASSERT_NE(kids[1], nullptr);
  allReduceAndCheck(kids, 1000);
  const int before = socketFds();
  allReduceAndCheck(kids, size_t(3) << 20);
  EXPECT_EQ(socketFds() - before, 2 * 2 * 2);
  destroyAll(kids);
  destroyAll(parents);
}

// LOOM_CHECK_COLLECTIVES: ranks that call different collectives get
// ncclInvalidUsage naming the ranks and their calls, the mismatched
// collective does not run (its output is untouched), and the communicator
// goes on; in a group one thread drives the ranks, whose checks then run
// side by side.
TEST(CommFeatures, CollectiveCheckNamesMismatchesAndTheCommunicatorGoesOn) {
  ScopedEnv env({"LOOM_CHECK_COLLECTIVES=1", "LOOM_TIMEOUT_S=20"});  // a broken check fails, never hangs
  auto comms = initAll(3);
  allReduceAndCheck(comms, 4099);
  std::vector<std::vector<float>> in(3, std::vector<float>(1024, 1.0f)), out(3);
  std::vector<std::string> errors(3);
  auto resetOut = [&] {
    for (auto& o : out) o.assign(1024, -1.0f);
  };
  resetOut();
  onRanks(3, [&](int r) {
    const size_t count = r == 1 ? 1000 : 1024;
    EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclFloat32, ncclSum,
                            comms[size_t(r)], nullptr),
              ncclInvalidUsage);
    errors[size_t(r)] = ncclGetLastError(comms[size_t(r)]);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[size_t(r)].find("ranks 0,2 call AllReduce of 1024 x float (sum); rank 1 calls AllReduce "
                                     "of 1000 x float (sum)"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_EQ(out[size_t(r)][0], -1.0f) << "rank " << r << ": the mismatched call ran";
  }
  allReduceAndCheck(comms, 4099);

  // Grouped, from one thread: an AllReduce and a Broadcast agree...
  resetOut();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    in[size_t(r)].assign(1024, float(r + 1));
    ASSERT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), 512, ncclFloat32, ncclSum, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(in[size_t(r)].data() + 512, out[size_t(r)].data() + 512, 512, ncclFloat32, 1,
                            comms[size_t(r)], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[size_t(r)][0], 6.0f);
    EXPECT_EQ(out[size_t(r)][1023], 2.0f);
  }
  // ...and a Broadcast from another root is the second call of the group:
  // the AllReduce, agreed on, runs.
  resetOut();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), 512, ncclFloat32, ncclSum, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(in[size_t(r)].data() + 512, out[size_t(r)].data() + 512, 512, ncclFloat32,
                            r == 2 ? 2 : 1, comms[size_t(r)], nullptr),
              ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  const std::string grouped = ncclGetLastError(nullptr);
  EXPECT_NE(grouped.find("at its collective #6 ranks 0-1 call Broadcast of 512 x float root 1; rank 2 calls "
                         "Broadcast of 512 x float root 2"),
            std::string::npos)
      << grouped;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[size_t(r)][0], 6.0f) << "rank " << r;
    EXPECT_EQ(out[size_t(r)][512], -1.0f) << "rank " << r;
  }

  // Send/Recv are not compared: a ring shift runs as usual.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ncclSend(in[size_t(r)].data(), 16, ncclFloat32, (r + 1) % 3, comms[size_t(r)], nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(out[size_t(r)].data(), 16, ncclFloat32, (r + 2) % 3, comms[size_t(r)], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[size_t(r)][0], float((r + 2) % 3 + 1));

  // Two communicators in one group: the one whose ranks disagree runs
  // nothing, the other runs.
  auto other = initAll(3);
  resetOut();
  std::vector<std::vector<float>> out2(3, std::vector<float>(1024, -1.0f));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), 1024, ncclFloat32, ncclSum, comms[size_t(r)],
                            nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(in[size_t(r)].data(), out2[size_t(r)].data(), 1024, r == 0 ? ncclFloat32 : ncclInt32,
                            ncclSum, other[size_t(r)], nullptr),
              ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  const std::string two = ncclGetLastError(nullptr);
  EXPECT_NE(two.find("rank 0 calls AllReduce of 1024 x float (sum); ranks 1-2 call AllReduce of 1024 x int32"),
            std::string::npos)
      << two;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[size_t(r)][0], 6.0f) << "rank " << r;
    EXPECT_EQ(out2[size_t(r)][0], -1.0f) << "rank " << r;
  }
  allReduceAndCheck(other, 100);
  destroyAll(other);
  destroyAll(comms);
}

// Ranks may group their collectives differently (the check compares them
// one by one, in order, and each runs once agreed on): rank 0 groups two
// AllReduces on A and one on B, the others call them one at a time, B's
// first. Checks and operations interleave; nothing waits for the timeout.
TEST(CommFeatures, CollectiveCheckLetsRanksGroupDifferently) {
  ScopedEnv env({"LOOM_CHECK_COLLECTIVES=1", "LOOM_TIMEOUT_S=20"});
  auto a = initAll(3), b = initAll(3);
  std::vector<std::vector<float>> in(3), out(3);
  for (int r = 0; r < 3; ++r) {
    in[size_t(r)].assign(300, float(r + 1));
    out[size_t(r)].assign(300, -1.0f);
  }
  onRanks(3, [&](int r) {
    float* i = in[size_t(r)].data();
    float* o = out[size_t(r)].data();
    auto ar = [&](float* at, ncclComm_t comm) {
      return ncclAllReduce(i, at, 100, ncclFloat32, ncclSum, comm, nullptr);
    };
    if (r == 0) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      EXPECT_EQ(ar(o, a[0]), ncclSuccess);
      EXPECT_EQ(ar(o + 100, a[0]), ncclSuccess);
      EXPECT_EQ(ar(o + 200, b[0]), ncclSuccess);
      EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    } else {
      EXPECT_EQ(ar(o + 200, b[size_t(r)]), ncclSuccess) << ncclGetLastError(b[size_t(r)]);
      EXPECT_EQ(ar(o, a[size_t(r)]), ncclSuccess) << ncclGetLastError(a[size_t(r)]);
      EXPECT_EQ(ar(o + 100, a[size_t(r)]), ncclSuccess) << ncclGetLastError(a[size_t(r)]);
    }
  });
  for (int r = 0; r < 3; ++r)
    for (size_t e : {size_t(0), size_t(150), size_t(299)}) EXPECT_EQ(out[size_t(r)][e], 6.0f) << "rank " << r;
  destroyAll(b);
  destroyAll(a);
}

// The check is on when any rank asks (here rank 0 only: its settings are
// read when its non-blocking init is called, before rank 1's).
TEST(CommFeatures, CollectiveCheckIsOnWhenAnyRankAsks) {
  ScopedEnv timeout({"LOOM_TIMEOUT_S=20"});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c0 = nullptr, c1 = nullptr;
  {
    ScopedEnv env({"LOOM_CHECK_COLLECTIVES=1"});
    ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &config), ncclInProgress) << ncclGetLastError(nullptr);
  }
  ASSERT_EQ(ncclCommInitRank(&c1, 2, id, 1), ncclSuccess) << ncclGetLastError(nullptr);
  ncclResult_t async = ncclInProgress;
  const auto start = std::chrono::steady_clock::now();
  while (async == ncclInProgress && secondsSince(start) < kEndsWithinS) {
    ASSERT_EQ(ncclCommGetAsyncError(c0, &async), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(async, ncclSuccess) << ncclGetLastError(c0);
  std::vector<ncclComm_t> comms{c0, c1};
  onRanks(2, [&](int r) {
    int32_t in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
    EXPECT_EQ(ncclAllReduce(in, out, r == 0 ? 4 : 3, ncclInt32, ncclSum, comms[size_t(r)], nullptr),
              ncclInvalidUsage);
    EXPECT_NE(std::strstr(ncclGetLastError(comms[size_t(r)]), "collective mismatch"), nullptr)
        << ncclGetLastError(comms[size_t(r)]);
  });
  allReduceAndCheck(comms);
  destroyAll(comms);
}

// A rank that never makes the call: the others' check waits, warns every
// LOOM_STALL_WARN_S and fails at LOOM_TIMEOUT_S, saying which call it was.
TEST(CommFeatures, CollectiveCheckEndsAtTheTimeoutWhenARankNeverCalls) {
  ScopedEnv env({"LOOM_CHECK_COLLECTIVES=1", "LOOM_TIMEOUT_S=2", "LOOM_STALL_WARN_S=1"});
  auto comms = initAll(2);
  float x = 1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], nullptr), ncclSuccess);
  EXPECT_LT(secondsSince(start), kEndsWithinS);
  const std::string error = ncclGetLastError(comms[0]);
  EXPECT_NE(error.find("the collective check (LOOM_CHECK_COLLECTIVES) of AllReduce #1"), std::string::npos)
      << error;
  destroyAll(comms);
  // In a group the engine times the wait (its check runs ahead, untimed).
  comms = initAll(2);
  const auto again = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], nullptr), ncclSuccess);
  EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  EXPECT_LT(secondsSince(again), kEndsWithinS);
  const std::string grouped = ncclGetLastError(nullptr);
  EXPECT_NE(grouped.find("waiting for the ranks' collective check (LOOM_CHECK_COLLECTIVES)"), std::string::npos)
      << grouped;
  destroyAll(comms);
}

// The collective numbers the flight recorder lines ranks up by stay in step
// after a mismatch, however the ranks grouped what was skipped: rank 0
// groups two AllReduces, the others one of another count. The skipped
// entries keep no number; the next AllReduce has the same on every rank.
// Then rank 2 stays away from the next one, so ranks 0 and 1 fail at the
// timeout and write their recorders, which show it.
TEST(CommFeatures, CollectiveCheckKeepsTheFlightRecordersInStep) {
  char dir[] = "/tmp/loom-flight-check-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ScopedEnv env({"LOOM_CHECK_COLLECTIVES=1", "LOOM_TIMEOUT_S=2", std::string("LOOM_FLIGHT_RECORDER_DIR=") + dir});
  auto comms = initAll(3);
  std::vector<float> data(3 * 100, 1.0f);
  onRanks(3, [&](int r) {
    float* x = data.data() + r * 100;
    ncclComm_t c = comms[size_t(r)];
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int i = 0; i < (r == 0 ? 2 : 1); ++i)
      ASSERT_EQ(ncclAllReduce(x, x, r == 0 ? 100 : 99, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "rank " << r;
    EXPECT_EQ(ncclAllReduce(x, x, 100, ncclFloat32, ncclSum, c, nullptr), ncclSuccess) << ncclGetLastError(c);
    if (r == 2) return;
    // Recorded before its check waits: alone on rank 0, grouped on rank 1.
    if (r == 0) {
      EXPECT_NE(ncclAllReduce(x, x, 50, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
    } else {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(x, x, 50, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
      EXPECT_NE(ncclGroupEnd(), ncclSuccess);
    }
  });
  for (int r = 0; r < 2; ++r) {
    std::string lines;
    for (const std::string& path : flightFiles(dir))
      if (path.find("-rank" + std::to_string(r) + ".json") != std::string::npos) lines += readText(path);
    ASSERT_FALSE(lines.empty()) << "no recorder file from rank " << r << " in " << dir;
    SCOPED_TRACE("rank " + std::to_string(r) + "'s recorder:\n" + lines);
    auto count = [&](const std::string& what) {
      size_t n = 0;
      for (size_t at = lines.find(what); at != std::string::npos; at = lines.find(what, at + 1)) ++n;
      return n;
    };
    EXPECT_EQ(count("\"coll\":0,\"kind\":\"AllReduce\",\"count\":" + std::string(r == 0 ? "100" : "99")),
              r == 0 ? 2u : 1u);
    EXPECT_EQ(count("\"state\":\"skipped\""), r == 0 ? 2u : 1u);
    EXPECT_EQ(count("\"coll\":1,\"kind\":\"AllReduce\",\"count\":100,"), 1u);
    EXPECT_EQ(count("\"coll\":2,\"kind\":\"AllReduce\",\"count\":50,"), 1u);
  }
  destroyAll(comms);
  std::filesystem::remove_all(dir);
}

// ncclCommGrow: a communicator of 2 ranks grows to 4. Rank 1 gets the id
// (only one may be outstanding), the new ranks join with it and their
// numbers, the old ranks keep theirs; both communicators work after.
TEST(CommFeatures, GrowAddsRanksAndTheOldRanksKeepTheirNumbers) {
  ScopedEnv env({"LOOM_TIMEOUT_S=30", "LOOM_INIT_TIMEOUT_S=30"});  // a broken grow fails, never hangs
  auto comms = initAll(2);
  ncclUniqueId id, another;
  ASSERT_EQ(ncclCommGetUniqueId(comms[1], &id), ncclSuccess) << ncclGetLastError(comms[1]);
  EXPECT_EQ(ncclCommGetUniqueId(comms[1], &another), ncclInvalidUsage);
  std::vector<ncclComm_t> grown(4, nullptr);
  onRanks(4, [&](int r) {
    const ncclResult_t res = r < 2 ? ncclCommGrow(comms[size_t(r)], 4, r == 1 ? &id : nullptr, -1, &grown[size_t(r)],
                                                  nullptr)
                                   : ncclCommGrow(nullptr, 4, &id, r, &grown[size_t(r)], nullptr);
    EXPECT_EQ(res, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(nullptr);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_NE(grown[size_t(r)], nullptr) << "rank " << r;
    int rank = -1, count = 0;
    ASSERT_EQ(ncclCommUserRank(grown[size_t(r)], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(grown[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(count, 4);
  }
  allReduceAndCheck(grown, 4099);
  allReduceAndCheck(comms, 100);
  destroyAll(grown);
  // The id was used: the communicator may give another.
  EXPECT_EQ(ncclCommGetUniqueId(comms[1], &another), ncclSuccess) << ncclGetLastError(comms[1]);

  ncclComm_t none = nullptr;
  EXPECT_EQ(ncclCommGrow(comms[0], 2, nullptr, -1, &none, nullptr), ncclInvalidArgument);  // no larger
  EXPECT_EQ(ncclCommGrow(comms[0], 3, nullptr, 0, &none, nullptr), ncclInvalidArgument);   // keeps its rank: -1
  EXPECT_EQ(ncclCommGrow(nullptr, 3, nullptr, 2, &none, nullptr), ncclInvalidArgument);    // a new rank needs the id
  EXPECT_EQ(ncclCommGrow(nullptr, 3, &id, 3, &none, nullptr), ncclInvalidArgument);        // beyond nRanks
  EXPECT_EQ(ncclCommGrow(comms[0], 3, nullptr, -1, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(none, nullptr);
  // Every rank of comm refuses alike when none passes the id, or their sizes differ.
  // The last error is the process's: the other rank's thread may have
  // written its own refusal of the same grow, which says the same.
  onRanks(2, [&](int r) {
    ncclComm_t out = nullptr;
    EXPECT_EQ(ncclCommGrow(comms[size_t(r)], 3, nullptr, -1, &out, nullptr), ncclInvalidUsage);
    const std::string noId = ncclGetLastError(nullptr);
    EXPECT_NE(noId.find("no rank passed a unique id"), std::string::npos) << noId;
    EXPECT_EQ(ncclCommGrow(comms[size_t(r)], 3 + r, &another, -1, &out, nullptr), ncclInvalidUsage);
    const std::string sizes = ncclGetLastError(nullptr);
    EXPECT_NE(sizes.find("every rank must pass the same nRanks"), std::string::npos) << sizes;
    EXPECT_EQ(out, nullptr);
  });
  // A refused grow used up the id too.
  EXPECT_EQ(ncclCommGetUniqueId(comms[1], &another), ncclSuccess) << ncclGetLastError(comms[1]);
  allReduceAndCheck(comms, 100);
  destroyAll(comms);
}

// Ranks that call ncclCommGrow where another calls ncclCommSplit: every rank
// is refused, naming the other's call, and the communicator goes on.
TEST(CommFeatures, AGrowMatchedWithASplitIsRefusedOnEveryRank) {
  ScopedEnv env({"LOOM_TIMEOUT_S=30", "LOOM_INIT_TIMEOUT_S=30"});
  auto comms = initAll(3);
  ncclUniqueId id;
  ASSERT_EQ(ncclCommGetUniqueId(comms[0], &id), ncclSuccess) << ncclGetLastError(comms[0]);
  onRanks(3, [&](int r) {
    ncclComm_t out = nullptr;
    const ncclResult_t res = r == 1 ? ncclCommSplit(comms[1], 0, 0, &out, nullptr)
                                    : ncclCommGrow(comms[size_t(r)], 4, r == 0 ? &id : nullptr, -1, &out, nullptr);
    // The last error is one per process, and the ranks here are threads:
    // read once, it holds this rank's refusal or another's, each of which
    // names the other call.
    const std::string error = ncclGetLastError(nullptr);
    EXPECT_EQ(res, ncclInvalidUsage) << "rank " << r << ": " << error;
    EXPECT_TRUE(error.find("rank 0 called ncclCommGrow here") != std::string::npos ||
                error.find("rank 1 called ncclCommSplit here") != std::string::npos)
        << "rank " << r << ": " << error;
    if (out) ncclCommDestroy(out);
  });
  allReduceAndCheck(comms, 100);
  // The calls took their turns: the next split goes ahead.
  std::vector<ncclComm_t> halves(3, nullptr);
  onRanks(3, [&](int r) {
    EXPECT_EQ(ncclCommSplit(comms[size_t(r)], r % 2, r, &halves[size_t(r)], nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  allReduceAndCheck(std::vector<ncclComm_t>{halves[0], halves[2]}, 100);
  destroyAll(halves);
  destroyAll(comms);
}

// Elastic recovery: shrink away a rank, then grow the shrunk communicator
// back to size with a newcomer in the last place.
TEST(CommFeatures, ShrinkThenGrowRestoresTheSize) {
  ScopedEnv env({"LOOM_TIMEOUT_S=30", "LOOM_INIT_TIMEOUT_S=30"});
  auto comms = initAll(3);
  std::vector<ncclComm_t> shrunk(2, nullptr), grown(3, nullptr);
  onRanks(2, [&](int r) {
    int excluded = 1;
    EXPECT_EQ(ncclCommShrink(comms[size_t(r == 0 ? 0 : 2)], &excluded, 1, &shrunk[size_t(r)], nullptr,
                             NCCL_SHRINK_DEFAULT),
              ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  allReduceAndCheck(shrunk, 100);
  ncclUniqueId id;
  ASSERT_EQ(ncclCommGetUniqueId(shrunk[0], &id), ncclSuccess) << ncclGetLastError(shrunk[0]);
  onRanks(3, [&](int r) {
    const ncclResult_t res = r < 2 ? ncclCommGrow(shrunk[size_t(r)], 3, r == 0 ? &id : nullptr, -1,
                                                  &grown[size_t(r)], nullptr)
                                   : ncclCommGrow(nullptr, 3, &id, 2, &grown[size_t(r)], nullptr);
    EXPECT_EQ(res, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(nullptr);
  });
  allReduceAndCheck(grown, 4099);
  destroyAll(grown);
  destroyAll(shrunk);
  destroyAll(comms);
}

TEST(CommFeatures, NonBlockingInitReportsInProgressUntilThePeerJoins) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c0 = nullptr, c1 = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &config), ncclInProgress) << ncclGetLastError(nullptr);
  ASSERT_NE(c0, nullptr);
  ncclResult_t async = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(c0, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(ncclCommGetAsyncError(c0, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInProgress) << "init finished although rank 1 has not joined";
  // Registering needs the init done (the buffer mode comes from it), as in NCCL.
  std::vector<char> buf(4096);
  void* handle = nullptr;
  ncclWindow_t win = nullptr;
  EXPECT_EQ(ncclCommRegister(c0, buf.data(), buf.size(), &handle), ncclInvalidArgument);
  EXPECT_NE(std::strstr(ncclGetLastError(c0), "still initializing"), nullptr) << ncclGetLastError(c0);
  EXPECT_EQ(ncclCommWindowRegister(c0, buf.data(), buf.size(), &win, NCCL_WIN_DEFAULT), ncclInvalidArgument);
  std::thread peer([&] { EXPECT_EQ(ncclCommInitRank(&c1, 2, id, 1), ncclSuccess) << ncclGetLastError(nullptr); });
  const auto start = std::chrono::steady_clock::now();
  do {
    ASSERT_EQ(ncclCommGetAsyncError(c0, &async), ncclSuccess);
    if (async == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (async == ncclInProgress && secondsSince(start) < kEndsWithinS);
  peer.join();
  ASSERT_EQ(async, ncclSuccess) << ncclGetLastError(c0);
  ASSERT_EQ(ncclCommRegister(c0, buf.data(), buf.size(), &handle), ncclSuccess) << ncclGetLastError(c0);
  std::vector<ncclComm_t> comms{c0, c1};
  allReduceAndCheck(comms);
  EXPECT_EQ(ncclCommDeregister(c0, handle), ncclSuccess);
  destroyAll(comms);
}

TEST(CommFeatures, GroupedInitAndCollectivesFromOneThread) {
  const int n = 4;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) ASSERT_EQ(ncclCommInitRank(&comms[size_t(r)], n, id, r), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  // One group: an AllReduce, a Broadcast and a Send/Recv ring per rank.
  const size_t count = 1031;
  std::vector<std::vector<int32_t>> a(static_cast<size_t>(n)), b(a), bc(a), ring(a);
  for (int r = 0; r < n; ++r) {
    a[size_t(r)].assign(count, r + 1);
    b[size_t(r)].assign(count, -1);
    bc[size_t(r)].assign(count, r == 2 ? 42 : -7);
    ring[size_t(r)].assign(count, -1);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ncclComm_t c = comms[size_t(r)];
    ASSERT_EQ(ncclAllReduce(a[size_t(r)].data(), b[size_t(r)].data(), count, ncclInt32, ncclSum, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclBroadcast(bc[size_t(r)].data(), bc[size_t(r)].data(), count, ncclInt32, 2, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclSend(a[size_t(r)].data(), count, ncclInt32, (r + 1) % n, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(ring[size_t(r)].data(), count, ncclInt32, (r + n - 1) % n, c, nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(b[size_t(r)][i], n * (n + 1) / 2) << "AllReduce rank " << r;
      ASSERT_EQ(bc[size_t(r)][i], 42) << "Broadcast rank " << r;
      ASSERT_EQ(ring[size_t(r)][i], (r + n - 1) % n + 1) << "Send/Recv rank " << r;
    }
  }
  destroyAll(comms);
}

// Whether a small collective runs on the shared-memory board or as a plan
// must not depend on whether a rank's call was grouped: one thread drives
// ranks 0 and 1 in a group while another calls rank 2's alone (NCCL allows
// both). Broadcast, AllReduce and AllGather of board size, several times.
TEST(CommFeatures, GroupedAndLoneCallsOfOneCollectiveMeet) {
  const int n = 3;
  std::vector<ncclComm_t> comms = initAll(n);
  const size_t count = 64;
  std::vector<std::vector<int32_t>> in(static_cast<size_t>(n)), sum(in), gathered(in), bc(in);
  for (int r = 0; r < n; ++r) {
    in[size_t(r)].assign(count, r + 1);
    sum[size_t(r)].assign(count, 0);
    gathered[size_t(r)].assign(count * size_t(n), 0);
    bc[size_t(r)].assign(count, r == 1 ? 99 : 0);
  }
  auto calls = [&](int r) {
    ncclComm_t c = comms[size_t(r)];
    EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), sum[size_t(r)].data(), count, ncclInt32, ncclSum, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllGather(in[size_t(r)].data(), gathered[size_t(r)].data(), count, ncclInt32, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclBroadcast(bc[size_t(r)].data(), bc[size_t(r)].data(), count, ncclInt32, 1, c, nullptr), ncclSuccess);
  };
  for (int round = 0; round < 20; ++round) {
    std::thread alone([&] { calls(2); });
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    calls(0);
    calls(1);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    alone.join();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(sum[size_t(r)][i], n * (n + 1) / 2) << "rank " << r;
        ASSERT_EQ(bc[size_t(r)][i], 99) << "rank " << r;
        for (int q = 0; q < n; ++q) ASSERT_EQ(gathered[size_t(r)][size_t(q) * count + i], q + 1) << "rank " << r;
      }
  }
  destroyAll(comms);
}

// The board lets a Broadcast's root run ahead of its readers, as far as
// its cells, lines or slots allow: 4095 operations of at most 8 bytes (4096
// cells per rank), 1023 whose data fits a cache line (1024 inline lines;
// 203 where ranks have CPUs of their own and operations take 5 lines
// each), 7 larger ones (8 slots). The next one waits for the reader; every
// value still arrives in order. (Each round starts with an operation both
// ranks join: until the places have all been used once, a root may go one
// further.)
TEST(CommFeatures, BroadcastRootRunsAheadOfItsReaderAsFarAsTheBoardHolds) {
  ScopedEnv env({"LOOM_LATENCY_PATH=1", "NCCL_SHM_DISABLE=0"});
  std::vector<ncclComm_t> comms = initAll(2);
  struct Round {
    size_t count;
    std::vector<int> ahead;  // how far the root may get, by the board's layout
  };
  for (const Round& round : {Round{2, {4095}}, Round{3, {203, 1023}}, Round{1024, {7}}}) {
    // Plain locals, not a structured binding: the lambdas below capture them.
    const size_t count = round.count;
    std::vector<int32_t> both{1, 2};
    onRanks(2, [&](int r) {
      EXPECT_EQ(ncclAllReduce(&both[size_t(r)], &both[size_t(r)], 1, ncclInt32, ncclSum, comms[size_t(r)], nullptr),
                ncclSuccess);
    });
    const int total = round.ahead.back() + 1;
    std::vector<std::vector<int32_t>> sent(static_cast<size_t>(total)), got(static_cast<size_t>(total));
    for (int k = 0; k < total; ++k) {
      sent[size_t(k)].assign(count, 1000 * k + int32_t(count));
      got[size_t(k)].assign(count, -1);
    }
    std::atomic<int> rootDone{0};
    std::thread root([&] {
      for (int k = 0; k < total; ++k) {
        EXPECT_EQ(ncclBroadcast(sent[size_t(k)].data(), sent[size_t(k)].data(), count, ncclInt32, 0, comms[0], nullptr),
                  ncclSuccess) << ncclGetLastError(comms[0]);
        rootDone.store(k + 1);
      }
    });
    const auto start = std::chrono::steady_clock::now();
    while (rootDone.load() < round.ahead.front() && secondsSince(start) < kEndsWithinS)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int ahead = rootDone.load();
    EXPECT_NE(std::find(round.ahead.begin(), round.ahead.end(), ahead), round.ahead.end())
        << count << " ints: the root got " << ahead << " operations ahead of a reader that has not called";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(rootDone.load(), ahead) << count << " ints: the root overtook a reader that has not called";
    for (int k = 0; k < total; ++k) {
      const ncclResult_t r = ncclBroadcast(nullptr, got[size_t(k)].data(), count, ncclInt32, 0, comms[1], nullptr);
      EXPECT_EQ(r, ncclSuccess) << ncclGetLastError(comms[1]);
      if (r != ncclSuccess) break;  // the root then fails on its own (comms[1] has failed)
    }
    root.join();
    EXPECT_EQ(rootDone.load(), total);
    for (int k = 0; k < total; ++k) EXPECT_EQ(got[size_t(k)], sent[size_t(k)]) << count << " ints, operation " << k;
  }
  destroyAll(comms);
}

TEST(CommFeatures, InitRankScalableWithSeveralIds) {
  const int n = 3;
  ncclUniqueId ids[2];
  ASSERT_EQ(ncclGetUniqueId(&ids[0]), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&ids[1]), ncclSuccess);
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  onRanks(n, [&](int r) {
    EXPECT_EQ(ncclCommInitRankScalable(&comms[size_t(r)], n, r, 2, ids, nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  for (auto c : comms) ASSERT_NE(c, nullptr);
  allReduceAndCheck(comms);
  destroyAll(comms);
}

TEST(CommFeatures, SplitByColorWithReversedKeysAndNoColor) {
  const int n = 5;
  std::vector<ncclComm_t> parents = initAll(n);
  std::vector<ncclComm_t> kids(size_t(n), nullptr);
  onRanks(n, [&](int r) {
    const int color = r == 4 ? NCCL_SPLIT_NOCOLOR : r % 2;
    EXPECT_EQ(ncclCommSplit(parents[size_t(r)], color, -r, &kids[size_t(r)], nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  EXPECT_EQ(kids[4], nullptr) << "NCCL_SPLIT_NOCOLOR must give NULL";
  // Keys -r reverse the order: even {0, 2} -> child ranks {1, 0}; odd {1, 3} -> {1, 0}.
  const int wantRank[4] = {1, 1, 0, 0};
  for (int r = 0; r < 4; ++r) {
    ASSERT_NE(kids[size_t(r)], nullptr);
    int count = 0, rank = -1;
    EXPECT_EQ(ncclCommCount(kids[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(kids[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(count, 2) << "parent rank " << r;
    EXPECT_EQ(rank, wantRank[r]) << "parent rank " << r;
  }
  // AllGather of parent ranks shows membership and order.
  std::vector<std::vector<int32_t>> got(4, std::vector<int32_t>(2, -1));
  onRanks(4, [&](int r) {
    int32_t me = r;
    EXPECT_EQ(ncclAllGather(&me, got[size_t(r)].data(), 1, ncclInt32, kids[size_t(r)], nullptr), ncclSuccess)
        << ncclGetLastError(kids[size_t(r)]);
  });
  for (int r = 0; r < 4; ++r) {
    const std::vector<int32_t> want = r % 2 == 0 ? std::vector<int32_t>{2, 0} : std::vector<int32_t>{3, 1};
    EXPECT_EQ(got[size_t(r)], want) << "parent rank " << r;
  }
  // The parent still works, and a second split with equal keys keeps the parent order.
  allReduceAndCheck(parents);
  std::vector<ncclComm_t> same(size_t(n), nullptr);
  onRanks(n, [&](int r) {
    EXPECT_EQ(ncclCommSplit(parents[size_t(r)], 7, 0, &same[size_t(r)], nullptr), ncclSuccess);
  });
  for (int r = 0; r < n; ++r) {
    int rank = -1;
    EXPECT_EQ(ncclCommUserRank(same[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
  }
  allReduceAndCheck(same);
  destroyAll(same);
  destroyAll(kids);
  destroyAll(parents);
}

// Waits out ncclInProgress on a non-blocking communicator.
ncclResult_t waitInit(ncclComm_t comm) {
  ncclResult_t async = ncclInProgress;
  const auto start = std::chrono::steady_clock::now();
  while (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclInProgress &&
         secondsSince(start) < kEndsWithinS) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return async;
}

// A rank that leaves a grouped split with NCCL_SPLIT_NOCOLOR on a
// non-blocking parent: its groupEnd completes the split at once (there is
// no child to poll) and the parent, whose own init ran on a thread of its
// own, keeps working.
TEST(CommFeatures, GroupedNoColorSplitOnNonBlockingParents) {
  const int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> parents(size_t(n), nullptr), kids(size_t(n), nullptr);
  onRanks(n, [&](int r) {
    ncclResult_t res = ncclCommInitRankConfig(&parents[size_t(r)], n, id, r, &config);
    EXPECT_TRUE(res == ncclSuccess || res == ncclInProgress) << ncclGetLastError(nullptr);
    EXPECT_EQ(waitInit(parents[size_t(r)]), ncclSuccess) << ncclGetLastError(parents[size_t(r)]);
  });
  onRanks(n, [&](int r) {
    const int color = r == 2 ? NCCL_SPLIT_NOCOLOR : 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclCommSplit(parents[size_t(r)], color, r, &kids[size_t(r)], &config), ncclSuccess)
        << ncclGetLastError(nullptr);
    ncclResult_t end = ncclGroupEnd();
    if (r == 2) {
      EXPECT_EQ(end, ncclSuccess) << ncclGetLastError(nullptr);
      EXPECT_EQ(kids[size_t(r)], nullptr);
    } else {
      EXPECT_TRUE(end == ncclSuccess || end == ncclInProgress) << ncclGetLastError(nullptr);
      ASSERT_NE(kids[size_t(r)], nullptr);
      EXPECT_EQ(waitInit(kids[size_t(r)]), ncclSuccess) << ncclGetLastError(kids[size_t(r)]);
    }
  });
  std::vector<ncclComm_t> pair{kids[0], kids[1]};
  allReduceAndCheck(pair);
  allReduceAndCheck(parents);
  destroyAll(pair);
  destroyAll(parents);
}

TEST(CommFeatures, FinalizeThenDestroy) {
  std::vector<ncclComm_t> comms = initAll(3);
  allReduceAndCheck(comms);
  onRanks(3, [&](int r) { EXPECT_EQ(ncclCommFinalize(comms[size_t(r)]), ncclSuccess) << ncclGetLastError(nullptr); });
  destroyAll(comms);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);  // NULL is a no-op
}

TEST(CommFeatures, Queries) {
  std::vector<ncclComm_t> comms = initAll(3);
  for (int r = 0; r < 3; ++r) {
    int count = 0, rank = -5, device = 7;
    EXPECT_EQ(ncclCommCount(comms[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(comms[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCuDevice(comms[size_t(r)], &device), ncclSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(device, -1) << "host mode has no CUDA device";
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comms[size_t(r)], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
  }
  int version = 0;
  EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  destroyAll(comms);
}

TEST(CommFeatures, MemAllocAndFree) {
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 1 << 20), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0xab, 1 << 20);  // usable host memory in host mode
  std::vector<ncclComm_t> comms = initAll(2);
  // ncclMemAlloc buffers in a collective.
  void* q = nullptr;
  ASSERT_EQ(ncclMemAlloc(&q, 1 << 20), ncclSuccess);
  onRanks(2, [&](int r) {
    void* buf = r == 0 ? p : q;
    for (int i = 0; i < 1024; ++i) static_cast<float*>(buf)[i] = float(r + 1);
    EXPECT_EQ(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comms[size_t(r)], nullptr), ncclSuccess);
  });
  EXPECT_EQ(static_cast<float*>(p)[1023], 3.0f);
  EXPECT_EQ(static_cast<float*>(q)[0], 3.0f);
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  EXPECT_EQ(ncclMemFree(q), ncclSuccess);
  EXPECT_EQ(ncclMemFree(p), ncclInvalidArgument) << "double free must be refused";
  int onStack = 0;
  EXPECT_EQ(ncclMemFree(&onStack), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclMemFree"), std::string::npos);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
  destroyAll(comms);
}

TEST(CommFeatures, RegisterAndDeregister) {
  std::vector<ncclComm_t> comms = initAll(2);
  std::vector<std::vector<float>> bufs(2, std::vector<float>(4096, 1.0f));
  void* handles[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclCommRegister(comms[size_t(r)], bufs[size_t(r)].data(), 4096 * sizeof(float), &handles[r]),
              ncclSuccess)
        << ncclGetLastError(nullptr);
    EXPECT_NE(handles[r], nullptr);
  }
  onRanks(2, [&](int r) {
    EXPECT_EQ(ncclAllReduce(bufs[size_t(r)].data(), bufs[size_t(r)].data(), 4096, ncclFloat32, ncclSum,
                            comms[size_t(r)], nullptr),
              ncclSuccess);
  });
  EXPECT_EQ(bufs[0][4095], 2.0f);
  EXPECT_EQ(ncclCommDeregister(comms[1], handles[0]), ncclInvalidArgument) << "handle of another communicator";
  EXPECT_EQ(ncclCommDeregister(comms[0], handles[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(comms[0], handles[0]), ncclInvalidArgument) << "deregistered twice";
  EXPECT_EQ(ncclCommDeregister(comms[1], handles[1]), ncclSuccess);
  destroyAll(comms);
}

// ncclScalarDevice: the scalar is read when the collective runs, so a value
// written after ncclRedOpCreatePreMulSum must be used; ncclScalarHostImmediate
// keeps the value it had at creation.
TEST(CommFeatures, PreMulSumScalarResidence) {
  const int n = 2;
  std::vector<ncclComm_t> comms = initAll(n);
  float devScalar[2] = {1.0f, 1.0f};
  double hostScalar[2] = {2.0, 2.0};
  ncclRedOp_t devOp[2], hostOp[2];
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&devOp[r], &devScalar[r], ncclFloat32, ncclScalarDevice, comms[size_t(r)]),
              ncclSuccess)
        << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&hostOp[r], &hostScalar[r], ncclFloat64, ncclScalarHostImmediate,
                                       comms[size_t(r)]),
              ncclSuccess);
    EXPECT_GE(int(devOp[r]), int(ncclNumOps));
  }
  auto runF = [&](float* expect) {
    onRanks(n, [&](int r) {
      std::vector<float> x(257, 1.0f), y(257, 0.0f);
      EXPECT_EQ(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, devOp[r], comms[size_t(r)], nullptr),
                ncclSuccess)
          << ncclGetLastError(nullptr);
      expect[r] = y[256];
    });
  };
  float got[2];
  devScalar[0] = 3.0f;  // changed after the op was created
  devScalar[1] = 5.0f;
  runF(got);
  EXPECT_EQ(got[0], 8.0f) << "the device-resident scalar was not read at run time";
  EXPECT_EQ(got[1], 8.0f);
  devScalar[0] = -1.0f;
  devScalar[1] = 0.5f;
  runF(got);
  EXPECT_EQ(got[0], -0.5f);
  hostScalar[0] = hostScalar[1] = 7.0;  // must not matter
  onRanks(n, [&](int r) {
    std::vector<double> x(99, 1.5), y(99, 0.0);
    EXPECT_EQ(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat64, hostOp[r], comms[size_t(r)], nullptr),
              ncclSuccess);
    EXPECT_EQ(y[98], 6.0) << "the host-immediate scalar must be the value at creation (2.0)";
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclRedOpDestroy(devOp[r], comms[size_t(r)]), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(hostOp[r], comms[size_t(r)]), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(devOp[r], comms[size_t(r)]), ncclInvalidArgument) << "destroyed twice";
    EXPECT_EQ(ncclRedOpDestroy(ncclSum, comms[size_t(r)]), ncclInvalidArgument) << "built-in op";
  }
  // Every rank using the destroyed op fails at once (no rank waits).
  onRanks(n, [&](int r) {
    float x = 1, y = 0;
    EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, devOp[r], comms[size_t(r)], nullptr), ncclInvalidArgument);
  });
  allReduceAndCheck(comms);
  destroyAll(comms);
}

TEST(CommFeatures, Bcast) {
  const int n = 3, root = 1;
  std::vector<ncclComm_t> comms = initAll(n);
  std::vector<std::vector<uint16_t>> bufs(static_cast<size_t>(n));
  onRanks(n, [&](int r) {
    bufs[size_t(r)].resize(5000);
    for (size_t i = 0; i < 5000; ++i) bufs[size_t(r)][i] = uint16_t(r == root ? i * 7 : 0xdead);
    EXPECT_EQ(ncclBcast(bufs[size_t(r)].data(), 5000, ncclFloat16, root, comms[size_t(r)], nullptr), ncclSuccess);
  });
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(bufs[size_t(r)][i], uint16_t(i * 7)) << "rank " << r;
  destroyAll(comms);
}

TEST(CommFeatures, GroupSimulateEndEstimatesWithoutRunning) {
  std::vector<ncclComm_t> comms = initAll(2);
  std::vector<float> a(1 << 20, 1.0f), b(1 << 20, -3.0f), c(1 << 20, 1.0f), d(1 << 20, -3.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(a.data(), b.data(), a.size(), ncclFloat32, ncclSum, comms[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(c.data(), d.data(), c.size(), ncclFloat32, ncclSum, comms[1], nullptr), ncclSuccess);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_GT(sim.estimatedTime, 0.0f);
  EXPECT_EQ(b[0], -3.0f) << "simulated work must not run";
  EXPECT_EQ(d[12345], -3.0f);
  allReduceAndCheck(comms);  // the communicators are still usable
  destroyAll(comms);
}

}  // namespace
}  // namespace loom::test

// NCCL's device API (nccl_device.h); loom exports these two and refuses.
extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* requirements, void* devComm);
extern "C" ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);

namespace loom::test {
namespace {

// Windows register their buffers (as ncclCommRegister does) and collectives
// on them are right; NCCL's device API says it is not supported.
TEST(CommFeatures, WindowsRegisterAndTheDeviceApiSaysInvalidUsage) {
  const int n = 2;
  std::vector<ncclComm_t> comms = initAll(n);
  const size_t count = (1 << 20) + 3;  // large enough for the bulk path
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<ncclWindow_t> wins(2 * n, nullptr);
  for (int r = 0; r < n; ++r) {
    in[size_t(r)].assign(count, float(r + 1));
    out[size_t(r)].assign(count, 0);
    ASSERT_EQ(ncclCommWindowRegister(comms[size_t(r)], in[size_t(r)].data(), count * sizeof(float),
                                     &wins[2 * size_t(r)], NCCL_WIN_COLL_SYMMETRIC),
              ncclSuccess)
        << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclCommWindowRegister(comms[size_t(r)], out[size_t(r)].data(), count * sizeof(float),
                                     &wins[2 * size_t(r) + 1], NCCL_WIN_COLL_SYMMETRIC),
              ncclSuccess);
  }
  for (int round = 0; round < 2; ++round) {
    onRanks(n, [&](int r) {
      EXPECT_EQ(ncclAllReduce(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclFloat, ncclSum,
                              comms[size_t(r)], nullptr),
                ncclSuccess);
    });
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; i += 1021) ASSERT_EQ(out[size_t(r)][i], 3.0f) << "rank " << r << " element " << i;
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommWindowDeregister(comms[size_t(r)], wins[2 * size_t(r)]), ncclSuccess);
    EXPECT_EQ(ncclCommWindowDeregister(comms[size_t(r)], wins[2 * size_t(r) + 1]), ncclSuccess);
  }
  auto expectUsage = [](ncclResult_t rc, const char* func) {
    EXPECT_EQ(rc, ncclInvalidUsage) << func;
    const std::string msg = ncclGetLastError(nullptr);
    EXPECT_NE(msg.find(func), std::string::npos) << msg;
    EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
  };
  char requirements[256] = {}, devComm[256] = {};
  expectUsage(ncclDevCommCreate(comms[0], requirements, devComm), "ncclDevCommCreate");
  expectUsage(ncclDevCommDestroy(comms[0], devComm), "ncclDevCommDestroy");
  allReduceAndCheck(comms);  // nothing was broken
  destroyAll(comms);
}

// Shrinking healthy ranks away (NCCL_SHRINK_DEFAULT): the excluded ranks do
// not call; the others keep their order; the parent stays usable.
TEST(CommFeatures, ShrinkHealthyRanksAway) {
  const int n = 5;
  std::vector<ncclComm_t> parents = initAll(n);
  std::vector<ncclComm_t> kids(size_t(n), nullptr);
  int exclude[2] = {3, 1};  // any order
  onRanks(n, [&](int r) {
    if (r == 1 || r == 3) return;
    EXPECT_EQ(ncclCommShrink(parents[size_t(r)], exclude, 2, &kids[size_t(r)], nullptr, NCCL_SHRINK_DEFAULT),
              ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  std::vector<ncclComm_t> shrunk;
  const int wantRank[5] = {0, -1, 1, -1, 2};
  for (int r = 0; r < n; ++r) {
    if (wantRank[r] < 0) {
      EXPECT_EQ(kids[size_t(r)], nullptr);
      continue;
    }
    ASSERT_NE(kids[size_t(r)], nullptr) << "parent rank " << r;
    int count = 0, rank = -1;
    EXPECT_EQ(ncclCommCount(kids[size_t(r)], &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(kids[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(rank, wantRank[r]) << "parent rank " << r;
    shrunk.push_back(kids[size_t(r)]);
  }
  allReduceAndCheck(shrunk);
  allReduceAndCheck(parents);  // the parent is untouched
  // A second shrink of the same parent, excluding nobody: ranks 1 and 3
  // skipped the first one, which must not put them out of step.
  std::vector<ncclComm_t> again(size_t(n), nullptr);
  onRanks(n, [&](int r) {
    EXPECT_EQ(ncclCommShrink(parents[size_t(r)], nullptr, 0, &again[size_t(r)], nullptr, NCCL_SHRINK_DEFAULT),
              ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  allReduceAndCheck(again);
  destroyAll(again);
  destroyAll(shrunk);
  destroyAll(parents);
}

// A non-blocking shrink (config.blocking = 0) returns at once; the new
// communicators finish setting up in the background.
TEST(CommFeatures, NonBlockingShrink) {
  const int n = 3;
  std::vector<ncclComm_t> parents = initAll(n);
  std::vector<ncclComm_t> kids(size_t(n), nullptr);
  int exclude[1] = {0};
  onRanks(n, [&](int r) {
    if (r == 0) return;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommShrink(parents[size_t(r)], exclude, 1, &kids[size_t(r)], &config,
                                           NCCL_SHRINK_DEFAULT);
    EXPECT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << ncclGetLastError(nullptr);
    ASSERT_NE(kids[size_t(r)], nullptr);
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 3000 && state == ncclInProgress; ++i) {
      EXPECT_EQ(ncclCommGetAsyncError(kids[size_t(r)], &state), ncclSuccess);
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(state, ncclSuccess) << ncclGetLastError(kids[size_t(r)]);
  });
  std::vector<ncclComm_t> shrunk = {kids[1], kids[2]};
  allReduceAndCheck(shrunk);
  destroyAll(shrunk);
  destroyAll(parents);
}

// ncclCommRevoke ends an operation blocked on a rank that never comes, and
// later ones, with an error; the revoked communicator can still be shrunk.
TEST(CommFeatures, RevokeEndsBlockedWorkThenShrink) {
  const int n = 3;
  std::vector<ncclComm_t> parents = initAll(n);
  std::vector<float> x(1024, 1.0f), y(1024, 0.0f);
  ncclResult_t blocked = ncclSuccess;
  std::atomic<int> returned{0};
  // Ranks 0 and 1 wait in an AllReduce that rank 2 never joins.
  std::thread t0([&] {
    blocked = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, parents[0], nullptr);
    ++returned;
  });
  std::vector<float> x1(1024, 1.0f), y1(1024, 0.0f);
  ncclResult_t blocked1 = ncclSuccess;
  std::thread t1([&] {
    blocked1 = ncclAllReduce(x1.data(), y1.data(), x1.size(), ncclFloat32, ncclSum, parents[1], nullptr);
    ++returned;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // They cannot finish without rank 2: still inside the call, not refused.
  EXPECT_EQ(returned.load(), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommRevoke(parents[0], NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclCommRevoke(parents[1], NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(nullptr);
  t0.join();
  t1.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_NE(blocked, ncclSuccess);
  EXPECT_NE(blocked1, ncclSuccess);
  EXPECT_NE(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, parents[0], nullptr), ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(parents[0])).find("revoked"), std::string::npos) << ncclGetLastError(parents[0]);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(parents[0], &async), ncclSuccess);
  EXPECT_NE(async, ncclSuccess);
  EXPECT_EQ(ncclCommRevoke(parents[0], 7), ncclInvalidArgument);
  std::vector<ncclComm_t> kids(2, nullptr);
  int exclude[1] = {2};
  onRanks(2, [&](int r) {
    EXPECT_EQ(ncclCommShrink(parents[size_t(r)], exclude, 1, &kids[size_t(r)], nullptr, NCCL_SHRINK_DEFAULT),
              ncclSuccess)
        << ncclGetLastError(nullptr);
  });
  allReduceAndCheck(kids);
  destroyAll(kids);
  destroyAll(parents);
}

TEST(CommFeatures, ShrinkRefusesBadArguments) {
  std::vector<ncclComm_t> comms = initAll(2);
  ncclComm_t child = nullptr;
  auto expect = [](ncclResult_t rc, ncclResult_t want, const char* says) {
    EXPECT_EQ(rc, want) << says;
    const std::string msg = ncclGetLastError(nullptr);
    EXPECT_NE(msg.find(says), std::string::npos) << msg;
  };
  int self[1] = {0}, twice[2] = {1, 1}, outside[1] = {2};
  expect(ncclCommShrink(comms[0], self, 1, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidUsage,
         "only the remaining ranks call ncclCommShrink");
  expect(ncclCommShrink(comms[0], twice, 2, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "twice");
  expect(ncclCommShrink(comms[0], outside, 1, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
         "excludeRanksList");
  expect(ncclCommShrink(comms[0], nullptr, 1, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
         "excludeRanksList");
  expect(ncclCommShrink(comms[0], self, 0, &child, nullptr, 5), ncclInvalidArgument, "shrinkFlags");
  expect(ncclCommShrink(comms[0], self, 0, nullptr, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "newcomm");
  allReduceAndCheck(comms);  // nothing was broken
  destroyAll(comms);
}

// Two ranks pass different lists: both fail at once (no timeout), saying so.
TEST(CommFeatures, ShrinkWithDifferentListsFailsClearly) {
  std::vector<ncclComm_t> comms = initAll(3);
  std::vector<ncclComm_t> kids(2, nullptr);
  std::vector<ncclResult_t> rcs(2, ncclSuccess);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  onRanks(2, [&](int r) {
    int exclude[1] = {2};
    rcs[size_t(r)] = ncclCommShrink(comms[size_t(r)], exclude, r == 0 ? 1 : 0, &kids[size_t(r)], nullptr,
                                    NCCL_SHRINK_DEFAULT);
    errors[size_t(r)] = ncclGetLastError(nullptr);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rcs[size_t(r)], ncclInvalidUsage) << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("different excludeRanksList"), std::string::npos) << errors[size_t(r)];
    EXPECT_EQ(kids[size_t(r)], nullptr);
  }
  allReduceAndCheck(comms);  // the parent is untouched
  destroyAll(comms);
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
