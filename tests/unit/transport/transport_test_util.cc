#include "transport_test_util.h"

#include <poll.h>

#include <thread>

namespace loom::transport::testing {

Result<SocketSets> makeTcpSockets(size_t n) {
  LOOM_ASSIGN_OR_RETURN(net::SocketAddress any, net::SocketAddress::parse("127.0.0.1:0"));
  net::SocketAddress bound;
  LOOM_ASSIGN_OR_RETURN(net::UniqueFd listener, net::listenOn(any, &bound));
  SocketSets out;
  for (size_t i = 0; i < n; ++i) {
    LOOM_ASSIGN_OR_RETURN(net::UniqueFd c,
                          net::connectTo(bound, Deadline::afterSeconds(30), nullptr));
    // Connections are accepted one at a time, so accept order = connect order.
    Deadline d = Deadline::afterSeconds(30);
    net::UniqueFd s;
    while (!s.valid()) {
      LOOM_ASSIGN_OR_RETURN(s, net::acceptOne(listener.get()));
      if (s.valid()) break;
      if (d.expired()) return remoteError("test: accept timed out");
      pollfd p{listener.get(), POLLIN, 0};
      ::poll(&p, 1, 100);
    }
    out.a.push_back(std::move(c));
    out.b.push_back(std::move(s));
  }
  return out;
}

namespace {

void waitOnce(const Connection& c) {
  std::vector<pollfd> fds;
  c.pollFds(&fds);
  if (fds.empty()) {
    std::this_thread::yield();
    return;
  }
  ::poll(fds.data(), fds.size(), 100);
}

}  // namespace

Status waitAll(Connection& c, const std::vector<Transfer*>& transfers, Deadline deadline) {
  while (true) {
    LOOM_TRY(c.progress());
    bool all = true;
    for (const Transfer* t : transfers) all = all && t->done;
    if (all) return Status::ok();
    if (deadline.expired()) return remoteError("test: transfers not done before the deadline");
    waitOnce(c);
  }
}

Status waitForError(Connection& c, Deadline deadline) {
  while (!deadline.expired()) {
    Status s = c.progress();
    if (!s.isOk()) return s;
    waitOnce(c);
  }
  return Status::ok();
}

void fillPattern(uint8_t* data, size_t bytes, uint32_t stream, uint32_t index) {
  uint32_t x = stream * 0x9E3779B9u + index * 0x85EBCA6Bu + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    data[i] = uint8_t(x);
  }
}

bool checkPattern(const uint8_t* data, size_t bytes, uint32_t stream, uint32_t index) {
  uint32_t x = stream * 0x9E3779B9u + index * 0x85EBCA6Bu + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    if (data[i] != uint8_t(x)) return false;
  }
  return true;
}

}  // namespace loom::transport::testing
