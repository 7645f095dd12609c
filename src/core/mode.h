// The buffer mode of this process: host pointers or CUDA device pointers.
// Chosen once, at the first communicator init, from LOOM_DEVICE.
#pragma once

#include "common/status.h"

namespace loom::core {

enum class Mode : int { kHost = 0, kCuda = 1 };
const char* modeName(Mode mode);

// Decides (once) and returns the mode, or why the requested one is unusable.
Result<Mode> processMode();

}  // namespace loom::core
