#include "dtype_ref.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

namespace loom::test {
namespace {

constexpr std::array<TypeInfo, 12> kTypes = {{
    {ncclInt8, "int8", 1, false, true},
    {ncclUint8, "uint8", 1, false, false},
    {ncclInt32, "int32", 4, false, true},
    {ncclUint32, "uint32", 4, false, false},
    {ncclInt64, "int64", 8, false, true},
    {ncclUint64, "uint64", 8, false, false},
    {ncclFloat16, "half", 2, true, true, 10, 5, 15, true},
    {ncclFloat32, "float", 4, true, true, 23, 8, 127, true},
    {ncclFloat64, "double", 8, true, true, 52, 11, 1023, true},
    {ncclBfloat16, "bfloat16", 2, true, true, 7, 8, 127, true},
    {ncclFloat8e4m3, "f8e4m3", 1, true, true, 3, 4, 7, false},
    {ncclFloat8e5m2, "f8e5m2", 1, true, true, 2, 5, 15, true},
}};

uint64_t expField(const TypeInfo& t, uint64_t bits) {
  return (bits >> t.mantBits) & ((uint64_t(1) << t.expBits) - 1);
}
uint64_t mantField(const TypeInfo& t, uint64_t bits) { return bits & ((uint64_t(1) << t.mantBits) - 1); }
uint64_t allOnesExp(const TypeInfo& t) { return (uint64_t(1) << t.expBits) - 1; }

// Decoding from the bit fields; valid for every floating format here.
double decodeGeneric(const TypeInfo& t, uint64_t bits) {
  const int width = int(t.size * 8);
  const bool neg = (bits >> (width - 1)) & 1;
  const uint64_t e = expField(t, bits), m = mantField(t, bits);
  double v;
  if (e == allOnesExp(t) && t.ieeeSpecials) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == allOnesExp(t) && m == (uint64_t(1) << t.mantBits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();  // e4m3: the only NaN pattern
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - t.bias - t.mantBits);
  } else {
    v = std::ldexp(double(m + (uint64_t(1) << t.mantBits)), int(e) - t.bias - t.mantBits);
  }
  return neg ? -v : v;
}

// Lookup tables for the 8- and 16-bit formats (the matrix decodes millions
// of elements).
const std::vector<double>& table(ncclDataType_t type) {
  static std::once_flag once;
  static std::vector<double> tables[12];
  std::call_once(once, [] {
    for (ncclDataType_t t : {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2}) {
      const TypeInfo& info = typeInfo(t);
      const size_t n = size_t(1) << (8 * info.size);
      tables[t].resize(n);
      for (size_t b = 0; b < n; ++b) tables[t][b] = decodeGeneric(info, b);
    }
  });
  return tables[type];
}

// Fast path of encodeFloat for the narrow formats (the matrix encodes
// millions of values): a nonzero value in the normal range that float
// holds exactly, whose float mantissa bits beyond the format's are zero, is
// re-biased and truncated. Anything else takes the general path.
bool encodeNarrowExact(const TypeInfo& t, double x, uint64_t* out) {
  const float f = float(x);
  if (double(f) != x || x == 0) return false;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const int e = int((u >> 23) & 0xff) - 127;
  const uint32_t mant = u & 0x7fffff;
  const int drop = 23 - t.mantBits;
  const int maxE = int(allOnesExp(t)) - (t.ieeeSpecials ? 1 : 0) - t.bias;
  if (((u >> 23) & 0xff) == 0 || e < 1 - t.bias || e > maxE || (mant & ((1u << drop) - 1)) != 0) return false;
  const uint64_t mf = mant >> drop;
  if (!t.ieeeSpecials && e == maxE && mf == (uint64_t(1) << t.mantBits) - 1) return false;  // e4m3 NaN slot
  *out = (uint64_t(u >> 31) << (t.size * 8 - 1)) | (uint64_t(e + t.bias) << t.mantBits) | mf;
  return true;
}

}  // namespace

