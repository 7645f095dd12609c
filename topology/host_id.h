// Which host a process runs on, for grouping ranks by host.
#pragma once

#include <cstdint>
#include <string>

namespace loom::topology {

// Hash of (hostname, kernel boot id), or of NCCL_HOSTID when set: network
// namespaces on one machine share hostname and boot id, so multi-host tests
// give each "host" its own NCCL_HOSTID.
uint64_t hostHash();
// Short host name (up to the first dot).
std::string hostName();

}  // namespace loom::topology
