// Verbs devices: which HCA ports loom may use (NCCL_IB_HCA), what each is
// (link layer, MTU, speed, the GID its queue pairs address), and the opened
// device a port's connections share (its context, protection domain and
// async events).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/ib/verbs.h"

namespace loom::transport::ib {

// NCCL_IB_HCA: a comma-separated list of device names, each optionally
// with ":port". A leading '^' makes it an exclusion list; a leading '='
// (after any '^') matches names exactly instead of as prefixes ("mlx5_1"
// also matches "mlx5_10" without it). Empty: every device.
class HcaFilter {
 public:
  static HcaFilter parse(std::string_view spec);
  bool accepts(std::string_view device, int port) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string name;
    int port = -1;  // -1: every port
  };
  std::vector<Entry> entries_;
  bool exclude_ = false;
  bool exact_ = false;
};

// One usable port, as discovered.
struct PortInfo {
  std::string device;  // "mlx5_0", "rxe0"
  int port = 1;
  bool ethernet = false;  // RoCE; false: InfiniBand
  uint16_t lid = 0;
  ibv_mtu activeMtu = IBV_MTU_1024;
  int gidIndex = 0;
  ibv_gid gid{};
  std::string gidType;  // "RoCE v2", "IB/RoCE v1" (from sysfs; "" when unknown)
  double gbps = 0;      // active width x speed
  int maxQpWr = 0;
  std::string describe() const;  // "rxe0:1 (RoCE, 2.5 Gb/s, MTU 1024, GID 0)"
};

// One entry of a RoCE port's GID table, as the GID auto-selection sees it.
struct GidEntry {
  ibv_gid gid{};
  int version = 0;  // RoCE version from sysfs: 1 ("IB/RoCE v1"), 2 ("RoCE v2"), 0 unknown
};

// What the auto-selection looks for (NCCL's settings): a GID of RoCE
// version NCCL_IB_ROCE_VERSION_NUM (2) holding an address of family
// NCCL_IB_ADDR_FAMILY (else NCCL_SOCKET_FAMILY, else AF_INET) within
// NCCL_IB_ADDR_RANGE (CIDR, e.g. 10.0.0.0/8 or fd00::/8; unset: any).
struct GidPreference {
  int family = 0;   // AF_INET or AF_INET6 (0 is taken as AF_INET)
  int version = 2;  // 1 or 2
  // The range as a prefix of the GID (IPv4 ranges as IPv4-mapped ones).
  ibv_gid prefix{};
  int prefixBits = 0;  // 0: any address
  // `familySetting`: where `family` came from, for errors.
  static Result<GidPreference> make(std::string_view family, int version, std::string_view range,
                                    std::string_view familySetting = "NCCL_IB_ADDR_FAMILY");
  // From the settings; values it cannot use are a warning (*warning) and
  // the defaults stand.
  static GidPreference fromSettings(std::string* warning);
  std::string describe() const;  // "RoCE v2, AF_INET6 in 2001:db8::/32"
};

// The GID index the auto-selection takes from `table`: the first entry of
// the wanted version and family (IPv6: a global address before a
// link-local fe80::/10 one) within the range. Where none matches (said in
// *unmet), what loom took before these settings existed: the first RoCE v2
// GID with an IPv4 address, else the first RoCE v2 GID, else index 0.
int pickGid(std::span<const GidEntry> table, const GidPreference& want, std::string* unmet);

// The ports NCCL_IB_HCA admits that are ACTIVE, in device order, with their
// GID chosen: NCCL_IB_GID_INDEX when set (>= 0), else on RoCE pickGid()'s,
// else index 0. Empty with *why set when there is none (or no libibverbs).
std::vector<PortInfo> discoverPorts(std::string* why);

// An opened device: context and protection domain, shared by the
// connections on its ports, closed when the last one goes. Its async events
// (a port going down, a QP in error) are read by whichever connection polls
// them; what they say is kept here.
class Device {
 public:
  // The open device of that name (opened on first use).
  static Result<std::shared_ptr<Device>> open(const std::string& name);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }

  // Reads the async events that are waiting (never blocks). Returns the
  // first fatal one for `port` or for one of `qps` as an error, sticky per
  // device for device-wide ones (a fatal device error), per port for a port
  // that went down.
  Status pollEvents(int port, const std::vector<ibv_qp*>& qps);
  // Drops what was recorded for a queue pair about to be destroyed.
  void forget(const ibv_qp* qp);

 private:
  Device(std::string name, ibv_context* context, ibv_pd* pd);
  std::string name_;
  ibv_context* context_;
  ibv_pd* pd_;
  std::mutex mu_;  // connections of several communicators may poll at once
  std::string fatal_;                 // device-wide, sticky
  std::vector<std::string> portDown_; // per port number, "" while up
  std::vector<std::pair<const ibv_qp*, std::string>> qpErrors_;
};

}  // namespace loom::transport::ib
