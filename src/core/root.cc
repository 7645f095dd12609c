#include "core/root.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/time.h"
#include "core/hello_reader.h"
#include "core/traffic.h"

namespace loom::core {

struct RootServer::Control {
  std::atomic<bool> stop{false};
  net::UniqueFd wake{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
};

namespace {

constexpr double kAnswerTimeoutS = 30;  // all ranks must have taken their table by then
constexpr double kFailureTimeoutS = 5;

struct Joined {
  net::UniqueFd fd;
  wire::RankInfo info;
  std::vector<uint8_t> blob;  // as the rank sent it (checked): passed on in the table
};

// One answer being sent without blocking.
struct Outgoing {
  int rank;
  int fd;
  std::vector<uint8_t> bytes;
  size_t sent = 0;
};

class Root {
 public:
  Root(net::UniqueFd listener, const RootOptions& options, std::shared_ptr<RootServer::Control> control)
      : listener_(std::move(listener)), options_(options), control_(std::move(control)),
        idleDeadline_(Deadline::afterSeconds(options.initTimeoutS)) {}

  void run() {
    for (;;) {
      if (control_->stop.load()) {
        failAll("the rendezvous was stopped: rank 0's init failed or was aborted");
        return;
      }
      if (nranks_ > 0 && joined_.size() == size_t(nranks_)) {
        replyAll();
        return;
      }
      if (nranks_ > 0 && deadline_.expired()) {
        failAll(timeoutMessage());
        return;
      }
      if (nranks_ == 0 && idleDeadline_.expired()) {
        LOOM_INFO(log::kBootstrap, "bootstrap root: no rank joined within %.0f s (LOOM_INIT_TIMEOUT_S); "
                  "closing the rendezvous", options_.initTimeoutS);
        return;
      }
      std::vector<pollfd> fds{{control_->wake.get(), POLLIN, 0}};
      reader_.pollFds(listener_.get(), &fds);
      int timeout = (nranks_ > 0 ? deadline_ : idleDeadline_).msLeft(1000);
      if (reader_.backoffMsLeft() >= 0) timeout = std::min(timeout, reader_.backoffMsLeft());
      int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        LOOM_WARN("bootstrap root: poll failed (errno %d); rendezvous abandoned", errno);
        failAll("the rendezvous root failed: poll error");
        return;
      }
      reader_.acceptAll(listener_.get());
      std::vector<HelloReader::Arrival> arrived;
      reader_.service([this](const wire::Hello& h, int fd) { return helloLooksValid(h, fd); }, &arrived);
      for (HelloReader::Arrival& a : arrived) admit(std::move(a));
    }
  }

 private:
  // The hello alone (the RankInfo may still be on its way): refuse early.
  bool helloLooksValid(const wire::Hello& h, int fd) {
    if (h.magic != wire::kHelloMagic || h.kind != uint32_t(wire::HelloKind::kRootJoin)) {
      LOOM_WARN("bootstrap root: refused a connection that sent bytes that are not a loom hello");
      return false;
    }
    if (h.secret[0] != options_.secret[0] || h.secret[1] != options_.secret[1]) {
      LOOM_WARN("bootstrap root: refused a connection with a wrong secret (claims rank %u); "
                "check that all ranks use the same unique id / LOOM_COMM_SECRET", h.fromRank);
      // Tell it why: a misconfigured rank learns the fix, a stranger learns nothing new.
      sendFailure(fd, "the rendezvous refused this rank: wrong secret; give every rank the "
                      "same unique id (or the same LOOM_COMM_SECRET with NCCL_COMM_ID)");
      return false;
    }
    if (h.payload > wire::kMaxRankInfoBytes) {
      LOOM_WARN("bootstrap root: refused a join with a %u-byte rank info (at most %u)", h.payload,
                wire::kMaxRankInfoBytes);
      sendFailure(fd, "the rendezvous refused this rank: its rank info is too large; run the same "
                      "loom build on all ranks");
      return false;
    }
    return true;
  }

  void admit(HelloReader::Arrival p) {
    const wire::Hello& h = p.hello;
    wire::RankInfo info;
    std::vector<uint8_t>& blob = p.payload;
    rootTraffic().received(sizeof h + blob.size());
    Status s = checkJoin(h, blob, &info, options_.secret, nranks_);
    if (s.isOk() && joined_.count(int(h.fromRank))) {
      s = invalidArgument("rank " + std::to_string(h.fromRank) + " joined twice (pids " +
                          std::to_string(joined_[int(h.fromRank)].info.pid) + " and " +
                          std::to_string(info.pid) + ")");
    }
    if (!s.isOk()) {
      LOOM_WARN("bootstrap root: refused a join: %s", s.message().c_str());
      sendFailure(p.fd.get(), s.message());
      return;
    }
    if (nranks_ == 0) {
      nranks_ = int(h.toRank);
      deadline_ = Deadline::afterSeconds(options_.initTimeoutS);
    }
    joined_[int(h.fromRank)] = Joined{std::move(p.fd), std::move(info), std::move(blob)};
  }

