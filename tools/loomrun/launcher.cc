#include "tools/loomrun/launcher.h"

#include <arpa/inet.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

extern char** environ;

namespace loom::launcher {
namespace {

// The logical CPUs this process may run on, grouped by core (package and
// core id from sysfs; a CPU whose ids cannot be read is a core of its own),
// a package's cores together in order of their first CPU, packages in order
// of their id.
Result<std::vector<std::vector<int>>> allowedCores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return systemErrno("sched_getaffinity", errno);
  auto readId = [](int cpu, const char* what) -> long {
    const std::string path = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + what;
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return -1;
    long id = -1;
    if (std::fscanf(f, "%ld", &id) != 1) id = -1;
    std::fclose(f);
    return id;
  };
  std::vector<std::pair<std::pair<long, long>, std::vector<int>>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const long package = readId(cpu, "physical_package_id"), core = readId(cpu, "core_id");
    const std::pair<long, long> key = package < 0 || core < 0 ? std::make_pair(-1L - cpu, -1L) : std::make_pair(package, core);
    auto it = std::find_if(cores.begin(), cores.end(), [&](const auto& c) { return c.first == key; });
    if (it == cores.end()) cores.push_back({key, {cpu}});
    else it->second.push_back(cpu);
  }
  // A package's cores side by side (some machines number CPUs alternately
  // across packages), so that a share of consecutive cores stays on one.
  std::stable_sort(cores.begin(), cores.end(),
                   [](const auto& a, const auto& b) { return std::max(a.first.first, -1L) < std::max(b.first.first, -1L); });
  std::vector<std::vector<int>> out;
  for (auto& c : cores) out.push_back(std::move(c.second));
  if (out.empty()) return systemError("sched_getaffinity reports no CPU");
  return out;
}

// Write end of the self-pipe; the signal handler's only state.
int gSignalWrite = -1;

void onSignal(int signal) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal);
  ssize_t ignored = write(gSignalWrite, &byte, 1);
  (void)ignored;
  errno = saved;
}

double monotonicSeconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

std::string signalName(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation ? std::string("SIG") + abbreviation : "signal " + std::to_string(signal);
}

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t written = write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout is gone (EPIPE...): nothing sensible to do
    }
    data += written;
    size -= size_t(written);
  }
}

