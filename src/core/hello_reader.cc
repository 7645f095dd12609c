#include "core/hello_reader.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace loom::core {
namespace {

constexpr double kHelloTimeoutS = 30;  // a connection must identify itself by then

wire::Hello helloOf(const std::vector<uint8_t>& buf) {
  wire::Hello h;
  std::memcpy(&h, buf.data(), sizeof h);
  return h;
}

}  // namespace

void HelloReader::acceptAll(int listenFd) {
  for (;;) {
    auto fd = gate_.accept(listenFd);
    if (!fd.isOk() || !fd.value().valid()) return;
    if (pending_.size() >= gate_.maxPending()) {
      LOOM_WARN("%s: %zu connections have not identified themselves; closing a new one", who_.c_str(),
                pending_.size());
      continue;
    }
    pending_.push_back(Pending{std::move(fd.value()), {}, Clock::now()});
  }
}

void HelloReader::service(const Check& check, std::vector<Arrival>* done) {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool drop = false;
    size_t need = sizeof(wire::Hello);
    if (p.checked) need += helloOf(p.buf).payload;
    if (p.buf.size() < need) {
      uint8_t tmp[4096];
      const ssize_t got = ::recv(p.fd.get(), tmp, std::min(sizeof tmp, need - p.buf.size()), MSG_DONTWAIT);
      if (got > 0) {
        p.buf.insert(p.buf.end(), tmp, tmp + got);
      } else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop = true;  // closed before identifying itself
      }
    }
    if (!drop && !p.checked && p.buf.size() >= sizeof(wire::Hello)) {
      if (check(helloOf(p.buf), p.fd.get())) p.checked = true;
      else drop = true;
    }
    if (!drop && p.checked && p.buf.size() == sizeof(wire::Hello) + helloOf(p.buf).payload) {
      Arrival a{helloOf(p.buf), std::vector<uint8_t>(p.buf.begin() + sizeof(wire::Hello), p.buf.end()),
                std::move(p.fd)};
      done->push_back(std::move(a));
      drop = true;  // moved out
    }
    if (!drop && secondsSince(p.since) > kHelloTimeoutS) {
      LOOM_WARN("%s: a connection stayed silent for %.0f s; closed it", who_.c_str(), kHelloTimeoutS);
      drop = true;
    }
    if (drop) pending_.erase(pending_.begin() + long(i));
    else ++i;
  }
}

void HelloReader::pollFds(int listenFd, std::vector<pollfd>* fds) const {
  if (gate_.pollable()) fds->push_back({listenFd, POLLIN, 0});
  for (const Pending& p : pending_) fds->push_back({p.fd.get(), POLLIN, 0});
}

}  // namespace loom::core
