// Shared helpers of the public-API tests: ranks as threads, child processes,
// unique ids as text, deterministic pseudo-random values.
//
// Only the public C API (nccl.h) and POSIX are used here.
#pragma once

#include <nccl.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::test {

// splitmix64 finaliser: a cheap, well-mixed hash of one word.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// Runs fn(rank) for every rank in [0, n) on a thread of its own and joins
// them all.
void onRanks(int n, const std::function<void(int)>& fn);

double secondsSince(std::chrono::steady_clock::time_point start);

// Random inputs of mixed magnitudes (sums whose bits depend on the order of
// the fold) for ncclFloat32, ncclFloat16 or ncclBfloat16, as raw bytes: the
// same for a (type, elems, rank) in every process.
std::vector<uint8_t> orderSensitiveInput(ncclDataType_t type, size_t elems, int rank);

// Sets NAME=VALUE environment entries and makes loom read its settings
// again (ncclResetDebugInit); the destructor restores both. Nothing is done
// for an empty list.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::string> entries);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The unique id as 256 hex digits (to hand it to a child on its command
// line) and back.
std::string idToHex(const ncclUniqueId& id);
bool idFromHex(const std::string& hex, ncclUniqueId* id);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read
// it back, close). Another program could take it in between; the tests
// that use it accept that small risk.
int freeLoopbackPort();

// A child process started with fork + exec; stdout and stderr go to a file
// that output() reads. The destructor kills (SIGKILL) and reaps a child that
// is still running, so no test leaves processes behind.
class ChildProcess {
 public:
  // `env` entries are NAME=VALUE and are added to (or replace) the
  // parent's environment.
  static std::unique_ptr<ChildProcess> start(const std::string& path, const std::vector<std::string>& args,
                                             const std::vector<std::string>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `seconds` for the child to exit; true when it has.
  bool wait(double seconds);
  bool running();
  void kill(int sig);
  // After wait() returned true: exit code, or -signal when killed.
  int status() const { return status_; }
  bool exitedNormally() const { return exited_ && status_ >= 0; }
  std::string output() const;

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string logPath_;
};

// Processes whose parent is `pid` (from /proc).
std::vector<pid_t> childrenOf(pid_t pid);

// Value of "KEY=value" on a line "RESULT ... KEY=value ..." of a child's
// output (values end at the next space, except `error=` which runs to the
// end of the line). Empty when absent.
std::string resultField(const std::string& output, const std::string& key);

// The flight recorder files (loom-flight-*.json) in `dir`, as paths, sorted.
std::vector<std::string> flightFiles(const std::string& dir);
// A file's whole text (empty when it cannot be read).
std::string readText(const std::string& path);

}  // namespace loom::test
