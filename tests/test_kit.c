/*
 * The problem kit's host side (no device): views address disjoint elements
 * inside their buffers, builds are deterministic, poisoning touches only
 * unreachable keys, the error measure is norm-wise, and the host
 * quantisation follows ggml's rules.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "problem.h"

/* Every logical element of a [B,H,R,C] view lies inside elems and no two share one. */
static int view_is_injective(const clattn_tensor *t, int B, int H, int R, int C, size_t elems) {
  unsigned char *seen = calloc(elems, 1);
  int ok = seen != NULL;
  for (int b = 0; ok && b < B; b++)
    for (int h = 0; ok && h < H; h++)
      for (int r = 0; ok && r < R; r++)
        for (int c = 0; ok && c < C; c++) {
          size_t i = cp_index(t, b, h, r, c);
          ok = i < elems && !seen[i];
          if (ok) seen[i] = 1;
        }
  free(seen);
  return ok;
}

static void views_are_injective_and_in_bounds(void) {
  const cp_layout layouts[] = {CP_BHSD, CP_BSHD};
  for (int l = 0; l < 2; l++)
    for (size_t pad = 0; pad < 4; pad += 3)
      for (size_t gap = 0; gap < 3; gap += 2) {
        cp_shape s = cp_shape_default();
        s.batch = 2;
        s.q_heads = 6;
        s.kv_heads = 2;
        s.q_len = 5;
        s.kv_len = 7;
        s.head_dim = 3;
        s.value_dim = 4;
        s.layout = layouts[l];
        s.pad = pad;
        s.row_gap = gap;
        s.want_lse = 1;
        s.want_weights = 1;
        char err[128];
        cp_problem *pb = cp_build(&s, err, sizeof err);
        REQUIREF(pb != NULL, "%s", err);
        const clattn_params *p = &pb->params;
        CHECK(view_is_injective(&p->q, 2, 6, 5, 3, pb->q_elems));
        CHECK(view_is_injective(&p->k, 2, 2, 7, 3, pb->k_elems));
        CHECK(view_is_injective(&p->v, 2, 2, 7, 4, pb->v_elems));
        CHECK(view_is_injective(&p->out, 2, 6, 5, 4, pb->out_elems));
        CHECK(view_is_injective(&p->lse, 2, 6, 5, 1, pb->lse_elems));
        CHECK(view_is_injective(&p->weights, 2, 6, 5, 7, pb->weights_elems));
        CHECK(p->q.offset == pad && pb->q_elems >= pad * 2 + 2 * 6 * 5 * 3);
        if (layouts[l] == CP_BSHD) CHECK(p->q.stride[1] == 3 + gap && p->q.stride[2] == 6 * (3 + gap));
        cp_free(pb);
      }
}

static void broadcast_views_have_zero_strides(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 3;
  s.q_len = 4;
  s.kv_len = 5;
  s.kv_heads = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_HEAD | CP_BCAST_ROW;
  s.bias = CP_BIAS_RANDOM;
  s.bias_bcast = CP_BCAST_BATCH;
  char err[128];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  REQUIREF(pb != NULL, "%s", err);
  const clattn_params *p = &pb->params;
  CHECK(p->mask.stride[1] == 0 && p->mask.stride[2] == 0 && p->mask.stride[0] == 5);
  CHECK(pb->mask_elems == 2 * 5);
  CHECK(p->bias.stride[0] == 0 && p->bias.stride[1] == 4 * 5 && p->bias.stride[2] == 5);
  CHECK(pb->bias_elems == 3 * 4 * 5);
  cp_free(pb);
}

static void builds_are_deterministic_per_seed(void) {
  cp_shape s = cp_shape_default();
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.batch = 3;
  char err[128];
  cp_problem *a = cp_build(&s, err, sizeof err), *b = cp_build(&s, err, sizeof err);
  s.seed = 2;
  cp_problem *c = cp_build(&s, err, sizeof err);
  REQUIRE(a && b && c);
  CHECK(memcmp(a->q, b->q, a->q_elems * sizeof(float)) == 0);
  CHECK(memcmp(a->mask, b->mask, a->mask_elems) == 0);
  CHECK(memcmp(a->kv_lens, b->kv_lens, 3 * sizeof(int32_t)) == 0);
  CHECK(memcmp(a->q, c->q, a->q_elems * sizeof(float)) != 0);
  for (int i = 0; i < 3; i++) CHECK(a->kv_lens[i] >= 1 && a->kv_lens[i] <= s.kv_len);
  float lo = 1, hi = -1;
  for (size_t i = 0; i < a->v_elems; i++) {
    lo = a->v[i] < lo ? a->v[i] : lo;
    hi = a->v[i] > hi ? a->v[i] : hi;
  }
  CHECK(lo >= -1.0f && hi <= 1.0f && hi - lo > 1.5f);
  cp_free(a);
  cp_free(b);
  cp_free(c);
}

