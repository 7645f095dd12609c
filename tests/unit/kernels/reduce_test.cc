// reduce() / copy() for every type x op: chains of several partials plus a
// local input, odd lengths crossing the internal block size, unaligned
// pointers, exact aliasing, pre/post steps, and the degenerate shapes. Every
// test runs at each instruction-set level (scalar, AVX2, AVX-512; a level the
// CPU lacks is skipped), with and without streaming stores.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/datatype.h"
#include "kernels/reduce.h"
#include "kernels/types.h"
#include "isa_levels.h"
#include "reference.h"

namespace loom::kernels {
namespace {

using test::AtLevel;
using test::configFor;

// Per type: DataType, reference, and a premulsum scalar worth testing.
template <typename T>
struct Case;
#define LOOM_INT_CASE(T, kDataType, kScalar)           \
  template <>                                         \
  struct Case<T> {                                    \
    using R = ref::IntRef<T>;                         \
    static constexpr DataType kType = kDataType;      \
    static T scalar() { return T(kScalar); }          \
  }
LOOM_INT_CASE(int8_t, DataType::kInt8, -3);
LOOM_INT_CASE(uint8_t, DataType::kUint8, 7);
LOOM_INT_CASE(int32_t, DataType::kInt32, -5);
LOOM_INT_CASE(uint32_t, DataType::kUint32, 3);
LOOM_INT_CASE(int64_t, DataType::kInt64, -7);
LOOM_INT_CASE(uint64_t, DataType::kUint64, 11);
#undef LOOM_INT_CASE
template <>
struct Case<float> {
  using R = ref::NativeFloatRef<float>;
  static constexpr DataType kType = DataType::kFloat32;
  static float scalar() { return -0.3f; }
};
template <>
struct Case<double> {
  using R = ref::NativeFloatRef<double>;
  static constexpr DataType kType = DataType::kFloat64;
  static double scalar() { return 0.1; }
};
#define LOOM_NARROW_CASE(T, kSpecName, kDataType, kScalarBits) \
  template <>                                                 \
  struct Case<T> {                                            \
    using R = ref::NarrowRef<T, ref::kSpecName>;              \
    static constexpr DataType kType = kDataType;              \
    static T scalar() { return R::fromBits(kScalarBits); }    \
  }
LOOM_NARROW_CASE(Half, kHalfSpec, DataType::kFloat16, 0xb666);           // -0.39990234375
LOOM_NARROW_CASE(Bfloat16, kBf16Spec, DataType::kBfloat16, 0xbecd);      // ~ -0.4
LOOM_NARROW_CASE(Float8e4m3, kE4m3Spec, DataType::kFloat8e4m3, 0xb3);    // -0.6875
LOOM_NARROW_CASE(Float8e5m2, kE5m2Spec, DataType::kFloat8e5m2, 0xb7);    // -0.4375
#undef LOOM_NARROW_CASE

constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax,
                             RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv};
constexpr uint64_t kDivisor = 3;

template <typename T>
uint64_t scalarField(T s) {
  uint64_t raw = 0;
  std::memcpy(&raw, &s, sizeof(s));
  return raw;
}

// A byte buffer holding `count` elements of T at a chosen misalignment, with
// guard bytes on both sides that must never change.
template <typename T>
class Placed {
 public:
  static constexpr size_t kGuard = 64;
  Placed(size_t count, size_t offset) : count_(count), offset_(offset), bytes_(count * sizeof(T) + 2 * kGuard + 64) {
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = uint8_t(0xa5 ^ i);
  }
  void* data() { return bytes_.data() + kGuard + offset_; }
  T get(size_t i) const {
    T v;
    std::memcpy(&v, bytes_.data() + kGuard + offset_ + i * sizeof(T), sizeof(T));
    return v;
  }
  void set(size_t i, T v) { std::memcpy(bytes_.data() + kGuard + offset_ + i * sizeof(T), &v, sizeof(T)); }
  bool guardsIntact() const {
    const size_t begin = kGuard + offset_;
    const size_t end = begin + count_ * sizeof(T);
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if ((i < begin || i >= end) && bytes_[i] != uint8_t(0xa5 ^ i)) return false;
    }
    return true;
  }

