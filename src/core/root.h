// The rendezvous root: a detached thread that serves one communicator's init.
//
// Every rank connects, proves the secret and sends its RankInfo; when all
// nranks have joined, the root sends everybody the table of all RankInfos
// and exits. Connections that send garbage, a wrong secret, a duplicate or
// out-of-range rank are answered (where possible) and closed; silent ones
// are dropped at their deadline; none of them delays the others. If not all
// ranks join within the init timeout (counted from the first join), every
// waiting rank gets a message naming the missing ranks.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace loom::core {

struct RootOptions {
  uint64_t secret[2] = {0, 0};
  double initTimeoutS = 300;
};

// Takes ownership of a listening socket and serves it on a detached thread.
Status startRoot(net::UniqueFd listener, const RootOptions& options);

}  // namespace loom::core
