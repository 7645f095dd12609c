// One element of a reduce() chain, written once for host C++ and CUDA device
// code: the definition every vectorized path must agree with bit for bit.
//
//   native: acc = s0; acc = op(acc, s1); ...; acc = op(acc, pre(local)); post(acc)
//           (rounding to T after every op; kernels/ops.h)
//   fp32:   the same chain for the sum-like ops of the narrow float types,
//           computed in float and rounded to T once (Accumulation::kFloat32
//           in kernels/reduce.h).
//
// Sources are read through a callable `load(s)` returning source s as T:
// s = 0..npartials-1 are the partials, s = npartials is the local input.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/ops.h"
#include "kernels/types.h"

namespace loom::kernels {

template <typename Op, typename T, typename = void>
struct HasPre : std::false_type {};
template <typename Op, typename T>
struct HasPre<Op, T, std::void_t<decltype(std::declval<const Op&>().pre(std::declval<T>()))>>
    : std::true_type {};
template <typename Op, typename T, typename = void>
struct HasPost : std::false_type {};
template <typename Op, typename T>
struct HasPost<Op, T, std::void_t<decltype(std::declval<const Op&>().post(std::declval<T>()))>>
    : std::true_type {};

template <typename T, typename Op>
LOOM_HOST_DEVICE inline T preStep(const Op& op, T x) {
  if constexpr (HasPre<Op, T>::value) {
    return op.pre(x);
  } else {
    return x;
  }
}

template <typename T, typename Op>
LOOM_HOST_DEVICE inline T postStep(const Op& op, T x) {
  if constexpr (HasPost<Op, T>::value) {
    return op.post(x);
  } else {
    return x;
  }
}

// The native chain in steps, for loops that see one source at a time:
//   acc = chainFirst(op, s0, s0IsLocal); acc = chainNext(op, acc, s, sIsLocal)...;
//   out = chainLast(op, acc, applyPost)
// The local input (always the last source) gets the pre step.
template <typename T, typename Op>
LOOM_HOST_DEVICE inline T chainFirst(const Op& op, T x, bool isLocal) {
  return isLocal ? preStep<T>(op, x) : x;
}
template <typename T, typename Op>
LOOM_HOST_DEVICE inline T chainNext(const Op& op, T acc, T x, bool isLocal) {
  return op(acc, isLocal ? preStep<T>(op, x) : x);
}
template <typename T, typename Op>
LOOM_HOST_DEVICE inline T chainLast(const Op& op, T acc, bool applyPost) {
  return applyPost ? postStep<T>(op, acc) : acc;
}

// Native chain. Needs npartials + (hasLocal ? 1 : 0) >= 1.
template <typename T, typename Op, typename Load>
LOOM_HOST_DEVICE inline T chainElement(const Op& op, const Load& load, int npartials, bool hasLocal,
                                       bool applyPost) {
  const int nsources = npartials + (hasLocal ? 1 : 0);
  T acc = chainFirst<T>(op, load(0), npartials == 0);
  for (int s = 1; s < nsources; ++s) acc = chainNext<T>(op, acc, load(s), s == npartials);
  return chainLast<T>(op, acc, applyPost);
}

// ---- fp32 accumulation -------------------------------------------------------

template <typename T>
inline constexpr bool kIsNarrowFloat = std::is_same_v<T, Half> || std::is_same_v<T, Bfloat16> ||
                                       std::is_same_v<T, Float8e4m3> || std::is_same_v<T, Float8e5m2>;

// The float-domain constants of a sum-like op.
struct Fp32Terms {
  bool pre = false;      // kPreMulSum: local is multiplied by `scalar`
  float scalar = 1.0f;
  bool post = false;     // kSumPostDiv: the sum is divided by `divisor`
  float divisor = 1.0f;
};

// Which ops fp32 accumulation applies to, and their constants.
template <typename T, typename Op>
struct Fp32Sum : std::false_type {};
template <typename T>
struct Fp32Sum<T, SumOp<T>> : std::bool_constant<kIsNarrowFloat<T>> {
  LOOM_HOST_DEVICE static Fp32Terms terms(const SumOp<T>&) { return Fp32Terms{}; }
};
template <typename T>
struct Fp32Sum<T, PreMulSumOp<T>> : std::bool_constant<kIsNarrowFloat<T>> {
  LOOM_HOST_DEVICE static Fp32Terms terms(const PreMulSumOp<T>& op) {
    Fp32Terms t;
    t.pre = true;
    t.scalar = Arith<T>::widen(op.scalar);
    return t;
  }
};
template <typename T>
struct Fp32Sum<T, SumPostDivOp<T>> : std::bool_constant<kIsNarrowFloat<T>> {
  LOOM_HOST_DEVICE static Fp32Terms terms(const SumPostDivOp<T>& op) {
    Fp32Terms t;
    t.post = true;
    t.divisor = float(op.divisor);  // the same conversion SumPostDivOp::post uses
    return t;
  }
};

// The fp32 chain in steps (see chainFirst): the running value is a float.
template <typename T>
LOOM_HOST_DEVICE inline float chainFirstFp32(const Fp32Terms& terms, T x, bool isLocal) {
  const float v = Arith<T>::widen(x);
  return isLocal && terms.pre ? v * terms.scalar : v;
}
template <typename T>
LOOM_HOST_DEVICE inline float chainNextFp32(const Fp32Terms& terms, float acc, T x, bool isLocal) {
  float v = Arith<T>::widen(x);
  if (isLocal && terms.pre) v = v * terms.scalar;
  return acc + v;
}
template <typename T>
LOOM_HOST_DEVICE inline T chainLastFp32(const Fp32Terms& terms, float acc, bool applyPost) {
  return Arith<T>::narrow(applyPost && terms.post ? acc / terms.divisor : acc);
}

// fp32 chain. Needs npartials + (hasLocal ? 1 : 0) >= 1.
template <typename T, typename Load>
LOOM_HOST_DEVICE inline T chainElementFp32(const Fp32Terms& terms, const Load& load, int npartials,
                                           bool hasLocal, bool applyPost) {
  const int nsources = npartials + (hasLocal ? 1 : 0);
  float acc = chainFirstFp32<T>(terms, load(0), npartials == 0);
  for (int s = 1; s < nsources; ++s) acc = chainNextFp32<T>(terms, acc, load(s), s == npartials);
  return chainLastFp32<T>(terms, acc, applyPost);
}

}  // namespace loom::kernels
