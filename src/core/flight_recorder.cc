#include "core/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <new>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "common/log.h"
#include "common/settings.h"

namespace loom::core {

bool flightClockPrecise() {
  static const bool precise = settings::current()->getBool("LOOM_FLIGHT_RECORDER_PRECISE");
  return precise;
}

int64_t wallMicros() {
  timespec ts{};
  clock_gettime(flightClockPrecise() ? CLOCK_REALTIME : CLOCK_REALTIME_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

namespace {

// The recorders' clock, unless LOOM_FLIGHT_RECORDER_PRECISE: a thread that
// reads the wall clock every kTickMs and leaves it in `now_`, where a
// recorder finds it with one load. Even the kernel's tick clock costs an
// operation on the board a few ns (2 ranks, Broadcast of 8 B: 75 -> 72 ns
// without it, alternating A/B), against 250 wake-ups a second here. It runs while some
// recorder of the process has recorded, and falls back to reading the
// clock (now_ 0) while it is not running, after a fork (the child has no
// thread) and where it could not be started.
class Ticker {
 public:
  static constexpr int kTickMs = 4;  // the kernel's tick here; the clock it replaces had no finer steps

  // Leaked: recorders of communicators destroyed by static destructors
  // still find it.
  static Ticker& instance() {
    static Ticker* t = new Ticker;
    return *t;
  }

  int64_t now() const {
    const int64_t t = now_.load(std::memory_order_relaxed);
    return t ? t : wallMicros();
  }

  // A recorder starts using the clock, or stops; returns the fork
  // generation that its release() passes back (a recorder from before a
  // fork releases nothing in the child).
  uint64_t acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (users_++ == 0 && !running_) start();  // while it stops, its stopper starts it again
    return generation_;
  }
  void release(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (generation != generation_ || users_ == 0 || --users_ > 0 || !running_ || stop_) return;
    stop_ = true;
    wake_.notify_all();
    const pthread_t thread = thread_;
    lock.unlock();
    pthread_join(thread, nullptr);
    lock.lock();
    running_ = false;
    stop_ = false;
    if (users_ > 0) start();  // acquired again while it stopped
  }

 private:
  Ticker() {
    // The child of a fork has no ticker thread, and its mutex may have been
    // held by it: both start afresh, and the parent's recorders in the
    // child read the clock themselves.
    pthread_atfork(nullptr, nullptr, [] {
      Ticker& t = instance();
      new (&t.mutex_) std::mutex;
      new (&t.wake_) std::condition_variable;
      t.now_.store(0, std::memory_order_relaxed);
      t.users_ = 0;
      t.running_ = false;
      t.stop_ = false;
      ++t.generation_;
    });
  }

  // mutex_ held.
  void start() {
    now_.store(wallMicros(), std::memory_order_relaxed);
    // Started with every signal blocked: the process's signals go to its
    // own threads, not to this one.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int e = pthread_create(&thread_, nullptr, &Ticker::loopEntry, this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (e != 0) {
      now_.store(0, std::memory_order_relaxed);
      LOOM_WARN("flight recorder: cannot start its clock thread (%s); it reads the clock on every entry",
                std::strerror(e));
      return;
    }
    pthread_setname_np(thread_, "loom-clock");  // named at once, not once it first runs
    running_ = true;
  }

  static void* loopEntry(void* self) {
    static_cast<Ticker*>(self)->loop();
    return nullptr;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      now_.store(wallMicros(), std::memory_order_relaxed);
      wake_.wait_for(lock, std::chrono::milliseconds(kTickMs));
    }
    now_.store(0, std::memory_order_relaxed);
  }

  std::atomic<int64_t> now_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  int users_ = 0;        // recorders that use it
  bool running_ = false;  // a thread was started and is not joined yet
  bool stop_ = false;     // it is being stopped (by the release that joins it)
  uint64_t generation_ = 0;
  pthread_t thread_{};
};

}  // namespace

FlightRecorder::~FlightRecorder() {
  // A recorder uses the clock thread from its first entry on (ring_),
  // unless the clock is the precise one.
  if (ring_ && !flightClockPrecise()) Ticker::instance().release(tickerGeneration_);
}

int64_t FlightRecorder::now() const {
  return flightClockPrecise() ? wallMicros() : Ticker::instance().now();
}

const char* flightStateName(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kQueued: return "queued";
    case FlightRecorder::State::kRunning: return "running";
    case FlightRecorder::State::kDone: return "done";
    case FlightRecorder::State::kFailed: return "failed";
    case FlightRecorder::State::kSkipped: return "skipped";
  }
  return "?";
}

