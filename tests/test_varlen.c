/*
 * Packed variable-length batches (cu_seqlens_q / cu_seqlens_k): every
 * algorithm against the reference, equal to running each sequence alone in
 * a padded batch of one, sequences isolated from each other bitwise,
 * zero-length sequences, lengths 1 and 4099 mixed, malformed offsets kept
 * inside the views, and the validation rules.
 */
#include "check.h"
#include "api/api.h"
#include "kit_checks.h"

static cp_shape packed(int batch, int q_len, int kv_len, uint64_t seed) {
  cp_shape s = cp_shape_default();
  s.batch = batch;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.head_dim = 40;
  s.value_dim = 24;
  s.varlen = 1;
  s.causal = 1;
  s.want_lse = 1;
  s.want_diag = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = seed;
  return s;
}

static void packed_batches_match_reference(void) {
  cp_shape shapes[4];
  shapes[0] = packed(5, 37, 53, 1);
  shapes[1] = packed(3, 7, 300, 2);
  shapes[1].layout = CP_BSHD;
  shapes[1].pad = 3;
  shapes[1].row_gap = 1;
  shapes[1].causal = 0;
  shapes[1].window_left = 20;
  shapes[1].mask = CP_MASK_RANDOM;
  shapes[1].bias = CP_BIAS_RANDOM;
  shapes[2] = packed(4, 1, 700, 3); /* decode shaped: direct kernels */
  shapes[2].head_dim = 64;
  shapes[2].value_dim = 64;
  shapes[2].want_diag = 0;
  shapes[3] = packed(3, 20, 20, 4);
  shapes[3].want_weights = 1;
  shapes[3].sinks = 1;
  shapes[3].alibi = 1;
  for (int c = 0; c < 4; c++) {
    cp_problem *pb;
    KC_BUILD(pb, &shapes[c]);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    cp_free(pb);
  }
}

/* Sequence b of a packed run equals a batch of one holding only it. */
static void each_sequence_equals_its_own_run(void) {
  cp_shape s = packed(4, 29, 41, 5);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    for (int b = 0; b < s.batch; b++) {
      const int m = pb->cu_q[b + 1] - pb->cu_q[b], n = pb->cu_k[b + 1] - pb->cu_k[b];
      if (m == 0 || n == 0) continue;
      cp_shape one = cp_shape_default();
      one.q_heads = s.q_heads;
      one.kv_heads = s.kv_heads;
      one.q_len = m;
      one.kv_len = n;
      one.head_dim = s.head_dim;
      one.value_dim = s.value_dim;
      one.causal = 1;
      one.want_lse = 1;
      cp_problem *alone;
      KC_BUILD(alone, &one);
      const clattn_params *q = &alone->params;
      for (int h = 0; h < s.q_heads; h++)
        for (int i = 0; i < m; i++)
          for (int d = 0; d < s.head_dim; d++)
            alone->q[cp_index(&q->q, 0, h, i, d)] = pb->q[cp_index(&p->q, b, h, pb->cu_q[b] + i, d)];
      for (int h = 0; h < s.kv_heads; h++)
        for (int j = 0; j < n; j++) {
          for (int d = 0; d < s.head_dim; d++)
            alone->k[cp_index(&q->k, 0, h, j, d)] = pb->k[cp_index(&p->k, b, h, pb->cu_k[b] + j, d)];
          for (int c = 0; c < s.value_dim; c++)
            alone->v[cp_index(&q->v, 0, h, j, c)] = pb->v[cp_index(&p->v, b, h, pb->cu_k[b] + j, c)];
        }
      if (KC_RUN_OK(alone, kc_algos[a], 1e-5) > 0) {
        double worst = 0.0;
        for (int h = 0; h < s.q_heads; h++)
          for (int i = 0; i < m; i++)
            for (int c = 0; c < s.value_dim; c++) {
              double x = pb->out[(((size_t)b * s.q_heads + h) * s.q_len + i) * s.value_dim + c];
              double y = alone->out[(((size_t)h) * m + i) * s.value_dim + c];
              worst = fmax(worst, fabs(x - y));
            }
        CHECKF(worst <= 1e-6, "%s: sequence %d (%d x %d): differs from its own run by %g",
               clattn_algo_name(kc_algos[a]), b, m, n, worst);
      }
      cp_free(alone);
    }
  }
  cp_free(pb);
}

