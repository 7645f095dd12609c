#include "core/communicator.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstring>

#include "common/log.h"
#include "common/settings.h"
#include "core/group.h"
#include "core/root.h"
#include "core/scalar.h"
#include "topology/detect.h"
#include "topology/host_id.h"

namespace loom::core {
namespace {

constexpr int kNumBuiltinOps = 5;  // ncclNumOps
constexpr int kAvg = 4;
// Secret used with NCCL_COMM_ID when LOOM_COMM_SECRET is unset: well known,
// like NCCL's fixed magic; it only keeps strangers' bytes out.
constexpr uint64_t kWellKnownSecret[2] = {0x6c6f6f6d2d636f6dull, 0x6d2d69642d763031ull};

void secretFromSettings(uint64_t out[2]) {
  const std::string text = settings::current()->getString("LOOM_COMM_SECRET");
  if (text.empty()) {
    out[0] = kWellKnownSecret[0];
    out[1] = kWellKnownSecret[1];
  } else {
    out[0] = hashBytes(text.data(), text.size());
    out[1] = hashBytes(text.data(), text.size(), 0x9e3779b97f4a7c15ull);
  }
}

Result<net::SocketAddress> commIdAddress() {
  const std::string env = settings::current()->getString("NCCL_COMM_ID");
  auto addr = net::SocketAddress::parse(env);
  if (!addr.isOk()) {
    return invalidArgument("NCCL_COMM_ID='" + env + "' is not a valid host:port: " +
                           addr.status().message());
  }
  return addr;
}

}  // namespace

bool useCommIdEnv() { return !settings::current()->getString("NCCL_COMM_ID").empty(); }

namespace {
// See spinRounds(): an idle round costs ~0.1 us over shared memory (a look at
// each connection), a system call per socket over TCP.
constexpr int kDedicatedSpinRounds = 2000;
constexpr int kSharedSpinRounds = 64;
std::atomic<pid_t> gPid{0};
void refreshPid() { gPid.store(::getpid(), std::memory_order_relaxed); }

std::string rankList(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
  }
  out += ']';
  return out;
}
}  // namespace

pid_t processId() {
  static const bool registered = [] {
    refreshPid();
    return pthread_atfork(nullptr, nullptr, refreshPid) == 0;
  }();
  if (!registered) return ::getpid();
  return gPid.load(std::memory_order_relaxed);
}

CommOptions CommOptions::fromSettings() {
  auto cfg = settings::current();
  CommOptions o;
  o.blocking = cfg->getInt("NCCL_COMM_BLOCKING") != 0;
  // NCCL's way of asking for more sockets (threads x sockets per thread)
  // counts where loom's own is not given.
  int64_t sockets = cfg->getInt("LOOM_SOCKETS_PER_PEER");
  if (!cfg->isSet("LOOM_SOCKETS_PER_PEER") &&
      (cfg->isSet("NCCL_SOCKET_NTHREADS") || cfg->isSet("NCCL_NSOCKS_PERTHREAD"))) {
    sockets = std::max<int64_t>(cfg->getInt("NCCL_SOCKET_NTHREADS"), 1) *
              std::max<int64_t>(cfg->getInt("NCCL_NSOCKS_PERTHREAD"), 1);
  }
  o.link.socketsPerPeer = int(std::clamp<int64_t>(sockets, 1, 16));
  o.link.stripeMin = size_t(std::max<int64_t>(cfg->getInt("LOOM_SOCKET_STRIPE_MIN"), 4096));
  int64_t chunk = cfg->getInt("LOOM_CHUNK_BYTES");
  if (chunk > 0) {
    o.sliceBytes = o.networkSliceBytes = size_t(std::max<int64_t>(chunk, 4096));
  } else {
    o.sliceBytes = size_t(std::max<int64_t>(cfg->getInt("NCCL_BUFFSIZE") / 8, 64 * 1024));
    // Over TCP a rank's thread copies every byte in and out of the kernel
    // itself, and slices that stay in its cache while they go through
    // receive, reduce and send are worth more than fewer, larger messages:
    // on a veth pair 128 KiB slices reached 2.2-2.4 GB/s where 512 KiB
    // reached 1.3-1.6 (bench/cluster_bandwidth.py).
    o.networkSliceBytes = std::min(o.sliceBytes, o.networkSliceBytes);
  }
  o.maxChannels = int(std::clamp<int64_t>(cfg->getInt("NCCL_MAX_NCHANNELS"), 1, 32));
  o.channels = int(std::clamp<int64_t>(cfg->getInt("NCCL_MIN_NCHANNELS"), 1, o.maxChannels));
  o.timeoutS = double(cfg->getInt("LOOM_TIMEOUT_S"));
  o.stallWarnS = double(std::max<int64_t>(0, cfg->getInt("LOOM_STALL_WARN_S")));
  o.flightEntries = size_t(std::clamp<int64_t>(cfg->getInt("LOOM_FLIGHT_RECORDER_ENTRIES"), 0, 1 << 20));
  o.initTimeoutS = double(std::max<int64_t>(cfg->getInt("LOOM_INIT_TIMEOUT_S"), 1));
  o.link.selection = transport::Selection::fromSettings();
  o.device = threadDevice().empty() ? cfg->getString("LOOM_DEVICE") : threadDevice();
  o.latencyPath = cfg->getBool("LOOM_LATENCY_PATH");
  o.deterministic = cfg->getBool("LOOM_DETERMINISTIC");
  o.calibrate = cfg->getBool("LOOM_CALIBRATE");
  o.checkCollectives = cfg->getBool("LOOM_CHECK_COLLECTIVES");
  std::vector<std::string> warnings;
  o.algorithms = AlgoFilter::parse(cfg->getString("NCCL_ALGO"), &warnings);
  if (!parseProto(cfg->getString("NCCL_PROTO"), &warnings).latencyPath) o.latencyPath = false;
  static std::once_flag warned;  // settings are read once per process
  std::call_once(warned, [&] {
    for (const auto& w : warnings) LOOM_WARN("%s", w.c_str());
  });
  o.apply(Config{});  // NCCL_MIN_CTAS and NCCL_MAX_CTAS count without a config too
  return o;
}

void CommOptions::apply(const Config& config) {
  auto cfg = settings::current();
  // As NCCL, a setting of 0 or less is ignored.
  auto setting = [&](const char* name, int given) {
    return cfg->isSet(name) && cfg->getInt(name) > 0 ? int(std::min<int64_t>(cfg->getInt(name), 32)) : given;
  };
  if (int most = setting("NCCL_MAX_CTAS", config.maxChannels); most > 0) maxChannels = std::min(maxChannels, most);
  if (int least = setting("NCCL_MIN_CTAS", config.minChannels); least > 0) channels = std::max(channels, least);
  channels = std::clamp(channels, 1, maxChannels);
  if (!config.network.empty() && !cfg->isSet("NCCL_NET")) {
    link.selection.net = config.network;
    link.selection.netSource = "ncclConfig_t.netName";
  }
  if (config.trafficClass >= 0) link.selection.trafficClass = config.trafficClass;
}

Status getUniqueId(uint8_t id[kUniqueIdBytes]) {
  std::memset(id, 0, kUniqueIdBytes);
  wire::UniqueIdPayload p{};
  p.magic = wire::kIdMagic;
  p.version = wire::kIdVersion;
  net::SocketAddress root;
  if (useCommIdEnv()) {
    LOOM_ASSIGN_OR_RETURN(root, commIdAddress());
    secretFromSettings(p.secret);
  } else {
    if (getrandom(p.secret, sizeof p.secret, 0) != ssize_t(sizeof p.secret))
      return systemErrno("getrandom", errno);
    auto cfg = settings::current();
    LOOM_ASSIGN_OR_RETURN(net::Interface iface,
                          net::chooseInterface(cfg->getString("NCCL_SOCKET_IFNAME"),
                                               cfg->getString("NCCL_SOCKET_FAMILY"), nullptr));
    net::SocketAddress bindAddr = iface.addr;
    bindAddr.setPort(0);
    LOOM_ASSIGN_OR_RETURN(net::UniqueFd listener, net::listenOn(bindAddr, &root));
    RootOptions ro;
    ro.secret[0] = p.secret[0];
    ro.secret[1] = p.secret[1];
    ro.initTimeoutS = CommOptions::fromSettings().initTimeoutS;
    // Nobody owns this root: it ends once its ranks have their table, or at
    // the init timeout when they never come.
    LOOM_ASSIGN_OR_RETURN(auto server, RootServer::start(std::move(listener), ro));
    RootServer::detach(std::move(server));
    LOOM_INFO(log::kBootstrap, "unique id: rendezvous root listens on %s", root.toString().c_str());
  }
  if (getrandom(&p.nonce, sizeof p.nonce, 0) != ssize_t(sizeof p.nonce)) p.nonce = uint64_t(getpid());
  root.encode(p.rootAddr);
  std::memcpy(id, &p, sizeof p);
  return Status::ok();
}

