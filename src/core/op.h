// One user operation (a collective or a point-to-point call) as the engine
// sees it, after argument checks and op mapping.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/datatype.h"
#include "kernels/reduce.h"

namespace loom::core {

enum class OpKind : int {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};
inline constexpr size_t kOpKindCount = size_t(OpKind::kRecv) + 1;  // kRecv is the last
constexpr const char* opKindName(OpKind kind) {  // "AllReduce", ...
  switch (kind) {
    case OpKind::kAllReduce: return "AllReduce";
    case OpKind::kAllGather: return "AllGather";
    case OpKind::kReduceScatter: return "ReduceScatter";
    case OpKind::kBroadcast: return "Broadcast";
    case OpKind::kReduce: return "Reduce";
    case OpKind::kAllToAll: return "AllToAll";
    case OpKind::kGather: return "Gather";
    case OpKind::kScatter: return "Scatter";
    case OpKind::kSend: return "Send";
    case OpKind::kRecv: return "Recv";
  }
  return "?";
}

struct OpDesc {
  OpKind kind = OpKind::kAllReduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  // Elements, with NCCL's meaning per collective (AllGather: sendcount,
  // ReduceScatter: recvcount, AllToAll/Gather/Scatter: per-peer count).
  size_t count = 0;
  kernels::DataType type = kernels::DataType::kFloat32;
  // Reducing collectives only. For PreMulSum with a device-resident scalar,
  // scalarPtr is read when the operation runs.
  kernels::Reduction reduction{};
  const void* scalarPtr = nullptr;
  int root = 0;  // Broadcast/Reduce/Gather/Scatter root; Send/Recv peer
  // Cuda mode: the cudaStream_t it is ordered on (nullptr: the legacy
  // default stream). Host mode ignores it: calls complete before returning.
  void* stream = nullptr;
};

inline bool isReducing(OpKind kind) {
  return kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter || kind == OpKind::kReduce;
}
// Kinds with a root (OpDesc::root is one).
inline bool isRooted(OpKind kind) {
  return kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather ||
         kind == OpKind::kScatter;
}
// Kinds a group merges into one point-to-point plan.
inline bool isPointToPoint(OpKind kind) {
  return kind == OpKind::kSend || kind == OpKind::kRecv || kind == OpKind::kAllToAll || kind == OpKind::kGather ||
         kind == OpKind::kScatter;
}

}  // namespace loom::core
