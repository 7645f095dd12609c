#include "tools/perf/common.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "loom/version.h"
#include "tools/perf/backend.h"
#include "tools/perf/environment.h"
#include "tools/perf/format.h"
#include "tools/perf/options.h"
#include "tools/perf/run_state.h"
#include "tools/perf/worker.h"

namespace loom::perf {
namespace {

const char* baseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Host buffers unless LOOM_DEVICE asks otherwise and a CUDA device is usable
// (the library's LOOM_DEVICE=auto makes the same choice).
Result<std::unique_ptr<Backend>> selectBackend(const LaunchEnv& env) {
  if (env.deviceMode == "host") return makeHostBackend();
  std::string why;
  std::unique_ptr<Backend> cuda = makeCudaBackend(&why);
  if (cuda) return cuda;
  if (env.deviceMode == "cuda") return invalidUsage("LOOM_DEVICE=cuda but no CUDA buffers are possible: " + why);
  return makeHostBackend();
}

class PerfRun {
 public:
  PerfRun(const Options& options, const Collective& collective, const LaunchEnv& env,
          std::unique_ptr<Backend> backend, const char* programName)
      : options_(options), env_(env), backend_(std::move(backend)), state_(options.nThreads) {
    ctx_.options = &options_;
    ctx_.collective = &collective;
    ctx_.env = &env_;
    ctx_.backend = backend_.get();
    ctx_.state = &state_;
    ctx_.programName = programName;
    ctx_.host = shortHostName();
    ctx_.nThreads = options.nThreads;
    ctx_.nGpus = options.nGpus;
    ctx_.nProcs = env.nProcs;
    ctx_.procRank = env.procRank;
    ctx_.totalRanks = env.nProcs * options.nThreads * options.nGpus;
    ctx_.maxBytes = options.maxBytes;
  }

  int execute();

 private:
  Status setupSlots();
  Status limitMaxBytes();
  Status initCommsInMainThread();
  std::string headerText();
  void runThreads();
  Status destroyComms();
  Status finalBarrier();
  int finish();
  Status reportFailure(const Status& status, int exitCode);

