// The generated inputs reduce exactly, in any order, to the expected values
// for every type and operation; and the codec of the narrow float formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tools/perf/verifiable.h"

namespace loom::perf {
namespace {

// ---- float codec ------------------------------------------------------

TEST(FloatCodec, KnownEncodings) {
  EXPECT_EQ(encodeFloat(1.0, kHalfLayout), 0x3C00u);
  EXPECT_EQ(encodeFloat(-2.0, kHalfLayout), 0xC000u);
  EXPECT_EQ(encodeFloat(65504.0, kHalfLayout), 0x7BFFu);
  EXPECT_EQ(encodeFloat(65519.0, kHalfLayout), 0x7BFFu);
  EXPECT_EQ(encodeFloat(65520.0, kHalfLayout), 0x7C00u);  // tie rounds to even: infinity
  EXPECT_EQ(encodeFloat(std::ldexp(1.0, -24), kHalfLayout), 0x0001u);
  EXPECT_EQ(encodeFloat(std::ldexp(1.0, -25), kHalfLayout), 0x0000u);  // tie to even: zero
  EXPECT_EQ(encodeFloat(std::ldexp(3.0, -26), kHalfLayout), 0x0001u);
  EXPECT_EQ(encodeFloat(1.0 + std::ldexp(1.0, -11), kHalfLayout), 0x3C00u);  // tie to even
  EXPECT_EQ(encodeFloat(1.0, kBfloat16Layout), 0x3F80u);
  EXPECT_EQ(encodeFloat(1.0, kE4M3Layout), 0x38u);
  EXPECT_EQ(encodeFloat(448.0, kE4M3Layout), 0x7Eu);
  EXPECT_EQ(encodeFloat(464.0, kE4M3Layout), 0x7Eu);
  EXPECT_EQ(encodeFloat(480.0, kE4M3Layout), 0x7Fu);  // no infinity: NaN
  EXPECT_EQ(encodeFloat(std::ldexp(1.0, -9), kE4M3Layout), 0x01u);
  EXPECT_EQ(encodeFloat(1.0, kE5M2Layout), 0x3Cu);
  EXPECT_EQ(encodeFloat(57344.0, kE5M2Layout), 0x7Bu);
  EXPECT_EQ(encodeFloat(1e9, kE5M2Layout), 0x7Cu);
  EXPECT_EQ(kE4M3Layout.maxFinite(), 448.0);
  EXPECT_EQ(kE5M2Layout.maxFinite(), 57344.0);
  EXPECT_EQ(kHalfLayout.maxFinite(), 65504.0);
  EXPECT_TRUE(isNanBits(encodeFloat(std::nan(""), kE4M3Layout), kE4M3Layout));
  EXPECT_TRUE(isNanBits(encodeFloat(std::nan(""), kHalfLayout), kHalfLayout));
}

TEST(FloatCodec, EveryNarrowCodeRoundTrips) {
  for (const SmallFloatLayout& layout : {kHalfLayout, kBfloat16Layout, kE4M3Layout, kE5M2Layout}) {
    for (uint64_t bits = 0; bits < (uint64_t(1) << layout.totalBits()); ++bits) {
      if (isNanBits(bits, layout)) continue;
      ASSERT_EQ(encodeFloat(decodeFloat(bits, layout), layout), bits) << "bits " << bits;
    }
  }
}

TEST(FloatCodec, AgreesWithNativeFloatRounding) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    double value = std::ldexp(double(rng() >> 11) / double(uint64_t(1) << 53), int(rng() % 300) - 160);
    if (rng() & 1) value = -value;
    float native = float(value);
    uint32_t nativeBits;
    std::memcpy(&nativeBits, &native, 4);
    ASSERT_EQ(encodeFloat(value, kFloatLayout), nativeBits) << value;
    ASSERT_EQ(encodeFloatPortable(value, kFloatLayout), nativeBits) << value;
    uint64_t doubleBits;
    std::memcpy(&doubleBits, &value, 8);
    ASSERT_EQ(encodeFloat(value, kDoubleLayout), doubleBits);
    ASSERT_EQ(encodeFloatPortable(value, kDoubleLayout), doubleBits);
  }
}

