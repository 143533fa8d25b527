/*
 * `clattn bench --modifiers`: what a modifier costs against the call it
 * replaces, f32, FUSED, one context, the same inputs (B 1, H query and HKV
 * key/value heads, M = N keys, d; default 8, 8, 4096, 64):
 *
 *   documents  8 equal documents: a dense uchar mask tensor [N, N] (broadcast
 *              over heads), the document mask modifier (int ids captured)
 *              alone, and with its block mask (128 x 128 blocks);
 *   causal     built-in causal against the causal mask modifier with its
 *              block mask (and without);
 *   ALiBi      built-in ALiBi slopes against the ALiBi score modifier.
 *
 * Each group is timed in rounds, one call of each variant per round
 * (bench_base.c's bb_time_rounds: medians of up to --reps rounds within
 * --cap seconds), so the ratios come from one run side by side. Every
 * variant's output is compared with its group's first (max abs difference).
 * GFLOP/s count 4·B·H·M·N·d (halved for causal, and for documents the
 * pairs the mask allows: 4·B·H·N·(N/8)·d).
 */
#include "bench_modifiers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_base.h"
#include "clattn.h"
#include "problem.h"

const char bench_modifiers_usage[] =
    "       clattn bench --modifiers [--shape H,HKV,N,D] [--block BQ,BK] [--reps R] [--cap SECONDS]\n";

enum { DOCS = 8, MAX_VARIANTS = 3 };

static const char DOCUMENT[] =
    "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
    "  __global const int *doc = (__global const int *)cap->buf[0];\n"
    "  return doc[q_idx] == doc[kv_idx];\n}\n";
static const char CAUSAL[] =
    "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
    "  return kv_idx <= q_idx;\n}\n";
static const char ALIBI[] = /* the slopes captured */
    "float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
    "  __global const float *slope = (__global const float *)cap->buf[0];\n"
    "  return score - slope[h] * (float)abs(q_idx - kv_idx);\n}\n";

typedef struct {
  clattn_context *ctx;
  cl_command_queue queue;
  clattn_params p;
  const char *name;
} variant;

static int run_once(void *arg, char *err, size_t n) {
  variant *v = arg;
  const clattn_status st = clattn_forward(v->ctx, &v->p, 0, NULL, NULL);
  const cl_int e = clFinish(v->queue);
  if (st != CLATTN_OK || e != CL_SUCCESS) {
    snprintf(err, n, "%s: clattn_forward: %s: %s (clFinish %d)", v->name, clattn_status_string(st),
             clattn_last_error(v->ctx), e);
    return -1;
  }
  return 0;
}

/* The output after one call of v, into out (count floats). */
static int output_of(variant *v, cl_mem out_buf, float *out, size_t count, char *err, size_t n) {
  if (run_once(v, err, n)) return -1;
  const cl_int e = clEnqueueReadBuffer(v->queue, out_buf, CL_TRUE, 0, count * sizeof(float), out, 0, NULL, NULL);
  if (e != CL_SUCCESS) return snprintf(err, n, "clEnqueueReadBuffer: %d", e), -1;
  return 0;
}

/* Times the group side by side and prints a line per variant. */
static int run_group(const char *title, variant *v, int n, double flops, cl_mem out_buf, size_t count, int reps,
                     double cap_ms) {
  char err[1024] = "";
  float *first = malloc(count * sizeof *first), *other = malloc(count * sizeof *other);
  double diff[MAX_VARIANTS] = {0};
  int rc = !first || !other ? (snprintf(err, sizeof err, "out of host memory"), -1) : 0;
  for (int i = 0; i < n && rc == 0; i++) {
    rc = output_of(&v[i], out_buf, i ? other : first, count, err, sizeof err);
    for (size_t e = 0; i && rc == 0 && e < count; e++) diff[i] = fmax(diff[i], fabs((double)first[e] - other[e]));
  }
  double ms[MAX_VARIANTS];
  int rounds = 0;
  void *args[MAX_VARIANTS];
  for (int i = 0; i < n; i++) args[i] = &v[i];
  if (rc == 0) rc = bb_time_rounds(run_once, args, n, reps, cap_ms, ms, &rounds, err, sizeof err);
  free(first);
  free(other);
  if (rc) return fprintf(stderr, "clattn bench --modifiers: %s: %s\n", title, err), -1;
  printf("%s (%d rounds)\n", title, rounds);
  for (int i = 0; i < n; i++)
    printf("  %-34s %9.2f ms %8.1f GFLOP/s  %6.2fx the first  max|diff| %.2g\n", v[i].name, ms[i],
           flops / (ms[i] * 1e6), ms[i] / ms[0], diff[i]);
  return 0;
}

static cl_mem host_buffer(clattn_context *ctx, const void *host, size_t bytes) {
  cl_int e;
  cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)host, &e);
  return e == CL_SUCCESS ? m : NULL;
}

