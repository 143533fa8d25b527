/*
 * `clattn bench --backward`: per shape, clattn's FUSED forward (with lse)
 * and clattn_backward's three ways on the chosen device, side by side: FA2
 * deterministic (the default), FA2 with atomic dQ (deterministic = 0) and
 * the staged backward (fwd.algo STAGED); the FA2 backward/forward time
 * ratio, and a host OpenBLAS backward from the same O and lse (five SGEMMs
 * per head: S = scale Q Kᵀ, dP = dO Vᵀ, dV += Pᵀ dO, dQ = scale dS K,
 * dK += scale dSᵀ Q, with P = exp(S - lse) and dS = P (dP - D) between them,
 * single-threaded). f32, dense [B,H,S,d], dk = dv = d, scale 1/sqrt(d),
 * causal bottom-right aligned.
 *
 * GFLOP/s count 4·B·H·M·N·d for the forward and 10·B·H·M·N·d for the
 * backward (halved for causal), FlashAttention-2's convention. Times: one
 * warm-up call, then the median of up to --reps calls within --cap seconds
 * (bench_base.c's bb_time). The device's gradients are compared with the
 * host's (max abs difference over dQ, dK, dV, relative to their largest;
 * the largest over the three device paths).
 */
#include "bench_backward.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_base.h"
#include "clattn.h"

#define MAX_SHAPES 16

typedef struct {
  clattn_context *ctx;
  cl_command_queue queue;
  clattn_params fwd;
  clattn_backward_params bp;
} dev_call;

static int run_fwd(void *arg, char *err, size_t n) {
  dev_call *c = arg;
  clattn_status st = clattn_forward(c->ctx, &c->fwd, 0, NULL, NULL);
  cl_int e = clFinish(c->queue);
  if (st != CLATTN_OK || e != CL_SUCCESS) {
    snprintf(err, n, "clattn_forward: %s: %s (clFinish %d)", clattn_status_string(st), clattn_last_error(c->ctx), e);
    return -1;
  }
  return 0;
}

static int run_bwd(void *arg, char *err, size_t n) {
  dev_call *c = arg;
  clattn_status st = clattn_backward(c->ctx, &c->bp, 0, NULL, NULL);
  cl_int e = clFinish(c->queue);
  if (st != CLATTN_OK || e != CL_SUCCESS) {
    snprintf(err, n, "clattn_backward: %s: %s (clFinish %d)", clattn_status_string(st), clattn_last_error(c->ctx), e);
    return -1;
  }
  return 0;
}

/* The host backward's inputs, outputs and one head's M x N scratch pair. */
typedef struct {
  bb_shape s;
  const float *q, *k, *v, *o, *lse, *d_o;
  float *d_q, *d_k, *d_v, *sc, *dp, *dsum;
} host_bwd;

static int run_host(void *arg, char *err, size_t n) {
  (void)err;
  (void)n;
  host_bwd *h = arg;
  const int B = h->s.batch, H = h->s.heads, G = H / h->s.kv_heads, M = h->s.q_len, N = h->s.kv_len, d = h->s.dim;
  const float scale = 1.0f / sqrtf((float)d);
  const size_t qs = (size_t)M * d, ks = (size_t)N * d;
  memset(h->d_k, 0, (size_t)B * h->s.kv_heads * ks * sizeof(float));
  memset(h->d_v, 0, (size_t)B * h->s.kv_heads * ks * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int hh = 0; hh < H; hh++) {
      const size_t bh = (size_t)b * H + hh, bk = (size_t)b * h->s.kv_heads + hh / G;
      const float *q = h->q + bh * qs, *o = h->o + bh * qs, *d_o = h->d_o + bh * qs, *lse = h->lse + bh * M;
      const float *k = h->k + bk * ks, *v = h->v + bk * ks;
      for (int i = 0; i < M; i++) {
        float D = 0.0f;
        for (int c = 0; c < d; c++) D += d_o[(size_t)i * d + c] * o[(size_t)i * d + c];
        h->dsum[i] = D;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, d, scale, q, d, k, d, 0.0f, h->sc, N);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, d, 1.0f, d_o, d, v, d, 0.0f, h->dp, N);
      for (int i = 0; i < M; i++) {
        const int last = h->s.causal ? i + N - M : N - 1; /* bottom-right aligned */
        float *p = h->sc + (size_t)i * N, *ds = h->dp + (size_t)i * N;
        for (int j = 0; j < N; j++) {
          const float w = j <= last ? expf(p[j] - lse[i]) : 0.0f;
          p[j] = w;
          ds[j] = w * (ds[j] - h->dsum[i]);
        }
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, d, M, 1.0f, h->sc, N, d_o, d, 1.0f, h->d_v + bk * ks, d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, d, N, scale, h->dp, N, k, d, 0.0f, h->d_q + bh * qs, d);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, d, M, scale, h->dp, N, q, d, 1.0f, h->d_k + bk * ks, d);
    }
  return 0;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
  double diff = 0.0, top = 0.0;
  for (size_t e = 0; e < n; e++) {
    diff = fmax(diff, fabs((double)a[e] - b[e]));
    top = fmax(top, fabs((double)b[e]));
  }
  return top > 0.0 ? diff / top : diff;
}

