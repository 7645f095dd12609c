#include "topology/detect.h"

#include <dirent.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "common/log.h"
#include "common/settings.h"
#include "topology/detect_internal.h"

namespace loom::topology {
namespace detail {
namespace {


long long readNumber(const std::string& path, long long fallback) {
  const std::string s = readLine(path);
  if (s.empty()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  return end == s.c_str() ? fallback : v;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    int a = -1, b = -1;
    const std::string item = text.substr(at, comma - at);
    if (std::sscanf(item.c_str(), "%d-%d", &a, &b) == 2) {
      for (int c = a; c <= b && c - a < 65536; ++c) out.push_back(c);
    } else if (std::sscanf(item.c_str(), "%d", &a) == 1) {
      out.push_back(a);
    }
    at = comma + 1;
  }
  return out;
}

bool looksLikeBusId(const std::string& s) {
  unsigned dom, bus, dev, fn;
  char extra;
  return std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &extra) == 4;
}

// The PCI function a sysfs device path lives under (the last component that
// is a bus id), and the one above it.
std::pair<std::string, std::string> pciOfPath(const std::string& real) {
  std::string last, above;
  size_t at = 0;
  while (at < real.size()) {
    size_t slash = real.find('/', at);
    if (slash == std::string::npos) slash = real.size();
    const std::string part = real.substr(at, slash - at);
    if (looksLikeBusId(part)) {
      above = last;
      last = normalizeBusId(part);
    }
    at = slash + 1;
  }
  return {last, above};
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) return "";
  return buf;
}

// Caches seen from one CPU: data and unified caches, by level.
std::vector<Cache> cachesOf(const std::string& sysRoot, int cpu) {
  std::vector<Cache> out;
  const std::string base = sysRoot + "/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache";
  for (const auto& idx : listDir(base)) {
    if (idx.rfind("index", 0) != 0) continue;
    const std::string type = readLine(base + "/" + idx + "/type");
    if (type == "Instruction") continue;
    const int level = int(readNumber(base + "/" + idx + "/level", 0));
    std::string size = readLine(base + "/" + idx + "/size");
    unsigned long long bytes = 0;
    char unit = 0;
    if (std::sscanf(size.c_str(), "%llu%c", &bytes, &unit) >= 1) {
      if (unit == 'K') bytes <<= 10;
      if (unit == 'M') bytes <<= 20;
      if (unit == 'G') bytes <<= 30;
    }
    if (level > 0 && bytes > 0) out.push_back(Cache{level, bytes});
  }
  std::sort(out.begin(), out.end(), [](const Cache& a, const Cache& b) { return a.level < b.level; });
  return out;
}

}  // namespace

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

int numaOfCpu(const std::string& sysRoot, int cpu) {
  const std::string nodes = sysRoot + "/devices/system/node";
  for (const auto& n : listDir(nodes)) {
    int id = -1;
    char extra;
    if (std::sscanf(n.c_str(), "node%d%c", &id, &extra) != 1) continue;
    const auto cpus = parseCpuList(readLine(nodes + "/" + n + "/cpulist"));
    if (std::find(cpus.begin(), cpus.end(), cpu) != cpus.end()) return id;
  }
  return -1;
}

std::string affinityMask(const std::vector<int>& cpus) {
  int top = 0;
  for (int c : cpus) top = std::max(top, c);
  std::vector<uint32_t> words(size_t(top / 32 + 1), 0);
  for (int c : cpus) {
    if (c >= 0) words[size_t(c / 32)] |= 1u << (c % 32);
  }
  std::string out;
  char buf[16];
  for (size_t i = words.size(); i-- > 0;) {
    std::snprintf(buf, sizeof buf, "%08x", words[i]);
    if (!out.empty()) out += ",";
    out += buf;
  }
  return out;
}

