/*
 * The fp64 reference alone (no device): the seeds' worked examples with
 * their exact numbers, and the semantics the device paths are checked
 * against (empty rows, window/causal allowed sets, GQA head mapping,
 * disallowed NaN inertness, NaN propagation).
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "reference.h"
#include "worked.h"

/* Params for B=1, Hq=H, Hkv=Hk, M x N, dk, dv with dense [B,H,S,D] views and
 * everything else absent (independent of the library's defaults). */
static clattn_params dense_params(int H, int Hk, int M, int N, int dk, int dv) {
  clattn_params p;
  memset(&p, 0, sizeof p);
  p.batch = 1;
  p.q_heads = H;
  p.kv_heads = Hk;
  p.q_len = M;
  p.kv_len = N;
  p.head_dim = dk;
  p.value_dim = dv;
  p.dtype = CLATTN_F32;
  p.scale = NAN;
  p.window_left = -1;
  p.window_right = -1;
  p.empty_rows = CLATTN_EMPTY_ZERO;
  size_t sq[4] = {(size_t)H * M * dk, (size_t)M * dk, (size_t)dk, 1};
  size_t sk[4] = {(size_t)Hk * N * dk, (size_t)N * dk, (size_t)dk, 1};
  size_t sv[4] = {(size_t)Hk * N * dv, (size_t)N * dv, (size_t)dv, 1};
  size_t so[4] = {(size_t)H * M * dv, (size_t)M * dv, (size_t)dv, 1};
  size_t sm[4] = {(size_t)H * M * N, (size_t)M * N, (size_t)N, 1};
  memcpy(p.q.stride, sq, sizeof sq);
  memcpy(p.k.stride, sk, sizeof sk);
  memcpy(p.v.stride, sv, sizeof sv);
  memcpy(p.out.stride, so, sizeof so);
  memcpy(p.mask.stride, sm, sizeof sm);
  memcpy(p.bias.stride, sm, sizeof sm);
  return p;
}

/* One query over n keys: runs ref_forward, returns its status. */
static int run1(clattn_params *p, const float *q, const float *k, const float *v, const unsigned char *mask,
                double *out, double *w, double *lse, long *empty) {
  ref_inputs in = {.q = q, .k = k, .v = v, .mask = mask};
  ref_outputs o = {.out = out, .lse = lse, .weights = w};
  int rc = ref_forward(p, &in, &o);
  if (empty) *empty = o.empty_rows;
  return rc;
}

/* Every worked example of the seeds: the reference gives the printed
 * numbers within their rounding. */
static void worked_examples_give_the_seeds_numbers(void) {
  for (int i = 0; i < CP_N_WORKED; i++) {
    const cp_worked *e = &cp_worked_examples[i];
    clattn_params p = dense_params(1, 1, 1, e->n, e->dk, e->dv);
    p.scale = e->scale;
    double out[2], w[3];
    REQUIRE(run1(&p, e->q, e->k, e->v, e->allowed, out, w, NULL, NULL) == 0);
    for (int d = 0; d < e->dv; d++)
      CHECKF(fabs(out[d] - e->want_out[d]) <= e->tol_out, "%s: out[%d] = %.9g, seeds %g", e->name, d, out[d],
             e->want_out[d]);
    for (int j = 0; j < e->n; j++)
      CHECKF(fabs(w[j] - e->want_w[j]) <= e->tol_w, "%s: w[%d] = %.9g, seeds %g", e->name, j, w[j], e->want_w[j]);
  }
}

/* The positive read to full precision, and what the rounded numbers imply. */
static void positive_read_matches_worked_example(void) {
  const cp_worked *e = &cp_worked_examples[0];
  clattn_params p = dense_params(1, 1, 1, e->n, e->dk, e->dv);
  double out[2], w[3];
  REQUIRE(run1(&p, e->q, e->k, e->v, NULL, out, w, NULL, NULL) == 0);
  /* 1.2f and 0.8f are not exact: the example's numbers hold to ~1e-7 */
  CHECK_NEAR(out[0], 8.638325843083024, 1e-6);
  CHECK_NEAR(out[1], 1.3616741569169766, 1e-6);
  CHECK(w[0] > w[2] && w[2] > w[1]);
  CHECK_NEAR(ref_scale(&p), 1.0 / sqrt(2.0), 1e-15);
}

