// Detection of the machine this process runs on, as a Topology in NCCL's
// XML form. CPUs, NUMA nodes, caches and the PCI tree come from hwloc
// (libhwloc.so.15, loaded at run time) where it loads, otherwise from sysfs;
// NIC ports (speed, link layer) always from sysfs (/sys/class/net and
// /sys/class/infiniband); GPUs, their compute capability and NVLinks from
// NVML (libnvidia-ml.so.1, loaded at run time) where a driver is present.
// None of these libraries is needed to build or load loom.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/topology.h"

namespace loom::topology {

struct DetectOptions {
  // "auto" (hwloc, else sysfs), "hwloc" (fail without it) or "sysfs".
  std::string method = "auto";
  // Where sysfs is mounted; tests point this at a tree of their own.
  std::string sysRoot = "/sys";
  bool useNvml = true;
};

// The topology's source says which method ran ("hwloc" or "sysfs").
Result<Topology> detect(const DetectOptions& options = {});

// This process's machine: loaded from NCCL_TOPO_FILE when set, otherwise
// detected as LOOM_TOPO_DETECT says. Done once per (file, method) and
// shared; which source was used is logged (INFO, GRAPH).
Result<std::shared_ptr<const Topology>> localTopology();

// The NUMA node whose CPUs include the CPUs this thread may run on (the
// first of them), -1 when sysfs has no NUMA information.
int currentNumaNode(const std::string& sysRoot = "/sys");

// The CPUs this thread may run on (sched_getaffinity): bit c of word c / 64.
std::vector<uint64_t> currentCpuMask();

// Whether the ranks of one host that `masks` describe (each rank's
// currentCpuMask()) have more ranks than CPUs where rank `me` runs: every
// rank spreads evenly over the CPUs of its mask, and `me`'s CPUs carry more
// than one rank on average. Unbound ranks (all CPUs each): more ranks than
// CPUs. Ranks bound a CPU each: shared only where two share one. An empty
// mask (not known) counts as every CPU in any mask.
bool cpusShared(const std::vector<std::vector<uint64_t>>& masks, size_t me);

}  // namespace loom::topology
