/*
 * `clattn lab`: the seeds' routing laboratory, run on the chosen device
 * (clattn_create(NULL): env CLATTN_DEVICE, else the first GPU, else the first
 * device) through the public API, every read with CLATTN_ALGO_STAGED because
 * every read asks for the routing matrix.
 *
 * Part 1 reproduces the seeds' worked examples with their numbers (positive
 * read, paired permutation, key collision, two routes with one output, the
 * uniform-mean negative control, the structural mask, the memory-interface
 * read 17.04). The seeds print rounded values, so the comparison is absolute,
 * within half a unit of the last printed digit plus float error.
 *
 * Part 2 is the seeds' "how to extend the experiment": a synthetic retrieval
 * task (random unit keys, each query a noisy copy of one target key, random
 * values) and interventions on it — paired permutation, key shuffle, value
 * shuffle, ablation of the top route, near-duplicate keys with contradictory
 * values — each with output change, error against the target value, route
 * entropy, max weight and how often the top route reaches the target value.
 *
 * Every read is also checked against the fp64 reference, and the library's
 * route diagnostics (entropy, max_weight, argmax outputs) against the same
 * quantities computed here from its weights output (check_diagnostics).
 */
#include "lab.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"
#include "heatmap.h"
#include "lab_train.h"
#include "problem.h"
#include "worked.h"

const char lab_usage[] =
    "       clattn lab [--json] [--heatmap FILE.png] [--seed S]\n"
    "       clattn lab --train [--quick] [--seeds N] [--steps S] [--lr LR] [--seed S]\n"
    "                          [--plot FILE.png]\n";

#define SEED_TOL    1e-3 /* seeds' numbers printed to 3 decimals */
#define DIAG_TOL    1e-4 /* library diagnostics vs the same from its weights */
#define REF_TOL     1e-5 /* error against fp64 (ref_error) */
#define MAX_VEC     4
#define MAX_CHECKS  16
#define MAX_METRICS 10
#define MAX_ASSERTS 4
#define MAX_INTV    8

/* ---- results ---- */

typedef struct { /* one compared quantity of a check */
  const char *label;
  int n;
  double expected[4], got[4], tol;
} lab_vec;

typedef struct {
  const char *name;
  lab_vec vec[MAX_VEC];
  int n_vec, pass;
} lab_check;

typedef struct {
  const char *name, *what; /* what the intervention does */
  struct {
    const char *key;
    double val;
  } metric[MAX_METRICS];
  int n_metric;
  struct {
    char text[160];
    int pass;
  } assert_[MAX_ASSERTS];
  int n_assert, pass;
  double per_row[2][16]; /* ablation: removed weight, output change per row */
  int n_rows;
} lab_intv;

typedef struct {
  clattn_context *ctx;
  uint64_t seed;
  lab_check checks[MAX_CHECKS];
  int n_checks;
  lab_intv intv[MAX_INTV];
  int n_intv;
  /* run-level tallies over every read */
  int runs, ref_fail, diag_fail, diag_argmax_fail;
  double ref_worst, diag_worst;
  char diag_first[200], ref_first[400];
  int harness_failed;
} lab;

/* ---- one attention read through the public API ---- */

typedef struct { /* dense inputs of one head, one batch row */
  int m, n, dk, dv;
  const float *q, *k, *v;    /* [m,dk] [n,dk] [n,dv] */
  const unsigned char *mask; /* [m,n], NULL = everything allowed */
  float scale;               /* NAN = 1/sqrt(dk) */
} lab_input;

typedef struct {
  int m, n, dv;
  float *out, *w;               /* [m,dv] [m,n] read back */
  float *lib_entropy, *lib_max; /* [m] the library's diagnostics */
  int32_t *lib_argmax;
  double *entropy, *max_w; /* [m] the same, from w */
  int *argmax;
} lab_read;

static void read_free(lab_read *r) {
  free(r->out);
  free(r->w);
  free(r->lib_entropy);
  free(r->lib_max);
  free(r->lib_argmax);
  free(r->entropy);
  free(r->max_w);
  free(r->argmax);
  memset(r, 0, sizeof *r);
}

/* Entropy (nats), max weight and argmax (lowest index on ties) of each row of
 * w: what the library's diagnostics must equal. */
static void stats_from_weights(lab_read *r) {
  for (int i = 0; i < r->m; i++) {
    const float *a = r->w + (size_t)i * r->n;
    double h = 0, best = -1;
    int arg = -1;
    for (int j = 0; j < r->n; j++) {
      if (a[j] > 0) h -= a[j] * log((double)a[j]);
      if (a[j] > best) best = a[j], arg = j;
    }
    r->entropy[i] = h;
    r->max_w[i] = arg < 0 || best <= 0 ? 0 : best;
    r->argmax[i] = best <= 0 ? -1 : arg;
  }
}

/* The one assertion on the library's route diagnostics: entropy and
 * max_weight within DIAG_TOL of the values computed from its own weights,
 * argmax the same key (or a key of equal weight). Tallied over every read;
 * unwritten outputs (still the NaN / -7 written before the call) fail it. */
