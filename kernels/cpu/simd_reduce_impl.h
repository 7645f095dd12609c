// The vectorized host reduce/copy kernels, written once over an instruction
// set's traits `Simd` (see reduce_avx2.cc, reduce_avx512.cc).
//
// NOT an ordinary header: it is included only by those two translation units,
// after they define
//   LOOM_SIMD_TARGET   the function attribute enabling their instructions,
//   LOOM_SIMD_INLINE   the same plus always_inline, for the small helpers
//                      (vectors must stay in registers across them),
//   struct Simd        the traits (vector types and primitive operations),
// both inside an anonymous namespace, so everything here has internal linkage
// and is compiled for exactly one instruction set. Functions of the shared
// headers (ops.h, chain.h, types.h) carry no target attribute: they are
// inlined here, and any out-of-line copy the compiler emits is compiled for
// the baseline ISA, so no AVX instruction can leak into code that runs before
// the CPU check.
//
// Semantics: bit-identical to chainElement()/chainElementFp32() (chain.h).
// The narrow float types and float are computed in float vectors: widen
// (exact), apply the op, and round to the element type (widen(narrow(x)))
// before the value is used again, exactly where the scalar chain narrows.
// The integer types and double run lane-wise vector expressions equal to
// the ops.h functors (see "the native-type chain" below). fp8 narrowing
// has two exact methods (Fp8Elem::narrowToWords).
//
// Layout of the work: whole 64-byte lines of the destination per step (the
// loads of the sources need no alignment); elements before the first line
// boundary (when streaming) and after the last whole line run the scalar
// chain. Streaming (non-temporal) stores are used only when asked for and
// the destination is aligned to its element size; a streaming call ends with
// an sfence.

constexpr size_t kLineBytes = 64;

// Loops over the few vectors of one line must be unrolled so the vectors
// live in registers (GCC's -O2 keeps such arrays on the stack otherwise).
#define LOOM_UNROLL _Pragma("GCC unroll 16")

// ---- element types in the float domain ---------------------------------------

// Elem<T>: loads a 64-byte line of T as kVecs float vectors, rounds a float
// vector to T's values, stores kVecs float vectors as a line of T.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static constexpr bool kRoundsLines = false;
  LOOM_SIMD_INLINE static Simd::F fixProduct(Simd::F x) { return x; }
  static constexpr int kVecs = int(kLineBytes / (4 * Simd::kLanes));
  LOOM_SIMD_INLINE static void load(const Byte* p, Simd::F* v) {
    LOOM_UNROLL
    for (int k = 0; k < kVecs; ++k) v[k] = Simd::loadF(p + k * 4 * Simd::kLanes);
  }
  LOOM_SIMD_INLINE static Simd::F round(Simd::F x) { return x; }
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static void store(Byte* p, const Simd::F* v, bool stream) {
    Simd::storeLineF(p, v, stream);
  }
};

template <>
struct Elem<Half> {
  static constexpr bool kRoundsLines = false;
  LOOM_SIMD_INLINE static Simd::F fixProduct(Simd::F x) { return x; }
  static constexpr int kVecs = int(kLineBytes / (2 * Simd::kLanes));
  LOOM_SIMD_INLINE static void load(const Byte* p, Simd::F* v) {
    LOOM_UNROLL
    for (int k = 0; k < kVecs; ++k) v[k] = Simd::loadHalf(p + k * 2 * Simd::kLanes);
  }
  LOOM_SIMD_INLINE static Simd::F round(Simd::F x) { return Simd::roundHalf(x); }
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static void store(Byte* p, const Simd::F* v, bool stream) {
    Simd::storeLineHalf(p, v, stream);
  }
};

// bfloat16 rounding (Bfloat16::fromFloat) on float bits, result in the top
// 16 bits of each lane.
LOOM_SIMD_INLINE Simd::I bf16RoundBits(Simd::F x) {
  const Simd::I u = Simd::castFI(x);
  const Simd::I lsb = Simd::andI(Simd::srli<16>(u), Simd::set1I(1));
  const Simd::I rounded = Simd::addI(Simd::addI(u, Simd::set1I(0x7fff)), lsb);
  const Simd::I nan = Simd::orI(u, Simd::set1I(0x00400000));  // quiet, sign and payload kept
  return Simd::selectI(Simd::cmpUnordF(x, x), nan, rounded);
}

template <>
struct Elem<Bfloat16> {
  static constexpr bool kRoundsLines = false;
  LOOM_SIMD_INLINE static Simd::F fixProduct(Simd::F x) { return x; }
  static constexpr int kVecs = int(kLineBytes / (2 * Simd::kLanes));
  LOOM_SIMD_INLINE static void load(const Byte* p, Simd::F* v) {
    if constexpr (Simd::kHasBf16Words) {
      Simd::loadLineBf16(p, v);  // lane-interleaved order, undone by store()
    } else {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) v[k] = Simd::castIF(Simd::slli<16>(Simd::loadU16toI32(p + k * 2 * Simd::kLanes)));
    }
  }
  LOOM_SIMD_INLINE static Simd::F round(Simd::F x) {
    return Simd::castIF(Simd::andI(bf16RoundBits(x), Simd::set1I(int32_t(0xffff0000u))));
  }
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static void store(Byte* p, const Simd::F* v, bool stream) {
    Simd::I bits[kVecs];
    if constexpr (Simd::kHasBf16Words) {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) bits[k] = bf16RoundBits(v[k]);
      Simd::storeLineBf16(p, bits, stream);
    } else {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) bits[k] = Simd::srli<16>(bf16RoundBits(v[k]));
      Simd::storeLine16(p, bits, stream);
    }
  }
};

