// NCCL data types and reduction operations as loom's kernels see them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::kernels {

// Same numeric values as ncclDataType_t.
enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
constexpr int kNumDataTypes = 12;

// What the kernels compute. ncclAvg is mapped by the caller: integers ->
// kSumPostDiv, floating types -> kPreMulSum with scalar 1/nranks.
enum class RedOp : int { kSum, kProd, kMax, kMin, kPreMulSum, kSumPostDiv };

size_t dataTypeSize(DataType t);
const char* dataTypeName(DataType t);  // "float", "bfloat16", ... (nccl-tests names)
bool isFloatingType(DataType t);
constexpr bool isFp8(DataType t) { return t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2; }
const char* redOpName(RedOp op);

}  // namespace loom::kernels
