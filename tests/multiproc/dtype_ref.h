// Reference model of the NCCL element types for the public-API tests.
//
// Written independently of loom's kernels (kernels/types.h) on purpose: the
// tests compare loom's results with what these decoders/encoders say, so a
// shared bug cannot hide. Only what the tests need is here: decode any bit
// pattern to double, encode a double with round-to-nearest-even, the spacing
// of representable values (ULP), and loading/storing elements by size.
#pragma once

#include <nccl.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace loom::test {

struct TypeInfo {
  ncclDataType_t type;
  const char* name;
  size_t size;      // bytes
  bool isFloat;
  bool isSigned;    // integers only
  // Floating types: explicit mantissa bits, exponent bits, bias, and
  // whether the all-ones exponent means inf/NaN (IEEE) or, as in e4m3
  // ("fn"), only S.1111.111 is NaN and there is no infinity.
  int mantBits = 0;
  int expBits = 0;
  int bias = 0;
  bool ieeeSpecials = true;
};

const std::array<ncclDataType_t, 12>& allTypes();
const TypeInfo& typeInfo(ncclDataType_t type);

// Element access: the value's bits in the low bytes of a uint64_t.
// (Inline with fixed-size copies: the matrix touches every element.)
inline uint64_t loadBits(const void* base, size_t index, size_t elemSize) {
  const auto* p = static_cast<const uint8_t*>(base) + index * elemSize;
  switch (elemSize) {
    case 1: return *p;
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
}
inline void storeBits(void* base, size_t index, size_t elemSize, uint64_t bits) {
  auto* p = static_cast<uint8_t*>(base) + index * elemSize;
  switch (elemSize) {
    case 1: *p = uint8_t(bits); break;
    case 2: { uint16_t v = uint16_t(bits); std::memcpy(p, &v, 2); break; }
    case 4: { uint32_t v = uint32_t(bits); std::memcpy(p, &v, 4); break; }
    default: std::memcpy(p, &bits, 8); break;
  }
}
inline uint64_t maskBits(uint64_t bits, size_t elemSize) {
  return elemSize >= 8 ? bits : bits & ((uint64_t(1) << (8 * elemSize)) - 1);
}

// Floating types.
double decodeFloat(ncclDataType_t type, uint64_t bits);
// Decoded value of every bit pattern of the 8- and 16-bit floating types
// (indexed by the bits); NULL for the other types.
const double* decodeTable(ncclDataType_t type);
bool isNanBits(ncclDataType_t type, uint64_t bits);
bool isFiniteBits(ncclDataType_t type, uint64_t bits);
// Nearest representable value, ties to even. *exact (optional) says whether
// x was representable. Values beyond the largest finite one give inf (IEEE
// formats) or NaN (e4m3); the tests never ask for those.
uint64_t encodeFloat(ncclDataType_t type, double x, bool* exact = nullptr);
// Distance between the two representable values around |x| (for x at a
// power of two, the spacing above it).
double ulpAt(ncclDataType_t type, double x);
// Largest M such that every integer in [-M, M] is representable: 2^(p)
// with p = mantBits + 1.
double maxExactInteger(ncclDataType_t type);

// Integers: the value as signed/unsigned 64-bit.
int64_t signedValue(ncclDataType_t type, uint64_t bits);

// "0x3c00 (1)" for messages.
std::string formatValue(ncclDataType_t type, uint64_t bits);

}  // namespace loom::test
