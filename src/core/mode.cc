#include "core/mode.h"

#include "device/device.h"

namespace loom::core {

const char* modeName(Mode mode) { return mode == Mode::kHost ? "host" : "cuda"; }

Result<Mode> resolveMode(const std::string& want) {
  if (want == "host") return Mode::kHost;
  if (want != "cuda" && want != "auto" && !want.empty()) {
    return invalidArgument("LOOM_DEVICE='" + want + "' is not one of auto, host, cuda");
  }
  device::Api* api = device::api();
  // A GPU whose driver is too old must not pass for no GPU: auto would take
  // host mode and be handed device pointers.
  if (api) LOOM_TRY(api->checkDriver());
  const int devices = api ? api->deviceCount() : 0;
  if (devices > 0) return Mode::kCuda;
  if (want == "cuda") {
    return invalidUsage(api ? "LOOM_DEVICE=cuda, but no CUDA device is usable here (no GPU, or no driver)"
                            : "LOOM_DEVICE=cuda, but this build of loom has no CUDA support (built without the "
                              "CUDA toolkit); use LOOM_DEVICE=host or auto");
  }
  return Mode::kHost;
}

namespace {
thread_local std::string tDevice;
}  // namespace

void setThreadDevice(const std::string& want) { tDevice = want; }
const std::string& threadDevice() { return tDevice; }

}  // namespace loom::core
