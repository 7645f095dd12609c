// Independent scalar reference for the reduction kernels tests.
//
// Nothing here uses kernels/types.h or kernels/ops.h: narrow formats are
// decoded by hand from their bit fields into double and rounded with
// frexp/ldexp/nearbyint; native types are computed in a wider type
// (__float128 or unsigned __int128) and then rounded/wrapped once.
//
// Why double is an exact-enough stand-in for the narrow formats: every value
// of half, bfloat16 and fp8 is a double; products of two of them are exact in
// double; and for +, / double's 53-bit significand exceeds 2p+2 for every
// narrow format (p <= 11 for half, 8 for bfloat16), so rounding to double and
// then to the format gives the correctly rounded result.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/datatype.h"

namespace loom::kernels::ref {

#if defined(__SIZEOF_FLOAT128__)
using Wide = __float128;  // 113-bit significand: > 2*53+2, so exact enough for double
#else
using Wide = long double;  // fallback; only as good as the platform's long double
#endif

struct FormatSpec {
  int expBits;
  int manBits;
  bool hasInf;     // IEEE-like (true) or OCP "fn" with S.1..1.1..1 = NaN (false)
  bool satFinite;  // what the reductions narrow with (fp8: true, NVIDIA's SATFINITE)
};
inline constexpr FormatSpec kHalfSpec{5, 10, true, false};
inline constexpr FormatSpec kBf16Spec{8, 7, true, false};
inline constexpr FormatSpec kE4m3Spec{4, 3, false, true};
inline constexpr FormatSpec kE5m2Spec{5, 2, true, true};

inline int bias(const FormatSpec& f) { return (1 << (f.expBits - 1)) - 1; }
inline int minExp(const FormatSpec& f) { return 1 - bias(f); }

inline double maxFinite(const FormatSpec& f) {
  const int expAll = (1 << f.expBits) - 1;
  if (f.hasInf) {
    // exponent field expAll-1, mantissa all ones
    return std::ldexp(double((2 << f.manBits) - 1), expAll - 1 - bias(f) - f.manBits);
  }
  // exponent field expAll, mantissa all ones minus one (all ones is NaN)
  return std::ldexp(double((2 << f.manBits) - 2), expAll - bias(f) - f.manBits);
}

// Bit fields -> value. NaN for every NaN encoding.
inline double decode(uint32_t bits, const FormatSpec& f) {
  const uint32_t manMask = (1u << f.manBits) - 1;
  const uint32_t expAll = (1u << f.expBits) - 1;
  const bool negative = (bits >> (f.expBits + f.manBits)) & 1u;
  const uint32_t exp = (bits >> f.manBits) & expAll;
  const uint32_t man = bits & manMask;
  double v;
  if (f.hasInf && exp == expAll) {
    v = man == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.hasInf && exp == expAll && man == manMask) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(double(man), minExp(f) - f.manBits);
  } else {
    v = std::ldexp(double(man + (1u << f.manBits)), int(exp) - bias(f) - f.manBits);
  }
  return negative ? -v : v;
}

// Round an exact (or innocuously pre-rounded) value to the format, nearest
// even. Overflow: satFinite -> +-max, else +-inf (NaN where there is no inf).
inline double round(double v, const FormatSpec& f, bool satFinite) {
  if (std::isnan(v)) return v;
  const double maxv = maxFinite(f);
  const double overflow =
      satFinite ? maxv : (f.hasInf ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN());
  if (std::isinf(v)) return std::copysign(overflow, v);
  if (v == 0) return v;
  int e;
  std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1): leading bit weight 2^(e-1)
  const int quantum = std::max(e - 1, minExp(f)) - f.manBits;
  const double n = std::nearbyint(std::ldexp(std::fabs(v), -quantum));  // FE_TONEAREST: ties to even
  const double r = std::ldexp(n, quantum);
  if (r > maxv) return std::copysign(overflow, v);
  return std::copysign(r, v);
}

// True when the element at p (of type `type`) is a NaN pattern.
inline bool isNanPattern(DataType type, const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  switch (type) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, b, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, b, 8);
      return std::isnan(d);
    }
    case DataType::kFloat16: return std::isnan(decode(uint32_t(b[0] | (b[1] << 8)), kHalfSpec));
    case DataType::kBfloat16: return std::isnan(decode(uint32_t(b[0] | (b[1] << 8)), kBf16Spec));
    case DataType::kFloat8e4m3: return std::isnan(decode(b[0], kE4m3Spec));
    case DataType::kFloat8e5m2: return std::isnan(decode(b[0], kE5m2Spec));
    default: return false;
  }
}

// Same value: both NaN, or equal including the sign of zero.
inline bool same(double expected, double actual) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  return expected == actual && std::signbit(expected) == std::signbit(actual);
}

// maximumNumber / minimumNumber written out case by case.
template <typename F>
F maxRule(F a, F b) {
  if (std::isnan(a) && std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == 0 && b == 0) return (std::signbit(a) && std::signbit(b)) ? a : F(0);
  return a > b ? a : b;
}
template <typename F>
F minRule(F a, F b) {
  if (std::isnan(a) && std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == 0 && b == 0) return (std::signbit(a) || std::signbit(b)) ? F(-0.0) : F(0);
  return a < b ? a : b;
}