// MiniFloat<kE, kM, kInf>::decode / encode (types.h) on vectors of 32-bit
// lanes holding the encodings; each line is the scalar formula.
template <typename Fmt>
struct MiniVec;
template <int kE, int kM, bool kInf>
struct MiniVec<detail::MiniFloat<kE, kM, kInf>> {
  using Fmt = detail::MiniFloat<kE, kM, kInf>;
  static constexpr uint32_t kMagMask = Fmt::kSignBit - 1;
  static constexpr uint32_t kExpField = Fmt::kExpAll << kM;

  LOOM_SIMD_INLINE static Simd::F decode(Simd::I v) {
    const Simd::I sign = Simd::slli<31 - kE - kM>(Simd::andI(v, Simd::set1I(int32_t(Fmt::kSignBit))));
    const Simd::I mag = Simd::andI(v, Simd::set1I(int32_t(kMagMask)));
    const Simd::I man = Simd::andI(v, Simd::set1I(int32_t(Fmt::kManMask)));
    const Simd::I exp = Simd::andI(v, Simd::set1I(int32_t(kExpField)));
    // ((exp + 127 - bias) << 23) | (man << shift) == (mag << shift) + ((127 - bias) << 23)
    const Simd::I normal =
        Simd::addI(Simd::slli<Fmt::kShift>(mag), Simd::set1I(int32_t(uint32_t(127 - Fmt::kBias) << 23)));
    const float scale = detail::bitsToFloat(uint32_t(Fmt::kMinExp - kM + 127) << 23);
    const Simd::I subnormal = Simd::castFI(Simd::mulF(Simd::cvtI32F(man), Simd::set1F(scale)));
    Simd::I out = Simd::selectI(Simd::cmpEqI(exp, Simd::set1I(0)), subnormal, normal);
    if constexpr (kInf) {
      const Simd::I special = Simd::orI(Simd::set1I(0x7f800000), Simd::slli<Fmt::kShift>(man));
      out = Simd::selectI(Simd::cmpEqI(exp, Simd::set1I(int32_t(kExpField))), special, out);
    } else {
      out = Simd::selectI(Simd::cmpEqI(mag, Simd::set1I(int32_t(kMagMask))), Simd::set1I(0x7fc00000), out);
    }
    return Simd::castIF(Simd::orI(sign, out));
  }

  // encode(u, satFinite = true): the reductions narrow fp8 only with SATFINITE.
  LOOM_SIMD_INLINE static Simd::I encodeSatFinite(Simd::F x) {
    const Simd::I u = Simd::castFI(x);
    const Simd::I a = Simd::andI(u, Simd::set1I(0x7fffffff));
    const Simd::I lsb = Simd::andI(Simd::srli<Fmt::kShift>(a), Simd::set1I(1));
    // The scalar code's rebias after the shift, folded into the rounding
    // add: (127 - bias) << 23 is a multiple of 2^kShift. Below the smallest
    // normal this wraps, but the subnormal result is selected there.
    constexpr uint32_t kRound = ((1u << (Fmt::kShift - 1)) - 1u) - (uint32_t(127 - Fmt::kBias) << 23);
    const Simd::I normal = Simd::srli<Fmt::kShift>(Simd::addI(Simd::addI(a, Simd::set1I(int32_t(kRound))), lsb));
    const float magic = detail::bitsToFloat(uint32_t(Fmt::kMinExp - kM + 23 + 127) << 23);
    const Simd::I subnormal =
        Simd::subI(Simd::castFI(Simd::addF(Simd::castIF(a), Simd::set1F(magic))), Simd::castFI(Simd::set1F(magic)));
    // a < 2^31: a signed compare does.
    Simd::I field =
        Simd::selectI(Simd::cmpGtI(Simd::set1I(int32_t(Fmt::kMinNormalFloatBits)), a), subnormal, normal);
    field = Simd::minU32(field, Simd::set1I(int32_t(Fmt::kMaxFinite)));  // SATFINITE (inf included)
    Simd::I nan = Simd::set1I(int32_t(Fmt::kQuietNan));
    if constexpr (kInf) {
      nan = Simd::orI(nan, Simd::andI(Simd::srli<Fmt::kShift>(a), Simd::set1I(int32_t(Fmt::kManMask))));
    }
    field = Simd::selectI(Simd::cmpGtI(a, Simd::set1I(0x7f800000)), nan, field);
    return Simd::orI(Simd::slli<kE + kM>(Simd::srli<31>(u)), field);
  }
};


