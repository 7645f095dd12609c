// loom as a torch.distributed backend for CPU tensors (a c10d::Backend).
//
// torch's ProcessGroup hands each collective of the group to this backend.
// A worker thread per backend runs them one after another, in the order the
// Python program issued them (the order every rank issues them in), on a
// host-mode loom communicator; each call returns a Work whose future
// completes when the worker is done, so DDP overlaps its gradient buckets'
// AllReduce with the rest of the backward pass as it does on gloo.
//
// The plugin holds its own copy of loom, linked in with every symbol local
// (see CMakeLists.txt): the nccl* functions called here are loom's even in a
// process where torch has loaded NVIDIA's libnccl.so.2 for its CUDA tensors
// (backend="cpu:loom,cuda:nccl").
#include <loom/loom.h>
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom_torch {
namespace {

using c10d::OpType;
using c10d::ReduceOp;

[[noreturn]] void fail(const std::string& what) {
  C10_THROW_ERROR(DistBackendError, "loom: " + what);
}

// Throws loom's message for a failed call.
void check(ncclResult_t r, ncclComm_t comm, const char* call) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(call) + " failed: " + ncclGetErrorString(r);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') msg.append(": ").append(detail);
  fail(msg);
}

// ---- tensors and types --------------------------------------------------

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "loom: ", what, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "loom: ", what, " is on ", t.device(),
                    "; the loom backend takes CPU tensors (use backend=\"cpu:loom,cuda:nccl\" for CUDA tensors)");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "loom: ", what, " is not a dense (strided) tensor; ", t.layout(),
                    " tensors are not supported");
}

// How a tensor of `type` travels: a loom type and the number of its
// elements per tensor element.
struct Wire {
  ncclDataType_t type = ncclUint8;
  int64_t perElement = 1;
};

bool nativeType(at::ScalarType s, ncclDataType_t* type) {
  switch (s) {
    case at::kFloat: *type = ncclFloat32; return true;
    case at::kDouble: *type = ncclFloat64; return true;
    case at::kHalf: *type = ncclFloat16; return true;
    case at::kBFloat16: *type = ncclBfloat16; return true;
    case at::kChar: *type = ncclInt8; return true;
    case at::kByte: *type = ncclUint8; return true;
    case at::kBool: *type = ncclUint8; return true;
    case at::kInt: *type = ncclInt32; return true;
    case at::kLong: *type = ncclInt64; return true;
    case at::kUInt32: *type = ncclUint32; return true;
    case at::kUInt64: *type = ncclUint64; return true;
    case at::kFloat8_e4m3fn: *type = ncclFloat8e4m3; return true;
    case at::kFloat8_e5m2: *type = ncclFloat8e5m2; return true;
    default: return false;
  }
}

// Moving data without arithmetic: any type goes, as its bytes where loom
// has no type for it.
Wire copyWire(at::ScalarType s) {
  Wire w;
  if (!nativeType(s, &w.type)) {
    w.type = ncclUint8;
    w.perElement = int64_t(c10::elementSize(s));
  }
  return w;
}

// A reduction operator on the communicator; custom ones (PREMUL_SUM) are
// destroyed with it.
class RedOp {
 public:
  RedOp() = default;
  RedOp(const RedOp&) = delete;
  RedOp& operator=(const RedOp&) = delete;
  ~RedOp() {
    if (comm_ != nullptr) ncclRedOpDestroy(op_, comm_);
  }
  ncclRedOp_t get() const { return op_; }
  void set(ncclRedOp_t op) { op_ = op; }
  void setCustom(ncclRedOp_t op, ncclComm_t comm) {
    op_ = op;
    comm_ = comm;
  }

 private:
  ncclRedOp_t op_ = ncclSum;
  ncclComm_t comm_ = nullptr;
};

const char* opName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// What a reduction needs, checked on the calling thread so that a bad
// argument raises at the call.
struct Reduction {
  Wire wire;
  ReduceOp reduceOp;
  bool complexAsReal = false;
};

Reduction reduction(at::ScalarType s, const ReduceOp& op) {
  Reduction r;
  r.reduceOp = op;
  const ReduceOp::RedOpType kind = op.op_;
  TORCH_CHECK_VALUE(kind == ReduceOp::SUM || kind == ReduceOp::AVG || kind == ReduceOp::PRODUCT ||
                        kind == ReduceOp::MIN || kind == ReduceOp::MAX || kind == ReduceOp::PREMUL_SUM,
                    "loom: ReduceOp.", opName(kind), " is not supported (SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM are)");
  if (at::isComplexType(s)) {
    TORCH_CHECK_VALUE(kind == ReduceOp::SUM || kind == ReduceOp::AVG || kind == ReduceOp::PREMUL_SUM, "loom: ReduceOp.",
                      opName(kind), " is not defined on complex tensors (", s, ")");
    r.complexAsReal = true;
    s = c10::toRealValueType(s);
    r.wire.perElement = 2;
  }
  TORCH_CHECK_VALUE(nativeType(s, &r.wire.type), "loom: no reduction on ", s, " tensors (loom reduces float, double, ",
                    "half, bfloat16, float8, int8, uint8, bool, int32, int64, uint32, uint64)");
  if (s == at::kBool) {
    TORCH_CHECK_VALUE(kind != ReduceOp::AVG && kind != ReduceOp::PREMUL_SUM, "loom: ReduceOp.", opName(kind),
                      " is not defined on bool tensors");
  }
  if (kind == ReduceOp::PREMUL_SUM) {
    TORCH_CHECK_VALUE(at::isFloatingType(s), "loom: PREMUL_SUM needs a floating-point tensor, not ", s);
    TORCH_CHECK_VALUE(op.supplement_.defined(), "loom: PREMUL_SUM without its factor");
  }
  return r;
}

