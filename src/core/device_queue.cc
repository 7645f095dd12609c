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

// Bytes each buffer of `op` covers on this rank; 0 when the rank does not
// use that buffer (a non-root's Broadcast input, say).
void bufferBytes(const OpDesc& op, int rank, int nranks, size_t* send, size_t* recv) {
  const size_t one = op.count * kernels::dataTypeSize(op.type);
  const size_t all = one * size_t(nranks);
  const bool root = rank == op.root;
  *send = *recv = 0;
  switch (op.kind) {
    case OpKind::kAllReduce: *send = *recv = one; break;
    case OpKind::kAllGather: *send = one; *recv = all; break;
    case OpKind::kReduceScatter: *send = all; *recv = one; break;
    case OpKind::kBroadcast: *send = root ? one : 0; *recv = one; break;
    case OpKind::kReduce: *send = one; *recv = root ? one : 0; break;
    case OpKind::kAllToAll: *send = *recv = all; break;
    case OpKind::kGather: *send = one; *recv = root ? all : 0; break;
    case OpKind::kScatter: *send = root ? all : 0; *recv = one; break;
    case OpKind::kSend: *send = one; break;
    case OpKind::kRecv: *recv = one; break;
  }
}

// A run of user memory staged as one piece (overlapping buffers, in-place
// operations, share one).
struct Range {
  const std::byte* begin;
  const std::byte* end;
  bool written;
  size_t offset = 0;  // in the staging buffer
};

constexpr size_t kStagingAlign = 256;

}  // namespace

Result<std::unique_ptr<DeviceQueue>> DeviceQueue::create(Communicator* comm, device::Api* api) {
  std::unique_ptr<DeviceQueue> q(new DeviceQueue(comm, api));
  LOOM_ASSIGN_OR_RETURN(q->word_, device::acquireGateWord(api));
  q->base_ = device::readGateWord(q->word_);
  LOOM_ASSIGN_OR_RETURN(q->stream_, api->createStream());
  try {
    q->thread_ = std::thread([p = q.get()] { p->loop(); });
  } catch (const std::system_error& e) {
    return systemError(std::string("cannot start the device progress thread: ") + e.what());
  }
  return q;
}

DeviceQueue::DeviceQueue(Communicator* comm, device::Api* api)
    : comm_(comm), api_(api), signal_(std::make_shared<Signal>()) {}

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
  if (staging_) api_->freeHost(staging_);
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
  const int rank = comm_->rank(), n = comm_->nranks();
  // Device-resident PreMulSum scalars: read now, after the stream's earlier work.
  std::vector<OpDesc> ops = job.ops;
  bool readScalar = false;
  for (OpDesc& op : ops) {
    if (!op.scalarPtr) continue;
    LOOM_TRY(api_->copyAsync(&op.reduction.scalar, op.scalarPtr, kernels::dataTypeSize(op.type), stream_));
    op.scalarPtr = nullptr;
    readScalar = true;
  }
  if (readScalar) LOOM_TRY(api_->synchronize(stream_));

  // The user memory the operations touch, merged into ranges.
  std::vector<Range> spans;
  for (const OpDesc& op : ops) {
    size_t send = 0, recv = 0;
    bufferBytes(op, rank, n, &send, &recv);
    const auto* s = static_cast<const std::byte*>(op.sendbuf);
    const auto* r = static_cast<const std::byte*>(op.recvbuf);
    if (send > 0 && s) spans.push_back({s, s + send, false});
    if (recv > 0 && r) spans.push_back({r, r + recv, true});
  }
  std::sort(spans.begin(), spans.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> ranges;
  for (const Range& s : spans) {
    if (!ranges.empty() && s.begin < ranges.back().end) {
      ranges.back().end = std::max(ranges.back().end, s.end);
      ranges.back().written = ranges.back().written || s.written;
    } else {
      ranges.push_back(s);
    }
  }
  size_t total = 0;
  for (Range& r : ranges) {
    r.offset = total;
    total += (size_t(r.end - r.begin) + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  }
  if (total > stagingBytes_) {
    const size_t want = std::max(total, stagingBytes_ * 2);
    if (staging_) api_->freeHost(staging_);
    staging_ = nullptr;
    stagingBytes_ = 0;
    LOOM_ASSIGN_OR_RETURN(staging_, api_->allocHost(want));
    stagingBytes_ = want;
  }

  // In: every range (an output range too: a rank may write only part of it).
  auto* base = static_cast<std::byte*>(staging_);
  for (const Range& r : ranges) LOOM_TRY(api_->copyAsync(base + r.offset, r.begin, size_t(r.end - r.begin), stream_));
  LOOM_TRY(api_->synchronize(stream_));

  // The host engine on the staged copies.
  auto toHost = [&](const void* p, size_t bytes) -> std::byte* {
    const auto* b = static_cast<const std::byte*>(p);
    if (bytes == 0 || !b) return nullptr;
    for (const Range& r : ranges)
      if (b >= r.begin && b < r.end) return base + r.offset + size_t(b - r.begin);
    return nullptr;
  };
  std::vector<PendingOp> pending;
  for (OpDesc op : ops) {
    size_t send = 0, recv = 0;
    bufferBytes(op, rank, n, &send, &recv);
    op.sendbuf = toHost(op.sendbuf, send);
    op.recvbuf = toHost(op.recvbuf, recv);
    pending.push_back(PendingOp{job.pin, op});
  }
  LOOM_TRY(runPlannedOps(std::move(pending)));

  // Out: the ranges holding outputs.
  for (const Range& r : ranges) {
    if (!r.written) continue;
    LOOM_TRY(api_->copyAsync(const_cast<std::byte*>(r.begin), base + r.offset, size_t(r.end - r.begin), stream_));
  }
  return api_->synchronize(stream_);
}

}  // namespace loom::core
