/*
 * Modifiers (clattn_params.score_mod / mask_mod) and block masks: the
 * example modifiers (examples/modifiers/) on every path against the fp64
 * reference (which runs the modifiers through clattn_modifier_eval) and
 * against the built-in features they equal (causal, windows, ALiBi,
 * softcap, a mask tensor), block masks that skip work without changing a
 * bit, NaN/Inf in keys and values a modifier disallows, errors, and the
 * program table's bound.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit_checks.h"

#define TOL 1e-5

/* An example modifier's text (examples/modifiers/NAME.cl); NULL recorded. */
static char *example(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.cl", MODIFIERS_DIR, name);
  FILE *f = fopen(path, "rb");
  if (!CHECKF(f != NULL, "cannot open %s", path)) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  if (text && fread(text, 1, (size_t)n, f) == (size_t)n) {
    text[n] = '\0';
  } else {
    free(text);
    text = NULL;
  }
  fclose(f);
  CHECKF(text != NULL, "cannot read %s", path);
  return text;
}

static cl_mem device_copy(const void *host, size_t bytes) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes,
                            (void *)host, &e);
  CHECKF(e == CL_SUCCESS, "clCreateBuffer(%zu bytes): %d", bytes, e);
  return m;
}

/* Document ids of n positions: documents of lengths 1 .. 2 avg, from seed. */
static cl_mem documents(int n, int avg, uint64_t seed) {
  int *doc = malloc((size_t)n * sizeof *doc);
  if (!CHECK(doc)) return NULL;
  int id = 0, left = 0;
  for (int i = 0; i < n; i++) {
    if (left == 0) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      left = 1 + (int)((seed >> 33) % (uint64_t)(2 * avg));
      id++;
    }
    doc[i] = id;
    left--;
  }
  cl_mem m = device_copy(doc, (size_t)n * sizeof *doc);
  free(doc);
  return m;
}

/* The reference recomputes its modifier tables (after params change). */
static void forget_reference(cp_problem *pb) {
  free(pb->mod_allowed);
  free(pb->mod_score);
  free(pb->mod_grad);
  pb->mod_allowed = NULL;
  pb->mod_score = pb->mod_grad = NULL;
  pb->ref_valid = 0;
}

static cp_shape base(int M, int N, int dk) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = M;
  s.kv_len = N;
  s.head_dim = s.value_dim = dk;
  s.want_lse = 1;
  s.seed = (uint64_t)(M * 131 + N * 7 + dk);
  return s;
}

/* Each example, its captures set up, on every path. */
static void run_example(const char *name, cp_shape s) {
  char *text = example(name);
  if (!text) return;
  const int score = strstr(text, "clattn_score_mod") != NULL;
  if (score) s.score_mod = text; else s.mask_mod = text;
  cl_mem held = NULL;
  const int positions = s.kv_len > s.q_len ? s.kv_len : s.q_len;
  if (strcmp(name, "document") == 0) held = s.captures[0] = documents(positions, 9, s.seed);
  if (strcmp(name, "sliding_window") == 0) s.capture_i[0] = 5;
  if (strcmp(name, "prefix_lm") == 0) s.capture_i[0] = 11;
  if (strcmp(name, "alibi") == 0) { /* the standard slopes, 2^(-8 (h + 1) / H) */
    float slopes[64];
    for (int h = 0; h < s.q_heads && h < 64; h++) slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)s.q_heads);
    held = s.captures[0] = device_copy(slopes, sizeof slopes);
  }
  if (strcmp(name, "tanh_softcap") == 0) s.capture_f[0] = 5.0f;
  if (strcmp(name, "relative_bias") == 0) {
    float table[15];
    for (int e = 0; e < 15; e++) table[e] = 0.25f * (float)((e * 7) % 11) - 1.0f;
    held = s.captures[0] = device_copy(table, sizeof table);
    s.capture_i[0] = 8;
  }
  cp_problem *pb;
  KC_BUILD(pb, &s);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (kc_run_ok(pb, kc_algos[a], TOL, __FILE__, __LINE__) < 0)
      printf("    example %s, M %d N %d d %d\n", name, s.q_len, s.kv_len, s.head_dim);
  }
  cp_free(pb);
  if (held) clReleaseMemObject(held);
  free(text);
}

static const char *const examples[] = {"causal", "sliding_window", "prefix_lm", "document",
                                       "alibi",  "tanh_softcap",   "relative_bias"};

