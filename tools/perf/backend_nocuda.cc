// Built without CUDA: only host buffers exist.
#include "tools/perf/backend.h"

namespace loom::perf {

std::unique_ptr<Backend> makeCudaBackend(std::string* why) {
  *why = "the perf tools were built without CUDA";
  return nullptr;
}

}  // namespace loom::perf
