#include "core/mode.h"

#include <mutex>

#include "common/log.h"
#include "common/settings.h"

namespace loom::core {

const char* modeName(Mode mode) { return mode == Mode::kHost ? "host" : "cuda"; }

Result<Mode> processMode() {
  static std::once_flag once;
  static Status error;
  static Mode mode = Mode::kHost;
  std::call_once(once, [] {
    const std::string want = settings::current()->getString("LOOM_DEVICE");
    if (want == "host" || want == "auto" || want.empty()) {
      // The CUDA data path is not part of this build yet, so auto means host.
      mode = Mode::kHost;
      LOOM_INFO(log::kInit, "buffer mode: host (LOOM_DEVICE=%s)", want.c_str());
    } else if (want == "cuda") {
      error = invalidUsage("LOOM_DEVICE=cuda, but this build of loom has no CUDA data path yet; "
                           "use LOOM_DEVICE=host (host buffers) or auto");
    } else {
      error = invalidArgument("LOOM_DEVICE='" + want + "' is not one of auto, host, cuda");
    }
  });
  if (!error.isOk()) return error;
  return mode;
}

}  // namespace loom::core