namespace {

// The writer's side of a slot's sequence lock: `change` runs between the
// two version bumps (plain stores: there is one writer at a time).
template <typename Slot, typename F>
void rewrite(Slot& slot, F change) {
  const uint64_t v = slot.version.load(std::memory_order_relaxed);
  slot.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // the odd version before the fields
  change();
  slot.version.store(v + 2, std::memory_order_release);
}

}  // namespace

uint64_t FlightRecorder::record(const Entry& e, State state, int64_t since) {
  if (capacity_ == 0) return 0;
  if (!ring_) {
    ring_ = std::make_unique<Slot[]>(capacity_);
    published_.store(ring_.get(), std::memory_order_release);
    if (!flightClockPrecise()) tickerGeneration_ = Ticker::instance().acquire();
  }
  const int64_t now = this->now();
  const int64_t began = since ? since : now;
  const uint64_t id = recorded_.load(std::memory_order_relaxed) + 1;
  Slot& slot = ring_[next_];  // (id - 1) % capacity_, without a division on every call
  if (++next_ == capacity_) next_ = 0;
  rewrite(slot, [&] {
    constexpr auto r = std::memory_order_relaxed;
    slot.id.store(id, r);
    slot.seq.store(e.seq, r);
    slot.collSeq.store(e.collSeq, r);
    slot.kind.store(e.kind, r);
    slot.count.store(e.count, r);
    slot.type.store(e.type, r);
    slot.op.store(e.op, r);
    slot.root.store(e.root, r);
    slot.state.store(state, r);
    slot.enqueueUs.store(began, r);
    slot.startUs.store(state == State::kQueued ? 0 : began, r);
    slot.endUs.store(state == State::kDone || state == State::kFailed ? now : 0, r);
  });
  recorded_.store(id, std::memory_order_release);
  return id;
}

FlightRecorder::Slot* FlightRecorder::find(uint64_t id) const {
  const uint64_t recorded = recorded_.load(std::memory_order_relaxed);
  if (id == 0 || id > recorded || recorded - id >= capacity_) return nullptr;
  return &ring_[(id - 1) % capacity_];
}

void FlightRecorder::started(uint64_t id) {
  if (id == 0) return;  // not recorded (capacity 0)
  const int64_t now = this->now();
  if (Slot* slot = find(id)) {
    rewrite(*slot, [&] {
      slot->state.store(State::kRunning, std::memory_order_relaxed);
      slot->startUs.store(now, std::memory_order_relaxed);
    });
  }
}

void FlightRecorder::finished(uint64_t id, bool ok) { end(id, ok ? State::kDone : State::kFailed); }

void FlightRecorder::skipped(uint64_t id) { end(id, State::kSkipped); }

void FlightRecorder::end(uint64_t id, State state) {
  if (id == 0) return;
  const int64_t now = this->now();
  if (Slot* slot = find(id)) {
    rewrite(*slot, [&] {
      slot->state.store(state, std::memory_order_relaxed);
      if (state == State::kSkipped) slot->collSeq.store(0, std::memory_order_relaxed);
      slot->endUs.store(now, std::memory_order_relaxed);
    });
  }
}

bool FlightRecorder::read(const Slot& slot, uint64_t id, Entry* out) {
  constexpr auto r = std::memory_order_relaxed;
  for (int tries = 0;; tries = std::min(tries + 1, 64)) {
    const uint64_t before = slot.version.load(std::memory_order_acquire);
    if (before & 1) {  // being written: a few stores, unless its thread was preempted
      if (tries == 64) sched_yield();
      continue;
    }
    const uint64_t held = slot.id.load(r);
    Entry e;
    e.seq = slot.seq.load(r);
    e.collSeq = slot.collSeq.load(r);
    e.kind = slot.kind.load(r);
    e.count = slot.count.load(r);
    e.type = slot.type.load(r);
    e.op = slot.op.load(r);
    e.root = slot.root.load(r);
    e.state = slot.state.load(r);
    e.enqueueUs = slot.enqueueUs.load(r);
    e.startUs = slot.startUs.load(r);
    e.endUs = slot.endUs.load(r);
    std::atomic_thread_fence(std::memory_order_acquire);  // the fields before the second look
    if (slot.version.load(r) != before) continue;
    if (held != id) return false;  // overwritten by a newer entry since
    *out = e;
    return true;
  }
}

void FlightRecorder::setIdentity(Identity id) {
  std::lock_guard<SpinMutex> lock(idMutex_);
  id_ = std::move(id);
}

bool FlightRecorder::identified() const {
  std::lock_guard<SpinMutex> lock(idMutex_);
  return id_.nranks > 0;
}

