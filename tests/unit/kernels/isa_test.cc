// The instruction-set levels themselves: detection and choice, bit-identical
// results across levels on random bit patterns (every type, op, shape, both
// accumulation modes, streaming on and off), fp32 accumulation against an
// independent reference, and streaming on buffers above the default
// threshold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "isa_levels.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/reduce.h"
#include "kernels/types.h"
#include "reference.h"

namespace loom::kernels {
namespace {

using test::configFor;

constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax,
                             RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv};

// ---- detection and choice ------------------------------------------------------

TEST(CpuIsa, NamesParseBack) {
  for (CpuIsa isa : kAllCpuIsas) {
    CpuIsa parsed = CpuIsa::kScalar;
    ASSERT_TRUE(parseCpuIsa(cpuIsaName(isa), &parsed)) << cpuIsaName(isa);
    EXPECT_EQ(parsed, isa);
  }
  CpuIsa parsed = CpuIsa::kScalar;
  EXPECT_TRUE(parseCpuIsa("AVX2", &parsed));
  EXPECT_EQ(parsed, CpuIsa::kAvx2);
  EXPECT_FALSE(parseCpuIsa("auto", &parsed));
  EXPECT_FALSE(parseCpuIsa("avx", &parsed));
  EXPECT_FALSE(parseCpuIsa("", &parsed));
}

TEST(CpuIsa, ChoiceFallsBackToWhatTheCpuRuns) {
  bool downgraded = true;
  EXPECT_EQ(chooseCpuIsa(std::nullopt, CpuIsa::kAvx2, &downgraded), CpuIsa::kAvx2);
  EXPECT_FALSE(downgraded);
  EXPECT_EQ(chooseCpuIsa(CpuIsa::kScalar, CpuIsa::kAvx512, &downgraded), CpuIsa::kScalar);
  EXPECT_FALSE(downgraded);
  EXPECT_EQ(chooseCpuIsa(CpuIsa::kAvx512, CpuIsa::kAvx2, &downgraded), CpuIsa::kAvx2);
  EXPECT_TRUE(downgraded);
  EXPECT_EQ(chooseCpuIsa(CpuIsa::kAvx2, CpuIsa::kScalar, &downgraded), CpuIsa::kScalar);
  EXPECT_TRUE(downgraded);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The F16C bit of CPUID leaf 1; Clang 14's __builtin_cpu_supports has no
// name for it.
bool cpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// Our cpuid/xgetbv reading against the compiler's own (which also checks the
// OS saves the registers).
TEST(CpuIsa, DetectionAgreesWithTheCompilerRuntime) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && cpuHasF16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool vbmi = avx512 && __builtin_cpu_supports("avx512vbmi");
  const CpuIsa expected = vbmi     ? CpuIsa::kAvx512Vbmi
                          : avx512 ? CpuIsa::kAvx512
                          : avx2   ? CpuIsa::kAvx2
                                   : CpuIsa::kScalar;
  EXPECT_EQ(detectedCpuIsa(), expected) << "detected " << cpuIsaName(detectedCpuIsa());
  EXPECT_TRUE(cpuIsaSupported(CpuIsa::kScalar));
  EXPECT_TRUE(cpuIsaSupported(defaultCpuKernelConfig().isa));
}
#endif

// ---- bit identity across levels ---------------------------------------------------

struct Scenario {
  int npartials;
  bool withLocal;
  bool applyPost;
  size_t count;
  size_t offset;  // misalignment of every buffer
};

// Runs one reduce at `isa` on fixed random inputs (raw bit patterns, so NaN,
// infinities, subnormals and overflow all occur) and returns dst's bytes.
std::vector<unsigned char> runAt(const CpuKernelConfig& config, const Reduction& r, const Scenario& sc,
                                 uint64_t seed) {
  const size_t size = dataTypeSize(r.type);
  const size_t bytes = sc.count * size;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<unsigned char>> inputs(size_t(sc.npartials) + 1,
                                                 std::vector<unsigned char>(bytes + 64));
  for (auto& in : inputs) {
    for (auto& b : in) b = uint8_t(rng());
  }
  std::vector<const void*> partials;
  for (int p = 0; p < sc.npartials; ++p) partials.push_back(inputs[p].data() + sc.offset);
  std::vector<unsigned char> out(bytes + 64, 0);
  reduce(config, r, out.data() + sc.offset, partials.data(), sc.npartials,
         sc.withLocal ? inputs.back().data() + sc.offset : nullptr, sc.count, sc.applyPost);
  return std::vector<unsigned char>(out.begin() + long(sc.offset), out.begin() + long(sc.offset + bytes));
}

class BitIdentity : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, BitIdentity,
                         ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vbmi),
                         test::isaParamName);

