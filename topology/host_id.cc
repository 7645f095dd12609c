#include "topology/host_id.h"

#include <unistd.h>

#include <fstream>

#include "common/settings.h"

namespace loom::topology {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string hostName() {
  char buf[256] = "";
  gethostname(buf, sizeof buf - 1);
  std::string name(buf);
  if (auto dot = name.find('.'); dot != std::string::npos) name.resize(dot);
  return name;
}

uint64_t hostHash() {
  auto cfg = settings::current();
  const std::string override = cfg->getString("NCCL_HOSTID");
  if (!override.empty()) return fnv1a("hostid:" + override);
  std::string id = hostName();
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (std::getline(boot, bootId)) id += ":" + bootId;
  return fnv1a(id);
}

}  // namespace loom::topology
