/*
 * Decode shapes through the fused path: 1 to 16 query rows per KV head (one
 * token or a few speculative ones, times the GQA group), the shapes
 * flash_decode (cl/decode.cl) takes on GPUs. Run as `decode-block`
 * (CLATTN_FLASH_WG=64: POCL takes the GPU kernels, so flash_decode) under
 * both POCL work-group methods, and as `decode` (the CPU kernels).
 *
 *  - rows 1..16 from (group, q_len) pairs, N from 1 to 4099 off the tile
 *    multiples, head dims 40, 64, 80, 111, 128, every feature in turn (kv_lens,
 *    causal, windows, masks, bias, ALiBi, softcap, sinks, lse), f32, f16 and
 *    bf16 storage, NaN/Inf wherever nothing allowed reads, NaN-filled
 *    outputs, against the fp64 reference;
 *  - each case run twice: bitwise the same outputs and lse;
 *  - split-KV following each batch row's own length: kv_lens far below
 *    kv_len (1, 17, 0 and nearly all keys) at N = 4099 and 65,536;
 *  - route diagnostics and additive scores (flash_tiled keeps them) at a
 *    decode shape.
 * Paged and quantised caches at decode shapes are test_kvcache's.
 */
#include <math.h>
#include <stdint.h>

#include "kit_checks.h"

#define TOL 1e-5

/* The output tolerance for a storage type (test_precision's bounds). */
static double out_tol(clattn_dtype t) { return t == CLATTN_F16 ? 1e-3 : t == CLATTN_BF16 ? 8e-3 : TOL; }

/* Runs pb twice (outputs NaN-filled each time), checks the first run
 * against the reference and the second for the same bits. */
static void run_twice(cp_problem *pb, const char *label) {
  cp_result r;
  if (kc_run(pb, CLATTN_ALGO_FUSED, &r, __FILE__, __LINE__) <= 0) return;
  char d[512], f[512];
  const double tol = out_tol(pb->shape.dtype);
  if (!CHECKF(r.status == CLATTN_OK && r.mismatch_out == 0 && r.mismatch_lse == 0 && r.err_out <= tol &&
                  r.err_lse <= TOL && r.mismatch_diag == 0 && r.err_entropy <= TOL && r.err_max_weight <= TOL,
              "%s: %s\n      (%s)", label, cp_result_format(&r, f, sizeof f), cp_describe(&pb->shape, d, sizeof d))) {
    if (r.status != CLATTN_OK) printf("      last error: %s\n", clattn_last_error(ct_context()));
    return;
  }
  float *out = malloc(pb->out_count * sizeof(float)), *lse = malloc((pb->lse_count + 1) * sizeof(float));
  REQUIRE(out && lse);
  memcpy(out, pb->out, pb->out_count * sizeof(float));
  if (pb->lse_count) memcpy(lse, pb->lse, pb->lse_count * sizeof(float));
  if (kc_run(pb, CLATTN_ALGO_FUSED, &r, __FILE__, __LINE__) > 0)
    CHECKF(r.status == CLATTN_OK && memcmp(out, pb->out, pb->out_count * sizeof(float)) == 0 &&
               (!pb->lse_count || memcmp(lse, pb->lse, pb->lse_count * sizeof(float)) == 0),
           "%s: a second run differs", label);
  free(out);
  free(lse);
}

/* ---------- 1. rows 1..16, every feature ---------- */

