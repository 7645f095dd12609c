// Runs the host-kernel tests once per instruction-set level (and with and
// without streaming stores). Levels the CPU lacks are skipped with a message,
// never counted as passed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/types.h"

namespace loom::kernels::test {

// streaming: every call uses non-temporal stores where dst allows (threshold
// 0), else none at all.
inline CpuKernelConfig configFor(CpuIsa isa, bool streaming = false) {
  CpuKernelConfig config;
  config.isa = isa;
  config.streamingMinBytes = streaming ? 0 : SIZE_MAX;
  return config;
}

// A (type, level) pair for typed tests.
template <typename T, CpuIsa kLevel>
struct AtLevel {
  using Type = T;
  static constexpr CpuIsa kIsa = kLevel;
};

template <typename T>
const char* elementName();
template <> inline const char* elementName<int8_t>() { return "int8"; }
template <> inline const char* elementName<uint8_t>() { return "uint8"; }
template <> inline const char* elementName<int32_t>() { return "int32"; }
template <> inline const char* elementName<uint32_t>() { return "uint32"; }
template <> inline const char* elementName<int64_t>() { return "int64"; }
template <> inline const char* elementName<uint64_t>() { return "uint64"; }
template <> inline const char* elementName<float>() { return "float"; }
template <> inline const char* elementName<double>() { return "double"; }
template <> inline const char* elementName<Half>() { return "half"; }
template <> inline const char* elementName<Bfloat16>() { return "bfloat16"; }
template <> inline const char* elementName<Float8e4m3>() { return "f8e4m3"; }
template <> inline const char* elementName<Float8e5m2>() { return "f8e5m2"; }

// gtest names "ReduceTest/half_avx512" instead of "ReduceTest/17".
struct LevelNames {
  template <typename P>
  static std::string GetName(int) {
    return std::string(elementName<typename P::Type>()) + "_" + cpuIsaName(P::kIsa);
  }
};

inline std::string isaParamName(const ::testing::TestParamInfo<CpuIsa>& info) { return cpuIsaName(info.param); }

inline const auto kAllLevels =
    ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vbmi);

}  // namespace loom::kernels::test

// In SetUp() or a test body: skip when this CPU cannot run `isa`.
#define LOOM_SKIP_UNLESS_CPU_RUNS(isa)                                                                   \
  do {                                                                                                   \
    if (!::loom::kernels::cpuIsaSupported(isa)) {                                                         \
      GTEST_SKIP() << "skipped: this CPU lacks " << ::loom::kernels::cpuIsaName(isa)                     \
                   << " (it runs up to " << ::loom::kernels::cpuIsaName(::loom::kernels::detectedCpuIsa()) \
                   << "), so those kernels cannot be tested here";                                       \
    }                                                                                                    \
  } while (0)
