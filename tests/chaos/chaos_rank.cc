// loom_chaos_rank: one rank of a chaos-suite job (or, in `abort` mode, a
// whole 2-rank communicator as threads), driven by its command line. Uses
// only the public API (nccl.h) and POSIX; tests/chaos/chaos_driver.py
// starts it, kills it, and reads what it prints.
//
//   loom_chaos_rank mix rank=R nranks=N seed=S [ops=K] [max_bytes=B] [split=0|1] [limit_s=T]
//       Joins through NCCL_COMM_ID (ncclGetUniqueId + ncclCommInitRank),
//       prints "INIT ok", then runs K random operations (the same sequence
//       on every rank, from S) until one fails or T seconds have passed.
//   loom_chaos_rank soak rank=R nranks=N seed=S [ops=K] [max_bytes=B]
//       Like mix with small sizes and no splits; prints STATS lines (RSS,
//       open fds, threads) after 100 warm-up operations, half-way and at
//       the end.
//   loom_chaos_rank shrink rank=R nranks=N seed=S victim=V [max_bytes=B] [limit_s=T] [revoke=0|1]
//       Like mix without splits until an operation fails (the driver kills
//       rank V), then ncclCommShrink without V (NCCL_SHRINK_ABORT; with
//       revoke=1, ncclCommRevoke then NCCL_SHRINK_DEFAULT) and one checked
//       operation of every kind on the new communicator; destroys both.
//   loom_chaos_rank abort [tries=100] [seed=S] [bound_s=15]
//       ncclCommInitAll of 2 ranks per try; rank 0 blocks in an AllReduce
//       that rank 1 never joins; another thread aborts rank 0 after 0-200 ms.
//
// Output, one line each, flushed at once (the driver parses them):
//   INIT ok seconds=<init time>
//   WRONG op=<i> <what differed>                 (a checked result was wrong)
//   RESULT code=<ncclResult_t> t=<CLOCK_MONOTONIC s> op=<i> desc=<op> error=<text>
//                  (desc ends in /child when a split's child communicator failed)
//   ABORTED seconds=<ncclCommAbort time>         (after a failed operation)
//   SHRUNK code=<ncclResult_t> first_t=<CLOCK_MONOTONIC s of the first correct operation on the new
//          communicator> shrink_s=<ncclCommShrink time> rank=<new rank> nranks=<new size> ops=<run>
//          kinds=<of 8> wrong=<mismatches> destroy_s=<both destroyed> error=<text>
//   STATS phase=before|half|after rss_kb=.. fds=.. threads=..
//   TRY <i> delay_ms=.. abort_s=.. release_s=.. teardown_s=.. code=..
//   ERROR try=<i> <the blocked call's error>     (abort mode: first try, failed tries)
//   HANG ...                                     (abort mode: a call did not return)
//   SUMMARY ...
// Exit status: 0 when the rank behaved (an error caused by a lost peer is
// expected behaviour), 1 for a wrong result, a failed init, a blocked call
// that succeeded or a bound exceeded, 2 for bad arguments.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "chaos_ops.h"

namespace {

using loom::chaos::monotonicSeconds;

struct Args {
  std::map<std::string, std::string> kv;
  long getInt(const std::string& k, long def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::strtol(it->second.c_str(), nullptr, 10);
  }
  unsigned long long getU64(const std::string& k, unsigned long long def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::strtoull(it->second.c_str(), nullptr, 10);
  }
};

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string oneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

void result(int code, double t, long op, const std::string& desc, const std::string& error) {
  say("RESULT code=%d t=%.6f op=%ld desc=%s error=%s", code, t, op, desc.empty() ? "-" : desc.c_str(),
      oneLine(error).c_str());
}

// Joins the communicator the driver set up through NCCL_COMM_ID.
ncclComm_t initOrExit(int rank, int nranks) {
  const double t0 = monotonicSeconds();
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc == ncclSuccess) rc = ncclCommInitRank(&comm, nranks, id, rank);
  if (rc != ncclSuccess) {
    result(int(rc), monotonicSeconds(), -1, "init", ncclGetLastError(nullptr));
    std::exit(1);
  }
  say("INIT ok seconds=%.3f", monotonicSeconds() - t0);
  return comm;
}

// Prints the first few mismatches; returns how many there were.
size_t reportWrong(long op, std::vector<std::string>* wrong, size_t* printed) {
  const size_t n = wrong->size();
  for (const std::string& w : *wrong)
    if ((*printed)++ < 20) say("WRONG op=%ld %s", op, w.c_str());
  wrong->clear();
  return n;
}

