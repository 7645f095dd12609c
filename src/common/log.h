// The one logger: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE.
//
// Lines look like NCCL's: "host:pid:tid [rank] NCCL INFO <text>". The level
// and subsystem are checked before any formatting happens, so a disabled log
// statement costs one load and a compare. Output goes to stderr or the file
// named by NCCL_DEBUG_FILE, never to stdout.
#pragma once

#include <cstdarg>
#include <cstdint>

namespace loom::log {

enum class Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

// Subsystem bits (same names as NCCL's).
enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTuning = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kProxy = 1u << 10,
  kBootstrap = 1u << 11,
  kReg = 1u << 12,
  kAll = 0xffffffffu,
};

// Current threshold and mask; initialised from settings on first use.
Level level();
uint32_t subsysMask();
inline bool enabled(Level lvl, uint32_t subsys) {
  // Warnings always reach write(): it keeps the last one for ncclGetLastError
  // even when NCCL_DEBUG does not print it.
  if (lvl == Level::kWarn) return true;
  return int(level()) >= int(lvl) && (subsysMask() & subsys) != 0;
}

void write(Level lvl, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Text of the most recent warning of this process ("" if none).
const char* lastWarning();

// Re-reads NCCL_DEBUG* from the (reloaded) settings.
void reset();

// Rank shown in the prefix for log lines of the calling thread (-1: none).
void setThreadRank(int rank);
int threadRank();
class ScopedRank {
 public:
  explicit ScopedRank(int rank) : saved_(threadRank()) { setThreadRank(rank); }
  ~ScopedRank() { setThreadRank(saved_); }
  ScopedRank(const ScopedRank&) = delete;
  ScopedRank& operator=(const ScopedRank&) = delete;

 private:
  int saved_;
};

}  // namespace loom::log

#define LOOM_LOG(lvl, subsys, ...)                                               \
  do {                                                                           \
    if (::loom::log::enabled(lvl, subsys))                                       \
      ::loom::log::write(lvl, subsys, __FILE__, __LINE__, __VA_ARGS__);          \
  } while (0)

#define LOOM_WARN(...) LOOM_LOG(::loom::log::Level::kWarn, ::loom::log::kAll, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG(::loom::log::Level::kInfo, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG(::loom::log::Level::kTrace, subsys, __VA_ARGS__)
