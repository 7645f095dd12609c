#include "core/group.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "core/collective_check.h"
#include "core/device_queue.h"
#include "core/flight_recorder.h"
#include "core/planner.h"

namespace loom::core {
namespace {

struct GroupState {
  std::vector<PendingOp> ops;
  std::vector<std::pair<Communicator*, std::function<Status()>>> inits;
};
thread_local GroupState tGroup;
// The group depth apart: every call reads it, and a plain int needs no
// constructor check on each access, which tGroup's does. (Not in the static
// TLS block: the library and the torch module are loaded with dlopen, where
// that block may have no room left.)
thread_local int tGroupDepth = 0;

// Waiting: spin the communicators' idle rounds (Communicator::spinRounds:
// long when every rank of the host has a core, short when they share),
// then yield this many, then block in poll (sockets and shared memory's
// wake pipes wake us when data arrives).
constexpr int kYieldRounds = 32;
constexpr int kBlockMs = 50;
// While spinning, a yield every this many idle rounds (some 25 us): next to
// free for a rank alone on its CPU (the call returns at once). When another
// thread ran meanwhile (yieldSawOthers), the kernel has put this rank on a
// CPU it shares, typically with the peer it waits for, just after launch:
// it blocks at once, and the wake-up moves it to an idle CPU. (2 ranks
// started unbound, AllReduce of 1 MiB: 5 launches in 16 took 180-390 us
// instead of 70-83, spinning through their peer's time slices.)
constexpr int kSpinYieldEvery = 256;
constexpr const char* kAbortHint = "The other ranks are told to abort";

struct Task {
  std::vector<OpDesc> ops;  // one collective, or the group's point-to-point calls
  std::shared_ptr<const CachedPlan> planned;  // the plan and the connections it uses
  bool board = false;  // runs on the communicator's latency path instead (no plan)
  std::vector<std::byte*> buffers;
  kernels::Reduction reduction{};
  const void* scalarPtr = nullptr;
  bool reducing = false;
  uint64_t seq = 0;  // the communicator's operation number
  uint64_t collSeq = 0;    // its number among the communicator's collectives (0: point-to-point)
  uint64_t flightId = 0;   // its entry in the communicator's flight recorder
  // LOOM_CHECK_COLLECTIVES: how many of the call's collectives on this
  // communicator its ranks must have agreed on before this task starts.
  size_t checksNeeded = 0;
  // "AllReduce #17 (1024 x float)": built when a message needs it, not for
  // every operation (formatting costs a noticeable share of a tiny one).
  std::string name() const;
};

struct CommRun {
  Communicator* comm;
  std::vector<Task> tasks;
  size_t current = 0;
  std::unique_ptr<PlanRunner> runner;
  bool boardStarted = false;  // the current task is a board task that started
  int stallWarnings = 0;  // stall warnings logged since the group last progressed
  CollectiveChecker* checker = nullptr;  // LOOM_CHECK_COLLECTIVES, for a group's call
  bool done() const { return current >= tasks.size(); }
  // The current task waits for its ranks to agree on its collectives.
  bool waitsForCheck() const {
    return checker && !done() && !runner && !boardStarted && tasks[current].checksNeeded > checker->passed();
  }
};

std::vector<int> linksOf(const Plan& plan) {
  std::vector<int> links;
  for (const Stream& s : plan.streams)
    for (const Step& st : s.steps)
      st.forEachPeer([&](int peer) { links.push_back(int(linkIndex(peer, s.channel, plan.nranks))); });
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  return links;
}

std::string opLabel(const OpDesc& op, uint64_t seq) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s #%llu (%zu x %s)", opKindName(op.kind),
                static_cast<unsigned long long>(seq), op.count, kernels::dataTypeName(op.type));
  return buf;
}

std::string Task::name() const {
  if (ops.size() == 1) return opLabel(ops[0], seq);
  return "group of " + std::to_string(ops.size()) + " point-to-point calls #" + std::to_string(seq);
}

// A collective's entry in the communicator's flight recorder.
uint64_t recordCollective(Communicator* comm, const OpDesc& op, uint64_t seq, uint64_t collSeq,
                          FlightRecorder::State state = FlightRecorder::State::kQueued, int64_t since = 0) {
  return comm->flight().record(FlightRecorder::Entry{
      .seq = seq, .collSeq = collSeq, .kind = opKindName(op.kind), .count = op.count,
      .type = kernels::dataTypeName(op.type), .op = isReducing(op.kind) ? kernels::redOpName(op.reduction.op) : "",
      .root = isRooted(op.kind) ? op.root : -1}, state, since);
}

