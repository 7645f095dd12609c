// Fuzz target `hello`: the first bytes a rank's listener reads from a
// stranger (wire::Hello and its payload, checked by checkHello), and the
// rendezvous root's answer as the joining rank reads it (wire::Reply and the
// table of RankInfo blobs or failure text after it, checked by
// checkRootReply and wire::decodeTable).
//
// Input: [nranks - 1 : u8] then the bytes on the wire, read both as a Hello
// (+ payload) and as a Reply (+ what follows), as the two readers would.
#include <cstring>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/wire.h"
#include "fuzz_input.h"

namespace loom::core {
namespace {

// The listener's own rank: what a valid hello must name.
Bootstrap::Identity listenerIdentity() {
  Bootstrap::Identity id;
  id.secret[0] = 0x0123456789abcdefull;
  id.secret[1] = 0xfedcba9876543210ull;
  id.commHash = 0x5eed5eed5eed5eedull;
  id.rank = 1;
  id.nranks = 4;
  return id;
}

// What Bootstrap::service() does with the bytes of one connection.
void listenerReads(std::string_view wireBytes) {
  static const Bootstrap::Identity self = listenerIdentity();
  fuzz::Input in(reinterpret_cast<const uint8_t*>(wireBytes.data()), wireBytes.size());
  if (in.left() < sizeof(wire::Hello)) return;  // still waiting for it
  const auto h = in.take<wire::Hello>();
  Status s = checkHello(h, self);
  FUZZ_TRACE("hello: %s\n", s.isOk() ? "accepted" : s.message().c_str());
  if (!s.isOk()) {
    FUZZ_CHECK(s.code() == Code::kInvalidArgument && !s.message().empty());
    return;
  }
  // Accepted: everything the caller goes on to trust must hold.
  FUZZ_CHECK(h.magic == wire::kHelloMagic);
  FUZZ_CHECK(h.secret[0] == self.secret[0] && h.secret[1] == self.secret[1]);
  FUZZ_CHECK(h.commHash == self.commHash);
  FUZZ_CHECK(h.toRank == uint32_t(self.rank) && h.fromRank < uint32_t(self.nranks));
  FUZZ_CHECK(h.kind >= uint32_t(wire::HelloKind::kBootstrapRing) &&
             h.kind <= uint32_t(wire::HelloKind::kShrink));
  FUZZ_CHECK(h.payload <= wire::kMaxNoticeBytes);  // bounds service()'s stack buffer
  if (h.kind == uint32_t(wire::HelloKind::kData)) {
    FUZZ_CHECK(h.count >= 1 && h.count <= 16 && h.index < h.count);
  }
  std::string_view payload = in.view(h.payload);
  if (payload.size() == h.payload && h.kind == uint32_t(wire::HelloKind::kAbortNotice)) {
    Notice notice{int(h.fromRank), std::string(payload)};
    FUZZ_CHECK(notice.fromRank >= 0 && notice.fromRank < self.nranks);
  }
}

// What Bootstrap::joinRoot() does with the root's answer.
void rankReadsReply(std::string_view wireBytes, int nranks) {
  fuzz::Input in(reinterpret_cast<const uint8_t*>(wireBytes.data()), wireBytes.size());
  if (in.left() < sizeof(wire::Reply)) return;
  const auto reply = in.take<wire::Reply>();
  Status s = checkRootReply(reply, nranks);
  FUZZ_TRACE("reply for %d ranks: %s\n", nranks, s.isOk() ? "accepted" : s.message().c_str());
  if (!s.isOk()) {
    FUZZ_CHECK(s.code() == Code::kRemoteError && !s.message().empty());
    return;
  }
  FUZZ_CHECK(reply.magic == wire::kReplyMagic);
  if (reply.status != 0) {
    FUZZ_CHECK(reply.length <= wire::kMaxReplyTextBytes);  // the rank allocates this much
    std::string text(reply.length, '\0');
    in.bytes(text.data(), text.size());
    return;
  }
  // The rank allocates reply.length bytes.
  FUZZ_CHECK(reply.length >= uint64_t(nranks) * 8 && reply.length <= wire::kMaxTableBytes);
  const std::string_view raw = in.view(reply.length);
  auto table = wire::decodeTable({reinterpret_cast<const uint8_t*>(raw.data()), raw.size()}, nranks);
  FUZZ_TRACE("table: %s\n", table.isOk() ? "decoded" : table.status().message().c_str());
  if (!table.isOk()) {
    FUZZ_CHECK(table.status().code() == Code::kRemoteError && !table.status().message().empty());
    return;
  }
  FUZZ_CHECK(table->size() == size_t(nranks));
  for (const auto& info : *table) {
    FUZZ_CHECK(info.hostname.size() <= wire::kMaxHostnameBytes);
    auto addr = net::SocketAddress::decode(info.listenAddr);
    if (addr.isOk()) (void)addr->toString();
  }
}

}  // namespace
}  // namespace loom::core

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int nranks = 1 + data[0];
  std::string_view wireBytes(reinterpret_cast<const char*>(data + 1), size - 1);
  loom::core::listenerReads(wireBytes);
  loom::core::rankReadsReply(wireBytes, nranks);
  return 0;
}