// True when 127.0.0.1:port can be bound now.
bool portFree(int port) {
  UniqueFd socketFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socketFd.get() < 0) return false;
  const int one = 1;
  setsockopt(socketFd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as rank 0's listener
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(uint16_t(port));
  return bind(socketFd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
}

// A free TCP port on loopback for the rendezvous, which rank 0 binds soon
// after. Taken below the kernel's ephemeral range when it can be: a port
// from that range may meanwhile become the local port of some connection
// or of a rank's own listener (bound to port 0), and rank 0's bind then
// fails. The kernel's pick is the fallback.
Result<int> pickFreePort() {
  int low = 32768;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int hi = 0;
    if (fscanf(f, "%d %d", &low, &hi) != 2) low = 32768;
    fclose(f);
  }
  const int first = 10000;
  if (low > first + 100) {
    uint32_t r = 0;
    UniqueFd random(open("/dev/urandom", O_RDONLY | O_CLOEXEC));
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (random.get() < 0 || read(random.get(), &r, sizeof r) != ssize_t(sizeof r)) r = uint32_t(getpid()) * 2654435761u + uint32_t(attempt);
      const int port = first + int(r % uint32_t(low - first));
      if (portFree(port)) return port;
    }
  }
  UniqueFd socketFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socketFd.get() < 0) return systemErrno("socket", errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (bind(socketFd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return systemErrno("bind 127.0.0.1:0", errno);
  }
  socklen_t length = sizeof address;
  if (getsockname(socketFd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return systemErrno("getsockname", errno);
  }
  return int(ntohs(address.sin_port));
}

Result<std::string> randomSecret() {
  UniqueFd random(open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (random.get() < 0) return systemErrno("open /dev/urandom", errno);
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = read(random.get(), bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return systemErrno("read /dev/urandom", n < 0 ? errno : EIO);
    got += size_t(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string secret;
  for (unsigned char byte : bytes) {
    secret += kHex[byte >> 4];
    secret += kHex[byte & 15];
  }
  return secret;
}

Status makeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return systemErrno("mkdir " + prefix, errno);
    }
    if (slash == std::string::npos) return Status::ok();
  }
}

Result<UniqueFd> openOutput(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return systemErrno("open " + path, errno);
  return fd;
}

// Whether the ranks will drive NVIDIA GPUs: a GPU is visible and
// LOOM_DEVICE does not say host. Such a rank belongs near its GPU, which
// loomrun does not know, so the default binding leaves it to the job.
bool gpuJob() {
  const char* device = std::getenv("LOOM_DEVICE");
  if (device != nullptr && std::strcmp(device, "host") == 0) return false;
  struct stat st {};
  return stat("/dev/nvidia0", &st) == 0 || stat("/proc/driver/nvidia/gpus", &st) == 0;
}

}  // namespace

std::vector<std::vector<int>> cpusPerRank(LaunchOptions::Binding binding, const std::vector<std::vector<int>>& cores,
                                          int nranks) {
  std::vector<std::vector<int>> out(static_cast<size_t>(nranks));
  const size_t c = cores.size();
  const size_t n = size_t(nranks);
  // More ranks than cores: the default spreads them as --bind-to core does.
  // Left to the kernel, they started crowded and moved between the cores
  // (2 cores, AllReduce on 4 and 8 ranks: 1.5-2x the time at 1 MiB, about
  // 1.2-1.6x at 8 B; at 1 MiB on 8 ranks 2.3 to 11 ms per call from
  // launch to launch, where bound they mostly took 1.9 to 2.7).
  const bool spread = binding == LaunchOptions::Binding::kCore || (binding == LaunchOptions::Binding::kShare && n > c);
  if (spread) {
    for (size_t r = 0; r < n; ++r) out[r] = cores[r % c];
  } else if (binding == LaunchOptions::Binding::kShare && n >= 2) {
    for (size_t r = 0; r < n; ++r) {
      for (size_t k = r * c / n; k < (r + 1) * c / n; ++k) out[r].insert(out[r].end(), cores[k].begin(), cores[k].end());
    }
  }
  return out;
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

Launcher::~Launcher() {
  // run() reaps everything; this only covers an early return.
  for (Child& child : children_) {
    if (child.running) {
      kill(-child.pid, SIGKILL);
      waitpid(child.pid, nullptr, 0);
    }
  }
  gSignalWrite = -1;
}

Status Launcher::prepare() {
  LOOM_ASSIGN_OR_RETURN(int port, pickFreePort());
  commId_ = "127.0.0.1:" + std::to_string(port);
  LOOM_ASSIGN_OR_RETURN(secret_, randomSecret());
  if (!options_.outputDir.empty()) LOOM_TRY(makeDirectories(options_.outputDir));

  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return systemErrno("pipe2", errno);
  signalRead_.reset(fds[0]);
  signalWrite_.reset(fds[1]);
  gSignalWrite = fds[1];
  struct sigaction action{};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int signal : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {
    if (sigaction(signal, &action, nullptr) != 0) return systemErrno("sigaction", errno);
  }
  signal(SIGPIPE, SIG_IGN);
  if (options_.timeoutSeconds > 0) timeoutAt_ = monotonicSeconds() + options_.timeoutSeconds;
  const bool core = options_.binding == LaunchOptions::Binding::kCore;
  const bool share = options_.binding == LaunchOptions::Binding::kShare && options_.nranks >= 2 && !gpuJob();
  if (core || share) {
    Result<std::vector<std::vector<int>>> cores = allowedCores();
    if (cores.isOk()) {
      rankCpus_ = cpusPerRank(options_.binding, *cores, options_.nranks);
    } else if (core) {
      return cores.takeStatus();
    } else {
      // The default: where the CPU set cannot be read, unbound rather than not at all.
      std::fprintf(stderr, "loomrun: warning: ranks are not bound (%s)\n", cores.status().message().c_str());
    }
  }
  return Status::ok();
}

std::vector<std::string> Launcher::environmentFor(int rank) const {
  static const char* const kOwn[] = {"LOOM_RANK=", "LOOM_WORLD_SIZE=", "LOOM_LOCAL_RANK=", "NCCL_COMM_ID=",
                                     "LOOM_COMM_SECRET="};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    bool ours = false;
    for (const char* prefix : kOwn) ours = ours || std::strncmp(*entry, prefix, std::strlen(prefix)) == 0;
    if (!ours) environment.emplace_back(*entry);
  }
  environment.push_back("LOOM_RANK=" + std::to_string(rank));
  environment.push_back("LOOM_WORLD_SIZE=" + std::to_string(options_.nranks));
  environment.push_back("LOOM_LOCAL_RANK=" + std::to_string(rank));
  environment.push_back("NCCL_COMM_ID=" + commId_);
  environment.push_back("LOOM_COMM_SECRET=" + secret_);
  return environment;
}

Status Launcher::spawn(Child& child, const std::vector<std::string>& environment) {
  // Where the child's stdout and stderr go: pipes (--tag), files (--output)
  // or loomrun's own (neither).
  UniqueFd outWrite, errWrite;
  if (!options_.outputDir.empty()) {
    std::string base = options_.outputDir + "/rank." + std::to_string(child.rank);
    LOOM_ASSIGN_OR_RETURN(outWrite, openOutput(base + ".out"));
    LOOM_ASSIGN_OR_RETURN(errWrite, openOutput(base + ".err"));
  } else if (options_.tag) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return systemErrno("pipe2", errno);
    child.out.fd.reset(out[0]);
    outWrite.reset(out[1]);
    if (pipe2(err, O_CLOEXEC) != 0) return systemErrno("pipe2", errno);
    child.err.fd.reset(err[0]);
    errWrite.reset(err[1]);
  }
  std::vector<char*> argv;
  for (const std::string& arg : options_.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : environment) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  cpu_set_t binding;
  CPU_ZERO(&binding);
  const bool bound = size_t(child.rank) < rankCpus_.size() && !rankCpus_[size_t(child.rank)].empty();
  if (bound) {
    for (int cpu : rankCpus_[size_t(child.rank)]) CPU_SET(cpu, &binding);
  }

  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return systemErrno("fork", errno);
  if (pid == 0) {
    // Child (loomrun is single-threaded, so the calls below are safe).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // loomrun died before prctl took effect
    setpgid(0, 0);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devNull = open("/dev/null", O_RDONLY);
    if (devNull >= 0) dup2(devNull, STDIN_FILENO);
    if (outWrite.get() >= 0) dup2(outWrite.get(), STDOUT_FILENO);
    if (errWrite.get() >= 0) dup2(errWrite.get(), STDERR_FILENO);
    if (bound && sched_setaffinity(0, sizeof binding, &binding) != 0) {
      // --bind-to core was asked for; the default runs the rank unbound.
      const bool asked = options_.binding == LaunchOptions::Binding::kCore;
      std::string message = std::string("loomrun: ") + (asked ? "" : "warning: ") + "cannot bind rank " +
                            std::to_string(child.rank) + " to its CPUs: " + std::strerror(errno) +
                            (asked ? "\n" : "; it runs unbound\n");
      writeAll(STDERR_FILENO, message.data(), message.size());
      if (asked) _exit(126);
    }
    execvpe(argv[0], argv.data(), envp.data());
    std::string message = "loomrun: cannot run '" + options_.command[0] + "': " + std::strerror(errno) + "\n";
    writeAll(STDERR_FILENO, message.data(), message.size());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so signals reach the group from the start
  child.pid = pid;
  child.running = true;
  return Status::ok();
}

int Launcher::runningCount() const {
  int running = 0;
  for (const Child& child : children_) running += child.running ? 1 : 0;
  return running;
}

void Launcher::signalRunning(int signal) {
  for (const Child& child : children_) {
    if (child.running) kill(-child.pid, signal);
  }
}

void Launcher::stopAll(int signal, double graceSeconds) {
  stopping_ = true;
  killAt_ = monotonicSeconds() + graceSeconds;
  signalRunning(signal);
}

void Launcher::onChildExit(Child& child, int waitStatus) {
  child.running = false;
  // Whatever the rank left behind in its process group goes with it.
  kill(-child.pid, SIGKILL);
  bool clean = WIFEXITED(waitStatus) && WEXITSTATUS(waitStatus) == 0;
  if (clean || failed_) return;
  failed_ = true;
  std::string what;
  if (WIFEXITED(waitStatus)) {
    exitStatus_ = WEXITSTATUS(waitStatus);
    what = "exited with status " + std::to_string(exitStatus_);
  } else {
    int signal = WTERMSIG(waitStatus);
    exitStatus_ = 128 + signal;
    what = "was killed by signal " + signalName(signal);
  }
  int others = runningCount();
  std::string message = "loomrun: rank " + std::to_string(child.rank) + " (pid " + std::to_string(child.pid) +
                        ") " + what;
  message += others > 0 ? "; stopping the other " + std::to_string(others) + (others == 1 ? " rank\n" : " ranks\n")
                        : "\n";
  writeAll(STDERR_FILENO, message.data(), message.size());
  if (others > 0) stopAll(SIGTERM, options_.graceSeconds);
}

void Launcher::reapChildren() {
  for (;;) {
    int waitStatus = 0;
    pid_t pid = waitpid(-1, &waitStatus, WNOHANG);
    if (pid <= 0) return;
    for (Child& child : children_) {
      if (child.pid == pid && child.running) onChildExit(child, waitStatus);
    }
  }
}

void Launcher::handleSignals() {
  unsigned char signals[64];
  ssize_t count;
  while ((count = read(signalRead_.get(), signals, sizeof signals)) > 0) {
    for (ssize_t i = 0; i < count; ++i) {
      int signal = signals[i];
      if (signal == SIGCHLD) continue;  // reaped below
      if (stopping_) {
        signalRunning(SIGKILL);  // asked again: no more grace
        continue;
      }
      failed_ = true;
      exitStatus_ = 128 + signal;
      std::string message = "loomrun: received " + signalName(signal) + "; stopping " +
                            std::to_string(runningCount()) + " ranks\n";
      writeAll(STDERR_FILENO, message.data(), message.size());
      stopAll(signal, options_.graceSeconds);
    }
  }
  reapChildren();
}

void Launcher::pumpOutput(Stream& stream, int rank, int destination, bool eof) {
  char buffer[65536];
  ssize_t got = eof ? 0 : read(stream.fd.get(), buffer, sizeof buffer);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got > 0) stream.partial.append(buffer, size_t(got));
  const std::string prefix = "[" + std::to_string(rank) + "] ";
  size_t start = 0;
  for (size_t newline; (newline = stream.partial.find('\n', start)) != std::string::npos; start = newline + 1) {
    std::string line = prefix + stream.partial.substr(start, newline - start + 1);
    writeAll(destination, line.data(), line.size());
  }
  stream.partial.erase(0, start);
  if (got <= 0) {  // end of stream (or error): flush the unterminated rest
    if (!stream.partial.empty()) {
      std::string line = prefix + stream.partial + "\n";
      writeAll(destination, line.data(), line.size());
      stream.partial.clear();
    }
    stream.fd.reset();
  }
}

