// Host kernels for AVX-512 (F, BW, VL, DQ) + F16C: 16 floats per vector;
// and the AVX-512 + VBMI level, which differs in the fp8 types only.
//
// Built at the baseline ISA like the rest of the library; only the functions
// marked LOOM_SIMD_TARGET use AVX-512, and they run only after cpu_isa.cc
// found the CPU and OS support it. See simd_reduce_impl.h for the kernels.
#include "kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__)

// GCC 12's avx512fintrin.h builds "undefined" vectors by self-initialization
// (`__m512i __Y = __Y;`), which it then reports as uninitialized once those
// intrinsics are inlined into target-attribute functions (a known compiler
// false positive). Silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/chain.h"
#include "kernels/ops.h"
#include "kernels/types.h"

namespace loom::kernels::cpu {
namespace {

#define LOOM_SIMD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define LOOM_SIMD_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"), always_inline)) inline

struct Simd {
  static constexpr size_t kLanes = 16;
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;

  // GCC/Clang vectors of 64 bytes (native lines): load, and store
  // (`stream` needs p aligned to 64).
  static constexpr size_t kVecBytes = 64;
  template <typename V>
  LOOM_SIMD_INLINE static V loadVec(const Byte* p) {
    return reinterpret_cast<V>(_mm512_loadu_si512(p));
  }
  template <typename V>
  LOOM_SIMD_INLINE static void storeVec(Byte* p, V value, bool stream) {
    const __m512i v = reinterpret_cast<__m512i>(value);
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
    } else {
      _mm512_storeu_si512(p, v);
    }
  }
  LOOM_SIMD_INLINE static F loadF(const Byte* p) { return _mm512_loadu_ps(p); }
  LOOM_SIMD_INLINE static F set1F(float x) { return _mm512_set1_ps(x); }
  LOOM_SIMD_INLINE static I set1I(int32_t x) { return _mm512_set1_epi32(x); }
  LOOM_SIMD_INLINE static F addF(F a, F b) { return _mm512_add_ps(a, b); }
  LOOM_SIMD_INLINE static F subF(F a, F b) { return _mm512_sub_ps(a, b); }
  LOOM_SIMD_INLINE static F mulF(F a, F b) { return _mm512_mul_ps(a, b); }
  LOOM_SIMD_INLINE static F divF(F a, F b) { return _mm512_div_ps(a, b); }
  LOOM_SIMD_INLINE static F maxF(F a, F b) { return _mm512_max_ps(a, b); }  // b if either is NaN or both zero
  LOOM_SIMD_INLINE static F minF(F a, F b) { return _mm512_min_ps(a, b); }
  LOOM_SIMD_INLINE static F andF(F a, F b) { return _mm512_and_ps(a, b); }
  LOOM_SIMD_INLINE static F orF(F a, F b) { return _mm512_or_ps(a, b); }
  LOOM_SIMD_INLINE static F cvtI32F(I a) { return _mm512_cvtepi32_ps(a); }