static void check_diagnostics(lab *L, const char *run, const lab_read *r) {
  for (int i = 0; i < r->m; i++) {
    double de = fabs(r->lib_entropy[i] - r->entropy[i]), dm = fabs(r->lib_max[i] - r->max_w[i]);
    double d = isnan(de) || isnan(dm) ? INFINITY : fmax(de, dm);
    int am = r->lib_argmax[i], ok_arg = am == r->argmax[i];
    if (!ok_arg && am >= 0 && am < r->n && r->argmax[i] >= 0)
      ok_arg = r->w[(size_t)i * r->n + am] == r->w[(size_t)i * r->n + r->argmax[i]];
    if (d > L->diag_worst) L->diag_worst = d;
    if (d <= DIAG_TOL && ok_arg) continue;
    if (!L->diag_first[0])
      snprintf(L->diag_first, sizeof L->diag_first,
               "%s, row %d: library entropy %.6g max_weight %.6g argmax %d; from weights %.6g %.6g %d", run, i,
               r->lib_entropy[i], r->lib_max[i], am, r->entropy[i], r->max_w[i], r->argmax[i]);
    if (d > DIAG_TOL) L->diag_fail++;
    if (!ok_arg) L->diag_argmax_fail++;
    return; /* one failure per read is enough to count it */
  }
}

/* A device buffer of count elements of size bytes, filled with the pattern
 * (so an output the library does not write is recognisable). */
static cl_mem diag_buffer(cp_problem *pb, size_t count, size_t size, const void *pattern, char *err, size_t errlen) {
  cl_int e;
  cl_mem b = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE, count * size, NULL, &e);
  if (e != CL_SUCCESS) {
    snprintf(err, errlen, "clCreateBuffer (diagnostics): %s (%d)", cp_cl_error_name(e), e);
    return NULL;
  }
  e = clEnqueueFillBuffer(pb->queue, b, pattern, size, 0, count * size, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    snprintf(err, errlen, "clEnqueueFillBuffer (diagnostics): %s (%d)", cp_cl_error_name(e), e);
    clReleaseMemObject(b);
    return NULL;
  }
  return b;
}

static int read_buffer(cp_problem *pb, cl_mem b, size_t bytes, void *host, char *err, size_t errlen) {
  cl_int e = clEnqueueReadBuffer(pb->queue, b, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  if (e != CL_SUCCESS) snprintf(err, errlen, "clEnqueueReadBuffer (diagnostics): %s (%d)", cp_cl_error_name(e), e);
  return e == CL_SUCCESS ? 0 : -1;
}

/* Largest difference from the fp64 reference: absolute for the weights,
 * relative to the largest |value| for the outputs. Absolute rather than
 * norm-wise because some reads (opposite values mixed) cancel to almost 0. */
static double ref_error(const cp_problem *pb, const lab_input *in) {
  if (!pb->ref_valid || !pb->ref_out || !pb->ref_weights) return INFINITY;
  double vmax = 1e-30, e = 0;
  for (size_t i = 0; i < (size_t)in->n * in->dv; i++) vmax = fmax(vmax, fabs(in->v[i]));
  for (size_t i = 0; i < pb->out_count; i++) e = fmax(e, fabs(pb->out[i] - pb->ref_out[i]) / vmax);
  for (size_t i = 0; i < pb->weights_count; i++) e = fmax(e, fabs(pb->weights[i] - pb->ref_weights[i]));
  return e;
}

/* Runs one read: builds the problem with the problem kit, asks for weights
 * and the three route diagnostics, checks the result against fp64 and the
 * diagnostics against the weights. Returns 0, or -1 (message on stderr). */
static int lab_attend(lab *L, const char *run, const lab_input *in, lab_read *r) {
  memset(r, 0, sizeof *r);
  cp_shape s = cp_shape_default();
  s.q_len = in->m;
  s.kv_len = in->n;
  s.head_dim = in->dk;
  s.value_dim = in->dv;
  s.scale = in->scale;
  s.mask = in->mask ? CP_MASK_ONES : CP_MASK_NONE;
  s.want_weights = 1;
  s.algo = CLATTN_ALGO_STAGED;
  char err[512] = "";
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) return fprintf(stderr, "clattn lab: %s: %s\n", run, err), L->harness_failed = 1, -1;
  clattn_params *p = &pb->params;
  for (int i = 0; i < in->m; i++) {
    for (int d = 0; d < in->dk; d++) pb->q[cp_index(&p->q, 0, 0, i, d)] = in->q[(size_t)i * in->dk + d];
    if (in->mask)
      for (int j = 0; j < in->n; j++) pb->mask[cp_index(&p->mask, 0, 0, i, j)] = in->mask[(size_t)i * in->n + j];
  }
  for (int j = 0; j < in->n; j++) {
    for (int d = 0; d < in->dk; d++) pb->k[cp_index(&p->k, 0, 0, j, d)] = in->k[(size_t)j * in->dk + d];
    for (int d = 0; d < in->dv; d++) pb->v[cp_index(&p->v, 0, 0, j, d)] = in->v[(size_t)j * in->dv + d];
  }
  size_t m = (size_t)in->m;
  cl_mem ent = NULL, mx = NULL, am = NULL;
  int rc = -1;
  const float fnan = NAN;
  const int32_t unset = -7;
  cp_result res;
  if (cp_upload(pb, L->ctx) != 0) {
    snprintf(err, sizeof err, "%s", pb->err);
    goto done;
  }
  if (!(ent = diag_buffer(pb, m, sizeof(float), &fnan, err, sizeof err)) ||
      !(mx = diag_buffer(pb, m, sizeof(float), &fnan, err, sizeof err)) ||
      !(am = diag_buffer(pb, m, sizeof(int32_t), &unset, err, sizeof err)))
    goto done;
  /* strides like lse: [B,Hq,M] */
  p->entropy = (clattn_tensor){ent, 0, {m, m, 1, 0}};
  p->max_weight = (clattn_tensor){mx, 0, {m, m, 1, 0}};
  p->argmax = (clattn_tensor){am, 0, {m, m, 1, 0}};
  if (cp_run(pb, L->ctx, &res) != 0) {
    snprintf(err, sizeof err, "%s", pb->err);
    goto done;
  }
  if (res.status != CLATTN_OK) {
    snprintf(err, sizeof err, "clattn_forward: %s: %s", clattn_status_string(res.status), clattn_last_error(L->ctx));
    goto done;
  }
  r->m = in->m;
  r->n = in->n;
  r->dv = in->dv;
  r->out = malloc(pb->out_count * sizeof *r->out);
  r->w = malloc(pb->weights_count * sizeof *r->w);
  r->lib_entropy = malloc(m * sizeof(float));
  r->lib_max = malloc(m * sizeof(float));
  r->lib_argmax = malloc(m * sizeof(int32_t));
  r->entropy = malloc(m * sizeof(double));
  r->max_w = malloc(m * sizeof(double));
  r->argmax = malloc(m * sizeof(int));
  if (!r->out || !r->w || !r->lib_entropy || !r->lib_max || !r->lib_argmax || !r->entropy || !r->max_w || !r->argmax) {
    snprintf(err, sizeof err, "out of memory");
    goto done;
  }
  memcpy(r->out, pb->out, pb->out_count * sizeof *r->out);
  memcpy(r->w, pb->weights, pb->weights_count * sizeof *r->w);
  if (read_buffer(pb, ent, m * sizeof(float), r->lib_entropy, err, sizeof err) ||
      read_buffer(pb, mx, m * sizeof(float), r->lib_max, err, sizeof err) ||
      read_buffer(pb, am, m * sizeof(int32_t), r->lib_argmax, err, sizeof err))
    goto done;
  stats_from_weights(r);
  L->runs++;
  double e = ref_error(pb, in);
  if (!(e <= L->ref_worst)) L->ref_worst = isnan(e) ? INFINITY : e;
  if (!(e <= REF_TOL) || res.mismatch_out || res.mismatch_weights || res.nan_out || res.nan_weights) {
    char line[300];
    if (!L->ref_first[0])
      snprintf(L->ref_first, sizeof L->ref_first, "%s: %s", run, cp_result_format(&res, line, sizeof line));
    L->ref_fail++;
  }
  check_diagnostics(L, run, r);
  rc = 0;
done:
  if (ent) clReleaseMemObject(ent);
  if (mx) clReleaseMemObject(mx);
  if (am) clReleaseMemObject(am);
  p->entropy.buf = p->max_weight.buf = p->argmax.buf = NULL;
  cp_free(pb);
  if (rc != 0) {
    fprintf(stderr, "clattn lab: %s: %s\n", run, err);
    L->harness_failed = 1;
    read_free(r);
  }
  return rc;
}