// ---- reference arithmetic in the element type --------------------------

// Values as exact doubles (floats) or int64 (integers, sign-extended).
struct Arith {
  const TypeInfo& type;
  uint64_t mask() const { return type.size == 8 ? ~uint64_t(0) : (uint64_t(1) << type.bits()) - 1; }
  int64_t asSigned(uint64_t bits) const {
    int shift = 64 - type.bits();
    return type.size == 8 ? int64_t(bits) : int64_t(bits << shift) >> shift;
  }
  double asDouble(uint64_t bits) const { return decodeFloat(bits, type.layout); }
  uint64_t fromDouble(double v) const { return encodeFloat(v, type.layout); }

  // One correctly rounded operation in the type; `exact` is cleared when a
  // float result had to round or an integer result left the type's range.
  uint64_t apply(Op op, uint64_t a, uint64_t b, bool* exact) const {
    if (type.isFloat()) {
      double x = asDouble(a), y = asDouble(b), r = 0;
      switch (op) {
        case Op::kSum: case Op::kMulSum: case Op::kAvg: r = x + y; break;
        case Op::kProd: r = x * y; break;
        case Op::kMax: r = std::max(x, y); break;
        case Op::kMin: r = std::min(x, y); break;
        case Op::kNone: r = x; break;
      }
      if (type.type == ncclFloat64) {
        long double wide = op == Op::kProd ? (long double)x * y : (long double)x + y;
        if ((op == Op::kProd || op == Op::kSum || op == Op::kMulSum || op == Op::kAvg) && wide != (long double)r) {
          *exact = false;
        }
      }
      uint64_t bits = fromDouble(r);
      if (asDouble(bits) != r) *exact = false;
      return bits;
    }
    if (type.kind == TypeKind::kUnsigned) {
      switch (op) {
        case Op::kProd: return (a * b) & mask();
        case Op::kMax: return std::max(a, b);
        case Op::kMin: return std::min(a, b);
        default: return (a + b) & mask();
      }
    }
    __int128 x = asSigned(a), y = asSigned(b), r = 0;
    switch (op) {
      case Op::kProd: r = x * y; break;
      case Op::kMax: r = std::max(x, y); break;
      case Op::kMin: r = std::min(x, y); break;
      default: r = x + y; break;
    }
    __int128 limit = __int128(1) << (type.bits() - 1);
    if (r >= limit || r < -limit) *exact = false;
    return uint64_t(int64_t(r)) & mask();
  }

  // x * scalar in the type (PreMulSum's pre-multiplication).
  uint64_t scale(uint64_t x, double scalar, bool* exact) const {
    if (type.isFloat()) {
      double s = asDouble(fromDouble(scalar));  // the scalar as stored in the type
      double r = asDouble(x) * s;
      uint64_t bits = fromDouble(r);
      if (asDouble(bits) != r) *exact = false;
      return bits;
    }
    return apply(Op::kProd, x, uint64_t(int64_t(scalar)) & mask(), exact);
  }
};

// Reduces per-rank values in the given order (a left fold) or as a balanced
// tree when `order` is empty.
uint64_t reduceInOrder(const Arith& arith, Op op, const std::vector<uint64_t>& values, const std::vector<int>& order,
                       bool* exact) {
  if (order.empty()) {
    std::vector<uint64_t> level = values;
    while (level.size() > 1) {
      std::vector<uint64_t> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(arith.apply(op, level[i], level[i + 1], exact));
      if (level.size() % 2) next.push_back(level.back());
      level = next;
    }
    return level[0];
  }
  uint64_t acc = values[size_t(order[0])];
  for (size_t i = 1; i < order.size(); ++i) acc = arith.apply(op, acc, values[size_t(order[i])], exact);
  return acc;
}

