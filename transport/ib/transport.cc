#include "transport/ib/transport.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "common/log.h"
#include "common/settings.h"
#include "transport/ib/connection.h"
#include "transport/ib/endpoint.h"

namespace loom::transport::ib {

std::vector<PortInfo> usablePorts(std::string* why) {
  struct Found {
    std::vector<PortInfo> ports;
    std::string why;
  };
  static std::mutex mu;
  static pid_t pid = 0;
  static std::map<std::string, Found> cache;
  auto cfg = settings::current();
  const std::string key = cfg->getString("NCCL_IB_HCA") + "\n" + std::to_string(cfg->getInt("NCCL_IB_GID_INDEX"));
  std::lock_guard<std::mutex> lock(mu);
  if (pid != ::getpid()) {
    cache.clear();
    pid = ::getpid();
  }
  auto it = cache.find(key);
  if (it == cache.end()) {
    Found f;
    f.ports = discoverPorts(&f.why);
    if (f.ports.empty()) {
      LOOM_INFO(log::kNet | log::kInit, "verbs: %s", f.why.c_str());
    } else {
      for (const PortInfo& p : f.ports) LOOM_INFO(log::kNet | log::kInit, "verbs port %s", p.describe().c_str());
      std::string whyNot;
      const std::string relaxed = relaxedOrdering(*verbs(), &whyNot) ? "yes" : "no (" + whyNot + ")";
      LOOM_INFO(log::kNet | log::kInit, "verbs: registrations ask for PCIe relaxed ordering: %s", relaxed.c_str());
    }
    it = cache.emplace(key, std::move(f)).first;
  }
  if (why) *why = it->second.why;
  return it->second.ports;
}

namespace {

class IbBackend final : public Backend {
 public:
  const char* name() const override { return "ib"; }
  // Device buffers only with GPUDirect (LOOM_IB_GPUDIRECT, untested); else
  // the engine stages them through pinned host memory.
  bool moves(MemoryType m) const override {
    return m != MemoryType::kDevice || IbConnection::gpuDirectWhyNot().empty();
  }

  std::string whyNot(const PeerView& self, const PeerView& peer, const Selection& selection) const override {
    if (selection.ibDisabled) return "NCCL_IB_DISABLE=1";
    if (!selection.wantsNetwork("IB")) return selection.describeNet();
    if (!(self.transports & kTransportVerbs)) return "this rank has no usable verbs port";
    if (!(peer.transports & kTransportVerbs)) return "rank " + std::to_string(peer.rank) + " has no usable verbs port";
    return "";
  }

  Result<std::unique_ptr<Connection>> listen(int peer, const Selection& selection,
                                             std::vector<uint8_t>* endpoint) const override {
    std::string why;
    const std::vector<PortInfo> ports = usablePorts(&why);
    if (ports.empty()) return systemError("no usable verbs port: " + why);
    LOOM_ASSIGN_OR_RETURN(auto conn, IbConnection::create(peer, ports[0],
                                                          IbConnection::Options::fromSettings(selection.trafficClass)));
    writeEndpoint(conn->endpoint(), endpoint);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Status connect(Connection& half, std::span<const uint8_t> peerEndpoint) const override {
    auto& conn = static_cast<IbConnection&>(half);
    LOOM_ASSIGN_OR_RETURN(IbEndpoint e, readEndpoint(peerEndpoint, kSlots, conn.slotStride()));
    return conn.attach(e);
  }
};

}  // namespace

const Backend& backend() {
  static const IbBackend instance;
  return instance;
}

}  // namespace loom::transport::ib