std::vector<FlightRecorder::Entry> FlightRecorder::snapshot() const {
  std::vector<Entry> out;
  const Slot* ring = published_.load(std::memory_order_acquire);
  if (!ring) return out;
  const uint64_t recorded = recorded_.load(std::memory_order_acquire);
  const uint64_t first = recorded > capacity_ ? recorded - capacity_ + 1 : 1;
  out.reserve(size_t(recorded - first + 1));
  for (uint64_t id = first; id <= recorded; ++id) {
    Entry e;
    if (read(ring[(id - 1) % capacity_], id, &e)) out.push_back(e);
  }
  return out;
}

std::string jsonQuoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string FlightRecorder::toJson(const std::string& reason) const {
  Identity id;
  {
    std::lock_guard<SpinMutex> lock(idMutex_);
    id = id_;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "{\"loom_flight_recorder\":1,\"comm\":\"%016llx\",\"rank\":%d,\"nranks\":%d,\"host\":",
                static_cast<unsigned long long>(id.commHash), id.rank, id.nranks);
  std::string out = buf + jsonQuoted(id.host) + ",\"pid\":" + std::to_string(getpid()) + ",\"reason\":" + jsonQuoted(reason) + "}\n";
  for (const Entry& e : snapshot()) {
    std::snprintf(buf, sizeof buf,
                  "{\"seq\":%llu,\"coll\":%llu,\"kind\":\"%s\",\"count\":%llu,\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"state\":\"%s\","
                  "\"enqueue_us\":%lld,\"start_us\":%lld,\"end_us\":%lld}\n",
                  static_cast<unsigned long long>(e.seq), static_cast<unsigned long long>(e.collSeq), e.kind, static_cast<unsigned long long>(e.count), e.type, e.op,
                  e.root, flightStateName(e.state), static_cast<long long>(e.enqueueUs),
                  static_cast<long long>(e.startUs), static_cast<long long>(e.endUs));
    out += buf;
  }
  return out;
}

Result<std::string> FlightRecorder::dump(const std::string& dir, const std::string& reason) const {
  int rank = 0;
  uint64_t comm = 0;
  {
    std::lock_guard<SpinMutex> lock(idMutex_);
    rank = id_.rank;
    comm = id_.commHash;
  }
  char name[96];
  std::snprintf(name, sizeof name, "/loom-flight-%016llx-rank%d.json", static_cast<unsigned long long>(comm), rank);
  const std::string path = dir + name;
  const std::string text = toJson(reason);
  // Written beside, then renamed: a reader never sees half a file.
  static std::atomic<uint64_t> dumps{0};
  const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "-" + std::to_string(++dumps);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return systemErrno("cannot create the flight recorder file " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return systemErrno("cannot write " + tmp, err);
    }
    done += size_t(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return systemErrno("cannot rename " + tmp, err);
  }
  return path;
}

// ---- the signal: a handler that only writes a byte into a pipe, and a
// thread that dumps ------------------------------------------------------
namespace {

int parseSignal(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (end && *end == '\0') return n > 0 && n < NSIG ? int(n) : -1;
  std::string name = text.rfind("SIG", 0) == 0 ? text.substr(3) : text;
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = sigabbrev_np(s);
    if (abbrev && name == abbrev) return s;
  }
  return -1;
}

// Cleared once the dumper is destroyed (at exit): communicators destroyed
// later by other static destructors skip it. Constant-initialized, so it
// outlives every destructor.
std::atomic<bool> gDumperAlive{false};

class SignalDumper {
 public:
  static SignalDumper& instance() {
    static SignalDumper d;
    return d;
  }