const std::array<ncclDataType_t, 12>& allTypes() {
  static const std::array<ncclDataType_t, 12> kAll = {
      ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
      ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  return kAll;
}

const TypeInfo& typeInfo(ncclDataType_t type) { return kTypes.at(size_t(type)); }

const double* decodeTable(ncclDataType_t type) {
  const TypeInfo& t = typeInfo(type);
  return t.isFloat && t.size <= 2 ? table(type).data() : nullptr;
}

double decodeFloat(ncclDataType_t type, uint64_t bits) {
  switch (type) {
    case ncclFloat32: {
      float f;
      uint32_t u = uint32_t(bits);
      std::memcpy(&f, &u, 4);
      return f;
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    default:
      return table(type)[size_t(maskBits(bits, typeInfo(type).size))];
  }
}

bool isNanBits(ncclDataType_t type, uint64_t bits) { return std::isnan(decodeFloat(type, bits)); }

bool isFiniteBits(ncclDataType_t type, uint64_t bits) { return std::isfinite(decodeFloat(type, bits)); }

uint64_t encodeFloat(ncclDataType_t type, double x, bool* exact) {
  if (exact) *exact = true;
  if (type == ncclFloat64) {
    uint64_t b;
    std::memcpy(&b, &x, 8);
    return b;
  }
  if (type == ncclFloat32) {
    float f = float(x);  // round to nearest even
    if (exact) *exact = double(f) == x || std::isnan(x);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  const TypeInfo& t = typeInfo(type);
  uint64_t fast = 0;
  if (encodeNarrowExact(t, x, &fast)) return fast;
  const int width = int(t.size * 8);
  const uint64_t signBit = uint64_t(1) << (width - 1);
  const uint64_t nanBits = t.ieeeSpecials ? (allOnesExp(t) << t.mantBits) | 1
                                          : (allOnesExp(t) << t.mantBits) | ((uint64_t(1) << t.mantBits) - 1);
  if (std::isnan(x)) return nanBits;
  const uint64_t sign = std::signbit(x) ? signBit : 0;
  const double a = std::fabs(x);
  if (a == 0) return sign;
  const uint64_t infBits = t.ieeeSpecials ? allOnesExp(t) << t.mantBits : nanBits;
  if (std::isinf(a)) {
    if (exact) *exact = t.ieeeSpecials;
    return sign | infBits;
  }
  int e2 = 0;
  std::frexp(a, &e2);
  int e = e2 - 1;  // a in [2^e, 2^(e+1))
  const int emin = 1 - t.bias;
  uint64_t bits;
  double scale, q;
  if (e < emin) {
    scale = std::ldexp(1.0, emin - t.mantBits);
    q = std::nearbyint(a / scale);  // may reach 2^m: then it is the smallest normal, same bits
    bits = uint64_t(q);
  } else {
    scale = std::ldexp(1.0, e - t.mantBits);
    q = std::nearbyint(a / scale);
    if (q == std::ldexp(1.0, t.mantBits + 1)) {
      ++e;
      scale *= 2;
      q /= 2;
    }
    const uint64_t ef = uint64_t(e + t.bias);
    const uint64_t mf = uint64_t(q) - (uint64_t(1) << t.mantBits);
    const uint64_t maxEf = t.ieeeSpecials ? allOnesExp(t) - 1 : allOnesExp(t);
    if (ef > maxEf || (!t.ieeeSpecials && ef == maxEf && mf == (uint64_t(1) << t.mantBits) - 1)) {
      if (exact) *exact = false;
      return sign | infBits;
    }
    bits = (ef << t.mantBits) | mf;
  }
  if (exact) *exact = q * scale == a;
  return sign | bits;
}

double ulpAt(ncclDataType_t type, double x) {
  const TypeInfo& t = typeInfo(type);
  const double a = std::fabs(x);
  const int emin = 1 - t.bias;
  if (a < std::ldexp(1.0, emin)) return std::ldexp(1.0, emin - t.mantBits);  // subnormal spacing
  int e2 = 0;
  std::frexp(a, &e2);
  return std::ldexp(1.0, e2 - 1 - t.mantBits);
}

double maxExactInteger(ncclDataType_t type) { return std::ldexp(1.0, typeInfo(type).mantBits + 1); }

int64_t signedValue(ncclDataType_t type, uint64_t bits) {
  const size_t w = typeInfo(type).size * 8;
  if (w == 64) return int64_t(bits);
  const uint64_t sign = uint64_t(1) << (w - 1);
  bits = maskBits(bits, w / 8);
  return (bits & sign) ? int64_t(bits) - int64_t(uint64_t(1) << w) : int64_t(bits);
}

std::string formatValue(ncclDataType_t type, uint64_t bits) {
  const TypeInfo& t = typeInfo(type);
  bits = maskBits(bits, t.size);
  char buf[96];
  if (t.isFloat) {
    std::snprintf(buf, sizeof buf, "0x%0*llx (%.17g)", int(t.size * 2), static_cast<unsigned long long>(bits),
                  decodeFloat(type, bits));
  } else if (t.isSigned) {
    std::snprintf(buf, sizeof buf, "0x%0*llx (%lld)", int(t.size * 2), static_cast<unsigned long long>(bits),
                  static_cast<long long>(signedValue(type, bits)));
  } else {
    std::snprintf(buf, sizeof buf, "0x%0*llx (%llu)", int(t.size * 2), static_cast<unsigned long long>(bits),
                  static_cast<unsigned long long>(bits));
  }
  return buf;
}

}  // namespace loom::test
