/*
 * A sweep of shapes against the fp64 reference: lengths, head and value
 * dims, GQA ratios, layouts, offsets and row gaps, causal/window/kv_lens,
 * masks and biases with broadcast strides, lse and weights. Inputs carry NaN
 * in every element no view reads, outputs are NaN-poisoned before each run,
 * so a wrong index or an unwritten element shows. fp32 results must lie
 * within 1e-5 (norm-wise relative) of the reference for every algorithm.
 *
 * Usage: test_sweep [name-filter] (the harness filter); SWEEP_CASES=n
 * overrides the number of random cases.
 */
#include <stdint.h>

#include "kit_checks.h"

#define TOL 1e-5

/* cost of the reference and of the device run, in multiply-adds */
static double work(const cp_shape *s) {
  return (double)s->batch * s->q_heads * s->q_len * s->kv_len * (s->head_dim + s->value_dim);
}

static uint64_t g_rng = 0x5EED5EEDull;

static uint32_t rnd(uint32_t n) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng % n);
}

#define PICK(arr) (arr)[rnd((uint32_t)(sizeof(arr) / sizeof((arr)[0])))]

static const int lens[] = {1, 7, 37, 53, 128, 4099};
static const int dims[] = {1, 8, 40, 64, 111, 128, 256};
static const int ratios[] = {1, 3, 4};

/* A length from lens, rarely 1 for keys (one key makes every weight exactly 1). */
static int pick_len(int keys) {
  int l = PICK(lens);
  if (keys && l == 1 && rnd(3) != 0) l = lens[1 + rnd(5)];
  return l;
}

/* A random shape whose work stays under cap. */
static cp_shape random_shape(int index, double cap) {
  cp_shape s;
  do {
    s = cp_shape_default();
    s.q_len = pick_len(0);
    s.kv_len = pick_len(1);
    if (s.q_len == 4099 && s.kv_len > 53) s.kv_len = 37;
    if (s.kv_len == 4099 && s.q_len > 53) s.q_len = 7;
    s.head_dim = PICK(dims);
    s.value_dim = rnd(3) == 0 ? PICK(dims) : s.head_dim;
    s.kv_heads = 1 + (int)rnd(2);
    s.q_heads = s.kv_heads * PICK(ratios);
    s.batch = 1 + (int)rnd(2);
    s.layout = rnd(2) ? CP_BSHD : CP_BHSD;
    s.pad = rnd(2) ? 0 : 1 + rnd(7);
    s.row_gap = rnd(3) == 0 ? 1 + rnd(4) : 0;
    s.causal = rnd(3) == 0;
    /* a left window that leaves most rows something to read */
    s.window_left = rnd(4) == 0 ? (int)(s.q_len + rnd((uint32_t)s.kv_len + 1)) : -1;
    s.window_right = rnd(6) == 0 ? (int)rnd(8) : -1;
    s.kv_lens = rnd(3) == 0;
    switch (rnd(6)) {
      case 0:
      case 1: s.mask = CP_MASK_RANDOM; break;
      case 2:
        s.mask = CP_MASK_BLOCK_DIAG;
        s.mask_blocks = 1 + (int)rnd(4);
        break;
      default: s.mask = CP_MASK_NONE; break;
    }
    s.mask_density = 0.5 + 0.1 * rnd(5);
    s.mask_bcast = rnd(8);
    if (s.mask == CP_MASK_BLOCK_DIAG) s.mask_bcast &= ~(unsigned)CP_BCAST_ROW;
    s.bias = rnd(3) == 0 ? CP_BIAS_RANDOM : CP_BIAS_NONE;
    s.bias_amp = rnd(2) ? 1.0 : 4.0;
    s.bias_bcast = rnd(8);
    if (rnd(5) == 0) s.scale = 0.05f + 0.1f * (float)rnd(10);
    s.qk_amp = rnd(4) == 0 ? 2.0 : 1.0;
    s.want_lse = rnd(4) != 0;
    s.want_weights = rnd(3) == 0 && (double)s.q_len * s.kv_len <= 600000.0;
    s.want_diag = rnd(2);
    s.softcap = rnd(4) == 0 ? 1.5f + (float)rnd(20) : 0.0f;
    s.alibi = rnd(4) == 0;
    s.sinks = rnd(4) == 0;
    s.additive = rnd(5) == 0;
    s.varlen = rnd(6) == 0;
    s.empty_rows = CLATTN_EMPTY_ZERO;
    s.poison_gaps = 1;
    s.poison_disallowed = rnd(2);
    s.seed = 1000 + (uint64_t)index;
  } while (work(&s) > cap);
  return s;
}

/* A random problem in which at most half the rows are empty (the fixed
 * cases and the semantics tests cover empty rows on purpose). */
static cp_problem *random_problem(int index, double cap) {
  for (;;) {
    cp_shape s = random_shape(index, cap);
    char err[256];
    cp_problem *pb = cp_build(&s, err, sizeof err);
    if (!pb) {
      CHECKF(0, "case %d: cp_build: %s", index, err);
      return NULL;
    }
    if (cp_reference(pb) != 0) {
      CHECKF(0, "case %d: %s", index, pb->err);
      cp_free(pb);
      return NULL;
    }
    long rows = (long)s.batch * s.q_heads * s.q_len;
    if (2 * pb->ref_empty_rows <= rows) return pb;
    cp_free(pb);
  }
}

