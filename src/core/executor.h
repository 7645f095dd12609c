// The executor: runs one rank's Plan over transport connections.
//
// PlanRunner is a non-blocking state machine: advance() does whatever can be
// done right now (post receives, reduce, post sends, move bytes) and returns;
// the caller decides how to wait (spin, yield, poll). One runner can thus
// drive several operations of several communicators from one thread, and the
// simulator can interleave all ranks of a test in one thread.
//
// Hazards: a step never writes a user-buffer region that an earlier,
// still-queued send reads (it waits for that send), so in-place operations
// and sends straight from user buffers are safe.
//
// Cuda mode (a DeviceContext): the user buffers are device memory that the
// host never touches. Each step's arithmetic and copies are queued on the
// context's stream as kernels, and the step finishes (posting its send,
// freeing slots) only once an event after them has fired: the host decides
// when a kernel runs, so no kernel ever waits for a peer. A connection that
// moves device memory (Connection::moves) is handed device pointers; the
// others send from and receive into staging slots of pinned host memory,
// which both the kernels and the host transports reach. When every
// connection of a plan moves device memory, its slots are device memory.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"
#include "core/plan.h"
#include "core/registration.h"
#include "device/device.h"
#include "kernels/reduce.h"
#include "transport/transport.h"

namespace loom::core {

// Reusable staging memory, grown on demand (one per communicator: its
// operations run one after another). Host memory, or memory of a device
// table when constructed with one: pinned host memory, or device memory.
class Scratch {
 public:
  enum class Kind { kHost, kPinned, kDevice };
  Scratch() = default;
  Scratch(device::Api* api, Kind kind) : api_(api), kind_(kind) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // At least `bytes` of memory, or an error naming the size. Pinned and
  // device memory that grows keeps its old block until the destructor: a
  // cudaFree waits for the whole device, and the progress thread calls this
  // while users' streams wait behind loom's gates. Blocks at least double,
  // so the kept ones add up to less than the last.
  //
  // Allocating pinned or device memory may wait for the whole device too
  // (CUDA lists both among the calls that synchronize implicitly), so in
  // cuda mode the caller's thread reserve()s what an operation will need
  // before it queues the operation's gates, and the progress thread's get()
  // finds it there. Should get() still have to grow a pinned or device block,
  // it does, and warns once: that operation may hang on some drivers.
  Result<std::byte*> get(size_t bytes);
  // Grows the memory to at least `bytes` now (any thread; get() may run on
  // another meanwhile: what it returned stays valid).
  Status reserve(size_t bytes);
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return size_;
  }

 private:
  // Under mutex_.
  Status grow(size_t bytes);
  void release(std::byte* mem);
  device::Api* api_ = nullptr;
  Kind kind_ = Kind::kHost;
  std::mutex mutex_;  // reserve() and get() on different threads
  std::byte* mem_ = nullptr;
  size_t size_ = 0;
  std::vector<std::byte*> retired_;
  bool warned_ = false;
};

// Cuda mode: where the executor's kernels run (see the top of this file).
struct DeviceContext {
  device::Api* api = nullptr;
  device::Stream stream = nullptr;
  // Slots: in device memory when every connection a plan uses moves device
  // memory, else pinned host memory.
  Scratch* pinned = nullptr;
  Scratch* onDevice = nullptr;
  // One event per plan stream, created as needed, owned by the context's owner.
  std::vector<device::Event>* events = nullptr;
};

// Whether a host operation writes its results into the user's buffers
// with streaming stores: it writes at least config.streamingMinBytes of
// them, and the bytes it touches, times the `hostRanks` ranks that share
// the host's cache, take more than a quarter of config.cacheBytes (any
// amount when that is unknown, 0).
bool streamsResults(size_t written, size_t touched, int hostRanks, const kernels::CpuKernelConfig& config);

