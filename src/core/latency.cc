#include "core/latency.h"

#include <sched.h>

#include <cstring>

#include "common/log.h"
#include "core/communicator.h"
#include "kernels/reduce.h"

namespace loom::core {
namespace {

// Slots: 64 KiB each, less for many ranks (kBoardSlots per rank).
constexpr size_t kMaxSlotBytes = size_t(64) << 10;
constexpr size_t kBoardBudget = size_t(4) << 20;
constexpr int kYields = 32;  // after the spins, before sleeping
constexpr int kSharedYields = 2000;  // ranks share CPUs: yield instead of spinning
constexpr int kSleepMs = 10;

size_t slotBytesFor(int nranks) {
  size_t per = kBoardBudget / (size_t(transport::shm::kBoardSlots) * size_t(nranks));
  per = per / 4096 * 4096;
  return std::clamp<size_t>(per, 4096, kMaxSlotBytes);
}

// As the engine names operations: "AllReduce #17 (2 x float)".
std::string opName(const OpDesc& op, uint64_t seq) {
  return std::string(opKindName(op.kind)) + " #" + std::to_string(seq) + " (" + std::to_string(op.count) + " x " +
         kernels::dataTypeName(op.type) + ")";
}

}  // namespace

LatencyPath::LatencyPath(transport::shm::Board board, int rank, int nranks, const TuningContext& tuning)
    : board_(std::move(board)), rank_(rank), nranks_(nranks) {
  for (int q = 0; q < nranks; ++q)
    if (q != rank) others_.push_back(q);
  // The cost model's choice, once per collective: direct up to a crossover
  // size, so a search over the sizes a slot holds finds it.
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast,
                      OpKind::kReduce}) {
    const size_t capacity = board_.slotBytes() * (kind == OpKind::kAllGather ? size_t(nranks) : 1);
    size_t lo = 0, hi = capacity;  // direct is chosen for lo (or lo is 0); the answer is in [lo, hi]
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      if (choose(kind, mid, tuning).algorithm == Algorithm::kDirect) lo = mid;
      else hi = mid - 1;
    }
    maxBytes_[size_t(collectiveIndex(kind))] = lo;
  }
}

Result<std::unique_ptr<LatencyPath>> LatencyPath::setup(Bootstrap& bootstrap, int rank, int nranks, bool wanted,
                                                        const TuningContext& tuning, Deadline deadline,
                                                        const std::atomic<bool>* abort) {
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
  std::vector<uint8_t> ok(static_cast<size_t>(nranks));
  ok[size_t(rank)] = board.isOk() ? 1 : 0;
  LOOM_TRY(bootstrap.allGather(ok.data(), 1, deadline, abort));
  for (int r = 0; r < nranks; ++r) {
    if (!ok[size_t(r)]) {
      LOOM_INFO(log::kInit, "rank %d: no shared-memory board (the latency path) because rank %d has none%s%s",
                rank, r, r == rank ? ": " : "", r == rank ? board.status().message().c_str() : "");
      return std::unique_ptr<LatencyPath>();
    }
  }
  // Everyone has opened it and joined.
  board->closeShared();
  board->watchMembers();
  return std::unique_ptr<LatencyPath>(new LatencyPath(std::move(board.value()), rank, nranks, tuning));
}

bool LatencyPath::takes(const OpDesc& op) const {
  const int index = collectiveIndex(op.kind);
  if (index < 0 || op.count == 0) return false;
  // tuningBytes(): the whole vector (AllGather's output, ReduceScatter's input).
  const size_t bytes = op.count * kernels::dataTypeSize(op.type) *
                       (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ? size_t(nranks_) : 1);
  return bytes <= maxBytes_[size_t(index)];
}

Status LatencyPath::waitFor(int q, uint64_t want, Communicator& comm, const OpDesc& op, uint64_t seq) {
  if (board_.seen(q) >= want) return Status::ok();
  // Every rank has a CPU: spin (pause-spins cost a fraction of an engine
  // round). Ranks share CPUs: the one we wait for may be waiting for ours,
  // so hand it over at once.
  const bool dedicated = !comm.cpusShared();
  if (dedicated && board_.wait(q, want, comm.spinRounds() * 8, 0)) return Status::ok();
  for (int i = 0; i < (dedicated ? kYields : kSharedYields); ++i) {
    sched_yield();
    if (board_.seen(q) >= want) return Status::ok();
  }
  const Clock::time_point since = Clock::now();
  const std::string name = opName(op, seq);
  int warnings = 0;
  for (;;) {
    if (board_.wait(q, want, 0, kSleepMs)) return Status::ok();
    if (comm.aborted()) return abortedError("running " + name);
    comm.pollNotices();
    LOOM_TRY(comm.asyncError());
    LOOM_TRY(checkWaited(comm));
    const double timeout = comm.timeoutS();
    const double stalled = secondsSince(since);
    // The stall inspector, as the engine's (core/group.cc).
    const double period = comm.options().stallWarnS;
    if (period > 0 && stalled >= period * double(warnings + 1) && (timeout <= 0 || stalled < timeout)) {
      warnings = int(stalled / period);
      const std::string ends = timeout > 0 ? "it fails after LOOM_TIMEOUT_S=" + std::to_string(int(timeout)) + " s"
                                           : "LOOM_TIMEOUT_S=0: it waits for ever";
      LOOM_WARN("%s: %s has made no progress for %d s; waiting for %s (LOOM_STALL_WARN_S=%d; %s)",
                comm.describe().c_str(), name.c_str(), int(stalled), comm.describePeer(q).c_str(), int(period),
                ends.c_str());
    }
    if (timeout > 0 && stalled > timeout) {
      return remoteError(name + " made no progress for " + std::to_string(int(timeout)) +
                         " s (LOOM_TIMEOUT_S); waiting for " + comm.describePeer(q));
    }
  }
}

