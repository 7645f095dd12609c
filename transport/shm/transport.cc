#include "transport/shm/transport.h"

#include "transport/shm/connection.h"
#include "transport/shm/endpoint.h"

namespace loom::transport::shm {
namespace {

class ShmBackend final : public Backend {
 public:
  const char* name() const override { return "shm"; }
  bool moves(MemoryType m) const override { return m != MemoryType::kDevice; }

  std::string whyNot(const PeerView& self, const PeerView& peer, const Selection& selection) const override {
    if (selection.shmDisabled) return "NCCL_SHM_DISABLE=1";
    if (self.hostHash != peer.hostHash) return "the ranks are on different hosts";
    // Both sides must choose alike: a peer with it off talks TCP only.
    if (!(peer.transports & kTransportShm))
      return "rank " + std::to_string(peer.rank) + " has shared memory off (NCCL_SHM_DISABLE=1)";
    return "";
  }

  Result<std::unique_ptr<Connection>> listen(int peer, const Selection&, std::vector<uint8_t>* endpoint) const override {
    LOOM_ASSIGN_OR_RETURN(auto conn, ShmConnection::create(peer, ShmConnection::Options::fromSettings()));
    writeEndpoint(conn->local(), endpoint);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Status connect(Connection& half, std::span<const uint8_t> peerEndpoint) const override {
    LOOM_ASSIGN_OR_RETURN(ShmDescriptor d, readEndpoint(peerEndpoint));
    return static_cast<ShmConnection&>(half).attach(d);
  }
};

}  // namespace

const Backend& backend() {
  static const ShmBackend instance;
  return instance;
}

}  // namespace loom::transport::shm
