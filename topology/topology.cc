#include "topology/topology.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace loom::topology {

const char* nodeTypeName(NodeType t) {
  switch (t) {
    case NodeType::kCpu: return "cpu";
    case NodeType::kPci: return "pci";
    case NodeType::kGpu: return "gpu";
    case NodeType::kNet: return "net";
    case NodeType::kNvSwitch: return "nvswitch";
  }
  return "?";
}

const char* linkTypeName(LinkType t) {
  switch (t) {
    case LinkType::kPci: return "PCI";
    case LinkType::kNvLink: return "NVL";
    case LinkType::kSys: return "SYS";
    case LinkType::kNet: return "NET";
  }
  return "?";
}

std::vector<int> Topology::ofType(NodeType t) const {
  std::vector<int> out;
  for (int i = 0; i < int(nodes.size()); ++i) {
    if (nodes[size_t(i)].type == t) out.push_back(i);
  }
  return out;
}

int Topology::find(NodeType t, const std::string& id) const {
  for (int i = 0; i < int(nodes.size()); ++i) {
    if (nodes[size_t(i)].type == t && nodes[size_t(i)].id == id) return i;
  }
  return -1;
}

std::vector<int> Topology::pathUp(int n) const {
  std::vector<int> path;
  for (int at = n; at >= 0 && path.size() <= nodes.size(); at = nodes[size_t(at)].parent) path.push_back(at);
  return path;
}

std::string normalizeBusId(std::string id) {
  for (auto& c : id) c = char(std::tolower(static_cast<unsigned char>(c)));
  // "00:1f.0" has no domain; "0000000:c5:00.0" (NCCL pads to 8 digits in
  // places) has a long one: both become 4 digits.
  const size_t firstColon = id.find(':');
  if (firstColon == std::string::npos) return id;
  if (id.find(':', firstColon + 1) == std::string::npos) return "0000:" + id;
  std::string domain = id.substr(0, firstColon);
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  while (domain.size() < 4) domain.insert(0, "0");
  return domain + id.substr(firstColon);
}

double pciGBs(const std::string& linkSpeed, int width) {
  if (width <= 0) return 0;
  double gt = 0;
  if (std::sscanf(linkSpeed.c_str(), "%lf", &gt) != 1 || !(gt > 0) || !std::isfinite(gt)) return 0;
  // 8b/10b encoding up to 5 GT/s, 128b/130b from 8 GT/s on.
  const double perLane = gt < 8 ? gt * 0.8 / 8 : gt * 128.0 / 130.0 / 8;
  const double total = perLane * std::min(width, 64);
  return std::isfinite(total) ? total : 0;
}

double nvlinkGBs(int sm) {
  if (sm >= 100) return 40.0;
  if (sm >= 90) return 20.6;
  if (sm >= 70) return 20.0;
  return 18.0;
}

namespace {

// Unknown PCI links (VMs often report none) count as PCIe 4 x16.
constexpr double kDefaultPciGBs = 24.0;

class Builder {
 public:
  explicit Builder(std::string origin) : origin_(std::move(origin)) {}

  Result<Topology> build(xml::Element system) {
    if (system.name != "system") return failAt(system, "the root element must be <system>");
    topo_.source = origin_;
    for (const auto& child : system.children) {
      if (child.name == "cpu") LOOM_TRY(cpu(child));
    }
    LOOM_TRY(nvlinks());
    // Every pair of CPUs is joined by the inter-socket link.
    auto cpus = topo_.ofType(NodeType::kCpu);
    for (size_t i = 0; i < cpus.size(); ++i) {
      for (size_t j = i + 1; j < cpus.size(); ++j) {
        const auto& v = topo_.nodes[size_t(cpus[i])].vendor;
        const double gbs = v == "AuthenticAMD" ? 16.0 : v == "GenuineIntel" ? 20.0 : 10.0;
        topo_.links.push_back(Link{cpus[i], cpus[j], LinkType::kSys, gbs, 1});
      }
    }
    topo_.xml = std::move(system);
    return std::move(topo_);
  }

 private:
  Status failAt(const xml::Element& e, const std::string& what) const {
    std::string where = "<" + e.name;
    for (const char* key : {"busid", "numaid", "name", "target", "dev"}) {
      if (const std::string* v = e.attr(key)) {
        where += std::string(" ") + key + "=\"" + *v + "\"";
        break;
      }
    }
    where += ">";
    return invalidArgument(origin_ + ":" + std::to_string(e.line) + ": " + where + ": " + what);
  }

