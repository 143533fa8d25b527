/*
 * Dropout (clattn_params.dropout_p, dropout_seed, dropout_offset): the
 * Philox4x32-10 behind it against Random123's published answers; the
 * library's host mask (clattn_dropout_mask) against the reference's own;
 * every path against the fp64 reference (which drops with its own Philox)
 * over shapes that are not tile multiples, GQA, packed sequences, masks,
 * ALiBi, sinks, windows, 16-bit storage, decode with split keys, the
 * routing matrix; dropped keys' NaN and Inf values never mixed in; the
 * kept share; seeds and offsets; plans; bitwise repeatability; refusals.
 */
#include "check.h"
#include "api/api.h"
#include "kit_checks.h"

/* Random123's known answers for Philox4x32-10 (its tests/kat_vectors). */
static void philox_matches_random123_answers(void) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    ref_philox4x32_10(kat[t], kat[t] + 4, out);
    CHECKF(memcmp(out, kat[t] + 6, sizeof out) == 0, "vector %d: %08x %08x %08x %08x", t, out[0], out[1], out[2],
           out[3]);
  }
}

static clattn_params dropping(float p, uint64_t seed, uint64_t offset) {
  clattn_params q = clattn_params_default();
  q.dropout_p = p;
  q.dropout_seed = seed;
  q.dropout_offset = offset;
  return q;
}

/* clattn_dropout_mask is the reference's mask, element for element, at
 * rows and keys past 2^16 and offsets that carry into the counter's high
 * word; dropout_p 0 keeps everything. */
