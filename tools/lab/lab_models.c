/*
 * The models of `clattn lab --train` (lab_models.h): the attention family on
 * the device (CLBlast projections, clattn_forward/backward for the read), the
 * readout, the MLP and Adam on the host. Every device call is synchronous
 * (each waits for its event): the sizes are small and the order is then plain.
 */
#include "lab_models.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <clblast_c.h>

#include "clattn.h"
#include "reference_backward.h"

const char *const model_name[MODEL_KINDS] = {"attention", "uniform (scale 0)", "fixed random routing",
                                             "MLP, mean-pooled"};
const char *const intervention_name[INTV_KINDS] = {"none", "paired permutation", "key shuffle", "value shuffle",
                                                   "ablation of the matching key"};

enum {
  QKV = 2 * DK + DV,     /* columns of the projection [Wq | Wk | Wv] and of its output */
  ROWS = CHUNK * TASK_T, /* tokens of one chunk */
  W_PROJ = TASK_D * QKV, /* attention parameters: the projection, then the readout R, rb */
  W_READ = W_PROJ,
  W_ATTN = W_PROJ + DV * TASK_CLASSES + TASK_CLASSES,
  M_W1 = 0, /* MLP parameters: W1, b1, W2, b2 */
  M_B1 = TASK_D * MLP_HIDDEN,
  M_W2 = M_B1 + MLP_HIDDEN,
  M_B2 = M_W2 + MLP_HIDDEN * TASK_CLASSES,
  W_MLP = M_B2 + TASK_CLASSES
};

struct lab_device {
  clattn_context *ctx;
  cl_command_queue queue;
  char name[128];
  cl_mem x, w, qkv, out, lse, d_out, d_q, d_k, d_v, d_w, mask, argmax, max_weight;
};

typedef struct {           /* the route of one read, per sequence */
  int key_at[CHUNK];       /* where the query's matching key is after the intervention; -1: removed */
  cl_int argmax[CHUNK];    /* the top-weighted key (clattn's route diagnostics) */
  float max_weight[CHUNK]; /* its weight */
} read_route;

/* ---- the device ---- */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes the message into err; returns -1. */
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

int lab_device_open(lab_device **out, char *err, size_t errlen) {
  lab_device *d = calloc(1, sizeof *d);
  if (!d) return fail(err, errlen, "out of host memory");
  clattn_status st = clattn_create(NULL, &d->ctx);
  if (st != CLATTN_OK) {
    fail(err, errlen, "cannot create a context: %s: %s", clattn_status_string(st), clattn_last_error(NULL));
    return free(d), -1;
  }
  d->queue = clattn_cl_queue(d->ctx);
  if (clGetDeviceInfo(clattn_cl_device(d->ctx), CL_DEVICE_NAME, sizeof d->name, d->name, NULL) != CL_SUCCESS)
    snprintf(d->name, sizeof d->name, "?");
  struct {
    cl_mem *m;
    size_t bytes;
  } all[] = {{&d->x, sizeof(float) * ROWS * TASK_D},
             {&d->w, sizeof(float) * W_PROJ},
             {&d->qkv, sizeof(float) * ROWS * QKV},
             {&d->out, sizeof(float) * CHUNK * DV},
             {&d->lse, sizeof(float) * CHUNK},
             {&d->d_out, sizeof(float) * CHUNK * DV},
             {&d->d_q, sizeof(float) * CHUNK * DK},
             {&d->d_k, sizeof(float) * ROWS * DK},
             {&d->d_v, sizeof(float) * ROWS * DV},
             {&d->d_w, sizeof(float) * W_PROJ},
             {&d->mask, ROWS},
             {&d->argmax, sizeof(cl_int) * CHUNK},
             {&d->max_weight, sizeof(float) * CHUNK}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    cl_int e = CL_SUCCESS;
    *all[i].m = clCreateBuffer(clattn_cl_context(d->ctx), CL_MEM_READ_WRITE, all[i].bytes, NULL, &e);
    if (e != CL_SUCCESS) {
      fail(err, errlen, "clCreateBuffer(%zu bytes) failed: OpenCL error %d", all[i].bytes, (int)e);
      return lab_device_close(d), -1;
    }
  }
  *out = d;
  return 0;
}

