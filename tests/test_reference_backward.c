/*
 * The fp64 backward reference alone (no device): every analytic gradient
 * of ref_backward against central finite differences of the fp64 forward
 * (ref_loss, L = sum dO . O) on tiny shapes, one per feature group. Inputs
 * lie on a 2^-10 grid so x +- h (h = 2^-10) is exact in the float inputs.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "problem.h"
#include "reference_backward.h"

static const double H = 1.0 / 1024.0;

static void grid(float *x, size_t n) {
  for (size_t e = 0; x && e < n; e++)
    if (isfinite(x[e])) x[e] = (float)(round((double)x[e] * 1024.0) / 1024.0);
}

/* d L / d x by central differences, x a float the reference reads. */
static double fd(cp_problem *pb, float *x, const double *d_out) {
  const ref_inputs in = cp_ref_inputs(pb);
  const float keep = *x;
  *x = (float)(keep + H);
  const double up = ref_loss(&pb->params, &in, d_out);
  *x = (float)(keep - H);
  const double down = ref_loss(&pb->params, &in, d_out);
  *x = keep;
  return (up - down) / (2.0 * H);
}

static double max_abs(const double *x, size_t n) {
  double m = 0.0;
  for (size_t e = 0; e < n; e++) m = fmax(m, fabs(x[e]));
  return m;
}

/* Checks one gradient array: the analytic value of each element against
 * its finite difference; tolerance relative to the array's largest entry. */
#define CHECK_GRAD(name, an, fdv, scale_) \
  CHECKF(fabs((an) - (fdv)) <= 1e-6 + 2e-5 * (scale_), "%s: analytic %.10g, finite difference %.10g", name, (an), (fdv))

static void check_shape(const cp_shape *s) {
  cp_problem *pb;
  char err[256] = "";
  pb = cp_build(s, err, sizeof err);
  REQUIREF(pb != NULL, "cp_build: %s", err);
  const clattn_params *p = &pb->params;
  grid(pb->q, pb->q_elems);
  grid(pb->k, pb->k_elems);
  grid(pb->v, pb->v_elems);
  grid(pb->sinks, pb->sinks ? (size_t)p->q_heads : 0);
  grid(pb->additive_w, pb->additive_w ? (size_t)p->head_dim : 0);
  grid(pb->bias, pb->bias_elems);
  const int B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, M = p->q_len, N = p->kv_len;
  const int dk = p->head_dim, dv = p->value_dim, group = Hq / Hkv;
  const size_t nq = (size_t)B * Hq * M * dk, nk = (size_t)B * Hkv * N * dk, nv = (size_t)B * Hkv * N * dv;
  const size_t no = (size_t)B * Hq * M * dv;
  double *d_out = malloc(no * sizeof *d_out);
  ref_grads g = {malloc(nq * sizeof(double)),        malloc(nk * sizeof(double)),
                 malloc(nv * sizeof(double)),        calloc((size_t)Hq, sizeof(double)),
                 calloc((size_t)dk, sizeof(double)), calloc(no / dv * N, sizeof(double))};
  if (!d_out || !g.d_q || !g.d_k || !g.d_v || !g.d_sinks || !g.d_additive_w || !g.d_scores) {
    CHECKF(0, "out of memory");
    goto done;
  }
  uint64_t x = s->seed * 2654435761u + 1;
  for (size_t e = 0; e < no; e++) { /* dO in [-1, 1] */
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    d_out[e] = (double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
  const ref_inputs in = cp_ref_inputs(pb);
  if (!CHECK(ref_backward(p, &in, d_out, &g) == 0)) goto done;
  const double sq_ = max_abs(g.d_q, nq), sk_ = max_abs(g.d_k, nk), sv_ = max_abs(g.d_v, nv);
  CHECKF(sq_ > 1e-3 && sk_ > 1e-3 && sv_ > 1e-3, "degenerate gradients (%g %g %g)", sq_, sk_, sv_);
  for (int b = 0; b < B; b++) {
    const ref_seq sq = ref_sequence(p, &in, b);
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < sq.rows; i++)
        for (int d = 0; d < dk; d++) {
          const double an = g.d_q[(((size_t)b * Hq + h) * M + i) * dk + d];
          CHECK_GRAD("d_q", an, fd(pb, &pb->q[cp_index(&p->q, b, h, (int)sq.q0 + i, d)], d_out), sq_);
        }
    for (int hk = 0; hk < Hkv; hk++)
      for (int j = 0; j < sq.keys; j++) {
        for (int d = 0; d < dk; d++) {
          const double an = g.d_k[(((size_t)b * Hkv + hk) * N + j) * dk + d];
          CHECK_GRAD("d_k", an, fd(pb, &pb->k[cp_index(&p->k, b, hk, (int)sq.k0 + j, d)], d_out), sk_);
        }
        for (int c = 0; c < dv; c++) {
          const double an = g.d_v[(((size_t)b * Hkv + hk) * N + j) * dv + c];
          CHECK_GRAD("d_v", an, fd(pb, &pb->v[cp_index(&p->v, b, hk, (int)sq.k0 + j, c)], d_out), sv_);
        }
      }
  }
  for (int h = 0; pb->sinks && h < Hq; h++)
    CHECK_GRAD("d_sinks", g.d_sinks[h], fd(pb, &pb->sinks[h], d_out), max_abs(g.d_sinks, (size_t)Hq));
  for (int d = 0; pb->additive_w && d < dk; d++)
    CHECK_GRAD("d_additive_w", g.d_additive_w[d], fd(pb, &pb->additive_w[d], d_out),
               max_abs(g.d_additive_w, (size_t)dk));
  /* a stored bias element's gradient: d_scores summed over every pair that
   * reads it (over the dimensions the bias broadcasts) */
  const double sb_ = max_abs(g.d_scores, no / dv * N);
  const clattn_tensor *bt = &p->bias;
  for (int b = 0; pb->bias && b < (bt->stride[0] ? B : 1); b++)
    for (int h = 0; h < (bt->stride[1] ? Hq : 1); h++)
      for (int i = 0; i < (bt->stride[2] ? M : 1); i++)
        for (int j = 0; j < N; j++) {
          const size_t e = cp_index(bt, b, h, i, j);
          double an = 0.0;
          for (int b2 = 0; b2 < B; b2++)
            for (int h2 = 0; h2 < Hq; h2++)
              for (int i2 = 0; i2 < M; i2++)
                if (cp_index(bt, b2, h2, i2, j) == e) an += g.d_scores[(((size_t)b2 * Hq + h2) * M + i2) * N + j];
          CHECK_GRAD("d_bias", an, fd(pb, &pb->bias[e], d_out), sb_);
        }
  (void)group;
done:
  free(d_out);
  free(g.d_q);
  free(g.d_k);
  free(g.d_v);
  free(g.d_sinks);
  free(g.d_additive_w);
  free(g.d_scores);
  cp_free(pb);
}

static cp_shape tiny(void) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 3;
  s.kv_len = 5;
  s.head_dim = 3;
  s.value_dim = 2;
  s.qk_amp = 1.5;
  s.seed = 7;
  return s;
}