void cpuIdentity(Machine* m) {
  struct utsname u {};
  if (uname(&u) == 0) m->arch = u.machine;
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2 <= line.size() ? line.find(':') + 2 : line.size()); };
    if (line.find(':') == std::string::npos) continue;
    if (m->vendor.empty() && line.rfind("vendor_id", 0) == 0) m->vendor = value();
    if (m->family < 0 && line.rfind("cpu family", 0) == 0) m->family = std::atoi(value().c_str());
    if (m->model < 0 && line.rfind("model\t", 0) == 0) m->model = std::atoi(value().c_str());
  }
}

Result<Machine> sysfsMachine(const std::string& sysRoot) {
  Machine m;
  m.source = "sysfs";
  cpuIdentity(&m);
  const std::string nodes = sysRoot + "/devices/system/node";
  for (const auto& n : listDir(nodes)) {
    int id = -1;
    char extra;
    if (std::sscanf(n.c_str(), "node%d%c", &id, &extra) != 1) continue;
    CpuSet set;
    set.numa = id;
    set.cpus = parseCpuList(readLine(nodes + "/" + n + "/cpulist"));
    if (set.cpus.empty()) continue;  // memory-only nodes hold no rank
    m.numa.push_back(std::move(set));
  }
  if (m.numa.empty()) {
    // No NUMA support in the kernel: one node with every online CPU.
    CpuSet all;
    all.cpus = parseCpuList(readLine(sysRoot + "/devices/system/cpu/online"));
    if (all.cpus.empty()) all.cpus.push_back(0);
    m.numa.push_back(std::move(all));
  }
  for (auto& set : m.numa) {
    const std::string topo = sysRoot + "/devices/system/cpu/cpu" + std::to_string(set.cpus[0]) + "/topology";
    set.package = int(readNumber(topo + "/physical_package_id", -1));
    std::set<std::pair<long long, long long>> cores;
    for (int c : set.cpus) {
      const std::string t = sysRoot + "/devices/system/cpu/cpu" + std::to_string(c) + "/topology";
      cores.insert({readNumber(t + "/physical_package_id", -1), readNumber(t + "/core_id", c)});
    }
    set.cores = int(cores.size());
    set.caches = cachesOf(sysRoot, set.cpus[0]);
  }
  const std::string devices = sysRoot + "/bus/pci/devices";
  for (const auto& d : listDir(devices)) {
    if (!looksLikeBusId(d)) continue;
    const std::string dir = devices + "/" + d;
    PciFunction f;
    const auto [self, parent] = pciOfPath(realPath(dir));
    f.busId = self.empty() ? normalizeBusId(d) : self;
    f.parent = parent;
    f.numa = int(readNumber(dir + "/numa_node", -1));
    f.cls = uint32_t(readNumber(dir + "/class", 0));
    f.vendor = uint32_t(readNumber(dir + "/vendor", 0));
    f.device = uint32_t(readNumber(dir + "/device", 0));
    f.subVendor = uint32_t(readNumber(dir + "/subsystem_vendor", 0));
    f.subDevice = uint32_t(readNumber(dir + "/subsystem_device", 0));
    f.linkSpeed = readLine(dir + "/current_link_speed");
    if (f.linkSpeed.find("Unknown") != std::string::npos) f.linkSpeed.clear();
    f.linkWidth = int(readNumber(dir + "/current_link_width", 0));
    m.pci.push_back(std::move(f));
  }
  return m;
}

