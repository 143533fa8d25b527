/*
 * Half and bfloat16 storage (q, k, v and out in 16 bits, arithmetic f32,
 * or P V in half products where forced: CLATTN_BLOCK_HALF_MATH): every
 * algorithm against the fp64 reference computed on the same rounded
 * inputs, within FlashAttention's rule — no more than twice the error of a
 * host implementation in the same precision, the better of a naive one
 * (sums in the storage type) and a framework's (stages rounded, sums in
 * f32) — and in any case within 1e-3 (f16) / 8e-3 (bf16) norm-wise. Also
 * the host conversions themselves.
 */
#include "check.h"
#include "kit_checks.h"

/* ---------- the kit's conversions ---------- */

static void conversions_round_to_nearest_even(void) {
  CHECK(cp_f16_bits(1.0f) == 0x3c00 && cp_f16_value(0x3c00) == 1.0f);
  CHECK(cp_f16_bits(65504.0f) == 0x7bff && cp_f16_bits(65520.0f) == 0x7c00);
  CHECK(cp_f16_bits(-2.0f) == 0xc000);
  CHECK(cp_f16_value(0x0001) == ldexpf(1.0f, -24));       /* smallest subnormal */
  CHECK(cp_f16_bits(1.0f + ldexpf(1.0f, -11)) == 0x3c00); /* a tie rounds to even */
  CHECK(cp_f16_bits(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);
  CHECK(isnan(cp_f16_value(cp_f16_bits(NAN))) && isinf(cp_f16_value(cp_f16_bits(INFINITY))));
  CHECK(cp_bf16_bits(1.0f) == 0x3f80 && cp_bf16_value(0x3f80) == 1.0f);
  CHECK(cp_bf16_bits(1.0f + ldexpf(1.0f, -8)) == 0x3f80); /* a tie rounds to even */
  CHECK(cp_bf16_bits(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3f82);
  CHECK(isnan(cp_bf16_value(cp_bf16_bits(NAN))));
  for (int i = -1000; i <= 1000; i++) { /* round trips of every representable value nearby */
    float x = (float)i * 0.37f;
    CHECK(cp_round_to(CLATTN_F16, cp_round_to(CLATTN_F16, x)) == cp_round_to(CLATTN_F16, x));
    CHECK(cp_round_to(CLATTN_BF16, cp_round_to(CLATTN_BF16, x)) == cp_round_to(CLATTN_BF16, x));
  }
}

/* ---------- a naive host attention in the storage precision ---------- */

/* Every intermediate rounded to the storage type, sums accumulated in it:
 * what a half-precision implementation without f32 accumulation computes.
 * The same score shaping (softcap, bias, ALiBi, sinks); rows with no
 * allowed key are 0. Dense [B,Hq,M,dv] out. */
static void naive_same_precision(const cp_problem *pb, double *out) {
  const clattn_params *p = &pb->params;
  const clattn_dtype t = p->dtype;
  ref_inputs in = cp_ref_inputs(pb);
  const int group = p->q_heads / p->kv_heads, N = p->kv_len;
  const float scale = cp_round_to(t, (float)ref_scale(p));
  float *s = malloc((size_t)N * sizeof *s);
  if (!s) return;
  size_t row = 0;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++, row++) {
        float m = -INFINITY;
        for (int j = 0; j < N; j++) {
          s[j] = -INFINITY;
          if (!ref_allowed(p, &in, b, h, i, j)) continue;
          float dot = 0.0f;
          for (int d = 0; d < p->head_dim; d++)
            dot = cp_round_to(t, dot + cp_round_to(t, pb->q[cp_index(&p->q, b, h, i, d)] *
                                                          pb->k[cp_index(&p->k, b, h / group, j, d)]));
          float x = cp_round_to(t, dot * scale);
          if (p->softcap > 0.0f) x = cp_round_to(t, p->softcap * tanhf(x / p->softcap));
          if (in.bias) x = cp_round_to(t, x + pb->bias[cp_index(&p->bias, b, h, i, j)]);
          if (in.alibi_slopes) x = cp_round_to(t, x - in.alibi_slopes[h] * fabsf((float)(i + N - p->q_len - j)));
          s[j] = x;
          m = fmaxf(m, s[j]);
        }
        const int empty = m == -INFINITY;
        const float sink = in.sinks ? in.sinks[h] : -INFINITY;
        m = fmaxf(m, sink);
        float l = in.sinks ? cp_round_to(t, expf(cp_round_to(t, sink - m))) : 0.0f;
        for (int j = 0; j < N; j++) {
          s[j] = empty ? 0.0f : cp_round_to(t, expf(cp_round_to(t, s[j] - m)));
          l = cp_round_to(t, l + s[j]);
        }
        for (int c = 0; c < p->value_dim; c++) {
          float o = 0.0f;
          for (int j = 0; j < N && l > 0.0f; j++)
            if (s[j] != 0.0f)
              o = cp_round_to(
                  t, o + cp_round_to(t, cp_round_to(t, s[j] / l) * pb->v[cp_index(&p->v, b, h / group, j, c)]));
          out[row * (size_t)p->value_dim + c] = o;
        }
      }
  free(s);
}

/* What a framework's attention in the storage type computes (FlashAttention's
 * test reference without upcasting: q scaled, then Q K^T, softmax and P V,
 * each stage's result rounded to the storage type, its sums accumulated in
 * f32 as GEMMs and softmax kernels do). Same shaping and sinks; rows with
 * no allowed key are 0. Dense [B,Hq,M,dv] out. */
static void framework_same_precision(const cp_problem *pb, double *out) {
  const clattn_params *p = &pb->params;
  const clattn_dtype t = p->dtype;
  ref_inputs in = cp_ref_inputs(pb);
  const int group = p->q_heads / p->kv_heads, N = p->kv_len;
  const float scale = (float)ref_scale(p);
  float *s = malloc((size_t)N * sizeof *s);
  if (!s) return;
  size_t row = 0;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++, row++) {
        float m = -INFINITY;
        for (int j = 0; j < N; j++) {
          s[j] = -INFINITY;
          if (!ref_allowed(p, &in, b, h, i, j)) continue;
          float dot = 0.0f;
          for (int d = 0; d < p->head_dim; d++)
            dot += cp_round_to(t, pb->q[cp_index(&p->q, b, h, i, d)] * scale) *
                   pb->k[cp_index(&p->k, b, h / group, j, d)];
          float x = cp_round_to(t, dot);
          if (p->softcap > 0.0f) x = cp_round_to(t, p->softcap * tanhf(x / p->softcap));
          if (in.bias) x = cp_round_to(t, x + pb->bias[cp_index(&p->bias, b, h, i, j)]);
          if (in.alibi_slopes) x = cp_round_to(t, x - in.alibi_slopes[h] * fabsf((float)(i + N - p->q_len - j)));
          s[j] = x;
          m = fmaxf(m, s[j]);
        }
        const int empty = m == -INFINITY;
        const float sink = in.sinks ? in.sinks[h] : -INFINITY;
        m = fmaxf(m, sink);
        float l = in.sinks ? expf(sink - m) : 0.0f;
        for (int j = 0; j < N; j++) {
          s[j] = empty ? 0.0f : expf(s[j] - m);
          l += s[j];
        }
        for (int j = 0; j < N; j++) s[j] = l > 0.0f ? cp_round_to(t, s[j] / l) : 0.0f;
        for (int c = 0; c < p->value_dim; c++) {
          float o = 0.0f;
          for (int j = 0; j < N; j++)
            if (s[j] != 0.0f) o += s[j] * pb->v[cp_index(&p->v, b, h / group, j, c)];
          out[row * (size_t)p->value_dim + c] = cp_round_to(t, o);
        }
      }
  free(s);
}

