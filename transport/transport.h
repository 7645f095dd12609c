// loom's transport interface, in a page. Core includes this header only; it
// never names a backend.
//
// A backend moves ordered messages between two ranks. How a pair of ranks
// gets its connection (core/peer_link.h drives it, without blocking):
//  1. Network. Every pair first connects sockets through the bootstrap; each
//     socket proves the job's secret in its hello. openNetwork() carries
//     data over them (the socket backend, NCCL_NET=Socket). A rank talks to
//     itself through openSelf().
//  2. Choice. choose() walks backends() best first and takes the first one
//     that moves both ranks' memory type (device memory: or pinned host
//     memory, which the engine stages it through) and whose whyNot() is
//     empty; the
//     reasons the better ones gave are logged. Both sides decide from the
//     same facts (PeerView, Selection), so they agree without talking.
//  3. Upgrade. Both sides listen() (their half plus an endpoint blob), trade
//     offers and endpoints over the network connection, connect() their half
//     to the peer's endpoint, and trade verdicts: only when both succeeded
//     is the new connection used; otherwise the pair keeps the network one.
//
// What a backend implements, in transport/<name>/:
//  transport.{h,cc}  its Backend (registry.h): name() (short, stable, on the
//                    wire and in logs), moves(MemoryType), whyNot(self, peer,
//                    selection), listen(peer, &endpoint), connect(half,
//                    endpoint). Joining: one line in backends()
//                    (registry.cc) and one kit line in the conformance
//                    suite (tests/unit/transport/conformance_test.cc).
//  endpoint.{h,cc}   its endpoint: EndpointWriter/Reader (endpoint.h), the
//                    version first, every field bounds-checked; a blob from
//                    the peer is never trusted (tests/fuzz/fuzz_endpoints.cc
//                    feeds readers arbitrary bytes). Backends whose
//                    connection data is the bootstrap's sockets (tcp) or
//                    nothing (loopback) have none.
//  connection.{h,cc} its Connection (connection.h):
//   - queueSend/queueRecv: called by postSend/postRecv after the common
//     checks; they only queue. progress() moves what it can without
//     blocking and marks transfers done in posting order per direction.
//   - Messages match in posting order; a size the peer did not post is an
//     error, never truncation.
//   - pollFds(): fds whose readiness lets progress() move bytes (none: the
//     waiter spins and yields); idle(): nothing queued.
//   - Memory: moves() per MemoryType; registerMemory() hands out a Region
//     (the base class when nothing is needed); needsRegistration() when
//     unregistered memory cannot move (core then registers every buffer,
//     core/registration.h). A receive with a sink may be handed its bytes
//     in place (Transfer::sunk); with hold, that memory stays valid until
//     release().
//   - Errors are sticky and say what happened and to whom: kRemoteError
//     for what the peer did (closed, died, sent garbage; name its rank),
//     kSystemError for a local resource failure (with errnoText()),
//     kInvalidUsage for a caller's mistake. A dead peer is noticed by
//     progress() within a bounded time, never a hang.
//   - Abort is core's, the same for every backend: it stops calling
//     progress() and destroys the connection. Destructors return promptly,
//     block on nothing the peer controls, and release every fd, mapping
//     and thread they own.
//   - One thread at a time uses a connection; it starts no threads of its
//     own unless it joins them in its destructor.
// Shared helpers: net/socket.h (sockets, addresses, deadline-bounded I/O),
// ring.h (allocation-free queues), endpoint.h, errnoText() (common/status.h).
#pragma once

#include "transport/connection.h"
#include "transport/endpoint.h"
#include "transport/registry.h"
