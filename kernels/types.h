// The 16-bit and 8-bit floating types that NCCL reduces, as small POD
// structs usable from host C++ and from CUDA device code.
//
// Each type stores its raw bit pattern (`bits`) and converts to and from
// float exactly: widening is exact for every pattern, narrowing rounds to
// nearest, ties to even, with correct handling of subnormals (of both the
// float input and the narrow result), signed zeros, infinities and NaNs.
// Like every float operation in loom, conversions assume the default
// round-to-nearest floating-point environment; flush-to-zero and
// denormals-are-zero modes do not affect them. Arithmetic is deliberately
// absent: kernels/ops.h widens to float, computes, and narrows once (see
// there for why that is correctly rounded).
//
// NaN rules (the same for every type, chosen so conversions never depend on
// the FPU's flush or NaN-propagation modes):
//  - Widening keeps the sign and puts the payload in the top mantissa bits of
//    the float, bit for bit (a signalling NaN stays signalling). E4M3 has a
//    single NaN per sign (S.1111.111); it widens to the quiet float NaN with
//    that sign.
//  - Narrowing keeps the sign and the top payload bits and sets the quiet bit
//    (IEEE 754's recommended behaviour, and what x86 F16C does). So
//    narrow(widen(x)) == x for every pattern except signalling NaNs of Half,
//    Bfloat16 and Float8e5m2, which come back quiet (quiet bit set, other
//    payload bits kept). NVIDIA's converters instead return one canonical NaN;
//    both are NaN, and loom never promises NaN payloads across ranks.
//
// Overflow rules:
//  - Half, Bfloat16: IEEE; a result above the largest finite value (after
//    rounding) becomes +-inf, like __float2half_rn / __float2bfloat16_rn.
//  - Float8e4m3 (OCP "E4M3FN": no infinities, max finite 448) and Float8e5m2
//    (IEEE-like, max finite 57344, has inf) offer two narrowings, matching
//    cuda_fp8.h's __NV_NOSAT and __NV_SATFINITE:
//      fromFloat():          overflow -> inf (e5m2) or NaN (e4m3); +-inf in
//                            -> +-inf (e5m2) or NaN (e4m3).
//      fromFloatSatFinite(): overflow AND +-inf in -> +-max finite; NaN stays
//                            NaN.
//    The reductions use fromFloatSatFinite(): NCCL's fp8 kernels narrow their
//    results with the __nv_fp8_e4m3 / __nv_fp8_e5m2 constructors, which are
//    documented to rely on __NV_SATFINITE (cuda_fp8.hpp; the PTX they use is
//    cvt.rn.satfinite.e4m3x2 / .e5m2x2). loom matches that so host and GPU
//    paths agree bit for bit on overflow.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::kernels {

namespace detail {

LOOM_HOST_DEVICE inline uint32_t floatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

LOOM_HOST_DEVICE inline float bitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// A binary floating format with kExpBits exponent bits and kManBits stored
// mantissa bits, IEEE-style bias and subnormals. kHasInf=false is the OCP
// "fn" layout: the all-ones exponent holds normal numbers except the single
// NaN with an all-ones mantissa. Encodings are held in the low bits of a
// uint32_t (sign at bit kExpBits + kManBits).
template <int kExpBits, int kManBits, bool kHasInf>
struct MiniFloat {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinExp = 1 - kBias;  // exponent of the smallest normal
  static constexpr int kShift = 23 - kManBits;  // float mantissa bits dropped
  static constexpr uint32_t kManMask = (1u << kManBits) - 1;
  static constexpr uint32_t kExpAll = (1u << kExpBits) - 1;
  static constexpr uint32_t kSignBit = 1u << (kExpBits + kManBits);
  static constexpr uint32_t kInfField = kExpAll << kManBits;  // only if kHasInf
  static constexpr uint32_t kMaxFinite =
      kHasInf ? kInfField - 1 : (kExpAll << kManBits) | (kManMask - 1);
  // The NaN narrowing produces before payload bits are merged in: quiet bit
  // set (IEEE-like formats) or the only NaN (fn formats).
  static constexpr uint32_t kQuietNan =
      kHasInf ? kInfField | (1u << (kManBits - 1)) : (kExpAll << kManBits) | kManMask;
  // Smallest normal of this format, as float bits.
  static constexpr uint32_t kMinNormalFloatBits = uint32_t(kMinExp + 127) << 23;