class PlanRunner {
 public:
  // `buffers[i]` binds BufRef::buf == i. `conns` is a table of connections
  // by (peer, channel) (linkIndex, core/plan.h): the entry of every peer a
  // stream names on the stream's channel must be non-null (the rank's own
  // entry connects it to itself); create() checks.
  // `reduction` is used for steps with reduce/post set and for the pre op of
  // `local` in reducing plans (`reducing` = the operation reduces). Every
  // transfer carries its region from `registrations` when there is one
  // (null: none). Staging slots come from `scratch`, or with a `device`
  // context from its scratch. Fails when they cannot be allocated.
  static Result<std::unique_ptr<PlanRunner>> create(const Plan* plan, std::vector<std::byte*> buffers,
                                                    kernels::Reduction reduction, bool reducing,
                                                    std::span<transport::Connection* const> conns,
                                                    Scratch* scratch, RegistrationCache* registrations = nullptr,
                                                    const DeviceContext* device = nullptr);
  // Staging bytes a plan needs: slots only for the steps whose data does
  // not go straight between user buffers and connections (receives that
  // reduce or have no output, local transforms that are sent). Plain data
  // movement (AllGather, Broadcast, point-to-point) needs none.
  static size_t stagingBytes(const Plan& plan, const kernels::Reduction& reduction, bool reducing,
                             bool device = false);
  PlanRunner(const PlanRunner&) = delete;
  PlanRunner& operator=(const PlanRunner&) = delete;
  // Host plans: makes a finished runner ready to run its plan again on
  // other buffers, without allocating (a repeated operation reuses it).
  // Takes the same arguments as create() for what may change.
  Status rebind(std::span<std::byte* const> buffers, const kernels::Reduction& reduction,
                std::span<transport::Connection* const> conns, Scratch* scratch);

  // Makes all progress possible now; sets *progressed when anything moved.
  // An error names the peer involved (the caller adds the operation).
  Status advance(bool* progressed);
  bool done() const;
  // Peers whose messages the runner is waiting for right now.
  void waitingOn(std::vector<int>* peers) const;
  // The peer whose connection reported the error advance() returned, or -1.
  int failedPeer() const { return failedPeer_; }
  // Connections the runner uses (each once).
  const std::vector<transport::Connection*>& connections() const { return used_; }
  // True while a step waits for its kernels (no fd announces their end).
  bool deviceBusy() const;

 private:
  // Sets t.region from registrations_ (when there are any to consult).
  Status attachRegion(transport::Connection& c, transport::Transfer& t);
  // Fills used_ from conns_ (an error names a missing connection), and
  // places the streams' slots in `scratch`.
  Status bindConnections();
  // Each stream's slot size and count, for the plan and the reduction.
  void layoutStreams();
  Status bindSlots(Scratch* scratch);
  PlanRunner(const Plan* plan, std::vector<std::byte*> buffers, kernels::Reduction reduction, bool reducing,
             std::span<transport::Connection* const> conns, const DeviceContext* device);
  static constexpr int kSlots = 4;  // staging slots per stream, at least
  static constexpr int kMaxSlots = 64;  // fan-in steps need one per source
  static size_t streamSlotBytes(const std::vector<Step>& steps, const kernels::Reduction& reduction,
                                bool reducing, bool device);
  // Slots a stream needs (create() refuses more than kMaxSlots): kSlots, or
  // for a fan-in one per source, one for a transformed local, one for the
  // result, beside the transformed sends since the previous fan-in (on a
  // device every send, which may be staged).
  static int streamSlots(const std::vector<Step>& steps, const kernels::Reduction& reduction, bool reducing,
                         bool device);
  // kCompute produces the step's result (host: at once; device: queues
  // kernels, then kDeviceWait until their event fired); kFinish posts it.
  enum class Phase { kStart, kReceiving, kCompute, kDeviceWait, kFinish };
  // The reduction of a receiving step into its result: run piece by piece by
  // a transport that hands over its own memory (Transfer::sink), else once
  // by compute() on the staging slot.
  // On a device the pieces are in a device-moving transport's memory (a
  // CUDA IPC inbox): consume() queues the reduction kernel, and the
  // transport holds the pieces (Transfer::hold) until finish() releases
  // them, after the step's event fired.
  class ReduceSink final : public transport::Sink {
   public:
    void consume(size_t offset, const void* bytes, size_t n) override;
    const kernels::Reduction* reduction = nullptr;
    std::byte* dst = nullptr;
    const std::byte* local = nullptr;  // may be null
    bool post = false;
    const kernels::CpuKernelConfig* config = nullptr;  // host: how dst is written
    const DeviceContext* device = nullptr;
    Status error;  // a kernel launch that failed (device)
  };
  // A fused step: one that receives and sends, over connections that allow
  // it (host buffers, a ring: fuses()). Its receive hands over its pieces
  // where they lie in the transport's memory and holds them
  // (Transfer::hold); its send, posted at once, has each piece folded with
  // the local input (or copied) straight into the send's transport memory
  // (Transfer::source), and from there into the step's user buffer if it
  // has one. One pass where the step otherwise writes a slot or the user
  // buffer and the send copies that again.
  class FusedStep final : public transport::Sink, public transport::Source {
   public:
    // reduction: null for a copy; out: null when the step keeps no result.
    void start(const kernels::Reduction* reduction, const std::byte* local, bool post, std::byte* out,
               const kernels::CpuKernelConfig* outConfig);
    void consume(size_t offset, const void* bytes, size_t n) override;
    size_t ready() const override { return arrived_; }
    void produce(size_t offset, void* to, size_t n) override;

