// Communicator: one rank's membership in a group of ranks.
//
// Owns the bootstrap (listener, peer table, ring), the data connections
// (created on first use, one per peer), the staging memory, the user
// reduction ops, and the sticky error. Threading: operations on a
// communicator run one at a time (opMutex); abort() may be called from any
// thread and makes a running operation return within a bounded time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "core/bootstrap.h"
#include "core/executor.h"
#include "core/mode.h"
#include "core/op.h"
#include "core/peer_link.h"
#include "transport/connection.h"

namespace loom::core {

constexpr size_t kUniqueIdBytes = 128;

struct CommOptions {
  bool blocking = true;
  std::string name;
  LinkOptions link;  // its connectTimeoutS follows initTimeoutS
  size_t sliceBytes = 512 * 1024;
  double timeoutS = 1800;
  double initTimeoutS = 300;
  // Filled from the settings; the API layer then applies ncclConfig_t.
  static CommOptions fromSettings();
};

// Fills a new unique id and starts its rendezvous root (or, with
// NCCL_COMM_ID, describes that address; rank 0 starts the root at init).
Status getUniqueId(uint8_t id[kUniqueIdBytes]);

class Communicator {
 public:
  explicit Communicator(const CommOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Blocking init from a unique id. Called on the caller's thread, a group
  // thread or the non-blocking init thread; sets the state when done.
  Status initFromId(const uint8_t id[kUniqueIdBytes], int nranks, int rank);
  // Runs `job` (an init) on a thread of its own; asyncError() says
  // kInProgress until it finishes.
  void startAsync(std::function<Status()> job);
  // Waits for an asynchronous init to finish and returns its result.
  Status waitReady();

  // Collective over the parent: ranks with the same color form a new
  // communicator ordered by (key, parent rank) and `child` (created by the
  // caller, null for NCCL_SPLIT_NOCOLOR = -1) becomes this rank's member.
  static Status split(Communicator& parent, int color, int key, Communicator* child);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int cudaDevice() const { return -1; }  // host mode
  const CommOptions& options() const { return options_; }
  Bootstrap& bootstrap() { return *bootstrap_; }
  const Bootstrap& bootstrap() const { return *bootstrap_; }
  std::string describe() const;     // "comm 0x.. rank 1/4"
  std::string describePeer(int r) const { return bootstrap_->describe(r); }

  // Sticky error: kInProgress during async init; the first failure after.
  Status asyncError() const;
  bool ready() const { return state_.load() == State::kReady; }
  // Records a failure (first one wins) and, when `tellPeers`, sends an abort
  // notice to every other rank so non-neighbours learn about it too.
  void fail(const Status& status, bool tellPeers);
  // Non-blocking check of the listener for abort notices from peers.
  void pollNotices();

  // Any thread: stop what runs on this communicator, as soon as possible.
  void abort();
  bool aborted() const { return abort_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }
  int wakeFd() const { return wakeFd_.get(); }

  // Data connections: one step of getting `peers` connected without
  // blocking; *ready when all are. Loopback for the rank itself.
  Status connectStep(const std::vector<int>& peers, bool* ready);
  // Blocking version (init, tests).
  Status connectAll(const std::vector<int>& peers, Deadline deadline);
  std::span<transport::Connection* const> connections() const { return connPtrs_; }

  std::mutex& opMutex() { return opMutex_; }
  Scratch& scratch() { return scratch_; }
  uint64_t nextSeq() { return ++seq_; }

  // User reduction ops (ncclRedOpCreatePreMulSum).
  Result<int> createPreMulSum(kernels::DataType type, const void* scalar, bool deviceResident);
  Status destroyOp(int op);
  // Maps an ncclRedOp_t value to a Reduction (and the scalar pointer to read
  // at run time for device-resident scalars).
  Status resolveOp(int op, kernels::DataType type, kernels::Reduction* out, const void** scalarPtr) const;

 private:
  enum class State { kInitializing, kReady, kFailed };
  Status initCommon(const net::SocketAddress* reach);
  Status finishInit();

  struct UserOp {
    bool live = false;
    kernels::DataType type{};
    bool deviceResident = false;
    uint64_t scalarBits = 0;
    const void* scalarPtr = nullptr;
  };

  CommOptions options_;
  int rank_ = 0;
  int nranks_ = 1;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<std::unique_ptr<transport::Connection>> conns_;
  std::vector<transport::Connection*> connPtrs_;
  std::atomic<State> state_{State::kInitializing};
  mutable std::mutex errorMutex_;
  Status error_;
  std::atomic<bool> abort_{false};
  net::UniqueFd wakeFd_;
  std::thread initThread_;
  std::mutex listenMutex_;  // guards the bootstrap listener state
  std::map<int, std::unique_ptr<PeerLink>> links_;  // connections being set up
  std::mutex opMutex_;
  Scratch scratch_;
  uint64_t seq_ = 0;
  uint64_t splits_ = 0;  // ncclCommSplit calls on this communicator
  mutable std::mutex opsMutex_;
  std::vector<UserOp> userOps_;
};

}  // namespace loom::core