  // Round-to-nearest-even narrowing of float bits `u`. `satFinite` chooses
  // what overflow and infinite inputs become (see the file comment).
  // Written as straight-line selects (no data-dependent branches) so host
  // loops vectorize and GPU warps do not diverge.
  LOOM_HOST_DEVICE static uint32_t encode(uint32_t u, bool satFinite) {
    const uint32_t a = u & 0x7fffffffu;
    // Normal result (or overflow): add just under half an ulp plus the lsb
    // of the kept part, so ties go to even; a carry out of the mantissa
    // correctly bumps the exponent. Then rebias the exponent.
    const uint32_t r = a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u);
    const uint32_t normal = (r >> kShift) - (uint32_t(127 - kBias) << kManBits);
    // Subnormal (or zero) result, |x| < 2^kMinExp: add the power of two
    // 2^(kMinExp - kManBits + 23), whose ulp is exactly this format's
    // subnormal spacing; the FPU's round-to-nearest-even then does the
    // rounding, and the sum's low bits are the encoding (a carry reaching
    // 2^kManBits is the smallest normal, as it should be). The magic number
    // is a normal float, so flush-to-zero / denormals-are-zero modes cannot
    // change the result (an input they would flush rounds to 0 anyway).
    const float magic = bitsToFloat(uint32_t(kMinExp - kManBits + 23 + 127) << 23);
    const uint32_t subnormal = floatToBits(bitsToFloat(a) + magic) - floatToBits(magic);
    uint32_t field = a < kMinNormalFloatBits ? subnormal : normal;
    const uint32_t overflow = satFinite ? kMaxFinite : (kHasInf ? kInfField : kQuietNan);
    field = field > kMaxFinite ? overflow : field;
    // NaN: quiet, keeping the top payload bits (formats with a single NaN
    // have no payload).
    const uint32_t nan = kHasInf ? (kQuietNan | ((a >> kShift) & kManMask)) : kQuietNan;
    field = a > 0x7f800000u ? nan : field;
    return ((u >> 31) << (kExpBits + kManBits)) | field;
  }

  // Exact widening of an encoding to float bits (straight-line, as encode).
  LOOM_HOST_DEVICE static uint32_t decode(uint32_t v) {
    const uint32_t sign = (v & kSignBit) << (31 - kExpBits - kManBits);
    const uint32_t exp = (v >> kManBits) & kExpAll;
    const uint32_t man = v & kManMask;
    const uint32_t normal = ((exp + uint32_t(127 - kBias)) << 23) | (man << kShift);
    // man * 2^(kMinExp - kManBits): exact, and a normal float for every
    // format using this template (smallest: 2^-24 for Half), so FTZ/DAZ
    // modes cannot touch it.
    const float scale = bitsToFloat(uint32_t(kMinExp - kManBits + 127) << 23);
    const uint32_t subnormal = floatToBits(float(int32_t(man)) * scale);  // signed: SSE2 converts it
    uint32_t mag = exp == 0 ? subnormal : normal;
    if constexpr (kHasInf) {
      mag = exp == kExpAll ? (0x7f800000u | (man << kShift)) : mag;  // inf, or NaN with payload
    } else {
      mag = (exp == kExpAll && man == kManMask) ? 0x7fc00000u : mag;
    }
    return sign | mag;
  }
};

using HalfFormat = MiniFloat<5, 10, true>;
using Float8e4m3Format = MiniFloat<4, 3, false>;
using Float8e5m2Format = MiniFloat<5, 2, true>;

}  // namespace detail

