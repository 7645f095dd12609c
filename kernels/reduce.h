// Host (CPU) reduction entry points used by the engine's host-memory paths.
//
// Thread safety: pure functions of their arguments; any number of threads may
// call them at once on disjoint destinations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/datatype.h"

namespace loom::kernels {

struct Reduction {
  DataType type;
  RedOp op;
  // kPreMulSum: the scalar, as a value of `type` stored in the low bytes (memcpy of the typed value).
  uint64_t scalar = 0;
  // kSumPostDiv: the divisor (nranks).
  uint64_t divisor = 1;
};

// dst[i] = post( partials[0][i] (+) ... (+) partials[npartials-1][i] (+) pre(local[i]) )
// pre(x) = scalar*x for kPreMulSum, x otherwise; post(x) = x/divisor for kSumPostDiv when applyPost, x otherwise.
// local may be null (then only partials are combined); npartials may be 0 (then dst = post(pre(local))).
// dst may alias any source exactly (same pointer); partial overlap is not allowed. count is in elements.
//
// Details of the contract:
//  - Sources are combined strictly left to right as written above, rounding
//    to `type` after every step (kernels/ops.h documents each op's rounding,
//    NaN and overflow rules), so results are deterministic for a given order.
//  - No alignment is required of any pointer.
//  - With no source at all (npartials == 0 and local == null) nothing is
//    written. A divisor of 0 is treated as 1.
//  - A single source with no pre/post step is copied bit for bit (no
//    conversion, so NaN payloads and fp8 infinities survive it).
void reduce(const Reduction& r, void* dst, const void* const* partials, int npartials,
            const void* local, size_t count, bool applyPost);

// memcpy-like copy used by the engine. Overlapping ranges are allowed (it
// behaves as memmove); dst == src is a no-op.
void copy(void* dst, const void* src, size_t bytes);

}  // namespace loom::kernels
