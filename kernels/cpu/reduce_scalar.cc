// Portable host reduction loops: the "scalar" instruction-set level (the
// build's baseline ISA, no runtime-selected extensions).
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
// Accumulation::kFloat32 runs chainElementFp32() element by element.
#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/chain.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "kernels/types.h"

namespace loom::kernels::cpu {
namespace {

static_assert(std::endian::native == std::endian::little,
              "Reduction::scalar is read as the low bytes of a uint64_t");

// 4 KiB keeps the accumulator in L1 next to the streamed sources.
constexpr size_t kBlockBytes = 4096;

template <typename T>
inline T loadAt(const Byte* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

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

template <typename T, typename Op, bool kPost>
void reduceBlocks(const Op& op, const ReduceCall& c) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  constexpr bool kPre = HasPre<Op, T>::value;
  T acc[kBlock];
  for (size_t base = 0; base < c.count; base += kBlock) {
    const size_t n = std::min(kBlock, c.count - base);
    const size_t off = base * sizeof(T);
    if (c.npartials > 0) {
      std::memcpy(acc, c.partials[0] + off, n * sizeof(T));
      for (int p = 1; p < c.npartials; ++p) combine<T>(op, acc, c.partials[p] + off, n);
      if (c.local != nullptr) {
        if constexpr (kPre) {
          combinePre<T>(op, acc, c.local + off, n);
        } else {
          combine<T>(op, acc, c.local + off, n);
        }
      }
    } else if constexpr (kPre) {
      loadPre<T>(op, acc, c.local + off, n);
    } else {
      std::memcpy(acc, c.local + off, n * sizeof(T));
    }
    if constexpr (kPost) applyPostStep<T>(op, acc, n);
    std::memcpy(c.dst + off, acc, n * sizeof(T));
  }
}

// Accumulation::kFloat32 for the narrow float sums.
template <typename T, typename Op>
void reduceFp32(const Op& op, const ReduceCall& c) {
  const Fp32Terms terms = Fp32Sum<T, Op>::terms(op);
  for (size_t i = 0; i < c.count; ++i) {
    const size_t off = i * sizeof(T);
    const SourceLoader<T> load{c.partials, c.npartials, c.local, off};
    const T out = chainElementFp32<T>(terms, load, c.npartials, c.local != nullptr, c.applyPost);
    std::memcpy(c.dst + off, &out, sizeof(T));
  }
}

template <typename T, typename Op>
void runOp(const Op& op, const ReduceCall& c) {
  if constexpr (Fp32Sum<T, Op>::value) {
    if (c.fp32) return reduceFp32<T>(op, c);
  }
  if constexpr (HasPost<Op, T>::value) {
    if (c.applyPost) return reduceBlocks<T, Op, true>(op, c);
  }
  reduceBlocks<T, Op, false>(op, c);
}

// Calls f(op) with the call's op as its kernels/ops.h type for T.
template <typename T, typename F>
void withOp(const ReduceCall& c, const F& f) {
  switch (c.op) {
    case RedOp::kSum: return f(SumOp<T>{});
    case RedOp::kProd: return f(ProdOp<T>{});
    case RedOp::kMax: return f(MaxOp<T>{});
    case RedOp::kMin: return f(MinOp<T>{});
    case RedOp::kPreMulSum: return f(PreMulSumOp<T>{scalarAs<T>(c.scalar)});
    case RedOp::kSumPostDiv: return f(SumPostDivOp<T>{c.divisor});
  }
}

// Calls run<T>(op, c) for the call's element type T and op.
template <template <typename, typename> class Run>
void dispatch(const ReduceCall& c) {
  auto typed = [&]<typename T>() { withOp<T>(c, [&]<typename Op>(const Op& op) { Run<T, Op>::run(op, c); }); };
  switch (c.type) {
    case DataType::kInt8: return typed.template operator()<int8_t>();
    case DataType::kUint8: return typed.template operator()<uint8_t>();
    case DataType::kInt32: return typed.template operator()<int32_t>();
    case DataType::kUint32: return typed.template operator()<uint32_t>();
    case DataType::kInt64: return typed.template operator()<int64_t>();
    case DataType::kUint64: return typed.template operator()<uint64_t>();
    case DataType::kFloat16: return typed.template operator()<Half>();
    case DataType::kFloat32: return typed.template operator()<float>();
    case DataType::kFloat64: return typed.template operator()<double>();
    case DataType::kBfloat16: return typed.template operator()<Bfloat16>();
    case DataType::kFloat8e4m3: return typed.template operator()<Float8e4m3>();
    case DataType::kFloat8e5m2: return typed.template operator()<Float8e5m2>();
  }
}

template <typename T, typename Op>
struct Blocks {
  static void run(const Op& op, const ReduceCall& c) { runOp<T>(op, c); }
};

void scalarReduce(const ReduceCall& c) { dispatch<Blocks>(c); }

// ---- element by element (reduceElements) -------------------------------------

template <typename T, typename Op>
void elementsOp(const Op& op, const ReduceCall& c) {
  for (size_t i = 0; i < c.count; ++i) {
    const size_t off = i * sizeof(T);
    const SourceLoader<T> load{c.partials, c.npartials, c.local, off};
    T out;
    if constexpr (Fp32Sum<T, Op>::value) {
      out = c.fp32 ? chainElementFp32<T>(Fp32Sum<T, Op>::terms(op), load, c.npartials, c.local != nullptr,
                                         c.applyPost)
                   : chainElement<T>(op, load, c.npartials, c.local != nullptr, c.applyPost);
    } else {
      out = chainElement<T>(op, load, c.npartials, c.local != nullptr, c.applyPost);
    }
    std::memcpy(c.dst + off, &out, sizeof(T));
  }
}

template <typename T, typename Op>
struct Elements {
  static void run(const Op& op, const ReduceCall& c) { elementsOp<T>(op, c); }
};

// The scalar level has no streaming stores of its own: a plain copy.
void scalarStreamCopy(Byte* dst, const Byte* src, size_t bytes) { std::memcpy(dst, src, bytes); }

}  // namespace

void reduceElements(const ReduceCall& c) {
  // Every element read before it is written: dst may alias a source exactly.
  dispatch<Elements>(c);
}

const KernelTable& scalarKernels() {
  static const KernelTable table{&scalarReduce, &scalarStreamCopy};
  return table;
}

}  // namespace loom::kernels::cpu
