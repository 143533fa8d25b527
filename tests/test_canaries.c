/*
 * Canaries: every output view (out, lse, weights, entropy, max_weight,
 * argmax) lies inside a larger buffer (a large offset, row gaps, column
 * stride 2, [B,H,S,D] or [B,S,H,D] order, a guard band after it), and
 * every element of those buffers is set to a known bit pattern before the
 * call. Afterwards:
 *   - every element outside the views still holds the pattern, bit for bit;
 *   - every element inside was written (no longer the pattern);
 *   - the results match the fp64 reference;
 *   - q, k, v, mask, bias and kv_lens are bitwise unchanged.
 * Shapes are not multiples of any tile (1, 7, 37, 53, 129), so the global
 * sizes are rounded up past the problem; every algorithm runs (FUSED
 * without weights), on the default context and on one with a tiny scratch
 * budget (the staged and GEMM paths then run many chunks).
 */
#include <stdint.h>

#include "kit_checks.h"

#define PATTERN 0x7FA5A5A5u /* a NaN payload no kernel writes */

typedef struct {
  size_t offset; /* elements before the view */
  size_t col;    /* column stride */
  size_t gap;    /* unused elements after each row */
  cp_layout layout;
} vspec;

/* A [B,H,R,C] view after spec; returns the buffer's elements (view + guard band). */
static size_t make_view(clattn_tensor *t, const vspec *v, int B, int H, int R, int C, size_t guard) {
  size_t row = (size_t)C * v->col + v->gap;
  memset(t->stride, 0, sizeof t->stride);
  t->offset = v->offset;
  t->stride[3] = v->col;
  if (v->layout == CP_BHSD) {
    t->stride[2] = row;
    t->stride[1] = row * (size_t)R;
    t->stride[0] = t->stride[1] * (size_t)H;
  } else {
    t->stride[1] = row;
    t->stride[2] = row * (size_t)H;
    t->stride[0] = t->stride[2] * (size_t)R;
  }
  return v->offset + t->stride[0] * (size_t)B + guard;
}

/* Re-lays an input of the problem: a new view, NaN everywhere else in the buffer. */
static int relay_input(float **host, size_t *elems, clattn_tensor *t, const vspec *v, int B, int H, int R, int C) {
  clattn_tensor old = *t;
  float *src = *host;
  size_t n = make_view(t, v, B, H, R, C, 64);
  float *buf = malloc(n * sizeof(float));
  if (!buf) return -1;
  for (size_t i = 0; i < n; i++) buf[i] = NAN;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) buf[cp_index(t, b, h, r, c)] = src[cp_index(&old, b, h, r, c)];
  free(src);
  *host = buf;
  *elems = n;
  return 0;
}

/* A new view for an output; the raw host array grows to the buffer's size. */
static void *relay_output(void *raw, size_t *elems, clattn_tensor *t, const vspec *v, int B, int H, int R, int C) {
  size_t n = make_view(t, v, B, H, R, C, 97);
  void *p = realloc(raw, n * 4);
  if (p) *elems = n;
  return p;
}

#define RELAY_OUT(field, elems, view, spec, R, C)                                    \
  do {                                                                               \
    void *np_ = relay_output(pb->field, (elems), &p->view, (spec), B, Hq, (R), (C)); \
    if (np_)                                                                         \
      pb->field = np_;                                                               \
    else                                                                             \
      ok = 0;                                                                        \
  } while (0)

typedef struct {
  const char *name;
  int B, Hq, Hkv, M, N, dk, dv;
  int causal, window_left, kv_lens, want_lse, want_weights, want_diag;
  cp_mask_kind mask;
  cp_bias_kind bias;
  vspec in, out, row; /* inputs; out/weights; lse and diagnostics */
} canary_case;

/* Marks the elements of view t (dims B,H,R,C) in mark. */
static void mark_view(unsigned char *mark, const clattn_tensor *t, int B, int H, int R, int C) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) mark[cp_index(t, b, h, r, c)] = 1;
}

/* Counts, in a raw output buffer, the elements outside view t that lost the
 * pattern and the elements inside that kept it. */
