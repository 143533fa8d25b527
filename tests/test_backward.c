/*
 * clattn_backward on the device against the fp64 reference of the gradients
 * (tools/reference/reference_backward.c, itself checked by finite differences in
 * test_reference_backward.c): odd shapes, dk != dv, every forward feature,
 * 16-bit storage, NaN/Inf in disallowed keys and values, empty rows,
 * packed sequences, a NaN key seen by some rows only, bitwise determinism,
 * four threads building programs at once, and validation (rejected calls
 * enqueue nothing and leave every buffer as it was).
 *
 * CLATTN_TEST_BACKWARD picks the path every check runs: unset, the FA2
 * kernels (fwd.algo FUSED, deterministic); "staged", the staged backward
 * (fwd.algo STAGED; meson runs it with a tiny scratch budget, so chunks of
 * rows and of heads across KV groups are exercised); "atomics", FA2 with
 * deterministic = 0 (dQ added atomically: checked within tolerance, not
 * bitwise). The staged-vs-fused and atomics checks below run in every mode.
 *
 * Gradient views reuse the forward's view shapes (offsets, row gaps,
 * layouts) in NaN-poisoned buffers of their own, so elements outside the
 * views are checked untouched too.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "kit_checks.h"
#include "reference_backward.h"

/* The path under test (CLATTN_TEST_BACKWARD), set in main. */
static clattn_algo g_algo = CLATTN_ALGO_FUSED;
static int g_deterministic = 1;

static size_t elem_bytes(clattn_dtype t) { return t == CLATTN_F32 ? 4 : 2; }

/* Host floats to storage bytes and back. */
static void to_storage(clattn_dtype t, const float *x, size_t n, void *out) {
  for (size_t e = 0; e < n; e++) {
    if (t == CLATTN_F32)
      ((float *)out)[e] = x[e];
    else
      ((uint16_t *)out)[e] = t == CLATTN_F16 ? cp_f16_bits(x[e]) : cp_bf16_bits(x[e]);
  }
}

static float from_storage(clattn_dtype t, const void *raw, size_t e) {
  if (t == CLATTN_F32) return ((const float *)raw)[e];
  const uint16_t h = ((const uint16_t *)raw)[e];
  return t == CLATTN_F16 ? cp_f16_value(h) : cp_bf16_value(h);
}

/* One gradient (or d_out) buffer: a view over `elems` elements of storage. */
typedef struct {
  clattn_tensor t;
  size_t elems, bytes;
  unsigned char *raw;  /* read back */
  unsigned char *init; /* what was written before the call */
} grad_buf;

static int grad_create(cp_problem *pb, grad_buf *g, const clattn_tensor *shape_of, size_t elems, clattn_dtype t,
                       const float *fill) {
  cl_int err = CL_SUCCESS;
  g->t = *shape_of;
  g->elems = elems;
  g->bytes = elems * elem_bytes(t);
  g->raw = malloc(g->bytes);
  g->init = malloc(g->bytes);
  float *host = malloc(elems * sizeof *host);
  if (!g->raw || !g->init || !host) {
    free(host);
    return -1;
  }
  for (size_t e = 0; e < elems; e++) host[e] = fill ? fill[e] : NAN;
  to_storage(t, host, elems, g->init);
  free(host);
  g->t.buf = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, g->bytes, g->init, &err);
  return err == CL_SUCCESS ? 0 : -1;
}

static int grad_read(cp_problem *pb, grad_buf *g) {
  return clEnqueueReadBuffer(pb->queue, g->t.buf, CL_TRUE, 0, g->bytes, g->raw, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
}

static int grad_reset(cp_problem *pb, grad_buf *g) {
  return clEnqueueWriteBuffer(pb->queue, g->t.buf, CL_TRUE, 0, g->bytes, g->init, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
}

static void grad_free(grad_buf *g) {
  if (g->t.buf) clReleaseMemObject(g->t.buf);
  free(g->raw);
  free(g->init);
  memset(g, 0, sizeof *g);
}

/* A backward problem: the forward (run on the device for out and lse), dO,
 * the gradient buffers and the reference's gradients. */
typedef struct {
  cp_problem *pb;
  clattn_backward_params bp;
  grad_buf d_out, d_q, d_k, d_v;
  cl_mem d_sinks, d_w;
  cl_mem d_bias;      /* with a bias: f32, viewed like it (its pad NaN, broadcast dimensions summed) */
  float *d_bias_host; /* read back: the whole buffer, bias_elems */
  double *dout;       /* dense logical dO */
  ref_grads ref;
  size_t nq, nk, nv, no;
} bwd;

static void bwd_free(bwd *w) {
  grad_free(&w->d_out);
  grad_free(&w->d_q);
  grad_free(&w->d_k);
  grad_free(&w->d_v);
  if (w->d_sinks) clReleaseMemObject(w->d_sinks);
  if (w->d_w) clReleaseMemObject(w->d_w);
  if (w->d_bias) clReleaseMemObject(w->d_bias);
  free(w->d_bias_host);
  free(w->ref.d_scores);
  free(w->dout);
  free(w->ref.d_q);
  free(w->ref.d_k);
  free(w->ref.d_v);
  free(w->ref.d_sinks);
  free(w->ref.d_additive_w);
  cp_free(w->pb);
  memset(w, 0, sizeof *w);
}

/* Builds the problem (editing it through `edit` first), runs and checks the
 * forward, uploads dO and NaN-poisoned gradient buffers, computes the
 * reference. 0 on success (a failure is recorded). */
static int bwd_setup(bwd *w, cp_shape s, void (*edit)(cp_problem *)) {
  memset(w, 0, sizeof *w);
  char err[256] = "";
  s.want_lse = 1;
  if (s.algo == CLATTN_ALGO_AUTO) s.algo = CLATTN_ALGO_FUSED;
  w->pb = cp_build(&s, err, sizeof err);
  if (!CHECKF(w->pb != NULL, "cp_build: %s", err)) return -1;
  cp_problem *pb = w->pb;
  if (edit) edit(pb);
  if (s.poison_disallowed) cp_poison_disallowed(pb);
  cp_result r;
  if (!CHECKF(cp_run(pb, ct_context(), &r) == 0, "harness: %s", pb->err)) return -1;
  char line[512];
  if (!CHECKF(cp_result_ok(&r, s.dtype == CLATTN_F32 ? 1e-4 : 2e-2), "forward: %s (%s)",
              cp_result_format(&r, line, sizeof line), cp_describe(&s, err, sizeof err)))
    return -1;
  const clattn_params *p = &pb->params;
  const int B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, M = p->q_len, N = p->kv_len;
  w->nq = (size_t)B * Hq * M * p->head_dim;
  w->nk = (size_t)B * Hkv * N * p->head_dim;
  w->nv = (size_t)B * Hkv * N * p->value_dim;
  w->no = (size_t)B * Hq * M * p->value_dim;
  w->dout = malloc(w->no * sizeof *w->dout);
  w->ref.d_q = malloc(w->nq * sizeof(double));
  w->ref.d_k = malloc(w->nk * sizeof(double));
  w->ref.d_v = malloc(w->nv * sizeof(double));
  w->ref.d_sinks = calloc((size_t)Hq, sizeof(double));
  w->ref.d_additive_w = calloc((size_t)p->head_dim, sizeof(double));
  float *dout_raw = calloc(pb->out_elems, sizeof(float));
  if (!CHECK(w->dout && w->ref.d_q && w->ref.d_k && w->ref.d_v && w->ref.d_sinks && w->ref.d_additive_w && dout_raw)) {
    free(dout_raw);
    return -1;
  }
  for (size_t e = 0; e < pb->out_elems; e++) dout_raw[e] = NAN; /* elements no view reads */
  const ref_inputs in = cp_ref_inputs(pb);
  uint64_t x = s.seed * 0x9E3779B97F4A7C15ull + 3;
  memset(w->dout, 0, w->no * sizeof *w->dout);
  for (int b = 0; b < B; b++) {
    const ref_seq sq = ref_sequence(p, &in, b);
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < sq.rows; i++)
        for (int c = 0; c < p->value_dim; c++) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          const float v = cp_round_to(p->dtype, (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0));
          w->dout[(((size_t)b * Hq + h) * M + i) * p->value_dim + c] = v;
          dout_raw[cp_index(&p->out, b, h, (int)sq.q0 + i, c)] = v;
        }
  }
  /* packed sequences: rows no sequence covers read as 0 */
  if (p->cu_seqlens_q)
    for (int h = 0; h < Hq; h++)
      for (int r = 0; r < p->total_q; r++)
        for (int c = 0; c < p->value_dim; c++)
          if (isnan(dout_raw[cp_index(&p->out, 0, h, r, c)])) dout_raw[cp_index(&p->out, 0, h, r, c)] = 0.0f;
  int bad = grad_create(pb, &w->d_out, &p->out, pb->out_elems, p->dtype, dout_raw) ||
            grad_create(pb, &w->d_q, &p->q, pb->q_elems, p->dtype, NULL) ||
            grad_create(pb, &w->d_k, &p->k, pb->k_elems, p->dtype, NULL) ||
            grad_create(pb, &w->d_v, &p->v, pb->v_elems, p->dtype, NULL);
  free(dout_raw);
  if (!CHECKF(!bad, "gradient buffers")) return -1;
  cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
  const float nan_h[64] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
                           NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
                           NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
                           NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
  if (pb->sinks && Hq <= 64)
    w->d_sinks = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (size_t)Hq * sizeof(float),
                                (void *)nan_h, &e1);
  if (pb->additive_w && p->head_dim <= 64)
    w->d_w = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (size_t)p->head_dim * sizeof(float),
                            (void *)nan_h, &e2);
  if (pb->bias) {
    w->d_bias_host = malloc(pb->bias_elems * sizeof(float));
    w->ref.d_scores = malloc((size_t)B * Hq * M * N * sizeof(double));
    if (!CHECK(w->d_bias_host && w->ref.d_scores)) return -1;
    for (size_t e = 0; e < pb->bias_elems; e++) w->d_bias_host[e] = NAN;
    w->d_bias = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, pb->bias_elems * sizeof(float),
                               w->d_bias_host, &e1);
  }
  if (!CHECK(e1 == CL_SUCCESS && e2 == CL_SUCCESS)) return -1;
  w->bp = clattn_backward_params_default();
  w->bp.fwd = *p;
  w->bp.fwd.algo = g_algo;
  w->bp.deterministic = g_deterministic;
  w->bp.d_out = w->d_out.t;
  w->bp.d_q = w->d_q.t;
  w->bp.d_k = w->d_k.t;
  w->bp.d_v = w->d_v.t;
  w->bp.d_sinks = w->d_sinks;
  w->bp.d_additive_w = w->d_w;
  if (w->d_bias) {
    w->bp.d_bias = p->bias;
    w->bp.d_bias.buf = w->d_bias;
  }
  if (!CHECK(ref_backward(p, &in, w->dout, &w->ref) == 0)) return -1;
  return 0;
}

