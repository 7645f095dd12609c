// loom_mp_rank: one rank of a multi-process test (or a rogue client), driven
// by its command line and environment. Uses only the public API.
//
//   loom_mp_rank <scenario> rank=R nranks=N [id=<hex unique id>] [key=value ...]
//
// Without id=, the unique id comes from ncclGetUniqueId in this process:
// with NCCL_COMM_ID set that names the shared rendezvous address; for a
// 1-rank communicator it is a private one.
//
// Scenarios (each prints one "RESULT key=value ... error=<text>" line):
//   suite   a representative set of collectives, checked bit for bit
//   loop    collectives in a loop; rank `victim` kills itself (SIGKILL)
//           before step `kill_step`; the others report the failure; with
//           agree=1 the ranks stop together once limit_s is up for one
//           (an AllReduce every 16 steps)
//   skip    after `before` AllReduces (default 0), rank `skipper` prints
//           SKIPPING and sleeps `sleep` seconds instead of joining an
//           AllReduce; the others report how their AllReduce ended
//   late    rank `late` sleeps `sleep` seconds, then joins an AllReduce
//           that the others started at once; everyone checks the sum
//   init    init only (then one checked AllReduce when it succeeded)
//   digest  AllReduce, ReduceScatter and Reduce (root n-1) of
//           order-sensitive float, half and bfloat16 inputs; prints a
//           "DIGEST <case> <hash>" line per result this rank holds (the
//           cluster tests compare them across rank-to-host layouts)
//   rogue   connect to addr=host:port, send mode=garbage|silent, report
//           whether the peer closed the connection without answering
//
// Exit status: 0 when the scenario behaved as the test expects a healthy
// rank to, 1 otherwise, 2 for bad arguments.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "matrix.h"
#include "mp_util.h"

using loom::test::Case;
using loom::test::Coll;
using loom::test::Red;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::map<std::string, std::string> kv;
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
  long getInt(const std::string& k, long def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::strtol(it->second.c_str(), nullptr, 10);
  }
};

// Error text on one line (the parent parses the RESULT line).
std::string oneLine(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

void result(int code, double seconds, long step, const std::string& error) {
  std::printf("RESULT code=%d seconds=%.3f step=%ld error=%s\n", code, seconds, step, oneLine(error).c_str());
  std::fflush(stdout);
}

ncclResult_t initComm(const Args& a, ncclComm_t* comm) {
  const int rank = int(a.getInt("rank", 0)), nranks = int(a.getInt("nranks", 1));
  ncclUniqueId id;
  if (!a.get("id").empty()) {
    if (!loom::test::idFromHex(a.get("id"), &id)) {
      std::fprintf(stderr, "bad id= argument\n");
      std::exit(2);
    }
  } else {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) return rc;
  }
  if (!a.getInt("nonblocking", 0)) return ncclCommInitRank(comm, nranks, id, rank);
  // Non-blocking: poll until the init is over, as NCCL programs do.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclCommInitRankConfig(comm, nranks, id, rank, &config);
  ncclResult_t state = rc;
  while (state == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (ncclCommGetAsyncError(*comm, &state) != ncclSuccess) return ncclInternalError;
  }
  return rc == ncclInProgress || rc == ncclSuccess ? state : rc;
}

int runSuite(ncclComm_t comm, int rank, int n) {
  struct Item {
    Coll coll;
    ncclDataType_t type;
    Red red;
    bool inPlace;
    size_t count;
    int root;
  };
  const std::vector<Item> items = {
      {Coll::kAllReduce, ncclFloat32, Red::kSum, false, 1031, 0},
      {Coll::kAllReduce, ncclFloat32, Red::kSum, true, 1 << 20, 0},
      {Coll::kAllGather, ncclInt32, Red::kNone, false, 4099, 0},
      {Coll::kAllGather, ncclUint8, Red::kNone, true, 10007, 0},
      {Coll::kBroadcast, ncclFloat16, Red::kNone, false, 100003, n - 1},
      {Coll::kReduceScatter, ncclFloat32, Red::kSum, false, 5003, 0},
      {Coll::kAlltoAll, ncclInt64, Red::kNone, false, 1001, 0},
      {Coll::kSendRecvRing, ncclUint8, Red::kNone, false, 65537, 0},
      {Coll::kSendRecvAllPairs, ncclBfloat16, Red::kNone, false, 777, 0},
      {Coll::kAllReduce, ncclBfloat16, Red::kAvg, false, 4097, 0},
      {Coll::kReduce, ncclFloat64, Red::kMax, false, 3001, n / 2},
      {Coll::kGather, ncclFloat8e4m3, Red::kNone, false, 999, n - 1},
      {Coll::kScatter, ncclInt8, Red::kNone, true, 1234, n / 2},
  };
  int failures = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Case c;
    c.coll = items[i].coll;
    c.type = items[i].type;
    c.red = items[i].red;
    c.inPlace = items[i].inPlace;
    c.count = items[i].count;
    c.root = items[i].root;
    c.nranks = n;
    c.seed = loom::test::hash3(0x5017e, uint64_t(n), i);
    for (const std::string& p : loom::test::runCaseAsRank(comm, rank, c)) {
      std::printf("FAIL %s: %s\n", c.describe().c_str(), p.c_str());
      ++failures;
    }
  }
  result(failures ? 1 : 0, 0, long(items.size()), failures ? "some cases failed (see FAIL lines)" : "");
  return failures ? 1 : 0;
}