// A new plan of a collective, from the algorithm the cost model (and
// NCCL_ALGO) picks. Reads only what the communicator fixed at init.
Result<std::shared_ptr<CachedPlan>> makePlan(Communicator* comm, const OpDesc& op, PlanParams params) {
  const TuningContext& ctx = comm->tuning();
  const size_t bytes = tuningBytes(op.kind, op.count, kernels::dataTypeSize(op.type), ctx.nranks);
  auto made = std::make_shared<CachedPlan>();
  made->choice = choose(op.kind, bytes, ctx);
  if (ctx.deterministic && isReducing(op.kind) && made->choice.algorithm == Algorithm::kRing) {
    return invalidUsage(std::string("LOOM_DETERMINISTIC=1: no algorithm that folds in rank order can run this ") +
                        opKindName(op.kind) + " of " + std::to_string(bytes) + " bytes on " +
                        std::to_string(ctx.nranks) +
                        " ranks (direct and twoshot run up to 32 ranks, twoshot up to 21 on device buffers)");
  }
  params.algorithm = made->choice.algorithm;
  LOOM_ASSIGN_OR_RETURN(made->plan, planCollective(op, params));
  made->links = linksOf(made->plan);
  return made;
}

// The cached plan of a collective, or a new one.
Result<std::shared_ptr<const CachedPlan>> collectivePlan(Communicator* comm, const OpDesc& op, PlanParams params) {
  const PlanKey key{op.kind, op.count, op.type, op.root};
  PlanCache& cache = comm->planCache();
  if (auto hit = cache.find(key)) return hit;
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<CachedPlan> made, makePlan(comm, op, params));
  const TuningContext& ctx = comm->tuning();
  LOOM_INFO(log::kTuning, "%s: %s of %zu bytes on %d ranks (%s): %s, estimated %.1f us", comm->describe().c_str(),
            opKindName(op.kind), tuningBytes(op.kind, op.count, kernels::dataTypeSize(op.type), ctx.nranks),
            ctx.nranks, linkClassName(ctx.links), algorithmName(made->choice.algorithm), made->choice.estimateUs);
  cache.insert(key, made);
  return std::shared_ptr<const CachedPlan>(std::move(made));
}

PlanParams planParamsOf(Communicator* comm) {
  PlanParams params;
  params.rank = comm->rank();
  params.nranks = comm->nranks();
  params.sliceBytes = comm->sliceBytes();
  params.channels = comm->nchannels();
  params.rings = comm->rings();
  params.hostOf = comm->hostOf();
  params.trees = comm->trees();
  params.cpusShared = comm->cpusShared();
  return params;
}

}  // namespace

size_t collectiveStagingBytes(Communicator* comm, const OpDesc& op) {
  auto made = makePlan(comm, op, planParamsOf(comm));
  return made.isOk() ? PlanRunner::stagingBytes(made.value()->plan, op.reduction, isReducing(op.kind), true) : 0;
}

size_t pointToPointStagingBytes(Communicator* comm, std::span<const OpDesc> p2p) {
  auto plan = planPointToPoint(p2p, planParamsOf(comm));
  return plan.isOk() ? PlanRunner::stagingBytes(plan.value(), {}, false, true) : 0;
}

