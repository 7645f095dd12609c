#include "topology/schedule.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <set>

namespace loom::topology {
namespace {

std::vector<std::string> pathDown(const Topology& topo, int node) {
  std::vector<std::string> path;
  for (int n : topo.pathUp(node)) {
    const Node& x = topo.nodes[size_t(n)];
    if (x.type != NodeType::kCpu && x.type != NodeType::kNet) path.push_back(x.busId);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

// Smaller is closer: PCI hops through a shared switch, then the same NUMA
// node, then anything else.
int distance(const RankPlace& r, const NicPlace& nic) {
  if (r.numa != nic.numa || r.numa < 0) return 1000;
  size_t common = 0;
  while (common < r.pciPath.size() && common < nic.pciPath.size() && r.pciPath[common] == nic.pciPath[common]) {
    ++common;
  }
  if (common == 0) return 100;
  return int(r.pciPath.size() - common + nic.pciPath.size() - common);
}

// NICs in the order channels take them: the fastest first, alternating
// between NUMA nodes so that consecutive channels use different sockets.
// NICs slower than a quarter of the fastest (management ports) are left out.
std::vector<const NicPlace*> channelNics(const HostPlace& host) {
  uint64_t fastest = 0;
  for (const auto& n : host.nics) fastest = std::max(fastest, n.speedMbps);
  std::map<uint64_t, std::map<int, std::vector<const NicPlace*>>, std::greater<>> bySpeed;
  for (const auto& n : host.nics) {
    if (n.speedMbps >= fastest / 4) bySpeed[n.speedMbps][n.numa].push_back(&n);
  }
  std::vector<const NicPlace*> out;
  for (auto& [speed, byNuma] : bySpeed) {
    for (auto& [numa, list] : byNuma) {
      std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->name < b->name; });
    }
    for (size_t i = 0;; ++i) {
      bool any = false;
      for (auto& [numa, list] : byNuma) {
        if (i < list.size()) {
          out.push_back(list[i]);
          any = true;
        }
      }
      if (!any) break;
    }
  }
  return out;
}

struct HostRanks {
  std::vector<int> local;                 // by NUMA node and PCI path
  std::vector<const NicPlace*> nics;      // channel order
};

std::vector<HostRanks> groupHosts(const Layout& layout) {
  std::vector<HostRanks> hosts(layout.hosts.size());
  for (int r = 0; r < int(layout.ranks.size()); ++r) hosts[size_t(layout.ranks[size_t(r)].host)].local.push_back(r);
  for (size_t h = 0; h < hosts.size(); ++h) {
    auto& l = hosts[h].local;
    std::stable_sort(l.begin(), l.end(), [&](int a, int b) {
      const auto& x = layout.ranks[size_t(a)];
      const auto& y = layout.ranks[size_t(b)];
      if (x.numa != y.numa) return x.numa < y.numa;
      return x.pciPath < y.pciPath;
    });
    hosts[h].nics = channelNics(layout.hosts[h]);
  }
  return hosts;
}

// Index in `local` of the rank closest to `nic`; ties are shared out by
// `turn`, so that channels whose NICs are equally far use different ranks.
size_t closest(const Layout& layout, const std::vector<int>& local, const NicPlace* nic, int turn) {
  if (!nic) return size_t(turn) % local.size();
  int best = INT_MAX;
  std::vector<size_t> ties;
  for (size_t i = 0; i < local.size(); ++i) {
    const int d = distance(layout.ranks[size_t(local[i])], *nic);
    if (d < best) {
      best = d;
      ties.clear();
    }
    if (d == best) ties.push_back(i);
  }
  return ties[size_t(turn) % ties.size()];
}

int lowBit(int q) { return q & -q; }

// A binary tree over positions 1..n in in-order: the node with lowest set
// bit b has children q - b/2 and q + b/2 (the latter shortened while it is
// past n), so odd positions are the leaves and every even position is
// interior. Returns parent positions (0 at the root).
std::vector<int> inorderTree(int n) {
  std::vector<int> parent(size_t(n) + 1, 0);
  for (int q = 1; q <= n; ++q) {
    const int b = lowBit(q);
    if (b == 1) continue;
    parent[size_t(q - b / 2)] = q;
    for (int h = b / 2; h >= 1; h /= 2) {
      if (q + h <= n) {
        parent[size_t(q + h)] = q;
        break;
      }
    }
  }
  return parent;
}

}  // namespace

HostPlace hostPlace(const Topology& topo, std::string name) {
  HostPlace h;
  h.name = std::move(name);
  // A NIC is a PCI function: its InfiniBand port and its netdev count once
  // (the faster one). Interfaces with no PCI function (bridges, veths,
  // tunnels) count only on a host that has no PCI NIC at all.
  std::map<std::string, size_t> byFunction;
  for (int n : topo.ofType(NodeType::kNet)) {
    const Node& x = topo.nodes[size_t(n)];
    if (!x.busId.empty()) {
      auto [it, added] = byFunction.emplace(x.busId, h.nics.size());
      if (!added) {
        if (x.speedMbps > h.nics[it->second].speedMbps) h.nics[it->second] = NicPlace{x.id, x.speedMbps, x.numa, pathDown(topo, n)};
        continue;
      }
    }
    h.nics.push_back(NicPlace{x.id, x.speedMbps, x.numa, pathDown(topo, n)});
  }
  if (!byFunction.empty()) {
    std::erase_if(h.nics, [](const NicPlace& nic) { return nic.pciPath.empty(); });
  }
  return h;
}

Result<RankPlace> gpuRank(const Topology& topo, int host, const std::string& busId) {
  const std::string id = normalizeBusId(busId);
  for (int n : topo.ofType(NodeType::kGpu)) {
    if (topo.nodes[size_t(n)].busId == id) return RankPlace{host, topo.nodes[size_t(n)].numa, pathDown(topo, n)};
  }
  return invalidArgument("the topology (" + topo.source + ") has no GPU " + id);
}

std::vector<std::string> usableNics(const HostPlace& host) {
  std::vector<std::string> out;
  for (const NicPlace* n : channelNics(host)) out.push_back(n->name);
  return out;
}

RankPlace cpuRank(int host, int numa) { return RankPlace{host, numa, {}}; }

Layout spreadLayout(const std::vector<Topology>& hosts, int perHost) {
  Layout layout;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const Topology& topo = hosts[h];
    layout.hosts.push_back(hostPlace(topo, "host" + std::to_string(h)));
    const auto gpus = topo.ofType(NodeType::kGpu);
    const auto cpus = topo.ofType(NodeType::kCpu);
    for (int i = 0; i < perHost; ++i) {
      if (!gpus.empty()) {
        const int g = gpus[size_t(i) % gpus.size()];
        layout.ranks.push_back(RankPlace{int(h), topo.nodes[size_t(g)].numa, pathDown(topo, g)});
      } else {
        const int numa = cpus.empty() ? -1 : topo.nodes[size_t(cpus[size_t(i) % cpus.size()])].numa;
        layout.ranks.push_back(cpuRank(int(h), numa));
      }
    }
  }
  return layout;
}