static int count_buffer(const void *raw, size_t n, const clattn_tensor *t, int B, int H, int R, int C,
                        size_t *clobbered, size_t *unwritten, size_t *first_clobbered, size_t *first_unwritten) {
  unsigned char *mark = calloc(n ? n : 1, 1);
  if (!mark) return -1;
  mark_view(mark, t, B, H, R, C);
  const uint32_t *w = raw;
  *clobbered = *unwritten = 0;
  *first_clobbered = *first_unwritten = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    if (!mark[i] && w[i] != PATTERN) {
      if ((*clobbered)++ == 0) *first_clobbered = i;
    } else if (mark[i] && w[i] == PATTERN) {
      if ((*unwritten)++ == 0) *first_unwritten = i;
    }
  }
  free(mark);
  return 0;
}

static void check_buffer(const char *what, const char *label, const void *raw, size_t n, const clattn_tensor *t, int B,
                         int H, int R, int C) {
  size_t clobbered = 0, unwritten = 0, first_clobbered = 0, first_unwritten = 0;
  if (!CHECK(count_buffer(raw, n, t, B, H, R, C, &clobbered, &unwritten, &first_clobbered, &first_unwritten) == 0))
    return;
  CHECKF(clobbered == 0, "%s: %s: %zu elements outside the view were written (first at %zu of %zu, view offset %zu)",
         label, what, clobbered, first_clobbered, n, t->offset);
  CHECKF(unwritten == 0, "%s: %s: %zu elements of the view were not written (first at %zu)", label, what, unwritten,
         first_unwritten);
}

/* The checker itself: a write one element past a view and a view element
 * left alone are both seen. */
static void canary_checker_detects(void) {
  clattn_tensor t = {NULL, 0, {0}};
  vspec v = {10, 2, 3, CP_BSHD};
  size_t n = make_view(&t, &v, 2, 3, 5, 7, 16);
  uint32_t *w = malloc(n * 4);
  REQUIRE(w);
  for (size_t i = 0; i < n; i++) w[i] = PATTERN;
  for (int b = 0; b < 2; b++)
    for (int h = 0; h < 3; h++)
      for (int r = 0; r < 5; r++)
        for (int c = 0; c < 7; c++) w[cp_index(&t, b, h, r, c)] = 0;
  size_t cl = 0, un = 0, fc = 0, fu = 0;
  REQUIRE(count_buffer(w, n, &t, 2, 3, 5, 7, &cl, &un, &fc, &fu) == 0);
  CHECK(cl == 0 && un == 0);
  w[cp_index(&t, 1, 2, 4, 6) + 1] = 0;   /* the column gap after the last element */
  w[cp_index(&t, 0, 1, 2, 3)] = PATTERN; /* one element not written */
  REQUIRE(count_buffer(w, n, &t, 2, 3, 5, 7, &cl, &un, &fc, &fu) == 0);
  CHECK(cl == 1 && un == 1 && fc == cp_index(&t, 1, 2, 4, 6) + 1 && fu == cp_index(&t, 0, 1, 2, 3));
  free(w);
}

static int fill_pattern(cp_problem *pb, cl_mem m, size_t elems) {
  if (!m) return 0;
  uint32_t pat = PATTERN;
  cl_int e = clEnqueueFillBuffer(pb->queue, m, &pat, sizeof pat, 0, elems * 4, 0, NULL, NULL);
  return e == CL_SUCCESS ? 0 : -1;
}

/* The inputs on the device are what was uploaded, bit for bit. */
static void check_inputs(cp_problem *pb, const char *label) {
  struct {
    const char *name;
    cl_mem m;
    const void *host;
    size_t bytes;
  } in[] = {
      {"q", pb->q_buf, pb->q, pb->q_elems * 4},
      {"k", pb->k_buf, pb->k, pb->k_elems * 4},
      {"v", pb->v_buf, pb->v, pb->v_elems * 4},
      {"mask", pb->mask_buf, pb->mask, pb->mask_elems},
      {"bias", pb->bias_buf, pb->bias, pb->bias_elems * 4},
      {"kv_lens", pb->kv_lens_buf, pb->kv_lens, (size_t)pb->params.batch * 4},
  };
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    if (!in[i].m) continue;
    void *got = malloc(in[i].bytes);
    if (!CHECK(got)) return;
    cl_int e = clEnqueueReadBuffer(pb->queue, in[i].m, CL_TRUE, 0, in[i].bytes, got, 0, NULL, NULL);
    CHECKF(e == CL_SUCCESS && memcmp(got, in[i].host, in[i].bytes) == 0, "%s: input %s changed", label, in[i].name);
    free(got);
  }
}

static long g_runs, g_elements;

