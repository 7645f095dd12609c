#include "core/root.h"

#include <poll.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/time.h"
#include "core/wire.h"

namespace loom::core {
namespace {

constexpr size_t kMaxPending = 4096;
constexpr double kHelloTimeoutS = 30;  // a connection must identify itself by then

struct Pending {
  net::UniqueFd fd;
  std::vector<uint8_t> buf;  // bytes of Hello + RankInfo received so far
  Clock::time_point since;
};

struct Joined {
  net::UniqueFd fd;
  wire::RankInfo info;
};

class Root {
 public:
  Root(net::UniqueFd listener, const RootOptions& options)
      : listener_(std::move(listener)), options_(options) {}

  void run() {
    for (;;) {
      if (nranks_ > 0 && joined_.size() == size_t(nranks_)) {
        replyAll();
        return;
      }
      if (nranks_ > 0 && deadline_.expired()) {
        failAll(timeoutMessage());
        return;
      }
      std::vector<pollfd> fds;
      fds.push_back({listener_.get(), POLLIN, 0});
      for (auto& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
      int timeout = nranks_ > 0 ? deadline_.msLeft(1000) : 1000;
      int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        LOOM_WARN("bootstrap root: poll failed (errno %d); rendezvous abandoned", errno);
        failAll("the rendezvous root failed: poll error");
        return;
      }
      if (fds[0].revents) acceptAll();
      serviceAll();
    }
  }

 private:
  void acceptAll() {
    for (;;) {
      auto fd = net::acceptOne(listener_.get());
      if (!fd.isOk() || !fd.value().valid()) return;
      if (pending_.size() >= kMaxPending) {
        LOOM_WARN("bootstrap root: too many unidentified connections; dropping one");
        continue;
      }
      pending_.push_back(Pending{std::move(fd.value()), {}, Clock::now()});
    }
  }

  // Reads what is available on each unidentified connection.
  void serviceAll() {
    constexpr size_t kNeed = sizeof(wire::Hello) + sizeof(wire::RankInfo);
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool drop = false;
      uint8_t tmp[kNeed];
      size_t want = kNeed - p.buf.size();
      ssize_t got = ::recv(p.fd.get(), tmp, want, MSG_DONTWAIT);
      if (got > 0) {
        p.buf.insert(p.buf.end(), tmp, tmp + got);
        if (p.buf.size() >= sizeof(wire::Hello) && !helloLooksValid(p)) drop = true;
      } else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop = true;  // closed before identifying itself
      }
      if (!drop && secondsSince(p.since) > kHelloTimeoutS) {
        LOOM_WARN("bootstrap root: a connection stayed silent for %.0f s; closed it", kHelloTimeoutS);
        drop = true;
      }
      if (!drop && p.buf.size() == kNeed) {
        admit(std::move(p));
        drop = true;  // moved out of pending
      }
      if (drop) {
        pending_.erase(pending_.begin() + long(i));
      } else {
        ++i;
      }
    }
  }

  bool helloLooksValid(const Pending& p) {
    wire::Hello h;
    std::memcpy(&h, p.buf.data(), sizeof h);
    if (h.magic != wire::kHelloMagic || h.kind != uint32_t(wire::HelloKind::kRootJoin)) {
      LOOM_WARN("bootstrap root: refused a connection that sent bytes that are not a loom hello");
      return false;
    }
    if (h.secret[0] != options_.secret[0] || h.secret[1] != options_.secret[1]) {
      LOOM_WARN("bootstrap root: refused a connection with a wrong secret (claims rank %u); "
                "check that all ranks use the same unique id / LOOM_COMM_SECRET", h.fromRank);
      // Tell it why: a misconfigured rank learns the fix, a stranger learns nothing new.
      sendFailure(p.fd.get(), "the rendezvous refused this rank: wrong secret; give every rank the "
                              "same unique id (or the same LOOM_COMM_SECRET with NCCL_COMM_ID)");
      return false;
    }
    return true;
  }

  void admit(Pending p) {
    wire::Hello h;
    wire::RankInfo info;
    std::memcpy(&h, p.buf.data(), sizeof h);
    std::memcpy(&info, p.buf.data() + sizeof h, sizeof info);
    std::string err;
    if (h.toRank == 0 || h.toRank > wire::kMaxRanks) {
      err = "nranks " + std::to_string(h.toRank) + " is out of range";
    } else if (nranks_ > 0 && h.toRank != uint32_t(nranks_)) {
      err = "rank " + std::to_string(h.fromRank) + " says nranks=" + std::to_string(h.toRank) +
            " but other ranks said " + std::to_string(nranks_);
    } else if (h.fromRank >= h.toRank) {
      err = "rank " + std::to_string(h.fromRank) + " is out of range for nranks=" + std::to_string(h.toRank);
    } else if (joined_.count(int(h.fromRank))) {
      err = "rank " + std::to_string(h.fromRank) + " joined twice (pids " +
            std::to_string(joined_[int(h.fromRank)].info.pid) + " and " + std::to_string(info.pid) + ")";
    }
    if (!err.empty()) {
      LOOM_WARN("bootstrap root: refused a join: %s", err.c_str());
      sendFailure(p.fd.get(), err);
      return;
    }
    if (nranks_ == 0) {
      nranks_ = int(h.toRank);
      deadline_ = Deadline::afterSeconds(options_.initTimeoutS);
    }
    joined_[int(h.fromRank)] = Joined{std::move(p.fd), info};
  }

  void replyAll() {
    std::vector<wire::RankInfo> table(static_cast<size_t>(nranks_));
    for (auto& [rank, j] : joined_) table[size_t(rank)] = j.info;
    wire::Reply reply{wire::kReplyMagic, 0, uint32_t(table.size() * sizeof(wire::RankInfo)), 0};
    for (auto [rank, j] : answerOrder()) {
      Deadline d = Deadline::afterSeconds(30);
      Status s = net::sendAll(j->fd.get(), &reply, sizeof reply, d, nullptr);
      if (s.isOk()) s = net::sendAll(j->fd.get(), table.data(), reply.length, d, nullptr);
      if (!s.isOk()) LOOM_WARN("bootstrap root: could not answer rank %d: %s", rank, s.message().c_str());
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
    LOOM_WARN("bootstrap root: %s", message.c_str());
    for (auto [rank, j] : answerOrder()) sendFailure(j->fd.get(), message);
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
  int nranks_ = 0;
  Deadline deadline_ = Deadline::never();
  std::vector<Pending> pending_;
  std::map<int, Joined> joined_;
};

}  // namespace

Status startRoot(net::UniqueFd listener, const RootOptions& options) {
  try {
    std::thread([fd = std::move(listener), options]() mutable {
      Root root(std::move(fd), options);
      root.run();
    }).detach();
  } catch (const std::system_error& e) {
    return systemError(std::string("cannot start the bootstrap root thread: ") + e.what());
  }
  return Status::ok();
}

}  // namespace loom::core
