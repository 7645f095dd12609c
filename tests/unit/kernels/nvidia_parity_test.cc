// loom's narrow float types and fp8 reductions against NVIDIA's own host
// implementations in cuda_fp16.h / cuda_bf16.h / cuda_fp8.h (header-only,
// no GPU or CUDA runtime needed). Skipped when the toolkit headers are absent.
//
// Expected differences, all documented in kernels/types.h and ops.h:
//  - NaN payloads: NVIDIA returns one canonical NaN, loom keeps sign and
//    payload; compared as "both NaN".
// fp8 ops: NCCL on sm_90 computes in half, loom in float; this checks that
// both give the same bits for every pair of operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "isa_levels.h"
#include "kernels/reduce.h"
#include "kernels/types.h"

#if defined(LOOM_TEST_HAVE_CUDA_FP_HEADERS) && __has_include(<cuda_fp8.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define LOOM_PARITY_ENABLED 1
#endif

namespace loom::kernels {
namespace {

#if defined(LOOM_PARITY_ENABLED)

bool bothNanOrEqual(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

uint16_t nvHalfBits(__half h) { return __half_raw(h).x; }
__half nvHalfFromBits(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half(r);
}

// Sampled float patterns plus the neighbourhoods of powers of two.
std::vector<float> sampleFloats() {
  std::vector<float> xs;
  uint32_t u = 0;
  for (uint64_t i = 0; i < (uint64_t(1) << 32) / 4099; ++i, u += 4099) xs.push_back(std::bit_cast<float>(u));
  for (int e = -150; e <= 128; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float x : {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY), p * 1.5f}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  return xs;
}

TEST(NvidiaParity, HalfAndBfloat16Narrowing) {
  for (float x : sampleFloats()) {
    const float nvHalf = __half2float(__float2half_rn(x));
    ASSERT_TRUE(bothNanOrEqual(Half::fromFloat(x).toFloat(), nvHalf)) << std::hexfloat << x;
    if (!std::isnan(x)) {
      ASSERT_EQ(Half::fromFloat(x).bits, nvHalfBits(__float2half_rn(x))) << std::hexfloat << x;
    }
    const float nvBf = __bfloat162float(__float2bfloat16_rn(x));
    ASSERT_TRUE(bothNanOrEqual(Bfloat16::fromFloat(x).toFloat(), nvBf)) << std::hexfloat << x;
  }
}

TEST(NvidiaParity, HalfAndBfloat16Widening) {
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_TRUE(bothNanOrEqual(Half::fromBits(uint16_t(b)).toFloat(), __half2float(nvHalfFromBits(uint16_t(b)))));
    __nv_bfloat16_raw r;
    r.x = uint16_t(b);
    ASSERT_TRUE(bothNanOrEqual(Bfloat16::fromBits(uint16_t(b)).toFloat(), __bfloat162float(__nv_bfloat16(r))));
  }
}

TEST(NvidiaParity, Fp8ConversionsBothSaturationModes) {
  auto isNan4 = [](uint8_t b) { return (b & 0x7f) == 0x7f; };
  auto isNan5 = [](uint8_t b) { return (b & 0x7f) > 0x7c; };
  for (float x : sampleFloats()) {
    if (std::isnan(x)) {
      // NVIDIA narrows every NaN to the positive canonical one; loom keeps
      // the sign (and e5m2 payload bits). Both must be NaN.
      EXPECT_TRUE(isNan4(Float8e4m3::fromFloat(x).bits) && isNan4(Float8e4m3::fromFloatSatFinite(x).bits));
      EXPECT_TRUE(isNan4(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)));
      EXPECT_TRUE(isNan5(Float8e5m2::fromFloat(x).bits) && isNan5(Float8e5m2::fromFloatSatFinite(x).bits));
      EXPECT_TRUE(isNan5(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)));
      continue;
    }
    EXPECT_EQ(Float8e4m3::fromFloat(x).bits, __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)) << std::hexfloat << x;
    EXPECT_EQ(Float8e4m3::fromFloatSatFinite(x).bits, __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3))
        << std::hexfloat << x;
    EXPECT_EQ(Float8e5m2::fromFloat(x).bits, __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2)) << std::hexfloat << x;
    EXPECT_EQ(Float8e5m2::fromFloatSatFinite(x).bits, __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2))
        << std::hexfloat << x;
    if (HasFailure()) return;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    const float nv4 = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3)));
    const float nv5 = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E5M2)));
    EXPECT_TRUE(bothNanOrEqual(Float8e4m3::fromBits(uint8_t(b)).toFloat(), nv4)) << b;
    EXPECT_TRUE(bothNanOrEqual(Float8e5m2::fromBits(uint8_t(b)).toFloat(), nv5)) << b;
  }
}

// What NCCL's sm_90 fp8 kernels compute: widen to half, operate in half,
// narrow with SATFINITE.
uint8_t ncclSm90(RedOp op, __nv_fp8_interpretation_t fmt, uint8_t a, uint8_t b) {
  const __half ha(__nv_cvt_fp8_to_halfraw(a, fmt));
  const __half hb(__nv_cvt_fp8_to_halfraw(b, fmt));
  __half r;
  switch (op) {
    case RedOp::kSum: r = __hadd(ha, hb); break;
    case RedOp::kProd: r = __hmul(ha, hb); break;
    case RedOp::kMax: r = __hmax(ha, hb); break;
    default: r = __hmin(ha, hb); break;
  }
  return __nv_cvt_halfraw_to_fp8(__half_raw(r), __NV_SATFINITE, fmt);
}

