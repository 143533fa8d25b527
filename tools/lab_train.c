/*
 * `clattn lab --train`: the routing lab's retrieval task learned by
 * gradient descent through clattn_forward and clattn_backward on the device.
 *
 * Task: N memory slots; query i is a noisy copy of the hidden key of slot
 * t_i = i mod N and should read that slot's hidden value y_i. The model's
 * keys K and values V start random and unrelated to the hidden ones; each
 * step runs the forward (O, lse), takes L = 1/(2M) Σ ||O_i − y_i||²
 * (dL/dO = (O − y) / M, on the host), runs the backward and moves Q, K and
 * V against dQ, dK and dV (plain gradient descent).
 *
 * Reported every few steps: the loss and the retrieval accuracy (O_i is
 * nearer y_i than any other hidden value; the model's slots may be any
 * permutation of the hidden ones). The first step's gradients are also checked against the fp64
 * reference (tests/kit/reference_backward.c). Asserted: that check, the loss
 * falling below a tenth of its start, accuracy at least 0.9 at the end.
 */
#include "lab_train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"
#include "reference_backward.h"

enum { M = 96, N = 32, DK = 16, DV = 8, MAX_STEPS = 100000 };

static double uni(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return (double)(*x >> 11) / 9007199254740992.0;
}

static double gauss(uint64_t *x) { return sqrt(-2.0 * log(uni(x) + 1e-300)) * cos(6.283185307179586 * uni(x)); }

static void unit_rows(float *a, int rows, int cols, uint64_t *x) {
  for (int r = 0; r < rows; r++) {
    double n = 0.0;
    for (int c = 0; c < cols; c++) {
      a[r * cols + c] = (float)gauss(x);
      n += (double)a[r * cols + c] * a[r * cols + c];
    }
    for (int c = 0; c < cols; c++) a[r * cols + c] = (float)(a[r * cols + c] / sqrt(n));
  }
}

typedef struct {
  clattn_context *ctx;
  cl_command_queue queue;
  cl_mem q, k, v, out, lse, d_out, d_q, d_k, d_v;
} bufs;