// IEEE 754 binary16.
struct Half {
  uint16_t bits;

  LOOM_HOST_DEVICE static Half fromBits(uint16_t b) { return Half{b}; }
  // Round to nearest even; overflow -> +-inf.
  LOOM_HOST_DEVICE static Half fromFloat(float f) {
    return Half{uint16_t(detail::HalfFormat::encode(detail::floatToBits(f), false))};
  }
  LOOM_HOST_DEVICE float toFloat() const {
    return detail::bitsToFloat(detail::HalfFormat::decode(bits));
  }
};

// bfloat16: the top half of an IEEE binary32.
struct Bfloat16 {
  uint16_t bits;

  LOOM_HOST_DEVICE static Bfloat16 fromBits(uint16_t b) { return Bfloat16{b}; }
  // Round to nearest even; overflow -> +-inf. Float subnormals round into
  // bfloat16 subnormals (no flush to zero).
  LOOM_HOST_DEVICE static Bfloat16 fromFloat(float f) {
    const uint32_t u = detail::floatToBits(f);
    // Same exponent layout as float, so one rounding add does it all:
    // subnormals, carries into the exponent and overflow to inf.
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x0040u;  // quiet, sign and payload kept
    return Bfloat16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
  }
  LOOM_HOST_DEVICE float toFloat() const { return detail::bitsToFloat(uint32_t(bits) << 16); }
};

// OCP FP8 E4M3 ("E4M3FN"): bias 7, no infinities, NaN = S.1111.111,
// max finite 448, smallest subnormal 2^-9.
struct Float8e4m3 {
  uint8_t bits;

  LOOM_HOST_DEVICE static Float8e4m3 fromBits(uint8_t b) { return Float8e4m3{b}; }
  // __NV_NOSAT semantics: overflow and +-inf become NaN (with the sign).
  LOOM_HOST_DEVICE static Float8e4m3 fromFloat(float f) {
    return Float8e4m3{uint8_t(detail::Float8e4m3Format::encode(detail::floatToBits(f), false))};
  }
  // __NV_SATFINITE semantics: overflow and +-inf become +-448.
  LOOM_HOST_DEVICE static Float8e4m3 fromFloatSatFinite(float f) {
    return Float8e4m3{uint8_t(detail::Float8e4m3Format::encode(detail::floatToBits(f), true))};
  }
  LOOM_HOST_DEVICE float toFloat() const {
    return detail::bitsToFloat(detail::Float8e4m3Format::decode(bits));
  }
};

// OCP FP8 E5M2: bias 15, IEEE-like (inf = S.11111.00, NaN = S.11111.{01,10,11}),
// max finite 57344, smallest subnormal 2^-16.
struct Float8e5m2 {
  uint8_t bits;

  LOOM_HOST_DEVICE static Float8e5m2 fromBits(uint8_t b) { return Float8e5m2{b}; }
  // __NV_NOSAT semantics: overflow -> +-inf.
  LOOM_HOST_DEVICE static Float8e5m2 fromFloat(float f) {
    return Float8e5m2{uint8_t(detail::Float8e5m2Format::encode(detail::floatToBits(f), false))};
  }
  // __NV_SATFINITE semantics: overflow and +-inf become +-57344.
  LOOM_HOST_DEVICE static Float8e5m2 fromFloatSatFinite(float f) {
    return Float8e5m2{uint8_t(detail::Float8e5m2Format::encode(detail::floatToBits(f), true))};
  }
  LOOM_HOST_DEVICE float toFloat() const {
    return detail::bitsToFloat(detail::Float8e5m2Format::decode(bits));
  }
};

static_assert(sizeof(Half) == 2 && sizeof(Bfloat16) == 2);
static_assert(sizeof(Float8e4m3) == 1 && sizeof(Float8e5m2) == 1);

}  // namespace loom::kernels
