/* The MPI layer against the single-process clattn_forward on the whole
 * problem (every rank computes that reference itself): KV-sharded decode and
 * prefill, ring prefill, MHA and GQA, causal and windowed, kv_lens, empty and
 * uneven shards; and failures: bad input on one rank gives the same status
 * and message on every rank, and clattn_mpi_create fails on every rank
 * at once when one rank's arguments are bad. Run under mpirun by
 * tests/mpi_run.sh (with --failures: only the failure cases).
 * Exit 0 when every rank passed, 1 when any failed, 77 without a device. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clattn_mpi.h"

static int rank, nranks, failures;
static clattn_context *ctx;
static clattn_mpi *mh;

#define CHECKF(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      failures++;                                             \
      printf("  rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
      printf(__VA_ARGS__);                                    \
      printf("\n");                                           \
    }                                                         \
  } while (0)

static uint64_t seed;
static float frand(void) {
  seed = seed * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((seed >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

static cl_mem upload(const void *host, size_t bytes) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                            bytes ? bytes : 4, (void *)host, &err);
  if (err != CL_SUCCESS) {
    printf("rank %d: clCreateBuffer failed (%d)\n", rank, err);
    exit(1);
  }
  return m;
}

static void download(cl_mem m, void *host, size_t bytes) {
  cl_int err = clEnqueueReadBuffer(clattn_cl_queue(ctx), m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  if (err != CL_SUCCESS) {
    printf("rank %d: clEnqueueReadBuffer failed (%d)\n", rank, err);
    exit(1);
  }
}

static clattn_tensor view(cl_mem b, int h, int rows, int d) {
  return (clattn_tensor){b, 0, {(size_t)h * rows * d, (size_t)rows * d, (size_t)d, 1}};
}

typedef struct {
  const char *name;
  int B, Hq, Hkv, M, N, D;
  int causal, wl, wr;
  int lens[2]; /* kv_lens per batch row; 0 = none */
  int split;   /* 0 even, 1 uneven (r+1)^2, 2 rank 1 empty, 3 all on the last rank */
  int root;
  clattn_empty_rows empty;
  int sinks; /* sinks[h] = 1 + h/2 (joins the softmax once) */
} kv_case;

/* The whole problem, every rank the same. */
typedef struct {
  int B, Hq, Hkv, M, N, D;
  float *q, *k, *v, *out, *lse;
  clattn_status ref_status;
} whole;

static void make_whole(whole *w, int B, int Hq, int Hkv, int M, int N, int D, uint64_t s) {
  *w = (whole){B, Hq, Hkv, M, N, D, NULL, NULL, NULL, NULL, NULL, CLATTN_OK};
  seed = s;
  const size_t nq = (size_t)B * Hq * M * D, nk = (size_t)B * Hkv * N * D;
  w->q = malloc(nq * 4), w->k = malloc(nk * 4), w->v = malloc(nk * 4);
  w->out = malloc(nq * 4), w->lse = malloc((size_t)B * Hq * M * 4);
  for (size_t i = 0; i < nq; i++) w->q[i] = 2 * frand();
  for (size_t i = 0; i < nk; i++) w->k[i] = 2 * frand(), w->v[i] = frand();
}

static void free_whole(whole *w) { free(w->q), free(w->k), free(w->v), free(w->out), free(w->lse); }

/* The single-process reference: clattn_forward on the whole problem. */
static void reference(whole *w, const clattn_params *shape, const int *lens) {
  const size_t nq = (size_t)w->B * w->Hq * w->M * w->D, nk = (size_t)w->B * w->Hkv * w->N * w->D;
  cl_mem q = upload(w->q, nq * 4), k = upload(w->k, nk * 4), v = upload(w->v, nk * 4);
  cl_mem o = upload(NULL, nq * 4), l = upload(NULL, (size_t)w->B * w->Hq * w->M * 4);
  cl_mem kl = lens ? upload(lens, (size_t)w->B * 4) : NULL;
  clattn_params p = *shape;
  p.q_len = w->M, p.kv_len = w->N;
  p.q = view(q, w->Hq, w->M, w->D), p.k = view(k, w->Hkv, w->N, w->D), p.v = view(v, w->Hkv, w->N, w->D);
  p.out = view(o, w->Hq, w->M, w->D);
  p.lse = (clattn_tensor){l, 0, {(size_t)w->Hq * w->M, (size_t)w->M, 1, 0}};
  p.kv_lens = kl;
  cl_event done = NULL;
  w->ref_status = clattn_forward(ctx, &p, 0, NULL, &done);
  if (done) clWaitForEvents(1, &done), clReleaseEvent(done);
  download(o, w->out, nq * 4);
  download(l, w->lse, (size_t)w->B * w->Hq * w->M * 4);
  clReleaseMemObject(q), clReleaseMemObject(k), clReleaseMemObject(v), clReleaseMemObject(o), clReleaseMemObject(l);
  if (kl) clReleaseMemObject(kl);
}

