// Conversions of the narrow float types (kernels/types.h) against the
// hand-written bit-field reference in reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/types.h"
#include "reference.h"

namespace loom::kernels {
namespace {

// Uniform access to the four types for typed tests.
template <typename T>
struct Info;
template <>
struct Info<Half> {
  static constexpr const ref::FormatSpec& spec = ref::kHalfSpec;
  static constexpr uint32_t kPatterns = 1u << 16;
  static constexpr uint32_t kQuietBit = 0x0200;
  static Half narrow(float f) { return Half::fromFloat(f); }
  static Half narrowSat(float f) { return Half::fromFloat(f); }
};
template <>
struct Info<Bfloat16> {
  static constexpr const ref::FormatSpec& spec = ref::kBf16Spec;
  static constexpr uint32_t kPatterns = 1u << 16;
  static constexpr uint32_t kQuietBit = 0x0040;
  static Bfloat16 narrow(float f) { return Bfloat16::fromFloat(f); }
  static Bfloat16 narrowSat(float f) { return Bfloat16::fromFloat(f); }
};
template <>
struct Info<Float8e4m3> {
  static constexpr const ref::FormatSpec& spec = ref::kE4m3Spec;
  static constexpr uint32_t kPatterns = 1u << 8;
  static constexpr uint32_t kQuietBit = 0;  // single NaN: nothing to quiet
  static Float8e4m3 narrow(float f) { return Float8e4m3::fromFloat(f); }
  static Float8e4m3 narrowSat(float f) { return Float8e4m3::fromFloatSatFinite(f); }
};
template <>
struct Info<Float8e5m2> {
  static constexpr const ref::FormatSpec& spec = ref::kE5m2Spec;
  static constexpr uint32_t kPatterns = 1u << 8;
  static constexpr uint32_t kQuietBit = 0x02;
  static Float8e5m2 narrow(float f) { return Float8e5m2::fromFloat(f); }
  static Float8e5m2 narrowSat(float f) { return Float8e5m2::fromFloatSatFinite(f); }
};

template <typename T>
T make(uint32_t bits) {
  return T::fromBits(decltype(T::bits)(bits));
}

template <typename T>
bool isNanBits(uint32_t bits) {
  return std::isnan(ref::decode(bits, Info<T>::spec));
}

template <typename T>
class ConversionTest : public ::testing::Test {};
using NarrowTypes = ::testing::Types<Half, Bfloat16, Float8e4m3, Float8e5m2>;
TYPED_TEST_SUITE(ConversionTest, NarrowTypes);

// Every pattern widens to exactly the value its bit fields spell.
TYPED_TEST(ConversionTest, WidenEveryPatternMatchesBitFields) {
  using T = TypeParam;
  for (uint32_t b = 0; b < Info<T>::kPatterns; ++b) {
    const double expected = ref::decode(b, Info<T>::spec);
    const float got = make<T>(b).toFloat();
    ASSERT_TRUE(ref::same(expected, double(got))) << std::hex << "bits 0x" << b << " got " << got;
    const bool signBit = (b >> (Info<T>::spec.expBits + Info<T>::spec.manBits)) & 1u;
    ASSERT_EQ(std::signbit(got), signBit) << std::hex << "bits 0x" << b;
  }
}

// narrow(widen(x)) == x, except that signalling NaNs come back quiet.
TYPED_TEST(ConversionTest, RoundTripEveryPattern) {
  using T = TypeParam;
  for (uint32_t b = 0; b < Info<T>::kPatterns; ++b) {
    const float f = make<T>(b).toFloat();
    const uint32_t expected = isNanBits<T>(b) ? (b | Info<T>::kQuietBit) : b;
    ASSERT_EQ(uint32_t(Info<T>::narrow(f).bits), expected) << std::hex << "bits 0x" << b;
    // Saturating narrowing differs only for infinities (e5m2 only).
    const double v = ref::decode(b, Info<T>::spec);
    const ref::FormatSpec& spec = Info<T>::spec;
    const uint32_t signBit = 1u << (spec.expBits + spec.manBits);
    const uint32_t maxPattern = (((1u << spec.expBits) - 2) << spec.manBits) | ((1u << spec.manBits) - 1);
    const uint32_t expectedSat = std::isinf(v) && spec.satFinite
                                     ? ((std::signbit(v) ? signBit : 0u) | maxPattern)
                                     : expected;
    ASSERT_EQ(uint32_t(Info<T>::narrowSat(f).bits), expectedSat) << std::hex << "bits 0x" << b;
  }
}

// Checks narrow(x) (both flavours) against the reference rounding.
template <typename T>
void expectNarrowing(float x) {
  const double expected = ref::round(double(x), Info<T>::spec, false);
  const auto got = Info<T>::narrow(x);
  ASSERT_TRUE(ref::same(expected, ref::decode(got.bits, Info<T>::spec)))
      << std::hexfloat << "x=" << x << " expected " << expected << std::hex << " got bits 0x"
      << uint32_t(got.bits);
  const double expectedSat = ref::round(double(x), Info<T>::spec, Info<T>::spec.satFinite);
  const auto gotSat = Info<T>::narrowSat(x);
  ASSERT_TRUE(ref::same(expectedSat, ref::decode(gotSat.bits, Info<T>::spec)))
      << std::hexfloat << "x=" << x << " expected(sat) " << expectedSat;
  if (std::isnan(x)) {
    ASSERT_EQ(std::signbit(Info<T>::narrow(x).toFloat()), std::signbit(x)) << "NaN sign is kept";
  }
}

// Every representable value, every midpoint between neighbours, and the
// floats just either side of each midpoint: the cases rounding gets wrong.
TYPED_TEST(ConversionTest, NarrowAtEveryValueAndMidpoint) {
  using T = TypeParam;
  std::vector<double> values;
  for (uint32_t b = 0; b < Info<T>::kPatterns; ++b) {
    const double v = ref::decode(b, Info<T>::spec);
    if (std::isfinite(v) && !std::signbit(v)) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  // Past the top: where the next value would be if the exponent continued,
  // so the overflow threshold (a midpoint) is tested too.
  const double top = values.back();
  values.push_back(top + (top - values[values.size() - 2]));
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float v = float(values[i]);
    const float mid = float((values[i] + values[i + 1]) / 2);  // exact in float
    ASSERT_EQ(double(mid), (values[i] + values[i + 1]) / 2);
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      expectNarrowing<T>(x);
      expectNarrowing<T>(-x);
    }
  }
}

TYPED_TEST(ConversionTest, NarrowSampledFloatPatterns) {
  using T = TypeParam;
  // A stride co-prime with 2^32 visits ~1.4M patterns of every class.
  constexpr uint32_t kStride = 3001;
  uint32_t u = 0;
  for (uint64_t i = 0; i < (uint64_t(1) << 32) / kStride; ++i, u += kStride) {
    expectNarrowing<T>(std::bit_cast<float>(u));
  }
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max()}) {
    expectNarrowing<T>(x);
  }
}