// Both ways a library may average floats land within kAvgToleranceUlps of
// the expected value: summing first and dividing once (`sum` is that sum),
// or pre-multiplying every input by 1/n rounded to the type, like NCCL.
testing::AssertionResult floatAverageWithinTolerance(const Arith& arith, const std::vector<uint64_t>& values,
                                                      const std::vector<int>& order, uint64_t sum, uint64_t want) {
  const TypeInfo& type = arith.type;
  const int n = int(values.size());
  uint64_t postDiv = arith.fromDouble(arith.asDouble(sum) / n);
  if (ulpDistance(type, postDiv, want) > uint64_t(kAvgToleranceUlps)) {
    return testing::AssertionFailure() << "sum then divide gave " << arith.asDouble(postDiv) << ", want "
                                       << arith.asDouble(want);
  }
  std::vector<uint64_t> pre = values;
  bool ignored = true;
  for (uint64_t& x : pre) x = arith.scale(x, 1.0 / n, &ignored);
  uint64_t preMul = reduceInOrder(arith, Op::kSum, pre, order, &ignored);
  if (ulpDistance(type, preMul, want) > uint64_t(kAvgToleranceUlps)) {
    return testing::AssertionFailure() << "pre-multiplied gave " << arith.asDouble(preMul) << ", want "
                                       << arith.asDouble(want);
  }
  return testing::AssertionSuccess();
}

struct Case {
  ncclDataType_t type;
  Op op;
  int nranks;
};

std::string caseName(const testing::TestParamInfo<Case>& info) {
  return std::string(typeInfo(info.param.type).name) + "_" + opName(info.param.op) + "_n" +
         std::to_string(info.param.nranks);
}

std::vector<Case> allCases() {
  std::vector<Case> cases;
  for (const TypeInfo& type : allTypes()) {
    for (Op op : allOps()) {
      for (int n : {1, 2, 3, 5, 8, 17}) cases.push_back({type.type, op, n});
    }
    for (int n : {1, 3}) cases.push_back({type.type, Op::kNone, n});
  }
  return cases;
}

class ExactInputs : public testing::TestWithParam<Case> {};