namespace {

Status buildTasks(Communicator* comm, std::span<const OpDesc> ops, std::vector<Task>* tasks) {
  const PlanParams params = planParamsOf(comm);
  std::vector<OpDesc> p2p;
  for (const OpDesc& op : ops) {
    if (isPointToPoint(op.kind)) {
      p2p.push_back(op);
      continue;
    }
    Task t;
    t.ops = {op};
    // The same choice as runSingle's, grouped or not: every rank of the
    // communicator must make it alike.
    LatencyPath* lp = comm->latencyPath();
    t.board = lp && lp->takes(op);
    if (!t.board) {
      LOOM_ASSIGN_OR_RETURN(t.planned, collectivePlan(comm, op, params));
    }
    t.buffers = {static_cast<std::byte*>(const_cast<void*>(op.sendbuf)), static_cast<std::byte*>(op.recvbuf)};
    t.reduction = op.reduction;
    t.scalarPtr = op.scalarPtr;
    t.reducing = isReducing(op.kind);
    t.seq = comm->nextSeq();
    t.collSeq = comm->nextCollSeq();
    t.flightId = recordCollective(comm, op, t.seq, t.collSeq);
    tasks->push_back(std::move(t));
  }
  if (!p2p.empty()) {
    Task t;
    t.ops = p2p;
    auto made = std::make_shared<CachedPlan>();
    LOOM_ASSIGN_OR_RETURN(made->plan, planPointToPoint(p2p, params));
    made->links = linksOf(made->plan);
    t.planned = std::move(made);
    for (const OpDesc& op : p2p) {
      t.buffers.push_back(static_cast<std::byte*>(const_cast<void*>(op.sendbuf)));
      t.buffers.push_back(static_cast<std::byte*>(op.recvbuf));
    }
    t.reduction.type = kernels::DataType::kUint8;
    const uint64_t seq = comm->nextSeq();
    t.seq = seq;
    size_t elems = 0;
    bool collective = true;  // AllToAll, Gather, Scatter: every rank calls them
    for (const OpDesc& op : p2p) {
      elems += op.count;
      collective = collective && op.kind != OpKind::kSend && op.kind != OpKind::kRecv;
    }
    t.collSeq = collective ? comm->nextCollSeq() : 0;
    t.flightId = comm->flight().record(FlightRecorder::Entry{
        .seq = seq, .collSeq = t.collSeq, .kind = p2p.size() == 1 ? opKindName(p2p[0].kind) : "PointToPointGroup", .count = elems,
        .type = kernels::dataTypeName(p2p[0].type), .op = "",
        .root = p2p.size() == 1 ? p2p[0].root : -1});
    tasks->push_back(std::move(t));
  }
  return Status::ok();
}

// After a collective mismatch (LOOM_CHECK_COLLECTIVES), `tasks` will not
// run: their recorder entries are skipped, and their collective numbers
// are given back. Ranks may have grouped other collectives after the
// mismatched one; returning theirs keeps the flight recorder lining ranks
// up by number (the check counts only the collectives that ran, alike on
// every rank).
void skipMismatched(Communicator* comm, std::span<const Task> tasks) {
  uint64_t first = 0, last = 0;
  for (const Task& t : tasks) {
    comm->flight().skipped(t.flightId);
    if (t.collSeq == 0) continue;
    if (first == 0) first = t.collSeq;
    last = t.collSeq;
  }
  if (first) comm->returnCollSeqs(first, last);
}

class Engine {
 public:
  Engine(std::vector<CommRun> runs, const DeviceContext* device) : runs_(std::move(runs)), device_(device) {}

  Status run() {
    int spinRounds = 0;
    for (const CommRun& cr : runs_) spinRounds = std::max(spinRounds, cr.comm->spinRounds());
    bool moved = true;  // progress since lastProgress_ was set (the start counts)
    int idle = 0;
    for (;;) {
      bool progressed = false, allDone = true;
      for (CommRun& cr : runs_) {
        Status s = step(cr, &progressed);
        if (!s.isOk()) return failAll(cr, s);
        allDone = allDone && cr.done();
      }
      if (allDone) return mismatch_;
      if (progressed) {
        moved = true;
        idle = 0;
        continue;
      }
      ++idle;
      if (idle < spinRounds) {
        if (idle % kSpinYieldEvery != 0 || !yieldSawOthers()) continue;
        idle = spinRounds + kYieldRounds;  // block now
      }
      // The clock is read only once waiting starts: small operations that
      // never wait read it once.
      if (moved) {
        lastProgress_ = Clock::now();
        for (CommRun& cr : runs_) cr.stallWarnings = 0;
        moved = false;
      }
      if (idle < spinRounds + kYieldRounds) {
        sched_yield();
        continue;
      }
      for (CommRun& cr : runs_) {
        Status s = checkHealth(cr);
        if (!s.isOk()) return failAll(cr, s);
      }
      block();
    }
  }