// One step of the failure loop: a different collective each step.
ncclResult_t loopStep(ncclComm_t comm, int rank, int n, long step, std::vector<float>& a, std::vector<float>& b,
                      size_t count) {
  switch (step % 5) {
    case 0: return ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
    case 1: return ncclAllGather(a.data(), b.data(), count, ncclFloat32, comm, nullptr);
    case 2: return ncclBroadcast(a.data(), b.data(), count, ncclFloat32, int(step % n), comm, nullptr);
    case 3: return ncclReduceScatter(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr);
    default: {
      ncclGroupStart();
      ncclSend(a.data(), count, ncclFloat32, (rank + 1) % n, comm, nullptr);
      ncclRecv(b.data(), count, ncclFloat32, (rank + n - 1) % n, comm, nullptr);
      return ncclGroupEnd();
    }
  }
}

int runLoop(const Args& a, ncclComm_t comm, int rank, int n) {
  const long steps = a.getInt("steps", 1000000), victim = a.getInt("victim", -1);
  const long killStep = a.getInt("kill_step", -1), limitS = a.getInt("limit_s", 90);
  const bool agree = a.getInt("agree", 0) != 0;
  const size_t count = size_t(a.getInt("count", 4096));
  std::vector<float> x(count * size_t(n), 1.0f), y(count * size_t(n), 0.0f);
  const auto start = Clock::now();
  for (long step = 0; step < steps; ++step) {
    if (rank == victim && step == killStep) {
      std::printf("KILLING myself at step %ld\n", step);
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    const auto t0 = Clock::now();
    ncclResult_t rc = loopStep(comm, rank, n, step, x, y, count);
    if (rc != ncclSuccess) {
      const double took = loom::test::secondsSince(t0);
      result(int(rc), took, step, ncclGetLastError(comm));
      const auto t1 = Clock::now();
      ncclCommAbort(comm);
      std::printf("ABORTED seconds=%.3f\n", loom::test::secondsSince(t1));
      return rc == ncclRemoteError ? 0 : 1;
    }
    if (agree && step % 16 == 15) {
      // Every rank stops at the same step: once the first one's time is up.
      int32_t late = loom::test::secondsSince(start) > double(limitS), anyLate = 0;
      rc = ncclAllReduce(&late, &anyLate, 1, ncclInt32, ncclMax, comm, nullptr);
      if (rc != ncclSuccess) {
        result(int(rc), loom::test::secondsSince(t0), step, ncclGetLastError(comm));
        ncclCommAbort(comm);
        return 1;
      }
      if (anyLate) break;
    } else if (!agree && loom::test::secondsSince(start) > double(limitS)) {
      break;
    }
  }
  result(0, loom::test::secondsSince(start), steps, "the loop ended without an error");
  ncclCommDestroy(comm);
  return victim >= 0 ? 1 : 0;
}

int runSkip(const Args& a, ncclComm_t comm, int rank) {
  const long skipper = a.getInt("skipper", 1), sleepS = a.getInt("sleep", 6);
  // `before` AllReduces that everybody joins first.
  for (long i = 0; i < a.getInt("before", 0); ++i) {
    std::vector<float> x(256, 1.0f), y(256);
    if (ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess) {
      result(1, 0, int(i), ncclGetLastError(comm));
      return 1;
    }
  }
  if (rank == skipper) {
    std::printf("SKIPPING\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(sleepS));
    result(0, double(sleepS), 0, "skipped the AllReduce");
    ncclCommAbort(comm);
    return 0;
  }
  std::vector<float> x(1024, 1.0f), y(1024);
  const auto t0 = Clock::now();
  ncclResult_t rc = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comm, nullptr);
  result(int(rc), loom::test::secondsSince(t0), 0, rc == ncclSuccess ? "" : ncclGetLastError(comm));
  ncclCommAbort(comm);
  return rc == ncclRemoteError ? 0 : 1;
}

int runLate(const Args& a, ncclComm_t comm, int rank, int nranks) {
  if (rank == a.getInt("late", 1)) std::this_thread::sleep_for(std::chrono::seconds(a.getInt("sleep", 3)));
  std::vector<float> x(1024, float(rank)), y(1024, -1.0f);
  const auto t0 = Clock::now();
  ncclResult_t rc = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comm, nullptr);
  const float want = float(nranks * (nranks - 1) / 2);
  const bool right = rc == ncclSuccess && y[0] == want && y[1023] == want;
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  result(rc == ncclSuccess && !right ? 99 : int(rc), loom::test::secondsSince(t0), 0,
         rc != ncclSuccess ? ncclGetLastError(comm) : right ? (async == ncclSuccess ? "" : "async error set") : "wrong sum");
  ncclCommDestroy(comm);
  return right && async == ncclSuccess ? 0 : 1;
}

