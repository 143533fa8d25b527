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
 *
 * Each kernel is a tiled product like qk_score and mix_values: a work-group
 * of BS_TN x BS_TM items stages blocks of its two operands in local memory
 * per step over the summed dimension (src/backward_staged.c sizes the
 * NDRanges by the same tiles). Tiles and steps no allowed pair's window
 * reaches are skipped (causal shapes do about half the work).
 */
#define BS_TM 8    /* rows (bwds_pairs, bwds_dq) or keys (bwds_dkdv) per tile */
#define BS_TN 16   /* keys (bwds_pairs) or columns (bwds_dq, bwds_dkdv) per tile */
#define BS_TK 16   /* summed elements per step */

/* Where pair (g, r, j) of a chunk lies in the P / G scratch. */
static inline ulong bwds_at(int g, int rows, int r, int kv_len, long j) {
  return ((ulong)g * (ulong)rows + (ulong)r) * (ulong)kv_len + (ulong)j;
}

/*
 * bwds_pairs — P and G of every pair of the chunk: <q_i, k_j> (or the
 * additive sum) and <dO_i, v_j> by tiles, then the pair's shaping, weight
 * and score gradient. NDRange: (kv_len rounded up to BS_TN, rows rounded up
 * to BS_TM, heads); work-group (BS_TN, BS_TM, 1).
 */
