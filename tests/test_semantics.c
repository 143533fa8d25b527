/*
 * DESIGN.md's Semantics on the device: the seeds' worked examples with their
 * exact numbers, paired permutation, inertness of disallowed candidates
 * (NaN/Inf in masked keys and values), packed-sequence isolation, empty
 * rows, huge logits, determinism and event ordering. Every run is also
 * checked against the fp64 reference.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "kit_checks.h"
#include "worked.h"

/* ---------- the seeds' worked examples ---------- */

/* One query row over n keys with dk = dq, dv: a problem whose host arrays
 * are then written from the example's numbers. */
static cp_problem *example(int n, int dk, int dv, const float *q, const float *k, const float *v,
                           const unsigned char *mask, float scale) {
  cp_shape s = cp_shape_default();
  s.q_len = 1;
  s.kv_len = n;
  s.head_dim = dk;
  s.value_dim = dv;
  s.scale = scale;
  s.want_lse = 1;
  s.want_weights = 1;
  s.want_diag = 1;
  s.mask = mask ? CP_MASK_ONES : CP_MASK_NONE;
  s.pad = 2;
  s.poison_gaps = 1;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) {
    CHECKF(0, "cp_build: %s", err);
    return NULL;
  }
  const clattn_params *p = &pb->params;
  for (int d = 0; d < dk; d++) pb->q[cp_index(&p->q, 0, 0, 0, d)] = q[d];
  for (int j = 0; j < n; j++) {
    for (int d = 0; d < dk; d++) pb->k[cp_index(&p->k, 0, 0, j, d)] = k[j * dk + d];
    for (int d = 0; d < dv; d++) pb->v[cp_index(&p->v, 0, 0, j, d)] = v[j * dv + d];
    if (mask) pb->mask[cp_index(&p->mask, 0, 0, 0, j)] = mask[j];
  }
  return pb;
}

/* Runs the example with every algorithm that can; checks out and weights
 * against the given numbers within tol (absolute) and the reference. */
static void check_example(cp_problem *pb, const double *want_out, const double *want_w, double tol) {
  if (!pb) return;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    const clattn_algo algo = kc_algos[a];
    if (KC_RUN_OK(pb, algo, 1e-5) <= 0) continue;
    for (int c = 0; c < pb->params.value_dim; c++)
      CHECKF(fabs(pb->out[c] - want_out[c]) <= tol, "%s: out[%d] = %.9g, expected %.9g", clattn_algo_name(algo), c,
             pb->out[c], want_out[c]);
    if (want_w)
      for (int j = 0; j < pb->params.kv_len; j++)
        CHECKF(fabs(pb->weights[j] - want_w[j]) <= tol, "%s: weights[%d] = %.9g, expected %.9g", clattn_algo_name(algo),
               j, pb->weights[j], want_w[j]);
  }
  cp_free(pb);
}

/* Every worked example of the seeds on every algorithm: the printed numbers
 * within their rounding (and the fp64 reference, in check_example). */
static void worked_examples_give_the_seeds_numbers(void) {
  for (int i = 0; i < CP_N_WORKED; i++) {
    const cp_worked *e = &cp_worked_examples[i];
    check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, e->allowed, e->scale), e->want_out, NULL, e->tol_out);
    check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, e->allowed, e->scale), e->want_out, e->want_w,
                  e->tol_w > e->tol_out ? e->tol_w : e->tol_out);
  }
}

/* The positive read to full precision; exact splits and means. */
static void positive_read_gives_worked_example_output(void) {
  const cp_worked *e = &cp_worked_examples[0];
  const double out[] = {8.638325843083024, 1.3616741569169766};
  check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, NULL, NAN), out, NULL, 1e-5);
}

static void key_collision_gives_even_split(void) {
  const cp_worked *e = &cp_worked_examples[2];
  const double out[] = {50.0}, w[] = {0.5, 0.5};
  check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, NULL, NAN), out, w, 1e-5);
}

static void zero_scale_gives_uniform_mean(void) {
  const cp_worked *e = &cp_worked_examples[3];
  const double out[] = {8.0}, w[] = {1.0 / 3, 1.0 / 3, 1.0 / 3};
  check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, NULL, 0.0f), out, w, 1e-5);
}

static void three_key_scalar_read_gives_17_04(void) {
  const cp_worked *e = &cp_worked_examples[4];
  const double s = 1.0 / sqrt(2.0), z = exp(s) + 1.0 + exp(-s);
  const double w[] = {exp(s) / z, 1.0 / z, exp(-s) / z};
  const double out[] = {10 * w[0] + 20 * w[1] + 40 * w[2]};
  check_example(example(e->n, e->dk, e->dv, e->q, e->k, e->v, NULL, NAN), out, w, 1e-5);
  CHECKF(fabs(out[0] - 17.04) < 5e-3, "the exact mixture %.6f rounds to 17.04", out[0]);
}

/* Checks row n's diagnostics after a run: entropy, max_weight, argmax. */
static void check_diag(const cp_problem *pb, clattn_algo algo, size_t n, double entropy, double max_weight,
                       int argmax) {
  CHECKF(fabs(pb->entropy[n] - entropy) <= 1e-5 * fmax(1.0, entropy) && fabs(pb->max_weight[n] - max_weight) <= 1e-6 &&
             pb->argmax[n] == argmax,
         "%s: row %zu: entropy %.9g max_weight %.9g argmax %d, expected %.9g %.9g %d", clattn_algo_name(algo), n,
         pb->entropy[n], pb->max_weight[n], pb->argmax[n], entropy, max_weight, argmax);
}

/* Uniform rows (scale 0) over a causal band: entropy log n, max weight 1/n,
 * argmax 0 (the lowest of n tied keys); across several key blocks. */
static void route_diagnostics_of_uniform_rows(void) {
  cp_shape s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 5;
  s.kv_len = 300;
  s.head_dim = 24;
  s.value_dim = 20;
  s.scale = 0.0f;
  s.causal = 1;
  s.want_lse = 1;
  s.want_diag = 1;
  s.layout = CP_BSHD;
  s.pad = 3;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < 5; i++) {
        const double n = 300 - 5 + i + 1;
        check_diag(pb, kc_algos[a], (size_t)h * 5 + i, log(n), 1.0 / n, 0);
      }
  }
  cp_free(pb);
}

/* One key far above the rest: entropy ~0, max weight 1, argmax that key;
 * two tied keys: log 2, 0.5, the lower index; rows of a batch whose
 * kv_lens is 0 are empty: 0, 0, -1. Batch 2 is checked against the
 * reference only. */