void LatencyPath::start(const OpDesc& op, uint64_t seq) {
  op_ = op;
  opSeq_ = seq;
  s_ = ++seq_;
  phase_ = Phase::kClaim;
  waiting_ = -1;
}

bool LatencyPath::allPublished(const std::vector<int>& peers, uint64_t want) {
  for (int q : peers) {
    if (board_.seen(q) < want) {
      waiting_ = q;
      want_ = want;
      return false;
    }
  }
  waiting_ = -1;
  return true;
}

void LatencyPath::publish() {
  const OpDesc& op = op_;
  const int n = nranks_;
  const size_t es = kernels::dataTypeSize(op.type);
  const size_t bytes = op.count * es;
  kernels::Reduction red = op.reduction;
  if (op.scalarPtr) std::memcpy(&red.scalar, op.scalarPtr, es);
  std::byte* mine = board_.data(rank_, s_);
  const auto* send = static_cast<const std::byte*>(op.sendbuf);
  // This rank's contribution (pre-multiplied for PreMulSum).
  const size_t contribution = op.kind == OpKind::kReduceScatter ? bytes * size_t(n)
                              : op.kind == OpKind::kBroadcast && rank_ != op.root ? 0
                                                                                   : bytes;
  if (contribution) {
    if (isReducing(op.kind) && red.op == kernels::RedOp::kPreMulSum)
      kernels::reduce(red, mine, nullptr, 0, send, contribution / es, false);
    else std::memcpy(mine, send, contribution);
  }
  board_.publish(rank_, s_);
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
      for (int q = 0; q < n; ++q) sources[q] = board_.data(q, s_) + at;
      kernels::reduce(plain, recv, sources, n, nullptr, op.count, true);
      break;
    }
    case OpKind::kAllGather:
      for (int q = 0; q < n; ++q) {
        std::byte* dst = recv + size_t(q) * bytes;
        const std::byte* src = q == rank_ ? send : board_.data(q, s_);
        if (dst != src) std::memcpy(dst, src, bytes);
      }
      break;
    case OpKind::kBroadcast: {
      const std::byte* src = rank_ == op.root ? send : board_.data(op.root, s_);
      if (recv != src) std::memcpy(recv, src, bytes);
      break;
    }
    default: break;  // takes() admits none other
  }
}

bool LatencyPath::step(bool* progressed) {
  if (phase_ == Phase::kClaim) {
    // This rank's slot for s last held s - kBoardSlots: free once everyone
    // published the operation after that one.
    constexpr uint64_t kSlots = transport::shm::kBoardSlots;
    if (s_ > kSlots && !allPublished(others_, s_ - kSlots + 1)) return false;
    publish();
    phase_ = Phase::kRead;
    *progressed = true;
  }
  if (phase_ == Phase::kRead) {
    const OpDesc& op = op_;
    const bool readsAll = op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduceScatter ||
                          op.kind == OpKind::kAllGather || (op.kind == OpKind::kReduce && rank_ == op.root);
    if (readsAll && !allPublished(others_, s_)) return false;
    if (op.kind == OpKind::kBroadcast && rank_ != op.root && board_.seen(op.root) < s_) {
      waiting_ = op.root;
      want_ = s_;
      return false;
    }
    finish();
    phase_ = Phase::kDone;
    *progressed = true;
  }
  return phase_ == Phase::kDone;
}

Status LatencyPath::checkWaited(Communicator& comm) const {
  if (phase_ == Phase::kDone || waiting_ < 0 || board_.seen(waiting_) >= want_ || !board_.closed(waiting_))
    return Status::ok();
  return remoteError(comm.describePeer(waiting_) +
                     (board_.alive(waiting_) ? " left the communicator (destroyed or aborted)" : " exited") +
                     " during " + opName(op_, opSeq_));
}

void LatencyPath::sleep(int ms) const {
  if (phase_ != Phase::kDone && waiting_ >= 0) board_.wait(waiting_, want_, 0, ms);
}

Status LatencyPath::run(const OpDesc& op, uint64_t seq, Communicator& comm) {
  start(op, seq);
  bool progressed = false;
  while (!step(&progressed)) {
    if (Status st = waitFor(waiting_, want_, comm, op, seq); !st.isOk()) {
      if (st.code() == Code::kRemoteError && !comm.aborted()) st = comm.preferPeerReport(st);
      phase_ = Phase::kDone;
      return Status(st.code(), comm.describe() + ": " + opName(op, seq) + " failed: " + st.message());
    }
  }
  return Status::ok();
}

}  // namespace loom::core