// The first failure ends the rank: report it, abort, say how long that took.
int abortAfter(ncclComm_t comm, const loom::chaos::Runner& runner, ncclResult_t rc, long op,
               const std::string& desc, size_t wrongCount) {
  result(int(rc), runner.failTime(), op, desc, runner.failText());
  const double t0 = monotonicSeconds();
  ncclCommAbort(comm);
  say("ABORTED seconds=%.6f", monotonicSeconds() - t0);
  return wrongCount ? 1 : 0;
}

int runMix(const Args& a) {
  const int rank = int(a.getInt("rank", 0)), n = int(a.getInt("nranks", 1));
  const uint64_t seed = a.getU64("seed", 1);
  const long ops = a.getInt("ops", 1000000), limitS = a.getInt("limit_s", 120);
  loom::chaos::Profile profile;
  profile.maxBytes = size_t(a.getInt("max_bytes", 8 << 20));
  profile.split = a.getInt("split", 1) != 0;
  ncclComm_t comm = initOrExit(rank, n);
  loom::chaos::Runner runner(comm, rank, n, profile.maxBytes);
  std::vector<std::string> wrong;
  size_t wrongCount = 0, printed = 0;
  const double start = monotonicSeconds();
  long i = 0;
  for (; i < ops; ++i) {
    const loom::chaos::Op op = loom::chaos::planOp(seed, uint64_t(i), n, profile);
    const ncclResult_t rc = runner.run(op, &wrong);
    wrongCount += reportWrong(i, &wrong, &printed);
    if (rc != ncclSuccess)
      return abortAfter(comm, runner, rc, i, op.describe() + (runner.failedOnChild() ? "/child" : ""), wrongCount);
    if (monotonicSeconds() - start > double(limitS)) {  // nobody was killed: end anyway
      ++i;
      break;
    }
  }
  result(0, monotonicSeconds(), i, "done", "");
  const double t0 = monotonicSeconds();
  const ncclResult_t rc = ncclCommDestroy(comm);
  say("DESTROYED code=%d seconds=%.6f", int(rc), monotonicSeconds() - t0);
  return wrongCount || rc != ncclSuccess ? 1 : 0;
}

// Kill, then shrink the dead rank away and use what is left.
int runShrink(const Args& a) {
  const int rank = int(a.getInt("rank", 0)), n = int(a.getInt("nranks", 1));
  const int victim = int(a.getInt("victim", -1));
  const uint64_t seed = a.getU64("seed", 1);
  const long limitS = a.getInt("limit_s", 60);
  const bool revoke = a.getInt("revoke", 0) != 0;
  loom::chaos::Profile profile;
  profile.maxBytes = size_t(a.getInt("max_bytes", 1 << 20));
  profile.split = false;
  if (victim < 0 || victim >= n) {
    std::fprintf(stderr, "shrink: victim= must name a rank\n");
    return 2;
  }
  ncclComm_t comm = initOrExit(rank, n);
  std::vector<std::string> wrong;
  size_t wrongCount = 0, printed = 0;
  ncclResult_t rc = ncclSuccess;
  long i = 0;
  {
    loom::chaos::Runner runner(comm, rank, n, profile.maxBytes);
    const double start = monotonicSeconds();
    loom::chaos::Op op;
    for (; rc == ncclSuccess && monotonicSeconds() - start < double(limitS); ++i) {
      op = loom::chaos::planOp(seed, uint64_t(i), n, profile);
      rc = runner.run(op, &wrong);
      wrongCount += reportWrong(i, &wrong, &printed);
    }
    result(int(rc), rc == ncclSuccess ? monotonicSeconds() : runner.failTime(), i - 1, op.describe(),
           rc == ncclSuccess ? "no operation failed" : runner.failText());
  }
  if (rc == ncclSuccess) return 1;  // the victim was never killed
  int excluded[1] = {victim};
  ncclComm_t child = nullptr;
  const double t0 = monotonicSeconds();
  rc = revoke ? ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) : ncclSuccess;
  if (rc == ncclSuccess) {
    rc = ncclCommShrink(comm, excluded, 1, &child, nullptr, revoke ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
  }
  const double shrinkS = monotonicSeconds() - t0;
  int childRank = -1, childN = 0, kinds = 0;
  long ran = 0;
  double firstT = 0;
  std::string error = rc == ncclSuccess ? "" : ncclGetLastError(comm);
  if (rc == ncclSuccess && (ncclCommUserRank(child, &childRank) != ncclSuccess ||
                            ncclCommCount(child, &childN) != ncclSuccess)) {
    rc = ncclInternalError;
    error = "rank or count of the shrunk communicator unavailable";
  }
  if (rc == ncclSuccess) {
    // One operation of every kind (drawn from the sequence until each came
    // up), checked; the first one's end is the recovery time.
    loom::chaos::Runner runner(child, childRank, childN, profile.maxBytes);
    bool seen[16] = {};
    for (uint64_t k = 0; k < 2000 && kinds < 8 && rc == ncclSuccess; ++k) {
      const loom::chaos::Op op = loom::chaos::planOp(seed ^ 0x5368726bull, k, childN, profile);
      if (seen[int(op.kind)]) continue;
      seen[int(op.kind)] = true;
      ++kinds;
      rc = runner.run(op, &wrong);
      const bool right = rc == ncclSuccess && wrong.empty();
      wrongCount += reportWrong(1000000 + ran, &wrong, &printed);
      if (rc != ncclSuccess) error = op.describe() + ": " + runner.failText();
      if (ran++ == 0 && right) firstT = monotonicSeconds();
    }
  }
  const double t1 = monotonicSeconds();
  if (child) ncclCommDestroy(child);
  ncclCommDestroy(comm);
  say("SHRUNK code=%d first_t=%.6f shrink_s=%.6f rank=%d nranks=%d ops=%ld kinds=%d wrong=%zu destroy_s=%.6f "
      "error=%s",
      int(rc), firstT, shrinkS, childRank, childN, ran, kinds, wrongCount, monotonicSeconds() - t1,
      oneLine(error).c_str());
  return rc == ncclSuccess && wrongCount == 0 && kinds == 8 ? 0 : 1;
}

