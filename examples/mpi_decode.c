/* clattn's MPI example: long-context decode with the KV cache split over the
 * ranks (KV-sharded attention), or with --prefill, ring attention over one
 * sequence. Each rank holds only its part; every rank gets the whole result.
 *
 *   mpirun -np 4 build/tests/mpi_decode --n 32768 --steps 10
 *   mpirun -np 4 build/tests/mpi_decode --prefill 8192
 *   mpirun -np 2 build/tests/mpi_decode --n 4096 --check   (against one process)
 *
 * Keys and values are a function of their global position, so each rank
 * makes its own shard and --check can build the whole cache on every rank.
 * Each decode step appends its token's K/V to the last rank's shard.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clattn_mpi.h"

enum { HQ = 8, HKV = 2, D = 64 }; /* GQA: 4 query heads per KV head */

static int rank, nranks;

static float value_at(uint64_t which, uint64_t i) { /* deterministic in [-0.5, 0.5) */
  uint64_t z = which * 0x9e3779b97f4a7c15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)(z >> 40) / 16777216.0f - 0.5f;
}

/* Rows first[c] .. first[c]+n[c]-1 of a [heads, positions, D] tensor whose
 * values depend only on (which, head, position, d), packed as [heads, sum n, D]. */
static float *rows_of(uint64_t which, int heads, const int *first, const int *n, int parts) {
  int all = 0;
  for (int c = 0; c < parts; c++) all += n[c];
  float *x = malloc(((size_t)heads * all * D + 1) * sizeof *x);
  if (!x) return NULL;
  size_t o = 0;
  for (int h = 0; h < heads; h++)
    for (int c = 0; c < parts; c++)
      for (int j = 0; j < n[c]; j++)
        for (int d = 0; d < D; d++) x[o++] = value_at(which, (((uint64_t)h << 32) + (uint64_t)(first[c] + j)) * D + d);
  return x;
}

static cl_mem buffer(clattn_context *ctx, const float *host, size_t n) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                            (n ? n : 1) * sizeof(float), (void *)host, &err);
  return err == CL_SUCCESS ? m : NULL;
}