  // Each rank gets the infos of its two ring neighbours only (next, then
  // previous): the ranks build their ring and gather the whole table over
  // it, so what the root sends grows linearly with nranks, not as its square.
  void replyAll() {
    std::vector<Outgoing> out;
    for (auto [rank, j] : answerOrder()) {
      std::vector<uint8_t> table;
      wire::appendTableEntry(joined_[(rank + 1) % nranks_].blob, &table);
      wire::appendTableEntry(joined_[(rank + nranks_ - 1) % nranks_].blob, &table);
      wire::Reply reply{wire::kReplyMagic, 0, uint32_t(table.size()), 0};
      std::vector<uint8_t> bytes(sizeof reply + table.size());
      std::memcpy(bytes.data(), &reply, sizeof reply);
      std::memcpy(bytes.data() + sizeof reply, table.data(), table.size());
      out.push_back(Outgoing{rank, j->fd.get(), std::move(bytes)});
    }
    sendAll(out, kAnswerTimeoutS, true);
  }

  // Sends every joined rank the same answer at once, without blocking on
  // any of them: ranks of other processes first (see answerOrder).
  // Failures are small and always sent in full.
  void sendToAll(const std::vector<uint8_t>& bytes) {
    std::vector<Outgoing> out;
    for (auto [rank, j] : answerOrder()) out.push_back(Outgoing{rank, j->fd.get(), bytes});
    sendAll(out, kFailureTimeoutS, false);
  }

  // A stop (the owner is being destroyed) cuts the delivery short where
  // `stoppable`.
  void sendAll(std::vector<Outgoing>& out, double seconds, bool stoppable) {
    for (const Outgoing& o : out) rootTraffic().sent(o.bytes.size());
    const Deadline deadline = Deadline::afterSeconds(seconds);
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Outgoing*> waiting;
      for (Outgoing& o : out) {
        while (o.sent < o.bytes.size()) {
          ssize_t n = ::send(o.fd, o.bytes.data() + o.sent, o.bytes.size() - o.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n > 0) {
            o.sent += size_t(n);
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            fds.push_back({o.fd, POLLOUT, 0});
            waiting.push_back(&o);
          } else {
            LOOM_WARN("bootstrap root: could not answer rank %d: %s", o.rank, errnoText(errno).c_str());
            o.sent = o.bytes.size();
          }
          break;
        }
      }
      if (fds.empty()) return;
      if (deadline.expired() || (stoppable && control_->stop.load())) {
        for (Outgoing* o : waiting) LOOM_WARN("bootstrap root: rank %d did not take its answer in time", o->rank);
        return;
      }
      fds.push_back({control_->wake.get(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), deadline.msLeft(1000));
    }
  }