static cl_mem upload(cl_context cx, const float *x, size_t n, cl_int *err) {
  return clCreateBuffer(cx, CL_MEM_READ_WRITE | (x ? CL_MEM_COPY_HOST_PTR : 0), n * sizeof(float), (void *)x, err);
}

/* One shape: prints its table row. 0, or -1 after printing why. */
static int bench_shape(clattn_context *ctx, const bb_shape *s, int host, int max_reps, double cap_ms) {
  const size_t qn = (size_t)s->batch * s->heads * s->q_len * s->dim;
  const size_t kn = (size_t)s->batch * s->kv_heads * s->kv_len * s->dim;
  const size_t ln = (size_t)s->batch * s->heads * s->q_len;
  float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *d_o = malloc(qn * 4), *o = malloc(qn * 4);
  float *lse = malloc(ln * 4), *gq = malloc(qn * 4), *gk = malloc(kn * 4), *gv = malloc(kn * 4);
  float *hq = malloc(qn * 4), *hk = malloc(kn * 4), *hv = malloc(kn * 4);
  float *sc = malloc((size_t)s->q_len * s->kv_len * 4), *dp = malloc((size_t)s->q_len * s->kv_len * 4);
  float *dsum = malloc((size_t)s->q_len * 4);
  cl_mem bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL, bdo = NULL, bgq = NULL, bgk = NULL, bgv = NULL;
  int rc = -1;
  char err[512] = "";
  if (!q || !k || !v || !d_o || !o || !lse || !gq || !gk || !gv || !hq || !hk || !hv || !sc || !dp || !dsum) {
    printf("| out of host memory |\n");
    goto done;
  }
  unsigned long long x = 88172645463325252ull;
  float *fill[] = {q, k, v, d_o};
  size_t fn[] = {qn, kn, kn, qn};
  for (int a = 0; a < 4; a++)
    for (size_t e = 0; e < fn[a]; e++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      fill[a][e] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
  cl_context cx = clattn_cl_context(ctx);
  cl_int e1, e2, e3, e4, e5, e6, e7, e8, e9;
  bq = upload(cx, q, qn, &e1), bk = upload(cx, k, kn, &e2), bv = upload(cx, v, kn, &e3), bdo = upload(cx, d_o, qn, &e4);
  bo = upload(cx, NULL, qn, &e5), bl = upload(cx, NULL, ln, &e6), bgq = upload(cx, NULL, qn, &e7);
  bgk = upload(cx, NULL, kn, &e8), bgv = upload(cx, NULL, kn, &e9);
  if (e1 || e2 || e3 || e4 || e5 || e6 || e7 || e8 || e9) {
    printf("| device buffers: clCreateBuffer failed |\n");
    goto done;
  }
  const size_t M = s->q_len, N = s->kv_len, d = s->dim, H = s->heads, Hk = s->kv_heads;
  dev_call c = {ctx, clattn_cl_queue(ctx), clattn_params_default(), clattn_backward_params_default()};
  clattn_params *p = &c.fwd;
  p->batch = s->batch, p->q_heads = s->heads, p->kv_heads = s->kv_heads, p->q_len = s->q_len, p->kv_len = s->kv_len;
  p->head_dim = p->value_dim = s->dim;
  p->causal = s->causal;
  p->algo = CLATTN_ALGO_FUSED;
  p->q = (clattn_tensor){bq, 0, {H * M * d, M * d, d, 1}};
  p->k = (clattn_tensor){bk, 0, {Hk * N * d, N * d, d, 1}};
  p->v = (clattn_tensor){bv, 0, {Hk * N * d, N * d, d, 1}};
  p->out = (clattn_tensor){bo, 0, {H * M * d, M * d, d, 1}};
  p->lse = (clattn_tensor){bl, 0, {H * M, M, 1, 0}};
  c.bp.fwd = *p;
  c.bp.d_out = (clattn_tensor){bdo, 0, {H * M * d, M * d, d, 1}};
  c.bp.d_q = (clattn_tensor){bgq, 0, {H * M * d, M * d, d, 1}};
  c.bp.d_k = (clattn_tensor){bgk, 0, {Hk * N * d, N * d, d, 1}};
  c.bp.d_v = (clattn_tensor){bgv, 0, {Hk * N * d, N * d, d, 1}};
  double f_ms, b_ms[3], h_ms = NAN, diff = NAN;
  int f_reps, b_reps, h_reps = 0;
  cl_command_queue qu = c.queue;
  if (bb_time(run_fwd, &c, 1, max_reps, cap_ms, &f_ms, &f_reps, err, sizeof err) != 0) {
    printf("| %s |\n", err);
    goto done;
  }
  if (clEnqueueReadBuffer(qu, bo, CL_TRUE, 0, qn * 4, o, 0, NULL, NULL) ||
      clEnqueueReadBuffer(qu, bl, CL_TRUE, 0, ln * 4, lse, 0, NULL, NULL)) {
    printf("| clEnqueueReadBuffer failed |\n");
    goto done;
  }
  if (host) {
    host_bwd hb = {*s, q, k, v, o, lse, d_o, hq, hk, hv, sc, dp, dsum};
    if (bb_time(run_host, &hb, 1, max_reps, cap_ms, &h_ms, &h_reps, err, sizeof err) != 0) {
      printf("| %s |\n", err);
      goto done;
    }
  }
  /* FA2 deterministic, FA2 atomic dQ, staged: each timed, each compared with the host */
  static const struct {
    clattn_algo algo;
    int deterministic;
  } paths[3] = {{CLATTN_ALGO_FUSED, 1}, {CLATTN_ALGO_FUSED, 0}, {CLATTN_ALGO_STAGED, 1}};
  for (int w = 0; w < 3; w++) {
    c.bp.fwd.algo = paths[w].algo;
    c.bp.deterministic = paths[w].deterministic;
    if (bb_time(run_bwd, &c, 1, max_reps, cap_ms, &b_ms[w], &b_reps, err, sizeof err) != 0) {
      printf("| %s |\n", err);
      goto done;
    }
    if (clEnqueueReadBuffer(qu, bgq, CL_TRUE, 0, qn * 4, gq, 0, NULL, NULL) ||
        clEnqueueReadBuffer(qu, bgk, CL_TRUE, 0, kn * 4, gk, 0, NULL, NULL) ||
        clEnqueueReadBuffer(qu, bgv, CL_TRUE, 0, kn * 4, gv, 0, NULL, NULL)) {
      printf("| clEnqueueReadBuffer failed |\n");
      goto done;
    }
    if (host) {
      const double d = fmax(max_rel_diff(gq, hq, qn), fmax(max_rel_diff(gk, hk, kn), max_rel_diff(gv, hv, kn)));
      diff = w == 0 || !(d <= diff) ? d : diff; /* the largest; NaN sticks */
    }
  }
  const double work = (double)s->batch * H * M * N * d * (s->causal ? 0.5 : 1.0);
  char label[96];
  snprintf(label, sizeof label, "B%d H%d/%d M=%d N=%d d%d%s", s->batch, s->heads, s->kv_heads, s->q_len, s->kv_len,
           s->dim, s->causal ? " causal" : "");
  printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f |", label, f_ms, 4.0 * work / f_ms / 1e6, b_ms[0],
         10.0 * work / b_ms[0] / 1e6, b_ms[0] / f_ms, b_ms[1], b_ms[2]);
  if (host)
    printf(" %.1f | %.1f | %.2f | %.1e |\n", h_ms, 10.0 * work / h_ms / 1e6, h_ms / b_ms[0], diff);
  else
    printf(" - | - | - | - |\n");
  rc = diff > 1e-3 ? -1 : 0; /* NaN (no host run) passes */
  if (rc) printf("(device and host gradients disagree: %.3g)\n", diff);
done:;
  cl_mem bufs[] = {bq, bk, bv, bo, bl, bdo, bgq, bgk, bgv};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  float *hosts[] = {q, k, v, d_o, o, lse, gq, gk, gv, hq, hk, hv, sc, dp, dsum};
  for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) free(hosts[i]);
  return rc;
}

