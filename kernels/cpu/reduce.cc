// Portable host reduction loops.
//
// Work proceeds in blocks of kBlockBytes: the block is gathered into a local,
// aligned accumulator (first source copied in, every further source combined
// into it), post-processed, then written to dst in one memcpy. Because every
// read of a block happens before its write, dst may alias a source exactly,
// and because sources are only ever read through memcpy-style loads, no
// pointer needs any alignment. The inner loops are per type x op template
// instances with no per-element dispatch, and the accumulator is a local
// array distinct from every source, so the compiler can vectorize the native
// integer and float paths at the baseline ISA (no -march flags).
#include "kernels/reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/types.h"

namespace loom::kernels {
namespace {

static_assert(std::endian::native == std::endian::little,
              "Reduction::scalar is read as the low bytes of a uint64_t");

// 4 KiB keeps the accumulator in L1 next to the streamed sources.
constexpr size_t kBlockBytes = 4096;

using Byte = unsigned char;

template <typename T>
inline T loadAt(const Byte* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename Op, typename T>
constexpr bool kHasPre = requires(const Op& op, T x) { op.pre(x); };
template <typename Op, typename T>
constexpr bool kHasPost = requires(const Op& op, T x) { op.post(x); };

// acc[j] = op(acc[j], src[j])
template <typename T, typename Op>
void combine(const Op& op, T* __restrict acc, const Byte* __restrict src, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] = op(acc[j], loadAt<T>(src, j));
}

// acc[j] = op(acc[j], op.pre(src[j]))
template <typename T, typename Op>
void combinePre(const Op& op, T* __restrict acc, const Byte* __restrict src, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] = op(acc[j], op.pre(loadAt<T>(src, j)));
}

// acc[j] = op.pre(src[j])
template <typename T, typename Op>
void loadPre(const Op& op, T* __restrict acc, const Byte* __restrict src, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] = op.pre(loadAt<T>(src, j));
}

template <typename T, typename Op>
void applyPostStep(const Op& op, T* __restrict acc, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] = op.post(acc[j]);
}

struct Sources {
  const Byte* const* partials;
  int npartials;
  const Byte* local;  // may be null
};

template <typename T, typename Op, bool kPost>
void reduceBlocks(const Op& op, Byte* dst, const Sources& s, size_t count) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  T acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const size_t off = base * sizeof(T);
    if (s.npartials > 0) {
      std::memcpy(acc, s.partials[0] + off, n * sizeof(T));
      for (int p = 1; p < s.npartials; ++p) combine<T>(op, acc, s.partials[p] + off, n);
      if (s.local != nullptr) {
        if constexpr (kHasPre<Op, T>) {
          combinePre<T>(op, acc, s.local + off, n);
        } else {
          combine<T>(op, acc, s.local + off, n);
        }
      }
    } else if constexpr (kHasPre<Op, T>) {
      loadPre<T>(op, acc, s.local + off, n);
    } else {
      std::memcpy(acc, s.local + off, n * sizeof(T));
    }
    if constexpr (kPost) applyPostStep<T>(op, acc, n);
    std::memcpy(dst + off, acc, n * sizeof(T));
  }
}

template <typename T, typename Op>
void runOp(const Op& op, bool applyPost, Byte* dst, const Sources& s, size_t count) {
  if constexpr (kHasPost<Op, T>) {
    if (applyPost) {
      reduceBlocks<T, Op, true>(op, dst, s, count);
      return;
    }
  }
  reduceBlocks<T, Op, false>(op, dst, s, count);
}

template <typename T>
T scalarAs(uint64_t raw) {
  T v;
  std::memcpy(&v, &raw, sizeof(T));
  return v;
}

template <typename T>
void reduceTyped(const Reduction& r, bool applyPost, Byte* dst, const Sources& s, size_t count) {
  switch (r.op) {
    case RedOp::kSum:
      return runOp<T>(SumOp<T>{}, applyPost, dst, s, count);
    case RedOp::kProd:
      return runOp<T>(ProdOp<T>{}, applyPost, dst, s, count);
    case RedOp::kMax:
      return runOp<T>(MaxOp<T>{}, applyPost, dst, s, count);
    case RedOp::kMin:
      return runOp<T>(MinOp<T>{}, applyPost, dst, s, count);
    case RedOp::kPreMulSum:
      return runOp<T>(PreMulSumOp<T>{scalarAs<T>(r.scalar)}, applyPost, dst, s, count);
    case RedOp::kSumPostDiv:
      return runOp<T>(SumPostDivOp<T>{r.divisor == 0 ? 1 : r.divisor}, applyPost, dst, s, count);
  }
}

// True when the result is one source's bytes unchanged.
bool isPlainCopy(const Reduction& r, int npartials, const void* local, bool applyPost) {
  const int nsources = npartials + (local != nullptr ? 1 : 0);
  if (nsources != 1) return false;
  if (r.op == RedOp::kPreMulSum && local != nullptr) return false;
  if (r.op == RedOp::kSumPostDiv && applyPost) return false;
  return true;
}

}  // namespace

void reduce(const Reduction& r, void* dst, const void* const* partials, int npartials,
            const void* local, size_t count, bool applyPost) {
  if (count == 0 || (npartials <= 0 && local == nullptr)) return;
  if (npartials < 0) npartials = 0;
  if (isPlainCopy(r, npartials, local, applyPost)) {
    copy(dst, npartials > 0 ? partials[0] : local, count * dataTypeSize(r.type));
    return;
  }
  const Sources s{reinterpret_cast<const Byte* const*>(partials), npartials,
                  static_cast<const Byte*>(local)};
  Byte* out = static_cast<Byte*>(dst);
  switch (r.type) {
    case DataType::kInt8: return reduceTyped<int8_t>(r, applyPost, out, s, count);
    case DataType::kUint8: return reduceTyped<uint8_t>(r, applyPost, out, s, count);
    case DataType::kInt32: return reduceTyped<int32_t>(r, applyPost, out, s, count);
    case DataType::kUint32: return reduceTyped<uint32_t>(r, applyPost, out, s, count);
    case DataType::kInt64: return reduceTyped<int64_t>(r, applyPost, out, s, count);
    case DataType::kUint64: return reduceTyped<uint64_t>(r, applyPost, out, s, count);
    case DataType::kFloat16: return reduceTyped<Half>(r, applyPost, out, s, count);
    case DataType::kFloat32: return reduceTyped<float>(r, applyPost, out, s, count);
    case DataType::kFloat64: return reduceTyped<double>(r, applyPost, out, s, count);
    case DataType::kBfloat16: return reduceTyped<Bfloat16>(r, applyPost, out, s, count);
    case DataType::kFloat8e4m3: return reduceTyped<Float8e4m3>(r, applyPost, out, s, count);
    case DataType::kFloat8e5m2: return reduceTyped<Float8e5m2>(r, applyPost, out, s, count);
  }
}

void copy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  std::memmove(dst, src, bytes);
}

}  // namespace loom::kernels
