/*
 * backward_staged — the staged backward (src/backward_staged.c): the
 * gradients with P and dS materialised per chunk of query rows, a second
 * path beside the fused kernels of backward.cl (and a cross-check of them).
 * Built in the backward program, after backward.cl (BWD_ARGS, bwd_row).
 *
 * Per chunk ([heads] (batch, head) pairs from bh0, rows i0 .. i0 + rows - 1):
 *   bwds_pairs   P_ij = exp(s_ij - lse_i) and G_ij = P_ij (dP_ij - D_i) dshape_ij
 *                with dP_ij = <dO_i, v_j>, into scratch [heads][rows][kv_len]
 *   bwds_dq      dQ_i = sum_j G_ij dscore/dq_i      (the rows are whole in a chunk)
 *   bwds_dkdv    dK_j += sum_i G_ij dscore/dk_j, dV_j += sum_i P_ij dO_i
 *                into f32 accumulators [B * Hkv][kv_len][DK + DV]
 * and bwd_store writes the accumulators to d_k and d_v at the end.
 * A pair that is not allowed (kv_lens, window, mask), has lse -inf or a
 * weight that is 0 gets P = G = 0, and the sums skip zeros, so NaN/Inf in
 * a disallowed key or value never reaches a gradient. Every element is
 * summed by one work-item in a fixed order (group heads and rows in chunk
 * order): bitwise repeatable.
 */

/* Where pair (g, r, j) of a chunk lies in the P / G scratch. */
static inline ulong bwds_at(int g, int rows, int r, int kv_len, long j) {
  return ((ulong)g * (ulong)rows + (ulong)r) * (ulong)kv_len + (ulong)j;
}

/*
 * bwds_pairs — P and G of every pair of the chunk. NDRange: (kv_len, rows, heads).
 */
__kernel void bwds_pairs(BWD_ARGS, int bh0, int i0, int rows, __global float *pw, __global float *gw) {
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)has_sinks; (void)sinks;
  const long j = get_global_id(0);
  const int r = get_global_id(1), g = get_global_id(2);
  if (j >= kv_len || r >= rows) return;
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, hk = h / group, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  float pv = 0.0f, gv = 0.0f;
  bool allowed = i < sq.rows && j < sq.keys && ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right);
  if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
  const float row_lse = allowed ? lse[ca_at(lse_off, lse_st, b, h, i, 0)] : -INFINITY;
  if (row_lse != -INFINITY) {
    const long qi = sq.q0 + i, kj = sq.k0 + j;
    float raw = 0.0f;
    for (int d = 0; d < DK; d++) {
      const float qd = ca_load(q, ca_at(q_off, q_st, b, h, qi, d)), kd = ca_load(k, ca_at(k_off, k_st, b, hk, kj, d));
      raw = additive ? fma(add_w[d], tanh(qd + kd), raw) : fma(qd, kd, raw);
    }
    float x = raw * scale, dshape = scale;
    if (softcap > 0.0f) {
      const float t = tanh(x / softcap);
      dshape = scale * (1.0f - t * t);
      x = softcap * t;
    }
    if (has_bias) x += bias[ca_at(bias_off, bias_st, b, h, i, j)];
    if (has_alibi) x += ca_alibi(i, j, sq.align_m, sq.align_n, alibi[h]);
    const float p = exp(x - row_lse);
    if (p != 0.0f) {   /* a NaN weight (a NaN in an allowed key) goes on, as in the forward */
      float dp = 0.0f;
      for (int c = 0; c < DV; c++)
        dp = fma(ca_load(d_o, ca_at(do_off, do_st, b, h, qi, c)), ca_load(v, ca_at(v_off, v_st, b, hk, kj, c)), dp);
      pv = p;
      gv = p * (dp - dsum[bwd_row(b, h, i, q_heads, q_len)]) * dshape;
    }
  }
  pw[bwds_at(g, rows, r, kv_len, j)] = pv;
  gw[bwds_at(g, rows, r, kv_len, j)] = gv;
}

/*
 * bwds_dq — dQ of the chunk's rows, column d per work-item, summed over the
 * keys in order; with additive scoring and want_dw, the row's term of
 * d_additive_w, sum_j G_ij tanh(q_i + k_j), to dw_rows [B * Hq * q_len][DK]
 * (0 for rows past a sequence). Rows past a packed sequence's end are left
 * to bwd_zero. NDRange: (DK, rows, heads).
 */
