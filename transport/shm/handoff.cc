#include "transport/shm/handoff.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/reduce.h"

namespace loom::transport::shm {

void HandoffPolicy::copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (!kernels::handoffStreams(bytes)) {
    if (bytes) std::memcpy(d, s, bytes);
    return;
  }
  size_t done = 0;
  if (timed(bytes) && probeNext()) {
    using Clock = std::chrono::steady_clock;
    done = std::min(bytes, kProbeBytes);
    const auto start = Clock::now();
    std::memcpy(d, s, done);
    observe(done, std::chrono::duration<double, std::nano>(Clock::now() - start).count());
  }
  if (done == bytes) return;
  if (streaming_) kernels::copyForPeer(d + done, s + done, bytes - done);
  else std::memcpy(d + done, s + done, bytes - done);
}

bool HandoffPolicy::timed(size_t bytes) { return bytes >= kMinProbeBytes && kernels::handoffStreams(bytes); }

bool HandoffPolicy::probeNext() {
  if (!streaming_) return true;
  if (++sinceProbe_ < uint64_t(kProbeEvery)) return false;
  sinceProbe_ = 0;
  return true;
}

bool HandoffPolicy::mayPull(size_t bytes) {
  if (!timed(bytes)) return true;
  if (streaming_) return false;
  return ++pulls_ % uint64_t(kPullProbeEvery) != 0;
}

void HandoffPolicy::observe(size_t bytes, double ns) {
  const bool slow = double(bytes) < kSlowBytesPerNs * ns;
  if (!slow) {
    slowRun_ = 0;
    streaming_ = false;
  } else if (slowRun_ < 2 && ++slowRun_ == 2) {
    streaming_ = true;
  }
}

}  // namespace loom::transport::shm