// SATFINITE round-to-nearest-even of float lanes onto the fp8 grid, in
// float: |x| is clamped to the largest finite value (SATFINITE, infinities
// included), then rounded to the fp8 quantum of its binade by adding and
// subtracting C = quantum * 2^23 (the FPU rounds the sum to nearest even;
// below the smallest normal the quantum stays the subnormal one). The result
// is an exact fp8 value with x's sign, so converting it to half and taking
// bits is exact. kScale: the lanes hold values times 2^-kScale (see
// Fp8Elem). NaN lanes: x itself (kKeepNan), else +-(largest finite + one
// quantum) scaled, which encodes as S.1111.111, e4m3's NaN.
template <typename Fmt, int kScale, bool kKeepNan>
LOOM_SIMD_INLINE Simd::F fp8PreRound(Simd::F x) {
  constexpr int kM = 23 - Fmt::kShift;
  const Simd::I u = Simd::castFI(x);
  Simd::I a = Simd::andI(u, Simd::set1I(0x7fffffff));
  const float maxFinite = detail::bitsToFloat(Fmt::decode(Fmt::kMaxFinite) - (uint32_t(kScale) << 23));
  a = Simd::minU32(a, Simd::castFI(Simd::set1F(maxFinite)));
  const Simd::I binade = Simd::maxU32(Simd::andI(a, Simd::set1I(0x7f800000)),
                                      Simd::set1I(int32_t(Fmt::kMinNormalFloatBits - (uint32_t(kScale) << 23))));
  const Simd::F c = Simd::castIF(Simd::addI(binade, Simd::set1I((23 - kM) << 23)));
  const Simd::F r = Simd::subF(Simd::addF(Simd::castIF(a), c), c);
  const Simd::I sign = Simd::andI(u, Simd::set1I(int32_t(0x80000000u)));
  const Simd::F signedR = Simd::castIF(Simd::orI(Simd::castFI(r), sign));
  Simd::F nan = x;  // converting a NaN keeps its sign and top payload bits
  if constexpr (!kKeepNan) {
    // The value S.1111.111 would have as a normal number (e4m3: 480).
    constexpr uint32_t kNanValueBits =
        ((Fmt::kMaxFinite + 1) << Fmt::kShift) + (uint32_t(127 - Fmt::kBias) << 23) - (uint32_t(kScale) << 23);
    const float nanPattern = detail::bitsToFloat(kNanValueBits);
    nan = Simd::castIF(Simd::orI(sign, Simd::castFI(Simd::set1F(nanPattern))));
  }
  return Simd::selectF(Simd::cmpUnordF(x, x), nan, signedR);
}

// fp8 lines. With the word layout they are widened through F16C:
// e5m2 is the top byte of a half; e4m3 times 2^-8 is a half whose pattern is
// the e4m3 bits shifted left by 7 (its exponent range lands on half's, its
// subnormals on half's subnormals), so e4m3 lanes hold values * 2^-8
// (kScale = 8). Every op is exact under that scaling (all values stay
// normal floats), except that a product must be scaled back once
// (fixProduct). The element order inside a line is permuted the same way for
// every source and undone by store(). Levels with kHasFp8Lines (AVX-512)
// narrow whole lines of bytes at once (lineBytes()); kHasFp8Tables (AVX-512 +
// VBMI) also widen through byte tables instead of F16C (reduce_avx512.cc).
// Simd as a name that depends on T, for traits only some levels define.
template <typename T>
struct SimdFor {
  using type = Simd;
};

template <typename T, typename Fmt>
struct Fp8Elem {
  using S = typename SimdFor<T>::type;
  static constexpr bool kRoundsLines = true;  // roundLine() instead of round()
  static constexpr bool kE5m2 = std::is_same_v<T, Float8e5m2>;
  static constexpr int kScale = Simd::kHasFp8Words && !kE5m2 ? 8 : 0;
  static constexpr int kVecs = int(kLineBytes / Simd::kLanes);
  static constexpr int kWordVecs = kVecs / 2;  // 16-bit lanes: two float vectors each

