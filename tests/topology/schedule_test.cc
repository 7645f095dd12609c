#include "topology/schedule.h"

#include <gtest/gtest.h>

#include <set>

namespace loom::topology {
namespace {

Topology load(const char* name) {
  auto t = loadFile(std::string(LOOM_TOPO_FIXTURES) + "/" + name);
  EXPECT_TRUE(t.isOk()) << t.status().message();
  return t.isOk() ? std::move(t).value() : Topology{};
}

Layout hostsOf(const char* fixture, int hosts, int perHost) {
  return spreadLayout(std::vector<Topology>(size_t(hosts), load(fixture)), perHost);
}

Schedule checked(const Layout& layout) {
  Schedule s = buildSchedule(layout);
  Status st = checkSchedule(layout, s);
  EXPECT_TRUE(st.isOk()) << st.message();
  return s;
}

TEST(Schedule, FourDgxHostsOfEight) {
  Layout layout = hostsOf("dgx-h100-like.xml", 4, 8);
  Schedule s = checked(layout);
  ASSERT_EQ(s.rings.size(), 8u);  // eight 400G NICs; the 25G port is not used
  std::set<std::string> exits;
  for (size_t c = 0; c < s.rings.size(); ++c) {
    const auto& o = s.rings[c].order;
    // Inside each host the ring leaves from the GPU beside the ring's NIC
    // (rank 8h+g sits on GPU g, beside mlx5_g).
    for (int h = 0; h < 4; ++h) {
      const std::string nic = s.rings[c].exitNic[size_t(h)];
      exits.insert(nic);
      const int last = o[size_t(8 * h + 7)];
      EXPECT_EQ(last / 8, h);
      EXPECT_EQ("mlx5_" + std::to_string(last % 8), nic) << "ring " << c << " host " << h;
    }
  }
  EXPECT_EQ(exits.size(), 8u);
  EXPECT_LE(hostDepth(layout, s.trees[0]), 3);
  // Two trees use different NICs of each host.
  EXPECT_NE(s.trees[0].nic[0], s.trees[1].nic[0]);
}

TEST(Schedule, TwoCpuHostsOfThree) {
  Layout layout = hostsOf("cpu-2socket.xml", 2, 3);
  Schedule s = checked(layout);
  ASSERT_EQ(s.rings.size(), 2u);  // the 1 GbE port is left out
  for (const auto& ring : s.rings) {
    // Each host's ranks stay together, ordered by NUMA node.
    EXPECT_EQ(layout.ranks[size_t(ring.order[0])].host, layout.ranks[size_t(ring.order[2])].host);
  }
  EXPECT_NE(s.rings[0].exitNic[0], s.rings[1].exitNic[0]);
  // Ranks 0 and 2 are on NUMA node 0, rank 1 on node 1: a ring leaving
  // through the NIC on node 1 leaves from rank 1.
  for (const auto& ring : s.rings) {
    const int exitRank = ring.order[2];
    const int exitNuma = layout.ranks[size_t(exitRank)].numa;
    EXPECT_EQ(ring.exitNic[0] == "ens2f0" ? 1 : 0, exitNuma) << ring.exitNic[0];
  }
}

TEST(Schedule, OneHostOfFive) {
  for (const char* fixture : {"dgx-h100-like.xml", "cpu-2socket.xml", "cloud-vm-a100.xml", "cloud-vm-v100.xml"}) {
    SCOPED_TRACE(fixture);
    Layout layout = hostsOf(fixture, 1, 5);
    Schedule s = checked(layout);
    EXPECT_EQ(s.trees[0].root >= 0, true);
    // One host: the trees are chains.
    EXPECT_EQ(hostDepth(layout, s.trees[0]), 0);
  }
}

TEST(Schedule, SixtyFourDgxHostsOfEight) {
  Layout layout = hostsOf("dgx-h100-like.xml", 64, 8);
  Schedule s = checked(layout);
  EXPECT_EQ(s.rings.size(), 8u);
  EXPECT_LE(hostDepth(layout, s.trees[0]), 7);
  EXPECT_LE(hostDepth(layout, s.trees[1]), 7);
}

// The tree properties for every host count up to 300, one rank and two
// ranks per host, and hosts of different NIC counts.
TEST(Schedule, TreesForEveryHostCount) {
  for (int hosts = 1; hosts <= 300; ++hosts) {
    for (int per : {1, 2}) {
      Layout layout;
      for (int h = 0; h < hosts; ++h) {
        layout.hosts.push_back(HostPlace{"h" + std::to_string(h), {}});
        for (int i = 0; i < per; ++i) layout.ranks.push_back(cpuRank(h, 0));
      }
      Schedule s = buildSchedule(layout);
      Status st = checkSchedule(layout, s);
      ASSERT_TRUE(st.isOk()) << hosts << " hosts x " << per << ": " << st.message();
    }
  }
}

TEST(Schedule, RanksInterleavedOverHostsStayTogether) {
  // Ranks 0,2,4 on host 0 and 1,3,5 on host 1, as a launcher may number them.
  Layout layout;
  for (int h = 0; h < 2; ++h) layout.hosts.push_back(hostPlace(load("cpu-2socket.xml"), "h" + std::to_string(h)));
  for (int r = 0; r < 6; ++r) layout.ranks.push_back(cpuRank(r % 2, (r / 2) % 2));
  Schedule s = checked(layout);
  EXPECT_EQ(s.rings.size(), 2u);
}

TEST(Schedule, HostsWithDifferentNicCounts) {
  std::vector<Topology> topos{load("dgx-h100-like.xml"), load("cloud-vm-a100.xml")};
  Layout layout = spreadLayout(topos, 4);
  Schedule s = checked(layout);
  EXPECT_EQ(s.rings.size(), 1u);  // the VM has one NIC
}

TEST(Schedule, CheckCatchesBrokenSchedules) {
  Layout layout = hostsOf("cpu-2socket.xml", 2, 3);
  Schedule s = buildSchedule(layout);
  Schedule split = s;
  std::swap(split.rings[0].order[1], split.rings[0].order[4]);  // host 0's ranks no longer together
  EXPECT_FALSE(checkSchedule(layout, split).isOk());
  Schedule twice = s;
  twice.rings[0].order[1] = twice.rings[0].order[0];
  EXPECT_FALSE(checkSchedule(layout, twice).isOk());
  Schedule sameNic = s;
  sameNic.rings[1].exitNic = sameNic.rings[0].exitNic;
  EXPECT_FALSE(checkSchedule(layout, sameNic).isOk());
  Schedule wrongExit = s;
  std::swap(wrongExit.rings[0].exitNic, wrongExit.rings[1].exitNic);  // each leaves from the other socket
  EXPECT_FALSE(checkSchedule(layout, wrongExit).isOk());
  Schedule badChild = s;
  badChild.trees[1].children[0].push_back(99);
  EXPECT_FALSE(checkSchedule(layout, badChild).isOk());
  Schedule loop = s;
  const int child = loop.trees[0].children[size_t(loop.trees[0].root)][0];
  loop.trees[0].parent[size_t(loop.trees[0].root)] = child;
  EXPECT_FALSE(checkSchedule(layout, loop).isOk());
}

TEST(Schedule, LogLinesInNcclStyle) {
  Layout layout = hostsOf("cpu-2socket.xml", 2, 2);
  Schedule s = buildSchedule(layout);
  auto lines = ringLines(s);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("Channel 00/02 :", 0), 0u) << lines[0];
  const std::string t = treeLine(s, s.trees[0].root);
  EXPECT_NE(t.find("[0] "), std::string::npos);
  EXPECT_NE(t.find("->" + std::to_string(s.trees[0].root) + "->-1"), std::string::npos) << t;
  const std::string dot = scheduleDot(layout, s);
  EXPECT_NE(dot.find("subgraph cluster_h1"), std::string::npos);
}

}  // namespace
}  // namespace loom::topology
