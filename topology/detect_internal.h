// What the detection back ends (sysfs, hwloc, NVML) hand to detect.cc,
// which turns it into NCCL's XML.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/topology.h"

namespace loom::topology::detail {

struct CpuSet {
  int numa = 0;
  std::vector<int> cpus;
  int package = -1;
  int cores = 0;
  std::vector<Cache> caches;
};

struct PciFunction {
  std::string busId;   // normalized
  std::string parent;  // the bridge above it, "" at a root port
  int numa = -1;
  uint32_t cls = 0;    // 24-bit class code
  uint32_t vendor = 0, device = 0, subVendor = 0, subDevice = 0;
  std::string linkSpeed;  // "16.0 GT/s PCIe", "" unknown
  int linkWidth = 0;
};

struct NetPort {
  std::string name;
  std::string busId;  // "" for a virtual interface
  uint64_t speedMbps = 0;
  int port = 0;
  int dev = 0;
  std::string linkLayer;  // ethernet, infiniband, roce
};

struct GpuInfo {
  std::string busId;
  int dev = -1;
  int sm = 0;
  std::map<std::string, std::pair<int, uint32_t>> nvlinks;  // target -> (count, target class)
};

struct Machine {
  std::string source;
  std::string arch, vendor;
  int family = -1, model = -1;
  std::vector<CpuSet> numa;
  std::vector<PciFunction> pci;
};

// CPUs and PCI from sysfs or hwloc; NICs from sysfs; GPUs from NVML.
Result<Machine> sysfsMachine(const std::string& sysRoot);
Result<Machine> hwlocMachine();
std::vector<NetPort> sysfsNets(const std::string& sysRoot);
std::vector<GpuInfo> nvmlGpus();

// Shared by both CPU back ends: vendor and model from /proc/cpuinfo.
void cpuIdentity(Machine* m);
// The first line of a (sysfs) file, trailing blanks removed; "" when unreadable.
std::string readLine(const std::string& path);
// The NUMA node that holds `cpu`, -1 when sysfs does not say.
int numaOfCpu(const std::string& sysRoot, int cpu);
// NCCL's affinity spelling: 32-bit hex groups, most significant first.
std::string affinityMask(const std::vector<int>& cpus);

}  // namespace loom::topology::detail
