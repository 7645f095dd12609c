#include "matrix.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>
#include <cstdio>
#include <cstring>

#include "dtype_ref.h"
#include "mp_util.h"

namespace loom::test {
namespace {

constexpr size_t kGuard = 64;                      // guard bytes on each side of a buffer
#ifndef LOOM_TEST_SANITIZED
constexpr size_t kBigBytes = (3u << 20) + 40;      // "a few MiB" per buffer
#else
// Sanitizer builds: a third of it, with 64 KiB pipeline slices instead of
// 512 KiB (matrix_test.cc's main), so a big buffer still spans many slices.
constexpr size_t kBigBytes = (1u << 20) + 40;
#endif
constexpr size_t kMaxReportsPerBuffer = 3;

bool perRankCount(Coll c) {
  return c == Coll::kAllGather || c == Coll::kReduceScatter || c == Coll::kAlltoAll || c == Coll::kGather ||
         c == Coll::kScatter || c == Coll::kSendRecvAllPairs;
}

// One buffer of one rank, its expected image, and what the messages need.
struct Buf {
  std::vector<uint8_t> mem;     // guard | elements | guard
  std::vector<uint8_t> expect;  // what mem must hold after the call
  size_t elems = 0;
  size_t es = 1;
  const char* name = "";
  size_t outBegin = 0, outEnd = 0;  // elements written by the call (for messages)
  size_t tolBegin = 0;              // tolExact[i] is the exact value of element tolBegin + i
  std::vector<double> tolExact;
  bool used() const { return !mem.empty(); }
  uint8_t* data() { return mem.data() + kGuard; }
  uint8_t* exp() { return expect.data() + kGuard; }
};

struct RankBufs {
  Buf a, b;  // a: the send side (or the only buffer in place), b: the receive side
  const void* send = nullptr;
  void* recv = nullptr;
};

void alloc(Buf& buf, size_t elems, size_t es, uint64_t pattern, const char* name) {
  buf.elems = elems;
  buf.es = es;
  buf.name = name;
  buf.mem.resize(2 * kGuard + elems * es);
  uint64_t* words = reinterpret_cast<uint64_t*>(buf.mem.data());
  const size_t nwords = buf.mem.size() / 8;
  for (size_t i = 0; i < nwords; ++i) words[i] = pattern ^ (i * 0x9e3779b97f4a7c15ull);
  for (size_t i = nwords * 8; i < buf.mem.size(); ++i) buf.mem[i] = uint8_t(pattern >> (i % 8));
}

// Runs fn(begin, end) over [0, count) split across the machine's cores
// (building inputs and expected images dominates the run time).
void parallelFor(size_t count, const std::function<void(size_t, size_t)>& fn) {
  const size_t workers = std::max(1u, std::thread::hardware_concurrency());
  if (count < 65536 || workers == 1) {
    fn(0, count);
    return;
  }
  std::vector<std::thread> threads;
  const size_t part = (count + workers - 1) / workers;
  for (size_t w = 0; w < workers; ++w) {
    const size_t begin = std::min(count, w * part), end = std::min(count, begin + part);
    threads.emplace_back(fn, begin, end);
  }
  for (auto& t : threads) t.join();
}

void writeInputs(const Case& c, int rank, uint8_t* dst, size_t elems) {
  const Red red = collReduces(c.coll) ? c.red : Red::kNone;
  const size_t es = typeInfo(c.type).size;
  parallelFor(elems, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) storeBits(dst, i, es, inputBits(c.type, red, c.nranks, c.seed, rank, i));
  });
}

class Builder {
 public:
  Builder(const Case& c, std::vector<RankBufs>& ranks, std::vector<std::string>& problems)
      : c_(c), n_(c.nranks), es_(typeInfo(c.type).size), ranks_(ranks), problems_(problems) {}

  void build();