 private:
  Status step(CommRun& cr, bool* progressed) {
    if (cr.done()) return Status::ok();
    Communicator* comm = cr.comm;
    if (comm->aborted()) return abortedError("running " + cr.tasks[cr.current].name());
    Task& task = cr.tasks[cr.current];
    if (cr.waitsForCheck()) {
      if (!cr.checker->finished()) return Status::ok();
      // The ranks disagree here, or the check failed.
      const Status& why = cr.checker->result();
      if (why.isOk()) return internalError("the collective check ended before " + task.name());
      if (why.code() != Code::kInvalidUsage || comm->hasFailed()) return why;
      // A mismatch, seen alike by every rank: this communicator's part of
      // the call ends here, and the others go on.
      skipMismatched(comm, std::span<const Task>(cr.tasks).subspan(cr.current));
      cr.current = cr.tasks.size();
      if (mismatch_.isOk()) mismatch_ = why;
      *progressed = true;
      return Status::ok();
    }
    if (task.board) {
      LatencyPath* lp = comm->latencyPath();
      if (!cr.boardStarted) {
        lp->start(task.ops[0]);
        comm->flight().started(task.flightId);
        cr.boardStarted = true;
        *progressed = true;
      }
      if (lp->step(progressed)) {
        comm->flight().finished(task.flightId, true);
        cr.boardStarted = false;
        ++cr.current;
        *progressed = true;
      }
      return Status::ok();
    }
    if (!cr.runner) {
      bool ready = false;
      LOOM_TRY(comm->connectStep(task.planned->links, &ready));
      if (!ready) return Status::ok();
      if (task.scalarPtr) {
        std::memcpy(&task.reduction.scalar, task.scalarPtr, kernels::dataTypeSize(task.reduction.type));
      }
      if (task.planned->spare && !device_) {
        cr.runner = std::move(task.planned->spare);
        LOOM_TRY(cr.runner->rebind(task.buffers, task.reduction, comm->connections(), &comm->scratch()));
      } else {
        LOOM_ASSIGN_OR_RETURN(cr.runner, PlanRunner::create(&task.planned->plan, task.buffers, task.reduction,
                                                            task.reducing, comm->connections(), &comm->scratch(),
                                                            &comm->registrations(), device_));
      }
      LOOM_TRACE(log::kColl, "%s: %s: %s", comm->describe().c_str(), task.name().c_str(),
                 dumpPlan(task.planned->plan).c_str());
      comm->flight().started(task.flightId);
      *progressed = true;
    }
    LOOM_TRY(cr.runner->advance(progressed));
    if (cr.runner->done()) {
      comm->flight().finished(task.flightId, true);
      if (!device_) task.planned->spare = std::move(cr.runner);
      cr.runner.reset();
      ++cr.current;
      *progressed = true;
    }
    return Status::ok();
  }

  std::string waitingList(const CommRun& cr) const {
    if (cr.waitsForCheck()) {
      return "the ranks' collective check (LOOM_CHECK_COLLECTIVES): some rank has not reached this collective";
    }
    std::vector<int> peers;
    if (!cr.done() && cr.tasks[cr.current].board) {
      if (cr.comm->latencyPath()->waitingFor() >= 0) peers.push_back(cr.comm->latencyPath()->waitingFor());
    } else if (cr.runner && cr.runner->failedPeer() >= 0) peers.push_back(cr.runner->failedPeer());
    else if (cr.runner) cr.runner->waitingOn(&peers);
    else if (!cr.done()) {
      for (int link : cr.tasks[cr.current].planned->links) peers.push_back(link % cr.comm->nranks());
      std::sort(peers.begin(), peers.end());
      peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    }
    std::string s;
    for (int p : peers) s += (s.empty() ? "" : ", ") + cr.comm->describePeer(p);
    return s.empty() ? "no peer" : s;
  }

  // Peer notices and the no-progress timeout. Dead peers are seen by their
  // connections: sockets close, and shared memory watches the peer through a
  // pidfd opened where the peer's process was proven visible. A pid alone
  // proves nothing (ranks in other PID namespaces), so none is probed here.
  Status checkHealth(CommRun& cr) {
    if (cr.done()) return Status::ok();
    Communicator* comm = cr.comm;
    comm->pollNotices();
    // Not asyncError(): the init's own operations (LOOM_CALIBRATE) run
    // before the communicator is ready.
    LOOM_TRY(comm->stickyError());
    if (cr.tasks[cr.current].board) LOOM_TRY(comm->latencyPath()->checkWaited(*comm));
    const double timeout = comm->timeoutS();
    const double stalled = secondsSince(lastProgress_);
    // The stall inspector: one WARN per period of no progress, naming who
    // is late; nothing fails because of it.
    const double period = comm->options().stallWarnS;
    if (period > 0 && stalled >= period * double(cr.stallWarnings + 1) && (timeout <= 0 || stalled < timeout)) {
      cr.stallWarnings = int(stalled / period);  // one warning, even after a long gap
      const std::string ends = timeout > 0 ? "it fails after LOOM_TIMEOUT_S=" + std::to_string(int(timeout)) + " s"
                                           : "LOOM_TIMEOUT_S=0: it waits for ever";
      LOOM_WARN("%s: %s has made no progress for %d s; waiting for %s (LOOM_STALL_WARN_S=%d; %s)",
                comm->describe().c_str(), cr.tasks[cr.current].name().c_str(), int(stalled), waitingList(cr).c_str(),
                int(period), ends.c_str());
    }
    if (timeout > 0 && stalled > timeout) {
      // Waiting only for ranks of this host (alive, or their shared memory
      // would have said so) means the stall comes from further along: the
      // rank that waits for another host times out too and tells everyone.
      // Its report names the cause; give it a moment before blaming a
      // neighbour.
      const double grace = std::min(2.0, timeout / 4);
      if (stalled < timeout + grace && waitsOnlyOnThisHost(cr)) return Status::ok();
      return remoteError(cr.tasks[cr.current].name() + " made no progress for " +
                         std::to_string(int(timeout)) + " s (LOOM_TIMEOUT_S); waiting for " +
                         waitingList(cr));
    }
    return Status::ok();
  }

