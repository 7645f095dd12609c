// The rendezvous root: a thread that serves one communicator's init.
//
// Every rank connects, proves the secret and sends its RankInfo; when all
// nranks have joined, the root sends each rank its two ring neighbours'
// RankInfos (to all ranks at once, so a slow one delays nobody) and exits;
// the ranks gather the whole table over their ring (Bootstrap::joinRoot). Connections
// that send garbage, a wrong secret, a duplicate or out-of-range rank are
// answered (where possible) and closed; silent ones are dropped at their
// deadline; none of them delays the others. If not all ranks join within
// the init timeout (counted from the first join), every waiting rank gets a
// message naming the missing ranks; a root nobody joins ends after the init
// timeout too, releasing its thread and port.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "common/status.h"
#include "core/wire.h"
#include "transport/net/socket.h"

namespace loom::core {

struct RootOptions {
  uint64_t secret[2] = {0, 0};
  double initTimeoutS = 300;
};

// A running root. Destroying the handle stops the root (ranks still waiting
// are told the rendezvous was stopped) and joins its thread.
class RootServer {
 public:
  // Takes ownership of a listening socket and serves it on a new thread.
  static Result<std::unique_ptr<RootServer>> start(net::UniqueFd listener, const RootOptions& options);
  ~RootServer();
  RootServer(const RootServer&) = delete;
  RootServer& operator=(const RootServer&) = delete;
  // Lets the root run to its natural end on its own (ncclGetUniqueId: no
  // communicator owns it); it still ends at its deadline.
  static void detach(std::unique_ptr<RootServer> root);

  struct Control;  // shared with the root's thread (root.cc)

 private:
  RootServer() = default;
  std::shared_ptr<Control> control_;
  std::thread thread_;
};

// Checks a join request (a Hello followed by `payload`, the joining rank's
// RankInfo blob) against the root's secret and the nranks announced so far
// (0: none yet); on success *info is the decoded blob. Every refusal is
// kInvalidArgument; its message is what the root tells the rank.
Status checkJoin(const wire::Hello& h, std::span<const uint8_t> payload, wire::RankInfo* info,
                 const uint64_t secret[2], int nranksSoFar);

}  // namespace loom::core