/* Exact where the example's numbers are: a collision splits evenly, scale 0
 * averages, a masked key weighs exactly 0. */
static void exact_splits_means_and_masked_zero(void) {
  const cp_worked *mask = &cp_worked_examples[1], *coll = &cp_worked_examples[2], *unif = &cp_worked_examples[3];
  double out[2], w[3];
  clattn_params p = dense_params(1, 1, 1, mask->n, mask->dk, mask->dv);
  REQUIRE(run1(&p, mask->q, mask->k, mask->v, mask->allowed, out, w, NULL, NULL) == 0);
  CHECK(w[0] == 0.0);
  p = dense_params(1, 1, 1, coll->n, coll->dk, coll->dv);
  REQUIRE(run1(&p, coll->q, coll->k, coll->v, NULL, out, w, NULL, NULL) == 0);
  CHECK_NEAR(w[0], 0.5, 1e-15);
  CHECK_NEAR(w[1], 0.5, 1e-15);
  CHECK_NEAR(out[0], 50.0, 1e-12);
  p = dense_params(1, 1, 1, unif->n, unif->dk, unif->dv);
  p.scale = 0.0f;
  REQUIRE(run1(&p, unif->q, unif->k, unif->v, NULL, out, w, NULL, NULL) == 0);
  CHECK_NEAR(out[0], 8.0, 1e-12);
  for (int j = 0; j < 3; j++) CHECK_NEAR(w[j], 1.0 / 3.0, 1e-15);
}

static void lse_is_log_sum_exp_of_scores(void) {
  const float q[] = {1, 0}, k[] = {1, 0, 0, 1, -1, 0}, v[] = {10, 20, 40};
  clattn_params p = dense_params(1, 1, 1, 3, 2, 1);
  double out[1], lse[1];
  REQUIRE(run1(&p, q, k, v, NULL, out, NULL, lse, NULL) == 0);
  double s = 1.0 / sqrt(2.0);
  CHECK_NEAR(lse[0], log(exp(s) + exp(0.0) + exp(-s)), 1e-14);
  /* huge logits stay finite: the row max is subtracted */
  p.scale = 2e4f;
  REQUIRE(run1(&p, q, k, v, NULL, out, NULL, lse, NULL) == 0);
  CHECK(isfinite(out[0]) && isfinite(lse[0]));
  CHECK_NEAR(out[0], 10.0, 1e-9);
  CHECK_NEAR(lse[0], 2e4, 1e-6);
  p.scale = -2e4f;
  REQUIRE(run1(&p, q, k, v, NULL, out, NULL, lse, NULL) == 0);
  CHECK_NEAR(out[0], 40.0, 1e-9);
}

static void empty_rows_give_zero_and_minus_inf(void) {
  /* two rows: row 0 fully masked, row 1 allowed; a -inf bias empties a row too */
  const float q[] = {1, 0, 0, 1}, k[] = {1, 0, 0, 1}, v[] = {3, 5};
  const unsigned char mask[] = {0, 0, 1, 1};
  clattn_params p = dense_params(1, 1, 2, 2, 2, 1);
  double out[2], w[4], lse[2];
  long empty = -1;
  REQUIRE(run1(&p, q, k, v, mask, out, w, lse, &empty) == 0);
  CHECK(empty == 1);
  CHECK(out[0] == 0.0 && lse[0] == -INFINITY && w[0] == 0.0 && w[1] == 0.0);
  CHECK(isfinite(out[1]) && isfinite(lse[1]));

  const float bias[] = {-INFINITY, -INFINITY, 0, -INFINITY};
  ref_inputs in = {.q = q, .k = k, .v = v, .bias = bias};
  ref_outputs o = {.out = out, .lse = lse, .weights = w};
  REQUIRE(ref_forward(&p, &in, &o) == 0);
  CHECK(o.empty_rows == 1);
  CHECK(out[0] == 0.0 && lse[0] == -INFINITY);
  CHECK_NEAR(out[1], 3.0, 1e-15); /* only key 0 remains for row 1 */
  CHECK(w[2] == 1.0 && w[3] == 0.0);

  /* kv_lens = 0 empties every row of the batch; lengths clamp to [0, N] */
  const int32_t lens0[] = {0}, lens_big[] = {99};
  ref_inputs in2 = {.q = q, .k = k, .v = v, .kv_lens = lens0};
  o.empty_rows = 0;
  REQUIRE(ref_forward(&p, &in2, &o) == 0);
  CHECK(o.empty_rows == 2);
  in2.kv_lens = lens_big;
  REQUIRE(ref_forward(&p, &in2, &o) == 0);
  CHECK(o.empty_rows == 0);
}

