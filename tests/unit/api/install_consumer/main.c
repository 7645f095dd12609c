/* Downstream program for the install test: uses only installed headers and
 * the installed libnccl.so.2. Prints the version the library reports. */
#include <loom/version.h>
#include <nccl.h>

#include <stdio.h>

int main(void) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    fprintf(stderr, "ncclGetVersion failed\n");
    return 1;
  }
  printf("nccl-version %d loom-version %s\n", version, LOOM_VERSION_STRING);
  return version == NCCL_VERSION_CODE ? 0 : 1;
}
