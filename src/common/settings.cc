#include "common/settings.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <mutex>
#include <set>

namespace loom::settings {
namespace {

using T = Type;

// The table. Keep entries grouped by subsystem; the doc says what the value
// means and which values are accepted.
constexpr Spec kTable[] = {
    // Logging
    {"NCCL_DEBUG", T::kString, "", "LOG",
     "Log level: VERSION (print the version once), WARN, INFO, ABORT or TRACE. Unset: nothing is "
     "printed; a failed call's reason is still returned by ncclGetLastError."},
    {"NCCL_DEBUG_SUBSYS", T::kString, "INIT,BOOTSTRAP,ENV", "LOG",
     "Comma-separated subsystems logged at INFO: INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, "
     "ALLOC, CALL, PROXY, BOOTSTRAP, REG, ALL. A leading ^ logs all but those listed."},
    {"NCCL_DEBUG_FILE", T::kString, "", "LOG",
     "Write the log to this file instead of stderr; %h is replaced by the host name, %p by the pid."},
    {"NCCL_CONF_FILE", T::kString, "", "ENV",
     "File of NAME=VALUE lines read for settings not in the environment (default ~/.nccl.conf, "
     "then /etc/nccl.conf)."},

    // Bootstrap and sockets
    {"NCCL_COMM_ID", T::kString, "", "BOOTSTRAP",
     "host:port of the rendezvous. Rank 0 listens there; every rank connects to it. The unique id "
     "passed to init is then only used for its secret."},
    {"LOOM_COMM_SECRET", T::kString, "", "BOOTSTRAP",
     "Shared secret that every bootstrap and transport connection must prove when NCCL_COMM_ID is "
     "used (launchers such as loomrun set a fresh one). Unset: a fixed well-known value."},
    {"NCCL_SOCKET_IFNAME", T::kString, "", "NET",
     "Network interfaces to use: prefixes (eth,ib), ^ to exclude (^docker), = for exact names "
     "(=eth0). Unset: the first interface that is not loopback or docker, else loopback."},
    {"NCCL_SOCKET_FAMILY", T::kString, "", "NET",
     "AF_INET or AF_INET6 to restrict interface selection to one address family."},
    {"LOOM_SOCKETS_PER_PEER", T::kInt, "2", "NET",
     "TCP sockets per connection (one connection per peer and channel); messages of at least "
     "LOOM_SOCKET_STRIPE_MIN bytes are striped over all of them (1..16)."},
    {"NCCL_SOCKET_NTHREADS", T::kInt, "1", "NET",
     "NCCL's socket threads per connection. Loom runs no threads for sockets: unless "
     "LOOM_SOCKETS_PER_PEER is set, NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (either set; "
     "at most 16) is the number of TCP sockets per connection, as in NCCL."},
    {"NCCL_NSOCKS_PERTHREAD", T::kInt, "1", "NET",
     "NCCL's sockets per socket thread (see NCCL_SOCKET_NTHREADS)."},
    {"LOOM_SOCKET_STRIPE_MIN", T::kInt, "65536", "NET",
     "Smallest message (bytes) that is striped over several sockets."},

    {"NCCL_MIN_NCHANNELS", T::kInt, "1", "COLL",
     "Channels a communicator uses at least: independent connections per peer pair, each with its "
     "own ordering; AllReduce, Broadcast and Reduce of at least 256 KiB per channel are split "
     "across them. Capped by NCCL_MAX_NCHANNELS; 1..32."},
    {"NCCL_MAX_NCHANNELS", T::kInt, "32", "COLL",
     "Channels a communicator uses at most (see NCCL_MIN_NCHANNELS)."},
    {"NCCL_MIN_CTAS", T::kInt, "1", "COLL",
     "Set: replaces ncclConfig_t.minCTAs, which raises a communicator's channels to at least that "
     "many (NCCL's thread blocks per operation are its channels), within NCCL_MAX_NCHANNELS."},
    {"NCCL_MAX_CTAS", T::kInt, "32", "COLL",
     "Set: replaces ncclConfig_t.maxCTAs, which caps a communicator's channels."},
    {"LOOM_LATENCY_PATH", T::kBool, "1", "TUNING",
     "1: collectives small enough (up to 128 KiB per rank on up to 4 ranks, 4 MiB / (8 x ranks) "
     "from 5, 64 KiB per rank for AllGather) on communicators whose ranks all share "
     "one host run on a shared-memory board in the calling thread, one exchange with no system "
     "call, when the cost model picks the direct algorithm. 0: they run like larger ones."},
    {"LOOM_DETERMINISTIC", T::kBool, "0", "TUNING",
     "1: every reduction (AllReduce, ReduceScatter, Reduce) folds the ranks' values in rank order, "
     "element by element in one fold, so its bits do not depend on the algorithm, the slicing, the "
     "channels or where the ranks run: only direct and twoshot are used (not the ring), on host and "
     "device buffers. NCCL has no such mode."},
    {"LOOM_CALIBRATE", T::kBool, "0", "TUNING",
     "1: at init, before its first operation, a host-mode communicator times ring shifts over its "
     "own connections (a small and a large message, a few milliseconds) and the cost model uses "
     "the slowest rank's hop latency and bandwidth instead of its table's for the link class the "
     "ranks use. Every rank must set it, or none calibrates. NCCL_DEBUG=INFO (subsystem TUNING) "
     "prints the measured and the table's values."},
    {"NCCL_PROTO", T::kString, "", "TUNING",
     "Protocols, mapped onto loom's paths: LL and LL128 mean the latency path (LOOM_LATENCY_PATH), "
     "Simple the plans. A list, ^ to exclude: 'Simple' or '^LL,LL128' turn the latency path off. "
     "Simple cannot be excluded (a warning); unknown names are warnings."},
    {"NCCL_ALGO", T::kString, "", "TUNING",
     "Algorithms collectives may use: a comma-separated list (ring, direct, twoshot; NCCL's Ring too), ^ to "
     "exclude the listed ones, and per-collective sections such as "
     "'allreduce:direct;broadcast:ring'. Unset: the cost model picks per size. Names loom does not "
     "have (Tree, NVLS, ...) are ignored with a warning. loom-info --algos prints the choices."},

    {"NCCL_TOPO_FILE", T::kString, "", "GRAPH",
     "A topology file in NCCL's XML format to use instead of detecting this machine's (for every "
     "rank of this process). loom-topo prints what loom reads from it."},
    {"NCCL_TOPO_DUMP_FILE", T::kString, "", "GRAPH",
     "Where to write the detected (or loaded) topology as NCCL XML at init; the lowest rank of each "
     "host writes it."},
    {"LOOM_TOPO_DETECT", T::kString, "auto", "GRAPH",
     "How to detect the machine: auto (hwloc where libhwloc.so.15 loads, else sysfs), hwloc, or "
     "sysfs. NICs come from sysfs and GPUs from NVML either way."},
    {"NCCL_HOSTID", T::kString, "", "INIT",
     "Host identity override: ranks with the same value are treated as one host. Default: "
     "hostname plus kernel boot id."},

    // Init, timeouts and failures
    {"LOOM_INIT_TIMEOUT_S", T::kInt, "300", "INIT",
     "Seconds init waits for all ranks to join before it fails, naming the ranks missing."},
    {"LOOM_STALL_WARN_S", T::kInt, "60", "COLL",
     "Seconds an operation may make no progress before each waiting rank logs a WARN naming the "
     "communicator, the operation with its sequence number and the ranks it waits for (host, pid); "
     "repeated every period while the stall lasts. Nothing fails: the operation completes if they "
     "catch up. In cuda mode also how long a CUDA graph replay may wait behind a later call before "
     "a WARN names that case (a graph replayed on another stream than its capture stream). 0 = off."},
    {"LOOM_CHECK_COLLECTIVES", T::kBool, "0", "COLL",
     "1: before each collective of a communicator runs, its ranks compare what each called there "
     "(collective, count, type, op, root; one by one in call order, however the ranks group them); a "
     "mismatch fails that call on every rank with ncclInvalidUsage naming the ranks and their calls, "
     "instead of hanging or corrupting data: that collective and the rest of the call on that "
     "communicator do not run, and the communicator stays usable. Costs one small all-gather over "
     "the bootstrap ring per collective (blocking: a call on device buffers waits for every rank to "
     "reach it). On when any rank of the communicator sets it. Send/Recv are not compared."},
    {"LOOM_FLIGHT_RECORDER_ENTRIES", T::kInt, "2000", "COLL",
     "Operations each communicator's flight recorder keeps (kind, sequence number, count, type, op, "
     "root or peer, state, enqueue/start/end times), the newest; 0 = none. Dumped into "
     "LOOM_FLIGHT_RECORDER_DIR; `loom-info --flight DIR` merges the files."},
    {"LOOM_FLIGHT_RECORDER_DIR", T::kString, "", "COLL",
     "Folder the flight recorders are written to, one JSON file per rank and communicator, when a "
     "communicator fails (an error, the LOOM_TIMEOUT_S timeout), on LOOM_FLIGHT_RECORDER_SIGNAL, or "
     "with LOOM_FLIGHT_RECORDER_AT_DESTROY when it is destroyed. `loom-info --flight DIR` merges "
     "them, `loom-info --trace DIR OUT` turns them into a Chrome trace. Unset: nothing is written."},
    {"LOOM_FLIGHT_RECORDER_PRECISE", T::kBool, "0", "COLL",
     "1: the flight recorder's times come from the precise wall clock, read at every entry "
     "(microseconds, about 20 ns more per operation), instead of the copy that a clock thread "
     "refreshes every 4 ms, for traces of short operations (`loom-info --trace`). Read once per "
     "process."},
    {"LOOM_FLIGHT_RECORDER_AT_DESTROY", T::kBool, "0", "COLL",
     "1: every communicator also writes its flight recorder into LOOM_FLIGHT_RECORDER_DIR when "
     "ncclCommDestroy or ncclCommAbort ends it (a failure's file is kept): a timeline of a run "
     "that did not fail, its last LOOM_FLIGHT_RECORDER_ENTRIES operations per communicator."},
    {"LOOM_FLIGHT_RECORDER_SIGNAL", T::kString, "", "COLL",
     "A signal (USR1, SIGUSR2, 10) on which every communicator of the process writes its flight "
     "recorder; the handler installed before loom's still runs. Unset (default): loom installs no "
     "handler."},
    {"LOOM_TIMEOUT_S", T::kInt, "1800", "COLL",
     "Seconds an operation may make no progress before it fails with ncclRemoteError, naming the "
     "ranks it waits for. 0 = wait forever."},
    {"NCCL_COMM_BLOCKING", T::kInt, "1", "INIT",
     "Default of ncclConfig_t.blocking when the config leaves it undefined: 1 blocking, 0 "
     "non-blocking (calls may return ncclInProgress)."},

    // Device selection
    {"LOOM_DEVICE", T::kString, "auto", "INIT",
     "Buffer mode of new communicators: host (host pointers, calls complete before returning), cuda "
     "(device pointers, work ordered on the call's stream), or auto (cuda where a CUDA device answers, "
     "else host). Splits keep their parent's mode. All ranks of a communicator must agree."},

    // Buffers and pipelining
    {"NCCL_BUFFSIZE", T::kInt, "4194304", "TUNING",
     "Staging buffer bytes per peer and channel; host pipeline slices are 1/8 of it (at least "
     "64 KiB) unless LOOM_CHUNK_BYTES is set."},
    {"LOOM_CHUNK_BYTES", T::kInt, "0", "TUNING",
     "Pipeline chunk size in bytes for host collectives; 0 = NCCL_BUFFSIZE / 8, at most 128 KiB "
     "when ranks talk over the network."},
    {"NCCL_SHM_DISABLE", T::kBool, "0", "SHM",
     "1: never use shared memory between ranks of one host; they talk over TCP instead."},
    {"NCCL_NET", T::kString, "", "NET",
     "The network backend between ranks: Socket (TCP; loom's name tcp is accepted too) or IB "
     "(InfiniBand/RoCE verbs). Required, not a hint: init fails, saying why, when the named "
     "backend cannot be used. Unset: IB where an active verbs port is found, else Socket. Set, it "
     "replaces ncclConfig_t.netName, which names one communicator's network the same way."},
    {"NCCL_IB_DISABLE", T::kBool, "0", "NET",
     "1: never use InfiniBand/RoCE verbs; the network backend is Socket."},
    {"NCCL_IB_HCA", T::kString, "", "NET",
     "Verbs ports loom may use: names with optional :port, comma-separated (mlx5_0:1,mlx5_1); a "
     "leading ^ excludes the listed ones, a leading = (after any ^) matches names exactly instead of "
     "as prefixes. Empty: every active port."},
    {"NCCL_IB_GID_INDEX", T::kInt, "-1", "NET",
     "GID table index RoCE queue pairs address; -1 picks one: the first GID of "
     "NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY and NCCL_IB_ADDR_RANGE (default: RoCE v2, "
     "IPv4, any address)."},
    {"NCCL_IB_TIMEOUT", T::kInt, "20", "NET",
     "Verbs local ACK timeout exponent (4.096 us x 2^value per try), 1 .. 31. With NCCL_IB_RETRY_CNT it "
     "bounds how long a dead peer or a lost link goes unnoticed."},
    {"NCCL_IB_RETRY_CNT", T::kInt, "7", "NET", "Verbs transport retries before a send fails, 0 .. 7."},
    {"NCCL_IB_ROCE_VERSION_NUM", T::kInt, "2", "NET",
     "RoCE version (1 or 2) of the GID the auto-selection (NCCL_IB_GID_INDEX unset) looks for."},
    {"NCCL_IB_ADDR_FAMILY", T::kString, "AF_INET", "NET",
     "Address family (AF_INET or AF_INET6) of the RoCE GID the auto-selection looks for; unset, "
     "NCCL_SOCKET_FAMILY's when that is set. IPv6: a global address before a link-local one."},
    {"NCCL_IB_ADDR_RANGE", T::kString, "", "NET",
     "Address range (CIDR: 10.0.0.0/8, fd00::/8) the auto-selected RoCE GID must lie in. A GID "
     "that matches no setting: the first RoCE v2 GID with an IPv4 address, else the first RoCE v2 "
     "one, else index 0 (logged)."},
    {"NCCL_IB_SL", T::kInt, "0", "NET",
     "InfiniBand service level of the verbs queue pairs, 0 .. 15 (the fabric maps it to a virtual "
     "lane). RoCE packets carry none: NCCL_IB_TC is RoCE's class of service. Unset, an "
     "ncclConfig_t.trafficClass is the service level too where it fits (0 .. 15; NCCL takes any)."},
    {"NCCL_IB_TC", T::kInt, "0", "NET",
     "RoCE traffic class of the verbs queue pairs, 0 .. 255: the DSCP (upper six bits) and ECN bits "
     "of their packets, which select the switch queue (for example a lossless one). Set, it "
     "replaces ncclConfig_t.trafficClass, which gives one communicator's (NCCL_IB_SL likewise)."},
    {"NCCL_IB_PCI_RELAXED_ORDERING", T::kInt, "2", "NET",
     "PCIe relaxed ordering on verbs memory registrations (faster DMA on platforms that reorder, "
     "such as virtual machines and some CPUs; ignored by devices without it): 0 off, 1 on "
     "(warning where libibverbs cannot ask for it), 2 on where libibverbs can ask for it."},
    {"NCCL_IB_QPS_PER_CONNECTION", T::kInt, "1", "NET",
     "Queue pairs per verbs connection, 1 .. 16; a message's FIFO slots go round-robin over them."},
    {"LOOM_IB_GPUDIRECT", T::kBool, "0", "NET",
     "1: verbs connections move device buffers themselves (GPUDirect RDMA: ncclCommRegister'd device "
     "buffers registered with the NIC through a dma-buf and sent straight from device memory; other device "
     "buffers copied) instead of the engine staging them through pinned host memory. UNTESTED: no machine "
     "loom is tested on has a GPU and an RDMA NIC; every rank must set it alike."},
    {"LOOM_IB_FIFO_BYTES", T::kInt, "1048576", "NET",
     "Bytes of each verbs connection's receive FIFO (and of its send staging area), split into 8 "
     "slots; messages bigger than a slot span several. 8192 .. 268435456."},
    {"NCCL_P2P_DISABLE", T::kBool, "0", "P2P",
     "1: never move device buffers directly between GPUs of one host (CUDA IPC); they go "
     "through host memory."},
    {"LOOM_SHM_FIFO_BYTES", T::kInt, "2097152", "SHM",
     "Bytes of each shared-memory inbox FIFO (one per peer rank on the same host), split into 8 "
     "slots; messages bigger than a slot span several. 32768 .. 1073741824."},
    {"LOOM_SHM_FUSED_STEPS", T::kBool, "1", "SHM",
     "1: a ring step that receives and sends over shared memory (host buffers) folds or copies each "
     "piece as it arrives straight into the next rank's FIFO, and stores its result from there; "
     "steps that keep a result do so from 512 KiB messages. 0: such steps go through a staging "
     "slot or the user buffer, and the send copies it again."},
    {"LOOM_SHM_SINGLE_COPY_MIN", T::kInt, "65536", "SHM",
     "Smallest message (bytes) the shared-memory transport sends single-copy (the receiver reads "
     "the sender's buffer with process_vm_readv) where the plan allows it: a rank's own block in "
     "AllGather, which its peers store as it is while they exchange theirs, sent so unless the "
     "operation streams its output (LOOM_CPU_STREAMING_BYTES) or, for ranks with a CPU each, "
     "copies into that peer's FIFO run slowly and stream (LOOM_CPU_HANDOFF_STREAMING_BYTES; one "
     "such message in 32 is then copied, to keep timing that). The limit applies to each message "
     "(LOOM_CHUNK_BYTES slices). "
     "0 = never: everything is copied through the FIFO. "
     "Where Yama restricts ptrace (ptrace_scope 1), a process with single copy on lets any process "
     "of its user read it (prctl PR_SET_PTRACER_ANY); 0 keeps that off. Falls back to the FIFO by "
     "itself where ptrace rules forbid it."},

    // Host reduction kernels (kernels/)
    {"LOOM_CPU_ISA", T::kString, "auto", "INIT",
     "Instruction set of the host reduce/copy kernels: auto (the best the CPU has), avx512vbmi (avx512 "
     "plus faster fp8), avx512, avx2 "
     "or scalar. Asking for one the CPU lacks logs a warning and uses the best available one. "
     "Results are bit-identical at every level; only speed differs."},
    {"LOOM_CPU_STREAMING_BYTES", T::kInt, "8388608", "TUNING",
     "Host reduce/copy calls whose destination is at least this many bytes write it with "
     "non-temporal (cache-bypassing) stores, and so does a host operation that writes at least "
     "this many bytes of the user's buffers, for every result it does not send on, if its buffers "
     "outgrow the cache (LOOM_CPU_CACHE_BYTES); 0 = never. "
     "Pays off only for data larger than the caches. fp8 reductions never stream."},
    {"LOOM_CPU_CACHE_BYTES", T::kInt, "-1", "TUNING",
     "Bytes of the cache a host's cores share last; -1 = the largest cache sysfs lists for CPU 0, "
     "0 = unknown. An operation streams its results into the user's buffers "
     "(LOOM_CPU_STREAMING_BYTES) only when the buffers it and the host's other ranks of the "
     "communicator touch take more than a quarter of it; below that they stay cached."},
    {"LOOM_CPU_HANDOFF_STREAMING_BYTES", T::kInt, "8192", "TUNING",
     "Copies into shared memory that another rank reads next (the latency path's slots, the shm "
     "FIFO's pieces) of at least this many bytes use non-temporal stores while plain copies into "
     "it run slowly, so the reader fetches them from memory rather than out of the writer's cache; "
     "0 = never."},
    {"LOOM_ACCUMULATE", T::kString, "native", "COLL",
     "Sums of half, bfloat16 and fp8: native rounds to the element type after every addition "
     "(as NCCL does); fp32 adds all sources of one reduction step in float and rounds once."},
};

std::mutex gMutex;
std::shared_ptr<const Config> gCurrent;  // guarded by gMutex for writes

[[noreturn]] void misuse(std::string_view what, std::string_view name) {
  std::fprintf(stderr, "loom internal error: %.*s '%.*s'\n", int(what.size()), what.data(),
               int(name.size()), name.data());
  std::abort();
}

bool parseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 0);
  if (errno != 0 || end == text.c_str()) return false;
  while (*end == ' ' || *end == '\t') ++end;
  if (*end != '\0') return false;
  *out = v;
  return true;
}