Schedule buildSchedule(const Layout& layout) {
  Schedule s;
  const int n = int(layout.ranks.size());
  if (n == 0) return s;
  const auto hosts = groupHosts(layout);
  std::vector<int> used;  // hosts that hold ranks, in index order
  size_t channels = SIZE_MAX;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (hosts[h].local.empty()) continue;
    used.push_back(int(h));
    channels = std::min(channels, hosts[h].nics.size());
  }
  channels = std::clamp<size_t>(channels, 1, 32);

  for (size_t c = 0; c < channels; ++c) {
    Ring ring;
    ring.exitNic.assign(hosts.size(), "");
    for (int h : used) {
      const auto& local = hosts[size_t(h)].local;
      const NicPlace* nic = c < hosts[size_t(h)].nics.size() ? hosts[size_t(h)].nics[c] : nullptr;
      const size_t exit = closest(layout, local, nic, int(c));
      for (size_t k = 1; k <= local.size(); ++k) ring.order.push_back(local[(exit + k) % local.size()]);
      if (nic) ring.exitNic[size_t(h)] = nic->name;
    }
    s.rings.push_back(std::move(ring));
  }

  const int H = int(used.size());
  const auto shape = inorderTree(H);
  for (int t = 0; t < 2; ++t) {
    Tree& tree = s.trees[size_t(t)];
    tree.parent.assign(size_t(n), -1);
    tree.children.assign(size_t(n), {});
    tree.nic.assign(hosts.size(), "");
    // Tree 0 puts host i at position i+1, tree 1 at position i+2 (wrapping).
    auto hostAt = [&](int q) { return used[size_t(t == 0 ? q - 1 : (q - 2 + H) % H)]; };
    std::vector<int> head(hosts.size(), -1);
    for (int q = 1; q <= H; ++q) {
      const int h = hostAt(q);
      const auto& local = hosts[size_t(h)].local;
      const auto& nics = hosts[size_t(h)].nics;
      const NicPlace* nic = nics.empty() ? nullptr : nics[size_t(t) % nics.size()];
      const size_t first = closest(layout, local, nic, t);
      if (nic) tree.nic[size_t(h)] = nic->name;
      head[size_t(h)] = local[first];
      for (size_t k = 1; k < local.size(); ++k) {
        const int prev = local[(first + k - 1) % local.size()];
        const int cur = local[(first + k) % local.size()];
        tree.parent[size_t(cur)] = prev;
        tree.children[size_t(prev)].push_back(cur);
      }
    }
    for (int q = 1; q <= H; ++q) {
      const int h = head[size_t(hostAt(q))];
      if (shape[size_t(q)] == 0) {
        tree.root = h;
        continue;
      }
      const int p = head[size_t(hostAt(shape[size_t(q)]))];
      tree.parent[size_t(h)] = p;
      tree.children[size_t(p)].push_back(h);
    }
  }
  return s;
}

