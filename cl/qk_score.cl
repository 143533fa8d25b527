/*
 * qk_score — the staged path's first stage: scaled, biased, masked scores
 * for a chunk of query rows.
 *
 *   scores[g][r][j] = shaped(scale * <q_i, k_j>)   if key j is allowed for row i
 * (shaped: softcap, bias, ALiBi; common.h.cl's ca_shape)
 *                   = -INFINITY                       otherwise
 * with i = i0 + r and (b, h) = divmod(bh0 + g, q_heads). Disallowed keys are
 * replaced whatever they hold, so NaN or Inf there never reaches a score.
 * K is located (paged) and dequantised (Q8_0, INT8) on load; a key whose
 * page is outside the pool is disallowed.
 *
 * NDRange: (keys rounded up to SCORE_TN, rows rounded up to SCORE_TM, heads in
 * the chunk); work-group (SCORE_TN, SCORE_TM, 1). The group stages a
 * SCORE_TM x SCORE_TK block of Q and a SCORE_TK x SCORE_TN block of K in
 * local memory per step over the head dimension.
 *
 * -D SCORE_TM, SCORE_TN, SCORE_TK: tile sizes (defaults below).
 */
#ifndef SCORE_TM
#define SCORE_TM 8
#endif
#ifndef SCORE_TN
#define SCORE_TN 16
#endif
#ifndef SCORE_TK
#define SCORE_TK 16
#endif

__kernel __attribute__((reqd_work_group_size(SCORE_TN, SCORE_TM, 1)))
void qk_score(CA_PARAMS(qk_score, args)) {
  CA_UNPACK(qk_score, args)
  CA_MOD_CAPTURES
  __local float q_tile[SCORE_TM][SCORE_TK];
  __local float k_tile[SCORE_TK][SCORE_TN];
  __local float w_tile[SCORE_TK];

  const int lx = get_local_id(0), ly = get_local_id(1);
  const long j = get_global_id(0);
  const int r = get_global_id(1);
  const int g = get_global_id(2);
  const int bh = bh0 + g;
  const int b = bh / q_heads, h = bh % q_heads, hk = h / group;
  const int row0 = i0 + get_group_id(1) * SCORE_TM; /* first query row of this tile */
  const int key0 = get_group_id(0) * SCORE_TN;      /* first key of this tile */
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int row_end = min(i0 + rows, sq.rows);
  const int lid = ly * SCORE_TN + lx;

  float acc = 0.0f;
  for (int d0 = 0; d0 < head_dim; d0 += SCORE_TK) {
    for (int t = lid; t < SCORE_TM * SCORE_TK; t += SCORE_TM * SCORE_TN) {
      int rr = t / SCORE_TK, dd = t % SCORE_TK;
      int qi = row0 + rr, d = d0 + dd;
      q_tile[rr][dd] = (qi < row_end && d < head_dim) ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + qi, d)) : 0.0f;
    }
    for (int t = lid; t < SCORE_TK * SCORE_TN; t += SCORE_TM * SCORE_TN) {
      int jj = t % SCORE_TN, dd = t / SCORE_TN;
      int kj = key0 + jj, d = d0 + dd;
      k_tile[dd][jj] = (kj < sq.keys && d < head_dim)
                           ? ca_k_get(k, k_off, k_st, k_scale, k_scale_off, k_scale_st, b, hk, sq.k0 + kj, d, CA_PAGE_PASS)
                           : 0.0f;
    }
    if (additive && lid < SCORE_TK) w_tile[lid] = d0 + lid < head_dim ? add_w[d0 + lid] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (additive)
      for (int dd = 0; dd < SCORE_TK; dd++) acc += w_tile[dd] * tanh(q_tile[ly][dd] + k_tile[dd][lx]);
    else
      for (int dd = 0; dd < SCORE_TK; dd++) acc += q_tile[ly][dd] * k_tile[dd][lx];
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  const int i = i0 + r;
  if (r < rows && i < q_len && j < kv_len) {
    bool allowed = i < sq.rows && j < sq.keys && ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right);
    if (allowed && paged) allowed = ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok; /* page in the pool */
    if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
    if (allowed) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
    const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
    allowed = allowed && bias_ij != -INFINITY;
    float s = -INFINITY;
    if (allowed) s = ca_shape(scale * acc, bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS);
    scores[((ulong)g * (ulong)rows + (ulong)r) * (ulong)kv_len + (ulong)j] = s;
  }
}