static void decode_rows_match_reference_with_every_feature(void) {
  /* (group, q_len): rows per KV head 1, 2, 3, 4, 5, 7, 8, 9, 12, 16 */
  static const struct {
    int group, q_len;
  } rows[] = {{1, 1}, {2, 1}, {1, 3}, {4, 1}, {5, 1}, {7, 1}, {4, 2}, {3, 3}, {2, 6}, {16, 1}, {8, 2}, {1, 16}};
  static const int ns[] = {1, 7, 37, 53, 300, 1000, 4099};
  static const int dims[][2] = {{64, 64}, {40, 40}, {111, 80}, {128, 128}, {80, 111}};
  static const clattn_dtype types[] = {CLATTN_F32, CLATTN_F32, CLATTN_F16, CLATTN_F32, CLATTN_BF16};
  int idx = 0;
  for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
      cp_shape s = cp_shape_default();
      const int N = ns[ni];
      s.algo = CLATTN_ALGO_FUSED;
      s.batch = 1 + idx % 2;
      s.kv_heads = 1 + idx % 3 / 2;
      s.q_heads = s.kv_heads * rows[ri].group;
      s.q_len = rows[ri].q_len;
      s.kv_len = N;
      s.head_dim = dims[idx % 5][0];
      s.value_dim = dims[idx % 5][1];
      s.dtype = types[idx % 5];
      s.want_lse = 1;
      s.poison_gaps = 1;
      s.layout = idx % 2 ? CP_BSHD : CP_BHSD;
      s.pad = idx % 3;
      s.seed = 500 + (uint64_t)idx;
      switch (idx % 6) {
        case 0: /* padding under causal */
          s.kv_lens = 1;
          s.causal = 1;
          break;
        case 1: /* sliding window, per-row mask */
          s.causal = 1;
          s.window_left = N / 3;
          s.mask = CP_MASK_RANDOM;
          s.mask_bcast = CP_BCAST_ROW;
          break;
        case 2: /* padding, per-head mask and bias */
          s.kv_lens = 1;
          s.mask = CP_MASK_RANDOM;
          s.bias = CP_BIAS_RANDOM;
          s.bias_amp = 2.0;
          break;
        case 3: /* ALiBi, softcap, sinks, a two-sided window */
          s.alibi = 1;
          s.softcap = 20.0f;
          s.sinks = 1;
          s.window_left = N / 2;
          s.window_right = 3;
          break;
        case 4: /* sinks with padding: empty splits and short rows */
          s.kv_lens = 1;
          s.sinks = 1;
          s.causal = 1;
          break;
        default: /* everything at once, ALiBi slopes per (batch, head) */
          s.kv_lens = 1;
          s.causal = 1;
          s.window_left = N / 2;
          s.mask = CP_MASK_RANDOM;
          s.mask_density = 0.8;
          s.bias = CP_BIAS_RANDOM;
          s.bias_bcast = CP_BCAST_HEAD;
          s.alibi = 2;
          s.softcap = 30.0f;
          s.sinks = 1;
          break;
      }
      cp_problem *pb;
      KC_BUILD(pb, &s);
      cp_poison_disallowed(pb); /* NaN/Inf past kv_lens, outside the window, masked */
      char label[64];
      snprintf(label, sizeof label, "decode case %d (rows %d, N %d)", idx, rows[ri].group * rows[ri].q_len, N);
      run_twice(pb, label);
      cp_free(pb);
    }
  printf("  %d cases\n", idx);
}

/* ---------- 2. split-KV following each batch row's length ---------- */

static void splits_follow_each_rows_own_length(void) {
  static const struct {
    int n, dk;
    int lens[3];
  } cases[] = {{4099, 64, {4099, 17, 0}}, {4099, 128, {1, 4098, 2000}}, {65536, 64, {65533, 1000, 5}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int g = 1; g <= 8; g *= 8) {
      cp_shape s = cp_shape_default();
      s.algo = CLATTN_ALGO_FUSED;
      s.batch = 3;
      s.q_heads = g;
      s.kv_heads = 1;
      s.q_len = 2;
      s.kv_len = cases[c].n;
      s.head_dim = s.value_dim = cases[c].dk;
      s.kv_lens = 1;
      s.causal = g == 1;
      s.sinks = g == 8;
      s.want_lse = 1;
      s.seed = 700 + c * 10 + (uint64_t)g;
      cp_problem *pb;
      KC_BUILD(pb, &s);
      for (int b = 0; b < 3; b++) pb->kv_lens[b] = cases[c].lens[b];
      cp_poison_disallowed(pb);
      char label[96];
      snprintf(label, sizeof label, "N %d, lengths %d/%d/%d, %d rows", cases[c].n, cases[c].lens[0], cases[c].lens[1],
               cases[c].lens[2], 2 * g);
      run_twice(pb, label);
      cp_free(pb);
    }
}

/* ---------- 3. what flash_decode declines ---------- */

static void diagnostics_and_additive_at_decode_shapes(void) {
  for (int v = 0; v < 2; v++) {
    cp_shape s = cp_shape_default();
    s.algo = CLATTN_ALGO_FUSED;
    s.batch = 2;
    s.q_heads = 4;
    s.kv_heads = 2;
    s.q_len = 3;
    s.kv_len = 777;
    s.head_dim = s.value_dim = 64;
    s.kv_lens = 1;
    s.want_lse = 1;
    s.want_diag = v == 0;
    s.additive = v == 1;
    s.poison_disallowed = 1;
    s.seed = 800 + (uint64_t)v;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    run_twice(pb, v ? "additive scores" : "route diagnostics");
    cp_free(pb);
  }
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(decode_rows_match_reference_with_every_feature),
      CT_TEST(splits_follow_each_rows_own_length),
      CT_TEST(diagnostics_and_additive_at_decode_shapes),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
