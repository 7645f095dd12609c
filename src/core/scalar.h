// Scalars of any NCCL data type, as the kernels' Reduction stores them.
#pragma once

#include <cstdint>

#include "kernels/datatype.h"

namespace loom::core {

// The bits of `value` converted (round to nearest even) to `type`, in the
// low bytes of the result.
uint64_t encodeScalar(kernels::DataType type, double value);

}  // namespace loom::core