__kernel __attribute__((reqd_work_group_size(BS_TN, BS_TM, 1)))
void bwds_pairs(CA_PARAMS(bwds_pairs, args)) {
  CA_UNPACK(bwds_pairs, args)
  CA_MOD_CAPTURES
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)sinks_at; (void)sinks;
  __local float a_tile[BS_TM][BS_TK];
  __local float b_tile[BS_TK][BS_TN];
  __local float w_tile[BS_TK];
  const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * BS_TN + lx;
  const long j = get_global_id(0);
  const int r = get_global_id(1), g = get_global_id(2);
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, hk = h / group, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int row0 = i0 + get_group_id(1) * BS_TM, row_end = min(i0 + rows, sq.rows);
  const long key0 = (long)get_group_id(0) * BS_TN;
  float raw = 0.0f, dp = 0.0f;
  /* a tile no allowed pair's window reaches skips its products (the same
   * for the whole work-group, so its barriers are too) */
  const long shift = (long)sq.align_n - (long)sq.align_m, last_row = min(row0 + BS_TM, row_end) - 1;
  bool tile_live = row0 < row_end && key0 < sq.keys;
  if (window_right >= 0) tile_live = tile_live && key0 <= last_row + shift + window_right;
  if (window_left >= 0) tile_live = tile_live && key0 + BS_TN - 1 >= (long)row0 + shift - window_left;
  for (int d0 = 0; tile_live && d0 < DK; d0 += BS_TK) {
    for (int t = lid; t < BS_TM * BS_TK; t += BS_TM * BS_TN) {
      const int qi = row0 + t / BS_TK, d = d0 + t % BS_TK;
      a_tile[t / BS_TK][t % BS_TK] = qi < row_end && d < DK ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + qi, d)) : 0.0f;
    }
    for (int t = lid; t < BS_TK * BS_TN; t += BS_TM * BS_TN) {
      const long kj = key0 + t % BS_TN;
      const int d = d0 + t / BS_TN;
      b_tile[t / BS_TN][t % BS_TN] = kj < sq.keys && d < DK ? ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + kj, d)) : 0.0f;
    }
    if (additive && lid < BS_TK) w_tile[lid] = d0 + lid < DK ? add_w[d0 + lid] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (additive)
      for (int dd = 0; dd < BS_TK; dd++) raw = fma(w_tile[dd], tanh(a_tile[ly][dd] + b_tile[dd][lx]), raw);
    else
      for (int dd = 0; dd < BS_TK; dd++) raw = fma(a_tile[ly][dd], b_tile[dd][lx], raw);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int c0 = 0; tile_live && c0 < DV; c0 += BS_TK) {
    for (int t = lid; t < BS_TM * BS_TK; t += BS_TM * BS_TN) {
      const int qi = row0 + t / BS_TK, c = c0 + t % BS_TK;
      a_tile[t / BS_TK][t % BS_TK] =
          qi < row_end && c < DV ? ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, sq.q0 + qi, c)) : 0.0f;
    }
    for (int t = lid; t < BS_TK * BS_TN; t += BS_TM * BS_TN) {
      const long kj = key0 + t % BS_TN;
      const int c = c0 + t / BS_TN;
      b_tile[t / BS_TN][t % BS_TN] = kj < sq.keys && c < DV ? ca_load(v, ca_at(v_off, v_st, b, hk, sq.k0 + kj, c)) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int cc = 0; cc < BS_TK; cc++) dp = fma(a_tile[ly][cc], b_tile[cc][lx], dp);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (r >= rows || j >= kv_len) return;
  float pv = 0.0f, gv = 0.0f;
  bool allowed = i < sq.rows && j < sq.keys && ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right);
  if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
  if (allowed) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
  const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
  allowed = allowed && bias_ij != -INFINITY;
  const float row_lse = allowed ? lse[ca_at(lse_off, lse_st, b, h, i, 0)] : -INFINITY;
  if (row_lse != -INFINITY) {
    float x = raw * scale, dshape = scale;
    if (softcap > 0.0f) {
      const float t = tanh(x / softcap);
      dshape = scale * (1.0f - t * t);
      x = softcap * t;
    }
#ifdef CA_MOD_SCORE
    dshape *= clattn_score_mod_grad(x, b, h, CA_Q_IDX(i, sq), j, ca_cap);
    x = clattn_score_mod(x, b, h, CA_Q_IDX(i, sq), j, ca_cap);
#endif
    x += bias_ij;
    if (has_alibi) x += ca_alibi(i, j, sq.align_m, sq.align_n, ca_alibi_slope(alibi, alibi_bstride, b, h));
    const float p = exp(x - row_lse);
    if (p != 0.0f) {   /* a NaN weight (a NaN in an allowed key) goes on, as in the forward */
#ifdef CA_DROPOUT /* the weight that mixed V */
      const float z = ca_dropout(dropout, b, h, i, j);
#else
      const float z = 1.0f;
#endif
      pv = p * z;
      gv = p * (z * dp - dsum[bwd_row(b, h, i, q_heads, q_len)]) * dshape;
    }
  }
  pw[bwds_at(g, rows, r, kv_len, j)] = pv;
  gw[bwds_at(g, rows, r, kv_len, j)] = gv;
}

/*
 * bwds_dq — dQ of the chunk's rows, G K by tiles over the keys (additive:
 * G_ij w_d (1 - tanh^2(q_id + k_jd))); with additive scoring and want_dw,
 * the row's term of d_additive_w, sum_j G_ij tanh(q_id + k_jd), to
 * dw_rows [B * Hq * q_len][DK] (0 for rows past a sequence). A zero G adds
 * nothing, whatever its key holds. Rows past a packed sequence's end are
 * left to bwd_zero. NDRange: (DK rounded up to BS_TN, rows rounded up to
 * BS_TM, heads); work-group (BS_TN, BS_TM, 1).
 */