 private:
  size_t count_;
  size_t offset_;
  std::vector<uint8_t> bytes_;
};

struct Shape {
  int npartials;
  bool withLocal;
  bool applyPost;
  size_t count;
  size_t seed;
  // Aliasing: -1 none, 0..npartials-1 dst is that partial, npartials: dst is local.
  int dstAliases = -1;
};

// Runs one reduce() with random data in the given shape and checks every
// element against the reference chain. Returns "" on success.
template <typename T>
std::string runShape(const CpuKernelConfig& config, RedOp op, const Shape& shape, size_t fixedOffset = 64) {
  using R = typename Case<T>::R;
  std::mt19937_64 rng(shape.seed * 7919 + size_t(op));
  // fixedOffset < 64: every buffer at that misalignment; else random ones.
  auto offset = [&] { return fixedOffset < 64 ? fixedOffset : size_t(rng() % 64); };
  std::vector<Placed<T>> partials;
  for (int p = 0; p < shape.npartials; ++p) partials.emplace_back(shape.count, offset());
  Placed<T> local(shape.withLocal ? shape.count : 0, offset());
  Placed<T> out(shape.count, offset());
  for (auto& p : partials) {
    for (size_t i = 0; i < shape.count; ++i) p.set(i, R::random(rng));
  }
  for (size_t i = 0; shape.withLocal && i < shape.count; ++i) local.set(i, R::random(rng));

  std::vector<const void*> ptrs;
  for (auto& p : partials) ptrs.push_back(p.data());
  Placed<T>* dstBuf = &out;
  if (shape.dstAliases >= 0) dstBuf = shape.dstAliases < shape.npartials ? &partials[shape.dstAliases] : &local;

  // Expected values first: with aliasing the inputs get overwritten.
  const T scalar = Case<T>::scalar();
  std::vector<typename R::V> expected;
  for (size_t i = 0; i < shape.count; ++i) {
    std::vector<typename R::V> in;
    for (auto& p : partials) in.push_back(R::value(p.get(i)));
    const typename R::V l = shape.withLocal ? R::value(local.get(i)) : typename R::V{};
    expected.push_back(ref::chain<R>(op, in, shape.withLocal ? &l : nullptr, R::value(scalar), kDivisor,
                                     shape.applyPost));
  }

  Reduction r{Case<T>::kType, op};
  r.scalar = scalarField(scalar);
  r.divisor = kDivisor;
  r.accumulation = Accumulation::kElementType;
  reduce(config, r, dstBuf->data(), ptrs.data(), shape.npartials, shape.withLocal ? local.data() : nullptr,
         shape.count, shape.applyPost);

  std::ostringstream err;
  int bad = 0;
  for (size_t i = 0; i < shape.count; ++i) {
    if (!R::matches(expected[i], dstBuf->get(i)) && ++bad <= 3) {
      err << "element " << i << ": expected " << double(expected[i]) << " got " << double(R::value(dstBuf->get(i)))
          << "\n";
    }
  }
  if (bad > 0) err << bad << " mismatches";
  if (!dstBuf->guardsIntact()) err << "bytes outside dst changed";
  for (auto& p : partials) {
    if (&p != dstBuf && !p.guardsIntact()) err << "a partial buffer changed";
  }
  return err.str();
}

template <typename P>
class ReduceTest : public ::testing::Test {
 protected:
  using T = typename P::Type;
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(P::kIsa); }
  static CpuKernelConfig config(bool streaming) { return configFor(P::kIsa, streaming); }
};
#define LOOM_AT_LEVELS(T) AtLevel<T, CpuIsa::kScalar>, AtLevel<T, CpuIsa::kAvx2>, AtLevel<T, CpuIsa::kAvx512>
// avx512vbmi differs from avx512 in the fp8 types only.
#define LOOM_AT_FP8_LEVELS(T) LOOM_AT_LEVELS(T), AtLevel<T, CpuIsa::kAvx512Vbmi>
using AllTypesAllLevels =
    ::testing::Types<LOOM_AT_LEVELS(int8_t), LOOM_AT_LEVELS(uint8_t), LOOM_AT_LEVELS(int32_t),
                     LOOM_AT_LEVELS(uint32_t), LOOM_AT_LEVELS(int64_t), LOOM_AT_LEVELS(uint64_t),
                     LOOM_AT_LEVELS(Half), LOOM_AT_LEVELS(float), LOOM_AT_LEVELS(double),
                     LOOM_AT_LEVELS(Bfloat16), LOOM_AT_FP8_LEVELS(Float8e4m3), LOOM_AT_FP8_LEVELS(Float8e5m2)>;