Status decodeUniqueId(const uint8_t id[kUniqueIdBytes], net::SocketAddress* root, uint64_t secret[2]) {
  wire::UniqueIdPayload p;
  std::memcpy(&p, id, sizeof p);
  if (p.magic != wire::kIdMagic || p.version != wire::kIdVersion) {
    return invalidArgument("the ncclUniqueId was not made by loom's ncclGetUniqueId (or is "
                           "corrupt): pass every rank the id that one rank got, or set NCCL_COMM_ID");
  }
  auto addr = net::SocketAddress::decode(p.rootAddr);
  if (!addr.isOk() || addr->port() == 0 || (addr->family() != AF_INET && addr->family() != AF_INET6)) {
    return invalidArgument("the ncclUniqueId holds no usable rendezvous address (it is corrupt): pass every "
                           "rank the id that one rank got");
  }
  *root = *addr;
  secret[0] = p.secret[0];
  secret[1] = p.secret[1];
  return Status::ok();
}

Communicator::Communicator(const CommOptions& options)
    : options_(options), timeoutS_(options.timeoutS), ownerPid_(processId()), flight_(std::make_shared<FlightRecorder>(options.flightEntries)) {
  wakeFd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (options.flightEntries > 0) registerFlightRecorder(flight_);
}

Communicator::~Communicator() {
  unregisterFlightRecorder(flight_.get());
  abort();
  if (initThread_.joinable()) initThread_.join();
  root_.reset();  // stops a rendezvous that is still waiting, and joins it
}

bool Communicator::tryPin() {
  if (pins_.fetch_add(1, std::memory_order_acquire) & kClosing) {
    unpin();
    return false;
  }
  return true;
}

void Communicator::addPin() { pins_.fetch_add(1, std::memory_order_relaxed); }

void Communicator::unpin() {
  int64_t v = pins_.load(std::memory_order_relaxed);
  while (!(v & kClosing)) {
    if (pins_.compare_exchange_weak(v, v - 1, std::memory_order_acq_rel)) return;
  }
  // Closing: drop the pin under the lock, so that the closer (which checks
  // the count under it) cannot see the last pin gone and free this
  // communicator before this call is done with it.
  std::lock_guard<std::mutex> lock(pinMutex_);
  if (pins_.fetch_sub(1, std::memory_order_acq_rel) - 1 == kClosing) pinCv_.notify_all();
}

bool Communicator::closeAndWait(double seconds) {
  std::unique_lock<std::mutex> lock(pinMutex_);
  pins_.fetch_or(kClosing, std::memory_order_acq_rel);
  return pinCv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return pins_.load() == kClosing; });
}

void Communicator::addDependent(Communicator* child, bool abortIfAborted) {
  std::lock_guard<std::mutex> lock(dependentsMutex_);
  dependents_.push_back(child);
  if (abortIfAborted && aborted()) child->abort();
}

void Communicator::removeDependent(Communicator* child) {
  std::lock_guard<std::mutex> lock(dependentsMutex_);
  dependents_.erase(std::remove(dependents_.begin(), dependents_.end(), child), dependents_.end());
}

std::string Communicator::describe() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "comm %p rank %d/%d", static_cast<const void*>(this), rank_, nranks_);
  std::string s = buf;
  if (!options_.name.empty()) s += " (" + options_.name + ")";
  return s;
}

// Where this rank sits in its machine (the GPU's PCI path, else the NUMA
// node it runs on) and the machine's NICs, for the schedule every rank builds.
Status placeSelf(wire::RankInfo* self, int device);

void Communicator::InitTimes::start() {
  phases_.clear();
  start_ = last_ = Clock::now();
}

void Communicator::InitTimes::mark(const char* phase) {
  const auto now = Clock::now();
  phases_.emplace_back(phase, std::chrono::duration<double, std::milli>(now - last_).count());
  last_ = now;
}

std::string Communicator::InitTimes::describe() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f ms", std::chrono::duration<double, std::milli>(last_ - start_).count());
  std::string out = buf;
  bool first = true;
  for (const auto& [phase, ms] : phases_) {
    if (ms < 0.05) continue;  // prints as 0.0
    std::snprintf(buf, sizeof buf, "%s%s %.1f", first ? ": " : ", ", phase, ms);
    out += buf;
    first = false;
  }
  return out;
}

