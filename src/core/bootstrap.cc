#include "core/bootstrap.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cstring>

#include "common/log.h"
#include "common/settings.h"

namespace loom::core {
namespace {

// Sends `sbytes` on sfd while receiving `rbytes` on rfd, so neither side of
// a ring step can block the other however large the blocks are.
Status exchange(int sfd, const void* sbuf, size_t sbytes, int rfd, void* rbuf, size_t rbytes,
                Deadline deadline, const std::atomic<bool>* abort, const Bootstrap::Check& check,
                const std::string& nextName, const std::string& prevName) {
  size_t sent = 0, got = 0;
  while (sent < sbytes || got < rbytes) {
    if (abort && abort->load(std::memory_order_relaxed)) return abortedError("exchanging over the bootstrap ring");
    if (check) LOOM_TRY(check());
    pollfd fds[2] = {{sfd, short(sent < sbytes ? POLLOUT : 0), 0},
                     {rfd, short(got < rbytes ? POLLIN : 0), 0}};
    int rc = ::poll(fds, 2, deadline.msLeft(100));
    if (rc < 0 && errno != EINTR) return systemErrno("poll", errno);
    if (sent < sbytes) {
      ssize_t n = ::send(sfd, static_cast<const char*>(sbuf) + sent, sbytes - sent,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += size_t(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        return remoteError("bootstrap ring: sending to " + nextName + " failed (" + errnoText(errno) +
                           "): that rank exited or failed");
    }
    if (got < rbytes) {
      ssize_t n = ::recv(rfd, static_cast<char*>(rbuf) + got, rbytes - got, MSG_DONTWAIT);
      if (n > 0) got += size_t(n);
      else if (n == 0) return remoteError(prevName + " closed its bootstrap connection");
      else if (errno != EAGAIN && errno != EINTR)
        return remoteError("bootstrap ring: receiving from " + prevName + " failed: " +
                           errnoText(errno));
    }
    if (deadline.expired()) return remoteError("bootstrap ring: timed out waiting for " + prevName);
  }
  return Status::ok();
}

}  // namespace

uint64_t hashBytes(const void* data, size_t bytes, uint64_t seed) {
  uint64_t h = seed;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

Result<std::unique_ptr<Bootstrap>> Bootstrap::open(const Identity& id, const net::SocketAddress* reach) {
  auto cfg = settings::current();
  LOOM_ASSIGN_OR_RETURN(net::Interface iface,
                        net::chooseInterface(cfg->getString("NCCL_SOCKET_IFNAME"),
                                             cfg->getString("NCCL_SOCKET_FAMILY"), reach));
  std::unique_ptr<Bootstrap> b(new Bootstrap(id));
  b->news_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!b->news_.valid()) return systemErrno("eventfd", errno);
  net::SocketAddress bindAddr = iface.addr;
  bindAddr.setPort(0);
  LOOM_ASSIGN_OR_RETURN(b->listener_, net::listenOn(bindAddr, &b->listenAddr_));
  LOOM_INFO(log::kBootstrap, "rank %d listens on %s (%s)", id.rank, b->listenAddr_.toString().c_str(),
            iface.name.c_str());
  return b;
}

std::string Bootstrap::describe(int r) const {
  if (r < 0 || size_t(r) >= table_.size()) return "rank " + std::to_string(r);
  const auto& p = table_[size_t(r)];
  if (p.pid == 0) return "rank " + std::to_string(r);  // not known yet (joinRoot's gather)
  return "rank " + std::to_string(r) + " (host " + std::string(p.hostname) + ", pid " +
         std::to_string(p.pid) + ")";
}

Status Bootstrap::joinRoot(const net::SocketAddress& root, wire::RankInfo self, Deadline deadline,
                           const std::atomic<bool>* abort) {
  listenAddr_.encode(self.listenAddr);
  const std::vector<uint8_t> blob = wire::encode(self);
  LOOM_ASSIGN_OR_RETURN(net::UniqueFd fd, net::connectTo(root, deadline, abort));
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.kind = uint32_t(wire::HelloKind::kRootJoin);
  h.secret[0] = id_.secret[0];
  h.secret[1] = id_.secret[1];
  h.fromRank = uint32_t(id_.rank);
  h.toRank = uint32_t(id_.nranks);
  h.payload = uint32_t(blob.size());
  LOOM_TRY(net::sendAll(fd.get(), &h, sizeof h, deadline, abort));
  LOOM_TRY(net::sendAll(fd.get(), blob.data(), blob.size(), deadline, abort));
  traffic_.sent(sizeof h + blob.size());
  wire::Reply reply{};
  Status s = net::recvAll(fd.get(), &reply, sizeof reply, deadline, abort);
  if (!s.isOk()) {
    return s.addContext("waiting for the other ranks at the rendezvous " + root.toString());
  }
  // A table of two: the ring neighbours (root.cc), each a length and a blob.
  LOOM_TRY(checkRootReply(reply, 2).addContext("the rendezvous at " + root.toString()));
  if (reply.status == 0 && reply.length > 2 * (8 + uint64_t(wire::kMaxRankInfoBytes))) {
    return remoteError("the rendezvous at " + root.toString() + " sent " + std::to_string(reply.length) +
                       " bytes for the two ring neighbours' infos");
  }
  if (reply.status != 0) {
    std::string text(reply.length, '\0');
    LOOM_TRY(net::recvAll(fd.get(), text.data(), text.size(), deadline, abort));
    Code code = text.find("timed out") != std::string::npos ? Code::kRemoteError : Code::kInvalidUsage;
    return Status(code, "init failed: " + text);
  }
  std::vector<uint8_t> neighbours(reply.length);
  LOOM_TRY(net::recvAll(fd.get(), neighbours.data(), neighbours.size(), deadline, abort));
  traffic_.received(sizeof reply + neighbours.size());
  auto decoded = wire::decodeTable(neighbours, 2);
  if (!decoded.isOk()) return decoded.takeStatus().addContext("the rendezvous at " + root.toString());
  // Until the gather below only this rank and its ring neighbours are known
  // (pid 0 marks the others: peerAddress refuses them, notifyAll skips them).
  const int n = id_.nranks, next = (id_.rank + 1) % n, prev = (id_.rank + n - 1) % n;
  table_.assign(size_t(n), wire::RankInfo{});
  table_[size_t(prev)] = std::move(decoded.value()[1]);
  table_[size_t(next)] = std::move(decoded.value()[0]);
  table_[size_t(id_.rank)] = self;
  LOOM_TRY(buildRing(deadline, abort));
  if (n == 1) return Status::ok();
  // A rank that fails here tells its ring neighbours, which pass the notice
  // on when they fail from it (the check), so every rank ends with the
  // cause, not only with "its neighbour closed the ring".
  std::vector<std::vector<uint8_t>> blobs;
  const Check heardOfFailure = [this]() -> Status {
    service();
    return firstNotice();
  };
  s = allGatherV(blob, wire::kMaxRankInfoBytes, &blobs, deadline, abort, heardOfFailure);
  if (!s.isOk()) {
    s = s.addContext("gathering the ranks' infos over the bootstrap ring");
    if (!(abort && abort->load())) notifyAll(s.message().substr(0, wire::kMaxNoticeBytes));
    return s;
  }
  std::vector<wire::RankInfo> table(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto info = wire::decodeRankInfo(blobs[size_t(r)]);
    if (!info.isOk()) return info.takeStatus().addContext("the info of rank " + std::to_string(r));
    table[size_t(r)] = std::move(info.value());
  }
  // The ring neighbours passed on what the root told them: it must agree.
  for (int r : {prev, next}) {
    if (std::memcmp(table[size_t(r)].listenAddr, table_[size_t(r)].listenAddr, sizeof table_[0].listenAddr) != 0 ||
        table[size_t(r)].pid != table_[size_t(r)].pid) {
      return remoteError("the ring passed on an info of " + describe(r) + " that differs from the rendezvous'");
    }
  }
  table_ = std::move(table);
  return Status::ok();
}

Status Bootstrap::adoptTable(std::vector<wire::RankInfo> table, Deadline deadline,
                             const std::atomic<bool>* abort) {
  table_ = std::move(table);
  return buildRing(deadline, abort);
}

// Every rank listens before any learns the table, so a neighbour that
// refuses connections is gone. A rank that fails here tells the ranks it
// knows (its neighbours; after a split, all), so a rank waiting for a dead
// neighbour's connection ends too.
Status Bootstrap::buildRing(Deadline deadline, const std::atomic<bool>* abort) {
  constexpr double kRefusedLimitS = 3;
  const int n = id_.nranks;
  if (n == 1) return Status::ok();
  const int next = (id_.rank + 1) % n, prev = (id_.rank + n - 1) % n;
  Status s;
  {
    auto fd = peerAddress(next);
    if (!fd.isOk()) return fd.takeStatus();
    auto conn = net::connectTo(*fd, deadline, abort, kRefusedLimitS);
    if (conn.isOk()) {
      s = sendHello(conn->get(), next, wire::HelloKind::kBootstrapRing, 0, 0, 1, nullptr, 0, deadline, abort);
      if (s.isOk()) ringNext_ = std::move(*conn);
    } else {
      s = conn.takeStatus();
    }
    if (!s.isOk()) s = s.addContext("connecting to " + describe(next) + " (bootstrap ring)");
  }
  if (s.isOk()) {
    auto fd = waitFor(wire::HelloKind::kBootstrapRing, prev, deadline, abort);
    if (fd.isOk()) ringPrev_ = std::move(*fd);
    else s = fd.takeStatus();
  }
  if (!s.isOk() && !(abort && abort->load())) notifyAll(s.message().substr(0, wire::kMaxNoticeBytes));
  return s;
}

Result<net::SocketAddress> Bootstrap::peerAddress(int peer) const {
  if (table_[size_t(peer)].pid == 0) return internalError("the address of rank " + std::to_string(peer) + " is not known yet");
  auto addr = net::SocketAddress::decode(table_[size_t(peer)].listenAddr);
  if (!addr.isOk()) return addr.takeStatus().addContext("the listen address of " + describe(peer));
  return addr;
}

Status Bootstrap::sendHello(int fd, int peer, wire::HelloKind kind, uint32_t channel, uint32_t index,
                            uint32_t count, const void* payload, uint32_t payloadBytes, Deadline deadline,
                            const std::atomic<bool>* abort) const {
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.kind = uint32_t(kind);
  h.secret[0] = id_.secret[0];
  h.secret[1] = id_.secret[1];
  h.commHash = id_.commHash;
  h.fromRank = uint32_t(id_.rank);
  h.toRank = uint32_t(peer);
  h.channel = channel;
  h.index = index;
  h.count = count;
  h.payload = payloadBytes;
  LOOM_TRY(net::sendAll(fd, &h, sizeof h, deadline, abort));
  if (payloadBytes) LOOM_TRY(net::sendAll(fd, payload, payloadBytes, deadline, abort));
  traffic_.sent(sizeof h + payloadBytes);
  return Status::ok();
}

Result<net::UniqueFd> Bootstrap::connectPeer(int peer, wire::HelloKind kind, uint32_t channel,
                                             uint32_t index, uint32_t count, const void* payload,
                                             uint32_t payloadBytes, Deadline deadline,
                                             const std::atomic<bool>* abort) {
  LOOM_ASSIGN_OR_RETURN(auto addr, peerAddress(peer));
  auto fd = net::connectTo(addr, deadline, abort);
  if (!fd.isOk()) return fd.takeStatus().addContext("connecting to " + describe(peer));
  LOOM_TRY(sendHello(fd.value().get(), peer, kind, channel, index, count, payload, payloadBytes, deadline, abort));
  return std::move(fd.value());
}

Status checkRootReply(const wire::Reply& reply, int nranks) {
  if (reply.magic != wire::kReplyMagic) return remoteError("answered with bytes that are not loom's");
  if (reply.status != 0) {
    if (reply.length > wire::kMaxReplyTextBytes) return remoteError("sent an oversized failure message");
    return Status::ok();
  }
  // Each entry: a length and a blob of at least its version.
  if (reply.length < uint64_t(nranks) * 8 || reply.length > wire::kMaxTableBytes) {
    return remoteError("sent a table of " + std::to_string(reply.length) + " bytes for " + std::to_string(nranks) +
                       " ranks");
  }
  return Status::ok();
}

Status checkHello(const wire::Hello& h, const Bootstrap::Identity& self) {
  if (h.magic != wire::kHelloMagic) return invalidArgument("bytes that are not a loom hello");
  if (h.secret[0] != self.secret[0] || h.secret[1] != self.secret[1])
    return invalidArgument("a wrong secret (claims rank " + std::to_string(h.fromRank) + ")");
  if (h.commHash != self.commHash) return invalidArgument("a hello for another communicator");
  if (h.toRank != uint32_t(self.rank) || h.fromRank >= uint32_t(self.nranks))
    return invalidArgument("a hello with a bad rank (" + std::to_string(h.fromRank) + ")");
  if (h.kind < uint32_t(wire::HelloKind::kBootstrapRing) || h.kind > uint32_t(wire::HelloKind::kShrink))
    return invalidArgument("a hello of unknown kind");
  if (h.payload > wire::kMaxNoticeBytes) return invalidArgument("a hello with an oversized payload");
  if (h.kind == uint32_t(wire::HelloKind::kData) && (h.count < 1 || h.count > 16 || h.index >= h.count))
    return invalidArgument("a data hello with a bad socket count");
  if (h.channel >= wire::kMaxChannels) return invalidArgument("a hello with a bad channel");
  return Status::ok();
}

void Bootstrap::notifyAll(const std::string& text) const {
  // Only the peer table is used, which no longer changes once init is done
  // (other threads call this only then): callable while another thread
  // services the listener. All connects start at once, so a dead rank
  // (refused) or a slow one delays nobody's notice: peers must hear the
  // cause before they see this rank's connections close (preferPeerReport).
  constexpr int kTotalMs = 1000;
  struct Out {
    int rank;
    net::UniqueFd fd;
  };
  std::vector<Out> out;
  for (int r = 0; r < int(table_.size()); ++r) {
    if (r == id_.rank) continue;
    auto addr = peerAddress(r);
    if (!addr.isOk()) continue;
    int err = 0;
    auto fd = net::startConnect(*addr, &err);
    if (fd.isOk() && fd->valid()) out.push_back(Out{r, std::move(*fd)});
  }
  const Deadline deadline = Deadline::afterMs(kTotalMs);
  while (!out.empty() && !deadline.expired()) {
    std::vector<pollfd> fds;
    for (const Out& o : out) fds.push_back({o.fd.get(), POLLOUT, 0});
    ::poll(fds.data(), fds.size(), deadline.msLeft(kTotalMs));
    for (size_t i = 0; i < out.size();) {
      const int state = net::finishConnect(out[i].fd.get());
      if (state == EINPROGRESS) {
        ++i;
        continue;
      }
      if (state == 0) {
        // A fresh socket takes the hello and the text at once.
        sendHello(out[i].fd.get(), out[i].rank, wire::HelloKind::kAbortNotice, 0, 0, 0, text.data(),
                  uint32_t(text.size()), Deadline::afterMs(100), nullptr)
            .ignore();
      }
      out.erase(out.begin() + long(i));
    }
  }
}

void Bootstrap::service() {
  if (newsSignalled_) {  // whoever polls has woken; what is stashed is looked at now
    uint64_t count;
    (void)!::read(news_.get(), &count, sizeof count);
    newsSignalled_ = false;
  }
  reader_.acceptAll(listener_.get());
  std::vector<HelloReader::Arrival> arrived;
  reader_.service(
      [this](const wire::Hello& h, int) {
        Status ok = checkHello(h, id_);
        if (!ok.isOk()) LOOM_WARN("rank %d: refused a connection that sent %s", id_.rank, ok.message().c_str());
        return ok.isOk();
      },
      &arrived);
  const bool news = !arrived.empty();
  for (HelloReader::Arrival& a : arrived) {
    const wire::Hello& h = a.hello;
    traffic_.received(sizeof h + a.payload.size());
    if (h.kind == uint32_t(wire::HelloKind::kAbortNotice)) {
      notices_.push_back(Notice{int(h.fromRank), std::string(a.payload.begin(), a.payload.end())});
    } else {
      if (h.kind == uint32_t(wire::HelloKind::kData)) dataSockets_[{int(h.fromRank), h.channel}] = int(h.count);
      stash_[Key{h.kind, int(h.fromRank), h.channel, h.index}] = std::move(a.fd);
    }
  }
  if (news) {
    const uint64_t one = 1;
    (void)!::write(news_.get(), &one, sizeof one);
    newsSignalled_ = true;
  }
}

void Bootstrap::pollFds(std::vector<pollfd>* fds) const {
  // While accepting backs off (out of fds) the listener is not polled: the
  // callers' poll caps (at most 200 ms) bring them back.
  reader_.pollFds(listener_.get(), fds);
  fds->push_back({news_.get(), POLLIN, 0});
}

std::optional<net::UniqueFd> Bootstrap::take(wire::HelloKind kind, int from, uint32_t channel,
                                             uint32_t index) {
  auto it = stash_.find(Key{uint32_t(kind), from, channel, index});
  if (it == stash_.end()) return std::nullopt;
  net::UniqueFd fd = std::move(it->second);
  stash_.erase(it);
  return fd;
}

int Bootstrap::socketCount(int from, uint32_t channel) const {
  auto it = dataSockets_.find({from, channel});
  return it == dataSockets_.end() ? 0 : it->second;
}

std::vector<Notice> Bootstrap::takeNotices() { return std::exchange(notices_, {}); }

Status Bootstrap::firstNotice() const {
  if (notices_.empty()) return Status::ok();
  const Notice& n = notices_.front();
  return remoteError(describe(n.fromRank) + " reports: " + n.text);
}

bool Bootstrap::refuses(int peer) const {
  auto addr = peerAddress(peer);
  if (!addr.isOk()) return false;
  int err = 0;
  auto fd = net::startConnect(*addr, &err);
  if (!fd.isOk()) return false;
  if (!fd->valid()) return err == ECONNREFUSED;
  pollfd p{fd->get(), POLLOUT, 0};
  ::poll(&p, 1, 200);
  return net::finishConnect(fd->get()) == ECONNREFUSED;
}

Result<net::UniqueFd> Bootstrap::waitFor(wire::HelloKind kind, int from, Deadline deadline,
                                         const std::atomic<bool>* abort) {
  DeadPeerProbe probe(*this, from);
  for (;;) {
    service();
    if (auto fd = take(kind, from, 0, 0)) return std::move(*fd);
    if (abort && abort->load()) return abortedError("waiting for " + describe(from));
    LOOM_TRY(firstNotice());
    if (deadline.expired()) return remoteError("timed out waiting for " + describe(from) + " to connect");
    // `from` opened its listener before anyone learned the table and must
    // connect here before it can finish: if it refuses connections now, it
    // died (a failed setup would have sent a notice).
    if (probe.dead()) return remoteError(describe(from) + " died during setup: its listener refuses connections");
    std::vector<pollfd> fds;
    pollFds(&fds);
    if (::poll(fds.data(), fds.size(), deadline.msLeft(100)) < 0 && errno != EINTR)
      return systemErrno("poll", errno);
  }
}

bool DeadPeerProbe::dead() {
  constexpr double kProbePeriodS = 0.5;
  if (secondsSince(last_) <= kProbePeriodS) return false;
  last_ = Clock::now();
  const bool refused = bootstrap_.refuses(peer_);
  const bool twice = refused && refusedBefore_;
  refusedBefore_ = refused;
  return twice;
}

Status Bootstrap::ringGather(uint8_t* base, const std::vector<size_t>& offsets, const std::vector<size_t>& sizes,
                             Deadline deadline, const std::atomic<bool>* abort, const Check& check) {
  const int n = id_.nranks;
  const std::string prevName = describe((id_.rank + n - 1) % n), nextName = describe((id_.rank + 1) % n);
  for (int k = 0; k < n - 1; ++k) {
    const auto sendBlock = size_t((id_.rank - k + n) % n);
    const auto recvBlock = size_t((id_.rank - k - 1 + n) % n);
    LOOM_TRY(exchange(ringNext_.get(), base + offsets[sendBlock], sizes[sendBlock], ringPrev_.get(),
                      base + offsets[recvBlock], sizes[recvBlock], deadline, abort, check, nextName, prevName));
    traffic_.sent(sizes[sendBlock]);
    traffic_.received(sizes[recvBlock]);
  }
  return Status::ok();
}

Status Bootstrap::allGather(void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* abort,
                            const Check& check) {
  const auto n = size_t(id_.nranks);
  std::vector<size_t> offsets(n), sizes(n, bytes);
  for (size_t r = 0; r < n; ++r) offsets[r] = r * bytes;
  return ringGather(static_cast<uint8_t*>(data), offsets, sizes, deadline, abort, check);
}

Status Bootstrap::allGatherV(std::span<const uint8_t> mine, size_t maxBytes, std::vector<std::vector<uint8_t>>* all,
                             Deadline deadline, const std::atomic<bool>* abort, const Check& check) {
  const auto n = size_t(id_.nranks), me = size_t(id_.rank);
  std::vector<uint64_t> lengths(n);
  lengths[me] = mine.size();
  LOOM_TRY(allGather(lengths.data(), sizeof(uint64_t), deadline, abort, check));
  std::vector<size_t> offsets(n), sizes(n);
  size_t total = 0;
  for (size_t r = 0; r < n; ++r) {
    if (lengths[r] > maxBytes) {
      return remoteError(describe(int(r)) + " sent a " + std::to_string(lengths[r]) + "-byte block (at most " +
                         std::to_string(maxBytes) + ")");
    }
    offsets[r] = total;
    sizes[r] = size_t(lengths[r]);
    total += sizes[r];
  }
  std::vector<uint8_t> buf(total);
  std::copy(mine.begin(), mine.end(), buf.begin() + long(offsets[me]));
  LOOM_TRY(ringGather(buf.data(), offsets, sizes, deadline, abort, check));
  all->assign(n, {});
  for (size_t r = 0; r < n; ++r) {
    const auto begin = buf.begin() + long(offsets[r]);
    (*all)[r].assign(begin, begin + long(sizes[r]));
  }
  return Status::ok();
}

Status Bootstrap::barrier(Deadline deadline, const std::atomic<bool>* abort) {
  std::vector<uint8_t> dummy(size_t(id_.nranks));
  return allGather(dummy.data(), 1, deadline, abort);
}

}  // namespace loom::core