std::vector<NetPort> sysfsNets(const std::string& sysRoot) {
  std::vector<NetPort> out;
  // InfiniBand and RoCE ports.
  const std::string ib = sysRoot + "/class/infiniband";
  int dev = 0;
  for (const auto& hca : listDir(ib)) {
    const std::string busId = pciOfPath(realPath(ib + "/" + hca + "/device")).first;
    for (const auto& p : listDir(ib + "/" + hca + "/ports")) {
      const std::string port = ib + "/" + hca + "/ports/" + p;
      if (readLine(port + "/state").find("ACTIVE") == std::string::npos) continue;
      NetPort n;
      n.port = std::atoi(p.c_str());
      n.name = n.port <= 1 ? hca : hca + ":" + p;
      n.busId = busId;
      n.dev = dev++;
      double gbits = 0;
      std::sscanf(readLine(port + "/rate").c_str(), "%lf", &gbits);
      n.speedMbps = uint64_t(gbits * 1000);
      n.linkLayer = readLine(port + "/link_layer") == "Ethernet" ? "roce" : "infiniband";
      out.push_back(std::move(n));
    }
  }
  // Network interfaces that are up (not loopback, not docker bridges).
  const std::string net = sysRoot + "/class/net";
  for (const auto& ifname : listDir(net)) {
    if (ifname == "lo" || ifname.rfind("docker", 0) == 0) continue;
    const std::string state = readLine(net + "/" + ifname + "/operstate");
    if (state != "up" && state != "unknown") continue;
    NetPort n;
    n.name = ifname;
    n.busId = pciOfPath(realPath(net + "/" + ifname + "/device")).first;
    n.dev = dev++;
    const long long speed = readNumber(net + "/" + ifname + "/speed", -1);
    n.speedMbps = speed > 0 ? uint64_t(speed) : 10000;  // virtual interfaces report none
    n.linkLayer = readNumber(net + "/" + ifname + "/type", 1) == 32 ? "infiniband" : "ethernet";
    out.push_back(std::move(n));
  }
  return out;
}