static int close_to(float a, float b) {
  if (isinf(a) || isinf(b)) return a == b;
  return fabsf(a - b) <= 1e-5f;
}

static void shard_of(const kv_case *c, int r, int *off, int *len) {
  int lens[64], total = 0;
  for (int i = 0; i < nranks; i++) {
    int wgt = c->split == 1 ? (i + 1) * (i + 1) : c->split == 2 && i == 1 ? 0 : c->split == 3 ? i == nranks - 1 : 1;
    lens[i] = wgt;
    total += wgt;
  }
  int at = 0, given = 0;
  for (int i = 0; i < nranks; i++) {
    int n = i == nranks - 1 ? c->N - given : (int)((long long)c->N * lens[i] / total);
    if (i == r) *off = at, *len = n;
    at += n, given += n;
  }
}

static clattn_params base_params(int B, int Hq, int Hkv, int D, int causal, int wl, int wr) {
  clattn_params p = clattn_params_default();
  p.batch = B, p.q_heads = Hq, p.kv_heads = Hkv, p.head_dim = D, p.value_dim = D;
  p.causal = causal, p.window_left = wl, p.window_right = wr;
  return p;
}

static cl_mem sinks_buf(int heads) {
  float s[64];
  for (int h = 0; h < heads; h++) s[h] = 1.0f + 0.5f * (float)h;
  return upload(s, (size_t)heads * sizeof *s);
}

static void kv_sharded(const kv_case *c) {
  whole w;
  make_whole(&w, c->B, c->Hq, c->Hkv, c->M, c->N, c->D, 1234);
  clattn_params p = base_params(c->B, c->Hq, c->Hkv, c->D, c->causal, c->wl, c->wr);
  p.empty_rows = c->empty;
  cl_mem sinks = c->sinks ? sinks_buf(c->Hq) : NULL;
  p.sinks = sinks;
  reference(&w, &p, c->lens[0] ? c->lens : NULL);
  int off = 0, n = 0;
  shard_of(c, rank, &off, &n);
  /* The shard, packed: rows off .. off+n-1 of every (b, h). */
  const size_t ns = (size_t)c->B * c->Hkv * n * c->D;
  float *ks = malloc(ns * 4 + 4), *vs = malloc(ns * 4 + 4);
  for (int bh = 0; bh < c->B * c->Hkv; bh++)
    for (int j = 0; j < n; j++)
      for (int d = 0; d < c->D; d++) {
        ks[((size_t)bh * n + j) * c->D + d] = w.k[((size_t)bh * c->N + off + j) * c->D + d];
        vs[((size_t)bh * n + j) * c->D + d] = w.v[((size_t)bh * c->N + off + j) * c->D + d];
      }
  const size_t nq = (size_t)c->B * c->Hq * c->M * c->D, nl = (size_t)c->B * c->Hq * c->M;
  float *sentinel = malloc(nq * 4);
  for (size_t i = 0; i < nq; i++) sentinel[i] = 12345.0f;
  cl_mem q = upload(w.q, nq * 4), o = upload(sentinel, nq * 4), l = upload(sentinel, nl * 4);
  cl_mem k = n ? upload(ks, ns * 4) : NULL, v = n ? upload(vs, ns * 4) : NULL;
  cl_mem kl = c->lens[0] ? upload(c->lens, (size_t)c->B * 4) : NULL;
  p.q_len = c->M, p.kv_len = n;
  p.q = view(q, c->Hq, c->M, c->D), p.out = view(o, c->Hq, c->M, c->D);
  if (n) p.k = view(k, c->Hkv, n, c->D), p.v = view(v, c->Hkv, n, c->D);
  p.lse = (clattn_tensor){l, 0, {(size_t)c->Hq * c->M, (size_t)c->M, 1, 0}};
  p.kv_lens = kl;
  clattn_mpi_kv_shard s = {off, c->N, c->root};
  clattn_status st = clattn_mpi_kv_sharded_forward(mh, &p, &s);
  CHECKF(st == w.ref_status, "%s: status %s (%s), whole problem gave %s", c->name, clattn_mpi_status_string(st),
         clattn_mpi_last_error(mh), clattn_status_string(w.ref_status));
  float *got = malloc(nq * 4), *got_lse = malloc(nl * 4);
  download(o, got, nq * 4);
  download(l, got_lse, nl * 4);
  const int receives = c->root < 0 || c->root == rank;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < nq; i++) {
    const float want = receives ? w.out[i] : 12345.0f;
    if (!close_to(got[i], want)) bad++;
    if (!isinf(got[i]) && fabs(got[i] - want) > worst) worst = fabs(got[i] - want);
  }
  for (size_t i = 0; i < nl; i++) bad += !close_to(got_lse[i], receives ? w.lse[i] : 12345.0f);
  CHECKF(bad == 0, "%s: %d of %zu values differ from the whole problem's (worst |dO| %.3g)", c->name, bad, nq + nl,
         worst);
  clReleaseMemObject(q), clReleaseMemObject(o), clReleaseMemObject(l);
  if (k) clReleaseMemObject(k), clReleaseMemObject(v);
  if (kl) clReleaseMemObject(kl);
  if (sinks) clReleaseMemObject(sinks);
  free(ks), free(vs), free(sentinel), free(got), free(got_lse);
  free_whole(&w);
}