Status Communicator::initFromId(const uint8_t id[kUniqueIdBytes], int nranks, int rank) {
  initTimes_.start();
  rank_ = rank;
  nranks_ = nranks;
  log::ScopedRank logRank(rank);
  Bootstrap::Identity ident;
  ident.rank = rank;
  ident.nranks = nranks;
  ident.commHash = hashBytes(id, kUniqueIdBytes);
  net::SocketAddress root;
  if (useCommIdEnv()) {
    LOOM_ASSIGN_OR_RETURN(root, commIdAddress());
    secretFromSettings(ident.secret);
    // All ranks derive the same hash whatever id bytes they were given.
    ident.commHash = hashBytes(ident.secret, sizeof ident.secret, hashBytes(root.toString().data(), root.toString().size()));
  } else {
    LOOM_TRY(decodeUniqueId(id, &root, ident.secret));
  }
  if (useCommIdEnv() && rank == 0) {
    net::SocketAddress bound;
    auto listener = net::listenOn(root, &bound);
    if (!listener.isOk()) {
      return listener.takeStatus().addContext("NCCL_COMM_ID=" + root.toString() +
                                              ": rank 0 cannot listen there (is the port in use?)");
    }
    RootOptions ro;
    ro.secret[0] = ident.secret[0];
    ro.secret[1] = ident.secret[1];
    ro.initTimeoutS = options_.initTimeoutS;
    // Owned: if this rank's init fails or it is destroyed early, the root
    // stops (telling the waiting ranks) and the fixed port is free again.
    LOOM_ASSIGN_OR_RETURN(root_, RootServer::start(std::move(listener.value()), ro));
  }
  LOOM_ASSIGN_OR_RETURN(bootstrap_, Bootstrap::open(ident, &root));
  initTimes_.mark("bootstrap");
  LOOM_ASSIGN_OR_RETURN(mode_, resolveMode(options_.device));
  int device = -1;
  std::optional<device::ScopedDevice> bound;  // the init's device work (queues, inboxes) lands on it
  if (mode_ == Mode::kCuda) {
    device = options_.cudaDevice;
    if (device < 0) {
      LOOM_ASSIGN_OR_RETURN(device, device::api()->currentDevice());
    }
    bound.emplace(device::api(), device);
    if (Status s = bound->status(); !s.isOk()) return s.addContext("binding CUDA device " + std::to_string(device));
  }
  LOOM_TRY(startDeviceMode(device));
  initTimes_.mark("device");
  wire::RankInfo self;
  self.pid = uint32_t(getpid());
  self.hostHash = topology::hostHash();
  self.mode = uint32_t(mode_);
  if (device >= 0) {
    self.cudaDevice = uint32_t(device);
    LOOM_ASSIGN_OR_RETURN(self.gpuUuid, device::api()->deviceUuid(device));
  }
  self.hostname = topology::hostName();
  describeOwnAsks(&self);
  LOOM_TRY(placeSelf(&self, device));
  initTimes_.mark("topology");
  Deadline deadline = Deadline::afterSeconds(options_.initTimeoutS + 15);
  Status s = bootstrap_->joinRoot(root, self, deadline, &abort_);
  if (!s.isOk()) return s.addContext("rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  initTimes_.mark("rendezvous");
  return finishInit();
}

void Communicator::describeOwnAsks(wire::RankInfo* self) const {
  self->transports = transport::localTransports(options_.link.selection);
  self->flags = (options_.calibrate ? wire::kRankFlagCalibrate : 0) |
                (options_.checkCollectives ? wire::kRankFlagCheckCollectives : 0);
  self->channels = uint32_t(options_.channels);
}

Status placeSelf(wire::RankInfo* self, int device) {
  self->numa = topology::currentNumaNode();
  self->cpuMask = topology::currentCpuMask();
  auto found = topology::localTopology();
  if (!found.isOk()) {
    // A file the user named must load; a machine that cannot be detected
    // only loses the locality of its rings.
    if (!settings::current()->getString("NCCL_TOPO_FILE").empty()) return found.takeStatus();
    LOOM_WARN("%s; rings follow rank order on this host", found.status().message().c_str());
    return Status::ok();
  }
  const auto& topo = found.value();
  if (device >= 0) {
    auto busId = device::api()->pciBusId(device);
    auto place = busId.isOk() ? topology::gpuRank(*topo, 0, busId.value()) : Result<topology::RankPlace>(busId.takeStatus());
    if (place.isOk()) {
      self->numa = place->numa;
      self->pciPath = place->pciPath;
    } else {
      LOOM_INFO(log::kGraph, "CUDA device %d is not in the topology (%s): placed by NUMA node only", device,
                place.status().message().c_str());
    }
  }
  self->nics = topology::hostPlace(*topo, "").nics;
  return Status::ok();
}

Status Communicator::startDeviceMode(int device) {
  if (mode_ != Mode::kCuda) return Status::ok();
  device::Api* api = device::api();
  if (!api) return internalError("cuda mode without a CUDA table");
  cudaDevice_ = device;
  LOOM_ASSIGN_OR_RETURN(auto queue, DeviceQueue::create(this, api));
  std::lock_guard<std::mutex> lock(deviceQueueMutex_);
  deviceQueue_ = std::move(queue);
  if (aborted()) deviceQueue_->abort();
  return Status::ok();
}

Status Communicator::finishInit() {
  Status s = connectPeersAtInit();
  if (!s.isOk() && !aborted()) {
    // A peer that closed its connection may only be passing on another's
    // failure: prefer its notice. Then tell the peers, which know this
    // rank now and may wait for it.
    if (s.code() == Code::kRemoteError) s = preferPeerReport(s);
    fail(s, true);
  }
  return s;
}

Status Communicator::connectPeersAtInit() {
  const Mode mine = Mode(bootstrap_->peer(rank_).mode);
  for (int r = 0; r < nranks_; ++r) {
    if (Mode(bootstrap_->peer(r).mode) != mine) {
      return invalidUsage(describePeer(r) + " runs in " + modeName(Mode(bootstrap_->peer(r).mode)) +
                          " mode but this rank runs in " + modeName(mine) +
                          " mode; set the same LOOM_DEVICE on every rank");
    }
  }
  // Every rank must address the same channels: the fewest any rank asks
  // for (settings and configs may differ from rank to rank).
  int channels = options_.channels;
  for (int r = 0; r < nranks_; ++r) channels = std::min(channels, int(bootstrap_->peer(r).channels));
  if (channels != options_.channels) {
    LOOM_INFO(log::kInit, "%s: %d channel(s) instead of the %d asked for here, the fewest any rank asks for",
              describe().c_str(), channels, options_.channels);
    options_.channels = std::max(channels, 1);
  }
  conns_.resize(size_t(nranks_) * size_t(options_.channels));
  connPtrs_.assign(conns_.size(), nullptr);
  scheduleFromTable();
  initTimes_.mark("schedule");
  // Every rank of a single-host host-mode communicator takes part in the
  // board's setup (all know from the shared table that it applies), each
  // saying whether its own settings want it.
  if (mode_ == Mode::kHost && nranks_ > 1 && nranks_ <= transport::shm::kBoardMaxMembers && singleHost_) {
    const bool wanted = options_.latencyPath && tuning_.links == LinkClass::kSharedMemory;
    LOOM_ASSIGN_OR_RETURN(latency_, LatencyPath::setup(*bootstrap_, rank_, nranks_, wanted, cpusShared_, tuning_,
                                                       Deadline::afterSeconds(options_.initTimeoutS), &abort_));
    initTimes_.mark("board");
  }
  // Ring neighbours are connected now, so a rank that dies before the first
  // operation is noticed by its connections closing.
  const auto& order = rings_[0];
  const int at = int(std::find(order.begin(), order.end(), rank_) - order.begin());
  std::vector<int> links{order[size_t((at + 1) % nranks_)], order[size_t((at + nranks_ - 1) % nranks_)]};
  if (mode_ == Mode::kCuda) {
    // Cuda mode connects every rank of its host on every channel now, and
    // reserves the staging memory its plans need: a CUDA IPC connection
    // allocates device memory and maps its peer's, which may wait for the
    // whole device. Later, on the progress thread, a user's stream may be
    // waiting behind one of loom's gates (core/device_queue.h).
    for (int c = 0; c < options_.channels; ++c)
      for (int p = 0; p < nranks_; ++p)
        if (p != rank_ && hostOf_[size_t(p)] == hostOf_[size_t(rank_)]) links.push_back(int(linkIndex(p, c, nranks_)));
    std::sort(links.begin(), links.end());
    links.erase(std::unique(links.begin(), links.end()), links.end());
  }
  LOOM_TRY(connectAll(links, Deadline::afterSeconds(options_.initTimeoutS)));
  initTimes_.mark("connections");
  if (DeviceQueue* q = deviceQueue()) {
    for (int l : links)
      if (hostOf_[size_t(l % nranks_)] == hostOf_[size_t(rank_)] && connPtrs_[size_t(l)])
        hostConns_.push_back(connPtrs_[size_t(l)]);
    LOOM_TRY(q->reserveForEverySize());
    initTimes_.mark("device memory");
  }
  // Still initializing: users wait for ready, and a non-blocking init says
  // "in progress" until the calibration is over.
  LOOM_TRY(calibrate());
  initTimes_.mark("calibration");
  setState(State::kReady);
  auto net = options_.link.selection.network();
  const TrafficCounts t = bootstrap_->traffic();
  LOOM_INFO(log::kInit,
            "%s ready (%d ranks, network %s, %d channel(s), %d sockets per connection, %zu KiB slices); "
            "bootstrap sent %llu messages (%llu bytes), received %llu (%llu bytes)",
            describe().c_str(), nranks_, net.isOk() ? net->c_str() : "?", options_.channels,
            options_.link.socketsPerPeer, sliceBytes_ >> 10, (unsigned long long)t.sentMessages,
            (unsigned long long)t.sentBytes, (unsigned long long)t.receivedMessages,
            (unsigned long long)t.receivedBytes);
  LOOM_INFO(log::kInit, "%s init timings: %s", describe().c_str(), initTimes_.describe().c_str());
  if (mode_ == Mode::kCuda) {
    // NCCL refuses ranks that share a GPU; loom runs them (nothing on the
    // device waits for a peer), and says so.
    const wire::RankInfo& me = bootstrap_->peer(rank_);
    int sharing = 0;
    for (int r = 0; r < nranks_; ++r) {
      const wire::RankInfo& p = bootstrap_->peer(r);
      if (p.hostHash == me.hostHash && p.gpuUuid == me.gpuUuid) ++sharing;
    }
    LOOM_INFO(log::kInit, "%s on CUDA device %d (GPU %s), shared by %d rank(s) of this communicator",
              describe().c_str(), cudaDevice_, me.gpuUuid.c_str(), sharing);
  }
  return Status::ok();
}

void Communicator::scheduleFromTable() {
  flight_->setIdentity(FlightRecorder::Identity{bootstrap_->identity().commHash, rank_, nranks_,
                                                bootstrap_->peer(rank_).hostname});
  topology::Layout layout;
  std::map<uint64_t, int> hostIndex;
  for (int r = 0; r < nranks_; ++r) {
    const wire::RankInfo& p = bootstrap_->peer(r);
    auto [it, added] = hostIndex.emplace(p.hostHash, int(layout.hosts.size()));
    if (added) layout.hosts.push_back(topology::HostPlace{p.hostname, p.nics});
    layout.ranks.push_back(topology::RankPlace{it->second, p.numa, p.pciPath});
  }
  schedule_ = topology::buildSchedule(layout);
  const Status checked = topology::checkSchedule(layout, schedule_);
  if (!checked.isOk()) {
    // Not expected (the schedules are checked for many layouts in tests);
    // rank order is always a valid ring, and heaps over it valid trees.
    LOOM_WARN("%s: the topology's schedule is invalid (%s); using rank order", describe().c_str(),
              checked.message().c_str());
    schedule_.rings.assign(1, topology::Ring{});
    schedule_.rings[0].order.resize(size_t(nranks_));
    for (int r = 0; r < nranks_; ++r) schedule_.rings[0].order[size_t(r)] = r;
  }
  rings_ = topology::ringOrders(schedule_);
  trees_.clear();
  if (checked.isOk() && layout.hosts.size() > 1) trees_ = topology::treeParents(schedule_);
  tuning_.nranks = nranks_;
  singleHost_ = layout.hosts.size() == 1;
  hostOf_.clear();
  std::vector<int> perHost(layout.hosts.size(), 0);
  for (const auto& place : layout.ranks) {
    hostOf_.push_back(place.host);
    ++perHost[size_t(place.host)];
  }
  tuning_.hosts = int(layout.hosts.size());
  const bool even = std::all_of(perHost.begin(), perHost.end(), [&](int k) { return k == perHost[0]; });
  tuning_.ranksPerHost = even ? perHost[0] : 0;
  // One rank with shared memory off puts its pairs on TCP: every rank
  // must then plan for the network alike (slices, algorithms).
  bool shmOff = false;
  for (int r = 0; r < nranks_; ++r) shmOff = shmOff || !(bootstrap_->peer(r).transports & transport::kTransportShm);
  tuning_.links = layout.hosts.size() > 1 || shmOff ? LinkClass::kNetwork : LinkClass::kSharedMemory;
  tuning_.shmInsideHosts = !shmOff;
  tuning_.device = mode_ == Mode::kCuda;
  tuning_.filter = options_.algorithms;
  tuning_.deterministic = options_.deterministic;
  std::vector<int> checkers;
  for (int r = 0; r < nranks_; ++r)
    if (bootstrap_->peer(r).flags & wire::kRankFlagCheckCollectives) checkers.push_back(r);
  checksCollectives_ = !checkers.empty() && nranks_ > 1;
  if (checksCollectives_) {
    LOOM_INFO(log::kInit, "%s: ranks compare their collective calls before running them (LOOM_CHECK_COLLECTIVES "
              "set on %s)", describe().c_str(),
              int(checkers.size()) == nranks_ ? "every rank" : ("ranks " + rankList(checkers)).c_str());
  }
  // Whether this rank's CPUs also run other ranks of its host, from every
  // local rank's CPU mask: ranks bound a core each do not share (2 ranks
  // on 2 cores took each its own core's spin budget only from here on:
  // before, one core each in the mask read as 2 ranks on 1 CPU).
  std::vector<std::vector<uint64_t>> masks;
  size_t mine = 0;
  for (int r = 0; r < nranks_; ++r) {
    if (bootstrap_->peer(r).hostHash != bootstrap_->peer(rank_).hostHash) continue;
    if (r == rank_) mine = masks.size();
    masks.push_back(bootstrap_->peer(r).cpuMask);
  }
  const int local = int(masks.size());
  cpu_set_t cpus;
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  cpusShared_ = topology::cpusShared(masks, mine);
  const bool network = tuning_.links == LinkClass::kNetwork;
  spinRounds_ = cpusShared_ || network ? kSharedSpinRounds : kDedicatedSpinRounds;
  sliceBytes_ = network ? options_.networkSliceBytes : options_.sliceBytes;
  tuning_.sliceBytes = sliceBytes_;
  const wire::RankInfo& me = bootstrap_->peer(rank_);
  int firstLocal = rank_;
  for (int r = 0; r < nranks_; ++r) {
    if (bootstrap_->peer(r).hostHash == me.hostHash) {
      firstLocal = r;
      break;
    }
  }
  if (cpusShared_ && firstLocal == rank_) {
    // Left to the kernel, ranks that outnumber their CPUs start crowded
    // where their launcher runs and are spread only after a few tenths of
    // a second (8 ranks on 2 CPUs, 6 on one: an 8-byte AllReduce took 12 us
    // against 5.5 us with 4 on each).
    const bool everywhere = cores >= get_nprocs();
    LOOM_INFO(log::kInit, "%s: %d ranks on this host, %d CPU(s) this rank may run on: waits yield instead of spinning%s",
              describe().c_str(), local, cores,
              everywhere ? "; bind the ranks evenly (loomrun --bind-to core, mpirun --bind-to core:overload-allowed) "
                           "so that they do not start crowded on a few CPUs"
                         : "");
  }
  if (rank_ == 0) {
    for (const auto& line : topology::ringLines(schedule_)) LOOM_INFO(log::kGraph, "%s", line.c_str());
  }
  LOOM_INFO(log::kGraph, "%s", topology::treeLine(schedule_, rank_).c_str());
  const std::string dump = settings::current()->getString("NCCL_TOPO_DUMP_FILE");
  if (!dump.empty() && firstLocal == rank_) {
    auto topo = topology::localTopology();
    Status s = topo.isOk() ? topology::dumpFile(**topo, dump) : topo.takeStatus();
    if (s.isOk()) LOOM_INFO(log::kGraph, "topology written to %s", dump.c_str());
    else LOOM_WARN("NCCL_TOPO_DUMP_FILE: %s", s.message().c_str());
  }
}

Status Communicator::calibrate() {
  int asked = 0;
  for (int r = 0; r < nranks_; ++r) asked += (bootstrap_->peer(r).flags & wire::kRankFlagCalibrate) != 0;
  if (asked == 0 || nranks_ == 1) return Status::ok();
  // Every rank decides from the same table, so all of them measure or none.
  if (asked < nranks_ || mode_ != Mode::kHost) {
    LOOM_INFO(log::kTuning, "%s: LOOM_CALIBRATE ignored: %s", describe().c_str(),
              asked < nranks_ ? "not every rank sets it" : "it measures host-mode communicators only");
    return Status::ok();
  }
  // Ring shifts on ring 0: each rank sends to its successor and receives
  // from its predecessor at once, a small message (a hop, with the start of
  // a call) and a large one (a hop plus bytes); medians of kRounds after a
  // warm-up (ranks sharing CPUs make single rounds noisy). Sizes are fixed,
  // not taken from the local slice size, so every rank posts the same.
  const auto& order = rings_[0];
  const size_t at = size_t(std::find(order.begin(), order.end(), rank_) - order.begin());
  const int next = order[(at + 1) % order.size()];
  const int prev = order[(at + order.size() - 1) % order.size()];
  constexpr size_t kSmall = 64;
  constexpr size_t kLarge = size_t(1) << 20;
  constexpr int kRounds = 11;
  std::vector<std::byte> out(kLarge, std::byte{1}), in(kLarge);
  auto shift = [&](size_t bytes, double* us) -> Status {
    OpDesc ops[2];
    ops[0].kind = OpKind::kSend;
    ops[0].sendbuf = out.data();
    ops[0].root = next;
    ops[1].kind = OpKind::kRecv;
    ops[1].recvbuf = in.data();
    ops[1].root = prev;
    for (OpDesc& op : ops) {
      op.count = bytes;
      op.type = kernels::DataType::kUint8;
      op.reduction.type = op.type;
    }
    const Clock::time_point start = Clock::now();
    Status s = runInitOps(this, ops);
    *us = secondsSince(start) * 1e6;
    return s.isOk() ? s : s.addContext("LOOM_CALIBRATE: a timed ring shift of " + std::to_string(bytes) + " bytes");
  };
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  // One size after the other: a rank that times a small shift while its
  // predecessor still sends a large one would measure the wait.
  std::vector<double> small(kRounds), large(kRounds);
  double ignored = 0;
  for (int i = 0; i < 2; ++i) LOOM_TRY(shift(kSmall, &ignored));
  for (int i = 0; i < kRounds; ++i) LOOM_TRY(shift(kSmall, &small[size_t(i)]));
  LOOM_TRY(shift(kLarge, &ignored));
  for (int i = 0; i < kRounds; ++i) LOOM_TRY(shift(kLarge, &large[size_t(i)]));
  // Every rank's figures and slice size over the bootstrap: each takes the
  // slowest times, so all hold the same costs and pick the same algorithms.
  struct Figures {
    double smallUs, largeUs;
    uint64_t sliceBytes;
  };
  std::vector<Figures> all(static_cast<size_t>(nranks_));
  all[size_t(rank_)] = Figures{median(small), median(large), sliceBytes_};
  Status s = bootstrap_->allGather(all.data(), sizeof(Figures), Deadline::afterSeconds(options_.initTimeoutS), &abort_);
  if (!s.isOk()) return s.addContext("LOOM_CALIBRATE: sharing the measurements");
  Figures worst = all[0];
  for (const Figures& f : all) {
    if (f.sliceBytes != worst.sliceBytes) {
      LOOM_INFO(log::kTuning, "%s: LOOM_CALIBRATE ignored: the ranks use different slice sizes (%llu and %llu bytes)",
                describe().c_str(), (unsigned long long)worst.sliceBytes, (unsigned long long)f.sliceBytes);
      return Status::ok();
    }
    worst.smallUs = std::max(worst.smallUs, f.smallUs);
    worst.largeUs = std::max(worst.largeUs, f.largeUs);
  }
  // t(small) = hop + message + small * beta; t(large) = hop + slices *
  // message + large * beta. A beta of zero or less is noise: the table's
  // stays. Kept within 20x of the table's, where a figure further off is
  // more likely a hiccup of the measurement than the machine.
  const LinkCost& table = tableCost(tuning_.links);
  LinkCost& cost = tuning_.costs[size_t(tuning_.links)];
  const double slices = double((kLarge + worst.sliceBytes - 1) / worst.sliceBytes);
  const double beta = (worst.largeUs - worst.smallUs - (slices - 1) * table.messageUs) / double(kLarge - kSmall);
  if (beta > 0) cost.usPerByte = std::clamp(beta, table.usPerByte / 20, table.usPerByte * 20);
  const double hop = worst.smallUs - table.messageUs - double(kSmall) * cost.usPerByte;
  cost.hopUs = std::clamp(hop, table.hopUs / 20, table.hopUs * 20);
  LOOM_INFO(log::kTuning,
            "%s: calibrated %s links (ring shifts of %zu and %zu bytes, slowest rank: %.2f and %.2f us): "
            "hop %.2f us (table %.2f), %.3f GB/s per rank (table %.3f)",
            describe().c_str(), linkClassName(tuning_.links), kSmall, kLarge, worst.smallUs, worst.largeUs,
            cost.hopUs, table.hopUs, 1e-3 / cost.usPerByte, 1e-3 / table.usPerByte);
  return Status::ok();
}

void Communicator::setState(State s) {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    state_.store(s);
  }
  stateCv_.notify_all();
}

