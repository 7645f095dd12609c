#include "transport/registry.h"

#include <array>

#include "common/settings.h"
#include "transport/shm/transport.h"

namespace loom::transport {

Selection Selection::fromSettings() {
  auto cfg = settings::current();
  Selection s;
  s.shmDisabled = cfg->getBool("NCCL_SHM_DISABLE");
  return s;
}

std::span<const Backend* const> backends() {
  static const std::array<const Backend*, 1> table = {&shm::backend()};
  return table;
}

const Backend* choose(const PeerView& self, const PeerView& peer, const Selection& selection,
                      std::string* reasons) {
  for (const Backend* b : backends()) {
    std::string why = b->whyNot(self, peer, selection);
    if (why.empty()) return b;
    if (reasons) {
      if (!reasons->empty()) *reasons += "; ";
      *reasons += std::string(b->name()) + ": " + why;
    }
  }
  return nullptr;
}

const Backend* find(std::string_view name) {
  for (const Backend* b : backends())
    if (name == b->name()) return b;
  return nullptr;
}

}  // namespace loom::transport