// Every level gives the scalar level's bytes. The one freedom: when two NaN
// operands meet in an arithmetic op, which NaN's payload (and sign) comes
// out is not specified (IEEE 754 leaves it open and compilers may swap the
// operands of +, *), so a NaN result only has to be a NaN.
TEST_P(BitIdentity, SameBytesAsScalarOnRandomBits) {
  const Scenario scenarios[] = {
      {1, true, true, 1000, 0},  {2, false, false, 777, 3}, {0, true, true, 513, 0},
      {3, true, true, 300, 17},  {4, true, false, 129, 1},  {1, true, false, 70, 63},
  };
  uint64_t seed = 1;
  for (int t = 0; t < kNumDataTypes; ++t) {
    const DataType type = DataType(t);
    const size_t size = dataTypeSize(type);
    for (RedOp op : kAllOps) {
      for (Accumulation acc : {Accumulation::kElementType, Accumulation::kFloat32}) {
        for (const Scenario& sc : scenarios) {
          Reduction r{type, op};
          std::mt19937_64 scalarRng(seed * 31);
          r.scalar = scalarRng();  // random bits of the type, also NaN or inf
          r.divisor = 1 + seed % 7;
          r.accumulation = acc;
          const auto expected = runAt(configFor(CpuIsa::kScalar), r, sc, seed);
          for (bool streaming : {false, true}) {
            const auto got = runAt(configFor(GetParam(), streaming), r, sc, seed);
            int bad = 0;
            for (size_t i = 0; i < sc.count && bad < 3; ++i) {
              const unsigned char* e = expected.data() + i * size;
              const unsigned char* g = got.data() + i * size;
              if (std::memcmp(e, g, size) == 0) continue;
              if (ref::isNanPattern(type, e) && ref::isNanPattern(type, g)) continue;
              ++bad;
              ADD_FAILURE() << dataTypeName(type) << " " << redOpName(op) << " fp32=" << int(acc)
                            << " npartials=" << sc.npartials << " local=" << sc.withLocal
                            << " post=" << sc.applyPost << " streaming=" << streaming << " element " << i;
            }
          }
          ++seed;
        }
      }
    }
  }
}

// ---- fp32 accumulation -------------------------------------------------------------

template <typename T>
struct NarrowCase;
template <>
struct NarrowCase<Half> {
  static constexpr DataType kType = DataType::kFloat16;
  static constexpr const ref::FormatSpec& kSpec = ref::kHalfSpec;
};
template <>
struct NarrowCase<Bfloat16> {
  static constexpr DataType kType = DataType::kBfloat16;
  static constexpr const ref::FormatSpec& kSpec = ref::kBf16Spec;
};
template <>
struct NarrowCase<Float8e4m3> {
  static constexpr DataType kType = DataType::kFloat8e4m3;
  static constexpr const ref::FormatSpec& kSpec = ref::kE4m3Spec;
};
template <>
struct NarrowCase<Float8e5m2> {
  static constexpr DataType kType = DataType::kFloat8e5m2;
  static constexpr const ref::FormatSpec& kSpec = ref::kE5m2Spec;
};

// The documented fp32 semantics, written independently: widen (exact),
// pre-multiply in float, add left to right in float, divide in float, round
// to the format once.
double fp32Reference(const ref::FormatSpec& spec, const std::vector<uint32_t>& partials, const uint32_t* local,
                     RedOp op, uint32_t scalarBits, uint64_t divisor, bool applyPost) {
  // A single source with no pre/post step is copied bit for bit (reduce.h).
  const size_t sources = partials.size() + (local != nullptr ? 1 : 0);
  const bool transform = (op == RedOp::kPreMulSum && local != nullptr) || (op == RedOp::kSumPostDiv && applyPost);
  if (sources == 1 && !transform) return ref::decode(local != nullptr ? *local : partials[0], spec);
  float acc = 0;
  bool have = false;
  for (uint32_t p : partials) {
    const float x = float(ref::decode(p, spec));
    acc = have ? acc + x : x;
    have = true;
  }
  if (local != nullptr) {
    float x = float(ref::decode(*local, spec));
    if (op == RedOp::kPreMulSum) {
      volatile float product = x * float(ref::decode(scalarBits, spec));  // rounded to float on its own
      x = product;
    }
    acc = have ? acc + x : x;
  }
  if (applyPost && op == RedOp::kSumPostDiv) acc = acc / float(divisor);
  return ref::round(double(acc), spec, spec.satFinite);
}

