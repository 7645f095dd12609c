/*
 * nccl.h -- loom's implementation of the NCCL host C API.
 *
 * loom is a collective-communication library that can stand in for NVIDIA's
 * NCCL: programs built against NVIDIA's nccl.h run against loom's
 * libnccl.so.2 unchanged, and programs built against this header run against
 * either library. Names, signatures, enum values and struct layouts therefore
 * follow the NCCL 2.28 host API exactly; the text is loom's own.
 *
 * Version reported. This header (and ncclGetVersion) report 2.27.7 although
 * the 2.28 host additions (ncclAlltoAll, ncclGather, ncclScatter, and the
 * 2.28 ncclConfig_t fields) are present. Programs such as nccl-tests switch
 * to NVIDIA's device-side API (nccl_device.h) when they see 2.28 or later,
 * and loom does not provide that device API.
 *
 * Two execution modes.
 *   - CUDA mode: buffers are device (or registered) memory and every
 *     communication call is ordered on the given cudaStream_t, as with NCCL.
 *     A call returns once the work is queued; synchronise the stream to wait
 *     for the data.
 *   - Host mode (no GPU): buffers are ordinary host pointers, the `stream`
 *     argument is ignored (pass NULL), and a communication call returns only
 *     after the operation has finished on this rank. Calls made between
 *     ncclGroupStart and ncclGroupEnd are queued and all finish inside
 *     ncclGroupEnd.
 *
 * Threading. Library-wide calls (ncclGetVersion, ncclGetErrorString,
 * ncclGetUniqueId) may be made from any thread at any time. A communicator
 * must be driven by one thread at a time; different communicators may be used
 * concurrently from different threads. Group nesting depth is tracked per
 * thread, so a group must be opened and closed on the same thread.
 *
 * Each function also exists with a `p` prefix (pncclAllReduce, ...). The
 * p-names are the real definitions; the plain names are weak aliases, so a
 * profiling or tracing layer can define the plain name, do its work and then
 * forward to the p-name.
 *
 * The header is valid C99 and C++. When <cuda_runtime.h> can be found it is
 * included (with the fp16/bf16/fp8 type headers, as NVIDIA's header does);
 * otherwise, or when LOOM_NCCL_NO_CUDA is defined before inclusion, only an
 * opaque cudaStream_t compatible with CUDA's is declared, so host-only code
 * can be built without a CUDA toolkit.
 */

#ifndef NCCL_H_
#define NCCL_H_

/* ---- CUDA types --------------------------------------------------------- */

/* LOOM_NCCL_HAVE_CUDA_HEADERS tells the includer which way the header went:
 * 1 when the CUDA runtime headers were included, 0 when only the opaque
 * stream type below was declared. */
#define LOOM_NCCL_HAVE_CUDA_HEADERS 0
#if !defined(LOOM_NCCL_NO_CUDA) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#undef LOOM_NCCL_HAVE_CUDA_HEADERS
#define LOOM_NCCL_HAVE_CUDA_HEADERS 1
#endif
#endif

#if LOOM_NCCL_HAVE_CUDA_HEADERS
#include <cuda_runtime.h>
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#endif
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11000 && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#if defined(__cplusplus) && defined(CUDART_VERSION) && CUDART_VERSION >= 11080 && \
    __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#endif
#elif !defined(__DRIVER_TYPES_H__) /* CUDA's driver_types.h not seen yet */
/* Same spelling as CUDA's own declaration, so that CUDA headers included
 * later in a C11 or C++ translation unit redeclare the identical type. */
typedef struct CUstream_st* cudaStream_t;
#endif

#include <limits.h> /* INT_MIN for NCCL_CONFIG_UNDEF_INT */
#include <stddef.h> /* size_t, NULL */

/* ---- version ------------------------------------------------------------ */

/* Version encoding: releases before 2.9 used MAJOR*1000 + MINOR*100 + PATCH,
 * later ones MAJOR*10000 + MINOR*100 + PATCH. Compare NCCL_VERSION_CODE with
 * NCCL_VERSION(x, y, z), never with a literal. */