static int put(bufs *b, cl_mem m, const void *x, size_t bytes) {
  return clEnqueueWriteBuffer(b->queue, m, CL_TRUE, 0, bytes, x, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
}

static int get(bufs *b, cl_mem m, void *x, size_t bytes) {
  return clEnqueueReadBuffer(b->queue, m, CL_TRUE, 0, bytes, x, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
}

int lab_train_main(int argc, char **argv) {
  int steps = 500, every = 50;
  double lr = 5.0;
  uint64_t seed = 7;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--train")) continue;
    if (!strcmp(o, "--steps") && val && atoi(val) > 0 && atoi(val) <= MAX_STEPS) steps = atoi(val), i++;
    else if (!strcmp(o, "--lr") && val && strtod(val, NULL) > 0) lr = strtod(val, NULL), i++;
    else if (!strcmp(o, "--seed") && val && val[0] != '-') seed = strtoull(val, NULL, 10), i++;
    else {
      fprintf(stderr, "clattn lab --train: bad option %s\nusage:\n%s", o, lab_train_usage);
      return 2;
    }
  }
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  float q[M * DK], k[N * DK], v[N * DV], hk[N * DK], hv[N * DV], o[M * DV], lse[M], d_o[M * DV];
  float gq[M * DK], gk[N * DK], gv[N * DV];
  unit_rows(hk, N, DK, &x);                  /* the hidden keys */
  for (int e = 0; e < N * DV; e++) hv[e] = (float)(2.0 * uni(&x) - 1.0);
  for (int i = 0; i < M; i++)                /* query i: a noisy copy of hidden key i mod N */
    for (int d = 0; d < DK; d++) q[i * DK + d] = hk[(i % N) * DK + d] + (float)(0.1 * gauss(&x));
  unit_rows(k, N, DK, &x);                   /* the model's keys and values: unrelated to the hidden ones */
  for (int e = 0; e < N * DV; e++) v[e] = (float)(0.1 * gauss(&x));

  bufs b = {0};
  int rc = 1;
  clattn_status st = clattn_create(NULL, &b.ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn lab --train: cannot create a context: %s: %s\n", clattn_status_string(st),
            clattn_last_error(NULL));
    return 1;
  }
  b.queue = clattn_cl_queue(b.ctx);
  cl_context cx = clattn_cl_context(b.ctx);
  struct { cl_mem *m; size_t bytes; } all[] = {
      {&b.q, sizeof q}, {&b.k, sizeof k}, {&b.v, sizeof v}, {&b.out, sizeof o}, {&b.lse, sizeof lse},
{&b.d_out, sizeof d_o}, {&b.d_q, sizeof q}, {&b.d_k, sizeof k}, {&b.d_v, sizeof v}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    cl_int err = CL_SUCCESS;
    *all[i].m = clCreateBuffer(cx, CL_MEM_READ_WRITE, all[i].bytes, NULL, &err);
    if (err != CL_SUCCESS) {
      fprintf(stderr, "clattn lab --train: clCreateBuffer failed (%d)\n", err);
      goto done;
    }
  }
  clattn_params p = clattn_params_default();
  p.batch = p.q_heads = p.kv_heads = 1;
  p.q_len = M, p.kv_len = N, p.head_dim = DK, p.value_dim = DV;
  p.scale = 6.0f;                            /* sharp enough to route to one slot */
  p.algo = CLATTN_ALGO_FUSED;
  p.q = (clattn_tensor){b.q, 0, {0, 0, DK, 1}};
  p.k = (clattn_tensor){b.k, 0, {0, 0, DK, 1}};
  p.v = (clattn_tensor){b.v, 0, {0, 0, DV, 1}};
  p.out = (clattn_tensor){b.out, 0, {0, 0, DV, 1}};
  p.lse = (clattn_tensor){b.lse, 0, {0, 0, 1, 0}};
  clattn_backward_params bp = clattn_backward_params_default();
  bp.fwd = p;
  bp.d_out = (clattn_tensor){b.d_out, 0, {0, 0, DV, 1}};
  bp.d_q = (clattn_tensor){b.d_q, 0, {0, 0, DK, 1}};
  bp.d_k = (clattn_tensor){b.d_k, 0, {0, 0, DK, 1}};
  bp.d_v = (clattn_tensor){b.d_v, 0, {0, 0, DV, 1}};

  printf("clattn lab --train: %d queries, %d slots, dk %d, dv %d, scale %.1f, lr %g, %d steps (seed %llu)\n", M, N,
         DK, DV, (double)p.scale, lr, steps, (unsigned long long)seed);
  printf("%6s %12s %10s\n", "step", "loss", "accuracy");
  double loss0 = NAN, loss = NAN, acc = 0.0, grad_err = NAN;
  for (int s = 0; s <= steps; s++) {
    if (put(&b, b.q, q, sizeof q) || put(&b, b.k, k, sizeof k) || put(&b, b.v, v, sizeof v)) goto io;
    if ((st = clattn_forward(b.ctx, &p, 0, NULL, NULL)) != CLATTN_OK) goto api;
    if (get(&b, b.out, o, sizeof o)) goto io;
    loss = 0.0;
    int hits = 0;
    for (int i = 0; i < M; i++) {
      /* a hit: O_i is nearer its target than any other hidden value */
      int near = -1;
      double best = INFINITY;
      for (int u = 0; u < N; u++) {
        double dist = 0.0;
        for (int c = 0; c < DV; c++) dist += pow((double)o[i * DV + c] - hv[u * DV + c], 2.0);
        if (dist < best) best = dist, near = u;
      }
      hits += near == i % N;
      for (int c = 0; c < DV; c++) {
        const double e = (double)o[i * DV + c] - hv[(i % N) * DV + c];
        d_o[i * DV + c] = (float)(e / M);
        loss += 0.5 * e * e / M;
      }
    }
    acc = (double)hits / M;
    if (s == 0) loss0 = loss;
    if (s % every == 0 || s == steps) printf("%6d %12.6f %10.3f\n", s, loss, acc);
    if (s == steps) break;
    if (put(&b, b.d_out, d_o, sizeof d_o)) goto io;
    if ((st = clattn_backward(b.ctx, &bp, 0, NULL, NULL)) != CLATTN_OK) goto api;
    if (get(&b, b.d_q, gq, sizeof gq) || get(&b, b.d_k, gk, sizeof gk) || get(&b, b.d_v, gv, sizeof gv)) goto io;
    if (s == 0) {   /* the first step's gradients against the fp64 reference */
      double dout[M * DV], rq[M * DK], rk[N * DK], rv[N * DV];
      for (int e = 0; e < M * DV; e++) dout[e] = d_o[e];
      ref_inputs in = {.q = q, .k = k, .v = v};
      ref_grads g = {rq, rk, rv, NULL, NULL};
      double num = 0.0, den = 0.0;
      if (ref_backward(&p, &in, dout, &g) == 0) {
        for (int e = 0; e < M * DK; e++) num += (gq[e] - rq[e]) * (gq[e] - rq[e]), den += rq[e] * rq[e];
        for (int e = 0; e < N * DK; e++) num += (gk[e] - rk[e]) * (gk[e] - rk[e]), den += rk[e] * rk[e];
        for (int e = 0; e < N * DV; e++) num += (gv[e] - rv[e]) * (gv[e] - rv[e]), den += rv[e] * rv[e];
        grad_err = sqrt(num / (den > 0.0 ? den : 1.0));
      }
    }
    for (int e = 0; e < M * DK; e++) q[e] -= (float)(lr * gq[e]);
    for (int e = 0; e < N * DK; e++) k[e] -= (float)(lr * gk[e]);
    for (int e = 0; e < N * DV; e++) v[e] -= (float)(lr * gv[e]);
  }
  const int grad_ok = grad_err <= 1e-4, loss_ok = loss < 0.1 * loss0, acc_ok = acc >= 0.9;
  printf("first step's dQ, dK, dV vs the fp64 reference: relative error %.2e (%s)\n", grad_err, grad_ok ? "ok" : "FAIL");
  printf("loss %.6f -> %.6f (%s: below a tenth), retrieval accuracy %.3f (%s: at least 0.9)\n", loss0, loss,
         loss_ok ? "ok" : "FAIL", acc, acc_ok ? "ok" : "FAIL");
  rc = grad_ok && loss_ok && acc_ok ? 0 : 1;
  goto done;
api:
  fprintf(stderr, "clattn lab --train: %s: %s\n", clattn_status_string(st), clattn_last_error(b.ctx));
  goto done;
io:
  fprintf(stderr, "clattn lab --train: a buffer read or write failed\n");
done:
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (*all[i].m) clReleaseMemObject(*all[i].m);
  clattn_destroy(b.ctx);
  return rc;
}

const char lab_train_usage[] = "       clattn lab --train [--steps S] [--lr LR] [--seed S]\n";