static void run_case(clattn_context *ctx, const char *ctx_name, const canary_case *k) {
  cp_shape s = cp_shape_default();
  s.batch = k->B;
  s.q_heads = k->Hq;
  s.kv_heads = k->Hkv;
  s.q_len = k->M;
  s.kv_len = k->N;
  s.head_dim = k->dk;
  s.value_dim = k->dv;
  s.causal = k->causal;
  s.window_left = k->window_left;
  s.kv_lens = k->kv_lens;
  s.want_lse = k->want_lse;
  s.want_weights = k->want_weights;
  s.want_diag = k->want_diag;
  s.mask = k->mask;
  s.bias = k->bias;
  s.seed = (uint64_t)(k->M * 131 + k->N);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  clattn_params *p = &pb->params;
  const int B = k->B, Hq = k->Hq, Hk = k->Hkv, M = k->M, N = k->N;
  int ok = relay_input(&pb->q, &pb->q_elems, &p->q, &k->in, B, Hq, M, k->dk) == 0 &&
           relay_input(&pb->k, &pb->k_elems, &p->k, &k->in, B, Hk, N, k->dk) == 0 &&
           relay_input(&pb->v, &pb->v_elems, &p->v, &k->in, B, Hk, N, k->dv) == 0;
  RELAY_OUT(out_raw, &pb->out_elems, out, &k->out, M, k->dv);
  if (k->want_lse) RELAY_OUT(lse_raw, &pb->lse_elems, lse, &k->row, M, 1);
  if (k->want_weights) RELAY_OUT(weights_raw, &pb->weights_elems, weights, &k->out, M, N);
  if (k->want_diag) {
    RELAY_OUT(entropy_raw, &pb->diag_elems, entropy, &k->row, M, 1);
    RELAY_OUT(max_weight_raw, &pb->diag_elems, max_weight, &k->row, M, 1);
    RELAY_OUT(argmax_raw, &pb->diag_elems, argmax, &k->row, M, 1);
  }
  if (!CHECKF(ok, "%s: out of host memory", k->name) || !CHECKF(cp_upload(pb, ctx) == 0, "upload: %s", pb->err)) {
    cp_free(pb);
    return;
  }
  for (size_t a = 0; a < KC_NALGOS; a++) {
    clattn_algo algo = kc_algos[a];
    if (kc_algo_filtered_out(algo)) continue;
    char label[256];
    snprintf(label, sizeof label, "%s [%s, %s]", k->name, clattn_algo_name(algo), ctx_name);
    p->algo = algo;
    if (fill_pattern(pb, pb->out_buf, pb->out_elems) || fill_pattern(pb, pb->lse_buf, pb->lse_elems) ||
        fill_pattern(pb, pb->weights_buf, pb->weights_elems) || fill_pattern(pb, pb->entropy_buf, pb->diag_elems) ||
        fill_pattern(pb, pb->max_weight_buf, pb->diag_elems) || fill_pattern(pb, pb->argmax_buf, pb->diag_elems) ||
        clFinish(pb->queue) != CL_SUCCESS) {
      CHECKF(0, "%s: filling the canaries failed", label);
      break;
    }
    clattn_status st = clattn_forward(ctx, p, 0, NULL, NULL);
    clFinish(pb->queue);
    if (st == CLATTN_ERR_UNSUPPORTED && kc_algo_optional(algo, p)) continue;
    if (!CHECKF(st == CLATTN_OK, "%s: %s: %s", label, clattn_status_string(st), clattn_last_error(ctx))) continue;
    g_runs++;
    if (!CHECKF(cp_read_outputs(pb) == 0, "%s: read: %s", label, pb->err)) continue;
    check_buffer("out", label, pb->out_raw, pb->out_elems, &p->out, B, Hq, M, k->dv);
    g_elements += (long)pb->out_elems;
    if (k->want_lse) check_buffer("lse", label, pb->lse_raw, pb->lse_elems, &p->lse, B, Hq, M, 1);
    if (k->want_weights) {
      check_buffer("weights", label, pb->weights_raw, pb->weights_elems, &p->weights, B, Hq, M, N);
      g_elements += (long)pb->weights_elems;
    }
    if (k->want_diag) {
      check_buffer("entropy", label, pb->entropy_raw, pb->diag_elems, &p->entropy, B, Hq, M, 1);
      check_buffer("max_weight", label, pb->max_weight_raw, pb->diag_elems, &p->max_weight, B, Hq, M, 1);
      check_buffer("argmax", label, pb->argmax_raw, pb->diag_elems, &p->argmax, B, Hq, M, 1);
    }
    cp_result r;
    memset(&r, 0, sizeof r);
    if (CHECKF(cp_compare(pb, &r) == 0, "%s: compare: %s", label, pb->err)) {
      r.status = st;
      char f[512];
      CHECKF(cp_result_ok(&r, 2e-4), "%s: %s", label, cp_result_format(&r, f, sizeof f));
    }
    check_inputs(pb, label);
  }
  cp_free(pb);
}

