#include "transport/net/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace loom::net {
namespace {

constexpr int kPollSliceMs = 100;  // longest wait between abort checks
constexpr int kListenBacklog = 16384;
constexpr int kMaxBackoffMs = 100;

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

enum class Wait { kReady, kTimeout, kAborted };

// Polls fd for `events` in slices of at most kPollSliceMs until it is ready,
// the deadline passes or *abort is set. Error/hangup readiness counts as ready
// (the caller's next syscall reports it).
Result<Wait> waitFd(int fd, short events, Deadline deadline, const std::atomic<bool>* abort) {
  while (true) {
    if (aborted(abort)) return Wait::kAborted;
    if (deadline.expired()) return Wait::kTimeout;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.msLeft(kPollSliceMs));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return systemErrno("poll on socket", errno);
    }
    if (rc > 0 && p.revents != 0) return Wait::kReady;
  }
}

// Sleeps `ms`, waking early (every kPollSliceMs at most) to honour the
// deadline and abort flag. Returns false when aborted.
bool sleepChecked(int ms, Deadline deadline, const std::atomic<bool>* abort) {
  auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < until) {
    if (aborted(abort)) return false;
    if (deadline.expired()) return true;
    auto step = std::min<Clock::duration>(until - Clock::now(),
                                          std::chrono::milliseconds(kPollSliceMs));
    std::this_thread::sleep_for(step);
  }
  return !aborted(abort);
}

const uint8_t* addrBytes(const SocketAddress& a, size_t* n) {  // see rawAddress()
  if (a.family() == AF_INET) {
    *n = 4;
    return reinterpret_cast<const uint8_t*>(
        &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr);
  }
  if (a.family() == AF_INET6) {
    *n = 16;
    return reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr.s6_addr;
  }
  *n = 0;
  return nullptr;
}

Result<uint16_t> parsePort(std::string_view text, std::string_view whole) {
  if (text.empty() || text.size() > 5 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return invalidArgument("bad port in address '" + std::string(whole) +
                           "': expected host:port with a port of 0..65535");
  }
  unsigned v = 0;
  for (char c : text) v = v * 10 + unsigned(c - '0');
  if (v > 65535) {
    return invalidArgument("port " + std::string(text) + " in address '" + std::string(whole) +
                           "' is out of range: use 0..65535");
  }
  return uint16_t(v);
}

}  // namespace

// ---- UniqueFd ----------------------------------------------------------------

void UniqueFd::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

// ---- SocketAddress -------------------------------------------------------------

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

const uint8_t* SocketAddress::rawAddress(size_t* n) const { return addrBytes(*this, n); }

bool SocketAddress::isLoopback() const {
  size_t n = 0;
  const uint8_t* b = addrBytes(*this, &n);
  if (n == 4) return b[0] == 127;
  if (n == 16) {
    static const uint8_t kV6Loop[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(b, kV6Loop, 16) == 0) return true;
    return std::memcmp(b, kMapped, 12) == 0 && b[12] == 127;
  }
  return false;
}

bool SocketAddress::isAny() const {
  size_t n = 0;
  const uint8_t* b = addrBytes(*this, &n);
  if (n == 0) return false;
  return std::all_of(b, b + n, [](uint8_t x) { return x == 0; });
}

std::string SocketAddress::hostString() const {
  char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {};
  if (family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf,
                sizeof buf);
    return buf;
  }
  if (family() == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    std::string s = buf;
    if (a6->sin6_scope_id != 0) s.append("%").append(std::to_string(a6->sin6_scope_id));
    return s;
  }
  return "<none>";
}

std::string SocketAddress::toString() const {
  if (family() == AF_INET) return hostString() + ":" + std::to_string(port());
  if (family() == AF_INET6) return std::string("[").append(hostString()).append("]:").append(std::to_string(port()));
  return "<none>";
}

