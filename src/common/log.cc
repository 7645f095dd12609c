#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include <loom/version.h>

#include "common/settings.h"

namespace loom::log {
namespace {

constexpr int kUninit = -1;
std::atomic<int> gLevel{kUninit};
std::atomic<uint32_t> gMask{0};
std::mutex gMutex;  // guards gFile, gHost, gLastWarning and the output
FILE* gFile = nullptr;
bool gOwnFile = false;
char gHost[64] = "";
char gLastWarning[1024] = "";
thread_local int tRank = -1;

struct SubsysName {
  const char* name;
  uint32_t bit;
};
constexpr SubsysName kSubsys[] = {
    {"INIT", kInit}, {"COLL", kColl},   {"P2P", kP2p},     {"SHM", kShm},
    {"NET", kNet},   {"GRAPH", kGraph}, {"TUNING", kTuning}, {"ENV", kEnv},
    {"ALLOC", kAlloc}, {"CALL", kCall}, {"PROXY", kProxy}, {"BOOTSTRAP", kBootstrap},
    {"REG", kReg},   {"ALL", kAll},
};

Level parseLevel(const std::string& s) {
  if (s == "VERSION") return Level::kVersion;
  if (s == "WARN") return Level::kWarn;
  if (s == "INFO") return Level::kInfo;
  if (s == "ABORT") return Level::kAbort;
  if (s == "TRACE") return Level::kTrace;
  return Level::kNone;
}

uint32_t parseMask(const std::string& spec) {
  bool invert = !spec.empty() && spec[0] == '^';
  uint32_t mask = 0;
  size_t pos = invert ? 1 : 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string tok = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (const auto& s : kSubsys)
      if (strcasecmp(tok.c_str(), s.name) == 0) mask |= s.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

// Expands %h (host) and %p (pid) in NCCL_DEBUG_FILE.
std::string expandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') { out += gHost; ++i; continue; }
      if (c == 'p') { out += std::to_string(getpid()); ++i; continue; }
      if (c == '%') { out += '%'; ++i; continue; }
    }
    out += pattern[i];
  }
  return out;
}

void initLocked() {
  auto cfg = settings::current();
  if (gHost[0] == '\0') {
    gethostname(gHost, sizeof gHost - 1);
    if (char* dot = std::strchr(gHost, '.')) *dot = '\0';
  }
  if (gOwnFile && gFile) std::fclose(gFile);
  gFile = stderr;
  gOwnFile = false;
  const std::string path = cfg->getString("NCCL_DEBUG_FILE");
  if (!path.empty()) {
    if (FILE* f = std::fopen(expandPath(path).c_str(), "w")) {
      std::setvbuf(f, nullptr, _IOLBF, 0);
      gFile = f;
      gOwnFile = true;
    }
  }
  gMask.store(parseMask(cfg->getString("NCCL_DEBUG_SUBSYS")), std::memory_order_relaxed);
  Level lvl = parseLevel(cfg->getString("NCCL_DEBUG"));
  bool first = gLevel.load() == kUninit;
  gLevel.store(int(lvl), std::memory_order_release);
  if (first && lvl >= Level::kVersion) {
    std::fprintf(gFile, "%s:%d:%ld [%d] NCCL INFO NCCL version %s+loom%s\n", gHost, getpid(),
                 long(syscall(SYS_gettid)), tRank, LOOM_NCCL_VERSION_STRING, LOOM_VERSION_STRING);
  }
  if (first && lvl >= Level::kInfo && (gMask.load() & kEnv) && !cfg->unused().empty()) {
    std::fprintf(gFile, "%s:%d:%ld [%d] NCCL INFO settings: loom does not read %s (set here; loom-info -s lists "
                 "what it reads)\n", gHost, getpid(), long(syscall(SYS_gettid)), tRank, cfg->unused().c_str());
  }
  if (!cfg->warnings().empty() && lvl >= Level::kWarn) {
    std::fprintf(gFile, "%s:%d:%ld [%d] NCCL WARN settings: %s\n", gHost, getpid(),
                 long(syscall(SYS_gettid)), tRank, cfg->warnings().c_str());
  }
}

void ensureInit() {
  if (gLevel.load(std::memory_order_acquire) != kUninit) return;
  std::lock_guard<std::mutex> lock(gMutex);
  if (gLevel.load() == kUninit) initLocked();
}

const char* levelName(Level lvl) {
  switch (lvl) {
    case Level::kWarn: return "WARN";
    case Level::kTrace: return "TRACE";
    default: return "INFO";
  }
}

}  // namespace

Level level() {
  ensureInit();
  return Level(gLevel.load(std::memory_order_relaxed));
}

uint32_t subsysMask() {
  ensureInit();
  return gMask.load(std::memory_order_relaxed);
}

void write(Level lvl, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  ensureInit();
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(gMutex);
  if (lvl == Level::kWarn) std::snprintf(gLastWarning, sizeof gLastWarning, "%s", msg);
  if (int(level()) < int(lvl)) return;
  const char* base = std::strrchr(file, '/');
  if (lvl == Level::kTrace) {
    std::fprintf(gFile, "%s:%d:%ld [%d] NCCL %s %s:%d %s\n", gHost, getpid(),
                 long(syscall(SYS_gettid)), tRank, levelName(lvl), base ? base + 1 : file, line,
                 msg);
  } else {
    std::fprintf(gFile, "%s:%d:%ld [%d] NCCL %s %s\n", gHost, getpid(), long(syscall(SYS_gettid)),
                 tRank, levelName(lvl), msg);
  }
}

const char* lastWarning() {
  std::lock_guard<std::mutex> lock(gMutex);
  thread_local char copy[sizeof gLastWarning];
  std::memcpy(copy, gLastWarning, sizeof copy);
  return copy;
}

void reset() {
  std::lock_guard<std::mutex> lock(gMutex);
  initLocked();
}

void setThreadRank(int rank) { tRank = rank; }
int threadRank() { return tRank; }

}  // namespace loom::log