namespace {

char hexDigit(uint32_t v) { return "0123456789abcdef"[v & 15]; }
std::string hex(uint32_t v, int digits) {
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += hexDigit(v >> (4 * i));
  return s;
}

void addNet(xml::Element& nic, const NetPort& n) {
  xml::Element& e = nic.add("net");
  e.set("name", n.name);
  e.set("dev", std::to_string(n.dev));
  e.set("speed", std::to_string(n.speedMbps));
  e.set("port", std::to_string(n.port));
  e.set("loom_link", n.linkLayer);
}

// Builds NCCL's XML: a <cpu> per NUMA node, below it the PCI functions that
// matter (GPUs, NICs, NVSwitches) with the bridges above them, NIC ports in
// <nic><net>, GPUs in <gpu> with their <nvlink>s.
xml::Element toXml(const Machine& m, const std::vector<NetPort>& nets, const std::vector<GpuInfo>& gpus) {
  std::map<std::string, const PciFunction*> byId;
  for (const auto& f : m.pci) byId[f.busId] = &f;
  std::map<std::string, const GpuInfo*> gpuById;
  for (const auto& g : gpus) gpuById[g.busId] = &g;
  std::set<std::string> keep;
  auto keepWithParents = [&](const std::string& id) {
    for (std::string at = id; !at.empty() && !keep.count(at);) {
      keep.insert(at);
      auto it = byId.find(at);
      at = it == byId.end() ? "" : it->second->parent;
    }
  };
  for (const auto& f : m.pci) {
    // NVIDIA display and 3D controllers, and bridges of class 0x0680
    // (NVSwitch): a server's management VGA (ASPEED, Matrox) is no GPU.
    if (isNvidiaGpu(f.cls, f.vendor) || (f.cls >> 8) == 0x0680) keepWithParents(f.busId);
  }
  for (const auto& n : nets) {
    if (!n.busId.empty()) keepWithParents(n.busId);
  }
  for (const auto& g : gpus) keepWithParents(g.busId);

  xml::Element system;
  system.name = "system";
  system.set("version", "1");
  std::map<int, size_t> cpuAt;
  for (const auto& set : m.numa) {
    xml::Element& cpu = system.add("cpu");
    cpu.set("numaid", std::to_string(set.numa));
    cpu.set("affinity", affinityMask(set.cpus));
    if (!m.arch.empty()) cpu.set("arch", m.arch);
    if (!m.vendor.empty()) cpu.set("vendor", m.vendor);
    if (m.family >= 0) cpu.set("familyid", std::to_string(m.family));
    if (m.model >= 0) cpu.set("modelid", std::to_string(m.model));
    if (set.package >= 0) cpu.set("loom_package", std::to_string(set.package));
    if (set.cores > 0) cpu.set("loom_cores", std::to_string(set.cores));
    std::string caches;
    for (const auto& c : set.caches) {
      if (!caches.empty()) caches += ",";
      caches += std::to_string(c.level) + ":" + std::to_string(c.bytes);
    }
    if (!caches.empty()) cpu.set("loom_caches", caches);
    cpuAt[set.numa] = system.children.size() - 1;
  }
  const int firstNuma = m.numa.empty() ? 0 : m.numa[0].numa;
  auto cpuFor = [&](int numa) -> xml::Element& {
    auto it = cpuAt.find(numa);
    return system.children[it == cpuAt.end() ? cpuAt[firstNuma] : it->second];
  };
  auto addNets = [&](xml::Element& parent, const std::string& busId) {
    xml::Element* nic = nullptr;
    for (const auto& n : nets) {
      if (n.busId != busId) continue;
      if (!nic) nic = &parent.add("nic");
      addNet(*nic, n);
    }
  };
  // Children of each kept function, in bus-id order.
  std::map<std::string, std::vector<const PciFunction*>> below;
  for (const auto& f : m.pci) {
    // Under its parent when that is listed and kept, else at the top.
    const bool underParent = byId.count(f.parent) && keep.count(f.parent);
    if (keep.count(f.busId)) below[underParent ? f.parent : ""].push_back(&f);
  }
  std::function<void(xml::Element&, const PciFunction&)> addPci = [&](xml::Element& parent, const PciFunction& f) {
    xml::Element& e = parent.add("pci");
    e.set("busid", f.busId);
    e.set("class", hex(f.cls, 6));
    e.set("vendor", hex(f.vendor, 4));
    e.set("device", hex(f.device, 4));
    e.set("subsystem_vendor", hex(f.subVendor, 4));
    e.set("subsystem_device", hex(f.subDevice, 4));
    e.set("link_speed", f.linkSpeed);
    e.set("link_width", std::to_string(f.linkWidth));
    if (auto g = gpuById.find(f.busId); g != gpuById.end()) {
      xml::Element& gpu = e.add("gpu");
      gpu.set("dev", std::to_string(g->second->dev));
      gpu.set("sm", std::to_string(g->second->sm));
      for (const auto& [target, link] : g->second->nvlinks) {
        xml::Element& l = gpu.add("nvlink");
        l.set("target", target);
        l.set("count", std::to_string(link.first));
        l.set("tclass", hex(link.second, 6));
      }
    }
    for (const PciFunction* c : below[f.busId]) addPci(e, *c);
    addNets(e, f.busId);
  };
  for (const PciFunction* f : below[""]) addPci(cpuFor(f->numa), *f);
  // GPUs NVML knows that sysfs did not list (containers hide some of /sys).
  for (const auto& g : gpus) {
    if (byId.count(g.busId)) continue;
    PciFunction f;
    f.busId = g.busId;
    f.cls = 0x030200;
    f.vendor = 0x10de;
    addPci(cpuFor(firstNuma), f);
  }
  // Interfaces with no PCI function (virtual, or a PCI tree we cannot see).
  for (const auto& n : nets) {
    if (n.busId.empty() || !byId.count(n.busId)) {
      xml::Element& cpu = cpuFor(firstNuma);
      xml::Element* nic = nullptr;
      for (auto& c : cpu.children) {
        if (c.name == "nic") nic = &c;
      }
      addNet(nic ? *nic : cpu.add("nic"), n);
    }
  }
  return system;
}

}  // namespace
}  // namespace detail

