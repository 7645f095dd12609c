#include "transport/ib/device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "common/log.h"
#include "common/settings.h"
#include "transport/net/socket.h"

namespace loom::transport::ib {

// ---- NCCL_IB_HCA --------------------------------------------------------------

HcaFilter HcaFilter::parse(std::string_view spec) {
  HcaFilter f;
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  spec = trim(spec);
  if (!spec.empty() && spec.front() == '^') {
    f.exclude_ = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    f.exact_ = true;
    spec.remove_prefix(1);
  }
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    std::string_view item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    Entry e;
    const size_t colon = item.find(':');
    e.name = std::string(trim(item.substr(0, colon)));
    if (colon != std::string_view::npos) {
      const std::string port(trim(item.substr(colon + 1)));
      char* end = nullptr;
      const long p = std::strtol(port.c_str(), &end, 10);
      // A port that is not a number matches no port at all.
      e.port = (!port.empty() && end && *end == '\0' && p > 0 && p < 256) ? int(p) : 0;
    }
    if (!e.name.empty()) f.entries_.push_back(std::move(e));
  }
  return f;
}

bool HcaFilter::accepts(std::string_view device, int port) const {
  if (entries_.empty()) return true;
  bool listed = false;
  for (const Entry& e : entries_) {
    const bool nameMatches = exact_ ? device == e.name : device.substr(0, e.name.size()) == e.name;
    if (nameMatches && (e.port == -1 || e.port == port)) listed = true;
  }
  return listed != exclude_;
}

// ---- discovery ----------------------------------------------------------------

namespace {

std::string readSysLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

bool isZero(const ibv_gid& g) {
  static const ibv_gid zero{};
  return std::memcmp(&g, &zero, sizeof g) == 0;
}

bool isIpv4Mapped(const ibv_gid& g) {
  for (int i = 0; i < 10; ++i)
    if (g.raw[i] != 0) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

double widthFactor(uint8_t width) {
  switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 1;
  }
}

double laneGbps(const ibv_port_attr& a) {
  switch (a.active_speed) {
    case 1: return 2.5;    // SDR
    case 2: return 5;      // DDR
    case 4: return 10;     // QDR
    case 8: return 10;     // FDR10
    case 16: return 14;    // FDR
    case 32: return 25;    // EDR
    case 64: return 50;    // HDR
    case 128: return 100;  // NDR
    default: return 2.5;
  }
}

// Chooses the GID of a RoCE port; see discoverPorts().
void chooseGid(const Verbs& v, ibv_context* ctx, PortInfo* p, int tableLength, int wanted,
               const GidPreference& preference) {
  const std::string types =
      std::string("/sys/class/infiniband/") + p->device + "/ports/" + std::to_string(p->port) + "/gid_attrs/types/";
  auto take = [&](int index) -> bool {
    ibv_gid g{};
    if (v.queryGid(ctx, uint8_t(p->port), index, &g) != 0) return false;
    p->gidIndex = index;
    p->gid = g;
    p->gidType = readSysLine(types + std::to_string(index));
    return true;
  };
  if (wanted >= 0) {
    if (!take(wanted)) p->gidIndex = wanted;  // fails later, naming the index
    return;
  }
  std::vector<GidEntry> table(size_t(std::max(tableLength, 0)));
  for (int i = 0; i < tableLength; ++i) {
    GidEntry& e = table[size_t(i)];
    if (v.queryGid(ctx, uint8_t(p->port), i, &e.gid) != 0) e.gid = ibv_gid{};
    const std::string type = readSysLine(types + std::to_string(i));
    e.version = type == "RoCE v2" ? 2 : type == "IB/RoCE v1" ? 1 : 0;
  }
  std::string unmet;
  take(pickGid(table, preference, &unmet));
  if (!unmet.empty()) {
    LOOM_INFO(log::kNet, "verbs %s:%d: %s; using GID index %d", p->device.c_str(), p->port, unmet.c_str(),
              p->gidIndex);
  }
}

const char* mtuText(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return "?";
}

}  // namespace