/* A +inf score makes the row NaN (its weights are NaN) even where dropout
 * drops every key: the row's softmax, not the dropped sum, decides. */
static void inf_score_row_is_nan_under_dropout(void) {
  const float q[] = {-INFINITY}, k[] = {-INFINITY}, v[] = {2};
  clattn_params p = dense_params(1, 1, 1, 1, 1, 1);
  double out[1], lse[1];
  REQUIRE(run1(&p, q, k, v, NULL, out, NULL, lse, NULL) == 0);
  CHECK(isnan(out[0]) && isnan(lse[0]));
  p.dropout_p = 0.999f; /* some seed drops the one key */
  int dropped = 0;
  for (p.dropout_seed = 0; p.dropout_seed < 64 && !dropped; p.dropout_seed++) {
    if (ref_dropout_kept(&p, 0, 0, 0, 0)) continue;
    dropped = 1;
    REQUIRE(run1(&p, q, k, v, NULL, out, NULL, lse, NULL) == 0);
    CHECK(isnan(out[0]) && isnan(lse[0]));
  }
  CHECK(dropped);
}

/* The window/causal allowed set, against the formula written out. */
static void window_and_causal_allowed_sets_are_bottom_right(void) {
  const int shapes[][2] = {{5, 9}, {9, 5}, {1, 7}, {6, 6}};
  const int wins[] = {-1, 0, 1, 3};
  long checked = 0, bad = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    int M = shapes[si][0], N = shapes[si][1];
    clattn_params p = dense_params(1, 1, M, N, 1, 1);
    ref_inputs in = {0};
    for (int causal = 0; causal < 2; causal++)
      for (size_t a = 0; a < 4; a++)
        for (size_t c = 0; c < 4; c++) {
          p.causal = causal;
          p.window_left = wins[a];
          p.window_right = wins[c];
          int right = causal ? 0 : wins[c];
          for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
              int pos = i + N - M;
              int want = (wins[a] < 0 || j >= pos - wins[a]) && (right < 0 || j <= pos + right);
              checked++;
              if (ref_allowed(&p, &in, 0, 0, i, j) != want) bad++;
            }
        }
  }
  CHECKF(bad == 0, "%ld of %ld (i, j) pairs disagree with the window formula", bad, checked);

  /* decode step: M = 1 sees the whole cache under causal */
  clattn_params p = dense_params(1, 1, 1, 8, 1, 1);
  ref_inputs in = {0};
  p.causal = 1;
  for (int j = 0; j < 8; j++) CHECK(ref_allowed(&p, &in, 0, 0, 0, j));
  /* square causal: the usual lower triangle */
  p = dense_params(1, 1, 4, 4, 1, 1);
  p.causal = 1;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) CHECK(ref_allowed(&p, &in, 0, 0, i, j) == (j <= i));
  /* causal with a wider explicit right window stays causal */
  p.window_right = 2;
  CHECK(!ref_allowed(&p, &in, 0, 0, 0, 1));
}

static void gqa_head_reads_kv_head_h_over_group(void) {
  /* Hq = 6, Hkv = 2: heads 0..2 read kv head 0, heads 3..5 read kv head 1 */
  enum { H = 6, HK = 2, M = 2, N = 3, D = 2 };
  float q[H * M * D], k[HK * N * D], v[HK * N * D];
  for (int i = 0; i < H * M * D; i++) q[i] = (float)((i * 7 % 11) - 5) / 4.0f;
  for (int i = 0; i < HK * N * D; i++) k[i] = (float)((i * 5 % 13) - 6) / 3.0f;
  for (int i = 0; i < HK * N * D; i++) v[i] = (float)(i + 1);
  clattn_params p = dense_params(H, HK, M, N, D, D);
  double out[H * M * D];
  ref_inputs in = {.q = q, .k = k, .v = v};
  ref_outputs o = {.out = out, .lse = NULL, .weights = NULL};
  REQUIRE(ref_forward(&p, &in, &o) == 0);
  for (int h = 0; h < H; h++) {
    int g = h / (H / HK);
    clattn_params p1 = dense_params(1, 1, M, N, D, D);
    double out1[M * D];
    ref_inputs in1 = {.q = q + h * M * D, .k = k + g * N * D, .v = v + g * N * D};
    ref_outputs o1 = {.out = out1, .lse = NULL, .weights = NULL};
    REQUIRE(ref_forward(&p1, &in1, &o1) == 0);
    for (int x = 0; x < M * D; x++)
      CHECKF(out[h * M * D + x] == out1[x], "head %d element %d: %g vs single-head %g", h, x, out[h * M * D + x],
             out1[x]);
  }
}

