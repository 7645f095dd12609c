// Interface selection with NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY semantics
// (declared in transport/net/socket.h).
#include "transport/net/socket.h"

#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace loom::net {

namespace {

bool isLinkLocalV6(const sockaddr_in6& a) {
  return a.sin6_addr.s6_addr[0] == 0xfe && (a.sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

}  // namespace

bool Interface::sameSubnet(const SocketAddress& other) const {
  if (other.family() != addr.family() || netmask.family() != addr.family()) return false;
  size_t n = 0, nm = 0, no = 0;
  const uint8_t* a = addr.rawAddress(&n);
  const uint8_t* m = netmask.rawAddress(&nm);
  const uint8_t* o = other.rawAddress(&no);
  if (n == 0 || nm != n || no != n) return false;
  for (size_t i = 0; i < n; ++i)
    if ((a[i] & m[i]) != (o[i] & m[i])) return false;
  return true;
}

namespace {

struct IfSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> items;

  bool matches(const std::string& name) const {
    bool any = false;
    for (const std::string& item : items) {
      if (exact ? name == item : name.compare(0, item.size(), item) == 0) any = true;
    }
    return exclude ? !any : any;
  }
};

IfSpec parseSpec(const std::string& text) {
  IfSpec spec;
  size_t i = 0;
  if (i < text.size() && text[i] == '^') { spec.exclude = true; ++i; }
  if (i < text.size() && text[i] == '=') { spec.exact = true; ++i; }
  std::string cur;
  for (; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      size_t b = cur.find_first_not_of(" \t");
      size_t e = cur.find_last_not_of(" \t");
      if (b != std::string::npos) spec.items.push_back(cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  return spec;
}

// One raw entry of getifaddrs that carries an address we could use.
struct RawIf {
  std::string name;
  bool up = false;
  bool loopback = false;
  std::vector<std::pair<SocketAddress, SocketAddress>> addrs;  // (addr, netmask)
};

// Every interface the kernel reports, in getifaddrs order, with its usable
// addresses (link-local IPv6 dropped).
Result<std::vector<RawIf>> listRawInterfaces() {
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) return systemErrno("getifaddrs (listing network interfaces)", errno);
  std::vector<RawIf> out;
  for (ifaddrs* ifa = head; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_name == nullptr) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const RawIf& r) { return r.name == ifa->ifa_name; });
    if (it == out.end()) {
      out.push_back(RawIf{ifa->ifa_name, false, false, {}});
      it = out.end() - 1;
    }
    it->up = it->up || (ifa->ifa_flags & IFF_UP) != 0;
    it->loopback = it->loopback || (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    if (ifa->ifa_addr == nullptr) continue;
    int fam = ifa->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (fam == AF_INET6 && isLinkLocalV6(*reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)))
      continue;
    SocketAddress addr = SocketAddress::fromSockaddr(ifa->ifa_addr, len);
    SocketAddress mask;
    if (ifa->ifa_netmask != nullptr && ifa->ifa_netmask->sa_family == fam) {
      mask = SocketAddress::fromSockaddr(ifa->ifa_netmask, len);
    } else if (ifa->ifa_netmask != nullptr) {
      // Some kernels leave the netmask's family unset; take its bytes anyway.
      sockaddr_storage tmp{};
      std::memcpy(&tmp, ifa->ifa_netmask, len);
      tmp.ss_family = sa_family_t(fam);
      mask = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&tmp), len);
    }
    it->addrs.emplace_back(addr, mask);
  }
  ::freeifaddrs(head);
  return out;
}

std::string describeInterfaces(const std::vector<RawIf>& raw) {
  std::string s;
  for (const RawIf& r : raw) {
    if (!s.empty()) s += ", ";
    s += r.name;
    std::string detail;
    if (!r.up) detail = "down";
    for (const auto& a : r.addrs) detail += (detail.empty() ? "" : " ") + a.first.hostString();
    if (r.addrs.empty() && r.up) detail += "no address";
    s += " (" + detail + ")";
  }
  return s.empty() ? "none" : s;
}

bool isContainerBridge(const std::string& name) {
  return name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
}

