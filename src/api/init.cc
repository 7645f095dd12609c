// Unique ids, communicator creation and teardown, and queries.
#include <algorithm>
#include <cstring>
#include <thread>

#include "api/api.h"
#include "common/log.h"
#include "core/group.h"
#include "core/mode.h"
#include "device/device.h"

using loom::Status;
using loom::core::CommOptions;
using loom::core::CommRef;
using loom::core::Communicator;

namespace loom::api {
namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;

// Reads an ncclConfig_t of any header version by its size: older headers
// pass a smaller struct (missing fields keep their defaults), newer ones a
// bigger one (unknown trailing fields are ignored). Values NCCL refuses are
// refused; of the rest, loom acts on blocking, commName, minCTAs and
// maxCTAs (channels), netName and trafficClass, and accepts the others,
// which tune GPU thread blocks and NVLink SHARP.
Status parseConfig(const ncclConfig_t* config, CommOptions* o) {
  if (!config) return Status::ok();
  if (config->magic != kConfigMagic) {
    return invalidArgument("config->magic is not 0xcafebeef: initialise the config with "
                           "NCCL_CONFIG_INITIALIZER before setting fields");
  }
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  size_t n = std::min(config->size, sizeof c);
  if (n < offsetof(ncclConfig_t, blocking)) return invalidArgument("config->size is too small");
  std::memcpy(&c, config, n);
  // A field the caller's struct does not reach keeps the initializer's
  // "not set" value from `c`.
  const auto given = [](int v) { return v != NCCL_CONFIG_UNDEF_INT; };
  const auto flag = [&](int v, const char* field) -> Status {
    if (given(v) && v != 0 && v != 1) {
      return invalidArgument(std::string("config->") + field + " is " + std::to_string(v) + ": must be 0 or 1");
    }
    return Status::ok();
  };
  const auto positive = [&](int v, const char* field) -> Status {
    if (given(v) && v <= 0) {
      return invalidArgument(std::string("config->") + field + " is " + std::to_string(v) + ": must be at least 1");
    }
    return Status::ok();
  };
  LOOM_TRY(flag(c.blocking, "blocking"));
  LOOM_TRY(flag(c.splitShare, "splitShare"));
  LOOM_TRY(flag(c.collnetEnable, "collnetEnable"));
  LOOM_TRY(flag(c.shrinkShare, "shrinkShare"));
  LOOM_TRY(flag(c.nvlinkCentricSched, "nvlinkCentricSched"));
  LOOM_TRY(positive(c.minCTAs, "minCTAs"));
  LOOM_TRY(positive(c.maxCTAs, "maxCTAs"));
  LOOM_TRY(positive(c.nvlsCTAs, "nvlsCTAs"));
  LOOM_TRY(positive(c.nChannelsPerNetPeer, "nChannelsPerNetPeer"));
  if (given(c.minCTAs) && given(c.maxCTAs) && c.minCTAs > c.maxCTAs) {
    return invalidArgument("config->minCTAs " + std::to_string(c.minCTAs) + " is more than maxCTAs " +
                           std::to_string(c.maxCTAs));
  }
  if (given(c.cgaClusterSize) && c.cgaClusterSize < 0) {
    return invalidArgument("config->cgaClusterSize is " + std::to_string(c.cgaClusterSize) + ": must be 0 or more");
  }
  constexpr int kPolicies = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (given(c.CTAPolicy) && (c.CTAPolicy & ~kPolicies) != 0) {
    return invalidArgument("config->CTAPolicy is " + std::to_string(c.CTAPolicy) +
                           ": must be NCCL_CTA_POLICY_DEFAULT, _EFFICIENCY or _ZERO");
  }
  if (given(c.blocking)) o->blocking = c.blocking == 1;
  if (c.commName) o->name = c.commName;
  CommOptions::Config asked;
  if (given(c.minCTAs)) asked.minChannels = c.minCTAs;
  if (given(c.maxCTAs)) asked.maxChannels = c.maxCTAs;
  if (c.netName) asked.network = c.netName;
  if (given(c.trafficClass)) {
    if (c.trafficClass >= 0 && c.trafficClass <= 255) {
      asked.trafficClass = c.trafficClass;
    } else {
      // NCCL passes any value on to the network; a class of service has 8 bits.
      LOOM_WARN("config->trafficClass %d is not 0 .. 255: ignored", c.trafficClass);
    }
  }
  o->apply(asked);
  return Status::ok();
}

// A split or shrink child starts from its parent's options. Given a
// config, as in NCCL, the child's channel bounds and network come from the
// settings and that config, not from the parent's config.
CommOptions childOptions(const Communicator& parent, const ncclConfig_t* config) {
  CommOptions options = parent.options();
  options.name.clear();
  if (config) {
    const CommOptions fresh = CommOptions::fromSettings();
    options.channels = fresh.channels;
    options.maxChannels = fresh.maxChannels;
    options.link.selection = fresh.link.selection;
  }
  return options;
}

Status checkInitArgs(ncclComm_t* comm, int nranks, int rank) {
  LOOM_TRY(checkPtr(comm, "comm (the ncclComm_t* to fill)"));
  if (nranks < 1) return invalidArgument("nranks " + std::to_string(nranks) + " must be at least 1");
  return checkRank(rank, nranks, "rank");
}

// The device a cuda-mode communicator binds: the calling thread's current
// one, read now (a grouped or non-blocking init runs on another thread).
// Host mode, or no device: left to the init, which reports it.
void chooseDevice(CommOptions* options) {
  if (options->cudaDevice >= 0) return;
  auto mode = core::resolveMode(options->device);
  if (!mode.isOk() || mode.value() != core::Mode::kCuda) return;
  if (auto current = device::api()->currentDevice(); current.isOk()) options->cudaDevice = current.value();
}

// Creates the handle and runs (or queues, inside a group) its init.
Status startInit(ncclComm_t* out, CommOptions options, std::function<Status(Communicator*)> init) {
  LOOM_TRY(options.link.selection.network().status());  // NCCL_NET names one that cannot be used
  chooseDevice(&options);
  auto handle = std::make_unique<ncclComm>();
  handle->impl = std::make_unique<Communicator>(options);
  Communicator* c = handle->impl.get();
  auto job = [c, init = std::move(init)] { return init(c); };
  if (core::groupDepth() > 0) {
    core::enqueueInit(c, std::move(job));
  } else if (!options.blocking) {
    c->startAsync(std::move(job));
    registerComm(handle.get());
    *out = handle.release();
    return Status(Code::kInProgress, "");
  } else {
    Status s = job();
    if (!s.isOk()) {
      *out = nullptr;
      return s;
    }
  }
  registerComm(handle.get());
  *out = handle.release();
  return Status::ok();
}

Status initFromId(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                  const ncclConfig_t* config) {
  LOOM_TRY(checkInitArgs(comm, nranks, rank));
  CommOptions options = CommOptions::fromSettings();
  LOOM_TRY(parseConfig(config, &options));
  ncclUniqueId copy = id;
  return startInit(comm, options, [copy, nranks, rank](Communicator* c) {
    return c->initFromId(reinterpret_cast<const uint8_t*>(copy.internal), nranks, rank);
  });
}

// How long ncclCommAbort waits for other threads' calls to let go. They see
// the abort within milliseconds; only a group another thread left open
// holds its pins longer.
constexpr double kAbortWaitS = 30;

// ncclCommDestroy and ncclCommAbort: exactly one of two racing teardowns of
// a handle wins; the communicator is deleted once no call holds it (a data
// call in its thread's slot, any other through a pin).
Status closeHandle(ncclComm_t comm, bool abort) {
  {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    if (core::groupHolds(c.get())) {
      return invalidUsage("the calling thread's open group still holds operations or an init for this "
                          "communicator; call ncclGroupEnd before destroying or aborting it");
    }
  }
  LOOM_ASSIGN_OR_RETURN(ncclComm* handle, takeHandle(comm));
  Communicator* c = handle->impl.get();
  if (abort) {
    c->announceAbort(lastError());  // peers learn why before they see the connections close
    c->abort();                     // a running call notices within milliseconds
  } else {
    c->abortDependents();  // a child still being set up holds this one
  }
  const double waitS = abort ? kAbortWaitS : std::max(c->timeoutS(), kAbortWaitS);
  const Deadline deadline = Deadline::afterSeconds(waitS);
  if (!waitForCalls(handle, deadline) || !c->closeAndWait(deadline.msLeft() / 1000.0)) {
    // Deleting it now would crash the thread that still holds it: keep it.
    LOOM_WARN("%s is still in use by another thread %.0f s after %s; its memory is kept so that thread "
              "cannot crash (end that thread's group or call first)",
              c->describe().c_str(), waitS, abort ? "ncclCommAbort" : "ncclCommDestroy");
    return Status::ok();
  }
  c->dumpFlightRecorderAtDestroy(abort ? "ncclCommAbort" : "ncclCommDestroy");
  delete handle;
  return Status::ok();
}

}  // namespace
}  // namespace loom::api

