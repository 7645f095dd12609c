#include "tools/perf/worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tools/perf/format.h"

namespace loom::perf {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Bytes per rank exchanged to print every rank's "#  Rank ..." line.
constexpr size_t kDeviceLineBytes = 256;

// Seed of the data the timed iterations run on (nccl-tests uses 99 too);
// checks use a fresh seed each time.
constexpr uint64_t kTimingSeed = 99;

int exitCodeFor(const Status& status) {
  switch (status.code()) {
    case Code::kCudaError: return kExitCuda;
    case Code::kInvalidArgument:
    case Code::kInvalidUsage: return kExitInvalidUsage;
    case Code::kSuccess: return kExitOk;
    default: return kExitInternal;
  }
}

}  // namespace

// Evaluates an NCCL call; on failure prints nccl-tests' failure line, records
// the failure and returns. ncclInProgress is not a failure (non-blocking
// communicators); waitAll() waits for it.
#define PERF_NCCL(comm, call)                                                        \
  do {                                                                               \
    ncclResult_t perf_result_ = (call);                                              \
    if (perf_result_ != ncclSuccess && perf_result_ != ncclInProgress) {             \
      return ncclFailure(perf_result_, (comm), __LINE__);                            \
    }                                                                                \
  } while (0)

Worker::Worker(RunContext& context, int thread, std::vector<RankSlot*> slots)
    : ctx_(context),
      opts_(*context.options),
      thread_(thread),
      printer_(context.procRank == 0 && thread == 0),
      slots_(std::move(slots)) {}

void Worker::print(const std::string& text) const {
  if (printer_) std::fputs(text.c_str(), stdout);
}

Status Worker::ncclFailure(ncclResult_t result, ncclComm_t comm, int line) {
  if (ctx_.state->failed()) return RunState::stoppedByOtherFailure();
  // The communicator is still valid: nothing was aborted yet.
  const char* last = ncclGetLastError(comm);
  std::printf("%s: Test NCCL failure %s:%d '%s / %s'\n", ctx_.host.c_str(), "worker.cc", line,
              ncclGetErrorString(result), last ? last : "");
  std::fflush(stdout);
  ctx_.state->fail(kExitNccl);
  return Status(Code(result), std::string("NCCL call failed: ") + ncclGetErrorString(result));
}

Status Worker::run() {
  Status status = [&]() -> Status {
    if (opts_.parallelInit) LOOM_TRY(initComms());
    if (!ctx_.state->barrier()) return RunState::stoppedByOtherFailure();
    std::string lines;
    LOOM_TRY(exchangeDeviceLines(&lines));
    print(ctx_.headerText + lines);
    if (ctx_.maxBytes < opts_.maxBytes) {
      print("#\n# Reducing maxBytes to " + std::to_string(ctx_.maxBytes) + " due to memory limitation\n");
    }
    LOOM_TRY(allocateBuffers());
    LOOM_TRY(registerBuffers());
    print(tableHeader(opts_.reportCputime, opts_.reportTimestamps));
    LOOM_TRY(runAllTests());
    LOOM_TRY(deregisterBuffers());
    return Status::ok();
  }();
  if (!status.isOk() && !ctx_.state->failed()) {
    std::printf("%s: Test failure: %s\n", ctx_.host.c_str(), status.toString().c_str());
    std::fflush(stdout);
    ctx_.state->fail(exitCodeFor(status));
  }
  return status;
}

ncclConfig_t makeCommConfig(const Options& options) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (options.ctaPolicy >= 0) config.CTAPolicy = options.ctaPolicy;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  config.nvlinkCentricSched = 1;  // as nccl-tests built on 2.28 headers
#endif
  return config;
}

Status waitCommReady(ncclComm_t comm, RunState& state) {
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm, &async);
    if (result != ncclSuccess) return Status(Code(result), "ncclCommGetAsyncError failed");
    if (async == ncclSuccess) return Status::ok();
    if (async != ncclInProgress) return Status(Code(async), std::string("init failed: ") + ncclGetErrorString(async));
    if (state.failed()) return RunState::stoppedByOtherFailure();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status Worker::initComms() {
  ncclConfig_t config = makeCommConfig(opts_);
  RunState::BusyScope busy(*ctx_.state, thread_);
  PERF_NCCL(nullptr, ncclGroupStart());
  for (RankSlot* slot : slots_) {
    LOOM_TRY(ctx_.backend->setDevice(slot->device));
    ncclResult_t result = ncclCommInitRankConfig(&slot->comm, ctx_.totalRanks, ctx_.uniqueId, slot->rank, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      return ncclFailure(result, nullptr, __LINE__);
    }
  }
  PERF_NCCL(nullptr, ncclGroupEnd());
  for (RankSlot* slot : slots_) {
    ctx_.state->addComm(slot->comm);
    Status ready = waitCommReady(slot->comm, *ctx_.state);
    if (!ready.isOk()) return ncclFailure(ncclResult_t(ready.code()), slot->comm, __LINE__);
  }
  return Status::ok();
}

