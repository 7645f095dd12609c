// The transport registry's choice for a pair, and endpoints: a backend's
// half made through the registry connects to the peer's endpoint, and a
// damaged endpoint is an error, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "transport/endpoint.h"
#include "transport/registry.h"

namespace loom::transport {
namespace {

PeerView view(int rank, uint64_t host, bool hostBuffers = true) {
  PeerView v;
  v.rank = rank;
  v.hostHash = host;
  v.pid = 1000 + uint32_t(rank);
  v.memory = hostBuffers ? MemoryType::kHost : MemoryType::kDevice;
  v.transports = kTransportShm;  // shared memory allowed
  return v;
}

TEST(Registry, SameHostHostBuffersChooseShm) {
  std::string reasons;
  const Backend* b = choose(view(0, 7), view(1, 7), Selection{}, &reasons);
  ASSERT_NE(b, nullptr);
  EXPECT_STREQ(b->name(), "shm");
  EXPECT_EQ(find("shm"), b);
  EXPECT_EQ(find("no-such-backend"), nullptr);
  // A peer with shared memory off (NCCL_SHM_DISABLE=1 in its process):
  // both sides of the pair keep TCP.
  PeerView off = view(1, 7);
  off.transports = 0;
  reasons.clear();
  const Backend* none = choose(view(0, 7), off, Selection{}, &reasons);
  EXPECT_TRUE(none == nullptr || std::strcmp(none->name(), "shm") != 0);
  EXPECT_NE(reasons.find("rank 1 has shared memory off"), std::string::npos) << reasons;
}

// NCCL_NET names a network backend that is required, not a hint: NCCL's
// names and loom's, in any case; one that cannot be used (or does not
// exist) is an error saying why.
TEST(Registry, NetworkBackendByName) {
  auto net = [](const char* name, bool ibDisabled = false) {
    Selection s;
    s.net = name;
    s.ibDisabled = ibDisabled;
    return s.network();
  };
  // Unset, the best available: IB where this machine has a usable verbs
  // port (the rdma tier's guest), else Socket.
  const bool verbsHere = localTransports(Selection{}) & kTransportVerbs;
  for (const char* name : {"", "Socket", "socket", "SOCKET", "tcp"}) {
    auto n = net(name);
    ASSERT_TRUE(n.isOk()) << name << ": " << n.status().toString();
    EXPECT_EQ(n.value(), *name == '\0' && verbsHere ? "IB" : "Socket") << name;
  }
  auto ib = net("IB");
  if (verbsHere) {
    ASSERT_TRUE(ib.isOk()) << ib.status().toString();
    EXPECT_EQ(ib.value(), "IB");
  } else {
    ASSERT_FALSE(ib.isOk());
    EXPECT_EQ(ib.status().code(), Code::kInvalidArgument);
    EXPECT_NE(ib.status().message().find("NCCL_NET=IB cannot be used: "), std::string::npos) << ib.status().message();
    EXPECT_NE(ib.status().message().find("verbs"), std::string::npos) << ib.status().message();
  }
  auto ibOff = net("ib", true);
  ASSERT_FALSE(ibOff.isOk());
  EXPECT_NE(ibOff.status().message().find("NCCL_IB_DISABLE=1"), std::string::npos) << ibOff.status().message();
  EXPECT_TRUE(net("", true).isOk()) << "with IB disabled the default is Socket";
  auto bogus = net("Carrier-Pigeon");
  ASSERT_FALSE(bogus.isOk());
  EXPECT_NE(bogus.status().message().find("names no network backend; known: IB, Socket"), std::string::npos)
      << bogus.status().message();
}

TEST(Registry, EveryRefusalIsExplained) {
  std::string reasons;
  EXPECT_EQ(choose(view(0, 7), view(1, 8), Selection{}, &reasons), nullptr);
  EXPECT_NE(reasons.find("shm: the ranks are on different hosts"), std::string::npos) << reasons;

  reasons.clear();
  Selection noShm;
  noShm.shmDisabled = true;
  EXPECT_EQ(choose(view(0, 7), view(1, 7), noShm, &reasons), nullptr);
  EXPECT_NE(reasons.find("NCCL_SHM_DISABLE"), std::string::npos) << reasons;
}

#if LOOM_HAVE_VERBS
// Verbs take a pair only when both ranks said (in the init exchange) that
// they have a usable port, and only when NCCL_NET allows IB; same-host
// pairs keep shared memory.
TEST(Registry, VerbsNeedAPortOnBothRanks) {
  auto withVerbs = [](PeerView v) {
    v.transports |= kTransportVerbs;
    return v;
  };
  std::string reasons;
  EXPECT_EQ(choose(withVerbs(view(0, 7)), withVerbs(view(1, 8)), Selection{}, &reasons), find("ib")) << reasons;
  EXPECT_EQ(choose(withVerbs(view(0, 7)), withVerbs(view(1, 7)), Selection{}, &reasons), find("shm")) << reasons;
  Selection noShm;
  noShm.shmDisabled = true;
  EXPECT_EQ(choose(withVerbs(view(0, 7)), withVerbs(view(1, 7)), noShm, &reasons), find("ib")) << reasons;

  reasons.clear();
  EXPECT_EQ(choose(withVerbs(view(0, 7)), view(1, 8), Selection{}, &reasons), nullptr);
  EXPECT_NE(reasons.find("ib: rank 1 has no usable verbs port"), std::string::npos) << reasons;
  reasons.clear();
  EXPECT_EQ(choose(view(0, 7), withVerbs(view(1, 8)), Selection{}, &reasons), nullptr);
  EXPECT_NE(reasons.find("ib: this rank has no usable verbs port"), std::string::npos) << reasons;

  Selection socket;
  socket.net = "Socket";
  reasons.clear();
  EXPECT_EQ(choose(withVerbs(view(0, 7)), withVerbs(view(1, 8)), socket, &reasons), nullptr);
  EXPECT_NE(reasons.find("ib: NCCL_NET=Socket"), std::string::npos) << reasons;
  EXPECT_FALSE(socket.requiresVerbs());
  Selection off;
  off.ibDisabled = true;
  reasons.clear();
  EXPECT_EQ(choose(withVerbs(view(0, 7)), withVerbs(view(1, 8)), off, &reasons), nullptr);
  EXPECT_NE(reasons.find("ib: NCCL_IB_DISABLE=1"), std::string::npos) << reasons;

  Selection ib;
  ib.net = "ib";
  EXPECT_TRUE(ib.requiresVerbs());
  EXPECT_TRUE(ib.wantsNetwork("IB"));
  EXPECT_FALSE(ib.wantsNetwork("Socket"));
  EXPECT_FALSE(Selection{}.requiresVerbs());
}
#endif

// Device buffers: CUDA IPC first; without it (NCCL_P2P_DISABLE, or after
// its connect failed) shared memory, through which the engine stages them
// in pinned slots.
TEST(Registry, DeviceBuffersTryCudaIpcThenSharedMemory) {
  std::string reasons;
  Selection noP2p;
  noP2p.p2pDisabled = true;
  EXPECT_EQ(choose(view(0, 7, false), view(1, 7, false), noP2p, &reasons), find("shm")) << reasons;
  EXPECT_NE(reasons.find("cudaipc: NCCL_P2P_DISABLE=1"), std::string::npos) << reasons;
  reasons.clear();
  EXPECT_EQ(choose(view(0, 7, false), view(1, 7, false), Selection{}, &reasons, find("cudaipc")), find("shm")) << reasons;
  EXPECT_EQ(choose(view(0, 7, false), view(1, 7, false), Selection{}, &reasons, find("shm")), nullptr);
  reasons.clear();
  EXPECT_EQ(choose(view(0, 7), view(1, 7), Selection{}, &reasons), find("shm")) << reasons;
  EXPECT_NE(reasons.find("cudaipc: the buffers are host memory"), std::string::npos) << reasons;
#ifdef LOOM_DEVICE_HAVE_CUDA
  reasons.clear();
  EXPECT_EQ(choose(view(0, 7, false), view(1, 7, false), Selection{}, &reasons), find("cudaipc")) << reasons;
#endif
}

// Both halves through the registry's interface only, then one message.
TEST(Registry, HalvesConnectThroughTheirEndpoints) {
  const Backend* b = find("shm");
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> ea, eb;
  auto a = b->listen(1, Selection{}, &ea);
  auto c = b->listen(0, Selection{}, &eb);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  ASSERT_TRUE(b->connect(*a.value(), eb).isOk());
  ASSERT_TRUE(b->connect(*c.value(), ea).isOk());

  uint64_t out = 0x1122334455667788, in = 0;
  Transfer s{&out, sizeof out}, r{&in, sizeof in};
  ASSERT_TRUE(a.value()->postSend(&s).isOk());
  ASSERT_TRUE(c.value()->postRecv(&r).isOk());
  for (int i = 0; i < 100000 && !(s.done && r.done); ++i) {
    ASSERT_TRUE(a.value()->progress().isOk());
    ASSERT_TRUE(c.value()->progress().isOk());
  }
  ASSERT_TRUE(s.done && r.done);
  EXPECT_EQ(in, out);
}

TEST(Registry, DamagedEndpointsAreErrors) {
  const Backend* b = find("shm");
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> mine, theirs;
  auto half = b->listen(1, Selection{}, &mine);
  auto peer = b->listen(0, Selection{}, &theirs);
  ASSERT_TRUE(half.isOk() && peer.isOk());

  auto attempt = [&](std::vector<uint8_t> blob) {
    auto fresh = b->listen(1, Selection{}, &mine);  // a half that has not attached yet
    EXPECT_TRUE(fresh.isOk());
    return b->connect(*fresh.value(), blob);
  };
  Status empty = attempt({});
  EXPECT_EQ(empty.code(), Code::kRemoteError);
  EXPECT_NE(empty.message().find("truncated"), std::string::npos) << empty.message();

  std::vector<uint8_t> shortBlob(theirs.begin(), theirs.end() - 1);
  EXPECT_NE(attempt(shortBlob).message().find("truncated"), std::string::npos);

  std::vector<uint8_t> longBlob = theirs;
  longBlob.push_back(0);
  EXPECT_NE(attempt(longBlob).message().find("trailing"), std::string::npos);

  std::vector<uint8_t> newer = theirs;
  newer[0] ^= 0x40;  // the version is the first field
  Status version = attempt(newer);
  EXPECT_EQ(version.code(), Code::kRemoteError);
  EXPECT_NE(version.message().find("version"), std::string::npos) << version.message();
}

TEST(Endpoint, FieldsRoundTripLittleEndian) {
  std::vector<uint8_t> blob;
  EndpointWriter w(&blob, 3);
  w.put(uint8_t(0xAB));
  w.put(int32_t(-2));
  w.put(uint64_t(0x0102030405060708));
  ASSERT_EQ(blob.size(), 4u + 1 + 4 + 8);
  EXPECT_EQ(blob[0], 3);
  EXPECT_EQ(blob[9], 0x08);  // least significant byte first

  EndpointReader r(blob, "test endpoint");
  ASSERT_TRUE(r.expectVersion(3).isOk());
  uint8_t a = 0;
  int32_t b = 0;
  uint64_t c = 0;
  EXPECT_TRUE(r.get(&a) && r.get(&b) && r.get(&c));
  EXPECT_EQ(a, 0xAB);
  EXPECT_EQ(b, -2);
  EXPECT_EQ(c, 0x0102030405060708u);
  EXPECT_TRUE(r.finish().isOk());
  EXPECT_FALSE(r.get(&a));
  EXPECT_EQ(r.finish().code(), Code::kRemoteError);
}

}  // namespace
}  // namespace loom::transport
