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
  uint64_t seq = 0;   // the gate word's value that releases it
  int waiting = 0;    // host functions not yet run (under Signal::mutex)
  Status failed;      // queuing it on a stream failed: record, never run
};

struct DeviceQueue::Signal {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> jobs;  // submitted, not yet running
  uint64_t submitted = 0;
  uint64_t released = 0;
  bool running = false;
  bool aborted = false;
  bool stop = false;
};

namespace {

// What a host function queued on a user's stream carries. Weak: the queue
// (abort, destroy) may be gone when the stream gets to it.
struct Ticket {
  std::weak_ptr<void> signal;
  std::weak_ptr<void> job;
};

}  // namespace

Result<std::unique_ptr<DeviceQueue>> DeviceQueue::create(Communicator* comm, device::Api* api) {
  std::unique_ptr<DeviceQueue> q(new DeviceQueue(comm, api));
  LOOM_ASSIGN_OR_RETURN(q->word_, device::acquireGateWord(api));
  q->base_ = device::readGateWord(q->word_);
  LOOM_ASSIGN_OR_RETURN(q->stream_, api->createStream());
  q->context_ = DeviceContext{api, q->stream_, &q->scratch_, &q->events_};
  try {
    q->thread_ = std::thread([p = q.get()] { p->loop(); });
  } catch (const std::system_error& e) {
    return systemError(std::string("cannot start the device progress thread: ") + e.what());
  }
  return q;
}

DeviceQueue::DeviceQueue(Communicator* comm, device::Api* api)
    : comm_(comm), api_(api), signal_(std::make_shared<Signal>()), scratch_(api) {}

DeviceQueue::~DeviceQueue() {
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    signal_->stop = true;
    signal_->jobs.clear();
  }
  signal_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  if (word_) {
    // Nothing may stay gated on a word that changes owner.
    device::raiseGateWord(word_, base_ + signal_->submitted);
    device::releaseGateWord(api_, word_);
  }
  if (stream_) {
    (void)api_->synchronize(stream_);
    api_->destroyStream(stream_);
  }
  for (device::Event e : events_) api_->destroyEvent(e);
}

Status DeviceQueue::submit(CommRef pin, std::vector<OpDesc> ops) {
  std::vector<device::Stream> streams;
  for (const OpDesc& op : ops)
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
  for (device::Stream s : streams) {
    LOOM_ASSIGN_OR_RETURN(device::Capture capture, api_->captureStatus(s));
    if (capture != device::Capture::kNone) {
      return invalidUsage("a loom operation was called on a stream that is being captured into a CUDA graph; "
                          "loom's cuda mode cannot be captured yet: call it outside the capture");
    }
  }
  auto job = std::make_shared<Job>();
  job->pin = std::move(pin);
  job->ops = std::move(ops);
  job->waiting = int(streams.size());
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (signal_->aborted || signal_->stop) return abortedError("queuing an operation");
    job->seq = base_ + ++signal_->submitted;
    signal_->jobs.push_back(job);
  }
  // On each stream: the host function (ready once the stream's earlier
  // work is done), then the gate (later work waits for the release).
  Status queued;
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
    const bool hostFunctionQueued = st.isOk();
    if (!hostFunctionQueued) delete ticket;
    else st = api_->launchGate(s, word_, job->seq);
    if (st.isOk()) continue;
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (!hostFunctionQueued) --job->waiting;  // a queued host function counts itself
    if (queued.isOk()) queued = st;
    if (job->failed.isOk()) job->failed = st;
  }
  signal_->cv.notify_all();
  return queued;
}

Status DeviceQueue::drain(double seconds) {
  std::unique_lock<std::mutex> lock(signal_->mutex);
  const bool done = signal_->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
    return signal_->released == signal_->submitted || signal_->aborted;
  });
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
    // A running job releases everything itself once it stops: releasing
    // it now would let its stream run while it may still copy results.
    if (!signal_->running) {
      release(base_ + signal_->submitted);
      signal_->released = signal_->submitted;
    }
  }
  signal_->cv.notify_all();
}  // `dropped` unpins the communicator here, outside the lock

void DeviceQueue::release(uint64_t seq) { device::raiseGateWord(word_, seq); }

void DeviceQueue::loop() {
  // The kernels, copies and connections this thread makes belong to the
  // communicator's device.
  if (Status s = api_->setDevice(comm_->cudaDevice()); !s.isOk()) comm_->fail(s.addContext("the device progress thread"), true);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(signal_->mutex);
      signal_->cv.wait(lock, [&] {
        return signal_->stop || signal_->aborted || (!signal_->jobs.empty() && signal_->jobs.front()->waiting == 0);
      });
      if (signal_->stop || signal_->aborted) return;
      job = std::move(signal_->jobs.front());
      signal_->jobs.pop_front();
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
      if (signal_->aborted) {
        release(base_ + signal_->submitted);
        signal_->released = signal_->submitted;
      } else {
        release(job->seq);
        ++signal_->released;
      }
    }
    signal_->cv.notify_all();
    job.reset();  // unpins; the communicator may be destroyed from here on
  }
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
  }
  // Every step waited for its kernels; this only makes sure before the release.
  Status synced = api_->synchronize(stream_);
  return s.isOk() ? synced : s;
}

}  // namespace loom::core
