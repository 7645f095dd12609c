// Plans: what one rank does for one operation, as data.
//
// A Plan holds streams; the steps of one stream run in order, streams run
// concurrently. Each stream runs on one channel: its messages go over that
// channel's connections, so plans address connections as (peer, channel)
// and a communicator holds one connection per pair and channel. A
// collective uses one stream per channel; grouped point-to-point calls use
// one stream per (peer, direction), so that messages on a connection are
// posted in the same order on both sides.
//
// A Step is the unit of the ring/chain/tree pseudocode:
//   send            : out = pre(local)              -> sendPeer
//   recvReduceSend  : out = in (+) pre(local)       -> sendPeer
//   recvReduceCopy  : out = post(in (+) pre(local)) into a user buffer
//   recvCopySend    : out = in (stored in a user buffer) -> sendPeer
//   recv            : out = in
//   copy            : out = local
//   fanIn           : out = post(fold of in_0, in_1, ... and pre(local)),
//                     or of local itself when it is a partial result
//                     already (localPartial: recursive doubling's rounds)
// where `in` is a message received from recvPeer. A fan-in step (the
// one-shot algorithms) receives one message from each rank of `fanIn` at
// once and folds them, with `local` at place `localAt`, strictly in the
// listed order: ranks that list the same sources in the same order get the
// same bits. Which one a Step is follows from its fields; stepName() prints
// it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::core {

// A place in one of the operation's buffers. Buffers are numbered: a
// collective has 0 = send buffer, 1 = receive buffer; merged point-to-point
// calls have 2i and 2i+1 for call i. The executor binds numbers to pointers.
struct BufRef {
  int buf = -1;       // -1: none
  size_t offset = 0;  // bytes
  bool valid() const { return buf >= 0; }
};
constexpr int kSendBuf = 0;
constexpr int kRecvBuf = 1;

struct Step {
  int recvPeer = -1;  // receive `count` elements from this rank first
  int sendPeer = -1;  // send the step's result to this rank
  BufRef local{};     // this rank's own contribution
  BufRef out{};       // where the result is stored (none: a staging slot)
  size_t bytes = 0;   // message and data size (a multiple of the element size)
  bool reduce = false;  // combine the received data with `local` (else copy)
  bool post = false;    // apply the reduction's post op (SumPostDiv)
  // Fan-in: the ranks whose messages are folded (recvPeer is then -1), and
  // the place of `local` among them (-1: none). Always reducing.
  std::vector<int> fanIn{};
  int localAt = -1;
  bool localPartial = false;  // fan-in: `local` is pre-applied already
  // The send is one side of an exchange: its receiver stores the message as
  // it is (no reduction reads it) while busy with a message of its own, so
  // the receiver may copy it straight from this rank's buffer (shared
  // memory's single copy, transport::Transfer::singleCopy). Only for data
  // that comes from the user's input, not data this rank just received:
  // that sits dirty in this core's cache, where the peer may read it slowly.
  bool singleCopy = false;
  // With singleCopy, where the ranks share CPUs: single copy whenever the
  // transport can (Transfer::pullAlways).
  bool pullAlways = false;

  // Calls f(peer) for every rank the step exchanges a message with.
  template <class F>
  void forEachPeer(F&& f) const {
    if (recvPeer >= 0) f(recvPeer);
    if (sendPeer >= 0) f(sendPeer);
    for (int p : fanIn) f(p);
  }
};

struct Stream {
  int channel = 0;  // the steps' messages use this channel's connections
  std::vector<Step> steps;
};

// Where the connection to `peer` on `channel` sits in a table of
// nranks * nchannels connections (the communicator's, the executor's).
inline size_t linkIndex(int peer, int channel, int nranks) { return size_t(channel) * size_t(nranks) + size_t(peer); }

struct Plan {
  int rank = 0;
  int nranks = 1;
  int nbuffers = 2;
  std::vector<Stream> streams;
  const char* algorithm = "";  // "ring", "chain", "direct", ...
  // Ranks of the communicator on this rank's host, this one included.
  // They share its caches: the executor weighs their buffers against them
  // (PlanRunner::chooseStreaming).
  int hostRanks = 1;
};

std::string stepName(const Step& s);
// Human-readable dump, one step per line (for NCCL_DEBUG=TRACE and tests).
std::string dumpPlan(const Plan& plan);

}  // namespace loom::core
