// The board: one shared-memory segment that every rank of a host-local
// group maps, for operations small enough to finish in one exchange.
//
// Each member has a sequence word on a cache line of its own,
// kBoardSlots data slots used in turn (operation s uses slot s %
// kBoardSlots), kBoardInlineSlots cache lines used in turn for data that
// fits in a few lines beside a stamp each, and kBoardCells 16-byte cells,
// four to a line, for data of at most 8 bytes (inlineData). A member writes
// its data for operation s into its slot (or its inline lines or cell,
// then stamps each with s), then publishes s; readers wait until a member's
// sequence (or the stamps) reach s and read the slot (or the lines they
// just fetched). A member publishes s only after it finished operation
// s-1, so once every member has published s - kBoardSlots + 1, nobody
// reads the slot of s - kBoardSlots any more and it can be reused for s
// (inline lines, k per operation: s - kBoardInlineSlots / k + 1; cells:
// s - kBoardCells + 1): a member that only writes (a Broadcast's root) can
// run that many operations, less one, ahead of its readers, and its
// readers then fetch one line per four tiny operations. No system
// call on the fast path: publishing is a store, waiting is a spin on a
// cache line. A waiter that runs out of spins sleeps on a futex on the
// sequence word's low half (FUTEX_WAIT on shared memory), and a publisher
// calls FUTEX_WAKE only when it sees a sleeper (a store-load pattern each
// side fences: see setAsymmetricFence).
//
// Setup: the leader create()s the segment (a sealed memfd, nothing in
// /dev/shm) and ships describe() to the members, which open() it through
// /proc/<pid>/fd (same user and PID namespace, like the shm transport);
// each member then join()s, which records its pid. Afterwards the leader may
// closeShared(): the mappings stay valid whoever exits first.
//
// Liveness: a member that dies never publishes again. alive() polls a pidfd
// per member (opened by watchMembers()), so a waiter can tell a dead member
// from a slow one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "transport/net/socket.h"
#include "transport/shm/inbox.h"

namespace loom::transport::shm {

struct BoardDescriptor {
  uint64_t magic = 0;  // kBoardDescriptorMagic
  uint64_t nonce = 0;
  uint64_t bytes = 0;      // size of the memfd
  uint64_t slotBytes = 0;  // data bytes per slot
  int32_t pid = 0;         // the leader, holding `memfd`
  int32_t memfd = -1;
  int32_t members = 0;
  uint32_t version = 0;
};
static_assert(sizeof(BoardDescriptor) == 48, "BoardDescriptor must keep its 48-byte layout");
static_assert(std::is_trivially_copyable_v<BoardDescriptor>);
inline constexpr uint64_t kBoardDescriptorMagic = 0x6472616F426D6F4CULL;  // "LomBoard"
inline constexpr int kBoardMaxMembers = 64;
inline constexpr int kBoardSlots = 8;         // per member
inline constexpr int kBoardInlineSlots = 1024;  // per member
// Data up to this size can travel on the slot's own cache line with its
// stamp (see Board::inlineData): one line for a reader to fetch, not two.
inline constexpr size_t kBoardInlineBytes = 56;
inline constexpr int kBoardCells = 4096;  // per member, four to a line
inline constexpr size_t kBoardCellBytes = 8;

// Where an operation's inline data travels: a line of its own (up to
// kBoardInlineBytes) or a cell (up to kBoardCellBytes).
enum class InlinePlace : uint8_t { kLine, kCell };
inline constexpr InlinePlace inlinePlaceFor(size_t bytes) {
  return bytes <= kBoardCellBytes ? InlinePlace::kCell : InlinePlace::kLine;
}
// How many lines (or cells) a member has to use in turn.
inline constexpr uint64_t inlineTurns(InlinePlace p) {
  return p == InlinePlace::kCell ? kBoardCells : kBoardInlineSlots;
}

class Board {
 public:
  Board() = default;
  // A member that joined leaves when its board is destroyed: waiters for
  // it see closed() instead of waiting for ever.
  ~Board() { leave(); }
  Board(Board&& other) noexcept { *this = std::move(other); }
  Board& operator=(Board&& other) noexcept;

  // The leader: a board for `members` members with `slotBytes` (a multiple
  // of 4096) of data per slot.
  static Result<Board> create(int members, size_t slotBytes);
  // A member: opens and checks the board `d` describes.
  static Result<Board> open(const BoardDescriptor& d);
  BoardDescriptor describe() const;
  // Records this process as member `member` (for watchMembers()).
  void join(int member);
  // Member `m` left the board (its communicator is gone) or exited.
  bool closed(int m) const { return line(m)->closed.load(std::memory_order_acquire) != 0 || !alive(m); }
  // The leader, once every member has opened the board.
  void closeShared() { memfd_.reset(); }
  // Opens a pidfd for every member that joined (after all did): alive()
  // can then tell when one has exited.
  void watchMembers();
  // False when member `m`'s process has exited (pidfds only; true when
  // none could be opened).
  bool alive(int m) const;