__kernel void bwds_dq(BWD_ARGS, int bh0, int i0, int rows, __global const float *gw, __global store_t *d_q,
                      ulong dq_off, ulong4 dq_st, __global float *dw_rows, int want_dw) {
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)has_sinks; (void)sinks; (void)v; (void)v_off; (void)v_st;
  (void)d_o; (void)do_off; (void)do_st; (void)lse; (void)lse_off; (void)lse_st; (void)mask; (void)mask_off;
  (void)mask_st; (void)has_mask; (void)bias; (void)bias_off; (void)bias_st; (void)has_bias; (void)dsum;
  const int d = get_global_id(0), r = get_global_id(1), g = get_global_id(2);
  if (d >= DK || r >= rows) return;
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, hk = h / group, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  float acc = 0.0f, acc_w = 0.0f;
  if (i < sq.rows) {
    const float qd = additive ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
    for (long j = 0; j < sq.keys; j++) {
      const float gij = gw[bwds_at(g, rows, r, kv_len, j)];
      if (gij == 0.0f) continue;
      const float kd = ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, d));
      if (additive) {
        const float t = tanh(qd + kd);
        acc = fma(gij * add_w[d], 1.0f - t * t, acc);
        acc_w = fma(gij, t, acc_w);
      } else {
        acc = fma(gij, kd, acc);
      }
    }
    ca_store(d_q, ca_at(dq_off, dq_st, b, h, sq.q0 + i, d), acc);
  }
  if (want_dw) dw_rows[bwd_row(b, h, i, q_heads, q_len) * DK + d] = acc_w;
}

/*
 * bwds_dkdv — adds the chunk's share to dK and dV of key j of KV pair
 * kv0 + gid(1): over the group's heads the chunk holds, in head order, then
 * its rows in order. acc [B * Hkv][kv_len][DK + DV] starts at 0 (bwd_fill).
 * NDRange: (kv_len, KV pairs the chunk touches).
 */
__kernel void bwds_dkdv(BWD_ARGS, int bh0, int i0, int rows, int heads, __global const float *pw,
                        __global const float *gw, __global float *acc) {
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)has_sinks; (void)sinks; (void)v; (void)v_off; (void)v_st;
  (void)lse; (void)lse_off; (void)lse_st; (void)mask; (void)mask_off; (void)mask_st; (void)has_mask; (void)bias;
  (void)bias_off; (void)bias_st; (void)has_bias; (void)dsum; (void)scale; (void)softcap; (void)alibi; (void)has_alibi;
  (void)window_left; (void)window_right;
  const long j = get_global_id(0);
  const int bhk = bh0 / group + get_global_id(1);
  if (j >= kv_len) return;
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  if (j >= sq.keys) return;
  const ulong at = ((ulong)bhk * (ulong)kv_len + (ulong)j) * (ulong)(DK + DV);
  float gk[DK], gv[DV], ka[DK];
  for (int d = 0; d < DK; d++) {
    gk[d] = acc[at + d];
    ka[d] = additive ? ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, d)) : 0.0f;
  }
  for (int c = 0; c < DV; c++) gv[c] = acc[at + DK + c];
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    const int g = b * q_heads + h - bh0;
    if (g < 0 || g >= heads) continue;
    for (int r = 0; r < rows && i0 + r < sq.rows; r++) {
      const long qi = sq.q0 + i0 + r;
      const float pij = pw[bwds_at(g, rows, r, kv_len, j)], gij = gw[bwds_at(g, rows, r, kv_len, j)];
      if (pij != 0.0f)
        for (int c = 0; c < DV; c++) gv[c] = fma(pij, ca_load(d_o, ca_at(do_off, do_st, b, h, qi, c)), gv[c]);
      if (gij != 0.0f)
        for (int d = 0; d < DK; d++) {
          const float qd = ca_load(q, ca_at(q_off, q_st, b, h, qi, d));
          if (additive) {
            const float t = tanh(qd + ka[d]);
            gk[d] = fma(gij * add_w[d], 1.0f - t * t, gk[d]);
          } else {
            gk[d] = fma(gij, qd, gk[d]);
          }
        }
    }
  }
  for (int d = 0; d < DK; d++) acc[at + d] = gk[d];
  for (int c = 0; c < DV; c++) acc[at + DK + c] = gv[c];
}
