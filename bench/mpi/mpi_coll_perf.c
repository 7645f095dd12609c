/*
 * An MPI collective timed the way nccl-tests times one, so its numbers line
 * up with loom's perf tools: per size, `warmup` untimed calls, then `iters`
 * timed calls, wall clock per call averaged over the ranks, algbw = bytes /
 * time, busbw = algbw times nccl-tests' factor; out-of-place, then in-place
 * (MPI_IN_PLACE). Floats (sum for the reductions). Results are checked once
 * per size. Like nccl-tests (and loom's perf tools), call i works on the
 * buffers shifted by (i % (maxBytes / bytes)) * bytes, so small sizes are
 * not timed on data that stays in the caches from the call before.
 *
 * -o picks the collective; sizes mean what they mean in nccl-tests:
 *   allreduce      MPI_Allreduce of size bytes          busbw x 2(n-1)/n
 *   bcast          MPI_Bcast of size bytes from rank 0  busbw x 1
 *   allgather      MPI_Allgather, size = the output     busbw x (n-1)/n
 *   reducescatter  MPI_Reduce_scatter_block, size = the input  x (n-1)/n
 *
 *   mpirun -np 2 ./mpi_coll_perf -o allreduce -b 1M -e 256M -f 2 [-n iters] [-w warmup]
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

enum Coll { kAllreduce, kBcast, kAllgather, kReducescatter };

/* One call. `count` is in the nccl-tests sense: elements of `size` bytes. */
static void call(enum Coll coll, int inPlace, float* send, float* recv, size_t count, int n, int rank) {
  switch (coll) {
    case kAllreduce:
      if (inPlace) MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kBcast:
      /* In place: the root's data is already in recv; out of place it is
         copied there first, as ncclBroadcast does from sendbuff. */
      if (!inPlace && rank == 0) memcpy(recv, send, count * sizeof(float));
      MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case kAllgather: {
      const int per = (int)(count / (size_t)n);
      if (inPlace) MPI_Allgather(MPI_IN_PLACE, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
      else MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    }
    case kReducescatter: {
      const int per = (int)(count / (size_t)n);
      /* In place the input is recv and this rank's block ends up at its start. */
      if (inPlace) MPI_Reduce_scatter_block(MPI_IN_PLACE, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    }
  }
}

/* Input element i of rank r. */
static float input(int r, size_t i) { return (float)((r + i) % 7); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minBytes = 1 << 20, maxBytes = 256u << 20;
  int factor = 2, iters = 20, warmup = 2, decimals = 2;
  enum Coll coll = kAllreduce;
  const char* collName = "allreduce";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-d")) decimals = atoi(argv[i + 1]); /* time columns, as loom's --time_decimals */
    else if (!strcmp(argv[i], "-o")) {
      collName = argv[i + 1];
      if (!strcmp(collName, "allreduce")) coll = kAllreduce;
      else if (!strcmp(collName, "bcast")) coll = kBcast;
      else if (!strcmp(collName, "allgather")) coll = kAllgather;
      else if (!strcmp(collName, "reducescatter")) coll = kReducescatter;
      else {
        if (rank == 0) fprintf(stderr, "mpi_coll_perf: -o allreduce|bcast|allgather|reducescatter\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    }
  }
  const int blocked = coll == kAllgather || coll == kReducescatter; /* sizes split into n blocks */
  const double busFactor = coll == kAllreduce ? 2.0 * (n - 1) / n : coll == kBcast ? 1.0 : (double)(n - 1) / n;
  size_t maxCount = maxBytes / sizeof(float);
  float* sendBase = malloc(maxCount * sizeof(float) + 64);
  float* recvBase = malloc(maxCount * sizeof(float) + 64);
  if (!sendBase || !recvBase) {
    fprintf(stderr, "mpi_coll_perf: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Touch every page before timing (as loom's perf tools do). */
  for (size_t i = 0; i < maxCount; ++i) {
    sendBase[i] = input(rank, i);
    recvBase[i] = 0.0f;
  }
  if (rank == 0) {
    printf("# mpi_coll_perf: %s, %d ranks, float%s, iters %d, warmup %d\n", collName, n,
           coll == kAllreduce || coll == kReducescatter ? " sum" : "", iters, warmup);
    printf("#%11s %12s %9s %7s %7s %9s %7s %7s\n", "size(B)", "count", "oop(us)", "algbw", "busbw",
           "ip(us)", "algbw", "busbw");
  }
  long wrongTotal = 0;
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= (size_t)factor) {
    size_t count = bytes / sizeof(float);
    if (blocked) count -= count % (size_t)n;
    if (count == 0) continue;
    const size_t per = blocked ? count / (size_t)n : count;
    size_t steps = maxBytes / bytes > 0 ? maxBytes / bytes : 1;
    float* send = sendBase;
    float* recv = recvBase;
    double us[2];
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      for (int i = 0; i < warmup; ++i) {
        send = sendBase + (size_t)(i % steps) * count;
        recv = recvBase + (size_t)(i % steps) * count;
        call(coll, inPlace, send, recv, count, n, rank);
      }
      /* Check one fresh call. In place the input sits where MPI_IN_PLACE
         expects it: all of recv (allreduce, reducescatter), this rank's
         block of it (allgather), the root's recv (bcast). */
      send = sendBase;
      recv = recvBase;
      const size_t inElems = coll == kAllgather ? per : count;
      for (size_t i = 0; i < inElems; ++i) send[i] = input(rank, i);
      for (size_t i = 0; i < count; ++i) recv[i] = 0.0f;
      if (inPlace) {
        if (coll == kAllgather) memcpy(recv + (size_t)rank * per, send, per * sizeof(float));
        else if (coll != kBcast || rank == 0) memcpy(recv, send, inElems * sizeof(float));
      }
      call(coll, inPlace, send, recv, count, n, rank);
      long wrong = 0;
      const size_t outElems = coll == kReducescatter ? per : count;
      for (size_t i = 0; i < outElems; ++i) {
        float want = 0;
        switch (coll) {
          case kAllreduce: for (int r = 0; r < n; ++r) want += input(r, i); break;
          case kBcast: want = input(0, i); break;
          case kAllgather: want = input((int)(i / per), i % per); break;
          case kReducescatter: for (int r = 0; r < n; ++r) want += input(r, (size_t)rank * per + i); break;
        }
        if (recv[i] != want) ++wrong;
      }
      wrongTotal += wrong;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        send = sendBase + (size_t)(i % steps) * count;
        recv = recvBase + (size_t)(i % steps) * count;
        call(coll, inPlace, send, recv, count, n, rank);
      }
      double local = (MPI_Wtime() - t0) / iters, sum = 0;
      MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      us[inPlace] = sum / n * 1e6;
    }
    if (rank == 0) {
      const size_t shown = count * sizeof(float);
      double a0 = shown / (us[0] * 1e3), a1 = shown / (us[1] * 1e3);
      printf("%12zu %12zu %9.*f %7.2f %7.2f %9.*f %7.2f %7.2f\n", shown, count, decimals, us[0], a0,
             a0 * busFactor, decimals, us[1], a1, a1 * busFactor);
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
