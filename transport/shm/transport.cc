#include "transport/shm/transport.h"

#include "transport/endpoint.h"
#include "transport/shm/connection.h"

namespace loom::transport::shm {
namespace {

constexpr uint32_t kEndpointVersion = 1;

class ShmBackend final : public Backend {
 public:
  const char* name() const override { return "shm"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice; }

  std::string whyNot(const PeerView& self, const PeerView& peer, const Selection& selection) const override {
    if (selection.shmDisabled) return "NCCL_SHM_DISABLE=1";
    if (self.hostHash != peer.hostHash) return "the ranks are on different hosts";
    return "";
  }

  Result<std::unique_ptr<Connection>> listen(int peer, std::vector<uint8_t>* endpoint) const override {
    LOOM_ASSIGN_OR_RETURN(auto conn, ShmConnection::create(peer, ShmConnection::Options::fromSettings()));
    const ShmDescriptor& d = conn->local();
    EndpointWriter w(endpoint, kEndpointVersion);
    w.put(d.magic);
    w.put(d.nonce);
    w.put(d.inboxBytes);
    w.put(d.pid);
    w.put(d.memfd);
    w.put(d.wakeFd);
    w.put(d.version);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Status connect(Connection& half, std::span<const uint8_t> peerEndpoint) const override {
    EndpointReader r(peerEndpoint, "shared-memory endpoint");
    LOOM_TRY(r.expectVersion(kEndpointVersion));
    ShmDescriptor d;
    r.get(&d.magic);
    r.get(&d.nonce);
    r.get(&d.inboxBytes);
    r.get(&d.pid);
    r.get(&d.memfd);
    r.get(&d.wakeFd);
    r.get(&d.version);
    LOOM_TRY(r.finish());
    return static_cast<ShmConnection&>(half).attach(d);
  }
};

}  // namespace

const Backend& backend() {
  static const ShmBackend instance;
  return instance;
}

}  // namespace loom::transport::shm
