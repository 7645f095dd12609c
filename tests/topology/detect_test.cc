// Detection from a sysfs tree built by the test: two NUMA nodes, a PCIe
// switch with a GPU and a NIC behind it, an InfiniBand port on that NIC, a
// virtual interface, caches and cores. Then this machine's own detection
// (whatever it has) with both methods.
#include "topology/detect.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "topology/schedule.h"

namespace loom::topology {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    for (int node = 0; node < 2; ++node) {
      write("devices/system/node/node" + std::to_string(node) + "/cpulist", node == 0 ? "0-3\n" : "4-7\n");
    }
    write("devices/system/node/node2/cpulist", "\n");  // memory only
    for (int cpu = 0; cpu < 8; ++cpu) {
      const std::string c = "devices/system/cpu/cpu" + std::to_string(cpu);
      write(c + "/topology/physical_package_id", cpu < 4 ? "0\n" : "1\n");
      write(c + "/topology/core_id", std::to_string(cpu % 4 / 2) + "\n");  // 2 threads per core
      write(c + "/cache/index0/level", "1\n");
      write(c + "/cache/index0/type", "Data\n");
      write(c + "/cache/index0/size", "48K\n");
      write(c + "/cache/index1/level", "1\n");
      write(c + "/cache/index1/type", "Instruction\n");
      write(c + "/cache/index1/size", "32K\n");
      write(c + "/cache/index3/level", "3\n");
      write(c + "/cache/index3/type", "Unified\n");
      write(c + "/cache/index3/size", "32768K\n");
    }
    // pci0000:80 root port 80:01.0 -> switch 81:00.0 -> GPU 82:00.0, NIC 83:00.0 (NUMA 1)
    const std::string port = "devices/pci0000:80/0000:80:01.0";
    const std::string sw = port + "/0000:81:00.0";
    pci(port, "0x060400", "1");
    pci(sw, "0x060400", "1");
    pci(sw + "/0000:82:00.0", "0x030200", "1", "0x10de");
    pci(sw + "/0000:83:00.0", "0x020700", "1", "0x15b3");
    pci("devices/pci0000:00/0000:00:1f.6", "0x020000", "0", "0x8086");  // onboard NIC, NUMA 0
    pci("devices/pci0000:00/0000:00:02.0", "0x060000", "0");            // host bridge: not kept
    pci("devices/pci0000:00/0000:00:1c.0", "0x030000", "0", "0x1a03");  // the BMC's VGA: no GPU
    // The IB port of the NIC, and its netdev; a virtual interface; loopback.
    link("class/infiniband/mlx5_0/device", sw + "/0000:83:00.0");
    write("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
    write("class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n");
    write("class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n");
    write("class/infiniband/mlx5_0/ports/2/state", "1: DOWN\n");
    netdev("eno1", "devices/pci0000:00/0000:00:1f.6", "1000", "up");
    netdev("ib0", sw + "/0000:83:00.0", "100000", "up");  // IPoIB on the IB NIC
    netdev("veth0", "", "10000", "up");
    netdev("eth9", "", "10000", "down");
    netdev("lo", "", "", "unknown");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void link(const std::string& rel, const std::string& target) {
    const fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    fs::create_directory_symlink(fs::path(root_) / target, p);
  }
  void pci(const std::string& dir, const std::string& cls, const std::string& numa, const std::string& vendor = "0x1000") {
    write(dir + "/class", cls + "\n");
    write(dir + "/numa_node", numa + "\n");
    write(dir + "/vendor", vendor + "\n");
    write(dir + "/device", "0x1234\n");
    write(dir + "/current_link_speed", "32.0 GT/s PCIe\n");
    write(dir + "/current_link_width", "16\n");
    link("bus/pci/devices/" + fs::path(dir).filename().string(), dir);
  }
  void netdev(const std::string& name, const std::string& device, const std::string& speed, const std::string& state) {
    write("class/net/" + name + "/operstate", state + "\n");
    if (!speed.empty()) write("class/net/" + name + "/speed", speed + "\n");
    write("class/net/" + name + "/type", "1\n");
    if (!device.empty()) link("class/net/" + name + "/device", device);
  }

  std::string root_;
};

TEST_F(FakeSysfs, FindsNumaCachesPciTreeGpuAndNics) {
  DetectOptions o;
  o.method = "sysfs";
  o.sysRoot = root_;
  o.useNvml = false;
  auto t = detect(o);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->source, "sysfs");
  ASSERT_EQ(t->numaCount(), 2);  // the memory-only node holds no CPU
  const Node& cpu1 = t->nodes[size_t(t->find(NodeType::kCpu, "cpu1"))];
  EXPECT_EQ(cpu1.affinity, "000000f0");
  EXPECT_EQ(cpu1.package, 1);
  EXPECT_EQ(cpu1.cores, 2);
  ASSERT_EQ(cpu1.caches.size(), 2u);  // L1 data and L3; no instruction cache
  EXPECT_EQ(cpu1.caches[1], (Cache{3, 32u << 20}));
  // GPU -> switch -> root port -> CPU 1.
  const auto gpus = t->ofType(NodeType::kGpu);
  ASSERT_EQ(gpus.size(), 1u);
  auto up = t->pathUp(gpus[0]);
  ASSERT_EQ(up.size(), 4u);
  EXPECT_EQ(t->nodes[size_t(up[1])].busId, "0000:81:00.0");
  EXPECT_EQ(t->nodes[size_t(up[2])].busId, "0000:80:01.0");
  EXPECT_EQ(t->nodes[size_t(up[3])].id, "cpu1");
  EXPECT_NEAR(t->links[0].gbs, pciGBs("32.0 GT/s", 16), 0.01);
  // Ports: the active IB port (not the down one), the onboard NIC, the
  // virtual interface; not the interface that is down, not loopback.
  const int ib = t->find(NodeType::kNet, "mlx5_0");
  ASSERT_GE(ib, 0);
  EXPECT_EQ(t->nodes[size_t(ib)].speedMbps, 400000u);
  EXPECT_EQ(t->nodes[size_t(ib)].linkLayer, "infiniband");
  EXPECT_EQ(t->nodes[size_t(ib)].busId, "0000:83:00.0");
  EXPECT_EQ(t->nodes[size_t(ib)].numa, 1);
  const int eno1 = t->find(NodeType::kNet, "eno1");
  ASSERT_GE(eno1, 0);
  EXPECT_EQ(t->nodes[size_t(eno1)].numa, 0);
  EXPECT_EQ(t->nodes[size_t(eno1)].speedMbps, 1000u);
  EXPECT_GE(t->find(NodeType::kNet, "veth0"), 0);
  EXPECT_EQ(t->find(NodeType::kNet, "eth9"), -1);
  EXPECT_EQ(t->find(NodeType::kNet, "lo"), -1);
  EXPECT_EQ(t->find(NodeType::kNet, "mlx5_0:2"), -1);
  EXPECT_EQ(t->find(NodeType::kPci, "0000:00:02.0"), -1);  // leads to nothing kept
  EXPECT_EQ(t->find(NodeType::kPci, "0000:00:1c.0"), -1);  // a management VGA is neither GPU nor kept
  // The GPU and the IB NIC share the switch: a rank on that GPU is the one
  // its host's ring leaves from.
  auto rank = gpuRank(t.value(), 0, "0000:82:00.0");
  ASSERT_TRUE(rank.isOk());
  EXPECT_EQ(rank->numa, 1);
  EXPECT_EQ(rank->pciPath, (std::vector<std::string>{"0000:80:01.0", "0000:81:00.0", "0000:82:00.0"}));
  // For the schedules a NIC is a PCI function: the IB port and its IPoIB
  // netdev count once (the faster), and the virtual interface not at all
  // beside PCI NICs.
  const HostPlace place = hostPlace(t.value(), "h");
  std::set<std::string> names;
  for (const auto& nic : place.nics) names.insert(nic.name);
  EXPECT_EQ(names, (std::set<std::string>{"eno1", "mlx5_0"}));
  // The detected XML loads back to the same graph.
  auto again = fromXml(xml::parse(xml::write(t->xml), "dump").value(), "dump");
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_EQ(again->nodes, t->nodes);
}