void lab_device_close(lab_device *d) {
  if (!d) return;
  cl_mem all[] = {d->x,   d->w,   d->qkv, d->out,  d->lse,    d->d_out,     d->d_q,
                  d->d_k, d->d_v, d->d_w, d->mask, d->argmax, d->max_weight};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  clattn_destroy(d->ctx);
  free(d);
}

const char *lab_device_name(const lab_device *d) { return d->name; }

static int put(lab_device *d, cl_mem m, const void *x, size_t bytes, const char *what, char *err, size_t errlen) {
  const cl_int e = clEnqueueWriteBuffer(d->queue, m, CL_TRUE, 0, bytes, x, 0, NULL, NULL);
  return e == CL_SUCCESS ? 0 : fail(err, errlen, "clEnqueueWriteBuffer(%s) failed: OpenCL error %d", what, (int)e);
}

static int get(lab_device *d, cl_mem m, void *x, size_t bytes, const char *what, char *err, size_t errlen) {
  const cl_int e = clEnqueueReadBuffer(d->queue, m, CL_TRUE, 0, bytes, x, 0, NULL, NULL);
  return e == CL_SUCCESS ? 0 : fail(err, errlen, "clEnqueueReadBuffer(%s) failed: OpenCL error %d", what, (int)e);
}

static int finish(cl_event ev, const char *what, char *err, size_t errlen) {
  const cl_int e = clWaitForEvents(1, &ev);
  clReleaseEvent(ev);
  return e == CL_SUCCESS ? 0 : fail(err, errlen, "%s: clWaitForEvents failed: OpenCL error %d", what, (int)e);
}

/* C (m x n, at c_off, ldc) = op(A) B, row-major; op(A) = Aᵀ when a_trans (A stored k x m). */
static int sgemm(lab_device *d, int a_trans, size_t m, size_t n, size_t k, cl_mem a, size_t a_off, size_t a_ld,
                 cl_mem b, size_t b_ld, cl_mem c, size_t c_off, size_t c_ld, const char *what, char *err,
                 size_t errlen) {
  cl_event ev = NULL;
  const CLBlastStatusCode code =
      CLBlastSgemm(CLBlastLayoutRowMajor, a_trans ? CLBlastTransposeYes : CLBlastTransposeNo, CLBlastTransposeNo, m, n,
                   k, 1.0f, a, a_off, a_ld, b, 0, b_ld, 0.0f, c, c_off, c_ld, &d->queue, &ev);
  if (code != CLBlastSuccess) return fail(err, errlen, "CLBlastSgemm(%s) failed: CLBlast status %d", what, (int)code);
  return finish(ev, what, err, errlen);
}

/* The read of nb sequences' query tokens as clattn takes it: Q, K, V are
 * column blocks of the projection's output (row stride QKV); route: with
 * the top key and its weight per row. */
static clattn_params read_params(lab_device *d, int nb, float scale, int masked, int route) {
  clattn_params p = clattn_params_default();
  p.batch = nb, p.q_heads = p.kv_heads = 1;
  p.q_len = 1, p.kv_len = TASK_T, p.head_dim = DK, p.value_dim = DV;
  p.scale = scale;
  p.algo = CLATTN_ALGO_FUSED;
  p.q = (clattn_tensor){d->qkv, TASK_PAIRS * QKV, {TASK_T * QKV, 0, QKV, 1}}; /* the query token's row */
  p.k = (clattn_tensor){d->qkv, DK, {TASK_T * QKV, 0, QKV, 1}};
  p.v = (clattn_tensor){d->qkv, 2 * DK, {TASK_T * QKV, 0, QKV, 1}};
  p.out = (clattn_tensor){d->out, 0, {DV, DV, DV, 1}};
  p.lse = (clattn_tensor){d->lse, 0, {1, 1, 1, 0}};
  if (masked) p.mask = (clattn_tensor){d->mask, 0, {TASK_T, 0, TASK_T, 1}};
  if (route) {
    p.argmax = (clattn_tensor){d->argmax, 0, {1, 1, 1, 0}};
    p.max_weight = (clattn_tensor){d->max_weight, 0, {1, 1, 1, 0}};
  }
  return p;
}

