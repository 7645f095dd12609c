// Byte layouts exchanged between processes during bootstrap and connection
// setup. All fields are little-endian fixed-size integers; every message
// starts with a magic so garbage is recognised at once.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

#include "topology/schedule.h"
#include "transport/net/socket.h"

namespace loom::core::wire {

constexpr uint32_t kIdMagic = 0x4d4f4f4c;      // "LOOM" at the start of a unique id
constexpr uint32_t kIdVersion = 1;
constexpr uint32_t kHelloMagic = 0x6c6c6548;   // "Hell"
constexpr uint32_t kReplyMagic = 0x6c706552;   // "Repl"
constexpr uint32_t kMaxRanks = 1u << 20;
constexpr uint32_t kMaxNoticeBytes = 1024;
constexpr uint32_t kMaxReplyTextBytes = 4096;
constexpr uint32_t kMaxChannels = 32;  // data connections per peer pair

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
  kShrink = 5,         // rank -> the shrink's leader, over the parent: ShrinkRequest, then a Reply
};

// ncclCommShrink: what a member sends its leader after the hello (then its
// RankInfo blob for the child).
struct ShrinkRequest {
  uint64_t exclusion;  // hash of the excluded ranks and the shrink's number
  uint32_t blobBytes;
  uint32_t reserved;
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
  uint32_t payload;  // bytes that follow (a RankInfo blob, notice text)
};

// What each rank tells the others about itself at init. On the wire it is
// a versioned, variable-length blob (transport/endpoint.h's rules): version
// kRankInfoVersion, then the fields below in order, the hostname as a
// string. A new field means a new version; ranks of different versions
// refuse each other with a message that names both.
struct RankInfo {
  uint8_t listenAddr[net::SocketAddress::kEncodedSize] = {};
  uint32_t pid = 0;
  uint64_t hostHash = 0;
  uint32_t mode = 0;                 // 0 host, 1 cuda
  uint32_t cudaDevice = UINT32_MAX;  // or UINT32_MAX
  std::string gpuUuid;               // cuda mode: the device's UUID (hex), at most kMaxUuidBytes
  // Where the rank sits in its host's topology, and the host's NICs: every
  // rank builds the same rings and trees from these (topology/schedule.h).
  int32_t numa = -1;
  std::vector<std::string> pciPath;  // at most kMaxPciDepth bus ids
  std::vector<topology::NicPlace> nics;  // at most kMaxNics
  std::string hostname;              // at most kMaxHostnameBytes
  uint32_t transports = 0;           // transport::kTransport* bits this rank can use
  uint32_t flags = 0;                // kRankFlag* bits: what this rank's settings ask of all
  // The CPUs the rank may run on (topology::currentCpuMask(), at most
  // kMaxCpuWords words): whether ranks of one host share CPUs.
  std::vector<uint64_t> cpuMask;
  // The channels this rank's settings and config ask for: the communicator
  // opens the fewest any rank asks for (every rank must address the same).
  uint32_t channels = 1;
};
// 2: gpuUuid (before the hostname). 3: numa, pciPath, nics (before the hostname).
// 4: transports (after the hostname). 5: flags (after transports).
// 6: cpuMask (after flags). 7: channels (after cpuMask).
constexpr uint32_t kRankInfoVersion = 7;
// Settings every rank must share to take effect: a rank that asks alone
// must not start something its peers will not join.
constexpr uint32_t kRankFlagCalibrate = 1u << 0;  // LOOM_CALIBRATE
constexpr uint32_t kRankFlagCheckCollectives = 1u << 1;  // LOOM_CHECK_COLLECTIVES
constexpr size_t kMaxPciDepth = 16;
constexpr size_t kMaxNics = 32;
constexpr size_t kMaxNameBytes = 64;  // a bus id or NIC name
constexpr size_t kMaxUuidBytes = 64;
constexpr size_t kMaxHostnameBytes = 255;
constexpr size_t kMaxCpuWords = 64;  // 4096 CPUs
constexpr uint32_t kMaxRankInfoBytes = 64 << 10;  // room for what later versions carry

std::vector<uint8_t> encode(const RankInfo& info);
// Any bytes: an error (kRemoteError) unless a whole blob of this version.
Result<RankInfo> decodeRankInfo(std::span<const uint8_t> blob);

// A table of blobs, each preceded by its length (u32): the rendezvous root
// sends each rank two (its ring neighbours'), a shrink's leader all members'.
constexpr uint64_t kMaxTableBytes = uint64_t(1) << 30;
void appendTableEntry(std::span<const uint8_t> blob, std::vector<uint8_t>* table);
Result<std::vector<RankInfo>> decodeTable(std::span<const uint8_t> table, int nranks);

// Root -> rank once everybody joined (status 0, then a table of RankInfo
// blobs), or a failure (status != 0, then `length` bytes of text).
struct Reply {
  uint32_t magic;
  uint32_t status;
  uint32_t length;
  uint32_t reserved;
};

}  // namespace loom::core::wire