  LOOM_SIMD_INLINE static void load(const Byte* p, Simd::F* v) {
    if constexpr (Simd::kHasFp8Tables) {
      S::template fp8LineToFloats<kE5m2>(S::loadLine(p), v);
    } else if constexpr (Simd::kHasFp8Words) {
      Simd::I w[kWordVecs];
      Simd::loadLineAsHighBytes(p, w);
      if (!kE5m2 && !Simd::lineHasE4m3Nan(p)) {
        LOOM_UNROLL
        for (int k = 0; k < kWordVecs; ++k) w[k] = Simd::e4m3WordsToScaledHalvesNoNan(w[k]);
      } else if (!kE5m2) {
        LOOM_UNROLL
        for (int k = 0; k < kWordVecs; ++k) w[k] = Simd::e4m3WordsToScaledHalves(w[k]);
      }
      LOOM_UNROLL
      for (int k = 0; k < kWordVecs; ++k) Simd::halvesToFloats(w[k], v + 2 * k);
    } else if constexpr (kE5m2) {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) v[k] = Simd::loadE5m2ViaHalf(p + k * Simd::kLanes);
    } else {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) v[k] = MiniVec<Fmt>::decode(Simd::loadU8toI32(p + k * Simd::kLanes));
    }
  }
  LOOM_SIMD_INLINE static Simd::F fixProduct(Simd::F x) {
    if constexpr (kScale != 0) {
      return Simd::mulF(x, Simd::set1F(float(1u << kScale)));
    } else {
      return x;
    }
  }
  // The line as fp8 bytes in words (word layout only). kExactInHalf: every
  // lane is exact in half (an op of two fp8 values: their sums, products,
  // max/min are; see below), so RNE to half then RNE on the half's bit
  // pattern is exact. Otherwise (a quotient, an fp32 sum) fp8PreRound()
  // rounds in float first and the conversion is exact.
  //
  // Why an op of two fp8 values is exact in half, or safe: a product has at
  // most 8 significant bits, a sum of two values whose exponents differ by
  // less than 9 (e5m2) or 8 (e4m3) fits half's 11 bits, and in both formats
  // every result on the fp8 subnormal grid is a half. Otherwise (a sum with
  // a tiny operand, a product far below the fp8 range) the half rounding
  // moves the value by less than half a half-ulp, far from any fp8 tie, so
  // the second rounding still goes the right way. The exhaustive all-pairs
  // tests check every such pair.
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static void narrowToWords(const Simd::F* v, Simd::I* w) {
    LOOM_UNROLL
    for (int k = 0; k < kWordVecs; ++k) {
      if constexpr (kExactInHalf) {
        w[k] = Simd::template roundHalvesToFp8Words<kE5m2>(Simd::floatsToHalves(v[2 * k], v[2 * k + 1]));
      } else {
        const Simd::F r0 = fp8PreRound<Fmt, kScale, kE5m2>(v[2 * k]);
        const Simd::F r1 = fp8PreRound<Fmt, kScale, kE5m2>(v[2 * k + 1]);
        w[k] = Simd::template halvesToFp8Words<kE5m2>(Simd::floatsToHalves(r0, r1));
      }
    }
  }
  // Exact halves h[0] = floatsToHalves(v[0], v[1]), h[1] (of v[2], v[3]) ->
  // the line's fp8 bytes in element order, as roundHalvesToFp8Words would
  // give them: for e5m2 the fp8 is the half's high byte and the low byte is
  // what rounding drops; for e4m3 (halves of value * 2^-8) the same holds for
  // the half shifted left by one, below its sign (S::roundFp8Bytes). Lines
  // holding a NaN take the word path.
  LOOM_SIMD_INLINE static Simd::I roundHalvesToLine(const Simd::I* h) {
    const Simd::I sign = S::halvesHighBytes(h);
    Simd::I kept, dropped;
    if constexpr (kE5m2) {
      kept = Simd::andI(sign, Simd::set1I(0x7f7f7f7f));
      dropped = S::halvesLowBytes(h);
    } else {
      const Simd::I shifted[2] = {Simd::template slli16<1>(h[0]), Simd::template slli16<1>(h[1])};
      kept = S::halvesHighBytes(shifted);
      dropped = S::halvesLowBytes(shifted);
    }
    Simd::I out;
    if (S::template roundFp8Bytes<kE5m2>(sign, kept, dropped, &out)) return out;
    const Simd::I words[2] = {Simd::template roundHalvesToFp8Words<kE5m2>(h[0]),
                              Simd::template roundHalvesToFp8Words<kE5m2>(h[1])};
    return S::halvesLowBytes(words);
  }
  // The line's fp8 bytes, in element order (kHasFp8Lines levels).
  // kExactInHalf as for narrowToWords.
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static Simd::I lineBytes(const Simd::F* v) {
    Simd::I h[2];
    if constexpr (kExactInHalf) {
      h[0] = Simd::floatsToHalves(v[0], v[1]);
      h[1] = Simd::floatsToHalves(v[2], v[3]);
      return roundHalvesToLine(h);
    } else {
      LOOM_UNROLL
      for (int k = 0; k < 2; ++k) {
        const Simd::F r0 = fp8PreRound<Fmt, kScale, kE5m2>(v[2 * k]);
        const Simd::F r1 = fp8PreRound<Fmt, kScale, kE5m2>(v[2 * k + 1]);
        h[k] = Simd::template halvesToFp8Words<kE5m2>(Simd::floatsToHalves(r0, r1));
      }
      return S::halvesLowBytes(h);
    }
  }
  // round() on a whole line (results of ops, always exact in half).
  LOOM_SIMD_INLINE static void roundLine(Simd::F* v) {
    if constexpr (Simd::kHasFp8Tables) {
      S::template fp8LineToFloats<kE5m2>(lineBytes<true>(v), v);
    } else if constexpr (Simd::kHasFp8Words) {
      Simd::I w[kWordVecs];
      narrowToWords<true>(v, w);
      LOOM_UNROLL
      for (int k = 0; k < kWordVecs; ++k) {
        const Simd::I high = Simd::slli16<8>(w[k]);
        Simd::halvesToFloats(kE5m2 ? high : Simd::e4m3WordsToScaledHalves(high), v + 2 * k);
      }
    } else {
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) v[k] = MiniVec<Fmt>::decode(MiniVec<Fmt>::encodeSatFinite(v[k]));
    }
  }
  template <bool kExactInHalf>
  LOOM_SIMD_INLINE static void store(Byte* p, const Simd::F* v, bool stream) {
    if constexpr (Simd::kHasFp8Lines) {
      S::storeLine(p, lineBytes<kExactInHalf>(v), stream);
    } else if constexpr (Simd::kHasFp8Words) {
      Simd::I w[kWordVecs];
      narrowToWords<kExactInHalf>(v, w);
      S::storeLineFromWords(p, w, stream);
    } else {
      Simd::I bits[kVecs];
      LOOM_UNROLL
      for (int k = 0; k < kVecs; ++k) bits[k] = MiniVec<Fmt>::encodeSatFinite(v[k]);
      Simd::storeLine8(p, bits, stream);
    }
  }
};
template <>
struct Elem<Float8e4m3> : Fp8Elem<Float8e4m3, detail::Float8e4m3Format> {};
template <>
struct Elem<Float8e5m2> : Fp8Elem<Float8e5m2, detail::Float8e5m2Format> {};

// ---- ops in the float domain ---------------------------------------------------