void checkFp8Parity(CpuIsa isa, DataType type, __nv_fp8_interpretation_t fmt) {
  std::vector<uint8_t> a(65536), b(65536), out(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    a[i] = uint8_t(i >> 8);
    b[i] = uint8_t(i);
  }
  for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin}) {
    const void* partials[] = {a.data()};
    reduce(test::configFor(isa), Reduction{type, op}, out.data(), partials, 1, b.data(), a.size(), false);
    int differ = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint8_t nv = ncclSm90(op, fmt, a[i], b[i]);
      const bool nanBoth = (nv & 0x7f) > (fmt == __NV_E4M3 ? 0x7e : 0x7c) &&
                           (out[i] & 0x7f) > (fmt == __NV_E4M3 ? 0x7e : 0x7c);
      if (nv == out[i] || nanBoth) continue;
      ADD_FAILURE() << redOpName(op) << std::hex << " a=0x" << int(a[i]) << " b=0x" << int(b[i]) << " nccl=0x"
                    << int(nv) << " loom=0x" << int(out[i]);
      if (++differ >= 5) return;
    }
  }
}

// premulsum on sm_90: the local input is multiplied by the scalar in half,
// narrowed (SATFINITE), then summed like any other input.
void checkFp8PreMulSumParity(CpuIsa isa, DataType type, __nv_fp8_interpretation_t fmt) {
  std::vector<uint8_t> a(65536), b(65536), out(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    a[i] = uint8_t(i >> 8);
    b[i] = uint8_t(i);
  }
  for (uint8_t scalar : {0x30, 0xbc, 0x01, 0x7b, 0x42}) {
    const void* partials[] = {a.data()};
    Reduction r{type, RedOp::kPreMulSum};
    r.scalar = scalar;
    reduce(test::configFor(isa), r, out.data(), partials, 1, b.data(), a.size(), false);
    const uint8_t nanMin = fmt == __NV_E4M3 ? 0x7f : 0x7d;
    int differ = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint8_t pre = ncclSm90(RedOp::kProd, fmt, b[i], scalar);
      const uint8_t nv = ncclSm90(RedOp::kSum, fmt, a[i], pre);
      if (nv == out[i] || ((nv & 0x7f) >= nanMin && (out[i] & 0x7f) >= nanMin)) continue;
      ADD_FAILURE() << std::hex << "scalar=0x" << int(scalar) << " a=0x" << int(a[i]) << " b=0x" << int(b[i])
                    << " nccl=0x" << int(nv) << " loom=0x" << int(out[i]);
      if (++differ >= 5) return;
    }
  }
}

// Every test at each instruction-set level the CPU runs.
class NvidiaParity : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { LOOM_SKIP_UNLESS_CPU_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, NvidiaParity, test::kAllLevels, test::isaParamName);

TEST_P(NvidiaParity, Fp8e4m3OpsMatchNcclSm90) {
  checkFp8Parity(GetParam(), DataType::kFloat8e4m3, __NV_E4M3);
  checkFp8PreMulSumParity(GetParam(), DataType::kFloat8e4m3, __NV_E4M3);
}
TEST_P(NvidiaParity, Fp8e5m2OpsMatchNcclSm90) {
  checkFp8Parity(GetParam(), DataType::kFloat8e5m2, __NV_E5M2);
  checkFp8PreMulSumParity(GetParam(), DataType::kFloat8e5m2, __NV_E5M2);
}

// Half ops against NVIDIA's __hadd/__hmul/__hmax/__hmin (host versions, which
// the sm_80+ instructions match: correctly rounded, same NaN/zero rules).
TEST_P(NvidiaParity, HalfOpsMatchCudaFp16) {
  std::vector<uint16_t> a(65536), b(65536), out(65536);
  const uint16_t operands[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x83ff,
                               0x7bff, 0xfbff, 0x3c00, 0xbc01, 0x1400, 0x6400, 0xc248};
  for (uint32_t i = 0; i < 65536; ++i) a[i] = uint16_t(i);
  for (uint16_t operand : operands) {
    std::fill(b.begin(), b.end(), operand);
    for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin}) {
      const void* partials[] = {a.data()};
      reduce(test::configFor(GetParam()), Reduction{DataType::kFloat16, op}, out.data(), partials, 1, b.data(),
             a.size(), false);
      for (uint32_t i = 0; i < 65536; ++i) {
        const __half x = nvHalfFromBits(a[i]), y = nvHalfFromBits(operand);
        const __half nv = op == RedOp::kSum    ? __hadd(x, y)
                          : op == RedOp::kProd ? __hmul(x, y)
                          : op == RedOp::kMax  ? __hmax(x, y)
                                               : __hmin(x, y);
        ASSERT_TRUE(bothNanOrEqual(Half::fromBits(out[i]).toFloat(), __half2float(nv)))
            << redOpName(op) << std::hex << " a=0x" << a[i] << " b=0x" << operand;
        const bool zero = (out[i] & 0x7fff) == 0;
        if (zero) {
          ASSERT_EQ(out[i], nvHalfBits(nv)) << "sign of zero";
        }
      }
    }
  }
}

#else

TEST(NvidiaParity, Skipped) {
  GTEST_SKIP() << "cuda_fp8.h not found at configure time (set LOOM_TEST_CUDA_FP_HEADERS_DIR to the CUDA "
                  "include directory to compare against NVIDIA's conversions)";
}

#endif

}  // namespace
}  // namespace loom::kernels
