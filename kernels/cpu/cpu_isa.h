// Which x86 vector instruction set the host kernels run with, and the other
// per-process choices of the host kernels (streaming stores, accumulation).
//
// The library is built for the baseline x86-64 ISA; the AVX2 and AVX-512
// kernels live in their own translation units whose functions carry target
// attributes, and are only called after the CPU (and the OS, for the vector
// register state) was checked here. Every level computes bit-identical
// results: they differ only in speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom::kernels {

// Ordered: a CPU that runs a level runs every lower one.
enum class CpuIsa : int {
  kScalar = 0,  // portable C++ at the build's baseline ISA
  kAvx2 = 1,    // AVX2 + F16C (no FMA: ops never fuse a multiply into an add)
  kAvx512 = 2,  // AVX-512 F, BW, VL, DQ (+ AVX2, F16C)
  // kAvx512 + VBMI (Ice Lake, Zen 4 and later): byte permutes from 128-entry
  // tables make the fp8 kernels much cheaper; every other type runs kAvx512's.
  kAvx512Vbmi = 3,
};
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vbmi};

const char* cpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512", "avx512vbmi"
// Parses "scalar", "avx2", "avx512" or "avx512vbmi" (case-insensitive). False otherwise.
bool parseCpuIsa(std::string_view text, CpuIsa* out);

// Highest level this CPU and OS run (detected once, with cpuid/xgetbv).
CpuIsa detectedCpuIsa();
inline bool cpuIsaSupported(CpuIsa isa) { return int(isa) <= int(detectedCpuIsa()); }

// The level to use: `requested` (nullopt = automatic) if the CPU runs it,
// else the best the CPU runs; *downgraded says the request was lowered.
CpuIsa chooseCpuIsa(std::optional<CpuIsa> requested, CpuIsa detected, bool* downgraded);

// How host reduce/copy calls run. Any number of threads may share one.
struct CpuKernelConfig {
  CpuIsa isa = CpuIsa::kScalar;
  // A call whose destination takes at least this many bytes writes it with
  // non-temporal (cache-bypassing) stores where the destination is aligned
  // to its element size; SIZE_MAX: never. Streaming pays off only when the
  // data would not stay in the caches anyway: the default (setting
  // LOOM_CPU_STREAMING_BYTES) is 8 MiB of destination, i.e. a 2-source
  // reduce touching >= 24 MiB, beyond a core's share of a server L3. Below
  // that the result stays cached for whoever reads it next. An sfence ends
  // every streaming call, so the data is ordered before any later store
  // (e.g. a ready flag) of the calling thread. fp8 reductions never stream
  // (bound by arithmetic, they measured slower with it).
  size_t streamingMinBytes = SIZE_MAX;
  // copyForPeer(): a copy that another core reads next (the shared-memory
  // board's slots and FIFO pieces, when transport/shm/handoff.h says so)
  // streams from this many bytes (setting
  // LOOM_CPU_HANDOFF_STREAMING_BYTES, default 8 KiB). The reader then
  // fetches lines from memory instead of taking each one, modified, out
  // of the writer's cache, and the writer's next copy into the slot needs
  // no ownership request for lines the reader holds: on the EPYC VM in its
  // slow placement (where handoff.h streams), 2 ranks, Broadcast of
  // 16 KiB from 3-8 to 1.4 us, AllReduce of 64 KiB on 4 ranks from 77 to
  // 30 us. Below 8 KiB it measured the same or slower.
  size_t handoffStreamingMinBytes = SIZE_MAX;
  // The cache that the ranks of one host share last (setting
  // LOOM_CPU_CACHE_BYTES; by default the largest cache sysfs lists for
  // CPU 0); 0: unknown. The executor streams an operation's results only
  // when its ranks' buffers outgrow a quarter of it: below that they stay
  // cached for the next call, which reads them from the cache. On the
  // Intel VM (480 MiB L3), 2 ranks, AllReduce of 16 MiB in place: 2.6 ->
  // 2.2 ms.
  size_t cacheBytes = 0;
};

// The process-wide configuration, resolved on first use from the settings
// LOOM_CPU_ISA (auto|avx512vbmi|avx512|avx2|scalar; asking for a level the CPU lacks
// logs one warning and uses the best available one),
// LOOM_CPU_STREAMING_BYTES, LOOM_CPU_HANDOFF_STREAMING_BYTES and
// LOOM_CPU_CACHE_BYTES. Thread-safe;
// never changes afterwards.
const CpuKernelConfig& defaultCpuKernelConfig();

// LOOM_ACCUMULATE=fp32 (read once per process): see Accumulation in reduce.h.
bool defaultAccumulateInFloat32();

}  // namespace loom::kernels