static float model_scale(const model *m) { return m->kind == MODEL_UNIFORM ? 0.0f : (float)(1.0 / sqrt((double)DK)); }

/* After a clattn call: its status, then its event (done) waited for. */
static int call(lab_device *d, clattn_status st, cl_event done, const char *what, char *err, size_t errlen) {
  if (st != CLATTN_OK)
    return fail(err, errlen, "%s: %s: %s", what, clattn_status_string(st), clattn_last_error(d->ctx));
  return finish(done, what, err, errlen);
}

/* Rotates columns [c0, c1) of the pair tokens' rows of one sequence by
 * shift positions: pair j gets pair (j + shift) mod TASK_PAIRS's. */
static void rotate_pairs(float *seq, int c0, int c1, int shift) {
  float tmp[TASK_PAIRS][QKV];
  for (int j = 0; j < TASK_PAIRS; j++) memcpy(tmp[j], seq + (size_t)j * QKV, sizeof tmp[j]);
  for (int j = 0; j < TASK_PAIRS; j++)
    for (int c = c0; c < c1; c++) seq[(size_t)j * QKV + c] = tmp[(j + shift) % TASK_PAIRS][c];
}

/* The attention family's forward for nb sequences from x (and match, for
 * the ablation): projection, intervention, read; o receives the query
 * tokens' outputs [nb, DV]; qkv_host (non-NULL) the projection as read;
 * route (non-NULL) the route. */
static int attention_read(const model *m, lab_device *d, const float *x, const int *match, int nb, intervention intv,
                          uint64_t *rng, float *o, float *qkv_host, read_route *route, char *err, size_t errlen) {
  const size_t rows = (size_t)nb * TASK_T;
  if (route)
    for (int b = 0; b < nb; b++) route->key_at[b] = intv == INTV_ABLATE ? -1 : match[b];
  if (put(d, d->x, x, rows * TASK_D * sizeof *x, "tokens", err, errlen) ||
      put(d, d->w, m->w, W_PROJ * sizeof *m->w, "projection", err, errlen) ||
      sgemm(d, 0, rows, QKV, TASK_D, d->x, 0, TASK_D, d->w, QKV, d->qkv, 0, QKV, "[Q K V] = X [Wq Wk Wv]", err, errlen))
    return -1;
  const int shuffle = intv == INTV_PAIRED || intv == INTV_KEY_SHUFFLE || intv == INTV_VALUE_SHUFFLE;
  if (shuffle || qkv_host) {
    float *h = qkv_host ? qkv_host : malloc(rows * QKV * sizeof *h);
    if (!h) return fail(err, errlen, "out of host memory");
    int rc = get(d, d->qkv, h, rows * QKV * sizeof *h, "Q K V", err, errlen);
    if (!rc && shuffle) {
      const int c0 = intv == INTV_VALUE_SHUFFLE ? 2 * DK : DK, c1 = intv == INTV_KEY_SHUFFLE ? 2 * DK : QKV;
      for (int b = 0; b < nb; b++) {
        const int shift = 1 + (int)(task_rng(rng) % (TASK_PAIRS - 1));
        rotate_pairs(h + (size_t)b * TASK_T * QKV, c0, c1, shift);
        if (route && intv != INTV_VALUE_SHUFFLE) route->key_at[b] = (match[b] - shift + TASK_PAIRS) % TASK_PAIRS;
      }
      rc = put(d, d->qkv, h, rows * QKV * sizeof *h, "Q K V", err, errlen);
    }
    if (!qkv_host) free(h);
    if (rc) return -1;
  }
  if (intv == INTV_ABLATE) {
    unsigned char mask[ROWS];
    memset(mask, 1, rows);
    for (int b = 0; b < nb; b++) mask[b * TASK_T + match[b]] = 0;
    if (put(d, d->mask, mask, rows, "mask", err, errlen)) return -1;
  }
  const clattn_params p = read_params(d, nb, model_scale(m), intv == INTV_ABLATE, route != NULL);
  cl_event ev = NULL;
  const clattn_status st = clattn_forward(d->ctx, &p, 0, NULL, &ev);
  if (call(d, st, ev, "clattn_forward", err, errlen)) return -1;
  if (route) {
    if (get(d, d->argmax, route->argmax, (size_t)nb * sizeof *route->argmax, "argmax", err, errlen) ||
        get(d, d->max_weight, route->max_weight, (size_t)nb * sizeof *route->max_weight, "max_weight", err, errlen))
      return -1;
  }
  return get(d, d->out, o, (size_t)nb * DV * sizeof *o, "O", err, errlen);
}

