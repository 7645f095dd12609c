// One round of a spin-wait: tells the CPU that this thread is waiting for
// another (less power, no memory-order mis-speculation when the awaited
// store lands, and the sibling hardware thread runs meanwhile).
#pragma once

namespace loom {

inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace loom