typedef struct {
  const char *name;
  int B, Hq, Hkv, S, D;
  int causal, wl, wr;
  int lens[2];
  int sinks;
} ring_case;

static void ring(const ring_case *c) {
  whole w;
  make_whole(&w, c->B, c->Hq, c->Hkv, c->S, c->S, c->D, 99);
  clattn_params p = base_params(c->B, c->Hq, c->Hkv, c->D, c->causal, c->wl, c->wr);
  cl_mem sinks = c->sinks ? sinks_buf(c->Hq) : NULL;
  p.sinks = sinks;
  reference(&w, &p, c->lens[0] ? c->lens : NULL);
  clattn_mpi_ring_layout lay;
  if (clattn_mpi_ring_layout_of(c->S, nranks, rank, &lay) != CLATTN_OK) {
    CHECKF(0, "%s: no layout", c->name);
    free_whole(&w);
    return;
  }
  const int L = lay.rows, D = c->D;
  /* Local rows in layout order: chunk 0 then chunk 1. */
  float *q = malloc((size_t)c->B * c->Hq * L * D * 4), *k = malloc((size_t)c->B * c->Hkv * L * D * 4);
  float *v = malloc((size_t)c->B * c->Hkv * L * D * 4);
  int global_row[2 * 4096];
  for (int i = 0; i < L; i++) global_row[i] = i < lay.len[0] ? lay.offset[0] + i : lay.offset[1] + i - lay.len[0];
  for (int bh = 0; bh < c->B * c->Hq; bh++)
    for (int i = 0; i < L; i++)
      memcpy(q + ((size_t)bh * L + i) * D, w.q + ((size_t)bh * c->S + global_row[i]) * D, (size_t)D * 4);
  for (int bh = 0; bh < c->B * c->Hkv; bh++)
    for (int i = 0; i < L; i++) {
      memcpy(k + ((size_t)bh * L + i) * D, w.k + ((size_t)bh * c->S + global_row[i]) * D, (size_t)D * 4);
      memcpy(v + ((size_t)bh * L + i) * D, w.v + ((size_t)bh * c->S + global_row[i]) * D, (size_t)D * 4);
    }
  cl_mem qb = upload(q, (size_t)c->B * c->Hq * L * D * 4), kb = upload(k, (size_t)c->B * c->Hkv * L * D * 4);
  cl_mem vb = upload(v, (size_t)c->B * c->Hkv * L * D * 4), ob = upload(NULL, (size_t)c->B * c->Hq * L * D * 4);
  cl_mem lb = upload(NULL, (size_t)c->B * c->Hq * L * 4);
  cl_mem kl = c->lens[0] ? upload(c->lens, (size_t)c->B * 4) : NULL;
  p.q_len = p.kv_len = L;
  p.q = view(qb, c->Hq, L, D), p.k = view(kb, c->Hkv, L, D), p.v = view(vb, c->Hkv, L, D);
  p.out = view(ob, c->Hq, L, D);
  p.lse = (clattn_tensor){lb, 0, {(size_t)c->Hq * L, (size_t)L, 1, 0}};
  p.kv_lens = kl;
  clattn_status st = clattn_mpi_ring_forward(mh, &p, c->S);
  CHECKF(st == w.ref_status, "%s: status %s (%s)", c->name, clattn_mpi_status_string(st), clattn_mpi_last_error(mh));
  float *got = malloc((size_t)c->B * c->Hq * L * D * 4), *got_lse = malloc((size_t)c->B * c->Hq * L * 4);
  download(ob, got, (size_t)c->B * c->Hq * L * D * 4);
  download(lb, got_lse, (size_t)c->B * c->Hq * L * 4);
  int bad = 0;
  double worst = 0;
  for (int bh = 0; bh < c->B * c->Hq; bh++)
    for (int i = 0; i < L; i++) {
      const size_t gr = (size_t)bh * c->S + global_row[i], lr = (size_t)bh * L + i;
      bad += !close_to(got_lse[lr], w.lse[gr]);
      for (int d = 0; d < D; d++) {
        const float a = got[lr * D + d], b = w.out[gr * D + d];
        bad += !close_to(a, b);
        if (fabs(a - b) > worst) worst = fabs(a - b);
      }
    }
  CHECKF(bad == 0, "%s: %d values differ from the whole problem's (worst |dO| %.3g)", c->name, bad, worst);
  clReleaseMemObject(qb), clReleaseMemObject(kb), clReleaseMemObject(vb), clReleaseMemObject(ob),
      clReleaseMemObject(lb);
  if (kl) clReleaseMemObject(kl);
  if (sinks) clReleaseMemObject(sinks);
  free(q), free(k), free(v), free(got), free(got_lse);
  free_whole(&w);
}