/* ---- readout, MLP, Adam (host) ---- */

/* logits = h R + rb for nb rows of width in; returns the mean cross-entropy
 * and counts the rows whose largest logit is the label's; d_logits
 * (non-NULL) receives dL/dlogits = (softmax - onehot) / nb. */
static double readout(const float *r, const float *rb, const float *h, int in, int nb, const int *label,
                      double *d_logits, int *correct) {
  double loss = 0.0;
  for (int b = 0; b < nb; b++) {
    double z[TASK_CLASSES], top = -INFINITY, sum = 0.0;
    int best = 0;
    for (int c = 0; c < TASK_CLASSES; c++) {
      z[c] = rb[c];
      for (int i = 0; i < in; i++) z[c] += (double)h[b * in + i] * r[i * TASK_CLASSES + c];
      if (z[c] > top) top = z[c], best = c;
    }
    for (int c = 0; c < TASK_CLASSES; c++) sum += exp(z[c] - top);
    loss += log(sum) + top - z[label[b]];
    *correct += best == label[b];
    if (d_logits)
      for (int c = 0; c < TASK_CLASSES; c++)
        d_logits[b * TASK_CLASSES + c] = (exp(z[c] - top) / sum - (c == label[b])) / nb;
  }
  return loss / nb;
}

/* The readout's gradients into gr, grb, and dL/dh into d_h (non-NULL). */
static void readout_backward(const float *r, const float *h, int in, int nb, const double *d_logits, float *gr,
                             float *grb, double *d_h) {
  for (int i = 0; i < in; i++)
    for (int c = 0; c < TASK_CLASSES; c++) {
      double s = 0.0;
      for (int b = 0; b < nb; b++) s += (double)h[b * in + i] * d_logits[b * TASK_CLASSES + c];
      gr[i * TASK_CLASSES + c] = (float)s;
    }
  for (int c = 0; c < TASK_CLASSES; c++) {
    double s = 0.0;
    for (int b = 0; b < nb; b++) s += d_logits[b * TASK_CLASSES + c];
    grb[c] = (float)s;
  }
  if (d_h)
    for (int b = 0; b < nb; b++)
      for (int i = 0; i < in; i++) {
        double s = 0.0;
        for (int c = 0; c < TASK_CLASSES; c++) s += d_logits[b * TASK_CLASSES + c] * r[i * TASK_CLASSES + c];
        d_h[b * in + i] = s;
      }
}

/* The MLP's hidden layer for nb sequences: x̄ (mean token) and relu(x̄ W1 + b1). */
static void mlp_hidden(const model *m, const float *x, int nb, float *mean, float *h) {
  for (int b = 0; b < nb; b++) {
    for (int c = 0; c < TASK_D; c++) {
      double s = 0.0;
      for (int t = 0; t < TASK_T; t++) s += x[((size_t)b * TASK_T + t) * TASK_D + c];
      mean[b * TASK_D + c] = (float)(s / TASK_T);
    }
    for (int j = 0; j < MLP_HIDDEN; j++) {
      double s = m->w[M_B1 + j];
      for (int c = 0; c < TASK_D; c++) s += (double)mean[b * TASK_D + c] * m->w[M_W1 + c * MLP_HIDDEN + j];
      h[b * MLP_HIDDEN + j] = s > 0.0 ? (float)s : 0.0f;
    }
  }
}

static void adam(model *m, double lr) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  m->t++;
  const double c1 = 1.0 - pow(b1, (double)m->t), c2 = 1.0 - pow(b2, (double)m->t);
  for (int i = 0; i < m->n_params; i++) {
    if (!m->trained[i]) continue;
    m->m[i] = b1 * m->m[i] + (1.0 - b1) * m->g[i];
    m->v[i] = b2 * m->v[i] + (1.0 - b2) * (double)m->g[i] * m->g[i];
    m->w[i] -= (float)(lr * (m->m[i] / c1) / (sqrt(m->v[i] / c2) + eps));
  }
}

