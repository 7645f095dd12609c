// The pipeline slice and spin budget a communicator takes from its links.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "core/communicator.h"
#include "core/group.h"

namespace loom::core {
namespace {

struct Env {
  Env(const char* name, const char* value) : name_(name) {
    setenv(name, value, 1);
    settings::reload();
  }
  ~Env() {
    unsetenv(name_);
    settings::reload();
  }
  const char* name_;
};

TEST(CommOptions, NetworkSliceIsSmallerUnlessTheChunkIsSet) {
  CommOptions d = CommOptions::fromSettings();
  EXPECT_EQ(d.sliceBytes, size_t(512) << 10);  // NCCL_BUFFSIZE / 8
  EXPECT_EQ(d.networkSliceBytes, size_t(128) << 10);
  {
    Env e("NCCL_BUFFSIZE", "524288");
    CommOptions o = CommOptions::fromSettings();
    EXPECT_EQ(o.sliceBytes, size_t(64) << 10);
    EXPECT_EQ(o.networkSliceBytes, size_t(64) << 10);
  }
  {
    Env e("LOOM_CHUNK_BYTES", "1048576");
    CommOptions o = CommOptions::fromSettings();
    EXPECT_EQ(o.sliceBytes, size_t(1) << 20);
    EXPECT_EQ(o.networkSliceBytes, size_t(1) << 20);
  }
}

TEST(CommOptions, SocketsPerPeerFromLoomOrNcclSettings) {
  EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 2);
  {
    Env threads("NCCL_SOCKET_NTHREADS", "4");
    EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 4);
    Env perThread("NCCL_NSOCKS_PERTHREAD", "3");
    EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 12);
    Env many("NCCL_SOCKET_NTHREADS", "8");  // 24 sockets: capped
    EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 16);
    Env loom("LOOM_SOCKETS_PER_PEER", "5");  // loom's own wins
    EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 5);
  }
  {
    Env perThread("NCCL_NSOCKS_PERTHREAD", "0");  // NCCL's minimum is 1
    EXPECT_EQ(CommOptions::fromSettings().link.socketsPerPeer, 1);
  }
}

// An ncclConfig_t's minCTAs / maxCTAs bound the channels within the
// settings' limits, netName picks the network and trafficClass travels in
// the selection; NCCL_MIN_CTAS, NCCL_MAX_CTAS and NCCL_NET, where set,
// replace the config's fields as in NCCL.
TEST(CommOptions, ConfigBoundsChannelsAndNamesTheNetwork) {
  auto applied = [](CommOptions::Config c) {
    CommOptions o = CommOptions::fromSettings();
    o.apply(c);
    return o;
  };
  CommOptions d = CommOptions::fromSettings();
  EXPECT_EQ(d.channels, 1);
  EXPECT_EQ(d.maxChannels, 32);
  EXPECT_EQ(d.link.selection.trafficClass, -1);
  EXPECT_EQ(applied({.minChannels = 4}).channels, 4);
  EXPECT_EQ(applied({.minChannels = 4, .maxChannels = 2}).channels, 2);  // the cap wins
  EXPECT_EQ(applied({.maxChannels = 3}).maxChannels, 3);
  EXPECT_EQ(applied({.network = "Socket"}).link.selection.net, "Socket");
  EXPECT_EQ(applied({.trafficClass = 106}).link.selection.trafficClass, 106);
  {
    Env floor("NCCL_MIN_NCHANNELS", "3");
    EXPECT_EQ(applied({}).channels, 3);
    EXPECT_EQ(applied({.minChannels = 2}).channels, 3);  // a floor, never lowered
    EXPECT_EQ(applied({.maxChannels = 2}).channels, 2);
  }
  {
    Env cap("NCCL_MAX_NCHANNELS", "2");
    EXPECT_EQ(applied({.minChannels = 8}).channels, 2);
  }
  {
    Env least("NCCL_MIN_CTAS", "5");
    EXPECT_EQ(CommOptions::fromSettings().channels, 5);  // without a config too
    EXPECT_EQ(applied({.minChannels = 2}).channels, 5);
    Env most("NCCL_MAX_CTAS", "4");
    EXPECT_EQ(applied({.maxChannels = 8}).channels, 4);
  }
  {
    Env zero("NCCL_MAX_CTAS", "0");  // too low: ignored, as in NCCL
    EXPECT_EQ(applied({.maxChannels = 8}).maxChannels, 8);
  }
  {
    Env net("NCCL_NET", "Socket");
    EXPECT_EQ(applied({.network = "IB"}).link.selection.net, "Socket");
  }
  // A split child starts from its parent's options: applying again keeps them.
  CommOptions parent = applied({.minChannels = 4, .network = "Socket"});
  parent.apply({});
  EXPECT_EQ(parent.channels, 4);
  EXPECT_EQ(parent.link.selection.net, "Socket");
}