/* Runs the backward; reads every gradient buffer back. */
static clattn_status bwd_run(bwd *w) {
  clattn_status st = clattn_backward(ct_context(), &w->bp, 0, NULL, NULL);
  CHECK(clFinish(w->pb->queue) == CL_SUCCESS);
  CHECK(grad_read(w->pb, &w->d_q) == 0 && grad_read(w->pb, &w->d_k) == 0 && grad_read(w->pb, &w->d_v) == 0);
  return st;
}

/* Gathers a gradient view into dense logical order; every element of the
 * buffer no logical (existing) row covers must be either the poison it
 * started with (outside the view) or 0 (inside the view: a packed row no
 * sequence covers). Returns the count of elements that are neither. */
static long gather(const bwd *w, const grad_buf *g, int heads, int rows_logical, int cols, int keys, float *dense) {
  const clattn_params *p = &w->pb->params;
  const ref_inputs in = cp_ref_inputs(w->pb);
  unsigned char *seen = calloc(g->elems, 1);
  if (!seen) return -1;
  for (size_t e = 0; e < (size_t)p->batch * heads * rows_logical * cols; e++) dense[e] = 0.0f;
  for (int b = 0; b < p->batch; b++) {
    const ref_seq sq = ref_sequence(p, &in, b);
    const int n = keys ? sq.keys : sq.rows;
    const long r0 = keys ? sq.k0 : sq.q0;
    for (int h = 0; h < heads; h++)
      for (int r = 0; r < n; r++)
        for (int c = 0; c < cols; c++) {
          const size_t e = cp_index(&g->t, b, h, (int)(r0 + r), c);
          seen[e] = 1;
          dense[(((size_t)b * heads + h) * rows_logical + r) * cols + c] = from_storage(p->dtype, g->raw, e);
        }
    /* keys past kv_lens (padded batches) are in the logical layout too: their gradient is 0 */
    if (keys && !p->cu_seqlens_q)
      for (int h = 0; h < heads; h++)
        for (int r = n; r < rows_logical; r++)
          for (int c = 0; c < cols; c++) {
            const size_t e = cp_index(&g->t, b, h, r, c);
            seen[e] = 1;
            dense[(((size_t)b * heads + h) * rows_logical + r) * cols + c] = from_storage(p->dtype, g->raw, e);
          }
  }
  long wrong = 0;
  const size_t eb = elem_bytes(p->dtype);
  for (size_t e = 0; e < g->elems; e++)
    if (!seen[e] && memcmp(g->raw + e * eb, g->init + e * eb, eb) != 0 && from_storage(p->dtype, g->raw, e) != 0.0f)
      wrong++;
  free(seen);
  return wrong;
}

/* Non-finite entries of the device's dense gradient, where the reference is finite. */
static long nonfinite(const float *x, const double *ref, size_t n) {
  long bad = 0;
  for (size_t e = 0; e < n; e++) bad += !isfinite(x[e]) && isfinite(ref[e]);
  return bad;
}

/* Checks every gradient read back (bwd_run) against the reference within
 * tol (norm-wise). */
static void bwd_compare(bwd *w, double tol, const char *what) {
  const clattn_params *p = &w->pb->params;
  float *dq = malloc(w->nq * sizeof *dq), *dk = malloc(w->nk * sizeof *dk), *dv = malloc(w->nv * sizeof *dv);
  if (!CHECK(dq && dk && dv)) goto done;
  const long wq = gather(w, &w->d_q, p->q_heads, p->q_len, p->head_dim, 0, dq);
  const long wk = gather(w, &w->d_k, p->kv_heads, p->kv_len, p->head_dim, 1, dk);
  const long wv = gather(w, &w->d_v, p->kv_heads, p->kv_len, p->value_dim, 1, dv);
  CHECKF(wq == 0 && wk == 0 && wv == 0, "%s: elements outside the gradient views written (%ld %ld %ld)", what, wq, wk,
         wv);
  const double eq = cp_rel_err(dq, w->ref.d_q, w->nq), ek = cp_rel_err(dk, w->ref.d_k, w->nk),
               ev = cp_rel_err(dv, w->ref.d_v, w->nv);
  CHECKF(eq <= tol && ek <= tol && ev <= tol, "%s: relative errors d_q %.3g, d_k %.3g, d_v %.3g (tol %g)", what, eq, ek,
         ev, tol);
  const long nf =
      nonfinite(dq, w->ref.d_q, w->nq) + nonfinite(dk, w->ref.d_k, w->nk) + nonfinite(dv, w->ref.d_v, w->nv);
  CHECKF(nf == 0, "%s: %ld non-finite gradient entries where the reference is finite", what, nf);
  if (w->d_sinks) {
    float ds[64];
    CHECK(clEnqueueReadBuffer(w->pb->queue, w->d_sinks, CL_TRUE, 0, (size_t)p->q_heads * sizeof(float), ds, 0, NULL,
                              NULL) == CL_SUCCESS);
    const double e = cp_rel_err(ds, w->ref.d_sinks, (size_t)p->q_heads);
    CHECKF(e <= tol && nonfinite(ds, w->ref.d_sinks, (size_t)p->q_heads) == 0, "%s: d_sinks relative error %.3g", what,
           e);
  }
  if (w->d_w) {
    float dw[64];
    CHECK(clEnqueueReadBuffer(w->pb->queue, w->d_w, CL_TRUE, 0, (size_t)p->head_dim * sizeof(float), dw, 0, NULL,
                              NULL) == CL_SUCCESS);
    const double e = cp_rel_err(dw, w->ref.d_additive_w, (size_t)p->head_dim);
    CHECKF(e <= tol && nonfinite(dw, w->ref.d_additive_w, (size_t)p->head_dim) == 0,
           "%s: d_additive_w relative error %.3g", what, e);
  }
done:
  free(dq);
  free(dk);
  free(dv);
}