/* ---- models ---- */

int model_init(model *m, model_kind kind, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->kind = kind;
  m->n_params = kind == MODEL_MLP ? W_MLP : W_ATTN;
  m->w = calloc((size_t)m->n_params, sizeof *m->w);
  m->g = calloc((size_t)m->n_params, sizeof *m->g);
  m->m = calloc((size_t)m->n_params, sizeof *m->m);
  m->v = calloc((size_t)m->n_params, sizeof *m->v);
  m->trained = malloc((size_t)m->n_params);
  if (!m->w || !m->g || !m->m || !m->v || !m->trained) return model_free(m), -1;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)kind;
  memset(m->trained, 1, (size_t)m->n_params);
  if (kind == MODEL_MLP) {
    for (int i = M_W1; i < M_B1; i++) m->w[i] = (float)(sqrt(2.0 / TASK_D) * task_gauss(&s));
    for (int i = M_W2; i < M_B2; i++) m->w[i] = (float)(task_gauss(&s) / sqrt((double)MLP_HIDDEN));
  } else {
    for (int i = 0; i < W_PROJ; i++) m->w[i] = (float)(task_gauss(&s) / sqrt((double)TASK_D));
    for (int i = W_READ; i < W_READ + DV * TASK_CLASSES; i++) m->w[i] = (float)(task_gauss(&s) / sqrt((double)DV));
    if (kind != MODEL_ATTENTION) /* Wq, Wk: frozen (fixed) or without effect (uniform) */
      for (int r = 0; r < TASK_D; r++) memset(m->trained + r * QKV, 0, 2 * DK);
  }
  for (int i = 0; i < m->n_params; i++) m->n_trained += m->trained[i];
  return 0;
}

void model_free(model *m) {
  free(m->w);
  free(m->g);
  free(m->m);
  free(m->v);
  free(m->trained);
  memset(m, 0, sizeof *m);
}

static double rel_error(const float *got, const double *want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return sqrt(num / (den > 0.0 ? den : 1.0));
}

/* The gradient check of one attention step (after its backward): dQ, dK,
 * dV against ref_backward; d_w (CLBlast's Xᵀ dQKV) against Xᵀ times those. */
static int check_gradients(lab_device *d, const clattn_params *p, const float *x, int nb, const float *qkv,
                           const float *d_o, const float *d_w, grad_check *out, char *err, size_t errlen) {
  const size_t rows = (size_t)nb * TASK_T;
  float *gq = malloc((size_t)nb * DK * sizeof *gq), *gk = malloc(rows * DK * sizeof *gk),
        *gv = malloc(rows * DV * sizeof *gv);
  double *rq = malloc((size_t)nb * DK * sizeof *rq), *rk = malloc(rows * DK * sizeof *rk),
         *rv = malloc(rows * DV * sizeof *rv), *dout = malloc((size_t)nb * DV * sizeof *dout),
         *rw = calloc(W_PROJ, sizeof *rw);
  int rc = -1;
  if (!gq || !gk || !gv || !rq || !rk || !rv || !dout || !rw) {
    fail(err, errlen, "out of host memory");
    goto done;
  }
  if (get(d, d->d_q, gq, (size_t)nb * DK * sizeof *gq, "dQ", err, errlen) ||
      get(d, d->d_k, gk, rows * DK * sizeof *gk, "dK", err, errlen) ||
      get(d, d->d_v, gv, rows * DV * sizeof *gv, "dV", err, errlen))
    goto done;
  for (int i = 0; i < nb * DV; i++) dout[i] = d_o[i];
  const ref_inputs in = {.q = qkv, .k = qkv, .v = qkv};
  ref_grads g = {rq, rk, rv, NULL, NULL, NULL};
  if (ref_backward(p, &in, dout, &g) != 0) {
    fail(err, errlen, "the fp64 reference cannot run these params");
    goto done;
  }
  double num = 0.0, den = 0.0;
  const struct {
    const float *got;
    const double *want;
    size_t n;
  } parts[] = {{gq, rq, (size_t)nb * DK}, {gk, rk, rows * DK}, {gv, rv, rows * DV}};
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < parts[k].n; i++) {
      const double e = parts[k].got[i] - parts[k].want[i];
      num += e * e, den += parts[k].want[i] * parts[k].want[i];
    }
  out->attention = sqrt(num / (den > 0.0 ? den : 1.0));
  for (size_t row = 0; row < rows; row++) { /* dW = Xᵀ [dQ dK dV] in fp64; dQ only on query rows */
    const int b = (int)(row / TASK_T), t = (int)(row % TASK_T);
    for (int c = 0; c < QKV; c++) {
      const double dr = c < DK       ? (t == TASK_PAIRS ? rq[b * DK + c] : 0.0)
                        : c < 2 * DK ? rk[row * DK + (c - DK)]
                                     : rv[row * DV + (c - 2 * DK)];
      for (int e = 0; e < TASK_D; e++) rw[e * QKV + c] += (double)x[row * TASK_D + e] * dr;
    }
  }
  out->projection = rel_error(d_w, rw, W_PROJ);
  rc = 0;
