/*
 * Takes the address of every host function of the NCCL API, plain and
 * p-prefixed, through pointers whose types spell out the expected
 * signatures, then calls ncclGetVersion.
 *
 * check_link.sh builds this file against loom's nccl.h (as C99, no CUDA
 * headers) and against NVIDIA's nccl.h, links it to loom's libnccl.so.2 with
 * immediate binding and runs it. So it shows that (a) both headers declare
 * the same signatures, (b) loom's library defines every function a program
 * built against either header can reference, and (c) the library loads.
 * check_link.sh also verifies that every function nccl.h declares appears
 * here, so this list cannot silently fall behind the header.
 *
 * LOOM_EXPECTED_NCCL_VERSION (from CMake) is the version code loom reports.
 */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>

#include "nccl_abi_checks.h"

#ifndef LOOM_EXPECTED_NCCL_VERSION
#error "define LOOM_EXPECTED_NCCL_VERSION"
#endif
/* Make sure the include path picked the header the script asked for. */
#if defined(LOOM_EXPECT_NVIDIA_HEADER) && defined(LOOM_NCCL_HAVE_CUDA_HEADERS)
#error "expected NVIDIA's nccl.h but loom's was included"
#endif
#if defined(LOOM_EXPECT_LOOM_HEADER) && !defined(LOOM_NCCL_HAVE_CUDA_HEADERS)
#error "expected loom's nccl.h but another one was included"
#endif

/* One typed pointer for ncclX and one for pncclX, with external linkage so
 * the compiler keeps them and the loader must resolve every name. An
 * incompatible signature is a compile error (the script builds with
 * -Werror=incompatible-pointer-types). */
#define LOOM_REF(ret, name, params)  \
  ret (*ref_##name) params = name;   \
  ret (*ref_p##name) params = p##name;

LOOM_REF(ncclResult_t, ncclMemAlloc, (void**, size_t))
LOOM_REF(ncclResult_t, ncclMemFree, (void*))
LOOM_REF(ncclResult_t, ncclGetVersion, (int*))
LOOM_REF(ncclResult_t, ncclGetUniqueId, (ncclUniqueId*))
LOOM_REF(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*))
LOOM_REF(ncclResult_t, ncclCommInitRank, (ncclComm_t*, int, ncclUniqueId, int))
LOOM_REF(ncclResult_t, ncclCommInitAll, (ncclComm_t*, int, const int*))
LOOM_REF(ncclResult_t, ncclCommFinalize, (ncclComm_t))
LOOM_REF(ncclResult_t, ncclCommDestroy, (ncclComm_t))
LOOM_REF(ncclResult_t, ncclCommAbort, (ncclComm_t))
LOOM_REF(ncclResult_t, ncclCommRevoke, (ncclComm_t, int))
LOOM_REF(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*))
LOOM_REF(ncclResult_t, ncclCommShrink, (ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int))
/* NCCL 2.30's, which older NVIDIA headers do not declare. */
#if defined(LOOM_NCCL_HAVE_CUDA_HEADERS) || NCCL_VERSION_CODE >= 23000
LOOM_REF(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t, ncclUniqueId*))
LOOM_REF(ncclResult_t, ncclCommGrow, (ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*))
#endif
LOOM_REF(ncclResult_t, ncclCommInitRankScalable,
         (ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*))
LOOM_REF(const char*, ncclGetErrorString, (ncclResult_t))
LOOM_REF(const char*, ncclGetLastError, (ncclComm_t))
LOOM_REF(void, ncclResetDebugInit, (void))
LOOM_REF(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*))
LOOM_REF(ncclResult_t, ncclCommCount, (const ncclComm_t, int*))
LOOM_REF(ncclResult_t, ncclCommCuDevice, (const ncclComm_t, int*))
LOOM_REF(ncclResult_t, ncclCommUserRank, (const ncclComm_t, int*))
LOOM_REF(ncclResult_t, ncclCommRegister, (const ncclComm_t, void*, size_t, void**))
LOOM_REF(ncclResult_t, ncclCommDeregister, (const ncclComm_t, void*))
LOOM_REF(ncclResult_t, ncclCommWindowRegister, (ncclComm_t, void*, size_t, ncclWindow_t*, int))
LOOM_REF(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t))
LOOM_REF(ncclResult_t, ncclRedOpCreatePreMulSum,
         (ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t))
LOOM_REF(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t, ncclComm_t))
LOOM_REF(ncclResult_t, ncclReduce,
         (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclBcast, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclBroadcast,
         (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclAllReduce,
         (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclReduceScatter,
         (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclAllGather,
         (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclAlltoAll,
         (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclGather,
         (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclScatter,
         (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclSend, (const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclRecv, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
LOOM_REF(ncclResult_t, ncclGroupStart, (void))
LOOM_REF(ncclResult_t, ncclGroupEnd, (void))
LOOM_REF(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t*))

int main(void) {
  int version = 0;
  int pversion = 0;
  ncclResult_t rc = ref_ncclGetVersion(&version);
  if (rc != ncclSuccess) {
    fprintf(stderr, "FAIL: ncclGetVersion returned %d\n", (int)rc);
    return 1;
  }
  if (version != LOOM_EXPECTED_NCCL_VERSION) {
    fprintf(stderr, "FAIL: ncclGetVersion reported %d, expected %d (wrong libnccl.so.2 loaded?)\n",
            version, LOOM_EXPECTED_NCCL_VERSION);
    return 1;
  }
  if (ref_pncclGetVersion(&pversion) != ncclSuccess || pversion != version) {
    fprintf(stderr, "FAIL: pncclGetVersion disagrees with ncclGetVersion (%d vs %d)\n", pversion,
            version);
    return 1;
  }
  printf("OK: loaded libnccl.so.2 reports version %d\n", version);
  return 0;
}