Result<Topology> detect(const DetectOptions& options) {
  using namespace detail;
  Result<Machine> machine = internalError("no detection method ran");
  if (options.method == "hwloc" || options.method == "auto") {
    machine = hwlocMachine();
    if (!machine.isOk() && options.method == "hwloc") return machine.takeStatus();
  }
  if (!machine.isOk()) {
    if (options.method != "auto" && options.method != "sysfs") {
      return invalidArgument("unknown topology detection method '" + options.method + "' (auto, hwloc or sysfs)");
    }
    machine = sysfsMachine(options.sysRoot);
    if (!machine.isOk()) return machine.takeStatus();
  }
  const auto nets = sysfsNets(options.sysRoot);
  const auto gpus = options.useNvml ? nvmlGpus() : std::vector<GpuInfo>{};
  const std::string source = machine->source;
  return fromXml(toXml(machine.value(), nets, gpus), source);
}

Result<std::shared_ptr<const Topology>> localTopology() {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const Topology>> cache;
  auto cfg = settings::current();
  const std::string file = cfg->getString("NCCL_TOPO_FILE");
  const std::string method = cfg->getString("LOOM_TOPO_DETECT");
  const std::string key = file + "\n" + method;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  Result<Topology> topo = internalError("unset");
  if (!file.empty()) {
    topo = loadFile(file);
    if (!topo.isOk()) return topo.takeStatus().addContext("loading NCCL_TOPO_FILE");
  } else {
    DetectOptions options;
    options.method = method;
    topo = detect(options);
    if (!topo.isOk()) return topo.takeStatus().addContext("detecting the topology (LOOM_TOPO_DETECT=" + method + ")");
  }
  auto shared = std::make_shared<const Topology>(std::move(topo).value());
  LOOM_INFO(log::kGraph, "topology %s %s: %d NUMA node(s), %zu GPU(s), %zu NIC port(s)",
            file.empty() ? "detected with" : "loaded from", shared->source.c_str(), shared->numaCount(),
            shared->ofType(NodeType::kGpu).size(), shared->ofType(NodeType::kNet).size());
  cache[key] = shared;
  return shared;
}

int currentNumaNode(const std::string& sysRoot) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &set)) first = c;
  }
  return first < 0 ? -1 : detail::numaOfCpu(sysRoot, first);
}

std::vector<uint64_t> currentCpuMask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<uint64_t> mask;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return mask;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    mask.resize(std::max(mask.size(), size_t(c / 64 + 1)), 0);
    mask[size_t(c / 64)] |= uint64_t(1) << (c % 64);
  }
  return mask;
}

bool cpusShared(const std::vector<std::vector<uint64_t>>& masks, size_t me) {
  std::vector<uint64_t> all;  // every CPU of any mask: what an empty one means
  for (const auto& m : masks) {
    all.resize(std::max(all.size(), m.size()), 0);
    for (size_t w = 0; w < m.size(); ++w) all[w] |= m[w];
  }
  auto cpusOf = [&](const std::vector<uint64_t>& m) -> const std::vector<uint64_t>& { return m.empty() ? all : m; };
  auto count = [](const std::vector<uint64_t>& m) {
    size_t n = 0;
    for (uint64_t w : m) n += size_t(__builtin_popcountll(w));
    return n;
  };
  // Each rank puts 1 / |its mask| on each of its CPUs; `me` shares when its
  // CPUs carry more than one rank each on average (a small tolerance for
  // the sums of fractions).
  const std::vector<uint64_t>& mine = cpusOf(masks[me]);
  const size_t myCpus = count(mine);
  if (myCpus == 0) return masks.size() > 1;
  double load = 0;
  for (const auto& m : masks) {
    const std::vector<uint64_t>& theirs = cpusOf(m);
    const size_t n = count(theirs);
    if (n == 0) continue;
    size_t common = 0;
    for (size_t w = 0; w < std::min(theirs.size(), mine.size()); ++w)
      common += size_t(__builtin_popcountll(theirs[w] & mine[w]));
    load += double(common) / double(n);
  }
  return load > double(myCpus) * (1 + 1e-9);
}

}  // namespace loom::topology