  std::string timeoutMessage() const {
    std::string missing;
    int shown = 0;
    for (int r = 0; r < nranks_; ++r) {
      if (joined_.count(r)) continue;
      if (shown++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (shown > 16) missing += " and " + std::to_string(shown - 16) + " more";
    return "init timed out after " + std::to_string(int(options_.initTimeoutS)) + " s: " +
           std::to_string(joined_.size()) + " of " + std::to_string(nranks_) +
           " ranks joined; missing ranks: " + missing +
           ". Check that every rank started and uses the same unique id, or raise LOOM_INIT_TIMEOUT_S.";
  }

  void failAll(const std::string& message) {
    if (joined_.empty()) return;
    LOOM_WARN("bootstrap root: %s", message.c_str());
    wire::Reply reply{wire::kReplyMagic, 1, uint32_t(message.size()), 0};
    std::vector<uint8_t> bytes(sizeof reply + message.size());
    std::memcpy(bytes.data(), &reply, sizeof reply);
    std::memcpy(bytes.data() + sizeof reply, message.data(), message.size());
    sendToAll(bytes);
  }

  // Who is answered first. This thread lives in one rank's process (rank 0
  // with NCCL_COMM_ID, or the caller of ncclGetUniqueId); once that rank
  // has its answer its process may exit - on an init failure it usually
  // does - and take this thread with it before the others are answered. So
  // ranks of other processes come first, ranks of this process last.
  std::vector<std::pair<int, Joined*>> answerOrder() {
    const uint32_t self = uint32_t(getpid());
    std::vector<std::pair<int, Joined*>> order;
    for (auto& [rank, j] : joined_)
      if (j.info.pid != self) order.emplace_back(rank, &j);
    for (auto& [rank, j] : joined_)
      if (j.info.pid == self) order.emplace_back(rank, &j);
    return order;
  }

  static void sendFailure(int fd, const std::string& message) {
    wire::Reply reply{wire::kReplyMagic, 1, uint32_t(message.size()), 0};
    Deadline d = Deadline::afterSeconds(5);
    Status s = net::sendAll(fd, &reply, sizeof reply, d, nullptr);
    if (s.isOk()) s = net::sendAll(fd, message.data(), message.size(), d, nullptr);
    s.ignore();
  }

  net::UniqueFd listener_;
  RootOptions options_;
  std::shared_ptr<RootServer::Control> control_;
  HelloReader reader_{"bootstrap root"};
  Deadline idleDeadline_;  // nobody joined yet
  int nranks_ = 0;
  Deadline deadline_ = Deadline::never();
  std::map<int, Joined> joined_;
};

}  // namespace

Status checkJoin(const wire::Hello& h, std::span<const uint8_t> payload, wire::RankInfo* info,
                 const uint64_t secret[2], int nranksSoFar) {
  if (h.magic != wire::kHelloMagic || h.kind != uint32_t(wire::HelloKind::kRootJoin)) {
    return invalidArgument("bytes that are not a loom join request");
  }
  if (h.secret[0] != secret[0] || h.secret[1] != secret[1]) {
    return invalidArgument("the rendezvous refused this rank: wrong secret");
  }
  if (h.payload != payload.size() || h.payload > wire::kMaxRankInfoBytes) {
    return invalidArgument("a join request with a " + std::to_string(h.payload) + "-byte payload (" +
                           std::to_string(payload.size()) + " bytes came, at most " +
                           std::to_string(wire::kMaxRankInfoBytes) + " allowed)");
  }
  if (h.toRank == 0 || h.toRank > wire::kMaxRanks) {
    return invalidArgument("nranks " + std::to_string(h.toRank) + " is out of range");
  }
  if (nranksSoFar > 0 && h.toRank != uint32_t(nranksSoFar)) {
    return invalidArgument("rank " + std::to_string(h.fromRank) + " says nranks=" + std::to_string(h.toRank) +
                           " but other ranks said " + std::to_string(nranksSoFar));
  }
  if (h.fromRank >= h.toRank) {
    return invalidArgument("rank " + std::to_string(h.fromRank) + " is out of range for nranks=" +
                           std::to_string(h.toRank));
  }
  auto decoded = wire::decodeRankInfo(payload);
  if (!decoded.isOk()) {
    return invalidArgument("rank " + std::to_string(h.fromRank) + "'s join request: " +
                           decoded.status().message() + "; run the same loom build on all ranks");
  }
  *info = std::move(decoded.value());
  return Status::ok();
}

Result<std::unique_ptr<RootServer>> RootServer::start(net::UniqueFd listener, const RootOptions& options) {
  std::unique_ptr<RootServer> server(new RootServer());
  server->control_ = std::make_shared<Control>();
  if (!server->control_->wake) return systemErrno("eventfd for the bootstrap root", errno);
  try {
    server->thread_ = std::thread([fd = std::move(listener), options, control = server->control_]() mutable {
      try {
        Root root(std::move(fd), options, std::move(control));
        root.run();
      } catch (const std::exception& e) {
        LOOM_WARN("bootstrap root: stopped by an unexpected error: %s", e.what());
      }
    });
  } catch (const std::system_error& e) {
    return systemError(std::string("cannot start the bootstrap root thread: ") + e.what());
  }
  pthread_setname_np(server->thread_.native_handle(), "loom-root");  // for gdb, top -H and tests
  return server;
}

RootServer::~RootServer() {
  if (!thread_.joinable()) return;
  control_->stop.store(true);
  uint64_t one = 1;
  (void)!::write(control_->wake.get(), &one, sizeof one);
  thread_.join();
}

void RootServer::detach(std::unique_ptr<RootServer> root) {
  if (root && root->thread_.joinable()) root->thread_.detach();
}

Traffic& rootTraffic() {
  static Traffic traffic;
  return traffic;
}

}  // namespace loom::core