   private:
    struct Piece {
      size_t offset;
      const std::byte* at;
      size_t bytes;
    };
    const kernels::Reduction* reduction_ = nullptr;
    const std::byte* local_ = nullptr;  // may be null
    bool post_ = false;
    std::byte* out_ = nullptr;
    const kernels::CpuKernelConfig* outConfig_ = nullptr;
    std::vector<Piece> pieces_;  // handed over so far, in order
    size_t cursor_ = 0;          // the first piece not wholly produced
    size_t arrived_ = 0;         // bytes handed over
  };
  struct PendingSend {
    transport::Transfer xfer;
    const std::byte* begin;
    const std::byte* end;
    int slot;  // staging slot held until done, or -1
    int peer;
  };
  struct StreamState {
    int channel = 0;  // of the plan's stream
    size_t next = 0;  // index of the current step
    Phase phase = Phase::kStart;
    transport::Transfer recv;
    ReduceSink sink;
    // The running step is fused (fuses()): its send and what produces it.
    bool fusing = false;
    FusedStep fused;
    transport::Transfer fusedSend;
    int recvSlot = -1;
    std::byte* slots = nullptr;  // nslots * slotBytes
    size_t slotBytes = 0;
    int nslots = kSlots;
    // Host: a receive of this stream may land where a send of the plan reads
    // (layoutStreams): such receives wait for those sends in a slot.
    bool overlaps = false;
    // A send of this stream may go single-copy (Step::singleCopy).
    bool singleCopy = false;
    uint64_t freeSlots = (uint64_t(1) << kSlots) - 1;
    // A fan-in step's receives (sized once per step: posted transfers never
    // move) and the slots they land in.
    std::vector<transport::Transfer> fanRecvs;
    std::vector<int> fanSlots;
    std::deque<PendingSend> sends;
    // The computed step, until kFinish posts it.
    const std::byte* result = nullptr;
    int hold = -1;       // slot holding the result
    std::vector<int> freeAfter;  // slots the step's computation reads (its kernels: device), freed at kFinish
    device::Event event = nullptr;
  };

