#include "shm_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>

#include "transport_test_util.h"

namespace loom::transport::shm::testing {
namespace {

constexpr int kBlockMs = 50;

void blockOnce(const Connection& c) {
  std::vector<pollfd> fds;
  c.pollFds(&fds);
  if (fds.empty()) return;
  ::poll(fds.data(), fds.size(), kBlockMs);
}

struct InFlight {
  std::vector<uint8_t> buf;
  Transfer t;
  uint32_t index = 0;
};

// Posts up to `window` transfers from `next`, in order.
Status postMore(Connection& c, bool send, uint32_t stream, const std::vector<size_t>& sizes,
                size_t window, size_t* next, std::deque<InFlight>* q) {
  while (q->size() < window && *next < sizes.size()) {
    q->emplace_back();
    InFlight& f = q->back();
    f.index = uint32_t(*next);
    f.buf.assign(std::max<size_t>(sizes[*next], 1), 0xA5);
    if (send) transport::testing::fillPattern(f.buf.data(), sizes[*next], stream, f.index);
    f.t.data = f.buf.data();
    f.t.bytes = sizes[*next];
    // Every other send may go single-copy (a plan's hint), so that both
    // kinds interleave on one connection.
    f.t.singleCopy = send && f.index % 2 == 0;
    LOOM_TRY(send ? c.postSend(&f.t) : c.postRecv(&f.t));
    ++*next;
  }
  return Status::ok();
}

}  // namespace

Result<Pair> makePair(const Options& a, const Options& b) {
  Pair p;
  LOOM_ASSIGN_OR_RETURN(p.a, ShmConnection::create(1, a));
  LOOM_ASSIGN_OR_RETURN(p.b, ShmConnection::create(0, b));
  LOOM_TRY(p.a->attach(p.b->local()));
  LOOM_TRY(p.b->attach(p.a->local()));
  return p;
}

Status runExchange(Connection& c, uint32_t sendStream, const std::vector<size_t>& sendSizes,
                   uint32_t recvStream, const std::vector<size_t>& recvSizes, size_t window,
                   Deadline deadline) {
  std::deque<InFlight> sends, recvs;
  size_t nextSend = 0, nextRecv = 0;
  while (true) {
    LOOM_TRY(postMore(c, true, sendStream, sendSizes, window, &nextSend, &sends));
    LOOM_TRY(postMore(c, false, recvStream, recvSizes, window, &nextRecv, &recvs));
    LOOM_TRY(c.progress());
    bool moved = false;
    while (!sends.empty() && sends.front().t.done) {
      if (sends.front().t.progressed != sends.front().t.bytes) {
        return internalError("test: send done with progressed != bytes");
      }
      sends.pop_front();
      moved = true;
    }
    while (!recvs.empty() && recvs.front().t.done) {
      const InFlight& f = recvs.front();
      if (f.t.progressed != f.t.bytes ||
          !transport::testing::checkPattern(f.buf.data(), f.t.bytes, recvStream, f.index)) {
        return internalError("test: message #" + std::to_string(f.index) + " of " +
                             std::to_string(f.t.bytes) + " bytes arrived corrupted");
      }
      recvs.pop_front();
      moved = true;
    }
    if (sends.empty() && recvs.empty() && nextSend == sendSizes.size() &&
        nextRecv == recvSizes.size()) {
      return Status::ok();
    }
    if (deadline.expired()) {
      return remoteError("test: exchange not finished before the deadline (sent " +
                         std::to_string(nextSend - sends.size()) + ", received " +
                         std::to_string(nextRecv - recvs.size()) + ")");
    }
    if (!moved) blockOnce(c);
  }
}

Status pingPong(Connection& c, bool pinger, size_t bytes, int rounds, bool blocking,
                Deadline deadline) {
  std::vector<uint8_t> out(std::max<size_t>(bytes, 1), 7), in(std::max<size_t>(bytes, 1), 0);
  auto wait = [&](Transfer& t) -> Status {
    while (true) {
      LOOM_TRY(c.progress());
      if (t.done) return Status::ok();
      if (deadline.expired()) return remoteError("test: ping-pong timed out");
      if (blocking) blockOnce(c);
    }
  };
  for (int i = 0; i < rounds; ++i) {
    Transfer s{out.data(), bytes}, r{in.data(), bytes};
    if (pinger) {
      LOOM_TRY(c.postSend(&s));
      LOOM_TRY(c.postRecv(&r));
      LOOM_TRY(wait(r));
      LOOM_TRY(wait(s));
    } else {
      LOOM_TRY(c.postRecv(&r));
      LOOM_TRY(wait(r));
      LOOM_TRY(c.postSend(&s));
      LOOM_TRY(wait(s));
    }
  }
  return Status::ok();
}

std::vector<size_t> mixedSizes(size_t slot, int rounds) {
  const std::vector<size_t> base = {0,        1,        7,           4095,     4096,
                                    slot - 1, slot,     slot + 1,    3 * slot + 5,
                                    65535,    65536,    100003,      (1u << 20) + 7,
                                    3u << 20, (9u << 20) + 1};
  std::vector<size_t> out;
  std::mt19937 rng(12345);
  for (int r = 0; r < rounds; ++r) {
    std::vector<size_t> round = base;
    std::shuffle(round.begin(), round.end(), rng);
    out.insert(out.end(), round.begin(), round.end());
  }
  return out;
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::start(
    std::function<int(ChildProcess& self)> body) {
  int toChild[2], toParent[2];
  if (::pipe2(toChild, O_CLOEXEC) != 0) return systemErrno("pipe2", errno);
  if (::pipe2(toParent, O_CLOEXEC) != 0) return systemErrno("pipe2", errno);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return systemErrno("fork", errno);
  std::unique_ptr<ChildProcess> p(new ChildProcess());
  if (pid == 0) {
    ::close(toChild[1]);
    ::close(toParent[0]);
    p->readFd_ = toChild[0];
    p->writeFd_ = toParent[1];
    int code = body(*p);
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(toChild[0]);
  ::close(toParent[1]);
  p->pid_ = pid;
  p->readFd_ = toParent[0];
  p->writeFd_ = toChild[1];
  return p;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (readFd_ >= 0) ::close(readFd_);
  if (writeFd_ >= 0) ::close(writeFd_);
}

Status ChildProcess::send(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(writeFd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return systemErrno("test: pipe write", errno);
    p += n;
    bytes -= size_t(n);
  }
  return Status::ok();
}

Status ChildProcess::recv(void* data, size_t bytes, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    pollfd pf{readFd_, POLLIN, 0};
    if (::poll(&pf, 1, deadline.msLeft(100)) == 0) {
      if (deadline.expired()) return remoteError("test: pipe read timed out");
      continue;
    }
    ssize_t n = ::read(readFd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return remoteError("test: the other process closed its pipe");
    if (n < 0) return systemErrno("test: pipe read", errno);
    p += n;
    bytes -= size_t(n);
  }
  return Status::ok();
}

Status ChildProcess::connect(ShmConnection& c, Deadline deadline) {
  LOOM_TRY(send(&c.local(), sizeof(ShmDescriptor)));
  ShmDescriptor peer;
  LOOM_TRY(recv(&peer, sizeof peer, deadline));
  LOOM_TRY(c.attach(peer));
  const char ok = 'A';
  char got = 0;
  LOOM_TRY(send(&ok, 1));
  LOOM_TRY(recv(&got, 1, deadline));
  if (got != ok) return internalError("test: bad sync byte");
  return Status::ok();
}

Result<int> ChildProcess::wait(Deadline deadline) {
  while (true) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return -WTERMSIG(status);
    }
    if (r < 0 && errno != EINTR) return systemErrno("test: waitpid", errno);
    if (deadline.expired()) {
      kill(SIGKILL);
      return remoteError("test: child " + std::to_string(pid_) + " did not exit in time");
    }
    ::usleep(2000);
  }
}

void ChildProcess::kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

std::set<std::string> devShmEntries() {
  std::set<std::string> out;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.insert(name);
  }
  ::closedir(d);
  return out;
}

bool usesDevShm() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/") != std::string::npos) return true;
  }
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    char target[512];
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (std::string(target).rfind("/dev/shm/", 0) == 0) found = true;
  }
  ::closedir(d);
  return found;
}

InboxHeader* mapInbox(const ShmConnection& c) {
  const ShmDescriptor& d = c.local();
  const std::string path = "/proc/self/fd/" + std::to_string(d.memfd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, d.inboxBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<InboxHeader*>(p);
}

}  // namespace loom::transport::shm::testing
