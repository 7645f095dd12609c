// Socket utilities shared by the bootstrap and the TCP transport: an owning fd,
// addresses (parse, print, fixed-size encoding), interface selection with
// NCCL_SOCKET_IFNAME semantics, and deadline-bounded connect/accept/send/recv.
//
// Every wait here has a deadline and checks an optional abort flag at least
// every 100 ms, so nothing can hang forever. All sockets are non-blocking and
// close-on-exec. Sends use MSG_NOSIGNAL: a dead peer is an error, never SIGPIPE.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace loom::net {

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  // Gives up ownership; the caller must close the returned fd.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the current fd (if any) and takes ownership of `fd`.
  void reset(int fd = -1);
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

 private:
  int fd_ = -1;
};

// An IPv4 or IPv6 socket address (family AF_UNSPEC when empty).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return len == 0 ? AF_UNSPEC : storage.ss_family; }
  uint16_t port() const;  // host byte order; 0 when empty
  void setPort(uint16_t port);
  bool isLoopback() const;  // 127.0.0.0/8 or ::1 (or v4-mapped 127.x)
  bool isAny() const;       // 0.0.0.0 or ::
  // The address bytes in network order (4 or 16; *n = 0 and null when empty).
  const uint8_t* rawAddress(size_t* n) const;
  // Address without the port: "1.2.3.4" or "::1".
  std::string hostString() const;
  // "1.2.3.4:5678" or "[::1]:5678"; "<none>" when empty.
  std::string toString() const;

  // "host:port" or "[v6addr]:port"; host may be a name (resolved with
  // getaddrinfo, first stream address wins, IPv4 preferred) or a numeric
  // address. Port 0..65535 is required. With resolveNames false only
  // numeric hosts are accepted (no lookup ever leaves the process).
  static Result<SocketAddress> parse(std::string_view hostPort, bool resolveNames = true);
  // From a sockaddr returned by the kernel (getifaddrs, getsockname...).
  static SocketAddress fromSockaddr(const sockaddr* sa, socklen_t len);

  // Fixed-size POD encoding (28 bytes) for embedding in ids and messages,
  // independent of the host's sockaddr layout:
  //   [0]      family tag: 0 none, 4 IPv4, 6 IPv6
  //   [1]      reserved (0)
  //   [2..3]   port, network byte order
  //   [4..19]  address, network byte order (IPv4 uses [4..7], rest 0)
  //   [20..23] IPv6 scope id, little endian
  //   [24..27] IPv6 flow info, network byte order as in sockaddr_in6
  static constexpr size_t kEncodedSize = 28;
  void encode(uint8_t* out) const;
  static Result<SocketAddress> decode(const uint8_t* in);

  // Same family, address and port (and scope for IPv6).
  bool operator==(const SocketAddress& other) const;
};

struct Interface {
  std::string name;
  SocketAddress addr;     // port 0
  SocketAddress netmask;  // same family as addr; empty when the kernel gave none
  bool loopback = false;
  // True when `other` (same family) lies in this interface's subnet.
  bool sameSubnet(const SocketAddress& other) const;
};

// An address family setting's value: "" (AF_UNSPEC), "AF_INET" or
// "AF_INET6"; anything else is an error naming `setting` (NCCL_SOCKET_FAMILY,
// NCCL_IB_ADDR_FAMILY).
Result<int> parseFamily(std::string_view text, std::string_view setting);

// Up interfaces with an address, one address per interface (IPv4 preferred
// when `family` is empty; IPv6 link-local addresses are skipped because they
// need a scope to be usable), filtered by an NCCL_SOCKET_IFNAME-style spec:
//   "eth,ib"   names starting with eth or ib
//   "^docker"  all names except those starting with docker
//   "=eth0"    exactly eth0 (also "^=eth0" to exclude exactly eth0)
// `family`: "" (any), "AF_INET" or "AF_INET6" (NCCL_SOCKET_FAMILY).
// Empty spec: every up interface except loopback and docker*/virbr* first,
// then docker*/virbr*, then loopback. When nothing matches the error message
// names the spec and the family and lists the interfaces that exist.
Result<std::vector<Interface>> findInterfaces(const std::string& ifnameSpec,
                                              const std::string& family);