  bool valid() const { return map_.get() != nullptr; }
  int members() const { return members_; }
  size_t slotBytes() const { return slotBytes_; }
  std::byte* data(int member, uint64_t seq) const {
    return static_cast<std::byte*>(map_.get()) + dataOffset_ +
           (size_t(member) * kBoardSlots + size_t(seq % kBoardSlots)) * slotBytes_;
  }
  // Small data: inline lines (or cells) per member, used in turn, each
  // holding up to kBoardInlineBytes (kBoardCellBytes) and a stamp; `at`
  // picks one (modulo their number: kBoardInlineSlots lines, kBoardCells
  // cells). The writer fills inlineData(), then stamps it with the
  // operation's `seq` (stampInline()) before it publish()es `seq`; a reader
  // that sees inlineStamped() reads the data from the line it just fetched.
  // An operation may spread its data over several lines, each stamped.
  // publish() still follows: slot reuse and sleepers use it. Lines and
  // cells are apart: an operation may use either.
  std::byte* inlineData(InlinePlace p, int member, uint64_t at) const {
    return entryOf(p, member, at) + offsetof(InlineCell, data);
  }
  void stampInline(InlinePlace p, int member, uint64_t at, uint64_t seq) const {
    stampOf(p, member, at)->store(seq, std::memory_order_release);
  }
  bool inlineStamped(InlinePlace p, int member, uint64_t at, uint64_t seq) const {
    return stampOf(p, member, at)->load(std::memory_order_acquire) == seq;
  }
  // Spins up to `spins` rounds until member `m` stamped `seq` at `at`.
  bool waitInline(InlinePlace p, int m, uint64_t at, uint64_t seq, int spins) const;
  // Member `member` finished writing its data for operation `seq`.
  void publish(int member, uint64_t seq) const;
  // Every member agreed to fence asymmetrically (each registered with
  // AsymmetricFence::enable(FenceScope::kProcesses)): publish() then stores
  // without a full fence, and a waiter about to sleep pays with a
  // membarrier instead. All members must set the same value.
  void setAsymmetricFence(bool on) { asymmetric_ = on; }
  uint64_t seen(int member) const { return line(member)->seq.load(std::memory_order_acquire); }
  // Waits until member `m` has published `want`: spins `spins` rounds, then
  // sleeps on the futex for at most `sleepMs`. False when it has not yet.
  bool wait(int m, uint64_t want, int spins, int sleepMs) const;

 private:
  struct alignas(64) Line {
    std::atomic<uint64_t> seq;      // last operation published; its low half is the futex word
    std::atomic<uint32_t> waiters;  // members sleeping on it
    std::atomic<int32_t> pid;       // the member's process (join)
    std::atomic<uint32_t> closed;   // 1: the member left
  };
  // An inline line or cell: the stamp (the operation whose data follows),
  // then the data.
  template <size_t kBytes>
  struct Stamped {
    std::atomic<uint64_t> stamp;
    std::byte data[kBytes];
  };
  using InlineLine = Stamped<kBoardInlineBytes>;
  using InlineCell = Stamped<kBoardCellBytes>;
  static_assert(sizeof(InlineLine) == 64 && sizeof(InlineCell) == 16);
  static_assert(offsetof(InlineLine, data) == offsetof(InlineCell, data));
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  void leave();
  Line* line(int m) const { return reinterpret_cast<Line*>(static_cast<std::byte*>(map_.get()) + kPageBytes) + m; }
  // The start of a line or cell: its stamp, then its data (at the same
  // offset in both).
  std::byte* entryOf(InlinePlace p, int m, uint64_t at) const {
    auto* base = static_cast<std::byte*>(map_.get());
    if (p == InlinePlace::kCell) {
      return base + cellOffset_ + (size_t(m) * kBoardCells + size_t(at % kBoardCells)) * sizeof(InlineCell);
    }
    return base + 2 * kPageBytes + (size_t(m) * kBoardInlineSlots + size_t(at % kBoardInlineSlots)) * sizeof(InlineLine);
  }
  std::atomic<uint64_t>* stampOf(InlinePlace p, int m, uint64_t at) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(entryOf(p, m, at));
  }

  Mapping map_;
  int members_ = 0;
  size_t slotBytes_ = 0;
  size_t cellOffset_ = 0;
  size_t dataOffset_ = 0;
  uint64_t nonce_ = 0;
  int32_t leaderPid_ = 0;
  int member_ = -1;  // this process's place, once joined
  bool asymmetric_ = false;
  net::UniqueFd memfd_;  // the leader's, until closeShared()
  std::vector<net::UniqueFd> pidfds_;
};

}  // namespace loom::transport::shm