#define NCCL_VERSION(X, Y, Z)                                     \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z)          \
                          : (X) * 10000 + (Y) * 100 + (Z))

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""
/* Equals NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH); kept as a literal
 * so it can be used where the ternary above is awkward. */
#define NCCL_VERSION_CODE 22707

#if defined(__GNUC__) || defined(__clang__)
#define LOOM_NCCL_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define LOOM_NCCL_DEPRECATED(msg)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- handles and identifiers -------------------------------------------- */

/* A communicator: one rank's membership in a group of ranks. Opaque; created
 * by the ncclCommInit* / ncclCommSplit calls and released by ncclCommDestroy
 * or ncclCommAbort. The struct tag matches NVIDIA's so that C++ names
 * mangled with ncclComm_t agree between the two libraries. */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

/* A registered memory window (see ncclCommWindowRegister). Opaque. */
typedef struct ncclWindow_vidmem* ncclWindow_t;

/* The rendezvous token that lets independently started ranks find each
 * other. Produced once by ncclGetUniqueId and copied byte for byte to every
 * rank (over MPI, a file, a socket ...). Its content is private to the
 * library that produced it: an id made by loom is only understood by loom. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* C++ sees the enums that callers pass in (results, operators, data types,
 * scalar residence) with a fixed underlying int: the same size and values C sees,
 * and any int a caller passes is a value the library can check instead of
 * undefined behaviour. */
#if defined(__cplusplus)
#define LOOM_NCCL_ENUM_INT : int
#else
#define LOOM_NCCL_ENUM_INT
#endif

/* ---- result codes ------------------------------------------------------- */

typedef enum LOOM_NCCL_ENUM_INT {
  ncclSuccess = 0,            /* the call did what was asked */
  ncclUnhandledCudaError = 1, /* a CUDA runtime/driver call failed */
  ncclSystemError = 2,        /* the OS refused something: socket, memory, file */
  ncclInternalError = 3,      /* a bug or broken invariant inside the library */
  ncclInvalidArgument = 4,    /* a bad value: null pointer, rank out of range ... */
  ncclInvalidUsage = 5,       /* a call not allowed now, or not supported */
  ncclRemoteError = 6,        /* a peer failed or went away */
  ncclInProgress = 7,         /* non-blocking communicator: not finished yet */
  ncclNumResults = 8          /* count of the codes above, not a result */
} ncclResult_t;

/* ---- configuration ------------------------------------------------------ */

/* "Not set" markers: a field left at these values gets the library default
 * (which environment variables may change). */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
/* Colour meaning "this rank joins no new communicator" in ncclCommSplit. */
#define NCCL_SPLIT_NOCOLOR -1
/* Float "not set" marker, used by ncclSimInfo_t. */
#define NCCL_UNDEF_FLOAT -1.0f

/* winFlags for ncclCommWindowRegister. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01 /* same-size window on every rank */
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Values for ncclConfig_t.CTAPolicy (GPU thread-block usage policy). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* shrinkFlags for ncclCommShrink. */
#define NCCL_SHRINK_DEFAULT 0x00 /* parent is healthy: plain shrink */
#define NCCL_SHRINK_ABORT 0x01   /* stop the parent's pending work first */

/* revokeFlags for ncclCommRevoke: only 0 is defined. */
#define NCCL_REVOKE_DEFAULT 0x00

/*
 * Per-communicator options, passed to ncclCommInitRankConfig,
 * ncclCommInitRankScalable, ncclCommSplit and ncclCommShrink.
 *
 * Always start from NCCL_CONFIG_INITIALIZER and then set the fields you care
 * about: the first three fields identify the struct's layout, and a struct
 * whose `magic` is wrong is rejected with ncclInvalidArgument. The layout
 * (LP64: 80 bytes) is NVIDIA's 2.28 one. A struct from an older header (a
 * smaller `size`) is read only up to its size, the missing options keeping
 * their defaults; trailing fields from a newer header are ignored. The
 * struct and its strings are only read during the call.
 *
 * Values NCCL refuses (a flag other than 0 or 1, minCTAs above maxCTAs,
 * ...) are refused with ncclInvalidArgument naming the field. loom acts on
 * `blocking`, `commName`, `minCTAs`/`maxCTAs` (they bound the channels: NCCL's
 * thread blocks per operation are its channels), `netName` (as NCCL_NET) and
 * `trafficClass` (the verbs queue pairs' class of service); NCCL_MIN_CTAS,
 * NCCL_MAX_CTAS, NCCL_NET and NCCL_IB_TC, where set, win over them as in
 * NCCL. The other fields tune GPU thread blocks, NVLink SHARP or resource
 * sharing; they are accepted and have no effect.
 */
