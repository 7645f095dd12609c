#include "core/device_queue.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "core/communicator.h"
#include "core/group.h"

namespace loom::core {

struct DeviceQueue::Job {
  CommRef pin;
  std::vector<OpDesc> ops;
  uint64_t* word = nullptr;  // the gate word that releases it...
  uint64_t value = 0;        // ...once raised to this
  int waiting = 0;           // host functions not yet run (under Signal::mutex)
  bool replay = false;       // queued by a graph replay (ready when queued)
  std::vector<device::Stream> streams;  // where it is gated
  Status failed;             // queuing it on a stream failed: record, never run
};

struct DeviceQueue::Signal {
  explicit Signal(Communicator* comm) : comm(comm) {}
  Communicator* const comm;  // valid while !stop (the queue is its member)
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> jobs;  // submitted, not yet running
  uint64_t submitted = 0;  // jobs, graph replays included
  uint64_t released = 0;
  uint64_t seq = 0;        // gate values handed out on the queue's own word
  std::vector<std::pair<uint64_t*, uint64_t>> unreleased;  // dropped by abort, released with the running job
  bool running = false;
  bool aborted = false;
  bool stop = false;
};

// A collective captured into a CUDA graph: what each replay runs. The graph
// owns it (Api::retainWithGraph). On the stream it is a host function
// (onReplay: sets this replay's target and queues a job) and an indirect
// gate (waits until `word` reaches the target). The words are its own, so
// replays stay ordered whatever else the queue runs.
struct DeviceQueue::Replay {
  ~Replay() {
    // Nothing may stay gated on words that change owner.
    device::raiseGateWord(word, base + launches);
    device::releaseGateWord(api, word);
    device::releaseGateWord(api, target);
  }
  static void onReplay(void* arg);

  device::Api* api = nullptr;
  std::weak_ptr<Signal> signal;
  std::vector<OpDesc> ops;
  uint64_t* word = nullptr;
  uint64_t* target = nullptr;
  uint64_t base = 0;
  uint64_t launches = 0;  // only onReplay touches it (replays run one at a time on their stream)
  device::Stream stream = nullptr;  // the captured stream
};

void DeviceQueue::Replay::onReplay(void* arg) {
  auto* r = static_cast<Replay*>(arg);
  const uint64_t value = r->base + ++r->launches;
  device::raiseGateWord(r->target, value);
  auto signal = r->signal.lock();
  bool queued = false;
  if (signal) {
    std::lock_guard<std::mutex> lock(signal->mutex);
    if (!signal->stop && !signal->aborted && signal->comm->tryPin()) {
      auto job = std::make_shared<Job>();
      job->pin = CommRef::adopt(signal->comm);
      job->ops = r->ops;
      job->word = r->word;
      job->value = value;
      job->replay = true;
      job->streams = {r->stream};
      ++signal->submitted;
      signal->jobs.push_back(std::move(job));
      queued = true;
    }
  }
  // A communicator that is gone (or failing) runs nothing: the replay's
  // gate opens at once, so the graph never hangs.
  if (queued) signal->cv.notify_all();
  else device::raiseGateWord(r->word, value);
}

namespace {

// What a host function queued on a user's stream carries. Weak: the queue
// (abort, destroy) may be gone when the stream gets to it.
struct Ticket {
  std::weak_ptr<void> signal;
  std::weak_ptr<void> job;
};

}  // namespace

Result<std::unique_ptr<DeviceQueue>> DeviceQueue::create(Communicator* comm, device::Api* api) {
  LOOM_TRY(api->loadKernels(comm->cudaDevice()));
  std::unique_ptr<DeviceQueue> q(new DeviceQueue(comm, api));
  LOOM_ASSIGN_OR_RETURN(q->word_, device::acquireGateWord(api));
  q->base_ = device::readGateWord(q->word_);
  LOOM_ASSIGN_OR_RETURN(q->stream_, api->createStream());
  q->context_ = DeviceContext{api, q->stream_, &q->pinned_, &q->onDevice_, &q->events_};
  try {
    q->thread_ = std::thread([p = q.get()] { p->loop(); });
  } catch (const std::system_error& e) {
    return systemError(std::string("cannot start the device progress thread: ") + e.what());
  }
  return q;
}

DeviceQueue::DeviceQueue(Communicator* comm, device::Api* api)
    : comm_(comm), api_(api), signal_(std::make_shared<Signal>(comm)),
      pinned_(api, Scratch::Kind::kPinned), onDevice_(api, Scratch::Kind::kDevice) {}

DeviceQueue::~DeviceQueue() {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    signal_->stop = true;
    left.swap(signal_->jobs);
    for (const auto& job : left) device::raiseGateWord(job->word, job->value);
  }
  signal_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  if (word_) {
    // Nothing may stay gated on a word that changes owner.
    device::raiseGateWord(word_, base_ + signal_->seq);
    device::releaseGateWord(api_, word_);
  }
  if (stream_) {
    (void)api_->synchronize(stream_);
    api_->destroyStream(stream_);
  }
  for (device::Event e : events_) api_->destroyEvent(e);
}

