#include "reduce_ref.h"

#include <cmath>
#include <limits>

#include "dtype_ref.h"
#include "mp_util.h"

namespace loom::test {
namespace {

bool isPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

uint64_t floatInput(ncclDataType_t type, Red red, int n, uint64_t h) {
  const double maxExact = maxExactInteger(type);
  const double k = std::min(std::floor(maxExact / n), 1e6);
  switch (red) {
    case Red::kSum:
    case Red::kPreMulHost:
    case Red::kPreMulDevice:
      return encodeFloat(type, double(int64_t(h % uint64_t(2 * k + 1)) - int64_t(k)));
    case Red::kAvg:
      return encodeFloat(type, double(h % uint64_t(k + 1)));  // power-of-two nranks; see avgSparseInput
    case Red::kProd: {
      static const double kMag[8] = {1, 1, 2, 0.5, 1, 2, 0.5, 1};
      double v = kMag[h & 7];
      return encodeFloat(type, (h >> 3) & 1 ? -v : v);
    }
    case Red::kMax:
    case Red::kMin:
    case Red::kNone:
    default: {
      const size_t size = typeInfo(type).size;
      uint64_t bits = maskBits(h, size);
      if (red == Red::kNone) return bits;
      for (uint64_t salt = 1; !isFiniteBits(type, bits); ++salt) bits = maskBits(mix64(h + salt), size);
      return bits;
    }
  }
}

uint64_t intInput(ncclDataType_t type, Red red, int n, uint64_t h) {
  const TypeInfo& t = typeInfo(type);
  switch (red) {
    case Red::kProd:
      return maskBits((h & 15) == 0 ? h >> 8 : (h >> 8) | 1, t.size);  // mostly odd: products stay nonzero
    case Red::kAvg: {
      const int bits = int(t.size * 8) - (t.isSigned ? 1 : 0);
      const uint64_t maxVal = bits >= 41 ? uint64_t(1) << 40 : (uint64_t(1) << bits) - 1;
      const uint64_t k = maxVal / uint64_t(n);
      if (!t.isSigned) return maskBits(h % (k + 1), t.size);
      return maskBits(uint64_t(int64_t(h % (2 * k + 1)) - int64_t(k)), t.size);
    }
    default:
      return maskBits(h, t.size);
  }
}

// Floating avg on a rank count that is not a power of two: at most two
// ranks per element hold a nonzero value, +-2^k with k in [0, 4], chosen
// from the element index alone so that all ranks agree. Products with the
// rounded 1/n are then exact and the sum rounds once.
uint64_t avgSparseInput(ncclDataType_t type, int n, uint64_t seed, int rank, size_t index) {
  const uint64_t h = hash3(seed, 0x5eed, index);
  const int a = int(h % uint64_t(n)), b = int((h >> 16) % uint64_t(n));
  if (rank != a && rank != b) return encodeFloat(type, 0.0);
  const uint64_t bits = rank == a ? h >> 32 : h >> 40;
  const double v = std::ldexp(1.0, int(bits % 5));
  return encodeFloat(type, (bits >> 3) & 1 ? -v : v);
}

}  // namespace

const char* redName(Red red) {
  switch (red) {
    case Red::kSum: return "sum";
    case Red::kProd: return "prod";
    case Red::kMax: return "max";
    case Red::kMin: return "min";
    case Red::kAvg: return "avg";
    case Red::kPreMulHost: return "premulsum(host scalar)";
    case Red::kPreMulDevice: return "premulsum(device scalar)";
    case Red::kNone: return "none";
  }
  return "?";
}

bool isPreMul(Red red) { return red == Red::kPreMulHost || red == Red::kPreMulDevice; }

uint64_t inputBits(ncclDataType_t type, Red red, int nranks, uint64_t seed, int rank, size_t index) {
  const uint64_t h = hash3(seed, uint64_t(rank), index);
  if (red == Red::kAvg && typeInfo(type).isFloat && !isPow2(nranks))
    return avgSparseInput(type, nranks, seed, rank, index);
  return typeInfo(type).isFloat ? floatInput(type, red, nranks, h) : intInput(type, red, nranks, h);
}

uint64_t preMulScalarBits(ncclDataType_t type, Red red) {
  const bool host = red == Red::kPreMulHost;
  if (typeInfo(type).isFloat) return encodeFloat(type, host ? -2.0 : 0.5);
  return maskBits(host ? 3 : 5, typeInfo(type).size);
}

Reducer::Reducer(ncclDataType_t type, Red red, int nranks)
    : type_(type),
      red_(red),
      n_(nranks),
      isFloat_(typeInfo(type).isFloat),
      isSigned_(typeInfo(type).isSigned),
      tolerant_(red == Red::kAvg && typeInfo(type).isFloat && !isPow2(nranks)),
      size_(typeInfo(type).size),
      table_(decodeTable(type)) {
  if (isPreMul(red)) {
    scalarBits_ = preMulScalarBits(type, red);
    if (isFloat_) scalar_ = decodeFloat(type, scalarBits_);
  }
}

double Reducer::decode(uint64_t bits) const { return table_ ? table_[bits] : decodeFloat(type_, bits); }

Expected Reducer::operator()(const uint64_t* in) const { return isFloat_ ? floatReduce(in) : intReduce(in); }

Expected Reducer::intReduce(const uint64_t* in) const {
  Expected e;
  uint64_t acc = 0;
  switch (red_) {
    case Red::kSum:
      for (int r = 0; r < n_; ++r) acc += in[r];
      break;
    case Red::kProd:
      acc = 1;
      for (int r = 0; r < n_; ++r) acc *= in[r];
      break;
    case Red::kPreMulHost:
    case Red::kPreMulDevice:
      for (int r = 0; r < n_; ++r) acc += scalarBits_ * in[r];
      break;
    case Red::kMax:
    case Red::kMin: {
      acc = in[0];
      for (int r = 1; r < n_; ++r) {
        const bool greater = isSigned_ ? signedValue(type_, in[r]) > signedValue(type_, acc) : in[r] > acc;
        const bool less = isSigned_ ? signedValue(type_, in[r]) < signedValue(type_, acc) : in[r] < acc;
        if ((red_ == Red::kMax && greater) || (red_ == Red::kMin && less)) acc = in[r];
      }
      break;
    }
    case Red::kAvg: {
      if (isSigned_) {
        int64_t sum = 0;
        for (int r = 0; r < n_; ++r) sum += signedValue(type_, in[r]);
        acc = uint64_t(sum / n_);  // C truncation toward zero
      } else {
        for (int r = 0; r < n_; ++r) acc += in[r];
        acc /= uint64_t(n_);
      }
      break;
    }
    default:
      e.designError = true;
  }
  e.bits = maskBits(acc, size_);
  return e;
}

Expected Reducer::floatReduce(const uint64_t* in) const {
  Expected e;
  double acc = 0;
  switch (red_) {
    case Red::kSum:
      // Start from the first term, not +0: a sum of -0 terms is -0.
      acc = decode(in[0]);
      for (int r = 1; r < n_; ++r) acc += decode(in[r]);
      break;
    case Red::kProd:
      acc = 1;
      for (int r = 0; r < n_; ++r) acc *= decode(in[r]);
      break;
    case Red::kPreMulHost:
    case Red::kPreMulDevice:
      acc = scalar_ * decode(in[0]);  // -2 * 0 is -0, and a sum of -0 terms stays -0
      for (int r = 1; r < n_; ++r) acc += scalar_ * decode(in[r]);
      break;
    case Red::kMax:
    case Red::kMin: {
      uint64_t best = in[0];
      double bestV = decode(best);
      for (int r = 1; r < n_; ++r) {
        const double a = decode(in[r]);
        bool take = red_ == Red::kMax ? a > bestV : a < bestV;
        if (a == bestV && a == 0) take = red_ == Red::kMax ? !std::signbit(a) : std::signbit(a);  // +0 > -0
        if (take) {
          best = in[r];
          bestV = a;
        }
      }
      e.bits = best;
      return e;
    }
    case Red::kAvg:
      acc = decode(in[0]);
      for (int r = 1; r < n_; ++r) acc += decode(in[r]);
      acc /= n_;
      if (tolerant_) {
        e.tolerant = true;
        e.exact = acc;
      }
      break;
    default:
      e.designError = true;
      return e;
  }
  bool exact = true;
  e.bits = encodeFloat(type_, acc, &exact);
  if (!exact && !e.tolerant) e.designError = true;
  return e;
}

Expected reduceRef(ncclDataType_t type, Red red, int nranks, const uint64_t* in) {
  return Reducer(type, red, nranks)(in);
}

bool acceptable(ncclDataType_t type, const Expected& e, uint64_t actual) {
  actual = maskBits(actual, typeInfo(type).size);
  if (actual == e.bits) return true;
  if (!e.tolerant) return false;
  const double v = decodeFloat(type, actual);
  return std::isfinite(v) && std::fabs(v - e.exact) <= kAvgToleranceUlp * ulpAt(type, e.exact);
}

}  // namespace loom::test