done:
  free(gq), free(gk), free(gv), free(rq), free(rk), free(rv), free(dout), free(rw);
  return rc;
}

static int attention_step(model *m, lab_device *d, const task_set *s, double *loss, grad_check *check, char *err,
                          size_t errlen) {
  const int nb = s->n;
  const size_t rows = (size_t)nb * TASK_T;
  float o[CHUNK * DV], d_o[CHUNK * DV];
  double d_logits[CHUNK * TASK_CLASSES], d_h[CHUNK * DV];
  float *qkv = check ? malloc(rows * QKV * sizeof *qkv) : NULL;
  if (check && !qkv) return fail(err, errlen, "out of host memory");
  int rc = -1, correct = 0;
  if (attention_read(m, d, s->x, s->match, nb, INTV_NONE, NULL, o, qkv, NULL, err, errlen)) goto done;
  float *r = m->w + W_READ, *rb = r + DV * TASK_CLASSES;
  *loss = readout(r, rb, o, DV, nb, s->label, d_logits, &correct);
  readout_backward(r, o, DV, nb, d_logits, m->g + W_READ, m->g + W_READ + DV * TASK_CLASSES, d_h);
  for (int i = 0; i < nb * DV; i++) d_o[i] = (float)d_h[i];
  clattn_backward_params bp = clattn_backward_params_default();
  bp.fwd = read_params(d, nb, model_scale(m), 0, 0);
  bp.d_out = (clattn_tensor){d->d_out, 0, {DV, DV, DV, 1}};
  bp.d_q = (clattn_tensor){d->d_q, 0, {DK, DK, DK, 1}};
  bp.d_k = (clattn_tensor){d->d_k, 0, {TASK_T * DK, TASK_T * DK, DK, 1}};
  bp.d_v = (clattn_tensor){d->d_v, 0, {TASK_T * DV, TASK_T * DV, DV, 1}};
  if (put(d, d->d_out, d_o, (size_t)nb * DV * sizeof *d_o, "dO", err, errlen)) goto done;
  cl_event ev = NULL;
  const clattn_status st = clattn_backward(d->ctx, &bp, 0, NULL, &ev);
  if (call(d, st, ev, "clattn_backward", err, errlen)) goto done;
  /* dWv = Xᵀ dV and dWk = Xᵀ dK over every token, dWq = Xᵀ dQ over the query tokens (rows TASK_T apart) */
  if (sgemm(d, 1, TASK_D, DV, rows, d->x, 0, TASK_D, d->d_v, DV, d->d_w, 2 * DK, QKV, "dWv = Xᵀ dV", err, errlen))
    goto done;
  if (m->kind == MODEL_ATTENTION &&
      (sgemm(d, 1, TASK_D, DK, rows, d->x, 0, TASK_D, d->d_k, DK, d->d_w, DK, QKV, "dWk = Xᵀ dK", err, errlen) ||
       sgemm(d, 1, TASK_D, DK, (size_t)nb, d->x, TASK_PAIRS * TASK_D, TASK_T * TASK_D, d->d_q, DK, d->d_w, 0, QKV,
             "dWq = Xᵀ dQ", err, errlen)))
    goto done;
  if (get(d, d->d_w, m->g, W_PROJ * sizeof *m->g, "dW", err, errlen)) goto done;
  if (check && check_gradients(d, &bp.fwd, s->x, nb, qkv, d_o, m->g, check, err, errlen)) goto done;
  for (int i = 0; i < W_PROJ; i++)
    if (!m->trained[i]) m->g[i] = 0.0f; /* columns no GEMM wrote this step */
  rc = 0;
done:
  free(qkv);
  return rc;
}