Result<std::unique_ptr<DeviceQueue::Submission>> DeviceQueue::queueHostFunctions(CommRef pin,
                                                                                  std::vector<OpDesc> ops) {
  std::vector<device::Stream> streams;
  for (const OpDesc& op : ops)
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
  int capturing = 0;
  for (device::Stream s : streams) {
    LOOM_ASSIGN_OR_RETURN(device::Capture capture, api_->captureStatus(s));
    if (capture == device::Capture::kInvalidated) {
      return invalidUsage("a loom operation was called on a stream whose CUDA graph capture was invalidated "
                          "(an earlier call in the capture failed)");
    }
    capturing += capture == device::Capture::kActive;
  }
  if (capturing > 0) {
    if (streams.size() != 1) {
      return invalidUsage("a CUDA graph capture may hold a group of loom operations only when all of one "
                          "communicator's operations in the group use the same stream");
    }
    return capture(std::move(ops), streams[0]);
  }
  auto sub = std::make_unique<Submission>();
  auto job = std::make_shared<Job>();
  job->pin = std::move(pin);
  job->ops = std::move(ops);
  job->word = word_;
  job->streams = streams;
  // One more than the host functions: the job cannot start before its gates
  // are queued (a failed gate launch is recorded first).
  job->waiting = int(streams.size()) + 1;
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (signal_->aborted || signal_->stop) return abortedError("queuing an operation");
    job->value = base_ + ++signal_->seq;
    ++signal_->submitted;
    signal_->jobs.push_back(job);
  }
  // On each stream the host function marks the job ready once the stream's
  // earlier work is done; the gate (queueGates) holds back later work.
  for (device::Stream s : streams) {
    auto* ticket = new Ticket{signal_, job};
    Status st = api_->launchHostFunc(
        s,
        [](void* arg) {
          std::unique_ptr<Ticket> t(static_cast<Ticket*>(arg));
          auto signal = std::static_pointer_cast<Signal>(t->signal.lock());
          if (!signal) return;
          {
            std::lock_guard<std::mutex> lock(signal->mutex);
            if (auto j = std::static_pointer_cast<Job>(t->job.lock())) --j->waiting;
          }
          signal->cv.notify_all();
        },
        ticket);
    sub->hostFunctionQueued.push_back(st.isOk());
    if (st.isOk()) continue;
    delete ticket;
    std::lock_guard<std::mutex> lock(signal_->mutex);
    --job->waiting;  // a queued host function counts itself
    if (sub->queued.isOk()) sub->queued = st;
    if (job->failed.isOk()) job->failed = st;
  }
  sub->job = std::move(job);
  return sub;
}

Status DeviceQueue::reserveStaging(std::span<const OpDesc> ops) { return reserve(stagingNeed(ops)); }

Status DeviceQueue::reserve(size_t bytes) {
  if (bytes <= std::min(pinned_.size(), onDevice_.size())) return Status::ok();
  // The caller's thread may have another device current (one thread
  // driving several GPUs): the memory belongs on the communicator's.
  device::ScopedDevice bound(api_, comm_->cudaDevice());
  LOOM_TRY(bound.status());
  LOOM_TRY(pinned_.reserve(bytes));
  return onDevice_.reserve(bytes);
}

