#include "transport/registry.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "common/settings.h"
#include "transport/cudaipc/transport.h"
#if LOOM_HAVE_VERBS
#include "transport/ib/transport.h"
#endif
#include "transport/loopback/transport.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

namespace loom::transport {

Selection Selection::fromSettings() {
  auto cfg = settings::current();
  Selection s;
  s.shmDisabled = cfg->getBool("NCCL_SHM_DISABLE");
  s.p2pDisabled = cfg->getBool("NCCL_P2P_DISABLE");
  s.ibDisabled = cfg->getBool("NCCL_IB_DISABLE");
  s.net = cfg->getString("NCCL_NET");
  return s;
}

namespace {

bool sameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

// The network backends: NCCL's name, loom's, and why one cannot be used
// here ("" when it can), best first.
struct Network {
  const char* ncclName;
  const char* loomName;
  std::string whyNot(const Selection& s) const {
    if (sameName(ncclName, "IB")) {
      if (s.ibDisabled) return "NCCL_IB_DISABLE=1";
#if LOOM_HAVE_VERBS
      std::string why;
      if (ib::usablePorts(&why).empty()) return why;
#else
      return "this build of loom has no verbs backend (libibverbs-dev was missing when it was built)";
#endif
    }
    return "";
  }
};
constexpr Network kNetworks[] = {{"IB", "ib"}, {"Socket", "tcp"}};

}  // namespace

Result<std::string> Selection::network() const {
  std::string known;
  for (const Network& n : kNetworks) {
    known += std::string(known.empty() ? "" : ", ") + n.ncclName;
    if (!net.empty() && !sameName(net, n.ncclName) && !sameName(net, n.loomName)) continue;
    const std::string why = n.whyNot(*this);
    if (why.empty()) return std::string(n.ncclName);
    if (!net.empty()) return invalidArgument(describeNet() + " cannot be used: " + why);
  }
  if (!net.empty()) return invalidArgument(describeNet() + " names no network backend; known: " + known);
  return internalError("no network backend can be used");
}

bool Selection::wantsNetwork(std::string_view ncclName) const {
  if (net.empty()) return true;
  for (const Network& n : kNetworks)
    if (sameName(ncclName, n.ncclName)) return sameName(net, n.ncclName) || sameName(net, n.loomName);
  return false;
}

bool Selection::requiresVerbs() const { return !net.empty() && wantsNetwork("IB"); }

uint32_t localTransports(const Selection& selection) {
  uint32_t bits = selection.shmDisabled ? 0 : kTransportShm;
#if LOOM_HAVE_VERBS
  if (!selection.ibDisabled && selection.wantsNetwork("IB") && !ib::usablePorts(nullptr).empty()) bits |= kTransportVerbs;
#endif
  return bits;
}

std::span<const Backend* const> backends() {
#if LOOM_HAVE_VERBS
  static const std::array<const Backend*, 3> table = {&cudaipc::backend(), &shm::backend(), &ib::backend()};
#else
  static const std::array<const Backend*, 2> table = {&cudaipc::backend(), &shm::backend()};
#endif
  return table;
}

const Backend* choose(const PeerView& self, const PeerView& peer, const Selection& selection,
                      std::string* reasons, const Backend* after) {
  auto all = backends();
  auto from = all.begin();
  if (after) from = std::find(all.begin(), all.end(), after) + 1;
  for (auto it = from; it < all.end(); ++it) {
    const Backend* b = *it;
    std::string why;
    for (MemoryType m : {self.memory, peer.memory}) {
      if (why.empty() && !b->moves(m) && !(m == MemoryType::kDevice && b->moves(MemoryType::kHostPinned)))
        why = std::string("it cannot move ") + memoryTypeName(m) + " memory";
    }
    if (why.empty()) why = b->whyNot(self, peer, selection);
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

std::unique_ptr<Connection> openNetwork(int peer, std::vector<net::UniqueFd> sockets, size_t stripeMin) {
  return tcp::open(peer, std::move(sockets), stripeMin);
}

std::unique_ptr<Connection> openSelf(int rank) { return loopback::open(rank); }

}  // namespace loom::transport