static void disallowed_nan_never_reaches_reference_output(void) {
  /* keys 2,3 are past kv_len 2 and hold NaN/Inf; key 1 is masked and holds NaN */
  const float q[] = {1, 0};
  const float k[] = {1, 0, NAN, NAN, NAN, 0, INFINITY, 1};
  const float v[] = {7, NAN, INFINITY, NAN};
  const unsigned char mask[] = {1, 0, 1, 1};
  const int32_t lens[] = {2};
  clattn_params p = dense_params(1, 1, 1, 4, 2, 1);
  double out[1], w[4], lse[1];
  ref_inputs in = {.q = q, .k = k, .v = v, .mask = mask, .kv_lens = lens};
  ref_outputs o = {.out = out, .lse = lse, .weights = w};
  REQUIRE(ref_forward(&p, &in, &o) == 0);
  CHECK(out[0] == 7.0);
  CHECK(w[0] == 1.0 && w[1] == 0.0 && w[2] == 0.0 && w[3] == 0.0);
  CHECK_NEAR(lse[0], 1.0 / sqrt(2.0), 1e-15);
}

static void nan_in_allowed_score_poisons_only_its_row(void) {
  /* two query rows; row 1's query holds NaN */
  const float q[] = {1, 0, NAN, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2};
  clattn_params p = dense_params(1, 1, 2, 2, 2, 1);
  double out[2], lse[2];
  ref_inputs in = {.q = q, .k = k, .v = v};
  ref_outputs o = {.out = out, .lse = lse, .weights = NULL};
  REQUIRE(ref_forward(&p, &in, &o) == 0);
  CHECK(isfinite(out[0]) && isfinite(lse[0]));
  CHECK(isnan(out[1]) && isnan(lse[1]));
  CHECK(o.empty_rows == 0);
}

static void strided_views_and_broadcast_mask_index_correctly(void) {
  /* The same problem stored BSHD with an offset and a head-broadcast mask
   * equals the dense BHSD one. B=2, H=2, M=3, N=4, D=2. */
  enum { B = 2, H = 2, M = 3, N = 4, D = 2, OFF = 5 };
  float q[B * H * M * D], k[B * H * N * D], v[B * H * N * D];
  unsigned char mask[B * M * N];
  for (int i = 0; i < B * H * M * D; i++) q[i] = (float)((i * 3 % 7) - 3) / 2.0f;
  for (int i = 0; i < B * H * N * D; i++) k[i] = (float)((i * 5 % 9) - 4) / 3.0f;
  for (int i = 0; i < B * H * N * D; i++) v[i] = (float)(i % 10) - 4.5f;
  for (int i = 0; i < B * M * N; i++) mask[i] = (unsigned char)((i * 7 % 5) != 0);
  unsigned char mask_full[B * H * M * N];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int x = 0; x < M * N; x++) mask_full[(b * H + h) * M * N + x] = mask[b * M * N + x];

  clattn_params p = dense_params(H, H, M, N, D, D);
  p.batch = B;
  double ref[B * H * M * D], got[B * H * M * D];
  ref_inputs in = {.q = q, .k = k, .v = v, .mask = mask_full};
  ref_outputs o = {.out = ref, .lse = NULL, .weights = NULL};
  REQUIRE(ref_forward(&p, &in, &o) == 0);

  /* re-store q, k, v as [B,S,H,D] after OFF elements; mask as [B,1,M,N] */
  float q2[OFF + B * H * M * D], k2[OFF + B * H * N * D], v2[OFF + B * H * N * D];
  unsigned char m2[OFF + B * M * N];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      for (int i = 0; i < M; i++)
        for (int d = 0; d < D; d++) q2[OFF + ((b * M + i) * H + h) * D + d] = q[((b * H + h) * M + i) * D + d];
      for (int j = 0; j < N; j++)
        for (int d = 0; d < D; d++) {
          k2[OFF + ((b * N + j) * H + h) * D + d] = k[((b * H + h) * N + j) * D + d];
          v2[OFF + ((b * N + j) * H + h) * D + d] = v[((b * H + h) * N + j) * D + d];
        }
    }
  memcpy(m2 + OFF, mask, sizeof mask);
  clattn_params p2 = p;
  size_t sq[4] = {(size_t)M * H * D, D, (size_t)H * D, 1};
  size_t skv[4] = {(size_t)N * H * D, D, (size_t)H * D, 1};
  size_t sm[4] = {(size_t)M * N, 0, N, 1};
  memcpy(p2.q.stride, sq, sizeof sq);
  memcpy(p2.k.stride, skv, sizeof skv);
  memcpy(p2.v.stride, skv, sizeof skv);
  memcpy(p2.mask.stride, sm, sizeof sm);
  p2.q.offset = p2.k.offset = p2.v.offset = p2.mask.offset = OFF;
  ref_inputs in2 = {.q = q2, .k = k2, .v = v2, .mask = m2};
  ref_outputs o2 = {.out = got};
  REQUIRE(ref_forward(&p2, &in2, &o2) == 0);
  for (int x = 0; x < B * H * M * D; x++)
    CHECKF(got[x] == ref[x], "element %d: strided %g vs dense %g", x, got[x], ref[x]);
  CHECK(o.empty_rows == o2.empty_rows);
}