#undef LOOM_AT_FP8_LEVELS
#undef LOOM_AT_LEVELS
TYPED_TEST_SUITE(ReduceTest, AllTypesAllLevels, test::LevelNames);

// Every op, several partials plus local, lengths that cross the 4 KiB block
// and many 64-byte lines for every element size, random misalignment of every
// pointer, with and without streaming stores.
// Long enough to cross the scalar kernel's 4 KiB blocks for every type; the
// sanitizer tier's shorter vectors still do, at half the cost.
#ifdef LOOM_TEST_SANITIZED
constexpr size_t kChainCount = 4099;
#else
constexpr size_t kChainCount = 9001;
#endif

TYPED_TEST(ReduceTest, ChainsOfPartialsAndLocal) {
  using T = typename TestFixture::T;
  size_t seed = 1;
  for (bool streaming : {false, true}) {
    for (RedOp op : kAllOps) {
      for (int np : {0, 1, 2, 5}) {
        for (bool withLocal : {false, true}) {
          if (np == 0 && !withLocal) continue;
          for (bool post : {false, true}) {
            const Shape shape{np, withLocal, post, kChainCount, seed++};
            EXPECT_EQ(runShape<T>(this->config(streaming), op, shape), "")
                << redOpName(op) << " npartials=" << np << " local=" << withLocal << " post=" << post
                << " streaming=" << streaming;
          }
        }
      }
    }
  }
}

// Short and odd lengths, each with many different random misalignments.
TYPED_TEST(ReduceTest, OddLengthsUnaligned) {
  using T = typename TestFixture::T;
  size_t seed = 1000;
  for (size_t count : {1, 2, 3, 5, 7, 15, 16, 17, 31, 63, 64, 65, 127, 1023, 1025}) {
    for (RedOp op : kAllOps) {
      for (int rep = 0; rep < 4; ++rep) {
        const Shape shape{2, true, true, count, seed++};
        EXPECT_EQ(runShape<T>(this->config(rep % 2 == 1), op, shape), "") << redOpName(op) << " count=" << count;
      }
    }
  }
}

// Every misalignment 1..63 bytes, the same for all buffers (so streaming can
// align dst and the vector loop runs on unaligned sources) and mixed, with
// lengths that leave heads and tails around whole 64-byte lines.
TYPED_TEST(ReduceTest, EveryMisalignment) {
  using T = typename TestFixture::T;
  size_t seed = 3000;
  for (size_t offset = 1; offset < 64; ++offset) {
    for (size_t count : {size_t(1), size_t(70), 64 * 7 / sizeof(T) + 3}) {
      for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kPreMulSum, RedOp::kSumPostDiv}) {
        const Shape shape{1 + int(offset % 3), true, true, count, seed++};
        EXPECT_EQ(runShape<T>(this->config(offset % 2 == 0), op, shape, offset), "")
            << redOpName(op) << " count=" << count << " offset=" << offset;
      }
    }
  }
}

TYPED_TEST(ReduceTest, DstAliasesASourceExactly) {
  using T = typename TestFixture::T;
  size_t seed = 5000;
  for (bool streaming : {false, true}) {
    for (RedOp op : kAllOps) {
      for (int alias : {0, 2, 3}) {  // first partial, last partial, local
        const Shape shape{3, true, true, 5000, seed++, alias};
        EXPECT_EQ(runShape<T>(this->config(streaming), op, shape), "") << redOpName(op) << " alias=" << alias;
      }
      const Shape pair{1, true, true, 3001, seed++, 1};  // dst == local, the two-source loop
      EXPECT_EQ(runShape<T>(this->config(streaming), op, pair), "") << redOpName(op) << " pair in place";
      const Shape onlyLocal{0, true, true, 777, seed++, 0};  // dst == local, no partials
      EXPECT_EQ(runShape<T>(this->config(streaming), op, onlyLocal), "") << redOpName(op) << " in place";
    }
  }
}