Status runInitJob(const std::function<Status()>& job) {
  try {
    return job();
  } catch (const std::bad_alloc&) {
    return systemError("out of host memory during init");
  } catch (const std::exception& e) {
    return internalError(std::string("unexpected exception during init: ") + e.what());
  }
}

void Communicator::startAsync(std::function<Status()> job) {
  auto body = [this, job = std::move(job)] {
    Status s = runInitJob(job);
    if (!s.isOk()) {
      fail(s, false);
      setState(State::kFailed);
    }
  };
  try {
    initThread_ = std::thread(std::move(body));
    pthread_setname_np(initThread_.native_handle(), "loom-init");
  } catch (const std::system_error& e) {
    fail(systemError(std::string("cannot start the init thread: ") + e.what()), false);
    setState(State::kFailed);
  }
}

Status Communicator::waitReady() {
  if (state_.load() != State::kInitializing) return asyncError();
  std::unique_lock<std::mutex> lock(stateMutex_);
  stateCv_.wait(lock, [this] { return state_.load() != State::kInitializing; });
  lock.unlock();
  return asyncError();
}

Status Communicator::stickyError() const {
  if (!failed_.load()) return Status::ok();
  std::lock_guard<std::mutex> lock(errorMutex_);
  return error_;
}

Status Communicator::asyncError() const {
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(errorMutex_);
    if (!error_.isOk()) return error_;
  }
  if (state_.load() == State::kInitializing) return Status(Code::kInProgress, "init in progress");
  return Status::ok();
}

