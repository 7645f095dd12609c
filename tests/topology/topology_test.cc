#include "topology/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

namespace loom::topology {
namespace {

std::string fixture(const char* name) { return std::string(LOOM_TOPO_FIXTURES) + "/" + name; }

Topology load(const char* name) {
  auto t = loadFile(fixture(name));
  EXPECT_TRUE(t.isOk()) << t.status().message();
  return t.isOk() ? std::move(t).value() : Topology{};
}

size_t count(const Topology& t, NodeType type) { return t.ofType(type).size(); }
size_t countLinks(const Topology& t, LinkType type) {
  return size_t(std::count_if(t.links.begin(), t.links.end(), [&](const Link& l) { return l.type == type; }));
}

TEST(Topology, DgxLikeNode) {
  Topology t = load("dgx-h100-like.xml");
  EXPECT_EQ(t.numaCount(), 2);
  EXPECT_EQ(count(t, NodeType::kGpu), 8u);
  EXPECT_EQ(count(t, NodeType::kNet), 9u);  // 8 InfiniBand ports and the management port
  EXPECT_EQ(count(t, NodeType::kNvSwitch), 1u);
  EXPECT_EQ(countLinks(t, LinkType::kNvLink), 8u);
  EXPECT_EQ(countLinks(t, LinkType::kSys), 1u);
  const Node& gpu0 = t.nodes[size_t(t.ofType(NodeType::kGpu)[0])];
  EXPECT_EQ(gpu0.busId, "0000:18:00.0");
  EXPECT_EQ(gpu0.sm, 90);
  EXPECT_EQ(gpu0.dev, 0);
  // GPU -> PCIe switch -> CPU 0.
  auto up = t.pathUp(t.ofType(NodeType::kGpu)[0]);
  ASSERT_EQ(up.size(), 3u);
  EXPECT_EQ(t.nodes[size_t(up[1])].busId, "0000:15:00.0");
  EXPECT_EQ(t.nodes[size_t(up[2])].type, NodeType::kCpu);
  const int ib0 = t.find(NodeType::kNet, "mlx5_0");
  ASSERT_GE(ib0, 0);
  EXPECT_EQ(t.nodes[size_t(ib0)].speedMbps, 400000u);
  EXPECT_EQ(t.nodes[size_t(ib0)].linkLayer, "infiniband");
  EXPECT_EQ(t.nodes[size_t(ib0)].busId, "0000:1a:00.0");
  const Node& cpu0 = t.nodes[size_t(t.find(NodeType::kCpu, "cpu0"))];
  EXPECT_EQ(cpu0.cores, 56);
  ASSERT_EQ(cpu0.caches.size(), 3u);
  EXPECT_EQ(cpu0.caches[2], (Cache{3, 110100480}));
  for (const auto& l : t.links) {
    if (l.type == LinkType::kNvLink) EXPECT_NEAR(l.gbs, 18 * 20.6, 0.01);
  }
}

TEST(Topology, CpuOnlyServer) {
  Topology t = load("cpu-2socket.xml");
  EXPECT_EQ(t.numaCount(), 2);
  EXPECT_EQ(count(t, NodeType::kGpu), 0u);
  EXPECT_EQ(count(t, NodeType::kNet), 3u);
  const int nic = t.find(NodeType::kNet, "ens2f0");
  ASSERT_GE(nic, 0);
  EXPECT_EQ(t.nodes[size_t(nic)].numa, 1);
}

TEST(Topology, CloudVmShapes) {
  Topology v100 = load("cloud-vm-v100.xml");
  EXPECT_EQ(count(v100, NodeType::kGpu), 8u);  // from the PCI class alone
  EXPECT_EQ(count(v100, NodeType::kNet), 1u);  // the NIC without ports gets one
  EXPECT_EQ(countLinks(v100, LinkType::kNvLink), 0u);
  Topology a100 = load("cloud-vm-a100.xml");
  EXPECT_EQ(a100.numaCount(), 4);
  EXPECT_EQ(count(a100, NodeType::kGpu), 4u);
  // The self-link is kept in the file, not linked; 1->0 and 2->3 are links.
  EXPECT_EQ(countLinks(a100, LinkType::kNvLink), 2u);
  const int eth0 = a100.find(NodeType::kNet, "eth0");
  ASSERT_GE(eth0, 0);
  EXPECT_EQ(a100.nodes[size_t(eth0)].busId, "");
  EXPECT_EQ(a100.nodes[size_t(eth0)].numa, 0);
}

// Load, dump, load: the same tree (unknown elements and attributes kept) and
// the same graph.
TEST(Topology, DumpAndReloadKeepEverything) {
  for (const char* name : {"dgx-h100-like.xml", "cpu-2socket.xml", "cloud-vm-v100.xml", "cloud-vm-a100.xml"}) {
    SCOPED_TRACE(name);
    Topology first = load(name);
    char path[] = "/tmp/loom-topo-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_TRUE(dumpFile(first, path).isOk());
    auto second = loadFile(path);
    std::remove(path);
    ASSERT_TRUE(second.isOk()) << second.status().message();
    EXPECT_EQ(second->xml, first.xml);
    EXPECT_EQ(second->nodes, first.nodes);
    EXPECT_EQ(second->links, first.links);
  }
  Topology a100 = load("cloud-vm-a100.xml");
  const std::string text = xml::write(a100.xml);
  EXPECT_NE(text.find("future_attribute=\"kept\""), std::string::npos);
  EXPECT_NE(text.find("<future_element"), std::string::npos);
}

TEST(Topology, BadTopologiesNameFileLineAndElement) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"<system>\n  <cpu affinity=\"1\"/>\n</system>", "t.xml:2: <cpu>: attribute 'numaid' is missing"},
      {"<system>\n  <cpu numaid=\"zero\"/>\n</system>", "t.xml:2: <cpu numaid=\"zero\">: attribute numaid=\"zero\" is not a number"},
      {"<system>\n<cpu numaid=\"0\"/>\n<cpu numaid=\"0\"/>\n</system>", "t.xml:3: <cpu numaid=\"0\">: NUMA node 0 appears twice"},
      {"<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\"/>\n<pci busid=\"0000:01:00.0\"/>\n</cpu>\n</system>",
       "t.xml:4: <pci busid=\"0000:01:00.0\">: PCI device 0000:01:00.0 appears twice"},
      {"<system>\n<cpu numaid=\"0\">\n<pci class=\"0x030200\"/>\n</cpu>\n</system>", "t.xml:3: <pci>: attribute 'busid' is missing"},
      {"<system>\n<cpu numaid=\"0\">\n<pci busid=\"1:0.0\">\n<gpu sm=\"9x\"/>\n</pci>\n</cpu>\n</system>",
       "t.xml:4: <gpu>: attribute sm=\"9x\" is not a number"},
      {"<system>\n<cpu numaid=\"0\">\n<nic>\n<net dev=\"0\"/>\n</nic>\n</cpu>\n</system>", "t.xml:4: <net dev=\"0\">: attribute 'name' is missing"},
      {"<system>\n<cpu numaid=\"0\">\n<pci busid=\"1:0.0\">\n<gpu>\n<nvlink count=\"2\"/>\n</gpu>\n</pci>\n</cpu>\n</system>",
       "t.xml:5: <nvlink>: attribute 'target' is missing"},
      {"<topology/>", "t.xml:1: <topology>: the root element must be <system>"},
      {"<system>\n<cpu numaid=\"0\" loom_caches=\"L3=big\"/>\n</system>", "t.xml:2: <cpu numaid=\"0\">: loom_caches"},
  };
  for (const auto& c : cases) {
    auto root = xml::parse(c.text, "t.xml");
    ASSERT_TRUE(root.isOk()) << root.status().message();
    auto t = fromXml(std::move(root).value(), "t.xml");
    ASSERT_FALSE(t.isOk()) << c.text;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().message();
  }
}

