/*
 * Compile-time checks of the NCCL ABI facts loom promises: enum values,
 * macro values, struct sizes and field offsets. Included from C99, C++ and
 * from a program built against NVIDIA's own nccl.h, so the same list is
 * verified against both headers. Include <nccl.h> and <stddef.h> first.
 *
 * Checks specific to loom's header (the version it reports) are guarded by
 * LOOM_NCCL_HAVE_CUDA_HEADERS, which only loom's nccl.h defines.
 */
#ifndef LOOM_TESTS_NCCL_ABI_CHECKS_H_
#define LOOM_TESTS_NCCL_ABI_CHECKS_H_

#include <limits.h>
#include <stddef.h>

#if defined(__cplusplus)
#define LOOM_ABI_CHECK(tag, cond) static_assert(cond, #tag ": " #cond)
#else
/* C99 has no static_assert: an array of negative size fails to compile. */
#define LOOM_ABI_CHECK(tag, cond) typedef char loom_abi_check_##tag[(cond) ? 1 : -1]
#endif

/* Result codes. */
LOOM_ABI_CHECK(res0, ncclSuccess == 0);
LOOM_ABI_CHECK(res1, ncclUnhandledCudaError == 1);
LOOM_ABI_CHECK(res2, ncclSystemError == 2);
LOOM_ABI_CHECK(res3, ncclInternalError == 3);
LOOM_ABI_CHECK(res4, ncclInvalidArgument == 4);
LOOM_ABI_CHECK(res5, ncclInvalidUsage == 5);
LOOM_ABI_CHECK(res6, ncclRemoteError == 6);
LOOM_ABI_CHECK(res7, ncclInProgress == 7);
LOOM_ABI_CHECK(res8, ncclNumResults == 8);

/* Reduction operators. */
LOOM_ABI_CHECK(op0, ncclSum == 0);
LOOM_ABI_CHECK(op1, ncclProd == 1);
LOOM_ABI_CHECK(op2, ncclMax == 2);
LOOM_ABI_CHECK(op3, ncclMin == 3);
LOOM_ABI_CHECK(op4, ncclAvg == 4);
LOOM_ABI_CHECK(op5, ncclNumOps == 5);
LOOM_ABI_CHECK(opmax, ncclMaxRedOp == 0x7fffffff);
LOOM_ABI_CHECK(opsize, sizeof(ncclRedOp_t) == 4);

/* Data types and their aliases. */
LOOM_ABI_CHECK(dt0, ncclInt8 == 0 && ncclChar == 0);
LOOM_ABI_CHECK(dt1, ncclUint8 == 1);
LOOM_ABI_CHECK(dt2, ncclInt32 == 2 && ncclInt == 2);
LOOM_ABI_CHECK(dt3, ncclUint32 == 3);
LOOM_ABI_CHECK(dt4, ncclInt64 == 4);
LOOM_ABI_CHECK(dt5, ncclUint64 == 5);
LOOM_ABI_CHECK(dt6, ncclFloat16 == 6 && ncclHalf == 6);
LOOM_ABI_CHECK(dt7, ncclFloat32 == 7 && ncclFloat == 7);
LOOM_ABI_CHECK(dt8, ncclFloat64 == 8 && ncclDouble == 8);
LOOM_ABI_CHECK(dt9, ncclBfloat16 == 9);
LOOM_ABI_CHECK(dt10, ncclFloat8e4m3 == 10);
LOOM_ABI_CHECK(dt11, ncclFloat8e5m2 == 11);
LOOM_ABI_CHECK(dt12, ncclNumTypes == 12);
LOOM_ABI_CHECK(dtsize, sizeof(ncclDataType_t) == 4);
LOOM_ABI_CHECK(ressize, sizeof(ncclResult_t) == 4);

LOOM_ABI_CHECK(sr0, ncclScalarDevice == 0);
LOOM_ABI_CHECK(sr1, ncclScalarHostImmediate == 1);