 private:
  uint64_t pattern(int r, int which) const { return hash3(c_.seed ^ 0xbadc0ffee, uint64_t(r), uint64_t(which)); }
  void allocA(int r, size_t elems) { alloc(ranks_[size_t(r)].a, elems, es_, pattern(r, 0), "sendbuff"); }
  void allocB(int r, size_t elems) { alloc(ranks_[size_t(r)].b, elems, es_, pattern(r, 1), "recvbuff"); }
  void snapshot() {
    for (auto& rb : ranks_) {
      rb.a.expect = rb.a.mem;
      rb.b.expect = rb.b.mem;
    }
  }
  void markOutput(Buf& b, size_t begin, size_t count) {
    b.outBegin = begin;
    b.outEnd = begin + count;
  }
  // Expected image of dst[dstElem ..) = reduction over ranks of in[r][0 .. count).
  void reduceInto(const std::vector<const uint8_t*>& in, size_t count, Buf& dst, size_t dstElem);
  void copyInto(const uint8_t* src, size_t count, Buf& dst, size_t dstElem) {
    if (count) std::memcpy(dst.exp() + dstElem * es_, src, count * es_);
    markOutput(dst, dstElem, count);
  }
  void buildReducing();
  void buildGatherLike();
  void buildScatterLike();
  void buildPointToPoint();

  const Case& c_;
  const int n_;
  const size_t es_;
  std::vector<RankBufs>& ranks_;
  std::vector<std::string>& problems_;
};

void Builder::reduceInto(const std::vector<const uint8_t*>& in, size_t count, Buf& dst, size_t dstElem) {
  markOutput(dst, dstElem, count);
  const bool tolerant = c_.red == Red::kAvg && typeInfo(c_.type).isFloat && (n_ & (n_ - 1)) != 0;
  if (tolerant) {
    dst.tolBegin = dstElem;
    dst.tolExact.assign(count, 0.0);
  }
  std::atomic<size_t> designErrors{0}, firstError{SIZE_MAX};
  const Reducer reducer(c_.type, c_.red, n_);
  parallelFor(count, [&](size_t begin, size_t end) {
    std::vector<uint64_t> vals(static_cast<size_t>(n_));
    for (size_t i = begin; i < end; ++i) {
      for (int r = 0; r < n_; ++r) vals[size_t(r)] = loadBits(in[size_t(r)], i, es_);
      Expected e = reducer(vals.data());
      if (e.designError && designErrors++ == 0) firstError = i;
      storeBits(dst.exp(), dstElem + i, es_, e.bits);
      if (e.tolerant) dst.tolExact[i] = e.exact;
    }
  });
  if (designErrors > 0) {
    problems_.push_back("test design error: the inputs at element " + std::to_string(firstError.load()) + " and " +
                        std::to_string(designErrors.load() - 1) +
                        " others do not reduce exactly; fix reduce_ref.cc");
  }
}

void Builder::buildReducing() {
  const size_t cnt = c_.count;
  const bool rs = c_.coll == Coll::kReduceScatter;
  const size_t inElems = rs ? cnt * size_t(n_) : cnt;
  std::vector<const uint8_t*> in(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    allocA(r, inElems);
    if (!c_.inPlace) allocB(r, cnt);
    rb.send = rb.a.data();
    rb.recv = c_.inPlace ? rb.a.data() + (rs ? size_t(r) * cnt * es_ : 0) : rb.b.data();
    writeInputs(c_, r, rb.a.data(), inElems);
    in[size_t(r)] = rb.a.data();
  }
  snapshot();
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    if (c_.coll == Coll::kReduce && r != c_.root) continue;  // nothing written off the root
    std::vector<const uint8_t*> block = in;
    if (rs)
      for (auto& p : block) p += size_t(r) * cnt * es_;
    Buf& dst = c_.inPlace ? rb.a : rb.b;
    reduceInto(block, cnt, dst, c_.inPlace && rs ? size_t(r) * cnt : 0);
  }
}

// AllGather and Gather: rank r's `count` elements land in block r.
void Builder::buildGatherLike() {
  const size_t cnt = c_.count, total = cnt * size_t(n_);
  const bool toAll = c_.coll == Coll::kAllGather;
  std::vector<const uint8_t*> in(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    allocB(r, total);
    if (c_.inPlace) {
      rb.send = rb.b.data() + size_t(r) * cnt * es_;
    } else {
      allocA(r, cnt);
      rb.send = rb.a.data();
    }
    rb.recv = rb.b.data();
    writeInputs(c_, r, const_cast<uint8_t*>(static_cast<const uint8_t*>(rb.send)), cnt);
    in[size_t(r)] = static_cast<const uint8_t*>(rb.send);
  }
  snapshot();
  for (int r = 0; r < n_; ++r) {
    if (!toAll && r != c_.root) continue;
    for (int j = 0; j < n_; ++j) copyInto(in[size_t(j)], cnt, ranks_[size_t(r)].b, size_t(j) * cnt);
    markOutput(ranks_[size_t(r)].b, 0, total);
  }
}

