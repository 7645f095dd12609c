// Encoders and decoders for the narrow floating-point formats the perf tools
// generate and check: IEEE half, bfloat16 and the two OCP 8-bit formats.
//
// The tools build their inputs on the host, so they need these conversions
// without CUDA's headers. Encoding rounds to nearest, ties to even. Values
// beyond the largest finite number become infinity where the format has one
// (half, bfloat16, e5m2) and NaN for e4m3, which has no infinity (OCP's
// non-saturating conversion). NaN inputs give the format's canonical quiet NaN.
#pragma once

#include <cstdint>

namespace loom::perf {

// Bit layout of a narrow binary floating-point format.
struct SmallFloatLayout {
  int exponentBits;
  int mantissaBits;  // stored bits, without the implicit leading one
  // true: the all-ones exponent means inf/NaN (IEEE style). false: e4m3
  // style, where only all-ones exponent and mantissa is NaN and there is no inf.
  bool ieeeSpecials;

  int bias() const { return (1 << (exponentBits - 1)) - 1; }
  int totalBits() const { return 1 + exponentBits + mantissaBits; }
  // Exponent of the smallest normal number (2^minExponent).
  int minExponent() const { return 1 - bias(); }
  // Exponent of the largest binade that holds finite numbers.
  int maxExponent() const;
  double maxFinite() const;
};

inline constexpr SmallFloatLayout kHalfLayout{5, 10, true};
inline constexpr SmallFloatLayout kBfloat16Layout{8, 7, true};
inline constexpr SmallFloatLayout kE4M3Layout{4, 3, false};
inline constexpr SmallFloatLayout kE5M2Layout{5, 2, true};
// float and double, for code that treats every float type alike.
inline constexpr SmallFloatLayout kFloatLayout{8, 23, true};
inline constexpr SmallFloatLayout kDoubleLayout{11, 52, true};

// Rounds `value` to the format; returns the bits in the low totalBits().
uint64_t encodeFloat(double value, const SmallFloatLayout& layout);
// The same rounding done in software, for any layout (encodeFloat uses the
// hardware for float and double; tests hold the two against each other).
uint64_t encodeFloatPortable(double value, const SmallFloatLayout& layout);
// Exact value of the bits (every narrow format value is a double).
double decodeFloat(uint64_t bits, const SmallFloatLayout& layout);
bool isNanBits(uint64_t bits, const SmallFloatLayout& layout);

}  // namespace loom::perf
