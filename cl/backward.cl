/*
 * backward — gradients of the forward (flash.cl's semantics) by
 * FlashAttention-2's recomputation: P is never stored, each pass rebuilds
 *   p_ij = exp(s_ij - lse_i)
 * from q, k and the forward's lse (which includes a sink's term), and
 *   D_i   = sum_c dO_ic O_ic                       (bwd_rowdot)
 *   dV_j  = sum_i p_ij dO_i                        (bwd_dkdv)
 *   dS_ij = p_ij (<dO_i, v_j> - D_i)
 *   dK_j  = sum_i g_ij dscore/dk,  dQ_i = sum_j g_ij dscore/dq   (bwd_dkdv, bwd_dq)
 * with g_ij = dS_ij * (1 - tanh^2(x/softcap) when softcap) * scale, the
 * chain through softcap; bias and ALiBi are constants of the score.
 * d_sinks[h] = -sum_{b,i} exp(sink_h - lse_i) D_i and d_additive_w are
 * per-row terms summed by bwd_sum in a fixed order.
 *
 * Determinism: every output element is written by exactly one work-item
 * that walks its partners in a fixed order (dK, dV of a KV head sum over
 * the group's query heads in head order), so no atomics and no order that
 * depends on scheduling: results are bitwise repeatable.
 *
 * A pair (i, j) takes part only when allowed (kv_lens, window, mask) and
 * its recomputed weight is nonzero, so NaN/Inf in a disallowed key or value
 * never reaches a gradient (as in the forward, a zero weight mixes nothing).
 *
 * -D DK, DV: head dim and value dim (private arrays are sized by them).
 */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV 64
#endif

/* Arguments every pass takes: the forward's views and score fields, d_out,
 * and the per-row scratch dsum (D_i) and sinkt (a sink's term of d_sinks),
 * both [B * Hq * q_len], indexed by the logical row. */
#define BWD_ARGS                                                                                      \
  __global const store_t *q, ulong q_off, ulong4 q_st, __global const store_t *k, ulong k_off,       \
      ulong4 k_st, __global const store_t *v, ulong v_off, ulong4 v_st, __global const store_t *o,    \
      ulong o_off, ulong4 o_st, __global const store_t *d_o, ulong do_off, ulong4 do_st,              \
      __global const float *lse, ulong lse_off, ulong4 lse_st, CA_SCORE_ARGS,                         \
      __global const uchar *mask, ulong mask_off, ulong4 mask_st, int has_mask,                        \
      __global const float *bias, ulong bias_off, ulong4 bias_st, int has_bias, CA_SEQ_ARGS,          \
      int q_heads, int kv_heads, int group, int q_len, int kv_len, float scale, CA_SHAPE_ARGS,        \
      __global const float *sinks, int has_sinks, int window_left, int window_right,                  \
      __global float *dsum, __global float *sinkt

static inline ulong bwd_row(long b, long h, long i, int q_heads, int q_len) {
  return ((ulong)b * (ulong)q_heads + (ulong)h) * (ulong)q_len + (ulong)i;
}

/* Whether key j is allowed for row (b, h, i): valid, inside the window, mask. */
static inline bool bwd_allowed(long b, long h, long i, long j, ca_seq sq, int window_left, int window_right,
                               __global const uchar *mask, ulong mask_off, ulong4 mask_st, int has_mask) {
  if (j >= sq.keys || !ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right)) return false;
  return !has_mask || mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
}

/* The score of (q_i, k_j), shaped as the forward does, and in *dshape the
 * derivative of the shaped score by the raw <q, k> (or additive sum). */
static inline float bwd_score(const float *qr, const float *kr, __global const float *add_w, int additive,
                              float scale, float bias_ij, long h, long i, long j, ca_seq sq, CA_SHAPE_ARGS,
                              float *dshape) {
  float dot = 0.0f;
  if (additive)
    for (int d = 0; d < DK; d++) dot = fma(add_w[d], tanh(qr[d] + kr[d]), dot);
  else
    for (int d = 0; d < DK; d++) dot = fma(qr[d], kr[d], dot);
  float x = scale * dot;
  *dshape = scale;
  if (softcap > 0.0f) {
    const float t = tanh(x / softcap);
    x = softcap * t;
    *dshape = scale * (1.0f - t * t);
  }
  x += bias_ij;
  if (has_alibi) x += ca_alibi(i, j, sq.align_m, sq.align_n, alibi[h]);
  return x;
}

/* The recomputed weight of an allowed pair; 0 when the score or the row's
 * lse is -inf (an empty row: nothing flows back through it). */
static inline float bwd_weight(float s, float row_lse) {
  return (s == -INFINITY || row_lse == -INFINITY) ? 0.0f : exp(s - row_lse);
}

/*
 * bwd_rowdot — D_i = sum_c dO_ic O_ic per query row, and with sinks the row's
 * term of d_sinks, -exp(sink_h - lse_i) D_i. Rows past a packed sequence's
 * end get 0. NDRange: (q_len, batch * q_heads).
 */
