#include "core/scalar.h"

#include <cstring>

#include "kernels/types.h"

namespace loom::core {

uint64_t encodeScalar(kernels::DataType type, double value) {
  using namespace kernels;
  uint64_t bits = 0;
  auto store = [&bits](auto v) { std::memcpy(&bits, &v, sizeof v); };
  switch (type) {
    case DataType::kInt8: store(int8_t(value)); break;
    case DataType::kUint8: store(uint8_t(value)); break;
    case DataType::kInt32: store(int32_t(value)); break;
    case DataType::kUint32: store(uint32_t(value)); break;
    case DataType::kInt64: store(int64_t(value)); break;
    case DataType::kUint64: store(uint64_t(value)); break;
    case DataType::kFloat16: store(Half::fromFloat(float(value)).bits); break;
    case DataType::kFloat32: store(float(value)); break;
    case DataType::kFloat64: store(value); break;
    case DataType::kBfloat16: store(Bfloat16::fromFloat(float(value)).bits); break;
    case DataType::kFloat8e4m3: store(Float8e4m3::fromFloat(float(value)).bits); break;
    case DataType::kFloat8e5m2: store(Float8e5m2::fromFloat(float(value)).bits); break;
  }
  return bits;
}

}  // namespace loom::core