  LOOM_SIMD_INLINE static M cmpUnordF(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  LOOM_SIMD_INLINE static M cmpEqF(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  LOOM_SIMD_INLINE static M cmpGtF(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  LOOM_SIMD_INLINE static M signM(F a) { return _mm512_movepi32_mask(_mm512_castps_si512(a)); }
  LOOM_SIMD_INLINE static M andM(M a, M b) { return _kand_mask16(a, b); }
  LOOM_SIMD_INLINE static M orM(M a, M b) { return _kor_mask16(a, b); }
  LOOM_SIMD_INLINE static M andNotM(M a, M b) { return _kandn_mask16(a, b); }  // ~a & b
  LOOM_SIMD_INLINE static F selectF(M m, F ifTrue, F ifFalse) { return _mm512_mask_blend_ps(m, ifFalse, ifTrue); }
  LOOM_SIMD_INLINE static I selectI(M m, I ifTrue, I ifFalse) {
    return _mm512_mask_blend_epi32(m, ifFalse, ifTrue);
  }

  LOOM_SIMD_INLINE static I castFI(F a) { return _mm512_castps_si512(a); }
  LOOM_SIMD_INLINE static F castIF(I a) { return _mm512_castsi512_ps(a); }
  LOOM_SIMD_INLINE static I andI(I a, I b) { return _mm512_and_si512(a, b); }
  LOOM_SIMD_INLINE static I orI(I a, I b) { return _mm512_or_si512(a, b); }
  LOOM_SIMD_INLINE static I addI(I a, I b) { return _mm512_add_epi32(a, b); }
  LOOM_SIMD_INLINE static I subI(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kN>
  LOOM_SIMD_INLINE static I srli(I a) {
    return _mm512_srli_epi32(a, kN);
  }
  template <int kN>
  LOOM_SIMD_INLINE static I slli(I a) {
    return _mm512_slli_epi32(a, kN);
  }
  LOOM_SIMD_INLINE static M cmpGtI(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  LOOM_SIMD_INLINE static M cmpEqI(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  LOOM_SIMD_INLINE static I minU32(I a, I b) { return _mm512_min_epu32(a, b); }

  // Widening loads of kLanes elements.
  LOOM_SIMD_INLINE static I loadU8toI32(const Byte* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  LOOM_SIMD_INLINE static I loadU16toI32(const Byte* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  LOOM_SIMD_INLINE static F loadHalf(const Byte* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  LOOM_SIMD_INLINE static F loadE5m2ViaHalf(const Byte* p) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(_mm256_slli_epi16(bytes, 8));
  }
  // fp8 lines in a lane-interleaved word layout (see Fp8Elem in
  // simd_reduce_impl.h): unpacking a 64-byte line against zero gives its
  // bytes as 16-bit words in two registers, and packus restores the order.
  static constexpr bool kHasFp8Words = true;
  static constexpr bool kHasFp8Lines = true;    // stores round whole lines of bytes
  static constexpr bool kHasFp8Tables = false;  // see the VBMI level below
  // w[0], w[1]: the line's bytes as the high bytes of words.
  LOOM_SIMD_INLINE static void loadLineAsHighBytes(const Byte* p, I* w) {
    const I v = _mm512_loadu_si512(p);
    w[0] = _mm512_unpacklo_epi8(_mm512_setzero_si512(), v);
    w[1] = _mm512_unpackhi_epi8(_mm512_setzero_si512(), v);
  }
  // 32 halves -> 2 float vectors (exact), and back (values already exact halves).
  LOOM_SIMD_INLINE static void halvesToFloats(I h, F* out) {
    out[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    out[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
  LOOM_SIMD_INLINE static I floatsToHalves(F a, F b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(narrowHalf(a)), narrowHalf(b), 1);
  }
  // Whether the 64-byte line holds e4m3's NaN (S.1111.111): lines without
  // one skip e4m3WordsToScaledHalves' fix-up.
  LOOM_SIMD_INLINE static bool lineHasE4m3Nan(const Byte* p) {
    return _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_loadu_si512(p), _mm512_set1_epi8(char(0x80))),
                                  _mm512_set1_epi8(char(0xff))) != 0;
  }
  // e4m3 bytes (high bytes of words) -> halves of value * 2^-8: the
  // magnitude bits shifted into bits 14..7, the sign kept. Arithmetic shift:
  // bit 15 keeps the sign, bits 13..7 get the magnitude; bit 14 (a copy of
  // the sign) and the low bits are cleared. Right for every code but NaN.
  LOOM_SIMD_INLINE static I e4m3WordsToScaledHalvesNoNan(I w) {
    return _mm512_and_si512(_mm512_srai_epi16(w, 1), _mm512_set1_epi16(int16_t(0xbf80)));
  }
  // The same for any code: the NaN S.1111.111 (which would read as +-1.875)
  // becomes a half NaN.
  LOOM_SIMD_INLINE static I e4m3WordsToScaledHalves(I w) {
    const I h = e4m3WordsToScaledHalvesNoNan(w);
    const __mmask32 nan =
        _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7f00)), _mm512_set1_epi16(0x7f00));
    return _mm512_mask_mov_epi16(h, nan, _mm512_or_si512(h, _mm512_set1_epi16(0x7e00)));
  }
  // Half patterns of fp8 values -> fp8 bytes in words: e5m2 is the top
  // byte; e4m3 (scaled by 2^-8 before) is bits 14..7 plus the sign.
  template <bool kE5m2>
  LOOM_SIMD_INLINE static I halvesToFp8Words(I h) {
    if constexpr (kE5m2) {
      return _mm512_srli_epi16(h, 8);
    } else {
      // (h >> 7) & 0x7f | (h >> 8) & 0x80: bitwise select, ternary logic C ? A : B.
      return _mm512_ternarylogic_epi32(_mm512_srli_epi16(h, 7), _mm512_srli_epi16(h, 8), _mm512_set1_epi16(0x7f),
                                       0xe4);
    }
  }
  // Round-to-nearest-even halves of values that are exact in half (see
  // Fp8Elem::store) -> fp8 bytes in words, SATFINITE: RNE on the bit
  // pattern, results above max finite (infinities included) -> max finite,
  // NaN -> NaN (e5m2: quiet, top payload bit kept; e4m3: S.1111.111).
  template <bool kE5m2>
  LOOM_SIMD_INLINE static I roundHalvesToFp8Words(I h) {
    constexpr int kDrop = kE5m2 ? 8 : 7;
    const I mag = _mm512_and_si512(h, _mm512_set1_epi16(0x7fff));
    const I kept = _mm512_srli_epi16(mag, kDrop);
    const I lsb = _mm512_and_si512(kept, _mm512_set1_epi16(1));
    const I roundBias = _mm512_set1_epi16(int16_t((1 << (kDrop - 1)) - 1));
    I r = _mm512_srli_epi16(_mm512_add_epi16(_mm512_add_epi16(mag, roundBias), lsb), kDrop);
    r = _mm512_min_epu16(r, _mm512_set1_epi16(kE5m2 ? 0x7b : 0x7e));
    const __mmask32 nan = _mm512_cmpgt_epu16_mask(mag, _mm512_set1_epi16(0x7c00));
    const I nanField = kE5m2 ? _mm512_or_si512(kept, _mm512_set1_epi16(0x02)) : _mm512_set1_epi16(0x7f);
    r = _mm512_mask_mov_epi16(r, nan, nanField);
    // r | (sign >> 8): ternary logic A | (B & C).
    return _mm512_ternarylogic_epi32(r, _mm512_srli_epi16(h, 8), _mm512_set1_epi16(0x80), 0xf8);
  }
  // Round to nearest even of 64 results at once, on bytes: `kept` holds the
  // bits that survive (e5m2: the half's high byte without the sign; e4m3:
  // bits 14..7 of its half of value * 2^-8), `dropped` the next 8 bits, the
  // sign in bit 7 of `sign`. Up when dropped exceeds 0x80, or equals it and
  // kept is odd; then SATFINITE (overflow and infinities -> largest finite).
  // Returns false, computing nothing, when a lane is NaN: an infinity's kept
  // bits are 0x7c (e5m2) or 0xf8 (e4m3), a NaN's larger (the float->half
  // conversion keeps NaNs quiet).
  template <bool kE5m2>
  LOOM_SIMD_INLINE static bool roundFp8Bytes(I sign, I kept, I dropped, I* out) {
    if (_mm512_cmpgt_epu8_mask(kept, _mm512_set1_epi8(char(kE5m2 ? 0x7c : 0xf8))) != 0) return false;
    const I one = _mm512_set1_epi8(1);
    const __mmask64 up = _mm512_cmpgt_epu8_mask(_mm512_adds_epu8(dropped, _mm512_and_si512(kept, one)),
                                                _mm512_set1_epi8(char(0x80)));
    I r = _mm512_mask_add_epi8(kept, up, kept, one);
    r = _mm512_min_epu8(r, _mm512_set1_epi8(char(kE5m2 ? 0x7b : 0x7e)));
    *out = _mm512_ternarylogic_epi32(r, sign, _mm512_set1_epi8(char(0x80)), 0xf8);  // r | (sign & 0x80)
    return true;
  }
  // Each element's high or low byte of two word vectors of the lane-
  // interleaved layout, in element order (packus restores it).
  LOOM_SIMD_INLINE static I halvesHighBytes(const I* h) {
    return _mm512_packus_epi16(_mm512_srli_epi16(h[0], 8), _mm512_srli_epi16(h[1], 8));
  }
  LOOM_SIMD_INLINE static I halvesLowBytes(const I* h) {
    const I low = _mm512_set1_epi16(0xff);
    return _mm512_packus_epi16(_mm512_and_si512(h[0], low), _mm512_and_si512(h[1], low));
  }
  template <int kN>
  LOOM_SIMD_INLINE static I slli16(I a) {
    return _mm512_slli_epi16(a, kN);
  }
  LOOM_SIMD_INLINE static I maxU32(I a, I b) { return _mm512_max_epu32(a, b); }
  // bfloat16 lines in a lane-interleaved order: unpacking against zero puts
  // each value in the top half of a float; store() takes the top halves of
  // the rounded patterns back with one word permute (the inverse order).
  static constexpr bool kHasBf16Words = true;
  LOOM_SIMD_INLINE static void loadLineBf16(const Byte* p, F* v) {
    const I x = _mm512_loadu_si512(p);
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
  }
  LOOM_SIMD_INLINE static void storeLineBf16(Byte* p, const I* rounded, bool stream) {
    // Output word 8k + j (128-bit lane k): j < 4 from rounded[0], else from
    // rounded[1], each the top word of dword 4k + (j % 4).
    storeLine(p, _mm512_permutex2var_epi16(rounded[0], bf16StoreIndex(), rounded[1]), stream);
  }
  LOOM_SIMD_INLINE static I bf16StoreIndex() {
    alignas(64) static constexpr uint16_t kIdx[32] = {
        1,  3,  5,  7,  33, 35, 37, 39,  // lane 0
        9,  11, 13, 15, 41, 43, 45, 47,  // lane 1
        17, 19, 21, 23, 49, 51, 53, 55,  // lane 2
        25, 27, 29, 31, 57, 59, 61, 63,  // lane 3
    };
    return _mm512_load_si512(kIdx);
  }
  LOOM_SIMD_INLINE static __m256i narrowHalf(F x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }
  LOOM_SIMD_INLINE static F roundHalf(F x) { return _mm512_cvtph_ps(narrowHalf(x)); }

  // Stores of one 64-byte line; `stream` needs p 64-byte aligned.
  LOOM_SIMD_INLINE static void storeLine(Byte* p, I v, bool stream) {
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
    } else {
      _mm512_storeu_si512(p, v);
    }
  }
  LOOM_SIMD_INLINE static void storeLineF(Byte* p, const F* v, bool stream) { storeLine(p, castFI(v[0]), stream); }
  LOOM_SIMD_INLINE static void storeLineHalf(Byte* p, const F* v, bool stream) {
    storeLine(p, _mm512_inserti64x4(_mm512_castsi256_si512(narrowHalf(v[0])), narrowHalf(v[1]), 1), stream);
  }
  // Lanes hold 16-bit values.
  LOOM_SIMD_INLINE static void storeLine16(Byte* p, const I* v, bool stream) {
    const __m256i lo = _mm512_cvtepi32_epi16(v[0]);
    const __m256i hi = _mm512_cvtepi32_epi16(v[1]);
    storeLine(p, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), stream);
  }
  // Lanes hold 8-bit values.
  LOOM_SIMD_INLINE static void storeLine8(Byte* p, const I* v, bool stream) {
    const __m256i lo = _mm256_set_m128i(_mm512_cvtepi32_epi8(v[1]), _mm512_cvtepi32_epi8(v[0]));
    const __m256i hi = _mm256_set_m128i(_mm512_cvtepi32_epi8(v[3]), _mm512_cvtepi32_epi8(v[2]));
    storeLine(p, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), stream);
  }
  LOOM_SIMD_INLINE static void storeLineBytes(Byte* p, const Byte* src, bool stream) {
    storeLine(p, _mm512_loadu_si512(src), stream);
  }
  // dst 64-byte aligned, bytes a multiple of 64.
  LOOM_SIMD_INLINE static void copyLinesStream(Byte* dst, const Byte* src, size_t bytes) {
    size_t off = 0;
    for (; off + 256 <= bytes; off += 256) {
      const I a = _mm512_loadu_si512(src + off);
      const I b = _mm512_loadu_si512(src + off + 64);
      const I c = _mm512_loadu_si512(src + off + 128);
      const I d = _mm512_loadu_si512(src + off + 192);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off), a);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off + 64), b);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off + 128), c);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off + 192), d);
    }
    for (; off < bytes; off += 64) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off), _mm512_loadu_si512(src + off));
    }
  }
  LOOM_SIMD_INLINE static void fence() { _mm_sfence(); }
};