Status Worker::exchangeDeviceLines(std::string* lines) {
  if (ctx_.nProcs == 1) {
    *lines = "";  // the single process knows every line: common.cc put them in headerText
    return Status::ok();
  }
  // Every rank contributes its own line; rank 0's process prints them all.
  std::vector<Buffer> buffers;
  for (RankSlot* slot : slots_) {
    LOOM_TRY(ctx_.backend->setDevice(slot->device));
    LOOM_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(ctx_.backend, kDeviceLineBytes * (ctx_.totalRanks + 1)));
    DeviceDescription description{"host", "CPU", 0};
    if (slot->device >= 0) {
      LOOM_ASSIGN_OR_RETURN(description, ctx_.backend->describe(slot->device));
    }
    std::string line = deviceLine(slot->rank, 0, int(getpid()), ctx_.host, slot->device, description.busId,
                                  description.name);
    std::vector<char> own(kDeviceLineBytes, '\0');
    std::memcpy(own.data(), line.data(), std::min(line.size(), kDeviceLineBytes - 1));
    LOOM_TRY(ctx_.backend->copyIn(buffer.data(), own.data(), own.size()));
    buffers.push_back(std::move(buffer));
  }
  {
    RunState::BusyScope busy(*ctx_.state, thread_);
    if (slots_.size() > 1) PERF_NCCL(nullptr, ncclGroupStart());
    for (size_t i = 0; i < slots_.size(); ++i) {
      PERF_NCCL(slots_[i]->comm, ncclAllGather(buffers[i].data(), buffers[i].data() + kDeviceLineBytes,
                                               kDeviceLineBytes, ncclUint8, slots_[i]->comm, slots_[i]->stream));
    }
    if (slots_.size() > 1) PERF_NCCL(nullptr, ncclGroupEnd());
  }
  LOOM_TRY(waitAll());
  std::vector<char> all(kDeviceLineBytes * size_t(ctx_.totalRanks));
  LOOM_TRY(ctx_.backend->setDevice(slots_[0]->device));
  LOOM_TRY(ctx_.backend->copyOut(all.data(), buffers[0].data() + kDeviceLineBytes, all.size()));
  for (int r = 0; r < ctx_.totalRanks; ++r) {
    const char* line = all.data() + size_t(r) * kDeviceLineBytes;
    lines->append(line, strnlen(line, kDeviceLineBytes));
  }
  return Status::ok();
}

Status Worker::allocateBuffers() {
  size_t bytes = ctx_.maxBytes + 8 * size_t(opts_.unalign);  // room to shift by -u elements of any type
  for (RankSlot* slot : slots_) {
    LOOM_TRY(ctx_.backend->setDevice(slot->device));
    LOOM_ASSIGN_OR_RETURN(slot->send, Buffer::allocate(ctx_.backend, bytes));
    LOOM_ASSIGN_OR_RETURN(slot->recv, Buffer::allocate(ctx_.backend, bytes));
    LOOM_ASSIGN_OR_RETURN(slot->scratch, Buffer::allocate(ctx_.backend, 2 * sizeof(double)));
  }
  return Status::ok();
}