std::string PortInfo::describe() const {
  char text[160];
  std::snprintf(text, sizeof text, "%s:%d (%s, %g Gb/s, MTU %s, GID %d%s%s%s)", device.c_str(), port,
                ethernet ? "RoCE" : "InfiniBand", gbps, mtuText(activeMtu), gidIndex, gidType.empty() ? "" : " ",
                gidType.c_str(), ethernet ? "" : (", LID " + std::to_string(lid)).c_str());
  return text;
}

// ---- GID auto-selection -------------------------------------------------------

Result<GidPreference> GidPreference::make(std::string_view family, int version, std::string_view range,
                                          std::string_view familySetting) {
  GidPreference p;
  LOOM_ASSIGN_OR_RETURN(const int parsed, net::parseFamily(family, familySetting));
  p.family = parsed == AF_UNSPEC ? AF_INET : parsed;
  if (version != 1 && version != 2) {
    return invalidArgument("NCCL_IB_ROCE_VERSION_NUM=" + std::to_string(version) + " is not 1 or 2");
  }
  p.version = version;
  if (range.empty()) return p;
  const std::string text(range);
  const size_t slash = text.find('/');
  const std::string address = text.substr(0, slash);
  const bool v6 = address.find(':') != std::string::npos;
  const int maxBits = v6 ? 128 : 32;
  int bits = maxBits;
  if (slash != std::string::npos) {
    const std::string b = text.substr(slash + 1);
    char* end = nullptr;
    const long n = std::strtol(b.c_str(), &end, 10);
    if (b.empty() || *end != '\0' || n < 0 || n > maxBits) bits = -1;
    else bits = int(n);
  }
  uint8_t raw[16] = {};
  if (bits < 0 || inet_pton(v6 ? AF_INET6 : AF_INET, address.c_str(), raw) != 1) {
    return invalidArgument("NCCL_IB_ADDR_RANGE='" + text + "' is not an address range such as 10.0.0.0/8 or fd00::/8");
  }
  if ((v6 ? AF_INET6 : AF_INET) != p.family) {
    return invalidArgument("NCCL_IB_ADDR_RANGE='" + text + "' is not of the family " +
                           (p.family == AF_INET6 ? "AF_INET6" : "AF_INET") + " (" + std::string(familySetting) + ")");
  }
  if (v6) {
    std::memcpy(p.prefix.raw, raw, 16);
    p.prefixBits = bits;
  } else {
    p.prefix.raw[10] = p.prefix.raw[11] = 0xff;  // IPv4-mapped
    std::memcpy(p.prefix.raw + 12, raw, 4);
    p.prefixBits = 96 + bits;
  }
  return p;
}

GidPreference GidPreference::fromSettings(std::string* warning) {
  auto cfg = settings::current();
  const char* familySetting = cfg->isSet("NCCL_IB_ADDR_FAMILY") ? "NCCL_IB_ADDR_FAMILY" : "NCCL_SOCKET_FAMILY";
  Result<GidPreference> p = make(cfg->getString(familySetting), int(cfg->getInt("NCCL_IB_ROCE_VERSION_NUM")),
                                 cfg->getString("NCCL_IB_ADDR_RANGE"), familySetting);
  if (p.isOk()) return p.value();
  *warning = p.status().message() + "; GID auto-selection keeps its defaults (RoCE v2, AF_INET, any address)";
  return make("", 2, "").value();
}

std::string GidPreference::describe() const {
  std::string s = "RoCE v" + std::to_string(version) + ", " + (family == AF_INET6 ? "AF_INET6" : "AF_INET");
  if (prefixBits > 0) {
    char text[INET6_ADDRSTRLEN] = "?";
    if (family == AF_INET6) inet_ntop(AF_INET6, prefix.raw, text, sizeof text);
    else inet_ntop(AF_INET, prefix.raw + 12, text, sizeof text);
    s += std::string(" in ") + text + "/" + std::to_string(family == AF_INET6 ? prefixBits : prefixBits - 96);
  }
  return s;
}

