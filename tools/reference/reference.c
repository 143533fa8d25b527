/*
 * The fp64 host reference of DESIGN.md's semantics (see reference.h).
 *
 * Written for clarity, not speed: one query row at a time, scores in a
 * scratch array of N doubles. A disallowed candidate's key and value are
 * never read, so NaN or Inf stored there cannot reach an output.
 */
#include "reference.h"

#include <math.h>
#include <stdlib.h>

static size_t view_index(const clattn_tensor *t, int b, int h, int row, int col) {
  return t->offset + (size_t)b * t->stride[0] + (size_t)h * t->stride[1] + (size_t)row * t->stride[2] +
         (size_t)col * t->stride[3];
}

double ref_scale(const clattn_params *p) {
  if (isnan(p->scale)) return 1.0 / sqrt((double)p->head_dim);
  return (double)p->scale;
}

/* The effective right window bound: causal is window_right = 0, combined
 * with an explicit window_right by taking the tighter of the two, which is
 * always 0 (min(window_right, 0) for window_right >= 0; 0 when unbounded). */
static int effective_right(const clattn_params *p) { return p->causal ? 0 : p->window_right; }

static long clampl(long x, long lo, long hi) { return x < lo ? lo : x > hi ? hi : x; }

ref_seq ref_sequence(const clattn_params *p, const ref_inputs *in, int b) {
  ref_seq s = {0, 0, p->q_len, p->kv_len, p->q_len, p->kv_len};
  if (in->cu_seqlens_q) {
    const long q0 = clampl(in->cu_seqlens_q[b], 0, p->total_q);
    const long q1 = clampl(in->cu_seqlens_q[b + 1], q0, p->total_q);
    s.q0 = q0;
    s.rows = s.align_m = (int)(q1 - q0 < p->q_len ? q1 - q0 : p->q_len);
  }
  if (in->cu_seqlens_q && in->cu_seqlens_k) {
    const long k0 = clampl(in->cu_seqlens_k[b], 0, p->total_kv);
    const long k1 = clampl(in->cu_seqlens_k[b + 1], k0, p->total_kv);
    s.k0 = k0;
    s.keys = s.align_n = (int)(k1 - k0 < p->kv_len ? k1 - k0 : p->kv_len);
  } else if (in->kv_lens) {
    s.keys = (int)clampl(in->kv_lens[b], 0, p->kv_len);
    if (in->cache_leftpad) { /* the rows before cache_leftpad[b] are padding */
      s.k0 = clampl(in->cache_leftpad[b], 0, s.keys);
      s.keys -= (int)s.k0;
    }
    /* packed queries over per-row keys (a paged cache's form), or a left-padded row */
    if (in->cu_seqlens_q || in->cache_leftpad) s.align_n = s.keys;
  }
  return s;
}

void ref_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]}, k[2] = {key[0], key[1]};
  for (int round = 0; round < 10; round++) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    const uint32_t n[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k[0], (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c[3] ^ k[1],
                           (uint32_t)p0};
    for (int w = 0; w < 4; w++) c[w] = n[w];
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  for (int w = 0; w < 4; w++) out[w] = c[w];
}

int ref_dropout_kept(const clattn_params *p, int b, int h, long i, long j) {
  if (!(p->dropout_p > 0.0f)) return 1;
  const uint64_t at = p->dropout_offset + ((uint64_t)i << 32) + (uint64_t)(j / 4);
  const uint32_t counter[4] = {(uint32_t)at, (uint32_t)(at >> 32), (uint32_t)h, (uint32_t)b};
  const uint32_t key[2] = {(uint32_t)p->dropout_seed, (uint32_t)(p->dropout_seed >> 32)};
  uint32_t r[4];
  ref_philox4x32_10(counter, key, r);
  const uint32_t threshold = (uint32_t)floor((double)p->dropout_p * 4294967296.0);
  return r[j % 4] >= threshold;
}

double ref_dropout_scale(const clattn_params *p) {
  return p->dropout_p > 0.0f ? (double)(float)(1.0 / (1.0 - (double)p->dropout_p)) : 1.0;
}

