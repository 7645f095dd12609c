// Unit tests of the verbs backend that need no verbs device: NCCL_IB_HCA's
// syntax, the endpoint's checks, and what happens on a machine without a
// usable port. The data path runs in the rdma tier (tests/rdma).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <utility>

#include "common/settings.h"

#include "transport/ib/connection.h"
#include "transport/ib/device.h"
#include "transport/ib/endpoint.h"
#include "transport/ib/transport.h"

namespace loom::transport::ib {
namespace {

TEST(IbHcaFilter, NcclSyntax) {
  EXPECT_TRUE(HcaFilter::parse("").accepts("mlx5_0", 1));
  EXPECT_TRUE(HcaFilter::parse("  ").empty());

  // Prefixes by default: mlx5_1 also names mlx5_10.
  const HcaFilter prefix = HcaFilter::parse("mlx5_1");
  EXPECT_TRUE(prefix.accepts("mlx5_1", 1));
  EXPECT_TRUE(prefix.accepts("mlx5_10", 2));
  EXPECT_FALSE(prefix.accepts("mlx5_0", 1));

  // '=' matches whole names.
  const HcaFilter exact = HcaFilter::parse("=mlx5_1");
  EXPECT_TRUE(exact.accepts("mlx5_1", 1));
  EXPECT_FALSE(exact.accepts("mlx5_10", 1));

  // Ports.
  const HcaFilter ports = HcaFilter::parse("mlx5_0:1, mlx5_1");
  EXPECT_TRUE(ports.accepts("mlx5_0", 1));
  EXPECT_FALSE(ports.accepts("mlx5_0", 2));
  EXPECT_TRUE(ports.accepts("mlx5_1", 2));
  EXPECT_FALSE(ports.accepts("rxe0", 1));

  // '^' excludes; '^=' excludes exact names.
  const HcaFilter exclude = HcaFilter::parse("^mlx5_0:2,rxe");
  EXPECT_TRUE(exclude.accepts("mlx5_0", 1));
  EXPECT_FALSE(exclude.accepts("mlx5_0", 2));
  EXPECT_FALSE(exclude.accepts("rxe0", 1));
  EXPECT_TRUE(exclude.accepts("mlx5_1", 1));
  const HcaFilter excludeExact = HcaFilter::parse("^=mlx5_1");
  EXPECT_FALSE(excludeExact.accepts("mlx5_1", 1));
  EXPECT_TRUE(excludeExact.accepts("mlx5_10", 1));

  // A port that is not a number matches no port; empty items are skipped.
  const HcaFilter bad = HcaFilter::parse("mlx5_0:x,,");
  EXPECT_FALSE(bad.accepts("mlx5_0", 1));
  EXPECT_FALSE(bad.empty());
}

IbEndpoint sample() {
  IbEndpoint e;
  e.qpns = {0x11, 0x22};
  e.psn = 0xabcdef;
  e.lid = 7;
  for (int i = 0; i < 16; ++i) e.gid[i] = uint8_t(0xf0 + i);
  e.mtu = IBV_MTU_4096;
  e.ethernet = 1;
  e.fifoAddr = 0x7f0000001000;
  e.fifoRkey = 0x1234;
  e.slots = kSlots;
  e.slotStride = 4160;
  e.device = "rxe0:1";
  return e;
}

TEST(IbEndpoint, RoundTripsAndChecksEveryField) {
  std::vector<uint8_t> blob;
  writeEndpoint(sample(), &blob);
  auto back = readEndpoint(blob, kSlots, 4160);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->qpns, sample().qpns);
  EXPECT_EQ(back->psn, 0xabcdefu);
  EXPECT_EQ(back->lid, 7);
  EXPECT_EQ(back->gid[15], 0xff);
  EXPECT_EQ(back->fifoAddr, 0x7f0000001000u);
  EXPECT_EQ(back->device, "rxe0:1");