static clattn_tensor view(cl_mem b, int heads, int rows) {
  return (clattn_tensor){b, 0, {(size_t)heads * rows * D, (size_t)rows * D, D, 1}};
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* One process's answer for --check: clattn_forward on the whole problem. */
static int whole_forward(clattn_context *ctx, int M, int N, const float *q, float *out) {
  int first = 0;
  float *k = rows_of(2, HKV, &first, &N, 1), *v = rows_of(3, HKV, &first, &N, 1);
  cl_mem qb = buffer(ctx, q, (size_t)HQ * M * D), kb = buffer(ctx, k, (size_t)HKV * N * D);
  cl_mem vb = buffer(ctx, v, (size_t)HKV * N * D), ob = buffer(ctx, NULL, (size_t)HQ * M * D);
  int ok = k && v && qb && kb && vb && ob;
  clattn_params p = clattn_params_default();
  p.batch = 1, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = M, p.kv_len = N, p.head_dim = D, p.value_dim = D;
  p.causal = 1;
  p.q = view(qb, HQ, M), p.k = view(kb, HKV, N), p.v = view(vb, HKV, N), p.out = view(ob, HQ, M);
  cl_event done = NULL;
  ok = ok && clattn_forward(ctx, &p, 0, NULL, &done) == CLATTN_OK;
  ok = ok && clEnqueueReadBuffer(clattn_cl_queue(ctx), ob, CL_TRUE, 0, (size_t)HQ * M * D * 4, out, 1, &done, NULL) ==
                 CL_SUCCESS;
  if (done) clReleaseEvent(done);
  cl_mem all[] = {qb, kb, vb, ob};
  for (int i = 0; i < 4; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  free(k), free(v);
  return ok;
}

static double worst_diff(const float *a, const float *b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
  return w;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Rank 0 prints the median and fastest call (the machine may be shared) and,
 * averaged over ranks and calls, where the time went and what was sent. */
static void report(clattn_mpi *mh, const char *what, double *times, int steps) {
  clattn_mpi_stats s;
  clattn_mpi_get_stats(mh, &s, 1);
  double all[7] = {s.seconds,        s.seconds_compute, s.seconds_wait, s.bytes_sent,
                   s.ring_transfers, s.ring_hidden,     s.seconds_agree};
  double sum[7];
  MPI_Reduce(all, sum, 7, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  qsort(times, (size_t)steps, sizeof *times, by_value);
  if (rank == 0)
    printf(
        "%s, %d rank(s), %d calls: median %.2f ms, fastest %.2f ms per call; per rank and call: compute %.2f ms, "
        "exposed transfer wait %.2f ms, agreements %.2f ms, sent %.0f bytes\n",
        what, nranks, steps, 1e3 * times[steps / 2], 1e3 * times[0], 1e3 * sum[1] / nranks / steps,
        1e3 * sum[2] / nranks / steps, 1e3 * sum[6] / nranks / steps, sum[3] / nranks / steps);
  if (rank == 0 && sum[4] > 0)
    printf("ring transfers complete before their step's compute ended: %.0f of %.0f\n", sum[5], sum[4]);
}

/* Writes rows [at, at + n) of every head of a [heads, cap, D] cache buffer. */
static int put_rows(clattn_context *ctx, cl_mem buf, int heads, int cap, int at, int n, const float *rows) {
  for (int h = 0; h < heads; h++)
    if (clEnqueueWriteBuffer(clattn_cl_queue(ctx), buf, CL_TRUE, ((size_t)h * cap + at) * D * sizeof *rows,
                             (size_t)n * D * sizeof *rows, rows + (size_t)h * n * D, 0, NULL, NULL) != CL_SUCCESS)
      return 0;
  return 1;
}

static int decode(clattn_context *ctx, clattn_mpi *mh, int N, int steps, int check) {
  /* This rank's shard of the first N positions: an even split, the remainder
   * to the first ranks. Each step appends its token's K/V to the last rank's
   * shard, which has room for them (cap rows per head). */
  const int base = N / nranks, extra = N % nranks, last = rank == nranks - 1;
  const int off = rank * base + (rank < extra ? rank : extra), n0 = base + (rank < extra);
  const int cap = n0 + (last ? steps + 1 : 0);
  float *k = rows_of(2, HKV, &off, &n0, 1), *v = rows_of(3, HKV, &off, &n0, 1);
  float q[HQ * D], out[HQ * D], want[HQ * D];
  cl_mem kb = buffer(ctx, NULL, (size_t)HKV * cap * D), vb = buffer(ctx, NULL, (size_t)HKV * cap * D);
  cl_mem qb = buffer(ctx, NULL, HQ * D), ob = buffer(ctx, NULL, HQ * D);
  const int filled =
      k && v && kb && vb && put_rows(ctx, kb, HKV, cap, 0, n0, k) && put_rows(ctx, vb, HKV, cap, 0, n0, v);
  free(k), free(v);
  if (!filled || !qb || !ob) return fprintf(stderr, "rank %d: buffers\n", rank), 1;
  clattn_params p = clattn_params_default();
  p.batch = 1, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = 1, p.head_dim = D, p.value_dim = D;
  p.causal = 1;
  p.q = view(qb, HQ, 1), p.k = view(kb, HKV, cap), p.v = view(vb, HKV, cap), p.out = view(ob, HQ, 1);
  int status = 0, n = n0, total = N;
  double *times = calloc((size_t)steps, sizeof *times);
  if (!times) return 1;
  for (int t = -1; t < steps && !status; t++) { /* step -1 warms up (kernel builds) */
    /* the new token: its K/V joins the cache (last rank), its query attends */
    if (last) {
      float kr[HKV * D], vr[HKV * D];
      const int one = 1;
      float *k1 = rows_of(2, HKV, &total, &one, 1), *v1 = rows_of(3, HKV, &total, &one, 1);
      if (!k1 || !v1) return 1;
      memcpy(kr, k1, sizeof kr), memcpy(vr, v1, sizeof vr);
      free(k1), free(v1);
      if (!put_rows(ctx, kb, HKV, cap, n, 1, kr) || !put_rows(ctx, vb, HKV, cap, n, 1, vr)) return 1;
      n++;
    }
    total++;
    for (int i = 0; i < HQ * D; i++) q[i] = value_at(100 + (uint64_t)(t + 1), (uint64_t)i);
    if (clEnqueueWriteBuffer(clattn_cl_queue(ctx), qb, CL_TRUE, 0, sizeof q, q, 0, NULL, NULL) != CL_SUCCESS) return 1;
    p.kv_len = n;
    const clattn_mpi_kv_shard shard = {off, total, -1};
    if (t == 0) clattn_mpi_get_stats(mh, NULL, 1);
    const double t0 = now();
    clattn_status st = clattn_mpi_kv_sharded_forward(mh, &p, &shard);
    if (t >= 0) times[t] = now() - t0;
    if (st != CLATTN_OK) {
      fprintf(stderr, "rank %d: %s: %s\n", rank, clattn_mpi_status_string(st), clattn_mpi_last_error(mh));
      return 1;
    }
    if (check && t == steps - 1) {
      clEnqueueReadBuffer(clattn_cl_queue(ctx), ob, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
      const double w = whole_forward(ctx, 1, total, q, want) ? worst_diff(out, want, HQ * D) : INFINITY;
      printf("rank %d: decode over %d keys, max |O - one process| = %.3g\n", rank, total, w);
      status = !(w <= 1e-5);
    }
  }
  char what[128];
  snprintf(what, sizeof what, "decode N=%d+%d (M=1, Hq=%d, Hkv=%d, D=%d; one token appended per step)", N, steps + 1,
           HQ, HKV, D);
  report(mh, what, times, steps);
  free(times);
  clReleaseMemObject(kb), clReleaseMemObject(vb), clReleaseMemObject(qb), clReleaseMemObject(ob);
  return status;
}

static int prefill(clattn_context *ctx, clattn_mpi *mh, int S, int check) {
  enum { PHQ = 4, PHKV = 1 }; /* a lighter shape: prefill is S^2 work on this CPU */
  clattn_mpi_ring_layout l;
  if (clattn_mpi_ring_layout_of(S, nranks, rank, &l) != CLATTN_OK) return fprintf(stderr, "bad layout\n"), 1;
  float *q = rows_of(1, PHQ, l.offset, l.len, 2), *k = rows_of(2, PHKV, l.offset, l.len, 2);
  float *v = rows_of(3, PHKV, l.offset, l.len, 2);
  cl_mem qb = buffer(ctx, q, (size_t)PHQ * l.rows * D), kb = buffer(ctx, k, (size_t)PHKV * l.rows * D);
  cl_mem vb = buffer(ctx, v, (size_t)PHKV * l.rows * D), ob = buffer(ctx, NULL, (size_t)PHQ * l.rows * D);
  free(k), free(v);
  if (!q || !qb || !kb || !vb || !ob) return fprintf(stderr, "rank %d: buffers\n", rank), 1;
  clattn_params p = clattn_params_default();
  p.batch = 1, p.q_heads = PHQ, p.kv_heads = PHKV, p.q_len = p.kv_len = l.rows, p.head_dim = D, p.value_dim = D;
  p.causal = 1;
  p.q = view(qb, PHQ, l.rows), p.k = view(kb, PHKV, l.rows), p.v = view(vb, PHKV, l.rows),
  p.out = view(ob, PHQ, l.rows);
  int status = 0;
  double times[3];
  for (int t = -1; t < 3; t++) { /* call -1 warms up (kernel builds) */
    if (t == 0) clattn_mpi_get_stats(mh, NULL, 1);
    const double t0 = now();
    clattn_status st = clattn_mpi_ring_forward(mh, &p, S);
    if (st != CLATTN_OK) {
      fprintf(stderr, "rank %d: %s: %s\n", rank, clattn_mpi_status_string(st), clattn_mpi_last_error(mh));
      return 1;
    }
    if (t >= 0) times[t] = now() - t0;
  }
  char what[96];
  snprintf(what, sizeof what, "ring prefill S=%d causal (Hq=%d, Hkv=%d, D=%d)", S, PHQ, PHKV, D);
  report(mh, what, times, 3);
  /* The same R-1 block transfers with nothing to hide them behind: against
   * the exposed wait above, how much of the communication the compute hid. */
  if (nranks > 1) {
    const int n = (int)((size_t)2 * PHKV * l.rows * D);
    float *a = calloc((size_t)n, 4), *b = calloc((size_t)n, 4);
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) { /* the fastest of 5: the machine may be shared */
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now();
      for (int t = 0; t < nranks - 1 && a && b; t++)
        MPI_Sendrecv(a, n, MPI_FLOAT, (rank + 1) % nranks, 0, b, n, MPI_FLOAT, (rank + nranks - 1) % nranks, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      double mine = now() - t0, most = 0;
      MPI_Allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = fmin(best, most);
    }
    if (rank == 0) printf("the %d ring transfers alone (no compute, fastest of 5): %.2f ms\n", nranks - 1, 1e3 * best);
    free(a), free(b);
  }
  if (check) { /* our rows against the whole sequence in one process */
    float *out = malloc((size_t)PHQ * l.rows * D * 4);
    clEnqueueReadBuffer(clattn_cl_queue(ctx), ob, CL_TRUE, 0, (size_t)PHQ * l.rows * D * 4, out, 0, NULL, NULL);
    int first = 0;
    float *qa = rows_of(1, PHQ, &first, &S, 1), *ka = rows_of(2, PHKV, &first, &S, 1);
    float *va = rows_of(3, PHKV, &first, &S, 1), *want = malloc((size_t)PHQ * S * D * 4);
    cl_mem a[4] = {buffer(ctx, qa, (size_t)PHQ * S * D), buffer(ctx, ka, (size_t)PHKV * S * D),
                   buffer(ctx, va, (size_t)PHKV * S * D), buffer(ctx, NULL, (size_t)PHQ * S * D)};
    clattn_params w = p;
    w.q_len = w.kv_len = S;
    w.q = view(a[0], PHQ, S), w.k = view(a[1], PHKV, S), w.v = view(a[2], PHKV, S), w.out = view(a[3], PHQ, S);
    cl_event done = NULL;
    double worst = INFINITY;
    if (clattn_forward(ctx, &w, 0, NULL, &done) == CLATTN_OK &&
        clEnqueueReadBuffer(clattn_cl_queue(ctx), a[3], CL_TRUE, 0, (size_t)PHQ * S * D * 4, want, 1, &done, NULL) ==
            CL_SUCCESS) {
      worst = 0;
      for (int h = 0; h < PHQ; h++)
        for (int i = 0; i < l.rows; i++) {
          const int g = i < l.len[0] ? l.offset[0] + i : l.offset[1] + i - l.len[0];
          worst = fmax(worst, worst_diff(out + ((size_t)h * l.rows + i) * D, want + ((size_t)h * S + g) * D, D));
        }
    }
    if (done) clReleaseEvent(done);
    printf("rank %d: ring prefill over %d tokens, max |O - one process| = %.3g\n", rank, S, worst);
    status = !(worst <= 1e-5);
    for (int i = 0; i < 4; i++)
      if (a[i]) clReleaseMemObject(a[i]);
    free(out), free(qa), free(ka), free(va), free(want);
  }
  free(q);
  clReleaseMemObject(qb), clReleaseMemObject(kb), clReleaseMemObject(vb), clReleaseMemObject(ob);
  return status;
}

int main(int argc, char **argv) {
  int N = 32768, steps = 10, S = 0, check = 0;
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc)
      N = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
      S = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--check"))
      check = 1;
    else {
      if (rank == 0) fprintf(stderr, "usage: mpi_decode [--n KEYS] [--steps T] [--prefill TOKENS] [--check]\n");
      MPI_Finalize();
      return 2;
    }
  }
  clattn_context *ctx = NULL;
  clattn_mpi *mh = NULL;
  /* Rank 0 first: it builds the kernel programs into the shared disk cache,
   * the other ranks then load them instead of compiling the same programs. */
  if (rank != 0) MPI_Barrier(MPI_COMM_WORLD);
  int ok = clattn_create(NULL, &ctx) == CLATTN_OK, all_ok = 0;
  if (rank == 0) MPI_Barrier(MPI_COMM_WORLD);
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD); /* every rank needs a device */
  if (!all_ok || clattn_mpi_create(ctx, MPI_COMM_WORLD, &mh) != CLATTN_OK) {
    fprintf(stderr, "rank %d: no clattn context: %s\n", rank, clattn_last_error(NULL));
    if (ctx) clattn_destroy(ctx);
    MPI_Finalize();
    return 77;
  }
  if (rank == 0) printf("%d rank(s), device: %s\n", nranks, clattn_describe(ctx));
  int status = S > 0 ? prefill(ctx, mh, S, check) : decode(ctx, mh, N, steps, check);
  int any = 0;
  MPI_Allreduce(&status, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  clattn_mpi_destroy(mh);
  clattn_destroy(ctx);
  MPI_Finalize();
  return any;
}