// A soft-RoCE device (rdma_rxe) as the kernel shows it: no "device" link,
// so no PCI parent. It is a RoCE port hanging from a CPU, like a virtual
// interface, with its rate from sysfs.
TEST_F(FakeSysfs, SoftRoceDeviceHasNoPciParent) {
  write("class/infiniband/rxe0/parent", "dummy0\n");
  write("class/infiniband/rxe0/ports/1/state", "4: ACTIVE\n");
  write("class/infiniband/rxe0/ports/1/rate", "2.5 Gb/sec (1X SDR)\n");
  write("class/infiniband/rxe0/ports/1/link_layer", "Ethernet\n");
  DetectOptions o;
  o.method = "sysfs";
  o.sysRoot = root_;
  o.useNvml = false;
  auto t = detect(o);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  const int rxe = t->find(NodeType::kNet, "rxe0");
  ASSERT_GE(rxe, 0);
  const Node& n = t->nodes[size_t(rxe)];
  EXPECT_EQ(n.linkLayer, "roce");
  EXPECT_EQ(n.speedMbps, 2500u);
  EXPECT_TRUE(n.busId.empty()) << n.busId;
  auto up = t->pathUp(rxe);
  ASSERT_GE(up.size(), 2u);
  EXPECT_EQ(t->nodes[size_t(up.back())].type, NodeType::kCpu) << "a virtual port hangs from a CPU";
  for (size_t i = 1; i + 1 < up.size(); ++i) EXPECT_NE(t->nodes[size_t(up[i])].type, NodeType::kPci);
  // Written out and read back, it stays where it is.
  auto again = fromXml(xml::parse(xml::write(t->xml), "dump").value(), "dump");
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_EQ(again->nodes, t->nodes);
}