typedef struct ncclConfig_v22800 {
  /* Header, filled in by NCCL_CONFIG_INITIALIZER; do not change. */
  size_t size;          /* sizeof(ncclConfig_t) the caller was built with */
  unsigned int magic;   /* 0xcafebeef */
  unsigned int version; /* NCCL_VERSION_CODE the caller was built with */
  /* Options. NCCL_CONFIG_UNDEF_INT / NULL means "use the default". */
  int blocking;         /* 1 (default): calls return when done. 0: init and
                           group calls may return ncclInProgress; poll
                           ncclCommGetAsyncError. Other values: invalid. */
  int cgaClusterSize;   /* GPU thread-block cluster size */
  int minCTAs;          /* lower bound on GPU thread blocks per operation */
  int maxCTAs;          /* upper bound on GPU thread blocks per operation */
  const char* netName;  /* network plugin/transport to use, by name */
  int splitShare;       /* 1: a split child may share its parent's resources */
  int trafficClass;     /* network traffic class (QoS) for this communicator */
  const char* commName; /* label for log messages */
  int collnetEnable;    /* 1: allow in-network reduction (CollNet/SHARP) */
  int CTAPolicy;        /* one of NCCL_CTA_POLICY_* */
  int shrinkShare;      /* 1: a shrunk child may share its parent's resources */
  int nvlsCTAs;         /* GPU thread blocks for NVLink SHARP operations */
  int nChannelsPerNetPeer; /* parallel channels per network peer */
  int nvlinkCentricSched;  /* NVLink-first scheduling hint */
} ncclConfig_t;

/* Initialiser for ncclConfig_t: header filled in, every option "not set".
 * Usage:  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; cfg.blocking = 0; */
#define NCCL_CONFIG_INITIALIZER                                              \
  {                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef,                                        \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                    \
        NCCL_CONFIG_UNDEF_INT /* blocking */,                                \
        NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */,                          \
        NCCL_CONFIG_UNDEF_INT /* minCTAs */,                                 \
        NCCL_CONFIG_UNDEF_INT /* maxCTAs */,                                 \
        NCCL_CONFIG_UNDEF_PTR /* netName */,                                 \
        NCCL_CONFIG_UNDEF_INT /* splitShare */,                              \
        NCCL_CONFIG_UNDEF_INT /* trafficClass */,                            \
        NCCL_CONFIG_UNDEF_PTR /* commName */,                                \
        NCCL_CONFIG_UNDEF_INT /* collnetEnable */,                           \
        NCCL_CONFIG_UNDEF_INT /* CTAPolicy */,                               \
        NCCL_CONFIG_UNDEF_INT /* shrinkShare */,                             \
        NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */,                                \
        NCCL_CONFIG_UNDEF_INT /* nChannelsPerNetPeer */,                     \
        NCCL_CONFIG_UNDEF_INT /* nvlinkCentricSched */                       \
  }

/* Output of ncclGroupSimulateEnd. Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
  size_t size;         /* sizeof(ncclSimInfo_t) */
  unsigned int magic;  /* 0x74685283 */
  unsigned int version;/* NCCL_VERSION_CODE the caller was built with */
  float estimatedTime; /* written by ncclGroupSimulateEnd */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                            \
  {                                                                          \
    sizeof(ncclSimInfo_t), 0x74685283,                                       \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT   \
  }

/* ---- reduction operators and data types --------------------------------- */