// ---- per element type reference ------------------------------------------
//
// Ref<T>::V is the reference's value domain (double for narrow floats, T
// otherwise); combine/pre/post round to T's value set after every step.

// Narrow float types: T is the loom struct, handled as raw bits only.
template <typename T, const FormatSpec& kSpec>
struct NarrowRef {
  using V = double;
  using Bits = std::conditional_t<sizeof(T) == 1, uint8_t, uint16_t>;
  static constexpr const FormatSpec& spec = kSpec;

  static Bits bitsOf(T x) {
    Bits b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  }
  static T fromBits(uint32_t b) {
    const Bits narrow = Bits(b);
    T x;
    std::memcpy(&x, &narrow, sizeof(x));
    return x;
  }
  static V value(T x) { return decode(bitsOf(x), kSpec); }
  static V narrow(double v) { return round(v, kSpec, kSpec.satFinite); }
  static V combine(RedOp op, V a, V b) {
    switch (op) {
      case RedOp::kProd: return narrow(a * b);
      case RedOp::kMax: return narrow(maxRule(a, b));
      case RedOp::kMin: return narrow(minRule(a, b));
      default: return narrow(a + b);  // sum, premulsum, sumpostdiv
    }
  }
  static V pre(V x, V scalar) { return narrow(x * scalar); }
  static V post(V x, uint64_t d) { return narrow(x / double(d)); }
  static bool matches(V expected, T actual) { return same(expected, value(actual)); }
  static T random(std::mt19937_64& rng) { return fromBits(uint32_t(rng())); }
};

template <typename T>
struct NativeFloatRef {
  using V = T;
  static V value(T x) { return x; }
  static V combine(RedOp op, V a, V b) {
    switch (op) {
      case RedOp::kProd: return T(Wide(a) * Wide(b));
      case RedOp::kMax: return maxRule(a, b);
      case RedOp::kMin: return minRule(a, b);
      default: return T(Wide(a) + Wide(b));
    }
  }
  static V pre(V x, V scalar) { return T(Wide(x) * Wide(scalar)); }
  static V post(V x, uint64_t d) { return T(Wide(x) / Wide(d)); }
  static bool matches(V expected, T actual) { return same(double(expected), double(actual)); }
  static T random(std::mt19937_64& rng) {
    // Half raw bit patterns (every class: NaN, inf, subnormal, huge), half
    // ordinary magnitudes so sums and products do real rounding.
    if (rng() & 1) {
      using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
      const U u = U(rng());
      T x;
      std::memcpy(&x, &u, sizeof(x));
      return x;
    }
    std::uniform_real_distribution<double> mag(-1000.0, 1000.0);
    return T(mag(rng));
  }
};

using U128 = unsigned __int128;

template <typename T>
struct IntRef {
  using V = T;
  using U = std::make_unsigned_t<T>;
  // Keep the low n bits of an exact (wide) result, reinterpreted as T.
  static T wrap(U128 x) {
    const U low = U(x);
    T t;
    std::memcpy(&t, &low, sizeof(t));
    return t;
  }
  static U128 pattern(T x) { return U128(U(x)); }
  static V value(T x) { return x; }
  static V combine(RedOp op, V a, V b) {
    switch (op) {
      case RedOp::kProd: return wrap(pattern(a) * pattern(b));
      case RedOp::kMax: return a > b ? a : b;
      case RedOp::kMin: return a < b ? a : b;
      default: return wrap(pattern(a) + pattern(b));
    }
  }
  static V pre(V x, V scalar) { return wrap(pattern(x) * pattern(scalar)); }
  static V post(V x, uint64_t d) {
    // C division truncates toward zero.
    return T(__int128(x) / __int128(d));
  }
  static bool matches(V expected, T actual) { return expected == actual; }
  static T random(std::mt19937_64& rng) {
    if (rng() % 4 == 0) return T(int(rng() % 7) - 3);  // small values, incl. 0 and negatives
    return wrap(rng());
  }
};

// The same thing expressed through the RedOp the kernels take: the full
// chain partials[0] (+) ... (+) pre(local), then post.
template <typename R>
typename R::V chain(RedOp op, const std::vector<typename R::V>& partials, const typename R::V* local,
                    typename R::V scalar, uint64_t divisor, bool applyPost) {
  typename R::V acc{};
  bool have = false;
  for (const auto& p : partials) {
    acc = have ? R::combine(op, acc, p) : p;
    have = true;
  }
  if (local != nullptr) {
    const typename R::V l = op == RedOp::kPreMulSum ? R::pre(*local, scalar) : *local;
    acc = have ? R::combine(op, acc, l) : l;
  }
  if (applyPost && op == RedOp::kSumPostDiv) acc = R::post(acc, divisor);
  return acc;
}

}  // namespace loom::kernels::ref