  // An integer attribute; `fallback` when absent or empty.
  Result<long long> number(const xml::Element& e, const char* key, long long fallback, bool required = false) {
    const std::string* v = e.attr(key);
    if (!v || v->empty()) {
      if (required) return failAt(e, std::string("attribute '") + key + "' is missing");
      return fallback;
    }
    long long out = 0;
    const char* b = v->data();
    const char* end = v->data() + v->size();
    int base = 10;
    if (v->size() > 2 && (*v)[0] == '0' && ((*v)[1] == 'x' || (*v)[1] == 'X')) {
      b += 2;
      base = 16;
    }
    auto [p, ec] = std::from_chars(b, end, out, base);
    if (ec != std::errc() || p != end) {
      return failAt(e, std::string("attribute ") + key + "=\"" + *v + "\" is not a number");
    }
    return out;
  }

  static Node node(NodeType type, std::string id, int numa, int parent, std::string busId) {
    Node n;
    n.type = type;
    n.id = std::move(id);
    n.numa = numa;
    n.parent = parent;
    n.busId = std::move(busId);
    return n;
  }

  int add(Node n) {
    topo_.nodes.push_back(std::move(n));
    return int(topo_.nodes.size()) - 1;
  }

  Status cpu(const xml::Element& e) {
    LOOM_ASSIGN_OR_RETURN(long long numa, number(e, "numaid", -1, true));
    if (numa < 0 || numa > 4095) return failAt(e, "numaid out of range");
    if (topo_.find(NodeType::kCpu, "cpu" + std::to_string(numa)) >= 0) {
      return failAt(e, "NUMA node " + std::to_string(numa) + " appears twice");
    }
    Node n = node(NodeType::kCpu, "cpu" + std::to_string(numa), int(numa), -1, "");
    n.arch = e.attrOr("arch", "");
    n.vendor = e.attrOr("vendor", "");
    n.affinity = e.attrOr("affinity", "");
    LOOM_ASSIGN_OR_RETURN(long long pkg, number(e, "loom_package", -1));
    LOOM_ASSIGN_OR_RETURN(long long cores, number(e, "loom_cores", 0));
    n.package = int(pkg);
    n.cores = int(std::clamp(cores, 0LL, 1LL << 20));
    if (const std::string* caches = e.attr("loom_caches")) LOOM_TRY(parseCaches(e, *caches, &n.caches));
    const int self = add(std::move(n));
    for (const auto& child : e.children) {
      if (child.name == "pci") LOOM_TRY(pci(child, self, int(numa)));
      if (child.name == "nic") LOOM_TRY(nic(child, self, int(numa), ""));
    }
    return Status::ok();
  }

  Status parseCaches(const xml::Element& e, const std::string& text, std::vector<Cache>* out) {
    size_t at = 0;
    while (at < text.size()) {
      size_t comma = text.find(',', at);
      if (comma == std::string::npos) comma = text.size();
      const std::string item = text.substr(at, comma - at);
      int level = 0;
      unsigned long long bytes = 0;
      char extra = 0;
      if (std::sscanf(item.c_str(), "%d:%llu%c", &level, &bytes, &extra) != 2 || level < 1 || level > 9) {
        return failAt(e, "loom_caches=\"" + text + "\": expected level:bytes pairs");
      }
      out->push_back(Cache{level, bytes});
      at = comma + 1;
    }
    return Status::ok();
  }