// maximumNumber / minimumNumber (ops.h detail::maxNumber, minNumber): a NaN
// loses to a number, +0 > -0; both NaN: b. Built on the x86 max/min
// instructions, which return their second operand when either is NaN and
// when both are zeros: max(b, a) already gives a for a NaN b and the larger
// otherwise; equal lanes take a & b (max: +0 if either is +0; equal nonzero
// values are the same bits) or a | b (min: -0 if either is -0); a NaN a
// takes b.
LOOM_SIMD_INLINE Simd::F maxNumberV(Simd::F a, Simd::F b) {
  Simd::F r = Simd::maxF(b, a);
  r = Simd::selectF(Simd::cmpEqF(a, b), Simd::andF(a, b), r);
  return Simd::selectF(Simd::cmpUnordF(a, a), b, r);
}
LOOM_SIMD_INLINE Simd::F minNumberV(Simd::F a, Simd::F b) {
  Simd::F r = Simd::minF(b, a);
  r = Simd::selectF(Simd::cmpEqF(a, b), Simd::orF(a, b), r);
  return Simd::selectF(Simd::cmpUnordF(a, a), b, r);
}

enum class VKind { kSum, kProd, kMax, kMin };

// The float-domain form of one RedOp: the binary op, and the constants of
// the pre (kPreMulSum) and post (kSumPostDiv) steps.
template <VKind kKind_, bool kPre, bool kPost>
struct VOp {
  static constexpr VKind kKind = kKind_;
  static constexpr bool kHasPre = kPre;
  static constexpr bool kHasPost = kPost;
  float scalar = 1.0f;   // widened pre-multiply scalar
  float divisor = 1.0f;  // float(divisor)
  LOOM_SIMD_INLINE static Simd::F apply(Simd::F a, Simd::F b) {
    if constexpr (kKind_ == VKind::kSum) return Simd::addF(a, b);
    if constexpr (kKind_ == VKind::kProd) return Simd::mulF(a, b);
    if constexpr (kKind_ == VKind::kMax) return maxNumberV(a, b);
    if constexpr (kKind_ == VKind::kMin) return minNumberV(a, b);
  }
};

// The binary op; products of scaled fp8 lanes are scaled back (fixProduct).
template <typename E, typename V>
LOOM_SIMD_INLINE Simd::F applyOp(Simd::F a, Simd::F b) {
  if constexpr (V::kKind == VKind::kProd) {
    return E::fixProduct(V::apply(a, b));
  } else {
    return V::apply(a, b);
  }
}

// ---- the float-domain chain ----------------------------------------------------

struct Sources {
  const Byte* const* partials;
  int npartials;
  const Byte* local;  // may be null
};

// Rounds a line of op results to T's values (widen(narrow(x))).
template <typename E>
LOOM_SIMD_INLINE void roundAll(Simd::F* v) {
  if constexpr (E::kRoundsLines) {
    E::roundLine(v);
  } else {
    LOOM_UNROLL
    for (int k = 0; k < E::kVecs; ++k) v[k] = E::round(v[k]);
  }
}

// Whole lines [begin, end) (byte offsets) of dst = chain(sources), any
// number of sources. kFp32: round to T only when storing.
template <typename T, typename V, bool kFp32>
LOOM_SIMD_TARGET void chainLines(const V& op, Byte* dst, const Sources& s, bool applyPost, size_t begin,
                                 size_t end, bool stream) {
  using E = Elem<T>;
  constexpr int kV = E::kVecs;
  const Simd::F scalar = Simd::set1F(op.scalar);
  const Simd::F divisor = Simd::set1F(op.divisor);
  for (size_t off = begin; off < end; off += kLineBytes) {
    Simd::F acc[kV], x[kV];
    bool raw = false;  // acc holds an op result not yet rounded to T
    if (s.npartials > 0) {
      E::load(s.partials[0] + off, acc);
      for (int p = 1; p < s.npartials; ++p) {
        E::load(s.partials[p] + off, x);
        if (!kFp32 && raw) roundAll<E>(acc);
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) acc[k] = applyOp<E, V>(acc[k], x[k]);
        raw = true;
      }
      if (s.local != nullptr) {
        E::load(s.local + off, x);
        if constexpr (V::kHasPre) {
          LOOM_UNROLL
          for (int k = 0; k < kV; ++k) x[k] = Simd::mulF(x[k], scalar);
          if (!kFp32) roundAll<E>(x);
        }
        if (!kFp32 && raw) roundAll<E>(acc);
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) acc[k] = applyOp<E, V>(acc[k], x[k]);
        raw = true;
      }
    } else {  // local alone: pre(local)
      E::load(s.local + off, acc);
      if constexpr (V::kHasPre) {
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) acc[k] = Simd::mulF(acc[k], scalar);
        if (!kFp32) roundAll<E>(acc);
      }
    }
    if constexpr (V::kHasPost) {
      if (applyPost) {
        if (!kFp32 && raw) roundAll<E>(acc);
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) acc[k] = Simd::divF(acc[k], divisor);
      }
    }
    if (kFp32 || (V::kHasPost && applyPost)) {
      E::template store<false>(dst + off, acc, stream);
    } else {
      E::template store<true>(dst + off, acc, stream);
    }
  }
}

