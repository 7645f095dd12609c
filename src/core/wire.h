// Byte layouts exchanged between processes during bootstrap and connection
// setup. All fields are little-endian fixed-size integers; every message
// starts with a magic so garbage is recognised at once.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/net/socket.h"

namespace loom::core::wire {

constexpr uint32_t kIdMagic = 0x4d4f4f4c;      // "LOOM" at the start of a unique id
constexpr uint32_t kIdVersion = 1;
constexpr uint32_t kHelloMagic = 0x6c6c6548;   // "Hell"
constexpr uint32_t kReplyMagic = 0x6c706552;   // "Repl"
constexpr uint32_t kMaxRanks = 1u << 20;
constexpr uint32_t kMaxNoticeBytes = 1024;
constexpr uint32_t kMaxReplyTextBytes = 4096;

// The 128-byte ncclUniqueId, as loom fills it.
struct UniqueIdPayload {
  uint32_t magic;
  uint32_t version;
  uint64_t secret[2];
  uint8_t rootAddr[net::SocketAddress::kEncodedSize];
  uint64_t nonce;  // distinguishes ids that share a root address
};
static_assert(sizeof(UniqueIdPayload) <= 128);

enum class HelloKind : uint32_t {
  kRootJoin = 1,       // rank -> rendezvous root, followed by RankInfo
  kBootstrapRing = 2,  // rank -> next rank on the bootstrap ring
  kData = 3,           // rank -> peer: one socket of a data connection
  kAbortNotice = 4,    // rank -> peer: "the communicator failed", followed by text
};

// First bytes on every connection. The secret comes from the unique id; a
// connection that does not present it is closed and logged.
struct Hello {
  uint32_t magic;
  uint32_t kind;
  uint64_t secret[2];
  uint64_t commHash;
  uint32_t fromRank;
  uint32_t toRank;   // or nranks for kRootJoin
  uint32_t channel;
  uint32_t index;    // socket index within a data connection
  uint32_t count;    // sockets in the data connection
  uint32_t payload;  // bytes that follow (RankInfo, notice text)
};

// What each rank tells the others about itself at init.
struct RankInfo {
  uint8_t listenAddr[net::SocketAddress::kEncodedSize];
  uint32_t pid;
  uint64_t hostHash;
  uint32_t mode;         // 0 host, 1 cuda
  uint32_t cudaDevice;   // or UINT32_MAX
  char hostname[64];
};

// A RankInfo from another process: its hostname may lack a terminator.
inline void terminate(RankInfo* info) { info->hostname[sizeof info->hostname - 1] = '\0'; }

// Root -> rank once everybody joined (status 0, then nranks RankInfo), or a
// failure (status != 0, then `length` bytes of text).
struct Reply {
  uint32_t magic;
  uint32_t status;
  uint32_t length;
  uint32_t reserved;
};

}  // namespace loom::core::wire