bool parseBool(const std::string& text, int64_t* out) {
  if (text == "1" || text == "true" || text == "TRUE" || text == "yes" || text == "on") {
    *out = 1;
    return true;
  }
  if (text == "0" || text == "false" || text == "FALSE" || text == "no" || text == "off") {
    *out = 0;
    return true;
  }
  return false;
}

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, e - b + 1);
}

std::map<std::string, std::string> readConfFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return parseConf(text.str());
}

}  // namespace

std::map<std::string, std::string> parseConf(std::string_view text) {
  std::map<std::string, std::string> out;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::span<const Spec> table() { return kTable; }

const Spec* find(std::string_view name) {
  for (const Spec& s : kTable)
    if (name == s.name) return &s;
  return nullptr;
}

const char* typeName(Type type) {
  switch (type) {
    case Type::kInt: return "int";
    case Type::kBool: return "bool";
    case Type::kString: return "string";
  }
  return "?";
}

const char* sourceName(Source source) {
  switch (source) {
    case Source::kDefault: return "default";
    case Source::kConfFile: return "conf file";
    case Source::kEnvironment: return "environment";
  }
  return "?";
}

std::shared_ptr<const Config> load() {
  // Config files first, so the environment wins.
  std::map<std::string, std::string> file;
  const char* confPath = std::getenv("NCCL_CONF_FILE");
  if (confPath && *confPath) {
    file = readConfFile(confPath);
  } else {
    const char* home = std::getenv("HOME");
    if (home && *home) file = readConfFile(std::string(home) + "/.nccl.conf");
    if (file.empty()) file = readConfFile("/etc/nccl.conf");
  }
  std::vector<std::string> envNames;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("NCCL_", 0) == 0) envNames.emplace_back(entry.substr(0, entry.find('=')));
  }
  return build([](const char* name) { return std::getenv(name); }, file, envNames);
}

