/*
 * `clattn bench --kvcache`: one decode step (B 1, H 32, KV 8, one query and
 * one new row, a cache of N = 4096 rows, N - 1 of them in use before the
 * step, d 128 unless --shape; f16 q, out and cache, causal, AUTO) two ways
 * on one context and the same cache:
 *
 *   one call   clattn_forward_kvcache (cache_seqlens N - 1, new_len 1; no
 *              rotary tables, which the two-call step has no call for);
 *   two calls  clattn_kv_append at positions N - 1, then clattn_forward
 *              over kv_lens N: what an engine enqueues without it.
 *
 * Every step writes the same row, so each variant sees the same cache.
 * The two outputs are compared bitwise first. Then --reps rounds, each
 * timing --steps back-to-back steps of each variant and one clFinish, in
 * turns (the first variant alternating from round to round); the figures
 * are the medians over the rounds of the wall time per step.
 */
#include "bench_kvcache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_base.h"
#include "clattn.h"
#include "problem.h"

const char bench_kvcache_usage[] = "       clattn bench --kvcache [--shape H,HKV,N,D] [--reps R] [--steps S]\n";

typedef struct {
  int heads, kv_heads, kv_len, dim, reps, steps;
} kv_cfg;

static int parse(int argc, char **argv, kv_cfg *c) {
  *c = (kv_cfg){32, 8, 4096, 128, 15, 10};
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--kvcache")) continue;
    if (!strcmp(o, "--reps") && v && atoi(v) > 0)
      c->reps = atoi(v), i++;
    else if (!strcmp(o, "--steps") && v && atoi(v) > 0)
      c->steps = atoi(v), i++;
    else if (!strcmp(o, "--shape") && v &&
             sscanf(v, "%d,%d,%d,%d", &c->heads, &c->kv_heads, &c->kv_len, &c->dim) == 4 && c->heads > 0 &&
             c->kv_heads > 0 && c->heads % c->kv_heads == 0 && c->kv_len > 1 && c->dim > 0)
      i++;
    else {
      fprintf(stderr, "clattn bench --kvcache: bad option %s\nusage:\n%s", o, bench_kvcache_usage);
      return -1;
    }
  }
  return 0;
}

/* n f16 values uniform in [-1, 1] (seeded), as a buffer of ctx. */
static cl_mem f16_buffer(cl_context cx, size_t n, uint32_t seed, cl_int *err) {
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) {
    *err = CL_OUT_OF_HOST_MEMORY;
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = cp_f16_bits((float)(seed >> 8) / 8388608.0f - 1.0f);
  }
  cl_mem m = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *h, h, err);
  free(h);
  return m;
}

enum { ONE_CALL, TWO_CALLS, N_WAYS };

typedef struct {
  clattn_context *ctx;
  clattn_kvcache_params kp;
  clattn_append_params ap;
  clattn_params fp;
} kv_runs;

static clattn_status step(kv_runs *r, int way) {
  clattn_status st;
  if (way == ONE_CALL) return clattn_forward_kvcache(r->ctx, &r->kp, 0, NULL, NULL);
  if ((st = clattn_kv_append(r->ctx, &r->ap, 0, NULL, NULL))) return st;
  return clattn_forward(r->ctx, &r->fp, 0, NULL, NULL);
}

/* Wall time per step (ms) of `steps` back-to-back steps and one clFinish. */
static int time_steps(kv_runs *r, int way, int steps, double *per_step) {
  cl_command_queue q = clattn_cl_queue(r->ctx);
  if (clFinish(q) != CL_SUCCESS) return -1;
  const double t0 = bb_now_ms();
  for (int i = 0; i < steps; i++)
    if (step(r, way) != CLATTN_OK) return -1;
  if (clFinish(q) != CL_SUCCESS) return -1;
  *per_step = (bb_now_ms() - t0) / steps;
  return 0;
}

