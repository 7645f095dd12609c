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
// "float", "bfloat16", ...: spelled as nccl-tests prints them, so logs and
// tools line up with it. Inline (like redOpName and core's opKindName):
// every operation records its names in the flight recorder.
constexpr const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "half";
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat8e4m3: return "f8e4m3";
    case DataType::kFloat8e5m2: return "f8e5m2";
  }
  return "unknown";
}
bool isFloatingType(DataType t);
constexpr bool isFp8(DataType t) { return t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2; }
constexpr const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum: return "sum";
    case RedOp::kProd: return "prod";
    case RedOp::kMax: return "max";
    case RedOp::kMin: return "min";
    case RedOp::kPreMulSum: return "premulsum";
    case RedOp::kSumPostDiv: return "sumpostdiv";
  }
  return "unknown";
}

}  // namespace loom::kernels