/* ---- part 1: the seeds' worked examples ---- */

static lab_check *new_check(lab *L, const char *name) {
  if (L->n_checks >= MAX_CHECKS) return NULL;
  lab_check *c = &L->checks[L->n_checks++];
  memset(c, 0, sizeof *c);
  c->name = name;
  return c;
}

static void add_vec(lab_check *c, const char *label, int n, const double *expected, const double *got, double tol) {
  if (!c || c->n_vec >= MAX_VEC) return;
  lab_vec *v = &c->vec[c->n_vec++];
  v->label = label;
  v->n = n > 4 ? 4 : n;
  v->tol = tol;
  for (int i = 0; i < v->n; i++) v->expected[i] = expected[i], v->got[i] = got[i];
}

static void add_vecf(lab_check *c, const char *label, int n, const double *expected, const float *got, double tol) {
  double g[4];
  for (int i = 0; i < n && i < 4; i++) g[i] = got[i];
  add_vec(c, label, n, expected, g, tol);
}

static void finish_check(lab_check *c) {
  if (!c) return;
  c->pass = c->n_vec > 0;
  for (int k = 0; k < c->n_vec; k++)
    for (int i = 0; i < c->vec[k].n; i++)
      if (!(fabs(c->vec[k].got[i] - c->vec[k].expected[i]) <= c->vec[k].tol)) c->pass = 0;
}

/* One worked example of the table: its weights and output against the
 * seeds' printed numbers (within their rounding, at least SEED_TOL); keep
 * (or NULL) receives the read for the caller. */
static void worked_check(lab *L, const cp_worked *e, lab_read *keep) {
  lab_check *c = new_check(L, e->name);
  const double tol_w = fmax(e->tol_w, SEED_TOL), tol_out = fmax(e->tol_out, SEED_TOL);
  lab_input in = {1, e->n, e->dk, e->dv, e->q, e->k, e->v, e->allowed, e->scale};
  lab_read r;
  if (lab_attend(L, c ? c->name : e->name, &in, &r) == 0) {
    add_vecf(c, "weights", e->n, e->want_w, r.w, tol_w);
    add_vecf(c, "output", e->dv, e->want_out, r.out, tol_out);
    if (keep)
      *keep = r;
    else
      read_free(&r);
  }
  finish_check(c);
}

