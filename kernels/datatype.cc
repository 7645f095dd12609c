#include "kernels/datatype.h"

namespace loom::kernels {

bool isFloatingType(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return true;
    default:
      return false;
  }
}

}  // namespace loom::kernels
