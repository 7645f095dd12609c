#include "transport/connection.h"

#include <string>

namespace loom::transport {

const char* memoryTypeName(MemoryType m) {
  switch (m) {
    case MemoryType::kHost: return "host";
    case MemoryType::kHostPinned: return "pinned host";
    case MemoryType::kDevice: return "device";
  }
  return "unknown";
}

namespace {

Status cannotMove(const Connection& c, const std::string& what, MemoryType m) {
  return invalidUsage(what + " " + memoryTypeName(m) + " memory on the " + c.kind() + " connection to rank " +
                      std::to_string(c.peer()) + ", which cannot move it");
}

}  // namespace

bool Region::spans(const void* base, size_t bytes, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(base);
  const auto* q = static_cast<const std::byte*>(p);
  return q >= b && n <= bytes && size_t(q - b) <= bytes - n;
}

Status Connection::checkPost(Transfer* t, const char* what) const {
  if (t == nullptr) return invalidArgument(std::string(what) + " with a null Transfer");
  if (t->data == nullptr && t->bytes > 0) {
    return invalidArgument(std::string(what) + " of " + std::to_string(t->bytes) + " bytes with a null buffer");
  }
  if (!moves(t->memory)) return cannotMove(*this, std::string(what) + " of", t->memory);
  if (t->region && (t->region->memory() != t->memory || !t->region->holds(t->data, t->bytes))) {
    return invalidArgument(std::string(what) + " of " + std::to_string(t->bytes) +
                           " bytes with a registered region that does not hold them");
  }
  t->progressed = 0;
  t->done = false;
  t->sunk = false;
  return Status::ok();
}

Status Connection::postSend(Transfer* t) {
  LOOM_TRY(checkPost(t, "send"));
  if (t->source && !produces()) {
    return invalidUsage(std::string("a ") + kind() + " connection cannot send from a producer (Transfer::source)");
  }
  return queueSend(t);
}

Status Connection::postRecv(Transfer* t) {
  LOOM_TRY(checkPost(t, "receive"));
  return queueRecv(t);
}

Result<std::unique_ptr<Region>> Connection::registerMemory(void* base, size_t bytes, MemoryType memory) {
  if (base == nullptr || bytes == 0) return invalidArgument("registering an empty buffer");
  if (!moves(memory)) return cannotMove(*this, "registering", memory);
  return std::make_unique<Region>(base, bytes, memory);
}

}  // namespace loom::transport
