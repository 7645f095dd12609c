#include "transport/loopback/transport.h"

#include "transport/loopback/connection.h"

namespace loom::transport::loopback {

std::unique_ptr<Connection> open(int rank) { return std::make_unique<LoopbackConnection>(rank); }

}  // namespace loom::transport::loopback