// Two ranks as threads: over shared memory the host slice, over TCP the
// network one and the short spin. `options` (if given) sets each rank's.
void initPair(std::vector<std::unique_ptr<Communicator>>* comms,
              const std::vector<CommOptions>& options = {}) {
  uint8_t id[kUniqueIdBytes];
  ASSERT_TRUE(getUniqueId(id).isOk());
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    comms->push_back(std::make_unique<Communicator>(options.empty() ? CommOptions::fromSettings() : options[size_t(r)]));
    threads.emplace_back([&, r] { results[size_t(r)] = (*comms)[size_t(r)]->initFromId(id, 2, r); });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) ASSERT_TRUE(s.isOk()) << s.message();
}

TEST(CommOptions, CommunicatorsOverTcpTakeTheNetworkSlice) {
  Env host("LOOM_DEVICE", "host");
  for (const char* shmOff : {"0", "1"}) {
    SCOPED_TRACE(std::string("NCCL_SHM_DISABLE=") + shmOff);
    Env shm("NCCL_SHM_DISABLE", shmOff);
    std::vector<std::unique_ptr<Communicator>> comms;
    initPair(&comms);
    const bool tcp = shmOff[0] == '1';
    for (auto& c : comms) {
      EXPECT_EQ(c->sliceBytes(), tcp ? size_t(128) << 10 : size_t(512) << 10);
      if (tcp) {
        EXPECT_EQ(c->spinRounds(), 64);
      }
      EXPECT_TRUE(c->closeAndWait(30));
    }
  }
}

// Ranks that ask for different channel counts (their settings or configs
// differ) open the fewest any of them asks for, instead of each waiting for
// connections the others never open.
TEST(CommOptions, RanksAgreeOnTheFewestChannels) {
  Env host("LOOM_DEVICE", "host");
  Env timeout("LOOM_TIMEOUT_S", "60");  // a disagreement fails instead of waiting 30 minutes
  for (const char* shmOff : {"0", "1"}) {
    SCOPED_TRACE(std::string("NCCL_SHM_DISABLE=") + shmOff);
    Env shm("NCCL_SHM_DISABLE", shmOff);
    std::vector<CommOptions> options(2, CommOptions::fromSettings());
    options[0].apply({.minChannels = 3});
    options[1].apply({.minChannels = 2});
    std::vector<std::unique_ptr<Communicator>> comms;
    initPair(&comms, options);
    ASSERT_EQ(comms.size(), 2u);
    // 4 MiB: split across both channels.
    constexpr size_t kCount = size_t(1) << 20;
    std::vector<std::vector<float>> in(2), out(2, std::vector<float>(kCount));
    std::vector<Status> results(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) ASSERT_EQ(comms[size_t(r)]->nchannels(), 2);
    for (int r = 0; r < 2; ++r) {
      in[size_t(r)].resize(kCount);
      for (size_t i = 0; i < kCount; ++i) in[size_t(r)][i] = float((i % 1000) * (r + 1));
      threads.emplace_back([&, r] {
        OpDesc op;
        op.kind = OpKind::kAllReduce;
        op.sendbuf = in[size_t(r)].data();
        op.recvbuf = out[size_t(r)].data();
        op.count = kCount;
        op.type = kernels::DataType::kFloat32;
        Status s = comms[size_t(r)]->resolveOp(int(kernels::RedOp::kSum), op.type, &op.reduction, &op.scalarPtr);
        results[size_t(r)] = s.isOk() ? enqueue(comms[size_t(r)].get(), op) : s;
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[size_t(r)].isOk()) << results[size_t(r)].message();
      size_t wrong = 0;
      for (size_t i = 0; i < kCount; ++i) wrong += out[size_t(r)][i] != float((i % 1000) * 3);
      EXPECT_EQ(wrong, 0u) << "rank " << r;
    }
    for (auto& c : comms) EXPECT_TRUE(c->closeAndWait(30));
  }
}

}  // namespace
}  // namespace loom::core