// "Name:   value kB" from /proc/self/status.
long statusField(const char* name) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long value = -1;
  const size_t len = std::strlen(name);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, name, len) == 0 && line[len] == ':') value = std::strtol(line + len + 1, nullptr, 10);
  std::fclose(f);
  return value;
}

long openFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  long n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

void stats(const char* phase) {
  say("STATS phase=%s rss_kb=%ld fds=%ld threads=%ld", phase, statusField("VmRSS"), openFds(),
      statusField("Threads"));
}

int runSoak(const Args& a) {
  const int rank = int(a.getInt("rank", 0)), n = int(a.getInt("nranks", 1));
  const uint64_t seed = a.getU64("seed", 1);
  const long ops = a.getInt("ops", 100000), warmup = 100;
  loom::chaos::Profile profile;
  profile.maxBytes = size_t(a.getInt("max_bytes", 1 << 20));
  profile.soak = true;
  ncclComm_t comm = initOrExit(rank, n);
  loom::chaos::Runner runner(comm, rank, n, profile.maxBytes);
  std::vector<std::string> wrong;
  size_t wrongCount = 0, printed = 0;
  double start = 0;
  for (long i = 0; i < warmup + ops; ++i) {
    if (i == warmup) {
      stats("before");
      start = monotonicSeconds();
    }
    if (i == warmup + ops / 2) stats("half");  // growth that stops is not a leak
    const loom::chaos::Op op = loom::chaos::planOp(seed, uint64_t(i), n, profile);
    const ncclResult_t rc = runner.run(op, &wrong);
    wrongCount += reportWrong(i, &wrong, &printed);
    if (rc != ncclSuccess) return abortAfter(comm, runner, rc, i, op.describe(), wrongCount) | 1;
  }
  const double took = monotonicSeconds() - start;
  stats("after");
  say("SOAK ops=%ld seconds=%.3f ops_per_s=%.1f wrong=%zu", ops, took, took > 0 ? double(ops) / took : 0.0,
      wrongCount);
  result(0, monotonicSeconds(), warmup + ops, "done", "");
  return wrongCount || ncclCommDestroy(comm) != ncclSuccess ? 1 : 0;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = size_t(q * double(v.size()) + 0.999999);  // nearest rank
  return v[std::min(v.size() - 1, k ? k - 1 : 0)];
}

struct TryResult {
  double abortS = 0, releaseS = 0, teardownS = 0;
  ncclResult_t code = ncclSuccess;
  bool ok = true;
};

