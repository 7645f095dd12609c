// HelloReader: the connections a listener accepted, until each identifies
// itself with a wire::Hello and the payload the hello announces. Shared by
// the rendezvous root (join requests) and every rank's bootstrap listener
// (data sockets, ring sockets, abort notices).
//
// Nothing here blocks: acceptAll() takes what the listener holds (through
// an AcceptGate that backs off when fds run out, at most maxPending
// unidentified connections), service() reads what has arrived. A connection
// is dropped when it closes, stays silent for 30 s, or its hello fails the
// caller's check (which runs once, as soon as the hello is in, before any
// payload byte is read; it may answer on the fd first).
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/time.h"
#include "core/wire.h"
#include "transport/net/socket.h"

namespace loom::core {

class HelloReader {
 public:
  struct Arrival {
    wire::Hello hello;
    std::vector<uint8_t> payload;  // exactly hello.payload bytes
    net::UniqueFd fd;
  };
  // True to go on reading the payload; false drops the connection (the
  // check logs why). Must bound hello.payload.
  using Check = std::function<bool(const wire::Hello& hello, int fd)>;

  // `who` starts its log lines ("bootstrap root", "rank 3").
  explicit HelloReader(std::string who) : who_(std::move(who)) {}
  void setWho(std::string who) { who_ = std::move(who); }

  void acceptAll(int listenFd);
  // Reads what is available on each connection; appends those complete.
  void service(const Check& check, std::vector<Arrival>* done);
  // The listener (unless accepting backs off) and the connections.
  void pollFds(int listenFd, std::vector<pollfd>* fds) const;
  // When the listener is not polled: wake up within this many ms.
  int backoffMsLeft() const { return gate_.pollable() ? -1 : gate_.backoffMsLeft(); }

 private:
  struct Pending {
    net::UniqueFd fd;
    std::vector<uint8_t> buf;  // the hello and payload bytes so far
    Clock::time_point since;
    bool checked = false;
  };
  std::string who_;
  net::AcceptGate gate_;
  std::vector<Pending> pending_;
};

}  // namespace loom::core