std::vector<std::vector<int>> ringOrders(const Schedule& s) {
  std::vector<std::vector<int>> out;
  for (const Ring& ring : s.rings) out.push_back(ring.order);
  return out;
}

std::vector<std::vector<int>> treeParents(const Schedule& s) {
  std::vector<std::vector<int>> out;
  for (const Tree& tree : s.trees) out.push_back(tree.parent);
  return out;
}

int hostDepth(const Layout& layout, const Tree& tree) {
  int deepest = 0;
  for (int r = 0; r < int(tree.parent.size()); ++r) {
    int crossings = 0, steps = 0;
    for (int at = r; tree.parent[size_t(at)] >= 0 && steps <= int(tree.parent.size()); ++steps) {
      const int p = tree.parent[size_t(at)];
      if (layout.ranks[size_t(p)].host != layout.ranks[size_t(at)].host) ++crossings;
      at = p;
    }
    deepest = std::max(deepest, crossings);
  }
  return deepest;
}

Status checkSchedule(const Layout& layout, const Schedule& s) {
  const int n = int(layout.ranks.size());
  if (n == 0) {
    return s.rings.empty() ? Status::ok() : internalError("rings for a layout without ranks");
  }
  for (const auto& r : layout.ranks) {
    if (r.host < 0 || r.host >= int(layout.hosts.size())) return internalError("a rank on a host the layout lacks");
  }
  std::set<int> hostsUsed;
  for (const auto& r : layout.ranks) hostsUsed.insert(r.host);
  const int H = int(hostsUsed.size());
  size_t minNics = SIZE_MAX;
  for (int h : hostsUsed) minNics = std::min(minNics, usableNics(layout.hosts[size_t(h)]).size());
  const size_t expectRings = std::clamp<size_t>(minNics, 1, 32);
  if (s.rings.size() != expectRings) {
    return internalError("expected " + std::to_string(expectRings) + " rings, got " + std::to_string(s.rings.size()));
  }
  for (size_t c = 0; c < s.rings.size(); ++c) {
    const auto& o = s.rings[c].order;
    const std::string name = "ring " + std::to_string(c);
    std::vector<int> seen(size_t(n), 0);
    if (int(o.size()) != n) return internalError(name + " has " + std::to_string(o.size()) + " ranks, not " + std::to_string(n));
    for (int r : o) {
      if (r < 0 || r >= n || seen[size_t(r)]++) return internalError(name + " visits rank " + std::to_string(r) + " twice or out of range");
    }
    int crossings = 0;
    for (int i = 0; i < n; ++i) {
      if (layout.ranks[size_t(o[size_t(i)])].host != layout.ranks[size_t(o[size_t((i + 1) % n)])].host) ++crossings;
    }
    if (crossings != (H > 1 ? H : 0)) {
      return internalError(name + " crosses host boundaries " + std::to_string(crossings) + " times for " +
                           std::to_string(H) + " hosts");
    }
    if (s.rings[c].exitNic.size() != layout.hosts.size()) return internalError(name + " names no NIC per host");
    // Each host is left from one of its ranks closest to the ring's NIC.
    for (int i = 0; i < n && H > 1; ++i) {
      const int from = o[size_t(i)], to = o[size_t((i + 1) % n)];
      const int h = layout.ranks[size_t(from)].host;
      if (layout.ranks[size_t(to)].host == h) continue;
      const auto& nics = layout.hosts[size_t(h)].nics;
      const auto nic = std::find_if(nics.begin(), nics.end(),
                                    [&](const NicPlace& x) { return x.name == s.rings[c].exitNic[size_t(h)]; });
      if (nic == nics.end()) continue;  // a host without NICs
      for (int r = 0; r < n; ++r) {
        if (layout.ranks[size_t(r)].host == h && distance(layout.ranks[size_t(r)], *nic) < distance(layout.ranks[size_t(from)], *nic)) {
          return internalError(name + " leaves host " + std::to_string(h) + " from rank " + std::to_string(from) +
                               ", but rank " + std::to_string(r) + " is closer to " + nic->name);
        }
      }
    }
    for (int h : hostsUsed) {
      if (usableNics(layout.hosts[size_t(h)]).size() < s.rings.size()) continue;
      for (size_t d = 0; d < c; ++d) {
        if (s.rings[d].exitNic[size_t(h)] == s.rings[c].exitNic[size_t(h)]) {
          return internalError("rings " + std::to_string(d) + " and " + std::to_string(c) + " leave host " +
                               std::to_string(h) + " through the same NIC " + s.rings[c].exitNic[size_t(h)]);
        }
      }
    }
  }
  std::vector<std::array<bool, 2>> interior(layout.hosts.size(), {false, false});
  for (int t = 0; t < 2; ++t) {
    const Tree& tree = s.trees[size_t(t)];
    const std::string name = "tree " + std::to_string(t);
    if (int(tree.parent.size()) != n || int(tree.children.size()) != n || tree.root < 0 || tree.root >= n) {
      return internalError(name + " does not cover every rank");
    }
    for (int r = 0; r < n; ++r) {
      const int p = tree.parent[size_t(r)];
      if (p >= n || p < -1) return internalError(name + ": rank " + std::to_string(r) + " has a parent out of range");
      for (int k : tree.children[size_t(r)]) {
        if (k < 0 || k >= n || tree.parent[size_t(k)] != r) {
          return internalError(name + ": rank " + std::to_string(r) + " lists a child that is not its child");
        }
      }
    }
    int roots = 0;
    for (int r = 0; r < n; ++r) {
      const int p = tree.parent[size_t(r)];
      if (p < 0) {
        ++roots;
        if (r != tree.root) return internalError(name + ": rank " + std::to_string(r) + " has no parent but is not the root");
        continue;
      }
      const auto& kids = tree.children[size_t(p)];
      if (std::count(kids.begin(), kids.end(), r) != 1) {
        return internalError(name + ": rank " + std::to_string(p) + " does not list its child " + std::to_string(r));
      }
      if (layout.ranks[size_t(p)].host != layout.ranks[size_t(r)].host) interior[size_t(layout.ranks[size_t(p)].host)][size_t(t)] = true;
      // Every rank reaches the root.
      int at = r, steps = 0;
      while (tree.parent[size_t(at)] >= 0 && steps++ < n) at = tree.parent[size_t(at)];
      if (at != tree.root) return internalError(name + ": rank " + std::to_string(r) + " does not reach the root");
    }
    size_t edges = 0;
    for (const auto& k : tree.children) edges += k.size();
    if (roots != 1 || edges != size_t(n - 1)) return internalError(name + " is not one tree");
    int bound = 1;
    while ((1 << (bound - 1)) < H) ++bound;  // ceil(log2 H) + 1
    const int depth = hostDepth(layout, tree);
    if (depth > bound) {
      return internalError(name + " crosses " + std::to_string(depth) + " hosts deep, more than " + std::to_string(bound));
    }
  }
  for (size_t h = 0; h < interior.size(); ++h) {
    if (interior[h][0] && interior[h][1]) return internalError("host " + std::to_string(h) + " is interior in both trees");
  }
  return Status::ok();
}