  bool waitsOnlyOnThisHost(const CommRun& cr) const {
    std::vector<int> peers;
    if (cr.runner) cr.runner->waitingOn(&peers);
    if (!cr.done() && cr.tasks[cr.current].board && cr.comm->latencyPath()->waitingFor() >= 0)
      peers.push_back(cr.comm->latencyPath()->waitingFor());
    const Bootstrap& b = cr.comm->bootstrap();
    const uint64_t here = b.peer(cr.comm->rank()).hostHash;
    for (int p : peers)
      if (b.peer(p).hostHash != here) return false;
    return !peers.empty();
  }

  void block() {
    // Checks end on their own threads, which announce nothing: look again soon.
    for (CommRun& cr : runs_) {
      if (cr.waitsForCheck()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        return;
      }
    }
    // A board task waits on a peer's sequence word, which no fd announces:
    // sleep on it briefly (the others are looked at again after).
    for (CommRun& cr : runs_) {
      if (!cr.done() && cr.tasks[cr.current].board && cr.boardStarted) {
        cr.comm->latencyPath()->sleep(1);
        return;
      }
    }
    // Kernels announce their end through no fd: look again soon.
    for (CommRun& cr : runs_) {
      if (cr.runner && cr.runner->deviceBusy()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        return;
      }
    }
    std::vector<pollfd> fds;
    for (CommRun& cr : runs_) {
      if (cr.done()) continue;
      fds.push_back({cr.comm->wakeFd(), POLLIN, 0});
      cr.comm->pollFdsForNotices(&fds);
      cr.comm->pollFdsForLinks(&fds);
      if (cr.runner)
        for (auto* c : cr.runner->connections()) c->pollFds(&fds);
    }
    ::poll(fds.data(), fds.size(), kBlockMs);
  }

  // The first failure ends the group: the failing communicator tells its
  // peers; the others of the group are left mid-operation, so they fail too.
  Status failAll(CommRun& failed, Status s) {
    Communicator* comm = failed.comm;
    // Before the communicator fails (and dumps its flight recorder).
    for (CommRun& cr : runs_) {
      if (!cr.done()) cr.comm->flight().finished(cr.tasks[cr.current].flightId, false);
    }
    if (s.code() == Code::kRemoteError && !comm->aborted()) s = comm->preferPeerReport(s);
    const std::string name = failed.done() ? "group" : failed.tasks[failed.current].name();
    const bool hinted = s.message().find(kAbortHint) != std::string::npos;  // relayed from a peer
    const std::string waiting = s.code() == Code::kRemoteError && !failed.done()
                                    ? " [peers involved: " + waitingList(failed) + "]"
                                    : "";
    Status full(s.code(), comm->describe() + ": " + name + " failed: " + s.message() + waiting +
                              (s.code() == Code::kRemoteError && !hinted
                                   ? std::string(". ") + kAbortHint +
                                         "; set NCCL_DEBUG=INFO on the rank named above to see why."
                                   : ""));
    LOOM_WARN("%s", full.toString().c_str());
    comm->fail(full, !comm->aborted());
    for (CommRun& cr : runs_) {
      if (cr.comm != comm && !cr.done())
        cr.comm->fail(Status(full.code(), "another communicator in the same group failed: " + full.message()), true);
    }
    return full;
  }

