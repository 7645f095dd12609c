// The data types and reduction operations the perf tools know, with the
// names nccl-tests prints and accepts on the command line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "nccl.h"
#include "tools/perf/float_codec.h"

namespace loom::perf {

enum class TypeKind { kSigned, kUnsigned, kFloat };

struct TypeInfo {
  ncclDataType_t type;
  const char* name;  // as printed in the table ("float", "f8e4m3", ...)
  size_t size;       // bytes per element
  TypeKind kind;
  SmallFloatLayout layout;  // meaningful for kFloat only

  bool isFloat() const { return kind == TypeKind::kFloat; }
  int bits() const { return int(size * 8); }
};

// Reduction operations as the tools name them. kMulSum is NCCL's PreMulSum
// with scalar 1 on even ranks and 2 on odd ranks; kNone is for collectives
// that only move data.
enum class Op { kSum, kProd, kMax, kMin, kAvg, kMulSum, kNone };

// Every type, in nccl-tests' order (the order "-d all" runs them).
std::span<const TypeInfo> allTypes();
const TypeInfo& typeInfo(ncclDataType_t type);
// Exact names plus a few aliases (char, int, fp16, bf16, fp32, ...).
std::optional<ncclDataType_t> parseTypeName(std::string_view name);

// sum, prod, max, min, avg, mulsum (the order "-o all" runs them).
std::span<const Op> allOps();
const char* opName(Op op);
std::optional<Op> parseOpName(std::string_view name);
// The built-in ncclRedOp_t for every op but kMulSum and kNone.
ncclRedOp_t builtinRedOp(Op op);

// PreMulSum scalar of a rank for kMulSum: 1 on even ranks, 2 on odd ranks.
inline int preMulScalar(int rank) { return rank % 2 == 0 ? 1 : 2; }
// The scalar as one element of `type`, in the low bytes of the result.
uint64_t preMulScalarBits(const TypeInfo& type, int rank);

}  // namespace loom::perf