TYPED_TEST(ReduceTest, NothingToDoWritesNothing) {
  using T = typename TestFixture::T;
  const CpuKernelConfig config = this->config(true);
  Placed<T> out(16, 3);
  reduce(config, Reduction{Case<T>::kType, RedOp::kSum}, out.data(), nullptr, 0, nullptr, 16, true);
  EXPECT_TRUE(out.guardsIntact());
  const T one = Case<T>::scalar();
  const void* partials[] = {&one};
  std::mt19937_64 rng(3);
  T before = Case<T>::R::random(rng);
  T dst = before;
  reduce(config, Reduction{Case<T>::kType, RedOp::kSum}, &dst, partials, 1, &one, 0, true);
  EXPECT_EQ(std::memcmp(&dst, &before, sizeof(dst)), 0) << "count 0 writes nothing";
}

// ---- specific values -------------------------------------------------------

// The value tests at each level (a one-element call runs the scalar tail
// code; the same values repeated over lines run the vector loops).
class ReduceValues : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, ReduceValues, test::kAllLevels, test::isaParamName);

// a (op) b, computed both as a single element and as 200 copies (vector
// loops, streaming); the copies must agree bit for bit.
template <typename T>
T reduce2(CpuIsa isa, RedOp op, T a, T b, uint64_t divisor = 1, bool post = false) {
  const void* partials[] = {&a};
  T out{};
  Reduction r{Case<T>::kType, op};
  r.divisor = divisor;
  reduce(configFor(isa), r, &out, partials, 1, &b, 1, post);
  std::vector<T> as(200, a), bs(200, b), outs(200);
  const void* manyPartials[] = {as.data()};
  reduce(configFor(isa, true), r, outs.data(), manyPartials, 1, bs.data(), outs.size(), post);
  for (const T& o : outs) EXPECT_EQ(std::memcmp(&o, &out, sizeof(T)), 0) << "vector loop differs from the tail";
  return out;
}