static void fd_plain_dot(void) {
  cp_shape s = tiny();
  s.kv_heads = 2;
  s.scale = 0.7f;
  check_shape(&s);
}

static void fd_causal_window_kv_lens_mask_bias_gqa(void) {
  cp_shape s = tiny();
  s.causal = 1;
  s.window_left = 2;
  s.kv_lens = 1;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.8;
  s.bias = CP_BIAS_RANDOM;
  s.bias_amp = 1.0;
  check_shape(&s);
  s.bias_bcast = CP_BCAST_BATCH | CP_BCAST_HEAD; /* one [M, N] bias: its gradient sums over batch and heads */
  s.softcap = 1.5f;
  check_shape(&s);
}

static void fd_softcap_alibi_sinks(void) {
  cp_shape s = tiny();
  s.softcap = 1.5f;
  s.alibi = 1;
  s.sinks = 1;
  s.qk_amp = 2.0;
  check_shape(&s);
}

static void fd_additive(void) {
  cp_shape s = tiny();
  s.additive = 1;
  s.softcap = 2.0f;
  check_shape(&s);
}

static void fd_packed_sequences(void) {
  cp_shape s = tiny();
  s.varlen = 1;
  static const int seq_q[] = {3, 2}, seq_k[] = {5, 3};
  s.seq_q = seq_q;
  s.seq_k = seq_k;
  s.causal = 1;
  check_shape(&s);
}

/* Dropout: the mask is a constant of the inputs, so O = sum_j p_j z_j v_j
 * is smooth in them and its finite differences check the dropped chain. */
static void fd_dropout(void) {
  cp_shape s = tiny();
  s.causal = 1;
  s.sinks = 1;
  s.bias = CP_BIAS_RANDOM;
  s.dropout_p = 0.4f;
  s.dropout_seed = 11;
  s.dropout_offset = 3;
  check_shape(&s);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(fd_plain_dot),           CT_TEST(fd_causal_window_kv_lens_mask_bias_gqa),
      CT_TEST(fd_softcap_alibi_sinks), CT_TEST(fd_additive),
      CT_TEST(fd_packed_sequences),    CT_TEST(fd_dropout),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