Status Worker::registerBuffers() {
  if (opts_.localRegister == 0) return Status::ok();
  RunState::BusyScope busy(*ctx_.state, thread_);
  PERF_NCCL(nullptr, ncclGroupStart());
  for (RankSlot* slot : slots_) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    if (opts_.localRegister == 2 && ctx_.libraryVersion >= NCCL_VERSION(2, 27, 0)) {
      PERF_NCCL(slot->comm, ncclCommWindowRegister(slot->comm, slot->send.data(), ctx_.maxBytes,
                                                   reinterpret_cast<ncclWindow_t*>(&slot->sendHandle),
                                                   NCCL_WIN_COLL_SYMMETRIC));
      PERF_NCCL(slot->comm, ncclCommWindowRegister(slot->comm, slot->recv.data(), ctx_.maxBytes,
                                                   reinterpret_cast<ncclWindow_t*>(&slot->recvHandle),
                                                   NCCL_WIN_COLL_SYMMETRIC));
      continue;
    }
#endif
    PERF_NCCL(slot->comm, ncclCommRegister(slot->comm, slot->send.data(), ctx_.maxBytes, &slot->sendHandle));
    PERF_NCCL(slot->comm, ncclCommRegister(slot->comm, slot->recv.data(), ctx_.maxBytes, &slot->recvHandle));
  }
  PERF_NCCL(nullptr, ncclGroupEnd());
  return Status::ok();
}

Status Worker::deregisterBuffers() {
  if (opts_.localRegister == 0) return Status::ok();
  for (RankSlot* slot : slots_) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    if (opts_.localRegister == 2 && ctx_.libraryVersion >= NCCL_VERSION(2, 27, 0)) {
      PERF_NCCL(slot->comm, ncclCommWindowDeregister(slot->comm, static_cast<ncclWindow_t>(slot->sendHandle)));
      PERF_NCCL(slot->comm, ncclCommWindowDeregister(slot->comm, static_cast<ncclWindow_t>(slot->recvHandle)));
      continue;
    }
#endif
    PERF_NCCL(slot->comm, ncclCommDeregister(slot->comm, slot->sendHandle));
    PERF_NCCL(slot->comm, ncclCommDeregister(slot->comm, slot->recvHandle));
  }
  return Status::ok();
}

Status Worker::runAllTests() {
  const Collective& coll = *ctx_.collective;
  std::vector<const TypeInfo*> types;
  if (opts_.type) {
    types.push_back(&typeInfo(*opts_.type));
  } else {
    for (const TypeInfo& type : allTypes()) types.push_back(&type);
  }
  std::vector<Op> ops;
  if (coll.opUse() == OpUse::kNone) {
    ops.push_back(Op::kNone);
  } else if (opts_.op) {
    ops.push_back(*opts_.op);
  } else {
    ops.assign(allOps().begin(), allOps().end());
  }
  std::vector<int> roots;
  if (!coll.hasRoot()) {
    roots.push_back(-1);
  } else if (opts_.root == -1) {
    for (int r = 0; r < ctx_.totalRanks; ++r) roots.push_back(r);
  } else {
    roots.push_back(opts_.root);
  }
  for (const TypeInfo* type : types) {
    for (Op op : ops) {
      for (int root : roots) LOOM_TRY(timeTest(*type, op, root));
    }
  }
  return Status::ok();
}

void Worker::setupSize(uint64_t bytes) {
  sizeBytes_ = bytes;
  counts_ = ctx_.collective->counts(bytes / type_->size, type_->size, ctx_.totalRanks);
  // Where each call's buffers start (startColl): computed once per size, so
  // that a call costs one division, as in nccl-tests' loop.
  shiftBytes_ = std::max(counts_.send, counts_.recv) * type_->size;
  shiftSteps_ = shiftBytes_ ? std::max<uint64_t>(ctx_.maxBytes / shiftBytes_, 1) : 1;
  // Each slot's call at shift 0, out of place and in place: a call then
  // only moves the two pointers.
  const size_t size = type_->size;
  calls_.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const RankSlot* slot = slots_[i];
    char* sendBase = slot->send.data() + size_t(opts_.unalign) * size;
    char* recvBase = slot->recv.data() + size_t(opts_.unalign) * size;
    const uint64_t rank = uint64_t(slot->rank);
    for (bool inPlace : {false, true}) {
      RunArgs& args = calls_[i][inPlace];
      args = RunArgs{};
      args.send = inPlace ? recvBase + counts_.sendInplaceOffset * rank * size : sendBase;
      args.recv = recvBase + (inPlace ? counts_.recvInplaceOffset * rank * size : 0);
      args.count = counts_.param;
      args.type = type_->type;
      args.op = op_ == Op::kMulSum && slot->hasPreMulOp ? slot->preMulOp : builtinRedOp(op_);
      args.root = root_;
      args.rank = slot->rank;
      args.nranks = ctx_.totalRanks;
      args.elementSize = size;
      args.libraryVersion = ctx_.libraryVersion;
      args.comm = slot->comm;
      args.stream = slot->stream;
    }
  }
}

