// Helpers for the transport tests: real TCP socket pairs over loopback and
// deadline-bounded waits on Connections.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/connection.h"
#include "transport/net/socket.h"

namespace loom::transport::testing {

struct SocketSets {
  std::vector<net::UniqueFd> a;  // a[i] is connected to b[i]
  std::vector<net::UniqueFd> b;
};

// n connected TCP socket pairs over 127.0.0.1, in matching order. Fails the
// calling test (via the returned Status) if loopback TCP does not work.
Result<SocketSets> makeTcpSockets(size_t n);

// Runs progress()/poll until every transfer is done, an error occurs or the
// deadline passes (then kRemoteError "timed out").
Status waitAll(Connection& c, const std::vector<Transfer*>& transfers, Deadline deadline);

// Runs progress()/poll until progress() fails or the deadline passes; returns
// the failure, or ok if it never failed.
Status waitForError(Connection& c, Deadline deadline);

// Deterministic payload pattern for message `index` of `stream`.
void fillPattern(uint8_t* data, size_t bytes, uint32_t stream, uint32_t index);
bool checkPattern(const uint8_t* data, size_t bytes, uint32_t stream, uint32_t index);

}  // namespace loom::transport::testing
