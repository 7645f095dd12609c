#include "tools/perf/float_codec.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace loom::perf {

int SmallFloatLayout::maxExponent() const {
  int allOnes = (1 << exponentBits) - 1;
  // IEEE formats reserve the all-ones exponent; e4m3 only reserves one code.
  return (ieeeSpecials ? allOnes - 1 : allOnes) - bias();
}

double SmallFloatLayout::maxFinite() const {
  // Largest mantissa: all ones, or all ones but the last bit when that
  // pattern is the NaN code (e4m3).
  double topMantissa = ieeeSpecials ? 2.0 - std::ldexp(1.0, -mantissaBits)
                                    : 2.0 - std::ldexp(1.0, 1 - mantissaBits);
  return std::ldexp(topMantissa, maxExponent());
}

namespace {

uint64_t nanBits(const SmallFloatLayout& layout) {
  uint64_t expOnes = (uint64_t(1) << layout.exponentBits) - 1;
  if (layout.ieeeSpecials) {
    // Quiet NaN: all-ones exponent, top mantissa bit set.
    return (expOnes << layout.mantissaBits) | (uint64_t(1) << (layout.mantissaBits - 1));
  }
  return (expOnes << layout.mantissaBits) | ((uint64_t(1) << layout.mantissaBits) - 1);
}

uint64_t overflowBits(const SmallFloatLayout& layout, uint64_t signBit) {
  if (!layout.ieeeSpecials) return signBit | nanBits(layout);
  uint64_t expOnes = (uint64_t(1) << layout.exponentBits) - 1;
  return signBit | (expOnes << layout.mantissaBits);
}

}  // namespace

uint64_t encodeFloat(double value, const SmallFloatLayout& layout) {
  // float and double: the hardware conversion already rounds to nearest
  // even, overflows to infinity and keeps subnormals (the tools never set
  // flush-to-zero), and is far cheaper than the portable path.
  if (layout.ieeeSpecials && layout.exponentBits == 11 && layout.mantissaBits == 52) {
    return std::isnan(value) ? nanBits(layout) : std::bit_cast<uint64_t>(value);
  }
  if (layout.ieeeSpecials && layout.exponentBits == 8 && layout.mantissaBits == 23) {
    return std::isnan(value) ? nanBits(layout) : std::bit_cast<uint32_t>(float(value));
  }
  return encodeFloatPortable(value, layout);
}

uint64_t encodeFloatPortable(double value, const SmallFloatLayout& layout) {
  const int m = layout.mantissaBits;
  const uint64_t signBit = std::signbit(value) ? uint64_t(1) << (layout.exponentBits + m) : 0;
  if (std::isnan(value)) return nanBits(layout);
  double a = std::fabs(value);
  if (std::isinf(a)) return overflowBits(layout, signBit);
  if (a == 0.0) return signBit;

  // Quantum of the binade that holds `a` (or of the subnormal range).
  int e = std::ilogb(a);
  int quantumExp = (e < layout.minExponent() ? layout.minExponent() : e) - m;
  // a / 2^quantumExp is exact in double; nearbyint rounds ties to even under
  // the default rounding mode.
  double units = std::nearbyint(std::ldexp(a, -quantumExp));
  double rounded = std::ldexp(units, quantumExp);
  if (rounded > layout.maxFinite()) return overflowBits(layout, signBit);
  if (units == 0.0) return signBit;

  int re = std::ilogb(rounded);
  if (re < layout.minExponent()) {
    // Subnormal: the mantissa field holds the units directly.
    return signBit | uint64_t(units);
  }
  uint64_t mantissa = uint64_t(std::ldexp(rounded, m - re)) - (uint64_t(1) << m);
  uint64_t exponent = uint64_t(re + layout.bias());
  return signBit | (exponent << m) | mantissa;
}

bool isNanBits(uint64_t bits, const SmallFloatLayout& layout) {
  const int m = layout.mantissaBits;
  uint64_t expOnes = (uint64_t(1) << layout.exponentBits) - 1;
  uint64_t exponent = (bits >> m) & expOnes;
  uint64_t mantissa = bits & ((uint64_t(1) << m) - 1);
  if (layout.ieeeSpecials) return exponent == expOnes && mantissa != 0;
  return exponent == expOnes && mantissa == (uint64_t(1) << m) - 1;
}

double decodeFloat(uint64_t bits, const SmallFloatLayout& layout) {
  const int m = layout.mantissaBits;
  uint64_t expOnes = (uint64_t(1) << layout.exponentBits) - 1;
  bool negative = (bits >> (layout.exponentBits + m)) & 1;
  uint64_t exponent = (bits >> m) & expOnes;
  uint64_t mantissa = bits & ((uint64_t(1) << m) - 1);
  double magnitude;
  if (isNanBits(bits, layout)) {
    magnitude = std::nan("");
  } else if (layout.ieeeSpecials && exponent == expOnes) {
    magnitude = INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(double(mantissa), layout.minExponent() - m);
  } else {
    magnitude = std::ldexp(double(mantissa | (uint64_t(1) << m)), int(exponent) - layout.bias() - m);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace loom::perf