Status Worker::timeTest(const TypeInfo& type, Op op, int root) {
  type_ = &type;
  op_ = op;
  root_ = root;
  LOOM_TRY(barrier());
  if (op == Op::kMulSum && ctx_.collective->opUse() == OpUse::kReduce) LOOM_TRY(createPreMulOps());

  // Warm-up over all sizes, doubling, out-of-place.
  for (uint64_t size = opts_.minBytes; size <= ctx_.maxBytes; size = size ? size * 2 : 1) {
    setupSize(size);
    for (int iter = 0; iter < opts_.warmupIters; ++iter) LOOM_TRY(startColl(iter, false));
    LOOM_TRY(completeColl());
    if (size > ctx_.maxBytes / 2) break;
  }

  const char* label = ctx_.collective->opUse() == OpUse::kNone ? "none" : opName(op);
  long repeat = opts_.runCycles;  // 0: forever
  do {
    for (uint64_t size = opts_.minBytes; size <= ctx_.maxBytes;) {
      setupSize(size);
      uint64_t shownBytes = std::max(counts_.send, counts_.recv) * type.size;
      print(rowPrefix(shownBytes, counts_.param, type.name, label, root));
      LOOM_TRY(benchTime(false));
      LOOM_TRY(benchTime(true));
      print((opts_.reportTimestamps ? rowTimestamp() : std::string()) + "\n");
      uint64_t next = opts_.stepFactor > 1 ? size * opts_.stepFactor : size + opts_.stepBytes;
      if (next <= size) break;  // overflow
      size = next;
    }
  } while (--repeat != 0);

  if (op == Op::kMulSum && ctx_.collective->opUse() == OpUse::kReduce) LOOM_TRY(destroyPreMulOps());
  return Status::ok();
}

Status Worker::benchTime(bool inPlace) {
  const Collective& coll = *ctx_.collective;
  const bool checked = opts_.check > 0 && (!inPlace || coll.checksInPlace());
  if (checked) LOOM_TRY(prepareData(kTimingSeed, inPlace));

  LOOM_TRY(startColl(0, inPlace));
  LOOM_TRY(completeColl());
  LOOM_TRY(barrier());

  const int aggIters = opts_.aggIters;
  double collOnly = 0;
  Clock::time_point start = Clock::now();
  for (int iter = 0; iter < opts_.iters; ++iter) {
    // A clock read per call only where -z 3 times each call on its own:
    // otherwise the loop reads none, as nccl-tests' does.
    Clock::time_point iterStart = opts_.blocking == 3 ? Clock::now() : start;
    if (aggIters > 1) PERF_NCCL(nullptr, ncclGroupStart());
    for (int a = 0; a < aggIters; ++a) LOOM_TRY(startColl(iter * aggIters + a, inPlace));
    if (aggIters > 1) {
      RunState::BusyScope busy(*ctx_.state, thread_);
      PERF_NCCL(nullptr, ncclGroupEnd());
    }
    if (opts_.blocking == 3) {
      LOOM_TRY(waitAll());
      collOnly += secondsSince(iterStart);
      LOOM_TRY(barrier());
    }
  }
  const double ops = double(opts_.iters) * aggIters;
  double cpuSeconds = (opts_.blocking == 3 ? collOnly : secondsSince(start)) / ops;
  LOOM_TRY(completeColl());
  double seconds = (opts_.blocking == 3 ? collOnly : secondsSince(start)) / ops;

  static constexpr Combine kModes[] = {Combine::kRank0, Combine::kAverage, Combine::kMin, Combine::kMax};
  LOOM_ASSIGN_OR_RETURN(seconds, combine(std::vector<double>(slots_.size(), seconds), kModes[opts_.average]));
  double algBw = coll.algorithmBytes(counts_.param, type_->size, ctx_.totalRanks) / 1.0e9 / seconds;
  double busBw = algBw * coll.busFactor(ctx_.totalRanks);
  LOOM_TRY(barrier());

  int64_t wrong = 0;
  for (int c = 0; checked && c < opts_.check; ++c) {
    LOOM_TRY(prepareData(++seedCounter_, inPlace));
    LOOM_TRY(startColl(0, inPlace));
    LOOM_TRY(completeColl());
    LOOM_ASSIGN_OR_RETURN(int64_t local, countWrong(inPlace));
    std::vector<double> perSlot(slots_.size(), 0.0);
    perSlot[0] = double(local);
    LOOM_ASSIGN_OR_RETURN(double total, combine(perSlot, Combine::kSum));
    wrong = int64_t(total);
    if (wrong != 0) break;
  }

  double timeUs = (opts_.reportCputime ? cpuSeconds : seconds) * 1.0e6;
  print(rowBody(timeUs, algBw, busBw, checked, wrong, opts_.timeDecimals));
  if (thread_ == 0) {
    ctx_.busBwSum += busBw;
    ++ctx_.busBwCount;
    if (checked && wrong != 0) ++ctx_.outOfBounds;
  }
  return Status::ok();
}

