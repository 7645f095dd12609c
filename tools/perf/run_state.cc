#include "tools/perf/run_state.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace loom::perf {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string shortHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  std::string host(name);
  size_t dot = host.find('.');
  if (dot != std::string::npos) host.resize(dot);
  return host;
}

RunState::RunState(int nThreads) : nThreads_(nThreads), busy_(new std::atomic<uint64_t>[size_t(nThreads)]),
      scopes_(new uint64_t[size_t(nThreads)]()) {
  for (int t = 0; t < nThreads; ++t) busy_[size_t(t)].store(0);
}

RunState::~RunState() { stopWatchdog(); }

bool RunState::fail(int exitCode) {
  bool expected = false;
  if (!failed_.compare_exchange_strong(expected, true)) return false;
  exitCode_.store(exitCode);
  abortAll();
  {
    std::lock_guard<std::mutex> lock(barrierMutex_);
    ++barrierEpoch_;
  }
  barrierCv_.notify_all();
  return true;
}

Status RunState::stoppedByOtherFailure() {
  return Status(Code::kRemoteError, "stopped: another test thread failed");
}

void RunState::addComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(commsMutex_);
  comms_.push_back(comm);
  // A communicator created after the failure is aborted at once.
  if (aborted_.load()) ncclCommAbort(comm);
}

void RunState::abortAll() {
  std::lock_guard<std::mutex> lock(commsMutex_);
  if (aborted_.exchange(true)) return;
  for (ncclComm_t comm : comms_) ncclCommAbort(comm);
}

bool RunState::barrier() {
  std::unique_lock<std::mutex> lock(barrierMutex_);
  if (failed()) return false;
  uint64_t epoch = barrierEpoch_;
  if (++barrierCount_ == nThreads_) {
    barrierCount_ = 0;
    ++barrierEpoch_;
    barrierCv_.notify_all();
    return true;
  }
  // No deadline here: a thread that never arrives has failed (fail() wakes
  // us) or is stuck in the library, which the watchdog and the library's
  // own timeouts bound.
  barrierCv_.wait(lock, [&] { return barrierEpoch_ != epoch; });
  return !failed();
}

void RunState::startWatchdog(int seconds) {
  if (seconds <= 0 || watchdog_.joinable()) return;
  timeoutSeconds_ = seconds;
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

void RunState::stopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(watchdogMutex_);
    watchdogStop_ = true;
  }
  watchdogCv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void RunState::watchdogLoop() {
  const int64_t limitNs = int64_t(timeoutSeconds_) * 1000000000;
  int64_t firedAt = 0;
  // Per thread: the busy scope seen at the last tick and since when.
  std::vector<uint64_t> seen(size_t(nThreads_), 0);
  std::vector<int64_t> seenSince(size_t(nThreads_), 0);
  std::unique_lock<std::mutex> lock(watchdogMutex_);
  while (!watchdogCv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return watchdogStop_; })) {
    int64_t now = nowNs();
    if (firedAt != 0) {
      if (now - firedAt > int64_t(30) * 1000000000) {
        std::fprintf(stderr, "%s: still blocked 30 s after aborting the communicators (-T %d); exiting\n",
                     shortHostName().c_str(), timeoutSeconds_);
        std::_Exit(kExitTimeout);
      }
      continue;
    }
    for (int t = 0; t < nThreads_; ++t) {
      const uint64_t scope = busy_[size_t(t)].load(std::memory_order_relaxed);
      if (scope == 0 || scope != seen[size_t(t)]) {
        seen[size_t(t)] = scope;
        seenSince[size_t(t)] = now;
        continue;
      }
      if (now - seenSince[size_t(t)] <= limitNs) continue;
      std::printf("%s: Test timeout (%ds) %s:%d\n", shortHostName().c_str(), timeoutSeconds_, "run_state.cc",
                  __LINE__);
      std::fflush(stdout);
      fail(kExitTimeout);
      firedAt = now;
      break;
    }
  }
}

RunState::BusyScope::BusyScope(RunState& state, int thread) : state_(state), thread_(thread) {
  // Only this thread writes its entries.
  state_.busy_[size_t(thread_)].store(++state_.scopes_[size_t(thread_)], std::memory_order_relaxed);
}

RunState::BusyScope::~BusyScope() { state_.busy_[size_t(thread_)].store(0, std::memory_order_relaxed); }

}  // namespace loom::perf
