/*
 * Left-padded caches (clattn_params.cache_leftpad): batch row b's keys are
 * rows cache_leftpad[b] .. kv_lens[b] - 1 of its cache, aligned on their own
 * count. Every algorithm against the reference with the padding rows
 * poisoned, over masks, windows, ALiBi, sinks, GQA and shapes that are not
 * tile multiples; a padded row equal to the same keys in a cache of their
 * own; starts past the end clamped; the validation rules.
 */
#include "check.h"
#include "api/api.h"
#include "kit_checks.h"

static cp_shape padded(int batch, int q_len, int kv_len, uint64_t seed) {
  cp_shape s = cp_shape_default();
  s.batch = batch;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.head_dim = 40;
  s.value_dim = 24;
  s.leftpad = 1;
  s.causal = 1;
  s.want_lse = 1;
  s.want_diag = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = seed;
  return s;
}

static void left_padded_rows_match_reference(void) {
  cp_shape shapes[5];
  shapes[0] = padded(5, 7, 53, 1);
  shapes[1] = padded(3, 1, 300, 2); /* decode shaped: the direct kernels */
  shapes[1].head_dim = shapes[1].value_dim = 64;
  shapes[1].want_diag = 0;
  shapes[2] = padded(4, 37, 53, 3);
  shapes[2].layout = CP_BSHD;
  shapes[2].pad = 3;
  shapes[2].row_gap = 1;
  shapes[2].causal = 0;
  shapes[2].window_left = 9;
  shapes[2].window_right = 2;
  shapes[2].mask = CP_MASK_RANDOM;
  shapes[2].bias = CP_BIAS_RANDOM;
  shapes[3] = padded(3, 20, 20, 4);
  shapes[3].want_weights = 1;
  shapes[3].sinks = 1;
  shapes[3].alibi = 2;
  shapes[3].softcap = 4.0f;
  shapes[4] = padded(2, 3, 4099, 5); /* a long cache, split across keys */
  shapes[4].head_dim = shapes[4].value_dim = 32;
  for (int c = 0; c < 5; c++) {
    cp_problem *pb;
    KC_BUILD(pb, &shapes[c]);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    cp_free(pb);
  }
}

/* Row b of a left-padded batch equals a cache of its keys alone, bitwise on
 * the same path: the padding shifts nothing but where the keys are read. */
static void padded_row_equals_its_keys_alone(void) {
  cp_shape s = padded(3, 5, 61, 6);
  s.alibi = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    for (int b = 0; b < s.batch; b++) {
      const int k0 = pb->leftpad[b], n = pb->kv_lens[b] - k0;
      if (n == 0) continue;
      cp_shape one = s;
      one.batch = 1;
      one.kv_len = n;
      one.leftpad = 0;
      one.poison_disallowed = 0;
      one.seed = 100 + (uint64_t)b;
      cp_problem *alone;
      KC_BUILD(alone, &one);
      const clattn_params *q = &alone->params;
      for (int h = 0; h < s.q_heads; h++)
        for (int i = 0; i < s.q_len; i++)
          for (int d = 0; d < s.head_dim; d++)
            alone->q[cp_index(&q->q, 0, h, i, d)] = pb->q[cp_index(&p->q, b, h, i, d)];
      for (int h = 0; h < s.kv_heads; h++)
        for (int j = 0; j < n; j++) {
          for (int d = 0; d < s.head_dim; d++)
            alone->k[cp_index(&q->k, 0, h, j, d)] = pb->k[cp_index(&p->k, b, h, k0 + j, d)];
          for (int c = 0; c < s.value_dim; c++)
            alone->v[cp_index(&q->v, 0, h, j, c)] = pb->v[cp_index(&p->v, b, h, k0 + j, c)];
        }
      if (KC_RUN_OK(alone, kc_algos[a], 1e-5) > 0) {
        double worst = 0.0;
        for (int h = 0; h < s.q_heads; h++)
          for (int i = 0; i < s.q_len; i++)
            for (int c = 0; c < s.value_dim; c++) {
              const size_t at = (((size_t)b * s.q_heads + h) * s.q_len + i) * s.value_dim + c;
              worst = fmax(worst, fabs(pb->out[at] - alone->out[((size_t)h * s.q_len + i) * s.value_dim + c]));
            }
        CHECKF(worst <= 1e-6, "%s: row %d (keys %d .. %d): differs from its keys alone by %g",
               clattn_algo_name(kc_algos[a]), b, k0, k0 + n - 1, worst);
      }
      cp_free(alone);
    }
  }
  cp_free(pb);
}

/* Starts past a row's end, negative ones and a row left with no key: the
 * kernels clamp them (a start past kv_lens[b] leaves the row empty) and read
 * nothing outside the views. */
static void hostile_starts_are_clamped(void) {
  cp_shape s = padded(4, 6, 29, 7);
  s.poison_disallowed = 0; /* poisoned below, once the starts are set */
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const int32_t starts[4] = {-5, 29, 1 << 30, 3};
  for (int b = 0; b < 4; b++) pb->leftpad[b] = starts[b];
  pb->kv_lens[3] = 3; /* row 3: no key left */
  cp_poison_disallowed(pb);
  for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
  cp_free(pb);
}

static void validation_rules(void) {
  cp_shape s = padded(2, 4, 16, 8);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  clattn_context *ctx = ct_context();
  REQUIRE(cp_upload(pb, ctx) == 0);
  clattn_params p = pb->params;
  p.kv_lens = NULL;
  CHECK(clattn_forward(ctx, &p, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(clattn_last_error(ctx), "cache_leftpad without kv_lens") != NULL, "%s", clattn_last_error(ctx));
  cl_int e;
  cl_mem small = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_ONLY, 4, NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  p = pb->params;
  p.cache_leftpad = small;
  CHECK(clattn_forward(ctx, &p, 0, NULL, NULL) == CLATTN_ERR_BUFFER_TOO_SMALL);
  CHECKF(strstr(clattn_last_error(ctx), "cache_leftpad") != NULL, "%s", clattn_last_error(ctx));
  clReleaseMemObject(small);
  /* the backward takes no left-padded cache */
  clattn_backward_params bp = clattn_backward_params_default();
  bp.fwd = pb->params;
  CHECK(clattn_backward(ctx, &bp, 0, NULL, NULL) == CLATTN_ERR_UNSUPPORTED);
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(left_padded_rows_match_reference),
      CT_TEST(padded_row_equals_its_keys_alone),
      CT_TEST(hostile_starts_are_clamped),
      CT_TEST(validation_rules),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