  Status pci(const xml::Element& e, int parent, int numa) {
    const std::string* rawId = e.attr("busid");
    if (!rawId || rawId->empty()) return failAt(e, "attribute 'busid' is missing");
    const std::string busId = normalizeBusId(*rawId);
    if (!pciIds_.insert(busId).second) return failAt(e, "PCI device " + busId + " appears twice");
    LOOM_ASSIGN_OR_RETURN(long long cls, number(e, "class", 0));
    LOOM_ASSIGN_OR_RETURN(long long width, number(e, "link_width", 0));
    const xml::Element* gpuChild = nullptr;
    for (const auto& c : e.children) {
      if (c.name == "gpu") gpuChild = &c;
    }
    // A display controller without <gpu> is a GPU only when it is NVIDIA's
    // (or says no vendor, as hand-written files may): not a management VGA.
    LOOM_ASSIGN_OR_RETURN(long long vendor, number(e, "vendor", kNvidiaVendor));
    Node n = node(NodeType::kPci, busId, numa, parent, busId);
    n.type = gpuChild || isNvidiaGpu(uint32_t(cls), uint32_t(vendor)) ? NodeType::kGpu
             : (cls >> 8) == 0x0680     ? NodeType::kNvSwitch
                                        : NodeType::kPci;
    if (gpuChild) {
      LOOM_ASSIGN_OR_RETURN(long long dev, number(*gpuChild, "dev", -1));
      LOOM_ASSIGN_OR_RETURN(long long sm, number(*gpuChild, "sm", 0));
      n.dev = int(dev);
      n.sm = int(sm);
    }
    double gbs = pciGBs(e.attrOr("link_speed", ""), int(std::clamp(width, 0LL, 64LL)));
    if (gbs == 0) gbs = kDefaultPciGBs;
    const int self = add(std::move(n));
    if (topo_.nodes[size_t(self)].type != NodeType::kPci) linkable_[busId] = self;
    topo_.links.push_back(Link{self, parent, LinkType::kPci, gbs, 1});
    bool nets = false;
    for (const auto& c : e.children) {
      if (c.name == "pci") LOOM_TRY(pci(c, self, numa));
      if (c.name == "nic") {
        LOOM_TRY(nic(c, self, numa, busId));
        nets = true;
      }
      if (c.name == "gpu") {
        for (const auto& l : c.children) {
          if (l.name == "nvlink") pendingNvlinks_.push_back({self, &l});
        }
      }
    }
    if ((cls >> 16) == 0x02 && !nets && netNames_.insert(busId).second) {
      // A NIC the file lists without its ports (vendor files leave them to
      // be found at run time): one port of unknown speed, named by bus id.
      const int port = add(node(NodeType::kNet, busId, numa, self, busId));
      topo_.links.push_back(Link{port, self, LinkType::kNet, gbs, 1});
    }
    return Status::ok();
  }

  Status nic(const xml::Element& e, int parent, int numa, const std::string& busId) {
    for (const auto& c : e.children) {
      if (c.name != "net") continue;
      const std::string* name = c.attr("name");
      if (!name || name->empty()) return failAt(c, "attribute 'name' is missing");
      if (!netNames_.insert(*name).second) return failAt(c, "net '" + *name + "' appears twice");
      LOOM_ASSIGN_OR_RETURN(long long speed, number(c, "speed", 0));
      LOOM_ASSIGN_OR_RETURN(long long dev, number(c, "dev", -1));
      LOOM_ASSIGN_OR_RETURN(long long port, number(c, "port", 0));
      if (speed < 0) return failAt(c, "negative speed");
      Node n = node(NodeType::kNet, *name, numa, parent, busId);
      n.speedMbps = uint64_t(speed);
      n.dev = int(dev);
      n.port = int(port);
      n.linkLayer = c.attrOr("loom_link", "");
      const double gbs = double(speed) / 8000.0;
      const int self = add(std::move(n));
      topo_.links.push_back(Link{self, parent, LinkType::kNet, gbs, 1});
    }
    return Status::ok();
  }

  Status nvlinks() {
    int nvswitch = -1;
    for (const auto& [gpu, e] : pendingNvlinks_) {
      const std::string* rawTarget = e->attr("target");
      if (!rawTarget || rawTarget->empty()) return failAt(*e, "attribute 'target' is missing");
      LOOM_ASSIGN_OR_RETURN(long long count, number(*e, "count", 1));
      LOOM_ASSIGN_OR_RETURN(long long tclass, number(*e, "tclass", 0));
      if (count < 1 || count > 1024) return failAt(*e, "count out of range");
      const std::string target = normalizeBusId(*rawTarget);
      // Copies: adding the NVSwitch node below may move the nodes.
      const std::string gpuBusId = topo_.nodes[size_t(gpu)].busId;
      const int sm = topo_.nodes[size_t(gpu)].sm;
      if (target == gpuBusId) continue;  // some VM files point a GPU at itself
      auto known = linkable_.find(target);
      int peer = known == linkable_.end() ? -1 : known->second;
      if (peer < 0 && (tclass >> 8) == 0x0680) {
        // NVSwitches of NVLink 4 are not PCI devices: one node stands for all.
        if (nvswitch < 0) nvswitch = add(node(NodeType::kNvSwitch, "nvswitch", -1, -1, ""));
        peer = nvswitch;
      }
      if (peer < 0) continue;  // a GPU this file does not list
      const double gbs = double(count) * nvlinkGBs(sm);
      // Both ends may list the link: one link, the larger count.
      const auto key = std::minmax(gpu, peer);
      if (auto at = nvlinkAt_.find(key); at != nvlinkAt_.end()) {
        Link& l = topo_.links[at->second];
        l.count = std::max(l.count, int(count));
        l.gbs = std::max(l.gbs, gbs);
        continue;
      }
      nvlinkAt_[key] = topo_.links.size();
      topo_.links.push_back(Link{gpu, peer, LinkType::kNvLink, gbs, int(count)});
    }
    return Status::ok();
  }