// ---- documented edge behaviour, spelled out -------------------------------

TEST(ConversionEdges, Float8e4m3OverflowAndSaturation) {
  EXPECT_EQ(Float8e4m3::fromFloat(448.0f).bits, 0x7e);
  EXPECT_EQ(Float8e4m3::fromFloat(464.0f).bits, 0x7e) << "tie between 448 and 480 goes to even (448)";
  EXPECT_EQ(Float8e4m3::fromFloat(464.5f).bits, 0x7f) << "no-sat overflow is NaN";
  EXPECT_EQ(Float8e4m3::fromFloat(-1e9f).bits, 0xff);
  EXPECT_EQ(Float8e4m3::fromFloat(INFINITY).bits, 0x7f) << "e4m3 has no inf";
  EXPECT_EQ(Float8e4m3::fromFloatSatFinite(464.5f).bits, 0x7e);
  EXPECT_EQ(Float8e4m3::fromFloatSatFinite(-INFINITY).bits, 0xfe);
  EXPECT_EQ(Float8e4m3::fromFloatSatFinite(NAN).bits & 0x7f, 0x7f);
  EXPECT_EQ(Float8e4m3::fromFloat(std::ldexp(1.0f, -10)).bits, 0x00) << "half the min subnormal ties to 0";
  EXPECT_EQ(Float8e4m3::fromFloat(std::nextafter(std::ldexp(1.0f, -10), 1.0f)).bits, 0x01);
  EXPECT_EQ(Float8e4m3::fromBits(0x01).toFloat(), std::ldexp(1.0f, -9));
  EXPECT_EQ(Float8e4m3::fromBits(0x7e).toFloat(), 448.0f);
  EXPECT_EQ(Float8e4m3::fromBits(0x78).toFloat(), 256.0f) << "exponent 1111 is finite in e4m3fn";
}

