// One round of a spin-wait: tells the CPU that this thread is waiting for
// another (less power, no memory-order mis-speculation when the awaited
// store lands, and the sibling hardware thread runs meanwhile).
#pragma once

#include <sched.h>

#include <chrono>

namespace loom {

inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Yields the CPU; true when another thread ran meanwhile (the call took
// longer than a system call does): this CPU is shared right now. A waiter
// that sees it should sleep rather than spin: the wake-up lets the kernel
// move it to an idle CPU, which a spinning or yielding thread never gets.
inline bool yieldSawOthers() noexcept {
  const auto start = std::chrono::steady_clock::now();
  sched_yield();
  return std::chrono::steady_clock::now() - start > std::chrono::microseconds(20);
}

}  // namespace loom