// Broadcast and Scatter: the root's data (all of it, or block r) lands on
// every rank r.
void Builder::buildScatterLike() {
  const size_t cnt = c_.count;
  const bool scatter = c_.coll == Coll::kScatter;
  const size_t inElems = scatter ? cnt * size_t(n_) : cnt;
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    allocA(r, inElems);
    rb.send = rb.a.data();
    if (c_.inPlace) {
      rb.recv = rb.a.data() + (scatter ? size_t(r) * cnt * es_ : 0);
    } else {
      allocB(r, cnt);
      rb.recv = rb.b.data();
    }
    writeInputs(c_, r, rb.a.data(), inElems);  // only the root's are sent
  }
  snapshot();
  const uint8_t* rootData = ranks_[size_t(c_.root)].a.data();
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    const uint8_t* src = rootData + (scatter ? size_t(r) * cnt * es_ : 0);
    if (c_.inPlace) copyInto(src, cnt, rb.a, scatter ? size_t(r) * cnt : 0);
    else copyInto(src, cnt, rb.b, 0);
  }
}

size_t pairCount(const Case& c, int from, int to) {
  if (c.coll != Coll::kSendRecvAllPairs || c.count == 0) return c.count;
  return c.count + size_t((from + 2 * to) % 3);  // unequal sizes per pair
}

// AlltoAll, Send/Recv ring, Send/Recv all pairs: a = what rank r sends
// (block j for rank j), b = what it receives (block j from rank j); in-place
// AlltoAll receives block j from rank j into a's block j.
void Builder::buildPointToPoint() {
  const bool inPlace = c_.inPlace && c_.coll == Coll::kAlltoAll;
  auto sends = [&](int from, int to) {
    if (c_.coll == Coll::kSendRecvRing) return to == (from + 1) % n_;
    return true;
  };
  auto offset = [&](int r, int peer, bool sending) {
    size_t off = 0;
    for (int j = 0; j < peer; ++j)
      if (sending ? sends(r, j) : sends(j, r)) off += pairCount(c_, sending ? r : j, sending ? j : r);
    return off;
  };
  for (int r = 0; r < n_; ++r) {
    RankBufs& rb = ranks_[size_t(r)];
    allocA(r, offset(r, n_, true));
    if (!inPlace) allocB(r, offset(r, n_, false));
    rb.send = rb.a.data();
    rb.recv = inPlace ? rb.a.data() : rb.b.data();
    writeInputs(c_, r, rb.a.data(), rb.a.elems);
  }
  snapshot();
  for (int r = 0; r < n_; ++r) {
    Buf& out = inPlace ? ranks_[size_t(r)].a : ranks_[size_t(r)].b;
    for (int j = 0; j < n_; ++j) {
      if (!sends(j, r)) continue;
      copyInto(ranks_[size_t(j)].a.data() + offset(j, r, true) * es_, pairCount(c_, j, r), out, offset(r, j, false));
    }
    markOutput(out, 0, out.elems);
  }
}

void Builder::build() {
  switch (c_.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kReduceScatter: buildReducing(); break;
    case Coll::kAllGather:
    case Coll::kGather: buildGatherLike(); break;
    case Coll::kBroadcast:
    case Coll::kScatter: buildScatterLike(); break;
    default: buildPointToPoint(); break;
  }
}

ncclRedOp_t builtinOp(Red red) {
  switch (red) {
    case Red::kProd: return ncclProd;
    case Red::kMax: return ncclMax;
    case Red::kMin: return ncclMin;
    case Red::kAvg: return ncclAvg;
    default: return ncclSum;
  }
}