typedef enum LOOM_NCCL_ENUM_INT {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4, /* sum divided by the number of ranks */
  /* Number of built-in operators. Operators made by ncclRedOpCreatePreMulSum
   * get values from ncclNumOps upwards. */
  ncclNumOps = 5,
  /* Largest value an operator may take. The enum is int-sized on every ABI
   * loom supports, so this is INT_MAX; it exists to pin that size. */
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Element types. Several names share a value: they are aliases. */
typedef enum LOOM_NCCL_ENUM_INT {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, /* IEEE half */
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10, /* 8-bit float, 4 exponent / 3 mantissa bits */
  ncclFloat8e5m2 = 11, /* 8-bit float, 5 exponent / 2 mantissa bits */
  ncclNumTypes = 12    /* count of distinct types, not a type */
} ncclDataType_t;

/* Where the scalar given to ncclRedOpCreatePreMulSum lives. */
typedef enum LOOM_NCCL_ENUM_INT {
  /* The pointer is read each time a collective using the operator runs
   * (CUDA mode: device-accessible memory; host mode: a host address). The
   * memory must stay valid until the operator is destroyed. */
  ncclScalarDevice = 0,
  /* The pointer is host memory read once, before the create call returns. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ======================================================================== */
/* Library and memory                                                        */
/* ======================================================================== */

/* ncclMemAlloc: allocate `size` bytes suited to communication buffers and
 * store the address in *ptr. The block may be larger than asked (allocation
 * granularity). CUDA mode: device memory usable by every transport. Host
 * mode: page-aligned host memory. Release with ncclMemFree only.
 * Thread-safe. ptr == NULL or size == 0 gives ncclInvalidArgument. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);

/* ncclMemFree: release a block from ncclMemAlloc. NULL is accepted and does
 * nothing; a pointer that ncclMemAlloc did not return (or that was freed
 * already) gives ncclInvalidArgument. The block must no longer be used by
 * any pending operation. Thread-safe. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ncclGetVersion: store the version of the library actually loaded (which
 * may differ from NCCL_VERSION_CODE of the header a program was built with)
 * in *version. Thread-safe; needs no communicator. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* ncclGetUniqueId: create a fresh rendezvous id. Call it on one process
 * only, then hand the same bytes to every rank's ncclCommInitRank* call. The
 * calling process serves the rendezvous, so it must stay alive until every
 * rank has joined. Thread-safe. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* ncclGetErrorString: a constant, human-readable name for `result`. Never
 * NULL; unknown codes give a generic text. Thread-safe. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* ncclGetLastError: a description of the most recent failed call in this
 * process, on any thread (comm is accepted for compatibility and may be
 * NULL). Never NULL; an empty string means nothing has failed yet. The
 * returned text belongs to the calling thread and stays valid until that
 * thread calls ncclGetLastError again. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* ncclResetDebugInit: re-read the logging settings from the environment.
 * Kept only for old callers; deprecated by NVIDIA and by loom. Not safe to
 * call while other threads are inside the library. */
LOOM_NCCL_DEPRECATED("ncclResetDebugInit is deprecated and not part of the supported API")
void ncclResetDebugInit(void);
LOOM_NCCL_DEPRECATED("pncclResetDebugInit is deprecated and not part of the supported API")
void pncclResetDebugInit(void);

/* ======================================================================== */
/* Communicator life cycle                                                  */
/* ======================================================================== */

/* ncclCommInitRank: join a communicator of `nranks` ranks as rank `rank`
 * (0 <= rank < nranks, each rank used exactly once) using the id from
 * ncclGetUniqueId. Blocks until all ranks have joined, so the ranks of one
 * communicator must call it from different threads/processes, or from one
 * thread inside ncclGroupStart/ncclGroupEnd (the joins then complete in
 * ncclGroupEnd). CUDA mode: the communicator binds to the current CUDA
 * device. On failure *comm is not valid. Same as ncclCommInitRankConfig with
 * a NULL config. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* ncclCommInitRankConfig: ncclCommInitRank with options. `config` may be
 * NULL (all defaults); it is read during the call only. With
 * config->blocking == 0 the call may return ncclInProgress while the join
 * continues; *comm is then already set and ncclCommGetAsyncError reports
 * when it is ready. A library may also finish at once and return
 * ncclSuccess: callers must accept both. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/* ncclCommInitRankScalable: ncclCommInitRankConfig for large jobs, with
 * `nId` rendezvous ids (1 <= nId <= nranks) in `commIds` so the join load
 * can be spread. Every rank must pass the same ids in the same order.
 * `myrank` is this caller's rank. loom rendezvouses through commIds[0] only;
 * the other ids are accepted and left unused. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* ncclCommInitAll: create all `ndev` (>= 1) ranks of a communicator inside
 * this process in one call; comm must have room for ndev handles and
 * receives rank i in comm[i]. CUDA mode: rank i uses device devlist[i], or
 * device i when devlist is NULL. Host mode: devlist entries are only checked
 * to be non-negative. Needs no id and no group; each returned handle is
 * then driven like any other communicator (one thread per rank, or
 * groups). */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* ncclCommFinalize: finish all work issued on comm and release the
 * resources shared with peers, in agreement with them. Blocking communicator:
 * returns when done. Non-blocking: may return ncclInProgress; poll
 * ncclCommGetAsyncError until it reports ncclSuccess. Afterwards only
 * ncclCommDestroy (which is then purely local) may be called on comm. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* ncclCommDestroy: release comm and every local resource it owns, after
 * the call currently running on it (if any) has returned. Call
 * ncclCommFinalize first for an orderly shutdown in agreement with the
 * peers. The handle is invalid afterwards; NULL is accepted and does
 * nothing. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* ncclCommAbort: stop whatever comm is doing, without waiting for peers, and
 * release it. The error path: use it after a failure, a timeout or
 * ncclRemoteError. Peers waiting on this rank then fail (typically with
 * ncclRemoteError) instead of hanging. The handle is invalid afterwards. May be called from a thread other than the
 * one blocked in comm, to unblock it. NULL does nothing. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* ncclCommRevoke: ends comm's in-flight operations (also those blocked on
 * another thread, or queued on a stream) and all later ones with an error,
 * without freeing it, so that it can then be shrunk or destroyed safely.
 * Local: each rank revokes its own. revokeFlags must be NCCL_REVOKE_DEFAULT. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* ncclCommSplit: collective over every rank of comm. Ranks passing the same
 * `color` (>= 0) form a new communicator, ordered by `key` (ties broken by
 * their rank in comm), returned in *newcomm. A rank passing
 * NCCL_SPLIT_NOCOLOR joins nothing and gets NULL. config NULL: the child
 * inherits comm's options; with a config, its channels (minCTAs, maxCTAs),
 * netName and trafficClass are the config's (or the settings'), not comm's.
 * Blocks like ncclCommInitRank (group rules apply the same way). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* ncclCommShrink: make a new communicator from comm without the
 * `excludeRanksCount` ranks listed in excludeRanksList (any order); the
 * remaining ranks keep their relative order and each of them, and no
 * excluded rank, calls it with the same list. NCCL_SHRINK_DEFAULT: comm is
 * healthy (queued work is waited for first). NCCL_SHRINK_ABORT: the
 * excluded ranks may be dead or hung; comm is revoked first
 * (ncclCommRevoke). Works on a communicator that has failed: it does not
 * need the excluded ranks, dead or alive. config NULL: the child inherits
 * comm's options; a config counts as for ncclCommSplit. Blocks like
 * ncclCommInitRank (group rules apply). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* Growing a communicator (the calls of NCCL 2.30). One rank of comm calls
 * ncclCommGetUniqueId and hands the id to the new ranks (out of band, as
 * for ncclCommInitRank); then every rank of comm calls
 * ncclCommGrow(comm, nRanks, &id or NULL, -1, &newcomm, config) (the rank
 * that got the id passes it, the others may pass NULL) and each new rank
 * ncclCommGrow(NULL, nRanks, &id, rank, &newcomm, config) with a rank of
 * its own from comm's size up. The ranks of comm keep their numbers in
 * *newcomm; comm stays usable. An id serves one grow, and a rank cannot
 * get another from comm until a grow has used it. Not with NCCL_COMM_ID
 * set. Grows are ordered with comm's splits by call order. config NULL:
 * the ranks of comm inherit its options (a config counts as for
 * ncclCommSplit); blocks like ncclCommInitRank. */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                           ncclComm_t* newcomm, ncclConfig_t* config);