void Communicator::fail(const Status& status, bool tellPeers) {
  {
    std::lock_guard<std::mutex> lock(errorMutex_);
    if (!error_.isOk()) return;
    error_ = status;
    failed_.store(true);
  }
  LOOM_WARN("%s: %s", describe().c_str(), status.message().c_str());
  if (tellPeers && bootstrap_ && nranks_ > 1 && !forkedAway()) {
    bootstrap_->notifyAll(status.message().substr(0, wire::kMaxNoticeBytes));
  }
  dumpFlightRecorder(status.message());
}

void Communicator::dumpFlightRecorderAtDestroy(const char* call) {
  if (hasFailed() || !settings::current()->getBool("LOOM_FLIGHT_RECORDER_AT_DESTROY")) return;
  dumpFlightRecorder(std::string(call) + " ended the communicator", false);
}

void Communicator::dumpFlightRecorder(const std::string& reason, bool failing) {
  const std::string dir = settings::current()->getString("LOOM_FLIGHT_RECORDER_DIR");
  if (dir.empty() || flight_->capacity() == 0 || !flight_->identified() || forkedAway()) return;
  auto path = flight_->dump(dir, reason);
  if (path.isOk() && failing) LOOM_WARN("%s: flight recorder written to %s", describe().c_str(), path->c_str());
  else if (path.isOk()) LOOM_INFO(log::kInit, "%s: flight recorder written to %s", describe().c_str(), path->c_str());
  else LOOM_WARN("%s: flight recorder: %s", describe().c_str(), path.status().message().c_str());
}

Status Communicator::reportWithin(int ms) {
  const Deadline grace = Deadline::afterMs(ms);
  for (;;) {
    pollNotices();
    Status known = stickyError();
    if (!known.isOk() || grace.expired()) return known;
    std::vector<pollfd> fds;
    pollFdsForNotices(&fds);
    ::poll(fds.data(), fds.size(), 10);
  }
}

Status Communicator::preferPeerReport(const Status& seen) {
  Status known = reportWithin(kPeerReportGraceMs);
  if (known.isOk() || known.message() == seen.message()) return seen;  // nothing, or seen came from it
  return Status(known.code(), known.message() + " (seen here as: " + seen.message() + ")");
}

void Communicator::pollNoticesThrottled() {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = lastNoticePollUs_.load(std::memory_order_relaxed);
  if (now - last < kNoticePollIntervalUs) return;
  // One caller per interval; the others return at once.
  if (!lastNoticePollUs_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  pollNotices();
}

void Communicator::pollNotices() {
  std::vector<Notice> notices;
  {
    std::lock_guard<std::mutex> lock(listenMutex_);
    if (!bootstrap_) return;
    bootstrap_->service();
    notices = bootstrap_->takeNotices();
  }
  for (const Notice& n : notices) {
    fail(remoteError(describePeer(n.fromRank) + " reports: " + n.text), false);
  }
}

void Communicator::abort() {
  if (forkedAway()) return;  // the eventfd is shared with the parent
  if (!abort_.exchange(true)) {
    uint64_t one = 1;
    if (wakeFd_.valid()) (void)!::write(wakeFd_.get(), &one, sizeof one);
  }
  {
    std::lock_guard<std::mutex> lock(deviceQueueMutex_);
    if (deviceQueue_) deviceQueue_->abort();
  }
  abortDependents();
}

void Communicator::abortDependents() {
  std::lock_guard<std::mutex> lock(dependentsMutex_);
  for (Communicator* child : dependents_) child->abort();
}

void Communicator::announceAbort(const std::string& why) {
  if (!ready() || !stickyError().isOk() || forkedAway() || nranks_ <= 1) return;
  std::string text = "it aborted the communicator (ncclCommAbort)";
  if (!why.empty()) text += "; the last error in that process was: " + why;
  bootstrap_->notifyAll(text.substr(0, wire::kMaxNoticeBytes));
}

void Communicator::pollFdsForNotices(std::vector<pollfd>* fds) {
  std::lock_guard<std::mutex> lock(listenMutex_);
  if (bootstrap_) bootstrap_->pollFds(fds);
}

Status Communicator::connectStep(const std::vector<int>& links, bool* ready) {
  *ready = true;
  for (int l : links) {
    if (connPtrs_[size_t(l)]) continue;
    const int p = l % nranks_, channel = l / nranks_;
    auto& link = links_[l];
    if (!link) {
      LinkOptions lo = options_.link;
      lo.connectTimeoutS = options_.initTimeoutS;
      lo.deadPeerS = options_.timeoutS;
      link = std::make_unique<PeerLink>(rank_, p, channel, lo);
    }
    bool linkReady = false;
    {
      // Short: advance() never blocks (a watchdog's pollNotices waits here).
      std::lock_guard<std::mutex> lock(listenMutex_);
      Status s = link->advance(*bootstrap_, &abort_, &linkReady);
      if (!s.isOk()) return s.addContext("connecting to " + describePeer(p));
    }
    if (!linkReady) {
      *ready = false;
      continue;
    }
    auto conn = link->take();
    links_.erase(l);
    LOOM_INFO(log::kInit, "%s: connection to %s on channel %d via %s", describe().c_str(),
              describePeer(p).c_str(), channel, conn->kind());
    connPtrs_[size_t(l)] = conn.get();
    conns_[size_t(l)] = std::move(conn);
  }
  return Status::ok();
}

void Communicator::pollFdsForLinks(std::vector<pollfd>* fds) const {
  for (const auto& [peer, link] : links_) link->pollFds(fds);
}

Status Communicator::prepareHostConnections() {
  for (transport::Connection* c : hostConns_) LOOM_TRY(c->prepare());
  return Status::ok();
}

Status Communicator::connectAll(const std::vector<int>& links, Deadline deadline) {
  constexpr double kProbePeriodS = 0.5;
  Clock::time_point lastProbe = Clock::now();
  std::vector<int> refusedBefore;
  for (;;) {
    bool ready = false;
    LOOM_TRY(connectStep(links, &ready));
    if (ready) return Status::ok();
    if (aborted()) return abortedError("setting up data connections");
    // A peer that must connect to this rank and died during setup never
    // does: its listener refusing twice, half a second apart, says so.
    if (secondsSince(lastProbe) > kProbePeriodS) {
      lastProbe = Clock::now();
      std::vector<int> refused;
      for (int l : links) {
        const int p = l % nranks_;
        if (p >= rank_ || connPtrs_[size_t(l)] || !bootstrap_->refuses(p)) continue;
        if (std::find(refusedBefore.begin(), refusedBefore.end(), p) != refusedBefore.end())
          return remoteError(describePeer(p) + " died during setup: its listener refuses connections");
        refused.push_back(p);
      }
      refusedBefore = std::move(refused);
    }
    if (deadline.expired()) {
      std::string missing;
      for (int l : links)
        if (!connPtrs_[size_t(l)]) missing.append(" ").append(describePeer(l % nranks_));
      return remoteError("timed out waiting for data connections from:" + missing);
    }
    // Sleep until the listener, a link's socket or an abort has news; the
    // cap only bounds how late the deadline is noticed.
    pollNotices();
    LOOM_TRY(stickyError());
    std::vector<pollfd> fds{{wakeFd_.get(), POLLIN, 0}};
    pollFdsForNotices(&fds);
    pollFdsForLinks(&fds);
    ::poll(fds.data(), fds.size(), 200);
  }
}

Result<int> Communicator::createPreMulSum(kernels::DataType type, const void* scalar, bool deviceResident) {
  std::lock_guard<std::mutex> lock(opsMutex_);
  UserOp op;
  op.live = true;
  op.type = type;
  op.deviceResident = deviceResident;
  if (deviceResident) {
    op.scalarPtr = scalar;
  } else {
    std::memcpy(&op.scalarBits, scalar, kernels::dataTypeSize(type));
  }
  size_t index = 0;
  while (index < userOps_.size() && userOps_[index].live) ++index;
  if (index == userOps_.size()) userOps_.push_back(op);
  else userOps_[index] = op;
  return kNumBuiltinOps + int(index);
}

Status Communicator::destroyOp(int op) {
  std::lock_guard<std::mutex> lock(opsMutex_);
  size_t index = size_t(op - kNumBuiltinOps);
  if (op < kNumBuiltinOps || index >= userOps_.size() || !userOps_[index].live) {
    return invalidArgument("op " + std::to_string(op) +
                           " is not a reduction op created by ncclRedOpCreatePreMulSum on this communicator");
  }
  userOps_[index].live = false;
  return Status::ok();
}

Status Communicator::resolveOp(int op, kernels::DataType type, kernels::Reduction* out,
                               const void** scalarPtr) const {
  using kernels::RedOp;
  *scalarPtr = nullptr;
  out->type = type;
  out->scalar = 0;
  out->divisor = 1;
  if (op >= 0 && op < kAvg) {
    static constexpr RedOp kMap[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin};
    out->op = kMap[op];
    return Status::ok();
  }
  if (op == kAvg) {
    if (kernels::isFloatingType(type)) {
      out->op = RedOp::kPreMulSum;
      out->scalar = encodeScalar(type, 1.0 / double(nranks_));
    } else {
      out->op = RedOp::kSumPostDiv;
      out->divisor = uint64_t(nranks_);
    }
    return Status::ok();
  }
  std::lock_guard<std::mutex> lock(opsMutex_);
  size_t index = size_t(op - kNumBuiltinOps);
  if (op < kNumBuiltinOps || index >= userOps_.size() || !userOps_[index].live) {
    return invalidArgument("op " + std::to_string(op) + " is not a valid ncclRedOp_t for this communicator "
                           "(built-in ops are 0..4; others come from ncclRedOpCreatePreMulSum)");
  }
  const UserOp& u = userOps_[index];
  if (u.type != type) {
    return invalidArgument(std::string("op ") + std::to_string(op) + " was created for datatype " +
                           kernels::dataTypeName(u.type) + " but is used with " + kernels::dataTypeName(type));
  }
  out->op = RedOp::kPreMulSum;
  out->scalar = u.scalarBits;
  if (u.deviceResident) *scalarPtr = u.scalarPtr;
  return Status::ok();
}

}  // namespace loom::core

