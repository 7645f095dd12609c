/* Functions defined in header_abi_c.c (compiled as C99) for header_abi_test. */
#ifndef LOOM_TESTS_HEADER_ABI_C_H_
#define LOOM_TESTS_HEADER_ABI_C_H_

#include <nccl.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies of the initialisers as the C compiler expands them. */
void loomTestCConfigInitializer(ncclConfig_t* out);
void loomTestCSimInfoInitializer(ncclSimInfo_t* out);
/* Field offsets of ncclConfig_t in declaration order; returns the field
 * count and writes at most `capacity` entries. */
size_t loomTestCConfigOffsets(size_t* out, size_t capacity);
size_t loomTestCConfigSize(void);
/* LOOM_NCCL_HAVE_CUDA_HEADERS as seen by the C build. */
int loomTestCHaveCudaHeaders(void);
long loomTestCVersionCode(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TESTS_HEADER_ABI_C_H_ */