static void examples_match_reference_on_every_path(void) {
  for (size_t e = 0; e < sizeof examples / sizeof examples[0]; e++) {
    /* one head dim (not a power of two): one program per example and path */
    run_example(examples[e], base(37, 53, 48));  /* off tile multiples */
    run_example(examples[e], base(53, 53, 48));  /* FlexAttention's square case */
    run_example(examples[e], base(1, 4099, 48)); /* decode: the direct kernels, split keys */
  }
}

static void examples_with_every_other_mask(void) {
  cp_shape s = base(29, 61, 48);
  s.causal = 1;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.8;
  s.bias = CP_BIAS_RANDOM;
  s.softcap = 6.0f;
  s.alibi = 1;
  s.sinks = 1;
  run_example("prefix_lm", s);
  run_example("relative_bias", s);
  s.kv_lens = 0;
  s.varlen = 1; /* packed sequences: q_idx and kv_idx per sequence */
  run_example("sliding_window", s);
  run_example("tanh_softcap", s);
}

/* Output of pb under algo, into a fresh array (NULL recorded). */
static float *output_of(cp_problem *pb, clattn_algo algo) {
  cp_result r;
  if (kc_run(pb, algo, &r, __FILE__, __LINE__) <= 0 || !CHECKF(r.status == CLATTN_OK, "%s: %s", clattn_algo_name(algo),
                                                               clattn_last_error(ct_context())))
    return NULL;
  float *o = malloc(pb->out_count * sizeof *o);
  if (CHECK(o)) memcpy(o, pb->out, pb->out_count * sizeof *o);
  return o;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double m = 0.0;
  for (size_t e = 0; e < n; e++) m = fmax(m, fabs((double)a[e] - (double)b[e]));
  return m;
}

/* A modifier equal to a built-in feature gives its results within f32 rounding. */
static void modifiers_equal_the_builtins(void) {
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (kc_algos[a] == CLATTN_ALGO_GEMM && !ca_gemm_available()) continue;
    cp_shape s = base(45, 70, 48);
    s.alibi = 1;
    s.softcap = 5.0f;
    s.causal = 1;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    float *builtin = output_of(pb, kc_algos[a]);
    char *causal = example("causal"), *alibi = example("alibi"), *softcap = example("tanh_softcap");
    /* the same call by modifiers: causal, then ALiBi, then softcap */
    clattn_params *p = &pb->params;
    const cl_mem slopes = p->alibi_slopes;
    float *host_slopes = pb->alibi_slopes;
    p->causal = 0;
    p->mask_mod = causal;
    p->alibi_slopes = NULL;
    pb->alibi_slopes = NULL; /* the reference's */
    p->score_mod = alibi;
    p->captures[0] = slopes; /* the same slopes, captured */
    forget_reference(pb);
    float *modded = builtin && causal && alibi ? output_of(pb, kc_algos[a]) : NULL;
    if (modded)
      CHECKF(max_diff(builtin, modded, pb->out_count) < 1e-5, "%s: causal + ALiBi by modifiers differ by %g",
             clattn_algo_name(kc_algos[a]), max_diff(builtin, modded, pb->out_count));
    free(modded);
    /* softcap by a modifier (it applies after the built-in softcap: off) */
    cp_shape s2 = base(45, 70, 48);
    s2.softcap = 5.0f;
    cp_problem *pb2;
    KC_BUILD(pb2, &s2);
    float *capped = output_of(pb2, kc_algos[a]);
    pb2->params.softcap = 0.0f;
    pb2->shape.softcap = 0.0f;
    pb2->params.score_mod = softcap;
    pb2->params.capture_f[0] = 5.0f;
    forget_reference(pb2);
    float *capped_mod = capped && softcap ? output_of(pb2, kc_algos[a]) : NULL;
    if (capped_mod)
      CHECKF(max_diff(capped, capped_mod, pb2->out_count) < 1e-5, "%s: softcap by a modifier differs by %g",
             clattn_algo_name(kc_algos[a]), max_diff(capped, capped_mod, pb2->out_count));
    free(capped);
    free(capped_mod);
    cp_free(pb2);
    p->alibi_slopes = slopes; /* cp_free releases them */
    pb->alibi_slopes = host_slopes;
    free(builtin);
    free(causal);
    free(alibi);
    free(softcap);
    cp_free(pb);
  }
}

/* Keys and values the mask modifier disallows hold NaN and Inf: the output
 * is finite and the reference's. */
