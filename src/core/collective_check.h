// LOOM_CHECK_COLLECTIVES: before a communicator's collectives run, its ranks
// compare what each of them called, so a mismatch (another count, type, op,
// root or collective, or a collective missing from one rank's group) is an
// error naming the ranks and their calls instead of a hang or wrong data.
//
// Each call, or each group's share for one communicator, costs one ring
// all-gather over the bootstrap sockets of a small fixed-size block: the
// position in the communicator's sequence of collectives, how many the call
// holds, a hash of all of them and the first kMaxListed in full. Nothing
// runs before the ranks agree, so after a mismatch every rank returns
// ncclInvalidUsage for that call and the communicator stays usable.
// Send/Recv are not compared: their pairs differ from rank to rank.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/op.h"

namespace loom::core {

class Communicator;
struct PendingOp;

// Whether ranks compare `kind` (every collective; not Send/Recv).
inline bool isChecked(OpKind kind) { return kind != OpKind::kSend && kind != OpKind::kRecv; }

// The block one rank contributes: `first` is the communicator's count of
// collectives checked before these, `ops` the call's operations (those not
// compared are skipped).
inline constexpr size_t kMaxListed = 32;
inline constexpr size_t kCheckBlockBytes = 24 + kMaxListed * 16;
std::vector<uint8_t> encodeCheckBlock(uint64_t first, std::span<const OpDesc> ops);

// Compares every rank's block (all of kCheckBlockBytes): ok when they agree,
// else kInvalidUsage saying at which collective of the communicator's
// sequence the ranks part and what each calls there ("rank 0,2-3 call
// AllReduce of 1024 x float32 (sum); rank 1 calls ..."); a malformed block
// is kRemoteError. `where` names the communicator for the message.
Status compareCheckBlocks(const std::vector<std::vector<uint8_t>>& blocks, const std::string& where);

// The exchange for one communicator (blocking; bounded by its timeout and
// abort): ok when nothing in `ops` needs checking or the ranks agree.
Status checkCollectives(Communicator* comm, std::span<const OpDesc> ops);

// The same for a group on several communicators at once (a thread each
// when more than one communicator has collectives: one thread may drive
// several ranks). The operations of a communicator whose ranks disagree are
// taken out of `ops`, so the others still run; returns the first error.
Status checkGroupCollectives(std::vector<PendingOp>* ops);

}  // namespace loom::core