void Launcher::loop() {
  double drainUntil = 0;  // after the last child: how long to wait for its output
  for (;;) {
    std::vector<pollfd> fds{{signalRead_.get(), POLLIN, 0}};
    std::vector<std::pair<Stream*, std::pair<int, int>>> streams;  // stream, (rank, destination)
    for (Child& child : children_) {
      if (child.out.fd.get() >= 0) streams.push_back({&child.out, {child.rank, STDOUT_FILENO}});
      if (child.err.fd.get() >= 0) streams.push_back({&child.err, {child.rank, STDERR_FILENO}});
    }
    for (auto& [stream, where] : streams) fds.push_back({stream->fd.get(), POLLIN, 0});
    const int running = runningCount();
    if (running == 0 && streams.empty()) return;

    double now = monotonicSeconds();
    if (running == 0 && drainUntil == 0) drainUntil = now + 1.0;
    double wait = 1.0;
    if (stopping_ && running > 0) wait = std::min(wait, std::max(killAt_ - now, 0.0));
    if (timeoutAt_ > 0 && !stopping_) wait = std::min(wait, std::max(timeoutAt_ - now, 0.0));
    if (drainUntil > 0) wait = std::min(wait, std::max(drainUntil - now, 0.0));
    int ready = poll(fds.data(), fds.size(), int(wait * 1000) + 1);
    if (ready < 0 && errno != EINTR) return;

    if (fds[0].revents & POLLIN) handleSignals();
    reapChildren();  // also catches a SIGCHLD that raced with poll
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
        pumpOutput(*streams[i].first, streams[i].second.first, streams[i].second.second, false);
      }
    }

    now = monotonicSeconds();
    if (timeoutAt_ > 0 && now >= timeoutAt_ && !stopping_ && runningCount() > 0) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", options_.timeoutSeconds);
      std::string message = "loomrun: timeout after " + std::string(seconds) + " s; stopping " +
                            std::to_string(runningCount()) + " ranks\n";
      writeAll(STDERR_FILENO, message.data(), message.size());
      failed_ = true;
      exitStatus_ = 124;
      stopAll(SIGTERM, options_.graceSeconds);
    }
    if (stopping_ && now >= killAt_ && runningCount() > 0) {
      signalRunning(SIGKILL);
      killAt_ = now + 3600;
    }
    if (drainUntil > 0 && now >= drainUntil) {
      // A grandchild may hold a pipe open; its output no longer matters.
      for (auto& [stream, where] : streams) {
        if (stream->fd.get() >= 0) pumpOutput(*stream, where.first, where.second, true);
      }
    }
  }
}

Result<int> Launcher::run() {
  LOOM_TRY(prepare());
  children_.resize(size_t(options_.nranks));
  for (int rank = 0; rank < options_.nranks; ++rank) {
    children_[size_t(rank)].rank = rank;
    Status spawned = spawn(children_[size_t(rank)], environmentFor(rank));
    if (!spawned.isOk()) {
      std::string message = "loomrun: cannot start rank " + std::to_string(rank) + ": " + spawned.message() + "\n";
      writeAll(STDERR_FILENO, message.data(), message.size());
      failed_ = true;
      exitStatus_ = 1;
      stopAll(SIGTERM, options_.graceSeconds);
      break;
    }
  }
  loop();
  return failed_ ? exitStatus_ : 0;
}

}  // namespace loom::launcher
