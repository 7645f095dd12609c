// reduce.h's entry points: normalize a call, then run it on the kernel table
// of the chosen instruction-set level (cpu_kernels.h).
#include "kernels/reduce.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using cpu::Byte;

const cpu::KernelTable& tableFor(CpuIsa isa) {
  if (!cpuIsaSupported(isa)) isa = detectedCpuIsa();
  if (isa == CpuIsa::kAvx512Vbmi) {
    if (const cpu::KernelTable* t = cpu::avx512VbmiKernels()) return *t;
  }
  if (isa >= CpuIsa::kAvx512) {
    if (const cpu::KernelTable* t = cpu::avx512Kernels()) return *t;
  }
  if (isa >= CpuIsa::kAvx2) {
    if (const cpu::KernelTable* t = cpu::avx2Kernels()) return *t;
  }
  return cpu::scalarKernels();
}

// True when the result is one source's bytes unchanged.
bool isPlainCopy(const Reduction& r, int npartials, const void* local, bool applyPost) {
  const int nsources = npartials + (local != nullptr ? 1 : 0);
  if (nsources != 1) return false;
  if (r.op == RedOp::kPreMulSum && local != nullptr) return false;
  if (r.op == RedOp::kSumPostDiv && applyPost) return false;
  return true;
}

bool useFloat32(Accumulation a) {
  switch (a) {
    case Accumulation::kElementType: return false;
    case Accumulation::kFloat32: return true;
    case Accumulation::kDefault: break;
  }
  return defaultAccumulateInFloat32();
}

// The types Accumulation applies to.
bool isNarrowFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || isFp8(t);
}

bool overlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

// Below this, reduce() goes element by element (cpu::reduceElements).
constexpr size_t kElementsOnlyBytes = 64;

// copyToMany() works in chunks that stay in L1 between the destinations, so
// src is read from memory once.
constexpr size_t kFanOutChunkBytes = 16 << 10;

// A few elements of a native type under an op with no pre or post step:
// the sources folded left to right with kernels/ops.h's op, as the contract
// says, without building a kernel call. The local input is the last source.
// There are two sources at least (one is a plain copy), so npartials >= 1.
template <typename T, typename Op>
void foldFew(const Op& op, void* dst, const void* const* partials, int npartials, const void* local,
             size_t count) {
  const auto at = [](const void* p, size_t i) {
    T v;
    std::memcpy(&v, static_cast<const Byte*>(p) + i * sizeof(T), sizeof(T));
    return v;
  };
  for (size_t i = 0; i < count; ++i) {
    T acc = at(partials[0], i);
    for (int p = 1; p < npartials; ++p) acc = op(acc, at(partials[p], i));
    if (local != nullptr) acc = op(acc, at(local, i));
    std::memcpy(static_cast<Byte*>(dst) + i * sizeof(T), &acc, sizeof(T));
  }
}

template <typename T>
bool foldFewTyped(RedOp op, void* dst, const void* const* partials, int npartials, const void* local,
                  size_t count) {
  switch (op) {
    case RedOp::kSum: foldFew<T>(SumOp<T>{}, dst, partials, npartials, local, count); return true;
    case RedOp::kProd: foldFew<T>(ProdOp<T>{}, dst, partials, npartials, local, count); return true;
    case RedOp::kMax: foldFew<T>(MaxOp<T>{}, dst, partials, npartials, local, count); return true;
    case RedOp::kMin: foldFew<T>(MinOp<T>{}, dst, partials, npartials, local, count); return true;
    case RedOp::kPreMulSum:
    case RedOp::kSumPostDiv: break;
  }
  return false;
}

// The latency path's tiny reductions: for an AllReduce of 8 B on 2 ranks,
// the reduction's share of a call ~215 -> ~135 instructions (callgrind).
// False for the narrow floats (their accumulation setting) and the ops with
// a pre or post step: those go element by element through the kernel table.
bool reduceFew(const Reduction& r, void* dst, const void* const* partials, int npartials, const void* local,
               size_t count) {
  switch (r.type) {
    case DataType::kInt8: return foldFewTyped<int8_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kUint8: return foldFewTyped<uint8_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kInt32: return foldFewTyped<int32_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kUint32: return foldFewTyped<uint32_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kInt64: return foldFewTyped<int64_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kUint64: return foldFewTyped<uint64_t>(r.op, dst, partials, npartials, local, count);
    case DataType::kFloat32: return foldFewTyped<float>(r.op, dst, partials, npartials, local, count);
    case DataType::kFloat64: return foldFewTyped<double>(r.op, dst, partials, npartials, local, count);
    default: return false;
  }
}

}  // namespace