// Builds the loom operator for `r` on `comm` (on the worker, which owns it).
void makeOp(const Reduction& r, ncclComm_t comm, at::ScalarType scalarType, RedOp* out) {
  switch (r.reduceOp.op_) {
    case ReduceOp::SUM: out->set(scalarType == at::kBool ? ncclMax : ncclSum); return;  // bool: logical or
    case ReduceOp::PRODUCT: out->set(scalarType == at::kBool ? ncclMin : ncclProd); return;  // logical and
    case ReduceOp::MIN: out->set(ncclMin); return;
    case ReduceOp::MAX: out->set(ncclMax); return;
    case ReduceOp::AVG: out->set(ncclAvg); return;
    case ReduceOp::PREMUL_SUM: {
      const auto* sup = dynamic_cast<const c10d::PreMulSumSupplement*>(r.reduceOp.supplement_.get());
      TORCH_CHECK_VALUE(sup != nullptr, "loom: PREMUL_SUM's factor is of an unknown kind");
      const at::ScalarType real = r.complexAsReal ? c10::toRealValueType(scalarType) : scalarType;
      // The factor, as one element of the tensor's (real) type.
      at::Tensor factor = sup->tensor_factor.defined()
                              ? sup->tensor_factor.detach().to(at::kCPU).to(real).reshape({1}).contiguous()
                              : at::full({1}, sup->double_factor, at::TensorOptions().dtype(real));
      ncclRedOp_t op;
      check(ncclRedOpCreatePreMulSum(&op, factor.data_ptr(), r.wire.type, ncclScalarHostImmediate, comm), comm,
            "ncclRedOpCreatePreMulSum");
      out->setCustom(op, comm);
      return;
    }
    default: fail(std::string("ReduceOp.") + opName(r.reduceOp.op_) + " is not supported");
  }
}

// A tensor as a flat buffer: itself when contiguous, else a contiguous copy
// that writeBack() copies into the tensor.
class Flat {
 public:
  explicit Flat(const at::Tensor& t) : tensor_(t), flat_(t.is_contiguous() ? t : t.contiguous()) {}
  void* data() const { return flat_.data_ptr(); }
  int64_t numel() const { return flat_.numel(); }
  void writeBack() {
    if (!flat_.is_same(tensor_)) tensor_.copy_(flat_);
  }

 private:
  at::Tensor tensor_;
  at::Tensor flat_;
};

size_t count(int64_t numel, const Wire& w) { return size_t(numel * w.perElement); }

// ---- work -----------------------------------------------------------------

// One operation: completed with the tensors it wrote (what DDP's reducer
// reads from the future) or the error.
class LoomWork : public c10d::Work {
 public:
  LoomWork(int rank, OpType type, std::vector<at::Tensor> outputs, uint64_t seq)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
        seq_(seq) {}

  // The future first (its callbacks run here), then wait()'s waiters: after
  // wait() the future has its value, as with gloo.
  void complete(const std::exception_ptr& error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  uint64_t seq_;
};

// Joins `t` unless the caller is `t` (a future's callback that ends its
// backend), which can only let it go.
void joinOrDetach(std::thread& t) {
  if (!t.joinable()) return;
  if (t.get_id() == std::this_thread::get_id()) {
    t.detach();
  } else {
    t.join();
  }
}

// Completes works off the worker: their futures' callbacks (DDP's, or a
// comm hook that waits for another collective of the same group, as
// PowerSGD's does) must not hold the worker that has to run that
// collective. A callback that blocks keeps its thread; the next completion
// gets another one (a few at most).
class Completions {
 public:
  Completions() = default;
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;
  ~Completions() { stop(); }

  void push(c10::intrusive_ptr<LoomWork> work, std::exception_ptr error) {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back({std::move(work), std::move(error)});
    if (idle_ == 0 && threads_.size() < kMaxThreads) {
      threads_.emplace_back([this] { run(); });
    } else {
      lock.unlock();
      cv_.notify_one();
    }
  }