Status Worker::startColl(int iter, bool inPlace) {
  const Collective& coll = *ctx_.collective;
  // Move the buffers each iteration, like nccl-tests, to defeat caches and
  // expose races with earlier operations.
  const uint64_t shift = shiftBytes_ * (uint64_t(iter) % shiftSteps_);
  RunState::BusyScope busy(*ctx_.state, thread_);
  const bool grouped = slots_.size() > 1;
  if (grouped) PERF_NCCL(nullptr, ncclGroupStart());
  for (const auto& calls : calls_) {
    RunArgs args = calls[inPlace];
    args.send = static_cast<const char*>(args.send) + shift;
    args.recv = static_cast<char*>(args.recv) + shift;
    ncclResult_t result = coll.run(args);
    if (result != ncclSuccess && result != ncclInProgress) {
      if (grouped) ncclGroupEnd();
      return ncclFailure(result, args.comm, __LINE__);
    }
  }
  if (grouped) PERF_NCCL(nullptr, ncclGroupEnd());
  if (opts_.blocking) {
    LOOM_TRY(waitAll());
    if (opts_.blocking == 1) LOOM_TRY(barrier());
  }
  return Status::ok();
}

Status Worker::completeColl() {
  if (opts_.blocking && opts_.aggIters <= 1) return Status::ok();  // startColl already waited
  return waitAll();
}

Status Worker::waitAll() {
  RunState::BusyScope busy(*ctx_.state, thread_);
  std::vector<bool> done(slots_.size(), false);
  for (;;) {
    bool allDone = true;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (done[i]) continue;
      RankSlot* slot = slots_[i];
      bool streamDone = true;
      if (ctx_.backend->isDevice()) {
        LOOM_TRY(ctx_.backend->setDevice(slot->device));
        LOOM_ASSIGN_OR_RETURN(streamDone, ctx_.backend->streamDone(slot->stream));
      }
      ncclResult_t async = ncclSuccess;
      PERF_NCCL(slot->comm, ncclCommGetAsyncError(slot->comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) return ncclFailure(async, slot->comm, __LINE__);
      if (streamDone && async == ncclSuccess) {
        done[i] = true;
      } else {
        allDone = false;
      }
    }
    if (allDone) return Status::ok();
    if (ctx_.state->failed()) return RunState::stoppedByOtherFailure();
    std::this_thread::yield();
  }
}

Status Worker::barrier() {
  if (ctx_.nProcs > 1) {
    // Processes meet through the library: an allreduce every rank joins.
    return combine(std::vector<double>(slots_.size(), 0.0), Combine::kSum).takeStatus();
  }
  RunState::BusyScope busy(*ctx_.state, thread_);
  if (!ctx_.state->barrier()) return RunState::stoppedByOtherFailure();
  return Status::ok();
}

Result<double> Worker::combine(const std::vector<double>& perSlot, Combine mode) {
  if (ctx_.totalRanks == 1) return perSlot[0];
  ncclRedOp_t op = mode == Combine::kMin ? ncclMin : mode == Combine::kMax ? ncclMax : ncclSum;
  for (size_t i = 0; i < slots_.size(); ++i) {
    // kRank0: global rank 0 gives its value, everyone else 0, and a sum.
    double value = mode == Combine::kRank0 && slots_[i]->rank != 0 ? 0.0 : perSlot[i];
    LOOM_TRY(ctx_.backend->setDevice(slots_[i]->device));
    LOOM_TRY(ctx_.backend->copyIn(slots_[i]->scratch.data(), &value, sizeof value));
  }
  {
    RunState::BusyScope busy(*ctx_.state, thread_);
    const bool grouped = slots_.size() > 1;
    if (grouped) PERF_NCCL(nullptr, ncclGroupStart());
    for (RankSlot* slot : slots_) {
      PERF_NCCL(slot->comm, ncclAllReduce(slot->scratch.data(), slot->scratch.data() + sizeof(double), 1,
                                          ncclFloat64, op, slot->comm, slot->stream));
    }
    if (grouped) PERF_NCCL(nullptr, ncclGroupEnd());
  }
  LOOM_TRY(waitAll());
  double result = 0;
  LOOM_TRY(ctx_.backend->setDevice(slots_[0]->device));
  LOOM_TRY(ctx_.backend->copyOut(&result, slots_[0]->scratch.data() + sizeof(double), sizeof result));
  if (mode == Combine::kAverage) result /= ctx_.totalRanks;
  return result;
}