static void host_mask_is_the_reference_mask(void) {
  const float ps[] = {0.0f, 0.1f, 0.5f, 0.93f};
  const uint64_t offsets[] = {0, 7, 0xfffffffffull, 0xffffffff00000000ull};
  unsigned char mask[37 * 53];
  for (size_t a = 0; a < 4; a++)
    for (size_t o = 0; o < 4; o++) {
      const clattn_params p = dropping(ps[a], 0x1234567890abcdefull + a, offsets[o]);
      const int b = (int)o, h = 3, row0 = o == 3 ? 70000 : 0, col0 = o == 2 ? 65533 : 1;
      REQUIRE(clattn_dropout_mask(&p, b, h, row0, 37, col0, 53, mask) == CLATTN_OK);
      long differ = 0;
      for (int r = 0; r < 37; r++)
        for (int c = 0; c < 53; c++) differ += mask[r * 53 + c] != ref_dropout_kept(&p, b, h, row0 + r, col0 + c);
      CHECKF(differ == 0, "p=%g offset %llx: %ld entries differ", (double)ps[a], (unsigned long long)offsets[o],
             differ);
    }
  clattn_params bad = dropping(1.0f, 1, 0);
  CHECK(clattn_dropout_mask(&bad, 0, 0, 0, 1, 0, 1, mask) == CLATTN_ERR_INVALID_ARGUMENT);
  bad.dropout_p = 0.5f;
  CHECK(clattn_dropout_mask(&bad, 0, 0, 0, 1, 0, 1, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(clattn_dropout_mask(&bad, 0, -1, 0, 1, 0, 1, mask) == CLATTN_ERR_INVALID_ARGUMENT);
}

/* The share kept over many draws is 1 - p within five standard deviations,
 * and different seeds or offsets draw different masks. */
static void kept_share_and_streams(void) {
  static unsigned char a[256 * 256], b[256 * 256];
  const float ps[] = {0.1f, 0.5f, 0.9f};
  for (int t = 0; t < 3; t++) {
    const clattn_params p = dropping(ps[t], 42, 0);
    REQUIRE(clattn_dropout_mask(&p, 1, 2, 0, 256, 0, 256, a) == CLATTN_OK);
    long kept = 0;
    for (int i = 0; i < 256 * 256; i++) kept += a[i];
    const double n = 256.0 * 256.0, want = (1.0 - ps[t]) * n, sd = sqrt(n * ps[t] * (1.0 - ps[t]));
    CHECKF(fabs((double)kept - want) <= 5.0 * sd, "p=%g: %ld of %.0f kept, expected %.0f", (double)ps[t], kept, n,
           want);
  }
  const clattn_params p = dropping(0.5f, 42, 0), seed = dropping(0.5f, 43, 0),
                      next = dropping(0.5f, 42, (uint64_t)256 << 32);
  REQUIRE(clattn_dropout_mask(&p, 0, 0, 0, 256, 0, 256, a) == CLATTN_OK);
  const clattn_params *others[] = {&seed, &next};
  for (int o = 0; o < 2; o++) {
    REQUIRE(clattn_dropout_mask(others[o], 0, 0, 0, 256, 0, 256, b) == CLATTN_OK);
    long same = 0;
    for (int i = 0; i < 256 * 256; i++) same += a[i] == b[i];
    CHECKF(same < 256 * 256 * 0.55, "%s: %ld of %d entries the same", o ? "offset past the rows" : "another seed", same,
           256 * 256);
  }
}

static cp_shape dropped(int q_len, int kv_len, float p, uint64_t seed) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.head_dim = 40;
  s.value_dim = 24;
  s.causal = 1;
  s.want_lse = 1;
  s.want_diag = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.dropout_p = p;
  s.dropout_seed = 0x5eed0000ull + seed;
  s.dropout_offset = seed * 977;
  s.seed = seed;
  return s;
}

/* Every path against the reference, over the features dropout meets. */
static void every_path_matches_reference(void) {
  cp_shape shapes[8];
  shapes[0] = dropped(37, 53, 0.17f, 1);
  shapes[1] = dropped(1, 4099, 0.5f, 2); /* decode: the direct kernels, keys split */
  shapes[1].head_dim = shapes[1].value_dim = 64;
  shapes[1].want_diag = 0;
  shapes[2] = dropped(7, 300, 0.9f, 3);
  shapes[2].layout = CP_BSHD;
  shapes[2].pad = 3;
  shapes[2].row_gap = 1;
  shapes[2].causal = 0;
  shapes[2].window_left = 20;
  shapes[2].mask = CP_MASK_RANDOM;
  shapes[2].bias = CP_BIAS_RANDOM;
  shapes[3] = dropped(20, 20, 0.3f, 4); /* the routing matrix is the dropped one */
  shapes[3].want_weights = 1;
  shapes[3].sinks = 1;
  shapes[3].alibi = 2;
  shapes[3].softcap = 5.0f;
  shapes[4] = dropped(29, 41, 0.25f, 5); /* packed sequences: rows count within each */
  shapes[4].varlen = 1;
  shapes[5] = dropped(16, 64, 0.4f, 6);
  shapes[5].dtype = CLATTN_F16;
  shapes[5].head_dim = shapes[5].value_dim = 64;
  shapes[6] = dropped(5, 33, 0.6f, 7);
  shapes[6].additive = 1;
  shapes[6].kv_lens = 1;
  shapes[7] = dropped(3, 90, 0.5f, 8); /* left-padded rows: keys count from each row's first */
  shapes[7].leftpad = 1;
  shapes[7].dropout_offset = 0xffffffff00000001ull; /* the offset's sum carries */
  for (int c = 0; c < 8; c++) {
    cp_problem *pb;
    KC_BUILD(pb, &shapes[c]);
    const double tol = shapes[c].dtype == CLATTN_F16 ? 2e-3 : 2e-5;
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], tol);
    cp_free(pb);
  }
}

/* An allowed key whose weight is dropped mixes nothing in: its value may
 * hold NaN or Inf (one query row, so every key's fate is that row's). */
static void dropped_values_never_mix_in(void) {
  cp_shape s = dropped(1, 300, 0.5f, 9);
  s.batch = 1;
  s.q_heads = s.kv_heads = 1;
  s.causal = 0;
  s.poison_disallowed = 0;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  long poisoned = 0;
  for (int j = 0; j < s.kv_len; j++)
    if (!ref_dropout_kept(p, 0, 0, 0, j)) {
      for (int c = 0; c < s.value_dim; c++) pb->v[cp_index(&p->v, 0, 0, j, c)] = c % 2 ? NAN : INFINITY;
      poisoned++;
    }
  CHECK(poisoned > 100);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_result r;
    if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
    CHECKF(cp_result_ok(&r, 2e-5) && r.nan_out == 0, "%s: %s", clattn_algo_name(kc_algos[a]),
           cp_result_format(&r, (char[512]){0}, 512));
  }
  cp_free(pb);
}

/* The same call twice is bitwise the same; another seed or offset is not;
 * dropout_p 0 with a seed is the call without dropout, bitwise. */
