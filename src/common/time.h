// Deadlines for every wait: nothing in loom waits forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace loom {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  // A deadline `seconds` from now; seconds <= 0 means never.
  static Deadline afterSeconds(double seconds) {
    if (seconds <= 0) return never();
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds)));
  }
  static Deadline afterMs(int64_t ms) {
    return Deadline(Clock::now() + std::chrono::milliseconds(ms));
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool isNever() const { return at_ == Clock::time_point::max(); }
  bool expired() const { return !isNever() && Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, cap]; cap when never.
  int msLeft(int cap = std::numeric_limits<int>::max()) const {
    if (isNever()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap ? cap : int(left);
  }
  Clock::time_point at() const { return at_; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace loom
