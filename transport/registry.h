// The transport registry: the backends that can carry a pair's data instead
// of the network connection every pair starts with, in order of preference,
// the choice for one pair, and the network and self connections. How core
// uses it: transport/transport.h.
//
// A backend:
//  - name(): short and stable ("shm"); it appears in logs and on the wire;
//  - moves(): the memory types it can carry; choose() never hands a pair
//    whose buffers are of another type to it, except device buffers to a
//    backend that moves pinned host memory: the engine stages them through
//    pinned slots (core/executor.h);
//  - whyNot(): "" when it can connect this pair, else the reason (logged);
//    decided only from what both ranks know of each other (PeerView) and
//    the settings, so both sides reach the same answer;
//  - listen(): this side's half, not yet usable, and its endpoint: a
//    self-describing blob (see transport/endpoint.h) the peer's connect()
//    reads; it travels over the authenticated network connection;
//  - connect(): attaches the half to the peer's endpoint. After both sides
//    connected, the half is a Connection (transport/connection.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/connection.h"
#include "transport/net/socket.h"

namespace loom::transport {

// Transports a rank can use, as it tells its peers in the init exchange.
inline constexpr uint32_t kTransportVerbs = 1u << 0;  // a usable verbs port (transport/ib)
inline constexpr uint32_t kTransportShm = 1u << 1;    // shared memory allowed (no NCCL_SHM_DISABLE)

// What the two ranks of a pair know of each other (from the init exchange).
struct PeerView {
  int rank = -1;
  uint64_t hostHash = 0;     // equal: same host (NCCL_HOSTID, else hostname + boot id)
  uint32_t pid = 0;
  MemoryType memory = MemoryType::kHost;  // what the communicator's buffers are
  uint32_t transports = 0;                // kTransport* bits
};

// Settings that steer the choice, read once per communicator.
struct Selection {
  bool shmDisabled = false;  // NCCL_SHM_DISABLE
  bool p2pDisabled = false;  // NCCL_P2P_DISABLE (GPU to GPU on one host, CUDA IPC)
  bool ibDisabled = false;   // NCCL_IB_DISABLE
  std::string net;           // NCCL_NET as given; empty: the best available
  std::string netSource = "NCCL_NET";  // where `net` came from, for messages
  // "NCCL_NET=IB" (or "ncclConfig_t.netName=IB").
  std::string describeNet() const { return netSource + "=" + net; }
  // ncclConfig_t.trafficClass of the communicator (-1: none): the verbs
  // queue pairs' class of service where NCCL_IB_TC / NCCL_IB_SL are unset.
  int trafficClass = -1;
  static Selection fromSettings();

  // The network backend every pair starts on (and keeps when no backend
  // above applies), by NCCL's name ("Socket"), or why the one NCCL_NET
  // names cannot be used: a named network is required, not a hint.
  Result<std::string> network() const;
  // True unless NCCL_NET names a network other than this one (NCCL's name).
  bool wantsNetwork(std::string_view ncclName) const;
  // True when NCCL_NET names IB: a pair no same-host backend takes must
  // then use verbs, and fails rather than fall back to sockets.
  bool requiresVerbs() const;
};

// The kTransport* bits this process can offer under `selection`.
uint32_t localTransports(const Selection& selection);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool moves(MemoryType m) const = 0;
  virtual std::string whyNot(const PeerView& self, const PeerView& peer, const Selection& selection) const = 0;
  virtual Result<std::unique_ptr<Connection>> listen(int peer, const Selection& selection,
                                                     std::vector<uint8_t>* endpoint) const = 0;
  virtual Status connect(Connection& half, std::span<const uint8_t> peerEndpoint) const = 0;
};

// The backends, best first.
std::span<const Backend* const> backends();

// The first backend that can connect the pair, or null (the pair keeps its
// network connection). *reasons collects why better ones could not. With
// `after`, only backends after that one are considered (the pair tried it
// and its connect failed on one side).
const Backend* choose(const PeerView& self, const PeerView& peer, const Selection& selection,
                      std::string* reasons, const Backend* after = nullptr);

// The backend of that name, or null.
const Backend* find(std::string_view name);

// The network connection every pair starts on, over `sockets` that core
// connected through the bootstrap (authenticated hellos); messages of at
// least stripeMin bytes are striped across them.
std::unique_ptr<Connection> openNetwork(int peer, std::vector<net::UniqueFd> sockets, size_t stripeMin);

// A rank's connection to itself.
std::unique_ptr<Connection> openSelf(int rank);

}  // namespace loom::transport