// The common case (the engine's): exactly two sources, dst = a (op) pre(b),
// then post. `pre` says b is the local input of a kPreMulSum.
template <typename T, typename V, bool kFp32>
LOOM_SIMD_TARGET void pairLines(const V& op, Byte* dst, const Byte* a, const Byte* b, bool pre, bool applyPost,
                                size_t begin, size_t end, bool stream) {
  using E = Elem<T>;
  constexpr int kV = E::kVecs;
  const Simd::F scalar = Simd::set1F(op.scalar);
  const Simd::F divisor = Simd::set1F(op.divisor);
  for (size_t off = begin; off < end; off += kLineBytes) {
    Simd::F x[kV], y[kV];
    E::load(a + off, x);
    E::load(b + off, y);
    if constexpr (V::kHasPre) {
      if (pre) {
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) y[k] = Simd::mulF(y[k], scalar);
        if (!kFp32) roundAll<E>(y);
      }
    }
    LOOM_UNROLL
    for (int k = 0; k < kV; ++k) x[k] = applyOp<E, V>(x[k], y[k]);
    if constexpr (V::kHasPost) {
      if (applyPost) {
        if (!kFp32) roundAll<E>(x);
        LOOM_UNROLL
        for (int k = 0; k < kV; ++k) x[k] = Simd::divF(x[k], divisor);
      }
    }
    if (kFp32 || (V::kHasPost && applyPost)) {
      E::template store<false>(dst + off, x, stream);
    } else {
      E::template store<true>(dst + off, x, stream);
    }
  }
}

// ---- the native-type chain (integers, double) -------------------------------------
//
// A line is handled as Simd::kVecBytes-sized GCC/Clang vectors (VecOf<T>),
// loaded and stored with this ISA's instructions, and each op is written as
// the lane-wise vector expression equal bit for bit to its ops.h functor
// (signed sums and products arrive here on the unsigned type, see
// reduceNative).

template <typename T, size_t kBytes = Simd::kVecBytes>
struct VecOf {
  typedef T type __attribute__((vector_size(kBytes)));
};

// maximumNumber / minimumNumber (ops.h) for double lanes as one select.
template <bool kMax, typename V>
LOOM_SIMD_INLINE V maxMinDouble(V a, V b) {
  using VI = typename VecOf<int64_t>::type;
  const VI nanA = a != a;
  const VI nanB = b != b;
  const VI better = kMax ? VI(a > b) : VI(a < b);
  const VI negA = reinterpret_cast<VI>(a) < 0;
  const VI zeroRule = kMax ? ~negA : negA;  // a == b: max keeps a unless it is -0, min only if -0
  const VI pickA = ~nanA & (nanB | better | (VI(a == b) & zeroRule));
  return pickA ? a : b;
}

// op(a, b) on whole vectors.
template <typename T, typename Op, typename V>
LOOM_SIMD_INLINE V combineVec(V a, V b) {
  // Signed lanes wrap through the unsigned type (ops.h): a signed vector
  // overflow would be undefined behaviour. Only SumPostDiv's sum still
  // arrives here signed (it needs the signed division afterwards).
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> &&
                (std::is_same_v<Op, ProdOp<T>> || !(std::is_same_v<Op, MaxOp<T>> || std::is_same_v<Op, MinOp<T>>))) {
    using UV = typename VecOf<std::make_unsigned_t<T>, sizeof(V)>::type;
    return std::is_same_v<Op, ProdOp<T>> ? V(UV(a) * UV(b)) : V(UV(a) + UV(b));
  } else if constexpr (std::is_same_v<Op, ProdOp<T>>) {
    return a * b;
  } else if constexpr (std::is_same_v<Op, MaxOp<T>>) {
    if constexpr (std::is_floating_point_v<T>) {
      return maxMinDouble<true>(a, b);
    } else {
      return a < b ? b : a;
    }
  } else if constexpr (std::is_same_v<Op, MinOp<T>>) {
    if constexpr (std::is_floating_point_v<T>) {
      return maxMinDouble<false>(a, b);
    } else {
      return b < a ? b : a;
    }
  } else {
    return a + b;  // sum, and the sums of premulsum and sumpostdiv
  }
}

// pre(x) (kPreMulSum: x * scalar).
template <typename T, typename Op, typename V>
LOOM_SIMD_INLINE V preVec(const Op& op, V x) {
  if constexpr (HasPre<Op, T>::value) {
    return x * op.scalar;
  } else {
    return x;
  }
}

// post(x) (kSumPostDiv). 32-bit integers divide in double, equal to
// SumPostDivOp::post's integer division: a quotient of integers below 2^32
// is never within double's rounding error of the next integer, and a
// divisor beyond 2^32 gives 0 either way. 64-bit integers divide lane by lane.
template <typename T, typename Op, typename V>
LOOM_SIMD_INLINE V postVec(const Op& op, V x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / T(op.divisor);
  } else if constexpr (sizeof(T) == 1) {
    // Bytes divide in float: |x| < 2^8, so float's error stays far below
    // the 1/divisor gap to the next integer for divisors below 2^8, and a
    // quotient is below 1 for larger ones.
    const float divisor = float(op.divisor);
    T lanes[sizeof(V)];
    std::memcpy(lanes, &x, sizeof(V));
    LOOM_UNROLL
    for (size_t k = 0; k < sizeof(V); ++k) lanes[k] = T(int32_t(float(lanes[k]) / divisor));
    std::memcpy(&x, lanes, sizeof(V));
    return x;
  } else if constexpr (sizeof(T) <= 4) {
    using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
#ifdef __OPTIMIZE__
    constexpr size_t kN = sizeof(V) / sizeof(T);
    using VD = typename VecOf<double, kN * sizeof(double)>::type;
    using VW = typename VecOf<Wide, kN * sizeof(Wide)>::type;
    const VD q = __builtin_convertvector(x, VD) / double(op.divisor);
    return __builtin_convertvector(__builtin_convertvector(q, VW), V);
#else
    // Unoptimized builds (CMAKE_BUILD_TYPE=Debug): GCC 12 at -O0 fails with
    // an internal compiler error on the 16-lane AVX-512 conversion above, so
    // convert half a vector at a time there. Same results (the kernel tests
    // pass both ways); the optimized form is about 1.5x faster at -O3.
    constexpr size_t kHalf = sizeof(V) / sizeof(T) / 2;
    using VH = typename VecOf<T, kHalf * sizeof(T)>::type;
    using VD = typename VecOf<double, kHalf * sizeof(double)>::type;
    using VW = typename VecOf<Wide, kHalf * sizeof(Wide)>::type;
    VH half[2];
    std::memcpy(half, &x, sizeof(V));
    for (VH& h : half) {
      const VD q = __builtin_convertvector(h, VD) / double(op.divisor);
      h = __builtin_convertvector(__builtin_convertvector(q, VW), VH);
    }
    std::memcpy(&x, half, sizeof(V));
    return x;
#endif
  } else {
    for (size_t k = 0; k < sizeof(V) / sizeof(T); ++k) x[k] = op.post(x[k]);
    return x;
  }
}