std::shared_ptr<const Config> build(const std::function<const char*(const char*)>& envLookup,
                                    const std::map<std::string, std::string>& file,
                                    const std::vector<std::string>& envNames) {
  auto cfg = std::make_shared<Config>();
  // NCCL_TESTS_* belong to nccl-tests (loom's perf tools read them).
  auto unread = [](const std::string& name) {
    return name.rfind("NCCL_", 0) == 0 && name.rfind("NCCL_TESTS_", 0) != 0 && !find(name);
  };
  std::set<std::string> unused;
  for (const std::string& name : envNames)
    if (unread(name)) unused.insert(name);
  for (const auto& [name, value] : file)
    if (unread(name)) unused.insert(name);
  for (const std::string& name : unused) cfg->unused_ += (cfg->unused_.empty() ? "" : ", ") + name;
  for (const Spec& spec : kTable) {
    Config::Value v;
    v.type = spec.type;
    v.text = spec.defaultValue;
    if (const char* env = envLookup(spec.name)) {
      v.text = env;
      v.source = Source::kEnvironment;
    } else if (auto it = file.find(spec.name); it != file.end()) {
      v.text = it->second;
      v.source = Source::kConfFile;
    }
    if (spec.type != Type::kString) {
      bool ok = spec.type == Type::kInt ? parseInt(v.text, &v.number) : parseBool(v.text, &v.number);
      if (!ok) {
        if (v.source != Source::kDefault) {
          cfg->warnings_ += std::string(spec.name) + "='" + v.text + "' is not a valid " +
                            typeName(spec.type) + "; using the default " + spec.defaultValue + ". ";
        }
        v.text = spec.defaultValue;
        v.source = Source::kDefault;
        int64_t d = 0;
        (spec.type == Type::kInt ? parseInt : parseBool)(v.text, &d);
        v.number = d;
      }
    }
    cfg->values_.emplace(spec.name, std::move(v));
  }
  return cfg;
}

std::shared_ptr<const Config> current() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gCurrent) gCurrent = load();
  return gCurrent;
}

void reload() {
  auto fresh = load();
  std::lock_guard<std::mutex> lock(gMutex);
  gCurrent = std::move(fresh);
}

const Config::Value& Config::lookup(std::string_view name, Type type) const {
  auto it = values_.find(name);
  if (it == values_.end()) misuse("read of undeclared setting", name);
  if (it->second.type != type && type != Type::kString) misuse("read with the wrong type", name);
  return it->second;
}

int64_t Config::getInt(std::string_view name) const { return lookup(name, Type::kInt).number; }
bool Config::getBool(std::string_view name) const { return lookup(name, Type::kBool).number != 0; }
std::string Config::getString(std::string_view name) const {
  return lookup(name, Type::kString).text;
}
std::string Config::text(std::string_view name) const {
  return lookup(name, Type::kString).text;
}
bool Config::isSet(std::string_view name) const {
  return lookup(name, Type::kString).source != Source::kDefault;
}
Source Config::source(std::string_view name) const { return lookup(name, Type::kString).source; }

}  // namespace loom::settings