TEST_P(ExactInputs, EveryOrderGivesTheExpectedValue) {
  const Case c = GetParam();
  const TypeInfo& type = typeInfo(c.type);
  const Arith arith{type};
  constexpr size_t kCount = 300;
  std::mt19937 shuffler(1234);
  int nonTrivial = 0;  // elements whose result differs from rank 0's input

  for (uint64_t seed : {1ull, 99ull, 0xfeedull}) {
    GenSpec spec{&type, c.op, c.nranks, seed};
    std::vector<std::vector<char>> inputs(size_t(c.nranks), std::vector<char>(kCount * type.size));
    for (int r = 0; r < c.nranks; ++r) generateInput(spec, r, 1000, kCount, inputs[size_t(r)].data());
    std::vector<char> expected(kCount * type.size);
    generateExpected(spec, 1000, kCount, expected.data());

    for (size_t i = 0; i < kCount; ++i) {
      const uint64_t want = loadElement(type, expected.data(), i);
      std::vector<uint64_t> values;
      for (int r = 0; r < c.nranks; ++r) {
        uint64_t x = loadElement(type, inputs[size_t(r)].data(), i);
        if (type.isFloat()) {
          ASSERT_FALSE(isNanBits(x, type.layout));
          ASSERT_TRUE(std::isfinite(arith.asDouble(x)));
          ASSERT_FALSE(x == (uint64_t(1) << (type.bits() - 1))) << "-0 input";
        }
        values.push_back(x);
      }
      if (c.op == Op::kNone) {
        for (uint64_t x : values) ASSERT_EQ(x, want) << "copy input must not depend on the rank";
        continue;
      }
      if (want != values[0]) ++nonTrivial;

      // Pre-operation: PreMulSum scales by 1 or 2; avg (float) may be done
      // NCCL's way, multiplying every input by a rounded 1/n first.
      std::vector<uint64_t> scaled = values;
      bool scaleExact = true;
      if (c.op == Op::kMulSum) {
        for (int r = 0; r < c.nranks; ++r) scaled[size_t(r)] = arith.scale(values[size_t(r)], preMulScalar(r), &scaleExact);
        ASSERT_TRUE(scaleExact) << "PreMulSum scaling rounded at element " << i;
      }

      std::vector<std::vector<int>> orders;
      std::vector<int> ascending(size_t(c.nranks));
      std::iota(ascending.begin(), ascending.end(), 0);
      orders.push_back(ascending);
      orders.push_back(std::vector<int>(ascending.rbegin(), ascending.rend()));
      for (int k = 0; k < 3; ++k) {
        std::vector<int> random = ascending;
        std::shuffle(random.begin(), random.end(), shuffler);
        orders.push_back(random);
      }
      orders.push_back({});  // balanced tree

      for (const std::vector<int>& order : orders) {
        bool exact = true;
        uint64_t got = reduceInOrder(arith, c.op, scaled, order, &exact);
        ASSERT_TRUE(exact) << "an intermediate result rounded or overflowed at element " << i;
        if (c.op == Op::kAvg) {
          if (type.isFloat()) {
            ASSERT_TRUE(floatAverageWithinTolerance(arith, values, order, got, want)) << "element " << i;
            continue;
          }
          got = type.kind == TypeKind::kUnsigned ? got / uint64_t(c.nranks)
                                                 : uint64_t(arith.asSigned(got) / c.nranks) & arith.mask();
        }
        ASSERT_EQ(got, want) << "element " << i;
      }
    }
  }
  if (c.op != Op::kNone && c.nranks >= 2) {
    // A library that returned its own input would be caught.
    EXPECT_GT(nonTrivial, int(3 * kCount / 4)) << "too few elements depend on other ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ExactInputs, testing::ValuesIn(allCases()), caseName);

TEST(GeneratedInputs, DependOnSeedRankAndIndex) {
  const TypeInfo& type = typeInfo(ncclFloat32);
  std::vector<float> a(64), b(64), c(64);
  generateInput({&type, Op::kSum, 4, 1}, 0, 0, 64, a.data());
  generateInput({&type, Op::kSum, 4, 2}, 0, 0, 64, b.data());
  generateInput({&type, Op::kSum, 4, 1}, 1, 0, 64, c.data());
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  std::vector<float> shifted(32);
  generateInput({&type, Op::kSum, 4, 1}, 0, 32, 32, shifted.data());
  EXPECT_TRUE(std::equal(shifted.begin(), shifted.end(), a.begin() + 32));
}

TEST(CountMismatches, BitExactExceptAverages) {
  const TypeInfo& type = typeInfo(ncclFloat32);
  std::vector<float> expected = {1.0f, 2.0f, -3.0f, 0.0f};
  std::vector<float> actual = expected;
  EXPECT_EQ(countMismatches(type, Op::kSum, actual.data(), expected.data(), 4), 0);
  actual[1] = std::nextafter(2.0f, 3.0f);
  EXPECT_EQ(countMismatches(type, Op::kSum, actual.data(), expected.data(), 4), 1);
  EXPECT_EQ(countMismatches(type, Op::kAvg, actual.data(), expected.data(), 4), 0);
  actual[1] = std::nextafter(std::nextafter(std::nextafter(2.0f, 3.0f), 3.0f), 3.0f);
  EXPECT_EQ(countMismatches(type, Op::kAvg, actual.data(), expected.data(), 4), 1);
  actual = expected;
  actual[3] = -0.0f;  // -0 vs +0: different bits
  EXPECT_EQ(countMismatches(type, Op::kSum, actual.data(), expected.data(), 4), 1);
  actual[3] = std::nanf("");
  EXPECT_EQ(countMismatches(type, Op::kAvg, actual.data(), expected.data(), 4), 1);

  const TypeInfo& int8 = typeInfo(ncclInt8);
  int8_t x[3] = {1, 2, 3}, y[3] = {1, 2, 4};
  EXPECT_EQ(countMismatches(int8, Op::kAvg, x, y, 3), 1);
}

}  // namespace
}  // namespace loom::perf