static void paired_permutation_leaves_reference_output(void) {
  const float q[] = {2, 0}, k[] = {2, 0, 0, 2, 1.2f, 0.8f}, v[] = {10, 0, 0, 10, 6, 4};
  const float kp[] = {1.2f, 0.8f, 2, 0, 0, 2}, vp[] = {6, 4, 10, 0, 0, 10};
  clattn_params p = dense_params(1, 1, 1, 3, 2, 2);
  double out[2], outp[2];
  REQUIRE(run1(&p, q, k, v, NULL, out, NULL, NULL, NULL) == 0);
  REQUIRE(run1(&p, q, kp, vp, NULL, outp, NULL, NULL, NULL) == 0);
  CHECK_NEAR(out[0], outp[0], 1e-13);
  CHECK_NEAR(out[1], outp[1], 1e-13);
}

static void unusable_params_are_rejected(void) {
  const float q[] = {1, 0}, k[] = {1, 0}, v[] = {1};
  double out[1];
  clattn_params p = dense_params(1, 1, 1, 1, 2, 1);
  CHECK(run1(&p, q, k, v, NULL, out, NULL, NULL, NULL) == 0);
  clattn_params bad = p;
  bad.q_len = 0;
  CHECK(run1(&bad, q, k, v, NULL, out, NULL, NULL, NULL) == -1);
  bad = p;
  bad.head_dim = -1;
  CHECK(run1(&bad, q, k, v, NULL, out, NULL, NULL, NULL) == -1);
  bad = p;
  bad.q_heads = 3;
  bad.kv_heads = 2;
  CHECK(run1(&bad, q, k, v, NULL, out, NULL, NULL, NULL) == -1);
  bad = p;
  bad.dtype = CLATTN_F16;
  CHECK(run1(&bad, q, k, v, NULL, out, NULL, NULL, NULL) == -1);
  bad = p;
  bad.window_left = -2;
  CHECK(run1(&bad, q, k, v, NULL, out, NULL, NULL, NULL) == -1);
  CHECK(run1(&p, q, k, v, NULL, NULL, NULL, NULL, NULL) == -1);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(worked_examples_give_the_seeds_numbers),     CT_TEST(positive_read_matches_worked_example),
      CT_TEST(exact_splits_means_and_masked_zero),         CT_TEST(lse_is_log_sum_exp_of_scores),
      CT_TEST(empty_rows_give_zero_and_minus_inf),         CT_TEST(inf_score_row_is_nan_under_dropout),
      CT_TEST(window_and_causal_allowed_sets_are_bottom_right),
      CT_TEST(gqa_head_reads_kv_head_h_over_group),        CT_TEST(disallowed_nan_never_reaches_reference_output),
      CT_TEST(nan_in_allowed_score_poisons_only_its_row),  CT_TEST(strided_views_and_broadcast_mask_index_correctly),
      CT_TEST(paired_permutation_leaves_reference_output), CT_TEST(unusable_params_are_rejected),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