ncclResult_t callPointToPoint(const Case& c, ncclComm_t comm, int r, const RankBufs& rb) {
  const int n = c.nranks;
  const size_t es = typeInfo(c.type).size;
  if (c.coll == Coll::kAlltoAll) return ncclAlltoAll(rb.send, rb.recv, c.count, c.type, comm, nullptr);
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
  size_t sendOff = 0, recvOff = 0;
  for (int j = 0; j < n; ++j) {
    const bool ring = c.coll == Coll::kSendRecvRing;
    const bool sendTo = !ring || j == (r + 1) % n, recvFrom = !ring || r == (j + 1) % n;
    const size_t sc = pairCount(c, r, j), rc = pairCount(c, j, r);
    ncclResult_t a = ncclSuccess, b = ncclSuccess;
    // Odd ranks post the receive first: the order inside a group must not matter.
    if (recvFrom && (r & 1)) a = ncclRecv(static_cast<uint8_t*>(rb.recv) + recvOff * es, rc, c.type, j, comm, nullptr);
    if (sendTo) b = ncclSend(static_cast<const uint8_t*>(rb.send) + sendOff * es, sc, c.type, j, comm, nullptr);
    if (recvFrom && !(r & 1)) a = ncclRecv(static_cast<uint8_t*>(rb.recv) + recvOff * es, rc, c.type, j, comm, nullptr);
    if (first == ncclSuccess) first = a != ncclSuccess ? a : b;
    if (sendTo) sendOff += sc;
    if (recvFrom) recvOff += rc;
  }
  ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

ncclResult_t callOne(const Case& c, ncclComm_t comm, int r, const RankBufs& rb, ncclRedOp_t op) {
  switch (c.coll) {
    case Coll::kAllReduce: return ncclAllReduce(rb.send, rb.recv, c.count, c.type, op, comm, nullptr);
    case Coll::kReduce: return ncclReduce(rb.send, rb.recv, c.count, c.type, op, c.root, comm, nullptr);
    case Coll::kReduceScatter: return ncclReduceScatter(rb.send, rb.recv, c.count, c.type, op, comm, nullptr);
    case Coll::kAllGather: return ncclAllGather(rb.send, rb.recv, c.count, c.type, comm, nullptr);
    case Coll::kBroadcast: return ncclBroadcast(rb.send, rb.recv, c.count, c.type, c.root, comm, nullptr);
    case Coll::kGather: return ncclGather(rb.send, rb.recv, c.count, c.type, c.root, comm, nullptr);
    case Coll::kScatter: return ncclScatter(rb.send, rb.recv, c.count, c.type, c.root, comm, nullptr);
    default: return callPointToPoint(c, comm, r, rb);
  }
}

void checkBuffer(const Case& c, int rank, Buf& b, std::vector<std::string>& out) {
  if (!b.used()) return;
  if (b.mem == b.expect) return;
  char line[400];
  if (std::memcmp(b.mem.data(), b.expect.data(), kGuard) != 0) {
    std::snprintf(line, sizeof line, "rank %d: the %zu guard bytes before %s were overwritten", rank, kGuard, b.name);
    out.push_back(line);
  }
  if (std::memcmp(b.mem.data() + kGuard + b.elems * b.es, b.expect.data() + kGuard + b.elems * b.es, kGuard) != 0) {
    std::snprintf(line, sizeof line, "rank %d: the %zu guard bytes after %s (%zu elements) were overwritten", rank,
                  kGuard, b.name, b.elems);
    out.push_back(line);
  }
  size_t bad = 0;
  for (size_t i = 0; i < b.elems; ++i) {
    const uint64_t got = loadBits(b.data(), i, b.es), want = loadBits(b.exp(), i, b.es);
    if (got == want) continue;
    if (!b.tolExact.empty() && i >= b.tolBegin && i < b.tolBegin + b.tolExact.size()) {
      Expected e;
      e.bits = want;
      e.tolerant = true;
      e.exact = b.tolExact[i - b.tolBegin];
      if (acceptable(c.type, e, got)) continue;
    }
    if (++bad > kMaxReportsPerBuffer) continue;
    const bool output = i >= b.outBegin && i < b.outEnd;
    std::snprintf(line, sizeof line, "rank %d: %s[%zu] %s: got %s, expected %s", rank, b.name, i,
                  output ? "(output)" : "(not an output: must stay untouched)", formatValue(c.type, got).c_str(),
                  formatValue(c.type, want).c_str());
    out.push_back(line);
  }
  if (bad > kMaxReportsPerBuffer) {
    out.push_back("rank " + std::to_string(rank) + ": " + b.name + ": " + std::to_string(bad) +
                  " elements differ in all");
  }
}

}  // namespace

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kAllGather: return "AllGather";
    case Coll::kReduceScatter: return "ReduceScatter";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kReduce: return "Reduce";
    case Coll::kAlltoAll: return "AlltoAll";
    case Coll::kGather: return "Gather";
    case Coll::kScatter: return "Scatter";
    case Coll::kSendRecvRing: return "SendRecvRing";
    case Coll::kSendRecvAllPairs: return "SendRecvAllPairs";
  }
  return "?";
}

