// Measures the shared-memory connection between two processes: 8-byte
// ping-pong latency (spinning and blocking in poll) and one-way bandwidth for
// 1 MiB and 64 MiB messages, FIFO-copy path vs single-copy. Not a test.
// Usage: loom_shm_bench [seconds-per-case]
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>

#include "shm_test_util.h"

namespace loom::transport::shm {
namespace {

using testing::ChildProcess;
using Options = ShmConnection::Options;
using Work = std::function<Status(ShmConnection&)>;

// Waits like the engine does: spin, then yield, then block in poll (50 ms).
void engineWait(const ShmConnection& c, int* idle) {
  ++*idle;
  if (*idle < 64) return;
  if (*idle < 128) {
    sched_yield();
    return;
  }
  std::vector<pollfd> fds;
  c.pollFds(&fds);
  ::poll(fds.data(), fds.size(), 50);
}

// One direction of a stream: `count` messages, `window` in flight.
struct Flow {
  bool send;
  size_t bytes;
  int count;
  size_t window;
  std::vector<uint8_t> buf;
  std::deque<Transfer> q;
  int posted = 0, done = 0;

  Flow(bool isSend, size_t b, int n, size_t w)
      : send(isSend), bytes(b), count(n), window(w), buf(b * w, 1) {}
  Status post(ShmConnection& c) {
    while (posted < count && q.size() < window) {
      q.push_back(Transfer{buf.data() + bytes * size_t(posted % int(window)), bytes});
      q.back().singleCopy = send;  // as AllGather's plans hint it: single-copy where the options allow
      LOOM_TRY(send ? c.postSend(&q.back()) : c.postRecv(&q.back()));
      ++posted;
    }
    return Status::ok();
  }
  size_t mark() const { return q.empty() ? 0 : q.front().progressed; }
  // Retires finished transfers; true when anything moved since `before`.
  bool retire(size_t before) {
    bool moved = !q.empty() && q.front().progressed != before;
    while (!q.empty() && q.front().done) {
      q.pop_front();
      ++done;
      moved = true;
    }
    return moved;
  }
};

// Streams `count` messages of `bytes` with `window` in flight per direction:
// sends when `send`, receives when `recv` (both: a bidirectional stream).
Status stream(ShmConnection& c, bool send, bool recv, size_t bytes, int count, size_t window) {
  std::vector<Flow> flows;
  if (send) flows.emplace_back(true, bytes, count, window);
  if (recv) flows.emplace_back(false, bytes, count, window);
  Deadline d = Deadline::afterSeconds(300);
  int idle = 0;
  while (true) {
    bool finished = true, moved = false;
    std::vector<size_t> marks;
    for (Flow& f : flows) {
      LOOM_TRY(f.post(c));
      marks.push_back(f.mark());
    }
    LOOM_TRY(c.progress());
    for (size_t i = 0; i < flows.size(); ++i) {
      moved = flows[i].retire(marks[i]) || moved;
      finished = finished && flows[i].done == flows[i].count;
    }
    if (finished) return Status::ok();
    if (moved) idle = 0;
    else engineWait(c, &idle);
    if (d.expired()) return remoteError("bench: stream timed out");
  }
}

bool runCase(const Options& o, const Work& parent, const Work& child) {
  auto proc = ChildProcess::start([&](ChildProcess& self) {
    auto c = ShmConnection::create(0, o);
    if (!c.isOk() || !self.connect(**c, Deadline::afterSeconds(30)).isOk()) return 2;
    Status s = child(**c);
    if (!s.isOk()) std::fprintf(stderr, "child: %s\n", s.toString().c_str());
    return s.isOk() ? 0 : 1;
  });
  if (!proc.isOk()) return false;
  auto c = ShmConnection::create(1, o);
  if (!c.isOk() || !(*proc)->connect(**c, Deadline::afterSeconds(30)).isOk()) return false;
  Status s = parent(**c);
  if (!s.isOk()) std::fprintf(stderr, "parent: %s\n", s.toString().c_str());
  auto code = (*proc)->wait(Deadline::afterSeconds(300));
  return s.isOk() && code.isOk() && *code == 0;
}

void latency(const char* name, const Options& o, bool blocking, int rounds) {
  double secs = 0;
  runCase(
      o,
      [&](ShmConnection& c) {
        LOOM_TRY(testing::pingPong(c, true, 8, rounds / 10, blocking, Deadline::afterSeconds(60)));
        auto t0 = Clock::now();
        Status s = testing::pingPong(c, true, 8, rounds, blocking, Deadline::afterSeconds(300));
        secs = secondsSince(t0);
        return s;
      },
      [&](ShmConnection& c) {
        return testing::pingPong(c, false, 8, rounds + rounds / 10, blocking,
                                 Deadline::afterSeconds(300));
      });
  std::printf("%-34s 8 B ping-pong: %8.2f us one-way (%d round trips)\n", name,
              secs / rounds / 2 * 1e6, rounds);
}

// One-way (child sends, parent receives) or both ways at once; reports the
// bandwidth of one direction.
void bandwidth(const char* name, const Options& o, size_t bytes, int count, bool both) {
  double secs = 0;
  bool single = false;  // the receiver (here) reads the sender's memory
  runCase(
      o,
      [&](ShmConnection& c) {
        LOOM_TRY(stream(c, both, true, bytes, 2, 4));
        auto t0 = Clock::now();
        Status s = stream(c, both, true, bytes, count, 4);
        secs = secondsSince(t0);
        single = c.canPull() && o.singleCopyMin > 0 && bytes >= o.singleCopyMin;
        return s;
      },
      [&](ShmConnection& c) { return stream(c, true, both, bytes, count + 2, 4); });
  std::printf("%-32s %-7s %6zu KiB x %4d: %6.2f GB/s per direction%s\n", name,
              both ? "bidir" : "one-way", bytes >> 10, count, double(bytes) * count / secs / 1e9,
              single ? " (single-copy)" : "");
}

}  // namespace
}  // namespace loom::transport::shm

int main() {
  using namespace loom::transport::shm;
  Options copy;
  copy.singleCopyMin = 0;
  Options single;  // defaults: 2 MiB FIFO, single-copy from 64 KiB
  latency("spin", single, false, 200000);
  latency("blocking poll", single, true, 20000);
  for (bool both : {false, true}) {
    for (size_t mib : {size_t(1), size_t(64)}) {
      int count = mib == 1 ? 4000 : 80;
      bandwidth("FIFO copy (2 MiB FIFO)", copy, mib << 20, count, both);
      bandwidth("single-copy (process_vm_readv)", single, mib << 20, count, both);
    }
  }
  return 0;
}