  // Completes what is queued, then ends the threads.
  void stop() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) joinOrDetach(t);
  }

 private:
  static constexpr size_t kMaxThreads = 4;
  struct Item {
    c10::intrusive_ptr<LoomWork> work;
    std::exception_ptr error;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      item.work->complete(item.error);
      item = Item{};  // the work's last reference may go here, unlocked
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// Runs the backend's jobs one at a time, in the order they were given: on
// its thread, or, for a caller that would only wait for the result (a
// synchronous call), on the caller's thread when nothing is queued or
// running (no thread hand-off: the small-message latency). A job runs with
// the thread-local state (grad mode, inference mode...) of the thread that
// gave it, as gloo's do.
class Worker {
 public:
  using Job = std::function<void()>;

  Worker() : thread_([this] { run(); }) {}
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() { stop(); }

  void push(c10::intrusive_ptr<LoomWork> work, Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      TORCH_CHECK(!stopping_, "loom: the backend has been shut down");
      queue_.push_back({std::move(work), std::move(job), at::ThreadLocalState()});
    }
    cv_.notify_one();
  }

  // Runs `job` on the calling thread if the worker is idle, completing
  // `work` here too; false (nothing run) if it is not, and the job must be
  // pushed.
  bool runHere(const c10::intrusive_ptr<LoomWork>& work, const Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      TORCH_CHECK(!stopping_, "loom: the backend has been shut down");
      if (busy_ || !queue_.empty()) return false;
      busy_ = true;
    }
    const std::exception_ptr error = execute(job);
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      wake = stopping_ || !queue_.empty();  // else the thread sleeps on: no switch per call
    }
    if (wake) cv_.notify_one();
    work->complete(error);  // after the release: a callback may issue the next call
    return true;
  }

  // Runs the queued jobs, completes their works, then ends the threads.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    joinOrDetach(thread_);
    completions_.stop();
  }

 private:
  struct Item {
    c10::intrusive_ptr<LoomWork> work;
    Job job;
    at::ThreadLocalState state;
  };

  static std::exception_ptr execute(const Job& job) {
    try {
      job();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !busy_ && (stopping_ || !queue_.empty()); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::exception_ptr error;
      {
        at::ThreadLocalStateGuard guard(item.state);
        error = execute(item.job);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      completions_.push(std::move(item.work), error);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;  // a job runs (here or on a caller's thread)
  bool stopping_ = false;
  Completions completions_;
  std::thread thread_;  // last: starts after the members it uses
};

// ---- the backend ----------------------------------------------------------

constexpr const char* kBackendName = "loom";

// The group timeout as loom's (whole seconds are not required).
double toSeconds(std::chrono::milliseconds t) { return double(t.count()) / 1000.0; }

// Runs one job on a fresh thread-local buffer mode: host.
ncclResult_t initHostComm(ncclComm_t* comm, int size, const ncclUniqueId& id, int rank) {
  check(loomSetBufferMode(loomBufferModeHost), nullptr, "loomSetBufferMode");
  const ncclResult_t r = ncclCommInitRank(comm, size, id, rank);
  (void)loomSetBufferMode(loomBufferModeDefault);
  return r;
}

class LoomBackend : public c10d::Backend {
 public:
  LoomBackend(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout)
      : Backend(rank, size),
        comm_(comm),
        options_(c10::make_intrusive<Backend::Options>(kBackendName, timeout)),
        worker_(std::make_unique<Worker>()) {
    setTimeoutOnComm(timeout);
  }

  ~LoomBackend() override { close(false); }

  // A new communicator for the group: rank 0 makes the unique id and
  // publishes it in the group's store, as ProcessGroupNCCL does.
  static c10::intrusive_ptr<LoomBackend> fromStore(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   std::chrono::milliseconds timeout) {
    TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "loom: rank ", rank, " of ", size, " is not a rank");
    ncclUniqueId id;
    static const std::string kKey = "loom_unique_id";
    if (rank == 0) {
      check(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
      const auto* bytes = reinterpret_cast<const uint8_t*>(id.internal);
      store->set(kKey, std::vector<uint8_t>(bytes, bytes + sizeof id.internal));
    } else {
      const std::vector<uint8_t> bytes = store->get(kKey);
      TORCH_CHECK(bytes.size() == sizeof id.internal, "loom: the store's ", kKey, " has ", bytes.size(),
                  " bytes, not ", sizeof id.internal, " (another backend wrote that key?)");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclComm_t comm = nullptr;
    check(initHostComm(&comm, size, id, rank), nullptr, "ncclCommInitRank");
    return c10::make_intrusive<LoomBackend>(comm, rank, size, timeout);
  }

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<Backend::Options> getBackendOptions() override { return options_; }

  void setTimeout(std::chrono::milliseconds timeout) override {
    options_->timeout = timeout;
    setTimeoutOnComm(timeout);
  }

  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10d::ErrorType getError() override {
    ncclComm_t comm = handle();
    if (comm == nullptr) return c10d::ErrorType::COMM_ERROR;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return c10d::ErrorType::COMM_ERROR;
    if (state == ncclSuccess || state == ncclInProgress) return c10d::ErrorType::SUCCESS;
    return state == ncclRemoteError ? c10d::ErrorType::REMOTE_ERROR : c10d::ErrorType::COMM_ERROR;
  }

  // ---- collectives ----

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK_VALUE(!opts.sparseIndices.has_value(), "loom: sparse allreduce is not supported");
    const at::Tensor t = single(tensors, "allreduce");
    const Reduction red = reduction(t.scalar_type(), opts.reduceOp);
    return enqueue(OpType::ALLREDUCE, opts.asyncOp, {t}, [this, t, red](ncclComm_t comm) { allreduceOne(comm, t, red); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK_VALUE(!tensors.empty(), "loom: allreduce_coalesced of no tensors");
    std::vector<Reduction> reds;
    for (const at::Tensor& t : tensors) {
      checkTensor(t, "allreduce_coalesced's tensor");
      reds.push_back(reduction(t.scalar_type(), opts.reduceOp));
    }
    return enqueue(OpType::ALLREDUCE_COALESCED, opts.asyncOp, tensors, [this, tensors, reds](ncclComm_t comm) {
      std::vector<std::unique_ptr<Flat>> flats;  // before the group: alive until it ends
      std::vector<std::unique_ptr<RedOp>> ops;
      Grouped group(comm);
      for (size_t i = 0; i < tensors.size(); ++i) {
        flats.push_back(std::make_unique<Flat>(asWireTensor(tensors[i], reds[i])));
        ops.push_back(std::make_unique<RedOp>());
        makeOp(reds[i], comm, tensors[i].scalar_type(), ops.back().get());
        check(ncclAllReduce(flats[i]->data(), flats[i]->data(), count(flats[i]->numel(), reds[i].wire), reds[i].wire.type,
                            ops[i]->get(), comm, nullptr),
              comm, "ncclAllReduce");
      }
      group.end();
      for (auto& f : flats) f->writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast");
    const int root = checkRoot(opts.rootRank, "broadcast");
    TORCH_CHECK_VALUE(opts.rootTensor == 0, "loom: rootTensor must be 0 (one tensor per rank)");
    return enqueue(OpType::BROADCAST, opts.asyncOp, {t}, [t, root](ncclComm_t comm) {
      const Wire w = copyWire(t.scalar_type());
      Flat f(t);
      check(ncclBroadcast(f.data(), f.data(), count(f.numel(), w), w.type, root, comm, nullptr), comm, "ncclBroadcast");
      f.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce");
    const int root = checkRoot(opts.rootRank, "reduce");
    TORCH_CHECK_VALUE(opts.rootTensor == 0, "loom: rootTensor must be 0 (one tensor per rank)");
    const Reduction red = reduction(t.scalar_type(), opts.reduceOp);
    return enqueue(OpType::REDUCE, opts.asyncOp, {t}, [this, t, red, root](ncclComm_t comm) {
      Flat f(asWireTensor(t, red));
      RedOp op;
      makeOp(red, comm, t.scalar_type(), &op);
      check(ncclReduce(f.data(), f.data(), count(f.numel(), red.wire), red.wire.type, op.get(), root, comm, nullptr),
            comm, "ncclReduce");
      if (getRank() == root) f.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK_VALUE(outputs.size() == 1, "loom: allgather takes one output list, not ", outputs.size());
    const std::vector<at::Tensor> outs = outputs[0];
    checkList(outs, in, "allgather");
    return enqueue(OpType::ALLGATHER, opts.asyncOp, outs, [this, in, outs](ncclComm_t comm) { allgatherList(comm, in, outs); });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    checkFlatPair(output, input, "all_gather_into_tensor", /*outputIsBig=*/true);
    const at::Tensor out = output, in = input;
    return enqueue(OpType::_ALLGATHER_BASE, opts.asyncOp, {out}, [in, out](ncclComm_t comm) {
      const Wire w = copyWire(in.scalar_type());
      const at::Tensor src = in.contiguous();
      Flat dst(out);
      check(ncclAllGather(src.data_ptr(), dst.data(), count(src.numel(), w), w.type, comm, nullptr), comm,
            "ncclAllGather");
      dst.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(outputLists.size() == inputs.size(), "loom: allgather_coalesced has ", inputs.size(),
                      " inputs but ", outputLists.size(), " output lists");
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkTensor(inputs[i], "allgather_coalesced's input");
      checkList(outputLists[i], inputs[i], "allgather_coalesced");
      all.insert(all.end(), outputLists[i].begin(), outputLists[i].end());
    }
    const std::vector<std::vector<at::Tensor>> lists = outputLists;
    const std::vector<at::Tensor> ins = inputs;
    return enqueue(OpType::ALLGATHER_COALESCED, opts.asyncOp, all, [this, lists, ins](ncclComm_t comm) {
      std::vector<at::Tensor> flats, srcs;
      {
        Grouped group(comm);
        for (size_t i = 0; i < ins.size(); ++i) flats.push_back(startAllgather(comm, ins[i], &srcs));
        group.end();
      }
      for (size_t i = 0; i < ins.size(); ++i) unpack(flats[i], lists[i]);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "loom: allgather_into_tensor_coalesced has ", inputs.size(),
                      " inputs but ", outputs.size(), " outputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkFlatPair(outputs[i], inputs[i], "allgather_into_tensor_coalesced", /*outputIsBig=*/true);
    }
    const std::vector<at::Tensor> outs = outputs, ins = inputs;
    return enqueue(OpType::COALESCED, opts.asyncOp, outs, [outs, ins](ncclComm_t comm) {
      std::vector<at::Tensor> srcs;
      std::vector<std::unique_ptr<Flat>> dsts;
      Grouped group(comm);
      for (size_t i = 0; i < ins.size(); ++i) {
        const Wire w = copyWire(ins[i].scalar_type());
        srcs.push_back(ins[i].contiguous());
        dsts.push_back(std::make_unique<Flat>(outs[i]));
        check(ncclAllGather(srcs[i].data_ptr(), dsts[i]->data(), count(srcs[i].numel(), w), w.type, comm, nullptr),
              comm, "ncclAllGather");
      }
      group.end();
      for (auto& d : dsts) d->writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor in = single(inputs, "gather");
    const int root = checkRoot(opts.rootRank, "gather");
    const std::vector<at::Tensor> outs = rootList(outputs, in, root, "gather", "output");
    return enqueue(OpType::GATHER, opts.asyncOp, outs, [this, in, outs, root](ncclComm_t comm) {
      const Wire w = copyWire(in.scalar_type());
      const at::Tensor src = in.contiguous();
      at::Tensor flat;
      if (getRank() == root) flat = at::empty({getSize() * src.numel()}, src.options());
      check(ncclGather(src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, count(src.numel(), w), w.type, root,
                       comm, nullptr),
            comm, "ncclGather");
      if (flat.defined()) unpack(flat, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "scatter");
    const int root = checkRoot(opts.rootRank, "scatter");
    const std::vector<at::Tensor> ins = rootList(inputs, out, root, "scatter", "input");
    return enqueue(OpType::SCATTER, opts.asyncOp, {out}, [this, out, ins, root](ncclComm_t comm) {
      const Wire w = copyWire(out.scalar_type());
      at::Tensor flat;
      if (getRank() == root) flat = pack(ins);
      Flat dst(out);
      check(ncclScatter(flat.defined() ? flat.data_ptr() : nullptr, dst.data(), count(dst.numel(), w), w.type, root,
                        comm, nullptr),
            comm, "ncclScatter");
      dst.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK_VALUE(inputs.size() == 1, "loom: reduce_scatter takes one input list, not ", inputs.size());
    const std::vector<at::Tensor> ins = inputs[0];
    checkList(ins, out, "reduce_scatter");
    const Reduction red = reduction(out.scalar_type(), opts.reduceOp);
    return enqueue(OpType::REDUCE_SCATTER, opts.asyncOp, {out}, [this, out, ins, red](ncclComm_t comm) {
      reduceScatterOne(comm, out, pack(ins), red);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    checkFlatPair(output, input, "reduce_scatter_tensor", /*outputIsBig=*/false);
    const Reduction red = reduction(output.scalar_type(), opts.reduceOp);
    const at::Tensor out = output, in = input;
    return enqueue(OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, {out}, [this, out, in, red](ncclComm_t comm) {
      reduceScatterOne(comm, out, in, red);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "loom: reduce_scatter_tensor_coalesced has ", inputs.size(),
                      " inputs but ", outputs.size(), " outputs");
    std::vector<Reduction> reds;
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkFlatPair(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced", /*outputIsBig=*/false);
      reds.push_back(reduction(outputs[i].scalar_type(), opts.reduceOp));
    }
    const std::vector<at::Tensor> outs = outputs, ins = inputs;
    return enqueue(OpType::COALESCED, opts.asyncOp, outs, [this, outs, ins, reds](ncclComm_t comm) {
      std::vector<at::Tensor> srcs;
      std::vector<std::unique_ptr<Flat>> dsts;
      std::vector<std::unique_ptr<RedOp>> ops;
      Grouped group(comm);
      for (size_t i = 0; i < ins.size(); ++i) {
        srcs.push_back(asWireTensor(ins[i], reds[i]).contiguous());
        dsts.push_back(std::make_unique<Flat>(asWireTensor(outs[i], reds[i])));
        ops.push_back(std::make_unique<RedOp>());
        makeOp(reds[i], comm, outs[i].scalar_type(), ops.back().get());
        check(ncclReduceScatter(srcs[i].data_ptr(), dsts[i]->data(), count(dsts[i]->numel(), reds[i].wire),
                                reds[i].wire.type, ops[i]->get(), comm, nullptr),
              comm, "ncclReduceScatter");
      }
      group.end();
      for (auto& d : dsts) d->writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override {
    checkTensor(output, "alltoall's output");
    checkTensor(input, "alltoall's input");
    TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "loom: alltoall's output is ", output.scalar_type(),
                     " but its input is ", input.scalar_type());
    const std::vector<int64_t> inOffsets = splitOffsets(input, inputSplits, "input");
    const std::vector<int64_t> outOffsets = splitOffsets(output, outputSplits, "output");
    const at::Tensor out = output, in = input;
    return enqueue(OpType::ALLTOALL_BASE, opts.asyncOp, {out}, [this, out, in, inOffsets, outOffsets](ncclComm_t comm) {
      const Wire w = copyWire(in.scalar_type());
      Flat dst(out);
      at::Tensor src = in.contiguous();
      if (src.data_ptr() == dst.data()) src = src.clone();  // loom's AllToAll needs two buffers
      const int n = getSize();
      const int64_t block = inOffsets[1];
      bool even = true;
      for (int r = 0; r <= n; ++r) {
        even = even && inOffsets[size_t(r)] == block * r && outOffsets[size_t(r)] == block * r;
      }
      if (even) {
        check(ncclAlltoAll(src.data_ptr(), dst.data(), count(inOffsets[1], w), w.type, comm, nullptr), comm,
              "ncclAlltoAll");
      } else {
        const size_t elem = c10::elementSize(in.scalar_type());
        auto* sbase = static_cast<const char*>(src.data_ptr());
        auto* rbase = static_cast<char*>(dst.data());
        Grouped group(comm);
        for (int r = 0; r < n; ++r) {
          const size_t rr = size_t(r);
          check(ncclSend(sbase + size_t(inOffsets[rr]) * elem, count(inOffsets[rr + 1] - inOffsets[rr], w), w.type, r,
                         comm, nullptr),
                comm, "ncclSend");
          check(ncclRecv(rbase + size_t(outOffsets[rr]) * elem, count(outOffsets[rr + 1] - outOffsets[rr], w), w.type,
                         r, comm, nullptr),
                comm, "ncclRecv");
        }
        group.end();
      }
      dst.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const size_t n = size_t(getSize());
    TORCH_CHECK_VALUE(outputs.size() == n && inputs.size() == n, "loom: alltoall takes ", n,
                      " input and output tensors (one per rank), not ", inputs.size(), " and ", outputs.size());
    for (size_t r = 0; r < n; ++r) {
      checkTensor(inputs[r], "alltoall's input");
      checkTensor(outputs[r], "alltoall's output");
      TORCH_CHECK_TYPE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                           outputs[r].scalar_type() == inputs[0].scalar_type(),
                       "loom: alltoall's tensors must all be of one type");
    }
    const std::vector<at::Tensor> outs = outputs, ins = inputs;
    return enqueue(OpType::ALLTOALL, opts.asyncOp, outs, [outs, ins](ncclComm_t comm) {
      const Wire w = copyWire(ins[0].scalar_type());
      std::vector<at::Tensor> srcs;
      std::vector<std::unique_ptr<Flat>> dsts;
      Grouped group(comm);
      for (size_t r = 0; r < ins.size(); ++r) {
        srcs.push_back(ins[r].contiguous());
        dsts.push_back(std::make_unique<Flat>(outs[r]));
        check(ncclSend(srcs[r].data_ptr(), count(srcs[r].numel(), w), w.type, int(r), comm, nullptr), comm, "ncclSend");
        check(ncclRecv(dsts[r]->data(), count(dsts[r]->numel(), w), w.type, int(r), comm, nullptr), comm, "ncclRecv");
      }
      group.end();
      for (auto& d : dsts) d->writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int /*tag*/) override {
    const at::Tensor t = single(tensors, "send");
    const int peer = checkRoot(dstRank, "send's destination");
    if (coalescing_) return record(true, t, peer);
    return enqueue(OpType::SEND, true, {t}, [t, peer](ncclComm_t comm) {
      const Wire w = copyWire(t.scalar_type());
      const at::Tensor src = t.contiguous();
      check(ncclSend(src.data_ptr(), count(src.numel(), w), w.type, peer, comm, nullptr), comm, "ncclSend");
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int /*tag*/) override {
    const at::Tensor t = single(tensors, "recv");
    const int peer = checkRoot(srcRank, "recv's source");
    if (coalescing_) return record(false, t, peer);
    return enqueue(OpType::RECV, true, {t}, [t, peer](ncclComm_t comm) {
      const Wire w = copyWire(t.scalar_type());
      Flat f(t);
      check(ncclRecv(f.data(), count(f.numel(), w), w.type, peer, comm, nullptr), comm, "ncclRecv");
      f.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) override {
    TORCH_CHECK(false, "loom: recv from any source is not supported (NCCL has no such receive); name the source rank");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kByte));
    return enqueue(OpType::BARRIER, opts.asyncOp, {}, [token](ncclComm_t comm) {
      check(ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclUint8, ncclSum, comm, nullptr), comm,
            "ncclAllReduce (barrier)");
    });
  }

  // ---- coalescing (batch_isend_irecv) ----
  // Sends and receives between startCoalescing and endCoalescing run as one
  // loom group, so that pairs that wait for each other (every rank sending
  // to one neighbour and receiving from the other) make progress whatever
  // their size. A lone send larger than the transport's buffer waits for
  // its receive, as in NCCL.

  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "loom: startCoalescing while already coalescing");
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "loom: endCoalescing without startCoalescing");
    coalescing_ = false;
    std::vector<PeerOp> ops = std::exchange(pending_, {});
    std::vector<c10::intrusive_ptr<LoomWork>> works = std::exchange(pendingWorks_, {});
    std::vector<at::Tensor> received;
    for (const PeerOp& op : ops) {
      if (!op.send) received.push_back(op.tensor);
    }
    return enqueue(OpType::COALESCED, true, received, [ops, works](ncclComm_t comm) {
      try {
        std::vector<at::Tensor> sends;  // before the group: alive until it ends
        std::deque<Flat> recvs;
        {
          Grouped group(comm);
          for (const PeerOp& op : ops) {
            const Wire w = copyWire(op.tensor.scalar_type());
            if (op.send) {
              sends.push_back(op.tensor.contiguous());
              check(ncclSend(sends.back().data_ptr(), count(sends.back().numel(), w), w.type, op.peer, comm, nullptr),
                    comm, "ncclSend");
            } else {
              recvs.emplace_back(op.tensor);
              check(ncclRecv(recvs.back().data(), count(recvs.back().numel(), w), w.type, op.peer, comm, nullptr),
                    comm, "ncclRecv");
            }
          }
          group.end();
        }
        for (Flat& f : recvs) f.writeBack();
      } catch (...) {
        for (const auto& w : works) w->complete(std::current_exception());
        throw;
      }
      for (const auto& w : works) w->complete(nullptr);
    });
  }

  // ---- splitting (new_group / split_group over ncclCommSplit) ----

  bool supportsSplitting() const override { return true; }

  // ProcessGroup::splitGroup: `ranks` are ranks of this group, in the new
  // group's order; every rank of this group calls it.
  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<c10d::Store>& /*store*/, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Backend::Options>& opts) override {
    const auto it = std::find(ranks.begin(), ranks.end(), getRank());
    if (it == ranks.end()) {
      splitComm(NCCL_SPLIT_NOCOLOR, getRank());
      return nullptr;
    }
    const std::chrono::milliseconds timeout = opts ? opts->timeout : options_->timeout;
    return splitChild(*std::min_element(ranks.begin(), ranks.end()), int(it - ranks.begin()), int(ranks.size()),
                      timeout);
  }

  // The color is the smallest member's rank in this group: disjoint groups
  // never share one.
  c10::intrusive_ptr<LoomBackend> splitChild(int color, int key, int size, std::chrono::milliseconds timeout) {
    ncclComm_t child = splitComm(color, key);
    TORCH_CHECK(child != nullptr, "loom: ncclCommSplit gave no communicator to a member");
    int childSize = 0;
    check(ncclCommCount(child, &childSize), child, "ncclCommCount");
    if (childSize != size) {
      ncclCommAbort(child);
      fail("the split made a group of " + std::to_string(childSize) + " ranks, not " + std::to_string(size) +
           " (do all ranks pass the same groups?)");
    }
    return c10::make_intrusive<LoomBackend>(child, key, size, timeout);
  }

  // A split this rank takes no part in (NCCL_SPLIT_NOCOLOR); ProcessGroupNCCL's name.
  void performNocolorSplit() { splitComm(NCCL_SPLIT_NOCOLOR, getRank()); }

  // ---- ending ----

  void abort() override { close(true); }
  void shutdown() override { close(false); }

 private:
  // A group of loom calls, ended in scope; after a failure the calls
  // recorded so far are dropped, not run (the buffers they name must outlive
  // the group: declare them before it).
  class Grouped {
   public:
    explicit Grouped(ncclComm_t comm) : comm_(comm) { check(ncclGroupStart(), comm, "ncclGroupStart"); }
    Grouped(const Grouped&) = delete;
    Grouped& operator=(const Grouped&) = delete;
    ~Grouped() {
      if (open_) {
        ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
        (void)ncclGroupSimulateEnd(&sim);
      }
    }
    void end() {
      open_ = false;
      check(ncclGroupEnd(), comm_, "ncclGroupEnd");
    }

   private:
    ncclComm_t comm_;
    bool open_ = true;
  };

  ncclComm_t handle() {
    std::lock_guard<std::mutex> lock(commMu_);
    return comm_;
  }

  void setTimeoutOnComm(std::chrono::milliseconds timeout) {
    ncclComm_t comm = handle();
    if (comm != nullptr) check(loomCommSetTimeout(comm, std::max(0.0, toSeconds(timeout))), comm, "loomCommSetTimeout");
  }

  const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
    TORCH_CHECK_VALUE(tensors.size() == 1, "loom: ", what, " takes one tensor per rank, not ", tensors.size());
    checkTensor(tensors[0], what);
    return tensors[0];
  }

  int checkRoot(int64_t root, const char* what) {
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "loom: ", what, " rank ", root, " is not in this group of ",
                      getSize());
    return int(root);
  }

  // A list of one tensor per rank, each like `like`.
  void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what) {
    TORCH_CHECK_VALUE(list.size() == size_t(getSize()), "loom: ", what, " takes a list of ", getSize(),
                      " tensors (one per rank), not ", list.size());
    for (const at::Tensor& t : list) {
      checkTensor(t, what);
      TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), "loom: ", what, "'s list holds ", t.scalar_type(),
                       " but the tensor is ", like.scalar_type());
      TORCH_CHECK_VALUE(t.numel() == like.numel(), "loom: ", what, "'s list holds a tensor of ", t.numel(),
                        " elements but the tensor has ", like.numel());
    }
  }

  // Gather's outputs or scatter's inputs: one list of one tensor per rank,
  // each like `like`, on the root; nothing elsewhere.
  std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& like, int root,
                                   const char* what, const char* side) {
    if (getRank() != root) {
      TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "loom: ", what, "'s ", side,
                        "s are given on the root only");
      return {};
    }
    TORCH_CHECK_VALUE(lists.size() == 1, "loom: ", what, "'s root takes one ", side, " list, not ", lists.size());
    checkList(lists[0], like, what);
    return lists[0];
  }

  // Output and input of the flat collectives: one is getSize() times the other.
  void checkFlatPair(const at::Tensor& output, const at::Tensor& input, const char* what, bool outputIsBig) {
    checkTensor(output, what);
    checkTensor(input, what);
    TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "loom: ", what, "'s output is ", output.scalar_type(),
                     " but its input is ", input.scalar_type());
    const int64_t big = outputIsBig ? output.numel() : input.numel();
    const int64_t small = outputIsBig ? input.numel() : output.numel();
    TORCH_CHECK_VALUE(big == small * getSize(), "loom: ", what, ": the ", outputIsBig ? "output" : "input", " has ",
                      big, " elements, not ", getSize(), " x ", small);
  }

  // Offsets in elements of each rank's block along dim 0 (n + 1 values).
  std::vector<int64_t> splitOffsets(const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    const int64_t n = getSize();
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
    std::vector<int64_t> offsets(size_t(n) + 1, 0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % n == 0, "loom: alltoall's ", what, " has ", rows, " rows, not a multiple of ", n,
                        "; give split sizes");
      for (int64_t r = 0; r <= n; ++r) offsets[size_t(r)] = r * (rows / n) * rowElems;
      return offsets;
    }
    TORCH_CHECK_VALUE(int64_t(splits.size()) == n, "loom: alltoall's ", what, " split sizes have ", splits.size(),
                      " entries, not ", n);
    for (int64_t r = 0; r < n; ++r) {
      TORCH_CHECK_VALUE(splits[size_t(r)] >= 0, "loom: alltoall's ", what, " split size ", splits[size_t(r)],
                        " is negative");
      offsets[size_t(r) + 1] = offsets[size_t(r)] + splits[size_t(r)] * rowElems;
    }
    TORCH_CHECK_VALUE(offsets.back() == t.numel(), "loom: alltoall's ", what, " split sizes add up to ",
                      offsets.back() / std::max<int64_t>(rowElems, 1), " rows but the tensor has ", rows);
    return offsets;
  }

  // The tensor seen as loom's reduction type (complex as its real pairs).
  static at::Tensor asWireTensor(const at::Tensor& t, const Reduction& red) {
    return red.complexAsReal ? at::view_as_real(t) : t;
  }

  void allreduceOne(ncclComm_t comm, const at::Tensor& t, const Reduction& red) {
    Flat f(asWireTensor(t, red));
    RedOp op;
    makeOp(red, comm, t.scalar_type(), &op);
    check(ncclAllReduce(f.data(), f.data(), count(f.numel(), red.wire), red.wire.type, op.get(), comm, nullptr), comm,
          "ncclAllReduce");
    f.writeBack();
  }

  void reduceScatterOne(ncclComm_t comm, const at::Tensor& out, const at::Tensor& in, const Reduction& red) {
    const at::Tensor src = asWireTensor(in, red).contiguous();
    Flat dst(asWireTensor(out, red));
    RedOp op;
    makeOp(red, comm, out.scalar_type(), &op);
    check(ncclReduceScatter(src.data_ptr(), dst.data(), count(dst.numel(), red.wire), red.wire.type, op.get(), comm,
                            nullptr),
          comm, "ncclReduceScatter");
    dst.writeBack();
  }

  // An AllGather of `in` into a new flat tensor (inside a group or alone);
  // `keep` holds its source until the group ends.
  at::Tensor startAllgather(ncclComm_t comm, const at::Tensor& in, std::vector<at::Tensor>* keep) {
    const Wire w = copyWire(in.scalar_type());
    const at::Tensor src = in.contiguous();
    at::Tensor flat = at::empty({getSize() * src.numel()}, src.options());
    check(ncclAllGather(src.data_ptr(), flat.data_ptr(), count(src.numel(), w), w.type, comm, nullptr), comm,
          "ncclAllGather");
    keep->push_back(src);
    return flat;
  }

  void allgatherList(ncclComm_t comm, const at::Tensor& in, const std::vector<at::Tensor>& outs) {
    std::vector<at::Tensor> keep;
    unpack(startAllgather(comm, in, &keep), outs);
  }

  // Block r of `flat` into outs[r].
  static void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
    int64_t offset = 0;
    for (const at::Tensor& o : outs) {
      o.copy_(flat.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
  }

  static at::Tensor pack(const std::vector<at::Tensor>& ins) {
    std::vector<at::Tensor> flat;
    flat.reserve(ins.size());
    for (const at::Tensor& t : ins) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
  }

  ncclComm_t splitComm(int color, int key) {
    ncclComm_t child = nullptr;
    auto work = enqueue(OpType::UNKNOWN, false, {}, [&child, color, key](ncclComm_t comm) {
      check(ncclCommSplit(comm, color, key, &child, nullptr), comm, "ncclCommSplit");
    });
    work->wait();
    return child;
  }

  // Queues `job` on the worker; it gets the communicator, or fails if the
  // backend was aborted or shut down.
  // A send or receive between startCoalescing and endCoalescing: its work
  // completes with the group's.
  c10::intrusive_ptr<c10d::Work> record(bool isSend, const at::Tensor& t, int peer) {
    pending_.push_back(PeerOp{isSend, t, peer});
    auto work = c10::make_intrusive<LoomWork>(getRank(), isSend ? OpType::SEND : OpType::RECV,
                                              std::vector<at::Tensor>{t}, ++seq_);
    pendingWorks_.push_back(work);
    return work;
  }

  // `async`: the caller may do other work before waiting (the collective's
  // asyncOp); otherwise it may run right here.
  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, bool async, std::vector<at::Tensor> outputs,
                                         std::function<void(ncclComm_t)> job) {
    TORCH_CHECK(!coalescing_ || type == OpType::COALESCED,
                "loom: only send and recv can be coalesced (batch_isend_irecv); end the coalescing first");
    auto work = c10::make_intrusive<LoomWork>(getRank(), type, std::move(outputs), ++seq_);
    Worker::Job run = [this, job = std::move(job)] {
      ncclComm_t comm = handle();
      if (comm == nullptr) fail("the communicator was aborted or shut down");
      job(comm);
    };
    if (async || !worker_->runHere(work, run)) worker_->push(work, std::move(run));
    return work;
  }

  // Abort: in-flight and queued work fails at once (revoke), then the
  // communicator goes. Shutdown: queued work runs to its end first.
  void close(bool abortNow) {
    if (abortNow) {
      if (ncclComm_t comm = handle()) (void)ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    }
    worker_->stop();
    ncclComm_t comm;
    {
      std::lock_guard<std::mutex> lock(commMu_);
      comm = comm_;
      comm_ = nullptr;
    }
    if (comm == nullptr) return;
    ncclResult_t state = ncclSuccess;
    const bool healthy = !abortNow && ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclSuccess;
    if (healthy) {
      (void)ncclCommDestroy(comm);
    } else {
      (void)ncclCommAbort(comm);
    }
  }

  struct PeerOp {
    bool send;
    at::Tensor tensor;
    int peer;
  };

  std::mutex commMu_;
  ncclComm_t comm_;  // null once aborted or shut down
  bool coalescing_ = false;  // the calling thread's, like torch's coalescing state
  std::vector<PeerOp> pending_;
  std::vector<c10::intrusive_ptr<LoomWork>> pendingWorks_;
  c10::intrusive_ptr<Backend::Options> options_;
  std::atomic<uint64_t> seq_{0};
  std::unique_ptr<Worker> worker_;  // last: its thread stops before the rest goes
};

// The creator torch.distributed calls for each group (extended API).
c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                const std::vector<int64_t>& globalRanks,
                                                const c10::intrusive_ptr<c10d::Backend>& splitFrom) {
  // torch offers the bound device's backend to split; for a CUDA device
  // that is another backend (backend="cpu:loom,cuda:nccl"): then the group
  // meets through its store.
  auto* parent = splitFrom ? dynamic_cast<LoomBackend*>(splitFrom.get()) : nullptr;
  if (parent != nullptr) {
    TORCH_CHECK_VALUE(!globalRanks.empty(), "loom: a split needs the new group's ranks");
    const int64_t color = *std::min_element(globalRanks.begin(), globalRanks.end());
    return parent->splitChild(int(color), rank, size, timeout);
  }
  return LoomBackend::fromStore(store, rank, size, timeout);
}

}  // namespace
}  // namespace loom_torch

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using loom_torch::LoomBackend;
  m.doc() = "loom's torch.distributed backend for CPU tensors (import loom_torch to register it)";
  py::class_<LoomBackend, c10d::Backend, c10::intrusive_ptr<LoomBackend>>(m, "LoomBackend")
      .def("perform_nocolor_split",
           [](LoomBackend& self, const py::object& /*device*/) { self.performNocolorSplit(); },
           py::call_guard<py::gil_scoped_release>())
      .def("comm_timeout", [](LoomBackend& self) { return self.getBackendOptions()->timeout; });
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         const std::vector<int64_t>& globalRanks, const py::object& splitFrom) {
        c10::intrusive_ptr<c10d::Backend> parent;
        if (!splitFrom.is_none()) parent = splitFrom.cast<c10::intrusive_ptr<c10d::Backend>>();
        py::gil_scoped_release release;  // init waits for the other ranks
        return loom_torch::createBackend(store, rank, size, timeout, globalRanks, parent);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_ranks"),
      py::arg("split_from"));
  m.def("version", [] {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  });
}