// One try of the abort test; exits the process (after saying HANG) when the
// blocked call does not return within bound_s of the abort.
TryResult abortTry(int index, unsigned delayMs, double boundS) {
  TryResult t;
  ncclComm_t comms[2] = {nullptr, nullptr};
  if (ncclCommInitAll(comms, 2, nullptr) != ncclSuccess) {
    say("TRY %d init failed: %s", index, oneLine(ncclGetLastError(nullptr)).c_str());
    t.ok = false;
    return t;
  }
  std::vector<float> x(1 << 16, 1.0f), y(1 << 16);
  std::atomic<int> state{0};  // 1: about to call, 2: returned
  std::atomic<double> returnedAt{0};
  ncclResult_t code = ncclSuccess;
  std::string error;
  std::thread blocked([&] {
    state = 1;
    code = ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, comms[0], nullptr);
    returnedAt = monotonicSeconds();
    if (code != ncclSuccess) error = oneLine(ncclGetLastError(nullptr));
    state = 2;
  });
  while (state.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
  const bool early = state.load() == 2;
  const double t0 = monotonicSeconds();
  ncclCommAbort(comms[0]);
  t.abortS = monotonicSeconds() - t0;
  while (state.load() != 2 && monotonicSeconds() - t0 < boundS)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (state.load() != 2) {
    say("HANG try=%d delay_ms=%u: the blocked AllReduce has not returned %.0f s after ncclCommAbort "
        "(which took %.3f s); waiting to be debugged",
        index, delayMs, boundS, t.abortS);
    std::this_thread::sleep_for(std::chrono::seconds(120));  // time for the driver's gdb
    std::_Exit(3);
  }
  blocked.join();
  t.releaseS = returnedAt.load() - t0;
  t.code = code;
  const double t1 = monotonicSeconds();
  if (index % 2) ncclCommAbort(comms[1]);
  else ncclCommDestroy(comms[1]);
  t.teardownS = monotonicSeconds() - t1;
  say("TRY %d delay_ms=%u abort_s=%.6f release_s=%.6f teardown_s=%.6f code=%d%s", index, delayMs, t.abortS,
      t.releaseS, t.teardownS, int(code), early ? " returned_before_abort=1" : "");
  t.ok = code != ncclSuccess && t.abortS < boundS && t.releaseS < boundS && t.teardownS < boundS;
  if (index == 0 || !t.ok) say("ERROR try=%d %s", index, error.c_str());
  return t;
}

int runAbort(const Args& a) {
  const int tries = int(a.getInt("tries", 100));
  const double boundS = double(a.getInt("bound_s", 15));
  uint64_t state = a.getU64("seed", uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::vector<double> aborts, releases;
  std::map<int, int> codes;
  int failures = 0;
  for (int i = 0; i < tries; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned delayMs = unsigned((state >> 33) % 201);
    const TryResult t = abortTry(i, delayMs, boundS);
    if (!t.ok) ++failures;
    aborts.push_back(t.abortS);
    releases.push_back(t.releaseS);
    ++codes[int(t.code)];
  }
  std::string codeText;
  for (const auto& [code, count] : codes) {
    if (!codeText.empty()) codeText += ',';
    codeText.append(std::to_string(code)).append("x").append(std::to_string(count));
  }
  say("SUMMARY tries=%d failures=%d codes=%s abort_s median=%.6f p90=%.6f max=%.6f "
      "release_s median=%.6f p90=%.6f max=%.6f",
      tries, failures, codeText.c_str(), quantile(aborts, 0.5), quantile(aborts, 0.9), quantile(aborts, 1.0),
      quantile(releases, 0.5), quantile(releases, 0.9), quantile(releases, 1.0));
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s mix|soak|abort|shrink key=value...\n", argv[0]);
    return 2;
  }
  Args a;
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    const size_t eq = s.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "argument '%s' is not key=value\n", s.c_str());
      return 2;
    }
    a.kv[s.substr(0, eq)] = s.substr(eq + 1);
  }
  const std::string mode = argv[1];
  if (mode == "mix") return runMix(a);
  if (mode == "soak") return runSoak(a);
  if (mode == "abort") return runAbort(a);
  if (mode == "shrink") return runShrink(a);
  std::fprintf(stderr, "unknown mode %s (mix, soak, abort or shrink)\n", mode.c_str());
  return 2;
}