  auto broken = [&](auto change, const char* expect, uint32_t stride = 4160) {
    IbEndpoint e = sample();
    change(e);
    std::vector<uint8_t> b;
    writeEndpoint(e, &b);
    auto r = readEndpoint(b, kSlots, stride);
    ASSERT_FALSE(r.isOk()) << expect;
    EXPECT_EQ(r.status().code(), Code::kRemoteError);
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  };
  broken([](IbEndpoint& e) { e.qpns.clear(); }, "no queue pair");
  broken([](IbEndpoint& e) { e.qpns.assign(kMaxQps + 1, 1); }, "queue pairs");
  broken([](IbEndpoint& e) { e.psn = 1u << 24; }, "PSN");
  broken([](IbEndpoint& e) { e.mtu = 9; }, "MTU");
  broken([](IbEndpoint& e) { e.ethernet = 2; }, "link-layer");
  broken([](IbEndpoint& e) { e.fifoAddr = 0; }, "FIFO address");
  broken([](IbEndpoint&) {}, "LOOM_IB_FIFO_BYTES", 8256);
  broken([](IbEndpoint& e) { e.device = std::string(100, 'x'); }, "oversized");

  std::vector<uint8_t> cut(blob.begin(), blob.end() - 3);
  EXPECT_NE(readEndpoint(cut, kSlots, 4160).status().message().find("truncated"), std::string::npos);
}

// Without a usable port the backend says why (no device, no library, or
// none active), and a listen() fails instead of crashing. Where the
// machine has a port (the rdma guest) the port is described instead.
TEST(IbBackend, SaysWhyWithoutAPort) {
  std::string why;
  const auto ports = usablePorts(&why);
  if (!ports.empty()) {
    EXPECT_FALSE(ports[0].describe().empty());
    return;
  }
  EXPECT_FALSE(why.empty());
  std::vector<uint8_t> endpoint;
  auto half = backend().listen(1, &endpoint);
  ASSERT_FALSE(half.isOk());
  EXPECT_NE(half.status().message().find("no usable verbs port"), std::string::npos) << half.status().message();
}

// The class of service: NCCL's settings, kept within what verbs takes.
TEST(IbConnectionOptions, ServiceLevelAndTrafficClassFromNcclSettings) {
  IbConnection::Options d = IbConnection::Options::fromSettings();
  EXPECT_EQ(d.serviceLevel, 0);
  EXPECT_EQ(d.trafficClass, 0);
  auto with = [](const char* sl, const char* tc) {
    ::setenv("NCCL_IB_SL", sl, 1);
    ::setenv("NCCL_IB_TC", tc, 1);
    settings::reload();
    IbConnection::Options o = IbConnection::Options::fromSettings();
    ::unsetenv("NCCL_IB_SL");
    ::unsetenv("NCCL_IB_TC");
    settings::reload();
    return std::make_pair(o.serviceLevel, o.trafficClass);
  };
  EXPECT_EQ(with("3", "106"), std::make_pair(3, 106));
  EXPECT_EQ(with("16", "256"), std::make_pair(15, 255));
  EXPECT_EQ(with("-1", "-5"), std::make_pair(0, 0));
}

// GPUDirect is off unless asked for, and asked for it still says why it
// cannot run where there is no CUDA device (every machine the tests run on
// but the GPU one; the data path itself is untested). Without it the
// backend never takes device buffers: the engine stages them.
TEST(IbBackend, GpuDirectIsOffByDefaultAndSaysWhy) {
  EXPECT_EQ(IbConnection::gpuDirectWhyNot(), "LOOM_IB_GPUDIRECT=0");
  EXPECT_FALSE(backend().moves(MemoryType::kDevice));
  EXPECT_TRUE(backend().moves(MemoryType::kHostPinned));
  ::setenv("LOOM_IB_GPUDIRECT", "1", 1);
  settings::reload();
  const std::string why = IbConnection::gpuDirectWhyNot();
  ::unsetenv("LOOM_IB_GPUDIRECT");
  settings::reload();
  if (why.empty()) GTEST_SKIP() << "this machine has a CUDA device and dma-buf registration";
  EXPECT_TRUE(why == "no CUDA device" || why.find("ibv_reg_dmabuf_mr") != std::string::npos) << why;
}

}  // namespace
}  // namespace loom::transport::ib
