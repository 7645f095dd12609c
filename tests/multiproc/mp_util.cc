#include "mp_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace loom::test {

// ncclResetDebugInit is deprecated API, but it is how a process makes loom
// read its settings again; the warning is expected here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
ScopedEnv::ScopedEnv(std::vector<std::string> entries) {
  for (const std::string& e : entries) {
    const std::string name = e.substr(0, e.find('='));
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    setenv(name.c_str(), e.substr(name.size() + 1).c_str(), 1);
  }
  if (!saved_.empty()) ncclResetDebugInit();
}

ScopedEnv::~ScopedEnv() {
  for (const auto& [name, old] : saved_) {
    if (old) setenv(name.c_str(), old->c_str(), 1);
    else unsetenv(name.c_str());
  }
  if (!saved_.empty()) ncclResetDebugInit();
}
#pragma GCC diagnostic pop

void onRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string idToHex(const ncclUniqueId& id) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += kDigits[(uint8_t(c) >> 4) & 15];
    s += kDigits[uint8_t(c) & 15];
  }
  return s;
}

bool idFromHex(const std::string& hex, ncclUniqueId* id) {
  if (hex.size() != 2 * sizeof id->internal) return false;
  for (size_t i = 0; i < sizeof id->internal; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    id->internal[i] = char(v);
  }
  return true;
}

int freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::unique_ptr<ChildProcess> ChildProcess::start(const std::string& path, const std::vector<std::string>& args,
                                                  const std::vector<std::string>& env) {
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  char tmpl[] = "/tmp/loom-mp-child-XXXXXX";
  int logFd = ::mkstemp(tmpl);
  if (logFd < 0) return nullptr;
  child->logPath_ = tmpl;
  // Everything the child needs is prepared before fork: only async-signal-
  // safe calls happen between fork and exec.
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& add : env) replaced = replaced || add.substr(0, add.find('=')) == name;
    if (!replaced) envStrings.push_back(entry);
  }
  for (const auto& add : env) envStrings.push_back(add);
  std::vector<char*> envp, argv;
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argStrings{path};
  argStrings.insert(argStrings.end(), args.begin(), args.end());
  for (auto& s : argStrings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(logFd);
    return nullptr;
  }
  if (pid == 0) {
    ::dup2(logFd, 1);
    ::dup2(logFd, 2);
    ::close(logFd);
    ::execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  ::close(logFd);
  child->pid_ = pid;
  return child;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (!logPath_.empty()) ::unlink(logPath_.c_str());
}

bool ChildProcess::wait(double seconds) {
  if (exited_) return true;
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000;
      return true;
    }
    if (secondsSince(start) >= seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ChildProcess::running() { return !wait(0); }

void ChildProcess::kill(int sig) {
  if (pid_ > 0 && !exited_) ::kill(pid_, sig);
}

std::string ChildProcess::output() const {
  std::ifstream in(logPath_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end || pid <= 0) continue;
    std::ifstream st("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    if (!std::getline(st, line)) continue;
    // pid (comm) state ppid ...; comm may contain spaces, so parse after ')'.
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(pid_t(pid));
  }
  ::closedir(d);
  return out;
}

std::string resultField(const std::string& output, const std::string& key) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RESULT ", 0) != 0) continue;
    size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) continue;
    at += key.size() + 2;
    if (key == "error") return line.substr(at);
    size_t end = line.find(' ', at);
    return line.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return "";
}

std::vector<uint8_t> orderSensitiveInput(ncclDataType_t type, size_t elems, int rank) {
  std::mt19937 rng(1234 + rank * 7919 + int(type) * 31);
  std::uniform_real_distribution<float> v(-1.0f, 1.0f);
  const size_t es = type == ncclFloat32 ? 4 : 2;
  std::vector<uint8_t> out(elems * es);
  for (size_t i = 0; i < elems; ++i) {
    float x = v(rng) * (rng() % 3 == 0 ? 1000.0f : rng() % 2 ? 1.0f : 0.001f);
    if (type == ncclFloat32) {
      std::memcpy(&out[i * 4], &x, 4);
    } else if (type == ncclBfloat16) {  // a float's top half
      uint32_t u;
      std::memcpy(&u, &x, 4);
      uint16_t h = uint16_t(u >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    } else {  // half: sign, a small exponent range and mantissa bits
      uint16_t h = uint16_t((rng() & 0x8000u) | ((8 + rng() % 14) << 10) | (rng() & 0x3ffu));
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<std::string> flightFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("loom-flight-", 0) == 0) files.push_back(dir + "/" + e->d_name);
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace loom::test