  std::string origin_;
  Topology topo_;
  std::vector<std::pair<int, const xml::Element*>> pendingNvlinks_;
  std::set<std::string> pciIds_, netNames_;
  std::map<std::string, int> linkable_;  // GPUs and NVSwitches by bus id
  std::map<std::pair<int, int>, size_t> nvlinkAt_;
};

std::string sizeText(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) std::snprintf(buf, sizeof buf, "%llu MiB", (unsigned long long)(bytes >> 20));
  else if (bytes >= 1024 && bytes % 1024 == 0) std::snprintf(buf, sizeof buf, "%llu KiB", (unsigned long long)(bytes >> 10));
  else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)bytes);
  return buf;
}

}  // namespace

Result<Topology> fromXml(xml::Element system, std::string origin) {
  return Builder(std::move(origin)).build(std::move(system));
}

Result<Topology> loadFile(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(auto root, xml::parseFile(path));
  return fromXml(std::move(root), path);
}

Status dumpFile(const Topology& topo, const std::string& path) { return xml::writeFile(path, topo.xml); }

std::string describe(const Topology& topo) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "topology (%s): %d NUMA node(s), %zu GPU(s), %zu NIC port(s)\n",
                topo.source.c_str(), topo.numaCount(), topo.ofType(NodeType::kGpu).size(),
                topo.ofType(NodeType::kNet).size());
  out += line;
  // Children in file order under each parent, depth-first from the CPUs.
  std::map<int, std::vector<int>> below;
  for (int i = 0; i < int(topo.nodes.size()); ++i) below[topo.nodes[size_t(i)].parent].push_back(i);
  auto uplink = [&](int n) {
    for (const auto& l : topo.links) {
      if ((l.a == n || l.b == n) && l.type != LinkType::kNvLink && l.type != LinkType::kSys) return l.gbs;
    }
    return 0.0;
  };
  auto print = [&](auto&& self, int n, int depth) -> void {
    const Node& x = topo.nodes[size_t(n)];
    std::string text(size_t(depth) * 2, ' ');
    switch (x.type) {
      case NodeType::kCpu: {
        text += "cpu numa " + std::to_string(x.numa);
        if (!x.arch.empty() || !x.vendor.empty()) text += " (" + x.arch + " " + x.vendor + ")";
        if (x.package >= 0) text += " package " + std::to_string(x.package);
        if (x.cores > 0) text += ", " + std::to_string(x.cores) + " cores";
        for (const auto& c : x.caches) text += ", L" + std::to_string(c.level) + " " + sizeText(c.bytes);
        if (!x.affinity.empty()) text += ", cpus " + x.affinity;
        break;
      }
      case NodeType::kPci:
      case NodeType::kGpu:
      case NodeType::kNvSwitch: {
        std::snprintf(line, sizeof line, "%s %s (%.1f GB/s)", nodeTypeName(x.type), x.busId.c_str(), uplink(n));
        text += line;
        if (x.type == NodeType::kGpu && x.dev >= 0) text += " dev " + std::to_string(x.dev);
        if (x.type == NodeType::kGpu && x.sm > 0) text += " sm " + std::to_string(x.sm);
        break;
      }
      case NodeType::kNet: {
        std::snprintf(line, sizeof line, "net %s, %.1f Gbit/s", x.id.c_str(), double(x.speedMbps) / 1000.0);
        text += line;
        if (!x.linkLayer.empty()) text += ", " + x.linkLayer;
        break;
      }
    }
    out += text + "\n";
    for (int c : below[n]) self(self, c, depth + 1);
  };
  for (int c : below[-1]) {
    if (topo.nodes[size_t(c)].type == NodeType::kCpu) print(print, c, 0);
  }
  for (const auto& l : topo.links) {
    if (l.type != LinkType::kNvLink) continue;
    std::snprintf(line, sizeof line, "nvlink %s <-> %s x%d (%.1f GB/s)\n", topo.nodes[size_t(l.a)].id.c_str(),
                  topo.nodes[size_t(l.b)].id.c_str(), l.count, l.gbs);
    out += line;
  }
  return out;
}

}  // namespace loom::topology