int ref_allowed(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j) {
  const ref_seq sq = ref_sequence(p, in, b);
  if (j < 0 || j >= sq.keys || i < 0 || i >= sq.rows) return 0;
  if (in->mask && in->mask[view_index(&p->mask, b, h, i, j)] == 0) return 0;
  if (in->mod_allowed && !in->mod_allowed[ref_pair_index(p, b, h, i, j)]) return 0;
  long pos = (long)i + ((long)sq.align_n - (long)sq.align_m);
  if (p->window_left >= 0 && (long)j < pos - p->window_left) return 0;
  int right = effective_right(p);
  if (right >= 0 && (long)j > pos + right) return 0;
  return 1;
}

int ref_bias_disallows(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j) {
  return in->bias && in->bias[view_index(&p->bias, b, h, i, j)] == -INFINITY;
}

size_t ref_pair_index(const clattn_params *p, int b, int h, int i, int j) {
  return (((size_t)b * (size_t)p->q_heads + (size_t)h) * (size_t)p->q_len + (size_t)i) * (size_t)p->kv_len + (size_t)j;
}

double ref_shaped_score(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j) {
  const int g = h / (p->q_heads / p->kv_heads);
  const ref_seq sq = ref_sequence(p, in, b);
  double dot = 0.0;
  for (int d = 0; d < p->head_dim; d++) {
    const double qd = in->q[view_index(&p->q, b, h, (int)(sq.q0 + i), d)];
    const double kd = in->k[view_index(&p->k, b, g, (int)(sq.k0 + j), d)];
    dot += in->additive_w ? (double)in->additive_w[d] * tanh(qd + kd) : qd * kd;
  }
  double sc = ref_scale(p) * dot;
  if (p->softcap > 0.0f) sc = (double)p->softcap * tanh(sc / (double)p->softcap);
  return sc;
}

double ref_score(const clattn_params *p, const ref_inputs *in, int b, int h, int i, int j) {
  const ref_seq sq = ref_sequence(p, in, b);
  double sc = in->mod_score ? (double)in->mod_score[ref_pair_index(p, b, h, i, j)] : ref_shaped_score(p, in, b, h, i, j);
  if (in->bias) sc += (double)in->bias[view_index(&p->bias, b, h, i, j)];
  if (in->alibi_slopes) {
    const long pos = (long)i + ((long)sq.align_n - (long)sq.align_m);
    sc -= (double)in->alibi_slopes[(size_t)b * (size_t)p->alibi_batch_stride + (size_t)h] * (double)labs(pos - j);
  }
  return sc;
}

/* The route diagnostics of row `row` from its weights w (NULL: empty row). */
static void diagnose(ref_outputs *o, size_t row, const double *w, const unsigned char *use, int n, int best) {
  double entropy = 0.0, top = 0.0;
  int nan = 0; /* a +inf score makes the row's weights NaN (inf - inf) */
  for (int j = 0; w && j < n; j++)
    if (use[j]) {
      nan |= isnan(w[j]);
      if (w[j] > 0.0) entropy -= w[j] * log(w[j]);
      if (w[j] > top) top = w[j];
    }
  if (o->entropy) o->entropy[row] = nan ? NAN : entropy;
  if (o->max_weight) o->max_weight[row] = nan ? NAN : top;
  if (o->argmax) o->argmax[row] = nan ? REF_ARGMAX_UNSPECIFIED : w ? best : -1;
}

