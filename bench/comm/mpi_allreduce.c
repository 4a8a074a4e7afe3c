/* The Open MPI peer of bench_comm: MPI_Allreduce of float sums over one
 * size, printing the same JSON line as comm_loop (rank 0): p50, p99 and
 * mean of the per-call time, after a warm-up; the result is checked. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const long bytes = argc > 1 ? atol(argv[1]) : 8;
  const long iters = argc > 2 ? atol(argv[2]) : 100;
  const long warmup = argc > 3 ? atol(argv[3]) : 10;
  const long count = bytes / 4 > 0 ? bytes / 4 : 1;
  float* in = malloc((size_t)count * 4);
  float* out = malloc((size_t)count * 4);
  double* lat = malloc((size_t)iters * sizeof(double));
  for (long i = 0; i < count; ++i) in[i] = (float)(rank + 1);
  for (long it = -warmup; it < iters; ++it) {
    const double t0 = MPI_Wtime();
    MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double t1 = MPI_Wtime();
    if (it >= 0) lat[it] = (t1 - t0) * 1e6;
  }
  int bad = out[0] != (float)(n * (n + 1) / 2) || out[count - 1] != (float)(n * (n + 1) / 2);
  double sum = 0;
  for (long i = 0; i < iters; ++i) sum += lat[i];
  qsort(lat, (size_t)iters, sizeof(double), cmp);
  if (rank == 0)
    printf(
        "{\"op\":\"allreduce\",\"dtype\":\"f32\",\"bytes\":%ld,\"ranks\":%d,\"iters\":%ld,\"p50_us\":%.3f,"
        "\"p99_us\":%.3f,\"mean_us\":%.3f,\"check\":\"%s\"}\n",
        bytes, n, iters, lat[iters / 2], lat[iters * 99 / 100], sum / (double)iters, bad ? "failed" : "passed");
  free(in);
  free(out);
  free(lat);
  MPI_Finalize();
  return bad;
}
