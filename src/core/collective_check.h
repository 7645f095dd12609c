// LOOM_CHECK_COLLECTIVES: before each collective of a communicator runs,
// its ranks compare what each of them called there, so a mismatch (another
// count, type, op, root or collective) is an error naming the ranks and
// their calls instead of a hang or wrong data.
//
// Each collective costs one ring all-gather over the bootstrap sockets of a
// small block: its position in the communicator's sequence of collectives
// and the call. Ranks compare collectives one by one in call order, so
// ranks may group them differently. Nothing runs before its ranks agree:
// after a mismatch every rank's call returns ncclInvalidUsage, the
// collectives of that call from the mismatched one on do not run, and the
// communicator stays usable. Send/Recv are not compared (their pairs
// differ from rank to rank), so a rank whose call holds only those is not
// caught when the others call a collective: that still waits for the
// timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "core/op.h"

namespace loom::core {

class Communicator;
struct PendingOp;

// Whether ranks compare `kind` (every collective; not Send/Recv).
inline bool isChecked(OpKind kind) { return kind != OpKind::kSend && kind != OpKind::kRecv; }

// The block one rank contributes for one collective: `index` is how many
// of the communicator's collectives were checked before it.
inline constexpr size_t kCheckBlockBytes = 24;
std::vector<uint8_t> encodeCheckBlock(uint64_t index, const OpDesc& op);

// Compares every rank's block: ok when they agree, else kInvalidUsage
// saying at which collective of the communicator's sequence the ranks part
// and what each calls there ("ranks 0,2-3 call AllReduce of 1024 x float
// (sum); rank 1 calls ..."); a malformed block is kRemoteError. `where`
// names the communicator for the message.
Status compareCheckBlocks(const std::vector<std::vector<uint8_t>>& blocks, const std::string& where);

// The exchange for one collective of `comm` (blocking; bounded by its
// abort, and by its timeout unless `timed` is false: the engine then times
// the wait itself, from when its task needs the check). A broken exchange
// fails the communicator.
Status checkCollective(Communicator* comm, const OpDesc& op, bool timed = true);

// The checks of one call's collectives on `comm`, in order, on a thread of
// its own, ahead of the operations: the engine starts each collective once
// passed() counts it, so one thread can drive several ranks and each
// communicator goes on as soon as its own checks pass.
class CollectiveChecker {
 public:
  // `timed`: see checkCollective (false while an engine waits on passed()).
  CollectiveChecker(Communicator* comm, std::span<const OpDesc> ops, bool timed);
  ~CollectiveChecker();  // wait()s
  CollectiveChecker(const CollectiveChecker&) = delete;
  CollectiveChecker& operator=(const CollectiveChecker&) = delete;

  size_t passed() const { return passed_.load(std::memory_order_acquire); }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Once finished(): ok, or why the checks stopped at passed().
  const Status& result() const { return result_; }
  // Until the checks end (each is bounded by the communicator's timeout).
  void wait();

 private:
  Communicator* comm_;
  std::vector<OpDesc> ops_;
  std::atomic<size_t> passed_{0};
  std::atomic<bool> finished_{false};
  Status result_;
  std::thread thread_;
};

// Calls on device buffers, whose operations are only queued: every
// communicator's collectives checked before anything is queued (a thread
// each when several communicators have some). The operations of a
// communicator whose ranks disagree are taken out of `ops`, so the others
// still run; returns the first error.
Status checkGroupCollectives(std::vector<PendingOp>* ops);

}  // namespace loom::core