static void mlp_step(model *m, const task_set *s, double *loss) {
  const int nb = s->n;
  float mean[CHUNK * TASK_D], h[CHUNK * MLP_HIDDEN];
  double d_logits[CHUNK * TASK_CLASSES], d_h[CHUNK * MLP_HIDDEN];
  int correct = 0;
  mlp_hidden(m, s->x, nb, mean, h);
  *loss = readout(m->w + M_W2, m->w + M_B2, h, MLP_HIDDEN, nb, s->label, d_logits, &correct);
  readout_backward(m->w + M_W2, h, MLP_HIDDEN, nb, d_logits, m->g + M_W2, m->g + M_B2, d_h);
  for (int j = 0; j < MLP_HIDDEN; j++) {
    double gb = 0.0;
    for (int b = 0; b < nb; b++)
      if (h[b * MLP_HIDDEN + j] > 0.0f) gb += d_h[b * MLP_HIDDEN + j];
    m->g[M_B1 + j] = (float)gb;
    for (int c = 0; c < TASK_D; c++) {
      double gw = 0.0;
      for (int b = 0; b < nb; b++)
        if (h[b * MLP_HIDDEN + j] > 0.0f) gw += (double)mean[b * TASK_D + c] * d_h[b * MLP_HIDDEN + j];
      m->g[M_W1 + c * MLP_HIDDEN + j] = (float)gw;
    }
  }
}

int model_step(model *m, lab_device *d, const task_set *batch, double lr, double *loss, grad_check *check, char *err,
               size_t errlen) {
  if (batch->n < 1 || batch->n > CHUNK) return fail(err, errlen, "a batch of %d sequences (1 to %d)", batch->n, CHUNK);
  if (check && m->kind != MODEL_ATTENTION) return fail(err, errlen, "the gradient check is the attention model's");
  if (m->kind == MODEL_MLP)
    mlp_step(m, batch, loss);
  else if (attention_step(m, d, batch, loss, check, err, errlen))
    return -1;
  adam(m, lr);
  return 0;
}

int model_accuracy(const model *m, lab_device *d, const task_set *s, intervention intv, uint64_t seed, double *acc,
                   route_summary *route, char *err, size_t errlen) {
  if ((intv != INTV_NONE || route) && m->kind == MODEL_MLP)
    return fail(err, errlen, "interventions and routes are the attention models'");
  int correct = 0, to_key = 0;
  double weight = 0.0;
  for (int b0 = 0; b0 < s->n; b0 += CHUNK) {
    const int nb = s->n - b0 < CHUNK ? s->n - b0 : CHUNK;
    const float *x = s->x + (size_t)b0 * TASK_T * TASK_D;
    if (m->kind == MODEL_MLP) {
      float mean[CHUNK * TASK_D], h[CHUNK * MLP_HIDDEN];
      mlp_hidden(m, x, nb, mean, h);
      readout(m->w + M_W2, m->w + M_B2, h, MLP_HIDDEN, nb, s->label + b0, NULL, &correct);
    } else {
      float o[CHUNK * DV];
      read_route r;
      if (attention_read(m, d, x, s->match + b0, nb, intv, &seed, o, NULL, route ? &r : NULL, err, errlen)) return -1;
      for (int b = 0; b < nb && route; b++) to_key += r.argmax[b] == r.key_at[b], weight += r.max_weight[b];
      readout(m->w + W_READ, m->w + W_READ + DV * TASK_CLASSES, o, DV, nb, s->label + b0, NULL, &correct);
    }
  }
  *acc = (double)correct / s->n;
  if (route) route->to_key = (double)to_key / s->n, route->max_weight = weight / s->n;
  return 0;
}