#include "kernels/cpu/simd_reduce_impl.h"

#undef LOOM_SIMD_TARGET
#undef LOOM_SIMD_INLINE
#undef LOOM_UNROLL

// ---- AVX-512 + VBMI: the fp8 types through byte tables ---------------------------
//
// VBMI's two-table byte permute (vpermi2b) looks up 64 bytes at once in a
// 128-entry table. Loads widen fp8 through tables of bfloat16 patterns (every
// fp8 value, and e4m3's value * 2^-8, is exact in bfloat16; the float is then
// the pattern in the top half of a lane: no F16C conversion); stores take
// the halves that the float->half conversion gives and round them to fp8
// with byte arithmetic on all 64 elements at once. The element order inside
// a line: see fp8LineToFloats. The other types run the AVX-512 kernels.
namespace vbmi {

using Base = Simd;  // the AVX-512 traits above

#define LOOM_SIMD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,f16c")))
#define LOOM_SIMD_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,f16c"), always_inline)) inline

struct Fp8Tables {
  // High and low bytes of the bfloat16 pattern of each magnitude code
  // (e4m3: of value * 2^-8, the lanes' scaling; see Fp8Elem). NaNs are
  // quiet, so every NaN the kernels meet has its quiet bit set.
  alignas(64) uint8_t e4m3High[128];
  alignas(64) uint8_t e4m3Low[128];
  alignas(64) uint8_t e5m2High[128];
  alignas(64) uint8_t e5m2Low[128];
  // Byte indices into two half vectors (see floatsToHalves) of each
  // element's high and low byte, in element order.
  alignas(64) uint8_t highIndex[64];
  alignas(64) uint8_t lowIndex[64];
};

Fp8Tables makeFp8Tables() {
  Fp8Tables t{};
  for (uint32_t code = 0; code < 128; ++code) {
    uint32_t e5m2 = detail::Float8e5m2Format::decode(code);
    if (e5m2 > 0x7f800000u) e5m2 |= 0x00400000u;
    const float e4m3 = detail::bitsToFloat(detail::Float8e4m3Format::decode(code));
    const uint32_t e4m3Scaled = std::isnan(e4m3) ? 0x7fc00000u : detail::floatToBits(std::ldexp(e4m3, -8));
    t.e5m2High[code] = uint8_t(e5m2 >> 24);
    t.e5m2Low[code] = uint8_t(e5m2 >> 16);
    t.e4m3High[code] = uint8_t(e4m3Scaled >> 24);
    t.e4m3Low[code] = uint8_t(e4m3Scaled >> 16);
  }
  // Element 16L + j of a line sits in float vector j / 4, lane 4L + j % 4
  // (fp8LineToFloats); vectors 2k and 2k + 1 become half vector k, words
  // 0-15 and 16-31.
  for (uint32_t e = 0; e < 64; ++e) {
    const uint32_t vec = (e % 16) / 4, lane = 4 * (e / 16) + e % 4;
    const uint32_t word = (vec % 2) * 16 + lane;
    t.lowIndex[e] = uint8_t((vec / 2) * 64 + 2 * word);
    t.highIndex[e] = uint8_t(t.lowIndex[e] + 1);
  }
  return t;
}

const Fp8Tables kFp8Tables = makeFp8Tables();

struct Simd : Base {
  static constexpr bool kHasFp8Tables = true;

