// The shared-memory inbox of one direction of a ShmConnection, and the
// descriptor a rank ships to its peer so the peer can open it.
//
// An inbox is an anonymous memfd (no name in /dev/shm, so nothing can leak
// there, even after kill -9) that its owner reads and its peer writes. It
// holds an InboxHeader and kSlots data slots of slotBytes each: a FIFO of
// slots indexed by two monotonically increasing step counters, `tail` (slots
// published by the writer) and `head` (slots consumed by the owner), slot i of
// step s being s % kSlots. Each counter has its own cache line.
//
// Beside the memfd the owner creates a wake pipe: the peer writes one byte to
// it when the owner has set `sleeping` (the owner is about to block in poll).
// A pipe and not an eventfd: an eventfd cannot be reopened through
// /proc/<pid>/fd (open fails with ENXIO); a pipe can.
//
// The peer opens both through /proc/<pid>/fd/<n> (same user, same PID
// namespace) and checks that they are the expected objects: the memfd's size
// and seals, the magic and nonce in the mapped header, the pipe's inode.
//
// The memfd is sealed against shrinking and growing, and its pages are
// allocated up front (fallocate, else MAP_POPULATE), so a short memory limit
// fails at creation with a message instead of SIGBUS later.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/status.h"
#include "transport/net/socket.h"

namespace loom::transport::shm {

inline constexpr uint64_t kDescriptorMagic = 0x637344686D536F4CULL;  // "LoSmDsc"
inline constexpr uint64_t kInboxMagic = 0x78626E49686D534CULL;       // "LShInbx"
inline constexpr uint32_t kLayoutVersion = 2;
inline constexpr uint32_t kSlots = 8;
inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kMinSlotBytes = kPageBytes;
inline constexpr size_t kMaxSlotBytes = size_t(128) << 20;

// Everything a peer needs to open an inbox. Plain data with a fixed layout:
// the lead ships it as bytes over the authenticated bootstrap connection.
struct ShmDescriptor {
  uint64_t magic = 0;       // kDescriptorMagic
  uint64_t nonce = 0;       // random; also stored in the inbox header
  uint64_t inboxBytes = 0;  // size of the memfd
  int32_t pid = 0;          // process holding the fds below
  int32_t memfd = -1;       // fd number of the inbox memfd in `pid`
  int32_t wakeFd = -1;      // fd number of the wake pipe's read end in `pid`
  uint32_t version = 0;     // kLayoutVersion
};
static_assert(sizeof(ShmDescriptor) == 40, "ShmDescriptor must keep its 40-byte layout");
static_assert(std::is_trivially_copyable_v<ShmDescriptor>);

enum class SlotKind : uint32_t {
  kCopy = 1,    // pieceBytes of the message at `offset` are in the slot's data
  kPull = 2,    // the whole message is at `addr` in the writer's memory
  kInline = 3,  // the whole message (at most kInlineBytes) is in the descriptor
};

inline constexpr size_t kInlineBytes = 24;

// One published slot, written by the writer before it advances `tail`. One
// cache line, so a small message costs the reader two lines: tail and this.
struct alignas(64) SlotDesc {
  uint64_t seq;         // message sequence number in this direction
  uint64_t totalBytes;  // size of the whole message
  uint64_t offset;      // kCopy: where this piece starts in the message
  uint64_t addr;        // kPull: the message's address in the writer process
  uint32_t pieceBytes;  // kCopy: bytes in the slot
  uint32_t kind;        // SlotKind
  uint8_t inlineData[kInlineBytes];  // kInline: the message
};
static_assert(sizeof(SlotDesc) == 64, "SlotDesc must fill exactly one cache line");

// Owner's verdict on reading the writer's memory with process_vm_readv.
enum PullState : uint32_t { kPullUnknown = 0, kPullOk = 1, kPullNo = 2 };

struct InboxHeader {
  // Written once by the owner before the descriptor is shared; read-only after.
  uint64_t magic;
  uint64_t nonce;
  uint32_t version;
  uint32_t slots;
  uint64_t slotBytes;
  uint64_t totalBytes;
  uint64_t dataOffset;
  uint64_t ownerAddr;  // address of this header in the owner's process
  uint64_t wakeIno;    // inode of the owner's wake pipe
  int32_t ownerPid;

  // Written by the owner, rarely.
  alignas(64) std::atomic<uint32_t> closed;     // 1: the owner destroyed its connection
  std::atomic<uint32_t> pullState;              // PullState
  // Written by the owner: slots consumed (and pull messages acknowledged).
  alignas(64) std::atomic<uint64_t> head;
  // Set by the owner before it blocks; cleared by whoever wakes it.
  alignas(64) std::atomic<uint32_t> sleeping;
  // Written by the writer: slots published.
  alignas(64) std::atomic<uint64_t> tail;
  SlotDesc desc[kSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared flags must be lock-free");

// Owns one MAP_SHARED mapping. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t bytes) : addr_(addr), bytes_(bytes) {}
  ~Mapping() { reset(); }
  Mapping(Mapping&& other) noexcept : addr_(other.addr_), bytes_(other.bytes_) {
    other.addr_ = nullptr;
    other.bytes_ = 0;
  }
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* get() const { return addr_; }
  size_t bytes() const { return bytes_; }
  void reset();

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

// One inbox as seen by one process: either its own (memfd, both pipe ends) or
// its peer's (the mapping and a pipe fd opened for writing wake-ups).
class Inbox {
 public:
  Inbox() = default;
  Inbox(Inbox&&) = default;
  Inbox& operator=(Inbox&&) = default;

  // Creates this process's inbox with kSlots slots of slotBytes (a multiple
  // of kPageBytes). Capacity failures name the fix.
  static Result<Inbox> create(size_t slotBytes, uint64_t nonce);
  // Opens and verifies the inbox `d` describes; `peerRank` is for messages.
  static Result<Inbox> open(const ShmDescriptor& d, int peerRank);

  // Describes an inbox made by create().
  ShmDescriptor describe() const;

  // The shared header. Only its counters and flags may be read after
  // create()/open(): the peer can write all of it, so the layout is kept
  // in private members, validated once.
  InboxHeader* header() const { return static_cast<InboxHeader*>(map_.get()); }
  uint8_t* slot(uint64_t step) const {
    return static_cast<uint8_t*>(map_.get()) + dataOffset_ + (step % kSlots) * slotBytes_;
  }
  size_t slotBytes() const { return slotBytes_; }
  uint64_t nonce() const { return nonce_; }
  size_t totalBytes() const { return map_.bytes(); }
  bool valid() const { return map_.get() != nullptr; }

  // Own inbox: the pipe end to poll (POLLIN) and one always writable
  // (POLLOUT) for an immediate wake-up; drains pending wake bytes.
  int wakeReadFd() const { return wakeRead_.get(); }
  int wakeWriteFd() const { return wakeWrite_.get(); }
  void drainWakeups() const;
  // Peer's inbox: writes one wake byte (a full pipe is already readable).
  void signal() const;

 private:
  Mapping map_;
  size_t slotBytes_ = 0;   // private copies of the validated layout
  size_t dataOffset_ = 0;
  uint64_t nonce_ = 0;
  int32_t ownerPid_ = 0;
  net::UniqueFd memfd_;      // own inbox: kept open for the peer to reopen
  net::UniqueFd wakeRead_;   // own inbox: read end
  net::UniqueFd wakeWrite_;  // own inbox: write end; peer inbox: the reopened pipe
};

}  // namespace loom::transport::shm