void reduce(const CpuKernelConfig& config, const Reduction& r, void* dst, const void* const* partials,
            int npartials, const void* local, size_t count, bool applyPost) {
  if (count == 0 || (npartials <= 0 && local == nullptr)) return;
  if (npartials < 0) npartials = 0;
  const size_t bytes = count * dataTypeSize(r.type);
  if (isPlainCopy(r, npartials, local, applyPost)) {
    copy(config, dst, npartials > 0 ? partials[0] : local, bytes);
    return;
  }
  if (bytes < kElementsOnlyBytes && reduceFew(r, dst, partials, npartials, local, count)) return;
  cpu::ReduceCall call{};
  call.type = r.type;
  call.op = r.op;
  call.scalar = r.scalar;
  call.divisor = r.divisor == 0 ? 1 : r.divisor;
  call.fp32 = isNarrowFloat(r.type) && useFloat32(r.accumulation);
  call.dst = static_cast<Byte*>(dst);
  call.partials = reinterpret_cast<const Byte* const*>(partials);
  call.npartials = npartials;
  call.local = static_cast<const Byte*>(local);
  call.count = count;
  call.applyPost = applyPost;
  // Shorter than a line: no vector loop would run. The latency path's tiny
  // AllReduce (2 ranks, 8 B): the reduction's share of a call ~300 -> ~215
  // instructions.
  if (bytes < kElementsOnlyBytes) return cpu::reduceElements(call);
  // fp8 reductions are bound by arithmetic, not memory: streaming stores
  // only slowed them (64-256 MiB sums: 0.70-0.82x STREAM add streamed,
  // 0.84-1.06x cached, on an AMD EPYC VM).
  call.stream = !isFp8(r.type) && bytes >= config.streamingMinBytes;
  tableFor(config.isa).reduce(call);
}

void reduce(const Reduction& r, void* dst, const void* const* partials, int npartials, const void* local,
            size_t count, bool applyPost) {
  reduce(defaultCpuKernelConfig(), r, dst, partials, npartials, local, count, applyPost);
}

void copy(const CpuKernelConfig& config, void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  if (bytes >= config.streamingMinBytes && !overlap(dst, src, bytes)) {
    tableFor(config.isa).streamCopy(static_cast<Byte*>(dst), static_cast<const Byte*>(src), bytes);
    return;
  }
  std::memmove(dst, src, bytes);
}

void copy(void* dst, const void* src, size_t bytes) { copy(defaultCpuKernelConfig(), dst, src, bytes); }

void copyForPeer(void* dst, const void* src, size_t bytes) {
  const CpuKernelConfig& config = defaultCpuKernelConfig();
  if (bytes >= config.handoffStreamingMinBytes) {
    tableFor(config.isa).streamCopy(static_cast<Byte*>(dst), static_cast<const Byte*>(src), bytes);
  } else if (bytes) {
    std::memcpy(dst, src, bytes);
  }
}

bool handoffStreams(size_t bytes) { return bytes >= defaultCpuKernelConfig().handoffStreamingMinBytes; }

void copyPastCaches(void* dst, const void* src, size_t bytes) {
  const CpuKernelConfig& config = defaultCpuKernelConfig();
  if (config.streamingMinBytes != SIZE_MAX && bytes) {
    tableFor(config.isa).streamCopy(static_cast<Byte*>(dst), static_cast<const Byte*>(src), bytes);
  } else if (bytes) {
    std::memcpy(dst, src, bytes);
  }
}

void copyToMany(const CpuKernelConfig& config, void* const* dsts, int ndsts, const void* src, size_t bytes) {
  if (ndsts <= 0 || bytes == 0) return;
  if (ndsts == 1) return copy(config, dsts[0], src, bytes);
  const auto* in = static_cast<const Byte*>(src);
  const bool stream = bytes >= config.streamingMinBytes;
  const cpu::KernelTable& table = tableFor(config.isa);
  for (size_t off = 0; off < bytes; off += kFanOutChunkBytes) {
    const size_t n = std::min(kFanOutChunkBytes, bytes - off);
    for (int d = 0; d < ndsts; ++d) {
      if (dsts[d] == src) continue;
      Byte* out = static_cast<Byte*>(dsts[d]) + off;
      if (stream) {
        table.streamCopy(out, in + off, n);
      } else {
        std::memcpy(out, in + off, n);
      }
    }
  }
}

void copyToMany(void* const* dsts, int ndsts, const void* src, size_t bytes) {
  copyToMany(defaultCpuKernelConfig(), dsts, ndsts, src, bytes);
}

}  // namespace loom::kernels
