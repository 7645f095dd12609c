// Reductions on the narrow float types through the public reduce() entry
// point, exhaustively where the operand space allows:
//  - fp8: all 65,536 operand pairs for sum, prod, max, min (both orders),
//    premulsum over all pairs for several scalars, sumpostdiv for all values.
//  - half, bfloat16: all 65,536 values against a fixed set of second operands
//    (zeros, infinities, NaNs, subnormals, extremes, random).
// Every test runs at each instruction-set level the CPU has (others are
// skipped with a message); the basic fp8 ops also with streaming stores.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/reduce.h"
#include "kernels/types.h"
#include "isa_levels.h"
#include "reference.h"

namespace loom::kernels {
namespace {

using test::AtLevel;
using test::configFor;

template <typename T>
struct Narrow;
template <>
struct Narrow<Half> {
  using R = ref::NarrowRef<Half, ref::kHalfSpec>;
  static constexpr DataType kType = DataType::kFloat16;
};
template <>
struct Narrow<Bfloat16> {
  using R = ref::NarrowRef<Bfloat16, ref::kBf16Spec>;
  static constexpr DataType kType = DataType::kBfloat16;
};
template <>
struct Narrow<Float8e4m3> {
  using R = ref::NarrowRef<Float8e4m3, ref::kE4m3Spec>;
  static constexpr DataType kType = DataType::kFloat8e4m3;
};
template <>
struct Narrow<Float8e5m2> {
  using R = ref::NarrowRef<Float8e5m2, ref::kE5m2Spec>;
  static constexpr DataType kType = DataType::kFloat8e5m2;
};

template <typename T>
uint32_t bitsOf(T x) {
  return Narrow<T>::R::bitsOf(x);
}

// dst = a (op) pre(b) [post], checked element by element against the
// reference chain. Returns a description of the first few mismatches.
template <typename T>
std::string checkPairs(const CpuKernelConfig& config, RedOp op, const std::vector<T>& a, const std::vector<T>& b,
                       uint32_t scalarBits, uint64_t divisor, bool applyPost) {
  using R = typename Narrow<T>::R;
  std::vector<T> dst(a.size());
  const void* partials[] = {a.data()};
  Reduction r{Narrow<T>::kType, op};
  r.scalar = scalarBits;
  r.divisor = divisor;
  r.accumulation = Accumulation::kElementType;
  reduce(config, r, dst.data(), partials, 1, b.data(), a.size(), applyPost);
  const double scalar = R::value(R::fromBits(scalarBits));
  std::ostringstream out;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double local = R::value(b[i]);
    const double expected = ref::chain<R>(op, {R::value(a[i])}, &local, scalar, divisor, applyPost);
    if (!R::matches(expected, dst[i])) {
      if (++bad <= 5) {
        out << std::hex << "a=0x" << bitsOf(a[i]) << " b=0x" << bitsOf(b[i]) << std::hexfloat
            << " expected " << expected << " got " << R::value(dst[i]) << std::hex << " (0x"
            << bitsOf(dst[i]) << ")\n";
      }
    }
  }
  if (bad > 0) out << bad << " mismatches of " << a.size();
  return out.str();
}

constexpr RedOp kBasicOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin};

// ---- fp8: every pair ------------------------------------------------------

template <typename P>
class Fp8OpsTest : public ::testing::Test {
 protected:
  using T = typename P::Type;
  // a[i] = i >> 8, b[i] = i & 0xff: all 65,536 ordered pairs.
  void SetUp() override {
    LOOM_SKIP_UNLESS_CPU_RUNS(P::kIsa);
    for (uint32_t i = 0; i < 65536; ++i) {
      a_.push_back(Narrow<T>::R::fromBits(i >> 8));
      b_.push_back(Narrow<T>::R::fromBits(i & 0xff));
    }
  }
  static CpuKernelConfig config(bool streaming = false) { return configFor(P::kIsa, streaming); }
  std::vector<T> a_, b_;
};
#define LOOM_AT_LEVELS(T)                                                                            \
  AtLevel<T, CpuIsa::kScalar>, AtLevel<T, CpuIsa::kAvx2>, AtLevel<T, CpuIsa::kAvx512>,               \
      AtLevel<T, CpuIsa::kAvx512Vbmi>
using Fp8TypesAllLevels = ::testing::Types<LOOM_AT_LEVELS(Float8e4m3), LOOM_AT_LEVELS(Float8e5m2)>;
TYPED_TEST_SUITE(Fp8OpsTest, Fp8TypesAllLevels, test::LevelNames);