using namespace loom;
using namespace loom::api;

NCCL_API(ncclResult_t, ncclGetVersion, int* version) {
  return guard("ncclGetVersion", [&] {
    LOOM_TRY(checkPtr(version, "version"));
    *version = NCCL_VERSION_CODE;
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId) {
  return guard("ncclGetUniqueId", [&] {
    LOOM_TRY(checkPtr(uniqueId, "uniqueId"));
    return loom::core::getUniqueId(reinterpret_cast<uint8_t*>(uniqueId->internal));
  });
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guard("ncclCommInitRank", [&] { return initFromId(comm, nranks, commId, rank, nullptr); });
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t* config) {
  return guard("ncclCommInitRankConfig", [&] { return initFromId(comm, nranks, commId, rank, config); });
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId,
         ncclUniqueId* commIds, ncclConfig_t* config) {
  return guard("ncclCommInitRankScalable", [&] {
    LOOM_TRY(checkPtr(commIds, "commIds"));
    if (nId < 1) return invalidArgument("nId " + std::to_string(nId) + " must be at least 1");
    // One rendezvous serves all ranks here; the other ids' roots time out unused.
    return initFromId(newcomm, nranks, commIds[0], myrank, config);
  });
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comm, int ndev, const int* devlist) {
  return guard("ncclCommInitAll", [&] {
    LOOM_TRY(checkPtr(comm, "comm"));
    if (ndev < 1) return invalidArgument("ndev " + std::to_string(ndev) + " must be at least 1");
    if (devlist) {
      for (int i = 0; i < ndev; ++i)
        if (devlist[i] < 0) return invalidArgument("devlist[" + std::to_string(i) + "] is negative");
    }
    ncclUniqueId id;
    LOOM_TRY(loom::core::getUniqueId(reinterpret_cast<uint8_t*>(id.internal)));
    std::vector<ncclComm_t> comms(size_t(ndev), nullptr);
    LOOM_TRY(loom::core::groupStart());
    // Rank i on devlist[i], or on device i (wrapping around when there are
    // fewer GPUs: loom lets ranks share one).
    const int devices = device::api() ? device::api()->deviceCount() : 0;
    for (int i = 0; i < ndev; ++i) {
      CommOptions options = CommOptions::fromSettings();
      options.blocking = true;
      if (devices > 0) options.cudaDevice = devlist ? devlist[i] : i % devices;
      Status s = startInit(&comms[size_t(i)], options, [id, ndev, i](Communicator* c) {
        return c->initFromId(reinterpret_cast<const uint8_t*>(id.internal), ndev, i);
      });
      if (!s.isOk()) {
        loom::core::groupEnd().ignore();
        return s;
      }
    }
    Status s = loom::core::groupEnd();
    if (!s.isOk()) {
      for (ncclComm_t c : comms)
        if (c) closeHandle(c, true).ignore();
      return s;
    }
    for (int i = 0; i < ndev; ++i) comm[i] = comms[size_t(i)];
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
         ncclConfig_t* config) {
  return guard("ncclCommSplit", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef parent, lookupUsable(comm));
    LOOM_TRY(checkPtr(newcomm, "newcomm"));
    if (color < NCCL_SPLIT_NOCOLOR) {
      return invalidArgument("color " + std::to_string(color) + " must be >= 0 or NCCL_SPLIT_NOCOLOR (-1)");
    }
    CommOptions options = childOptions(*parent, config);
    LOOM_TRY(parseConfig(config, &options));
    *newcomm = nullptr;
    // Its place among the parent's splits is taken now, in call order,
    // whichever thread runs it later.
    const uint64_t ticket = parent->reserveSplit();
    if (color == NCCL_SPLIT_NOCOLOR) {
      if (loom::core::groupDepth() > 0) {
        // No child to own the job: it runs inside groupEnd, even for a
        // non-blocking parent, whose own init thread must stay untouched.
        loom::core::enqueueInit(nullptr, [parent = std::move(parent), ticket, key]() mutable {
          return Communicator::split(std::move(parent), ticket, -1, key, nullptr);
        });
        return Status::ok();
      }
      return Communicator::split(std::move(parent), ticket, -1, key, nullptr);
    }
    // The job lets go of the parent as soon as the split is done with it.
    return startInit(newcomm, options, [parent = std::move(parent), ticket, color, key](Communicator* child) mutable {
      return Communicator::split(std::move(parent), ticket, color, key, child);
    });
  });
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
         ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return guard("ncclCommShrink", [&]() -> Status {
    // A failed parent is what a shrink is for: no lookupUsable.
    LOOM_ASSIGN_OR_RETURN(CommRef parent, lookup(comm));
    LOOM_TRY(checkPtr(newcomm, "newcomm"));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
      return invalidArgument("shrinkFlags " + std::to_string(shrinkFlags) +
                             " is neither NCCL_SHRINK_DEFAULT (0) nor NCCL_SHRINK_ABORT (1)");
    }
    if (excludeRanksCount < 0) return invalidArgument("excludeRanksCount is negative");
    if (excludeRanksCount > 0) LOOM_TRY(checkPtr(excludeRanksList, "excludeRanksList"));
    if (Status s = parent->waitReady(); !s.isOk() && !parent->ready()) {
      return Status(s.code(), "the communicator's init did not succeed, so it cannot be shrunk: " + s.message());
    }
    std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
    std::sort(excluded.begin(), excluded.end());
    for (size_t i = 0; i < excluded.size(); ++i) {
      LOOM_TRY(checkRank(excluded[i], parent->nranks(), "excludeRanksList entry"));
      if (i > 0 && excluded[i] == excluded[i - 1]) {
        return invalidArgument("excludeRanksList names rank " + std::to_string(excluded[i]) + " twice");
      }
    }
    if (std::binary_search(excluded.begin(), excluded.end(), parent->rank())) {
      return invalidUsage("this rank (" + std::to_string(parent->rank()) +
                          ") is in excludeRanksList: only the remaining ranks call ncclCommShrink");
    }
    CommOptions options = childOptions(*parent, config);
    LOOM_TRY(parseConfig(config, &options));
    *newcomm = nullptr;
    const uint64_t ticket = parent->reserveShrink(excluded);
    // The excluded ranks may be dead or hung: end the parent's work first.
    if (shrinkFlags == NCCL_SHRINK_ABORT) parent->revoke();
    const bool drain = shrinkFlags == NCCL_SHRINK_DEFAULT;
    return startInit(newcomm, options,
                     [parent = std::move(parent), ticket, excluded, drain](Communicator* child) mutable {
                       core::DeviceQueue* q = drain ? parent->deviceQueue() : nullptr;
                       if (q) {
                         LOOM_TRY(q->drain(parent->timeoutS())
                                      .addContext("ncclCommShrink waits for the parent's queued work"));
                       }
                       return Communicator::shrink(std::move(parent), ticket, std::move(excluded), child);
                     });
  });
}

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId) {
  return guard("ncclCommGetUniqueId", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookupUsable(comm));
    LOOM_TRY(checkPtr(uniqueId, "uniqueId"));
    return c->makeGrowId(reinterpret_cast<uint8_t*>(uniqueId->internal));
  });
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
         ncclComm_t* newcomm, ncclConfig_t* config) {
  return guard("ncclCommGrow", [&]() -> Status {
    LOOM_TRY(checkPtr(newcomm, "newcomm"));
    *newcomm = nullptr;
    if (nRanks < 1) return invalidArgument("nRanks " + std::to_string(nRanks) + " must be at least 1");
    if (core::useCommIdEnv()) {
      return invalidUsage("NCCL_COMM_ID is set, and the grown communicator would meet there instead of at "
                          "the id from ncclCommGetUniqueId; unset it to grow");
    }
    if (!comm) {  // a new rank
      LOOM_TRY(checkPtr(uniqueId, "uniqueId (a new rank joins with the id from ncclCommGetUniqueId)"));
      if (rank < 0 || rank >= nRanks) {
        return invalidArgument("rank " + std::to_string(rank) + ": a new rank passes its rank in the grown "
                               "communicator, 0 .. nRanks-1 (" + std::to_string(nRanks - 1) + ")");
      }
      return initFromId(newcomm, nRanks, *uniqueId, rank, config);
    }
    LOOM_ASSIGN_OR_RETURN(CommRef parent, lookupUsable(comm));
    if (rank != -1) {
      return invalidArgument("rank " + std::to_string(rank) + ": a rank of comm keeps its number in the grown "
                             "communicator and passes -1");
    }
    if (nRanks <= parent->nranks()) {
      return invalidArgument("nRanks " + std::to_string(nRanks) + " does not grow a communicator of " +
                             std::to_string(parent->nranks()) + " ranks");
    }
    CommOptions options = childOptions(*parent, config);
    LOOM_TRY(parseConfig(config, &options));
    // The buffer mode and device of comm, whatever LOOM_DEVICE says now.
    options.device = core::modeName(parent->mode());
    options.cudaDevice = parent->cudaDevice();
    std::vector<uint8_t> given;
    if (uniqueId) given.assign(uniqueId->internal, uniqueId->internal + sizeof uniqueId->internal);
    const uint64_t ticket = parent->reserveSplit();
    return startInit(newcomm, options,
                     [parent = std::move(parent), ticket, nRanks, given = std::move(given)](Communicator* child) mutable {
                       return Communicator::grow(std::move(parent), ticket, nRanks, std::move(given), child);
                     });
  });
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  return guard("ncclCommRevoke", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    if (revokeFlags != NCCL_REVOKE_DEFAULT) {
      return invalidArgument("revokeFlags " + std::to_string(revokeFlags) + " is not NCCL_REVOKE_DEFAULT (0)");
    }
    c->revoke();
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  return guard("ncclCommFinalize", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    // Host mode: every operation has completed when its call returned, so
    // finalizing only waits for a pending non-blocking init. Cuda mode
    // also waits for the queued operations (bounded by LOOM_TIMEOUT_S).
    Status s = c->waitReady();
    if (s.code() == Code::kInProgress) return Status::ok();
    LOOM_TRY(s);
    if (core::DeviceQueue* q = c->deviceQueue()) LOOM_TRY(q->drain(c->timeoutS()));
    return c->stickyError();
  });
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  return guard("ncclCommDestroy", [&]() -> Status {
    if (!comm) return Status::ok();  // as NCCL: destroying NULL is a no-op
    return closeHandle(comm, false);
  });
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  return guard("ncclCommAbort", [&]() -> Status {
    if (!comm) return Status::ok();
    return closeHandle(comm, true);
  });
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(asyncError, "asyncError"));
    if (c->ready()) c->pollNoticesThrottled();
    Status s = c->asyncError();
    if (s.isOk() || s.code() == Code::kInProgress) {
      *asyncError = toNccl(s.code());
    } else {
      recordError("ncclCommGetAsyncError", s);
      *asyncError = toNccl(s.code());
    }
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count) {
  return guard("ncclCommCount", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(count, "count"));
    *count = c->nranks();
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device) {
  return guard("ncclCommCuDevice", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(device, "device"));
    *device = c->cudaDevice();
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank) {
  return guard("ncclCommUserRank", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(rank, "rank"));
    *rank = c->rank();
    return Status::ok();
  });
}
