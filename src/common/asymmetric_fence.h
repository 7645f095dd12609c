// An asymmetric store-load fence for a pattern with a hot side and a rare
// side (Dekker's): each side stores its flag, then loads the other's, and
// at least one of them must see the other's store. On x86 a load may pass
// an earlier store, so each side needs a full fence, which drains the
// store buffer: on a tiny collective that is a stall for every store still
// waiting for its cache line. With membarrier(2) the hot side gets by with
// a compiler barrier (light()) and the rare side pays instead (heavy()):
// the kernel makes every running thread of the process, or of every
// process that registered, pass a full fence. Where the kernel refuses
// membarrier, light() is a full fence and heavy() one too.
#pragma once

#include <atomic>

namespace loom {

enum class FenceScope {
  kProcess,    // the hot side runs in threads of this process
  kProcesses,  // the hot side runs in several processes (shared memory), each of which calls enable()
};

class AsymmetricFence {
 public:
  // Registers this process for heavy() in `scope` (once; cheap afterwards).
  // False where the kernel refuses: light() then stays a full fence.
  static bool enable(FenceScope scope);
  // The hot side, between its store and its load.
  static void light(FenceScope scope) noexcept {
    if (enabled(scope)) std::atomic_signal_fence(std::memory_order_seq_cst);
    else std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  // The rare side, between its store and its load. False when the kernel
  // refused the membarrier after enable() had succeeded (it may fail for
  // want of memory): the light side was then not ordered, and the caller
  // must not rely on what it loads next.
  [[nodiscard]] static bool heavy(FenceScope scope) noexcept;

 private:
  static bool enabled(FenceScope scope) noexcept {
    return enabled_[int(scope)].load(std::memory_order_relaxed);
  }
  static std::atomic<bool> enabled_[2];
};

}  // namespace loom
