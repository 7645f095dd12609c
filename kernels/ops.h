// The reduction operators, one definition per op, for every element type,
// usable from host C++ and CUDA device code (LOOM_HOST_DEVICE).
//
// Element types: int8_t uint8_t int32_t uint32_t int64_t uint64_t float
// double Half Bfloat16 Float8e4m3 Float8e5m2 (see kernels/types.h).
//
// Semantics, per type family:
//  - Integers: sum, product and the premulsum pre-multiply wrap modulo 2^n
//    (computed in unsigned arithmetic, so there is no signed-overflow UB).
//    SumPostDiv divides the (wrapped) sum by the divisor with C semantics:
//    truncation toward zero for signed types, as NCCL's ncclAvg does.
//  - float, double: native IEEE arithmetic, one rounding per op. The build
//    compiles these with -ffp-contract=off so that premulsum's multiply and
//    add are never fused on the host.
//  - Half, Bfloat16, Float8e4m3, Float8e5m2: widen both operands to float
//    (exact), compute in float, narrow once. For +, *, / float has more than
//    2p+2 significand bits for each of these formats, so the double rounding
//    is innocuous and the result is the correctly rounded one, equal to what
//    __hadd/__hmul (sm_80+) give for Half and Bfloat16. fp8 results are
//    narrowed with fromFloatSatFinite(), matching NCCL (see types.h): an
//    overflowing result, and any +-inf result (including max/min picking an
//    e5m2 infinity), becomes +-max finite. NCCL on sm_90 computes fp8 ops
//    in half rather than float; for a single op on two fp8 operands the two
//    give identical bits (checked over all 65,536 pairs of each format
//    against NVIDIA's own host implementation in nvidia_parity_test.cc).
//    (The SATFINITE treatment of an infinite input follows cuda_fp8.hpp's
//    host implementation; no GPU has confirmed it for loom yet.)
//    Bfloat16 subnormals are float subnormals: a host thread running with
//    denormals-are-zero / flush-to-zero set (some frameworks set them) would
//    see them as zero in these ops, as a GPU kernel built with -ftz would.
//  - Max/min on floating types (NaN and zero rule): if exactly one operand is
//    NaN the other is returned; if both are NaN the result is NaN; +0 is
//    greater than -0. This is IEEE 754-2019 maximumNumber/minimumNumber.
//    NCCL uses __hmax/__hmin for half, bfloat16 and fp8 (via half), whose
//    documentation states exactly these three rules, and fmaxf/fmin for
//    float/double, documented with the same NaN rules; loom applies the +0 >
//    -0 rule to float/double too so every floating type behaves alike.
//
// Operator objects are cheap values, built once per call from the
// Reduction's argument and copied into loops/kernels.
//
// Accumulation precision: each op rounds to the element type, exactly like
// NCCL. The optional fp32 accumulation (Accumulation::kFloat32 in reduce.h,
// LOOM_ACCUMULATE=fp32) keeps the running sum of half/bfloat16/fp8 values in
// Arith<T>::Compute (float) instead; kernels/chain.h defines both chains.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/types.h"