// The interface to use: the first of findInterfaces, except that when `reach`
// is given (e.g. the NCCL_COMM_ID address) and the spec is empty, the
// interface in the same subnet as `reach` is preferred (a loopback `reach`
// picks the loopback interface).
Result<Interface> chooseInterface(const std::string& ifnameSpec, const std::string& family,
                                  const SocketAddress* reach);

// Listening socket (non-blocking, SO_REUSEADDR, backlog 16384 as clamped by
// the kernel's somaxconn) bound to addr (port 0 = ephemeral). *bound (may be
// null) receives the real address.
Result<UniqueFd> listenOn(const SocketAddress& addr, SocketAddress* bound);

// Non-blocking connect; retries ECONNREFUSED, ETIMEDOUT, ECONNRESET (and the
// transient EAGAIN/EINTR) with backoff until the deadline; checks *abort (may
// be null) at least every 100 ms. Returns a connected non-blocking socket with
// TCP_NODELAY set. Failure to get through before the deadline is kRemoteError;
// an abort is kRemoteError with "aborted" in the message; a local failure
// (no route, bad address) is kSystemError. Messages name the address.
// `refusedLimitS` > 0: a peer that keeps refusing (ECONNREFUSED) for that
// long is gone (for listeners known to be open already): kRemoteError then.
Result<UniqueFd> connectTo(const SocketAddress& to, Deadline deadline,
                           const std::atomic<bool>* abort, double refusedLimitS = 0);

// Non-blocking connect in two halves, for state machines that must never
// block. startConnect returns a socket whose connect is under way (poll it
// for POLLOUT), or an invalid one with *err set to a retryable errno
// (refused, reset...); other failures are errors. finishConnect then says 0
// (connected, TCP_NODELAY set), EINPROGRESS (still connecting) or the errno
// of the failed attempt.
Result<UniqueFd> startConnect(const SocketAddress& to, int* err);
int finishConnect(int fd);

// Accepts one pending connection if any (never blocks): returns an invalid
// UniqueFd when none is pending (or one was reset before being accepted).
// The returned socket is non-blocking, close-on-exec, with TCP_NODELAY.
Result<UniqueFd> acceptOne(int listenFd);

// Accepting for a listener that must never spin or run out of fds.
//  - EMFILE/ENFILE: the process (or system) is out of fds. The pending
//    connection stays in the kernel's queue, so the listener stays readable
//    and a poll loop would spin at 100% CPU: accept() then stops for a
//    back-off period, during which pollable() is false.
//  - At most maxPending() unidentified connections are held (well below the
//    fd limit); the owner closes new ones beyond that (full()).
class AcceptGate {
 public:
  AcceptGate();
  // One pending connection if any and if not backing off (invalid fd when
  // none). Errors other than fd exhaustion are returned.
  Result<UniqueFd> accept(int listenFd);
  // Whether to poll the listener now; when false, wake up again within
  // backoffMsLeft().
  bool pollable() const;
  int backoffMsLeft() const;
  size_t maxPending() const { return maxPending_; }
  // Times accept() backed off (tests, logs).
  uint64_t backoffs() const { return backoffs_; }

 private:
  Clock::time_point resumeAt_{};
  size_t maxPending_;
  uint64_t backoffs_ = 0;
};

// Unidentified connections a listener may hold: a quarter of the soft fd
// limit, between 16 and 1024.
size_t maxPendingConnections();

// Exact send/recv of control messages on a non-blocking socket, waiting with
// poll in slices of at most 100 ms. Fails on deadline (kRemoteError, "timed
// out"), abort (kRemoteError, "aborted"), EOF (kRemoteError, "peer closed the
// connection"), ECONNRESET/EPIPE (kRemoteError), or another error
// (kSystemError). Messages name the peer address when known.
Status sendAll(int fd, const void* data, size_t bytes, Deadline deadline,
               const std::atomic<bool>* abort);
Status recvAll(int fd, void* data, size_t bytes, Deadline deadline,
               const std::atomic<bool>* abort);

// Small helpers used by the transport.
Status setNoDelay(int fd);
// Dead-peer detection on a connected TCP socket, within about `seconds`
// (<= 0: off): keepalive probes while it is idle. A peer whose host or
// network vanished then fails the socket (ETIMEDOUT); a peer that is alive
// but slow (even stopped) still answers the probes, so it never does.
Status watchPeer(int fd, double seconds);
Status setNonBlocking(int fd);
// The peer address of a connected socket ("<unknown peer>" on failure).
std::string peerString(int fd);

}  // namespace loom::net
