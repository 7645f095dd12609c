#include "transport/cudaipc/transport.h"

#include "common/settings.h"
#include "transport/cudaipc/connection.h"
#include "transport/cudaipc/endpoint.h"

namespace loom::transport::cudaipc {
namespace {

// Slot size: an eighth of NCCL_BUFFSIZE (NCCL's 8-slot FIFO of 4 MiB).
size_t slotBytesFromSettings() {
  const int64_t buff = settings::current()->getInt("NCCL_BUFFSIZE");
  return size_t(std::max<int64_t>(buff, 64 << 10) / kSlots);
}

class CudaIpcBackend final : public Backend {
 public:
  const char* name() const override { return "cudaipc"; }
  bool moves(MemoryType) const override { return true; }

  std::string whyNot(const PeerView& self, const PeerView& peer, const Selection& selection) const override {
    if (selection.p2pDisabled) return "NCCL_P2P_DISABLE=1";
    if (self.memory != MemoryType::kDevice || peer.memory != MemoryType::kDevice) return "the buffers are host memory";
    if (self.hostHash != peer.hostHash) return "the ranks are on different hosts";
    if (!device::api()) return "this build has no CUDA";
    return "";
  }

  Result<std::unique_ptr<Connection>> listen(int peer, const Selection&, std::vector<uint8_t>* endpoint) const override {
    LOOM_ASSIGN_OR_RETURN(auto conn, CudaIpcConnection::create(peer, device::api(), slotBytesFromSettings()));
    conn->deferMapping(true);  // the engine's: a user's stream may wait on its operations
    writeEndpoint(conn->local(), endpoint);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Status connect(Connection& half, std::span<const uint8_t> peerEndpoint) const override {
    LOOM_ASSIGN_OR_RETURN(Descriptor d, readEndpoint(peerEndpoint));
    return static_cast<CudaIpcConnection&>(half).attach(d);
  }
};

}  // namespace

const Backend& backend() {
  static const CudaIpcBackend instance;
  return instance;
}

}  // namespace loom::transport::cudaipc
