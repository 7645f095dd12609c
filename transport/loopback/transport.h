// The loopback backend for the transport registry (transport/registry.h): a
// rank's connection to itself, within one process, so nothing is traded.
#pragma once

#include <memory>

#include "transport/connection.h"

namespace loom::transport::loopback {

std::unique_ptr<Connection> open(int rank);

}  // namespace loom::transport::loopback