static void poison_touches_only_unreachable_keys(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 6;
  s.kv_len = 20;
  s.head_dim = 4;
  s.value_dim = 3;
  s.causal = 1;
  s.window_left = 4;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_bcast = CP_BCAST_ROW;
  s.mask_density = 0.7;
  char err[128];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  REQUIREF(pb != NULL, "%s", err);
  cp_problem *clean = cp_build(&s, err, sizeof err);
  REQUIRE(clean);
  REQUIRE(cp_reference(clean) == 0);
  long n = cp_poison_disallowed(pb);
  CHECK(n > 0);
  /* the reference is unchanged, bit for bit */
  REQUIRE(cp_reference(pb) == 0);
  CHECK(memcmp(pb->ref_out, clean->ref_out, pb->out_count * sizeof(double)) == 0);
  /* and the poisoned rows are exactly the unreachable ones */
  const clattn_params *p = &pb->params;
  ref_inputs in = cp_ref_inputs(pb);
  long unreachable = 0, wrong = 0;
  for (int b = 0; b < 2; b++)
    for (int g = 0; g < 2; g++)
      for (int j = 0; j < 20; j++) {
        int reach = 0;
        for (int h = 2 * g; h < 2 * g + 2; h++)
          for (int i = 0; i < 6; i++) reach |= ref_allowed(p, &in, b, h, i, j);
        float kv = pb->k[cp_index(&p->k, b, g, j, 0)];
        unreachable += !reach;
        wrong += reach ? !isfinite(kv) : isfinite(kv);
      }
  CHECK(unreachable == n);
  CHECK(wrong == 0);
  cp_free(pb);
  cp_free(clean);
}

static void relative_error_is_normwise_over_finite_pairs(void) {
  const float x[] = {1.0f, 2.0f, NAN, -INFINITY};
  const double r[] = {1.0, 2.5, 3.0, -INFINITY};
  CHECK_NEAR(cp_rel_err(x, r, 4), 0.5 / sqrt(1.0 + 6.25), 1e-12);
  const double z[] = {0.0, 0.0};
  const float xz[] = {0.0f, 0.0f};
  CHECK(cp_rel_err(xz, z, 2) == 0.0);
  cp_result res;
  memset(&res, 0, sizeof res);
  res.status = CLATTN_OK;
  CHECK(cp_result_ok(&res, 1e-5));
  res.mismatch_lse = 1;
  CHECK(!cp_result_ok(&res, 1e-5));
}

static void bad_shapes_are_refused_with_a_message(void) {
  char err[128] = "";
  cp_shape s = cp_shape_default();
  s.q_heads = 3;
  s.kv_heads = 2;
  CHECK(cp_build(&s, err, sizeof err) == NULL && strstr(err, "kv_heads"));
  s = cp_shape_default();
  s.head_dim = 0;
  CHECK(cp_build(&s, err, sizeof err) == NULL && err[0]);
  CHECK(cp_build(NULL, err, sizeof err) == NULL);
  cp_free(NULL);
}

/* ggml's rules: d = amax / 127 (Q8_0: stored f16), q = roundf(x / d), ties
 * away from zero; an all-zero block has d = 0 and q = 0. */
static void quantisation_follows_ggml_rules(void) {
  float x[64];
  for (int c = 0; c < 32; c++) x[c] = c == 0 ? 127.0f : (float)(c % 7) - 3.5f; /* d = 1: q = x rounded away from zero */
  for (int c = 32; c < 64; c++) x[c] = 0.0f;
  unsigned char y[68];
  cp_quantize_q8_0_row(x, y, 64);
  uint16_t d0, d1;
  memcpy(&d0, y, 2);
  memcpy(&d1, y + 34, 2);
  CHECK(d0 == 0x3C00 && d1 == 0);
  CHECK((int8_t)y[2] == 127 && (int8_t)y[2 + 1] == -3 && (int8_t)y[2 + 7] == -4 && (int8_t)y[2 + 6] == 3);
  int zeros = 1;
  for (int c = 0; c < 32; c++) zeros &= y[36 + c] == 0;
  CHECK(zeros);
  const float row[3] = {254.0f, -1.0f, 0.5f};
  unsigned char q[3];
  CHECK(cp_quantize_int8_row(row, q, 3) == 2.0f);
  CHECK((int8_t)q[0] == 127 && (int8_t)q[1] == -1 && (int8_t)q[2] == 0);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(views_are_injective_and_in_bounds),
      CT_TEST(broadcast_views_have_zero_strides),
      CT_TEST(builds_are_deterministic_per_seed),
      CT_TEST(poison_touches_only_unreachable_keys),
      CT_TEST(relative_error_is_normwise_over_finite_pairs),
      CT_TEST(bad_shapes_are_refused_with_a_message),
      CT_TEST(quantisation_follows_ggml_rules),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