static void route_diagnostics_of_one_hot_tied_and_empty_rows(void) {
  cp_shape s = cp_shape_default();
  s.batch = 4;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 1;
  s.kv_len = 300;
  s.head_dim = 1;
  s.value_dim = 20;
  s.scale = 1.0f;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.want_diag = 1;
  s.layout = CP_BSHD;
  s.pad = 3;
  s.poison_gaps = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  for (int b = 0; b < 4; b++) {
    pb->kv_lens[b] = b == 3 ? 0 : 300;
    for (int h = 0; h < 2; h++) pb->q[cp_index(&p->q, b, h, 0, 0)] = 1.0f;
    for (int j = 0; j < 300; j++) pb->k[cp_index(&p->k, b, 0, j, 0)] = (float)(j % 7) * 0.01f;
  }
  pb->k[cp_index(&p->k, 0, 0, 257, 0)] = 100.0f; /* batch 0: one-hot at 257 */
  pb->k[cp_index(&p->k, 1, 0, 100, 0)] = 100.0f; /* batch 1: tied at 100 and 257 */
  pb->k[cp_index(&p->k, 1, 0, 257, 0)] = 100.0f;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    for (int h = 0; h < 2; h++) {
      check_diag(pb, kc_algos[a], (size_t)h, 0.0, 1.0, 257);
      check_diag(pb, kc_algos[a], (size_t)2 + h, log(2.0), 0.5, 100);
      check_diag(pb, kc_algos[a], (size_t)6 + h, 0.0, 0.0, -1);
    }
  }
  cp_free(pb);
}

/* Score shaping: softcap, ALiBi and sinks, alone and together with a mask,
 * bias, window, GQA and kv_lens, on every algorithm against the reference. */
static void score_shaping_matches_reference(void) {
  for (int variant = 0; variant < 5; variant++) {
    cp_shape s = cp_shape_default();
    s.batch = 2;
    s.q_heads = 4;
    s.kv_heads = 2;
    s.q_len = 37;
    s.kv_len = 53;
    s.head_dim = 40;
    s.value_dim = 24;
    s.want_lse = 1;
    s.want_diag = 1;
    s.qk_amp = 3.0;
    s.poison_gaps = 1;
    s.poison_disallowed = 1;
    s.seed = 40 + (uint64_t)variant;
    s.softcap = variant == 0 || variant == 3 ? 2.5f : 0.0f;
    s.alibi = variant == 1 ? 1 : variant >= 3 ? 2 : 0; /* 2: slopes per (batch, head) */
    s.sinks = variant == 2 || variant == 3 || variant == 4;
    if (variant >= 3) {
      s.mask = CP_MASK_RANDOM;
      s.bias = CP_BIAS_RANDOM;
      s.kv_lens = 1;
      s.causal = 1;
      s.window_left = 20;
      s.layout = CP_BSHD;
      s.pad = 2;
    }
    if (variant == 4) {
      s.q_len = 1;
      s.kv_len = 700;
      s.mask = CP_MASK_NONE;
      s.window_left = -1;
      s.want_diag = 0;
    }
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    s.want_weights = 1; /* the routing matrix too (FUSED cannot give it) */
    cp_free(pb);
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    cp_free(pb);
  }
}

/* Additive (Bahdanau) scores s_ij = scale sum_t w_t tanh(q_it + k_jt) on
 * every algorithm (prefill and decode, head dims with and without a multiple
 * of 16), and one closed-form case. */
static void additive_scoring_matches_reference(void) {
  for (int variant = 0; variant < 3; variant++) {
    cp_shape s = cp_shape_default();
    s.q_heads = 4;
    s.kv_heads = 2;
    s.additive = 1;
    s.want_lse = 1;
    s.want_diag = 1;
    s.poison_disallowed = 1;
    s.seed = 60 + (uint64_t)variant;
    if (variant == 0) {
      s.q_len = 37;
      s.kv_len = 53;
      s.head_dim = 40;
      s.value_dim = 24;
      s.causal = 1;
      s.mask = CP_MASK_RANDOM;
    }
    if (variant == 1) {
      s.q_len = 1;
      s.kv_len = 700;
      s.head_dim = 64;
      s.value_dim = 32;
      s.kv_lens = 1;
    }
    if (variant == 2) {
      s.q_len = 129;
      s.kv_len = 17;
      s.head_dim = 7;
      s.value_dim = 5;
      s.layout = CP_BSHD;
      s.pad = 2;
    }
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
    cp_free(pb);
  }
  /* one query, two keys, d = 1: weights softmax(scale w tanh(q + k_j)) */
  cp_shape s = cp_shape_default();
  s.q_len = 1;
  s.kv_len = 2;
  s.head_dim = 1;
  s.value_dim = 1;
  s.additive = 1;
  s.scale = 2.0f;
  s.want_weights = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  pb->q[cp_index(&p->q, 0, 0, 0, 0)] = 0.5f;
  pb->k[cp_index(&p->k, 0, 0, 0, 0)] = 0.25f;
  pb->k[cp_index(&p->k, 0, 0, 1, 0)] = -1.0f;
  pb->additive_w[0] = 1.5f;
  const double s0 = 2.0 * 1.5 * tanh(0.75), s1 = 2.0 * 1.5 * tanh(-0.5);
  const double w0 = 1.0 / (1.0 + exp(s1 - s0));
  for (size_t a = 0; a < KC_NALGOS; a++)
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) > 0) CHECK_CLOSE(pb->weights[0], w0, 1e-6);
  cp_free(pb);
}

/* ALiBi with scale 0: a_j proportional to exp(-slope |p - j|), closed form,
 * with one slope per head and with slopes per (batch, head). */
static void alibi_alone_gives_closed_form_weights(void) {
  for (int per_batch = 0; per_batch < 2; per_batch++) {
    cp_shape s = cp_shape_default();
    s.batch = 1 + per_batch;
    s.q_heads = 2;
    s.kv_heads = 1;
    s.q_len = 1;
    s.kv_len = 40;
    s.head_dim = 8;
    s.value_dim = 8;
    s.scale = 0.0f;
    s.alibi = 1 + per_batch;
    s.want_weights = 1;
    s.want_lse = 1;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) {
      if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
      for (int b = 0; b < s.batch; b++)
        for (int h = 0; h < 2; h++) {
          const double slope = pow(2.0, -8.0 * (h + 1) / 2) * (per_batch ? (b + 2) / 2.0 : 1.0);
          double z = 0.0;
          for (int j = 0; j < 40; j++) z += exp(-slope * (39 - j));
          for (int j = 0; j < 40; j++)
            CHECK_CLOSE(pb->weights[((size_t)b * 2 + h) * 40 + j], exp(-slope * (39 - j)) / z, 1e-6);
        }
    }
    cp_free(pb);
  }
}

/* A sink takes its share of the denominator: the keys' weights sum to
 * 1 - exp(sink - lse); a row with no allowed key has O = 0, lse = sink. */