namespace loom::core {

uint64_t Communicator::reserveShrink(const std::vector<int>& excluded) {
  std::lock_guard<std::mutex> lock(splitMutex_);
  return shrinksReserved_[excluded]++;
}

uint64_t Communicator::reserveSplit() {
  std::lock_guard<std::mutex> lock(splitMutex_);
  return splitsReserved_++;
}

Status Communicator::waitSplitTurn(uint64_t ticket, const std::atomic<bool>* abort) {
  const Deadline deadline = Deadline::afterSeconds(options_.initTimeoutS);
  std::unique_lock<std::mutex> lock(splitMutex_);
  while (splitsDone_ != ticket) {
    Status s;
    if (abort->load() || aborted()) s = abortedError("waiting for the splits called before it");
    else if (deadline.expired())
      s = remoteError("ncclCommSplit #" + std::to_string(ticket) + " on " + describe() + " waited " +
                      std::to_string(int(options_.initTimeoutS)) + " s for the splits called before it");
    if (!s.isOk()) {
      // Given up: the splits after this one must not wait for it.
      abandonedSplits_.insert(ticket);
      return s;
    }
    splitCv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  return Status::ok();
}

void Communicator::finishSplitTurn() {
  {
    std::lock_guard<std::mutex> lock(splitMutex_);
    ++splitsDone_;
    while (abandonedSplits_.erase(splitsDone_)) ++splitsDone_;
  }
  splitCv_.notify_all();
}

Status Communicator::waitSplits() {
  if (splitsDone_.load() >= splitsReserved_.load()) return Status::ok();
  std::unique_lock<std::mutex> lock(splitMutex_);
  const uint64_t mine = splitsReserved_;
  const Deadline deadline = Deadline::afterSeconds(options_.initTimeoutS);
  while (splitsDone_ < mine) {
    if (aborted()) return abortedError("waiting for an earlier ncclCommSplit");
    if (deadline.expired()) {
      return remoteError(describe() + ": an operation waited " + std::to_string(int(options_.initTimeoutS)) +
                         " s for an earlier ncclCommSplit of this communicator to finish");
    }
    splitCv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  return Status::ok();
}

Status Communicator::split(CommRef parentRef, uint64_t ticket, int color, int key, Communicator* child) {
  if (child) child->initTimes_.start();
  // What each rank of the parent tells the others: the fixed part, then
  // its RankInfo blob for the child (with the child's listen address).
  struct Entry {
    int32_t color;
    int32_t key;
  };
  Communicator& parent = *parentRef;
  // While the child is being set up, aborting the parent aborts it; a
  // NOCOLOR rank has no child and waits on the parent itself.
  Communicator* waiter = child ? child : &parent;
  if (child) parent.addDependent(child);
  struct Detach {
    Communicator* parent;
    Communicator* child;
    ~Detach() {
      if (child) parent->removeDependent(child);
    }
  } detach{&parent, child};

  const int n = parent.nranks(), me = parent.rank();
  const Entry mine{child ? color : -1, key};
  wire::RankInfo info = parent.bootstrap().peer(me);
  if (child) {
    net::SocketAddress reach = parent.bootstrap().listenAddress();
    LOOM_ASSIGN_OR_RETURN(child->bootstrap_, Bootstrap::open(Bootstrap::Identity{}, &reach));
    child->bootstrap_->listenAddress().encode(info.listenAddr);
    child->describeOwnAsks(&info);
  }
  std::vector<uint8_t> block(sizeof mine);
  std::memcpy(block.data(), &mine, sizeof mine);
  const std::vector<uint8_t> blob = wire::encode(info);
  block.insert(block.end(), blob.begin(), blob.end());
  const std::string what = "ncclCommSplit on " + parent.describe();
  Deadline deadline = Deadline::afterSeconds(parent.options().initTimeoutS);
  LOOM_ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> blocks,
                        parent.exchangeInTurn(TurnCall::kSplit, ticket, block, deadline, waiter->abortFlag(), what));
  std::vector<Entry> all(static_cast<size_t>(n));
  std::vector<wire::RankInfo> infos(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::span<const uint8_t> b = blocks[size_t(r)];
    Status s;
    if (b.size() < sizeof(Entry)) {
      s = remoteError(parent.bootstrap().describe(r) + " sent a short split entry");
    } else {
      std::memcpy(&all[size_t(r)], b.data(), sizeof(Entry));
      auto decoded = wire::decodeRankInfo(b.subspan(sizeof(Entry)));
      if (decoded.isOk()) infos[size_t(r)] = std::move(decoded.value());
      else s = decoded.takeStatus().addContext(parent.bootstrap().describe(r) + "'s split entry");
    }
    if (!s.isOk()) return parent.failMalformed(s.addContext(what), waiter->abortFlag());
  }
  if (!child) return Status::ok();
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (all[size_t(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[size_t(a)].key != all[size_t(b)].key ? all[size_t(a)].key < all[size_t(b)].key : a < b;
  });
  Bootstrap::Identity ident = parent.bootstrap().identity();
  ident.nranks = int(members.size());
  ident.rank = int(std::find(members.begin(), members.end(), me) - members.begin());
  uint64_t mix[3] = {ident.commHash, uint64_t(uint32_t(color)), ticket + 1};
  ident.commHash = hashBytes(mix, sizeof mix);
  std::vector<wire::RankInfo> table;
  for (int r : members) table.push_back(std::move(infos[size_t(r)]));
  // The parent stays pinned, and aborting or destroying it aborts the
  // child, until the child is set up: a member that failed the exchange
  // (it saw a rank die) may leave before the child connects, and only the
  // parent's notices say why.
  Status s = joinAsChild(parent, child, ident, std::move(table), deadline);
  if (s.code() == Code::kRemoteError && !child->aborted()) {
    Status cause = parent.reportWithin(kPeerReportGraceMs);
    if (!cause.isOk()) {
      s = Status(s.code(),
                 "the parent communicator failed: " + cause.message() + " (seen here as: " + s.message() + ")");
    }
  }
  return s;
}

Status Communicator::failMalformed(Status s, const std::atomic<bool>* abort) {
  if (!abort->load() && !aborted()) fail(s, true);
  return s;
}

Result<std::vector<std::vector<uint8_t>>> Communicator::exchangeInTurn(TurnCall call, uint64_t ticket,
                                                                        std::span<const uint8_t> payload,
                                                                        Deadline deadline,
                                                                        const std::atomic<bool>* abort,
                                                                        const std::string& what) {
  struct Header {
    uint32_t call;  // TurnCall
    uint32_t reserved;
    uint64_t ticket;
  };
  const Header head{uint32_t(call), 0, ticket};
  std::vector<uint8_t> block(sizeof head);
  std::memcpy(block.data(), &head, sizeof head);
  block.insert(block.end(), payload.begin(), payload.end());
  std::vector<std::vector<uint8_t>> blocks;
  LOOM_TRY(waitSplitTurn(ticket, abort).addContext(what));
  {
    struct Turn {
      Communicator* c;
      ~Turn() { c->finishSplitTurn(); }
    } turn{this};  // also when refused: the calls after it must not wait for it
    if (payload.size() > kTurnPayloadBytes) return internalError(what + ": an exchange entry too large");
    std::lock_guard<BiasedMutex> lock(opMutex_);
    std::lock_guard<std::mutex> ring(ringMutex_);
    // A peer that failed (or died: its neighbours fail and tell everyone)
    // ends the exchange at once instead of at the deadline.
    auto check = [this]() -> Status {
      pollNotices();
      Status s = stickyError();
      return s.isOk() ? s : Status(s.code(), "the communicator failed: " + s.message());
    };
    Status s = bootstrap_->allGatherV(block, sizeof(Header) + kTurnPayloadBytes, &blocks, deadline, abort, check);
    if (!s.isOk()) {
      // A neighbour that closed its ring connection may only be passing on
      // another rank's failure: prefer that rank's notice.
      if (s.code() == Code::kRemoteError && !abort->load() && stickyError().isOk()) s = preferPeerReport(s);
      s = s.addContext(what);
      if (!abort->load() && !aborted()) fail(s, true);  // its bootstrap ring is broken
      return s;
    }
  }
  // Every rank sees the same headers, so every rank refuses alike; the
  // ring is intact, and the communicator stays usable.
  auto callName = [](uint32_t c) {
    return c == uint32_t(TurnCall::kSplit) ? "ncclCommSplit" : c == uint32_t(TurnCall::kGrow) ? "ncclCommGrow" : "?";
  };
  for (int r = 0; r < nranks_; ++r) {
    std::vector<uint8_t>& b = blocks[size_t(r)];
    Header h{};
    if (b.size() < sizeof h) return failMalformed(remoteError(what + ": " + describePeer(r) + " sent a short entry"), abort);
    std::memcpy(&h, b.data(), sizeof h);
    if (h.call != uint32_t(call)) {
      return invalidUsage(what + ": rank " + std::to_string(r) + " called " + callName(h.call) +
                          " here; every rank must split and grow a communicator with the same calls, in the "
                          "same order");
    }
    if (h.ticket != ticket) {
      return invalidUsage(what + ": rank " + std::to_string(r) + " matched it with its split or grow #" +
                          std::to_string(h.ticket) + " but this rank's is #" + std::to_string(ticket) +
                          "; every rank must split and grow a communicator in the same order");
    }
    b.erase(b.begin(), b.begin() + sizeof h);
  }
  return blocks;
}

Status Communicator::makeGrowId(uint8_t id[kUniqueIdBytes]) {
  if (useCommIdEnv()) {
    return invalidUsage("ncclCommGetUniqueId: NCCL_COMM_ID is set, and a grown communicator would meet there "
                        "instead of at the new id; unset it to grow");
  }
  std::lock_guard<std::mutex> lock(splitMutex_);
  if (growIdPending_) {
    return invalidUsage("ncclCommGetUniqueId on " + describe() +
                        ": the id it gave before has not been used by an ncclCommGrow yet");
  }
  LOOM_TRY(getUniqueId(id));
  growIdPending_ = true;
  return Status::ok();
}

Status Communicator::grow(CommRef parentRef, uint64_t ticket, int nranks, std::vector<uint8_t> given,
                          Communicator* child) {
  child->initTimes_.start();
  Communicator& parent = *parentRef;
  const int me = parent.rank();
  uint8_t id[kUniqueIdBytes];
  // While the ranks agree, aborting the parent aborts the child's setup.
  parent.addDependent(child);
  Status agreed = parent.agreeOnGrow(ticket, nranks, given, child->abortFlag(), id);
  parent.removeDependent(child);
  if (!agreed.isOk()) return agreed;
  parentRef = CommRef();  // the grown communicator does not need the old one
  return child->initFromId(id, nranks, me).addContext("ncclCommGrow");
}

Status Communicator::agreeOnGrow(uint64_t ticket, int nranks, const std::vector<uint8_t>& given,
                                 const std::atomic<bool>* abort, uint8_t id[kUniqueIdBytes]) {
  // What each rank tells the others.
  struct Entry {
    uint32_t hasId;
    uint32_t reserved;
    int64_t nranks;
    uint8_t id[kUniqueIdBytes];
  };
  static_assert(sizeof(Entry) <= kTurnPayloadBytes);
  const int n = nranks_;
  const std::string what = "ncclCommGrow of " + describe() + " to " + std::to_string(nranks) + " ranks";
  Entry mine{};
  mine.hasId = given.empty() ? 0 : 1;
  mine.nranks = nranks;
  if (!given.empty()) std::memcpy(mine.id, given.data(), kUniqueIdBytes);
  // Whatever comes of it, this grow used up the id (another may be made).
  struct Used {
    Communicator* c;
    ~Used() {
      std::lock_guard<std::mutex> lock(c->splitMutex_);
      c->growIdPending_ = false;
    }
  } used{this};
  LOOM_ASSIGN_OR_RETURN(
      std::vector<std::vector<uint8_t>> blocks,
      exchangeInTurn(TurnCall::kGrow, ticket, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&mine), sizeof mine),
                     Deadline::afterSeconds(options_.initTimeoutS), abort, what));
  std::vector<Entry> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (blocks[size_t(r)].size() != sizeof(Entry)) {
      return failMalformed(remoteError(what + ": " + describePeer(r) + " sent a grow entry of " +
                                       std::to_string(blocks[size_t(r)].size()) + " bytes"),
                           abort);
    }
    std::memcpy(&all[size_t(r)], blocks[size_t(r)].data(), sizeof(Entry));
  }
  // Every rank sees the same entries, so every rank decides alike.
  const Entry* holder = nullptr;
  for (int r = 0; r < n; ++r) {
    const Entry& e = all[size_t(r)];
    if (e.nranks != nranks) {
      return invalidUsage(what + ": rank " + std::to_string(r) + " grows it to " + std::to_string(e.nranks) +
                          " ranks; every rank must pass the same nRanks");
    }
    if (!e.hasId) continue;
    if (holder && std::memcmp(holder->id, e.id, kUniqueIdBytes) != 0)
      return invalidUsage(what + ": ranks passed different unique ids (rank " + std::to_string(r) + "'s differs)");
    if (!holder) holder = &e;
  }
  if (!holder) {
    return invalidUsage(what + ": no rank passed a unique id; one rank gets it from ncclCommGetUniqueId and "
                        "passes it to its ncclCommGrow (the others may pass NULL)");
  }
  std::memcpy(id, holder->id, kUniqueIdBytes);
  return Status::ok();
}

