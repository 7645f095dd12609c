// Communicator: one rank's membership in a group of ranks.
//
// Owns the bootstrap (listener, peer table, ring), the data connections
// (created on first use, one per peer), the staging memory, the user
// reduction ops, and the sticky error. Threading: operations on a
// communicator run one at a time (opMutex); abort() may be called from any
// thread and makes a running operation return within a bounded time.
//
// Lifetime: whoever uses a communicator holds it for as long as it does.
// The API's data calls hold it through their thread's call slot
// (api::CallScope), which a teardown waits for before closeAndWait(); other
// API calls, operations queued in a group or a device queue, and split and
// init jobs on their threads hold a pin (CommRef). closeAndWait() refuses
// new pins and waits for the held ones, so a communicator is deleted only
// when nobody uses it.
//
// fork(): a communicator belongs to the process that created it. In a child
// it is never touched (no shared-memory flag written, no fd signalled):
// calls on it fail with kInvalidUsage.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/biased_mutex.h"
#include "common/status.h"
#include "common/time.h"
#include "core/bootstrap.h"
#include "core/device_queue.h"
#include "core/executor.h"
#include "core/flight_recorder.h"
#include "core/latency.h"
#include "core/mode.h"
#include "core/op.h"
#include "core/peer_link.h"
#include "core/plan_cache.h"
#include "core/registration.h"
#include "core/root.h"
#include "core/tuning.h"
#include "topology/schedule.h"
#include "transport/transport.h"