static void sinks_share_the_denominator_and_fill_empty_rows(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 3;
  s.kv_len = 30;
  s.head_dim = 8;
  s.value_dim = 8;
  s.sinks = 1;
  s.kv_lens = 1;
  s.want_weights = 1;
  s.want_lse = 1;
  s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  pb->kv_lens[1] = 0; /* batch 1: every row empty */
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < 3; i++) {
        const size_t row = (size_t)h * 3 + i, empty_row = (size_t)(2 + h) * 3 + i;
        double sum = 0.0;
        for (int j = 0; j < 30; j++) sum += pb->weights[row * 30 + j];
        CHECK_CLOSE(sum, 1.0 - exp((double)pb->sinks[h] - (double)pb->lse[row]), 1e-6);
        CHECKF(pb->lse[empty_row] == pb->sinks[h], "%s: empty row lse %g, sink %g", clattn_algo_name(kc_algos[a]),
               pb->lse[empty_row], pb->sinks[h]);
        for (int c = 0; c < 8; c++) CHECK(pb->out[empty_row * 8 + c] == 0.0f);
      }
  }
  cp_free(pb);
}

static void two_key_mixture_gives_1_34_1_32(void) {
  const float q[] = {1, 0}, k[] = {1, 0, 0, 1}, v[] = {2, 0, 0, 4};
  const double out[] = {1.34, 1.32};
  check_example(example(2, 2, 2, q, k, v, NULL, NAN), out, NULL, 5e-3);
}

/* ---------- permutation ---------- */

static void paired_permutation_leaves_output(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 40;
  s.value_dim = 24;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 11;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  const clattn_params *p = &pb->params;
  const int N = s.kv_len;
  int perm[53];
  for (int j = 0; j < N; j++) perm[j] = (j * 17 + 5) % N; /* 17 is coprime to 53: a permutation */

  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pp;
    KC_BUILD(pp, &s);
    cp_result r;
    if (kc_run_ok(pb, kc_algos[a], 1e-5, __FILE__, __LINE__) <= 0) {
      cp_free(pp);
      continue;
    }
    /* key/value j of pb moves to perm[j] in pp */
    for (int b = 0; b < s.batch; b++)
      for (int g = 0; g < s.kv_heads; g++)
        for (int j = 0; j < N; j++) {
          for (int d = 0; d < s.head_dim; d++)
            pp->k[cp_index(&p->k, b, g, perm[j], d)] = pb->k[cp_index(&p->k, b, g, j, d)];
          for (int d = 0; d < s.value_dim; d++)
            pp->v[cp_index(&p->v, b, g, perm[j], d)] = pb->v[cp_index(&p->v, b, g, j, d)];
        }
    if (kc_run(pp, kc_algos[a], &r, __FILE__, __LINE__) > 0) {
      CHECK_STATUS(r.status, CLATTN_OK);
      double worst = 0, worst_w = 0;
      for (size_t x = 0; x < pb->out_count; x++) worst = fmax(worst, fabs((double)pp->out[x] - pb->out[x]));
      for (size_t row = 0; row < (size_t)s.batch * s.q_heads * s.q_len; row++)
        for (int j = 0; j < N; j++)
          worst_w = fmax(worst_w, fabs((double)pp->weights[row * N + perm[j]] - pb->weights[row * N + j]));
      CHECKF(worst <= 1e-6, "%s: permuted output differs by %.3g", clattn_algo_name(kc_algos[a]), worst);
      CHECKF(worst_w <= 1e-6, "%s: permuted weights differ by %.3g", clattn_algo_name(kc_algos[a]), worst_w);
      for (size_t x = 0; x < pb->lse_count; x++)
        if (!kc_close(pp->lse[x], pb->lse[x], 1e-6)) {
          CHECKF(0, "lse[%zu] %.9g vs %.9g", x, pp->lse[x], pb->lse[x]);
          break;
        }
    }
    cp_free(pp);
  }
  cp_free(pb);
}

/* ---------- disallowed candidates are inert ---------- */

static int raw_equal(const float *a, const float *b, size_t n) {
  return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

/* Runs s, then writes NaN/Inf into every key/value row no query may read,
 * reruns, and checks every output buffer is bitwise unchanged. */
static void check_poison_inert(cp_shape s, const char *what) {
  s.want_lse = 1;
  s.want_weights = (long)s.q_len * s.kv_len <= 200000;
  s.poison_disallowed = 0;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pb;
    KC_BUILD(pb, &s);
    float *out0 = malloc(pb->out_elems * sizeof(float));
    float *lse0 = malloc((pb->lse_elems + 1) * sizeof(float));
    float *w0 = malloc((pb->weights_elems + 1) * sizeof(float));
    if (!CHECK(out0 && lse0 && w0) || KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) goto next;
    memcpy(out0, pb->out_raw, pb->out_elems * sizeof(float));
    memcpy(lse0, pb->lse_raw, pb->lse_elems * sizeof(float));
    memcpy(w0, pb->weights_raw, pb->weights_elems * sizeof(float));
    long poisoned = cp_poison_disallowed(pb);
    CHECKF(poisoned > 0, "%s: the shape leaves no key unreachable; the test is vacuous", what);
    if (!CHECKF(cp_write_inputs(pb) == 0, "%s", pb->err) || KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) goto next;
    CHECKF(raw_equal(out0, pb->out_raw, pb->out_elems), "%s, %s: out changed after poisoning %ld unreachable key rows",
           what, clattn_algo_name(kc_algos[a]), poisoned);
    CHECKF(raw_equal(lse0, pb->lse_raw, pb->lse_elems), "%s, %s: lse changed", what, clattn_algo_name(kc_algos[a]));
    CHECKF(raw_equal(w0, pb->weights_raw, pb->weights_elems), "%s, %s: weights changed", what,
           clattn_algo_name(kc_algos[a]));
  next:
    free(out0);
    free(lse0);
    free(w0);
    cp_free(pb);
  }
}

static void masked_candidates_nan_changes_nothing(void) {
  /* a key-padding mask (broadcast over heads and rows): masked keys are
   * masked for every query */
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 3;
  s.kv_heads = 1;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 64;
  s.value_dim = 64;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.6;
  s.mask_bcast = CP_BCAST_HEAD | CP_BCAST_ROW;
  s.seed = 21;
  check_poison_inert(s, "key-padding mask");
}

static void keys_past_kv_lens_nan_changes_nothing(void) {
  cp_shape s = cp_shape_default();
  s.batch = 3;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 7;
  s.kv_len = 128;
  s.head_dim = 40;
  s.value_dim = 40;
  s.kv_lens = 1;
  s.layout = CP_BSHD;
  s.seed = 22;
  check_poison_inert(s, "kv_lens");
}