Status Communicator::joinAsChild(Communicator& parent, Communicator* child, const Bootstrap::Identity& ident,
                                 std::vector<wire::RankInfo> table, Deadline deadline) {
  child->rank_ = ident.rank;
  child->nranks_ = ident.nranks;
  child->mode_ = parent.mode_;
  child->bootstrap_->setIdentity(ident);
  log::ScopedRank logRank(ident.rank);
  std::optional<device::ScopedDevice> bound;  // the parent's device, for the child's setup
  if (child->mode_ == Mode::kCuda) bound.emplace(device::api(), parent.cudaDevice_);
  Status s = bound && !bound->status().isOk() ? bound->status() : Status::ok();
  if (s.isOk()) s = child->startDeviceMode(parent.cudaDevice_);
  if (s.isOk()) s = child->bootstrap_->adoptTable(std::move(table), deadline, child->abortFlag());
  child->initTimes_.mark("members' exchange");
  if (s.isOk()) s = child->finishInit();
  return s;
}

void Communicator::revoke() {
  fail(Status(Code::kInvalidUsage, "the communicator was revoked (ncclCommRevoke): its operations end with this "
                                   "error; shrink or destroy it"),
       false);
  abort();
}

namespace {

// The leader's answer to one member: the table, or why the shrink failed
// (the status carries the code).
Status sendShrinkReply(int fd, const std::vector<uint8_t>* table, Code code, const std::string& error,
                       Deadline deadline, const std::atomic<bool>* abort) {
  const std::string text = error.substr(0, wire::kMaxReplyTextBytes);
  wire::Reply reply{wire::kReplyMagic, table ? 0u : uint32_t(code), uint32_t(table ? table->size() : text.size()), 0};
  LOOM_TRY(net::sendAll(fd, &reply, sizeof reply, deadline, abort));
  if (table) return net::sendAll(fd, table->data(), table->size(), deadline, abort);
  return net::sendAll(fd, text.data(), text.size(), deadline, abort);
}

}  // namespace

