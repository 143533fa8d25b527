/*
 * gemm — the GEMM path's own kernels around CLBlast's batched SGEMMs
 * (S = Q K^T and O = A V run in CLBlast; softmax_rows is softmax.cl's).
 *
 * gemm_dense_copy: copies a [B, H, S, D] view (query or key side) into a
 *   dense row-major f32 scratch, its sequences' rows in place (ca_sequence)
 *   and rows past their length (kv_lens, packed sequences) zeroed, so
 *   padding (often uninitialised cache memory) never reaches a GEMM.
 *   NDRange: (D, S, B * H); any work-group shape.
 * gemm_k_gather, gemm_v_gather: the same for K or V stored paged, quantised
 *   or in another storage than q (k_t, v_t): located through the block table and
 *   dequantised into dense f32 [B, Hkv, N, D], keys past kv_lens and keys
 *   whose page is outside the pool zeroed.
 *   NDRange: (D, N, B * Hkv); any work-group shape.
 * gemm_finite_values: makes the GEMM's dense copy of V finite in place
 *   (a non-finite element becomes 0) and flags each such key row in
 *   `bad`: O = A V then multiplies no zero weight by a NaN or an Inf, and a
 *   disallowed key's value cannot change the GEMM's sums, whatever order
 *   the GEMM adds them in.
 *   NDRange: (key rows of the copy); any work-group shape.
 * gemm_mask_scores: turns raw dot products into scores in place:
 *   s = scale * s + bias for allowed keys, -INFINITY otherwise (whatever the
 *   dot product was: NaN from a disallowed key stays out).
 *   NDRange: (N, rows, heads in the chunk); any work-group shape.
 * gemm_store_rows: copies a chunk of O rows from scratch to the out view.
 *   A row with a nonzero weight on a flagged key (an allowed non-finite
 *   value, zeroed in the copy) or that the GEMM made non-finite is
 *   recomputed from the values as stored, as sum over nonzero a_j of
 *   a_j v_j: an allowed NaN comes out NaN, a disallowed one never counts.
 *   NDRange: (rows, heads in the chunk); any work-group shape.
 */

__kernel void gemm_dense_copy(CA_PARAMS(gemm_dense_copy, args)) {
  CA_UNPACK(gemm_dense_copy, args)
  const int len = key_side ? kv_len : q_len;
  const int c = get_global_id(0), s = get_global_id(1), bh = get_global_id(2);
  if (c >= width || s >= len) return;
  const int b = bh / heads, h = bh % heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const bool keep = s < (key_side ? sq.keys : sq.rows);
  const long row = (key_side ? sq.k0 : sq.q0) + s;
  dst[((ulong)bh * (ulong)len + (ulong)s) * (ulong)width + (ulong)c] =
      keep ? ca_load(src, ca_at(src_off, src_st, b, h, row, c)) : 0.0f;
}

/* gemm_k_gather (keys, CA_K_DTYPE) and gemm_v_gather (values, CA_V_DTYPE) */
#define GEMM_GATHER(name, dt)                                                                               \
  __kernel void name(CA_PARAMS(gemm_gather, args)) {                                                        \
    CA_UNPACK(gemm_gather, args)                                                                            \
    const int c = get_global_id(0), s = get_global_id(1), bh = get_global_id(2);                            \
    if (c >= width || s >= kv_len) return;                                                                  \
    const int b = bh / heads, h = bh % heads;                                                               \
    const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);                                           \
    dst[((ulong)bh * (ulong)kv_len + (ulong)s) * (ulong)width + (ulong)c] =                                 \
        s < sq.keys ? ca_dt_get(dt, src, src_off, src_st, scale, scale_off, scale_st, b, h, sq.k0 + s, c, CA_PAGE_PASS) \
                    : 0.0f;                                                                                 \
  }
GEMM_GATHER(gemm_k_gather, CA_K_DTYPE)
GEMM_GATHER(gemm_v_gather, CA_V_DTYPE)

__kernel void gemm_finite_values(CA_PARAMS(gemm_finite_values, args)) {
  CA_UNPACK(gemm_finite_values, args)
  const ulong r = get_global_id(0);
  if (r >= rows) return;
  __global float *row = v + r * (ulong)width;
  uchar any = 0;
  for (int c = 0; c < width; c++)
    if (!isfinite(row[c])) {
      row[c] = 0.0f;
      any = 1;
    }
  bad[r] = any;
}

__kernel void gemm_mask_scores(CA_PARAMS(gemm_mask_scores, args)) {
  CA_UNPACK(gemm_mask_scores, args)
  CA_MOD_CAPTURES
  const int j = get_global_id(0), r = get_global_id(1), g = get_global_id(2);
  if (j >= kv_len || r >= rows) return;
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  bool allowed = i < sq.rows && j < sq.keys && ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right);
  if (allowed && paged) allowed = ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok; /* page in the pool */
  if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
  if (allowed) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
  const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
  allowed = allowed && bias_ij != -INFINITY;
  const ulong at = ((ulong)g * (ulong)rows + (ulong)r) * (ulong)kv_len + (ulong)j;
  float s = -INFINITY;
  if (allowed) s = ca_shape(scale * scores[at], bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS);
  scores[at] = s;
}

__kernel void gemm_store_rows(CA_PARAMS(gemm_store_rows, args)) {
  CA_UNPACK(gemm_store_rows, args)
  const int r = get_global_id(0), g = get_global_id(1);
  if (r >= rows) return;
  const int bh = bh0 + g, b = bh / q_heads, h = bh % q_heads, hk = h / group, i = i0 + r;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  if (i >= sq.rows) return;   /* past a packed sequence's end: no such row */
  const long out_row = sq.q0 + i;
  const ulong row = (ulong)g * (ulong)rows + (ulong)r;
  __global const float *o = o_rows + row * (ulong)value_dim;
  __global const float *a = probs + row * (ulong)kv_len;
  __global const uchar *bad = v_bad + ((ulong)b * (ulong)(q_heads / group) + (ulong)hk) * (ulong)kv_len;
  bool exact = true; /* the GEMM's row is the row */
  for (int j = 0; j < sq.keys; j++) exact = exact && !(bad[j] && a[j] != 0.0f);
  for (int c = 0; c < value_dim; c++) exact = exact && isfinite(o[c]);
  if (exact) {
    for (int c = 0; c < value_dim; c++) ca_store(out, ca_at(out_off, out_st, b, h, out_row, c), o[c]);
    return;
  }
  for (int c = 0; c < value_dim; c++) {
    float acc = 0.0f;
    for (int j = 0; j < sq.keys; j++)
      if (a[j] != 0.0f)
        acc += a[j] * ca_v_get(v, v_off, v_st, v_scale, v_scale_off, v_scale_st, b, hk, sq.k0 + j, c, CA_PAGE_PASS);
    ca_store(out, ca_at(out_off, out_st, b, h, out_row, c), acc);
  }
}