/* Macros. */
LOOM_ABI_CHECK(uid, NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128);
LOOM_ABI_CHECK(undef_int, NCCL_CONFIG_UNDEF_INT == INT_MIN);
LOOM_ABI_CHECK(nocolor, NCCL_SPLIT_NOCOLOR == -1);
#if defined(__cplusplus) /* not an integer constant expression in C */
LOOM_ABI_CHECK(undef_float, NCCL_UNDEF_FLOAT == -1.0f);
#endif
LOOM_ABI_CHECK(win, NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 &&
                        NCCL_WIN_REQUIRED_ALIGNMENT == 4096);
LOOM_ABI_CHECK(cta, NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 &&
                        NCCL_CTA_POLICY_ZERO == 2);
LOOM_ABI_CHECK(shrink, NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1);
LOOM_ABI_CHECK(revoke, NCCL_REVOKE_DEFAULT == 0);
LOOM_ABI_CHECK(vold, NCCL_VERSION(2, 8, 4) == 2804);
LOOM_ABI_CHECK(vnew, NCCL_VERSION(2, 27, 7) == 22707);
LOOM_ABI_CHECK(vnew2, NCCL_VERSION(2, 28, 9) == 22809);
LOOM_ABI_CHECK(vmajor3, NCCL_VERSION(3, 0, 1) == 30001);
LOOM_ABI_CHECK(vcode, NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));

#if defined(LOOM_NCCL_HAVE_CUDA_HEADERS) /* loom's header only */
LOOM_ABI_CHECK(loom_version, NCCL_MAJOR == 2 && NCCL_MINOR == 27 && NCCL_PATCH == 7 &&
                                 NCCL_VERSION_CODE == 22707);
#endif

/* Struct layouts (LP64: Linux x86-64 and aarch64). */
#if defined(__LP64__) || defined(_LP64)
LOOM_ABI_CHECK(cfg_size, sizeof(ncclConfig_t) == 80);
LOOM_ABI_CHECK(cfg_o0, offsetof(ncclConfig_t, size) == 0);
LOOM_ABI_CHECK(cfg_o1, offsetof(ncclConfig_t, magic) == 8);
LOOM_ABI_CHECK(cfg_o2, offsetof(ncclConfig_t, version) == 12);
LOOM_ABI_CHECK(cfg_o3, offsetof(ncclConfig_t, blocking) == 16);
LOOM_ABI_CHECK(cfg_o4, offsetof(ncclConfig_t, cgaClusterSize) == 20);
LOOM_ABI_CHECK(cfg_o5, offsetof(ncclConfig_t, minCTAs) == 24);
LOOM_ABI_CHECK(cfg_o6, offsetof(ncclConfig_t, maxCTAs) == 28);
LOOM_ABI_CHECK(cfg_o7, offsetof(ncclConfig_t, netName) == 32);
LOOM_ABI_CHECK(cfg_o8, offsetof(ncclConfig_t, splitShare) == 40);
LOOM_ABI_CHECK(cfg_o9, offsetof(ncclConfig_t, trafficClass) == 44);
LOOM_ABI_CHECK(cfg_o10, offsetof(ncclConfig_t, commName) == 48);
LOOM_ABI_CHECK(cfg_o11, offsetof(ncclConfig_t, collnetEnable) == 56);
LOOM_ABI_CHECK(cfg_o12, offsetof(ncclConfig_t, CTAPolicy) == 60);
LOOM_ABI_CHECK(cfg_o13, offsetof(ncclConfig_t, shrinkShare) == 64);
LOOM_ABI_CHECK(cfg_o14, offsetof(ncclConfig_t, nvlsCTAs) == 68);
LOOM_ABI_CHECK(cfg_o15, offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72);
LOOM_ABI_CHECK(cfg_o16, offsetof(ncclConfig_t, nvlinkCentricSched) == 76);

LOOM_ABI_CHECK(sim_size, sizeof(ncclSimInfo_t) == 24);
LOOM_ABI_CHECK(sim_o0, offsetof(ncclSimInfo_t, size) == 0);
LOOM_ABI_CHECK(sim_o1, offsetof(ncclSimInfo_t, magic) == 8);
LOOM_ABI_CHECK(sim_o2, offsetof(ncclSimInfo_t, version) == 12);
LOOM_ABI_CHECK(sim_o3, offsetof(ncclSimInfo_t, estimatedTime) == 16);
#endif

#endif /* LOOM_TESTS_NCCL_ABI_CHECKS_H_ */