/* ======================================================================== */
/* Communicator queries                                                     */
/* ======================================================================== */

/* ncclCommGetAsyncError: store comm's state in *asyncError: ncclSuccess
 * (healthy and idle), ncclInProgress (a non-blocking call is still running)
 * or the error that broke comm (typically ncclRemoteError or
 * ncclSystemError; the communicator must then be aborted). Never blocks and
 * may be called from any thread. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/* ncclCommCount: number of ranks in comm, in *count. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/* ncclCommCuDevice: CUDA device index comm is bound to, in *device. Host
 * mode: there is no device and -1 is stored. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

/* ncclCommUserRank: this caller's rank in comm, in *rank. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ======================================================================== */
/* Buffer registration                                                      */
/* ======================================================================== */

/* ncclCommRegister: tell comm that [buff, buff+size) will be used for
 * communication so transports may prepare it (pinning, mapping). *handle
 * receives a token for ncclCommDeregister. Registration is only a
 * performance hint: every call also works on unregistered buffers. The
 * buffer must stay allocated until deregistered. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

/* ncclCommDeregister: undo ncclCommRegister. No pending operation may still
 * use the buffer. */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* ncclCommWindowRegister: collective; register [buff, buff+size) on every
 * rank as one window (winFlags: NCCL_WIN_*; NCCL_WIN_COLL_SYMMETRIC asks for
 * equal sizes and NCCL_WIN_REQUIRED_ALIGNMENT-aligned buffers).
 * In loom a window is a registration with ncclCommRegister's effect,
 * released by ncclCommWindowDeregister only; loom has no symmetric
 * kernels, so NCCL_WIN_COLL_SYMMETRIC changes nothing, and the call does
 * not communicate (sizes are not compared across ranks). */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);