int runRogue(const Args& a) {
  const std::string addr = a.get("addr"), mode = a.get("mode", "garbage");
  const double holdS = double(a.getInt("hold", 60));
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return 2;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(std::atoi(addr.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1) return 2;
  int fd = -1;
  const auto start = Clock::now();
  while (loom::test::secondsSince(start) < 20) {  // the listener may not be up yet
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) break;
    ::close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (fd < 0) {
    result(1, 0, 0, "could not connect to " + addr);
    return 1;
  }
  std::printf("CONNECTED\n");
  std::fflush(stdout);
  if (mode == "garbage") {
    char junk[256];
    for (size_t i = 0; i < sizeof junk; ++i) junk[i] = char(loom::test::mix64(i) & 0xff);
    (void)!::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
  }
  // Wait for the other side to close; count what it sends meanwhile.
  size_t got = 0;
  bool closed = false;
  const auto t0 = Clock::now();
  while (!closed && loom::test::secondsSince(t0) < holdS) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r > 0) got += size_t(r);
    else closed = true;  // EOF or reset: refused
  }
  std::printf("RESULT code=0 refused=%d bytes=%zu seconds=%.3f error=\n", closed ? 1 : 0, got,
              loom::test::secondsSince(t0));
  std::fflush(stdout);
  ::close(fd);
  return 0;
}

// FNV-1a of a result's bytes.
uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

int runDigest(ncclComm_t comm, int rank, int n) {
  int failures = 0;
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    const size_t es = t == ncclFloat32 ? 4 : 2;
    for (size_t count : {size_t(3), size_t(1000), size_t(70001), size_t(600000)}) {
      for (const char* coll : {"allreduce", "reducescatter", "reduce"}) {
        const bool rs = !std::strcmp(coll, "reducescatter");
        const size_t outElems = rs ? count / size_t(n) + 1 : count;
        const size_t inElems = rs ? outElems * size_t(n) : count;
        std::vector<uint8_t> in = loom::test::orderSensitiveInput(t, inElems, rank), out(outElems * es, 0xEE);
        ncclResult_t rc;
        if (rs) rc = ncclReduceScatter(in.data(), out.data(), outElems, t, ncclSum, comm, nullptr);
        else if (!std::strcmp(coll, "reduce")) rc = ncclReduce(in.data(), out.data(), count, t, ncclSum, n - 1, comm, nullptr);
        else rc = ncclAllReduce(in.data(), out.data(), count, t, ncclSum, comm, nullptr);
        if (rc != ncclSuccess) {
          std::printf("FAIL %s: %s\n", coll, ncclGetLastError(comm));
          ++failures;
          continue;
        }
        if (!std::strcmp(coll, "reduce") && rank != n - 1) continue;  // only the root has a result
        std::printf("DIGEST %s/%d/%zu %016llx\n", coll, int(t), count, (unsigned long long)fnv1a(out));
      }
    }
  }
  std::fflush(stdout);
  result(failures ? 1 : 0, 0, 0, failures ? "some collectives failed (see FAIL lines)" : "");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s suite|loop|skip|late|init|digest|rogue key=value...\n", argv[0]);
    return 2;
  }
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    size_t eq = s.find('=');
    if (eq == std::string::npos) return 2;
    a.kv[s.substr(0, eq)] = s.substr(eq + 1);
  }
  const std::string scenario = argv[1];
  if (scenario == "rogue") return runRogue(a);
  const int rank = int(a.getInt("rank", 0)), n = int(a.getInt("nranks", 1));
  ncclComm_t comm = nullptr;
  const auto t0 = Clock::now();
  ncclResult_t rc = initComm(a, &comm);
  const double initS = loom::test::secondsSince(t0);
  if (rc != ncclSuccess) {
    result(int(rc), initS, -1, ncclGetLastError(nullptr));
    return scenario == "init" ? 0 : 1;  // init failures are what some init tests expect
  }
  std::printf("INIT ok seconds=%.3f\n", initS);
  std::fflush(stdout);
  if (scenario == "suite") {
    int status = runSuite(comm, rank, n);
    if (ncclCommFinalize(comm) != ncclSuccess || ncclCommDestroy(comm) != ncclSuccess) status = 1;
    return status;
  }
  if (scenario == "loop") return runLoop(a, comm, rank, n);
  if (scenario == "digest") {
    int status = runDigest(comm, rank, n);
    if (ncclCommDestroy(comm) != ncclSuccess) status = 1;
    return status;
  }
  if (scenario == "skip") return runSkip(a, comm, rank);
  if (scenario == "late") return runLate(a, comm, rank, n);
  if (scenario == "init") {
    Case c;
    c.coll = Coll::kAllReduce;
    c.type = ncclFloat32;
    c.red = Red::kSum;
    c.count = 1024;
    c.nranks = n;
    auto problems = loom::test::runCaseAsRank(comm, rank, c);
    result(0, initS, 0, problems.empty() ? "" : problems[0]);
    ncclCommFinalize(comm);
    ncclCommDestroy(comm);
    return problems.empty() ? 0 : 1;
  }
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 2;
}
