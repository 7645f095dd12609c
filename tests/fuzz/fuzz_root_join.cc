// Fuzz target `root_join`: the rendezvous root's reading of join requests
// (wire::Hello followed by the joining rank's RankInfo blob), checked by
// checkJoin against the root's secret and the nranks announced so far.
//
// Input: [nranksSoFar : u8] then join requests: sizeof(Hello) bytes (the
// last one zero-padded), then the blob: the hello's payload bytes, fewer
// when the input ends first (the root reads exactly the payload, so a
// shorter blob stands for one a liar announced wrongly). Like the root, the
// first accepted request fixes nranks for the ones after it.
#include <algorithm>
#include <cstring>
#include <span>
#include <set>
#include <string>

#include "core/root.h"
#include "core/wire.h"
#include "fuzz_input.h"

namespace {

constexpr uint64_t kSecret[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr int kMaxRequests = 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  using namespace loom::core;
  fuzz::Input in(data, size);
  int nranksSoFar = in.u8();
  std::set<uint32_t> joined;
  for (int i = 0; i < kMaxRequests && !in.empty(); ++i) {
    const auto h = in.take<wire::Hello>();
    const std::string_view raw = in.view(std::min<size_t>(h.payload, wire::kMaxRankInfoBytes + 1));
    const std::span<const uint8_t> payload(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
    wire::RankInfo info;
    Status s = checkJoin(h, payload, &info, kSecret, nranksSoFar);
    FUZZ_TRACE("join %d: %s\n", i, s.isOk() ? "accepted" : s.message().c_str());
    if (!s.isOk()) {
      FUZZ_CHECK(s.code() == Code::kInvalidArgument && !s.message().empty());
      continue;
    }
    // Accepted: what the root then relies on.
    FUZZ_CHECK(h.magic == wire::kHelloMagic && h.kind == uint32_t(wire::HelloKind::kRootJoin));
    FUZZ_CHECK(h.secret[0] == kSecret[0] && h.secret[1] == kSecret[1]);
    FUZZ_CHECK(h.payload == payload.size() && h.payload <= wire::kMaxRankInfoBytes);
    FUZZ_CHECK(h.toRank >= 1 && h.toRank <= wire::kMaxRanks);
    FUZZ_CHECK(nranksSoFar == 0 || h.toRank == uint32_t(nranksSoFar));
    FUZZ_CHECK(h.fromRank < h.toRank);  // indexes the root's table of toRank entries
    FUZZ_CHECK(info.hostname.size() <= wire::kMaxHostnameBytes);
    // The root passes the blob on as it came: it must be exactly what the
    // decoded info encodes to (nothing unchecked rides along).
    const auto again = wire::encode(info);
    FUZZ_CHECK(again.size() == payload.size() && std::equal(again.begin(), again.end(), payload.begin()));
    if (nranksSoFar == 0) nranksSoFar = int(h.toRank);
    joined.insert(h.fromRank);
    // The root prints the rank's address and host in its messages.
    std::string host = info.hostname;
    auto addr = net::SocketAddress::decode(info.listenAddr);
    if (addr.isOk()) host += " " + addr->toString();
  }
  FUZZ_CHECK(joined.size() <= size_t(nranksSoFar));
  return 0;
}
