// The verbs backend (NCCL_NET=IB) for the transport registry
// (transport/registry.h): pairs whose ranks both have a usable verbs port
// and that no same-host backend took (ranks on different hosts, or on one
// host with NCCL_SHM_DISABLE=1). Its endpoint (transport/ib/endpoint.h)
// carries the queue pair numbers, address and FIFO key the peer connects to.
#pragma once

#include <string>
#include <vector>

#include "transport/ib/device.h"
#include "transport/registry.h"

namespace loom::transport::ib {

const Backend& backend();

// The usable ports of this process under the current settings, discovered
// once per (NCCL_IB_HCA, NCCL_IB_GID_INDEX); empty with *why set when none.
std::vector<PortInfo> usablePorts(std::string* why);

}  // namespace loom::transport::ib
