#include "tools/perf/verifiable.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace loom::perf {
namespace {

// splitmix64's finaliser: a cheap, well-mixed 64-bit hash.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t elementHash(uint64_t seed, uint64_t index) {
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (index * 0xd1b54a32d192ed03ull));
}

uint64_t rankHash(uint64_t elementHashValue, int rank) {
  return mix64(elementHashValue ^ ((uint64_t(rank) + 1) * 0xd6e8feb86659fd93ull));
}

// Uniform in [0, range) from 64 random bits (range > 0).
uint64_t uniform(uint64_t random, uint64_t range) {
  return uint64_t((unsigned __int128)random * range >> 64);
}

// Uniform in [-limit, limit].
int64_t uniformSigned(uint64_t random, uint64_t limit) {
  return int64_t(uniform(random, 2 * limit + 1) - limit);
}

uint64_t widthMask(const TypeInfo& type) {
  return type.size == 8 ? ~uint64_t(0) : (uint64_t(1) << type.bits()) - 1;
}

int precision(const TypeInfo& type) { return type.layout.mantissaBits + 1; }

// Scale exponents for sum-like values: units up to 2^precision times 2^E
// must stay finite, and 2^E itself normal. Kept within +-24 for readability.
int scaleLow(const TypeInfo& type) { return std::max(type.layout.minExponent(), -24); }
int scaleHigh(const TypeInfo& type) {
  return std::max(scaleLow(type), std::min(type.layout.maxExponent() - precision(type), 24));
}

uint64_t floatBits(const TypeInfo& type, double value) { return encodeFloat(value, type.layout); }

// Everything one element needs, derived from its hash: which ranks are
// active (a rotation of `active` ranks starting at `offset`), the scale and
// the per-rank budget.
struct Plan {
  uint64_t hash;
  int offset;
  int active;
  int scaleExp;
  uint64_t quota;  // largest weighted magnitude an active rank may give
  bool negative;   // shared sign (float averages)
};

bool isActive(const Plan& plan, int rank, int nranks) {
  return (rank - plan.offset + nranks) % nranks < plan.active;
}

enum class Family { kSumUnits, kAvgFloat, kModular, kProd, kSelect, kCopy };

Family familyOf(const TypeInfo& type, Op op) {
  bool unsignedType = type.kind == TypeKind::kUnsigned;
  switch (op) {
    case Op::kSum:
    case Op::kMulSum: return unsignedType ? Family::kModular : Family::kSumUnits;
    case Op::kAvg: return type.isFloat() ? Family::kAvgFloat : Family::kSumUnits;
    case Op::kProd: return unsignedType ? Family::kModular : Family::kProd;
    case Op::kMax:
    case Op::kMin: return Family::kSelect;
    case Op::kNone: return Family::kCopy;
  }
  return Family::kCopy;
}

// Largest total magnitude of units whose partial sums stay exact. Integer
// units stay below 2^(bits-1) for unsigned averages too, so totals fit int64.
uint64_t unitBudget(const TypeInfo& type) {
  if (type.isFloat()) return uint64_t(1) << precision(type);
  return widthMask(type) >> 1;
}

Plan makePlan(const GenSpec& spec, uint64_t index) {
  const TypeInfo& type = *spec.type;
  Plan plan{};
  plan.hash = elementHash(spec.seed, index);
  uint64_t h = mix64(plan.hash + 1);
  plan.offset = int(uniform(h, uint64_t(spec.nranks)));
  h = mix64(h);
  plan.negative = h & 1;
  h = mix64(h);
  Family family = familyOf(type, spec.op);
  if (family == Family::kAvgFloat) {
    plan.active = std::min(spec.nranks, 2);
    // Keep (a + b) / n a normal number: raise the lowest scale by log2(n).
    int low = std::min(scaleLow(type) + int(std::bit_width(unsigned(spec.nranks))), scaleHigh(type));
    plan.scaleExp = low + int(uniform(h, uint64_t(scaleHigh(type) - low + 1)));
    plan.quota = uint64_t(1) << (precision(type) - 1);
    return plan;
  }
  uint64_t budget = unitBudget(type);
  plan.active = int(std::min<uint64_t>(uint64_t(spec.nranks), budget));
  plan.quota = budget / uint64_t(plan.active);
  if (type.isFloat()) plan.scaleExp = scaleLow(type) + int(uniform(h, uint64_t(scaleHigh(type) - scaleLow(type) + 1)));
  return plan;
}

int weightOf(const GenSpec& spec, int rank) { return spec.op == Op::kMulSum ? preMulScalar(rank) : 1; }

// Units of an active rank for kSumUnits (signed result, |weight * units| <= quota).
int64_t sumUnits(const GenSpec& spec, const Plan& plan, int rank) {
  uint64_t limit = plan.quota / uint64_t(weightOf(spec, rank));
  uint64_t random = rankHash(plan.hash, rank);
  if (spec.op == Op::kAvg) return int64_t(uniform(random, limit + 1));  // non-negative
  return uniformSigned(random, limit);
}

