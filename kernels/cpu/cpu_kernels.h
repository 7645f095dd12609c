// Internal: the per-instruction-set host kernel tables behind reduce.h.
//
// reduce.cc validates and normalizes a call (plain copies, accumulation
// mode, streaming decision) and hands it to the table of the chosen level.
// Each level computes exactly chainElement()/chainElementFp32() (chain.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/datatype.h"

namespace loom::kernels::cpu {

using Byte = unsigned char;

// One reduce() call, normalized: at least one source, count > 0, divisor >= 1.
struct ReduceCall {
  DataType type;
  RedOp op;
  uint64_t scalar;   // Reduction::scalar
  uint64_t divisor;  // >= 1
  bool fp32;         // Accumulation::kFloat32 resolved (only the narrow float sums use it)
  Byte* dst;
  const Byte* const* partials;
  int npartials;  // >= 0
  const Byte* local;  // may be null
  size_t count;
  bool applyPost;
  bool stream;  // non-temporal stores where dst allows (levels may ignore it)
};

struct KernelTable {
  void (*reduce)(const ReduceCall& call);
  // Copies `bytes` (no overlap) with non-temporal stores; ends with a fence.
  void (*streamCopy)(Byte* dst, const Byte* src, size_t bytes);
};

#if defined(__x86_64__)
// A vector level's table entry: its kernel, then vzeroupper. GCC leaves
// vzeroupper out on some exits of functions built with target("avx512...")
// attributes, and the caller's baseline (SSE) code then pays the AVX-SSE
// transition on its next vector instruction: on the Intel VM a float sum
// of 64 B - 4 KiB took 120-190 ns a call so, against 30-130 ns for the
// scalar level.
template <auto kKernel, typename... Args>
__attribute__((target("avx"))) void cleanUpper(Args... args) {
  kKernel(args...);
  __builtin_ia32_vzeroupper();
}
#endif

const KernelTable& scalarKernels();
// chainElement() for one element after another, with no setup: for calls
// shorter than a vector line, where every level's loops would only run their
// scalar head and tail anyway (the same bits, as chain.h defines them).
void reduceElements(const ReduceCall& call);
const KernelTable* avx2Kernels();    // null where not built (not x86)
const KernelTable* avx512Kernels();  // null where not built (not x86)
const KernelTable* avx512VbmiKernels();  // null where not built (not x86)

// Reduction::scalar as a T (its low bytes).
template <typename T>
inline T scalarAs(uint64_t raw) {
  T v;
  std::memcpy(&v, &raw, sizeof(T));
  return v;
}

// load(s) for chainElement(): element at byte offset `off` of source s
// (partials first, then local). No alignment needed.
template <typename T>
struct SourceLoader {
  const Byte* const* partials;
  int npartials;
  const Byte* local;
  size_t off;
  T operator()(int s) const {
    T v;
    std::memcpy(&v, (s < npartials ? partials[s] : local) + off, sizeof(T));
    return v;
  }
};

}  // namespace loom::kernels::cpu