TEST_P(ReduceValues, IntegersWrapAndDivideTowardZero) {
  const CpuIsa isa = GetParam();
  EXPECT_EQ(reduce2<int8_t>(isa, RedOp::kSum, 127, 1), -128);
  EXPECT_EQ(reduce2<int8_t>(isa, RedOp::kProd, -128, -1), -128);
  EXPECT_EQ(reduce2<uint8_t>(isa, RedOp::kProd, 200, 2), 144);
  EXPECT_EQ(reduce2<int32_t>(isa, RedOp::kSum, std::numeric_limits<int32_t>::max(), 1), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(reduce2<int64_t>(isa, RedOp::kProd, std::numeric_limits<int64_t>::min(), -1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(reduce2<uint64_t>(isa, RedOp::kSum, ~uint64_t(0), 2), 1u);
  EXPECT_EQ(reduce2<int32_t>(isa, RedOp::kSumPostDiv, -4, -3, 2, true), -3) << "-7/2 truncates toward zero";
  EXPECT_EQ(reduce2<int32_t>(isa, RedOp::kSumPostDiv, 4, 3, 2, true), 3);
  EXPECT_EQ(reduce2<int8_t>(isa, RedOp::kSumPostDiv, -100, -28, 3, true), -42) << "-128/3";
  EXPECT_EQ(reduce2<int64_t>(isa, RedOp::kSumPostDiv, std::numeric_limits<int64_t>::min(), 0, 1, true),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(reduce2<uint8_t>(isa, RedOp::kSumPostDiv, 250, 10, 3, true), 1) << "wrapped sum 4, then /3";
  EXPECT_EQ(reduce2<uint32_t>(isa, RedOp::kSumPostDiv, 7, 0, 0, true), 7u) << "divisor 0 treated as 1";
  EXPECT_EQ(reduce2<int8_t>(isa, RedOp::kMin, -128, 127), -128);
  EXPECT_EQ(reduce2<uint64_t>(isa, RedOp::kMax, ~uint64_t(0), 1), ~uint64_t(0));
}

TEST_P(ReduceValues, FloatMaxMinNanAndZeroRules) {
  const CpuIsa isa = GetParam();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(reduce2<float>(isa, RedOp::kMax, nan, 1.0f), 1.0f);
  EXPECT_EQ(reduce2<float>(isa, RedOp::kMax, 1.0f, nan), 1.0f);
  EXPECT_EQ(reduce2<float>(isa, RedOp::kMin, nan, -2.0f), -2.0f);
  EXPECT_TRUE(std::isnan(reduce2<float>(isa, RedOp::kMax, nan, nan)));
  EXPECT_FALSE(std::signbit(reduce2<float>(isa, RedOp::kMax, -0.0f, 0.0f)));
  EXPECT_FALSE(std::signbit(reduce2<float>(isa, RedOp::kMax, 0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(reduce2<float>(isa, RedOp::kMin, 0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(reduce2<double>(isa, RedOp::kMin, -0.0, 0.0)));
  EXPECT_EQ(reduce2<double>(isa, RedOp::kMax, -std::numeric_limits<double>::infinity(), nan), -INFINITY);
  EXPECT_TRUE(std::isnan(reduce2<float>(isa, RedOp::kSum, INFINITY, -INFINITY)));
}

TEST_P(ReduceValues, PreMulSumRoundsTheProductFirst) {
  const CpuIsa isa = GetParam();
  // float: -1 + 3 * (1/3 rounded) is 0 with the product rounded first (to
  // exactly 1), but 2^-25 if multiply and add were fused into one rounding.
  const float third = 1.0f / 3.0f;
  float a = -1.0f, x = third, out = 0;
  Reduction r{DataType::kFloat32, RedOp::kPreMulSum};
  r.scalar = scalarField(3.0f);
  const void* partials[] = {&a};
  reduce(configFor(isa), r, &out, partials, 1, &x, 1, false);
  volatile float product = 3.0f * third;  // forced rounding
  ASSERT_EQ(float(product), 1.0f);
  EXPECT_EQ(out, 0.0f);
  // Only local is pre-multiplied; with no local the partials are just summed.
  float b = 2.0f;
  const void* two[] = {&a, &b};
  reduce(configFor(isa), r, &out, two, 2, nullptr, 1, false);
  EXPECT_EQ(out, 1.0f);
  // npartials == 0: dst = pre(local).
  reduce(configFor(isa), r, &out, nullptr, 0, &b, 1, false);
  EXPECT_EQ(out, 6.0f);
}

TEST_P(ReduceValues, SingleSourceIsCopiedBitForBit) {
  const CpuIsa isa = GetParam();
  // An e5m2 infinity would saturate in any op, and a NaN payload could change;
  // a lone source with no pre/post step is copied unchanged.
  uint8_t inf = 0x7c, out = 0;
  const void* partials[] = {&inf};
  reduce(configFor(isa), Reduction{DataType::kFloat8e5m2, RedOp::kSum}, &out, partials, 1, nullptr, 1, true);
  EXPECT_EQ(out, 0x7c);
  uint32_t payloadNan = 0x7fa00001u, outBits = 0;
  reduce(configFor(isa), Reduction{DataType::kFloat32, RedOp::kMax}, &outBits, nullptr, 0, &payloadNan, 1, true);
  EXPECT_EQ(outBits, payloadNan);
}

class Copy : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, Copy, test::kAllLevels, test::isaParamName);

TEST_P(Copy, OverlapAndSamePointer) {
  // Streaming on: overlapping ranges must still behave as memmove.
  const CpuKernelConfig config = configFor(GetParam(), true);
  auto copy = [&](void* dst, const void* src, size_t bytes) { kernels::copy(config, dst, src, bytes); };
  std::vector<uint8_t> buf(100);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(i);
  copy(buf.data() + 10, buf.data(), 50);  // overlapping, forward
  for (size_t i = 0; i < 50; ++i) ASSERT_EQ(buf[10 + i], uint8_t(i));
  copy(buf.data(), buf.data(), 100);
  EXPECT_EQ(buf[0], 0);
  std::vector<uint8_t> dst(33, 0);
  copy(dst.data() + 1, buf.data() + 3, 31);
  for (size_t i = 0; i < 31; ++i) ASSERT_EQ(dst[1 + i], buf[3 + i]);
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(dst[32], 0);
}

// Streaming and regular copies, one and several destinations, every
// misalignment of dst relative to a line.
TEST_P(Copy, ToOneAndManyDestinations) {
  for (bool streaming : {false, true}) {
    const CpuKernelConfig config = configFor(GetParam(), streaming);
    for (size_t bytes : {size_t(1), size_t(63), size_t(4096 + 77), size_t(70000)}) {
      for (size_t offset : {size_t(0), size_t(1), size_t(31), size_t(63)}) {
        std::vector<uint8_t> src(bytes + 64), a(bytes + 128, 0xee), b(bytes + 128, 0xdd), c(bytes + 128, 0xcc);
        for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 13 + 7);
        const uint8_t* in = src.data() + (offset * 5) % 64;
        kernels::copy(config, a.data() + offset, in, bytes);
        void* dsts[] = {b.data() + offset, c.data() + 64 - offset};
        copyToMany(config, dsts, 2, in, bytes);
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(a[offset + i], in[i]) << "copy, byte " << i;
          ASSERT_EQ(b[offset + i], in[i]) << "copyToMany dst 0, byte " << i;
          ASSERT_EQ(c[64 - offset + i], in[i]) << "copyToMany dst 1, byte " << i;
        }
        EXPECT_EQ(a[offset + bytes], 0xee) << "copy wrote past the end";
        EXPECT_EQ(b[offset + bytes], 0xdd) << "copyToMany wrote past the end";
        if (offset > 0) {
          EXPECT_EQ(a[offset - 1], 0xee) << "copy wrote before the start";
        }
      }
    }
  }
  // A destination equal to the source is skipped.
  std::vector<uint8_t> buf(1000, 5), other(1000, 0);
  void* dsts[] = {buf.data(), other.data()};
  copyToMany(configFor(GetParam()), dsts, 2, buf.data(), buf.size());
  EXPECT_EQ(other[999], 5);
}

TEST(DataType, NamesAndSizes) {
  EXPECT_STREQ(dataTypeName(DataType::kInt8), "int8");
  EXPECT_STREQ(dataTypeName(DataType::kUint64), "uint64");
  EXPECT_STREQ(dataTypeName(DataType::kFloat16), "half");
  EXPECT_STREQ(dataTypeName(DataType::kFloat32), "float");
  EXPECT_STREQ(dataTypeName(DataType::kFloat64), "double");
  EXPECT_STREQ(dataTypeName(DataType::kBfloat16), "bfloat16");
  EXPECT_STREQ(dataTypeName(DataType::kFloat8e4m3), "f8e4m3");
  EXPECT_STREQ(dataTypeName(DataType::kFloat8e5m2), "f8e5m2");
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  for (int t = 0; t < kNumDataTypes; ++t) EXPECT_EQ(dataTypeSize(DataType(t)), sizes[t]) << t;
  EXPECT_TRUE(isFloatingType(DataType::kBfloat16));
  EXPECT_TRUE(isFloatingType(DataType::kFloat8e5m2));
  EXPECT_FALSE(isFloatingType(DataType::kUint8));
  EXPECT_STREQ(redOpName(RedOp::kSum), "sum");
  EXPECT_STREQ(redOpName(RedOp::kProd), "prod");
  EXPECT_STREQ(redOpName(RedOp::kMax), "max");
  EXPECT_STREQ(redOpName(RedOp::kMin), "min");
  EXPECT_STREQ(redOpName(RedOp::kPreMulSum), "premulsum");
  EXPECT_STREQ(redOpName(RedOp::kSumPostDiv), "sumpostdiv");
}

}  // namespace
}  // namespace loom::kernels
