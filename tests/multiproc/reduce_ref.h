// Inputs and expected results for the reducing collectives.
//
// Inputs are chosen, as nccl-tests does, so that every reduction is exact
// whatever order the ranks are combined in:
//  - sum, premulsum (scalar a power of two for floating types): integers
//    in [-K, K] with n*K at most the largest integer the type holds
//    exactly, so every partial sum is an exactly representable integer
//    (times the scalar, which only shifts the exponent);
//  - prod: +-0.5, +-1, +-2 on floating types (a product of n <= 8 of them
//    is a power of two in [2^-8, 2^8], representable in every type, fp8
//    included); integers wrap modulo 2^bits, which is exact in any order;
//  - max, min: any finite value (the result is one of the inputs);
//  - avg: integers in [0, K] (integer types: [-K, K] with no overflow; the
//    mean is truncated toward zero as C does, which is NCCL's rule).
// Floating avg is exact when nranks is a power of two (1/n and every
// partial sum are then exact). For 3, 5, 6 or 7 ranks 1/n has no exact binary
// form: a library may pre-multiply by the rounded 1/n (NCCL and loom do) or
// divide the sum, and it rounds partial sums in its own order, so no input
// gives one right answer in general (with dense inputs the error exceeds
// 2 ULP). These cases therefore use sparse inputs: at most two ranks per
// element hold a nonzero value, each +-2^k (k in 0..4). Then each
// premultiplied term is exact and the sum rounds once. The result is then
// within 1.2 ULP of the exact mean for every format, either method, any
// order and 3 to 7 ranks (computed exhaustively over this value set; the
// extremes: 7 ranks in float, where r + 2r, r the rounded 1/7, is a tie
// that rounds away from 3/7 by 1.14 ULP, and 5 ranks in e5m2 by division,
// 1.2 ULP). The check allows kAvgToleranceUlp = 1.25 ULP of the exact mean.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace loom::test {

enum class Red { kSum, kProd, kMax, kMin, kAvg, kPreMulHost, kPreMulDevice, kNone };
constexpr Red kAllReds[] = {Red::kSum, Red::kProd,       Red::kMax,          Red::kMin,
                            Red::kAvg, Red::kPreMulHost, Red::kPreMulDevice};
const char* redName(Red red);
bool isPreMul(Red red);

// The value a rank contributes at `index`, as element bits. kNone: any bit
// pattern (copies must preserve every bit, NaN payloads included).
uint64_t inputBits(ncclDataType_t type, Red red, int nranks, uint64_t seed, int rank, size_t index);

// The scalar the tests give ncclRedOpCreatePreMulSum (a power of two for
// floating types), as element bits.
uint64_t preMulScalarBits(ncclDataType_t type, Red red);

struct Expected {
  uint64_t bits = 0;     // exact result (nearest value for tolerant ones)
  bool tolerant = false; // compare within kAvgToleranceUlp of `exact`
  double exact = 0;      // tolerant results only
  bool designError = false;  // the inputs did not give an exact result: a test bug
};
constexpr double kAvgToleranceUlp = 1.25;

// Reduction of in[0..nranks) (element bits) as NCCL defines `red`.
// Reducer keeps what does not change from element to element.
class Reducer {
 public:
  Reducer(ncclDataType_t type, Red red, int nranks);
  Expected operator()(const uint64_t* in) const;

 private:
  double decode(uint64_t bits) const;
  Expected floatReduce(const uint64_t* in) const;
  Expected intReduce(const uint64_t* in) const;

  ncclDataType_t type_;
  Red red_;
  int n_;
  bool isFloat_, isSigned_, tolerant_;
  size_t size_;
  const double* table_;  // narrow floating types
  double scalar_ = 0;    // premulsum, floating
  uint64_t scalarBits_ = 0;
};
Expected reduceRef(ncclDataType_t type, Red red, int nranks, const uint64_t* in);
// Whether `actual` is acceptable for `e`.
bool acceptable(ncclDataType_t type, const Expected& e, uint64_t actual);

}  // namespace loom::test
