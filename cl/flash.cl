/*
 * flash — the fused path: exact attention in one pass over key/value blocks
 * with the online softmax (FlashAttention's recurrence), never forming the
 * M x N score matrix. Memory is O((M + N) d): the packed K/V copies below.
 *
 * Rows. Work is grouped per KV head: the group * q_len query rows that read
 * KV head (b, hk) are numbered t = (h - hk*group) * q_len + i, so the query
 * heads that share a KV head (GQA, MQA) share its key/value reads too.
 *
 * Per row, over the allowed keys j in blocks of FLASH_BN:
 *   m' = max(m, max_j s_j);  p_j = exp(s_j - m');  alpha = exp(m - m')
 *   l' = alpha l + sum_j p_j;  acc' = alpha acc + sum_j p_j v_j
 * and at the end O = acc / l, lse = m + log(l). A row with l = 0 had no
 * allowed key (or only -inf scores): O = 0, lse = -INFINITY, *empty_flag set.
 * Blocks wholly outside the window/causal band or past kv_lens are skipped;
 * blocks wholly inside skip the per-element masking.
 *
 * Split-KV: dimension 2 of the NDRange splits the keys into n_splits ranges of
 * split_keys each. With n_splits > 1 each range writes a partial state
 * (O_s normalised, lse_s) to part_o [n_splits][B*Hq*M][DV] and part_lse
 * [n_splits][B*Hq*M], combined by merge.cl. split_keys is a multiple of FLASH_BN.
 *
 * -D DK, DV: head dim and value dim (the program is specialised per pair).
 * -D FLASH_BM: rows per work-item (register block), FLASH_BN: keys per block.
 */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV 64
#endif
#ifndef FLASH_BM
#define FLASH_BM 4
#endif
#define FLASH_BN 16
/* Value rows are packed to a multiple of the vector width. */
#define DVP (((DV) + 15) / 16 * 16)

/*
 * flash_pack — copies K transposed and V row-major into contiguous scratch,
 * with keys past kv_lens[b] (and the padding up to n_pad) zeroed, so the main
 * kernel reads 16 consecutive keys of one dimension as one vector and never
 * multiplies a padded NaN.
 *   kt[bh][d][j] = k[b, hk, j, d]     vp[bh][j][c] = v[b, hk, j, c] (c < DV, else 0)
 * NDRange: (n_pad, batch * kv_heads); any work-group shape.
 */
__kernel void flash_pack(__global const float *k, ulong k_off, ulong4 k_st,
                         __global const float *v, ulong v_off, ulong4 v_st,
                         __global const int *kv_lens, int has_kv_lens,
                         int kv_heads, int kv_len, int n_pad,
                         __global float *kt, __global float *vp) {
  const int j = get_global_id(0);
  const int bh = get_global_id(1);
  if (j >= n_pad) return;
  const int b = bh / kv_heads, hk = bh % kv_heads;
  const bool valid = j < ca_valid_keys(kv_lens, has_kv_lens, b, kv_len);
  __global float *kt_head = kt + (ulong)bh * DK * (ulong)n_pad;
  for (int d = 0; d < DK; d++)
    kt_head[(ulong)d * (ulong)n_pad + j] = valid ? k[ca_at(k_off, k_st, b, hk, j, d)] : 0.0f;
  __global float *vp_row = vp + ((ulong)bh * (ulong)n_pad + (ulong)j) * DVP;
  for (int c = 0; c < DVP; c++) vp_row[c] = (valid && c < DV) ? v[ca_at(v_off, v_st, b, hk, j, c)] : 0.0f;
}

/* The key range [lo, hi] that row (h, i) may see: window and kv_lens. */
inline int2 flash_row_keys(long i, int q_len, int kv_len, int n_valid, int window_left, int window_right) {
  long p = i + (long)kv_len - (long)q_len;
  long lo = window_left >= 0 ? p - window_left : 0;
  long hi = window_right >= 0 ? p + window_right : (long)kv_len - 1;
  lo = max(lo, 0L);
  hi = min(hi, (long)n_valid - 1);
  return (int2)((int)min(lo, (long)INT_MAX), (int)max(hi, -1L));
}