int ref_forward(const clattn_params *p, const ref_inputs *in, ref_outputs *o) {
  if (!p || !in || !o || !in->q || !in->k || !in->v || !o->out) return -1;
  if (p->dtype != CLATTN_F32) return -1;
  if (p->batch <= 0 || p->q_heads <= 0 || p->kv_heads <= 0 || p->q_len <= 0 || p->kv_len <= 0 || p->head_dim <= 0 ||
      p->value_dim <= 0)
    return -1;
  if (p->q_heads % p->kv_heads != 0) return -1;
  if (p->window_left < -1 || p->window_right < -1) return -1;

  const int B = p->batch, Hq = p->q_heads, M = p->q_len, N = p->kv_len;
  const int dv = p->value_dim;
  const int group = Hq / p->kv_heads;

  double *s = malloc((size_t)N * sizeof *s); /* scores of allowed keys */
  unsigned char *use = malloc((size_t)N);    /* allowed and score > -inf */
  if (!s || !use) {
    free(s);
    free(use);
    return -1;
  }

  long empty = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++) {
      const int g = h / group;
      for (int i = 0; i < M; i++) {
        const size_t row = ((size_t)b * Hq + h) * M + i;
        const ref_seq sq = ref_sequence(p, in, b);
        if (i >= sq.rows) { /* past a packed sequence's end: no such row */
          for (int c = 0; c < dv; c++) o->out[row * (size_t)dv + c] = 0.0;
          if (o->lse) o->lse[row] = 0.0;
          if (o->weights)
            for (int j = 0; j < N; j++) o->weights[row * (size_t)N + j] = 0.0;
          diagnose(o, row, NULL, use, N, -1);
          continue;
        }
        double mx = -INFINITY;
        int has_nan = 0, any = 0, best = -1;
        for (int j = 0; j < N; j++) {
          use[j] = 0;
          if (!ref_allowed(p, in, b, h, i, j) || ref_bias_disallows(p, in, b, h, i, j)) continue;
          double sc = ref_score(p, in, b, h, i, j);
          s[j] = sc;
          if (isnan(sc)) {
            has_nan = 1;
            use[j] = 1;
          } else if (sc != -INFINITY) {
            use[j] = 1;
            any = 1;
            if (sc > mx) { /* strictly: the lowest index on ties */
              mx = sc;
              best = j;
            }
          }
        }

        double *orow = o->out + row * (size_t)dv;
        double *wrow = o->weights ? o->weights + row * (size_t)N : NULL;
        if (wrow)
          for (int j = 0; j < N; j++) wrow[j] = 0.0;

        if (has_nan) { /* NaN in an allowed score: the row is NaN */
          for (int c = 0; c < dv; c++) orow[c] = NAN;
          if (o->lse) o->lse[row] = NAN;
          if (o->entropy) o->entropy[row] = NAN;
          if (o->max_weight) o->max_weight[row] = NAN;
          if (o->argmax) o->argmax[row] = REF_ARGMAX_UNSPECIFIED;
          if (wrow)
            for (int j = 0; j < N; j++)
              if (use[j]) wrow[j] = NAN;
          continue;
        }
        /* a sink is one more logit in the denominator, without a value */
        const double sink = in->sinks ? (double)in->sinks[h] : -INFINITY;
        if (!any) { /* empty row */
          empty++;
          for (int c = 0; c < dv; c++) orow[c] = 0.0;
          if (o->lse) o->lse[row] = sink;
          diagnose(o, row, NULL, use, N, -1);
          continue;
        }

        if (sink > mx) mx = sink;
        double sum = in->sinks ? exp(sink - mx) : 0.0;
        for (int j = 0; j < N; j++)
          if (use[j]) {
            s[j] = exp(s[j] - mx); /* NaN when mx is +inf and s[j] too */
            sum += s[j];
          }
        for (int c = 0; c < dv; c++) orow[c] = 0.0;
        for (int j = 0; j < N; j++) {
          if (!use[j]) continue;
          s[j] /= sum; /* s now holds the weights */
          const double w = ref_dropout_kept(p, b, h, i, j) ? s[j] * ref_dropout_scale(p) : 0.0;
          if (wrow) wrow[j] = w;
          if ((float)w == 0.0f) /* zero in f32: contributes nothing, even an Inf value */
            continue;
          for (int c = 0; c < dv; c++) orow[c] += w * (double)in->v[view_index(&p->v, b, g, (int)(sq.k0 + j), c)];
        }
        if (isnan(sum)) /* a +inf score: the softmax is NaN, and so is the row, whatever dropout keeps */
          for (int c = 0; c < dv; c++) orow[c] = NAN;
        if (o->lse) o->lse[row] = mx + log(sum);
        diagnose(o, row, s, use, N, best);
      }
    }

  o->empty_rows = empty;
  free(s);
  free(use);
  return 0;
}
