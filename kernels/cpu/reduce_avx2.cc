// Host kernels for AVX2 + F16C: 8 floats per vector. No FMA on purpose:
// every op rounds on its own (kernels/ops.h).
//
// Built at the baseline ISA like the rest of the library; only the functions
// marked LOOM_SIMD_TARGET use AVX2, and they run only after cpu_isa.cc found
// the CPU and OS support it. See simd_reduce_impl.h for the kernels.
#include "kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__)

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

#define LOOM_SIMD_TARGET __attribute__((target("avx2,f16c")))
#define LOOM_SIMD_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

struct Simd {
  static constexpr size_t kLanes = 8;
  using F = __m256;
  using I = __m256i;
  using M = __m256i;  // lanes of all ones (true) or zeros

  // GCC/Clang vectors of 32 bytes (native lines): load, and store
  // (`stream` needs p aligned to 32).
  static constexpr size_t kVecBytes = 32;
  template <typename V>
  LOOM_SIMD_INLINE static V loadVec(const Byte* p) {
    return reinterpret_cast<V>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  template <typename V>
  LOOM_SIMD_INLINE static void storeVec(Byte* p, V value, bool stream) {
    const __m256i v = reinterpret_cast<__m256i>(value);
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    }
  }
  LOOM_SIMD_INLINE static F loadF(const Byte* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  LOOM_SIMD_INLINE static F set1F(float x) { return _mm256_set1_ps(x); }
  LOOM_SIMD_INLINE static I set1I(int32_t x) { return _mm256_set1_epi32(x); }
  LOOM_SIMD_INLINE static F addF(F a, F b) { return _mm256_add_ps(a, b); }
  LOOM_SIMD_INLINE static F subF(F a, F b) { return _mm256_sub_ps(a, b); }
  LOOM_SIMD_INLINE static F mulF(F a, F b) { return _mm256_mul_ps(a, b); }
  LOOM_SIMD_INLINE static F divF(F a, F b) { return _mm256_div_ps(a, b); }
  LOOM_SIMD_INLINE static F maxF(F a, F b) { return _mm256_max_ps(a, b); }  // b if either is NaN or both zero
  LOOM_SIMD_INLINE static F minF(F a, F b) { return _mm256_min_ps(a, b); }
  LOOM_SIMD_INLINE static F andF(F a, F b) { return _mm256_and_ps(a, b); }
  LOOM_SIMD_INLINE static F orF(F a, F b) { return _mm256_or_ps(a, b); }
  LOOM_SIMD_INLINE static F cvtI32F(I a) { return _mm256_cvtepi32_ps(a); }

  LOOM_SIMD_INLINE static M cmpUnordF(F a, F b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
  LOOM_SIMD_INLINE static M cmpEqF(F a, F b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
  LOOM_SIMD_INLINE static M cmpGtF(F a, F b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
  LOOM_SIMD_INLINE static M signM(F a) { return _mm256_srai_epi32(_mm256_castps_si256(a), 31); }
  LOOM_SIMD_INLINE static M andM(M a, M b) { return _mm256_and_si256(a, b); }
  LOOM_SIMD_INLINE static M orM(M a, M b) { return _mm256_or_si256(a, b); }
  LOOM_SIMD_INLINE static M andNotM(M a, M b) { return _mm256_andnot_si256(a, b); }  // ~a & b
  LOOM_SIMD_INLINE static F selectF(M m, F ifTrue, F ifFalse) {
    return _mm256_blendv_ps(ifFalse, ifTrue, _mm256_castsi256_ps(m));
  }
  LOOM_SIMD_INLINE static I selectI(M m, I ifTrue, I ifFalse) { return _mm256_blendv_epi8(ifFalse, ifTrue, m); }

  LOOM_SIMD_INLINE static I castFI(F a) { return _mm256_castps_si256(a); }
  LOOM_SIMD_INLINE static F castIF(I a) { return _mm256_castsi256_ps(a); }
  LOOM_SIMD_INLINE static I andI(I a, I b) { return _mm256_and_si256(a, b); }
  LOOM_SIMD_INLINE static I orI(I a, I b) { return _mm256_or_si256(a, b); }
  LOOM_SIMD_INLINE static I addI(I a, I b) { return _mm256_add_epi32(a, b); }
  LOOM_SIMD_INLINE static I subI(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kN>
  LOOM_SIMD_INLINE static I srli(I a) {
    return _mm256_srli_epi32(a, kN);
  }
  template <int kN>
  LOOM_SIMD_INLINE static I slli(I a) {
    return _mm256_slli_epi32(a, kN);
  }
  LOOM_SIMD_INLINE static M cmpGtI(I a, I b) { return _mm256_cmpgt_epi32(a, b); }
  LOOM_SIMD_INLINE static M cmpEqI(I a, I b) { return _mm256_cmpeq_epi32(a, b); }
  LOOM_SIMD_INLINE static I minU32(I a, I b) { return _mm256_min_epu32(a, b); }
  LOOM_SIMD_INLINE static I maxU32(I a, I b) { return _mm256_max_epu32(a, b); }
  // bfloat16 lines in a lane-interleaved order (see reduce_avx512.cc): each
  // 32-byte half unpacked against zero puts values in the top halves of
  // floats; packus of the shifted rounded patterns is the inverse order.
  static constexpr bool kHasBf16Words = true;
  LOOM_SIMD_INLINE static void loadLineBf16(const Byte* p, F* v) {
    for (int h = 0; h < 2; ++h) {
      const I x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
      v[2 * h] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), x));
      v[2 * h + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), x));
    }
  }
  LOOM_SIMD_INLINE static void storeLineBf16(Byte* p, const I* rounded, bool stream) {
    for (int h = 0; h < 2; ++h) {
      store32(p + 32 * h,
              _mm256_packus_epi32(_mm256_srli_epi32(rounded[2 * h], 16), _mm256_srli_epi32(rounded[2 * h + 1], 16)),
              stream);
    }
  }