  std::vector<CommRun> runs_;
  const DeviceContext* device_;
  Status mismatch_;  // the first communicator whose ranks called different collectives
  Clock::time_point lastProgress_;
};

std::vector<Communicator*> commsOf(const std::vector<PendingOp>& ops) {
  std::vector<Communicator*> comms;
  for (const auto& p : ops)
    if (std::find(comms.begin(), comms.end(), p.comm.get()) == comms.end()) comms.push_back(p.comm.get());
  return comms;
}

// Init done, and splits called before these operations went first.
Status waitTurn(Communicator* c) {
  Status s = c->waitReady();
  return s.isOk() ? c->waitSplits() : s;
}

// Cuda mode: each communicator's share goes to its device queue, in call
// order; every host function before any gate (DeviceQueue's
// queueHostFunctions, then queueGates), as communicators of one process may
// share a stream.
Status submitToDevices(std::vector<PendingOp> ops) {
  // Every communicator ready first: a job whose gates are not queued yet
  // is held, and a communicator's init may wait for another's queue to
  // drain (a shrink of it).
  for (Communicator* c : commsOf(ops)) LOOM_TRY(waitTurn(c));
  // LOOM_CHECK_COLLECTIVES: a communicator whose ranks disagree queues only
  // the collectives they agreed on.
  Status mismatch = checkGroupCollectives(&ops);
  if (ops.empty()) return mismatch;
  const std::vector<Communicator*> comms = commsOf(ops);
  // Each communicator's operations, and a pin of it.
  std::vector<std::pair<CommRef, std::vector<OpDesc>>> perComm(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    if (!comms[i]->deviceQueue())
      return internalError(comms[i]->describe() + " is in cuda mode but has no device queue");
    for (auto& p : ops) {
      if (p.comm.get() != comms[i]) continue;
      perComm[i].second.push_back(p.op);
      if (!perComm[i].first) perComm[i].first = p.comm;
    }
  }
  // Staging memory and peers' buffers to map before any gate of the group
  // is queued: allocating and mapping may wait for the whole device
  // (Scratch::reserve, Connection::prepare).
  for (size_t i = 0; i < comms.size(); ++i) {
    LOOM_TRY(comms[i]->deviceQueue()->reserveStaging(perComm[i].second));
    LOOM_TRY(comms[i]->prepareHostConnections());
  }
  std::vector<std::pair<DeviceQueue*, std::unique_ptr<DeviceQueue::Submission>>> queued;
  Status s;
  // Each communicator's work is queued with its device current: a launch
  // on a stream of another device fails (one thread may drive several GPUs).
  for (size_t i = 0; i < comms.size(); ++i) {
    DeviceQueue* q = comms[i]->deviceQueue();
    device::ScopedDevice bound(device::api(), comms[i]->cudaDevice());
    if (!bound.status().isOk()) {
      s = bound.status();
      break;
    }
    auto sub = q->queueHostFunctions(std::move(perComm[i].first), std::move(perComm[i].second));
    if (!sub.isOk()) {
      s = sub.takeStatus();
      break;
    }
    queued.emplace_back(q, std::move(sub.value()));
  }
  // What was queued gets its gates even after a failure: a job left
  // without them would never be released.
  for (auto& [q, sub] : queued) {
    device::ScopedDevice bound(device::api(), q->device());
    Status g = bound.status().isOk() ? q->queueGates(*sub) : bound.status();
    if (s.isOk()) s = g;
  }
  return s.isOk() ? mismatch : s;
}

}  // namespace

// One operation outside a group on a host communicator: runOps without the
// bookkeeping for several communicators (the latency of small operations).
Status runSingle(Communicator* c, const OpDesc& op) {
  // The checks inline first: on the board, the rest of a small call costs
  // about as much as they do.
  if (!c->usableNow()) LOOM_TRY(waitTurn(c));
  std::lock_guard<BiasedMutex> lock(c->opMutex());
  std::vector<Task> tasks;  // the engine's, if it runs
  bool boardStarted = false;
  if (c->checksCollectives() && isChecked(op.kind)) {
    // LOOM_CHECK_COLLECTIVES: numbered and in the flight recorder (queued)
    // before its ranks compare it, so that a dump taken while a rank never
    // comes shows the call waiting. Then it runs as in a group.
    LOOM_TRY(buildTasks(c, std::span<const OpDesc>(&op, 1), &tasks));
    if (Status s = checkCollective(c, op); !s.isOk()) {
      if (s.code() == Code::kInvalidUsage && !c->hasFailed() && !c->aborted()) skipMismatched(c, tasks);
      else c->flight().finished(tasks.front().flightId, false);
      return s;
    }
  } else if (LatencyPath* lp = c->latencyPath(); lp && lp->takes(op)) {
    // On the board, at once; a rank that is late is waited for by the
    // engine, as in a group.
    if (c->hasFailed()) LOOM_TRY(c->asyncError());
    if (c->aborted()) return abortedError(std::string("running ") + opKindName(op.kind));
    const uint64_t seq = c->nextSeq();
    const uint64_t collSeq = c->nextCollSeq();
    // The precise clock (a trace of short operations) is read at the start
    // too.
    const int64_t since = flightClockPrecise() ? wallMicros() : 0;
    lp->start(op);
    if (lp->finishSoon(c->cpusShared(), c->spinRounds())) {
      // Recorded once done: one entry, one look at the clock (two with
      // the precise clock). A dump taken meanwhile misses it; one that
      // waits for a late rank is recorded as running when the engine
      // takes it over below (with the 4 ms clock, its times lag by the
      // wait so far).
      recordCollective(c, op, seq, collSeq, FlightRecorder::State::kDone, since);
      return Status::ok();
    }
    const uint64_t flightId = recordCollective(c, op, seq, collSeq, FlightRecorder::State::kRunning, since);
    Task t;
    t.ops = {op};
    t.board = true;
    t.seq = seq;
    t.collSeq = collSeq;
    t.flightId = flightId;
    tasks.push_back(std::move(t));
    boardStarted = true;
  } else {
    LOOM_TRY(buildTasks(c, std::span<const OpDesc>(&op, 1), &tasks));
  }
  std::vector<CommRun> runs;
  runs.push_back(CommRun{c, std::move(tasks), 0, nullptr});
  runs[0].boardStarted = boardStarted;
  log::ScopedRank logRank(c->rank());
  return Engine(std::move(runs), nullptr).run();
}