template <typename P>
class Fp32AccumulationTest : public ::testing::Test {
 protected:
  using T = typename P::Type;
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(P::kIsa); }
};
#define LOOM_AT_LEVELS(T)                                                                  \
  test::AtLevel<T, CpuIsa::kScalar>, test::AtLevel<T, CpuIsa::kAvx2>, test::AtLevel<T, CpuIsa::kAvx512>, \
      test::AtLevel<T, CpuIsa::kAvx512Vbmi>
using NarrowAllLevels = ::testing::Types<LOOM_AT_LEVELS(Half), LOOM_AT_LEVELS(Bfloat16), LOOM_AT_LEVELS(Float8e4m3),
                                         LOOM_AT_LEVELS(Float8e5m2)>;
#undef LOOM_AT_LEVELS
TYPED_TEST_SUITE(Fp32AccumulationTest, NarrowAllLevels, test::LevelNames);

TYPED_TEST(Fp32AccumulationTest, MatchesTheFloatChainRoundedOnce) {
  using T = typename TestFixture::T;
  using Bits = std::conditional_t<sizeof(T) == 1, uint8_t, uint16_t>;
  constexpr const ref::FormatSpec& spec = NarrowCase<T>::kSpec;
  std::mt19937_64 rng(77);
  // Encodings of k * 2^-j (|k| <= 7, j <= 5): sums of these round
  // differently per step than once.
  std::vector<Bits> small;
  for (uint32_t b = 0; b < (1u << (8 * sizeof(T))); ++b) {
    const double v = ref::decode(b, spec);
    for (int j = 0; j <= 5 && !std::isnan(v); ++j) {
      const double k = std::ldexp(v, j);
      if (k == std::floor(k) && std::fabs(k) <= 7 && k != 0) {
        small.push_back(Bits(b));
        break;
      }
    }
  }
  ASSERT_FALSE(small.empty());
  for (RedOp op : {RedOp::kSum, RedOp::kPreMulSum, RedOp::kSumPostDiv}) {
    for (int np : {0, 1, 2, 3, 6}) {
      for (bool streaming : {false, true}) {
        const size_t count = 2000 + size_t(np) * 7;
        std::vector<std::vector<Bits>> partials(static_cast<size_t>(np), std::vector<Bits>(count));
        std::vector<Bits> local(count), out(count);
        // Every other element a random pattern (NaN, inf, subnormals...),
        // the rest small values.
        auto draw = [&](size_t i) { return i % 2 == 0 ? small[rng() % small.size()] : Bits(rng()); };
        for (auto& p : partials) {
          for (size_t i = 0; i < count; ++i) p[i] = draw(i);
        }
        for (size_t i = 0; i < count; ++i) local[i] = draw(i);
        std::vector<const void*> ptrs;
        for (auto& p : partials) ptrs.push_back(p.data());
        Reduction r{NarrowCase<T>::kType, op};
        r.scalar = sizeof(T) == 1 ? 0x33 : 0x3555;  // some ordinary value of each format
        r.divisor = 3;
        r.accumulation = Accumulation::kFloat32;
        reduce(configFor(TypeParam::kIsa, streaming), r, out.data(), ptrs.data(), np, local.data(), count, true);
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; ++i) {
          std::vector<uint32_t> in;
          for (auto& p : partials) in.push_back(p[i]);
          const uint32_t l = local[i];
          const double expected = fp32Reference(spec, in, &l, op, uint32_t(r.scalar), r.divisor, true);
          const double got = ref::decode(out[i], spec);
          if (ref::same(expected, got)) continue;
          ++bad;
          ADD_FAILURE() << redOpName(op) << " npartials=" << np << " element " << i << ": expected " << expected
                        << " got " << got;
        }
      }
    }
  }
}

// The example the option exists for: 1 + 2^-11 + 2^-11 in half. Rounded per
// step, each addition ties back to 1; in float the sum is 1 + 2^-10, one ulp.
TEST(Fp32Accumulation, HalfExampleRoundsOnce) {
  for (CpuIsa isa : kAllCpuIsas) {
    if (!cpuIsaSupported(isa)) continue;
    const std::vector<uint16_t> one(300, 0x3c00), tiny(300, 0x1000);  // 1.0, 2^-11
    const void* partials[] = {one.data(), tiny.data()};
    std::vector<uint16_t> out(300, 0);
    Reduction r{DataType::kFloat16, RedOp::kSum};
    r.accumulation = Accumulation::kElementType;
    reduce(configFor(isa), r, out.data(), partials, 2, tiny.data(), out.size(), false);
    EXPECT_EQ(out[0], 0x3c00) << cpuIsaName(isa);
    EXPECT_EQ(out[299], 0x3c00) << cpuIsaName(isa);
    r.accumulation = Accumulation::kFloat32;
    reduce(configFor(isa), r, out.data(), partials, 2, tiny.data(), out.size(), false);
    EXPECT_EQ(out[0], 0x3c01) << cpuIsaName(isa);
    EXPECT_EQ(out[299], 0x3c01) << cpuIsaName(isa);
  }
}

