// Buffer modes: host pointers, or CUDA device pointers ordered on streams.
// A property of each communicator, fixed at its init: LOOM_DEVICE gives
// the default (CommOptions::device), splits inherit their parent's.
#pragma once

#include <string>

#include "common/status.h"

namespace loom::core {

enum class Mode : int { kHost = 0, kCuda = 1 };
const char* modeName(Mode mode);

// "host", "cuda", or "auto"/"" (cuda exactly when a CUDA device answers):
// the mode, or why the requested one is unusable here.
Result<Mode> resolveMode(const std::string& want);

// The calling thread's choice for the communicators it creates next
// (loomSetBufferMode): "host", "cuda", or "" for LOOM_DEVICE.
void setThreadDevice(const std::string& want);
const std::string& threadDevice();

}  // namespace loom::core