int bench_modifiers_main(int argc, char **argv) {
  int heads = 8, kv_heads = 8, n = 4096, dim = 64, reps = 5, block_q = 0, block_k = 0; /* 0: the default */
  double cap_s = 20.0;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--modifiers")) continue;
    if (!strcmp(o, "--reps") && val && atoi(val) > 0)
      reps = atoi(val), i++;
    else if (!strcmp(o, "--cap") && val && strtod(val, NULL) > 0)
      cap_s = strtod(val, NULL), i++;
    else if (!strcmp(o, "--block") && val && sscanf(val, "%d,%d", &block_q, &block_k) == 2 && block_q > 0 &&
             block_k > 0)
      i++;
    else if (!strcmp(o, "--shape") && val && sscanf(val, "%d,%d,%d,%d", &heads, &kv_heads, &n, &dim) == 4 &&
             heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && n >= DOCS && n % DOCS == 0 && dim > 0)
      i++;
    else
      return fprintf(stderr, "clattn bench --modifiers: bad option %s (N a multiple of %d)\nusage:\n%s", o, DOCS,
                     bench_modifiers_usage),
             2;
  }
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK)
    return fprintf(stderr, "clattn bench --modifiers: cannot create a context: %s: %s\n", clattn_status_string(st),
                   clattn_last_error(NULL)),
           1;
  cp_shape s = cp_shape_default();
  s.batch = 1, s.q_heads = heads, s.kv_heads = kv_heads, s.q_len = s.kv_len = n, s.head_dim = s.value_dim = dim;
  s.alibi = 1;
  s.algo = CLATTN_ALGO_FUSED;
  char err[512];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  int *doc = malloc((size_t)n * sizeof *doc);
  unsigned char *dense = malloc((size_t)n * (size_t)n);
  cl_mem doc_buf = NULL, mask_buf = NULL;
  clattn_block_mask *doc_bm = NULL, *causal_bm = NULL;
  int rc = 1;
  if (!pb || !doc || !dense || cp_upload(pb, ctx) != 0) {
    fprintf(stderr, "clattn bench --modifiers: %s\n", pb ? pb->err : err);
    goto done;
  }
  for (int i = 0; i < n; i++) doc[i] = i / (n / DOCS);
  for (size_t i = 0; i < (size_t)n; i++)
    for (size_t j = 0; j < (size_t)n; j++) dense[i * (size_t)n + j] = doc[i] == doc[j];
  doc_buf = host_buffer(ctx, doc, (size_t)n * sizeof *doc);
  mask_buf = host_buffer(ctx, dense, (size_t)n * (size_t)n);
  if (!doc_buf || !mask_buf) {
    fprintf(stderr, "clattn bench --modifiers: cannot make the document buffers\n");
    goto done;
  }
  clattn_params base = pb->params;
  const cl_mem slopes = base.alibi_slopes;
  base.alibi_slopes = NULL;
  const cl_command_queue queue = clattn_cl_queue(ctx);
  const double full = 4.0 * heads * (double)n * n * dim;
  printf("clattn bench --modifiers: B 1, H %d, HKV %d, M = N = %d, d %d, f32, FUSED\n", heads, kv_heads, n, dim);

  variant docs[3] = {{ctx, queue, base, "dense mask tensor [N, N]"},
                     {ctx, queue, base, "document mask modifier"},
                     {ctx, queue, base, "document mask modifier + block mask"}};
  docs[0].p.mask = (clattn_tensor){mask_buf, 0, {0, 0, (size_t)n, 1}};
  for (int i = 1; i < 3; i++) docs[i].p.mask_mod = DOCUMENT, docs[i].p.captures[0] = doc_buf;
  if ((st = clattn_block_mask_create(ctx, &docs[2].p, block_q, block_k, &doc_bm)) != CLATTN_OK) {
    fprintf(stderr, "clattn bench --modifiers: block mask: %s\n", clattn_last_error(ctx));
    goto done;
  }
  docs[2].p.block_mask = doc_bm;
  char title[160];
  snprintf(title, sizeof title, "documents: %d of %d keys", DOCS, n / DOCS);
  if (run_group(title, docs, 3, full / DOCS, pb->out_buf, pb->out_elems, reps, cap_s * 1e3)) goto done;

  variant causal[3] = {{ctx, queue, base, "built-in causal"},
                       {ctx, queue, base, "causal mask modifier + block mask"},
                       {ctx, queue, base, "causal mask modifier"}};
  causal[0].p.causal = 1;
  causal[1].p.mask_mod = causal[2].p.mask_mod = CAUSAL;
  if ((st = clattn_block_mask_create(ctx, &causal[1].p, block_q, block_k, &causal_bm)) != CLATTN_OK) {
    fprintf(stderr, "clattn bench --modifiers: block mask: %s\n", clattn_last_error(ctx));
    goto done;
  }
  causal[1].p.block_mask = causal_bm;
  if (run_group("causal", causal, 3, full / 2, pb->out_buf, pb->out_elems, reps, cap_s * 1e3)) goto done;

  variant alibi[2] = {{ctx, queue, base, "built-in ALiBi"}, {ctx, queue, base, "ALiBi score modifier"}};
  alibi[0].p.alibi_slopes = slopes;
  alibi[1].p.score_mod = ALIBI;
  alibi[1].p.captures[0] = slopes;
  if (run_group("ALiBi", alibi, 2, full, pb->out_buf, pb->out_elems, reps, cap_s * 1e3)) goto done;
  rc = 0;
done:
  clattn_block_mask_release(doc_bm);
  clattn_block_mask_release(causal_bm);
  if (doc_buf) clReleaseMemObject(doc_buf);
  if (mask_buf) clReleaseMemObject(mask_buf);
  free(doc);
  free(dense);
  cp_free(pb);
  clattn_destroy(ctx);
  return rc;
}
