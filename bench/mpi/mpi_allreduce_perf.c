/*
 * MPI_Allreduce timed the way nccl-tests times a collective, so its numbers
 * line up with loom's all_reduce_perf: per size, `warmup` untimed calls,
 * then `iters` timed calls, wall clock per call averaged over the ranks,
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n; out-of-place, then in-place
 * (MPI_IN_PLACE). Float sum. Results are checked once per size. Like
 * nccl-tests (and loom's perf tools), call i works on the buffers shifted by
 * (i % (maxBytes / bytes)) * bytes, so small sizes are not timed on data that
 * stays in the caches from the call before.
 *
 *   mpirun -np 2 ./mpi_allreduce_perf -b 1M -e 256M -f 2 [-n iters] [-w warmup]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parseSize(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024.0; break;
    case 'M': case 'm': v *= 1024.0 * 1024.0; break;
    case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
  }
  return (size_t)v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minBytes = 1 << 20, maxBytes = 256u << 20;
  int factor = 2, iters = 20, warmup = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
  }
  size_t maxCount = maxBytes / sizeof(float);
  float* sendBase = malloc(maxCount * sizeof(float) + 64);
  float* recvBase = malloc(maxCount * sizeof(float) + 64);
  if (!sendBase || !recvBase) {
    fprintf(stderr, "mpi_allreduce_perf: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Touch every page before timing (as loom's perf tools do). */
  for (size_t i = 0; i < maxCount; ++i) {
    sendBase[i] = (float)((rank + i) % 7);
    recvBase[i] = 0.0f;
  }
  if (rank == 0) {
    printf("# mpi_allreduce_perf: %d ranks, float sum, iters %d, warmup %d\n", n, iters, warmup);
    printf("#%11s %12s %9s %7s %7s %9s %7s %7s\n", "size(B)", "count", "oop(us)", "algbw", "busbw",
           "ip(us)", "algbw", "busbw");
  }
  long wrongTotal = 0;
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= (size_t)factor) {
    size_t count = bytes / sizeof(float);
    size_t steps = maxBytes / bytes > 0 ? maxBytes / bytes : 1;
    float* send = sendBase;
    float* recv = recvBase;
    double us[2];
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      for (int i = 0; i < warmup; ++i) {
        send = sendBase + (size_t)(i % steps) * count;
        recv = recvBase + (size_t)(i % steps) * count;
        if (inPlace) MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      /* Check one fresh call. */
      send = sendBase;
      recv = recvBase;
      for (size_t i = 0; i < count; ++i) send[i] = (float)((rank + i) % 7);
      for (size_t i = 0; i < count; ++i) recv[i] = inPlace ? send[i] : 0.0f;
      if (inPlace) MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      long wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += (float)((r + i) % 7);
        if (recv[i] != want) ++wrong;
      }
      wrongTotal += wrong;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        send = sendBase + (size_t)(i % steps) * count;
        recv = recvBase + (size_t)(i % steps) * count;
        if (inPlace) MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      double local = (MPI_Wtime() - t0) / iters, sum = 0;
      MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      us[inPlace] = sum / n * 1e6;
    }
    if (rank == 0) {
      double factorBus = 2.0 * (n - 1) / n;
      double a0 = bytes / (us[0] * 1e3), a1 = bytes / (us[1] * 1e3);
      printf("%12zu %12zu %9.1f %7.2f %7.2f %9.1f %7.2f %7.2f\n", bytes, count, us[0], a0, a0 * factorBus,
             us[1], a1, a1 * factorBus);
      fflush(stdout);
    }
  }
  long wrongAll = 0;
  MPI_Allreduce(&wrongTotal, &wrongAll, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("# wrong elements: %ld\n", wrongAll);
  free(sendBase);
  free(recvBase);
  MPI_Finalize();
  return wrongAll ? 1 : 0;
}