  LOOM_SIMD_INLINE static I loadLine(const Byte* p) { return _mm512_loadu_si512(p); }
  LOOM_SIMD_INLINE static I table(const uint8_t* p) { return _mm512_load_si512(p); }

  // 64 fp8 bytes -> 4 float vectors: element 16L + j in vector j / 4, lane
  // 4L + j % 4 (the order two byte and two word unpacks give).
  template <bool kE5m2>
  LOOM_SIMD_INLINE static void fp8LineToFloats(I x, F* v) {
    const uint8_t* high = kE5m2 ? kFp8Tables.e5m2High : kFp8Tables.e4m3High;
    const uint8_t* low = kE5m2 ? kFp8Tables.e5m2Low : kFp8Tables.e4m3Low;
    // The permute uses the low 7 bits of each byte; the sign goes back with
    // ternary logic A | (B & C).
    const I hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(table(high), x, table(high + 64)), x,
                                           _mm512_set1_epi8(char(0x80)), 0xf8);
    const I lo = _mm512_permutex2var_epi8(table(low), x, table(low + 64));
    const I w0 = _mm512_unpacklo_epi8(lo, hi);
    const I w1 = _mm512_unpackhi_epi8(lo, hi);
    const I z = _mm512_setzero_si512();
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w0));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w0));
    v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w1));
    v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w1));
  }
  // h[0] = floatsToHalves(v[0], v[1]), h[1] = floatsToHalves(v[2], v[3]):
  // each element's high or low byte, in element order.
  LOOM_SIMD_INLINE static I halvesHighBytes(const I* h) {
    return _mm512_permutex2var_epi8(h[0], table(kFp8Tables.highIndex), h[1]);
  }
  LOOM_SIMD_INLINE static I halvesLowBytes(const I* h) {
    return _mm512_permutex2var_epi8(h[0], table(kFp8Tables.lowIndex), h[1]);
  }
};