/* Changing one sequence's tokens changes no other sequence's output, bitwise. */
static void sequences_are_isolated(void) {
  cp_shape s = packed(4, 33, 47, 6);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_result r;
    if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
    float *before = malloc(pb->out_elems * sizeof *before);
    REQUIRE(before);
    memcpy(before, pb->out_raw, pb->out_elems * sizeof *before);
    const int b = 1; /* rewrite sequence 1's keys, values and queries */
    for (int h = 0; h < s.kv_heads; h++)
      for (int j = pb->cu_k[b]; j < pb->cu_k[b + 1]; j++) {
        for (int d = 0; d < s.head_dim; d++) pb->k[cp_index(&p->k, 0, h, j, d)] += 0.5f;
        for (int c = 0; c < s.value_dim; c++) pb->v[cp_index(&p->v, 0, h, j, c)] *= -2.0f;
      }
    for (int h = 0; h < s.q_heads; h++)
      for (int i = pb->cu_q[b]; i < pb->cu_q[b + 1]; i++)
        for (int d = 0; d < s.head_dim; d++) pb->q[cp_index(&p->q, 0, h, i, d)] -= 0.25f;
    if (CHECK(cp_write_inputs(pb) == 0) && kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) > 0) {
      long changed_other = 0, changed_own = 0;
      for (int h = 0; h < s.q_heads; h++)
        for (int i = 0; i < p->total_q; i++)
          for (int c = 0; c < s.value_dim; c++) {
            const size_t e = cp_index(&p->out, 0, h, i, c);
            const int own = i >= pb->cu_q[b] && i < pb->cu_q[b + 1];
            if (memcmp(&before[e], &pb->out_raw[e], sizeof(float)) != 0) own ? changed_own++ : changed_other++;
          }
      CHECKF(changed_other == 0 && (changed_own > 0 || pb->cu_q[b + 1] == pb->cu_q[b]),
             "%s: %ld elements of other sequences changed, %ld of its own", clattn_algo_name(kc_algos[a]),
             changed_other, changed_own);
    }
    free(before);
  }
  cp_free(pb);
}

/* Zero-length sequences (queries, keys or both), lengths 1 and 4099 mixed. */
static void zero_length_and_mixed_lengths(void) {
  const int lens_q[] = {1, 0, 3, 4099, 2, 0};
  const int lens_k[] = {4099, 5, 0, 4099, 1, 0};
  cp_shape s = packed(6, 4099, 4099, 7);
  s.q_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 16;
  s.value_dim = 16;
  s.causal = 0;
  s.want_diag = 1;
  s.seq_q = lens_q;
  s.seq_k = lens_k;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_result r;
    if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
    char line[512];
    /* sequence 2 has 3 queries and no keys: 6 empty rows (2 heads) */
    CHECKF(cp_result_ok(&r, 1e-5) && r.empty_rows == 6, "%s: %s", clattn_algo_name(kc_algos[a]),
           cp_result_format(&r, line, sizeof line));
  }
  /* EMPTY_ERROR: rows without keys are empty rows, rows that do not exist are not */
  pb->params.empty_rows = CLATTN_EMPTY_ERROR;
  pb->params.algo = CLATTN_ALGO_FUSED;
  CHECK(cp_write_inputs(pb) == 0);
  CHECK(clattn_forward(ct_context(), &pb->params, 0, NULL, NULL) == CLATTN_ERR_EMPTY_ROW);
  pb->cu_k[3] = pb->cu_k[2] + 1; /* give sequence 2 one key: no empty row left */
  CHECK(cp_write_inputs(pb) == 0);
  CHECK(clattn_forward(ct_context(), &pb->params, 0, NULL, NULL) == CLATTN_OK);
  clFinish(clattn_cl_queue(ct_context()));
  cp_free(pb);
}

