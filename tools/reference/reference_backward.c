/*
 * The fp64 reference of the backward pass (see reference_backward.h):
 * one query row at a time, its weights rebuilt exactly, then the chain rule
 * through softmax (with the sink's term), softcap and the score's form.
 */
#include "reference_backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t at(const clattn_tensor *t, int b, int h, long row, int col) {
  return t->offset + (size_t)b * t->stride[0] + (size_t)h * t->stride[1] + (size_t)row * t->stride[2] +
         (size_t)col * t->stride[3];
}

int ref_backward(const clattn_params *p, const ref_inputs *in, const double *d_out, ref_grads *g) {
  if (!p || !in || !d_out || !g || !g->d_q || !g->d_k || !g->d_v || !in->q || !in->k || !in->v) return -1;
  if (p->batch <= 0 || p->q_heads <= 0 || p->kv_heads <= 0 || p->q_len <= 0 || p->kv_len <= 0 || p->head_dim <= 0 ||
      p->value_dim <= 0 || p->q_heads % p->kv_heads != 0)
    return -1;
  const int B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, M = p->q_len, N = p->kv_len;
  const int dk = p->head_dim, dv = p->value_dim, group = Hq / Hkv;
  const double scale = ref_scale(p);
  memset(g->d_q, 0, (size_t)B * Hq * M * dk * sizeof(double));
  memset(g->d_k, 0, (size_t)B * Hkv * N * dk * sizeof(double));
  memset(g->d_v, 0, (size_t)B * Hkv * N * dv * sizeof(double));
  if (g->d_sinks) memset(g->d_sinks, 0, (size_t)Hq * sizeof(double));
  if (g->d_additive_w) memset(g->d_additive_w, 0, (size_t)dk * sizeof(double));
  if (g->d_scores) memset(g->d_scores, 0, (size_t)B * Hq * M * N * sizeof(double));

  double *s = malloc((size_t)N * sizeof *s); /* shaped scores, then weights */
  unsigned char *use = malloc((size_t)N);
  double *o = malloc((size_t)dv * sizeof *o);
  if (!s || !use || !o) {
    free(s);
    free(use);
    free(o);
    return -1;
  }
  for (int b = 0; b < B; b++) {
    const ref_seq sq = ref_sequence(p, in, b);
    for (int h = 0; h < Hq; h++) {
      const int hk = h / group;
      for (int i = 0; i < sq.rows && i < M; i++) {
        const size_t row = ((size_t)b * Hq + h) * M + i;
        const double *dor = d_out + row * dv;
        double mx = -INFINITY;
        int any = 0;
        for (int j = 0; j < N; j++) {
          use[j] = 0;
          if (!ref_allowed(p, in, b, h, i, j) || ref_bias_disallows(p, in, b, h, i, j)) continue;
          s[j] = ref_score(p, in, b, h, i, j);
          if (s[j] == -INFINITY) continue; /* weight exactly 0: nothing flows back */
          use[j] = 1;
          any = 1;
          if (s[j] > mx || isnan(s[j])) mx = s[j];
        }
        if (!any) continue; /* empty row: d_q = 0, no sink term (O = 0) */
        const double sink = in->sinks ? (double)in->sinks[h] : -INFINITY;
        if (sink > mx) mx = sink;
        double sum = in->sinks ? exp(sink - mx) : 0.0;
        for (int j = 0; j < N; j++)
          if (use[j]) sum += (s[j] = exp(s[j] - mx));
        memset(o, 0, (size_t)dv * sizeof *o);
        for (int j = 0; j < N; j++)
          if (use[j]) {
            s[j] /= sum;
            const double z = ref_dropout_kept(p, b, h, i, j) ? ref_dropout_scale(p) : 0.0; /* 1 without dropout */
            for (int c = 0; c < dv; c++) o[c] += s[j] * z * in->v[at(&p->v, b, hk, sq.k0 + j, c)];
          }
        double D = 0.0;
        for (int c = 0; c < dv; c++) D += dor[c] * o[c];
        if (g->d_sinks && in->sinks) g->d_sinks[h] -= exp(sink - mx) / sum * D;
        for (int j = 0; j < N; j++) {
          if (!use[j]) continue;
          const double pj = s[j], z = ref_dropout_kept(p, b, h, i, j) ? ref_dropout_scale(p) : 0.0;
          double dp = 0.0;
          double *dvj = g->d_v + (((size_t)b * Hkv + hk) * N + j) * dv;
          for (int c = 0; c < dv; c++) {
            const double vjc = in->v[at(&p->v, b, hk, sq.k0 + j, c)];
            dp += dor[c] * vjc;
            dvj[c] += pj * z * dor[c];
          }
          double ds = pj * (z * dp - D); /* dL / d(shaped score); O = sum_j p_j z_j v_j */
          if (g->d_scores) g->d_scores[row * N + j] = ds;
          double dot = 0.0;
          for (int d = 0; d < dk; d++) {
            const double qd = in->q[at(&p->q, b, h, sq.q0 + i, d)], kd = in->k[at(&p->k, b, hk, sq.k0 + j, d)];
            dot += in->additive_w ? (double)in->additive_w[d] * tanh(qd + kd) : qd * kd;
          }
          if (in->mod_grad) ds *= (double)in->mod_grad[ref_pair_index(p, b, h, i, j)]; /* the score modifier's */
          if (p->softcap > 0.0f) {
            const double t = tanh(scale * dot / (double)p->softcap);
            ds *= 1.0 - t * t;
          }
          const double gd = ds * scale; /* dL / d(raw score) */
          double *dqi = g->d_q + row * dk;
          double *dkj = g->d_k + (((size_t)b * Hkv + hk) * N + j) * dk;
          for (int d = 0; d < dk; d++) {
            const double qd = in->q[at(&p->q, b, h, sq.q0 + i, d)], kd = in->k[at(&p->k, b, hk, sq.k0 + j, d)];
            if (in->additive_w) {
              const double u = tanh(qd + kd), w = in->additive_w[d];
              dqi[d] += gd * w * (1.0 - u * u);
              dkj[d] += gd * w * (1.0 - u * u);
              if (g->d_additive_w) g->d_additive_w[d] += gd * u;
            } else {
              dqi[d] += gd * kd;
              dkj[d] += gd * qd;
            }
          }
        }
      }
    }
  }
  free(s);
  free(use);
  free(o);
  return 0;
}

double ref_loss(const clattn_params *p, const ref_inputs *in, const double *d_out) {
  clattn_params f = *p;
  f.dtype = CLATTN_F32; /* the host inputs are floats whatever the storage */
  const size_t n = (size_t)p->batch * p->q_heads * p->q_len * p->value_dim;
  double *out = malloc(n * sizeof *out);
  if (!out) return NAN;
  ref_outputs o = {0};
  o.out = out;
  double loss = NAN;
  if (ref_forward(&f, in, &o) == 0) {
    loss = 0.0;
    for (size_t e = 0; e < n; e++) loss += d_out[e] * out[e];
  }
  free(out);
  return loss;
}