__kernel void bwd_rowdot(BWD_ARGS) {
  (void)q; (void)q_off; (void)q_st; (void)k; (void)k_off; (void)k_st; (void)v; (void)v_off; (void)v_st;
  const int i = get_global_id(0), bh = get_global_id(1);
  if (i >= q_len) return;
  const int b = bh / q_heads, h = bh % q_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const ulong row = bwd_row(b, h, i, q_heads, q_len);
  float d = 0.0f;
  if (i < sq.rows)
    for (int c = 0; c < DV; c++)
      d = fma(ca_load(d_o, ca_at(do_off, do_st, b, h, sq.q0 + i, c)), ca_load(o, ca_at(o_off, o_st, b, h, sq.q0 + i, c)), d);
  dsum[row] = d;
  if (has_sinks) {
    const float l = lse[ca_at(lse_off, lse_st, b, h, i, 0)];
    /* an empty row has lse = sink and O = 0: its term is 0 */
    sinkt[row] = i < sq.rows && l != -INFINITY ? -exp(sinks[h] - l) * d : 0.0f;
  }
}

/*
 * bwd_dkdv — one work-item per key j of KV head (b, hk): walks the query
 * rows that may see j (the window bounds them), over the group's heads in
 * order, and writes dK_j and dV_j. Keys past kv_lens get zero gradients;
 * keys past a packed sequence's end are left to bwd_zero.
 * NDRange: (kv_len, batch * kv_heads).
 */
__kernel void bwd_dkdv(BWD_ARGS, __global store_t *d_k, ulong dk_off, ulong4 dk_st, __global store_t *d_v,
                       ulong dv_off, ulong4 dv_st) {
  (void)o; (void)o_off; (void)o_st; (void)sinkt;
  const int j = get_global_id(0), bhk = get_global_id(1);
  if (j >= kv_len) return;
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  if (varlen && j >= sq.keys) return;
  const long kj = sq.k0 + j;
  float kr[DK], vr[DV], gk[DK], gv[DV];
  for (int d = 0; d < DK; d++) gk[d] = 0.0f;
  for (int c = 0; c < DV; c++) gv[c] = 0.0f;
  if (j < sq.keys) {
    for (int d = 0; d < DK; d++) kr[d] = ca_load(k, ca_at(k_off, k_st, b, hk, kj, d));
    for (int c = 0; c < DV; c++) vr[c] = ca_load(v, ca_at(v_off, v_st, b, hk, kj, c));
    /* rows whose window holds j: p_i - window_left <= j <= p_i + window_right */
    const long shift = (long)sq.align_n - (long)sq.align_m;
    long i_lo = window_right >= 0 ? (long)j - window_right - shift : 0;
    long i_hi = window_left >= 0 ? (long)j + window_left - shift : (long)sq.rows - 1;
    i_lo = max(i_lo, 0L);
    i_hi = min(i_hi, (long)sq.rows - 1);
    for (int h = hk * group; h < (hk + 1) * group; h++)
      for (long i = i_lo; i <= i_hi; i++) {
        if (!bwd_allowed(b, h, i, j, sq, window_left, window_right, mask, mask_off, mask_st, has_mask)) continue;
        const float l = lse[ca_at(lse_off, lse_st, b, h, i, 0)];
        if (l == -INFINITY) continue;
        float qr[DK], dor[DV];
        for (int d = 0; d < DK; d++) qr[d] = ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d));
        float dshape;
        const float s = bwd_score(qr, kr, add_w, additive, scale,
                                  has_bias ? bias[ca_at(bias_off, bias_st, b, h, i, j)] : 0.0f, h, i, j, sq,
                                  CA_SHAPE_PASS, &dshape);
        const float p = bwd_weight(s, l);
        if (p == 0.0f) continue;
        float dp = 0.0f;
        for (int c = 0; c < DV; c++) {
          dor[c] = ca_load(d_o, ca_at(do_off, do_st, b, h, sq.q0 + i, c));
          dp = fma(dor[c], vr[c], dp);
          gv[c] = fma(p, dor[c], gv[c]);
        }
        const float g = p * (dp - dsum[bwd_row(b, h, i, q_heads, q_len)]) * dshape;
        if (additive)
          for (int d = 0; d < DK; d++) {
            const float t = tanh(qr[d] + kr[d]);
            gk[d] = fma(g * add_w[d], 1.0f - t * t, gk[d]);
          }
        else
          for (int d = 0; d < DK; d++) gk[d] = fma(g, qr[d], gk[d]);
      }
  }
  for (int d = 0; d < DK; d++) ca_store(d_k, ca_at(dk_off, dk_st, b, hk, kj, d), gk[d]);
  for (int c = 0; c < DV; c++) ca_store(d_v, ca_at(dv_off, dv_st, b, hk, kj, c), gv[c]);
}