  // fp8 lines in the word layout (see reduce_avx512.cc and Fp8Elem).
  static constexpr bool kHasFp8Words = true;
  static constexpr bool kHasFp8Lines = false;
  static constexpr bool kHasFp8Tables = false;
  // w[0..3]: the line's bytes as the high bytes of words.
  LOOM_SIMD_INLINE static void loadLineAsHighBytes(const Byte* p, I* w) {
    for (int h = 0; h < 2; ++h) {
      const I v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
      w[2 * h] = _mm256_unpacklo_epi8(_mm256_setzero_si256(), v);
      w[2 * h + 1] = _mm256_unpackhi_epi8(_mm256_setzero_si256(), v);
    }
  }
  LOOM_SIMD_INLINE static void halvesToFloats(I h, F* out) {
    out[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    out[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
  LOOM_SIMD_INLINE static I floatsToHalves(F a, F b) { return _mm256_set_m128i(narrowHalf(b), narrowHalf(a)); }
  // Whether the 64-byte line holds e4m3's NaN (S.1111.111): lines without
  // one skip e4m3WordsToScaledHalves' fix-up.
  LOOM_SIMD_INLINE static bool lineHasE4m3Nan(const Byte* p) {
    const I ones = _mm256_set1_epi8(char(0xff)), sign = _mm256_set1_epi8(char(0x80));
    const I a = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), sign), ones);
    const I b = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), sign), ones);
    return !_mm256_testz_si256(_mm256_or_si256(a, b), _mm256_or_si256(a, b));
  }
  // e4m3 bytes (high bytes of words) -> halves of value * 2^-8, for every
  // code but NaN; then for any code (see reduce_avx512.cc).
  LOOM_SIMD_INLINE static I e4m3WordsToScaledHalvesNoNan(I w) {
    return _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(int16_t(0xbf80)));
  }
  LOOM_SIMD_INLINE static I e4m3WordsToScaledHalves(I w) {
    const I h = e4m3WordsToScaledHalvesNoNan(w);
    const I nan = _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f00)), _mm256_set1_epi16(0x7f00));
    return _mm256_blendv_epi8(h, _mm256_or_si256(h, _mm256_set1_epi16(0x7e00)), nan);
  }
  template <bool kE5m2>
  LOOM_SIMD_INLINE static I halvesToFp8Words(I h) {
    if constexpr (kE5m2) {
      return _mm256_srli_epi16(h, 8);
    } else {
      return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(h, 7), _mm256_set1_epi16(0x7f)),
                             _mm256_and_si256(_mm256_srli_epi16(h, 8), _mm256_set1_epi16(0x80)));
    }
  }
  // See reduce_avx512.cc. Magnitudes are below 2^15, so signed compares do.
  template <bool kE5m2>
  LOOM_SIMD_INLINE static I roundHalvesToFp8Words(I h) {
    constexpr int kDrop = kE5m2 ? 8 : 7;
    const I mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
    const I kept = _mm256_srli_epi16(mag, kDrop);
    const I lsb = _mm256_and_si256(kept, _mm256_set1_epi16(1));
    const I roundBias = _mm256_set1_epi16(int16_t((1 << (kDrop - 1)) - 1));
    I r = _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(mag, roundBias), lsb), kDrop);
    r = _mm256_min_epu16(r, _mm256_set1_epi16(kE5m2 ? 0x7b : 0x7e));
    const I nan = _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(0x7c00));
    const I nanField = kE5m2 ? _mm256_or_si256(kept, _mm256_set1_epi16(0x02)) : _mm256_set1_epi16(0x7f);
    r = _mm256_blendv_epi8(r, nanField, nan);
    return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi16(h, 8), _mm256_set1_epi16(0x80)));
  }
  template <int kN>
  LOOM_SIMD_INLINE static I slli16(I a) {
    return _mm256_slli_epi16(a, kN);
  }
  LOOM_SIMD_INLINE static void storeLineFromWords(Byte* p, const I* w, bool stream) {
    store32(p, _mm256_packus_epi16(w[0], w[1]), stream);
    store32(p + 32, _mm256_packus_epi16(w[2], w[3]), stream);
  }
  // Widening loads of kLanes elements.
  LOOM_SIMD_INLINE static I loadU8toI32(const Byte* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  LOOM_SIMD_INLINE static I loadU16toI32(const Byte* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  LOOM_SIMD_INLINE static F loadHalf(const Byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  LOOM_SIMD_INLINE static F loadE5m2ViaHalf(const Byte* p) {
    const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_slli_epi16(bytes, 8));
  }
  LOOM_SIMD_INLINE static __m128i narrowHalf(F x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }
  LOOM_SIMD_INLINE static F roundHalf(F x) { return _mm256_cvtph_ps(narrowHalf(x)); }

  // Stores of 32 bytes; `stream` needs p 32-byte aligned.
  LOOM_SIMD_INLINE static void store32(Byte* p, I v, bool stream) {
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    }
  }
  // Stores of one 64-byte line; `stream` needs p 64-byte aligned.
  LOOM_SIMD_INLINE static void storeLineF(Byte* p, const F* v, bool stream) {
    store32(p, castFI(v[0]), stream);
    store32(p + 32, castFI(v[1]), stream);
  }
  LOOM_SIMD_INLINE static void storeLineHalf(Byte* p, const F* v, bool stream) {
    store32(p, _mm256_set_m128i(narrowHalf(v[1]), narrowHalf(v[0])), stream);
    store32(p + 32, _mm256_set_m128i(narrowHalf(v[3]), narrowHalf(v[2])), stream);
  }
  // Two vectors of 32-bit lanes holding 16-bit values -> 16 packed values.
  LOOM_SIMD_INLINE static I pack16(I a, I b) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
  }
  LOOM_SIMD_INLINE static void storeLine16(Byte* p, const I* v, bool stream) {
    store32(p, pack16(v[0], v[1]), stream);
    store32(p + 32, pack16(v[2], v[3]), stream);
  }
  // Four vectors of 32-bit lanes holding 8-bit values -> 32 packed bytes.
  LOOM_SIMD_INLINE static I pack8(const I* v) {
    const I words = _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  LOOM_SIMD_INLINE static void storeLine8(Byte* p, const I* v, bool stream) {
    store32(p, pack8(v), stream);
    store32(p + 32, pack8(v + 4), stream);
  }
  LOOM_SIMD_INLINE static void storeLineBytes(Byte* p, const Byte* src, bool stream) {
    store32(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), stream);
    store32(p + 32, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32)), stream);
  }
  // dst 64-byte aligned, bytes a multiple of 64.
  LOOM_SIMD_INLINE static void copyLinesStream(Byte* dst, const Byte* src, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 128) {
      if (off + 128 > bytes) {
        storeLineBytes(dst + off, src + off, true);
        break;
      }
      const I a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off));
      const I b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off + 32));
      const I c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off + 64));
      const I d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off + 96));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + off), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + off + 32), b);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + off + 64), c);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + off + 96), d);
    }
  }
  LOOM_SIMD_INLINE static void fence() { _mm_sfence(); }
};

#include "kernels/cpu/simd_reduce_impl.h"

#undef LOOM_SIMD_TARGET
#undef LOOM_SIMD_INLINE
#undef LOOM_UNROLL

}  // namespace

const KernelTable* avx2Kernels() {
  static const KernelTable table{&cleanUpper<simdReduce, const ReduceCall&>,
                                 &cleanUpper<simdStreamCopy, Byte*, const Byte*, size_t>};
  return &table;
}

}  // namespace loom::kernels::cpu

#else  // not x86-64

namespace loom::kernels::cpu {
const KernelTable* avx2Kernels() { return nullptr; }
}  // namespace loom::kernels::cpu

#endif