// Magnitude in [1, quota] for float averages.
int64_t avgUnits(const Plan& plan, int rank) {
  int64_t units = int64_t(1 + uniform(rankHash(plan.hash, rank), plan.quota));
  return plan.negative ? -units : units;
}

// A finite, normal, non-zero value (floats) or any value (integers).
uint64_t plainBits(const TypeInfo& type, uint64_t random) {
  if (!type.isFloat()) return random & widthMask(type);
  int p = precision(type);
  int low = type.layout.minExponent();
  int high = std::max(low, type.layout.maxExponent() - p);
  double units = double(1 + uniform(random, (uint64_t(1) << p) - 1));
  int exponent = low + int(uniform(mix64(random), uint64_t(high - low + 1)));
  double value = std::ldexp(units, exponent);
  return floatBits(type, (mix64(random + 1) & 1) ? -value : value);
}

// Signed-integer and float product inputs: rank plan.offset carries a random
// mantissa, the others +-2^k with sum of k bounded.
struct ProdLimits {
  int carrierBits;  // integers: |carrier| < 2^carrierBits
  int totalShift;   // bound on the sum of the k's
};

ProdLimits prodLimits(const TypeInfo& type) {
  if (type.isFloat()) return {0, std::min(type.layout.maxExponent() - 1, 30)};
  int magnitudeBits = type.bits() - 1;
  int carrier = magnitudeBits / 2;
  return {carrier, magnitudeBits - carrier - 1};
}

uint64_t prodInput(const GenSpec& spec, const Plan& plan, int rank) {
  const TypeInfo& type = *spec.type;
  uint64_t random = rankHash(plan.hash, rank);
  bool negative = random >> 63;
  ProdLimits limits = prodLimits(type);
  if (rank == plan.offset) {
    if (type.isFloat()) {
      int m = type.layout.mantissaBits;
      double mantissa = std::ldexp(double((uint64_t(1) << m) | uniform(random, uint64_t(1) << m)), -m);
      return floatBits(type, negative ? -mantissa : mantissa);
    }
    int64_t carrier = int64_t(1 + uniform(random, (uint64_t(1) << limits.carrierBits) - 1));
    return uint64_t(negative ? -carrier : carrier) & widthMask(type);
  }
  int others = std::max(spec.nranks - 1, 1);
  int shift = int(uniform(mix64(random), uint64_t(limits.totalShift / others + 1)));
  if (type.isFloat()) return floatBits(type, negative ? -std::ldexp(1.0, shift) : std::ldexp(1.0, shift));
  int64_t value = int64_t(1) << shift;
  return uint64_t(negative ? -value : value) & widthMask(type);
}

int64_t signExtend(const TypeInfo& type, uint64_t bits) {
  if (type.size == 8) return int64_t(bits);
  int shift = 64 - type.bits();
  return int64_t(bits << shift) >> shift;
}

uint64_t inputBits(const GenSpec& spec, const Plan& plan, int rank, uint64_t index) {
  const TypeInfo& type = *spec.type;
  switch (familyOf(type, spec.op)) {
    case Family::kSumUnits: {
      if (!isActive(plan, rank, spec.nranks)) return 0;
      int64_t units = sumUnits(spec, plan, rank);
      if (type.isFloat()) return floatBits(type, std::ldexp(double(units), plan.scaleExp));
      return uint64_t(units) & widthMask(type);
    }
    case Family::kAvgFloat:
      if (!isActive(plan, rank, spec.nranks)) return 0;
      return floatBits(type, std::ldexp(double(avgUnits(plan, rank)), plan.scaleExp));
    case Family::kModular: {
      uint64_t random = rankHash(plan.hash, rank) & widthMask(type);
      return spec.op == Op::kProd ? (random | 1) : random;
    }
    case Family::kProd: return prodInput(spec, plan, rank);
    case Family::kSelect: return plainBits(type, rankHash(plan.hash, rank));
    case Family::kCopy: return plainBits(type, elementHash(spec.seed, index));
  }
  return 0;
}

// Order used by min and max.
bool lessThan(const TypeInfo& type, uint64_t a, uint64_t b) {
  switch (type.kind) {
    case TypeKind::kFloat: return decodeFloat(a, type.layout) < decodeFloat(b, type.layout);
    case TypeKind::kSigned: return signExtend(type, a) < signExtend(type, b);
    case TypeKind::kUnsigned: return a < b;
  }
  return false;
}

uint64_t expectedSumUnits(const GenSpec& spec, const Plan& plan) {
  const TypeInfo& type = *spec.type;
  int64_t total = 0;  // within the budget, so it cannot overflow
  for (int j = 0; j < plan.active; ++j) {
    int rank = (plan.offset + j) % spec.nranks;
    total += int64_t(weightOf(spec, rank)) * sumUnits(spec, plan, rank);
  }
  if (spec.op == Op::kAvg) total /= spec.nranks;  // non-negative: truncation is floor
  if (type.isFloat()) return floatBits(type, std::ldexp(double(total), plan.scaleExp));
  return uint64_t(total) & widthMask(type);
}