  void add(const std::shared_ptr<FlightRecorder>& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.push_back(r);
    if (!installed_) install();
  }
  void remove(const FlightRecorder* r) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(live_, [&](const std::weak_ptr<FlightRecorder>& w) {
      auto p = w.lock();
      return !p || p.get() == r;
    });
  }

  ~SignalDumper() {
    gDumperAlive = false;
    writeFd_ = -1;  // a handler running from now on writes nothing
    if (signo_ > 0) {
      // Put the old handler back only where nobody replaced loom's since.
      struct sigaction now {};
      if (sigaction(signo_, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == &handler) {
        sigaction(signo_, &previous_, nullptr);
      }
    }
    if (pipe_[1] >= 0) ::close(pipe_[1]);
    // The thread exists only in the process that started it (not in a
    // forked child); there the closed pipe ends it.
    if (threadStarted_ && ::getpid() == creator_) pthread_join(thread_, nullptr);
    if (pipe_[0] >= 0) ::close(pipe_[0]);
  }

 private:
  SignalDumper() { gDumperAlive = true; }

  // mutex_ held.
  void install() {
    installed_ = true;
    const std::string name = settings::current()->getString("LOOM_FLIGHT_RECORDER_SIGNAL");
    const int s = parseSignal(name);
    if (s == 0) return;
    if (s < 0 || s == SIGKILL || s == SIGSTOP) {
      LOOM_WARN("LOOM_FLIGHT_RECORDER_SIGNAL=%s is not a signal loom can catch; the flight recorder dumps on "
                "errors only", name.c_str());
      return;
    }
    if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
      LOOM_WARN("flight recorder: cannot create its pipe: %s", std::strerror(errno));
      return;
    }
    creator_ = ::getpid();
    if (int e = pthread_create(&thread_, nullptr, &SignalDumper::loopEntry, this); e != 0) {
      LOOM_WARN("flight recorder: cannot start its thread: %s", std::strerror(e));
      return;
    }
    threadStarted_ = true;
    // A forked child must not wake the parent's thread (its pipe is shared).
    pthread_atfork(nullptr, nullptr, [] { instance().writeFd_ = -1; });
    // The old action is read before loom's is installed, so a signal that
    // arrives meanwhile finds it complete.
    if (sigaction(s, nullptr, &previous_) != 0) {
      LOOM_WARN("flight recorder: cannot read the handler of signal %d: %s", s, std::strerror(errno));
      return;
    }
    writeFd_ = pipe_[1];
    struct sigaction sa {};
    sa.sa_sigaction = &SignalDumper::handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(s, &sa, nullptr) != 0) {
      LOOM_WARN("flight recorder: cannot install a handler for signal %d: %s", s, std::strerror(errno));
      return;
    }
    signo_ = s;
    LOOM_INFO(log::kInit, "flight recorder: signal %d (%s) dumps every communicator's recorder", s, name.c_str());
  }

  static void handler(int sig, siginfo_t* info, void* context) {
    const int saved = errno;
    SignalDumper& d = instance();
    const char byte = 1;
    const int fd = d.writeFd_.load(std::memory_order_relaxed);
    if (fd >= 0) (void)!::write(fd, &byte, 1);
    // Chain to whoever handled the signal before loom.
    if (d.previous_.sa_flags & SA_SIGINFO) {
      if (d.previous_.sa_sigaction) d.previous_.sa_sigaction(sig, info, context);
    } else if (d.previous_.sa_handler != SIG_DFL && d.previous_.sa_handler != SIG_IGN) {
      d.previous_.sa_handler(sig);
    }
    errno = saved;
  }

  static void* loopEntry(void* self) {
    static_cast<SignalDumper*>(self)->loop();
    return nullptr;
  }

  void loop() {
    pthread_setname_np(pthread_self(), "loom-flight");
    for (;;) {
      char buf[64];
      pollfd p{pipe_[0], POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return;
      const ssize_t n = ::read(pipe_[0], buf, sizeof buf);
      if (n == 0) return;  // the write end closed: the process is ending
      if (n < 0) continue;
      std::vector<std::shared_ptr<FlightRecorder>> now;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& w : live_)
          if (auto p = w.lock()) now.push_back(p);
      }
      const std::string dir = settings::current()->getString("LOOM_FLIGHT_RECORDER_DIR");
      if (dir.empty()) {
        LOOM_WARN("flight recorder: signal %d arrived but LOOM_FLIGHT_RECORDER_DIR is not set", signo_);
        continue;
      }
      for (const auto& r : now) {
        if (r->identified() == false) continue;
        auto written = r->dump(dir, "signal " + std::to_string(signo_));
        if (written.isOk()) LOOM_WARN("flight recorder written to %s (signal %d)", written->c_str(), signo_);
        else LOOM_WARN("flight recorder: %s", written.status().message().c_str());
      }
    }
  }

  std::mutex mutex_;
  std::vector<std::weak_ptr<FlightRecorder>> live_;
  bool installed_ = false;
  int pipe_[2] = {-1, -1};
  std::atomic<int> writeFd_{-1};
  int signo_ = 0;
  struct sigaction previous_ {};
  pthread_t thread_{};
  bool threadStarted_ = false;
  pid_t creator_ = 0;
};

}  // namespace

void registerFlightRecorder(const std::shared_ptr<FlightRecorder>& r) { SignalDumper::instance().add(r); }
void unregisterFlightRecorder(const FlightRecorder* r) {
  if (gDumperAlive) SignalDumper::instance().remove(r);
}

}  // namespace loom::core