bool collReduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter; }
bool collRooted(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}
bool collHasInPlace(Coll c) {
  return c != Coll::kSendRecvRing && c != Coll::kSendRecvAllPairs;
}

std::string Case::describe() const {
  char buf[300];
  std::snprintf(buf, sizeof buf, "%s nranks=%d type=%s op=%s %s count=%zu root=%d seed=%llu", collName(coll),
                nranks, typeInfo(type).name, collReduces(coll) ? redName(red) : "-",
                inPlace ? "in-place" : "out-of-place", count, root, static_cast<unsigned long long>(seed));
  return buf;
}

CommSet::CommSet(int n, std::vector<std::string> env) : n_(n), env_(std::move(env)) { create(); }
CommSet::~CommSet() { release(); }

void CommSet::create() {
  comms_.assign(size_t(n_), nullptr);
  ncclResult_t rc;
  {
    ScopedEnv env(env_);
    rc = ncclCommInitAll(comms_.data(), n_, nullptr);
  }
  ok_ = rc == ncclSuccess;
  error_ = ok_ ? "" : std::string("ncclCommInitAll failed: ") + ncclGetErrorString(rc) + ": " + ncclGetLastError(nullptr);
}

void CommSet::release() {
  for (auto& c : comms_) {
    if (c) ncclCommAbort(c);
    c = nullptr;
  }
}

void CommSet::rebuild() {
  release();
  create();
}

// Small counts: 0, 1, 1031 (odd, prime) and one more - 67 elements per
// rank for the collectives whose count is per rank, else 97n + n - 1 (not a
// multiple of nranks) - each crossed with every type, op and placement.
// Roots: all of {0, n/2, n-1} for Broadcast, Gather and Scatter; Reduce,
// which also crosses 7 ops, rotates its root through them instead.
std::vector<Case> casesFor(Coll coll, int n) {
  std::vector<Case> out;
  const bool perRank = perRankCount(coll);
  const std::vector<size_t> small = perRank ? std::vector<size_t>{0, 1, 1031, 67}
                                            : std::vector<size_t>{0, 1, 1031, 97 * size_t(n) + size_t(n > 1 ? n - 1 : 1)};
  std::vector<Red> reds = collReduces(coll) ? std::vector<Red>(std::begin(kAllReds), std::end(kAllReds))
                                            : std::vector<Red>{Red::kNone};
  std::vector<bool> places = collHasInPlace(coll) ? std::vector<bool>{false, true} : std::vector<bool>{false};
  std::vector<int> roots{0};
  if (collRooted(coll)) {
    roots = {0, n - 1, n / 2};
    std::sort(roots.begin(), roots.end());
    roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  }
  auto add = [&](ncclDataType_t type, Red red, bool inPlace, size_t count, int root) {
    Case c;
    c.coll = coll;
    c.type = type;
    c.red = red;
    c.inPlace = inPlace;
    c.count = count;
    c.root = root;
    c.nranks = n;
    c.seed = hash3(uint64_t(coll) + 1, uint64_t(n), out.size());
    out.push_back(c);
  };
  const auto& types = allTypes();
  for (size_t ci = 0; ci < small.size(); ++ci)
    for (size_t ti = 0; ti < types.size(); ++ti)
      for (size_t ri = 0; ri < reds.size(); ++ri)
        for (size_t pi = 0; pi < places.size(); ++pi) {
          if (collRooted(coll) && collReduces(coll)) {
            add(types[ti], reds[ri], places[pi], small[ci], roots[(ti + ri + pi + ci) % roots.size()]);
          } else {
            for (int root : roots) add(types[ti], reds[ri], places[pi], small[ci], root);
          }
        }
  // Big counts ("a few MiB" per buffer; per-rank counts are scaled so the
  // largest buffer is that size): four types per rank count, rotating so
  // that every three consecutive rank counts cover all twelve types; op,
  // placement and root rotate too. Building and checking these dominates
  // the run time, hence the sampling.
  const size_t nIndex = n == 8 ? 5 : size_t(n - 1);
  for (size_t ti = 0; ti < types.size(); ++ti) {
    if ((ti + nIndex) % 3 != 0) continue;
    const size_t es = typeInfo(types[ti]).size;
    const size_t count = kBigBytes / es / (perRank ? size_t(n) : 1) + 5;
    add(types[ti], reds[(ti + size_t(n)) % reds.size()], places[(ti / 3 + nIndex) % places.size()], count,
        roots[(ti / 3) % roots.size()]);
  }
  return out;
}