Status runOps(std::vector<PendingOp> ops) {
  for (Communicator* c : commsOf(ops)) LOOM_TRY(waitTurn(c));
  return runPlannedOps(std::move(ops));
}

Status runPlannedOps(std::vector<PendingOp> ops, const DeviceContext* device) {
  std::vector<Communicator*> comms = commsOf(ops);
  // Lock in address order so two threads with overlapping groups cannot deadlock.
  std::vector<Communicator*> order = comms;
  std::sort(order.begin(), order.end());
  std::vector<std::unique_lock<BiasedMutex>> locks;
  for (Communicator* c : order) locks.emplace_back(c->opMutex());
  std::vector<CommRun> runs;
  std::vector<std::vector<OpDesc>> theirs;
  for (Communicator* c : comms) {
    std::vector<OpDesc> mine;
    for (const auto& p : ops)
      if (p.comm.get() == c) mine.push_back(p.op);
    CommRun cr{c, {}, 0, nullptr};
    LOOM_TRY(buildTasks(c, mine, &cr.tasks));
    runs.push_back(std::move(cr));
    theirs.push_back(std::move(mine));
  }
  // LOOM_CHECK_COLLECTIVES on host buffers: each communicator's checks run
  // ahead on a thread of their own, and each task starts once its
  // collectives are agreed on (cuda mode checked them when they were
  // queued). Destroyed, so joined, before the locks are released.
  std::vector<std::unique_ptr<CollectiveChecker>> checkers;
  for (size_t i = 0; i < runs.size() && !device; ++i) {
    if (!runs[i].comm->checksCollectives()) continue;
    // buildTasks' order: the collectives in call order, then one task for
    // the point-to-point kinds, which needs every check.
    std::vector<size_t> needs;
    size_t seen = 0;
    for (const OpDesc& op : theirs[i]) {
      seen += isChecked(op.kind) ? 1 : 0;
      if (!isPointToPoint(op.kind)) needs.push_back(seen);
    }
    if (seen == 0) continue;  // point-to-point calls only: nothing to compare
    for (size_t t = 0; t < runs[i].tasks.size(); ++t) runs[i].tasks[t].checksNeeded = t < needs.size() ? needs[t] : seen;
    // Untimed: a check that runs ahead may wait while this rank's engine
    // runs earlier collectives; the engine's own no-progress timeout ends a
    // wait for a rank that never comes.
    checkers.push_back(std::make_unique<CollectiveChecker>(runs[i].comm, theirs[i], false));
    runs[i].checker = checkers.back().get();
  }
  log::ScopedRank logRank(comms.size() == 1 ? comms[0]->rank() : -1);
  return Engine(std::move(runs), device).run();
}

Status runInitOps(Communicator* comm, std::span<const OpDesc> ops) {
  std::vector<CommRun> runs;
  runs.push_back(CommRun{comm, {}, 0, nullptr});
  LOOM_TRY(buildTasks(comm, ops, &runs[0].tasks));
  return Engine(std::move(runs), nullptr).run();
}

Status groupStart() {
  ++tGroupDepth;
  return Status::ok();
}

int groupDepth() { return tGroupDepth; }