  Status advanceStream(size_t index, StreamState& st, bool* progressed);
  bool startStep(const Step& step, StreamState& st, Status* error);
  bool startFanIn(const Step& step, StreamState& st, Status* error);
  // Whether `step` runs fused (FusedStep), and its start and end.
  bool fuses(const Step& step, const StreamState& st) const;
  // A fused step's message, should it arrive whole, lands in a staging slot
  // where the step folds it (in place, the output is its input) or keeps
  // no result; else in the output.
  static bool landsInSlot(const Step& step) { return step.reduce || !step.out.valid(); }
  bool startFused(const Step& step, StreamState& st, Status* error);
  // Notes the peer whose connection failed with `s` and returns its
  // success (for the start functions, which report through *error).
  bool succeeded(int peer, Status s, Status* error) {
    *error = std::move(s);
    if (error->isOk()) return true;
    failedPeer_ = peer;
    return false;
  }
  // Attaches, posts and progresses receive `t` from `peer` over `c`.
  bool postReceive(int peer, transport::Connection& c, transport::Transfer& t, Status* error);
  // True once the fused step's send is written and its receive released.
  Result<bool> finishFused(const Step& step, StreamState& st);
  Status compute(const Step& step, StreamState& st);
  Status computeFanIn(const Step& step, StreamState& st);
  Status computeFanInOnDevice(const Step& step, StreamState& st);
  // A fan-in's local input is pre-multiplied into a slot first (PreMulSum).
  bool premultipliesLocal(const Step& s) const {
    return s.localAt >= 0 && !s.localPartial && reducing_ && reduction_.op == kernels::RedOp::kPreMulSum;
  }
  // Fills `out` with a fan-in's sources in fold order (`local` at the step's
  // place, the slots of `fanSlots` for its messages) and returns how many;
  // *fold is the reduction to fold them with (pre is applied to every one).
  int foldSources(const Step& step, const StreamState& st, const std::vector<int>& fanSlots, const std::byte* local,
                  const void** out, kernels::Reduction* fold) const;
  Status computeOnDevice(const Step& step, StreamState& st);
  Status finish(const Step& step, StreamState& st);
  int takeSlot(StreamState& st);
  static void freeSlot(StreamState& st, int slot) { st.freeSlots |= uint64_t(1) << slot; }
  std::byte* slot(const StreamState& st, int index) const { return st.slots + size_t(index) * st.slotBytes; }
  bool inSlots(const StreamState& st, const std::byte* p) const {
    return st.slots && p >= st.slots && p < st.slots + size_t(st.nslots) * st.slotBytes;
  }
  // The memory type of a transfer at `p` (a staging slot, or a user buffer).
  transport::MemoryType memoryOf(const StreamState& st, const std::byte* p) const;
  void retireSends(StreamState& st, bool* progressed);
  // The regions the plan's sends read, by start (for overlappingReceiveBytes).
  struct SendRegions {
    std::vector<std::pair<const std::byte*, const std::byte*>> begins;  // [begin, end), sorted
    std::vector<const std::byte*> reach;  // the furthest end of the first i + 1
  };
  SendRegions sendRegions() const;
  // The largest receive of `steps` straight into a region that a send of
  // the plan reads (host); 0 when none.
  size_t overlappingReceiveBytes(const std::vector<Step>& steps, const SendRegions& sends) const;
  bool writeBlocked(const std::byte* begin, size_t bytes) const;
  // True while a send step of another stream that reads [begin, begin +
  // bytes) has not posted its send yet (an in-place fold waits for the
  // sends of the input it overwrites: direct AllReduce).
  bool readPending(const StreamState& self, const std::byte* begin, size_t bytes) const;
  std::byte* ptr(const BufRef& ref) const { return buffers_[size_t(ref.buf)] + ref.offset; }
  size_t elements(const Step& s) const { return s.bytes / std::max<size_t>(1, kernels::dataTypeSize(reduction_.type)); }
  // The step's send leaves from a slot: its connection cannot move device memory.
  bool stagedSend(const Step& s, const StreamState& st) const {
    return s.sendPeer >= 0 && !conn(st, s.sendPeer)->moves(transport::MemoryType::kDevice);
  }
  transport::Connection* conn(const StreamState& st, int peer) const {
    return conns_[linkIndex(peer, st.channel, plan_->nranks)];
  }

  const Plan* plan_;
  std::vector<std::byte*> buffers_;
  kernels::Reduction reduction_;
  bool reducing_;
  // Host: how results are written into the user's buffers. An operation
  // that writes at least LOOM_CPU_STREAMING_BYTES of them, and whose
  // buffers, times the ranks on this host, take more than a quarter of the
  // shared cache (streamsResults()), streams every such write
  // past the caches (chooseStreaming()), its direct receives too
  // (Transfer::stream): the data would not stay cached anyway, and plain
  // stores first read every line they fill. Smaller ones leave their data
  // cached for the next call: AllReduce of 16 MiB, 2 ranks, in place on a
  // 480 MiB L3, 2.6 -> 2.2 ms; of 64 MiB out of place it streams,
  // 15.5 -> 11.7 ms.
  kernels::CpuKernelConfig outConfig_;
  bool streamOutput_ = false;
  // From the plan: bytes of results and of input read from the send
  // buffers, and how far into a collective's two buffers they reach.
  size_t written_ = 0;
  size_t sendRead_ = 0;
  size_t recvExtent_ = 0;
  size_t sendExtent_ = 0;
  // Sets outConfig_ and streamOutput_ for the plan and the bound buffers.
  void chooseStreaming();
  // A host ring or chain: its steps may fuse (fuses()). Set from the plan.
  bool fusable_ = false;
  // outConfig_ for a step's result in a user buffer, unless the step sends
  // it on: the send then finds it in this core's cache.
  const kernels::CpuKernelConfig& resultConfig(const Step& s) const {
    return s.sendPeer < 0 ? outConfig_ : kernels::defaultCpuKernelConfig();
  }
  std::span<transport::Connection* const> conns_;
  RegistrationCache* registrations_ = nullptr;
  const DeviceContext* device_ = nullptr;
  bool slotsOnDevice_ = false;
  std::vector<transport::Connection*> used_;
  std::vector<StreamState> streams_;
  int failedPeer_ = -1;
};

}  // namespace loom::core
