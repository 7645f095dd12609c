// The shared-memory backend for the transport registry (transport/registry.h):
// ranks of one host with host buffers. Its endpoint carries the fields of the
// ShmDescriptor (transport/shm/inbox.h) the peer attaches to.
#pragma once

#include "transport/registry.h"

namespace loom::transport::shm {

const Backend& backend();

}  // namespace loom::transport::shm