static void disallowed_nan_never_reaches_an_output(void) {
  static const char skip_some[] =
      "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  return kv_idx % 5 != cap->i[0];\n"
      "}\n";
  const int shapes[][2] = {{1, 300}, {37, 53}, {64, 64}};
  for (size_t c = 0; c < 3; c++) {
    cp_shape s = base(shapes[c][0], shapes[c][1], 48);
    s.mask_mod = skip_some;
    s.capture_i[0] = 2;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    const clattn_params *p = &pb->params;
    for (int b = 0; b < p->batch; b++)
      for (int h = 0; h < p->kv_heads; h++)
        for (int j = 2; j < p->kv_len; j += 5)
          for (int d = 0; d < p->head_dim; d++) {
            pb->k[cp_index(&p->k, b, h, j, d)] = d % 2 ? NAN : INFINITY;
            pb->v[cp_index(&p->v, b, h, j, d)] = d % 2 ? -INFINITY : NAN;
          }
    for (size_t a = 0; a < KC_NALGOS; a++) {
      cp_result r;
      if (KC_RUN_OK(pb, kc_algos[a], TOL) > 0 && kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) > 0)
        CHECKF(r.nan_out == 0, "%s: %ld NaN outputs", clattn_algo_name(kc_algos[a]), r.nan_out);
    }
    cp_free(pb);
  }
}

/* Document masking with its block mask: the same bits as without it, and
 * the blocks classed as the documents say. */