/* in / out / row specs */
#define BHSD(off, col, gap) \
  { (off), (col), (gap), CP_BHSD }
#define BSHD(off, col, gap) \
  { (off), (col), (gap), CP_BSHD }

static const canary_case cases[] = {
    {"1x1 d=1", 1, 1, 1, 1, 1, 1, 1, 0, -1, 0, 1, 1, 1, CP_MASK_NONE, CP_BIAS_NONE, BHSD(1000, 1, 3), BHSD(1000, 1, 3),
     BHSD(777, 1, 2)},
    {"M=7 N=37 dk=7 dv=53 GQA causal", 2, 2, 1, 7, 37, 7, 53, 1, -1, 0, 1, 1, 1, CP_MASK_NONE, CP_BIAS_NONE,
     BSHD(4099, 2, 5), BSHD(4099, 2, 5), BSHD(1001, 2, 3)},
    {"M=37 N=53 dk=37 dv=7 mask bias", 1, 3, 3, 37, 53, 37, 7, 0, -1, 0, 1, 1, 1, CP_MASK_RANDOM, CP_BIAS_RANDOM,
     BHSD(12345, 2, 0), BHSD(12345, 2, 0), BHSD(3, 1, 7)},
    {"M=53 N=129 dk=53 dv=37 kv_lens window", 1, 4, 2, 53, 129, 53, 37, 1, 40, 1, 1, 0, 1, CP_MASK_NONE, CP_BIAS_NONE,
     BSHD(513, 1, 11), BSHD(70000, 2, 11), BSHD(99, 2, 1)},
    {"M=129 N=7 d=16 weights", 1, 2, 1, 129, 7, 16, 16, 0, -1, 0, 1, 1, 1, CP_MASK_NONE, CP_BIAS_NONE, BHSD(17, 2, 1),
     BHSD(17, 2, 1), BHSD(17, 2, 0)},
    {"M=129 N=129 d=32 causal (fused blocks)", 1, 2, 2, 129, 129, 32, 32, 1, -1, 0, 1, 0, 0, CP_MASK_NONE, CP_BIAS_NONE,
     BSHD(31, 1, 3), BSHD(100003, 2, 0), BHSD(5, 1, 1)},
    /* decode: K and V read in place (column stride 1), split-KV + merge */
    {"decode M=1 N=1061 d=32 split", 2, 4, 1, 1, 1061, 32, 32, 0, -1, 1, 1, 0, 0, CP_MASK_NONE, CP_BIAS_NONE,
     BHSD(4096, 1, 32), BSHD(9999, 2, 3), BSHD(4444, 3, 2)},
    {"decode M=7 N=600 d=16 diag", 1, 2, 2, 7, 600, 16, 16, 0, -1, 0, 1, 0, 1, CP_MASK_NONE, CP_BIAS_NONE,
     BSHD(64, 1, 0), BHSD(300, 2, 7), BHSD(1, 2, 1)},
};

static clattn_context *g_chunked;

static void canaries_default_context(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ct_context(), "default", &cases[i]);
}

static void canaries_chunked_context(void) {
  REQUIRE(g_chunked != NULL);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(g_chunked, "scratch 1000 B", &cases[i]);
  printf("    %ld calls checked, %ld output elements\n", g_runs, g_elements);
}

static void cleanup(void) {
  clattn_destroy(g_chunked);
  g_chunked = NULL;
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(canary_checker_detects),
      CT_TEST(canaries_default_context),
      CT_TEST(canaries_chunked_context),
  };
  ct_context();
  /* a tiny scratch budget: staged and GEMM go a few rows at a time */
  setenv("CLATTN_SCRATCH_BYTES", "1000", 1);
  if (clattn_create(NULL, &g_chunked) != CLATTN_OK) g_chunked = NULL;
  unsetenv("CLATTN_SCRATCH_BYTES");
  ct_cleanup = cleanup;
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