template <typename T, typename Op>
LOOM_SIMD_TARGET void nativeLines(const Op& op, Byte* dst, const Sources& s, bool applyPost, size_t begin,
                                  size_t end, bool stream) {
  using V = typename VecOf<T>::type;
  constexpr size_t kParts = kLineBytes / sizeof(V);
  for (size_t off = begin; off < end; off += kLineBytes) {
    V acc[kParts], x[kParts];
    LOOM_UNROLL
    for (size_t k = 0; k < kParts; ++k) {
      const size_t at = off + k * sizeof(V);
      if (s.npartials > 0) {
        acc[k] = Simd::template loadVec<V>(s.partials[0] + at);
        for (int p = 1; p < s.npartials; ++p) {
          x[k] = Simd::template loadVec<V>(s.partials[p] + at);
          acc[k] = combineVec<T, Op>(acc[k], x[k]);
        }
        if (s.local != nullptr) {
          x[k] = Simd::template loadVec<V>(s.local + at);
          acc[k] = combineVec<T, Op>(acc[k], preVec<T>(op, x[k]));
        }
      } else {
        acc[k] = preVec<T>(op, Simd::template loadVec<V>(s.local + at));
      }
      if constexpr (HasPost<Op, T>::value) {
        if (applyPost) acc[k] = postVec<T>(op, acc[k]);
      }
      Simd::storeVec(dst + at, acc[k], stream);
    }
  }
}

// ---- driver ---------------------------------------------------------------------

// The scalar chain for elements [first, last): heads and tails.
template <typename T, typename Op, bool kFp32>
LOOM_SIMD_TARGET void scalarElements(const Op& op, Byte* dst, const Sources& s, bool applyPost, size_t first,
                                     size_t last) {
  for (size_t i = first; i < last; ++i) {
    const size_t off = i * sizeof(T);
    const SourceLoader<T> load{s.partials, s.npartials, s.local, off};
    T out;
    if constexpr (kFp32) {
      out = chainElementFp32<T>(Fp32Sum<T, Op>::terms(op), load, s.npartials, s.local != nullptr, applyPost);
    } else {
      out = chainElement<T>(op, load, s.npartials, s.local != nullptr, applyPost);
    }
    std::memcpy(dst + off, &out, sizeof(T));
  }
}

// [0, count) = a scalar head (up to the first 64-byte boundary of dst, only
// when streaming), whole lines, a scalar tail.
struct Split {
  size_t head;       // elements
  size_t lineBytes;  // bytes of whole lines after the head
  bool stream;
};
template <typename T>
Split splitWork(const Byte* dst, size_t count, bool stream) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
  Split sp{0, 0, stream && addr % sizeof(T) == 0};
  if (sp.stream) sp.head = std::min(count, ((kLineBytes - addr % kLineBytes) % kLineBytes) / sizeof(T));
  sp.lineBytes = (count - sp.head) * sizeof(T) / kLineBytes * kLineBytes;
  return sp;
}

template <typename T, typename Op, typename V, bool kFp32>
LOOM_SIMD_TARGET void runFloatDomain(const Op& op, const V& vop, const ReduceCall& c) {
  const Sources s{c.partials, c.npartials, c.local};
  const Split sp = splitWork<T>(c.dst, c.count, c.stream);
  scalarElements<T, Op, kFp32>(op, c.dst, s, c.applyPost, 0, sp.head);
  const size_t begin = sp.head * sizeof(T);
  const size_t end = begin + sp.lineBytes;
  const int nsources = c.npartials + (c.local != nullptr ? 1 : 0);
  if (nsources == 2) {
    const Byte* b = c.npartials == 2 ? c.partials[1] : c.local;
    pairLines<T, V, kFp32>(vop, c.dst, c.partials[0], b, c.local != nullptr, c.applyPost, begin, end, sp.stream);
  } else {
    chainLines<T, V, kFp32>(vop, c.dst, s, c.applyPost, begin, end, sp.stream);
  }
  scalarElements<T, Op, kFp32>(op, c.dst, s, c.applyPost, end / sizeof(T), c.count);
  if (sp.stream) Simd::fence();
}

template <typename T, typename Op, typename V>
LOOM_SIMD_TARGET void runFloatDomainMaybeFp32(const Op& op, const V& vop, const ReduceCall& c) {
  if constexpr (Fp32Sum<T, Op>::value) {
    if (c.fp32) return runFloatDomain<T, Op, V, true>(op, vop, c);
  }
  runFloatDomain<T, Op, V, false>(op, vop, c);
}

