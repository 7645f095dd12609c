// The pipeline slice and spin budget a communicator takes from its links.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "core/communicator.h"

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

// Two ranks as threads: over shared memory the host slice, over TCP the
// network one and the short spin.
void initPair(std::vector<std::unique_ptr<Communicator>>* comms) {
  uint8_t id[kUniqueIdBytes];
  ASSERT_TRUE(getUniqueId(id).isOk());
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    comms->push_back(std::make_unique<Communicator>(CommOptions::fromSettings()));
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

}  // namespace
}  // namespace loom::core