int pickGid(std::span<const GidEntry> table, const GidPreference& want, std::string* unmet) {
  auto inRange = [&](const ibv_gid& g) {
    for (int bit = 0; bit < want.prefixBits; ++bit) {
      const uint8_t mask = uint8_t(0x80u >> (bit % 8));
      if ((g.raw[bit / 8] & mask) != (want.prefix.raw[bit / 8] & mask)) return false;
    }
    return true;
  };
  auto linkLocal = [](const ibv_gid& g) { return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80; };
  const bool v6 = want.family == AF_INET6;
  int found = -1, foundLinkLocal = -1, firstV2 = -1, v2Ipv4 = -1;
  for (size_t i = 0; i < table.size(); ++i) {
    const GidEntry& e = table[i];
    if (isZero(e.gid)) continue;
    const bool ipv4 = isIpv4Mapped(e.gid);
    if (e.version == 2) {
      if (firstV2 < 0) firstV2 = int(i);
      if (v2Ipv4 < 0 && ipv4) v2Ipv4 = int(i);
    }
    if (e.version != want.version || ipv4 == v6 || !inRange(e.gid)) continue;
    int& slot = v6 && linkLocal(e.gid) ? foundLinkLocal : found;
    if (slot < 0) slot = int(i);
  }
  if (found < 0) found = foundLinkLocal;
  if (found >= 0) return found;
  if (unmet) *unmet = "no GID of " + want.describe();
  return v2Ipv4 >= 0 ? v2Ipv4 : firstV2 >= 0 ? firstV2 : 0;
}

std::vector<PortInfo> discoverPorts(std::string* why) {
  std::vector<PortInfo> out;
  const Verbs* v = verbs(why);
  if (!v) return out;
  auto cfg = settings::current();
  const HcaFilter filter = HcaFilter::parse(cfg->getString("NCCL_IB_HCA"));
  const int wantedGid = int(cfg->getInt("NCCL_IB_GID_INDEX"));
  std::string preferenceWarning;
  const GidPreference preference = GidPreference::fromSettings(&preferenceWarning);
  if (!preferenceWarning.empty()) LOOM_WARN("verbs: %s", preferenceWarning.c_str());
  int count = 0;
  ibv_device** list = v->getDeviceList(&count);
  if (!list) {
    *why = "no verbs devices (" + std::string(std::strerror(errno)) + ")";
    return out;
  }
  std::string skipped;
  for (int d = 0; d < count; ++d) {
    const std::string name = v->getDeviceName(list[d]);
    ibv_context* ctx = v->openDevice(list[d]);
    if (!ctx) {
      skipped += " " + name + " (cannot open: " + std::strerror(errno) + ")";
      continue;
    }
    ibv_device_attr dev{};
    if (v->queryDevice(ctx, &dev) == 0) {
      for (int port = 1; port <= dev.phys_port_cnt; ++port) {
        if (!filter.accepts(name, port)) {
          skipped += " " + name + ":" + std::to_string(port) + " (NCCL_IB_HCA)";
          continue;
        }
        ibv_port_attr a{};
        if (queryPort(*v, ctx, uint8_t(port), &a) != 0) continue;
        if (a.state != IBV_PORT_ACTIVE) {
          skipped += " " + name + ":" + std::to_string(port) + " (not active)";
          continue;
        }
        PortInfo p;
        p.device = name;
        p.port = port;
        p.ethernet = a.link_layer == IBV_LINK_LAYER_ETHERNET;
        p.lid = a.lid;
        p.activeMtu = a.active_mtu;
        p.gbps = widthFactor(a.active_width) * laneGbps(a);
        p.maxQpWr = dev.max_qp_wr;
        if (p.ethernet) {
          chooseGid(*v, ctx, &p, a.gid_tbl_len, wantedGid, preference);
        } else {
          p.gidIndex = wantedGid >= 0 ? wantedGid : 0;
          v->queryGid(ctx, uint8_t(port), p.gidIndex, &p.gid);
        }
        out.push_back(std::move(p));
      }
    }
    v->closeDevice(ctx);
  }
  v->freeDeviceList(list);
  if (out.empty()) {
    *why = count == 0 ? "no verbs devices found"
                      : "no usable verbs port among " + std::to_string(count) + " device(s):" + skipped;
  }
  return out;
}

