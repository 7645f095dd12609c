// The CUDA IPC backend for the transport registry (transport/registry.h):
// cuda-mode ranks of one host, device buffers moved GPU to GPU
// (transport/cudaipc/connection.h). First in the registry's order; a pair
// whose mapping fails moves on to shared memory.
#pragma once

#include "transport/registry.h"

namespace loom::transport::cudaipc {

const Backend& backend();

}  // namespace loom::transport::cudaipc