inline float flash_hmax(float16 x) {
  float8 a = fmax(x.lo, x.hi);
  float4 b = fmax(a.lo, a.hi);
  float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}

inline float flash_hsum(float16 x) {
  float8 a = x.lo + x.hi;
  float4 b = a.lo + a.hi;
  float2 c = b.lo + b.hi;
  return c.x + c.y;
}

/*
 * flash_rows — the fused kernel for CPUs (and any device): each work-item
 * keeps FLASH_BM query rows, their running (m, l) and their DVP-wide
 * accumulators in private memory and walks the key blocks with 16-wide
 * vector arithmetic: scores as outer products over the packed K^T, values
 * as broadcast multiply-adds over the packed V rows.
 * NDRange: (ceil(group * q_len / FLASH_BM), batch * kv_heads, n_splits);
 * work-group (1, 1, 1) — each work-item is an independent task.
 */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void flash_rows(__global const float *q, ulong q_off, ulong4 q_st,
                __global const float *kt, __global const float *vp, int n_pad,
                __global const uchar *mask, ulong mask_off, ulong4 mask_st, int has_mask,
                __global const float *bias, ulong bias_off, ulong4 bias_st, int has_bias,
                __global const int *kv_lens, int has_kv_lens,
                int q_heads, int kv_heads, int group, int q_len, int kv_len,
                float scale, int window_left, int window_right, int split_keys,
                __global float *out, ulong out_off, ulong4 out_st,
                __global float *lse, ulong lse_off, ulong4 lse_st, int want_lse,
                __global float *part_o, __global float *part_lse,
                __global int *empty_flag) {
  const int rows_per_kv = group * q_len;
  const int t0 = get_global_id(0) * FLASH_BM;
  const int bhk = get_global_id(1);
  const int split = get_global_id(2), n_splits = get_global_size(2);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const int n_valid = ca_valid_keys(kv_lens, has_kv_lens, b, kv_len);
  if (t0 >= rows_per_kv) return;

  float qr[FLASH_BM][DK];
  float acc[FLASH_BM][DVP];
  float m[FLASH_BM], l[FLASH_BM];
  int hs[FLASH_BM], is[FLASH_BM];
  int lo_min = INT_MAX, lo_max = 0, hi_min = INT_MAX, hi_max = -1;
  for (int r = 0; r < FLASH_BM; r++) {
    int t = min(t0 + r, rows_per_kv - 1); /* padding rows repeat the last row, never written */
    hs[r] = hk * group + t / q_len;
    is[r] = t % q_len;
    for (int d = 0; d < DK; d++) qr[r][d] = q[ca_at(q_off, q_st, b, hs[r], is[r], d)];
    for (int c = 0; c < DVP; c++) acc[r][c] = 0.0f;
    m[r] = -INFINITY;
    l[r] = 0.0f;
    int2 keys = flash_row_keys(is[r], q_len, kv_len, n_valid, window_left, window_right);
    lo_min = min(lo_min, keys.x);
    lo_max = max(lo_max, keys.x);
    hi_min = min(hi_min, keys.y);
    hi_max = max(hi_max, keys.y);
  }

  const int split_begin = split * split_keys;
  const int split_end = min(kv_len, split_begin + split_keys);
  const int j_begin = max(split_begin, lo_min) / FLASH_BN * FLASH_BN;
  const int j_end = min(split_end, hi_max + 1);
  const ulong kt_head = (ulong)bhk * DK * (ulong)n_pad;
  const ulong vp_head = (ulong)bhk * (ulong)n_pad * DVP;

  for (int j0 = j_begin; j0 < j_end; j0 += FLASH_BN) {
    float s[FLASH_BM][FLASH_BN];
    float16 sv[FLASH_BM];
    for (int r = 0; r < FLASH_BM; r++) sv[r] = (float16)(0.0f);
    for (int d = 0; d < DK; d++) {
      float16 kd = vload16(0, kt + kt_head + (ulong)d * (ulong)n_pad + j0);
      for (int r = 0; r < FLASH_BM; r++) sv[r] = fma((float16)(qr[r][d]), kd, sv[r]);
    }
    /* Every key of the block allowed for every row, inside this split? */
    const bool full = !has_mask && j0 >= lo_max && j0 + FLASH_BN - 1 <= hi_min &&
                      j0 >= split_begin && j0 + FLASH_BN <= split_end;
    for (int r = 0; r < FLASH_BM; r++) {
      sv[r] *= scale;
      if (!full || has_bias) {
        vstore16(sv[r], 0, s[r]);
        int2 keys = flash_row_keys(is[r], q_len, kv_len, n_valid, window_left, window_right);
        for (int jj = 0; jj < FLASH_BN; jj++) {
          int j = j0 + jj;
          bool allowed = j >= keys.x && j <= keys.y && j >= split_begin && j < split_end;
          if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, hs[r], is[r], j)] != 0;
          float x = s[r][jj];
          if (allowed && has_bias) x += bias[ca_at(bias_off, bias_st, b, hs[r], is[r], j)];
          s[r][jj] = allowed ? x : -INFINITY;
        }
        sv[r] = vload16(0, s[r]);
      }
      const float m_new = fmax(m[r], flash_hmax(sv[r]));
      const float m_safe = m_new == -INFINITY ? 0.0f : m_new; /* no -inf - -inf */
      const float16 p = exp(sv[r] - m_safe);
      const float alpha = exp(m[r] - m_safe);
      l[r] = l[r] * alpha + flash_hsum(p);
      m[r] = m_new;
      vstore16(p, 0, s[r]);
      for (int c = 0; c < DVP; c += 16) vstore16(vload16(0, acc[r] + c) * alpha, 0, acc[r] + c);
    }
    for (int jj = 0; jj < FLASH_BN; jj++) {
      __global const float *vrow = vp + vp_head + (ulong)(j0 + jj) * DVP;
      for (int c = 0; c < DVP; c += 16) {
        float16 vv = vload16(0, vrow + c);
        for (int r = 0; r < FLASH_BM; r++) {
          float pj = s[r][jj];
          float16 a = vload16(0, acc[r] + c);
          /* a zero weight mixes nothing in, even a NaN value */
          a = full ? fma((float16)(pj), vv, a) : (pj != 0.0f ? fma((float16)(pj), vv, a) : a);
          vstore16(a, 0, acc[r] + c);
        }
      }
    }
  }

  for (int r = 0; r < FLASH_BM; r++) {
    if (t0 + r >= rows_per_kv) break;
    const bool empty = l[r] == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l[r];
    const float row_lse = empty ? -INFINITY : m[r] + log(l[r]);
    if (n_splits > 1) {
      const ulong rows_total = (ulong)(get_global_size(1) / kv_heads) * (ulong)q_heads * (ulong)q_len;
      const ulong part = (ulong)split * rows_total + ((ulong)b * q_heads + hs[r]) * (ulong)q_len + is[r];
      for (int c = 0; c < DV; c++) part_o[part * DV + c] = acc[r][c] * inv;
      part_lse[part] = row_lse;
    } else {
      for (int c = 0; c < DV; c++) out[ca_at(out_off, out_st, b, hs[r], is[r], c)] = acc[r][c] * inv;
      if (want_lse) lse[ca_at(lse_off, lse_st, b, hs[r], is[r], 0)] = row_lse;
      if (empty) atomic_or(empty_flag, 1);
    }
  }
}