SocketAddress SocketAddress::fromSockaddr(const sockaddr* sa, socklen_t len) {
  SocketAddress out;
  if (sa == nullptr) return out;
  socklen_t want = sa->sa_family == AF_INET    ? socklen_t(sizeof(sockaddr_in))
                   : sa->sa_family == AF_INET6 ? socklen_t(sizeof(sockaddr_in6))
                                               : 0;
  if (want == 0 || len < want) return out;
  std::memcpy(&out.storage, sa, want);
  out.len = want;
  return out;
}

Result<SocketAddress> SocketAddress::parse(std::string_view hostPort, bool resolveNames) {
  std::string whole(hostPort);
  std::string host;
  std::string_view portText;
  bool bracketed = false;
  if (!hostPort.empty() && hostPort.front() == '[') {
    size_t close = hostPort.find(']');
    if (close == std::string_view::npos || close + 1 >= hostPort.size() ||
        hostPort[close + 1] != ':') {
      return invalidArgument("bad address '" + whole + "': expected [ipv6]:port");
    }
    host = std::string(hostPort.substr(1, close - 1));
    portText = hostPort.substr(close + 2);
    bracketed = true;
  } else {
    size_t colon = hostPort.rfind(':');
    if (colon == std::string_view::npos) {
      return invalidArgument("bad address '" + whole + "': expected host:port");
    }
    host = std::string(hostPort.substr(0, colon));
    portText = hostPort.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return invalidArgument("bad address '" + whole +
                             "': write IPv6 addresses in brackets, e.g. [::1]:port");
    }
  }
  if (host.empty()) return invalidArgument("bad address '" + whole + "': the host is empty");
  LOOM_ASSIGN_OR_RETURN(uint16_t port, parsePort(portText, hostPort));

  addrinfo hints{};
  hints.ai_family = bracketed ? AF_INET6 : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (bracketed || !resolveNames) hints.ai_flags |= AI_NUMERICHOST;
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) {
    std::string why = rc == EAI_SYSTEM ? errnoText(errno) : ::gai_strerror(rc);
    return invalidArgument("cannot resolve host '" + host + "' of address '" + whole +
                           "': " + why + "; give a numeric address or a resolvable name");
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) { pick = ai; break; }
    if (ai->ai_family == AF_INET6 && pick == nullptr) pick = ai;
  }
  SocketAddress out;
  if (pick != nullptr) out = fromSockaddr(pick->ai_addr, pick->ai_addrlen);
  ::freeaddrinfo(list);
  if (out.family() == AF_UNSPEC) {
    return invalidArgument("host '" + host + "' of address '" + whole +
                           "' has no IPv4 or IPv6 address");
  }
  out.setPort(port);
  return out;
}

void SocketAddress::encode(uint8_t* out) const {
  std::memset(out, 0, kEncodedSize);
  if (family() == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    out[0] = 4;
    std::memcpy(out + 2, &a->sin_port, 2);
    std::memcpy(out + 4, &a->sin_addr, 4);
  } else if (family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    out[0] = 6;
    std::memcpy(out + 2, &a->sin6_port, 2);
    std::memcpy(out + 4, a->sin6_addr.s6_addr, 16);
    uint32_t scope = a->sin6_scope_id;
    for (int i = 0; i < 4; ++i) out[20 + i] = uint8_t(scope >> (8 * i));
    std::memcpy(out + 24, &a->sin6_flowinfo, 4);
  }
}

Result<SocketAddress> SocketAddress::decode(const uint8_t* in) {
  SocketAddress out;
  if (in[1] != 0) return invalidArgument("encoded socket address is corrupt (reserved byte set)");
  if (in[0] == 0) {
    bool allZero = std::all_of(in, in + kEncodedSize, [](uint8_t b) { return b == 0; });
    if (!allZero) return invalidArgument("encoded empty socket address has stray bytes");
    return out;
  }
  if (in[0] == 4) {
    if (!std::all_of(in + 8, in + kEncodedSize, [](uint8_t b) { return b == 0; })) {
      return invalidArgument("encoded IPv4 socket address is corrupt (stray bytes)");
    }
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    std::memcpy(&a->sin_port, in + 2, 2);
    std::memcpy(&a->sin_addr, in + 4, 4);
    out.len = sizeof(sockaddr_in);
    return out;
  }
  if (in[0] == 6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a->sin6_family = AF_INET6;
    std::memcpy(&a->sin6_port, in + 2, 2);
    std::memcpy(a->sin6_addr.s6_addr, in + 4, 16);
    uint32_t scope = 0;
    for (int i = 0; i < 4; ++i) scope |= uint32_t(in[20 + i]) << (8 * i);
    a->sin6_scope_id = scope;
    std::memcpy(&a->sin6_flowinfo, in + 24, 4);
    out.len = sizeof(sockaddr_in6);
    return out;
  }
  return invalidArgument("encoded socket address has unknown family tag " +
                         std::to_string(int(in[0])) + " (expected 0, 4 or 6)");
}