/* d_bias read back against the reference's pair gradients summed over the
 * dimensions the bias broadcasts; the buffer's pad keeps its NaN. */
static void bwd_compare_bias(bwd *w, double tol, const char *what) {
  const cp_problem *pb = w->pb;
  const clattn_params *p = &pb->params;
  const clattn_tensor *bt = &p->bias;
  const int B = p->batch, Hq = p->q_heads, M = p->q_len, N = p->kv_len;
  const size_t n = pb->bias_elems;
  double *want = calloc(n, sizeof *want);
  unsigned char *seen = calloc(n, 1);
  if (!CHECK(want && seen) || !CHECK(clEnqueueReadBuffer(pb->queue, w->d_bias, CL_TRUE, 0, n * sizeof(float),
                                                         w->d_bias_host, 0, NULL, NULL) == CL_SUCCESS))
    goto done;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          const size_t e = cp_index(bt, b, h, i, j);
          want[e] += w->ref.d_scores[(((size_t)b * Hq + h) * M + i) * N + j];
          seen[e] = 1;
        }
  float *got = malloc(n * sizeof *got);
  if (!CHECK(got != NULL)) goto done;
  long outside = 0, nonfinite_in = 0;
  for (size_t e = 0; e < n; e++) {
    got[e] = seen[e] ? w->d_bias_host[e] : 0.0f;
    if (!seen[e]) outside += !isnan(w->d_bias_host[e]);
    nonfinite_in += seen[e] && !isfinite(got[e]) && isfinite(want[e]);
  }
  for (size_t e = 0; e < n; e++)
    if (!seen[e]) want[e] = 0.0;
  const double err = cp_rel_err(got, want, n);
  CHECKF(err <= tol && outside == 0 && nonfinite_in == 0,
         "%s: d_bias relative error %.3g (tol %g), %ld elements outside the view written, %ld non-finite", what, err,
         tol, outside, nonfinite_in);
  free(got);
done:
  free(want);
  free(seen);
}

/* Runs and checks every gradient against the reference within tol. */
static void bwd_check(bwd *w, double tol, const char *what) {
  CHECK_STATUS(bwd_run(w), CLATTN_OK);
  bwd_compare(w, tol, what);
  if (w->d_bias) bwd_compare_bias(w, tol, what);
}

static cp_shape base_shape(int M, int N) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = M;
  s.kv_len = N;
  s.head_dim = 32;
  s.value_dim = 16;
  s.pad = 3;
  s.row_gap = 1;
  s.poison_gaps = 1;
  return s;
}

static void check_shape(cp_shape s, void (*edit)(cp_problem *), double tol, const char *what) {
  bwd w;
  if (bwd_setup(&w, s, edit) == 0) bwd_check(&w, tol, what);
  bwd_free(&w);
}

/* ---------- dot scoring ---------- */

static void odd_shapes_gqa(void) {
  static const int sizes[][2] = {{1, 129}, {7, 53}, {37, 37}, {53, 7}, {129, 1}};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    cp_shape s = base_shape(sizes[t][0], sizes[t][1]);
    s.seed = 10 + t;
    s.layout = t % 2 ? CP_BSHD : CP_BHSD;
    char what[64];
    snprintf(what, sizeof what, "M=%d N=%d", s.q_len, s.kv_len);
    check_shape(s, NULL, 1e-4, what);
  }
}

static void odd_head_dims_mha_and_mqa(void) {
  cp_shape s = base_shape(37, 53);
  s.head_dim = 19;
  s.value_dim = 7;
  s.kv_heads = 4;
  s.scale = 0.3f;
  check_shape(s, NULL, 1e-4, "dk=19 dv=7 MHA");
  s.kv_heads = 1;
  s.causal = 1;
  check_shape(s, NULL, 1e-4, "dk=19 dv=7 MQA causal");
}

static void causal_window_kv_lens_mask_bias_poisoned(void) {
  cp_shape s = base_shape(37, 53);
  s.causal = 1;
  s.window_left = 9;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.7;
  s.mask_bcast = CP_BCAST_HEAD;
  s.bias = CP_BIAS_RANDOM;
  s.bias_amp = 2.0;
  s.poison_disallowed = 1; /* NaN/Inf in every key and value nothing allowed reads */
  check_shape(s, NULL, 1e-4, "causal+window+kv_lens+mask+bias, poisoned");
  s.causal = 0;
  s.window_left = 3;
  s.window_right = 5;
  s.mask = CP_MASK_NONE;
  s.seed = 3;
  check_shape(s, NULL, 1e-4, "two-sided window, poisoned");
}

static void zero_rows(cp_problem *pb) { pb->kv_lens[1] = 0; /* batch row 1: every row empty */ }

static void empty_rows_give_zero(void) {
  cp_shape s = base_shape(7, 53);
  s.kv_lens = 1;
  s.causal = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.1; /* some rows have no allowed key */
  s.poison_disallowed = 1;
  check_shape(s, zero_rows, 1e-4, "empty rows");
  s.sinks = 1;
  check_shape(s, zero_rows, 1e-4, "empty rows with sinks");
}

/* A NaN in a key only the last rows may see (causal): those rows' gradients
 * are NaN, every other row's d_q stays finite and right, although the key
 * shares a 16-row block and a key block with them. */
static void nan_key(cp_problem *pb) {
  const clattn_params *p = &pb->params;
  for (int b = 0; b < p->batch; b++)
    for (int hk = 0; hk < p->kv_heads; hk++) pb->k[cp_index(&p->k, b, hk, p->kv_len - 1, 0)] = NAN;
}

static void nan_in_allowed_key_stays_in_its_rows(void) {
  cp_shape s = base_shape(37, 37);
  s.causal = 1;
  bwd w;
  if (bwd_setup(&w, s, nan_key) == 0) {
    const clattn_params *p = &w.pb->params;
    bwd_check(&w, 1e-4, "NaN key seen by the last rows");
    float *dq = malloc(w.nq * sizeof *dq);
    if (CHECK(dq != NULL) && gather(&w, &w.d_q, p->q_heads, p->q_len, p->head_dim, 0, dq) == 0) {
      long finite = 0;
      for (size_t e = 0; e < w.nq; e++) finite += isfinite(dq[e]) && isfinite(w.ref.d_q[e]);
      CHECKF(finite >= (long)(w.nq - (size_t)p->batch * p->q_heads * p->head_dim), "only %ld of %zu d_q entries finite",
             finite, w.nq);
    }
    free(dq);
  }
  bwd_free(&w);
}

/* ---------- score shaping ---------- */

static void softcap_alibi_sinks(void) {
  cp_shape s = base_shape(37, 53);
  s.softcap = 2.0f;
  s.qk_amp = 2.0;
  check_shape(s, NULL, 1e-4, "softcap");
  s.softcap = 0.0f;
  s.alibi = 1;
  s.causal = 1;
  check_shape(s, NULL, 1e-4, "alibi causal");
  s.alibi = 0;
  s.causal = 0;
  s.sinks = 1;
  check_shape(s, NULL, 1e-4, "sinks (d_sinks)");
  s.softcap = 5.0f;
  s.alibi = 1;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.poison_disallowed = 1;
  check_shape(s, NULL, 1e-4, "softcap+alibi+sinks+bias+kv_lens");
  s.alibi = 2;
  s.causal = 1;
  check_shape(s, NULL, 1e-4, "alibi per (batch, head) causal+softcap+sinks+bias+kv_lens");
}

/* ---------- storage ---------- */

static void f16_and_bf16_storage(void) {
  cp_shape s = base_shape(37, 53);
  s.causal = 1;
  s.sinks = 1;
  s.dtype = CLATTN_F16;
  check_shape(s, NULL, 1e-2, "f16");
  s.dtype = CLATTN_BF16;
  check_shape(s, NULL, 5e-2, "bf16");
}

/* ---------- additive scoring and packed sequences ---------- */

static void additive_scores(void) {
  cp_shape s = base_shape(37, 53);
  s.additive = 1;
  s.causal = 1;
  s.softcap = 3.0f;
  s.poison_disallowed = 1;
  check_shape(s, NULL, 1e-4, "additive (d_additive_w)");
}

