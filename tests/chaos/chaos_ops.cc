#include "chaos_ops.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

namespace loom::chaos {
namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small deterministic generator (splitmix64): the same numbers on every
// rank and every platform, unlike the <random> distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_++); }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }

 private:
  uint64_t state_;
};

// Element i of rank r's data: a small integer in [-2, 2], so that sums and
// products over up to 5 ranks (|x| <= 32) are exact in every type used,
// int8 and half included.
int valueAt(int rank, size_t i, uint32_t salt) {
  uint32_t h = uint32_t(i) * 2654435761u ^ salt ^ uint32_t(rank + 1) * 0x85ebca6bu;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return int(h % 5u) - 2;
}

// IEEE half and bfloat16 encodings of -2, -1, 0, 1, 2.
constexpr uint16_t kHalf[5] = {0xC000, 0xBC00, 0x0000, 0x3C00, 0x4000};
constexpr uint16_t kBf16[5] = {0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000};

double halfToDouble(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(double(m), -24)
             : e == 31 ? (m ? NAN : INFINITY)
                       : std::ldexp(double(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}

double bf16ToDouble(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    default: return 4;  // ncclInt32, ncclFloat32: the only other types drawn
  }
}

const char* typeName(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclInt32: return "int32";
    case ncclFloat16: return "half";
    case ncclBfloat16: return "bf16";
    default: return "float32";
  }
}

const char* redName(ncclRedOp_t r) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return int(r) >= 0 && int(r) < 5 ? kNames[r] : "?";
}

// Writes valueAt(rank, first + k, salt) to elements k = 0..n-1 of p.
template <typename T, typename Enc>
void fillT(void* p, size_t n, int rank, uint32_t salt, size_t first, Enc enc) {
  T* q = static_cast<T*>(p);
  for (size_t k = 0; k < n; ++k) q[k] = enc(valueAt(rank, first + k, salt));
}

void fill(ncclDataType_t t, void* p, size_t n, int rank, uint32_t salt, size_t first = 0) {
  switch (t) {
    case ncclInt8: fillT<int8_t>(p, n, rank, salt, first, [](int v) { return int8_t(v); }); break;
    case ncclInt32: fillT<int32_t>(p, n, rank, salt, first, [](int v) { return int32_t(v); }); break;
    case ncclFloat16: fillT<uint16_t>(p, n, rank, salt, first, [](int v) { return kHalf[v + 2]; }); break;
    case ncclBfloat16: fillT<uint16_t>(p, n, rank, salt, first, [](int v) { return kBf16[v + 2]; }); break;
    default: fillT<float>(p, n, rank, salt, first, [](int v) { return float(v); }); break;
  }
}

double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return static_cast<const int8_t*>(p)[i];
    case ncclInt32: return static_cast<const int32_t*>(p)[i];
    case ncclFloat16: return halfToDouble(static_cast<const uint16_t*>(p)[i]);
    case ncclBfloat16: return bf16ToDouble(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// The reduction of element `i` over `ranks`.
double reduceAt(ncclRedOp_t red, const std::vector<int>& ranks, size_t i, uint32_t salt) {
  double acc = valueAt(ranks[0], i, salt);
  for (size_t k = 1; k < ranks.size(); ++k) {
    const double v = valueAt(ranks[k], i, salt);
    switch (red) {
      case ncclProd: acc *= v; break;
      case ncclMax: acc = std::max(acc, v); break;
      case ncclMin: acc = std::min(acc, v); break;
      default: acc += v; break;  // sum, avg
    }
  }
  return red == ncclAvg ? acc / double(ranks.size()) : acc;
}

// Every value except an average is a small integer, exact in every type.
bool close(ncclDataType_t t, ncclRedOp_t red, double got, double want) {
  if (red != ncclAvg) return got == want;
  const double scale = std::max(1.0, std::fabs(want));
  const bool narrow = t == ncclFloat16 || t == ncclBfloat16;
  return std::fabs(got - want) <= (narrow ? 1e-2 : 1e-5) * scale;
}

// Compares about 1,000 evenly spread elements of buf (and the last one)
// with want(i); adds one line to `wrong` at the first mismatch.
void check(const Op& op, const char* what, const void* buf, size_t count, const std::function<double(size_t)>& want,
           std::vector<std::string>* wrong) {
  if (count == 0) return;
  const size_t stride = std::max<size_t>(1, count / 1024);
  for (size_t i = 0;; i += stride) {
    if (i >= count) i = count - 1;
    const double got = load(op.type, buf, i), expect = want(i);
    if (!close(op.type, op.red, got, expect)) {
      char line[256];
      std::snprintf(line, sizeof line, "%s %s: element %zu is %g, expected %g", op.describe().c_str(), what, i, got,
                    expect);
      wrong->push_back(line);
      return;
    }
    if (i == count - 1) return;
  }
}

std::string oneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// 0 sometimes; otherwise log-uniform from 1 byte to `cap`.
size_t pickBytes(Rng& rng, size_t cap) {
  if (rng.below(25) == 0 || cap == 0) return 0;
  int bits = 0;
  while ((size_t(2) << bits) <= cap) ++bits;  // 2^bits <= cap < 2^(bits+1)
  const size_t base = size_t(1) << rng.below(uint64_t(bits) + 1);
  return std::min(cap, base + size_t(rng.below(base)));
}

}  // namespace

double monotonicSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::string Op::describe() const {
  static const char* const kKinds[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
                                       "AlltoAll",  "SendRecv",  "TwoInGroup",    "Split"};
  std::string s = std::string(kKinds[int(kind)]) + "/" + typeName(type);
  if (kind == Kind::kAllReduce || kind == Kind::kReduceScatter || kind == Kind::kReduce ||
      kind == Kind::kTwoInGroup || kind == Kind::kSplit)
    s += std::string("/") + redName(red);
  s += "/n=" + std::to_string(count);
  if (kind == Kind::kBroadcast || kind == Kind::kReduce) s += "/root=" + std::to_string(root);
  if (inPlace) s += "/inplace";
  return s;
}

Op planOp(uint64_t seed, uint64_t index, int nranks, const Profile& profile) {
  Rng rng(mix64(seed) ^ mix64(index + 0x51ed));
  struct Weight {
    Kind kind;
    int weight;
  };
  static const Weight kWeights[] = {{Kind::kAllReduce, 30}, {Kind::kAllGather, 12}, {Kind::kReduceScatter, 12},
                                    {Kind::kBroadcast, 10}, {Kind::kReduce, 10},    {Kind::kAlltoAll, 8},
                                    {Kind::kSendRecvRing, 8}, {Kind::kTwoInGroup, 6}, {Kind::kSplit, 4}};
  int total = 0;
  for (const Weight& w : kWeights)
    if (w.kind != Kind::kSplit || profile.split) total += w.weight;
  int pick = int(rng.below(uint64_t(total)));
  Op op;
  for (const Weight& w : kWeights) {
    if (w.kind == Kind::kSplit && !profile.split) continue;
    if (pick < w.weight) {
      op.kind = w.kind;
      break;
    }
    pick -= w.weight;
  }
  const int t = int(rng.below(100));
  op.type = t < 55 ? ncclFloat32 : t < 75 ? ncclInt32 : t < 87 ? ncclInt8 : t < 94 ? ncclBfloat16 : ncclFloat16;
  const int r = int(rng.below(100));
  op.red = r < 40 ? ncclSum : r < 55 ? ncclMax : r < 70 ? ncclMin : r < 85 ? ncclProd : ncclAvg;
  if (op.red == ncclAvg && (op.type == ncclInt8 || op.type == ncclInt32)) op.red = ncclSum;  // int avg truncates
  size_t cap = profile.maxBytes;
  if (profile.soak && rng.below(10) != 0) cap = std::min<size_t>(cap, 64u << 10);
  const size_t elems = pickBytes(rng, cap) / typeSize(op.type);
  const bool perRank = op.kind == Kind::kAllGather || op.kind == Kind::kReduceScatter || op.kind == Kind::kAlltoAll;
  op.count = perRank ? elems / size_t(nranks) : elems;
  op.root = int(rng.below(uint64_t(nranks)));
  op.inPlace = rng.below(4) == 0 && (op.kind == Kind::kAllReduce || op.kind == Kind::kAllGather ||
                                     op.kind == Kind::kBroadcast);
  op.salt = uint32_t(rng.next());
  return op;
}

