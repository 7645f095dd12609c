// Groups: ncclGroupStart/End and the engine loop that runs a group.
//
// Group state is per thread. Outside a group a call is a group of one. At
// the outermost ncclGroupEnd: pending inits run concurrently (one thread
// each), then each communicator's operations run: its collectives in call
// order, then its point-to-point calls merged into one plan. All
// communicators of the group progress together on the calling thread, so one
// thread can drive several ranks.
#pragma once

#include <functional>
#include <span>

#include "common/status.h"
#include "core/communicator.h"
#include "core/executor.h"
#include "core/op.h"

namespace loom::core {

Status groupStart();
// Runs the group when it is the outermost end. For non-blocking
// communicators whose init is pending it returns kInProgress.
Status groupEnd();
int groupDepth();
// Ends the outermost group without running it (pending inits still run) and
// estimates how long its operations would take, in microseconds: the cost
// model's estimate (core/tuning.h) of what the planner would pick.
Status groupSimulateEnd(float* estimatedUs);

// Adds an operation to the calling thread's group; runs it at once when no
// group is open. The caller keeps `comm` alive for the call (api::CallScope),
// which also keeps any teardown from beginning; work that outlives the call
// (a group's, a device queue's) adds a pin.
Status enqueue(Communicator* comm, const OpDesc& op);
// Adds an init job; outside a group the caller runs it directly instead.
// groupEnd starts it on `comm`'s own init thread when `comm` is
// non-blocking, else runs it on a worker it joins and marks `comm` failed
// on error. A job that creates no communicator (a rank leaving a split with
// NCCL_SPLIT_NOCOLOR) passes nullptr: it always runs to completion inside
// groupEnd, whose result carries its error. When one blocking init of the
// group fails, the others are aborted instead of waiting for their peers.
void enqueueInit(Communicator* comm, std::function<Status()> job);
// True when the calling thread's open group holds work for `comm` (it must
// not be destroyed before ncclGroupEnd).
bool groupHolds(const Communicator* comm);

// Cuda mode: the staging memory a device job binds on the progress thread
// for one collective, or for a group's point-to-point calls (planned
// together), worked out by planning them as the job will (0 for what cannot
// be planned: the job reports that).
size_t collectiveStagingBytes(Communicator* comm, const OpDesc& op);
size_t pointToPointStagingBytes(Communicator* comm, std::span<const OpDesc> p2p);

// Runs already-planned work; exposed for tests. Returns the first error.
struct PendingOp {
  CommRef comm;
  OpDesc op;
};
Status runOps(std::vector<PendingOp> ops);
// runOps without waiting for a pending init or earlier splits: for callers
// that waited when the operations were called (the device queue, which
// passes its DeviceContext: the buffers are device memory).
Status runPlannedOps(std::vector<PendingOp> ops, const DeviceContext* device = nullptr);
// Runs host-buffer operations of `comm` (collectives in order, point-to-point
// calls merged, like a group) on the calling thread, without its operation
// lock: the communicator's own work at the end of its init, before it is
// ready and before any user operation can run (LOOM_CALIBRATE).
Status runInitOps(Communicator* comm, std::span<const OpDesc> ops);

}  // namespace loom::core
