#include "core/collective_check.h"

#include <algorithm>
#include <cstring>
#include <optional>
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

struct Header {
  uint64_t first = 0;
  uint32_t calls = 0;
  uint32_t listed = 0;
  uint64_t hash = 0;
};
static_assert(sizeof(Header) == 24);

bool rooted(OpKind kind) {
  return kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather ||
         kind == OpKind::kScatter;
}

Call callOf(const OpDesc& op) {
  Call c;
  c.kind = uint8_t(op.kind);
  c.type = uint8_t(op.type);
  c.op = isReducing(op.kind) ? uint8_t(op.reduction.op) : 0;
  c.root = rooted(op.kind) ? op.root : -1;
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

uint64_t mixCall(uint64_t hash, const Call& c) {
  uint8_t bytes[16];
  put(bytes, c);
  return hashBytes(bytes, sizeof bytes, hash);
}

// "AllReduce of 1024 x float32 (sum)", "Broadcast of 8 x int8 from root 2".
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

struct Decoded {
  Header header;
  std::vector<Call> list;
};

Result<Decoded> decode(const std::vector<uint8_t>& block, int rank) {
  const std::string bad = "rank " + std::to_string(rank) + " sent a malformed collective check block: ";
  if (block.size() != kCheckBlockBytes) return remoteError(bad + std::to_string(block.size()) + " bytes");
  Decoded d;
  std::memcpy(&d.header, block.data(), sizeof(Header));
  if (d.header.listed != std::min<uint64_t>(d.header.calls, kMaxListed) || d.header.calls == 0)
    return remoteError(bad + "it lists " + std::to_string(d.header.listed) + " of " +
                       std::to_string(d.header.calls) + " calls");
  for (uint32_t i = 0; i < d.header.listed; ++i) {
    Call c = get(block.data() + sizeof(Header) + 16 * i);
    if (c.kind >= kOpKindCount || !isChecked(OpKind(c.kind)) || c.type >= kernels::kNumDataTypes ||
        c.op > uint8_t(kernels::RedOp::kSumPostDiv) || c.root < -1)
      return remoteError(bad + "call " + std::to_string(i) + " is not a collective");
    d.list.push_back(c);
  }
  return d;
}

// "collective #17 (number 2 in this group call)".
std::string position(uint64_t first, size_t index, uint32_t mostCalls) {
  std::string out = "collective #" + std::to_string(first + index + 1);
  if (mostCalls > 1) out += " (number " + std::to_string(index + 1) + " in this group call)";
  return out;
}

constexpr const char* kRule =
    ". Every rank must call a communicator's collectives in the same order with the same count, type, op "
    "and root; none of this call's collectives ran (LOOM_CHECK_COLLECTIVES)";

}  // namespace

std::vector<uint8_t> encodeCheckBlock(uint64_t first, std::span<const OpDesc> ops) {
  std::vector<uint8_t> block(kCheckBlockBytes, 0);
  Header h;
  h.first = first;
  h.hash = hashBytes(nullptr, 0);
  for (const OpDesc& op : ops) {
    if (!isChecked(op.kind)) continue;
    const Call c = callOf(op);
    if (h.listed < kMaxListed) put(block.data() + sizeof(Header) + 16 * h.listed++, c);
    h.hash = mixCall(h.hash, c);
    ++h.calls;
  }
  std::memcpy(block.data(), &h, sizeof h);
  return block;
}

Status compareCheckBlocks(const std::vector<std::vector<uint8_t>>& blocks, const std::string& where) {
  std::vector<Decoded> all;
  for (size_t r = 0; r < blocks.size(); ++r) {
    LOOM_ASSIGN_OR_RETURN(Decoded d, decode(blocks[r], int(r)));
    all.push_back(std::move(d));
  }
  if (all.empty()) return Status::ok();
  const std::string head = "collective mismatch on " + where + ": ";
  // Ranks grouped by a key, in the order their first rank comes.
  auto groups = [&](auto keyOf) {
    std::vector<std::pair<decltype(keyOf(0)), std::vector<int>>> out;
    for (int r = 0; r < int(all.size()); ++r) {
      auto key = keyOf(r);
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == key; });
      if (it == out.end()) out.push_back({key, {r}});
      else it->second.push_back(r);
    }
    return out;
  };
  const auto firsts = groups([&](int r) { return all[size_t(r)].header.first; });
  if (firsts.size() > 1) {
    // Only a rank that skipped an earlier failed check gets here.
    std::string text = head + "the ranks have checked different numbers of collectives: ";
    for (size_t i = 0; i < firsts.size(); ++i)
      text += (i ? "; " : "") + ranksText(firsts[i].second) + " at collective #" + std::to_string(firsts[i].first + 1);
    return invalidUsage(text + kRule);
  }
  const uint64_t first = all[0].header.first;
  uint32_t most = 0;
  for (const auto& d : all) most = std::max(most, d.header.calls);
  for (size_t i = 0; i < std::min<size_t>(most, kMaxListed); ++i) {
    // The call at position i, or none where a rank's call holds fewer.
    const auto at = groups([&](int r) {
      const auto& list = all[size_t(r)].list;
      return i < list.size() ? std::optional<Call>(list[i]) : std::nullopt;
    });
    if (at.size() == 1) continue;
    std::string text = head + "at its " + position(first, i, most) + " ";
    for (size_t g = 0; g < at.size(); ++g) {
      const bool one = at[g].second.size() == 1;
      text += (g ? "; " : "") + ranksText(at[g].second) +
              (at[g].first ? (one ? " calls " : " call ") + describeCall(*at[g].first)
                           : (one ? " calls" : " call") + std::string(" no more collectives in this call"));
    }
    return invalidUsage(text + kRule);
  }
  const auto rest = groups([&](int r) { return std::make_pair(all[size_t(r)].header.calls, all[size_t(r)].header.hash); });
  if (rest.size() > 1) {
    std::string text = head + "the ranks' calls agree on their first " + std::to_string(kMaxListed) +
                       " collectives (from #" + std::to_string(first + 1) + ") but not on the rest: ";
    for (size_t g = 0; g < rest.size(); ++g)
      text += (g ? "; " : "") + ranksText(rest[g].second) + " with " + std::to_string(rest[g].first.first) +
              " collectives (hash " + std::to_string(rest[g].first.second) + ")";
    return invalidUsage(text + kRule);
  }
  return Status::ok();
}