size_t DeviceQueue::stagingNeed(std::span<const OpDesc> ops) {
  size_t need = 0;
  std::vector<OpDesc> p2p;
  for (const OpDesc& op : ops) {
    if (isPointToPoint(op.kind)) {
      p2p.push_back(op);
      continue;
    }
    const PlanKey key{op.kind, op.count, op.type, op.root};
    {
      std::lock_guard<std::mutex> lock(stagingMutex_);
      if (auto it = stagingOf_.find(key); it != stagingOf_.end()) {
        need = std::max(need, it->second);
        continue;
      }
    }
    const size_t bytes = collectiveStagingBytes(comm_, op);
    need = std::max(need, bytes);
    std::lock_guard<std::mutex> lock(stagingMutex_);
    if (stagingOf_.size() >= PlanCache::kMaxEntries) stagingOf_.clear();
    stagingOf_[key] = bytes;
  }
  // Point-to-point calls are planned together, as the job will.
  if (!p2p.empty()) need = std::max(need, pointToPointStagingBytes(comm_, p2p));
  return need;
}

Status DeviceQueue::reserveForEverySize() {
  const int n = comm_->nranks();
  if (n < 2) return Status::ok();
  const size_t es = kernels::dataTypeSize(kernels::DataType::kFloat32);
  // Beyond this every step of every plan moves whole slices.
  const size_t largest = 4 * size_t(n) * comm_->sliceBytes() * size_t(comm_->nchannels());
  std::vector<OpDesc> ops;
  for (size_t bytes = 256; bytes <= largest; bytes *= 4) {
    for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllGather,
                        OpKind::kReduceScatter}) {
      OpDesc op;
      op.kind = kind;
      // AllGather and ReduceScatter count per rank; `bytes` is their whole vector.
      const bool perRank = kind == OpKind::kAllGather || kind == OpKind::kReduceScatter;
      op.count = std::max<size_t>(1, bytes / es / (perRank ? size_t(n) : 1));
      ops.push_back(op);
    }
  }
  // A send and a receive of many slices, planned together as a group would.
  OpDesc send, recv;
  send.kind = OpKind::kSend;
  recv.kind = OpKind::kRecv;
  send.count = recv.count = largest / es;
  send.root = (comm_->rank() + 1) % n;
  recv.root = (comm_->rank() + n - 1) % n;
  const OpDesc pair[] = {send, recv};
  LOOM_TRY(reserve(std::max(stagingNeed(ops), stagingNeed(pair))));
  LOOM_INFO(log::kInit, "%s: %zu bytes of staging memory for device operations, pinned and on the device",
            comm_->describe().c_str(), pinned_.size());
  return Status::ok();
}

int DeviceQueue::device() const { return comm_->cudaDevice(); }

Status DeviceQueue::queueGates(Submission& sub) {
  if (sub.replay) {
    // The graph owns the replay first: its host function is captured.
    Replay* r = sub.replay.get();
    LOOM_TRY(api_->retainWithGraph(r->stream, std::move(sub.replay)));
    return api_->launchGateIndirect(r->stream, r->word, r->target);
  }
  Job& job = *sub.job;
  for (size_t i = 0; i < job.streams.size(); ++i) {
    if (!sub.hostFunctionQueued[i]) continue;  // nothing to hold back for
    Status st = api_->launchGate(job.streams[i], word_, job.value);
    if (st.isOk()) continue;
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (sub.queued.isOk()) sub.queued = st;
    if (job.failed.isOk()) job.failed = st;
  }
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    --job.waiting;
  }
  signal_->cv.notify_all();
  return sub.queued;
}

// Captured into a graph: each replay queues a job from its host function;
// nothing runs now. The replay's object lives as long as the graph
// (queueGates hands it over).
Result<std::unique_ptr<DeviceQueue::Submission>> DeviceQueue::capture(std::vector<OpDesc> ops,
                                                                       device::Stream stream) {
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (signal_->aborted || signal_->stop) return abortedError("capturing an operation");
  }
  auto replay = std::make_shared<Replay>();
  replay->api = api_;
  replay->signal = signal_;
  replay->ops = std::move(ops);
  replay->stream = stream;
  LOOM_ASSIGN_OR_RETURN(replay->word, device::acquireGateWord(api_));
  auto target = device::acquireGateWord(api_);
  if (!target.isOk()) {
    device::releaseGateWord(api_, replay->word);
    return target.takeStatus();
  }
  replay->target = target.value();
  // Both words only go up: start above what either holds.
  replay->base = std::max(device::readGateWord(replay->word), device::readGateWord(replay->target));
  device::raiseGateWord(replay->word, replay->base);
  LOOM_TRY(api_->launchHostFunc(stream, &Replay::onReplay, replay.get()));
  auto sub = std::make_unique<Submission>();
  sub->replay = std::move(replay);
  return sub;
}