// A display controller is a GPU when it is NVIDIA's or names no vendor; a
// server's management VGA (ASPEED) is not.
TEST(Topology, OnlyNvidiaDisplayControllersAreGpus) {
  auto root = xml::parse("<system><cpu numaid=\"0\">"
                         "<pci busid=\"0000:02:00.0\" class=\"0x030000\" vendor=\"0x1a03\"/>"
                         "<pci busid=\"0000:03:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>"
                         "<pci busid=\"0000:04:00.0\" class=\"0x030200\"/>"
                         "</cpu></system>",
                         "vga.xml");
  ASSERT_TRUE(root.isOk()) << root.status().message();
  auto t = fromXml(std::move(root).value(), "vga.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  std::set<std::string> gpus;
  for (int g : t->ofType(NodeType::kGpu)) gpus.insert(t->nodes[size_t(g)].busId);
  EXPECT_EQ(gpus, (std::set<std::string>{"0000:03:00.0", "0000:04:00.0"}));
}

// Odd values found by fuzzing: a speed that is not a number gets the
// default bandwidth; a NIC without ports whose bus id is already a port's
// name does not make a second port of that name.
TEST(Topology, OddValuesStayUsable) {
  auto root = xml::parse("<system><cpu numaid=\"0\"><nic><net name=\"0000:01:00.0\" speed=\"1000\"/></nic>"
                         "<pci busid=\"0000:01:00.0\" class=\"0x020000\" link_speed=\"nan\" link_width=\"16\"/>"
                         "<pci busid=\"0000:02:00.0\" class=\"0x030000\" link_speed=\"1e308 GT/s\" link_width=\"99999\"/>"
                         "</cpu></system>",
                         "odd.xml");
  ASSERT_TRUE(root.isOk()) << root.status().message();
  auto t = fromXml(std::move(root).value(), "odd.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->ofType(NodeType::kNet).size(), 1u);
  for (const auto& l : t->links) {
    EXPECT_TRUE(std::isfinite(l.gbs)) << linkTypeName(l.type);
    if (l.type == LinkType::kPci) EXPECT_EQ(l.gbs, 24.0);
  }
}

TEST(Topology, Helpers) {
  EXPECT_EQ(normalizeBusId("0000:1A:00.0"), "0000:1a:00.0");
  EXPECT_EQ(normalizeBusId("1a:00.0"), "0000:1a:00.0");
  EXPECT_EQ(normalizeBusId("00000000:1a:00.0"), "0000:1a:00.0");
  EXPECT_EQ(normalizeBusId("1:0.0"), "0000:1:0.0");
  EXPECT_NEAR(pciGBs("16 GT/s", 16), 31.5, 0.1);
  EXPECT_NEAR(pciGBs("2.5 GT/s PCIe", 1), 0.25, 0.001);
  EXPECT_EQ(pciGBs("", 16), 0);
  EXPECT_EQ(pciGBs("8 GT/s", 0), 0);
  Topology t = load("dgx-h100-like.xml");
  const std::string text = describe(t);
  EXPECT_NE(text.find("2 NUMA node(s), 8 GPU(s), 9 NIC port(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("net mlx5_7, 400.0 Gbit/s, infiniband"), std::string::npos) << text;
}

}  // namespace
}  // namespace loom::topology
