/*
 * flash_decode — the fused kernel for GPUs at decode shapes: at most
 * DEC_ROWS (16) query rows per KV head (one token, or a few for speculative
 * decoding, times the GQA group). flash_tiled and flash_block would keep one
 * row per work-item there and leave most of the group idle; here the
 * work-items run over keys for the scores and over value columns for the
 * output, and all the rows of the KV head (every query head of the GQA group)
 * share each K/V tile read.
 *
 * One work-group of DEC_WG (64) work-items per (batch, KV head, split); rows
 * numbered as in flash.cl (t = (h - hk*group) * q_len + i). Per tile of DEC_N
 * keys:
 *   K tile -> local; work-item (key kk, row group rg) scores key kk against
 *   rows rg, rg + DEC_RG, ... (masked, shaped) into s_tile
 *   -> V tile -> local; work-item r < rows takes row r's tile maximum
 *   -> every work-item turns its scores into weights exp(s - m)
 *   -> work-item r < rows adds row r's weights to its sum in key order; every
 *   work-item rescales and accumulates P V for its float4 column groups of
 *   rows pg, pg + DEC_PV_RG, ...
 * Sums run in a fixed order, so results are bitwise repeatable. The online
 * softmax, sinks, split-KV partial states, lse and the empty-row flag are
 * flash.cl's (flash_finish through flash_store_cols).
 *
 * Split-KV: with n_splits > 1, split s covers keys [s * per, (s + 1) * per)
 * of batch row b's own valid length n (kv_lens, paged or packed lengths),
 * per = ceil(n / n_splits) rounded up to DEC_N, so short sequences share
 * their keys among all splits instead of leaving splits past their end to
 * idle; a split with no key writes lse = -inf, which the merge weighs 0. The
 * host's split_keys (a range of the kv_len bound) is not used.
 *
 * Same arguments as flash_rows; route diagnostics and additive scoring stay
 * with flash_tiled (the host chooses).
 * NDRange: (DEC_WG, batch * kv_heads, n_splits); work-group (DEC_WG, 1, 1).
 * -D DEC_N: keys per tile (16 or 32, from tl_decode_keys, which also counts
 * the local memory); -D FLASH_NO_DECODE leaves the kernel out.
 */
#ifndef FLASH_NO_DECODE
#ifndef DEC_N
#define DEC_N 32
#endif
#define DEC_WG 64
#define DEC_ROWS 16
#define DEC_RG (DEC_WG / DEC_N)         /* row groups of the score phase */
#define DEC_SR (DEC_ROWS / DEC_RG)      /* rows per work-item in the score phase */
#define DEC_DV4 (((DV) + 3) / 4)        /* value columns in float4 groups */
/* work-items per row in P V: DV4 rounded up to a power of two from 16 to 64 */
#define DEC_PVC (DEC_DV4 <= 16 ? 16 : DEC_DV4 <= 32 ? 32 : 64)
#define DEC_PV_RG (DEC_WG / DEC_PVC)    /* row groups of P V */
#define DEC_PR (DEC_ROWS / DEC_PV_RG)   /* rows per work-item in P V */
#define DEC_CV4 ((DEC_DV4 + DEC_PVC - 1) / DEC_PVC) /* float4 column groups per work-item */
#define DEC_KS ((DK) + 1)               /* K tile row stride: odd, so reads by key miss no bank */
#define DEC_VS (4 * DEC_PVC * DEC_CV4)  /* V tile row stride: every work-item's columns, zero past DV */
#define DEC_KVS (DEC_KS > DEC_VS ? DEC_KS : DEC_VS)