template <typename T>
LOOM_SIMD_TARGET void reduceFloatDomain(const ReduceCall& c) {
  switch (c.op) {
    case RedOp::kSum:
      return runFloatDomainMaybeFp32<T>(SumOp<T>{}, VOp<VKind::kSum, false, false>{}, c);
    case RedOp::kProd:
      return runFloatDomain<T, ProdOp<T>, VOp<VKind::kProd, false, false>, false>(ProdOp<T>{}, {}, c);
    case RedOp::kMax:
      return runFloatDomain<T, MaxOp<T>, VOp<VKind::kMax, false, false>, false>(MaxOp<T>{}, {}, c);
    case RedOp::kMin:
      return runFloatDomain<T, MinOp<T>, VOp<VKind::kMin, false, false>, false>(MinOp<T>{}, {}, c);
    case RedOp::kPreMulSum: {
      const PreMulSumOp<T> op{scalarAs<T>(c.scalar)};
      VOp<VKind::kSum, true, false> vop;
      vop.scalar = Arith<T>::widen(op.scalar);
      return runFloatDomainMaybeFp32<T>(op, vop, c);
    }
    case RedOp::kSumPostDiv: {
      const SumPostDivOp<T> op{c.divisor};
      VOp<VKind::kSum, false, true> vop;
      vop.divisor = float(op.divisor);  // as SumPostDivOp::post converts it
      return runFloatDomainMaybeFp32<T>(op, vop, c);
    }
  }
}

template <typename T, typename Op>
LOOM_SIMD_TARGET void runNative(const Op& op, const ReduceCall& c) {
  const Sources s{c.partials, c.npartials, c.local};
  const Split sp = splitWork<T>(c.dst, c.count, c.stream);
  scalarElements<T, Op, false>(op, c.dst, s, c.applyPost, 0, sp.head);
  const size_t begin = sp.head * sizeof(T);
  const size_t end = begin + sp.lineBytes;
  nativeLines<T>(op, c.dst, s, c.applyPost, begin, end, sp.stream);
  scalarElements<T, Op, false>(op, c.dst, s, c.applyPost, end / sizeof(T), c.count);
  if (sp.stream) Simd::fence();
}

// Signed integers: wrapping sums and products are the same bits as on the
// unsigned type of the same size, which the compiler vectorizes far better
// (its signed<->unsigned casts defeat the vectorizer); only max/min and the
// average's division need the signed type.
template <typename T>
LOOM_SIMD_TARGET void reduceNative(const ReduceCall& c) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (c.op) {
      case RedOp::kSum: return runNative<U>(SumOp<U>{}, c);
      case RedOp::kProd: return runNative<U>(ProdOp<U>{}, c);
      case RedOp::kPreMulSum: return runNative<U>(PreMulSumOp<U>{scalarAs<U>(c.scalar)}, c);
      case RedOp::kSumPostDiv:
        if (!c.applyPost) return runNative<U>(SumOp<U>{}, c);
        break;
      default: break;
    }
  }
  switch (c.op) {
    case RedOp::kSum: return runNative<T>(SumOp<T>{}, c);
    case RedOp::kProd: return runNative<T>(ProdOp<T>{}, c);
    case RedOp::kMax: return runNative<T>(MaxOp<T>{}, c);
    case RedOp::kMin: return runNative<T>(MinOp<T>{}, c);
    case RedOp::kPreMulSum: return runNative<T>(PreMulSumOp<T>{scalarAs<T>(c.scalar)}, c);
    case RedOp::kSumPostDiv: return runNative<T>(SumPostDivOp<T>{c.divisor}, c);
  }
}

#if defined(LOOM_SIMD_FP8_ONLY)
// Only the fp8 types (the including level runs the others elsewhere).
LOOM_SIMD_TARGET void simdReduceFp8(const ReduceCall& c) {
  if (c.type == DataType::kFloat8e4m3) return reduceFloatDomain<Float8e4m3>(c);
  reduceFloatDomain<Float8e5m2>(c);
}
#else
LOOM_SIMD_TARGET void simdReduce(const ReduceCall& c) {
  switch (c.type) {
    case DataType::kInt8: return reduceNative<int8_t>(c);
    case DataType::kUint8: return reduceNative<uint8_t>(c);
    case DataType::kInt32: return reduceNative<int32_t>(c);
    case DataType::kUint32: return reduceNative<uint32_t>(c);
    case DataType::kInt64: return reduceNative<int64_t>(c);
    case DataType::kUint64: return reduceNative<uint64_t>(c);
    case DataType::kFloat64: return reduceNative<double>(c);
    case DataType::kFloat32: return reduceFloatDomain<float>(c);
    case DataType::kFloat16: return reduceFloatDomain<Half>(c);
    case DataType::kBfloat16: return reduceFloatDomain<Bfloat16>(c);
    case DataType::kFloat8e4m3: return reduceFloatDomain<Float8e4m3>(c);
    case DataType::kFloat8e5m2: return reduceFloatDomain<Float8e5m2>(c);
  }
}

// Copies bytes (no overlap) with streaming stores where dst is line aligned.
LOOM_SIMD_TARGET void simdStreamCopy(Byte* dst, const Byte* src, size_t bytes) {
  const size_t head = std::min(bytes, (kLineBytes - reinterpret_cast<uintptr_t>(dst) % kLineBytes) % kLineBytes);
  std::memcpy(dst, src, head);
  const size_t lines = (bytes - head) / kLineBytes * kLineBytes;
  Simd::copyLinesStream(dst + head, src + head, lines);
  std::memcpy(dst + head + lines, src + head + lines, bytes - head - lines);
  Simd::fence();
}
#endif  // LOOM_SIMD_FP8_ONLY
