/*
 * loom's extensions to the NCCL API. Exported by libloom.so and
 * libnccl.so.2 beside the NCCL functions; programs that use them need
 * loom (NVIDIA's library has none of these).
 */
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Buffer mode of a communicator, fixed at its init. Host: host pointers,
 * the stream is ignored and a call returns when its operation is done.
 * Cuda: device pointers, the operation is ordered on the call's stream. */
typedef enum {
  loomBufferModeDefault = 0, /* LOOM_DEVICE: auto (cuda where a device answers), host or cuda */
  loomBufferModeHost = 1,
  loomBufferModeCuda = 2
} loomBufferMode_t;

/* The mode of the communicators the calling thread creates from now on
 * (ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitRankScalable,
 * ncclCommInitAll, a new rank's ncclCommGrow); loomBufferModeDefault goes
 * back to LOOM_DEVICE. Splits, shrinks and the old ranks' grows keep their
 * parent's mode. One process may hold host and cuda
 * communicators side by side (a CPU backend beside a GPU one). Cuda where no
 * device answers fails the init that asks for it. */
ncclResult_t loomSetBufferMode(loomBufferMode_t mode);

/* The mode `comm` runs in (never loomBufferModeDefault). */
ncclResult_t loomCommGetBufferMode(const ncclComm_t comm, loomBufferMode_t* mode);

/* How long an operation of `comm` may make no progress before it fails
 * with ncclRemoteError, naming the ranks it waits for: `seconds` from now
 * on, for the operations that start after the call (LOOM_TIMEOUT_S gives
 * the value at init). 0 waits for ever; negative or not finite is
 * ncclInvalidArgument. Frameworks map their group timeout onto it. */
ncclResult_t loomCommSetTimeout(ncclComm_t comm, double seconds);

/* The timeout `comm` applies now, in seconds (0: none). */
ncclResult_t loomCommGetTimeout(const ncclComm_t comm, double* seconds);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_H_ */