bool SocketAddress::operator==(const SocketAddress& other) const {
  if (family() != other.family() || port() != other.port()) return false;
  size_t n1 = 0, n2 = 0;
  const uint8_t* a = addrBytes(*this, &n1);
  const uint8_t* b = addrBytes(other, &n2);
  if (n1 != n2 || (n1 != 0 && std::memcmp(a, b, n1) != 0)) return false;
  if (family() == AF_INET6) {
    return reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_scope_id ==
           reinterpret_cast<const sockaddr_in6*>(&other.storage)->sin6_scope_id;
  }
  return true;
}

// ---- sockets -------------------------------------------------------------------------

Status setNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    return systemErrno("setsockopt(TCP_NODELAY)", errno);
  return Status::ok();
}

Status watchPeer(int fd, double seconds) {
  if (seconds <= 0) return Status::ok();
  // Keepalive while the socket is idle: first probe after s/4, then 3 probes
  // s/8 apart, about 5/8 s in all (Linux caps both times at 32767 s). No
  // TCP_USER_TIMEOUT: since Linux 5.11 it also ends a connection whose
  // window stays closed that long, i.e. a live peer that is only slow to
  // read. Sockets with unacknowledged data are left to the no-progress
  // timeout and to the notices of the ranks that detect the loss.
  constexpr double kMaxS = 32767;
  const int one = 1, probes = 3;
  const int idle = int(std::clamp(seconds / 4, 1.0, kMaxS)), interval = int(std::clamp(seconds / 8, 1.0, kMaxS));
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0) {
    return systemErrno("setsockopt(SO_KEEPALIVE)", errno);
  }
  return Status::ok();
}

Status setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return systemErrno("fcntl(O_NONBLOCK)", errno);
  return Status::ok();
}

std::string peerString(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "<unknown peer>";
  SocketAddress a = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
  return a.family() == AF_UNSPEC ? "<unknown peer>" : a.toString();
}

Result<UniqueFd> listenOn(const SocketAddress& addr, SocketAddress* bound) {
  if (addr.family() != AF_INET && addr.family() != AF_INET6)
    return invalidArgument("cannot listen on " + addr.toString() + ": not an IPv4/IPv6 address");
  UniqueFd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return systemErrno("socket() for listening on " + addr.toString(), errno);
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return systemErrno("setsockopt(SO_REUSEADDR)", errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    int err = errno;
    std::string fix = err == EADDRINUSE      ? "; the port is taken: choose another port"
                      : err == EADDRNOTAVAIL ? "; the address is not on this host: check the "
                                               "interface (NCCL_SOCKET_IFNAME)"
                                             : "";
    return systemError("cannot bind to " + addr.toString() + ": " + errnoText(err) + fix);
  }
  if (::listen(fd.get(), kListenBacklog) != 0)
    return systemErrno("listen on " + addr.toString(), errno);
  if (bound != nullptr) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
      return systemErrno("getsockname of listening socket", errno);
    *bound = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
  }
  return fd;
}

namespace {

bool retryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == EAGAIN ||
         err == EINTR;
}

// True when a TCP socket ended up connected to itself (simultaneous open to a
// local port in the ephemeral range that nobody listens on).
bool selfConnected(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
  return SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&a), la) ==
         SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&b), lb);
}