/* ncclCommWindowDeregister: release a window from ncclCommWindowRegister.
 * No pending operation may still use the buffer. */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ======================================================================== */
/* Custom reduction operators                                               */
/* ======================================================================== */

/* ncclRedOpCreatePreMulSum: make an operator that multiplies each rank's
 * input by *scalar (of type `datatype`) and then sums across ranks. Result
 * in *op. The operator is valid only on `comm` and only with `datatype`.
 * `residence` says when the scalar is read (see ncclScalarResidence_t). */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* ncclRedOpDestroy: release an operator made on `comm`. Allowed as soon as
 * the last call that was given the operator has returned (queued work keeps
 * what it needs). Built-in operators cannot be destroyed
 * (ncclInvalidArgument). */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ======================================================================== */
/* Collective operations                                                    */
/* ======================================================================== */
/*
 * Rules common to every call in this section and the next:
 *  - Every rank of comm must make the same sequence of collective calls
 *    with matching count, datatype, op and root.
 *  - Counts are numbers of elements of `datatype`, not bytes.
 *  - A collective waits for the other ranks, so one thread must not drive
 *    two ranks of the same communicator outside a group.
 *  - CUDA mode: the call queues the work on `stream` and returns; buffers
 *    are device memory. Host mode: buffers are host memory, `stream` is
 *    ignored, and the call returns once this rank's part is complete (inside
 *    a group: at ncclGroupEnd).
 *  - Buffers must not overlap except in the in-place forms listed.
 */

