#include "common/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

namespace loom {
namespace {

long membarrier(int cmd) { return ::syscall(SYS_membarrier, cmd, 0, 0); }

int registerCommand(FenceScope scope) {
  return scope == FenceScope::kProcess ? MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED
                                       : MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
}

int fenceCommand(FenceScope scope) {
  return scope == FenceScope::kProcess ? MEMBARRIER_CMD_PRIVATE_EXPEDITED : MEMBARRIER_CMD_GLOBAL_EXPEDITED;
}

}  // namespace

std::atomic<bool> AsymmetricFence::enabled_[2];

bool AsymmetricFence::enable(FenceScope scope) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled(scope)) return true;
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || !(supported & fenceCommand(scope))) return false;
  if (membarrier(registerCommand(scope)) != 0) return false;
  enabled_[int(scope)].store(true, std::memory_order_release);
  return true;
}

bool AsymmetricFence::heavy(FenceScope scope) noexcept {
  if (!enabled(scope)) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  // The syscall itself orders this thread's accesses around it.
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (membarrier(fenceCommand(scope)) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1 << attempt));
  }
  return false;
}

}  // namespace loom
