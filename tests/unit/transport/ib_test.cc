// Unit tests of the verbs backend that need no verbs device: NCCL_IB_HCA's
// syntax, the endpoint's checks, and what happens on a machine without a
// usable port. The data path runs in the rdma tier (tests/rdma).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>
#include <vector>

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
  auto half = backend().listen(1, Selection{}, &endpoint);
  ASSERT_FALSE(half.isOk());
  EXPECT_NE(half.status().message().find("no usable verbs port"), std::string::npos) << half.status().message();
}

// A RoCE port's GID table as NICs on a dual-stack network show it: each
// address as RoCE v1 and v2, link-local, IPv4 and global IPv6.
std::vector<GidEntry> dualStackTable() {
  auto entry = [](const char* text, int version) {
    GidEntry e;
    uint8_t raw[16] = {};
    if (inet_pton(AF_INET6, text, raw) != 1) ADD_FAILURE() << text;
    std::memcpy(e.gid.raw, raw, 16);
    e.version = version;
    return e;
  };
  return {entry("fe80::1:2ff:fe03:405", 1),        entry("fe80::1:2ff:fe03:405", 2),
          entry("::ffff:10.20.1.7", 1),            entry("::ffff:10.20.1.7", 2),
          entry("2001:db8:0:2:1:2ff:fe03:405", 1), entry("2001:db8:0:2:1:2ff:fe03:405", 2),
          entry("::ffff:192.168.5.7", 2),          GidEntry{}};
}

GidPreference want(const char* family, int version, const char* range) {
  auto p = GidPreference::make(family, version, range);
  EXPECT_TRUE(p.isOk()) << p.status().message();
  return p.isOk() ? p.value() : GidPreference{};
}

// NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY and NCCL_IB_ADDR_RANGE pick
// the GID; what matches nothing falls back to the first RoCE v2 IPv4 one.
TEST(IbGidSelection, VersionFamilyAndRange) {
  const auto table = dualStackTable();
  std::string unmet;
  EXPECT_EQ(pickGid(table, want("", 2, ""), &unmet), 3);
  EXPECT_EQ(unmet, "");
  EXPECT_EQ(pickGid(table, want("AF_INET", 1, ""), &unmet), 2);
  EXPECT_EQ(pickGid(table, want("AF_INET6", 2, ""), &unmet), 5) << "a global address before a link-local one";
  EXPECT_EQ(pickGid(table, want("AF_INET6", 1, ""), &unmet), 4);
  EXPECT_EQ(pickGid(table, want("AF_INET", 2, "192.168.0.0/16"), &unmet), 6);
  EXPECT_EQ(pickGid(table, want("AF_INET", 2, "10.20.1.7"), &unmet), 3) << "one address";
  EXPECT_EQ(pickGid(table, want("AF_INET6", 2, "fe80::/10"), &unmet), 1);
  EXPECT_EQ(unmet, "");
  EXPECT_EQ(pickGid(table, want("AF_INET", 2, "172.16.0.0/12"), &unmet), 3);
  EXPECT_EQ(unmet, "no GID of RoCE v2, AF_INET in 172.16.0.0/12");
  // Only link-local IPv6: taken when IPv6 is asked for.
  const std::vector<GidEntry> linkLocalOnly(table.begin(), table.begin() + 2);
  EXPECT_EQ(pickGid(linkLocalOnly, want("AF_INET6", 2, ""), &unmet), 1);
  unmet.clear();
  EXPECT_EQ(pickGid(linkLocalOnly, want("AF_INET", 2, ""), &unmet), 1) << "the first RoCE v2 GID";
  EXPECT_NE(unmet, "");
  EXPECT_EQ(pickGid(std::vector<GidEntry>(3), want("", 2, ""), &unmet), 0) << "an empty table: index 0";
}

TEST(IbGidSelection, BadSettingsAreRefusedWithTheirNames) {
  auto message = [](const char* family, int version, const char* range) {
    auto p = GidPreference::make(family, version, range);
    return p.isOk() ? std::string("accepted") : p.status().message();
  };
  EXPECT_NE(message("AF_UNIX", 2, "").find("NCCL_IB_ADDR_FAMILY"), std::string::npos);
  EXPECT_NE(message("", 3, "").find("NCCL_IB_ROCE_VERSION_NUM"), std::string::npos);
  EXPECT_NE(message("", 2, "10.0.0.0/33").find("NCCL_IB_ADDR_RANGE"), std::string::npos);
  EXPECT_NE(message("", 2, "ten/8").find("NCCL_IB_ADDR_RANGE"), std::string::npos);
  EXPECT_NE(message("", 2, "fd00::/8").find("family AF_INET"), std::string::npos);
  // Unusable settings: a warning, and the defaults.
  ::setenv("NCCL_IB_ROCE_VERSION_NUM", "7", 1);
  settings::reload();
  std::string warning;
  const GidPreference p = GidPreference::fromSettings(&warning);
  ::unsetenv("NCCL_IB_ROCE_VERSION_NUM");
  EXPECT_EQ(p.version, 2);
  EXPECT_NE(warning.find("NCCL_IB_ROCE_VERSION_NUM=7"), std::string::npos) << warning;
  // NCCL_SOCKET_FAMILY stands in for an unset NCCL_IB_ADDR_FAMILY.
  ::setenv("NCCL_SOCKET_FAMILY", "AF_INET6", 1);
  settings::reload();
  EXPECT_EQ(GidPreference::fromSettings(&warning).family, AF_INET6);
  ::setenv("NCCL_IB_ADDR_FAMILY", "AF_INET", 1);
  settings::reload();
  EXPECT_EQ(GidPreference::fromSettings(&warning).family, AF_INET);
  ::unsetenv("NCCL_SOCKET_FAMILY");
  ::unsetenv("NCCL_IB_ADDR_FAMILY");
  settings::reload();
}

// The class of service: NCCL's settings, kept within what verbs takes;
// where they are unset, the communicator's ncclConfig_t.trafficClass (the
// service level too when it fits in 0 .. 15, as NCCL takes it).
TEST(IbConnectionOptions, ServiceLevelAndTrafficClassFromNcclSettings) {
  IbConnection::Options d = IbConnection::Options::fromSettings();
  EXPECT_EQ(d.serviceLevel, 0);
  EXPECT_EQ(d.trafficClass, 0);
  auto with = [](const char* sl, const char* tc, int commClass = -1) {
    if (sl) ::setenv("NCCL_IB_SL", sl, 1);
    if (tc) ::setenv("NCCL_IB_TC", tc, 1);
    settings::reload();
    IbConnection::Options o = IbConnection::Options::fromSettings(commClass);
    ::unsetenv("NCCL_IB_SL");
    ::unsetenv("NCCL_IB_TC");
    settings::reload();
    return std::make_pair(o.serviceLevel, o.trafficClass);
  };
  EXPECT_EQ(with("3", "106"), std::make_pair(3, 106));
  EXPECT_EQ(with("16", "256"), std::make_pair(15, 255));
  EXPECT_EQ(with("-1", "-5"), std::make_pair(0, 0));
  EXPECT_EQ(with(nullptr, nullptr, 96), std::make_pair(0, 96));
  EXPECT_EQ(with(nullptr, nullptr, 5), std::make_pair(5, 5));
  EXPECT_EQ(with("2", "106", 5), std::make_pair(2, 106));  // set, NCCL's settings win
  EXPECT_EQ(with(nullptr, "106", 5), std::make_pair(5, 106));
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