TEST(ConversionEdges, Float8e5m2OverflowAndSaturation) {
  EXPECT_EQ(Float8e5m2::fromFloat(57344.0f).bits, 0x7b);
  EXPECT_EQ(Float8e5m2::fromFloat(61440.0f).bits, 0x7c) << "tie 57344|65536 rounds to even = overflow";
  EXPECT_EQ(Float8e5m2::fromFloat(61439.0f).bits, 0x7b);
  EXPECT_EQ(Float8e5m2::fromFloat(-INFINITY).bits, 0xfc);
  EXPECT_EQ(Float8e5m2::fromFloatSatFinite(61440.0f).bits, 0x7b);
  EXPECT_EQ(Float8e5m2::fromFloatSatFinite(INFINITY).bits, 0x7b) << "SATFINITE clamps inf too";
  EXPECT_EQ(Float8e5m2::fromFloatSatFinite(-INFINITY).bits, 0xfb);
  EXPECT_TRUE(std::isinf(Float8e5m2::fromBits(0x7c).toFloat()));
  EXPECT_EQ(Float8e5m2::fromBits(0x7d).bits, 0x7d);
  EXPECT_EQ(Float8e5m2::fromFloat(Float8e5m2::fromBits(0x7d).toFloat()).bits, 0x7f) << "sNaN -> qNaN";
  EXPECT_EQ(Float8e5m2::fromFloat(Float8e5m2::fromBits(0xfe).toFloat()).bits, 0xfe);
}

TEST(ConversionEdges, HalfAndBfloat16) {
  EXPECT_EQ(Half::fromFloat(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half::fromFloat(65519.996f).bits, 0x7bff);
  EXPECT_EQ(Half::fromFloat(65520.0f).bits, 0x7c00) << "tie at the top rounds to inf";
  EXPECT_EQ(Half::fromFloat(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(Half::fromFloat(std::ldexp(1.0f, -25)).bits, 0x0000);
  EXPECT_EQ(Half::fromFloat(-std::ldexp(3.0f, -26)).bits, 0x8001) << "1.5 * 2^-25 rounds up";
  EXPECT_EQ(Half::fromFloat(std::ldexp(1023.5f, -24)).bits, 0x0400) << "carry into the min normal";
  EXPECT_EQ(std::bit_cast<uint32_t>(Half::fromBits(0x7d01).toFloat()), 0x7fa02000u) << "payload kept";
  EXPECT_EQ(Half::fromFloat(std::bit_cast<float>(0xffa02000u)).bits, 0xff01) << "quieted, sign kept";
  EXPECT_EQ(Bfloat16::fromFloat(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(Bfloat16::fromFloat(std::bit_cast<float>(0x00018000u)).bits, 0x0002) << "float subnormal tie to even";
  EXPECT_EQ(Bfloat16::fromFloat(std::bit_cast<float>(0x00008000u)).bits, 0x0000);
  EXPECT_EQ(Bfloat16::fromFloat(std::bit_cast<float>(0x00008001u)).bits, 0x0001);
  EXPECT_EQ(Bfloat16::fromBits(0x0001).toFloat(), std::bit_cast<float>(0x00010000u));
  EXPECT_EQ(Bfloat16::fromFloat(std::bit_cast<float>(0x7f800001u)).bits, 0x7fc0) << "NaN stays NaN";
}

}  // namespace
}  // namespace loom::kernels