static void block_mask_skips_without_changing_a_bit(void) {
  enum { N = 512, DOCS = 4 };
  int doc[N];
  for (int i = 0; i < N; i++) doc[i] = i / (N / DOCS);
  cl_mem ids = device_copy(doc, sizeof doc);
  char *text = example("document");
  if (!ids || !text) goto done;
  for (int decode = 0; decode < 2; decode++) {
    cp_shape s = base(decode ? 1 : N, N, 48);
    s.mask_mod = text;
    s.captures[0] = ids;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    clattn_block_mask *bm = NULL;
    clattn_params bp = pb->params;
    bp.batch = 1; /* one for every batch row */
    REQUIRE(clattn_block_mask_create(ct_context(), &bp, 64, 64, &bm) == CLATTN_OK);
    size_t empty, partial, full;
    clattn_block_mask_counts(bm, &empty, &partial, &full);
    const size_t qb = decode ? 1 : N / 64, kb = N / 64, heads = (size_t)bp.q_heads;
    if (!decode)
      CHECKF(full == heads * DOCS * 4 && partial == 0 && empty == heads * (qb * kb - DOCS * 4),
             "counts %zu %zu %zu", empty, partial, full);
    else /* the one query (position N - 1) sees the last document */
      CHECKF(full == heads * 2 && partial == 0 && empty == heads * (kb - 2), "decode counts %zu %zu %zu", empty,
             partial, full);
    for (size_t a = 0; a < KC_NALGOS; a++) {
      pb->params.block_mask = NULL;
      float *plain = output_of(pb, kc_algos[a]);
      pb->params.block_mask = bm;
      float *skipped = plain ? output_of(pb, kc_algos[a]) : NULL;
      if (skipped)
        CHECKF(memcmp(plain, skipped, pb->out_count * sizeof *plain) == 0, "%s%s: the block mask changed bits",
               clattn_algo_name(kc_algos[a]), decode ? " decode" : "");
      free(plain);
      free(skipped);
    }
    /* a block mask for other captures, or for another modifier, is refused */
    clattn_params other = pb->params;
    other.capture_i[1] = 3;
    CHECK(clattn_forward(ct_context(), &other, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
    other = pb->params;
    other.mask_mod = "int clattn_mask_mod(int b, int h, int q, int k, const clattn_captures *c) { return 1; }";
    CHECK(clattn_forward(ct_context(), &other, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
    other = pb->params;
    other.q_len = 2;
    CHECK(clattn_forward(ct_context(), &other, 0, NULL, NULL) != CLATTN_OK);
    clattn_block_mask_release(bm);
    cp_free(pb);
  }
done:
  free(text);
  if (ids) clReleaseMemObject(ids);
}

static void bad_modifiers_are_refused(void) {
  cp_shape s = base(7, 9, 16);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  REQUIRE(cp_upload(pb, ct_context()) == 0);
  clattn_context *ctx = ct_context();
  clattn_params p = pb->params;
  p.mask_mod = "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) { return q_idx <; }";
  for (size_t a = 0; a < KC_NALGOS; a++) {
    p.algo = kc_algos[a];
    const clattn_status st = clattn_forward(ctx, &p, 0, NULL, NULL);
    if (kc_algos[a] == CLATTN_ALGO_GEMM && st == CLATTN_ERR_UNSUPPORTED) continue;
    CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT, "%s: a modifier that does not compile: %s",
           clattn_algo_name(kc_algos[a]), clattn_status_string(st));
    CHECKF(strstr(clattn_last_error(ctx), "modifier does not compile") != NULL, "message: %s",
           clattn_last_error(ctx));
  }
  p = pb->params;
  p.capture_i[2] = 1; /* captures without a modifier */
  CHECK(clattn_forward(ctx, &p, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  clattn_block_mask *bm = NULL;
  p = pb->params;
  CHECK(clattn_block_mask_create(ctx, &p, 0, 0, &bm) == CLATTN_ERR_INVALID_ARGUMENT && bm == NULL);
  cp_free(pb);
}

/* Many modifiers: the table keeps at most CA_MOD_PROGRAMS_MAX programs
 * with modifiers, every call is still right, and a plan made before them
 * still runs its own program (pushed out of the table) and matches the
 * reference. The bound is the host's, whatever kernel runs: the default
 * run checks it (the -block and -tiled runs name CLATTN_TEST_ALGOS). */
static void program_table_stays_bounded_and_plans_keep_theirs(void) {
  if (getenv("CLATTN_TEST_ALGOS")) return;
  static const char window[] =
      "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
      "  return q_idx - kv_idx <= cap->i[0] && kv_idx <= q_idx;\n}\n";
  cp_shape s = base(1, 777, 48); /* decode */
  s.mask_mod = window;
  s.capture_i[0] = 100;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  clattn_context *ctx = ct_context();
  REQUIRE(cp_upload(pb, ctx) == 0);
  clattn_plan *plan = NULL;
  pb->params.algo = CLATTN_ALGO_FUSED;
  REQUIRE(clattn_plan_create(ctx, &pb->params, &plan) == CLATTN_OK);
  const clattn_params planned = pb->params;
  char text[256];
  /* block masks of other modifiers: their small programs (cl/modifier.cl)
   * count against the same bound and push the plan's program out */
  for (int n = 0; n < CA_MOD_PROGRAMS_MAX + 4; n++) {
    snprintf(text, sizeof text,
             "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) {\n"
             "  return kv_idx <= q_idx + %d;\n}\n",
             n - 500);
    clattn_params other = planned;
    other.mask_mod = text;
    clattn_block_mask *bm = NULL;
    CHECK(clattn_block_mask_create(ctx, &other, 0, 0, &bm) == CLATTN_OK);
    clattn_block_mask_release(bm);
    int modded = 0, planned_held = 0;
    pthread_mutex_lock(&ctx->programs_lock);
    for (int i = 0; i < ctx->n_programs; i++) {
      modded += ctx->programs[i].key.mod.flags != 0;
      planned_held += ctx->programs[i].key.kind == CA_PROGRAM_FUSED && ctx->programs[i].key.mod.flags != 0;
    }
    pthread_mutex_unlock(&ctx->programs_lock);
    CHECKF(modded <= CA_MOD_PROGRAMS_MAX, "%d programs with modifiers held", modded);
    if (n == CA_MOD_PROGRAMS_MAX + 3) CHECKF(!planned_held, "the plan's program is still in the table");
  }
  pb->params = planned;
  forget_reference(pb);
  for (int step = 0; step < 2; step++) {
    REQUIRE(cp_fill_outputs(pb, NAN) == 0);
    CHECK(clattn_plan_enqueue(plan, NULL, 0, NULL, NULL) == CLATTN_OK);
    CHECK(clFinish(pb->queue) == CL_SUCCESS);
    cp_result r;
    memset(&r, 0, sizeof r);
    REQUIRE(cp_read_outputs(pb) == 0 && cp_compare(pb, &r) == 0);
    char f[512];
    CHECKF(cp_result_ok(&r, TOL), "plan step %d: %s", step, cp_result_format(&r, f, sizeof f));
  }
  clattn_plan_release(plan);
  KC_RUN_OK(pb, CLATTN_ALGO_FUSED, TOL); /* built again */
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(examples_match_reference_on_every_path),
      CT_TEST(examples_with_every_other_mask),
      CT_TEST(modifiers_equal_the_builtins),
      CT_TEST(disallowed_nan_never_reaches_an_output),
      CT_TEST(block_mask_skips_without_changing_a_bit),
      CT_TEST(bad_modifiers_are_refused),
      CT_TEST(program_table_stays_bounded_and_plans_keep_theirs),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
