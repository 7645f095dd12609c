// Verbs devices: which HCA ports loom may use (NCCL_IB_HCA), what each is
// (link layer, MTU, speed, the GID its queue pairs address), and the opened
// device a port's connections share (its context, protection domain and
// async events).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
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

// The ports NCCL_IB_HCA admits that are ACTIVE, in device order, with their
// GID chosen: NCCL_IB_GID_INDEX when set (>= 0), else on RoCE the first
// RoCE v2 GID holding an IPv4-mapped address, else the first RoCE v2 GID,
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
