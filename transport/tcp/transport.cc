#include "transport/tcp/transport.h"

#include "transport/tcp/connection.h"

namespace loom::transport::tcp {

std::unique_ptr<Connection> open(int peer, std::vector<net::UniqueFd> sockets, size_t stripeMin) {
  return std::make_unique<TcpConnection>(peer, std::move(sockets), stripeMin);
}

}  // namespace loom::transport::tcp