Status checkCollectives(Communicator* comm, std::span<const OpDesc> ops) {
  if (!comm->checksCollectives()) return Status::ok();
  const OpDesc* firstChecked = nullptr;
  size_t calls = 0;
  for (const OpDesc& op : ops) {
    if (!isChecked(op.kind)) continue;
    if (!firstChecked) firstChecked = &op;
    ++calls;
  }
  if (calls == 0) return Status::ok();
  std::lock_guard<std::mutex> lock(comm->ringMutex());
  const int n = comm->nranks(), me = comm->rank();
  const uint64_t first = comm->checkedCollectives();
  const std::vector<uint8_t> mine = encodeCheckBlock(first, ops);
  std::vector<uint8_t> gathered(kCheckBlockBytes * size_t(n));
  std::memcpy(gathered.data() + kCheckBlockBytes * size_t(me), mine.data(), kCheckBlockBytes);
  const std::string what = std::string("the collective check (LOOM_CHECK_COLLECTIVES) of ") +
                           opKindName(firstChecked->kind) + " #" + std::to_string(first + 1) + " on " +
                           comm->describe();
  const double timeout = comm->timeoutS();
  const Deadline deadline = timeout > 0 ? Deadline::afterSeconds(timeout) : Deadline::never();
  const double warnEvery = comm->options().stallWarnS;
  const Clock::time_point start = Clock::now();
  double nextWarn = warnEvery;
  // A rank that failed (or died: its neighbours tell everyone) ends the
  // wait at once; a rank that never calls is only warned about.
  auto check = [&]() -> Status {
    comm->pollNotices();
    LOOM_TRY(comm->stickyError());
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (warnEvery > 0 && waited >= nextWarn) {
      LOOM_WARN("%s: waiting for %.0f s: some rank has not made this call (its collectives on this communicator "
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
  comm->checkedCollectives() += calls;
  return Status::ok();
}

Status checkGroupCollectives(std::vector<PendingOp>* ops) {
  std::vector<Communicator*> comms;
  std::vector<std::vector<OpDesc>> theirs;
  for (const PendingOp& p : *ops) {
    Communicator* c = p.comm.get();
    if (!c->checksCollectives() || !isChecked(p.op.kind)) continue;
    auto it = std::find(comms.begin(), comms.end(), c);
    if (it == comms.end()) {
      comms.push_back(c);
      theirs.emplace_back();
      it = comms.end() - 1;
    }
    theirs[size_t(it - comms.begin())].push_back(p.op);
  }
  std::vector<Status> results(comms.size());
  if (comms.size() == 1) {
    results[0] = checkCollectives(comms[0], theirs[0]);
  } else if (!comms.empty()) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < comms.size(); ++i) {
      try {
        threads.emplace_back([&, i] {
          log::ScopedRank rank(comms[i]->rank());
          results[i] = checkCollectives(comms[i], theirs[i]);
        });
      } catch (const std::system_error& e) {
        // Checked alone it could wait for a rank this thread drives.
        results[i] = systemError(std::string("cannot start a thread for a collective check: ") + e.what());
        comms[i]->fail(results[i], true);
      }
    }
    for (auto& t : threads) t.join();
  }
  Status firstError;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (results[i].isOk()) continue;
    if (firstError.isOk()) firstError = results[i];
    std::erase_if(*ops, [&](const PendingOp& p) { return p.comm.get() == comms[i]; });
  }
  return firstError;
}

}  // namespace loom::core