// One connect attempt. Returns a connected socket, or an invalid one with
// *err set (0 when the deadline passed while connecting).
Result<UniqueFd> connectOnce(const SocketAddress& to, Deadline deadline,
                             const std::atomic<bool>* abort, int* err) {
  UniqueFd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return systemErrno("socket() for connecting to " + to.toString(), errno);
  *err = 0;
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.storage), to.len) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return UniqueFd();
    }
    LOOM_ASSIGN_OR_RETURN(Wait w, waitFd(fd.get(), POLLOUT, deadline, abort));
    if (w == Wait::kAborted) return abortedError("connecting to " + to.toString());
    if (w == Wait::kTimeout) return UniqueFd();  // *err stays 0
    int soErr = 0;
    socklen_t len = sizeof soErr;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soErr, &len) != 0) soErr = errno;
    if (soErr != 0) {
      *err = soErr;
      return UniqueFd();
    }
  }
  if (selfConnected(fd.get())) {
    *err = ECONNREFUSED;
    return UniqueFd();
  }
  LOOM_TRY(setNoDelay(fd.get()));
  return fd;
}

}  // namespace

Result<UniqueFd> connectTo(const SocketAddress& to, Deadline deadline,
                           const std::atomic<bool>* abort, double refusedLimitS) {
  if (to.family() != AF_INET && to.family() != AF_INET6)
    return invalidArgument("cannot connect to " + to.toString() + ": not an IPv4/IPv6 address");
  if (to.port() == 0) return invalidArgument("cannot connect to " + to.toString() + ": port 0");
  auto start = Clock::now();
  int backoffMs = 1;
  int attempts = 0;
  int lastErr = ETIMEDOUT;  // reported when no attempt got an answer at all
  Clock::time_point refusedSince{};
  while (true) {
    if (aborted(abort)) return abortedError("connecting to " + to.toString());
    ++attempts;
    int err = 0;
    LOOM_ASSIGN_OR_RETURN(UniqueFd fd, connectOnce(to, deadline, abort, &err));
    if (fd) return fd;
    if (err != 0) lastErr = err;
    if (err == ECONNREFUSED && refusedLimitS > 0) {
      if (refusedSince == Clock::time_point{}) refusedSince = Clock::now();
      if (secondsSince(refusedSince) > refusedLimitS) {
        return remoteError(to.toString() + " refuses connections (for " + std::to_string(int(refusedLimitS)) +
                           " s): the process that listened there exited or closed its communicator");
      }
    } else {
      refusedSince = {};
    }
    if (err != 0 && !retryableConnectError(err)) {
      return systemError("cannot connect to " + to.toString() + ": " + errnoText(err) +
                         "; check that the address is reachable from this host "
                         "(NCCL_SOCKET_IFNAME selects the interface peers advertise)");
    }
    if (!sleepChecked(backoffMs, deadline, abort))
      return abortedError("connecting to " + to.toString());
    backoffMs = std::min(backoffMs * 2, kMaxBackoffMs);
    if (deadline.expired()) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", secondsSince(start));
      return remoteError("could not connect to " + to.toString() + " within " + secs + " s (" +
                         std::to_string(attempts) + " attempts, last error: " + errnoText(lastErr) +
                         "); check that the peer process is running and listening there and "
                         "that no firewall blocks the port");
    }
  }
}

namespace {

// accept4 with the pending-error cases folded into "none pending"; *err is
// the errno of a real failure (0 otherwise).
Result<UniqueFd> acceptImpl(int listenFd, int* err) {
  *err = 0;
  while (true) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      UniqueFd owned(fd);
      LOOM_TRY(setNoDelay(owned.get()));
      return owned;
    }
    switch (errno) {
      case EINTR:
        continue;
      // Nothing pending, or a connection that died before we took it (Linux
      // passes pending network errors to accept: treat them like EAGAIN).
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        return UniqueFd();
      default:
        *err = errno;
        return systemErrno("accept on listening socket", errno);
    }
  }
}

}  // namespace

