#include "core/latency.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "common/asymmetric_fence.h"
#include "common/log.h"
#include "core/communicator.h"
#include "kernels/reduce.h"

namespace loom::core {
namespace {

// Slots: 128 KiB each, less from 5 ranks on (kBoardSlots per rank). 128
// KiB against 64 (2 cores, medians of 6-8 alternating rounds, time with
// over time without): AllReduce of 128 KiB 0.84 / 0.86 on 2 ranks and
// 0.67 / 0.64 on 4, ReduceScatter 0.84 / 1.00 and 0.59 / 0.57, Broadcast
// 0.90 / 0.92 and 0.63 / 0.50.
constexpr size_t kMaxSlotBytes = size_t(128) << 10;
constexpr size_t kBoardBudget = size_t(4) << 20;
// AllGather keeps to 64 KiB per rank: 2 ranks gathering 256 KiB on the
// board took 1.15x the time of the ring, whose own blocks go single-copy.
constexpr size_t kMaxGatherBlockBytes = size_t(64) << 10;
constexpr int kYields = 32;  // after the spins, before the engine takes over
constexpr int kSharedYields = 2000;  // ranks share CPUs: yield instead of spinning
// Spins come in chunks of this many looks (some 25 us) with a yield between;
// when another thread ran meanwhile, this CPU is shared and the engine
// takes over, to sleep (Engine's kSpinYieldEvery says why).
constexpr int kSpinChunk = 1024;

size_t slotBytesFor(int nranks) {
  size_t per = kBoardBudget / (size_t(transport::shm::kBoardSlots) * size_t(nranks));
  per = per / 4096 * 4096;
  return std::clamp<size_t>(per, 4096, kMaxSlotBytes);
}

}  // namespace

LatencyPath::LatencyPath(transport::shm::Board board, int rank, int nranks, bool cpusShared,
                         const TuningContext& tuning)
    : board_(std::move(board)), rank_(rank), nranks_(nranks) {
  lineStride_ = cpusShared ? 1 : kMaxInlineLines;
  for (int q = 0; q < nranks; ++q)
    if (q != rank) others_.push_back(q);
  gather_.resize(size_t(nranks) * kMaxInlineLines * transport::shm::kBoardInlineBytes);
  // The board takes every operation its slots hold (it is the direct
  // algorithm without syscalls or connections), unless NCCL_ALGO leaves
  // direct out. Measured on 4, 8 and 16 ranks sharing 2 cores (AllReduce,
  // and the four others on 8 ranks), it beat whatever plan the cost model
  // picks at every size it holds: AllReduce of 16 KiB on 8 ranks in 32-40
  // us against 90 us, of 32 KiB on 16 ranks in 135-140 us against 272-380.
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast,
                      OpKind::kReduce}) {
    const size_t capacity = kind == OpKind::kAllGather
                                ? std::min(board_.slotBytes(), kMaxGatherBlockBytes) * size_t(nranks)
                                : board_.slotBytes();
    maxBytes_[size_t(kind)] = tuning.filter.allows(kind, Algorithm::kDirect) ? capacity : 0;
  }
}