Status groupEnd() {
  if (tGroupDepth == 0) return invalidUsage("ncclGroupEnd called without a matching ncclGroupStart");
  if (--tGroupDepth > 0) return Status::ok();
  auto inits = std::move(tGroup.inits);
  auto ops = std::move(tGroup.ops);
  tGroup = GroupState{};
  bool inProgress = false;
  // Blocking inits run on worker threads, all at once (their ranks may need
  // each other). The first failure aborts the others: their peers may be
  // the ones that failed, and waiting for them would last the init timeout.
  std::mutex failMutex;
  Status first;
  std::vector<Communicator*> blockingComms;
  for (auto& [comm, job] : inits)
    if (!comm || comm->options().blocking) blockingComms.push_back(comm);
  auto runJob = [&](Communicator* comm, std::function<Status()>& job) {
    Status s = runInitJob(job);
    if (s.isOk()) return;
    if (comm) comm->fail(s, false);
    std::lock_guard<std::mutex> lock(failMutex);
    if (!first.isOk()) return;
    first = s;
    for (Communicator* other : blockingComms)
      if (other && other != comm) other->abort();
  };
  std::vector<std::thread> threads;
  for (auto& [comm, job] : inits) {
    if (comm && !comm->options().blocking) {
      comm->startAsync(std::move(job));
      inProgress = true;
      continue;
    }
    try {
      threads.emplace_back([&runJob, comm = comm, &job = job] { runJob(comm, job); });
    } catch (const std::system_error& e) {
      std::function<Status()> failed = [msg = std::string(e.what())] {
        return systemError("cannot start a thread for a grouped init: " + msg);
      };
      runJob(comm, failed);
    }
  }
  for (auto& t : threads) t.join();
  if (!first.isOk()) return first;
  // Device work is queued first: it never blocks, while host work runs here.
  std::vector<PendingOp> device, host;
  for (auto& p : ops) (p.comm->mode() == Mode::kCuda ? device : host).push_back(std::move(p));
  // Host work runs even when queueing device work failed (a communicator
  // whose ranks disagree, say): peers that grouped these communicators
  // apart wait for it.
  Status queued = device.empty() ? Status::ok() : submitToDevices(std::move(device));
  Status ran = host.empty() ? Status::ok() : runOps(std::move(host));
  LOOM_TRY(queued);
  LOOM_TRY(ran);
  return inProgress ? Status(Code::kInProgress, "non-blocking init in progress") : Status::ok();
}

Status groupSimulateEnd(float* estimatedUs) {
  if (tGroupDepth == 0) return invalidUsage("ncclGroupSimulateEnd called without a matching ncclGroupStart");
  if (tGroupDepth > 1) {
    --tGroupDepth;
    *estimatedUs = 0;
    return Status::ok();
  }
  auto ops = std::move(tGroup.ops);
  tGroup.ops.clear();
  // The cost model's estimates (core/tuning.h): what the planner would pick.
  double total = 0;
  for (const auto& p : ops) {
    const TuningContext& ctx = p.comm->tuning();
    const size_t es = kernels::dataTypeSize(p.op.type);
    if (collectiveIndex(p.op.kind) >= 0) {
      total += choose(p.op.kind, tuningBytes(p.op.kind, p.op.count, es, ctx.nranks), ctx).estimateUs;
    } else {
      const int peers = p.op.kind == OpKind::kSend || p.op.kind == OpKind::kRecv ? 1 : ctx.nranks - 1;
      total += pointToPointUs(p.op.count * es * size_t(std::max(1, peers)), std::max(1, peers), ctx);
    }
  }
  *estimatedUs = float(total);
  return groupEnd();  // runs pending inits only: the ops were taken out
}

Status enqueue(Communicator* comm, const OpDesc& op) {
  const bool now = tGroupDepth == 0;
  if (now && comm->mode() != Mode::kCuda) return runSingle(comm, op);
  comm->addPin();  // beside the caller's hold, which keeps any teardown waiting
  PendingOp pending{CommRef::adopt(comm), op};
  if (!now) {
    tGroup.ops.push_back(std::move(pending));
    return Status::ok();
  }
  std::vector<PendingOp> ops;
  ops.push_back(std::move(pending));
  return submitToDevices(std::move(ops));
}

void enqueueInit(Communicator* comm, std::function<Status()> job) {
  tGroup.inits.emplace_back(comm, std::move(job));
}

bool groupHolds(const Communicator* comm) {
  for (const auto& p : tGroup.ops)
    if (p.comm.get() == comm) return true;
  for (const auto& [c, job] : tGroup.inits)
    if (c == comm) return true;
  return false;
}

}  // namespace loom::core
