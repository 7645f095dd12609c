/*
 * The C side of header_abi_test: built as strict C99 (-pedantic -Werror,
 * no CUDA include path), it proves that nccl.h is valid C99 for host-only
 * users, runs the compile-time ABI checks in C, and hands values computed by
 * the C compiler to the C++ test so both languages can be compared.
 */
#include <nccl.h>

#include <stddef.h>

#include "header_abi_c.h"
#include "nccl_abi_checks.h"

void loomTestCConfigInitializer(ncclConfig_t* out) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  *out = config;
}

void loomTestCSimInfoInitializer(ncclSimInfo_t* out) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  *out = info;
}

size_t loomTestCConfigOffsets(size_t* out, size_t capacity) {
  const size_t offsets[] = {
      offsetof(ncclConfig_t, size),         offsetof(ncclConfig_t, magic),
      offsetof(ncclConfig_t, version),      offsetof(ncclConfig_t, blocking),
      offsetof(ncclConfig_t, cgaClusterSize), offsetof(ncclConfig_t, minCTAs),
      offsetof(ncclConfig_t, maxCTAs),      offsetof(ncclConfig_t, netName),
      offsetof(ncclConfig_t, splitShare),   offsetof(ncclConfig_t, trafficClass),
      offsetof(ncclConfig_t, commName),     offsetof(ncclConfig_t, collnetEnable),
      offsetof(ncclConfig_t, CTAPolicy),    offsetof(ncclConfig_t, shrinkShare),
      offsetof(ncclConfig_t, nvlsCTAs),     offsetof(ncclConfig_t, nChannelsPerNetPeer),
      offsetof(ncclConfig_t, nvlinkCentricSched),
  };
  const size_t count = sizeof(offsets) / sizeof(offsets[0]);
  size_t i;
  for (i = 0; i < count && i < capacity; ++i) out[i] = offsets[i];
  return count;
}

size_t loomTestCConfigSize(void) { return sizeof(ncclConfig_t); }

int loomTestCHaveCudaHeaders(void) { return LOOM_NCCL_HAVE_CUDA_HEADERS; }

long loomTestCVersionCode(void) { return NCCL_VERSION_CODE; }