__kernel __attribute__((reqd_work_group_size(DEC_WG, 1, 1))) void flash_decode(FLASH_PARAMS) {
  __local float q_tile[DEC_ROWS * DK];
  __local float kv_tile[DEC_N * DEC_KVS];
  __local float s_tile[DEC_ROWS * DEC_N]; /* scores, then weights */
  __local float row_m[DEC_ROWS], row_alpha[DEC_ROWS], row_l[DEC_ROWS];
#ifdef CA_MOD_MASK
  __local int bm_flags;
#endif
  FLASH_UNPACK
  const int lid = get_local_id(0);
  const int rows = group * q_len; /* <= DEC_ROWS (the host's condition) */
  const int bhk = get_global_id(1);
  const int split = get_global_id(2), n_splits = get_global_size(2);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n_valid = sq.keys;

  /* The queries, once, and the key range of all rows (their union). */
  for (int e = lid; e < DEC_ROWS * DK; e += DEC_WG) {
    const int t = e / DK, d = e % DK, tr = min(t, rows - 1);
    const int h = hk * group + tr / q_len, i = tr % q_len;
    q_tile[e] = t < rows && i < sq.rows ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
  }
  long lo = LONG_MAX, hi = -1;
  for (int t = 0; t < rows; t++) {
    const int i = t % q_len;
    const int2 keys = flash_row_keys(i, sq.align_m, sq.align_n, n_valid, window_left, window_right);
    if (i < sq.rows && keys.x <= keys.y) {
      lo = min(lo, (long)keys.x);
      hi = max(hi, (long)keys.y);
    }
  }
  /* This split's share of the batch row's own keys (64 bits: n_valid may be INT_MAX). */
  const long per = ((long)n_valid + n_splits - 1) / n_splits;
  const long split_keys_b = (per + DEC_N - 1) / DEC_N * DEC_N;
  const long split_begin = (long)split * split_keys_b;
  const long split_end = min((long)n_valid, split_begin + split_keys_b);
  const long j_begin = max(split_begin, lo) / DEC_N * DEC_N;
  const long j_end = min(split_end, hi + 1);

  /* Score phase: key kk of the tile against rows rg + DEC_RG u. */
  const int kk = lid % DEC_N, rg = lid / DEC_N;
  /* P V phase: float4 column groups cg.. of rows pg + DEC_PV_RG u. */
  const int cg = lid % DEC_PVC * DEC_CV4, pg = lid / DEC_PVC;
  float4 acc[DEC_PR][DEC_CV4];
  for (int u = 0; u < DEC_PR; u++)
    for (int g = 0; g < DEC_CV4; g++) acc[u][g] = (float4)(0.0f);
  float m = -INFINITY, l = 0.0f; /* row lid's, for lid < rows */

  for (long j0 = j_begin; j0 < j_end; j0 += DEC_N) {
#ifdef CA_MOD_MASK /* the block mask: a tile no row may see is skipped */
    const int tile_cls = ca_bm_group_class(&bm_flags, lid < rows && lid % q_len < sq.rows, bm_class, mod, b,
                                           hk * group + min(lid, rows - 1) / q_len, min(lid, rows - 1) % q_len, j0,
                                           j0 + DEC_N - 1, sq);
    if (tile_cls == CA_BM_EMPTY) continue;
#else
    const int tile_cls = CA_BM_FULL;
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's V and weights are consumed */
    for (int e = lid; e < DEC_N * DK; e += DEC_WG) {
      const int jj = e / DK, d = e % DK;
      const long j = j0 + jj;
      kv_tile[jj * DEC_KS + d] =
          j < n_valid ? ca_k_get(k, k_off, k_st, k_scale, k_scale_off, k_scale_st, b, hk, sq.k0 + j, d, CA_PAGE_PASS) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    {
      float s[DEC_SR];
      for (int u = 0; u < DEC_SR; u++) s[u] = 0.0f;
      for (int d = 0; d < DK; d++) {
        const float kd = kv_tile[kk * DEC_KS + d];
        for (int u = 0; u < DEC_SR; u++) s[u] = fma(q_tile[(rg + DEC_RG * u) * DK + d], kd, s[u]);
      }
      const long j = j0 + kk;
      /* the key's own checks, once for all rows: split range, page in the pool */
      const bool key_ok = j >= split_begin && j < split_end && (!paged || ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok);
      for (int u = 0; u < DEC_SR; u++) {
        const int t = rg + DEC_RG * u;
        if (t >= rows) break;
        const int h = hk * group + t / q_len, i = t % q_len;
        const int2 keys = flash_row_keys(i, sq.align_m, sq.align_n, n_valid, window_left, window_right);
        bool allowed = key_ok && i < sq.rows && j >= keys.x && j <= keys.y;
        if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
        if (allowed && tile_cls != CA_BM_FULL) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
        const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
        allowed = allowed && bias_ij != -INFINITY;
        s_tile[t * DEC_N + kk] =
            allowed ? ca_shape(scale * s[u], bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS) : -INFINITY;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* scores written; the K tile is consumed */

    for (int e = lid; e < DEC_N * DEC_VS; e += DEC_WG) {
      const int jj = e / DEC_VS, c = e % DEC_VS;
      const long j = j0 + jj;
      kv_tile[jj * DEC_VS + c] =
          j < n_valid && c < DV ? ca_v_get(v, v_off, v_st, v_scale, v_scale_off, v_scale_st, b, hk, sq.k0 + j, c, CA_PAGE_PASS)
                                : 0.0f;
    }
    if (lid < rows) {
      float tile_max = -INFINITY;
      for (int jj = 0; jj < DEC_N; jj++) tile_max = fmax(tile_max, s_tile[lid * DEC_N + jj]);
      const float m_new = fmax(m, tile_max);
      const float m_safe = m_new == -INFINITY ? 0.0f : m_new; /* no -inf - -inf */
      row_alpha[lid] = exp(m - m_safe);
      row_m[lid] = m_safe;
      m = m_new;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* maxima and the V tile in place */

    for (int u = 0; u < DEC_SR; u++) {
      const int t = rg + DEC_RG * u;
      if (t >= rows) break;
      s_tile[t * DEC_N + kk] = exp(s_tile[t * DEC_N + kk] - row_m[t]);
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* weights in place */

    if (lid < rows) {
      float tile_sum = 0.0f;
      for (int jj = 0; jj < DEC_N; jj++) tile_sum += s_tile[lid * DEC_N + jj];
      l = l * row_alpha[lid] + tile_sum;
    }
#ifdef CA_DROPOUT
    /* dropout: once the sums have every weight, the weights that mix V */
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = 0; u < DEC_SR; u++) {
      const int t = rg + DEC_RG * u;
      if (t >= rows) break;
      s_tile[t * DEC_N + kk] *= ca_dropout(dropout, b, hk * group + t / q_len, t % q_len, j0 + kk);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    for (int u = 0; u < DEC_PR; u++) {
      const int t = pg + DEC_PV_RG * u;
      if (t >= rows) break;
      const float alpha = row_alpha[t];
      for (int g = 0; g < DEC_CV4; g++) acc[u][g] *= alpha;
      for (int jj = 0; jj < DEC_N; jj++) {
        const float p = s_tile[t * DEC_N + jj];
        if (p == 0.0f) continue; /* a zero weight mixes nothing in, even an Inf or NaN value */
        for (int g = 0; g < DEC_CV4; g++)
          acc[u][g] = fma((float4)(p), vload4(0, kv_tile + jj * DEC_VS + 4 * (cg + g)), acc[u][g]);
      }
    }
  }

  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < rows) {
    row_m[lid] = m;
    row_l[lid] = l;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int u = 0; u < DEC_PR; u++) {
    const int t = pg + DEC_PV_RG * u;
    if (t >= rows) break;
    const int h = hk * group + t / q_len, i = t % q_len;
    if (i < sq.rows)
      flash_store_cols(acc[u], 4 * cg, 4 * DEC_CV4, cg == 0, row_m[t], row_l[t], ca_sink(sinks, sinks_at, h), b, h,
                       i, sq.q0 + i, q_heads, kv_heads, q_len, split, n_splits, out, out_off, out_st, lse, lse_off,
                       lse_st, want_lse, part_o, part_lse, empty_flag);
  }
}
#endif /* FLASH_NO_DECODE */