  const Options& options_;
  const LaunchEnv& env_;
  std::unique_ptr<Backend> backend_;
  RunState state_;
  RunContext ctx_{};
  std::vector<std::unique_ptr<RankSlot>> slots_;
  bool sharedDevices_ = false;  // more ranks than GPUs: they share
  int64_t freeBeforeInit_ = -1;
  int64_t freeAfterInit_ = -1;
};

Status PerfRun::reportFailure(const Status& status, int exitCode) {
  if (!state_.failed()) {
    std::printf("%s: Test failure: %s\n", ctx_.host.c_str(), status.message().c_str());
    std::fflush(stdout);
    state_.fail(exitCode);
  }
  return status;
}

Status PerfRun::setupSlots() {
  const int local = options_.nThreads * options_.nGpus;
  const int firstDevice = env_.firstDevice.value_or(env_.localRank * local);
  const int devices = backend_->isDevice() ? backend_->deviceCount() : 0;
  if (backend_->isDevice() && devices == 0) return invalidUsage("no CUDA device");
  // nccl-tests gives each rank of a host its own GPU and stops when there
  // are too few; loom lets ranks share one, so the devices wrap around.
  sharedDevices_ = backend_->isDevice() && firstDevice + local > devices;
  for (int i = 0; i < local; ++i) {
    auto slot = std::make_unique<RankSlot>();
    slot->rank = env_.procRank * local + i;
    slot->device = backend_->isDevice() ? (firstDevice + i) % devices : -1;
    LOOM_TRY(backend_->setDevice(slot->device));
    LOOM_ASSIGN_OR_RETURN(slot->stream, backend_->createStream(options_.streamNull));
    slots_.push_back(std::move(slot));
  }
  return Status::ok();
}

// nccl-tests' rule: keep 1 GiB per 16 GiB (at most 4 GiB) plus 1 GiB free,
// and fit send, receive (and, when checking, expected) buffers in the rest.
Status PerfRun::limitMaxBytes() {
  if (!backend_->isDevice()) return Status::ok();
  uint64_t smallest = ~uint64_t(0);
  for (const auto& slot : slots_) {
    LOOM_ASSIGN_OR_RETURN(DeviceDescription description, backend_->describe(slot->device));
    smallest = std::min(smallest, description.totalMemory);
  }
  const uint64_t gib = uint64_t(1) << 30;
  uint64_t reserve = std::min((smallest + 16 * gib - 1) / (16 * gib) * gib, 4 * gib);
  if (smallest <= reserve + gib) return invalidUsage("the CUDA device has too little memory for the test buffers");
  uint64_t limit = (smallest - reserve - gib) / (options_.check ? 3 : 2);
  if (ctx_.maxBytes > limit) ctx_.maxBytes = limit;
  return Status::ok();
}

Status PerfRun::initCommsInMainThread() {
  ncclConfig_t config = makeCommConfig(options_);
  ncclResult_t result = ncclGroupStart();
  for (size_t i = 0; i < slots_.size() && result == ncclSuccess; ++i) {
    LOOM_TRY(backend_->setDevice(slots_[i]->device));
    result = ncclCommInitRankConfig(&slots_[i]->comm, ctx_.totalRanks, ctx_.uniqueId, slots_[i]->rank, &config);
    if (result == ncclInProgress) result = ncclSuccess;
  }
  ncclResult_t endResult = ncclGroupEnd();
  if (result == ncclSuccess && endResult != ncclInProgress) result = endResult;
  if (result != ncclSuccess) {
    std::printf("%s: Test NCCL failure %s:%d '%s / %s'\n", ctx_.host.c_str(), "common.cc", __LINE__,
                ncclGetErrorString(result), ncclGetLastError(nullptr));
    std::fflush(stdout);
    state_.fail(kExitNccl);
    return Status(Code(result), "communicator initialisation failed");
  }
  for (const auto& slot : slots_) {
    state_.addComm(slot->comm);
    Status ready = waitCommReady(slot->comm, state_);
    if (!ready.isOk()) return reportFailure(ready, kExitNccl);
  }
  return Status::ok();
}

std::string PerfRun::headerText() {
  RunDescription run{};
  run.programName = ctx_.programName;
  run.toolsVersion = LOOM_VERSION_STRING;
  run.headerVersion = NCCL_VERSION_CODE;
  run.libraryVersion = ctx_.libraryVersion;
  run.nThreads = options_.nThreads;
  run.nGpus = options_.nGpus;
  run.minBytes = options_.minBytes;
  run.maxBytes = ctx_.maxBytes;
  run.stepBytes = options_.stepBytes;
  run.stepFactor = options_.stepFactor;
  run.warmupIters = options_.warmupIters;
  run.iters = options_.iters;
  run.aggIters = options_.aggIters;
  run.check = options_.check;
  run.graphLaunches = 0;
  run.unalign = options_.unalign;
  run.blocking = options_.blocking;
  run.parallelInit = options_.parallelInit;
  std::string text = runHeader(run);
  for (const std::string& note : options_.ignoredNotes) text += "# note: " + note + "\n";
  if (options_.memoryReport && !backend_->isDevice()) {
    text += "# note: -M 1: host buffers use no device memory; no memory report\n";
  }
  if (sharedDevices_) text += "# note: more ranks than GPUs on this host: ranks share GPUs (loom allows it)\n";
  text += "# Using devices\n";
  if (env_.nProcs == 1) {  // several processes exchange their lines once connected
    for (const auto& slot : slots_) {
      DeviceDescription description{"host", "CPU", 0};
      if (slot->device >= 0) {
        Result<DeviceDescription> found = backend_->describe(slot->device);
        if (found.isOk()) description = found.value();
      }
      text += deviceLine(slot->rank, 0, int(getpid()), ctx_.host, slot->device, description.busId, description.name);
    }
  }
  return text;
}

void PerfRun::runThreads() {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < options_.nThreads; ++t) {
    std::vector<RankSlot*> mine;
    for (int g = 0; g < options_.nGpus; ++g) mine.push_back(slots_[size_t(t * options_.nGpus + g)].get());
    workers.push_back(std::make_unique<Worker>(ctx_, t, std::move(mine)));
  }
  std::vector<std::thread> threads;
  for (int t = 1; t < options_.nThreads; ++t) {
    threads.emplace_back([&workers, t] { workers[size_t(t)]->run().ignore(); });
  }
  workers[0]->run().ignore();
  for (std::thread& thread : threads) thread.join();
}

Status PerfRun::destroyComms() {
  for (const auto& slot : slots_) {
    if (slot->comm == nullptr) continue;
    LOOM_TRY(backend_->setDevice(slot->device));
    ncclResult_t result = ncclCommDestroy(slot->comm);
    slot->comm = nullptr;
    if (result != ncclSuccess) {
      std::printf("%s: Test NCCL failure %s:%d '%s / %s'\n", ctx_.host.c_str(), "common.cc", __LINE__,
                  ncclGetErrorString(result), ncclGetLastError(nullptr));
      return Status(Code(result), "ncclCommDestroy failed");
    }
  }
  return Status::ok();
}

// Every process waits here until rank 0's process has printed the footer,
// so a launcher that stops the job when the first process exits non-zero
// (loomrun, mpirun) cannot cut rank 0's output short.
Status PerfRun::finalBarrier() {
  if (env_.nProcs == 1) return Status::ok();
  for (const auto& slot : slots_) {
    LOOM_TRY(backend_->setDevice(slot->device));
    double zero = 0;
    LOOM_TRY(backend_->copyIn(slot->scratch.data(), &zero, sizeof zero));
  }
  ncclResult_t result = ncclGroupStart();
  for (const auto& slot : slots_) {
    if (result != ncclSuccess) break;
    result = ncclAllReduce(slot->scratch.data(), slot->scratch.data() + sizeof(double), 1, ncclFloat64, ncclSum,
                           slot->comm, slot->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  if (result != ncclSuccess || (end != ncclSuccess && end != ncclInProgress)) {
    return Status(Code(result != ncclSuccess ? result : end), "final barrier failed");
  }
  for (const auto& slot : slots_) {
    for (;;) {
      LOOM_TRY(backend_->setDevice(slot->device));
      LOOM_ASSIGN_OR_RETURN(bool done, backend_->streamDone(slot->stream));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(slot->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Status(Code(async), "final barrier failed");
      if (done && async == ncclSuccess) break;
      std::this_thread::yield();
    }
  }
  return Status::ok();
}

int PerfRun::finish() {
  int64_t freeAfterRun = -1;
  if (options_.memoryReport && backend_->isDevice() && backend_->setDevice(slots_[0]->device).isOk()) {
    Result<uint64_t> free = backend_->freeMemory();
    if (free.isOk()) freeAfterRun = int64_t(free.value());
  }
  const bool printer = env_.procRank == 0;
  double avgBusBw = ctx_.busBwCount ? ctx_.busBwSum / ctx_.busBwCount : 0.0;
  if (printer) {
    std::string text = resultFooter(ctx_.outOfBounds, avgBusBw, env_.minBusBw, ctx_.programName);
    if (freeAfterRun >= 0 && freeBeforeInit_ >= 0) {
      int64_t user = int64_t(options_.nThreads) * options_.nGpus *
                     (2 * int64_t(ctx_.maxBytes + 8 * uint64_t(options_.unalign)) + 2 * int64_t(sizeof(double)));
      int64_t init = freeBeforeInit_ - freeAfterInit_;
      text += memoryUsageLine(init, user, std::max<int64_t>(freeAfterInit_ - freeAfterRun - user, 0));
    }
    text += "#\n";
    const char* lastError = ncclGetLastError(nullptr);
    text += lastError && *lastError ? std::string("# error: ") + lastError + "\n" : std::string("\n");
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  bool finished = finalBarrier().isOk();
  bool destroyed = destroyComms().isOk();
  for (const auto& slot : slots_) {
    backend_->setDevice(slot->device).ignore();
    backend_->destroyStream(slot->stream);
  }
  slots_.clear();  // frees the buffers
  if (!finished || !destroyed) return kExitNccl;
  bool bandwidthLow = env_.minBusBw >= 0 && avgBusBw < env_.minBusBw * 0.9;
  return ctx_.outOfBounds != 0 || bandwidthLow ? kExitWrongResults : kExitOk;
}

int PerfRun::execute() {
  ncclGetVersion(&ctx_.libraryVersion);
  const Collective& coll = *ctx_.collective;
  if (coll.hasRoot() && options_.root >= ctx_.totalRanks) {
    std::fprintf(stderr, "%s: root %d is not a rank; this run has %d ranks (-r -1 runs every root)\n",
                 ctx_.programName, options_.root, ctx_.totalRanks);
    return kExitInvalidUsage;
  }
  Status status = setupSlots();
  if (status.isOk()) status = limitMaxBytes();
  if (!status.isOk()) {
    std::fprintf(stderr, "%s: %s\n", ctx_.programName, status.message().c_str());
    return status.code() == Code::kCudaError ? kExitCuda : kExitInvalidUsage;
  }
  ctx_.headerText = headerText();

  // With NCCL_COMM_ID every process derives the same id from it; without,
  // the single process makes one for all its ranks.
  ncclResult_t idResult = ncclGetUniqueId(&ctx_.uniqueId);
  if (idResult != ncclSuccess) {
    std::printf("%s: Test NCCL failure %s:%d '%s / %s'\n", ctx_.host.c_str(), "common.cc", __LINE__,
                ncclGetErrorString(idResult), ncclGetLastError(nullptr));
    return kExitNccl;
  }
  if (options_.memoryReport && backend_->isDevice() && backend_->setDevice(slots_[0]->device).isOk()) {
    Result<uint64_t> free = backend_->freeMemory();
    if (free.isOk()) freeBeforeInit_ = int64_t(free.value());
  }
  state_.startWatchdog(options_.timeoutSeconds);
  if (!options_.parallelInit) {
    RunState::BusyScope busy(state_, 0);
    if (!initCommsInMainThread().isOk()) {
      state_.stopWatchdog();
      return state_.exitCode();
    }
  }
  if (freeBeforeInit_ >= 0) {
    Result<uint64_t> free = backend_->freeMemory();
    if (free.isOk()) freeAfterInit_ = int64_t(free.value());
  }
  runThreads();
  state_.stopWatchdog();
  if (state_.failed()) return state_.exitCode();
  return finish();
}

}  // namespace

int perfMain(int argc, char** argv, const Collective& collective) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line shows up as it is printed
  const char* programName = baseName(argv[0]);
  Result<Options> options = parseOptions(argc, argv);
  if (!options.isOk()) {
    std::fprintf(stderr, "%s: %s\n", programName, options.status().message().c_str());
    return kExitInvalidUsage;
  }
  if (options->help) {
    std::fputs(usageText(programName).c_str(), stdout);
    return kExitOk;
  }
  Result<LaunchEnv> env = readLaunchEnv();
  if (!env.isOk()) {
    std::fprintf(stderr, "%s: %s\n", programName, env.status().message().c_str());
    return kExitInvalidUsage;
  }
  for (const std::string& line : env->ignoredPairs) std::fprintf(stderr, "%s: note: %s\n", programName, line.c_str());
  if (env->nProcs > 1 && !env->hasCommId) {
    std::fprintf(stderr,
                 "%s: %d processes (from %s) need a rendezvous: set NCCL_COMM_ID=host:port on every process "
                 "(loomrun does this)\n",
                 programName, env->nProcs, env->rankSource.c_str());
    return kExitInvalidUsage;
  }
  Result<std::unique_ptr<Backend>> backend = selectBackend(env.value());
  if (!backend.isOk()) {
    std::fprintf(stderr, "%s: %s\n", programName, backend.status().message().c_str());
    return kExitInvalidUsage;
  }
  PerfRun run(options.value(), collective, env.value(), std::move(backend.value()), programName);
  return run.execute();
}

}  // namespace loom::perf