static void packed_sequences(void) {
  cp_shape s = base_shape(37, 53);
  s.varlen = 1;
  s.causal = 1;
  s.seed = 5;
  check_shape(s, NULL, 1e-4, "cu_seqlens");
  static const int sq[] = {0, 37}, sk[] = {53, 0}; /* an empty query side and an empty key side */
  s.seq_q = sq;
  s.seq_k = sk;
  s.causal = 0;
  check_shape(s, NULL, 1e-4, "cu_seqlens with empty sequences");
}

/* ---------- the bias's gradient ---------- */

/* d_bias: each pair's dS summed over the dimensions the bias broadcasts
 * (none; batch and heads; rows, a per-key bias; heads and rows) with causal,
 * kv_lens, a mask, softcap, ALiBi per (batch, head), sinks, GQA and
 * poisoned disallowed keys; packed sequences; f16 storage; bitwise
 * repeatable; and without fwd.bias, the gradient of a zero bias. */
static void bias_gradient_sums_over_broadcast_dims(void) {
  const unsigned bcasts[] = {0, CP_BCAST_BATCH | CP_BCAST_HEAD, CP_BCAST_ROW, CP_BCAST_HEAD | CP_BCAST_ROW};
  for (size_t v = 0; v < 4; v++) {
    cp_shape s = base_shape(37, 53);
    s.causal = 1;
    s.kv_lens = 1;
    s.mask = CP_MASK_RANDOM;
    s.mask_density = 0.8;
    s.bias = CP_BIAS_RANDOM;
    s.bias_bcast = bcasts[v];
    s.softcap = 4.0f;
    s.alibi = 2;
    s.sinks = 1;
    s.poison_disallowed = 1;
    s.seed = 30 + v;
    char what[64];
    snprintf(what, sizeof what, "d_bias, broadcast flags %u", bcasts[v]);
    bwd w;
    if (bwd_setup(&w, s, NULL) == 0) {
      bwd_check(&w, 1e-4, what);
      float *first = malloc(w.pb->bias_elems * sizeof *first);
      if (CHECK(first != NULL)) { /* a second run: the same bits */
        memcpy(first, w.d_bias_host, w.pb->bias_elems * sizeof *first);
        CHECK_STATUS(bwd_run(&w), CLATTN_OK);
        CHECK(clEnqueueReadBuffer(w.pb->queue, w.d_bias, CL_TRUE, 0, w.pb->bias_elems * sizeof(float), w.d_bias_host, 0,
                                  NULL, NULL) == CL_SUCCESS);
        CHECKF(memcmp(first, w.d_bias_host, w.pb->bias_elems * sizeof *first) == 0, "%s: not bitwise repeatable", what);
      }
      free(first);
    }
    bwd_free(&w);
  }
  cp_shape s = base_shape(37, 53);
  s.varlen = 1;
  s.causal = 1;
  s.bias = CP_BIAS_RANDOM;
  s.bias_bcast = CP_BCAST_BATCH;
  check_shape(s, NULL, 1e-4, "d_bias, packed sequences");
  s = base_shape(37, 53);
  s.dtype = CLATTN_F16;
  s.bias = CP_BIAS_RANDOM;
  s.window_left = 5;
  s.window_right = 7;
  check_shape(s, NULL, 1e-2, "d_bias, f16");
  s = base_shape(7, 53);
  s.bias = CP_BIAS_CONST; /* a zero bias in the reference, none given to the backward */
  s.bias_amp = 0.0;
  s.bias_bcast = CP_BCAST_BATCH | CP_BCAST_HEAD | CP_BCAST_ROW;
  bwd w;
  if (bwd_setup(&w, s, NULL) == 0) {
    w.bp.fwd.bias.buf = NULL;
    bwd_check(&w, 1e-4, "d_bias without fwd.bias");
  }
  bwd_free(&w);
}

/* ---------- dropout ---------- */

/* The forward's dropout (the same seed and offset in fwd): dV takes the
 * dropped weights, dS the dropped dP, on every path (FA2, its atomic dQ,
 * the staged backward), with every feature that meets it: GQA, causal,
 * sinks, a bias and its gradient, softcap, ALiBi, packed sequences, f16,
 * additive scores, keys not aligned to the kernels' blocks. */
static void dropout_every_path(void) {
  cp_shape s = base_shape(37, 53);
  s.causal = 1;
  s.sinks = 1;
  s.bias = CP_BIAS_RANDOM;
  s.softcap = 4.0f;
  s.alibi = 1;
  s.poison_disallowed = 1;
  s.dropout_p = 0.3f;
  s.dropout_seed = 0xd0d0ull;
  s.dropout_offset = 12345;
  const clattn_algo paths[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED};
  for (int a = 0; a < 2; a++)
    for (int det = 1; det >= (a == 0 ? 0 : 1); det--) {
      bwd w;
      if (bwd_setup(&w, s, NULL) == 0) {
        w.bp.fwd.algo = paths[a];
        w.bp.deterministic = det;
        char what[64];
        snprintf(what, sizeof what, "dropout, %s%s", clattn_algo_name(paths[a]), det ? "" : ", atomic dQ");
        bwd_check(&w, 1e-4, what);
      }
      bwd_free(&w);
    }
  cp_shape v = base_shape(37, 53);
  v.varlen = 1;
  v.causal = 1;
  v.window_left = 6; /* the dQ pass's first keys not a multiple of 4 */
  v.dropout_p = 0.5f;
  v.dropout_seed = 7;
  check_shape(v, NULL, 1e-4, "dropout, packed sequences, window");
  cp_shape h = base_shape(37, 53);
  h.dtype = CLATTN_F16;
  h.dropout_p = 0.2f;
  h.dropout_seed = 8;
  check_shape(h, NULL, 1e-2, "dropout, f16");
  cp_shape ad = base_shape(29, 41);
  ad.additive = 1;
  ad.dropout_p = 0.6f;
  ad.dropout_seed = 9;
  check_shape(ad, NULL, 1e-4, "dropout, additive (d_additive_w)");
}

/* ---------- determinism ---------- */

static void bitwise_deterministic_20_runs(void) {
  cp_shape s = base_shape(53, 129);
  s.causal = 1;
  s.sinks = 1;
  s.kv_heads = 1;
  bwd w;
  if (bwd_setup(&w, s, NULL) != 0) {
    bwd_free(&w);
    return;
  }
  unsigned char *q0 = malloc(w.d_q.bytes), *k0 = malloc(w.d_k.bytes), *v0 = malloc(w.d_v.bytes);
  float s0[64], s1[64];
  if (!CHECK(q0 && k0 && v0)) goto done;
  w.bp.deterministic = 1; /* the atomics variant's last bits depend on scheduling */
  for (int run = 0; run < 20; run++) {
    if (!CHECK(grad_reset(w.pb, &w.d_q) == 0)) break;
    CHECK_STATUS(bwd_run(&w), CLATTN_OK);
    CHECK(clEnqueueReadBuffer(w.pb->queue, w.d_sinks, CL_TRUE, 0, 4 * sizeof(float), run ? s1 : s0, 0, NULL, NULL) ==
          CL_SUCCESS);
    if (run == 0) {
      memcpy(q0, w.d_q.raw, w.d_q.bytes);
      memcpy(k0, w.d_k.raw, w.d_k.bytes);
      memcpy(v0, w.d_v.raw, w.d_v.bytes);
      continue;
    }
    CHECKF(memcmp(q0, w.d_q.raw, w.d_q.bytes) == 0 && memcmp(k0, w.d_k.raw, w.d_k.bytes) == 0 &&
               memcmp(v0, w.d_v.raw, w.d_v.bytes) == 0 && memcmp(s0, s1, 4 * sizeof(float)) == 0,
           "run %d differs bitwise from run 0", run);
  }
done:
  free(q0);
  free(k0);
  free(v0);
  bwd_free(&w);
}

/* ---------- the paths against each other ---------- */

/* Dense logical gradients (dQ, dK, dV in turn) read back from the last run, as doubles. */
static double *dense_grads(bwd *w) {
  const clattn_params *p = &w->pb->params;
  const size_t n = w->nq + w->nk + w->nv;
  float *f = malloc(n * sizeof *f);
  double *d = malloc(n * sizeof *d);
  if (!f || !d || gather(w, &w->d_q, p->q_heads, p->q_len, p->head_dim, 0, f) != 0 ||
      gather(w, &w->d_k, p->kv_heads, p->kv_len, p->head_dim, 1, f + w->nq) != 0 ||
      gather(w, &w->d_v, p->kv_heads, p->kv_len, p->value_dim, 1, f + w->nq + w->nk) != 0) {
    free(f);
    free(d);
    return NULL;
  }
  for (size_t e = 0; e < n; e++) d[e] = f[e];
  free(f);
  return d;
}