/* Every rank must report st and the same message as rank 0. */
static void same_everywhere(const char *name, clattn_status st, clattn_status want, const char *needle) {
  char msg[768] = {0}, root_msg[768] = {0};
  snprintf(msg, sizeof msg, "%s", clattn_mpi_last_error(mh));
  memcpy(root_msg, msg, sizeof msg);
  MPI_Bcast(root_msg, sizeof root_msg, MPI_CHAR, 0, MPI_COMM_WORLD);
  int statuses[2] = {(int)st, -(int)st}, agreed[2];
  MPI_Allreduce(statuses, agreed, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECKF(st == want, "%s: status %s, want %s (%s)", name, clattn_mpi_status_string(st), clattn_mpi_status_string(want),
         msg);
  CHECKF(agreed[0] == -agreed[1], "%s: ranks disagree on the status", name);
  CHECKF(strcmp(msg, root_msg) == 0, "%s: message '%s' differs from rank 0's '%s'", name, msg, root_msg);
  CHECKF(strstr(msg, needle) != NULL, "%s: message '%s' does not mention '%s'", name, msg, needle);
  if (rank == 0) printf("  %s -> %s%s%s\n", name, clattn_mpi_status_string(st), st ? ": " : "", st ? msg : "");
}

static void failures_agree(void) {
  enum { B = 1, H = 2, M = 2, N = 64, D = 16 };
  float host[B * H * N * D];
  for (size_t i = 0; i < sizeof host / 4; i++) host[i] = frand();
  const int n = N / nranks, off = rank * n, len = rank == nranks - 1 ? N - off : n;
  cl_mem q = upload(host, sizeof host), k = upload(host, sizeof host), v = upload(host, sizeof host);
  cl_mem o = upload(NULL, sizeof host);
  clattn_params p = base_params(B, H, H, D, 1, -1, -1);
  p.q_len = M, p.kv_len = len;
  p.q = view(q, H, M, D), p.out = view(o, H, M, D), p.k = view(k, H, len, D), p.v = view(v, H, len, D);
  clattn_mpi_kv_shard s = {off, N, -1};

  /* bad input on the last rank only, found before any data moves */
  clattn_params bad = p;
  if (rank == nranks - 1) bad.q.buf = NULL;
  same_everywhere("null q on the last rank", clattn_mpi_kv_sharded_forward(mh, &bad, &s), CLATTN_ERR_INVALID_ARGUMENT,
                  "q.buf");
  /* bad input found by the local clattn_forward (after the first agreement) */
  bad = p;
  if (rank == nranks - 1) bad.k.offset = (size_t)1 << 20;
  same_everywhere("K view past its buffer on the last rank", clattn_mpi_kv_sharded_forward(mh, &bad, &s),
                  CLATTN_ERR_BUFFER_TOO_SMALL, "rank");
  /* ranks that disagree on the problem */
  bad = p;
  if (rank == 0) bad.window_left = 7;
  same_everywhere("window_left differs on rank 0", clattn_mpi_kv_sharded_forward(mh, &bad, &s),
                  CLATTN_ERR_INVALID_ARGUMENT, "window_left");
  clattn_mpi_kv_shard overlap = s;
  if (rank == 1) overlap.kv_offset = 0;
  same_everywhere("overlapping shards", clattn_mpi_kv_sharded_forward(mh, &p, &overlap), CLATTN_ERR_INVALID_ARGUMENT,
                  "tile");
  /* position-dependent features are refused, not computed locally */
  cl_mem slopes = upload(host, H * 4);
  bad = p;
  bad.alibi_slopes = slopes;
  same_everywhere("ALiBi", clattn_mpi_kv_sharded_forward(mh, &bad, &s), CLATTN_ERR_UNSUPPORTED, "ALiBi");
  cl_mem sk = sinks_buf(H);
  bad = p;
  bad.sinks = sk;
  bad.empty_rows = CLATTN_EMPTY_ERROR;
  same_everywhere("sinks with EMPTY_ERROR", clattn_mpi_kv_sharded_forward(mh, &bad, &s), CLATTN_ERR_UNSUPPORTED,
                  "sinks");
  clReleaseMemObject(sk);
  /* ring: one rank with the wrong number of rows */
  clattn_mpi_ring_layout lay;
  clattn_mpi_ring_layout_of(N, nranks, rank, &lay);
  clattn_params r = p;
  r.q_len = r.kv_len = lay.rows + (rank == 0);
  r.k = view(k, H, lay.rows, D), r.v = view(v, H, lay.rows, D);
  same_everywhere("ring: wrong rows on rank 0", clattn_mpi_ring_forward(mh, &r, N), CLATTN_ERR_INVALID_ARGUMENT,
                  "rank 0: clattn_mpi_ring_forward");
  /* ring: a K view past its buffer on one rank, found before data moves */
  cl_mem ro = upload(NULL, (size_t)H * lay.rows * D * 4);
  r.q_len = r.kv_len = lay.rows;
  r.q = view(q, H, lay.rows, D), r.out = view(ro, H, lay.rows, D);
  if (rank == nranks - 1) r.k.offset = (size_t)1 << 20;
  same_everywhere("ring: K view past its buffer on the last rank", clattn_mpi_ring_forward(mh, &r, N),
                  CLATTN_ERR_BUFFER_TOO_SMALL, "k: the view addresses");
  r.k.offset = 0;
  /* ring: a failure after the first agreement (the local forward refuses
   * one rank's Q view); the ring still turns and every rank reports it */
  if (rank == nranks - 1) r.q.offset = (size_t)1 << 20;
  same_everywhere("ring: Q view past its buffer on the last rank", clattn_mpi_ring_forward(mh, &r, N),
                  CLATTN_ERR_BUFFER_TOO_SMALL, "clattn_forward (local block)");
  r.q.offset = 0;
  same_everywhere("ring: well-formed call after the failure", clattn_mpi_ring_forward(mh, &r, N), CLATTN_OK, "");
  clReleaseMemObject(ro);
  clReleaseMemObject(q), clReleaseMemObject(k), clReleaseMemObject(v), clReleaseMemObject(o),
      clReleaseMemObject(slopes);
}

/* A collective that never returns fails the test within seconds, naming
 * itself, instead of waiting for mpi_run.sh's deadline. */
static const char *watched;
static void on_alarm(int sig) {
  (void)sig;
  static const char head[] = "  FAIL: still waiting after 30 s in: ";
  (void)!write(1, head, sizeof head - 1);
  (void)!write(1, watched, strlen(watched));
  (void)!write(1, "\n", 1);
  _exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* clattn_mpi_create with this rank's arguments (ctx, out or not): every
 * rank must return want, with *out NULL on failure, within seconds. */
static void create_everywhere(const char *name, clattn_context *my_ctx, int give_out, clattn_status want) {
  clattn_mpi *m = (clattn_mpi *)&m; /* not NULL: create must clear it */
  watched = name;
  alarm(30);
  const double t0 = now();
  const clattn_status st = clattn_mpi_create(my_ctx, MPI_COMM_WORLD, give_out ? &m : NULL);
  const double took = now() - t0;
  alarm(0);
  int statuses[2] = {(int)st, -(int)st}, agreed[2];
  MPI_Allreduce(statuses, agreed, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECKF(st == want, "%s: status %s, want %s", name, clattn_mpi_status_string(st), clattn_mpi_status_string(want));
  CHECKF(agreed[0] == -agreed[1], "%s: ranks disagree on the status", name);
  CHECKF(took < 10, "%s: returned after %.1f s", name, took);
  if (give_out && st != CLATTN_OK) CHECKF(m == NULL, "%s: *out is not NULL after a failure", name);
  if (give_out && st == CLATTN_OK) clattn_mpi_destroy(m);
  MPI_Errhandler h;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
  CHECKF(h == MPI_ERRORS_ARE_FATAL, "%s: MPI_COMM_WORLD's error handler was not restored", name);
  MPI_Errhandler_free(&h);
  if (rank == 0) printf("  %s -> %s (%.2f s)\n", name, clattn_mpi_status_string(st), took);
}

/* clattn_mpi_create agrees on success before its first collective that
 * could wait (MPI_Comm_dup): one rank's bad arguments fail it on every
 * rank with that rank's status, and every rank returns at once. A NULL
 * handle to clattn_mpi_destroy on one rank does not hold up the others. */
static void create_failures_agree(void) {
  create_everywhere("create, ctx NULL on rank 1", rank == 1 ? NULL : ctx, 1, CLATTN_ERR_INVALID_ARGUMENT);
  create_everywhere("create, out NULL on the last rank", ctx, rank != nranks - 1, CLATTN_ERR_INVALID_ARGUMENT);
  create_everywhere("create, ctx NULL on every rank but 0", rank == 0 ? ctx : NULL, 1, CLATTN_ERR_INVALID_ARGUMENT);
  create_everywhere("create after the failures", ctx, 1, CLATTN_OK);
  clattn_mpi *m = NULL;
  if (clattn_mpi_create(ctx, MPI_COMM_WORLD, &m) != CLATTN_OK) {
    CHECKF(0, "clattn_mpi_create failed");
    return;
  }
  watched = "destroy, NULL on rank 1";
  alarm(30);
  clattn_mpi_destroy(rank == 1 ? NULL : m);
  alarm(0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) clattn_mpi_destroy(m);
}

int main(int argc, char **argv) {
  /* --failures: only the agreement on failures (create's and the calls') */
  const int only_failures = argc > 1 && strcmp(argv[1], "--failures") == 0;
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  /* Rank 0 first: it builds the kernel programs into the shared disk cache,
   * the other ranks then load them instead of compiling the same programs. */
  if (rank != 0) MPI_Barrier(MPI_COMM_WORLD);
  int have = clattn_create(NULL, &ctx) == CLATTN_OK, all = 0;
  if (rank == 0) MPI_Barrier(MPI_COMM_WORLD);
  MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0) printf("skipped: no OpenCL device on some rank\n");
    if (ctx) clattn_destroy(ctx);
    MPI_Finalize();
    return 77;
  }
  signal(SIGALRM, on_alarm);
  create_failures_agree();
  if (clattn_mpi_create(ctx, MPI_COMM_WORLD, &mh) != CLATTN_OK) {
    printf("rank %d: clattn_mpi_create failed\n", rank);
    MPI_Finalize();
    return 1;
  }
  const kv_case kv_cases[] = {
      /* name                            B Hq Hkv  M    N   D causal wl wr  lens     split root empty */
      {"decode MHA causal, even", 1, 2, 2, 1, 97, 16, 1, -1, -1, {0, 0}, 0, -1, CLATTN_EMPTY_ZERO, 0},
      {"decode GQA causal, uneven", 2, 4, 2, 4, 131, 16, 1, -1, -1, {0, 0}, 1, -1, CLATTN_EMPTY_ZERO, 0},
      {"decode GQA window 20: early shards hold no allowed key",
       1,
       4,
       2,
       3,
       120,
       16,
       1,
       20,
       -1,
       {0, 0},
       0,
       -1,
       CLATTN_EMPTY_ZERO,
       0},
      {"decode kv_lens {40, 117}: shards past the valid keys",
       2,
       4,
       1,
       2,
       120,
       16,
       1,
       -1,
       -1,
       {40, 117},
       1,
       -1,
       CLATTN_EMPTY_ZERO,
       0},
      {"decode, rank 1's shard empty, to root 0", 1, 2, 1, 16, 90, 16, 1, -1, -1, {0, 0}, 2, 0, CLATTN_EMPTY_ZERO, 0},
      {"prefill GQA causal, all keys on the last rank",
       1,
       4,
       2,
       33,
       70,
       16,
       1,
       -1,
       -1,
       {0, 0},
       3,
       -1,
       CLATTN_EMPTY_ZERO,
       0},
      {"prefill MHA causal, even: early rows see no key of the later shards",
       1,
       2,
       2,
       40,
       64,
       16,
       1,
       -1,
       -1,
       {0, 0},
       0,
       -1,
       CLATTN_EMPTY_ZERO,
       0},
      {"prefill MHA two-sided window 6/3, uneven", 1, 2, 2, 40, 64, 16, 0, 6, 3, {0, 0}, 1, -1, CLATTN_EMPTY_ZERO, 0},
      {"prefill non-causal, kv_lens {0, 50}, EMPTY_ERROR",
       2,
       2,
       2,
       8,
       64,
       16,
       0,
       -1,
       -1,
       {0, 50},
       0,
       -1,
       CLATTN_EMPTY_ERROR,
       0},
      {"prefill M > N causal: the first rows see no key",
       1,
       2,
       1,
       20,
       12,
       16,
       1,
       -1,
       -1,
       {0, 0},
       0,
       -1,
       CLATTN_EMPTY_ZERO,
       0},
      {"decode GQA window 20 with sinks, uneven", 1, 4, 2, 2, 120, 16, 1, 20, -1, {0, 0}, 1, -1, CLATTN_EMPTY_ZERO, 1},
      {"prefill sinks, kv_lens {0, 50}: empty rows hold the sink",
       2,
       2,
       2,
       8,
       64,
       16,
       0,
       -1,
       -1,
       {0, 50},
       0,
       -1,
       CLATTN_EMPTY_ZERO,
       1},
  };
  const ring_case ring_cases[] = {
      /* name                          B Hq Hkv   S   D causal wl  wr  lens */
      {"ring MHA causal", 1, 2, 2, 64, 16, 1, -1, -1, {0, 0}, 0},
      {"ring GQA causal, uneven chunks", 1, 4, 2, 77, 16, 1, -1, -1, {0, 0}, 0},
      {"ring GQA causal window 9", 2, 4, 1, 96, 16, 1, 9, -1, {0, 0}, 0},
      {"ring MHA two-sided window 5/12", 1, 2, 2, 70, 16, 0, 5, 12, {0, 0}, 0},
      {"ring non-causal, kv_lens {30, 61}", 2, 2, 2, 64, 16, 0, -1, -1, {30, 61}, 0},
      {"ring GQA causal window 9 with sinks", 1, 4, 2, 64, 16, 1, 9, -1, {0, 0}, 1},
  };
  for (size_t i = 0; i < sizeof kv_cases / sizeof kv_cases[0] && !only_failures; i++) {
    const int before = failures;
    kv_sharded(&kv_cases[i]);
    int bad = failures > before, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%s %s\n", any ? "FAIL" : "ok  ", kv_cases[i].name);
  }
  for (size_t i = 0; i < sizeof ring_cases / sizeof ring_cases[0] && !only_failures; i++) {
    const int before = failures;
    ring(&ring_cases[i]);
    int bad = failures > before, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%s %s\n", any ? "FAIL" : "ok  ", ring_cases[i].name);
  }
  failures_agree();
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%d ranks: %s (%d failed checks)\n", nranks, total ? "FAIL" : "all passed", total);
  clattn_mpi_destroy(mh);
  clattn_destroy(ctx);
  MPI_Finalize();
  return total ? 1 : 0;
}