__kernel __attribute__((reqd_work_group_size(BS_TN, BS_TM, 1)))
void bwds_dq(CA_PARAMS(bwds_dq, args)) {
  CA_UNPACK(bwds_dq, args)
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)sinks_at; (void)sinks; (void)v; (void)v_off; (void)v_st;
  (void)d_o; (void)d_o_off; (void)d_o_st; (void)lse; (void)lse_off; (void)lse_st; (void)mask; (void)mask_off;
  (void)mask_st; (void)has_mask; (void)bias; (void)bias_off; (void)bias_st; (void)has_bias; (void)bias_scale;
  (void)dsum; (void)scale;
  (void)softcap; (void)alibi; (void)has_alibi; (void)alibi_bstride; (void)window_left; (void)window_right;
  __local float a_tile[BS_TM][BS_TK];
  __local float k_tile[BS_TK][BS_TN];
  const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * BS_TN + lx;
  const int d = get_global_id(0), r = get_global_id(1), g = get_global_id(2);
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, hk = h / group, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int r0 = get_group_id(1) * BS_TM, d0 = get_group_id(0) * BS_TN;
  const bool live = r < rows && i < sq.rows && d < DK;
  const float qd = additive && live ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
  const float wd = additive && d < DK ? add_w[d] : 0.0f;
  float acc = 0.0f, acc_w = 0.0f;
  /* the keys the tile's rows' windows reach (G is 0 elsewhere) */
  const long shift = (long)sq.align_n - (long)sq.align_m, first_row = (long)i0 + r0;
  const long last_row = min((long)i0 + min(r0 + BS_TM, rows), (long)sq.rows) - 1;
  long j_lo = window_left >= 0 ? first_row + shift - window_left : 0;
  long j_hi = window_right >= 0 ? last_row + shift + window_right : (long)sq.keys - 1;
  j_lo = max(j_lo, 0L);
  j_hi = first_row <= last_row ? min(j_hi, (long)sq.keys - 1) : -1;
  for (long j0 = j_lo; j0 <= j_hi; j0 += BS_TK) {   /* 64 bits: j0 + BS_TK may pass INT_MAX */
    for (int t = lid; t < BS_TM * BS_TK; t += BS_TM * BS_TN) {
      const int ar = r0 + t / BS_TK;
      const long j = j0 + t % BS_TK;
      a_tile[t / BS_TK][t % BS_TK] = ar < rows && j < sq.keys ? gw[bwds_at(g, rows, ar, kv_len, j)] : 0.0f;
    }
    for (int t = lid; t < BS_TK * BS_TN; t += BS_TM * BS_TN) {
      const long j = j0 + t / BS_TN;
      const int dd = d0 + t % BS_TN;
      k_tile[t / BS_TN][t % BS_TN] = j < sq.keys && dd < DK ? ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, dd)) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int jj = 0; jj < BS_TK; jj++) {
      const float a = a_tile[ly][jj];
      if (a == 0.0f) continue;
      if (additive) {
        const float t = tanh(qd + k_tile[jj][lx]);
        acc = fma(a * wd, 1.0f - t * t, acc);
        acc_w = fma(a, t, acc_w);
      } else {
        acc = fma(a, k_tile[jj][lx], acc);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (live) ca_store(d_q, ca_at(d_q_off, d_q_st, b, h, sq.q0 + i, d), acc);
  if (want_dw && r < rows && d < DK) dw_rows[bwd_row(b, h, i, q_heads, q_len) * DK + d] = live ? acc_w : 0.0f;
}

/*
 * bwds_dkdv — adds the chunk's share to dK and dV of KV pair bh0 / group +
 * gid(2): dK_j += sum_i G_ij q_i (additive: G_ij w_d (1 - tanh^2(q_id +
 * k_jd))), dV_j += sum_i P_ij dO_i, over the group's heads the chunk holds
 * in head order, then its rows in order, by tiles of BS_TK rows. The first
 * ceil(DK / BS_TN) column tiles are dK's, the rest dV's. A zero weight adds
 * nothing. acc [B * Hkv][kv_len][DK + DV] starts at 0 (bwd_fill).
 * NDRange: (BS_TN (ceil(DK / BS_TN) + ceil(DV / BS_TN)), kv_len rounded up
 * to BS_TM, KV pairs the chunk touches); work-group (BS_TN, BS_TM, 1).
 */
__kernel __attribute__((reqd_work_group_size(BS_TN, BS_TM, 1)))
void bwds_dkdv(CA_PARAMS(bwds_dkdv, args)) {
  CA_UNPACK(bwds_dkdv, args)
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)sinks_at; (void)sinks; (void)v; (void)v_off; (void)v_st;
  (void)lse; (void)lse_off; (void)lse_st; (void)mask; (void)mask_off; (void)mask_st; (void)has_mask; (void)bias;
  (void)bias_off; (void)bias_st; (void)has_bias; (void)bias_scale; (void)dsum; (void)scale; (void)softcap; (void)alibi; (void)has_alibi;
  (void)alibi_bstride;
  (void)window_left; (void)window_right;
  __local float a_tile[BS_TM][BS_TK];
  __local float x_tile[BS_TK][BS_TN];
  const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * BS_TN + lx;
  const int k_tiles = (DK + BS_TN - 1) / BS_TN, tile = get_group_id(0);
  const bool is_v = tile >= k_tiles;   /* the same for the whole work-group */
  const int width = is_v ? DV : DK, c0 = (is_v ? tile - k_tiles : tile) * BS_TN, c = c0 + lx;
  const long j = get_global_id(1), key0 = (long)get_group_id(1) * BS_TM;
  const int bhk = bh0 / group + get_global_id(2), b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  __global const float *weights = is_v ? pw : gw;
  const bool live = j < sq.keys && c < width;
  const ulong at = ((ulong)bhk * (ulong)kv_len + (ulong)j) * (ulong)(DK + DV) + (ulong)(is_v ? DK : 0) + (ulong)c;
  const float kd = additive && !is_v && live ? ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, c)) : 0.0f;
  const float wd = additive && !is_v && c < DK ? add_w[c] : 0.0f;
  float sum = live ? acc[at] : 0.0f;
  const int n_rows = min(rows, sq.rows - i0);   /* may be <= 0: the chunk is past the sequence */
  /* the chunk's rows whose windows reach the tile's keys (P and G are 0 elsewhere) */
  const long shift = (long)sq.align_n - (long)sq.align_m, key_last = min(key0 + BS_TM, (long)sq.keys) - 1;
  long r_lo = window_right >= 0 ? key0 - shift - window_right - i0 : 0;
  long r_hi = window_left >= 0 ? key_last - shift + window_left - i0 : (long)n_rows - 1;
  r_lo = max(r_lo, 0L);
  r_hi = key0 <= key_last ? min(r_hi, (long)n_rows - 1) : -1;
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    const int g = b * q_heads + h - bh0;
    if (g < 0 || g >= heads) continue;
    for (long r0 = r_lo; r0 <= r_hi; r0 += BS_TK) {
      for (int t = lid; t < BS_TM * BS_TK; t += BS_TM * BS_TN) {
        const long kj = key0 + t / BS_TK;
        const int rr = (int)r0 + t % BS_TK;
        a_tile[t / BS_TK][t % BS_TK] = kj < sq.keys && rr <= r_hi ? weights[bwds_at(g, rows, rr, kv_len, kj)] : 0.0f;
      }
      for (int t = lid; t < BS_TK * BS_TN; t += BS_TM * BS_TN) {
        const int rr = (int)r0 + t / BS_TN, cc = c0 + t % BS_TN;
        const long qi = sq.q0 + i0 + rr;
        float x = 0.0f;
        if (rr <= r_hi && cc < width)
          x = is_v ? ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, qi, cc)) : ca_load(q, ca_at(q_off, q_st, b, h, qi, cc));
        x_tile[t / BS_TN][t % BS_TN] = x;
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int rr = 0; rr < BS_TK; rr++) {
        const float a = a_tile[ly][rr];
        if (a == 0.0f) continue;
        if (additive && !is_v) {
          const float t = tanh(x_tile[rr][lx] + kd);
          sum = fma(a * wd, 1.0f - t * t, sum);
        } else {
          sum = fma(a, x_tile[rr][lx], sum);
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  }
  if (live) acc[at] = sum;
}
