// Groups and user reduction ops.
#include "api/api.h"
#include "core/group.h"

using loom::Status;
using loom::core::Communicator;

using namespace loom;
using namespace loom::api;

NCCL_API(ncclResult_t, ncclGroupStart) {
  return guard("ncclGroupStart", [&] { return loom::core::groupStart(); });
}

NCCL_API(ncclResult_t, ncclGroupEnd) {
  return guard("ncclGroupEnd", [&] { return loom::core::groupEnd(); });
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo) {
  return guard("ncclGroupSimulateEnd", [&]() -> Status {
    LOOM_TRY(checkPtr(simInfo, "simInfo"));
    if (simInfo->magic != 0x74685283u) {
      return invalidArgument("simInfo->magic is wrong: initialise it with NCCL_SIM_INFO_INITIALIZER");
    }
    float estimate = 0;
    Status s = loom::core::groupSimulateEnd(&estimate);
    simInfo->estimatedTime = estimate;
    return s;
  });
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm) {
  return guard("ncclRedOpCreatePreMulSum", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef c, lookup(comm));
    LOOM_TRY(checkPtr(op, "op"));
    LOOM_TRY(checkPtr(scalar, "scalar"));
    LOOM_TRY(checkType(datatype));
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
      return invalidArgument("residence " + std::to_string(int(residence)) +
                             " is neither ncclScalarDevice nor ncclScalarHostImmediate");
    }
    LOOM_ASSIGN_OR_RETURN(int value, c->createPreMulSum(loom::kernels::DataType(datatype), scalar,
                                                        residence == ncclScalarDevice));
    *op = ncclRedOp_t(value);
    return Status::ok();
  });
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm) {
  return guard("ncclRedOpDestroy", [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::core::CommRef c, lookup(comm));
    return c->destroyOp(int(op));
  });
}