/* Offsets that decrease, pass the totals or are negative: the kernels clamp
 * them, so nothing outside the views is read or written. */
static void malformed_offsets_stay_inside_the_views(void) {
  const int bad[][4] = {{0, 50, 10, 30}, {-5, 3, 2, 1000}, {0, 0, 0, 0}, {30, 20, 10, 0}};
  for (int v = 0; v < 4; v++) {
    cp_shape s = packed(3, 16, 16, 8);
    s.pad = 5;
    s.row_gap = 2;
    s.poison_disallowed = 0;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (int b = 0; b < 4; b++) pb->cu_q[b] = pb->cu_k[b] = bad[v][b];
    for (size_t a = 0; a < KC_NALGOS; a++) {
      cp_result r;
      if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
      /* the gaps and pads of out were NaN-filled: they must still be NaN */
      const clattn_params *p = &pb->params;
      unsigned char *in_view = calloc(pb->out_elems, 1);
      REQUIRE(in_view);
      for (int h = 0; h < s.q_heads; h++)
        for (int i = 0; i < p->total_q; i++)
          for (int c = 0; c < s.value_dim; c++) in_view[cp_index(&p->out, 0, h, i, c)] = 1;
      long outside = 0;
      for (size_t e = 0; e < pb->out_elems; e++)
        if (!in_view[e] && !isnan(pb->out_raw[e])) outside++;
      CHECKF(r.status == CLATTN_OK && outside == 0, "offsets %d,%d,%d,%d, %s: status %s, %ld writes outside the view",
             bad[v][0], bad[v][1], bad[v][2], bad[v][3], clattn_algo_name(kc_algos[a]), clattn_status_string(r.status),
             outside);
      free(in_view);
    }
    cp_free(pb);
  }
}

static void validation_rules(void) {
  cp_shape s = packed(3, 8, 8, 9);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  REQUIRE(cp_upload(pb, ct_context()) == 0);
  clattn_params p = pb->params;
  CHECKF(ca_check_forward(ct_context(), &p, NULL) == CLATTN_OK, "%s", clattn_last_error(ct_context()));
  p.cu_seqlens_k = NULL;
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_INVALID_ARGUMENT &&
        strstr(clattn_last_error(ct_context()), "cu_seqlens_k"));
  p = pb->params;
  p.kv_lens = p.cu_seqlens_q;
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_INVALID_ARGUMENT &&
        strstr(clattn_last_error(ct_context()), "kv_lens"));
  p = pb->params;
  p.k.stride[0] = 1;
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_INVALID_ARGUMENT &&
        strstr(clattn_last_error(ct_context()), "k.stride[0]"));
  p = pb->params;
  p.total_q = 0;
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  p = pb->params;
  p.total_kv += 1000; /* more rows than k holds */
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_BUFFER_TOO_SMALL);
  p = pb->params;
  p.lse.buf = p.entropy.buf = p.max_weight.buf = p.argmax.buf = NULL; /* only q, k, v, out and the offsets */
  p.batch += 5;                                                       /* cu_seqlens shorter than batch + 1 */
  CHECK(ca_check_forward(ct_context(), &p, NULL) == CLATTN_ERR_BUFFER_TOO_SMALL &&
        strstr(clattn_last_error(ct_context()), "cu_seqlens"));
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(packed_batches_match_reference),
      CT_TEST(each_sequence_equals_its_own_run),
      CT_TEST(sequences_are_isolated),
      CT_TEST(zero_length_and_mixed_lengths),
      CT_TEST(malformed_offsets_stay_inside_the_views),
      CT_TEST(validation_rules),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
