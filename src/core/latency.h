// The latency path: small collectives of a communicator whose ranks all
// share one host run on a shared-memory board (transport/shm/board.h), in
// the calling thread. Each rank writes its contribution into its slot once
// and reads its peers' straight from theirs: one exchange, no plan, no
// connection, no system call unless a rank has to sleep. Reductions fold
// the ranks' data in rank order, as the direct algorithms do, so results
// are the same bits on every rank and as over the direct plans.
//
// Used in host mode for collectives whose data fits a slot and for which
// the cost model picks the direct algorithm (NCCL_ALGO can exclude it),
// grouped or not; everything else runs plans.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "core/bootstrap.h"
#include "core/op.h"
#include "core/tuning.h"
#include "transport/shm/board.h"
#include "transport/shm/handoff.h"

namespace loom::core {

class Communicator;

class LatencyPath {
 public:
  // Collective over the bootstrap: every rank of a single-host host-mode
  // communicator calls it, `wanted` or not (its settings may say no), so
  // ranks whose settings differ still exchange in step. Returns null on
  // every rank when any rank does not want the board or could not set it
  // up (logged): the communicator then runs plans only. `tuning`'s filter
  // (NCCL_ALGO without direct) can keep a collective off the board.
  // `cpusShared`: this rank's CPUs run other ranks too
  // (Communicator::cpusShared).
  static Result<std::unique_ptr<LatencyPath>> setup(Bootstrap& bootstrap, int rank, int nranks, bool wanted,
                                                    bool cpusShared, const TuningContext& tuning, Deadline deadline,
                                                    const std::atomic<bool>* abort);
  // Whether `op` runs here: a collective whose data fits a slot (and that
  // NCCL_ALGO lets run direct).
  bool takes(const OpDesc& op) const;
  // Runs `op` (with its resolved reduction) without blocking, so that the
  // engine can run it among other operations (a group that drives several
  // ranks from one thread); every rank calls it for the same operation.
  // start(), then step() until it returns true; while it returns false,
  // waitingFor() names the rank it waits for, checkWaited() fails when that
  // rank has left or died, and sleep() waits for it at most `ms`.
  void start(const OpDesc& op);
  bool step(bool* progressed);
  int waitingFor() const { return phase_ == Phase::kDone ? -1 : waiting_; }
  Status checkWaited(Communicator& comm) const;
  void sleep(int ms) const;
  // After start(), for a lone call in the calling thread: steps and waits
  // as the latency of a small operation wants (spin when every rank has a
  // CPU, yield when they share: Communicator::cpusShared() and
  // spinRounds()). False when a rank is still late: the engine then waits
  // for it, with its stall warnings, timeout and failure handling.
  bool finishSoon(bool cpusShared, int spinRounds);
  size_t slotBytes() const { return board_.slotBytes(); }

 private:
  LatencyPath(transport::shm::Board board, int rank, int nranks, bool cpusShared, const TuningContext& tuning);
  // Spins or yields (finishSoon's budget) until what step() waits for has
  // arrived (the awaited rank's sequence, or its stamp for inline data);
  // false when it has not.
  bool waitBriefly(bool cpusShared, int spinRounds) const;
  // True when every rank of `peers` has published `want`; else notes the
  // first that has not (waiting_, want_).
  bool allPublished(std::span<const int> peers, uint64_t want);
  // The same for an operation whose data travels inline: every rank of
  // `peers` stamped s_.
  bool allStamped(std::span<const int> peers);
  // Whether what step() waits for (waiting_, want_) has arrived, and
  // whether that is a stamp (inline data being read) or a sequence.
  bool arrived() const;
  bool waitsForStamp() const { return inline_ && phase_ == Phase::kRead; }
  // Inline places the current operation may take per rank (cells: one),
  // and where its j-th sits.
  uint64_t inlineStride() const {
    return place_ == transport::shm::InlinePlace::kCell ? 1 : uint64_t(lineStride_);
  }
  uint64_t inlineAt(int j) const { return s_ * inlineStride() + uint64_t(j); }
  // Rank q's contribution, contiguous (gathered from its lines into
  // gather_ when it spans several).
  const std::byte* dataOf(int q);
  void publish();  // this rank's contribution for the current operation
  void finish();   // the result, once what it reads is published

  transport::shm::Board board_;
  transport::shm::HandoffPolicy handoff_;  // how contributions are copied into the board
  int rank_;
  int nranks_;
  std::vector<int> others_;  // every rank but this one
  uint64_t seq_ = 0;  // operations run on the board
  // The operation in progress.
  enum class Phase { kClaim, kRead, kDone };
  Phase phase_ = Phase::kDone;
  OpDesc op_{};
  uint64_t s_ = 0;      // its board sequence number
  // Where no rank shares its CPUs, contributions of up to this many inline
  // lines travel inline: each line carries its own stamp, so a reader
  // fetches data and stamps together, the lines in parallel, instead of a
  // slot's sequence and then its data (2 ranks, AllReduce of 64 / 128 /
  // 256 B: 0.37 / 0.36 / 0.39 us in a slot, 0.29 / 0.31 / 0.35 inline; of
  // 448 B on 8 lines no faster). Where ranks share CPUs, one line: 4 ranks
  // on 2 cores, 128 B took 2.3 us inline against 1.9 in a slot.
  static constexpr int kMaxInlineLines = 5;
  int lineStride_ = 1;  // lines an operation may use: kMaxInlineLines, or 1 where ranks share CPUs
  bool inline_ = false;  // its data fits the inline lines (every rank's)
  transport::shm::InlinePlace place_ = transport::shm::InlinePlace::kLine;  // then: lines or a cell
  int lines_ = 1;           // lines per rank
  size_t inlineBytes_ = 0;  // bytes per rank
  uint64_t waitAt_ = 0;     // the line or cell waited for (waiting_, want_)
  std::vector<std::byte> gather_;  // dataOf()'s, kMaxInlineLines lines per rank
  int waiting_ = -1;    // the rank it waits for, and for which sequence
  uint64_t want_ = 0;
  // Per rank: a sequence number it is known to have published (read from
  // the board earlier), so that checks it passes cost no cache miss.
  std::array<uint64_t, transport::shm::kBoardMaxMembers> known_{};
  // Per OpKind: the largest tuningBytes() run here (0: none, or not a kind it runs).
  std::array<size_t, kOpKindCount> maxBytes_{};
};

}  // namespace loom::core