TYPED_TEST(Fp8OpsTest, AllPairsBasicOps) {
  using T = typename TestFixture::T;
  for (bool streaming : {false, true}) {
    for (RedOp op : kBasicOps) {
      EXPECT_EQ(checkPairs<T>(this->config(streaming), op, this->a_, this->b_, 0, 1, false), "")
          << redOpName(op) << " streaming=" << streaming;
      EXPECT_EQ(checkPairs<T>(this->config(streaming), op, this->b_, this->a_, 0, 1, false), "")
          << redOpName(op) << " swapped, streaming=" << streaming;
    }
  }
}

TYPED_TEST(Fp8OpsTest, AllPairsPreMulSum) {
  // 1.0, 0.5, -1.5, the smallest subnormal, the largest finite, a NaN.
  const uint32_t scalars[] = {0x38, 0x30, 0xbc, 0x01, 0x7b, 0x7f};
  for (uint32_t s : scalars) {
    EXPECT_EQ(checkPairs<typename TestFixture::T>(this->config(), RedOp::kPreMulSum, this->a_, this->b_, s, 1, false),
              "")
        << std::hex << "scalar 0x" << s;
  }
}

TYPED_TEST(Fp8OpsTest, AllPairsSumPostDiv) {
  for (uint64_t d : {1u, 2u, 3u, 7u, 8u}) {
    EXPECT_EQ(checkPairs<typename TestFixture::T>(this->config(), RedOp::kSumPostDiv, this->a_, this->b_, 0, d, true),
              "")
        << "divisor " << d;
  }
  // Without applyPost it is a plain sum.
  EXPECT_EQ(checkPairs<typename TestFixture::T>(this->config(), RedOp::kSumPostDiv, this->a_, this->b_, 0, 3, false),
            "");
}

// The documented SATFINITE consequences, spelled out.
class Fp8OpsEdges : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, Fp8OpsEdges, test::kAllLevels, test::isaParamName);

TEST_P(Fp8OpsEdges, SaturatesLikeNvidia) {
  // Each pair repeated over 300 elements, so the vector loops see it too.
  const CpuIsa isa = GetParam();
  auto run = [isa](DataType type, RedOp op, uint8_t x, uint8_t y) {
    std::vector<uint8_t> xs(300, x), ys(300, y), out(300, 0);
    const void* partials[] = {xs.data()};
    reduce(configFor(isa), Reduction{type, op}, out.data(), partials, 1, ys.data(), out.size(), false);
    for (uint8_t o : out) EXPECT_EQ(o, out[0]) << "the vector loop and the tail disagree";
    return out[0];
  };
  EXPECT_EQ(run(DataType::kFloat8e4m3, RedOp::kSum, 0x7e, 0x7e), 0x7e) << "448+448 -> 448";
  EXPECT_EQ(run(DataType::kFloat8e4m3, RedOp::kSum, 0xfe, 0xfe), 0xfe) << "-448-448 -> -448";
  EXPECT_EQ(run(DataType::kFloat8e5m2, RedOp::kSum, 0x7b, 0x7b), 0x7b) << "57344+57344 -> 57344";
  EXPECT_EQ(run(DataType::kFloat8e5m2, RedOp::kSum, 0x7c, 0x3c), 0x7b) << "inf+1 -> max finite";
  EXPECT_EQ(run(DataType::kFloat8e5m2, RedOp::kMax, 0x7c, 0x3c), 0x7b) << "max(inf,1) -> max finite";
  EXPECT_EQ(run(DataType::kFloat8e5m2, RedOp::kMin, 0xfc, 0x3c), 0xfb) << "min(-inf,1) -> -max finite";
  EXPECT_EQ(run(DataType::kFloat8e5m2, RedOp::kSum, 0x7c, 0xfc) & 0x7f, 0x7e) << "inf-inf -> NaN";
  EXPECT_EQ(run(DataType::kFloat8e4m3, RedOp::kMax, 0x7f, 0x38), 0x38) << "max(NaN,1) -> 1";
  EXPECT_EQ(run(DataType::kFloat8e4m3, RedOp::kMax, 0x80, 0x00), 0x00) << "max(-0,+0) -> +0";
  EXPECT_EQ(run(DataType::kFloat8e4m3, RedOp::kMin, 0x00, 0x80), 0x80) << "min(+0,-0) -> -0";
}

// ---- half and bfloat16: every value x a fixed operand set -----------------