Status DeviceQueue::drain(double seconds) {
  std::unique_lock<std::mutex> lock(signal_->mutex);
  auto finished = [&] { return signal_->released == signal_->submitted || signal_->aborted; };
  bool done = true;
  if (seconds <= 0) signal_->cv.wait(lock, finished);  // LOOM_TIMEOUT_S=0: no limit
  else done = signal_->cv.wait_for(lock, std::chrono::duration<double>(seconds), finished);
  if (!done) {
    return Status(Code::kInternalError, std::to_string(signal_->submitted - signal_->released) +
                                            " queued operations still not finished after " +
                                            std::to_string(int(seconds)) + " s");
  }
  return Status::ok();
}

void DeviceQueue::abort() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (signal_->aborted) return;
    signal_->aborted = true;
    dropped.swap(signal_->jobs);
    for (const auto& job : dropped) signal_->unreleased.emplace_back(job->word, job->value);
    signal_->released += dropped.size();
    // A running job releases everything itself once it stops: releasing
    // now would let its stream run while it may still copy results.
    if (!signal_->running) releaseAll();
  }
  signal_->cv.notify_all();
}  // `dropped` unpins the communicator here, outside the lock

// Under the mutex, after an abort: every gate value ever handed out.
void DeviceQueue::releaseAll() {
  device::raiseGateWord(word_, base_ + signal_->seq);
  for (auto [word, value] : signal_->unreleased) device::raiseGateWord(word, value);
  signal_->unreleased.clear();
}

void DeviceQueue::loop() {
  // The kernels, copies and connections this thread makes belong to the
  // communicator's device.
  if (Status s = api_->setDevice(comm_->cudaDevice()); !s.isOk()) comm_->fail(s.addContext("the device progress thread"), true);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(signal_->mutex);
      auto next = signal_->jobs.end();
      auto ready = [&] {
        next = nextJob();
        return signal_->stop || signal_->aborted || (!signal_->jobs.empty() && next != signal_->jobs.end());
      };
      // Waiting is normal (a user's stream may be busy for long), but a
      // replay held behind a call that waits for its stream for
      // LOOM_STALL_WARN_S is most likely the one order this queue cannot
      // see: the graph replayed on another stream than it was captured
      // on, that call queued after it there. Said once per stall.
      const double warnAfter = comm_->options().stallWarnS;
      std::chrono::steady_clock::time_point warnAt{};
      bool heldBack = false, warned = false;  // a replay is held back; it was said
      while (!ready()) {
        if (warnAfter <= 0 || !replayHeldBack()) {
          heldBack = warned = false;
          signal_->cv.wait(lock);
          continue;
        }
        if (warned) {
          signal_->cv.wait(lock);
          continue;
        }
        if (!heldBack) {
          heldBack = true;
          warnAt = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(warnAfter));
        }
        if (signal_->cv.wait_until(lock, warnAt) == std::cv_status::timeout && !ready() && replayHeldBack()) {
          warned = true;
          LOOM_WARN("%s: a graph replay has been ready for %.0f s behind an operation that still waits for its "
                    "stream. If the graph was launched on another stream than the one it was captured on, and "
                    "that operation was then called on the launch stream, they wait for each other: replay a "
                    "graph that holds loom operations on its capture stream, or make that stream wait for "
                    "the replay (an event) before calling loom on it (LOOM_STALL_WARN_S)",
                    comm_->describe().c_str(), warnAfter);
        }
      }
      if (signal_->stop || signal_->aborted) return;
      job = std::move(*next);
      signal_->jobs.erase(next);
      signal_->running = true;
    }
    Status s = job->failed;
    if (s.isOk()) s = comm_->stickyError();  // a failed communicator runs nothing more
    else if (comm_->stickyError().isOk()) comm_->fail(s, true);
    if (s.isOk() && !comm_->aborted()) {
      s = run(*job);
      if (!s.isOk() && comm_->stickyError().isOk()) comm_->fail(s, true);
    }
    {
      std::lock_guard<std::mutex> lock(signal_->mutex);
      signal_->running = false;
      device::raiseGateWord(job->word, job->value);
      ++signal_->released;
      if (signal_->aborted) releaseAll();
    }
    signal_->cv.notify_all();
    job.reset();  // unpins; the communicator may be destroyed from here on
  }
}