// ---- opened devices -----------------------------------------------------------

namespace {

struct OpenDevices {
  std::mutex mu;
  pid_t pid = 0;  // a forked child opens its own
  std::map<std::string, std::weak_ptr<Device>> byName;
};
OpenDevices& openDevices() {
  static OpenDevices* d = new OpenDevices;  // outlives connections destroyed at exit
  return *d;
}

}  // namespace

Device::Device(std::string name, ibv_context* context, ibv_pd* pd)
    : name_(std::move(name)), context_(context), pd_(pd) {}

Device::~Device() {
  const Verbs* v = verbs();
  if (pd_) v->deallocPd(pd_);
  if (context_) v->closeDevice(context_);
}

Result<std::shared_ptr<Device>> Device::open(const std::string& name) {
  std::string why;
  const Verbs* v = verbs(&why);
  if (!v) return systemError(why);
  OpenDevices& all = openDevices();
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.pid != ::getpid()) {
    all.byName.clear();
    all.pid = ::getpid();
  }
  if (auto d = all.byName[name].lock()) return d;
  int count = 0;
  ibv_device** list = v->getDeviceList(&count);
  if (!list) return systemErrno("listing verbs devices", errno);
  ibv_context* ctx = nullptr;
  int err = ENODEV;
  for (int i = 0; i < count && !ctx; ++i) {
    if (name != v->getDeviceName(list[i])) continue;
    ctx = v->openDevice(list[i]);
    if (!ctx) err = errno;
  }
  v->freeDeviceList(list);
  if (!ctx) return systemErrno("opening verbs device " + name, err);
  // Async events are read without blocking, from any connection's progress().
  const int flags = ::fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    const int e = errno;
    v->closeDevice(ctx);
    return systemErrno("making the async event fd of " + name + " non-blocking", e);
  }
  ibv_pd* pd = v->allocPd(ctx);
  if (!pd) {
    const int e = errno;
    v->closeDevice(ctx);
    return systemErrno("allocating a protection domain on " + name, e);
  }
  std::shared_ptr<Device> d(new Device(name, ctx, pd));
  all.byName[name] = d;
  return d;
}

Status Device::pollEvents(int port, const std::vector<ibv_qp*>& qps) {
  const Verbs* v = verbs();
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    ibv_async_event e{};
    if (v->getAsyncEvent(context_, &e) != 0) break;  // EAGAIN: none waiting
    const std::string what = eventText(e.event_type);
    switch (e.event_type) {
      case IBV_EVENT_DEVICE_FATAL:
        if (fatal_.empty()) fatal_ = "device " + name_ + " reported a fatal error: " + what;
        break;
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_PORT_ACTIVE: {
        const size_t p = size_t(e.element.port_num);
        if (portDown_.size() <= p) portDown_.resize(p + 1);
        portDown_[p] = e.event_type == IBV_EVENT_PORT_ERR ? "port " + name_ + ":" + std::to_string(p) + " went down" : "";
        break;
      }
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        qpErrors_.emplace_back(e.element.qp, "queue pair " + std::to_string(e.element.qp->qp_num) + " on " + name_ +
                                                 " entered the error state: " + what);
        break;
      default:
        LOOM_INFO(log::kNet, "verbs device %s: %s", name_.c_str(), what.c_str());
        break;
    }
    v->ackAsyncEvent(&e);
  }
  if (!fatal_.empty()) return remoteError(fatal_);
  if (size_t(port) < portDown_.size() && !portDown_[size_t(port)].empty()) return remoteError(portDown_[size_t(port)]);
  for (auto it = qpErrors_.begin(); it != qpErrors_.end(); ++it) {
    if (std::find(qps.begin(), qps.end(), it->first) == qps.end()) continue;
    std::string text = it->second;
    qpErrors_.erase(it);
    return remoteError(text);
  }
  return Status::ok();
}

void Device::forget(const ibv_qp* qp) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(qpErrors_, [qp](const auto& e) { return e.first == qp; });
}

}  // namespace loom::transport::ib