static int run(clattn_context *ctx, const kv_cfg *c) {
  const int H = c->heads, KV = c->kv_heads, N = c->kv_len, d = c->dim;
  const cl_context cx = clattn_cl_context(ctx);
  const size_t qn = (size_t)H * d, newn = (size_t)KV * d, cn = (size_t)KV * N * d;
  const cl_int in_use = N - 1, lens = N;
  cl_int e[9];
  cl_mem q = f16_buffer(cx, qn, 1, &e[0]), kn = f16_buffer(cx, newn, 2, &e[1]), vn = f16_buffer(cx, newn, 3, &e[2]),
         k = f16_buffer(cx, cn, 4, &e[3]), v = f16_buffer(cx, cn, 5, &e[4]), out[N_WAYS] = {NULL, NULL};
  out[ONE_CALL] = f16_buffer(cx, qn, 6, &e[5]);
  out[TWO_CALLS] = f16_buffer(cx, qn, 7, &e[6]);
  cl_mem seqlens = clCreateBuffer(cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof in_use, (void *)&in_use, &e[7]);
  cl_mem kv_lens = clCreateBuffer(cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof lens, (void *)&lens, &e[8]);
  int rc = -1;
  uint16_t *a = malloc(qn * 2), *b = malloc(qn * 2);
  for (int i = 0; i < 9; i++)
    if (e[i] != CL_SUCCESS) {
      fprintf(stderr, "clattn bench --kvcache: clCreateBuffer: %s\n", cp_cl_error_name(e[i]));
      goto done;
    }
  if (!a || !b) goto done;
  kv_runs r;
  memset(&r, 0, sizeof r);
  r.ctx = ctx;
  clattn_params p = clattn_params_default();
  p.batch = 1, p.q_heads = H, p.kv_heads = KV, p.q_len = 1, p.kv_len = N, p.head_dim = p.value_dim = d;
  p.dtype = CLATTN_F16;
  p.q = (clattn_tensor){q, 0, {qn, (size_t)d, (size_t)d, 1}};
  p.k = (clattn_tensor){k, 0, {cn, (size_t)N * d, (size_t)d, 1}};
  p.v = (clattn_tensor){v, 0, {cn, (size_t)N * d, (size_t)d, 1}};
  p.causal = 1;
  r.kp = clattn_kvcache_params_default();
  r.kp.attn = p;
  r.kp.attn.out = (clattn_tensor){out[ONE_CALL], 0, {qn, (size_t)d, (size_t)d, 1}};
  r.kp.cache_seqlens = seqlens;
  r.kp.new_len = 1;
  r.kp.k_new = (clattn_tensor){kn, 0, {newn, (size_t)d, (size_t)d, 1}};
  r.kp.v_new = (clattn_tensor){vn, 0, {newn, (size_t)d, (size_t)d, 1}};
  r.ap = clattn_append_params_default();
  r.ap.batch = 1, r.ap.kv_heads = KV, r.ap.new_len = 1, r.ap.head_dim = r.ap.value_dim = d;
  r.ap.src_dtype = CLATTN_F16;
  r.ap.k_new = r.kp.k_new, r.ap.v_new = r.kp.v_new, r.ap.positions = seqlens;
  r.ap.k = p.k, r.ap.v = p.v, r.ap.capacity = N;
  r.fp = p;
  r.fp.out = (clattn_tensor){out[TWO_CALLS], 0, {qn, (size_t)d, (size_t)d, 1}};
  r.fp.kv_lens = kv_lens;

  char route[N_WAYS][256];
  for (int w = 0; w < N_WAYS; w++) {
    const clattn_status st = step(&r, w);
    if (st != CLATTN_OK) {
      fprintf(stderr, "clattn bench --kvcache: %s: %s\n", clattn_status_string(st), clattn_last_error(ctx));
      goto done;
    }
    snprintf(route[w], sizeof route[w], "%s", clattn_last_route());
  }
  cl_command_queue queue = clattn_cl_queue(ctx);
  if (clEnqueueReadBuffer(queue, out[ONE_CALL], CL_TRUE, 0, qn * 2, a, 0, NULL, NULL) != CL_SUCCESS ||
      clEnqueueReadBuffer(queue, out[TWO_CALLS], CL_TRUE, 0, qn * 2, b, 0, NULL, NULL) != CL_SUCCESS)
    goto done;
  const int same = memcmp(a, b, qn * 2) == 0;

  double *t = malloc(sizeof(double) * N_WAYS * (size_t)c->reps);
  if (!t) goto done;
  for (int round = 0; round < c->reps; round++)
    for (int i = 0; i < N_WAYS; i++) {
      const int w = (i + round) % N_WAYS; /* the first variant alternates */
      if (time_steps(&r, w, c->steps, &t[w * c->reps + round]) != 0) {
        fprintf(stderr, "clattn bench --kvcache: a step failed: %s\n", clattn_last_error(ctx));
        free(t);
        goto done;
      }
    }
  const double one = bb_median(t, c->reps), two = bb_median(t + c->reps, c->reps);
  free(t);
  char dev[256] = "";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_NAME, sizeof dev, dev, NULL);
  printf("clattn bench --kvcache on %s\n", dev);
  printf(
      "decode step: B 1, H %d/KV %d, M 1, one new row, N %d (%d in use before), d %d, f16 q/out and cache, "
      "causal, AUTO\n%d rounds of %d back-to-back steps and one clFinish per variant, in turns; medians of the "
      "time per step:\n",
      H, KV, N, N - 1, d, c->reps, c->steps);
  printf("  one call   clattn_forward_kvcache              %8.3f ms   (%s)\n", one, route[ONE_CALL]);
  printf("  two calls  clattn_kv_append + clattn_forward   %8.3f ms   (forward: %s)\n", two, route[TWO_CALLS]);
  printf("  one call / two calls                           %8.3f\n", one / two);
  printf("  outputs bitwise equal: %s\n", same ? "yes" : "NO");
  rc = same ? 0 : -1;
done:
  free(a), free(b);
  const cl_mem all[] = {q, kn, vn, k, v, out[0], out[1], seqlens, kv_lens};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  return rc;
}

int bench_kvcache_main(int argc, char **argv) {
  kv_cfg c;
  if (parse(argc, argv, &c) != 0) return 2;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn bench --kvcache: cannot create a context: %s: %s\n", clattn_status_string(st),
            clattn_last_error(NULL));
    return 1;
  }
  const int rc = run(ctx, &c) == 0 ? 0 : 1;
  clattn_destroy(ctx);
  return rc;
}