static void repeatable_and_seeded(void) {
  cp_shape s = dropped(13, 77, 0.5f, 10);
  s.poison_disallowed = 0;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const size_t n = pb->out_count;
  float *first = malloc(n * sizeof(float));
  REQUIRE(first != NULL);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    pb->params.dropout_seed = s.dropout_seed;
    pb->params.dropout_offset = s.dropout_offset;
    pb->params.dropout_p = s.dropout_p;
    pb->ref_valid = 0;
    if (KC_RUN_OK(pb, kc_algos[a], 2e-5) <= 0) continue;
    memcpy(first, pb->out, n * sizeof(float));
    cp_result r;
    REQUIRE(kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) == 1);
    CHECKF(memcmp(first, pb->out, n * sizeof(float)) == 0, "%s: two runs differ", clattn_algo_name(kc_algos[a]));
    pb->params.dropout_seed++;
    pb->ref_valid = 0; /* the reference again, for the new fields */
    KC_RUN_OK(pb, kc_algos[a], 2e-5);
    CHECKF(memcmp(first, pb->out, n * sizeof(float)) != 0, "%s: another seed, the same output",
           clattn_algo_name(kc_algos[a]));
    pb->params.dropout_seed--;
    pb->params.dropout_offset += (uint64_t)s.q_len << 32;
    pb->ref_valid = 0;
    KC_RUN_OK(pb, kc_algos[a], 2e-5);
    CHECKF(memcmp(first, pb->out, n * sizeof(float)) != 0, "%s: another offset, the same output",
           clattn_algo_name(kc_algos[a]));
    pb->params.dropout_p = 0.0f;
    pb->ref_valid = 0;
    KC_RUN_OK(pb, kc_algos[a], 2e-5);
    memcpy(first, pb->out, n * sizeof(float));
    pb->params.dropout_seed = pb->params.dropout_offset = 0;
    REQUIRE(kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) == 1);
    CHECKF(memcmp(first, pb->out, n * sizeof(float)) == 0, "%s: dropout_p 0 depends on the seed",
           clattn_algo_name(kc_algos[a]));
  }
  free(first);
  cp_free(pb);
}

/* A plan with dropout gives clattn_forward's output bitwise, step after
 * step: the fused path's, or the staged path's where CLATTN_TEST_ALGOS
 * leaves the fused path out (the -softmax-sg runs). */
static void plans_drop_as_the_call_does(void) {
  cp_shape s = dropped(1, 200, 0.3f, 11);
  s.head_dim = s.value_dim = 64;
  s.poison_disallowed = 0;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_algo algo = kc_algo_filtered_out(CLATTN_ALGO_FUSED) ? CLATTN_ALGO_STAGED : CLATTN_ALGO_FUSED;
  REQUIRE(KC_RUN_OK(pb, algo, 2e-5) == 1);
  const size_t bytes = pb->out_elems * sizeof(float);
  float *want = malloc(bytes), *got = malloc(bytes);
  REQUIRE(want && got);
  memcpy(want, pb->out_raw, bytes);
  clattn_plan *plan = NULL;
  REQUIRE(clattn_plan_create(ct_context(), &pb->params, &plan) == CLATTN_OK);
  for (int step = 0; step < 3; step++) {
    REQUIRE(cp_fill_outputs(pb, NAN) == 0);
    REQUIRE(clattn_plan_enqueue(plan, NULL, 0, NULL, NULL) == CLATTN_OK);
    REQUIRE(clEnqueueReadBuffer(pb->queue, pb->out_buf, CL_TRUE, 0, bytes, got, 0, NULL, NULL) == CL_SUCCESS);
    CHECKF(memcmp(want, got, bytes) == 0, "step %d differs from clattn_forward", step);
  }
  clattn_plan_release(plan);
  free(want);
  free(got);
  cp_free(pb);
}

static void refusals(void) {
  cp_shape s = dropped(4, 16, 0.5f, 12);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  clattn_context *ctx = ct_context();
  REQUIRE(cp_upload(pb, ctx) == 0);
  const float bad[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    clattn_params p = pb->params;
    p.dropout_p = bad[i];
    CHECKF(clattn_forward(ctx, &p, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT, "dropout_p %g accepted",
           (double)bad[i]);
    CHECKF(strstr(clattn_last_error(ctx), "dropout_p") != NULL, "%s", clattn_last_error(ctx));
  }
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(philox_matches_random123_answers), CT_TEST(host_mask_is_the_reference_mask),
      CT_TEST(kept_share_and_streams),           CT_TEST(every_path_matches_reference),
      CT_TEST(dropped_values_never_mix_in),      CT_TEST(repeatable_and_seeded),
      CT_TEST(plans_drop_as_the_call_does),      CT_TEST(refusals),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