static void keys_outside_window_nan_changes_nothing(void) {
  cp_shape s = cp_shape_default();
  s.batch = 1;
  s.q_heads = 2;
  s.kv_heads = 2;
  s.q_len = 8;
  s.kv_len = 64;
  s.head_dim = 32;
  s.value_dim = 16;
  s.causal = 1;
  s.window_left = 8; /* keys j < 64 - 8 - 8 are out of every window */
  s.seed = 23;
  check_poison_inert(s, "causal + window_left");
  s.causal = 0;
  s.q_len = 8;
  s.kv_len = 32;
  s.window_left = 4;
  s.window_right = 2; /* rows see [i+24-4, i+24+2]: keys j < 20 never */
  s.layout = CP_BSHD;
  check_poison_inert(s, "window band");
}

static void masks_combined_nan_changes_nothing(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 6;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 128;
  s.head_dim = 111;
  s.value_dim = 40;
  s.causal = 1;
  s.window_left = 64;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.8;
  s.mask_bcast = CP_BCAST_ROW;
  s.bias = CP_BIAS_RANDOM;
  s.pad = 5;
  s.row_gap = 3;
  s.poison_gaps = 1;
  s.seed = 24;
  check_poison_inert(s, "causal + window + kv_lens + mask + bias");
}

/* Causal: a NaN key/value at the last position reaches only the last row
 * (the one query allowed to see it), which becomes NaN; every other row is
 * bitwise unchanged. */
static void nan_in_allowed_key_poisons_only_its_row(void) {
  cp_shape s = cp_shape_default();
  s.q_len = 16;
  s.kv_len = 16;
  s.head_dim = 8;
  s.value_dim = 8;
  s.causal = 1;
  s.want_lse = 1;
  s.seed = 25;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pb;
    KC_BUILD(pb, &s);
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) {
      cp_free(pb);
      continue;
    }
    float out0[16 * 8], lse0[16];
    memcpy(out0, pb->out, sizeof out0);
    memcpy(lse0, pb->lse, sizeof lse0);
    for (int d = 0; d < 8; d++) {
      pb->k[cp_index(&pb->params.k, 0, 0, 15, d)] = NAN;
      pb->v[cp_index(&pb->params.v, 0, 0, 15, d)] = NAN;
    }
    cp_result r;
    if (cp_write_inputs(pb) == 0 && kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) > 0) {
      CHECK_STATUS(r.status, CLATTN_OK);
      CHECKF(memcmp(out0, pb->out, 15 * 8 * sizeof(float)) == 0, "%s: rows before the NaN key changed",
             clattn_algo_name(kc_algos[a]));
      CHECK(memcmp(lse0, pb->lse, 15 * sizeof(float)) == 0);
      int all_nan = isnan(pb->lse[15]);
      for (int c = 0; c < 8; c++) all_nan &= isnan(pb->out[15 * 8 + c]);
      CHECKF(all_nan, "%s: the last row should be NaN (NaN in an allowed score propagates)",
             clattn_algo_name(kc_algos[a]));
      CHECK(r.mismatch_out == 0 && r.mismatch_lse == 0);
    }
    cp_free(pb);
  }
}

/* kv_lens outside [0, N] clamp: negative = no key, past N = every key. */
static void kv_lens_out_of_range_clamp(void) {
  cp_shape s = cp_shape_default();
  s.batch = 4;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 7;
  s.kv_len = 37;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.seed = 27;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pb;
    KC_BUILD(pb, &s);
    pb->kv_lens[0] = -5;
    pb->kv_lens[1] = 37 + 100;
    pb->kv_lens[2] = INT32_MAX;
    pb->kv_lens[3] = INT32_MIN;
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) > 0)
      CHECKF(pb->ref_empty_rows == 2 * 2 * 7, "reference empty rows %ld", pb->ref_empty_rows);
    cp_free(pb);
  }
}

/* ---------- packed sequences ---------- */

static void packed_sequences_isolated_by_block_mask(void) {
  enum { L1 = 23, L2 = 30, L = L1 + L2, D = 40 };
  cp_shape s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 2;
  s.q_len = L;
  s.kv_len = L;
  s.head_dim = D;
  s.value_dim = D;
  s.causal = 1;
  s.mask = CP_MASK_ONES;
  s.want_lse = 1;
  s.seed = 31;
  cp_shape s1 = s, s2 = s;
  s1.q_len = s1.kv_len = L1;
  s2.q_len = s2.kv_len = L2;
  s1.mask = s2.mask = CP_MASK_NONE;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pk = NULL, *p1 = NULL, *p2 = NULL;
    char err[256];
    pk = cp_build(&s, err, sizeof err);
    p1 = cp_build(&s1, err, sizeof err);
    p2 = cp_build(&s2, err, sizeof err);
    if (!CHECKF(pk && p1 && p2, "cp_build: %s", err)) goto next;
    const clattn_params *P = &pk->params;
    /* block-diagonal mask: row i in sequence (i >= L1), key j likewise */
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) pk->mask[cp_index(&P->mask, 0, h, i, j)] = (i >= L1) == (j >= L1);
    /* the packed rows are the two sequences' rows */
    for (int h = 0; h < 2; h++) {
      for (int i = 0; i < L; i++) {
        cp_problem *src = i < L1 ? p1 : p2;
        int r = i < L1 ? i : i - L1;
        for (int d = 0; d < D; d++) {
          pk->q[cp_index(&P->q, 0, h, i, d)] = src->q[cp_index(&src->params.q, 0, h, r, d)];
          pk->k[cp_index(&P->k, 0, h, i, d)] = src->k[cp_index(&src->params.k, 0, h, r, d)];
          pk->v[cp_index(&P->v, 0, h, i, d)] = src->v[cp_index(&src->params.v, 0, h, r, d)];
        }
      }
    }
    if (KC_RUN_OK(pk, kc_algos[a], 1e-5) <= 0 || KC_RUN_OK(p1, kc_algos[a], 1e-5) <= 0 ||
        KC_RUN_OK(p2, kc_algos[a], 1e-5) <= 0)
      goto next;
    double worst = 0;
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < L; i++) {
        cp_problem *src = i < L1 ? p1 : p2;
        int r = i < L1 ? i : i - L1, Ls = i < L1 ? L1 : L2;
        for (int d = 0; d < D; d++)
          worst =
              fmax(worst, fabs((double)pk->out[((size_t)h * L + i) * D + d] - src->out[((size_t)h * Ls + r) * D + d]));
      }
    CHECKF(worst <= 1e-6, "%s: packed vs separate outputs differ by %.3g", clattn_algo_name(kc_algos[a]), worst);

    /* changing sequence 2 (even to NaN) leaves sequence 1's rows bitwise */
    float *o1 = malloc(pk->out_count * sizeof(float));
    if (!CHECK(o1)) goto next;
    memcpy(o1, pk->out, pk->out_count * sizeof(float));
    for (int h = 0; h < 2; h++)
      for (int j = L1; j < L; j++)
        for (int d = 0; d < D; d++) {
          pk->k[cp_index(&P->k, 0, h, j, d)] = (j % 2) ? NAN : 1e30f;
          pk->v[cp_index(&P->v, 0, h, j, d)] = (j % 2) ? INFINITY : NAN;
        }
    cp_result r;
    if (cp_write_inputs(pk) == 0 && kc_run(pk, kc_algos[a], &r, __FILE__, __LINE__) > 0) {
      CHECK_STATUS(r.status, CLATTN_OK);
      int same = 1;
      for (int h = 0; h < 2; h++)
        same &= memcmp(o1 + (size_t)h * L * D, pk->out + (size_t)h * L * D, (size_t)L1 * D * sizeof(float)) == 0;
      CHECKF(same, "%s: sequence 1 changed when sequence 2 did", clattn_algo_name(kc_algos[a]));
    }
    free(o1);
  next:
    cp_free(pk);
    cp_free(p1);
    cp_free(p2);
  }
}