Status Worker::prepareData(uint64_t seed, bool inPlace) {
  const Collective& coll = *ctx_.collective;
  const size_t size = type_->size;
  const Op dataOp = coll.opUse() == OpUse::kReduce ? op_ : Op::kNone;
  for (RankSlot* slot : slots_) {
    const uint64_t rank = uint64_t(slot->rank);
    std::vector<char> input(counts_.send * size, 0);
    DataArgs args{GenSpec{type_, dataOp, ctx_.totalRanks, seed}, slot->rank, root_, counts_, input.data(), nullptr};
    coll.fillInput(args);

    // Host image of the receive buffer as the op will find it.
    const uint64_t recvOffset = inPlace ? counts_.recvInplaceOffset * rank : 0;
    std::vector<char> image;
    if (inPlace) {
      const uint64_t sendOffset = counts_.sendInplaceOffset * rank;
      image.assign(std::max(recvOffset + counts_.recv, sendOffset + counts_.send) * size, 0);
      std::copy(input.begin(), input.end(), image.begin() + std::ptrdiff_t(sendOffset * size));
    } else {
      image.assign(counts_.recv * size, 0);
    }
    char* sendBase = slot->send.data() + size_t(opts_.unalign) * size;
    char* recvBase = slot->recv.data() + size_t(opts_.unalign) * size;
    LOOM_TRY(ctx_.backend->setDevice(slot->device));
    if (!inPlace) LOOM_TRY(ctx_.backend->copyIn(sendBase, input.data(), input.size()));
    LOOM_TRY(ctx_.backend->copyIn(recvBase, image.data(), image.size()));

    auto first = image.begin() + std::ptrdiff_t(recvOffset * size);
    slot->expected.assign(first, first + std::ptrdiff_t(counts_.recv * size));
    args.expected = slot->expected.data();
    coll.fillExpected(args);
  }
  return Status::ok();
}

Result<int64_t> Worker::countWrong(bool inPlace) {
  const size_t size = type_->size;
  const Op dataOp = ctx_.collective->opUse() == OpUse::kReduce ? op_ : Op::kNone;
  int64_t wrong = 0;
  for (RankSlot* slot : slots_) {
    uint64_t recvOffset = inPlace ? counts_.recvInplaceOffset * uint64_t(slot->rank) : 0;
    const char* result = slot->recv.data() + (size_t(opts_.unalign) + recvOffset) * size;
    std::vector<char> actual(counts_.recv * size);
    LOOM_TRY(ctx_.backend->setDevice(slot->device));
    LOOM_TRY(ctx_.backend->copyOut(actual.data(), result, actual.size()));
    wrong += countMismatches(*type_, dataOp, actual.data(), slot->expected.data(), counts_.recv);
  }
  return wrong;
}

Status Worker::createPreMulOps() {
  for (RankSlot* slot : slots_) {
    uint64_t scalar = preMulScalarBits(*type_, slot->rank);  // one element, little-endian
    PERF_NCCL(slot->comm, ncclRedOpCreatePreMulSum(&slot->preMulOp, &scalar, type_->type, ncclScalarHostImmediate,
                                                   slot->comm));
    slot->hasPreMulOp = true;
  }
  return Status::ok();
}

Status Worker::destroyPreMulOps() {
  for (RankSlot* slot : slots_) {
    if (!slot->hasPreMulOp) continue;
    slot->hasPreMulOp = false;
    PERF_NCCL(slot->comm, ncclRedOpDestroy(slot->preMulOp, slot->comm));
  }
  return Status::ok();
}

}  // namespace loom::perf