std::vector<std::string> ringLines(const Schedule& s) {
  std::vector<std::string> out;
  char head[64];
  for (size_t c = 0; c < s.rings.size(); ++c) {
    std::snprintf(head, sizeof head, "Channel %02zu/%02zu :", c, s.rings.size());
    std::string line = head;
    for (int r : s.rings[c].order) {
      std::snprintf(head, sizeof head, " %4d", r);
      line += head;
    }
    out.push_back(line);
  }
  return out;
}

std::string treeLine(const Schedule& s, int rank) {
  std::string line = "Trees";
  for (int t = 0; t < 2; ++t) {
    const Tree& tree = s.trees[size_t(t)];
    if (rank < 0 || rank >= int(tree.parent.size())) break;
    const auto& kids = tree.children[size_t(rank)];
    line += " [" + std::to_string(t) + "] ";
    for (size_t i = 0; i < std::max<size_t>(kids.size(), 3); ++i) {
      if (i) line += "/";
      line += std::to_string(i < kids.size() ? kids[i] : -1);
    }
    line += "->" + std::to_string(rank) + "->" + std::to_string(tree.parent[size_t(rank)]);
  }
  return line;
}

std::string topologyDot(const Topology& topo) {
  std::string out = "graph topology {\n  node [shape=box, fontname=\"Helvetica\"];\n";
  char buf[256];
  for (int i = 0; i < int(topo.nodes.size()); ++i) {
    const Node& x = topo.nodes[size_t(i)];
    std::string label, style;
    switch (x.type) {
      case NodeType::kCpu:
        label = "CPU numa " + std::to_string(x.numa);
        if (x.cores) label += "\\n" + std::to_string(x.cores) + " cores";
        style = "style=filled, fillcolor=\"#dbe9f6\"";
        break;
      case NodeType::kPci: label = "PCI " + x.busId; style = "shape=ellipse"; break;
      case NodeType::kGpu:
        label = "GPU " + (x.dev >= 0 ? std::to_string(x.dev) + " " : std::string()) + x.busId;
        style = "style=filled, fillcolor=\"#c7f0c2\"";
        break;
      case NodeType::kNet:
        std::snprintf(buf, sizeof buf, "NIC %s\\n%.0f Gbit/s", x.id.c_str(), double(x.speedMbps) / 1000.0);
        label = buf;
        style = "style=filled, fillcolor=\"#fde2b8\"";
        break;
      case NodeType::kNvSwitch: label = "NVSwitch"; style = "shape=hexagon, style=filled, fillcolor=\"#e5d4f3\""; break;
    }
    out += "  n" + std::to_string(i) + " [label=\"" + label + "\", " + style + "];\n";
  }
  for (const auto& l : topo.links) {
    // Parent first, so that dot draws the CPUs on top.
    const bool up = l.type == LinkType::kPci || l.type == LinkType::kNet;
    std::snprintf(buf, sizeof buf, "  n%d -- n%d [label=\"%s %.0f GB/s\"%s];\n", up ? l.b : l.a, up ? l.a : l.b,
                  linkTypeName(l.type), l.gbs,
                  l.type == LinkType::kNvLink ? ", color=\"#2e7d32\", penwidth=2"
                  : l.type == LinkType::kSys  ? ", style=dashed"
                                              : "");
    out += buf;
  }
  return out + "}\n";
}