/* ---------- empty rows ---------- */

/* B=2, H=2, M=12, N=8, causal (so with M > N the first 4 rows are empty),
 * batch 1 has kv_lens 0 (all its rows empty), row 6 of head 0, batch 0 is
 * fully masked and row 7 has an all -inf bias. */
static cp_problem *empty_rows_problem(clattn_empty_rows policy) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 12;
  s.kv_len = 8;
  s.head_dim = 16;
  s.value_dim = 8;
  s.causal = 1;
  s.kv_lens = 1;
  s.mask = CP_MASK_ONES;
  s.bias = CP_BIAS_RANDOM;
  s.want_lse = 1;
  s.want_weights = 1;
  s.empty_rows = policy;
  s.seed = 41;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) {
    CHECKF(0, "cp_build: %s", err);
    return NULL;
  }
  pb->kv_lens[0] = 8;
  pb->kv_lens[1] = 0;
  for (int j = 0; j < 8; j++) {
    pb->mask[cp_index(&pb->params.mask, 0, 0, 6, j)] = 0;
    pb->bias[cp_index(&pb->params.bias, 0, 0, 7, j)] = -INFINITY;
  }
  return pb;
}

static void empty_rows_zero_policy_writes_zero_and_minus_inf(void) {
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pb = empty_rows_problem(CLATTN_EMPTY_ZERO);
    if (!pb) return;
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) > 0) {
      /* 4 causal-empty rows x 2 heads in batch 0, 24 rows of batch 1, rows 6 and 7 of head 0 */
      CHECKF(pb->ref_empty_rows == 8 + 24 + 2, "reference empty rows %ld", pb->ref_empty_rows);
      long bad = 0, nans = 0;
      for (size_t row = 0; row < pb->lse_count; row++) {
        int b = (int)(row / 24), h = (int)(row / 12 % 2), i = (int)(row % 12);
        int empty = b == 1 || i < 4 || (h == 0 && (i == 6 || i == 7));
        for (int c = 0; c < 8; c++) nans += isnan(pb->out[row * 8 + c]);
        for (int j = 0; j < 8; j++) nans += isnan(pb->weights[row * 8 + j]);
        if (!empty) continue;
        bad += pb->lse[row] != -INFINITY;
        for (int c = 0; c < 8; c++) bad += pb->out[row * 8 + c] != 0.0f;
        for (int j = 0; j < 8; j++) bad += pb->weights[row * 8 + j] != 0.0f;
      }
      CHECKF(bad == 0, "%s: %ld entries of empty rows are not 0 / -inf", clattn_algo_name(kc_algos[a]), bad);
      CHECKF(nans == 0, "%s: %ld NaN in out/weights", clattn_algo_name(kc_algos[a]), nans);
    }
    cp_free(pb);
  }
}

static void empty_rows_error_policy_returns_empty_row(void) {
  for (size_t a = 0; a < KC_NALGOS; a++) {
    cp_problem *pb = empty_rows_problem(CLATTN_EMPTY_ERROR);
    if (!pb) return;
    cp_result r;
    if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) > 0) {
      CHECK_STATUS(r.status, CLATTN_ERR_EMPTY_ROW);
      /* the outputs then hold the EMPTY_ZERO result */
      CHECKF(r.mismatch_out == 0 && r.mismatch_lse == 0 && r.mismatch_weights == 0 && r.err_out <= 1e-5 &&
                 r.err_lse <= 1e-5 && r.err_weights <= 1e-5,
             "%s: outputs after EMPTY_ROW differ from the EMPTY_ZERO result", clattn_algo_name(kc_algos[a]));
    }
    cp_free(pb);
  }
  /* no empty row: EMPTY_ERROR succeeds */
  cp_shape s = cp_shape_default();
  s.q_len = 9;
  s.kv_len = 9;
  s.causal = 1;
  s.empty_rows = CLATTN_EMPTY_ERROR;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  for (size_t a = 0; a < KC_NALGOS; a++) KC_RUN_OK(pb, kc_algos[a], 1e-5);
  cp_free(pb);
}

/* ---------- huge logits ---------- */