Runner::Runner(ncclComm_t comm, int rank, int nranks, size_t maxBytes)
    : comm_(comm), rank_(rank), nranks_(nranks) {
  for (int r = 0; r < nranks; ++r) all_.push_back(r);
  const size_t bytes = maxBytes + 64;
  send_.resize(bytes);
  recv_.resize(bytes);
  send2_.resize(bytes);
  recv2_.resize(bytes);
}

ncclResult_t Runner::fail(ncclResult_t rc) {
  failTime_ = monotonicSeconds();
  failText_ = oneLine(ncclGetLastError(nullptr));
  return rc;
}

ncclResult_t Runner::run(const Op& op, std::vector<std::string>* wrong) {
  switch (op.kind) {
    case Kind::kAllReduce: return runAllReduce(op, wrong);
    case Kind::kAllGather: return runAllGather(op, wrong);
    case Kind::kReduceScatter: return runReduceScatter(op, wrong);
    case Kind::kBroadcast:
    case Kind::kReduce: return runRooted(op, wrong);
    case Kind::kAlltoAll: return runAlltoAll(op, wrong);
    case Kind::kSendRecvRing: return runSendRecv(op, wrong);
    case Kind::kTwoInGroup: return runTwoInGroup(op, wrong);
    case Kind::kSplit: return runSplit(op, wrong);
  }
  return ncclInternalError;
}

ncclResult_t Runner::runAllReduce(const Op& op, std::vector<std::string>* wrong) {
  void* out = recv_.data();
  void* in = op.inPlace ? out : send_.data();
  fill(op.type, in, op.count, rank_, op.salt);
  ncclResult_t rc = ncclAllReduce(in, out, op.count, op.type, op.red, comm_, nullptr);
  if (rc != ncclSuccess) return fail(rc);
  check(op, "result", out, op.count, [&](size_t i) { return reduceAt(op.red, all_, i, op.salt); }, wrong);
  return ncclSuccess;
}

ncclResult_t Runner::runAllGather(const Op& op, std::vector<std::string>* wrong) {
  const size_t c = op.count, es = typeSize(op.type);
  unsigned char* out = recv_.data();
  unsigned char* in = op.inPlace ? out + size_t(rank_) * c * es : send_.data();
  fill(op.type, in, c, rank_, op.salt);
  ncclResult_t rc = ncclAllGather(in, out, c, op.type, comm_, nullptr);
  if (rc != ncclSuccess) return fail(rc);
  check(op, "result", out, c * size_t(nranks_), [&](size_t j) { return double(valueAt(int(j / c), j % c, op.salt)); },
        wrong);
  return ncclSuccess;
}

ncclResult_t Runner::runReduceScatter(const Op& op, std::vector<std::string>* wrong) {
  const size_t c = op.count;
  fill(op.type, send_.data(), c * size_t(nranks_), rank_, op.salt);
  ncclResult_t rc = ncclReduceScatter(send_.data(), recv_.data(), c, op.type, op.red, comm_, nullptr);
  if (rc != ncclSuccess) return fail(rc);
  const size_t first = size_t(rank_) * c;
  check(op, "result", recv_.data(), c, [&](size_t i) { return reduceAt(op.red, all_, first + i, op.salt); }, wrong);
  return ncclSuccess;
}

// Broadcast and Reduce: the two kinds with a root.
ncclResult_t Runner::runRooted(const Op& op, std::vector<std::string>* wrong) {
  const bool isRoot = rank_ == op.root;
  ncclResult_t rc;
  if (op.kind == Kind::kBroadcast) {
    void* in = op.inPlace ? recv_.data() : send_.data();
    if (isRoot) fill(op.type, in, op.count, rank_, op.salt);
    rc = ncclBroadcast(in, recv_.data(), op.count, op.type, op.root, comm_, nullptr);
    if (rc != ncclSuccess) return fail(rc);
    check(op, "result", recv_.data(), op.count, [&](size_t i) { return double(valueAt(op.root, i, op.salt)); },
          wrong);
    return ncclSuccess;
  }
  fill(op.type, send_.data(), op.count, rank_, op.salt);
  rc = ncclReduce(send_.data(), recv_.data(), op.count, op.type, op.red, op.root, comm_, nullptr);
  if (rc != ncclSuccess) return fail(rc);
  if (isRoot) {
    check(op, "result", recv_.data(), op.count, [&](size_t i) { return reduceAt(op.red, all_, i, op.salt); }, wrong);
  }
  return ncclSuccess;
}