std::string scheduleDot(const Layout& layout, const Schedule& s) {
  static const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::string out = "digraph schedule {\n  compound=true; node [shape=circle, fontname=\"Helvetica\"];\n";
  std::map<int, std::vector<int>> byHost;
  for (int r = 0; r < int(layout.ranks.size()); ++r) byHost[layout.ranks[size_t(r)].host].push_back(r);
  for (const auto& [h, ranks] : byHost) {
    out += "  subgraph cluster_h" + std::to_string(h) + " {\n    label=\"" + layout.hosts[size_t(h)].name + "\";\n";
    for (int r : ranks) out += "    r" + std::to_string(r) + " [label=\"" + std::to_string(r) + "\"];\n";
    out += "  }\n";
  }
  for (size_t c = 0; c < s.rings.size(); ++c) {
    const auto& o = s.rings[c].order;
    const char* color = kColors[c % 8];
    for (size_t i = 0; i < o.size() && o.size() > 1; ++i) {
      out += "  r" + std::to_string(o[i]) + " -> r" + std::to_string(o[(i + 1) % o.size()]) + " [color=\"" + color +
             "\", tooltip=\"ring " + std::to_string(c) + "\"];\n";
    }
  }
  for (int t = 0; t < 2; ++t) {
    const auto& tree = s.trees[size_t(t)];
    for (int r = 0; r < int(tree.parent.size()); ++r) {
      if (tree.parent[size_t(r)] < 0) continue;
      out += "  r" + std::to_string(tree.parent[size_t(r)]) + " -> r" + std::to_string(r) +
             " [style=dashed, color=\"" + (t == 0 ? "#555555" : "#aaaaaa") + "\", tooltip=\"tree " +
             std::to_string(t) + "\"];\n";
    }
  }
  return out + "}\n";
}

}  // namespace loom::topology