static void huge_logits_give_finite_outputs(void) {
  struct {
    const char *what;
    cp_bias_kind bias;
    double amp;
    float scale;
    double tol;
  } cases[] = {
      /* one dominant key per row: exact to f32 */
      {"random bias +-1e4", CP_BIAS_RANDOM, 1e4, NAN, 1e-5},
      /* every score shifted by +-1e4: f32 keeps ~1e-3 of the small part */
      {"bias +1e4", CP_BIAS_CONST, 1e4, NAN, 5e-3},
      {"bias -1e4", CP_BIAS_CONST, -1e4, NAN, 5e-3},
      /* scores themselves around +-1e4 */
      {"scale 3000", CP_BIAS_NONE, 0, 3000.0f, 1e-2},
      {"scale -3000", CP_BIAS_NONE, 0, -3000.0f, 1e-2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    cp_shape s = cp_shape_default();
    s.batch = 2;
    s.q_heads = 2;
    s.kv_heads = 2;
    s.q_len = 37;
    s.kv_len = 53;
    s.head_dim = 8;
    s.value_dim = 16;
    s.bias = cases[c].bias;
    s.bias_amp = cases[c].amp;
    s.scale = cases[c].scale;
    s.want_lse = 1;
    s.want_weights = 1;
    s.seed = 51 + c;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    for (size_t a = 0; a < KC_NALGOS; a++) {
      cp_result r;
      if (kc_run(pb, kc_algos[a], &r, __FILE__, __LINE__) <= 0) continue;
      char f[512];
      long nonfinite = 0;
      for (size_t x = 0; x < pb->out_count; x++) nonfinite += !isfinite(pb->out[x]);
      for (size_t x = 0; x < pb->lse_count; x++) nonfinite += !isfinite(pb->lse[x]);
      CHECKF(nonfinite == 0, "%s, %s: %ld non-finite outputs", cases[c].what, clattn_algo_name(kc_algos[a]), nonfinite);
      CHECKF(cp_result_ok(&r, cases[c].tol), "%s, %s: %s", cases[c].what, clattn_algo_name(kc_algos[a]),
             cp_result_format(&r, f, sizeof f));
    }
    cp_free(pb);
  }
}

/* ---------- underflowed weights ---------- */

/* An allowed key whose weight underflows to exactly 0 (score -200 against a
 * row maximum of 0) contributes nothing, even with V = +inf: 0 * inf must
 * not make the row NaN. Every other key has score 0 and V = 1, so O = 1.
 * Shapes: M = 3 with dk = dv = 16 runs FUSED's direct (decode) kernel, M = 12
 * with dk = 3 its packed flash_rows; N = 48 is three whole blocks, so the
 * key sits in a block that skips per-element masking (FUSED's full-block
 * path); the -tiled run covers flash_tiled. STAGED mixes through mix.cl,
 * GEMM's SGEMM gives 0 * inf = NaN and gemm_store_rows recomputes the row
 * skipping zero weights. */
static void underflowed_weight_on_inf_value_contributes_nothing(void) {
  const struct { int q_len, dk, dv; } shapes[] = {{3, 16, 16}, {12, 3, 5}};
  for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
    cp_shape s = cp_shape_default();
    s.q_heads = 2;
    s.kv_heads = 1;
    s.q_len = shapes[c].q_len;
    s.kv_len = 48;
    s.head_dim = shapes[c].dk;
    s.value_dim = shapes[c].dv;
    s.scale = 1.0f;
    s.want_lse = 1;
    s.want_diag = 1;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    const clattn_params *p = &pb->params;
    const int under = 20; /* in the second block of 16 keys */
    for (int h = 0; h < s.q_heads; h++)
      for (int i = 0; i < s.q_len; i++)
        for (int d = 0; d < s.head_dim; d++) pb->q[cp_index(&p->q, 0, h, i, d)] = d == 0 ? 1.0f : 0.0f;
    for (int j = 0; j < s.kv_len; j++) {
      for (int d = 0; d < s.head_dim; d++) pb->k[cp_index(&p->k, 0, 0, j, d)] = j == under && d == 0 ? -200.0f : 0.0f;
      for (int d = 0; d < s.value_dim; d++) pb->v[cp_index(&p->v, 0, 0, j, d)] = j == under ? INFINITY : 1.0f;
    }
    for (size_t a = 0; a < KC_NALGOS; a++) {
      if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
      long off = 0;
      for (size_t x = 0; x < pb->out_count; x++) off += !(fabs(pb->out[x] - 1.0) <= 1e-5);
      CHECKF(off == 0, "M=%d dk=%d: %s: %ld of %zu outputs are not 1 (out[0] = %g)", s.q_len, s.head_dim,
             clattn_algo_name(kc_algos[a]), off, pb->out_count, pb->out[0]);
      for (size_t x = 0; x < pb->lse_count; x++)
        CHECKF(kc_close(pb->lse[x], log(47.0), 1e-5), "%s: lse[%zu] = %g, expected log 47",
               clattn_algo_name(kc_algos[a]), x, pb->lse[x]);
    }
    cp_free(pb);
  }
}

/* ---------- determinism ---------- */

static void repeated_runs_are_bitwise_identical(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 53;
  s.kv_len = 128;
  s.head_dim = 64;
  s.value_dim = 64;
  s.causal = 1;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.seed = 61;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  float *o = malloc(pb->out_elems * sizeof(float)), *l = malloc(pb->lse_elems * sizeof(float)),
        *w = malloc(pb->weights_elems * sizeof(float));
  REQUIRE(o && l && w);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) continue;
    memcpy(o, pb->out_raw, pb->out_elems * sizeof(float));
    memcpy(l, pb->lse_raw, pb->lse_elems * sizeof(float));
    memcpy(w, pb->weights_raw, pb->weights_elems * sizeof(float));
    for (int rep = 0; rep < 2; rep++) {
      if (KC_RUN_OK(pb, kc_algos[a], 1e-5) <= 0) break;
      CHECKF(raw_equal(o, pb->out_raw, pb->out_elems) && raw_equal(l, pb->lse_raw, pb->lse_elems) &&
                 raw_equal(w, pb->weights_raw, pb->weights_elems),
             "%s: run %d differs bitwise from the first", clattn_algo_name(kc_algos[a]), rep + 2);
    }
  }
  free(o);
  free(l);
  free(w);
  cp_free(pb);
}

/* ---------- events ---------- */

static void forward_waits_for_caller_events(void) {
  cp_shape s = cp_shape_default();
  s.q_len = 7;
  s.kv_len = 37;
  s.want_lse = 1;
  s.seed = 71;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  clattn_context *ctx = ct_context();
  if (!CHECKF(cp_upload(pb, ctx) == 0 && cp_fill_outputs(pb, NAN) == 0, "%s", pb->err)) goto done;
  cl_int e;
  cl_event gate = clCreateUserEvent(clattn_cl_context(ctx), &e);
  if (!CHECKF(e == CL_SUCCESS, "clCreateUserEvent: %d", e)) goto done;
  cl_event fin = NULL;
  pb->params.algo = CLATTN_ALGO_AUTO;
  clattn_status st = clattn_forward(ctx, &pb->params, 1, &gate, &fin);
  CHECK_STATUS(st, CLATTN_OK);
  if (st == CLATTN_OK) {
    CHECK(fin != NULL);
    cl_int state = CL_COMPLETE;
    if (fin) {
      clFlush(clattn_cl_queue(ctx));
      CHECK(clGetEventInfo(fin, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL) == CL_SUCCESS);
      CHECKF(state != CL_COMPLETE, "the call completed before its wait event");
    }
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE) == CL_SUCCESS);
    if (fin) {
      CHECK(clWaitForEvents(1, &fin) == CL_SUCCESS);
      CHECK(clGetEventInfo(fin, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL) == CL_SUCCESS &&
            state == CL_COMPLETE);
      clReleaseEvent(fin);
    }
    cp_result r;
    memset(&r, 0, sizeof r);
    r.status = st;
    if (CHECKF(cp_read_outputs(pb) == 0 && cp_compare(pb, &r) == 0, "%s", pb->err)) {
      char f[512];
      CHECKF(cp_result_ok(&r, 1e-5), "%s", cp_result_format(&r, f, sizeof f));
    }
  } else {
    clSetUserEventStatus(gate, CL_COMPLETE);
  }
  clReleaseEvent(gate);