Result<UniqueFd> startConnect(const SocketAddress& to, int* err) {
  *err = 0;
  if (to.family() != AF_INET && to.family() != AF_INET6)
    return invalidArgument("cannot connect to " + to.toString() + ": not an IPv4/IPv6 address");
  UniqueFd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return systemErrno("socket() for connecting to " + to.toString(), errno);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.storage), to.len) == 0 ||
      errno == EINPROGRESS || errno == EINTR) {
    return fd;
  }
  *err = errno;
  if (!retryableConnectError(*err)) {
    return systemError("cannot connect to " + to.toString() + ": " + errnoText(*err) +
                       "; check that the address is reachable from this host");
  }
  return UniqueFd();
}

int finishConnect(int fd) {
  pollfd p{fd, POLLOUT, 0};
  int rc = ::poll(&p, 1, 0);
  if (rc < 0) return errno == EINTR ? EINPROGRESS : errno;
  if (rc == 0) return EINPROGRESS;
  int soErr = 0;
  socklen_t len = sizeof soErr;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soErr, &len) != 0) return errno;
  if (soErr != 0) return soErr;
  if (selfConnected(fd)) return ECONNREFUSED;
  if (Status s = setNoDelay(fd); !s.isOk()) return EIO;
  return 0;
}

Result<UniqueFd> acceptOne(int listenFd) {
  int err = 0;
  return acceptImpl(listenFd, &err);
}

size_t maxPendingConnections() {
  rlimit rl{};
  size_t limit = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = size_t(rl.rlim_cur);
  return std::clamp<size_t>(limit / 4, 16, 1024);
}

AcceptGate::AcceptGate() : maxPending_(maxPendingConnections()) {}

bool AcceptGate::pollable() const { return Clock::now() >= resumeAt_; }

int AcceptGate::backoffMsLeft() const {
  auto left = resumeAt_ - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  return int(std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) + 1;
}

Result<UniqueFd> AcceptGate::accept(int listenFd) {
  constexpr auto kBackoff = std::chrono::milliseconds(100);
  if (!pollable()) return UniqueFd();
  int err = 0;
  auto fd = acceptImpl(listenFd, &err);
  if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
    resumeAt_ = Clock::now() + kBackoff;
    ++backoffs_;
    return UniqueFd();
  }
  return fd;
}

Status sendAll(int fd, const void* data, size_t bytes, Deadline deadline,
               const std::atomic<bool>* abort) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::send(fd, p + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    int err = errno;
    if (n < 0 && err == EINTR) continue;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      LOOM_ASSIGN_OR_RETURN(Wait w, waitFd(fd, POLLOUT, deadline, abort));
      std::string what = "sending " + std::to_string(bytes) + " bytes to " + peerString(fd);
      if (w == Wait::kAborted) return abortedError(what);
      if (w == Wait::kTimeout)
        return remoteError("timed out " + what + " (" + std::to_string(done) +
                           " sent); the peer stopped reading");
      continue;
    }
    if (err == EPIPE || err == ECONNRESET)
      return remoteError("peer closed the connection (" + peerString(fd) + ", " +
                         errnoText(err) + ")");
    return systemErrno("send to " + peerString(fd), err);
  }
  return Status::ok();
}

Status recvAll(int fd, void* data, size_t bytes, Deadline deadline,
               const std::atomic<bool>* abort) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::recv(fd, p + done, bytes - done, MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n == 0)
      return remoteError("peer closed the connection (" + peerString(fd) + ", after " +
                         std::to_string(done) + " of " + std::to_string(bytes) + " bytes)");
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      LOOM_ASSIGN_OR_RETURN(Wait w, waitFd(fd, POLLIN, deadline, abort));
      std::string what = "receiving " + std::to_string(bytes) + " bytes from " + peerString(fd);
      if (w == Wait::kAborted) return abortedError(what);
      if (w == Wait::kTimeout)
        return remoteError("timed out " + what + " (" + std::to_string(done) +
                           " received); the peer did not send");
      continue;
    }
    if (err == ECONNRESET)
      return remoteError("peer closed the connection (" + peerString(fd) + ", " +
                         errnoText(err) + ")");
    return systemErrno("recv from " + peerString(fd), err);
  }
  return Status::ok();
}

}  // namespace loom::net