uint64_t expectedAvgFloat(const GenSpec& spec, const Plan& plan) {
  int64_t total = 0;
  for (int j = 0; j < plan.active; ++j) total += avgUnits(plan, (plan.offset + j) % spec.nranks);
  // |total| <= 2^precision and n is small: long double rounds the quotient
  // once to 64 bits, so at most one more (rare) rounding reaches the type.
  long double quotient = std::ldexp((long double)total / (long double)spec.nranks, plan.scaleExp);
  return floatBits(*spec.type, double(quotient));
}

uint64_t expectedModular(const GenSpec& spec, const Plan& plan) {
  const TypeInfo& type = *spec.type;
  uint64_t acc = spec.op == Op::kProd ? 1 : 0;
  for (int rank = 0; rank < spec.nranks; ++rank) {
    uint64_t x = inputBits(spec, plan, rank, 0);
    if (spec.op == Op::kProd) {
      acc *= x;
    } else {
      acc += x * uint64_t(weightOf(spec, rank));
    }
  }
  return acc & widthMask(type);
}

uint64_t expectedProd(const GenSpec& spec, const Plan& plan) {
  const TypeInfo& type = *spec.type;
  if (type.isFloat()) {
    double product = 1.0;  // exact: a mantissa times powers of two
    for (int rank = 0; rank < spec.nranks; ++rank) product *= decodeFloat(prodInput(spec, plan, rank), type.layout);
    return floatBits(type, product);
  }
  int64_t product = 1;  // bounded by prodLimits, cannot overflow
  for (int rank = 0; rank < spec.nranks; ++rank) product *= signExtend(type, prodInput(spec, plan, rank));
  return uint64_t(product) & widthMask(type);
}

uint64_t expectedBits(const GenSpec& spec, const Plan& plan, uint64_t index) {
  const TypeInfo& type = *spec.type;
  switch (familyOf(type, spec.op)) {
    case Family::kSumUnits: return expectedSumUnits(spec, plan);
    case Family::kAvgFloat: return expectedAvgFloat(spec, plan);
    case Family::kModular: return expectedModular(spec, plan);
    case Family::kProd: return expectedProd(spec, plan);
    case Family::kSelect: {
      uint64_t best = inputBits(spec, plan, 0, index);
      for (int rank = 1; rank < spec.nranks; ++rank) {
        uint64_t x = inputBits(spec, plan, rank, index);
        bool better = spec.op == Op::kMin ? lessThan(type, x, best) : lessThan(type, best, x);
        if (better) best = x;
      }
      return best;
    }
    case Family::kCopy: return inputBits(spec, plan, 0, index);
  }
  return 0;
}

}  // namespace

uint64_t loadElement(const TypeInfo& type, const void* base, size_t index) {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(base) + index * type.size, type.size);
  return bits;
}

void storeElement(const TypeInfo& type, void* base, size_t index, uint64_t bits) {
  std::memcpy(static_cast<char*>(base) + index * type.size, &bits, type.size);
}

void generateInput(const GenSpec& spec, int rank, uint64_t firstIndex, size_t count, void* out) {
  for (size_t i = 0; i < count; ++i) {
    uint64_t index = firstIndex + i;
    Plan plan = makePlan(spec, index);
    storeElement(*spec.type, out, i, inputBits(spec, plan, rank, index));
  }
}

void generateExpected(const GenSpec& spec, uint64_t firstIndex, size_t count, void* out) {
  for (size_t i = 0; i < count; ++i) {
    uint64_t index = firstIndex + i;
    Plan plan = makePlan(spec, index);
    storeElement(*spec.type, out, i, expectedBits(spec, plan, index));
  }
}

uint64_t ulpDistance(const TypeInfo& type, uint64_t a, uint64_t b) {
  int bits = type.bits();
  uint64_t signBit = uint64_t(1) << (bits - 1);
  auto ordered = [&](uint64_t x) -> __int128 {
    __int128 magnitude = __int128(x & (signBit - 1));
    return (x & signBit) ? -magnitude : magnitude;
  };
  __int128 diff = ordered(a) - ordered(b);
  return uint64_t(diff < 0 ? -diff : diff);
}

int64_t countMismatches(const TypeInfo& type, Op op, const void* actual, const void* expected, size_t count) {
  bool tolerant = type.isFloat() && op == Op::kAvg;
  if (!tolerant && std::memcmp(actual, expected, count * type.size) == 0) return 0;
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t a = loadElement(type, actual, i);
    uint64_t e = loadElement(type, expected, i);
    if (a == e) continue;
    bool close = tolerant && !isNanBits(a, type.layout) && !isNanBits(e, type.layout) &&
                 ulpDistance(type, a, e) <= uint64_t(kAvgToleranceUlps);
    if (!close) ++wrong;
  }
  return wrong;
}

}  // namespace loom::perf