done:
  cp_free(pb);
}

/* The fused kernel these tests exercise is the one the environment forces:
 * flash_rows on a CPU device, flash_block under CLATTN_FLASH_WG (the -block
 * variants), flash_tiled with CLATTN_FLASH_BLOCK=0 too (-tiled), as
 * clattn_last_route reports what a prefill call enqueued. */
/* OpenCL 2.1's query (the library and its tests build against 1.2
 * headers; the ICD loader exports it), for cl_intel_required_subgroup_size's
 * CL_KERNEL_COMPILE_SUB_GROUP_SIZE_INTEL. */
extern CL_API_ENTRY cl_int CL_API_CALL clGetKernelSubGroupInfo(cl_kernel, cl_device_id, cl_uint, size_t, const void *,
                                                               size_t, void *, size_t *);
#ifndef CL_KERNEL_COMPILE_SUB_GROUP_SIZE_INTEL
#define CL_KERNEL_COMPILE_SUB_GROUP_SIZE_INTEL 0x410A
#endif

/* The sub-group size kernel `name` of `program` was compiled for (0:
 * none required), -1 when it cannot be read. */
static int compiled_sub_group_size(cl_program program, const char *name) {
  if (!program) return -1;
  cl_int err;
  cl_kernel kernel = clCreateKernel(program, name, &err);
  if (err != CL_SUCCESS) return -1;
  size_t lanes = 0;
  err = clGetKernelSubGroupInfo(kernel, clattn_cl_device(ct_context()), CL_KERNEL_COMPILE_SUB_GROUP_SIZE_INTEL, 0, NULL,
                                sizeof lanes, &lanes, NULL);
  clReleaseKernel(kernel);
  return err == CL_SUCCESS ? (int)lanes : -1;
}

/* The context's fused program at d = 64, NULL when it cannot be built. */
static cl_program fused_program_d64(void) {
  ca_program built;
  const ca_program_key key = ca_fused_key(64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, 0);
  return ca_program_get(ct_context(), &key, &built) == CLATTN_OK ? built.program : NULL;
}

static void fused_kernel_is_the_one_forced(void) {
  cp_shape s = cp_shape_default();
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = s.value_dim = 64;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  if (KC_RUN_OK(pb, CLATTN_ALGO_FUSED, 1e-5) > 0) {
    const char *wg = getenv("CLATTN_FLASH_WG"), *block = getenv("CLATTN_FLASH_BLOCK");
    cl_device_type type = 0;
    clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_TYPE, sizeof type, &type, NULL);
    const char *route = clattn_last_route();
    CHECKF(!strncmp(route, "fused:", 6), "route \"%s\"", route);
    if (wg && atoi(wg) > 0) /* forced: the kernel asked for (the device may still step flash_block down) */
      CHECKF(strstr(route, block && !strcmp(block, "0") ? " flash_tiled" : " flash_block"),
             "route \"%s\" with "
             "CLATTN_FLASH_WG=%s CLATTN_FLASH_BLOCK=%s",
             route, wg, block ? block : "(unset)");
    else if (!wg && !(type & CL_DEVICE_TYPE_GPU))
      CHECKF(strstr(route, " flash_rows"), "route \"%s\" on a CPU device", route);
    /* flash_block's sub-group variant, forced at a size: compiled for it */
    const char *sg = getenv("CLATTN_BLOCK_SG");
    if (wg && atoi(wg) > 0 && !(block && !strcmp(block, "0")) && sg && *sg) {
      const int lanes = compiled_sub_group_size(fused_program_d64(), "flash_block");
      CHECKF(lanes == atoi(sg), "flash_block compiled for sub-groups of %d lanes (-1: unknown), CLATTN_BLOCK_SG=%s",
             lanes, sg);
    }
  }
  cp_free(pb);
}

/* softmax_rows (the staged and GEMM paths' softmax) is compiled for the
 * sub-group size CLATTN_SOFTMAX_SG forces (0: none, the local-memory
 * trees), its group then that many work-items; unforced, for the one the
 * context chose (where the device has sub-groups to ask about). */
static void softmax_kernel_is_the_one_forced(void) {
  clattn_context *ctx = ct_context();
  const char *sg = getenv("CLATTN_SOFTMAX_SG");
  if (!ctx->caps.sg_sizes) {
    CHECKF(ctx->tiles.softmax_sg == 0, "softmax_rows' sub-group variant (%d lanes) on a device without sub-groups",
           ctx->tiles.softmax_sg);
    return;
  }
  ca_program core;
  const ca_program_key key = ca_core_key(CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME);
  const int lanes =
      ca_program_get(ctx, &key, &core) == CLATTN_OK ? compiled_sub_group_size(core.program, "softmax_rows") : -1;
  if (sg && *sg) {
    CHECKF(lanes == atoi(sg), "softmax_rows compiled for sub-groups of %d lanes (-1: unknown), CLATTN_SOFTMAX_SG=%s",
           lanes, sg);
    CHECKF(atoi(sg) == 0 || ctx->tiles.softmax_wg == atoi(sg), "softmax_rows' group of %d, CLATTN_SOFTMAX_SG=%s",
           ctx->tiles.softmax_wg, sg);
  } else {
    CHECKF(lanes == ctx->tiles.softmax_sg, "softmax_rows compiled for sub-groups of %d lanes (-1: unknown), chosen %d",
           lanes, ctx->tiles.softmax_sg);
  }
}

/* softmax_rows' sub-group variant gives what its local-memory trees give,
 * bit for bit (its butterflies combine lane 0's partials in the trees'
 * order): every output of the staged and GEMM paths, with lse, weights,
 * diagnostics (the first argmax among ties), sinks, dropout, empty rows,
 * rows of fewer keys than lanes, a NaN row and packed sequences, against
 * a context on the same queue whose softmax_rows has the same group
 * through local memory (a tuning file with its softmax_wg and
 * CLATTN_SOFTMAX_SG=0). */