namespace loom::kernels {

// How a storage type is computed on: widen() to Compute, operate, narrow().
template <typename T>
struct Arith {
  using Compute = T;
  LOOM_HOST_DEVICE static Compute widen(T x) { return x; }
  LOOM_HOST_DEVICE static T narrow(Compute x) { return x; }
};
template <>
struct Arith<Half> {
  using Compute = float;
  LOOM_HOST_DEVICE static float widen(Half x) { return x.toFloat(); }
  LOOM_HOST_DEVICE static Half narrow(float x) { return Half::fromFloat(x); }
};
template <>
struct Arith<Bfloat16> {
  using Compute = float;
  LOOM_HOST_DEVICE static float widen(Bfloat16 x) { return x.toFloat(); }
  LOOM_HOST_DEVICE static Bfloat16 narrow(float x) { return Bfloat16::fromFloat(x); }
};
template <>
struct Arith<Float8e4m3> {
  using Compute = float;
  LOOM_HOST_DEVICE static float widen(Float8e4m3 x) { return x.toFloat(); }
  LOOM_HOST_DEVICE static Float8e4m3 narrow(float x) { return Float8e4m3::fromFloatSatFinite(x); }
};
template <>
struct Arith<Float8e5m2> {
  using Compute = float;
  LOOM_HOST_DEVICE static float widen(Float8e5m2 x) { return x.toFloat(); }
  LOOM_HOST_DEVICE static Float8e5m2 narrow(float x) { return Float8e5m2::fromFloatSatFinite(x); }
};

namespace detail {

// Unsigned type that T's wrapping arithmetic is done in: at least as wide as
// unsigned int so that small types never promote to (signed) int.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

LOOM_HOST_DEVICE inline bool signBitSet(float x) { return (floatToBits(x) >> 31) != 0; }
LOOM_HOST_DEVICE inline bool signBitSet(double x) {
#if defined(__CUDA_ARCH__)
  return __double_as_longlong(x) < 0;
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u >> 63) != 0;
#endif
}

// maximumNumber: NaN loses to a number, +0 > -0.
template <typename F>
LOOM_HOST_DEVICE inline F maxNumber(F a, F b) {
  if (a != a) return b;  // NaN or not, b is the answer
  if (b != b) return a;
  if (a == b) return signBitSet(a) ? b : a;  // only differs for +-0
  return a > b ? a : b;
}

// minimumNumber: NaN loses to a number, -0 < +0.
template <typename F>
LOOM_HOST_DEVICE inline F minNumber(F a, F b) {
  if (a != a) return b;
  if (b != b) return a;
  if (a == b) return signBitSet(a) ? a : b;
  return a < b ? a : b;
}

}  // namespace detail

template <typename T>
struct SumOp {
  LOOM_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = detail::WrapType<T>;
      return T(U(a) + U(b));
    } else {
      return Arith<T>::narrow(Arith<T>::widen(a) + Arith<T>::widen(b));
    }
  }
};

template <typename T>
struct ProdOp {
  LOOM_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = detail::WrapType<T>;
      return T(U(a) * U(b));
    } else {
      return Arith<T>::narrow(Arith<T>::widen(a) * Arith<T>::widen(b));
    }
  }
};

template <typename T>
struct MaxOp {
  LOOM_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? b : a;
    } else {
      return Arith<T>::narrow(detail::maxNumber(Arith<T>::widen(a), Arith<T>::widen(b)));
    }
  }
};

template <typename T>
struct MinOp {
  LOOM_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return b < a ? b : a;
    } else {
      return Arith<T>::narrow(detail::minNumber(Arith<T>::widen(a), Arith<T>::widen(b)));
    }
  }
};

// acc + scalar*x. The multiply is the pre-op applied to one rank's own input
// (pre()), rounded to T before it enters the sum, as in NCCL: partial results
// received from peers are already multiplied and are only summed.
template <typename T>
struct PreMulSumOp {
  T scalar;

  LOOM_HOST_DEVICE T pre(T x) const {
    if constexpr (std::is_integral_v<T>) {
      using U = detail::WrapType<T>;
      return T(U(x) * U(scalar));
    } else {
      return Arith<T>::narrow(Arith<T>::widen(x) * Arith<T>::widen(scalar));
    }
  }
  LOOM_HOST_DEVICE T operator()(T acc, T x) const { return SumOp<T>()(acc, x); }
};

// Sum, then one final division by `divisor` (nranks) in post(). Integers use
// C division on the wrapped sum (truncates toward zero; |x| / divisor is
// computed in uint64 so INT64_MIN and huge divisors are fine). Floating types
// divide in their compute type and round once. divisor must be >= 1.
template <typename T>
struct SumPostDivOp {
  uint64_t divisor;

  LOOM_HOST_DEVICE T operator()(T acc, T x) const { return SumOp<T>()(acc, x); }
  LOOM_HOST_DEVICE T post(T x) const {
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      // All in uint64: |x| of INT64_MIN is 2^63, and narrowing back to T is
      // modulo 2^n (well defined since C++20).
      const bool negative = x < 0;
      const uint64_t wide = uint64_t(int64_t(x));
      const uint64_t magnitude = negative ? uint64_t(0) - wide : wide;
      const uint64_t q = magnitude / divisor;
      return T(negative ? uint64_t(0) - q : q);
    } else if constexpr (std::is_integral_v<T>) {
      return T(uint64_t(x) / divisor);
    } else {
      using C = typename Arith<T>::Compute;
      return Arith<T>::narrow(Arith<T>::widen(x) / C(divisor));
    }
  }
};

}  // namespace loom::kernels