static void seed_checks(lab *L) {
  lab_read r, r2, first = {0};
  for (int i = 0; i < CP_N_WORKED; i++) worked_check(L, &cp_worked_examples[i], i == 0 ? &first : NULL);

  /* the positive read's keys and values moved together by the seeds' order [2, 0, 1] */
  const cp_worked *pos = &cp_worked_examples[0];
  lab_check *c = new_check(L, "paired permutation");
  const int order[] = {2, 0, 1};
  float pk[6], pv[6];
  for (int j = 0; j < 3; j++)
    for (int d = 0; d < 2; d++) pk[j * 2 + d] = pos->k[order[j] * 2 + d], pv[j * 2 + d] = pos->v[order[j] * 2 + d];
  lab_input in = {1, 3, 2, 2, pos->q, pk, pv, NULL, NAN};
  if (first.out && lab_attend(L, c->name, &in, &r) == 0) {
    const double orig[2] = {first.out[0], first.out[1]};
    add_vecf(c, "output unchanged", 2, orig, r.out, 1e-5);
    add_vecf(c, "output", 2, pos->want_out, r.out, SEED_TOL);
    read_free(&r);
  }
  read_free(&first);
  finish_check(c);

  /* The seeds mix fixed routes by hand; here the masks and scale 0 make the
   * library produce them: route A splits evenly over keys 0 and 1, route B
   * takes key 2 alone, whose value is their midpoint. */
  c = new_check(L, "different routes, same output");
  const float dv_[] = {1, 0, 0, 1, 0.5f, 0.5f};
  const unsigned char mask_a[] = {1, 1, 0}, mask_b[] = {0, 0, 1};
  in = (lab_input){1, 3, 2, 2, pos->q, pos->k, dv_, mask_a, 0.0f};
  lab_input in_b = {1, 3, 2, 2, pos->q, pos->k, dv_, mask_b, 0.0f};
  if (lab_attend(L, "route A", &in, &r) == 0) {
    if (lab_attend(L, "route B", &in_b, &r2) == 0) {
      add_vecf(c, "route A weights", 3, (const double[]){0.5, 0.5, 0}, r.w, SEED_TOL);
      add_vecf(c, "route B weights", 3, (const double[]){0, 0, 1}, r2.w, SEED_TOL);
      add_vecf(c, "route A output", 2, (const double[]){0.5, 0.5}, r.out, SEED_TOL);
      add_vecf(c, "route B output", 2, (const double[]){0.5, 0.5}, r2.out, SEED_TOL);
      read_free(&r2);
    }
    read_free(&r);
  }
  finish_check(c);
}

/* ---- part 2: interventions on a synthetic retrieval task ---- */

enum { RT_N = 256, RT_D = 32, RT_M = 16 };
#define RT_SHARP   12.0 /* scale * |q|: makes the target's weight about 0.95 */
#define RT_NOISE   0.3  /* |query noise| against a unit key */
#define RT_DUP_EPS 1e-3 /* |near-duplicate key - target key| before normalising */

typedef struct {
  float k[RT_N * RT_D], v[RT_N * RT_D], q[RT_M * RT_D];
  int target[RT_M];
  double value_norm; /* mean |v_j| */
} rtask;

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static double rng_gauss(uint64_t *s) {
  double u = rng_unit(s), v = rng_unit(s);
  return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

static void rng_perm(uint64_t *s, int *p, int n) {
  for (int i = 0; i < n; i++) p[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rng_next(s) % (uint64_t)(i + 1)), t = p[i];
    p[i] = p[j], p[j] = t;
  }
}

static void normalise(float *x, int d) {
  double n = 0;
  for (int i = 0; i < d; i++) n += (double)x[i] * x[i];
  n = sqrt(n);
  for (int i = 0; i < d; i++) x[i] = (float)(x[i] / n);
}

static void rtask_build(rtask *t, uint64_t seed) {
  uint64_t s = seed;
  for (int j = 0; j < RT_N; j++) {
    for (int d = 0; d < RT_D; d++) t->k[j * RT_D + d] = (float)rng_gauss(&s);
    normalise(t->k + j * RT_D, RT_D);
  }
  t->value_norm = 0;
  for (int j = 0; j < RT_N; j++) {
    double n = 0;
    for (int d = 0; d < RT_D; d++) {
      float x = (float)(2 * rng_unit(&s) - 1);
      t->v[j * RT_D + d] = x;
      n += (double)x * x;
    }
    t->value_norm += sqrt(n) / RT_N;
  }
  int perm[RT_N];
  rng_perm(&s, perm, RT_N);
  /* |q| = RT_SHARP * sqrt(d), so that with scale 1/sqrt(d) the logits are
   * RT_SHARP * cos(q, k) */
  for (int i = 0; i < RT_M; i++) {
    float *q = t->q + i * RT_D;
    t->target[i] = perm[i];
    for (int d = 0; d < RT_D; d++) q[d] = (float)(t->k[perm[i] * RT_D + d] + RT_NOISE / sqrt(RT_D) * rng_gauss(&s));
    normalise(q, RT_D);
    for (int d = 0; d < RT_D; d++) q[d] = (float)(q[d] * RT_SHARP * sqrt(RT_D));
  }
}

