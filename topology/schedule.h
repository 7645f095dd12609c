// Rings and trees over the ranks of a cluster, built from each host's
// topology. Pure functions of (hosts, rank placement): no communicator, no
// network, so every layout can be built and checked in a test, and every
// rank of a communicator computes the same schedule from the same table.
//
// Rings: the ranks of a host are consecutive on every ring (a ring enters
// and leaves each host once), ordered inside the host by NUMA node and PCI
// path. There is one ring per NIC a host can use (the fewest any host has,
// at least one); ring c leaves every host through that host's NIC c, from
// the rank closest to it.
// Trees: two binary trees over the hosts, the second the first shifted by
// one position, so that no host is interior in both (each host has its
// children in at most one tree); inside a host the ranks form a chain that
// hangs from the rank closest to the tree's NIC.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/topology.h"

namespace loom::topology {

// What the schedules need to know about a host's NICs and a rank's place.
struct NicPlace {
  std::string name;
  uint64_t speedMbps = 0;
  int numa = -1;
  std::vector<std::string> pciPath;  // bus ids from the CPU down; empty for a virtual NIC
  friend bool operator==(const NicPlace&, const NicPlace&) = default;
};
struct HostPlace {
  std::string name;
  std::vector<NicPlace> nics;
  friend bool operator==(const HostPlace&, const HostPlace&) = default;
};
struct RankPlace {
  int host = 0;   // index into Layout::hosts
  int numa = -1;  // NUMA node it runs on (-1: unknown)
  std::vector<std::string> pciPath;  // down to its GPU; empty for a CPU rank
  friend bool operator==(const RankPlace&, const RankPlace&) = default;
};
struct Layout {
  std::vector<HostPlace> hosts;
  std::vector<RankPlace> ranks;  // by rank
};

struct Ring {
  std::vector<int> order;            // ranks, each once
  std::vector<std::string> exitNic;  // per host: the NIC the ring leaves through ("" for none)
};
struct Tree {
  int root = -1;
  std::vector<int> parent;                 // per rank, -1 at the root
  std::vector<std::vector<int>> children;  // per rank
  std::vector<std::string> nic;            // per host: the NIC its head rank uses
};
struct Schedule {
  std::vector<Ring> rings;
  std::array<Tree, 2> trees;
};

// The NICs of a topology and where they sit.
HostPlace hostPlace(const Topology& topo, std::string name);
// The NICs rings and trees use, in the order channels take them: the
// fastest first, alternating between NUMA nodes; NICs slower than a quarter
// of the fastest (management ports) are left out.
std::vector<std::string> usableNics(const HostPlace& host);
// A rank that uses the GPU with this bus id, or one that runs on `numa`.
Result<RankPlace> gpuRank(const Topology& topo, int host, const std::string& busId);
RankPlace cpuRank(int host, int numa);
// Ranks spread over each host as a launcher would: `perHost` ranks on host
// h, on the host's GPUs in order where it has them (wrapping around),
// otherwise over its NUMA nodes in turn.
Layout spreadLayout(const std::vector<Topology>& hosts, int perHost);

Schedule buildSchedule(const Layout& layout);
// Checks the properties promised above; the message names the first broken one.
Status checkSchedule(const Layout& layout, const Schedule& schedule);
// Tree depth counted in hosts crossed, root to deepest rank.
int hostDepth(const Layout& layout, const Tree& tree);
// What plans take (core::PlanParams::rings, ::trees): each ring's order,
// each tree's parent vector.
std::vector<std::vector<int>> ringOrders(const Schedule& s);
std::vector<std::vector<int>> treeParents(const Schedule& s);

// NCCL's GRAPH log lines: "Channel 00/02 :    0   1 ..." per ring, and per
// rank "Trees [0] c/c/c->r->p [1] ...".
std::vector<std::string> ringLines(const Schedule& s);
std::string treeLine(const Schedule& s, int rank);

// Graphviz pictures: a machine, and a schedule (hosts as clusters, rings as
// coloured cycles, trees dashed).
std::string topologyDot(const Topology& topo);
std::string scheduleDot(const Layout& layout, const Schedule& s);

}  // namespace loom::topology