#define LOOM_SIMD_FP8_ONLY
#include "kernels/cpu/simd_reduce_impl.h"
#undef LOOM_SIMD_FP8_ONLY

#undef LOOM_SIMD_TARGET
#undef LOOM_SIMD_INLINE
#undef LOOM_UNROLL

}  // namespace vbmi

void reduceVbmi(const ReduceCall& c) {
  if (isFp8(c.type)) return vbmi::simdReduceFp8(c);
  simdReduce(c);
}

}  // namespace

const KernelTable* avx512Kernels() {
  static const KernelTable table{&cleanUpper<simdReduce, const ReduceCall&>,
                                 &cleanUpper<simdStreamCopy, Byte*, const Byte*, size_t>};
  return &table;
}

const KernelTable* avx512VbmiKernels() {
  static const KernelTable table{&cleanUpper<reduceVbmi, const ReduceCall&>,
                                 &cleanUpper<simdStreamCopy, Byte*, const Byte*, size_t>};
  return &table;
}

}  // namespace loom::kernels::cpu

#else  // not x86-64

namespace loom::kernels::cpu {
const KernelTable* avx512Kernels() { return nullptr; }
const KernelTable* avx512VbmiKernels() { return nullptr; }
}  // namespace loom::kernels::cpu

#endif