static void softmax_sub_groups_match_the_trees_bit_for_bit(void) {
  clattn_context *ctx = ct_context();
  if (!ctx->tiles.softmax_sg) {
    printf("  (softmax_rows takes its local-memory trees on this device: no sub-group variant to compare)\n");
    return;
  }
  char path[] = "/tmp/clattn-softmax-trees-XXXXXX", settings[64];
  const int fd = mkstemp(path);
  REQUIREF(fd >= 0, "mkstemp: %s", strerror(errno));
  close(fd);
  snprintf(settings, sizeof settings, "softmax_wg = %d\n", ctx->tiles.softmax_wg);
  const clattn_status written = clattn_tuning_write(ctx, settings, path);
  const char *env = getenv("CLATTN_SOFTMAX_SG");
  char *forced = env ? strdup(env) : NULL;
  setenv("CLATTN_SOFTMAX_SG", "0", 1);
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = clattn_cl_context(ctx);
  opt.device = clattn_cl_device(ctx);
  opt.queue = clattn_cl_queue(ctx);
  opt.tuning_file = path;
  clattn_context *trees = NULL;
  const clattn_status st = written == CLATTN_OK ? clattn_create(&opt, &trees) : written;
  if (forced)
    setenv("CLATTN_SOFTMAX_SG", forced, 1);
  else
    unsetenv("CLATTN_SOFTMAX_SG");
  free(forced);
  unlink(path);
  REQUIREF(st == CLATTN_OK, "the context with local-memory trees: %s", clattn_last_error(NULL));
  CHECKF(trees->tiles.softmax_sg == 0 && trees->tiles.softmax_wg == ctx->tiles.softmax_wg,
         "the trees' context: softmax_wg %d, softmax_sg %d (want %d, 0)", trees->tiles.softmax_wg,
         trees->tiles.softmax_sg, ctx->tiles.softmax_wg);

  static const int seq_q[] = {19, 0, 7}, seq_k[] = {300, 4, 0};
  for (int c = 0; c < 4; c++) {
    cp_shape s = cp_shape_default();
    s.batch = 3;
    s.q_heads = 4;
    s.kv_heads = 2;
    s.q_len = 19;
    s.kv_len = c == 1 ? 5 : 300; /* 5: fewer keys than lanes */
    s.want_lse = s.want_weights = s.want_diag = 1;
    s.causal = c == 0;
    s.kv_lens = c != 3;
    s.mask = c == 0 ? CP_MASK_RANDOM : CP_MASK_NONE;
    s.mask_density = 0.4; /* with kv_lens and the causal window: empty rows */
    s.sinks = c != 1;
    s.scale = c == 2 ? 0.0f : NAN; /* every key ties: argmax is each row's first */
    s.dropout_p = c == 1 ? 0.0f : 0.3f;
    s.dropout_seed = 77;
    s.varlen = c == 3;
    s.seq_q = c == 3 ? seq_q : NULL;
    s.seq_k = c == 3 ? seq_k : NULL;
    s.seed = 900 + (uint64_t)c;
    for (int a = 0; a < 2; a++) {
      const clattn_algo algo = a ? CLATTN_ALGO_GEMM : CLATTN_ALGO_STAGED;
      if (kc_algo_filtered_out(algo)) continue;
      cp_problem *pb[2];
      KC_BUILD(pb[0], &s);
      KC_BUILD(pb[1], &s);
      cp_result r[2];
      for (int k = 0; k < 2; k++) {
        if (c == 1) /* a NaN query: its row's scores are NaN */
          for (int d = 0; d < s.head_dim; d++) pb[k]->q[cp_index(&pb[k]->params.q, 1, 2, 3, d)] = NAN;
        pb[k]->params.algo = algo;
        if (!CHECKF(cp_run(pb[k], k ? trees : ctx, &r[k]) == 0, "harness: %s", pb[k]->err)) r[k].status = -1;
      }
      const int unsupported = r[0].status == CLATTN_ERR_UNSUPPORTED && kc_algo_optional(algo, &pb[0]->params);
      if (!unsupported && CHECKF(r[0].status == CLATTN_OK && r[1].status == CLATTN_OK, "case %d %s: status %d, %d", c,
                                 clattn_algo_name(algo), r[0].status, r[1].status)) {
        char f[512];
        CHECKF(cp_result_ok(&r[0], 1e-5), "case %d %s: %s", c, clattn_algo_name(algo),
               cp_result_format(&r[0], f, sizeof f));
        const cp_problem *x = pb[0], *y = pb[1];
        CHECKF(raw_equal(x->out_raw, y->out_raw, x->out_elems) && raw_equal(x->lse_raw, y->lse_raw, x->lse_elems) &&
                   raw_equal(x->weights_raw, y->weights_raw, x->weights_elems) &&
                   raw_equal(x->entropy_raw, y->entropy_raw, x->diag_elems) &&
                   raw_equal(x->max_weight_raw, y->max_weight_raw, x->diag_elems) &&
                   !memcmp(x->argmax_raw, y->argmax_raw, x->diag_elems * sizeof(int32_t)),
               "case %d %s: sub-groups of %d lanes and the trees differ bitwise", c, clattn_algo_name(algo),
               ctx->tiles.softmax_sg);
      }
      cp_free(pb[0]);
      cp_free(pb[1]);
    }
  }
  clattn_destroy(trees);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(positive_read_gives_worked_example_output),
      CT_TEST(worked_examples_give_the_seeds_numbers),
      CT_TEST(key_collision_gives_even_split),
      CT_TEST(zero_scale_gives_uniform_mean),
      CT_TEST(three_key_scalar_read_gives_17_04),
      CT_TEST(two_key_mixture_gives_1_34_1_32),
      CT_TEST(fused_kernel_is_the_one_forced),
      CT_TEST(softmax_kernel_is_the_one_forced),
      CT_TEST(softmax_sub_groups_match_the_trees_bit_for_bit),
      CT_TEST(route_diagnostics_of_uniform_rows),
      CT_TEST(route_diagnostics_of_one_hot_tied_and_empty_rows),
      CT_TEST(score_shaping_matches_reference),
      CT_TEST(alibi_alone_gives_closed_form_weights),
      CT_TEST(additive_scoring_matches_reference),
      CT_TEST(sinks_share_the_denominator_and_fill_empty_rows),
      CT_TEST(paired_permutation_leaves_output),
      CT_TEST(masked_candidates_nan_changes_nothing),
      CT_TEST(keys_past_kv_lens_nan_changes_nothing),
      CT_TEST(keys_outside_window_nan_changes_nothing),
      CT_TEST(masks_combined_nan_changes_nothing),
      CT_TEST(nan_in_allowed_key_poisons_only_its_row),
      CT_TEST(kv_lens_out_of_range_clamp),
      CT_TEST(packed_sequences_isolated_by_block_mask),
      CT_TEST(empty_rows_zero_policy_writes_zero_and_minus_inf),
      CT_TEST(empty_rows_error_policy_returns_empty_row),
      CT_TEST(huge_logits_give_finite_outputs),
      CT_TEST(underflowed_weight_on_inf_value_contributes_nothing),
      CT_TEST(repeated_runs_are_bitwise_identical),
      CT_TEST(forward_waits_for_caller_events),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