/* Fixed cases that the random ones might miss. */
static int fixed_shapes(cp_shape *out) {
  int n = 0;
  cp_shape s;
  /* decode: one query over a long cache, GQA 4, causal, kv_lens */
  s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.q_len = 1;
  s.kv_len = 4099;
  s.head_dim = 128;
  s.value_dim = 128;
  s.causal = 1;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.layout = CP_BSHD;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = 1;
  s.want_diag = 1;
  out[n++] = s;
  /* many queries, few keys; dk != dv; head-broadcast mask */
  s = cp_shape_default();
  s.q_heads = 3;
  s.kv_heads = 1;
  s.q_len = 4099;
  s.kv_len = 7;
  s.head_dim = 40;
  s.value_dim = 111;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_HEAD;
  s.want_lse = 1;
  s.want_weights = 1;
  s.pad = 3;
  s.poison_gaps = 1;
  s.seed = 2;
  s.want_diag = 1;
  out[n++] = s;
  /* head_dim 256, batch-broadcast mask (stride[0] = 0) and bias */
  s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 4;
  s.q_len = 53;
  s.kv_len = 128;
  s.head_dim = 256;
  s.value_dim = 64;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_BATCH;
  s.bias = CP_BIAS_RANDOM;
  s.bias_bcast = CP_BCAST_BATCH | CP_BCAST_HEAD;
  s.want_lse = 1;
  s.want_weights = 1;
  s.layout = CP_BSHD;
  s.row_gap = 2;
  s.pad = 1;
  s.poison_gaps = 1;
  s.seed = 3;
  out[n++] = s;
  /* head_dim 1, value_dim 1, causal with M > N (empty leading rows) */
  s = cp_shape_default();
  s.q_heads = 3;
  s.kv_heads = 1;
  s.q_len = 128;
  s.kv_len = 37;
  s.head_dim = 1;
  s.value_dim = 1;
  s.causal = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 4;
  out[n++] = s;
  /* sliding window both sides, BSHD with offsets, key-padding mask */
  s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 128;
  s.kv_len = 128;
  s.head_dim = 64;
  s.value_dim = 64;
  s.window_left = 16;
  s.window_right = 3;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_ROW | CP_BCAST_HEAD;
  s.layout = CP_BSHD;
  s.pad = 7;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = 5;
  s.want_diag = 1;
  out[n++] = s;
  /* block-diagonal packed sequences with causal, fully broadcast mask */
  s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 4;
  s.q_len = 128;
  s.kv_len = 128;
  s.head_dim = 111;
  s.value_dim = 40;
  s.causal = 1;
  s.mask = CP_MASK_BLOCK_DIAG;
  s.mask_blocks = 3;
  s.mask_bcast = CP_BCAST_HEAD | CP_BCAST_BATCH;
  s.batch = 2;
  s.want_lse = 1;
  s.seed = 6;
  out[n++] = s;
  /* long keys with a window: decode-shaped sliding window */
  s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 7;
  s.kv_len = 4099;
  s.head_dim = 64;
  s.value_dim = 64;
  s.causal = 1;
  s.window_left = 500;
  s.want_lse = 1;
  s.want_weights = 1;
  s.poison_disallowed = 1;
  s.seed = 7;
  s.want_diag = 1;
  out[n++] = s;
  return n;
}

/* Runs pb with every algorithm and frees it. */
static void run_case(int index, cp_problem *pb, int *ran) {
  char d[512];
  cp_describe(&pb->shape, d, sizeof d);
  printf("  case %2d: %s\n", index, d);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_result r;
    int got = kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__);
    if (got < 0) break;
    if (got == 0) continue;
    char f[512];
    int ok = cp_result_ok(&r, TOL);
    printf("    %-6s %s  %s\n", clattn_algo_name(kc_algos[a]), ok ? "ok  " : "FAIL", cp_result_format(&r, f, sizeof f));
    if (!ok && r.status != CLATTN_OK) printf("           last error: %s\n", clattn_last_error(ct_context()));
    CHECKF(ok, "case %d, %s: %s", index, clattn_algo_name(kc_algos[a]), f);
    (*ran)++;
  }
  cp_free(pb);
}

static void fixed_shapes_match_reference(void) {
  cp_shape shapes[16];
  int n = fixed_shapes(shapes), ran = 0;
  for (int c = 0; c < n; c++) {
    char err[256];
    cp_problem *pb = cp_build(&shapes[c], err, sizeof err);
    if (CHECKF(pb != NULL, "case %d: cp_build: %s", c, err)) run_case(c, pb, &ran);
  }
  CHECK(ran > 0); /* kc_run records any required algorithm that did not run */
}

static void random_shapes_match_reference(void) {
  int n = 120, ran = 0;
  const char *env = getenv("SWEEP_CASES");
  if (env && atoi(env) > 0) n = atoi(env);
  for (int c = 0; c < n; c++) {
    cp_problem *pb = random_problem(c, 5e7);
    if (pb) run_case(100 + c, pb, &ran);
  }
  CHECK(ran > 0); /* kc_run records any required algorithm that did not run */
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(fixed_shapes_match_reference),
      CT_TEST(random_shapes_match_reference),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