Result<std::unique_ptr<LatencyPath>> LatencyPath::setup(Bootstrap& bootstrap, int rank, int nranks, bool wanted,
                                                        bool cpusShared, const TuningContext& tuning,
                                                        Deadline deadline, const std::atomic<bool>* abort) {
  using transport::shm::Board;
  using transport::shm::BoardDescriptor;
  std::vector<BoardDescriptor> descs(static_cast<size_t>(nranks));
  Result<Board> board = internalError("not wanted here (LOOM_LATENCY_PATH, NCCL_PROTO or NCCL_SHM_DISABLE)");
  if (rank == 0 && wanted) {
    board = Board::create(nranks, slotBytesFor(nranks));
    if (board.isOk()) descs[0] = board->describe();
  }
  LOOM_TRY(bootstrap.allGather(descs.data(), sizeof(BoardDescriptor), deadline, abort));
  if (rank != 0 && wanted)
    board = descs[0].magic ? Board::open(descs[0]) : Result<Board>(remoteError("rank 0 has no board"));
  if (board.isOk()) board->join(rank);
  // Bit 0: this rank has the board; bit 1: it can fence asymmetrically;
  // bit 2: its CPUs run other ranks too.
  std::vector<uint8_t> ok(static_cast<size_t>(nranks));
  ok[size_t(rank)] =
      board.isOk() ? 1 | (AsymmetricFence::enable(FenceScope::kProcesses) ? 2 : 0) | (cpusShared ? 4 : 0) : 0;
  LOOM_TRY(bootstrap.allGather(ok.data(), 1, deadline, abort));
  bool asymmetric = true, anyShares = false;
  for (int r = 0; r < nranks; ++r) {
    asymmetric = asymmetric && (ok[size_t(r)] & 2);
    anyShares = anyShares || (ok[size_t(r)] & 4);
    if (!ok[size_t(r)]) {
      LOOM_INFO(log::kInit, "rank %d: no shared-memory board (the latency path) because rank %d has none%s%s",
                rank, r, r == rank ? ": " : "", r == rank ? board.status().message().c_str() : "");
      return std::unique_ptr<LatencyPath>();
    }
  }
  // Everyone has opened it and joined.
  board->setAsymmetricFence(asymmetric);
  board->closeShared();
  board->watchMembers();
  std::unique_ptr<LatencyPath> path(new LatencyPath(std::move(board.value()), rank, nranks, anyShares, tuning));
  LOOM_INFO(log::kInit, "rank %d: latency path on a shared-memory board: %zu-byte slots, inline data up to %zu bytes%s",
            rank, path->slotBytes(), size_t(path->lineStride_) * transport::shm::kBoardInlineBytes,
            anyShares ? " (ranks share CPUs: one line)" : "");
  return path;
}

bool LatencyPath::takes(const OpDesc& op) const {
  // tuningBytes(): the whole vector (AllGather's output, ReduceScatter's
  // input). Kinds the board does not run have 0 here.
  const size_t bytes = op.count * kernels::dataTypeSize(op.type) *
                       (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ? size_t(nranks_) : 1);
  const size_t most = maxBytes_[size_t(op.kind)];
  return most != 0 && op.count != 0 && bytes <= most;
}

bool LatencyPath::arrived() const {
  return waitsForStamp() ? board_.inlineStamped(place_, waiting_, waitAt_, want_) : board_.seen(waiting_) >= want_;
}

bool LatencyPath::waitBriefly(bool cpusShared, int spinRounds) const {
  if (arrived()) return true;
  // Every rank has a CPU: spin (pause-spins cost a fraction of an engine
  // round). Ranks share CPUs: the one we wait for may be waiting for ours,
  // so hand it over at once.
  if (!cpusShared) {
    for (int left = spinRounds * 8; left > 0; left -= kSpinChunk) {
      const int spins = std::min(left, kSpinChunk);
      if (waitsForStamp() ? board_.waitInline(place_, waiting_, waitAt_, want_, spins)
                          : board_.wait(waiting_, want_, spins, 0))
        return true;
      if (yieldSawOthers()) return arrived();
    }
  }
  for (int i = 0; i < (cpusShared ? kSharedYields : kYields); ++i) {
    sched_yield();
    if (arrived()) return true;
  }
  return false;
}

bool LatencyPath::finishSoon(bool cpusShared, int spinRounds) {
  bool progressed = false;
  while (!step(&progressed)) {
    if (!waitBriefly(cpusShared, spinRounds)) return false;
  }
  return true;
}

void LatencyPath::start(const OpDesc& op) {
  op_ = op;
  s_ = ++seq_;
  phase_ = Phase::kClaim;
  waiting_ = -1;
  // The largest contribution any rank writes (the same on every rank).
  const size_t bytes = op.count * kernels::dataTypeSize(op.type);
  const size_t most = op.kind == OpKind::kReduceScatter ? bytes * size_t(nranks_) : bytes;
  using transport::shm::kBoardInlineBytes;
  inline_ = most <= size_t(lineStride_) * kBoardInlineBytes;
  place_ = transport::shm::inlinePlaceFor(most);
  lines_ = int((most + kBoardInlineBytes - 1) / kBoardInlineBytes);  // a cell's data is one line's at most
  inlineBytes_ = most;
}

