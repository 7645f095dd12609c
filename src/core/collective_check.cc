#include "core/collective_check.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "core/communicator.h"
#include "core/group.h"

namespace loom::core {
namespace {

// One compared call: 16 bytes on the wire (host byte order: a
// communicator's ranks share the library build, and the blocks are checked
// before use).
struct Call {
  uint8_t kind = 0;
  uint8_t type = 0;
  uint8_t op = 0;  // kernels::RedOp of reducing collectives, else 0
  int32_t root = -1;  // rooted collectives, else -1
  uint64_t count = 0;
  bool operator==(const Call&) const = default;
};

Call callOf(const OpDesc& op) {
  Call c;
  c.kind = uint8_t(op.kind);
  c.type = uint8_t(op.type);
  c.op = isReducing(op.kind) ? uint8_t(op.reduction.op) : 0;
  c.root = isRooted(op.kind) ? op.root : -1;
  c.count = op.count;
  return c;
}

void put(uint8_t* at, const Call& c) {
  at[0] = c.kind;
  at[1] = c.type;
  at[2] = c.op;
  at[3] = 0;
  std::memcpy(at + 4, &c.root, 4);
  std::memcpy(at + 8, &c.count, 8);
}

Call get(const uint8_t* at) {
  Call c;
  c.kind = at[0];
  c.type = at[1];
  c.op = at[2];
  std::memcpy(&c.root, at + 4, 4);
  std::memcpy(&c.count, at + 8, 8);
  return c;
}

// "AllReduce of 1024 x float (sum)", "Broadcast of 8 x int8 root 2".
std::string describeCall(const Call& c) {
  const auto kind = OpKind(c.kind);
  std::string out = std::string(opKindName(kind)) + " of " + std::to_string(c.count) + " x " +
                    kernels::dataTypeName(kernels::DataType(c.type));
  if (isReducing(kind)) out += std::string(" (") + kernels::redOpName(kernels::RedOp(c.op)) + ")";
  if (c.root >= 0) out += " root " + std::to_string(c.root);
  return out;
}

// "rank 3", "ranks 0,2-3".
std::string ranksText(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

struct Block {
  uint64_t index = 0;
  Call call;
};

Result<Block> decode(const std::vector<uint8_t>& bytes, int rank) {
  const std::string bad = "rank " + std::to_string(rank) + " sent a malformed collective check block: ";
  if (bytes.size() != kCheckBlockBytes) return remoteError(bad + std::to_string(bytes.size()) + " bytes");
  Block b;
  std::memcpy(&b.index, bytes.data(), 8);
  b.call = get(bytes.data() + 8);
  const Call& c = b.call;
  if (c.kind >= kOpKindCount || !isChecked(OpKind(c.kind)) || c.type >= kernels::kNumDataTypes ||
      c.op > uint8_t(kernels::RedOp::kSumPostDiv) || c.root < -1)
    return remoteError(bad + "it names no collective");
  return b;
}

// Ranks grouped by what `keyOf` says of them, in the order of their first rank.
template <typename KeyOf>
auto groupRanks(int n, KeyOf keyOf) {
  std::vector<std::pair<decltype(keyOf(0)), std::vector<int>>> out;
  for (int r = 0; r < n; ++r) {
    auto key = keyOf(r);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == key; });
    if (it == out.end()) out.push_back({key, {r}});
    else it->second.push_back(r);
  }
  return out;
}

// Checks `ops`' collectives in order until one fails; onPass() after each
// the ranks agreed on.
template <typename OnPass>
Status checkInOrder(Communicator* comm, std::span<const OpDesc> ops, bool timed, OnPass onPass) {
  for (const OpDesc& op : ops) {
    if (!isChecked(op.kind)) continue;
    LOOM_TRY(checkCollective(comm, op, timed));
    onPass();
  }
  return Status::ok();
}

constexpr const char* kRule =
    ". Every rank must call a communicator's collectives in the same order with the same count, type, op "
    "and root; this call's collectives on this communicator from this one on did not run "
    "(LOOM_CHECK_COLLECTIVES)";

}  // namespace

std::vector<uint8_t> encodeCheckBlock(uint64_t index, const OpDesc& op) {
  std::vector<uint8_t> block(kCheckBlockBytes, 0);
  std::memcpy(block.data(), &index, 8);
  put(block.data() + 8, callOf(op));
  return block;
}

Status compareCheckBlocks(const std::vector<std::vector<uint8_t>>& blocks, const std::string& where) {
  std::vector<Block> all;
  for (size_t r = 0; r < blocks.size(); ++r) {
    LOOM_ASSIGN_OR_RETURN(Block b, decode(blocks[r], int(r)));
    all.push_back(b);
  }
  const int n = int(all.size());
  const std::string head = "collective mismatch on " + where + ": ";
  const auto indices = groupRanks(n, [&](int r) { return all[size_t(r)].index; });
  if (indices.size() > 1) {
    // Only a rank that went on past an earlier failed check gets here.
    std::string text = head + "the ranks have checked different numbers of collectives: ";
    for (size_t i = 0; i < indices.size(); ++i)
      text += (i ? "; " : "") + ranksText(indices[i].second) + " at collective #" + std::to_string(indices[i].first + 1);
    return invalidUsage(text + kRule);
  }
  const auto calls = groupRanks(n, [&](int r) { return all[size_t(r)].call; });
  if (calls.size() == 1) return Status::ok();
  std::string text = head + "at its collective #" + std::to_string(all[0].index + 1) + " ";
  for (size_t g = 0; g < calls.size(); ++g) {
    text += (g ? "; " : "") + ranksText(calls[g].second) + (calls[g].second.size() == 1 ? " calls " : " call ") +
            describeCall(calls[g].first);
  }
  return invalidUsage(text + kRule);
}

