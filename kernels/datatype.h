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

// 0 for a value that is not a DataType: callers validate before using it.
// Inline: every operation asks several times, and a call showed in the
// profile of an 8-byte collective.
constexpr size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}
const char* dataTypeName(DataType t);  // "float", "bfloat16", ... (nccl-tests names)
bool isFloatingType(DataType t);
constexpr bool isFp8(DataType t) { return t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2; }
const char* redOpName(RedOp op);

}  // namespace loom::kernels