bool LatencyPath::allPublished(std::span<const int> peers, uint64_t want) {
  for (int q : peers) {
    uint64_t& known = known_[size_t(q)];
    if (known >= want) continue;
    known = board_.seen(q);
    if (known < want) {
      waiting_ = q;
      want_ = want;
      return false;
    }
  }
  waiting_ = -1;
  return true;
}

bool LatencyPath::allStamped(std::span<const int> peers) {
  for (int q : peers) {
    for (int j = 0; j < lines_; ++j) {
      if (!board_.inlineStamped(place_, q, inlineAt(j), s_)) {
        waiting_ = q;
        waitAt_ = inlineAt(j);
        want_ = s_;
        return false;
      }
    }
    // It stamped s_ after it finished s_ - 1, which it published.
    known_[size_t(q)] = std::max(known_[size_t(q)], s_ - 1);
  }
  waiting_ = -1;
  return true;
}

void LatencyPath::publish() {
  const OpDesc& op = op_;
  const int n = nranks_;
  const size_t es = kernels::dataTypeSize(op.type);
  const size_t bytes = op.count * es;
  const auto* send = static_cast<const std::byte*>(op.sendbuf);
  // This rank's contribution (pre-multiplied for PreMulSum). A Broadcast's
  // readers have none, and nobody reads their lines: only their published
  // sequence (slot reuse) counts.
  const size_t contribution = op.kind == OpKind::kReduceScatter ? bytes * size_t(n)
                              : op.kind == OpKind::kBroadcast && rank_ != op.root ? 0
                                                                                   : bytes;
  if (contribution) {
    const bool premultiply = isReducing(op.kind) && op.reduction.op == kernels::RedOp::kPreMulSum;
    kernels::Reduction red = op.reduction;
    if (premultiply && op.scalarPtr) std::memcpy(&red.scalar, op.scalarPtr, es);
    if (inline_) {
      // Line by line (whole elements: 56 bytes hold 1, 2, 4 or 8-byte
      // ones), each stamped once its data is in.
      for (int j = 0; j < lines_; ++j) {
        const size_t at = size_t(j) * transport::shm::kBoardInlineBytes;
        const size_t n = std::min(transport::shm::kBoardInlineBytes, contribution - at);
        std::byte* mine = board_.inlineData(place_, rank_, inlineAt(j));
        if (premultiply) kernels::reduce(red, mine, nullptr, 0, send + at, n / es, false);
        else kernels::copySmall(mine, send + at, n);
        board_.stampInline(place_, rank_, inlineAt(j), s_);
      }
    } else {
      std::byte* mine = board_.data(rank_, s_);
      if (premultiply) kernels::reduce(red, mine, nullptr, 0, send, contribution / es, false);
      else handoff_.copy(mine, send, contribution);
    }
  }
  board_.publish(rank_, s_);
  // AllGather out of place: its own block now, while the peers' arrive
  // (2 ranks, 64 KiB, bound: 4.5-4.7 -> 4.4 us).
  if (op.kind == OpKind::kAllGather) {
    std::byte* own = static_cast<std::byte*>(op.recvbuf) + size_t(rank_) * bytes;
    if (own != send) std::memcpy(own, send, bytes);
  }
}

const std::byte* LatencyPath::dataOf(int q) {
  using transport::shm::kBoardInlineBytes;
  if (!inline_) return board_.data(q, s_);
  if (lines_ == 1) return board_.inlineData(place_, q, inlineAt(0));
  std::byte* to = gather_.data() + size_t(q) * kMaxInlineLines * kBoardInlineBytes;
  for (int j = 0; j < lines_; ++j) {
    const size_t at = size_t(j) * kBoardInlineBytes;
    std::memcpy(to + at, board_.inlineData(place_, q, inlineAt(j)), std::min(kBoardInlineBytes, inlineBytes_ - at));
  }
  return to;
}

