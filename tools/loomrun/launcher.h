// Starts the ranks of a local job and watches them until all are done.
//
// Ownership: the Launcher owns every child process (each in its own process
// group, with PR_SET_PDEATHSIG so it dies with loomrun) and the pipes that
// carry their output. run() returns only after every child was reaped and
// their process groups were killed, so no rank outlives it.
//
// Threading: single-threaded; signals reach the event loop through a
// self-pipe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loomrun/launch_options.h"

namespace loom::launcher {

// The CPUs each of `nranks` ranks is bound to under `binding` (empty: not
// bound), given the cores loomrun may use (each a list of logical CPUs).
std::vector<std::vector<int>> cpusPerRank(LaunchOptions::Binding binding, const std::vector<std::vector<int>>& cores,
                                          int nranks);

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  ~Launcher();
  // Runs the job; the result is loomrun's exit status.
  Result<int> run();

 private:
  struct Stream {
    UniqueFd fd;          // read end of the child's stdout or stderr pipe
    std::string partial;  // text after the last newline
  };
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    bool running = false;
    Stream out;
    Stream err;
  };

  Status prepare();
  Status spawn(Child& child, const std::vector<std::string>& environment);
  std::vector<std::string> environmentFor(int rank) const;
  void loop();
  void handleSignals();
  void reapChildren();
  void onChildExit(Child& child, int waitStatus);
  void stopAll(int signal, double graceSeconds);
  void signalRunning(int signal);
  void pumpOutput(Stream& stream, int rank, int destination, bool eof);
  int runningCount() const;

  LaunchOptions options_;
  std::vector<Child> children_;
  // The logical CPUs each rank is bound to (LaunchOptions::Binding); empty
  // for a rank the kernel places.
  std::vector<std::vector<int>> rankCpus_;
  std::string commId_;
  std::string secret_;
  UniqueFd signalRead_;   // self-pipe: the signal handler writes signal numbers
  UniqueFd signalWrite_;

  bool stopping_ = false;
  bool failed_ = false;           // a rank failed or loomrun was signalled
  int exitStatus_ = 0;
  double killAt_ = 0;             // monotonic seconds; SIGKILL the rest then
  double timeoutAt_ = 0;          // 0: none
};

}  // namespace loom::launcher