/* The staged backward and the FA2 kernels compute the same gradients by
 * different sums: they agree far inside the reference's tolerance, on a
 * problem with every shaping feature, GQA and poisoned disallowed keys. */
static void staged_agrees_with_fused(void) {
  cp_shape s = base_shape(37, 53);
  s.causal = 1;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.8;
  s.bias = CP_BIAS_RANDOM;
  s.softcap = 4.0f;
  s.alibi = 1;
  s.sinks = 1;
  s.poison_disallowed = 1;
  s.seed = 21;
  bwd w;
  if (bwd_setup(&w, s, NULL) == 0) {
    w.bp.deterministic = 1;
    w.bp.fwd.algo = CLATTN_ALGO_FUSED;
    bwd_check(&w, 1e-4, "fused");
    double *fused = dense_grads(&w);
    float *staged = malloc((w.nq + w.nk + w.nv) * sizeof *staged);
    if (CHECK(fused && staged) &&
        CHECK(grad_reset(w.pb, &w.d_q) == 0 && grad_reset(w.pb, &w.d_k) == 0 && grad_reset(w.pb, &w.d_v) == 0)) {
      w.bp.fwd.algo = CLATTN_ALGO_STAGED;
      bwd_check(&w, 1e-4, "staged");
      const clattn_params *p = &w.pb->params;
      if (CHECK(gather(&w, &w.d_q, p->q_heads, p->q_len, p->head_dim, 0, staged) == 0 &&
                gather(&w, &w.d_k, p->kv_heads, p->kv_len, p->head_dim, 1, staged + w.nq) == 0 &&
                gather(&w, &w.d_v, p->kv_heads, p->kv_len, p->value_dim, 1, staged + w.nq + w.nk) == 0)) {
        const double eq = cp_rel_err(staged, fused, w.nq), ek = cp_rel_err(staged + w.nq, fused + w.nq, w.nk),
                     ev = cp_rel_err(staged + w.nq + w.nk, fused + w.nq + w.nk, w.nv);
        CHECKF(eq <= 1e-5 && ek <= 1e-5 && ev <= 1e-5, "staged vs fused: d_q %.3g, d_k %.3g, d_v %.3g", eq, ek, ev);
      }
      w.bp.fwd.algo = CLATTN_ALGO_GEMM; /* GEMM names the staged path too */
      bwd_check(&w, 1e-4, "fwd.algo GEMM");
    }
    free(fused);
    free(staged);
  }
  bwd_free(&w);
}

/* deterministic = 0: FA2's single pass adds dQ atomically into f32 rows of
 * its own (seen in the call's scratch), within the reference's tolerance;
 * its last bits may differ from run to run, so nothing here is bitwise.
 * With d_additive_w wanted, the two deterministic passes run instead. */
static void atomic_dq_within_tolerance(void) {
  cp_shape s = base_shape(53, 37);
  s.causal = 1;
  s.sinks = 1;
  s.poison_disallowed = 1;
  bwd w;
  if (bwd_setup(&w, s, NULL) == 0) {
    const clattn_params *p = &w.pb->params;
    const size_t dq_rows = (size_t)p->batch * p->q_heads * p->q_len * p->head_dim * sizeof(float);
    w.bp.fwd.algo = CLATTN_ALGO_FUSED;
    w.bp.deterministic = 1;
    clattn_peak_scratch_bytes(ct_context(), 1);
    bwd_check(&w, 1e-4, "deterministic");
    const size_t two_pass = clattn_peak_scratch_bytes(ct_context(), 1);
    for (int run = 0; run < 3; run++) {
      w.bp.deterministic = 0;
      CHECK(grad_reset(w.pb, &w.d_q) == 0);
      bwd_check(&w, 1e-4, "deterministic = 0");
      const size_t one_pass = clattn_peak_scratch_bytes(ct_context(), 1);
      CHECKF(one_pass == two_pass + dq_rows, "deterministic = 0: scratch %zu, expected %zu + %zu (atomic dQ rows)",
             one_pass, two_pass, dq_rows);
    }
  }
  bwd_free(&w);
  s = base_shape(37, 53);
  s.additive = 1;
  if (bwd_setup(&w, s, NULL) == 0) {
    w.bp.fwd.algo = CLATTN_ALGO_FUSED;
    w.bp.deterministic = 0;
    bwd_check(&w, 1e-4, "additive, deterministic = 0 (two passes for d_additive_w)");
    w.bp.d_additive_w = NULL;
    CHECK(grad_reset(w.pb, &w.d_q) == 0);
    cl_mem keep = w.d_w;
    w.d_w = NULL; /* not compared: not asked for */
    bwd_check(&w, 1e-4, "additive, deterministic = 0, atomic dQ");
    w.d_w = keep;
  }
  bwd_free(&w);
}

/* ---------- threads ---------- */

typedef struct {
  bwd *w;
  clattn_status st;
  cl_int finish;
} thread_job;

static void *thread_call(void *arg) {
  thread_job *j = arg;
  j->st = clattn_backward(ct_context(), &j->w->bp, 0, NULL, NULL);
  j->finish = clFinish(j->w->pb->queue);
  return NULL;
}

/* Four threads call the backward at once on one context, each with head
 * dims no other call used: four programs built concurrently (the program
 * table grows under its lock), each result right. */
static void concurrent_first_builds(void) {
  enum { T = 4 };
  static const int dims[T][2] = {{5, 3}, {6, 10}, {9, 2}, {11, 13}};
  bwd w[T];
  thread_job jobs[T];
  pthread_t tid[T];
  int ready = 1;
  for (int t = 0; t < T; t++) {
    cp_shape s = base_shape(7 + t, 19);
    s.head_dim = dims[t][0];
    s.value_dim = dims[t][1];
    s.causal = t % 2;
    s.seed = 40 + t;
    ready &= bwd_setup(&w[t], s, NULL) == 0;
  }
  if (ready) {
    int started[T];
    for (int t = 0; t < T; t++) {
      jobs[t] = (thread_job){&w[t], CLATTN_ERR_OPENCL, CL_SUCCESS};
      started[t] = pthread_create(&tid[t], NULL, thread_call, &jobs[t]) == 0;
      CHECK(started[t]);
    }
    for (int t = 0; t < T; t++)
      if (started[t]) pthread_join(tid[t], NULL);
    for (int t = 0; t < T; t++) {
      CHECKF(jobs[t].st == CLATTN_OK && jobs[t].finish == CL_SUCCESS, "thread %d: %s", t,
             clattn_status_string(jobs[t].st));
      char what[64];
      snprintf(what, sizeof what, "thread %d (dk %d, dv %d)", t, dims[t][0], dims[t][1]);
      CHECK(grad_read(w[t].pb, &w[t].d_q) == 0 && grad_read(w[t].pb, &w[t].d_k) == 0 &&
            grad_read(w[t].pb, &w[t].d_v) == 0);
      bwd_compare(&w[t], 1e-4, what);
    }
  }
  for (int t = 0; t < T; t++) bwd_free(&w[t]);
}

/* ---------- validation ---------- */

/* A call that must fail with want before anything is enqueued: it waits on
 * a user event that is completed only afterwards, and every gradient buffer
 * still holds its poison. */
static void expect_rejected(bwd *w, const clattn_backward_params *bp, clattn_status want, const char *what) {
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(w->pb->cl_ctx, &err);
  if (!CHECK(err == CL_SUCCESS)) return;
  cl_event done = (cl_event)1;
  const clattn_status st = clattn_backward(ct_context(), bp, 1, &gate, &done);
  CHECKF(st == want, "%s: got %s, expected %s (%s)", what, clattn_status_string(st), clattn_status_string(want),
         clattn_last_error(ct_context()));
  CHECKF(done == NULL, "%s: *done not cleared", what);
  CHECKF(strlen(clattn_last_error(ct_context())) > 0, "%s: no message", what);
  clSetUserEventStatus(gate, CL_COMPLETE);
  clReleaseEvent(gate);
  CHECK(clFinish(w->pb->queue) == CL_SUCCESS);
  CHECK(grad_read(w->pb, &w->d_q) == 0 && grad_read(w->pb, &w->d_k) == 0 && grad_read(w->pb, &w->d_v) == 0);
  CHECKF(memcmp(w->d_q.raw, w->d_q.init, w->d_q.bytes) == 0 && memcmp(w->d_k.raw, w->d_k.init, w->d_k.bytes) == 0 &&
             memcmp(w->d_v.raw, w->d_v.init, w->d_v.bytes) == 0,
         "%s: a gradient buffer was written", what);
}