int bench_backward_main(int argc, char **argv) {
  int quick = 0, host = 1, max_reps = 5, n = 0;
  double cap_ms = 20e3;
  bb_shape shapes[MAX_SHAPES];
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--backward")) continue;
    if (!strcmp(a, "--quick"))
      quick = 1;
    else if (!strcmp(a, "--no-host"))
      host = 0;
    else if (!strcmp(a, "--reps") && val && atoi(val) > 0)
      max_reps = atoi(val), i++;
    else if (!strcmp(a, "--cap") && val && strtod(val, NULL) > 0)
      cap_ms = strtod(val, NULL) * 1e3, i++;
    else if (!strcmp(a, "--shape") && val && n < MAX_SHAPES) {
      bb_shape s = {1, 0, 0, 0, 0, 0, 0};
      char tail[16] = "";
      if (sscanf(val, "%d,%d,%d,%d,%d,%15s", &s.heads, &s.kv_heads, &s.q_len, &s.kv_len, &s.dim, tail) < 5 ||
          s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads || s.q_len <= 0 || s.kv_len <= 0 || s.dim <= 0) {
        fprintf(stderr, "clattn bench --backward: bad --shape %s (H,HKV,M,N,D[,causal])\n", val);
        return 2;
      }
      s.causal = !strcmp(tail, "causal");
      shapes[n++] = s;
      i++;
    } else {
      fprintf(stderr, "clattn bench --backward: unknown option %s\n%s", a, bench_backward_usage);
      return 2;
    }
  }
  if (!n) {
    const int len = quick ? 256 : 1024;
    shapes[n++] = (bb_shape){1, 8, 8, len, len, 64, 0};
    shapes[n++] = (bb_shape){1, 8, 8, len, len, 64, 1};
    shapes[n++] = (bb_shape){1, 8, 8, len, len, 128, 1};
    shapes[n++] = (bb_shape){1, 16, 4, len, len, 128, 1};
  }
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn bench --backward: cannot create a context: %s: %s\n", clattn_status_string(st),
            clattn_last_error(NULL));
    return 1;
  }
  char dev[256] = "?";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_NAME, sizeof dev - 1, dev, NULL);
  char version[64] = "", ext[8192] = "";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_VERSION, sizeof version - 1, version, NULL);
  if (clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL) != CL_SUCCESS) ext[0] = 0;
  const int native = !strncmp(version, "OpenCL 3.", 9) && strstr(ext, "cl_ext_float_atomics");
  printf("clattn bench --backward (clattn %s, f32): device %s; openblas %s, %d threads; atomic dQ by %s\n\n",
         CLATTN_VERSION_STRING, dev, bb_openblas_config(), bb_openblas_threads(),
         native ? "cl_ext_float_atomics" : "compare-and-swap");
  printf(
      "| shape | forward ms | forward GFLOP/s | FA2 backward ms | FA2 backward GFLOP/s | FA2 backward ÷ forward | "
      "FA2 atomic dQ ms | staged backward ms | host OpenBLAS backward ms | host GFLOP/s | host ÷ FA2 | "
      "max rel diff vs host |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int failures = 0;
  const double t0 = bb_now_ms();
  for (int i = 0; i < n; i++) failures += bench_shape(ctx, &shapes[i], host, max_reps, cap_ms) != 0;
  printf("\ntotal %.1f s\n", (bb_now_ms() - t0) / 1e3);
  clattn_destroy(ctx);
  return failures ? 1 : 0;
}

const char bench_backward_usage[] =
    "       clattn bench --backward [--quick] [--shape H,HKV,M,N,D[,causal]]... [--reps R] [--cap SECONDS]\n"
    "                    [--no-host]\n";