// The address of `r` to use for `family` (0 = any: IPv4 preferred).
const std::pair<SocketAddress, SocketAddress>* pickAddress(const RawIf& r, int family) {
  const std::pair<SocketAddress, SocketAddress>* v6 = nullptr;
  for (const auto& a : r.addrs) {
    if (family != AF_UNSPEC && a.first.family() != family) continue;
    if (a.first.family() == AF_INET) return &a;
    if (v6 == nullptr) v6 = &a;
  }
  return v6;
}

}  // namespace

Result<int> parseFamily(std::string_view text, std::string_view setting) {
  if (text.empty()) return int(AF_UNSPEC);
  if (text == "AF_INET") return int(AF_INET);
  if (text == "AF_INET6") return int(AF_INET6);
  return invalidArgument(std::string(setting) + "='" + std::string(text) +
                         "' is not valid: use AF_INET, AF_INET6 or leave it unset");
}

Result<std::vector<Interface>> findInterfaces(const std::string& ifnameSpec,
                                              const std::string& family) {
  LOOM_ASSIGN_OR_RETURN(int fam, parseFamily(family, "NCCL_SOCKET_FAMILY"));
  LOOM_ASSIGN_OR_RETURN(std::vector<RawIf> raw, listRawInterfaces());
  IfSpec spec = parseSpec(ifnameSpec);
  bool useDefault = spec.items.empty();
  // Tier 0: ordinary interfaces; 1: container bridges; 2: loopback.
  std::vector<Interface> tiers[3];
  for (const RawIf& r : raw) {
    if (!r.up) continue;
    if (!useDefault && !spec.matches(r.name)) continue;
    const auto* a = pickAddress(r, fam);
    if (a == nullptr) continue;
    Interface itf{r.name, a->first, a->second, r.loopback};
    int tier = useDefault ? (r.loopback ? 2 : isContainerBridge(r.name) ? 1 : 0) : 0;
    tiers[tier].push_back(std::move(itf));
  }
  std::vector<Interface> out;
  for (auto& t : tiers)
    for (auto& itf : t) out.push_back(std::move(itf));
  if (out.empty()) {
    std::string what = useDefault ? std::string("no network interface that is up has an address")
                                  : "NCCL_SOCKET_IFNAME='" + ifnameSpec +
                                        "' matches no network interface that is up and has an "
                                        "address";
    if (fam != AF_UNSPEC) what += " of family " + family + " (NCCL_SOCKET_FAMILY)";
    return systemError(what + "; interfaces present: " + describeInterfaces(raw) +
                       ". Set NCCL_SOCKET_IFNAME to one of them (prefixes like eth, ^ to "
                       "exclude, = for exact names).");
  }
  return out;
}

Result<Interface> chooseInterface(const std::string& ifnameSpec, const std::string& family,
                                  const SocketAddress* reach) {
  bool useReach = reach != nullptr && reach->family() != AF_UNSPEC &&
                  parseSpec(ifnameSpec).items.empty();
  std::string fam = family;
  // With no family restriction, look at addresses of reach's family, so that
  // an IPv6 rendezvous finds the IPv6 subnet of an interface that also has IPv4.
  if (useReach && fam.empty()) {
    fam = reach->family() == AF_INET6 ? "AF_INET6" : "AF_INET";
    auto sameFam = findInterfaces(ifnameSpec, fam);
    if (!sameFam.isOk()) fam = family;  // fall back to any family below
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<Interface> list, findInterfaces(ifnameSpec, fam));
  if (useReach) {
    for (const Interface& itf : list) {
      if (reach->isLoopback() ? itf.loopback : itf.sameSubnet(*reach)) {
        LOOM_INFO(log::kNet, "using interface %s %s: same subnet as %s", itf.name.c_str(),
                  itf.addr.hostString().c_str(), reach->toString().c_str());
        return itf;
      }
    }
    LOOM_INFO(log::kNet, "no interface shares a subnet with %s; using %s %s",
              reach->toString().c_str(), list.front().name.c_str(),
              list.front().addr.hostString().c_str());
  }
  return list.front();
}

}  // namespace loom::net
