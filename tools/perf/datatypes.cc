#include "tools/perf/datatypes.h"

#include <cstring>
#include <string>

namespace loom::perf {
namespace {

constexpr SmallFloatLayout kNoLayout{0, 0, false};

constexpr TypeInfo kTypes[] = {
    {ncclInt8, "int8", 1, TypeKind::kSigned, kNoLayout},
    {ncclUint8, "uint8", 1, TypeKind::kUnsigned, kNoLayout},
    {ncclInt32, "int32", 4, TypeKind::kSigned, kNoLayout},
    {ncclUint32, "uint32", 4, TypeKind::kUnsigned, kNoLayout},
    {ncclInt64, "int64", 8, TypeKind::kSigned, kNoLayout},
    {ncclUint64, "uint64", 8, TypeKind::kUnsigned, kNoLayout},
    {ncclFloat16, "half", 2, TypeKind::kFloat, kHalfLayout},
    {ncclFloat32, "float", 4, TypeKind::kFloat, kFloatLayout},
    {ncclFloat64, "double", 8, TypeKind::kFloat, kDoubleLayout},
    {ncclBfloat16, "bfloat16", 2, TypeKind::kFloat, kBfloat16Layout},
    {ncclFloat8e4m3, "f8e4m3", 1, TypeKind::kFloat, kE4M3Layout},
    {ncclFloat8e5m2, "f8e5m2", 1, TypeKind::kFloat, kE5M2Layout},
};

struct Alias {
  const char* name;
  ncclDataType_t type;
};
// Names older nccl-tests releases and other tools use for the same types.
constexpr Alias kTypeAliases[] = {
    {"char", ncclInt8},        {"int", ncclInt32},         {"fp16", ncclFloat16},
    {"float16", ncclFloat16},  {"fp32", ncclFloat32},      {"float32", ncclFloat32},
    {"fp64", ncclFloat64},     {"float64", ncclFloat64},   {"bf16", ncclBfloat16},
    {"e4m3", ncclFloat8e4m3},  {"fp8e4m3", ncclFloat8e4m3}, {"e5m2", ncclFloat8e5m2},
    {"fp8e5m2", ncclFloat8e5m2},
};

constexpr Op kOps[] = {Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg, Op::kMulSum};

}  // namespace

std::span<const TypeInfo> allTypes() { return kTypes; }

const TypeInfo& typeInfo(ncclDataType_t type) {
  for (const TypeInfo& info : kTypes) {
    if (info.type == type) return info;
  }
  return kTypes[7];  // unreachable for the types above; float as a safe default
}

std::optional<ncclDataType_t> parseTypeName(std::string_view name) {
  for (const TypeInfo& info : kTypes) {
    if (name == info.name) return info.type;
  }
  for (const Alias& alias : kTypeAliases) {
    if (name == alias.name) return alias.type;
  }
  return std::nullopt;
}

std::span<const Op> allOps() { return kOps; }

const char* opName(Op op) {
  switch (op) {
    case Op::kSum: return "sum";
    case Op::kProd: return "prod";
    case Op::kMax: return "max";
    case Op::kMin: return "min";
    case Op::kAvg: return "avg";
    case Op::kMulSum: return "mulsum";
    case Op::kNone: return "none";
  }
  return "none";
}

std::optional<Op> parseOpName(std::string_view name) {
  for (Op op : kOps) {
    if (name == opName(op)) return op;
  }
  if (name == "premulsum") return Op::kMulSum;
  return std::nullopt;
}

ncclRedOp_t builtinRedOp(Op op) {
  switch (op) {
    case Op::kProd: return ncclProd;
    case Op::kMax: return ncclMax;
    case Op::kMin: return ncclMin;
    case Op::kAvg: return ncclAvg;
    default: return ncclSum;
  }
}

uint64_t preMulScalarBits(const TypeInfo& type, int rank) {
  int scalar = preMulScalar(rank);
  if (!type.isFloat()) return uint64_t(scalar);
  if (type.type == ncclFloat32) {
    float f = float(scalar);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
  }
  return encodeFloat(double(scalar), type.layout);
}

}  // namespace loom::perf
