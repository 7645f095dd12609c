// The machine one rank runs on, as plain data: CPUs (one node per NUMA
// node), the PCI tree, GPUs, NICs and NVSwitches, joined by links that carry
// a bandwidth. A Topology is built from an XML tree in NCCL's topology
// format, whether that tree was detected (detect.h) or loaded from
// NCCL_TOPO_FILE; the tree is kept, so a dump writes back what was read,
// attributes loom does not know included.
//
// What loom reads (everything else is kept and ignored):
//   <system version>                      the root
//   <cpu numaid affinity arch vendor familyid modelid
//        loom_package loom_cores loom_caches>       one NUMA node
//   <pci busid class link_speed link_width vendor device>
//        class 0x03xxxx is a GPU, 0x02xxxx a NIC, 0x0604xx a bridge or
//        switch, 0x068000 an NVSwitch; children are what sits behind it
//   <gpu dev sm rank gdr>                  inside a <pci>
//   <nvlink target count tclass>           inside a <gpu>: links to the
//        GPU or NVSwitch with PCI id `target`; a target that is the GPU
//        itself or unknown is kept and not linked
//   <nic> and <net name dev speed port guid gdr loom_link>   speed in Mbit/s;
//        a <nic> is a child of a <pci> (a PCI NIC) or of a <cpu> (virtual)
// loom_* attributes are loom's own (NCCL ignores them): the package a NUMA
// node belongs to, its core count, its caches as level:bytes pairs
// ("1:49152,2:2097152,3:33554432"), and a net's link layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/xml.h"

namespace loom::topology {

enum class NodeType { kCpu, kPci, kGpu, kNet, kNvSwitch };

inline constexpr uint32_t kNvidiaVendor = 0x10de;
// A PCI function of class 0x03 (display, 3D controller) made by NVIDIA.
constexpr bool isNvidiaGpu(uint32_t cls, uint32_t vendor) { return (cls >> 16) == 0x03 && vendor == kNvidiaVendor; }
const char* nodeTypeName(NodeType t);

struct Cache {
  int level = 0;
  uint64_t bytes = 0;
  friend bool operator==(const Cache&, const Cache&) = default;
};

struct Node {
  NodeType type = NodeType::kCpu;
  std::string id;    // cpu: "cpu<numa>", pci/gpu/nvswitch: bus id, net: name
  int numa = -1;     // the NUMA node it belongs to (-1: none known)
  int parent = -1;   // node above it in the PCI tree (a cpu or pci node)
  std::string busId; // pci, gpu, nvswitch, and a net on a PCI NIC
  // cpu
  std::string arch, vendor, affinity;
  int package = -1;
  int cores = 0;
  std::vector<Cache> caches;
  // gpu
  int dev = -1;
  int sm = 0;
  // net
  uint64_t speedMbps = 0;
  int port = 0;
  std::string linkLayer;  // "ethernet", "infiniband" or ""
  friend bool operator==(const Node&, const Node&) = default;
};

enum class LinkType { kPci, kNvLink, kSys, kNet };
const char* linkTypeName(LinkType t);

struct Link {
  int a = -1, b = -1;
  LinkType type = LinkType::kPci;
  double gbs = 0;  // GB/s each way
  int count = 1;   // NVLinks in this link
  friend bool operator==(const Link&, const Link&) = default;
};

struct Topology {
  std::string source;  // "hwloc", "sysfs", or the file it was loaded from
  xml::Element xml;    // <system>, as detected or loaded
  std::vector<Node> nodes;
  std::vector<Link> links;

  std::vector<int> ofType(NodeType t) const;
  int find(NodeType t, const std::string& id) const;
  // Node indices from `n` up to its CPU, n first.
  std::vector<int> pathUp(int n) const;
  int numaCount() const { return int(ofType(NodeType::kCpu).size()); }
};

// Builds the graph from <system>. `origin` names the file in errors, which
// also give the element and its line: "f.xml:12: <pci busid="x">: ...".
Result<Topology> fromXml(xml::Element system, std::string origin);
Result<Topology> loadFile(const std::string& path);
Status dumpFile(const Topology& topo, const std::string& path);

// PCI bus ids are compared in one spelling: lower case, 4-digit domain.
std::string normalizeBusId(std::string id);
// GB/s of a PCI link ("16 GT/s", width 16); 0 when the speed is unknown.
double pciGBs(const std::string& linkSpeed, int width);
// GB/s of one NVLink of a GPU with compute capability `sm` (times 10).
double nvlinkGBs(int sm);

// A human-readable summary, one line per node, indented by tree depth.
std::string describe(const Topology& topo);

}  // namespace loom::topology