// ---- streaming on large buffers ------------------------------------------------------

// Above the default streaming threshold (8 MiB of destination), with the
// process's default configuration and with streaming forced off.
TEST(Streaming, LargeReduceAndCopyMatchRegularStores) {
  const size_t count = (size_t(12) << 20) / sizeof(float) + 5;  // 12 MiB + a tail
  std::vector<float> a(count), b(count), streamed(count + 16), regular(count + 16);
  for (size_t i = 0; i < count; ++i) {
    a[i] = float(i % 1000) * 0.25f;
    b[i] = float(i % 77) - 30.0f;
  }
  const void* partials[] = {a.data()};
  Reduction r{DataType::kFloat32, RedOp::kSum};
  for (size_t offset : {0, 1}) {  // aligned, and dst misaligned by one element
    for (CpuIsa isa : kAllCpuIsas) {
      if (!cpuIsaSupported(isa)) continue;
      reduce(configFor(isa, true), r, streamed.data() + offset, partials, 1, b.data(), count, false);
      reduce(configFor(isa, false), r, regular.data() + offset, partials, 1, b.data(), count, false);
      ASSERT_EQ(std::memcmp(streamed.data() + offset, regular.data() + offset, count * sizeof(float)), 0)
          << cpuIsaName(isa) << " offset " << offset;
      EXPECT_EQ(streamed[offset + count - 1], a[count - 1] + b[count - 1]);
      std::fill(streamed.begin(), streamed.end(), 0.0f);
      copy(configFor(isa, true), streamed.data() + offset, a.data(), count * sizeof(float));
      ASSERT_EQ(std::memcmp(streamed.data() + offset, a.data(), count * sizeof(float)), 0) << cpuIsaName(isa);
    }
  }
  // The default configuration (LOOM_CPU_STREAMING_BYTES) on the same call.
  reduce(r, streamed.data(), partials, 1, b.data(), count, false);
  reduce(configFor(CpuIsa::kScalar), r, regular.data(), partials, 1, b.data(), count, false);
  EXPECT_EQ(std::memcmp(streamed.data(), regular.data(), count * sizeof(float)), 0);
}

// copyForPeer: below and above its threshold (8 KiB by default), every
// alignment of either end and odd lengths copy exactly, nothing past the end.
TEST(Streaming, CopyForPeerCopiesExactlyAtEverySizeAndAlignment) {
  EXPECT_EQ(defaultCpuKernelConfig().handoffStreamingMinBytes, size_t(8192));
  std::vector<uint8_t> src(70000), dst(70100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 7 + 3);
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(8191), size_t(8192), size_t(8193), size_t(65536),
                       size_t(69999)}) {
    for (size_t dstOff : {0, 1, 17, 64}) {
      for (size_t srcOff : {0, 5}) {
        if (srcOff + bytes > src.size()) continue;
        std::fill(dst.begin(), dst.end(), uint8_t(0xee));
        copyForPeer(dst.data() + dstOff, src.data() + srcOff, bytes);
        ASSERT_EQ(std::memcmp(dst.data() + dstOff, src.data() + srcOff, bytes), 0) << bytes << " " << dstOff;
        for (size_t i = 0; i < dstOff; ++i) ASSERT_EQ(dst[i], 0xee) << "before, " << bytes << " " << dstOff;
        for (size_t i = dstOff + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee) << "after, " << bytes;
      }
    }
  }
}

// copySmall: every size it copies inline (0..64) and some it hands to
// memcpy, at every alignment of either end, copy exactly and write nothing
// outside the destination.
TEST(Streaming, CopySmallCopiesExactlyAtEverySizeAndAlignment) {
  std::vector<uint8_t> src(200 + 16), dst(200 + 32);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 13 + 1);
  for (size_t bytes = 0; bytes <= 200; bytes += bytes < 70 ? 1 : 65) {
    for (size_t dstOff = 0; dstOff < 16; ++dstOff) {
      for (size_t srcOff : {0, 3, 8, 15}) {
        std::fill(dst.begin(), dst.end(), uint8_t(0xee));
        copySmall(dst.data() + dstOff, src.data() + srcOff, bytes);
        ASSERT_EQ(std::memcmp(dst.data() + dstOff, src.data() + srcOff, bytes), 0) << bytes << " " << dstOff;
        for (size_t i = 0; i < dstOff; ++i) ASSERT_EQ(dst[i], 0xee) << "before, " << bytes << " " << dstOff;
        for (size_t i = dstOff + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee) << "after, " << bytes;
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels
