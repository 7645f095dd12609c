// Fuzz target `tcp_frames`: TcpConnection's receive path, end to end over
// real loopback TCP sockets, facing a peer that sends arbitrary bytes
// (frame headers and payload) on any of its sockets, then maybe closes.
//
// Input:
//   [flags : u8]   bits 0-1: sockets (1 + v % 3); bits 2-4: after writing,
//                  1 close (EOF), 2 reset (RST), others keep open; bits 5-6:
//                  stripeMin 1, 64, 4096 or 65536
//   [receives : u8] 1 + (v & 7) receives, then that many [bytes : u16]
//   chunks until the end: [head : u8] socket = head % sockets, bit 7 = fill;
//                  [length : u16]; then `length` bytes, or with fill one byte
//                  repeated `length` times
// After every chunk the connection runs progress() once; at the end until it
// fails, completes, or has nothing left to read. Every receive has a buffer
// of exactly its size, so ASan sees any write past it.
//
// The socket pairs of inputs that keep them open are made once and drained
// after each input (the connection gets dup()s); inputs that close get pairs
// of their own. Each input starts a fresh TcpConnection, so inputs do not
// depend on each other.
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "transport/tcp/connection.h"

namespace {

using loom::transport::Transfer;
using loom::transport::tcp::TcpConnection;

constexpr int kMaxSockets = 3;
constexpr size_t kMaxWriteBytes = size_t(1) << 20;  // per input, whatever the fills say
constexpr int kMaxFinalRounds = 64;
constexpr size_t kStripeMins[4] = {1, 64, 4096, 65536};

void die(const char* what) {
  std::perror(what);
  std::abort();
}

struct Link {
  int reader = -1;  // the end TcpConnection reads (as a dup)
  int writer = -1;  // the hostile peer's end
};

int listener() {
  static int fd = [] {
    int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) die("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
    if (::listen(l, 64) != 0) die("listen");
    return l;
  }();
  return fd;
}

Link connectLink() {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(listener(), reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
  Link k;
  k.writer = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (k.writer < 0) die("socket");
  if (::connect(k.writer, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    // libFuzzer's timer signal may interrupt the connect, which then goes on
    // in the background: wait for it to finish (a long run hit this).
    if (errno != EINTR) die("connect");
    pollfd p{k.writer, POLLOUT, 0};
    while (::poll(&p, 1, -1) < 0) {
      if (errno != EINTR) die("poll");
    }
    int err = 0;
    socklen_t errLen = sizeof err;
    if (::getsockopt(k.writer, SOL_SOCKET, SO_ERROR, &err, &errLen) != 0 || err != 0) {
      errno = err;
      die("connect");
    }
  }
  do {
    k.reader = ::accept4(listener(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  } while (k.reader < 0 && errno == EINTR);
  if (k.reader < 0) die("accept4");
  int one = 1;
  ::setsockopt(k.writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return k;
}

// Closes with RST (no TIME_WAIT left behind; the reader sees ECONNRESET).
void resetClose(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

int pendingIn(int fd) {
  int n = 0;
  return ::ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
}

// Bytes the kernel has not yet sent (unacknowledged ones already sit in the
// reader's queue on loopback).
int unsent(int fd) {
  int n = 0;
  return ::ioctl(fd, SIOCOUTQNSD, &n) == 0 ? n : 0;
}

// Empties a kept pair so the next input starts on a silent stream.
bool drain(const Link& k) {
  char buf[65536];
  for (int i = 0; i < 10000; ++i) {
    ssize_t r = ::recv(k.reader, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && unsent(k.writer) == 0) return true;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return false;
  }
  return false;
}

std::array<Link, kMaxSockets>& keptLinks() {
  static std::array<Link, kMaxSockets> links = [] {
    std::array<Link, kMaxSockets> l;
    for (Link& k : l) k = connectLink();
    return l;
  }();
  return links;
}

struct Receive {
  std::unique_ptr<uint8_t[]> buf;
  Transfer t;
};

class Run {
 public:
  Run(TcpConnection& conn, std::vector<Receive>& recvs) : conn_(conn), recvs_(recvs) {}

  // One progress() call and the contract checks after it; false once failed.
  bool step() {
    loom::Status s = conn_.progress();
    check();
    if (s.isOk()) return true;
    FUZZ_TRACE("tcp: %s\n", s.message().c_str());
    FUZZ_CHECK(s.code() == loom::Code::kRemoteError || s.code() == loom::Code::kSystemError);
    FUZZ_CHECK(!s.message().empty());
    loom::Status again = conn_.progress();  // sticky
    FUZZ_CHECK(!again.isOk() && again.code() == s.code());
    failed_ = true;
    return false;
  }
  bool failed() const { return failed_; }
  bool allDone() const { return recvs_.empty() || recvs_.back().t.done; }

 private:
  void check() const {
    bool prevDone = true;
    for (const Receive& r : recvs_) {
      FUZZ_CHECK(r.t.progressed <= r.t.bytes);
      FUZZ_CHECK(!r.t.done || r.t.progressed == r.t.bytes);
      FUZZ_CHECK(!r.t.done || prevDone);  // completed in posting order
      prevDone = r.t.done;
    }
    std::vector<pollfd> fds;
    conn_.pollFds(&fds);
  }

  TcpConnection& conn_;
  std::vector<Receive>& recvs_;
  bool failed_ = false;
};

// Writes `n` bytes to the peer end; when the socket is full, lets the
// connection read. Gives up (false) when the reader stopped reading.
bool writeAll(int fd, const uint8_t* p, size_t n, Run& run) {
  int stalls = 0;
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= size_t(w);
      stalls = 0;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (run.failed() || run.allDone() || ++stalls > 100) return false;
    run.step();
  }
  return true;
}

// How one input uses the sockets (its first byte).
struct Setup {
  explicit Setup(uint8_t flags)
      : sockets(1 + (flags & 3) % 3),
        closeMode((flags >> 2) & 7),
        fresh(closeMode == kCloseEof || closeMode == kCloseReset),
        stripeMin(kStripeMins[(flags >> 5) & 3]) {}
  static constexpr int kCloseEof = 1, kCloseReset = 2;
  int sockets;
  int closeMode;
  bool fresh;  // pairs of its own, closed by the peer after writing
  size_t stripeMin;
};

// The hostile peer's chunks, each followed by one progress() of the reader.
void writeChunks(loom::fuzz::Input& in, const Setup& setup, const std::array<Link, kMaxSockets>& links,
                 Run& run) {
  size_t written = 0;
  std::vector<uint8_t> fill;
  while (!in.empty() && written < kMaxWriteBytes) {
    const uint8_t head = in.u8();
    const int fd = links[size_t(head % setup.sockets)].writer;
    size_t len = std::min<size_t>(in.u16(), kMaxWriteBytes - written);
    const uint8_t* p;
    if (head & 0x80) {
      fill.assign(len, in.u8());
      p = fill.data();
    } else {
      std::string_view v = in.view(len);
      p = reinterpret_cast<const uint8_t*>(v.data());
      len = v.size();
    }
    if (!writeAll(fd, p, len, run)) return;
    written += len;
    if (!run.step()) return;
  }
}

// A fresh TcpConnection over dup()s of the reading ends, fed by the input.
void exercise(loom::fuzz::Input& in, const Setup& setup, std::array<Link, kMaxSockets>& links) {
  std::vector<Receive> recvs(size_t(1 + (in.u8() & 7)));
  std::vector<loom::net::UniqueFd> fds;
  for (int s = 0; s < setup.sockets; ++s) {
    int d = ::dup(links[size_t(s)].reader);
    if (d < 0) die("dup");
    fds.emplace_back(d);
  }
  TcpConnection conn(/*peerRank=*/1, std::move(fds), setup.stripeMin);
  Run run(conn, recvs);
  for (Receive& r : recvs) {
    r.t.bytes = in.u16();
    if (r.t.bytes > 0) r.buf.reset(new uint8_t[r.t.bytes]);
    r.t.data = r.buf.get();
    FUZZ_CHECK(conn.postRecv(&r.t).isOk());
  }
  writeChunks(in, setup, links, run);
  if (setup.fresh) {
    for (int s = 0; s < setup.sockets; ++s) {
      if (setup.closeMode == Setup::kCloseEof) {
        ::shutdown(links[size_t(s)].writer, SHUT_WR);
      } else {
        resetClose(links[size_t(s)].writer);
        links[size_t(s)].writer = -1;
      }
    }
  }
  for (int round = 0; round < kMaxFinalRounds && !run.failed() && !run.allDone(); ++round) {
    bool quiet = true;
    for (int s = 0; s < setup.sockets; ++s) quiet = quiet && pendingIn(links[size_t(s)].reader) == 0;
    if (!run.step()) break;
    if (quiet && !setup.fresh) break;  // nothing more can arrive
  }
  for (const Receive& r : recvs) {
    FUZZ_TRACE("tcp: receive of %zu: %zu bytes%s\n", r.t.bytes, r.t.progressed, r.t.done ? ", done" : "");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::Input in(data, size);
  const Setup setup(in.u8());
  std::array<Link, kMaxSockets> links;
  for (int s = 0; s < setup.sockets; ++s) {
    links[size_t(s)] = setup.fresh ? connectLink() : keptLinks()[size_t(s)];
  }
  exercise(in, setup, links);
  for (int s = 0; s < setup.sockets; ++s) {
    Link& k = links[size_t(s)];
    if (setup.fresh) {
      if (k.writer >= 0) resetClose(k.writer);
      resetClose(k.reader);
    } else if (!drain(k)) {
      // The stream is stuck or broken: start over with new pairs.
      ::close(k.reader);
      ::close(k.writer);
      keptLinks()[size_t(s)] = connectLink();
    }
  }
  return 0;
}
