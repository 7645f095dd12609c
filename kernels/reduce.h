// Host (CPU) reduction entry points used by the engine's host-memory paths.
//
// Thread safety: pure functions of their arguments; any number of threads may
// call them at once on disjoint destinations.
//
// The functions without a CpuKernelConfig run with defaultCpuKernelConfig()
// (kernels/cpu/cpu_isa.h): the best instruction set the CPU has (or
// LOOM_CPU_ISA), streaming stores from LOOM_CPU_STREAMING_BYTES. Every
// instruction-set level gives bit-identical results, with one freedom shared
// with IEEE 754 and NCCL: a NaN result is a NaN at every level, but when two
// NaNs meet in an arithmetic op, which one's payload and sign come out may
// differ between levels (compilers order the operands of + and * freely,
// and F16C quiets signalling NaNs when widening).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/datatype.h"

namespace loom::kernels {

// How sums of half, bfloat16 and fp8 values are accumulated.
//  - kElementType: round to the element type after every step (NCCL's
//    behaviour; see "Details of the contract" below).
//  - kFloat32: within one reduce() call, every source is widened to float,
//    the pre-multiply (kPreMulSum) is done in float, the sources are added
//    left to right in float (each add rounds to float), the kSumPostDiv
//    division is done in float, and the result is rounded to the element
//    type once. Applies to kSum, kPreMulSum and kSumPostDiv on kFloat16,
//    kBfloat16, kFloat8e4m3 and kFloat8e5m2; other types and ops ignore it.
//    With two sources and no pre/post step both modes give the same bits.
//    Note the scope: the rounding happens once per call, so in a collective
//    whose partial results travel between ranks in the element type (ring,
//    tree) the result is still rounded once per step of the algorithm.
//  - kDefault: kFloat32 when the setting LOOM_ACCUMULATE is "fp32", else
//    kElementType (read once per process). All ranks of a communicator must
//    use the same setting for results to be reproducible.
enum class Accumulation : uint8_t { kDefault, kElementType, kFloat32 };

struct Reduction {
  DataType type;
  RedOp op;
  // kPreMulSum: the scalar, as a value of `type` stored in the low bytes (memcpy of the typed value).
  uint64_t scalar = 0;
  // kSumPostDiv: the divisor (nranks).
  uint64_t divisor = 1;
  Accumulation accumulation = Accumulation::kDefault;
};

// dst[i] = post( partials[0][i] (+) ... (+) partials[npartials-1][i] (+) pre(local[i]) )
// pre(x) = scalar*x for kPreMulSum, x otherwise; post(x) = x/divisor for kSumPostDiv when applyPost, x otherwise.
// local may be null (then only partials are combined); npartials may be 0 (then dst = post(pre(local))).
// dst may alias any source exactly (same pointer); partial overlap is not allowed. count is in elements.
//
// Details of the contract:
//  - Sources are combined strictly left to right as written above, rounding
//    to `type` after every step (kernels/ops.h documents each op's rounding,
//    NaN and overflow rules), so results are deterministic for a given order.
//    (Accumulation::kFloat32 instead rounds sums of the narrow float types
//    once, see above.)
//  - No alignment is required of any pointer.
//  - With no source at all (npartials == 0 and local == null) nothing is
//    written. A divisor of 0 is treated as 1.
//  - A single source with no pre/post step is copied bit for bit (no
//    conversion, so NaN payloads and fp8 infinities survive it).
//  - All sources are read in one pass: each element of dst is written once,
//    with no intermediate copy of the data through memory.
void reduce(const Reduction& r, void* dst, const void* const* partials, int npartials,
            const void* local, size_t count, bool applyPost);
// The same on an explicitly chosen configuration (tests, benchmarks). A level
// the CPU lacks is lowered to the best one it has.
void reduce(const CpuKernelConfig& config, const Reduction& r, void* dst, const void* const* partials,
            int npartials, const void* local, size_t count, bool applyPost);

// memcpy-like copy used by the engine. Overlapping ranges are allowed (it
// behaves as memmove); dst == src is a no-op.
void copy(void* dst, const void* src, size_t bytes);
void copy(const CpuKernelConfig& config, void* dst, const void* src, size_t bytes);

// A copy into memory that another core reads next, where streaming it
// pays (transport/shm/handoff.h decides): from
// CpuKernelConfig::handoffStreamingMinBytes on, with streaming stores and
// an sfence, so the reader fetches it from memory. dst and src must not
// overlap. handoffStreams(bytes): whether a copy of `bytes` would stream.
void copyForPeer(void* dst, const void* src, size_t bytes);
bool handoffStreams(size_t bytes);

// memcpy, with copies of up to 64 bytes (the latency path's cells and
// lines) done inline: two possibly overlapping loads and stores of the
// widest power of two that fits, no call and no size loop. dst and src must
// not overlap.
namespace detail {
template <size_t W>
inline void copyTwoEnds(unsigned char* d, const unsigned char* s, size_t bytes) {  // W <= bytes <= 2W
  unsigned char head[W], tail[W];
  std::memcpy(head, s, W);
  std::memcpy(tail, s + bytes - W, W);
  std::memcpy(d, head, W);
  std::memcpy(d + bytes - W, tail, W);
}
}  // namespace detail
inline void copySmall(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (bytes > 64) std::memcpy(d, s, bytes);
  else if (bytes >= 32) detail::copyTwoEnds<32>(d, s, bytes);
  else if (bytes >= 16) detail::copyTwoEnds<16>(d, s, bytes);
  else if (bytes >= 8) detail::copyTwoEnds<8>(d, s, bytes);
  else if (bytes >= 4) detail::copyTwoEnds<4>(d, s, bytes);
  else if (bytes >= 2) detail::copyTwoEnds<2>(d, s, bytes);
  else if (bytes == 1) *d = *s;
}

// A copy into memory that is not read again soon (a large operation's
// output): streaming stores whatever the size, unless
// LOOM_CPU_STREAMING_BYTES=0 turned them off. dst and src must not overlap.
void copyPastCaches(void* dst, const void* src, size_t bytes);

// Copies src to every one of dsts[0..ndsts-1], reading src once. A
// destination equal to src is skipped; otherwise destinations must not
// overlap src or each other. No alignment is required.
void copyToMany(void* const* dsts, int ndsts, const void* src, size_t bytes);
void copyToMany(const CpuKernelConfig& config, void* const* dsts, int ndsts, const void* src, size_t bytes);

}  // namespace loom::kernels