template <typename T>
std::vector<uint32_t> secondOperands();
template <>
std::vector<uint32_t> secondOperands<Half>() {
  return {0x0000, 0x8000,                          // +-0
          0x7c00, 0xfc00,                          // +-inf
          0x7e00, 0xfe00, 0x7c01, 0x7fff,          // NaNs (quiet, negative, signalling, all-ones)
          0x0001, 0x8001, 0x03ff, 0x0200, 0x83ff,  // subnormals
          0x0400, 0x8400,                          // smallest normals
          0x7bff, 0xfbff, 0x7bfe,                  // largest finite
          0x3c00, 0xbc00, 0x3c01, 0x3800, 0x4000,  // 1, -1, 1+ulp, 0.5, 2
          0x1400, 0x6400, 0xc248};                 // 2^-10, 1024, -3.14
}
template <>
std::vector<uint32_t> secondOperands<Bfloat16>() {
  return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fff, 0x0001, 0x8001, 0x007f,
          0x0040, 0x807f, 0x0080, 0x8080, 0x7f7f, 0xff7f, 0x7f7e, 0x3f80, 0xbf80, 0x3f81, 0x3f00,
          0x4000, 0x3a80, 0x4480, 0xc049};
}

template <typename P>
class WideNarrowOpsTest : public ::testing::Test {
 protected:
  using T = typename P::Type;
  void SetUp() override {
    LOOM_SKIP_UNLESS_CPU_RUNS(P::kIsa);
    for (uint32_t i = 0; i < 65536; ++i) all_.push_back(Narrow<T>::R::fromBits(i));
    operands_ = secondOperands<T>();
    std::mt19937_64 rng(1234);
    for (int i = 0; i < 12; ++i) operands_.push_back(uint32_t(rng() & 0xffff));
#ifdef LOOM_TEST_SANITIZED
    // Every fourth operand (zero, NaN, subnormal, normal, random ones): the
    // same kernels over every value, at a quarter of the cost.
    std::vector<uint32_t> some;
    for (size_t i = 0; i < operands_.size(); i += 4) some.push_back(operands_[i]);
    operands_ = std::move(some);
#endif
  }
  std::vector<T> filled(uint32_t bits) const {
    return std::vector<T>(all_.size(), Narrow<T>::R::fromBits(bits));
  }
  static CpuKernelConfig config() { return configFor(P::kIsa); }
  std::vector<T> all_;
  std::vector<uint32_t> operands_;
};
using SixteenBitTypesAllLevels = ::testing::Types<LOOM_AT_LEVELS(Half), LOOM_AT_LEVELS(Bfloat16)>;
#undef LOOM_AT_LEVELS
TYPED_TEST_SUITE(WideNarrowOpsTest, SixteenBitTypesAllLevels, test::LevelNames);

TYPED_TEST(WideNarrowOpsTest, EveryValueAgainstOperandSet) {
  using T = typename TestFixture::T;
  for (uint32_t operand : this->operands_) {
    const std::vector<T> b = this->filled(operand);
    for (RedOp op : kBasicOps) {
      EXPECT_EQ(checkPairs<T>(this->config(), op, this->all_, b, 0, 1, false), "")
          << redOpName(op) << std::hex << " operand 0x" << operand;
      EXPECT_EQ(checkPairs<T>(this->config(), op, b, this->all_, 0, 1, false), "")
          << redOpName(op) << std::hex << " operand 0x" << operand << " first";
    }
  }
}

TYPED_TEST(WideNarrowOpsTest, PreMulSumEveryValue) {
  // The partial is every value in reverse, so pairs vary across the range.
  using T = typename TestFixture::T;
  std::vector<T> reversed(this->all_.rbegin(), this->all_.rend());
  for (uint32_t operand : this->operands_) {
    EXPECT_EQ(checkPairs<T>(this->config(), RedOp::kPreMulSum, reversed, this->all_, operand, 1, false), "")
        << std::hex << "scalar 0x" << operand;
  }
}

TYPED_TEST(WideNarrowOpsTest, SumPostDivEveryValue) {
  using T = typename TestFixture::T;
  const std::vector<T> zeros = this->filled(0);
  for (uint64_t d : {1u, 2u, 3u, 7u, 1000u}) {
    EXPECT_EQ(checkPairs<T>(this->config(), RedOp::kSumPostDiv, this->all_, zeros, 0, d, true), "")
        << "divisor " << d;
    EXPECT_EQ(checkPairs<T>(this->config(), RedOp::kSumPostDiv, this->all_, this->filled(0x3c01), 0, d, true), "")
        << "divisor " << d;
  }
}

}  // namespace
}  // namespace loom::kernels
