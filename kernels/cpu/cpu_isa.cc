#include "kernels/cpu/cpu_isa.h"

#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/log.h"
#include "common/settings.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define LOOM_KERNELS_X86 1
#endif

namespace loom::kernels {
namespace {

#if defined(LOOM_KERNELS_X86)
// XCR0: which register files the OS saves on a context switch. Read with the
// raw instruction so no -mxsave flag is needed.
uint64_t readXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuIsa detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return CpuIsa::kScalar;
  const bool osxsave = (ecx >> 27) & 1u;
  const bool avx = (ecx >> 28) & 1u;
  const bool f16c = (ecx >> 29) & 1u;
  if (!osxsave || !avx || !f16c) return CpuIsa::kScalar;
  const uint64_t xcr0 = readXcr0();
  const bool ymmState = (xcr0 & 0x6) == 0x6;     // SSE and AVX state
  const bool zmmState = (xcr0 & 0xe0) == 0xe0;   // opmask, ZMM0-15 high halves, ZMM16-31
  if (!ymmState) return CpuIsa::kScalar;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return CpuIsa::kScalar;
  const bool avx2 = (ebx >> 5) & 1u;
  if (!avx2) return CpuIsa::kScalar;
  const bool avx512f = (ebx >> 16) & 1u;
  const bool avx512dq = (ebx >> 17) & 1u;
  const bool avx512bw = (ebx >> 30) & 1u;
  const bool avx512vl = (ebx >> 31) & 1u;
  const bool avx512vbmi = (ecx >> 1) & 1u;
  if (zmmState && avx512f && avx512dq && avx512bw && avx512vl) {
    return avx512vbmi ? CpuIsa::kAvx512Vbmi : CpuIsa::kAvx512;
  }
  return CpuIsa::kAvx2;
}
#else
CpuIsa detect() { return CpuIsa::kScalar; }
#endif

// The largest cache sysfs lists for CPU 0 (its last level, which the
// host's other cores share on the machines loom runs on); 0 when none is
// listed (containers may hide sysfs).
size_t lastLevelCacheBytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream type(dir + "type"), size(dir + "size");
    std::string kind, text;
    if (!(type >> kind) || !(size >> text)) continue;
    if (kind == "Instruction") continue;
    char* end = nullptr;
    size_t bytes = std::strtoull(text.c_str(), &end, 10);
    if (end && (*end == 'K' || *end == 'k')) bytes <<= 10;
    else if (end && *end == 'M') bytes <<= 20;
    best = std::max(best, bytes);
  }
  return best;
}

CpuKernelConfig resolveDefaultConfig() {
  CpuKernelConfig config;
  const auto settings = settings::current();
  const std::string text = settings->getString("LOOM_CPU_ISA");
  std::optional<CpuIsa> requested;
  CpuIsa parsed = CpuIsa::kScalar;
  if (parseCpuIsa(text, &parsed)) {
    requested = parsed;
  } else if (!text.empty() && strcasecmp(text.c_str(), "auto") != 0) {
    LOOM_WARN("LOOM_CPU_ISA=%s is not one of auto, avx512vbmi, avx512, avx2, scalar; using auto", text.c_str());
  }
  bool downgraded = false;
  config.isa = chooseCpuIsa(requested, detectedCpuIsa(), &downgraded);
  if (downgraded) {
    LOOM_WARN("LOOM_CPU_ISA=%s asks for instructions this CPU lacks; the host kernels use %s instead",
              text.c_str(), cpuIsaName(config.isa));
  }
  const int64_t streaming = settings->getInt("LOOM_CPU_STREAMING_BYTES");
  config.streamingMinBytes = streaming <= 0 ? SIZE_MAX : size_t(streaming);
  const int64_t handoff = settings->getInt("LOOM_CPU_HANDOFF_STREAMING_BYTES");
  config.handoffStreamingMinBytes = handoff <= 0 ? SIZE_MAX : size_t(handoff);
  const int64_t cache = settings->getInt("LOOM_CPU_CACHE_BYTES");
  config.cacheBytes = cache < 0 ? lastLevelCacheBytes() : size_t(cache);
  LOOM_INFO(log::kInit, "host kernels: %s (CPU runs up to %s), streaming stores from %lld bytes, shared cache %zu bytes",
            cpuIsaName(config.isa), cpuIsaName(detectedCpuIsa()), static_cast<long long>(streaming),
            config.cacheBytes);
  return config;
}

bool resolveAccumulateInFloat32() {
  const std::string text = settings::current()->getString("LOOM_ACCUMULATE");
  if (strcasecmp(text.c_str(), "fp32") == 0) return true;
  if (!text.empty() && strcasecmp(text.c_str(), "native") != 0) {
    LOOM_WARN("LOOM_ACCUMULATE=%s is not one of native, fp32; using native", text.c_str());
  }
  return false;
}

}  // namespace

const char* cpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Vbmi: return "avx512vbmi";
  }
  return "unknown";
}

bool parseCpuIsa(std::string_view text, CpuIsa* out) {
  for (CpuIsa isa : kAllCpuIsas) {
    const std::string_view name = cpuIsaName(isa);
    if (text.size() == name.size() && strncasecmp(text.data(), name.data(), name.size()) == 0) {
      *out = isa;
      return true;
    }
  }
  return false;
}

CpuIsa detectedCpuIsa() {
  static const CpuIsa detected = detect();
  return detected;
}

CpuIsa chooseCpuIsa(std::optional<CpuIsa> requested, CpuIsa detected, bool* downgraded) {
  *downgraded = false;
  if (!requested) return detected;
  if (int(*requested) > int(detected)) {
    *downgraded = true;
    return detected;
  }
  return *requested;
}

const CpuKernelConfig& defaultCpuKernelConfig() {
  static const CpuKernelConfig config = resolveDefaultConfig();
  return config;
}

bool defaultAccumulateInFloat32() {
  static const bool fp32 = resolveAccumulateInFloat32();
  return fp32;
}

}  // namespace loom::kernels
