// The flight recorder: the last N operations of a communicator (kind,
// sequence number, count, type, op, root or peer, state, enqueue / start /
// end times) in a ring buffer, dumped as one JSON file per rank when the
// communicator fails (an error, the LOOM_TIMEOUT_S timeout) or, where
// LOOM_FLIGHT_RECORDER_SIGNAL names a signal, when the process gets it.
// `loom-info --flight DIR` merges the files of all ranks.
//
// File format (one object per line, so that the merge needs no JSON
// library): a header line, then one line per operation, oldest first:
//   {"loom_flight_recorder":1,"comm":"<hex>","rank":R,"nranks":N,"host":"h","pid":P,"reason":"..."}
//   {"seq":S,"coll":C,"kind":"AllReduce","count":C,"type":"float","op":"sum","root":-1,"state":"done",
//    "enqueue_us":T,"start_us":T,"end_us":T}
// Times are microseconds of the wall clock (comparable across hosts as far
// as their clocks agree) in steps of a few milliseconds: a thread of the
// process reads the clock every 4 ms and the recorders read its copy,
// which costs an operation less than any clock does. Enough to see when a
// stuck operation started and how long it has waited;
// LOOM_FLIGHT_RECORDER_PRECISE reads the precise clock instead, at every
// entry. 0 where a phase has not happened.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/spin_mutex.h"
#include "common/status.h"

namespace loom::core {

class FlightRecorder {
 public:
  // kSkipped: a queued operation that will not run (the ranks' collective
  // check refused its call); it keeps no collective number.
  enum class State : uint8_t { kQueued, kRunning, kDone, kFailed, kSkipped };
  struct Entry {
    uint64_t seq = 0;
    // Collectives only (every rank calls them, in the same order): their
    // own count, so that ranks line up although point-to-point calls
    // advance `seq` on some ranks only. 0 for point-to-point.
    uint64_t collSeq = 0;
    const char* kind = "";  // a static string
    uint64_t count = 0;
    const char* type = "";
    const char* op = "";  // "" for non-reducing operations
    int root = -1;        // root or peer, -1 for none
    State state = State::kQueued;
    int64_t enqueueUs = 0, startUs = 0, endUs = 0;
  };
  struct Identity {
    uint64_t commHash = 0;
    int rank = 0, nranks = 0;
    std::string host;
  };

  // capacity 0: records nothing.
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records an operation in state `state` (queued; running: one that starts
  // at once; done: one that already finished, all three times now, a
  // single look at the clock, or enqueued and started at `since` when
  // given); returns its id for the calls below.
  // record(), started(), finished() and skipped() are the writer's: one thread at a
  // time (a communicator calls them under its operation lock, or during
  // init before any operation may run: LOOM_CALIBRATE's shifts). The other
  // calls may come from any thread at any time.
  uint64_t record(const Entry& e, State state = State::kQueued, int64_t since = 0);
  void started(uint64_t id);
  void finished(uint64_t id, bool ok);
  void skipped(uint64_t id);

  void setIdentity(Identity id);
  // Whether setIdentity ran (a communicator that failed during init has
  // no table of ranks yet, and writes no file).
  bool identified() const;
  std::vector<Entry> snapshot() const;  // oldest first
  size_t capacity() const { return capacity_; }
  // The file's text, and writing it into `dir` (the file name is returned).
  std::string toJson(const std::string& reason) const;
  Result<std::string> dump(const std::string& dir, const std::string& reason) const;

 private:
  // An entry as the ring holds it: the writer takes no lock and makes no
  // atomic read-modify-write, either of which would wait until the
  // operation's stores (a tiny collective's data, the flags its peers
  // read) have reached their cache lines, on every call. Instead each
  // slot has a version, odd while the writer changes it: a reader copies
  // the slot and keeps the copy if the version was even and the same
  // before and after (a sequence lock per slot).
  struct Slot {
    std::atomic<uint64_t> version{0};
    std::atomic<uint64_t> id{0};  // 0: never written
    std::atomic<uint64_t> seq{0}, collSeq{0}, count{0};
    std::atomic<const char*> kind{""}, type{""}, op{""};
    std::atomic<int> root{-1};
    std::atomic<State> state{State::kQueued};
    std::atomic<int64_t> enqueueUs{0}, startUs{0}, endUs{0};
  };
  // The entries' clock (see the top of this file).
  int64_t now() const;
  // finished() and skipped(): the state and the end time.
  void end(uint64_t id, State state);
  // The writer's: the slot of `id`, or null once overwritten (or for 0).
  Slot* find(uint64_t id) const;
  // A consistent copy of `slot`, if it still holds entry `id`.
  static bool read(const Slot& slot, uint64_t id, Entry* out);

  const size_t capacity_;
  // Allocated by the first record() (most communicators of a large job
  // never fail, and a dump is their only reader) and kept till the end.
  std::unique_ptr<Slot[]> ring_;
  std::atomic<Slot*> published_{nullptr};  // ring_, for readers
  std::atomic<uint64_t> recorded_{0};      // ids are 1..recorded_
  size_t next_ = 0;  // the writer's: the ring index of the next entry (recorded_ % capacity_)
  // The fork generation in which this recorder took the clock thread (see
  // ~FlightRecorder for when it does).
  uint64_t tickerGeneration_ = 0;
  mutable SpinMutex idMutex_;
  Identity id_;
};

const char* flightStateName(FlightRecorder::State s);
// `s` as a JSON string literal (quotes, escapes), as the recorder's files
// write their text fields.
std::string jsonQuoted(const std::string& s);
// Unix microseconds, from the kernel's tick unless
// LOOM_FLIGHT_RECORDER_PRECISE (flightClockPrecise(), read once) asks for
// the precise clock: what the recorders' clock thread reads.
int64_t wallMicros();
bool flightClockPrecise();

// Where LOOM_FLIGHT_RECORDER_SIGNAL is set: dumps every live recorder into
// LOOM_FLIGHT_RECORDER_DIR when the signal arrives (from a thread of its
// own, not from the handler), then passes the signal on to the handler that
// was installed before. Recorders take part while registered.
void registerFlightRecorder(const std::shared_ptr<FlightRecorder>& r);
void unregisterFlightRecorder(const FlightRecorder* r);

}  // namespace loom::core