std::vector<std::string> runRanks(const Case& c, const std::vector<ncclComm_t>& comms, const std::vector<int>& local,
                                  bool* callFailed) {
  std::vector<std::string> problems;
  *callFailed = false;
  const int n = c.nranks;
  std::vector<RankBufs> ranks(static_cast<size_t>(n));
  Builder(c, ranks, problems).build();
  if (!problems.empty()) return problems;

  std::vector<ncclRedOp_t> ops(size_t(n), builtinOp(c.red));
  std::vector<uint64_t> scalars(size_t(n), 0);
  const bool preMul = collReduces(c.coll) && isPreMul(c.red);
  if (preMul) {
    for (int r : local) {
      scalars[size_t(r)] = preMulScalarBits(c.type, c.red);
      ncclResult_t rc = ncclRedOpCreatePreMulSum(
          &ops[size_t(r)], &scalars[size_t(r)], c.type,
          c.red == Red::kPreMulHost ? ncclScalarHostImmediate : ncclScalarDevice, comms[size_t(r)]);
      if (rc != ncclSuccess) {
        *callFailed = true;
        return {"rank " + std::to_string(r) + ": ncclRedOpCreatePreMulSum failed: " + ncclGetErrorString(rc) + ": " +
                ncclGetLastError(comms[size_t(r)])};
      }
    }
  }
  std::vector<ncclResult_t> rcs(size_t(n), ncclSuccess);
  std::vector<std::string> errors(static_cast<size_t>(n));
  onRanks(int(local.size()), [&](int i) {
    const int r = local[size_t(i)];
    rcs[size_t(r)] = callOne(c, comms[size_t(r)], r, ranks[size_t(r)], ops[size_t(r)]);
    if (rcs[size_t(r)] != ncclSuccess) errors[size_t(r)] = ncclGetLastError(comms[size_t(r)]);
  });
  for (int r : local) {
    if (rcs[size_t(r)] == ncclSuccess) continue;
    *callFailed = true;
    problems.push_back("rank " + std::to_string(r) + ": returned " + ncclGetErrorString(rcs[size_t(r)]) + ": " +
                       errors[size_t(r)]);
  }
  if (*callFailed) return problems;
  if (preMul) {
    for (int r : local) {
      if (ncclRedOpDestroy(ops[size_t(r)], comms[size_t(r)]) != ncclSuccess)
        problems.push_back("rank " + std::to_string(r) + ": ncclRedOpDestroy failed: " +
                           ncclGetLastError(comms[size_t(r)]));
    }
  }
  for (int r : local) {
    checkBuffer(c, r, ranks[size_t(r)].a, problems);
    checkBuffer(c, r, ranks[size_t(r)].b, problems);
  }
  return problems;
}

std::vector<std::string> runCase(CommSet& comms, const Case& c) {
  if (!comms.ok()) {
    comms.rebuild();
    if (!comms.ok()) return {comms.error()};
  }
  std::vector<ncclComm_t> handles;
  std::vector<int> local;
  for (int r = 0; r < c.nranks; ++r) {
    handles.push_back(comms[r]);
    local.push_back(r);
  }
  bool callFailed = false;
  std::vector<std::string> problems = runRanks(c, handles, local, &callFailed);
  if (callFailed) comms.rebuild();  // a failed call leaves the communicators unusable
  return problems;
}

std::vector<std::string> runCaseAsRank(ncclComm_t comm, int rank, const Case& c) {
  std::vector<ncclComm_t> handles(static_cast<size_t>(c.nranks), nullptr);
  handles[size_t(rank)] = comm;
  bool callFailed = false;
  return runRanks(c, handles, {rank}, &callFailed);
}

}  // namespace loom::test