static void validation_rejects_before_enqueue(void) {
  cp_shape s = base_shape(7, 9);
  s.sinks = 0;
  bwd w;
  if (bwd_setup(&w, s, NULL) != 0) {
    bwd_free(&w);
    return;
  }
  clattn_backward_params bp = w.bp;
  bp.fwd.lse.buf = NULL;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "no lse");
  bp = w.bp;
  bp.d_out.buf = NULL;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "no d_out");
  bp = w.bp;
  bp.fwd.out.buf = NULL;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "no out");
  bp = w.bp;
  bp.d_v.buf = NULL;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "no d_v");
  bp = w.bp;
  bp.d_k.buf = w.d_v.t.buf; /* dk = 32 > dv = 16: the d_v buffer is too small for d_k */
  bp.d_k.stride[2] = w.d_k.t.stride[2];
  expect_rejected(&w, &bp, CLATTN_ERR_BUFFER_TOO_SMALL, "d_k buffer too small");
  bp = w.bp;
  bp.d_q.offset += w.d_q.elems;
  expect_rejected(&w, &bp, CLATTN_ERR_BUFFER_TOO_SMALL, "d_q past its buffer");
  bp = w.bp;
  bp.d_out.offset += w.d_out.elems;
  expect_rejected(&w, &bp, CLATTN_ERR_BUFFER_TOO_SMALL, "d_out past its buffer");
  bp = w.bp;
  bp.d_q.stride[2] = 0;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "d_q broadcasts");
  bp = w.bp;
  bp.fwd.q_heads = 3; /* not a multiple of kv_heads: the forward's own checks */
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "q_heads % kv_heads");
  bp = w.bp;
  bp.fwd.algo = (clattn_algo)99;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "fwd.algo out of range");
  bp = w.bp;
  bp.fwd.scale = INFINITY;
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "infinite scale");
  bp = w.bp;
  bp.fwd.lse.stride[2] = 0; /* lse that broadcasts over rows cannot be the forward's */
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "lse broadcasts");
  bp = w.bp;
  bp.d_sinks = w.d_q.t.buf; /* without fwd.sinks */
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "d_sinks without sinks");
  bp = w.bp;
  bp.d_additive_w = w.d_q.t.buf; /* with dot scoring */
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "d_additive_w with dot scoring");
  /* d_bias over [B, Hq, M, N] = [2, 4, 7, 9], f32, summed where it broadcasts */
  bp = w.bp;
  bp.d_bias = (clattn_tensor){w.pb->lse_buf, 0, {4 * 7 * 9, 7 * 9, 9, 1}}; /* the lse buffer: 62 floats */
  expect_rejected(&w, &bp, CLATTN_ERR_BUFFER_TOO_SMALL, "d_bias buffer too small");
  bp.d_bias.stride[0] = bp.d_bias.stride[1] = 0; /* one [M, N] gradient: 63 floats, still one too many */
  expect_rejected(&w, &bp, CLATTN_ERR_BUFFER_TOO_SMALL, "d_bias [M, N] one float too large");
  bp.d_bias.buf = w.d_q.t.buf;
  bp.d_bias.stride[2] = 1;
  bp.d_bias.stride[3] = 2; /* rows and keys interleaved: two sums would share an element */
  expect_rejected(&w, &bp, CLATTN_ERR_INVALID_ARGUMENT, "d_bias overlaps itself");
  /* the K/V caches of inference engines are forward-only */
  bp = w.bp;
  bp.fwd.kv_dtype = CLATTN_F16; /* q in f32, k and v in f16 */
  expect_rejected(&w, &bp, CLATTN_ERR_UNSUPPORTED, "kv_dtype other than q's");
  bp = w.bp;
  bp.fwd.block_table = w.d_q.t.buf;
  bp.fwd.page_size = bp.fwd.block_table_stride = bp.fwd.num_pages = 1;
  expect_rejected(&w, &bp, CLATTN_ERR_UNSUPPORTED, "paged K/V");
  CHECK_STATUS(clattn_backward(ct_context(), NULL, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(clattn_backward(NULL, &w.bp, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(clattn_backward(ct_context(), &w.bp, 1, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  /* the forward's out and lse are read: buffers created CL_MEM_READ_ONLY will do */
  {
    cp_problem *pb = w.pb;
    void *o_host = malloc(pb->out_elems * 4), *l_host = malloc(pb->lse_elems * 4);
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    if (CHECK(o_host && l_host) && CHECK(clEnqueueReadBuffer(pb->queue, pb->out_buf, CL_TRUE, 0, pb->out_elems * 4,
                                                             o_host, 0, NULL, NULL) == CL_SUCCESS &&
                                         clEnqueueReadBuffer(pb->queue, pb->lse_buf, CL_TRUE, 0, pb->lse_elems * 4,
                                                             l_host, 0, NULL, NULL) == CL_SUCCESS)) {
      bp = w.bp;
      bp.fwd.out.buf =
          clCreateBuffer(pb->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, pb->out_elems * 4, o_host, &e1);
      bp.fwd.lse.buf =
          clCreateBuffer(pb->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, pb->lse_elems * 4, l_host, &e2);
      if (CHECK(e1 == CL_SUCCESS && e2 == CL_SUCCESS)) {
        const clattn_backward_params keep = w.bp;
        w.bp = bp;
        bwd_check(&w, 1e-4, "read-only out and lse");
        w.bp = keep;
      }
      if (bp.fwd.out.buf) clReleaseMemObject(bp.fwd.out.buf);
      if (bp.fwd.lse.buf) clReleaseMemObject(bp.fwd.lse.buf);
    }
    free(o_host);
    free(l_host);
  }
  /* and the same params, accepted, with an event handed back */
  cl_event done = NULL;
  CHECK_STATUS(clattn_backward(ct_context(), &w.bp, 0, NULL, &done), CLATTN_OK);
  CHECK(done != NULL && clWaitForEvents(1, &done) == CL_SUCCESS);
  if (done) clReleaseEvent(done);
  bwd_free(&w);
}

/* ---------- aliasing ---------- */

/* Refused because output a shares bytes with view b: expect_rejected, a
 * message naming both, and the inputs (read-write copies: a read-only
 * buffer is refused as an output before any sharing is seen) as they were. */
static void refuse_sharing(bwd *w, const clattn_backward_params *bp, const cl_mem *inputs, int n_inputs, const char *a,
                           const char *b, const char *what) {
  unsigned char *before[12] = {NULL};
  size_t n[12] = {0};
  for (int i = 0; i < n_inputs; i++) before[i] = ct_mem_bytes(inputs[i], &n[i]);
  expect_rejected(w, bp, CLATTN_ERR_INVALID_ARGUMENT, what);
  const char *msg = clattn_last_error(ct_context());
  CHECKF(strstr(msg, a) && strstr(msg, b) && strstr(msg, "share"),
         "%s: the message does not say %s shares bytes with %s: \"%s\"", what, a, b, msg);
  for (int i = 0; i < n_inputs; i++) {
    size_t m = 0;
    unsigned char *after = before[i] ? ct_mem_bytes(inputs[i], &m) : NULL;
    CHECKF(before[i] && after && m == n[i] && memcmp(before[i], after, m) == 0, "%s: a refused call changed an input",
           what);
    free(before[i]);
    free(after);
  }
}

/* A 4-d view of a backward call, by name. */
static clattn_tensor *view_named(clattn_backward_params *bp, const char *name) {
  clattn_tensor *const views[] = {&bp->fwd.q, &bp->fwd.k, &bp->fwd.v, &bp->fwd.out,
                                  &bp->d_out, &bp->d_q,   &bp->d_k,   &bp->d_v};
  static const char *const names[] = {"q", "k", "v", "out", "d_out", "d_q", "d_k", "d_v"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i])) return views[i];
  return NULL;
}

/* Every output of the backward (d_q, d_k, d_v, d_bias, d_sinks, d_additive_w)
 * may share no byte with any input (q, k, v, out, lse, d_out, mask, bias,
 * kv_lens, sinks, additive_w, alibi_slopes) nor with another output: each
 * such call, which gave wrong gradients with status OK on one path or the
 * other, is refused before anything is enqueued, and nothing changes. */
static void outputs_sharing_bytes_are_refused(void) {
  cp_shape s = base_shape(7, 9);
  s.head_dim = s.value_dim = 16; /* q, k, v, out views of one shape per side, so each fits the other's buffer */
  s.pad = 0;                     /* every view from its buffer's first byte: kv_lens, read there, meets it */
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.sinks = 1;
  s.alibi = 1;
  s.additive = 1;
  bwd w;
  if (bwd_setup(&w, s, NULL) != 0) {
    bwd_free(&w);
    return;
  }
  cp_problem *pb = w.pb;
  const clattn_params *p = &pb->params;
  clattn_backward_params rw = w.bp;
  cl_mem in[] = {
      rw.fwd.q.buf = kc_rw_copy(pb, pb->q, pb->q_elems * sizeof(float)),
      rw.fwd.k.buf = kc_rw_copy(pb, pb->k, pb->k_elems * sizeof(float)),
      rw.fwd.v.buf = kc_rw_copy(pb, pb->v, pb->v_elems * sizeof(float)),
      rw.fwd.mask.buf = kc_rw_copy(pb, pb->mask, pb->mask_elems),
      rw.fwd.bias.buf = kc_rw_copy(pb, pb->bias, pb->bias_elems * sizeof(float)),
      rw.fwd.kv_lens = kc_rw_copy(pb, pb->kv_lens, (size_t)p->batch * sizeof(int32_t)),
      rw.fwd.sinks = kc_rw_copy(pb, pb->sinks, (size_t)p->q_heads * sizeof(float)),
      rw.fwd.alibi_slopes = kc_rw_copy(pb, pb->alibi_slopes, (size_t)p->q_heads * sizeof(float)),
      rw.fwd.additive_w = kc_rw_copy(pb, pb->additive_w, (size_t)p->head_dim * sizeof(float)),
      rw.fwd.out.buf,
      rw.fwd.lse.buf,
      rw.d_out.buf,
  };
  const int n_in = sizeof in / sizeof in[0];
  for (int i = 0; i < n_in; i++)
    if (!in[i]) goto done;
  static const char *const pairs[][2] = {{"d_q", "q"}, {"d_q", "d_out"}, {"d_q", "out"}, {"d_k", "k"}, {"d_v", "v"},
                                         {"d_k", "v"}, {"d_v", "k"},     {"d_v", "d_k"}, {"d_k", "q"}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    clattn_backward_params bp = rw;
    clattn_tensor *out = view_named(&bp, pairs[i][0]);
    const clattn_tensor *on = view_named(&bp, pairs[i][1]);
    out->buf = on->buf, out->offset = on->offset;
    char what[64];
    snprintf(what, sizeof what, "%s on %s", pairs[i][0], pairs[i][1]);
    refuse_sharing(&w, &bp, in, n_in, pairs[i][0], pairs[i][1], what);
  }
  float *nan = malloc(2 * pb->k_elems * sizeof *nan);
  if (!CHECK(nan)) goto done;
  for (size_t e = 0; e < 2 * pb->k_elems; e++) nan[e] = NAN;
  cl_mem both = kc_rw_copy(pb, nan, 2 * pb->k_elems * sizeof *nan);
  free(nan);
  clattn_backward_params bp = rw;
  if (both) {
    bp.d_k.buf = bp.d_v.buf = both;
    bp.d_v.offset = bp.d_k.offset + 3 * bp.d_k.stride[2]; /* from d_k's fourth row on */
    refuse_sharing(&w, &bp, in, n_in, "d_v", "d_k", "d_v over d_k's rows 3..");
    clReleaseMemObject(both);
  }
  bp = rw;
  bp.fwd.lse.buf = bp.d_q.buf, bp.fwd.lse.offset = bp.d_q.offset;
  refuse_sharing(&w, &bp, in, n_in, "d_q", "lse", "lse read from d_q's bytes");
  bp = rw;
  bp.fwd.mask.buf = bp.d_k.buf;
  refuse_sharing(&w, &bp, in, n_in, "d_k", "mask", "mask read from d_k's bytes");
  bp = rw;
  bp.fwd.bias.buf = bp.d_v.buf;
  refuse_sharing(&w, &bp, in, n_in, "d_v", "bias", "bias read from d_v's bytes");
  bp = rw;
  bp.fwd.kv_lens = bp.d_q.buf;
  refuse_sharing(&w, &bp, in, n_in, "d_q", "kv_lens", "kv_lens read from d_q's bytes");
  bp = rw;
  bp.d_bias = bp.fwd.bias;
  refuse_sharing(&w, &bp, in, n_in, "d_bias", "bias", "d_bias on bias");
  bp = rw;
  bp.d_bias = bp.fwd.bias, bp.d_bias.buf = bp.d_q.buf; /* d_bias over d_q's bytes */
  refuse_sharing(&w, &bp, in, n_in, "d_bias", "d_q", "d_bias on d_q");
  bp = rw;
  bp.d_sinks = bp.fwd.sinks;
  refuse_sharing(&w, &bp, in, n_in, "d_sinks", "sinks", "d_sinks on sinks");
  bp = rw;
  bp.d_additive_w = bp.fwd.additive_w;
  refuse_sharing(&w, &bp, in, n_in, "d_additive_w", "additive_w", "d_additive_w on additive_w");
  bp = rw;
  bp.fwd.alibi_slopes = bp.d_sinks;
  refuse_sharing(&w, &bp, in, n_in, "d_sinks", "alibi_slopes", "alibi_slopes read from d_sinks");
  bp = rw;
  bp.d_sinks = bp.d_additive_w; /* q_heads 4 floats among head_dim 16 */
  refuse_sharing(&w, &bp, in, n_in, "d_sinks", "d_additive_w", "d_sinks on d_additive_w");
  /* through a sub-buffer of q's buffer */
  cl_buffer_region whole = {0, pb->q_elems * sizeof(float)};
  cl_int e;
  cl_mem sub = clCreateSubBuffer(rw.fwd.q.buf, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &whole, &e);
  if (CHECKF(e == CL_SUCCESS, "clCreateSubBuffer: %d", e)) {
    bp = rw;
    bp.d_q.buf = sub, bp.d_q.offset = rw.fwd.q.offset;
    refuse_sharing(&w, &bp, in, n_in, "d_q", "q", "d_q through a sub-buffer of q's");
    clReleaseMemObject(sub);
  }
  /* the same call on its own buffers is right */
  w.bp = rw;
  bwd_check(&w, 1e-4, "after the refusals, on read-write copies");
done:
  for (int i = 0; i < 9; i++) /* the copies; the rest are w's */
    if (in[i]) clReleaseMemObject(in[i]);
  bwd_free(&w);
}

/* d_q, d_k and d_v interleaved in one buffer, [B, S, 3, H, D] as training
 * code with packed QKV keeps them: they share no byte, so the call is
 * accepted, and every gradient matches the reference. */
static void packed_gradients_sharing_no_byte_are_right(void) {
  cp_shape s = base_shape(9, 9);
  s.q_heads = s.kv_heads = 2;
  s.head_dim = s.value_dim = 16;
  s.causal = 1;
  bwd w;
  if (bwd_setup(&w, s, NULL) != 0) {
    bwd_free(&w);
    return;
  }
  const clattn_params *p = &w.pb->params;
  const size_t B = (size_t)p->batch, S = (size_t)p->q_len, H = (size_t)p->q_heads, D = (size_t)p->head_dim;
  const size_t n = B * S * 3 * H * D;
  float *raw = malloc(n * sizeof *raw),
        *dense[3] = {malloc(w.nq * sizeof(float)), malloc(w.nk * sizeof(float)), malloc(w.nv * sizeof(float))};
  cl_mem packed = NULL;
  if (!CHECK(raw && dense[0] && dense[1] && dense[2])) goto done;
  for (size_t e = 0; e < n; e++) raw[e] = NAN;
  packed = kc_rw_copy(w.pb, raw, n * sizeof *raw);
  if (!packed) goto done;
  clattn_tensor *g[3] = {&w.bp.d_q, &w.bp.d_k, &w.bp.d_v};
  for (int t = 0; t < 3; t++) *g[t] = (clattn_tensor){packed, t * H * D, {S * 3 * H * D, D, 3 * H * D, 1}};
  CHECK_STATUS(clattn_backward(ct_context(), &w.bp, 0, NULL, NULL), CLATTN_OK);
  CHECK(clEnqueueReadBuffer(w.pb->queue, packed, CL_TRUE, 0, n * sizeof *raw, raw, 0, NULL, NULL) == CL_SUCCESS);
  const double *ref[3] = {w.ref.d_q, w.ref.d_k, w.ref.d_v};
  const size_t count[3] = {w.nq, w.nk, w.nv};
  for (int t = 0; t < 3; t++) {
    long nan = 0;
    for (size_t b = 0; b < B; b++)
      for (size_t h = 0; h < H; h++)
        for (size_t r = 0; r < S; r++)
          for (size_t c = 0; c < D; c++)
            nan += isnan(dense[t][((b * H + h) * S + r) * D + c] = raw[cp_index(g[t], (int)b, (int)h, (int)r, (int)c)]);
    const double err = cp_rel_err(dense[t], ref[t], count[t]);
    CHECKF(err <= 1e-4 && nan == 0, "packed %s: relative error %.3g, %ld NaN",
           t == 0   ? "d_q"
           : t == 1 ? "d_k"
                    : "d_v",
           err, nan);
  }
done:
  if (packed) clReleaseMemObject(packed);
  free(raw), free(dense[0]), free(dense[1]), free(dense[2]);
  bwd_free(&w);
}

static void defaults(void) {
  const clattn_backward_params bp = clattn_backward_params_default();
  CHECK(bp.deterministic == 1);
  CHECK(bp.d_out.buf == NULL && bp.d_q.buf == NULL && bp.d_k.buf == NULL && bp.d_v.buf == NULL);
  CHECK(bp.d_sinks == NULL && bp.d_additive_w == NULL && bp.d_bias.buf == NULL);
  CHECK(bp.fwd.alibi_batch_stride == 0);
  CHECK(isnan(bp.fwd.scale) && bp.fwd.window_left == -1 && bp.fwd.window_right == -1 && bp.fwd.lse.buf == NULL);
}

/* ---------- modifiers ---------- */

/* Through the modifiers: the reference runs them (clattn_modifier_eval)
 * and chains the score modifier's own derivative. */
static void modifiers(void) {
  static const char prefix_lm[] =
      "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  return kv_idx < cap->i[0] || kv_idx <= q_idx;\n}\n";
  static const char scaled_tanh[] = /* a score modifier with a derivative that is not 1 */
      "float clattn_score_mod(float s, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  return cap->f[0] * tanh(s / cap->f[0]) - 0.01f * (float)(h + 1) * (float)abs(q_idx - kv_idx);\n}\n"
      "float clattn_score_mod_grad(float s, int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  const float t = tanh(s / cap->f[0]);\n  return 1.0f - t * t;\n}\n";
  cp_shape s = base_shape(37, 53);
  s.mask_mod = prefix_lm;
  s.capture_i[0] = 9;
  s.poison_disallowed = 1;
  check_shape(s, NULL, 1e-4, "prefix-LM mask modifier");
  s.score_mod = scaled_tanh;
  s.capture_f[0] = 3.0f;
  s.qk_amp = 2.0;
  s.softcap = 6.0f; /* the modifier follows the built-in softcap */
  s.alibi = 1;
  s.kv_lens = 1;
  check_shape(s, NULL, 1e-4, "score and mask modifiers, softcap, ALiBi, kv_lens");
  s.mask_mod = NULL;
  s.capture_i[0] = 0;
  s.varlen = 1;
  s.kv_lens = 0;
  check_shape(s, NULL, 1e-4, "score modifier, packed sequences");
}

/* A block mask of the mask modifier: the same gradients, bit for bit
 * (the kernels skip blocks that add nothing). */
static void modifier_block_mask_keeps_every_bit(void) {
  static const char documents[] = /* documents of 8 positions, causal within each */
      "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  return q_idx / 8 == kv_idx / 8 && kv_idx <= q_idx;\n}\n";
  cp_shape s = base_shape(64, 64);
  s.mask_mod = documents;
  s.poison_disallowed = 1;
  bwd w;
  if (bwd_setup(&w, s, NULL) == 0) {
    bwd_check(&w, 1e-4, "documents");
    double *plain = dense_grads(&w);
    clattn_block_mask *bm = NULL;
    clattn_params shape = w.bp.fwd;
    shape.batch = 1;
    CHECK(clattn_block_mask_create(ct_context(), &shape, 16, 16, &bm) == CLATTN_OK);
    size_t empty = 0;
    clattn_block_mask_counts(bm, &empty, NULL, NULL);
    CHECKF(empty == (size_t)shape.q_heads * (16 - 4), "empty blocks %zu", empty); /* 4 x 4 blocks of 16 */
    w.bp.fwd.block_mask = bm;
    if (CHECK(plain && grad_reset(w.pb, &w.d_q) == 0 && grad_reset(w.pb, &w.d_k) == 0 &&
              grad_reset(w.pb, &w.d_v) == 0)) {
      bwd_check(&w, 1e-4, "documents, block mask");
      double *skipped = dense_grads(&w);
      const size_t n = w.nq + w.nk + w.nv;
      double worst = 0.0; /* atomic dQ (deterministic 0) may differ in its last bits from run to run */
      for (size_t e = 0; skipped && e < n; e++) worst = fmax(worst, fabs(plain[e] - skipped[e]));
      if (w.bp.deterministic)
        CHECKF(skipped && memcmp(plain, skipped, n * sizeof *plain) == 0, "the block mask changed the gradients");
      else
        CHECKF(skipped && worst <= 1e-6, "the block mask changed the gradients by %g", worst);
      free(skipped);
    }
    w.bp.fwd.block_mask = NULL;
    clattn_block_mask_release(bm);
    free(plain);
  }
  bwd_free(&w);
}

/* A score modifier without its derivative: refused, naming what is missing. */
static void score_modifier_without_derivative_is_unsupported(void) {
  cp_shape s = base_shape(7, 9);
  s.score_mod = "float clattn_score_mod(float s, int b, int h, int q, int k, const clattn_captures *c) { return 2 * s; }";
  bwd w;
  if (bwd_setup(&w, s, NULL) == 0) {
    CHECK(clattn_backward(ct_context(), &w.bp, 0, NULL, NULL) == CLATTN_ERR_UNSUPPORTED);
    CHECKF(strstr(clattn_last_error(ct_context()), "clattn_score_mod_grad") != NULL, "message: %s",
           clattn_last_error(ct_context()));
  }
  bwd_free(&w);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(defaults),
      CT_TEST(odd_shapes_gqa),
      CT_TEST(odd_head_dims_mha_and_mqa),
      CT_TEST(causal_window_kv_lens_mask_bias_poisoned),
      CT_TEST(empty_rows_give_zero),
      CT_TEST(nan_in_allowed_key_stays_in_its_rows),
      CT_TEST(softcap_alibi_sinks),
      CT_TEST(bias_gradient_sums_over_broadcast_dims),
      CT_TEST(f16_and_bf16_storage),
      CT_TEST(additive_scores),
      CT_TEST(packed_sequences),
      CT_TEST(dropout_every_path),
      CT_TEST(bitwise_deterministic_20_runs),
      CT_TEST(staged_agrees_with_fused),
      CT_TEST(atomic_dq_within_tolerance),
      CT_TEST(modifiers),
      CT_TEST(modifier_block_mask_keeps_every_bit),
      CT_TEST(score_modifier_without_derivative_is_unsupported),
      CT_TEST(concurrent_first_builds),
      CT_TEST(validation_rejects_before_enqueue),
      CT_TEST(outputs_sharing_bytes_are_refused),
      CT_TEST(packed_gradients_sharing_no_byte_are_right),
  };
  const char *path = getenv("CLATTN_TEST_BACKWARD");
  if (path && !strcmp(path, "staged"))
    g_algo = CLATTN_ALGO_STAGED;
  else if (path && !strcmp(path, "atomics"))
    g_deterministic = 0;
  else if (path && *path) {
    fprintf(stderr, "CLATTN_TEST_BACKWARD=%s: expected staged or atomics\n", path);
    return 1;
  }
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