// The shrink entry `from` sent to this (the parent's) listener. The
// listener is serviced under listenMutex_, as a watchdog's pollNotices does;
// notices do not end the wait (a failed parent gets them), a dead `from` does.
Result<net::UniqueFd> Communicator::awaitShrinkEntry(int from, Deadline deadline, const std::atomic<bool>* abort) {
  DeadPeerProbe probe(*bootstrap_, from);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(listenMutex_);
      bootstrap_->service();
      if (auto fd = bootstrap_->take(wire::HelloKind::kShrink, from, 0, 0)) return std::move(*fd);
    }
    if (abort->load()) return abortedError("waiting for the shrink entry of " + describePeer(from));
    if (deadline.expired()) return remoteError("timed out waiting for the shrink entry of " + describePeer(from));
    if (probe.dead()) return remoteError(describePeer(from) + " is dead: its listener refuses connections");
    std::vector<pollfd> fds;
    pollFdsForNotices(&fds);
    ::poll(fds.data(), fds.size(), deadline.msLeft(100));
  }
}

Status Communicator::shrink(CommRef parentRef, uint64_t ticket, std::vector<int> excluded, Communicator* child) {
  child->initTimes_.start();
  Communicator& parent = *parentRef;
  const int n = parent.nranks(), me = parent.rank();
  // Until the child is set up, aborting or destroying the parent aborts it
  // (a revoked parent is aborted already: that does not count).
  parent.addDependent(child, false);
  struct Detach {
    Communicator* parent;
    Communicator* child;
    ~Detach() { parent->removeDependent(child); }
  } detach{&parent, child};
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) members.push_back(r);
  const int leader = members.front();
  const std::string what = "ncclCommShrink #" + std::to_string(ticket) + " of " + parent.describe() +
                           " without ranks " + rankList(excluded);
  uint64_t mix[2] = {ticket, uint64_t(excluded.size())};
  const uint64_t exclusion =
      hashBytes(excluded.data(), excluded.size() * sizeof(int), hashBytes(mix, sizeof mix));
  const Deadline deadline = Deadline::afterSeconds(parent.options().initTimeoutS);
  const std::atomic<bool>* abort = child->abortFlag();

  net::SocketAddress reach = parent.bootstrap().listenAddress();
  LOOM_ASSIGN_OR_RETURN(child->bootstrap_, Bootstrap::open(Bootstrap::Identity{}, &reach));
  wire::RankInfo info = parent.bootstrap().peer(me);
  child->bootstrap_->listenAddress().encode(info.listenAddr);
  child->describeOwnAsks(&info);
  const std::vector<uint8_t> blob = wire::encode(info);

  std::vector<uint8_t> table;
  if (me == leader) {
    // Collect every member's entry, in the parent's order, and answer each
    // with the table or with why the shrink failed. After a failure the
    // members still to come get a short while to hear it.
    std::vector<net::UniqueFd> fds;
    wire::appendTableEntry(blob, &table);
    Status s;
    std::optional<Deadline> grace;
    {
      // No operation of the parent runs meanwhile (a revoked parent's have
      // ended; NCCL_SHRINK_DEFAULT wants none in flight).
      std::lock_guard<BiasedMutex> lock(parent.opMutex());
      for (size_t i = 1; i < members.size(); ++i) {
        const int m = members[i];
        auto fd = parent.awaitShrinkEntry(m, grace ? *grace : deadline, abort);
        if (!fd.isOk()) {
          if (s.isOk()) {
            s = fd.takeStatus().addContext("every rank not excluded must call ncclCommShrink with the same "
                                           "excludeRanksList; a dead rank must be in it");
            grace = Deadline::afterSeconds(2);
          }
          continue;
        }
        if (s.isOk()) {
          wire::ShrinkRequest req{};
          Status got = net::recvAll(fd->get(), &req, sizeof req, deadline, abort);
          if (got.isOk() && req.exclusion != exclusion) {
            got = invalidUsage(parent.describePeer(m) + " called ncclCommShrink with a different excludeRanksList "
                               "(or after a different number of shrinks with this list); every remaining rank "
                               "must pass the same ranks");
          } else if (got.isOk() && (req.blobBytes < 8 || req.blobBytes > wire::kMaxRankInfoBytes)) {
            got = remoteError(parent.describePeer(m) + " sent a shrink entry of " + std::to_string(req.blobBytes) +
                              " bytes");
          }
          std::vector<uint8_t> theirs(got.isOk() ? req.blobBytes : 0);
          if (got.isOk()) got = net::recvAll(fd->get(), theirs.data(), theirs.size(), deadline, abort);
          if (got.isOk()) got = wire::decodeRankInfo(theirs).status();
          if (got.isOk()) {
            wire::appendTableEntry(theirs, &table);
          } else {
            s = got;
            grace = Deadline::afterSeconds(2);
          }
        }
        fds.push_back(std::move(fd.value()));
      }
    }
    for (auto& fd : fds) {
      (void)sendShrinkReply(fd.get(), s.isOk() ? &table : nullptr, s.code(), s.message(), deadline, abort);
    }
    if (!s.isOk()) return s.addContext(what);
  } else {
    // The parent's listeners are known to be open: one that keeps refusing
    // belongs to a dead leader (3 s, as when the ring is built).
    LOOM_ASSIGN_OR_RETURN(net::SocketAddress to, parent.bootstrap().peerAddress(leader));
    auto fd = net::connectTo(to, deadline, abort, 3.0);
    Status s = fd.isOk() ? parent.bootstrap().sendHello(fd->get(), leader, wire::HelloKind::kShrink, 0, 0, 0,
                                                        nullptr, 0, deadline, abort)
                         : fd.status();
    if (!s.isOk()) {
      return s.addContext(what + ": reaching the first remaining rank, " + parent.describePeer(leader));
    }
    const wire::ShrinkRequest req{exclusion, uint32_t(blob.size()), 0};
    s = net::sendAll(fd->get(), &req, sizeof req, deadline, abort);
    if (s.isOk()) s = net::sendAll(fd->get(), blob.data(), blob.size(), deadline, abort);
    wire::Reply reply{};
    if (s.isOk()) s = net::recvAll(fd->get(), &reply, sizeof reply, deadline, abort);
    if (s.isOk()) s = checkRootReply(reply, int(members.size()));
    if (!s.isOk()) return s.addContext(what + ": waiting for the table from " + parent.describePeer(leader));
    if (reply.status != 0) {
      std::string text(reply.length, '\0');
      LOOM_TRY(net::recvAll(fd->get(), text.data(), text.size(), deadline, abort).addContext(what));
      const Code code = reply.status <= uint32_t(Code::kInProgress) ? Code(reply.status) : Code::kRemoteError;
      return Status(code, what + ": " + parent.describePeer(leader) + " reports: " + text);
    }
    table.resize(reply.length);
    LOOM_TRY(net::recvAll(fd->get(), table.data(), table.size(), deadline, abort).addContext(what));
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<wire::RankInfo> infos, wire::decodeTable(table, int(members.size())));
  Bootstrap::Identity ident = parent.bootstrap().identity();
  ident.nranks = int(members.size());
  ident.rank = int(std::find(members.begin(), members.end(), me) - members.begin());
  uint64_t childMix[3] = {ident.commHash, exclusion, 0x5368726b};  // "Shrk"
  ident.commHash = hashBytes(childMix, sizeof childMix);
  LOOM_INFO(log::kInit, "%s: rank %d becomes rank %d of %d", what.c_str(), me, ident.rank, ident.nranks);
  return joinAsChild(parent, child, ident, std::move(infos), deadline).addContext(what);
}

}  // namespace loom::core
