// The socket backend (NCCL_NET=Socket) for the transport registry
// (transport/registry.h): the connection every pair starts on, over the
// sockets core connected through the bootstrap (each one proved the job's
// secret in its hello, so the sockets are the endpoint: there is no blob to
// trade), and the one a pair keeps when no backend above it applies.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "transport/connection.h"
#include "transport/net/socket.h"

namespace loom::transport::tcp {

// A connection over `sockets`, all connected to `peer`; messages of at least
// stripeMin bytes are striped across them (transport/tcp/connection.h).
std::unique_ptr<Connection> open(int peer, std::vector<net::UniqueFd> sockets, size_t stripeMin);

}  // namespace loom::transport::tcp
