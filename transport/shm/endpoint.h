// The shared-memory endpoint: the ShmDescriptor (transport/shm/inbox.h) a
// peer attaches to, as it travels in the registry's offer. Version 1 is the
// descriptor's fields in declaration order (transport/endpoint.h's rules).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "transport/shm/inbox.h"

namespace loom::transport::shm {

void writeEndpoint(const ShmDescriptor& d, std::vector<uint8_t>* out);
// Any blob: a short, long or other-version one is an error, never a crash.
Result<ShmDescriptor> readEndpoint(std::span<const uint8_t> blob);

}  // namespace loom::transport::shm
