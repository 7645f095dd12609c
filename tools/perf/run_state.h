// State the test threads of one process share: the first failure and its
// exit code, the communicators to abort when anything fails, a barrier that
// wakes up on failure, and the -T watchdog.
//
// Threading: every member is safe to call from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "nccl.h"

namespace loom::perf {

// Exit codes, nccl-tests' testResult_t values.
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,
  kExitCuda = 2,
  kExitNccl = 3,
  kExitTimeout = 4,
  kExitInvalidUsage = 6,
  kExitWrongResults = 7,
};

// "host" as nccl-tests prints it: the host name up to the first dot.
std::string shortHostName();

class RunState {
 public:
  explicit RunState(int nThreads);
  ~RunState();

  // Records the first failure and aborts every registered communicator so
  // threads blocked in the library return. Later calls only return false.
  bool fail(int exitCode);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  int exitCode() const { return exitCode_.load(); }
  // Status for threads that stop because another one failed.
  static Status stoppedByOtherFailure();

  // Communicators to abort on failure. Once aborted, they must not be
  // destroyed: commsAborted() tells the cleanup.
  void addComm(ncclComm_t comm);
  bool commsAborted() const { return aborted_.load(); }

  // Process-local barrier of the test threads; false when a failure ended it.
  bool barrier();

  // -T: when one thread stays inside a library call (or a wait for one)
  // longer than `seconds`, prints nccl-tests' timeout line, aborts all
  // communicators and fails with kExitTimeout. If the process is still stuck
  // 30 s after that, it exits.
  void startWatchdog(int seconds);
  void stopWatchdog();
  // Marks thread `thread` busy until the scope ends. Cheap enough for every
  // timed call (no clock read): the watchdog times how long it sees the
  // same scope.
  class BusyScope {
   public:
    BusyScope(RunState& state, int thread);
    ~BusyScope();
    BusyScope(const BusyScope&) = delete;
    BusyScope& operator=(const BusyScope&) = delete;

   private:
    RunState& state_;
    int thread_;
  };

 private:
  void abortAll();
  void watchdogLoop();

  const int nThreads_;
  std::atomic<bool> failed_{false};
  std::atomic<int> exitCode_{kExitOk};

  std::mutex commsMutex_;
  std::vector<ncclComm_t> comms_;  // guarded by commsMutex_
  std::atomic<bool> aborted_{false};

  std::mutex barrierMutex_;
  std::condition_variable barrierCv_;
  int barrierCount_ = 0;      // guarded by barrierMutex_
  uint64_t barrierEpoch_ = 0;  // guarded by barrierMutex_

  int timeoutSeconds_ = 0;
  // Per thread: the scope it is in (a number new for each scope), 0 = idle.
  std::unique_ptr<std::atomic<uint64_t>[]> busy_;
  std::unique_ptr<uint64_t[]> scopes_;  // per thread, its scopes so far (only it writes its own)
  std::mutex watchdogMutex_;
  std::condition_variable watchdogCv_;
  bool watchdogStop_ = false;  // guarded by watchdogMutex_
  std::thread watchdog_;
};

}  // namespace loom::perf