namespace loom::core {

constexpr size_t kUniqueIdBytes = 128;

struct CommOptions {
  bool blocking = true;
  std::string name;
  LinkOptions link;  // its connectTimeoutS follows initTimeoutS
  size_t sliceBytes = 512 * 1024;
  // The slice when the communicator's links are network links (its ranks
  // span hosts, or shared memory is off): smaller, see fromSettings().
  size_t networkSliceBytes = 128 * 1024;
  int channels = 1;  // connections per peer pair (plans address (peer, channel))
  int maxChannels = 32;  // what a config's minCTAs may raise `channels` to
  double timeoutS = 1800;
  double stallWarnS = 60;  // 0: no stall warnings
  size_t flightEntries = 2000;  // the flight recorder's ring (0: none)
  double initTimeoutS = 300;
  // Buffer mode wanted: "auto", "host" or "cuda" (LOOM_DEVICE; core/mode.h).
  std::string device = "auto";
  // Cuda mode: the CUDA device to bind, chosen on the thread that called
  // the init (its current device; ncclCommInitAll: the device list); -1:
  // the init thread's current device.
  int cudaDevice = -1;
  // The algorithms collectives may use (NCCL_ALGO).
  AlgoFilter algorithms;
  // Small collectives of single-host communicators on a shared-memory
  // board (LOOM_LATENCY_PATH; core/latency.h).
  bool latencyPath = true;
  // Reductions fold in rank order whatever the algorithm (LOOM_DETERMINISTIC).
  bool deterministic = false;
  // Measure alpha and beta at init for the cost model (LOOM_CALIBRATE).
  bool calibrate = false;
  // Ranks compare their collective calls before running them
  // (LOOM_CHECK_COLLECTIVES; core/collective_check.h).
  bool checkCollectives = false;
  // Filled from the settings; the API layer then applies ncclConfig_t.
  static CommOptions fromSettings();
  // ncclConfig_t's fields that loom acts on (the API layer checks them);
  // the matching settings, where set, win as in NCCL.
  struct Config {
    int minChannels = 0;    // minCTAs (0: not given); NCCL_MIN_CTAS wins
    int maxChannels = 0;    // maxCTAs (0: not given); NCCL_MAX_CTAS wins
    std::string network{};  // netName ("": not given); NCCL_NET wins
    int trafficClass = -1;  // trafficClass (-1: not given); NCCL_IB_TC wins
  };
  void apply(const Config& config);
};

// Runs an init or split job on any thread: an exception becomes an error.
Status runInitJob(const std::function<Status()>& job);

// Reads a unique id made by getUniqueId (bytes from the user: checked).
Status decodeUniqueId(const uint8_t id[kUniqueIdBytes], net::SocketAddress* root, uint64_t secret[2]);

// Whether NCCL_COMM_ID is set: ranks then meet at that address, whatever
// the unique id says.
bool useCommIdEnv();

// Fills a new unique id and starts its rendezvous root (or, with
// NCCL_COMM_ID, describes that address; rank 0 starts the root at init).
Status getUniqueId(uint8_t id[kUniqueIdBytes]);

class CommRef;

// getpid() without a system call on every operation: cached, and refreshed
// in the child of every fork (pthread_atfork).
pid_t processId();

class Communicator {
 public:
  explicit Communicator(const CommOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Blocking init from a unique id. Called on the caller's thread, a group
  // thread or the non-blocking init thread; sets the state when done.
  Status initFromId(const uint8_t id[kUniqueIdBytes], int nranks, int rank);
  // Runs `job` (an init) on a thread of its own; asyncError() says
  // kInProgress until it finishes. Call at most once.
  void startAsync(std::function<Status()> job);
  // Waits for an asynchronous init to finish and returns its result. Any
  // number of threads may wait; only the destructor joins the thread.
  Status waitReady();

  // Splits are matched across ranks by call order (NCCL requires every rank
  // to split a communicator in the same order). reserveSplit() runs on the
  // caller's thread when ncclCommSplit is called and returns the split's
  // ticket; split() then waits for the splits before it, runs its exchange
  // over the parent, and lets the next one go. Collectives on the parent
  // wait for the splits reserved before them (waitSplits), so a split that
  // runs on its own thread never deadlocks against them.
  uint64_t reserveSplit();
  Status waitSplits();
  // Collective over the parent: ranks with the same color form a new
  // communicator ordered by (key, parent rank) and `child` (created by the
  // caller, null for NCCL_SPLIT_NOCOLOR = -1) becomes this rank's member.
  // The parent pin is released as soon as the exchange over it is done; an
  // abort of the parent aborts a child still being set up.
  static Status split(CommRef parent, uint64_t ticket, int color, int key, Communicator* child);

  // ncclCommShrink: every rank not in `excluded` (sorted, this rank not in
  // it) makes `child` its member of a communicator of the remaining ranks,
  // in their order. Unlike split it does not use the parent's ring, which
  // may run through dead ranks: each member sends its entry over the
  // parent's listener to the first remaining rank, which answers with the
  // table. `ticket` (reserveShrink) matches the shrinks of the ranks: the
  // number of earlier shrinks of this rank with the same excluded ranks
  // (ranks excluded earlier did not count those).
  uint64_t reserveShrink(const std::vector<int>& excluded);
  static Status shrink(CommRef parent, uint64_t ticket, std::vector<int> excluded, Communicator* child);
  // ncclCommGetUniqueId: a fresh unique id for a grow of this communicator
  // (its rendezvous runs in this process). Refused while an earlier one
  // has not been used by a grow.
  Status makeGrowId(uint8_t id[kUniqueIdBytes]);
  // ncclCommGrow on a rank of this communicator: in its place among the
  // splits (`ticket` from reserveSplit), the ranks agree over the ring on
  // the new size and the unique id (`given`: what this rank passed, empty
  // for none; at least one rank passes it); then `child` joins the grown
  // communicator of `nranks` through that id, keeping this rank's number.
  // New ranks call initFromId with the id and their rank.
  static Status grow(CommRef parent, uint64_t ticket, int nranks, std::vector<uint8_t> given, Communicator* child);
  // ncclCommRevoke: ends outstanding and future operations with an error
  // (the sticky error) and stops running ones as an abort does, but keeps
  // the communicator (its listener, its table) so it can be shrunk.
  void revoke();

  // Pins (see CommRef). tryPin fails once close has begun.
  bool tryPin();
  void addPin();  // another pin beside one already held
  void unpin();
  // Refuses new pins and waits up to `seconds` for the held ones to go.
  // False when some are still held then (the caller must not delete it).
  bool closeAndWait(double seconds);
  // True in a process forked from the one that created this communicator.
  bool forkedAway() const { return processId() != ownerPid_; }
  pid_t ownerPid() const { return ownerPid_; }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // The buffer mode, fixed at init (host until then), and in cuda mode the
  // device bound at init (the caller's current device), else -1.
  Mode mode() const { return mode_; }
  int cudaDevice() const { return cudaDevice_; }
  // Cuda mode: the queue its operations run through (core/device_queue.h).
  DeviceQueue* deviceQueue() { return deviceQueue_.get(); }
  const CommOptions& options() const { return options_; }
  // Seconds an operation may make no progress before it fails (LOOM_TIMEOUT_S
  // at init; loomCommSetTimeout changes it); 0: no limit.
  double timeoutS() const { return timeoutS_.load(std::memory_order_relaxed); }
  void setTimeoutS(double seconds) { timeoutS_.store(seconds, std::memory_order_relaxed); }
  Bootstrap& bootstrap() { return *bootstrap_; }
  const Bootstrap& bootstrap() const { return *bootstrap_; }
  std::string describe() const;     // "comm 0x.. rank 1/4"
  std::string describePeer(int r) const { return bootstrap_->describe(r); }

  // Sticky error: kInProgress during async init; the first failure after.
  Status asyncError() const;
  // The first failure only (ok while initializing).
  Status stickyError() const;
  bool ready() const { return state_.load() == State::kReady; }
  // Ready, not failed, and every split reserved so far done: what an
  // operation checks on every call, inline (asyncError, waitReady and
  // waitSplits take over when it is false).
  bool usableNow() const {
    return !failed_.load() && state_.load() == State::kReady && splitsDone_.load() >= splitsReserved_.load();
  }
  bool hasFailed() const { return failed_.load(); }
  // LOOM_FLIGHT_RECORDER_AT_DESTROY=1: writes the flight recorder into
  // LOOM_FLIGHT_RECORDER_DIR as `call` (ncclCommDestroy, ncclCommAbort)
  // ends the communicator, unless its failure wrote it already.
  void dumpFlightRecorderAtDestroy(const char* call);
  // Records a failure (first one wins) and, when `tellPeers`, sends an abort
  // notice to every other rank so non-neighbours learn about it too.
  void fail(const Status& status, bool tellPeers);
  // Non-blocking check of the listener for abort notices from peers.
  void pollNotices();
  // The same at most once per kNoticePollIntervalUs (ncclCommGetAsyncError,
  // which users and nccl-tests' loops call after every wait: a check is an
  // accept4 syscall, some 3 us on a VM). A notice is seen by the first call
  // after the interval; blocking waits poll the listener themselves.
  void pollNoticesThrottled();
  static constexpr int64_t kNoticePollIntervalUs = 1000;
  // A peer that failed first sends every rank a notice naming the cause
  // (typically the rank that died) and then closes its connections. The
  // closed connection can be seen here before the notice has been read,
  // which would blame the messenger; so on a remote error `seen`, give a
  // notice a short, bounded time to arrive and prefer it.
  Status preferPeerReport(const Status& seen);
  // The sticky error, after waiting up to `ms` for a peer's notice when
  // there is none yet (ok when none came).
  Status reportWithin(int ms);
  static constexpr int kPeerReportGraceMs = 250;
  // Bytes of buffers registered implicitly, for backends that cannot move
  // unregistered memory, before the least recently used ones are released.
  static constexpr size_t kImplicitRegistrationBytes = size_t(1) << 30;
  // The fds whose readiness means pollNotices() may find something.
  void pollFdsForNotices(std::vector<pollfd>* fds);

  // Any thread: stop what runs on this communicator, as soon as possible;
  // communicators being split from it are aborted too.
  void abort();
  // ncclCommDestroy: a communicator still being split from this one needs
  // it until it is set up, so destroying this one aborts that setup.
  void abortDependents();
  // ncclCommAbort of a communicator that has not failed: tells the other
  // ranks before its connections close, so they fail at once with the
  // reason (`why`: typically this process's last error) instead of seeing a
  // connection close with no explanation.
  void announceAbort(const std::string& why);
  // While `child` is being set up by a split of this communicator, an
  // abort of this one aborts it too.
  // (`abortIfAborted`: at once when this one is aborted already).
  void addDependent(Communicator* child, bool abortIfAborted = true);
  void removeDependent(Communicator* child);
  bool aborted() const { return abort_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }
  int wakeFd() const { return wakeFd_.get(); }

  // Data connections, one per peer and channel: the table's entry
  // linkIndex(peer, channel, nranks) (core/plan.h). One step of getting
  // `links` (such entries) connected without blocking; *ready when all
  // are. The rank's own entries connect it to itself.
  Status connectStep(const std::vector<int>& links, bool* ready);
  int nchannels() const { return options_.channels; }
  // The ring orders of the topology's schedule (channel c follows ring
  // c % size), set at init.
  std::span<const std::vector<int>> rings() const { return rings_; }
  const topology::Schedule& schedule() const { return schedule_; }
  // What the algorithm choice depends on (core/tuning.h), set at init.
  const TuningContext& tuning() const { return tuning_; }
  // Idle rounds an operation spins before it yields and then blocks: many
  // when this host's ranks of the communicator have a CPU each, few when
  // they share (a spinning rank then takes the CPU its peer needs). Set at
  // init.
  // Over network links a round is a system call per socket, so the budget
  // is the short one there too.
  int spinRounds() const { return spinRounds_; }
  // The pipeline slice of host collectives (CommOptions), set at init.
  size_t sliceBytes() const { return sliceBytes_; }
  // The host of each rank (0..hosts-1, in the order ranks name them), set at init.
  std::span<const int> hostOf() const { return hostOf_; }
  // The topology's two trees as each rank's parent, when the ranks span
  // hosts (empty on one host: PlanParams::trees), set at init.
  std::span<const std::vector<int>> trees() const { return trees_; }
  // True when this rank's CPUs also run other ranks of its host
  // (topology::cpusShared over the local ranks' CPU masks).
  bool cpusShared() const { return cpusShared_; }
  // The shared-memory board for small collectives, or null (use under opMutex).
  LatencyPath* latencyPath() { return latency_.get(); }
  // Plans of earlier collectives (use under opMutex).
  PlanCache& planCache() { return planCache_; }
  // What wakes a wait for connectStep(): the sockets of links being set up
  // (the listener is in pollFdsForNotices()).
  void pollFdsForLinks(std::vector<pollfd>* fds) const;
  // Blocking version (init, tests).
  Status connectAll(const std::vector<int>& links, Deadline deadline);
  std::span<transport::Connection* const> connections() const { return connPtrs_; }
  // Cuda mode, the caller's thread at a call (before its gates): lets the
  // connections to this host's ranks do what they put off while operations
  // ran (Connection::prepare). They are all made at init and never replaced,
  // so this may run beside the progress thread.
  Status prepareHostConnections();

  BiasedMutex& opMutex() { return opMutex_; }
  Scratch& scratch() { return scratch_; }
  // ncclCommRegister's buffers, and every region handed to a transfer.
  RegistrationCache& registrations() { return registrations_; }
  // LOOM_CHECK_COLLECTIVES: some rank asked and there is more than one
  // (set at init). The ring below is the bootstrap's: after init, split
  // exchanges and collective checks take turns on it; the count is of the
  // collectives checked so far (under ringMutex).
  bool checksCollectives() const { return checksCollectives_; }
  std::mutex& ringMutex() { return ringMutex_; }
  uint64_t& checkedCollectives() { return checkedCollectives_; }
  uint64_t nextSeq() { return ++seq_; }
  uint64_t nextCollSeq() { return ++collSeq_; }
  // Collectives first..last, the latest numbered, will not run (skipped
  // after a collective mismatch): the next one is numbered `first` again.
  void returnCollSeqs(uint64_t first, uint64_t last) {
    if (collSeq_ == last) collSeq_ = first - 1;
  }
  FlightRecorder& flight() { return *flight_; }

  // User reduction ops (ncclRedOpCreatePreMulSum).
  Result<int> createPreMulSum(kernels::DataType type, const void* scalar, bool deviceResident);
  Status destroyOp(int op);
  // Maps an ncclRedOp_t value to a Reduction (and the scalar pointer to read
  // at run time for device-resident scalars).
  Status resolveOp(int op, kernels::DataType type, kernels::Reduction* out, const void** scalarPtr) const;

 private:
  enum class State { kInitializing, kReady, kFailed };
  Status finishInit();
  // The parts of this rank's info that come from its own options (the
  // transports its selection allows, flags, channels), for init and split.
  void describeOwnAsks(wire::RankInfo* self) const;
  Status connectPeersAtInit();
  // LOOM_CALIBRATE, when every rank asks: alpha and beta of the ranks' link
  // class from timed ring shifts, the slowest rank's, into tuning_. Runs at
  // the end of the init, before the communicator is ready.
  Status calibrate();
  // Rings and trees from every rank's place (the init table), logged in
  // NCCL's GRAPH style; NCCL_TOPO_DUMP_FILE written by each host's first rank.
  void scheduleFromTable();
  // Into LOOM_FLIGHT_RECORDER_DIR, when it is set; logged as a warning
  // when `failing`, else at INFO.
  void dumpFlightRecorder(const std::string& reason, bool failing = true);
  void setState(State s);
  // grow()'s exchange over this communicator's ring: the id to join with.
  Status agreeOnGrow(uint64_t ticket, int nranks, const std::vector<uint8_t>& given, const std::atomic<bool>* abort,
                     uint8_t id[kUniqueIdBytes]);
  // A split's or a grow's exchange over this communicator's ring, in the
  // turn of `ticket` (ranks split and grow a communicator in one order):
  // every rank's payload (at most kTurnPayloadBytes), this rank's included.
  // Ranks that make the other call there, or match it with another ticket,
  // are refused alike on every rank (ncclInvalidUsage) and the
  // communicator stays usable; a broken exchange fails it.
  enum class TurnCall : uint32_t { kSplit = 0x74696c70, kGrow = 0x776f7267 };
  static constexpr size_t kTurnPayloadBytes = 8 + wire::kMaxRankInfoBytes;
  Result<std::vector<std::vector<uint8_t>>> exchangeInTurn(TurnCall call, uint64_t ticket,
                                                           std::span<const uint8_t> payload, Deadline deadline,
                                                           const std::atomic<bool>* abort, const std::string& what);
  // An entry of that exchange that this version cannot read: a peer that
  // speaks another protocol. Fails the communicator (unless `abort` or an
  // abort is under way) and returns s.
  Status failMalformed(Status s, const std::atomic<bool>* abort);
  // Splits and grows: waits until `ticket` is the next one to run.
  Status waitSplitTurn(uint64_t ticket, const std::atomic<bool>* abort);
  void finishSplitTurn();

  struct UserOp {
    bool live = false;
    kernels::DataType type{};
    bool deviceResident = false;
    uint64_t scalarBits = 0;
    const void* scalarPtr = nullptr;
  };

  // Split and shrink: `child` takes its place in a communicator of
  // `ident`'s size and rank with the peers in `table`, on the parent's
  // device in cuda mode.
  // Shrink's leader: the entry `from` sent over this one's listener.
  Result<net::UniqueFd> awaitShrinkEntry(int from, Deadline deadline, const std::atomic<bool>* abort);
  static Status joinAsChild(Communicator& parent, Communicator* child, const Bootstrap::Identity& ident,
                            std::vector<wire::RankInfo> table, Deadline deadline);
  // Cuda mode: picks the table and binds the device (init and split).
  Status startDeviceMode(int device);

  CommOptions options_;
  // Where the init's (or split's, shrink's) time went, phase by phase, for
  // the INFO line that follows "ready".
  class InitTimes {
   public:
    void start();
    void mark(const char* phase);  // the time since the previous mark is `phase`'s
    std::string describe() const;  // "412.3 ms: rendezvous 380.2, topology 20.1, ..."
   private:
    Clock::time_point start_{}, last_{};
    std::vector<std::pair<const char*, double>> phases_;
  };
  InitTimes initTimes_;
  std::atomic<double> timeoutS_;
  Mode mode_ = Mode::kHost;
  int cudaDevice_ = -1;
  topology::Schedule schedule_;
  std::vector<std::vector<int>> rings_;
  TuningContext tuning_;
  int spinRounds_ = 64;
  size_t sliceBytes_ = 512 * 1024;
  std::vector<int> hostOf_;
  std::vector<transport::Connection*> hostConns_;  // cuda mode: to this host's ranks, made at init
  std::vector<std::vector<int>> trees_;
  bool cpusShared_ = false;
  bool singleHost_ = false;  // every rank on this host (from the shared table)
  PlanCache planCache_;
  std::unique_ptr<LatencyPath> latency_;
  int rank_ = 0;
  int nranks_ = 1;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<std::unique_ptr<transport::Connection>> conns_;
  std::vector<transport::Connection*> connPtrs_;
  // After the connections: its regions are released before them.
  RegistrationCache registrations_{kImplicitRegistrationBytes};
  const pid_t ownerPid_;
  std::atomic<State> state_{State::kInitializing};
  std::mutex stateMutex_;  // with stateCv_: waiting for an async init
  std::condition_variable stateCv_;
  mutable std::mutex errorMutex_;
  Status error_;
  std::atomic<bool> failed_{false};  // error_ is set (read without the lock on every call)
  std::atomic<bool> abort_{false};
  net::UniqueFd wakeFd_;
  std::thread initThread_;  // joined by the destructor only
  std::unique_ptr<RootServer> root_;  // NCCL_COMM_ID rank 0's rendezvous
  // Pins held, plus kClosing once close has begun: taking and dropping a
  // pin is an atomic each (data calls take none: api::CallScope). pinMutex_
  // and pinCv_ only wake closeAndWait() when the last pin goes.
  static constexpr int64_t kClosing = int64_t(1) << 40;
  std::atomic<int64_t> pins_{0};
  std::mutex pinMutex_;
  std::condition_variable pinCv_;
  std::mutex dependentsMutex_;
  std::vector<Communicator*> dependents_;
  std::mutex splitMutex_;
  std::condition_variable splitCv_;
  // Under splitMutex_; atomic so that waitSplits() sees "none pending"
  // without the lock.
  std::atomic<uint64_t> splitsReserved_{0};  // tickets handed out
  std::atomic<uint64_t> splitsDone_{0};      // splits whose exchange over this one ended
  std::map<std::vector<int>, uint64_t> shrinksReserved_;  // under splitMutex_
  std::set<uint64_t> abandonedSplits_;  // gave up waiting for their turn
  bool growIdPending_ = false;  // under splitMutex_: makeGrowId's id not used by a grow yet
  std::mutex listenMutex_;  // guards the bootstrap listener state
  std::atomic<int64_t> lastNoticePollUs_{-kNoticePollIntervalUs};  // pollNoticesThrottled()
  std::map<int, std::unique_ptr<PeerLink>> links_;  // connections being set up
  BiasedMutex opMutex_;
  Scratch scratch_;
  uint64_t seq_ = 0;
  uint64_t collSeq_ = 0;  // collectives only (the flight recorder lines ranks up by it)
  bool checksCollectives_ = false;
  std::mutex ringMutex_;
  uint64_t checkedCollectives_ = 0;  // under ringMutex_
  std::shared_ptr<FlightRecorder> flight_;
  // Last: its thread runs operations on everything above, so it goes first.
  // Set once by init (under the mutex, which abort() takes too).
  std::mutex deviceQueueMutex_;
  std::unique_ptr<DeviceQueue> deviceQueue_;
  mutable std::mutex opsMutex_;
  std::vector<UserOp> userOps_;
};

// A pinned reference to a communicator: while one exists the communicator
// is not deleted. Copies pin again; moves transfer the pin.
class CommRef {
 public:
  CommRef() = default;
  // Takes over a pin the caller already holds (tryPin succeeded).
  static CommRef adopt(Communicator* c) {
    CommRef r;
    r.c_ = c;
    return r;
  }
  CommRef(const CommRef& o) : c_(o.c_) {
    if (c_) c_->addPin();
  }
  CommRef(CommRef&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  CommRef& operator=(CommRef o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~CommRef() { reset(); }
  void reset() {
    if (c_) c_->unpin();
    c_ = nullptr;
  }
  Communicator* get() const { return c_; }
  Communicator* operator->() const { return c_; }
  Communicator& operator*() const { return *c_; }
  explicit operator bool() const { return c_ != nullptr; }

 private:
  Communicator* c_ = nullptr;
};

}  // namespace loom::core
