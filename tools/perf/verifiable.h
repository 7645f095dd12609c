// Inputs whose reductions are exact in every order, and their expected
// results, for every data type and operation the perf tools test.
//
// How exactness is reached (the same ideas for every type; values are built
// on the host, element by element, from a hash of (seed, index, rank)):
// - sum, mulsum (floats and signed integers): each element draws a scale
//   2^E and gives a subset of ranks integer "units" whose absolute values
//   add up to at most the type's exact budget (2^precision for floats, the
//   largest positive value for signed integers). Every partial sum, in any
//   order, is then an integer number of units within the budget, so every
//   intermediate result is exactly representable. mulsum weighs odd ranks
//   by their scalar 2 inside the same budget.
// - unsigned sum, mulsum and prod: arbitrary values; arithmetic modulo 2^bits
//   is exact and order-free (products use odd values so they never vanish).
// - prod (floats and signed integers): one rank per element holds a random
//   mantissa, the others hold +-2^k with k >= 0 and a bounded total, so the
//   product never overflows or rounds, whatever the order.
// - min, max: arbitrary finite values; selection is always exact. No input is
//   ever -0 or NaN.
// - avg: integers use non-negative units within the budget; the expected
//   value is the exact sum divided by the rank count, truncated. Floats give
//   non-zero values of one sign to at most two ranks (the others give +0),
//   and the expected value is the exactly rounded (a + b) / n. A library may
//   divide after summing (0.5 ULP from exact) or pre-multiply by a rounded
//   1/n like NCCL (each of the three roundings costs at most about 0.5 ULP of
//   the result because both terms have the same sign), so results are
//   accepted within kAvgToleranceUlps; every other combination is compared
//   bit for bit.
// - none (data movement): arbitrary finite values depending on the index
//   only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tools/perf/datatypes.h"

namespace loom::perf {

// Distance in units in the last place accepted for float averages.
inline constexpr int kAvgToleranceUlps = 2;

struct GenSpec {
  const TypeInfo* type;
  Op op;        // Op::kNone for collectives that only move data
  int nranks;   // ranks taking part in the reduction
  uint64_t seed;
};

// Writes rank `rank`'s input elements [firstIndex, firstIndex + count) to
// `out` (count * type->size bytes). For Op::kNone the rank is ignored.
void generateInput(const GenSpec& spec, int rank, uint64_t firstIndex, size_t count, void* out);

// Writes the expected reduction over all ranks of elements
// [firstIndex, firstIndex + count). For Op::kNone: the same as the input.
void generateExpected(const GenSpec& spec, uint64_t firstIndex, size_t count, void* out);

// Elements of `actual` that differ from `expected`: bit for bit, except
// float averages within kAvgToleranceUlps.
int64_t countMismatches(const TypeInfo& type, Op op, const void* actual, const void* expected, size_t count);

// Helpers shared with the tests.
uint64_t loadElement(const TypeInfo& type, const void* base, size_t index);
void storeElement(const TypeInfo& type, void* base, size_t index, uint64_t bits);
// Distance in ULPs between two non-NaN values of a float type, counting
// through zero (+0 and -0 are 0 apart).
uint64_t ulpDistance(const TypeInfo& type, uint64_t a, uint64_t b);

}  // namespace loom::perf