ncclResult_t Runner::runAlltoAll(const Op& op, std::vector<std::string>* wrong) {
  const size_t c = op.count;
  fill(op.type, send_.data(), c * size_t(nranks_), rank_, op.salt);  // block j goes to rank j
  ncclResult_t rc = ncclAlltoAll(send_.data(), recv_.data(), c, op.type, comm_, nullptr);
  if (rc != ncclSuccess) return fail(rc);
  // Block i came from rank i, which sent its elements [rank*c, rank*c + c).
  check(op, "result", recv_.data(), c * size_t(nranks_),
        [&](size_t j) { return double(valueAt(int(j / c), size_t(rank_) * c + j % c, op.salt)); }, wrong);
  return ncclSuccess;
}

ncclResult_t Runner::runSendRecv(const Op& op, std::vector<std::string>* wrong) {
  const int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  fill(op.type, send_.data(), op.count, rank_, op.salt);
  ncclGroupStart();
  ncclResult_t s = ncclSend(send_.data(), op.count, op.type, next, comm_, nullptr);
  ncclResult_t r = ncclRecv(recv_.data(), op.count, op.type, prev, comm_, nullptr);
  ncclResult_t e = ncclGroupEnd();
  for (ncclResult_t rc : {s, r, e})
    if (rc != ncclSuccess) return fail(rc);
  check(op, "received", recv_.data(), op.count, [&](size_t i) { return double(valueAt(prev, i, op.salt)); }, wrong);
  return ncclSuccess;
}

ncclResult_t Runner::runTwoInGroup(const Op& op, std::vector<std::string>* wrong) {
  const size_t c2 = op.count / size_t(nranks_);
  fill(op.type, send_.data(), op.count, rank_, op.salt);
  fill(op.type, send2_.data(), c2, rank_, op.salt + 1);
  ncclGroupStart();
  ncclResult_t a = ncclAllReduce(send_.data(), recv_.data(), op.count, op.type, op.red, comm_, nullptr);
  ncclResult_t g = ncclAllGather(send2_.data(), recv2_.data(), c2, op.type, comm_, nullptr);
  ncclResult_t e = ncclGroupEnd();
  for (ncclResult_t rc : {a, g, e})
    if (rc != ncclSuccess) return fail(rc);
  check(op, "AllReduce result", recv_.data(), op.count, [&](size_t i) { return reduceAt(op.red, all_, i, op.salt); },
        wrong);
  check(op, "AllGather result", recv2_.data(), c2 * size_t(nranks_),
        [&](size_t j) { return double(valueAt(int(j / c2), j % c2, op.salt + 1)); }, wrong);
  return ncclSuccess;
}

// Split by rank parity (key: the rank, so the child keeps the order), one
// AllReduce of at most 16K elements on the child, then finalize + destroy.
ncclResult_t Runner::runSplit(const Op& op, std::vector<std::string>* wrong) {
  ncclComm_t child = nullptr;
  ncclResult_t rc = ncclCommSplit(comm_, rank_ % 2, rank_, &child, nullptr);
  if (rc != ncclSuccess) {
    fail(rc);
    if (child) ncclCommAbort(child);
    return rc;
  }
  failedOnChild_ = true;  // until the child is gone
  const size_t n = std::min<size_t>(op.count, 16384);
  fill(op.type, send_.data(), n, rank_, op.salt);
  rc = ncclAllReduce(send_.data(), recv_.data(), n, op.type, op.red, child, nullptr);
  if (rc != ncclSuccess) {
    fail(rc);
    ncclCommAbort(child);
    return rc;
  }
  std::vector<int> same;
  for (int r = rank_ % 2; r < nranks_; r += 2) same.push_back(r);
  check(op, "child AllReduce result", recv_.data(), n, [&](size_t i) { return reduceAt(op.red, same, i, op.salt); },
        wrong);
  rc = ncclCommFinalize(child);
  if (rc != ncclSuccess) {
    fail(rc);
    ncclCommAbort(child);
    return rc;
  }
  rc = ncclCommDestroy(child);
  if (rc != ncclSuccess) return fail(rc);
  failedOnChild_ = false;
  return ncclSuccess;
}

}  // namespace loom::chaos
