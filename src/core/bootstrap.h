// Bootstrap: how the ranks of one communicator find and reach each other.
//
// Each rank owns a listener. At init it joins the rendezvous root (unique
// id) or, for a split, gets its peers from the parent communicator; then it
// knows every rank's RankInfo (listen address, pid, host). A ring of
// bootstrap sockets carries small collectives (allGather, barrier). Every
// later connection to a rank, data or abort notice, goes to its listener and
// starts with a Hello that proves the secret; the listener is serviced
// without blocking and stashes authenticated sockets until someone asks.
#pragma once

#include <poll.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "core/hello_reader.h"
#include "core/traffic.h"
#include "core/wire.h"
#include "transport/net/socket.h"

namespace loom::core {

struct Notice {
  int fromRank;
  std::string text;
};

class Bootstrap {
 public:
  struct Identity {
    uint64_t secret[2] = {0, 0};
    uint64_t commHash = 0;
    int rank = 0;
    int nranks = 1;
  };

  // Opens this rank's listener (on the interface chosen by
  // NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY; `reach` hints the subnet).
  static Result<std::unique_ptr<Bootstrap>> open(const Identity& id, const net::SocketAddress* reach);

  // Rendezvous through the root at `root`; `self` is completed with the
  // listen address. The root answers with the ring neighbours' infos; the
  // ring is built and the whole table gathered over it.
  Status joinRoot(const net::SocketAddress& root, wire::RankInfo self, Deadline deadline,
                  const std::atomic<bool>* abort);
  // For a split: the table comes from the parent; builds the ring.
  Status adoptTable(std::vector<wire::RankInfo> table, Deadline deadline,
                    const std::atomic<bool>* abort);

  const Identity& identity() const { return id_; }
  // A split learns its rank only after the listener is open.
  void setIdentity(const Identity& id) {
    id_ = id;
    reader_.setWho("rank " + std::to_string(id.rank));
  }
  int rank() const { return id_.rank; }
  int nranks() const { return id_.nranks; }
  const wire::RankInfo& peer(int r) const { return table_[size_t(r)]; }
  const net::SocketAddress& listenAddress() const { return listenAddr_; }
  int listenFd() const { return listener_.get(); }
  // "rank 3 (host b, pid 4242)"
  std::string describe(int r) const;

  // Ring collectives: blocking, bounded by the deadline and abort flag.
  // allGather: `data` holds nranks blocks of `bytes`; block `rank` is ours.
  // `check` (may be empty) runs at least every 100 ms while waiting; an
  // error from it (a peer's abort notice, say) ends the wait.
  using Check = std::function<Status()>;
  Status allGather(void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* abort,
                   const Check& check = {});
  // Blocks of any size up to maxBytes (a larger one is an error): *all gets
  // every rank's, ours included.
  Status allGatherV(std::span<const uint8_t> mine, size_t maxBytes, std::vector<std::vector<uint8_t>>* all,
                    Deadline deadline, const std::atomic<bool>* abort, const Check& check = {});
  Status barrier(Deadline deadline, const std::atomic<bool>* abort);

