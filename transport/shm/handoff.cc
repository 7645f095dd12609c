#include "transport/shm/handoff.h"

namespace loom::transport::shm {

bool HandoffPolicy::probeNext(size_t bytes) {
  if (bytes < kProbeBytes) return false;
  if (!streaming_) return true;
  if (++sinceProbe_ < uint64_t(kProbeEvery)) return false;
  sinceProbe_ = 0;
  return true;
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