// Under the mutex: the job to run next. Jobs run in call order, the order
// every rank made its calls in, with one exception: a graph replay is only
// queued when its stream reaches it, possibly after calls made later on
// that stream, which wait behind the replay's own gate (`launch graph;
// call` on one stream). When the first job is such a call, not ready and
// on the replay's stream, the replay goes first: it precedes that call in
// stream order, on every rank alike. (Calls on other streams made after a
// graph launch keep their call order; keep a communicator's graph launches
// and calls on one stream to make the order the same on every rank.)
std::deque<std::shared_ptr<DeviceQueue::Job>>::iterator DeviceQueue::nextJob() {
  auto& jobs = signal_->jobs;
  if (jobs.empty() || jobs.front()->waiting == 0) return jobs.begin();
  const Job& front = *jobs.front();
  if (front.replay) return jobs.end();
  for (auto it = jobs.begin() + 1; it != jobs.end(); ++it) {
    const Job& j = **it;
    if (j.replay && j.waiting == 0 &&
        std::find(front.streams.begin(), front.streams.end(), j.streams[0]) != front.streams.end()) {
      return it;
    }
  }
  return jobs.end();
}

// Under the mutex: the first job waits for its stream while a replay behind
// it is ready (and nextJob() will not let it pass).
bool DeviceQueue::replayHeldBack() const {
  const auto& jobs = signal_->jobs;
  if (jobs.empty() || jobs.front()->waiting == 0 || jobs.front()->replay) return false;
  return std::any_of(jobs.begin() + 1, jobs.end(), [](const auto& j) { return j->replay && j->waiting == 0; });
}

Status DeviceQueue::run(Job& job) {
  // Device-resident PreMulSum scalars: read now, after the stream's earlier work.
  std::vector<PendingOp> pending;
  pending.reserve(job.ops.size());  // the copies below write into its elements
  bool readScalar = false;
  for (const OpDesc& op : job.ops) {
    pending.push_back(PendingOp{job.pin, op});
    OpDesc& mine = pending.back().op;
    if (!mine.scalarPtr) continue;
    LOOM_TRY(api_->copyAsync(&mine.reduction.scalar, mine.scalarPtr, kernels::dataTypeSize(mine.type), stream_));
    mine.scalarPtr = nullptr;
    readScalar = true;
  }
  if (readScalar) LOOM_TRY(api_->synchronize(stream_));
  Status s = runPlannedOps(std::move(pending), &context_);
  if (!s.isOk()) {
    // A failed operation may leave copies queued by its connections: the
    // user's buffers go back only once nothing touches them any more.
    for (transport::Connection* c : comm_->connections())
      if (c) (void)c->quiesce();
  } else {
    flushConnections();
  }
  // Every step waited for its kernels; this only makes sure before the release.
  Status synced = api_->synchronize(stream_);
  return s.isOk() ? synced : s;
}

// A transport may still hold messages for a peer when the operation is
// done here (CUDA IPC gives slots back after the last step's kernels), and
// the peer may wait for them: hand them over before going idle. Bounded:
// what is left goes out with the next operation. Errors are the next
// operation's to report.
void DeviceQueue::flushConnections() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    bool idle = true;
    for (transport::Connection* c : comm_->connections()) {
      if (!c || c->idle()) continue;
      if (!c->progress().isOk()) continue;
      idle = idle && c->idle();
    }
    if (idle || comm_->aborted() || std::chrono::steady_clock::now() > deadline) return;
    std::this_thread::yield();
  }
}

}  // namespace loom::core
