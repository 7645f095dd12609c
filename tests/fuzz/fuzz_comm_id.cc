// Fuzz target `comm_id`: how a rank learns where the rendezvous is.
//   mode 0: NCCL_COMM_ID text -> SocketAddress::parse (numeric hosts only: a
//           fuzzer must never send DNS queries); an accepted address prints
//           as text that parses back to the same address.
//   mode 1: the 28-byte address encoding inside ids and messages ->
//           SocketAddress::decode; an accepted encoding re-encodes to the
//           same bytes and decodes to the same address.
//   mode 2: the 128-byte ncclUniqueId a user passes to init ->
//           decodeUniqueId; an accepted id names a usable IPv4/IPv6 root.
//
// Input: [mode : u8 % 3] then the text or bytes (zero-padded to 28 / 128).
#include <cstring>
#include <string>

#include "core/communicator.h"
#include "core/wire.h"
#include "fuzz_input.h"
#include "transport/net/socket.h"

namespace {

using loom::net::SocketAddress;

void parseText(std::string_view text) {
  auto addr = SocketAddress::parse(text, /*resolveNames=*/false);
  if (!addr.isOk()) {
    loom::Status s = addr.takeStatus();
    FUZZ_TRACE("parse: %s\n", s.message().c_str());
    FUZZ_CHECK(!s.message().empty());
    return;
  }
  FUZZ_TRACE("parse: %s\n", addr->toString().c_str());
  FUZZ_CHECK(addr->family() == AF_INET || addr->family() == AF_INET6);
  const std::string printed = addr->toString();
  auto again = SocketAddress::parse(printed, /*resolveNames=*/false);
  FUZZ_CHECK(again.isOk());
  FUZZ_CHECK(*again == *addr);
  uint8_t enc[SocketAddress::kEncodedSize];
  addr->encode(enc);
  auto decoded = SocketAddress::decode(enc);
  FUZZ_CHECK(decoded.isOk() && *decoded == *addr);
}

void decodeBytes(loom::fuzz::Input& in) {
  uint8_t enc[SocketAddress::kEncodedSize];
  in.bytes(enc, sizeof enc);
  auto addr = SocketAddress::decode(enc);
  FUZZ_TRACE("decode: %s\n", addr.isOk() ? addr->toString().c_str() : "refused");
  if (!addr.isOk()) return;
  uint8_t again[SocketAddress::kEncodedSize];
  addr->encode(again);
  FUZZ_CHECK(std::memcmp(enc, again, sizeof enc) == 0);
  auto decoded = SocketAddress::decode(again);
  FUZZ_CHECK(decoded.isOk() && *decoded == *addr);
  (void)addr->toString();
}

void decodeId(loom::fuzz::Input& in) {
  uint8_t id[loom::core::kUniqueIdBytes];
  in.bytes(id, sizeof id);
  SocketAddress root;
  uint64_t secret[2] = {0, 0};
  loom::Status s = loom::core::decodeUniqueId(id, &root, secret);
  FUZZ_TRACE("unique id: %s\n", s.isOk() ? root.toString().c_str() : s.message().c_str());
  if (!s.isOk()) {
    FUZZ_CHECK(s.code() == loom::Code::kInvalidArgument);
    return;
  }
  FUZZ_CHECK(root.family() == AF_INET || root.family() == AF_INET6);
  FUZZ_CHECK(root.port() != 0);
  loom::core::wire::UniqueIdPayload p;
  std::memcpy(&p, id, sizeof p);
  FUZZ_CHECK(secret[0] == p.secret[0] && secret[1] == p.secret[1]);
  (void)root.toString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::Input in(data, size);
  switch (in.u8() % 3) {
    case 0: parseText(in.rest()); break;
    case 1: decodeBytes(in); break;
    case 2: decodeId(in); break;
  }
  return 0;
}