void LatencyPath::finish() {
  const OpDesc& op = op_;
  const int n = nranks_;
  const size_t es = kernels::dataTypeSize(op.type);
  const size_t bytes = op.count * es;
  const auto* send = static_cast<const std::byte*>(op.sendbuf);
  auto* recv = static_cast<std::byte*>(op.recvbuf);
  kernels::Reduction plain = op.reduction;  // every source is pre-multiplied already
  if (plain.op == kernels::RedOp::kPreMulSum) plain.op = kernels::RedOp::kSum;
  const void* sources[transport::shm::kBoardMaxMembers];
  switch (op.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter: {
      if (op.kind == OpKind::kReduce && rank_ != op.root) break;
      const size_t at = op.kind == OpKind::kReduceScatter ? size_t(rank_) * bytes : 0;
      // This rank's own part from its input (its board copy holds the same
      // bits, unless pre-multiplied): the line it just wrote, and which its
      // peers are reading, stays out of the fold (2 ranks, 8 B: 0.33 ->
      // 0.29 us).
      const bool premultiplied = op.reduction.op == kernels::RedOp::kPreMulSum;
      for (int q = 0; q < n; ++q) sources[q] = (q == rank_ && !premultiplied ? send : dataOf(q)) + at;
      kernels::reduce(plain, recv, sources, n, nullptr, op.count, true);
      break;
    }
    case OpKind::kAllGather:
      for (int q = 0; q < n; ++q) {
        if (q != rank_) kernels::copySmall(recv + size_t(q) * bytes, dataOf(q), bytes);  // its own: publish()
      }
      break;
    case OpKind::kBroadcast: {
      const std::byte* src = rank_ == op.root ? send : dataOf(op.root);
      if (recv != src) kernels::copySmall(recv, src, bytes);
      break;
    }
    default: break;  // takes() admits none other
  }
}

bool LatencyPath::step(bool* progressed) {
  if (phase_ == Phase::kClaim) {
    // This rank's slot (or inline line, or cell) for s last held s - lead,
    // or an earlier operation: free once everyone published the one after
    // it. A Broadcast's root runs up to lead - 1 operations ahead of its
    // readers: 4 ranks on 2 cores, 8 B, from 0.75-1.0 us with 8 inline
    // lines to 0.34-0.52 with 64 and 0.24-0.28 with 1024 (fewer switches
    // between the ranks sharing a core); 8 ranks 0.61-0.99 -> 0.46-0.69.
    // Operations take inlineStride() lines each, so lines come round after
    // inlineTurns() / inlineStride() operations.
    const uint64_t lead =
        inline_ ? transport::shm::inlineTurns(place_) / inlineStride() : transport::shm::kBoardSlots;
    if (s_ > lead && !allPublished(others_, s_ - lead + 1)) return false;
    publish();
    phase_ = Phase::kRead;
    *progressed = true;
  }
  if (phase_ == Phase::kRead) {
    const OpDesc& op = op_;
    const bool readsAll = op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduceScatter ||
                          op.kind == OpKind::kAllGather || (op.kind == OpKind::kReduce && rank_ == op.root);
    if (readsAll && !(inline_ ? allStamped(others_) : allPublished(others_, s_))) return false;
    if (op.kind == OpKind::kBroadcast && rank_ != op.root) {
      const int root[] = {op.root};
      if (!(inline_ ? allStamped(root) : allPublished(root, s_))) return false;
    }
    finish();
    phase_ = Phase::kDone;
    *progressed = true;
  }
  return phase_ == Phase::kDone;
}

Status LatencyPath::checkWaited(Communicator& comm) const {
  if (phase_ == Phase::kDone || waiting_ < 0 || arrived() || !board_.closed(waiting_)) return Status::ok();
  return remoteError(comm.describePeer(waiting_) +
                     (board_.alive(waiting_) ? " left the communicator (destroyed or aborted)" : " exited") +
                     " during the operation");
}

void LatencyPath::sleep(int ms) const {
  if (phase_ != Phase::kDone && waiting_ >= 0) board_.wait(waiting_, want_, 0, ms);
}

}  // namespace loom::core
