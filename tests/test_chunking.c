/*
 * The staged path under a tiny scratch budget (CLATTN_SCRATCH_BYTES=4096,
 * set before the context is created): B*H*M*N*4 bytes of scores far exceed
 * it, so the query rows run in many chunks, down to a single row whose
 * scores alone exceed the budget. Results must still match the reference.
 */
#include <stdlib.h>

#include "kit_checks.h"

static void check_shape(cp_shape s) {
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  REQUIREF(pb != NULL, "cp_build: %s", err);
  double bytes = 4.0 * s.batch * s.q_heads * s.q_len * s.kv_len;
  CHECKF(bytes > 16 * 4096.0, "scores (%.0f bytes) should exceed the budget many times", bytes);
  const clattn_algo algos[] = {CLATTN_ALGO_STAGED, CLATTN_ALGO_AUTO};
  for (int a = 0; a < 2; a++) KC_RUN_OK(pb, algos[a], 1e-5);
  cp_free(pb);
}

static void many_chunks_match_reference(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 128;
  s.kv_len = 128;
  s.head_dim = 64;
  s.value_dim = 40;
  s.causal = 1;
  s.kv_lens = 1;
  s.bias = CP_BIAS_RANDOM;
  s.want_lse = 1;
  s.want_weights = 1;
  s.layout = CP_BSHD;
  s.pad = 3;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  s.seed = 91;
  check_shape(s);
}

static void uneven_last_chunk_matches_reference(void) {
  cp_shape s = cp_shape_default();
  s.batch = 3;
  s.q_heads = 3;
  s.kv_heads = 1;
  s.q_len = 53; /* prime: the last chunk is partial */
  s.kv_len = 37;
  s.head_dim = 40;
  s.value_dim = 40;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_HEAD;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 92;
  check_shape(s);
}

static void row_longer_than_budget_matches_reference(void) {
  /* one row of scores is 4099 * 4 bytes > 4096 */
  cp_shape s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 37;
  s.kv_len = 4099;
  s.head_dim = 64;
  s.value_dim = 64;
  s.causal = 1;
  s.window_left = 1000;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 93;
  check_shape(s);
}

static void empty_rows_across_chunks_match_reference(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 2;
  s.q_len = 128; /* causal with M > N: 91 leading empty rows */
  s.kv_len = 37;
  s.head_dim = 8;
  s.value_dim = 8;
  s.causal = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 94;
  check_shape(s);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(many_chunks_match_reference),
      CT_TEST(uneven_last_chunk_matches_reference),
      CT_TEST(row_longer_than_budget_matches_reference),
      CT_TEST(empty_rows_across_chunks_match_reference),
  };
  if (setenv("CLATTN_SCRATCH_BYTES", "4096", 1) != 0) {
    printf("setenv failed\n0 passed, 1 failed\n");
    return 1;
  }
  ct_context();
  const char *d = clattn_describe(ct_ctx);
  if (d && strstr(d, "scratch")) printf("%s", d);
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
