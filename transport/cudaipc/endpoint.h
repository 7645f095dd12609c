// The CUDA IPC endpoint: a cudaipc::Descriptor as it travels in the
// registry's offer. Version 1: process nonce, inbox address, IPC handle (64
// bytes), slot bytes, slot count, then the control connection's shm
// endpoint as a nested blob (transport/endpoint.h's rules).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "transport/cudaipc/connection.h"

namespace loom::transport::cudaipc {

void writeEndpoint(const Descriptor& d, std::vector<uint8_t>* out);
// Any blob: a short, long or other-version one is an error, never a crash.
Result<Descriptor> readEndpoint(std::span<const uint8_t> blob);

}  // namespace loom::transport::cudaipc