static double dist(const float *a, const float *b, int d) {
  double s = 0;
  for (int i = 0; i < d; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return sqrt(s);
}

static lab_intv *new_intv(lab *L, const char *name, const char *what) {
  if (L->n_intv >= MAX_INTV) return NULL;
  lab_intv *v = &L->intv[L->n_intv++];
  memset(v, 0, sizeof *v);
  v->name = name;
  v->what = what;
  v->pass = 1;
  return v;
}

static void metric(lab_intv *v, const char *key, double val) {
  if (v && v->n_metric < MAX_METRICS) v->metric[v->n_metric].key = key, v->metric[v->n_metric++].val = val;
}

static void expect(lab_intv *v, int pass, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void expect(lab_intv *v, int pass, const char *fmt, ...) {
  if (!v) return;
  if (!pass) v->pass = 0;
  if (v->n_assert >= MAX_ASSERTS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->assert_[v->n_assert].text, sizeof v->assert_[0].text, fmt, ap);
  va_end(ap);
  v->assert_[v->n_assert++].pass = pass;
}

/* Summary of one read of the task: the metrics every intervention reports.
 * slot[i] is where query i's target value sits in this read's inputs. Route
 * metrics come from the library's diagnostics; *_w the same from weights
 * (what the assertions use, so that a diagnostics failure is reported once,
 * by check_diagnostics). */
typedef struct {
  double change, target_err, max_change;
  double entropy, max_weight, hit;       /* library */
  double entropy_w, max_weight_w, hit_w; /* from weights */
} rsum;

static rsum summarise(const rtask *t, const lab_read *base, const lab_read *r, const int *slot) {
  rsum s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < RT_M; i++) {
    double c = dist(r->out + i * RT_D, base->out + i * RT_D, RT_D);
    s.change += c / RT_M;
    if (c > s.max_change) s.max_change = c;
    s.target_err += dist(r->out + i * RT_D, t->v + t->target[i] * RT_D, RT_D) / RT_M;
    s.entropy += r->lib_entropy[i] / RT_M;
    s.max_weight += r->lib_max[i] / RT_M;
    s.hit += (r->lib_argmax[i] == slot[i]) / (double)RT_M;
    s.entropy_w += r->entropy[i] / RT_M;
    s.max_weight_w += r->max_w[i] / RT_M;
    s.hit_w += (r->argmax[i] == slot[i]) / (double)RT_M;
  }
  return s;
}

static void report(lab_intv *v, const rsum *s) {
  metric(v, "output_change", s->change);
  metric(v, "target_error", s->target_err);
  metric(v, "entropy", s->entropy);
  metric(v, "max_weight", s->max_weight);
  metric(v, "argmax_on_target", s->hit);
}

static int interventions(lab *L, lab_read *base_out) {
  rtask *t = malloc(sizeof *t), *x = malloc(sizeof *x);
  unsigned char *mask = malloc(RT_M * RT_N);
  int rc = -1;
  lab_read base, r;
  memset(&base, 0, sizeof base);
  if (!t || !x || !mask) {
    fprintf(stderr, "clattn lab: out of memory\n");
    L->harness_failed = 1;
    goto done;
  }
  rtask_build(t, L->seed);
  uint64_t s = L->seed ^ 0x5DEECE66Dull;
  int perm[RT_N], inv[RT_N], slot[RT_M];
  rng_perm(&s, perm, RT_N);
  for (int j = 0; j < RT_N; j++) inv[perm[j]] = j;

  /* baseline */
  lab_input in = {RT_M, RT_N, RT_D, RT_D, t->q, t->k, t->v, NULL, NAN};
  if (lab_attend(L, "baseline", &in, &base) != 0) goto done;
  rsum b = summarise(t, &base, &base, t->target);
  lab_intv *v = new_intv(L, "baseline", "the unmodified task: each query a noisy copy of its target key");
  report(v, &b);
  expect(v, b.hit_w == 1, "the top route reaches the target for every query (%.0f/%d)", b.hit_w * RT_M, RT_M);
  expect(v, b.max_weight_w >= 0.8, "the route is sharp: mean max weight %.3f >= 0.8", b.max_weight_w);
  expect(v, b.target_err <= 0.25 * t->value_norm, "output near the target value: error %.3f <= 0.25 x mean |v| %.3f",
         b.target_err, 0.25 * t->value_norm);

  /* paired permutation: pair j moves to slot inv[j] */
  v = new_intv(L, "paired permutation", "keys and values permuted together");
  for (int j = 0; j < RT_N; j++) {
    memcpy(x->k + j * RT_D, t->k + perm[j] * RT_D, sizeof(float) * RT_D);
    memcpy(x->v + j * RT_D, t->v + perm[j] * RT_D, sizeof(float) * RT_D);
  }
  for (int i = 0; i < RT_M; i++) slot[i] = inv[t->target[i]];
  in = (lab_input){RT_M, RT_N, RT_D, RT_D, t->q, x->k, x->v, NULL, NAN};
  if (lab_attend(L, v->name, &in, &r) == 0) {
    rsum a = summarise(t, &base, &r, slot);
    report(v, &a);
    double dw = 0;
    for (int i = 0; i < RT_M; i++)
      for (int j = 0; j < RT_N; j++) dw = fmax(dw, fabs(r.w[i * RT_N + j] - base.w[i * RT_N + perm[j]]));
    expect(v, a.max_change <= 1e-4, "output unchanged: max |change| %.2g <= 1e-4", a.max_change);
    expect(v, dw <= 1e-6, "weights move with their pairs: max |difference| %.2g <= 1e-6", dw);
    expect(v, fabs(a.entropy_w - b.entropy_w) <= 1e-4, "entropy unchanged: %.6f vs %.6f", a.entropy_w, b.entropy_w);
    read_free(&r);
  } else
    v->pass = 0;

  /* key shuffle: keys permuted, values stay; the target value stays at its slot */
  v = new_intv(L, "key shuffle", "keys permuted, values not: the addresses move, the content does not");
  memcpy(x->v, t->v, sizeof t->v);
  for (int i = 0; i < RT_M; i++) slot[i] = t->target[i];
  in = (lab_input){RT_M, RT_N, RT_D, RT_D, t->q, x->k, x->v, NULL, NAN};
  if (lab_attend(L, v->name, &in, &r) == 0) {
    rsum a = summarise(t, &base, &r, slot);
    report(v, &a);
    expect(v, a.hit_w <= 2.0 / RT_M, "the route misses the target value (top route on it for %.0f/%d)", a.hit_w * RT_M,
           RT_M);
    expect(v, a.target_err >= 5 * b.target_err && a.target_err >= 0.5 * t->value_norm,
           "output error vs the target rises: %.3f (baseline %.3f)", a.target_err, b.target_err);
    read_free(&r);
  } else
    v->pass = 0;

  /* value shuffle: same keys, so the same route; different content travels */
  v = new_intv(L, "value shuffle", "values permuted, keys not: same route, different content");
  memcpy(x->k, t->k, sizeof t->k);
  for (int j = 0; j < RT_N; j++) memcpy(x->v + j * RT_D, t->v + perm[j] * RT_D, sizeof(float) * RT_D);
  for (int i = 0; i < RT_M; i++) slot[i] = inv[t->target[i]];
  in = (lab_input){RT_M, RT_N, RT_D, RT_D, t->q, x->k, x->v, NULL, NAN};
  if (lab_attend(L, v->name, &in, &r) == 0) {
    rsum a = summarise(t, &base, &r, slot);
    report(v, &a);
    double dw = 0;
    for (size_t e = 0; e < (size_t)RT_M * RT_N; e++) dw = fmax(dw, fabs(r.w[e] - base.w[e]));
    expect(v, dw <= 1e-6, "weights unchanged: max |difference| %.2g <= 1e-6", dw);
    expect(v, a.change >= 0.5 * t->value_norm, "output changes: mean |change| %.3f >= 0.5 x mean |v| %.3f", a.change,
           0.5 * t->value_norm);
    read_free(&r);
  } else
    v->pass = 0;

  /* ablation: mask out each query's top key; the rest renormalises, so the
   * output must be the remaining keys' mixture under the baseline weights */
  v = new_intv(L, "ablate top route", "each query's argmax key masked out");
  memset(mask, 1, RT_M * RT_N);
  for (int i = 0; i < RT_M; i++) mask[i * RT_N + base.argmax[i]] = 0, slot[i] = t->target[i];
  in = (lab_input){RT_M, RT_N, RT_D, RT_D, t->q, t->k, t->v, mask, NAN};
  if (lab_attend(L, v->name, &in, &r) == 0) {
    rsum a = summarise(t, &base, &r, slot);
    report(v, &a);
    double removed = 0, worst = 0, masked_w = 0;
    int moved = 0;
    for (int i = 0; i < RT_M; i++) {
      int top = base.argmax[i];
      double wt = base.w[i * RT_N + top], rest = 0, pred[RT_D] = {0};
      for (int j = 0; j < RT_N; j++)
        if (j != top) {
          rest += base.w[i * RT_N + j];
          for (int d = 0; d < RT_D; d++) pred[d] += base.w[i * RT_N + j] * (double)t->v[j * RT_D + d];
        }
      double err = 0, norm = 0;
      for (int d = 0; d < RT_D; d++) {
        double o = r.out[i * RT_D + d];
        err += (o - pred[d] / rest) * (o - pred[d] / rest);
        norm += o * o;
      }
      worst = fmax(worst, sqrt(err) / (1 + sqrt(norm)));
      masked_w = fmax(masked_w, r.w[i * RT_N + top]);
      moved += r.argmax[i] != top;
      removed += wt / RT_M;
      v->per_row[0][i] = wt;
      v->per_row[1][i] = dist(r.out + i * RT_D, base.out + i * RT_D, RT_D);
    }
    v->n_rows = RT_M;
    metric(v, "removed_weight", removed);
    expect(v, masked_w == 0 && moved == RT_M, "the ablated key gets weight 0 (max %.2g), every top route moves (%d/%d)",
           masked_w, moved, RT_M);
    expect(v, worst <= 1e-3, "output = the other keys' baseline mixture, renormalised (rel. error %.2g <= 1e-3)",
           worst);
    expect(v, a.change >= 0.5 * t->value_norm, "output changes: mean |change| %.3f for mean removed weight %.3f",
           a.change, removed);
    read_free(&r);
  } else
    v->pass = 0;

  /* near-duplicate keys: for each query, another slot gets almost the target
   * key and the opposite value; the route cannot tell them apart */
  v = new_intv(L, "near-duplicate keys", "a near copy of each target key carrying the opposite value");
  memcpy(x->k, t->k, sizeof t->k);
  memcpy(x->v, t->v, sizeof t->v);
  int dup[RT_M], used = 0;
  for (int j = 0; j < RT_N && used < RT_M; j++) {
    int cand = perm[j], is_target = 0;
    for (int i = 0; i < RT_M; i++) is_target |= t->target[i] == cand;
    if (!is_target) dup[used++] = cand;
  }
  for (int i = 0; i < RT_M; i++) {
    float *k = x->k + dup[i] * RT_D;
    for (int d = 0; d < RT_D; d++) {
      k[d] = (float)(t->k[t->target[i] * RT_D + d] + RT_DUP_EPS / sqrt(RT_D) * rng_gauss(&s));
      x->v[dup[i] * RT_D + d] = -t->v[t->target[i] * RT_D + d];
    }
    normalise(k, RT_D);
    slot[i] = t->target[i];
  }
  in = (lab_input){RT_M, RT_N, RT_D, RT_D, t->q, x->k, x->v, NULL, NAN};
  if (lab_attend(L, v->name, &in, &r) == 0) {
    rsum a = summarise(t, &base, &r, slot);
    report(v, &a);
    double wt = 0, wd = 0, split = 1, mix = 0;
    for (int i = 0; i < RT_M; i++) {
      double a1 = r.w[i * RT_N + t->target[i]], a2 = r.w[i * RT_N + dup[i]];
      wt += a1 / RT_M, wd += a2 / RT_M;
      split = fmin(split, fmin(a1, a2) / (a1 + a2));
      double n = 0;
      for (int d = 0; d < RT_D; d++) n += (double)r.out[i * RT_D + d] * r.out[i * RT_D + d];
      mix += sqrt(n) / RT_M;
    }
    metric(v, "weight_target", wt);
    metric(v, "weight_duplicate", wd);
    metric(v, "output_norm", mix);
    expect(v, split >= 0.4, "weights split between the two keys: smaller share >= 0.4 in every row (%.3f)", split);
    expect(v, mix <= 0.25 * t->value_norm, "output is a mixture of opposites: mean |o| %.3f <= 0.25 x mean |v|", mix);
    expect(v, a.entropy_w >= b.entropy_w + 0.5, "route entropy rises by >= 0.5 nats: %.3f vs %.3f", a.entropy_w,
           b.entropy_w);
    read_free(&r);
  } else
    v->pass = 0;
  rc = 0;
done:
  if (rc == 0 && base_out)
    *base_out = base;
  else
    read_free(&base);
  free(t);
  free(x);
  free(mask);
  return rc;
}

/* ---- run-level checks ---- */

static void run_checks(lab *L) {
  lab_check *c = new_check(L, "every read matches the fp64 reference");
  double runs = L->runs;
  add_vec(c, "reads off the reference", 1, (const double[]){0}, (const double[]){L->ref_fail}, 0);
  add_vec(c, "worst error (weights; outputs / max |v|)", 1, (const double[]){0}, &L->ref_worst, REF_TOL);
  add_vec(c, "reads", 1, &runs, &runs, 0);
  finish_check(c);
  c = new_check(L, "route diagnostics agree with the weights");
  add_vec(c, "reads disagreeing", 1, (const double[]){0}, (const double[]){L->diag_fail}, 0);
  add_vec(c, "reads with another argmax", 1, (const double[]){0}, (const double[]){L->diag_argmax_fail}, 0);
  add_vec(c, "worst |entropy, max_weight difference|", 1, (const double[]){0}, &L->diag_worst, DIAG_TOL);
  finish_check(c);
}

/* ---- output ---- */

/* digits < 0: 3 significant digits (for errors) */
static void print_vec(const double *x, int n, int digits) {
  printf("[");
  for (int i = 0; i < n; i++) {
    if (digits < 0)
      printf("%s%.3g", i ? ", " : "", x[i]);
    else
      printf("%s%.*f", i ? ", " : "", digits, x[i]);
  }
  printf("]");
}

static void print_text(const lab *L, int failed) {
  printf("the seeds' checks (within %g of their rounded numbers, 5e-3 for 17.04):\n", SEED_TOL);
  for (int k = 0; k < L->n_checks; k++) {
    const lab_check *c = &L->checks[k];
    printf("  %-48s %s\n", c->name, c->pass ? "ok" : "FAILED");
    for (int i = 0; i < c->n_vec; i++) {
      const lab_vec *v = &c->vec[i];
      int zero = 1;
      for (int j = 0; j < v->n; j++) zero &= v->expected[j] == 0;
      int digits = v->tol == 0 ? 0 : v->tol >= 1e-3 ? 3 : zero ? -1 : 6;
      printf("    %-42s ", v->label);
      print_vec(v->got, v->n, digits);
      printf("  expected ");
      print_vec(v->expected, v->n, digits);
      if (digits < 0) printf(" within %.0e", v->tol);
      printf("\n");
    }
    if (k == 6) printf("\nchecks over every read above and below:\n");
  }
  if (L->ref_first[0]) printf("    first read off the reference: %s\n", L->ref_first);
  if (L->diag_first[0]) printf("    first disagreement: %s\n", L->diag_first);
  printf(
      "\ninterventions on a retrieval task: %d random unit keys in d=%d, %d queries each a noisy copy of one\n"
      "target key (logits %g x cosine), random values in [-1,1]^%d (seed %llu); means over the queries:\n",
      RT_N, RT_D, RT_M, RT_SHARP, RT_D, (unsigned long long)L->seed);
  printf("  %-20s %10s %11s %9s %10s %12s\n", "", "out change", "target err", "entropy", "max weight", "top=target");
  for (int k = 0; k < L->n_intv; k++) {
    const lab_intv *v = &L->intv[k];
    printf("  %-20s %10.4f %11.4f %9.4f %10.4f %12.2f\n", v->name, v->metric[0].val, v->metric[1].val, v->metric[2].val,
           v->metric[3].val, v->metric[4].val);
  }
  for (int k = 0; k < L->n_intv; k++) {
    const lab_intv *v = &L->intv[k];
    printf("  %s (%s): %s\n", v->name, v->what, v->pass ? "ok" : "FAILED");
    for (int i = 5; i < v->n_metric; i++) printf("    %s = %.4f\n", v->metric[i].key, v->metric[i].val);
    for (int i = 0; i < v->n_assert; i++)
      printf("    %-6s %s\n", v->assert_[i].pass ? "ok" : "FAILED", v->assert_[i].text);
  }
  printf("  (entropy in nats, max weight and top=target from the library's route diagnostics)\n");
  printf("\n%s\n", failed ? "lab: SOME ASSERTIONS FAILED" : "lab: all assertions hold");
}

static void json_num(double x) {
  if (isfinite(x))
    printf("%.9g", x);
  else
    printf("null");
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void json_arr(const double *x, int n) {
  putchar('[');
  for (int i = 0; i < n; i++) {
    if (i) putchar(',');
    json_num(x[i]);
  }
  putchar(']');
}

static void print_json(const lab *L, const char *device, int failed) {
  printf("{\"tool\":\"clattn lab\",\"version\":\"%s\",\"device\":", CLATTN_VERSION_STRING);
  json_str(device);
  printf(",\"seed\":%llu,\"pass\":%s,\"checks\":[", (unsigned long long)L->seed, failed ? "false" : "true");
  for (int k = 0; k < L->n_checks; k++) {
    const lab_check *c = &L->checks[k];
    printf("%s{\"name\":", k ? "," : "");
    json_str(c->name);
    for (int part = 0; part < 3; part++) {
      printf(",\"%s\":{", part == 0 ? "expected" : part == 1 ? "got" : "tolerance");
      for (int i = 0; i < c->n_vec; i++) {
        if (i) putchar(',');
        json_str(c->vec[i].label);
        putchar(':');
        if (part == 2)
          json_num(c->vec[i].tol);
        else
          json_arr(part == 0 ? c->vec[i].expected : c->vec[i].got, c->vec[i].n);
      }
      putchar('}');
    }
    printf(",\"pass\":%s}", c->pass ? "true" : "false");
  }
  printf("],\"task\":{\"keys\":%d,\"head_dim\":%d,\"value_dim\":%d,\"queries\":%d,\"sharpness\":%g,\"noise\":%g}", RT_N,
         RT_D, RT_D, RT_M, RT_SHARP, RT_NOISE);
  printf(",\"interventions\":[");
  for (int k = 0; k < L->n_intv; k++) {
    const lab_intv *v = &L->intv[k];
    printf("%s{\"name\":", k ? "," : "");
    json_str(v->name);
    printf(",\"what\":");
    json_str(v->what);
    printf(",\"metrics\":{");
    for (int i = 0; i < v->n_metric; i++) {
      printf("%s\"%s\":", i ? "," : "", v->metric[i].key);
      json_num(v->metric[i].val);
    }
    if (v->n_rows) {
      printf(",\"removed_weight_per_row\":");
      json_arr(v->per_row[0], v->n_rows);
      printf(",\"output_change_per_row\":");
      json_arr(v->per_row[1], v->n_rows);
    }
    printf("},\"assertions\":[");
    for (int i = 0; i < v->n_assert; i++) {
      printf("%s{\"what\":", i ? "," : "");
      json_str(v->assert_[i].text);
      printf(",\"pass\":%s}", v->assert_[i].pass ? "true" : "false");
    }
    printf("],\"pass\":%s}", v->pass ? "true" : "false");
  }
  printf("]");
  if (L->diag_first[0]) {
    printf(",\"first_diagnostics_disagreement\":");
    json_str(L->diag_first);
  }
  printf("}\n");
}

/* ---- the picture ---- */

/* The baseline's routing matrix, the whole of it (16 x 256). */
static int write_heatmap(const lab *L, const lab_read *base, const char *path) {
  char title[160], caption[1024], err[512];
  snprintf(title, sizeof title, "clattn lab: routing matrix of the retrieval task (%d queries x %d keys)", RT_M, RT_N);
  snprintf(caption, sizeof caption,
           "Routing coefficients a_ij = softmax_j(q_i . k_j / sqrt(%d)) of one head for one input: the synthetic "
           "task, seed %llu, before any intervention. Each query is a noisy copy of one target key, so each row "
           "has one bright cell.\n"
           "This is a routing diagnostic, not an explanation: what a route does is shown by intervening on keys, "
           "values and routes (see the interventions).",
           RT_D, (unsigned long long)L->seed);
  heatmap h = {
      .a = base->w, .rows = base->m, .cols = base->n, .ld = (size_t)base->n, .title = title, .caption = caption};
  if (heatmap_write_png(&h, path, err, sizeof err) != 0) {
    fprintf(stderr, "clattn lab: %s\n", err);
    return -1;
  }
  return 0;
}

/* ---- main ---- */

int lab_main(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--train")) return lab_train_main(argc, argv);
  int json = 0;
  const char *heat = NULL;
  lab *L = calloc(1, sizeof *L);
  if (!L) return fprintf(stderr, "clattn lab: out of memory\n"), 1;
  L->seed = 7;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(o, "--json"))
      json = 1;
    else if (!strcmp(o, "--heatmap") && val)
      heat = val, i++;
    else if (!strcmp(o, "--seed") && val && val[0] != '-' && (L->seed = strtoull(val, &end, 10), !*end))
      i++;
    else if (!strcmp(o, "-h") || !strcmp(o, "--help"))
      return free(L), printf("usage:\n%s\n--train:\n%s", lab_usage, lab_train_help), 0;
    else {
      if (!strcmp(o, "--heatmap") || !strcmp(o, "--seed"))
        fprintf(stderr, "clattn lab: %s needs %s\n", o,
                !strcmp(o, "--seed") ? "a non-negative integer" : "a file name");
      else
        fprintf(stderr, "clattn lab: bad option %s\n", o);
      free(L);
      return fprintf(stderr, "usage:\n%s", lab_usage), 2;
    }
  }
  clattn_status st = clattn_create(NULL, &L->ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn lab: cannot create a context: %s: %s\n", clattn_status_string(st), clattn_last_error(NULL));
    free(L);
    return 1;
  }
  char device[256] = "?";
  if (clGetDeviceInfo(clattn_cl_device(L->ctx), CL_DEVICE_NAME, sizeof device, device, NULL) != CL_SUCCESS)
    snprintf(device, sizeof device, "?");
  if (!json) printf("clattn lab on %s: the seeds' routing laboratory, every read on the device (STAGED)\n\n", device);

  seed_checks(L);
  lab_read base;
  memset(&base, 0, sizeof base);
  interventions(L, &base);
  run_checks(L);

  int failed = L->harness_failed, heat_failed = 0;
  for (int k = 0; k < L->n_checks; k++) failed |= !L->checks[k].pass;
  for (int k = 0; k < L->n_intv; k++) failed |= !L->intv[k].pass;
  if (heat && (!base.w || write_heatmap(L, &base, heat) != 0)) heat_failed = 1;
  if (json)
    print_json(L, device, failed);
  else {
    print_text(L, failed);
    if (heat && !heat_failed) printf("heat map: %s\n", heat);
  }
  read_free(&base);
  clattn_destroy(L->ctx);
  free(L);
  return failed || heat_failed ? 1 : 0;
}