TEST_F(FakeSysfs, UnknownMethodIsAnError) {
  DetectOptions o;
  o.method = "magic";
  o.sysRoot = root_;
  auto t = detect(o);
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("'magic'"), std::string::npos) << t.status().message();
}

// This machine, both ways: a NUMA node with this process's CPU, and the
// same CPUs and NICs from hwloc as from sysfs.
TEST(Detect, ThisMachineWithHwlocAndSysfs) {
  DetectOptions sysfs;
  sysfs.method = "sysfs";
  auto a = detect(sysfs);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  EXPECT_GE(a->numaCount(), 1);
  DetectOptions hwloc;
  hwloc.method = "hwloc";
  auto b = detect(hwloc);
  if (!b.isOk()) {
    GTEST_SKIP() << "skipped: hwloc is not installed here (" << b.status().message() << ")";
  }
  EXPECT_EQ(b->source, "hwloc");
  EXPECT_EQ(b->numaCount(), a->numaCount());
  EXPECT_EQ(b->ofType(NodeType::kNet).size(), a->ofType(NodeType::kNet).size());
  EXPECT_EQ(b->ofType(NodeType::kGpu).size(), a->ofType(NodeType::kGpu).size());
  for (int n : a->ofType(NodeType::kCpu)) {
    const int m = b->find(NodeType::kCpu, a->nodes[size_t(n)].id);
    ASSERT_GE(m, 0);
    EXPECT_EQ(b->nodes[size_t(m)].affinity, a->nodes[size_t(n)].affinity);
    EXPECT_EQ(b->nodes[size_t(m)].cores, a->nodes[size_t(n)].cores);
  }
  EXPECT_GE(currentNumaNode(), 0);
}

// Whether a rank's CPUs run other ranks too, from the local ranks' masks.
TEST(CpusShared, FollowsHowRanksAreBound) {
  using Masks = std::vector<std::vector<uint64_t>>;
  // Unbound on 2 CPUs: 2 ranks have one each, 3 do not.
  EXPECT_FALSE(cpusShared(Masks{{0x3}, {0x3}}, 0));
  EXPECT_TRUE(cpusShared(Masks{{0x3}, {0x3}, {0x3}}, 2));
  // Bound a CPU each (loomrun --bind-to core): 2 ranks on 2 CPUs share
  // nothing; 4 on 2 share every CPU.
  EXPECT_FALSE(cpusShared(Masks{{0x1}, {0x2}}, 0));
  EXPECT_FALSE(cpusShared(Masks{{0x1}, {0x2}}, 1));
  EXPECT_TRUE(cpusShared(Masks{{0x1}, {0x2}, {0x1}, {0x2}}, 1));
  // Two ranks pinned to CPU 0 beside two unbound on 4 CPUs: the pinned
  // ones share, the unbound ones have CPUs 1-3 to go to.
  const Masks mixed{{0x1}, {0x1}, {0xf}, {0xf}};
  EXPECT_TRUE(cpusShared(mixed, 0));
  EXPECT_FALSE(cpusShared(mixed, 2));
  // A mask that was not sent counts as every CPU of the others' masks;
  // CPUs past the first word count like any other.
  EXPECT_FALSE(cpusShared(Masks{{}, {0x1, 0x1}}, 0));
  EXPECT_TRUE(cpusShared(Masks{{0, 0x1}, {0, 0x1}}, 0));
  EXPECT_FALSE(cpusShared(Masks{{0x1}}, 0));
}

TEST(CpusShared, ThisThreadsMaskHoldsTheCpuItRunsOn) {
  const std::vector<uint64_t> mask = currentCpuMask();
  const int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  ASSERT_GT(mask.size(), size_t(cpu / 64));
  EXPECT_TRUE(mask[size_t(cpu / 64)] >> (cpu % 64) & 1);
}

}  // namespace
}  // namespace loom::topology
