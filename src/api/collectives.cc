// Collectives and point-to-point calls: argument checks, then the engine.
#include "api/api.h"
#include "core/group.h"

using loom::Status;
using loom::core::Communicator;
using loom::core::OpDesc;
using loom::core::OpKind;

namespace loom::api {
namespace {

// Checks what every data call shares and builds the OpDesc. `span` is how
// many `count`-sized blocks the largest buffer holds (nranks for AllGather's
// output, 1 for AllReduce...), for the overflow check.
Status prepare(OpKind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
               int op, int root, Communicator* c, OpDesc* desc) {
  LOOM_TRY(checkType(datatype));
  const int n = c->nranks();
  const size_t es = kernels::dataTypeSize(kernels::DataType(datatype));
  const size_t span = (kind == OpKind::kAllGather || kind == OpKind::kReduceScatter ||
                       kind == OpKind::kAllToAll || kind == OpKind::kGather || kind == OpKind::kScatter)
                          ? size_t(n) : 1;
  if (size_t bytes = 0; __builtin_mul_overflow(count, es * span, &bytes)) {
    return invalidArgument("count " + std::to_string(count) + " overflows the buffer size for " +
                           std::to_string(n) + " ranks");
  }
  if (core::isRooted(kind)) LOOM_TRY(checkRank(root, n, "root"));
  if (kind == OpKind::kSend || kind == OpKind::kRecv) LOOM_TRY(checkRank(root, n, "peer"));
  if (count > 0) {
    const int me = c->rank();
    const bool needSend = kind != OpKind::kRecv &&
                          !((kind == OpKind::kBroadcast || kind == OpKind::kScatter) && me != root);
    const bool needRecv = kind != OpKind::kSend &&
                          !((kind == OpKind::kReduce || kind == OpKind::kGather) && me != root);
    if (needSend) LOOM_TRY(checkPtr(sendbuff, kind == OpKind::kSend ? "sendbuff" : "sendbuff"));
    if (needRecv) LOOM_TRY(checkPtr(recvbuff, "recvbuff"));
  }
  desc->kind = kind;
  desc->sendbuf = sendbuff;
  desc->recvbuf = recvbuff;
  desc->count = count;
  desc->type = kernels::DataType(datatype);
  desc->root = root;
  if (core::isReducing(kind)) LOOM_TRY(c->resolveOp(op, desc->type, &desc->reduction, &desc->scalarPtr));
  else desc->reduction.type = desc->type;
  return Status::ok();
}

Status run(OpKind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           int op, int root, ncclComm_t comm, cudaStream_t stream) {
  CallScope call(comm);
  LOOM_ASSIGN_OR_RETURN(Communicator* c, call.usable());
  OpDesc desc;
  LOOM_TRY(prepare(kind, sendbuff, recvbuff, count, datatype, op, root, c, &desc));
  desc.stream = stream;
  return core::enqueue(c, desc);
}

}  // namespace
}  // namespace loom::api

using namespace loom;
using namespace loom::api;

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAllReduce", [&] {
    return run(OpKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclReduce", [&] {
    return run(OpKind::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclReduceScatter", [&] {
    return run(OpKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAllGather", [&] {
    return run(OpKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclBroadcast", [&] {
    return run(OpKind::kBroadcast, sendbuff, recvbuff, count, datatype, 0, root, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclBcast", [&] {
    return run(OpKind::kBroadcast, buff, buff, count, datatype, 0, root, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAlltoAll", [&] {
    return run(OpKind::kAllToAll, sendbuff, recvbuff, count, datatype, 0, 0, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclGather", [&] {
    return run(OpKind::kGather, sendbuff, recvbuff, count, datatype, 0, root, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclScatter", [&] {
    return run(OpKind::kScatter, sendbuff, recvbuff, count, datatype, 0, root, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclSend", [&] {
    return run(OpKind::kSend, sendbuff, nullptr, count, datatype, 0, peer, comm, stream);
  });
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclRecv", [&] {
    return run(OpKind::kRecv, nullptr, recvbuff, count, datatype, 0, peer, comm, stream);
  });
}