/* ncclReduce: combine `count` elements from every rank's sendbuff with `op`
 * and write the result to recvbuff on rank `root` only. recvbuff is not used
 * (and may be NULL) on the other ranks. In place when sendbuff == recvbuff
 * on the root. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* ncclBcast: older in-place broadcast: `count` elements of buff on rank
 * `root` are copied into buff on every other rank. Same as
 * ncclBroadcast(buff, buff, ...). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* ncclBroadcast: `count` elements of sendbuff on rank `root` are copied to
 * recvbuff on every rank (root included). sendbuff is only read on the root.
 * In place when sendbuff == recvbuff on the root. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

/* ncclAllReduce: combine `count` elements from every rank's sendbuff with
 * `op`; every rank receives the full result in recvbuff. In place when
 * sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* ncclReduceScatter: sendbuff holds nranks * recvcount elements on every
 * rank. They are combined with `op`, and rank r receives block r of the
 * result (elements [r*recvcount, (r+1)*recvcount)) in recvbuff. In place
 * when recvbuff == sendbuff + rank * recvcount (in elements). */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* ncclAllGather: every rank contributes `sendcount` elements; recvbuff
 * (nranks * sendcount elements) receives rank r's contribution at element
 * offset r * sendcount on every rank. In place when
 * sendbuff == recvbuff + rank * sendcount (in elements). */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* ncclAlltoAll: sendbuff and recvbuff hold nranks blocks of `count`
 * elements. Block j of sendbuff goes to rank j; the block that rank i sends
 * here lands in block i of recvbuff. The two buffers must not overlap. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* ncclGather: every rank sends `count` elements of sendbuff to rank `root`,
 * which stores rank i's elements at block i of recvbuff (nranks * count
 * elements). recvbuff is not used on other ranks. In place when, on the
 * root, sendbuff == recvbuff + root * count (in elements). */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* ncclScatter: rank `root` holds nranks blocks of `count` elements in
 * sendbuff and sends block i to rank i, which stores it in recvbuff.
 * sendbuff is not used on other ranks. In place when, on the root,
 * recvbuff == sendbuff + root * count (in elements). */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* ======================================================================== */
/* Point-to-point                                                           */
/* ======================================================================== */

/* ncclSend: send `count` elements of sendbuff to rank `peer`, which must
 * post a matching ncclRecv (same count and datatype). Sends to one peer are
 * matched with that peer's receives in call order. The call may wait until
 * the peer receives, so two ranks that send to each other, or one thread
 * driving several ranks, must put their sends and receives in one
 * ncclGroupStart/ncclGroupEnd group, which lets them progress together.
 * Sending to oneself is allowed inside a group. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ncclRecv: receive `count` elements from rank `peer` into recvbuff; the
 * counterpart of ncclSend, with the same grouping rules. */
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ======================================================================== */
/* Groups                                                                   */
/* ======================================================================== */
/*
 * A group batches calls: between ncclGroupStart and the matching
 * ncclGroupEnd, communication calls (and communicator creation calls) only
 * record what to do and return ncclSuccess; ncclGroupEnd then starts all of
 * them together. Uses:
 *  - one thread driving several ranks or devices (each rank's call would
 *    otherwise wait for the others);
 *  - posting several sends/receives that must progress at the same time;
 *  - letting the library fuse many small operations.
 * Groups nest; only the outermost ncclGroupEnd launches. Communicator
 * creation and communication calls must not be mixed in one group. Argument
 * errors may be reported by the recording call or by ncclGroupEnd.
 */

/* ncclGroupStart: open (or nest) a group on the calling thread. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

/* ncclGroupEnd: close the innermost group; the outermost one launches the
 * recorded work. CUDA mode: returns once the work is queued on its streams.
 * Host mode: returns once all of it has completed. Non-blocking
 * communicators may make it return ncclInProgress (see
 * ncclCommGetAsyncError). */
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* ncclGroupSimulateEnd: close the group like ncclGroupEnd but, instead of
 * running the recorded work (which is dropped), write an estimate of how
 * long it would take, in microseconds, to simInfo->estimatedTime. simInfo
 * must be initialised with NCCL_SIM_INFO_INITIALIZER (wrong magic:
 * ncclInvalidArgument). loom's estimate comes from a simple per-step
 * latency and link bandwidth model; treat it as a rough figure. A nested
 * (inner) group end stores 0. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#undef LOOM_NCCL_DEPRECATED

#endif /* NCCL_H_ */