static double rel_err(const double *x, const double *ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static void check_shape(cp_shape s, const char *what) {
  const clattn_dtype types[] = {CLATTN_F16, CLATTN_BF16};
  const double bound[] = {1e-3, 8e-3};
  for (int t = 0; t < 2; t++) {
    s.dtype = types[t];
    cp_problem *pb;
    KC_BUILD(pb, &s);
    REQUIRE(cp_reference(pb) == 0);
    double *naive = calloc(pb->out_count, sizeof *naive), *framework = calloc(pb->out_count, sizeof *framework);
    REQUIRE(naive && framework);
    naive_same_precision(pb, naive);
    framework_same_precision(pb, framework);
    const double naive_err = rel_err(naive, pb->ref_out, pb->out_count);
    const double framework_err = rel_err(framework, pb->ref_out, pb->out_count);
    const double allowed = fmin(bound[t], 2.0 * fmin(naive_err, framework_err));
    for (size_t a = 0; a < KC_NALGOS; a++) {
      cp_result r;
      if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
      char line[512];
      CHECKF(r.status == CLATTN_OK && r.mismatch_out == 0 && r.err_out <= allowed && r.err_lse <= 1e-5,
             "%s, %s, %s: error %.3g, allowed %.3g (same-precision naive %.3g, framework %.3g; bound %.0e): %s", what,
             t ? "bf16" : "f16", clattn_algo_name(kc_algos[a]), r.err_out, allowed, naive_err, framework_err,
             bound[t], cp_result_format(&r, line, sizeof line));
      printf("  %-28s %-4s %-6s error %.2e (same precision: naive %.2e, framework %.2e)\n", what,
             t ? "bf16" : "f16", clattn_algo_name(kc_algos[a]), r.err_out, naive_err, framework_err);
    }
    free(naive);
    free(framework);
    cp_free(pb);
  }
}

static void half_storage_within_twice_naive_error(void) {
  cp_shape s = cp_shape_default();
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 40;
  s.value_dim = 24;
  s.causal = 1;
  s.want_lse = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  check_shape(s, "GQA causal 37 x 53");
  s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 3;
  s.kv_heads = 3;
  s.q_len = 129;
  s.kv_len = 300;
  s.head_dim = 64;
  s.value_dim = 64;
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.layout = CP_BSHD;
  s.pad = 3;
  s.row_gap = 1;
  s.want_lse = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  check_shape(s, "masked, biased, strided");
  s = cp_shape_default();
  s.q_heads = 8;
  s.kv_heads = 2;
  s.q_len = 1;
  s.kv_len = 4099;
  s.head_dim = 128;
  s.value_dim = 128;
  s.want_lse = 1;
  s.kv_lens = 1;
  s.poison_disallowed = 1;
  check_shape(s, "decode 1 x 4099");
  s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 7;
  s.kv_len = 37;
  s.head_dim = 7;
  s.value_dim = 5;
  s.want_lse = 1;
  s.want_weights = 1;
  s.softcap = 3.0f;
  s.alibi = 1;
  s.sinks = 1;
  check_shape(s, "tiny dims, shaping, weights");
}

/* With CLATTN_BLOCK_HALF_MATH=1 and the work-group kernels forced (the
 * -block-half-math runs): the f16 programs the checks above ran were built
 * with flash_block's half products. */
static void half_products_are_the_ones_forced(void) {
  const char *want = getenv("CLATTN_BLOCK_HALF_MATH"), *wg = getenv("CLATTN_FLASH_WG");
  if (!want || strcmp(want, "1") != 0 || !wg || atoi(wg) <= 0) {
    printf("  (not forced in this run: nothing to check)\n");
    return;
  }
  const int dims[][2] = {{40, 24}, {64, 64}, {128, 128}};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
    ca_program built;
    const ca_program_key key = ca_fused_key(dims[d][0], dims[d][1], CLATTN_F16, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, 0);
    REQUIRE(ca_program_get(ct_context(), &key, &built) == CLATTN_OK);
    const cl_program program = built.program;
    char options[1024] = "";
    REQUIRE(clGetProgramBuildInfo(program, clattn_cl_device(ct_context()), CL_PROGRAM_BUILD_OPTIONS, sizeof options,
                                  options, NULL) == CL_SUCCESS);
    CHECKF(strstr(options, "-D BLOCK_HALF_MATH") != NULL, "d=%d: the f16 program was built with \"%s\"", dims[d][0],
           options);
  }
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(conversions_round_to_nearest_even),
      CT_TEST(half_storage_within_twice_naive_error),
      CT_TEST(half_products_are_the_ones_forced),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