/*
 * bwd_dq — one work-item per query row (b, h, i): walks the row's keys in
 * order and writes dQ_i; with additive scoring and want_dw, the row's term
 * of d_additive_w, sum_j g_ij tanh(q_i + k_j), to dw_rows [B * Hq * q_len][DK].
 * An empty row gets dQ = 0. Rows past a packed sequence's end are left to
 * bwd_zero. NDRange: (q_len, batch * q_heads).
 */
__kernel void bwd_dq(BWD_ARGS, __global store_t *d_q, ulong dq_off, ulong4 dq_st, __global float *dw_rows,
                     int want_dw) {
  (void)o; (void)o_off; (void)o_st; (void)sinkt;
  const int i = get_global_id(0), bh = get_global_id(1);
  if (i >= q_len) return;
  const int b = bh / q_heads, h = bh % q_heads, hk = h / group;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const ulong row = bwd_row(b, h, i, q_heads, q_len);
  float gq[DK], gw[DK];
  for (int d = 0; d < DK; d++) gq[d] = gw[d] = 0.0f;
  if (i < sq.rows) {
    const float l = lse[ca_at(lse_off, lse_st, b, h, i, 0)];
    const float drow = dsum[row];
    float qr[DK], dor[DV];
    for (int d = 0; d < DK; d++) qr[d] = ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d));
    for (int c = 0; c < DV; c++) dor[c] = ca_load(d_o, ca_at(do_off, do_st, b, h, sq.q0 + i, c));
    /* the keys i's window holds, as the forward's flash_row_keys */
    const long pos = (long)i + (long)sq.align_n - (long)sq.align_m;
    long j_lo = window_left >= 0 ? pos - window_left : 0;
    long j_hi = window_right >= 0 ? pos + window_right : (long)sq.keys - 1;
    j_lo = max(j_lo, 0L);
    j_hi = min(j_hi, (long)sq.keys - 1);
    if (l == -INFINITY) j_hi = -1; /* empty row */
    for (long j = j_lo; j <= j_hi; j++) {
      if (!bwd_allowed(b, h, i, j, sq, window_left, window_right, mask, mask_off, mask_st, has_mask)) continue;
      const long kj = sq.k0 + j;
      float kr[DK];
      for (int d = 0; d < DK; d++) kr[d] = ca_load(k, ca_at(k_off, k_st, b, hk, kj, d));
      float dshape;
      const float s = bwd_score(qr, kr, add_w, additive, scale,
                                has_bias ? bias[ca_at(bias_off, bias_st, b, h, i, j)] : 0.0f, h, i, j, sq,
                                CA_SHAPE_PASS, &dshape);
      const float p = bwd_weight(s, l);
      if (p == 0.0f) continue;
      float dp = 0.0f;
      for (int c = 0; c < DV; c++) dp = fma(dor[c], ca_load(v, ca_at(v_off, v_st, b, hk, kj, c)), dp);
      const float g = p * (dp - drow) * dshape;
      if (additive)
        for (int d = 0; d < DK; d++) {
          const float t = tanh(qr[d] + kr[d]);
          gq[d] = fma(g * add_w[d], 1.0f - t * t, gq[d]);
          gw[d] = fma(g, t, gw[d]);
        }
      else
        for (int d = 0; d < DK; d++) gq[d] = fma(g, kr[d], gq[d]);
    }
    for (int d = 0; d < DK; d++) ca_store(d_q, ca_at(dq_off, dq_st, b, h, sq.q0 + i, d), gq[d]);
  }
  if (want_dw)
    for (int d = 0; d < DK; d++) dw_rows[row * DK + d] = gw[d];
}

/*
 * bwd_sum — out[c] = sum_{a < n_outer} sum_{r < n_inner} x[a * s_outer + c * s_col + r * s_inner],
 * in that order: the fixed-order reductions of d_sinks (per head over
 * batch and rows) and d_additive_w (per column over rows). NDRange: (n_cols).
 */
__kernel void bwd_sum(__global const float *x, int n_cols, ulong n_outer, ulong n_inner, ulong s_outer, ulong s_col,
                      ulong s_inner, __global float *out) {
  const int c = get_global_id(0);
  if (c >= n_cols) return;
  float acc = 0.0f;
  for (ulong a = 0; a < n_outer; a++)
    for (ulong r = 0; r < n_inner; r++) acc += x[(ulong)a * s_outer + (ulong)c * s_col + (ulong)r * s_inner];
  out[c] = acc;
}

/*
 * bwd_zero — zeroes a gradient view [1, heads, rows, cols] (packed
 * sequences: rows no sequence covers still get a defined 0).
 * NDRange: (rows, heads).
 */
__kernel void bwd_zero(__global store_t *x, ulong x_off, ulong4 x_st, int rows, int cols) {
  const int r = get_global_id(0), h = get_global_id(1);
  if (r >= rows) return;
  for (int c = 0; c < cols; c++) ca_store(x, ca_at(x_off, x_st, 0, h, r, c), 0.0f);
}