Status checkCollective(Communicator* comm, const OpDesc& op, bool timed) {
  std::lock_guard<std::mutex> lock(comm->ringMutex());
  const int n = comm->nranks(), me = comm->rank();
  const uint64_t index = comm->checkedCollectives();
  const std::vector<uint8_t> mine = encodeCheckBlock(index, op);
  std::vector<uint8_t> gathered(kCheckBlockBytes * size_t(n));
  std::memcpy(gathered.data() + kCheckBlockBytes * size_t(me), mine.data(), kCheckBlockBytes);
  const std::string what = std::string("the collective check (LOOM_CHECK_COLLECTIVES) of ") + opKindName(op.kind) +
                           " #" + std::to_string(index + 1) + " on " + comm->describe();
  const double timeout = comm->timeoutS();
  const Deadline deadline = timed && timeout > 0 ? Deadline::afterSeconds(timeout) : Deadline::never();
  const double warnEvery = timed ? comm->options().stallWarnS : 0;
  const Clock::time_point start = Clock::now();
  double nextWarn = warnEvery;
  // A rank that failed (or died: its neighbours tell everyone) ends the
  // wait at once; a rank that never calls is only warned about.
  auto check = [&]() -> Status {
    comm->pollNotices();
    LOOM_TRY(comm->stickyError());
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (warnEvery > 0 && waited >= nextWarn) {
      LOOM_WARN("%s: waiting for %.0f s: some rank has not reached it (its collectives on this communicator "
                "differ from this rank's, or it is still busy); LOOM_TIMEOUT_S ends the wait",
                what.c_str(), waited);
      nextWarn += warnEvery;
    }
    return Status::ok();
  };
  Status s = comm->bootstrap().allGather(gathered.data(), kCheckBlockBytes, deadline, comm->abortFlag(), check);
  if (!s.isOk()) {
    if (comm->aborted()) return s.addContext(what);
    // The ring may be left mid-exchange: the communicator cannot go on.
    if (s.code() == Code::kRemoteError && comm->stickyError().isOk()) s = comm->preferPeerReport(s);
    s = s.addContext(what);
    comm->fail(s, true);
    return s;
  }
  std::vector<std::vector<uint8_t>> blocks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const uint8_t* at = gathered.data() + kCheckBlockBytes * size_t(r);
    blocks[size_t(r)].assign(at, at + kCheckBlockBytes);
  }
  Status agreed = compareCheckBlocks(blocks, comm->describe());
  if (agreed.code() == Code::kRemoteError) {
    comm->fail(agreed, true);
    return agreed;
  }
  LOOM_TRY(agreed);
  ++comm->checkedCollectives();
  return Status::ok();
}

CollectiveChecker::CollectiveChecker(Communicator* comm, std::span<const OpDesc> ops, bool timed)
    : comm_(comm), ops_(ops.begin(), ops.end()) {
  try {
    thread_ = std::thread([this, timed] {
      log::ScopedRank rank(comm_->rank());
      result_ = checkInOrder(comm_, ops_, timed, [this] { passed_.fetch_add(1, std::memory_order_release); });
      finished_.store(true, std::memory_order_release);
    });
  } catch (const std::system_error& e) {
    // Checked on this thread it could wait for a rank this thread drives.
    result_ = systemError(std::string("cannot start a thread for a collective check: ") + e.what());
    comm_->fail(result_, true);
    finished_.store(true, std::memory_order_release);
  }
}

CollectiveChecker::~CollectiveChecker() { wait(); }

void CollectiveChecker::wait() {
  if (thread_.joinable()) thread_.join();
}

Status checkGroupCollectives(std::vector<PendingOp>* ops) {
  std::vector<Communicator*> comms;
  std::vector<std::vector<OpDesc>> theirs;
  for (const PendingOp& p : *ops) {
    Communicator* c = p.comm.get();
    if (!c->checksCollectives()) continue;
    auto it = std::find(comms.begin(), comms.end(), c);
    if (it == comms.end()) {
      comms.push_back(c);
      theirs.emplace_back();
      it = comms.end() - 1;
    }
    theirs[size_t(it - comms.begin())].push_back(p.op);
  }
  // How many of each communicator's collectives its ranks agree on, and why
  // they stopped there.
  std::vector<size_t> passed(comms.size());
  std::vector<Status> results(comms.size());
  if (comms.size() == 1) {
    results[0] = checkInOrder(comms[0], theirs[0], true, [&] { ++passed[0]; });
  } else if (!comms.empty()) {
    std::vector<std::unique_ptr<CollectiveChecker>> checkers;
    for (size_t i = 0; i < comms.size(); ++i)
      checkers.push_back(std::make_unique<CollectiveChecker>(comms[i], theirs[i], true));
    for (size_t i = 0; i < comms.size(); ++i) {
      checkers[i]->wait();
      passed[i] = checkers[i]->passed();
      results[i] = checkers[i]->result();
    }
  }
  // A communicator whose ranks disagree keeps the collectives they agreed
  // on (the ranks that called them apart already run them) and drops the
  // rest of its share of the call.
  Status firstError;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (results[i].isOk()) continue;
    if (firstError.isOk()) firstError = results[i];
    size_t kept = 0;
    std::erase_if(*ops, [&](const PendingOp& p) {
      if (p.comm.get() != comms[i]) return false;
      if (isChecked(p.op.kind) && kept < passed[i]) {
        ++kept;
        return false;
      }
      return true;
    });
  }
  return firstError;
}

}  // namespace loom::core