  // Opens a connection to `peer`'s listener and sends the Hello (+payload).
  Result<net::UniqueFd> connectPeer(int peer, wire::HelloKind kind, uint32_t channel, uint32_t index,
                                    uint32_t count, const void* payload, uint32_t payloadBytes,
                                    Deadline deadline, const std::atomic<bool>* abort);
  // The same in non-blocking halves: peerAddress() to start a connect
  // (net::startConnect), sendHello() once it is connected.
  Result<net::SocketAddress> peerAddress(int peer) const;
  Status sendHello(int fd, int peer, wire::HelloKind kind, uint32_t channel, uint32_t index, uint32_t count,
                   const void* payload, uint32_t payloadBytes, Deadline deadline,
                   const std::atomic<bool>* abort) const;
  // Accepts and reads pending connections without blocking.
  void service();
  // What service() waits on: the listener and connections whose hello is
  // still arriving; and an event that is readable while a socket or notice
  // that service() stashed may be waiting for its taker, so that a thread
  // polling here wakes when another thread (a watchdog asking for errors)
  // or its own last service() took the listener's news.
  void pollFds(std::vector<pollfd>* fds) const;
  // Sends `text` as an abort notice to every other rank at once, skipping
  // ranks that refuse (dead); bounded to about a second in all.
  void notifyAll(const std::string& text) const;
  // True when `peer`'s listener refuses a connection right now (it listens
  // from before its address is known until its communicator ends, so a
  // refusal during setup means it died).
  bool refuses(int peer) const;
  // An authenticated socket stashed by service(), if it arrived.
  std::optional<net::UniqueFd> take(wire::HelloKind kind, int from, uint32_t channel, uint32_t index);
  // Sockets announced by `from` for its data connection to us on `channel`
  // (0: none yet).
  int socketCount(int from, uint32_t channel) const;
  // Abort notices received so far (consumed).
  std::vector<Notice> takeNotices();
  // What this rank's bootstrap sent and received so far: the rendezvous,
  // the ring and its gathers, hellos and notices.
  TrafficCounts traffic() const { return traffic_.counts(); }

 private:
  explicit Bootstrap(const Identity& id) : id_(id) { reader_.setWho("rank " + std::to_string(id.rank)); }
  Status buildRing(Deadline deadline, const std::atomic<bool>* abort);
  // n - 1 ring steps: block r is sizes[r] bytes at base + offsets[r].
  Status ringGather(uint8_t* base, const std::vector<size_t>& offsets, const std::vector<size_t>& sizes,
                    Deadline deadline, const std::atomic<bool>* abort, const Check& check);
  Result<net::UniqueFd> waitFor(wire::HelloKind kind, int from, Deadline deadline,
                                const std::atomic<bool>* abort);
  // The first abort notice received during setup as an error (left queued), or ok.
  Status firstNotice() const;

  using Key = std::tuple<uint32_t, int, uint32_t, uint32_t>;  // kind, from, channel, index

  Identity id_;
  net::UniqueFd listener_;
  net::SocketAddress listenAddr_;
  std::vector<wire::RankInfo> table_;
  net::UniqueFd ringNext_, ringPrev_;
  HelloReader reader_{"rank"};
  std::map<Key, net::UniqueFd> stash_;
  std::vector<Notice> notices_;
  std::map<std::pair<int, uint32_t>, int> dataSockets_;  // (from rank, channel) -> announced socket count
  mutable Traffic traffic_;
  net::UniqueFd news_;  // eventfd, see pollFds()
  bool newsSignalled_ = false;
};

// Checks the header of an answer that carries a table of `nranks` RankInfo
// blobs (status 0) or a failure text of at most kMaxReplyTextBytes: the
// rendezvous root's (nranks 2: the ring neighbours) or a shrink leader's
// (nranks: the members).
Status checkRootReply(const wire::Reply& reply, int nranks);

// Checks a Hello received on the listener of `self` (a rank of a
// communicator): magic, secret, communicator, ranks, kind, payload size.
Status checkHello(const wire::Hello& h, const Bootstrap::Identity& self);

// 64-bit FNV-1a of some bytes (comm hashes, secrets from text).
// While waiting for `peer` to connect: tells a dead peer from a slow one. Its
// listener is open for as long as its communicator lives, so two refusals in
// a row, probed at most every half second, mean it died.
class DeadPeerProbe {
 public:
  DeadPeerProbe(const Bootstrap& bootstrap, int peer) : bootstrap_(bootstrap), peer_(peer) {}
  bool dead();

 private:
  const Bootstrap& bootstrap_;
  const int peer_;
  Clock::time_point last_ = Clock::now();
  bool refusedBefore_ = false;
};

uint64_t hashBytes(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ull);

}  // namespace loom::core
