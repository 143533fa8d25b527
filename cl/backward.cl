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
 * chain through softcap; bias and ALiBi are constants of the score. Built
 * with -D CA_DROPOUT, each pair's factor z_ij (0 or 1 / (1 - p): the
 * forward's) scales it where it mixed V: dV_j = sum_i p_ij z_ij dO_i and
 * dS_ij = p_ij (z_ij <dO_i, v_j> - D_i), D_i from the dropped O.
 * d_sinks[h] = -sum_{b,i} exp(sink_h - lse_i) D_i and d_additive_w are
 * per-row terms summed by bwd_sum in a fixed order.
 *
 * Vectors: bwd_dkdv keeps 16 keys per work-item and bwd_dq 16 query rows,
 * one float16 lane each, so every multiply-add over the head dims is 16
 * wide and the partner (row or key) is a scalar broadcast: no packing, no
 * horizontal sums, K/V or Q/dO of the block in private memory.
 *
 * Determinism: every output element is written by exactly one work-item
 * that walks its partners in a fixed order (dK, dV of a KV head sum over
 * the group's query heads in head order), so no order that depends on
 * scheduling: results are bitwise repeatable. The one exception is asked
 * for: deterministic = 0 lets bwd_dkdv add dQ atomically (FA2's single
 * pass, dq_atomic below).
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

/* Every pass takes args.h.cl's bwd arguments: the forward's views and
 * score fields, d_out, and the per-row scratch dsum (D_i) and sinkt (a
 * sink's term of d_sinks), both [B * Hq * q_len], indexed by the logical
 * row; then its own. */
static inline ulong bwd_row(long b, long h, long i, int q_heads, int q_len) {
  return ((ulong)b * (ulong)q_heads + (ulong)h) * (ulong)q_len + (ulong)i;
}

/* One float16 lane per key (bwd_dkdv) or per query row (bwd_dq). */
#define BWD_BN 16

static inline int16 bwd_lanes(void) { return (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

/* 16 raw scores (<q, k> or the additive sum) shaped as the forward does
 * before bias and ALiBi: scale, then softcap; *dshape is the derivative of
 * the shaped score by the raw one (scale (1 - tanh^2) under softcap). */
static inline float16 bwd_shape(float16 raw, float scale, float softcap, float16 *dshape) {
  const float16 x = raw * scale;
  if (softcap > 0.0f) {
    const float16 t = tanh(x / softcap);
    *dshape = scale * (1.0f - t * t);
    return softcap * t;
  }
  *dshape = (float16)(scale);
  return x;
}

/* The per-pair part of 16 pairs (i0 + l di, j0 + l dj): the mask and the
 * mask modifier clear lanes of *ok; the score modifier shapes the allowed
 * lanes' scores (its derivative, clattn_score_mod_grad, multiplies their
 * *dshape), then bias and ALiBi add to them. */
static inline float16 bwd_pairs(float16 x, float16 *dshape, int16 *ok, long b, long h, long i0, int di, long j0, int dj, ca_seq sq,
                                __global const uchar *mask, ulong mask_off, ulong4 mask_st, int has_mask,
                                CA_BIAS_ARGS, CA_SHAPE_ARGS) {
  float e[BWD_BN], g[BWD_BN];
  int a[BWD_BN];
  vstore16(x, 0, e);
  vstore16(*dshape, 0, g);
  vstore16(*ok, 0, a);
  for (int l = 0; l < BWD_BN; l++) {
    if (!a[l]) continue;
    const long i = i0 + (long)l * di, j = j0 + (long)l * dj;
    if (has_mask && mask[ca_at(mask_off, mask_st, b, h, i, j)] == 0) {
      a[l] = 0;
      continue;
    }
    if (!CA_MOD_ALLOWS(b, h, i, j, sq)) {
      a[l] = 0;
      continue;
    }
#ifdef CA_MOD_SCORE
    g[l] *= clattn_score_mod_grad(e[l], (int)b, (int)h, CA_Q_IDX(i, sq), (int)j, ca_cap);
    e[l] = clattn_score_mod(e[l], (int)b, (int)h, CA_Q_IDX(i, sq), (int)j, ca_cap);
#endif
    if (has_bias) {
      const float bias_ij = ca_bias(CA_BIAS_PASS, b, h, i, j);
      if (bias_ij == -INFINITY) { /* disallowed, like a zero mask entry */
        a[l] = 0;
        continue;
      }
      e[l] += bias_ij;
    }
    if (has_alibi) e[l] += ca_alibi(i, j, sq.align_m, sq.align_n, ca_alibi_slope(alibi, alibi_bstride, b, h));
  }
  *ok = vload16(0, a);
  *dshape = vload16(0, g);
  return vload16(0, e);
}

/* The weights p = exp(s - lse) of the ok lanes (0 elsewhere, and ok
 * cleared where s is -inf or p underflows) and dS * dshape = p (dp - D) dshape:
 * a lane that is not ok contributes exactly nothing, whatever its key,
 * value or score holds. */
static inline float16 bwd_ds(float16 x, float16 row_lse, float16 dp, float16 d_row, float16 dshape, int16 *ok,
                             float16 *p) {
  *ok &= isnotequal(x, (float16)(-INFINITY));
  *p = select((float16)(0.0f), exp(x - row_lse), *ok);
  *ok &= isnotequal(*p, (float16)(0.0f));
  *p = select((float16)(0.0f), *p, *ok);
  return select((float16)(0.0f), *p * (dp - d_row) * dshape, *ok);
}

/*
 * bwd_rowdot — D_i = sum_c dO_ic O_ic per query row, and with sinks the row's
 * term of d_sinks, -exp(sink_h - lse_i) D_i. Rows past a packed sequence's
 * end get 0. NDRange: (q_len, batch * q_heads).
 */
__kernel void bwd_rowdot(CA_PARAMS(bwd_rowdot, args)) {
  CA_UNPACK(bwd_rowdot, args)
  (void)q; (void)q_off; (void)q_st; (void)k; (void)k_off; (void)k_st; (void)v; (void)v_off; (void)v_st;
  const int i = get_global_id(0), bh = get_global_id(1);
  if (i >= q_len) return;
  const int b = bh / q_heads, h = bh % q_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const ulong row = bwd_row(b, h, i, q_heads, q_len);
  float d = 0.0f;
  if (i < sq.rows)
    for (int c = 0; c < DV; c++)
      d = fma(ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, sq.q0 + i, c)), ca_load(o, ca_at(o_off, o_st, b, h, sq.q0 + i, c)), d);
  dsum[row] = d;
  if (sinks) {
    const float l = lse[ca_at(lse_off, lse_st, b, h, i, 0)];
    /* an empty row has lse = sink and O = 0: its term is 0 */
    sinkt[row] = i < sq.rows && l != -INFINITY ? -exp(sinks[sinks_at + h] - l) * d : 0.0f;
  }
}

/* x += v, atomically: cl_ext_float_atomics' native add where the device
 * has it (the host then builds with -D BWD_FLOAT_ATOMICS), else a
 * compare-and-swap loop on the bits, which OpenCL 1.2 has everywhere. */
static inline void bwd_atomic_add(volatile __global float *x, float v) {
#if defined(BWD_FLOAT_ATOMICS) && defined(__opencl_c_ext_fp32_global_atomic_add)
  atomic_fetch_add_explicit((volatile __global atomic_float *)x, v, memory_order_relaxed);
#else
  union { uint u; float f; } seen, want;
  seen.f = 0.0f;   /* a guess (rows start at 0): no plain read racing with the other adds */
  for (;;) {
    want.f = seen.f + v;
    const uint got = atomic_cmpxchg((volatile __global uint *)x, seen.u, want.u);
    if (got == seen.u) break;
    seen.u = got;
  }
#endif
}

static inline float bwd_hsum(float16 x) {
  const float8 a = x.lo + x.hi;
  const float4 c = a.lo + a.hi;
  const float2 e = c.lo + c.hi;
  return e.x + e.y;
}

/* Partner rows (bwd_dkdv) or keys (bwd_dq) taken together, so each
 * private K/V or Q/dO vector loaded serves BWD_R multiply-adds. */
#define BWD_R 4

/*
 * bwd_dkdv — one work-item per block of 16 keys of KV head (b, hk), one
 * float16 lane per key: walks the query rows whose window reaches the
 * block, BWD_R at a time, over the group's heads in order, and writes dK
 * and dV of its keys. A pair that is not allowed adds nothing, not even a
 * NaN times 0 (the accumulations select). Keys past kv_lens get zero
 * gradients; keys past a packed sequence's end are left to bwd_zero.
 * With dq_atomic (deterministic = 0), each pair's dQ share is also added
 * to the f32 rows dq_acc [B * Hq * q_len][DK] (zeroed first) by
 * bwd_atomic_add, and bwd_dq is not run: the order of the additions, and
 * so the last bits of dQ, depend on scheduling.
 * NDRange: (ceil(kv_len / 16), batch * kv_heads).
 */
__kernel void bwd_dkdv(CA_PARAMS(bwd_dkdv, args)) {
  CA_UNPACK(bwd_dkdv, args)
  CA_MOD_CAPTURES
  (void)o; (void)o_off; (void)o_st; (void)sinkt;
  const long j0l = (long)get_global_id(0) * BWD_BN;   /* no int overflow near kv_len = 2^31 - 1 */
  if (j0l >= kv_len) return;
  const int j0 = (int)j0l, bhk = get_global_id(1);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  if (varlen && j0 >= sq.keys) return;
  const int16 jv = j0 + bwd_lanes();
  const int16 key_ok = jv < (int16)(sq.keys);
  float ka[DK][BWD_BN], va[DV][BWD_BN], gka[DK][BWD_BN], gva[DV][BWD_BN];
  for (int l = 0; l < BWD_BN; l++) {
    const int j = min(j0 + l, sq.keys - 1);   /* keys past the valid ones are never read */
    const bool valid = j0 + l < sq.keys;
    for (int d = 0; d < DK; d++) ka[d][l] = valid ? ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, d)) : 0.0f;
    for (int c = 0; c < DV; c++) va[c][l] = valid ? ca_load(v, ca_at(v_off, v_st, b, hk, sq.k0 + j, c)) : 0.0f;
  }
  for (int d = 0; d < DK; d++) vstore16((float16)(0.0f), 0, gka[d]);
  for (int c = 0; c < DV; c++) vstore16((float16)(0.0f), 0, gva[c]);
  /* rows whose window reaches the block: p_i - window_left <= j <= p_i + window_right */
  const long shift = (long)sq.align_n - (long)sq.align_m;
  long i_lo = window_right >= 0 ? (long)j0 - window_right - shift : 0;
  long i_hi = window_left >= 0 ? (long)j0 + BWD_BN - 1 + window_left - shift : (long)sq.rows - 1;
  i_lo = max(i_lo, 0L);
  i_hi = min(i_hi, (long)sq.rows - 1);
  const bool per_pair = has_mask || has_bias || has_alibi || CA_MOD_ANY;
  for (int h = hk * group; h < (hk + 1) * group; h++)
    for (long ib = i_lo; ib <= i_hi; ib += BWD_R) {
      int16 ok[BWD_R];
      float lr[BWD_R];
      bool live[BWD_R], any_live = false;
      for (int r = 0; r < BWD_R; r++) {
        const long i = ib + r, pos = i + shift;
        lr[r] = i <= i_hi ? lse[ca_at(lse_off, lse_st, b, h, i, 0)] : -INFINITY;
        ok[r] = key_ok;
        if (window_left >= 0) ok[r] &= jv >= (int16)((int)max(pos - window_left, -1L));
        if (window_right >= 0) ok[r] &= jv <= (int16)((int)min(pos + window_right, (long)INT_MAX));
        live[r] = lr[r] != -INFINITY && any(ok[r]);   /* an empty row, or one the block is outside of */
        any_live |= live[r];
      }
      if (!any_live) continue;
#ifdef CA_MOD_MASK /* the block mask: rows whose blocks over these keys are empty add nothing */
      long bm_rows[BWD_R];
      for (int r = 0; r < BWD_R; r++) bm_rows[r] = ca_bm_row(mod, b, h, min(ib + r, i_hi), sq);
      if (ca_bm_rows_class(bm_class, mod, bm_rows, BWD_R, j0, j0 + BWD_BN - 1) == CA_BM_EMPTY) continue;
#endif
      float qv[BWD_R][DK], dov[BWD_R][DV];
      float16 raw[BWD_R], dp[BWD_R], ds[BWD_R], p[BWD_R];
      for (int r = 0; r < BWD_R; r++) {
        raw[r] = dp[r] = (float16)(0.0f);
        const long i = min(ib + r, i_hi);
        for (int d = 0; d < DK; d++) qv[r][d] = live[r] ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
        for (int c = 0; c < DV; c++) dov[r][c] = live[r] ? ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, sq.q0 + i, c)) : 0.0f;
      }
      if (additive)
        for (int d = 0; d < DK; d++) {
          const float16 kd = vload16(0, ka[d]);
#pragma unroll
          for (int r = 0; r < BWD_R; r++) raw[r] = fma((float16)(add_w[d]), tanh(qv[r][d] + kd), raw[r]);
        }
      else
        for (int d = 0; d < DK; d++) {
          const float16 kd = vload16(0, ka[d]);
#pragma unroll
          for (int r = 0; r < BWD_R; r++) raw[r] = fma((float16)(qv[r][d]), kd, raw[r]);
        }
      for (int c = 0; c < DV; c++) {
        const float16 vc = vload16(0, va[c]);
#pragma unroll
        for (int r = 0; r < BWD_R; r++) dp[r] = fma((float16)(dov[r][c]), vc, dp[r]);
      }
      for (int r = 0; r < BWD_R; r++) {
        if (!live[r]) ok[r] = (int16)(0);
        float16 dshape;
        float16 x = bwd_shape(raw[r], scale, softcap, &dshape);
        if (per_pair && live[r])
          x = bwd_pairs(x, &dshape, &ok[r], b, h, ib + r, 0, j0, 1, sq, mask, mask_off, mask_st, has_mask, CA_BIAS_PASS,
                        CA_SHAPE_PASS);
        const float d_row = live[r] ? dsum[bwd_row(b, h, ib + r, q_heads, q_len)] : 0.0f;
#ifdef CA_DROPOUT /* the weights that mixed V: the block's 16 keys of row ib + r */
        const float16 z = (float16)(ca_dropout4(dropout, b, h, ib + r, j0 >> 2),
                                    ca_dropout4(dropout, b, h, ib + r, (j0 >> 2) + 1),
                                    ca_dropout4(dropout, b, h, ib + r, (j0 >> 2) + 2),
                                    ca_dropout4(dropout, b, h, ib + r, (j0 >> 2) + 3));
        ds[r] = bwd_ds(x, (float16)(lr[r]), dp[r] * z, (float16)(d_row), dshape, &ok[r], &p[r]);
        p[r] *= z;
#else
        ds[r] = bwd_ds(x, (float16)(lr[r]), dp[r], (float16)(d_row), dshape, &ok[r], &p[r]);
#endif
      }
      for (int c = 0; c < DV; c++) {
        float16 g = vload16(0, gva[c]);
#pragma unroll
        for (int r = 0; r < BWD_R; r++) g = select(g, fma(p[r], (float16)(dov[r][c]), g), ok[r]);
        vstore16(g, 0, gva[c]);
      }
      for (int d = 0; d < DK; d++) {
        float16 g = vload16(0, gka[d]);
        if (additive) {
          const float16 kd = vload16(0, ka[d]);
          for (int r = 0; r < BWD_R; r++) {
            const float16 t = tanh(qv[r][d] + kd);
            g = select(g, fma(ds[r] * add_w[d], 1.0f - t * t, g), ok[r]);
          }
        } else {
#pragma unroll
          for (int r = 0; r < BWD_R; r++) g = select(g, fma(ds[r], (float16)(qv[r][d]), g), ok[r]);
        }
        vstore16(g, 0, gka[d]);
      }
      if (dq_atomic)   /* FA2's single pass: the block's share of each row's dQ, added at once */
        for (int r = 0; r < BWD_R; r++) {
          if (!any(ok[r])) continue;
          const ulong at = bwd_row(b, h, ib + r, q_heads, q_len) * DK;
          for (int d = 0; d < DK; d++) {
            const float16 kd = vload16(0, ka[d]);
            float16 t;
            if (additive) {
              const float16 th = tanh(qv[r][d] + kd);
              t = ds[r] * add_w[d] * (1.0f - th * th);
            } else {
              t = ds[r] * kd;
            }
            bwd_atomic_add(dq_acc + at + d, bwd_hsum(select((float16)(0.0f), t, ok[r])));
          }
        }
    }
  const int n_out = min(BWD_BN, (varlen ? sq.keys : kv_len) - j0);
  for (int l = 0; l < n_out; l++) {
    const long kj = sq.k0 + j0 + l;
    for (int d = 0; d < DK; d++) ca_store(d_k, ca_at(d_k_off, d_k_st, b, hk, kj, d), gka[d][l]);
    for (int c = 0; c < DV; c++) ca_store(d_v, ca_at(d_v_off, d_v_st, b, hk, kj, c), gva[c][l]);
  }
}

/*
 * bwd_dq — one work-item per block of 16 query rows of head (b, h), one
 * float16 lane per row: walks the keys the rows' windows reach, BWD_R at a
 * time in order, and writes dQ of its rows; with additive scoring and
 * want_dw, each row's term of d_additive_w, sum_j g_ij tanh(q_i + k_j), to
 * dw_rows [B * Hq * q_len][DK]. An empty row gets dQ = 0. Rows past a
 * packed sequence's end are left to bwd_zero.
 * NDRange: (ceil(q_len / 16), batch * q_heads).
 */
__kernel void bwd_dq(CA_PARAMS(bwd_dq, args)) {
  CA_UNPACK(bwd_dq, args)
  CA_MOD_CAPTURES
  (void)o; (void)o_off; (void)o_st; (void)sinkt;
  const long i0l = (long)get_global_id(0) * BWD_BN;
  if (i0l >= q_len) return;
  const int i0 = (int)i0l, bh = get_global_id(1);
  const int b = bh / q_heads, h = bh % q_heads, hk = h / group;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int16 iv = i0 + bwd_lanes();
  float qa[DK][BWD_BN], doa[DV][BWD_BN], gqa[DK][BWD_BN], gwa[DK][BWD_BN];
  float lse_a[BWD_BN], d_a[BWD_BN];
  for (int l = 0; l < BWD_BN; l++) {
    const int i = min(i0 + l, q_len - 1);
    const bool live = i0 + l < sq.rows;
    lse_a[l] = live ? lse[ca_at(lse_off, lse_st, b, h, i, 0)] : -INFINITY;
    d_a[l] = live ? dsum[bwd_row(b, h, i, q_heads, q_len)] : 0.0f;
    for (int d = 0; d < DK; d++) qa[d][l] = live ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
    for (int c = 0; c < DV; c++) doa[c][l] = live ? ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, sq.q0 + i, c)) : 0.0f;
  }
  for (int d = 0; d < DK; d++) {
    vstore16((float16)(0.0f), 0, gqa[d]);
    vstore16((float16)(0.0f), 0, gwa[d]);
  }
  const float16 row_lse = vload16(0, lse_a), d_row = vload16(0, d_a);
  const int16 row_ok = isnotequal(row_lse, (float16)(-INFINITY));   /* live, not empty */
  /* keys the block's windows reach, as the forward's flash_row_keys */
  const long shift = (long)sq.align_n - (long)sq.align_m;
  const int16 posv = iv + (int16)((int)shift);   /* i + shift lies in (-q_len, kv_len) */
  long j_lo = window_left >= 0 ? (long)i0 + shift - window_left : 0;
  long j_hi = window_right >= 0 ? (long)i0 + BWD_BN - 1 + shift + window_right : (long)sq.keys - 1;
  j_lo = max(j_lo, 0L);
#ifdef CA_DROPOUT
  j_lo &= ~3L; /* blocks of BWD_R = 4 keys, one Philox draw per row (keys below the window are not ok) */
#endif
  j_hi = min(j_hi, (long)sq.keys - 1);
  if (!any(row_ok)) j_hi = -1;
  const bool per_pair = has_mask || has_bias || has_alibi || CA_MOD_ANY;
#ifdef CA_MOD_MASK
  long bm_rows[BWD_BN]; /* where the block's rows' block-mask classes begin */
  for (int l = 0; l < BWD_BN; l++) bm_rows[l] = ca_bm_row(mod, b, h, min(i0 + l, max(sq.rows - 1, 0)), sq);
#endif
  for (long jb = j_lo; jb <= j_hi; jb += BWD_R) {
#ifdef CA_MOD_MASK /* keys whose blocks are empty for every row add nothing */
    if (ca_bm_rows_class(bm_class, mod, bm_rows, BWD_BN, jb, jb + BWD_R - 1) == CA_BM_EMPTY) continue;
#endif
    int16 ok[BWD_R];
    bool live[BWD_R], any_live = false;
    for (int r = 0; r < BWD_R; r++) {
      const long j = jb + r;
      ok[r] = row_ok;
      if (window_left >= 0) ok[r] &= posv <= (int16)((int)min(j + window_left, (long)INT_MAX));
      if (window_right >= 0) ok[r] &= posv >= (int16)((int)(j - window_right));
      live[r] = j <= j_hi && any(ok[r]);
      any_live |= live[r];
    }
    if (!any_live) continue;
#ifdef CA_DROPOUT /* the factors of keys jb .. jb + 3 for each of the block's rows */
    float4 z4[BWD_BN];
    for (int l = 0; l < BWD_BN; l++) z4[l] = ca_dropout4(dropout, b, h, i0 + l, jb >> 2);
#endif
    float kr[BWD_R][DK], vr[BWD_R][DV];
    float16 raw[BWD_R], dp[BWD_R], ds[BWD_R], p[BWD_R];
    for (int r = 0; r < BWD_R; r++) {   /* a key no row of the block may see is not read */
      raw[r] = dp[r] = (float16)(0.0f);
      const long kj = sq.k0 + min(jb + r, j_hi);
      for (int d = 0; d < DK; d++) kr[r][d] = live[r] ? ca_load(k, ca_at(k_off, k_st, b, hk, kj, d)) : 0.0f;
      for (int c = 0; c < DV; c++) vr[r][c] = live[r] ? ca_load(v, ca_at(v_off, v_st, b, hk, kj, c)) : 0.0f;
    }
    if (additive)
      for (int d = 0; d < DK; d++) {
        const float16 qd = vload16(0, qa[d]);
#pragma unroll
        for (int r = 0; r < BWD_R; r++) raw[r] = fma((float16)(add_w[d]), tanh(qd + kr[r][d]), raw[r]);
      }
    else
      for (int d = 0; d < DK; d++) {
        const float16 qd = vload16(0, qa[d]);
#pragma unroll
        for (int r = 0; r < BWD_R; r++) raw[r] = fma(qd, (float16)(kr[r][d]), raw[r]);
      }
    for (int c = 0; c < DV; c++) {
      const float16 dc = vload16(0, doa[c]);
#pragma unroll
      for (int r = 0; r < BWD_R; r++) dp[r] = fma(dc, (float16)(vr[r][c]), dp[r]);
    }
    for (int r = 0; r < BWD_R; r++) {
      if (!live[r]) ok[r] = (int16)(0);
      float16 dshape;
      float16 x = bwd_shape(raw[r], scale, softcap, &dshape);
      if (per_pair && live[r])
        x = bwd_pairs(x, &dshape, &ok[r], b, h, i0, 1, jb + r, 0, sq, mask, mask_off, mask_st, has_mask, CA_BIAS_PASS,
                      CA_SHAPE_PASS);
#ifdef CA_DROPOUT /* key jb + r's factors for the block's 16 rows */
      float zl[BWD_BN];
      for (int l = 0; l < BWD_BN; l++) zl[l] = r == 0 ? z4[l].x : r == 1 ? z4[l].y : r == 2 ? z4[l].z : z4[l].w;
      dp[r] *= vload16(0, zl);
#endif
      ds[r] = bwd_ds(x, row_lse, dp[r], d_row, dshape, &ok[r], &p[r]);
    }
    for (int d = 0; d < DK; d++) {
      float16 g = vload16(0, gqa[d]);
      if (additive) {
        const float16 qd = vload16(0, qa[d]);
        float16 gw = vload16(0, gwa[d]);
        for (int r = 0; r < BWD_R; r++) {
          const float16 t = tanh(qd + kr[r][d]);
          g = select(g, fma(ds[r] * add_w[d], 1.0f - t * t, g), ok[r]);
          gw = select(gw, fma(ds[r], t, gw), ok[r]);
        }
        vstore16(gw, 0, gwa[d]);
      } else {
#pragma unroll
        for (int r = 0; r < BWD_R; r++) g = select(g, fma(ds[r], (float16)(kr[r][d]), g), ok[r]);
      }
      vstore16(g, 0, gqa[d]);
    }
  }
  for (int l = 0; l < BWD_BN && i0 + l < q_len; l++) {
    const int i = i0 + l;
    if (i < sq.rows)
      for (int d = 0; d < DK; d++) ca_store(d_q, ca_at(d_q_off, d_q_st, b, h, sq.q0 + i, d), gqa[d][l]);
    if (want_dw)
      for (int d = 0; d < DK; d++) dw_rows[bwd_row(b, h, i, q_heads, q_len) * DK + d] = gwa[d][l];
  }
}

/*
 * bwd_dbias — dL/dbias (clattn_backward_params.d_bias): each pair's
 * dS_ij = p_ij (<dO_i, v_j> - D_i), the gradient of its shaped score after
 * the bias is added, summed over the dimensions of `summed` (bit 0 batch,
 * 1 head, 2 row, 3 key: those the output view broadcasts) in that order,
 * one work-item per output element: bitwise repeatable. A pair that is not
 * allowed, of an empty row or past a sequence, or whose weight is 0 adds
 * nothing, whatever its key or value holds.
 * NDRange: (kv_len, q_len, batch * q_heads), each 1 where summed.
 */
__kernel void bwd_dbias(CA_PARAMS(bwd_dbias, args)) {
  CA_UNPACK(bwd_dbias, args)
  CA_MOD_CAPTURES
  (void)o; (void)o_off; (void)o_st; (void)sinkt; (void)sinks; (void)sinks_at;
  const int heads_out = summed & 2 ? 1 : q_heads, rows_out = summed & 4 ? 1 : q_len;
  const long j_out = get_global_id(0);
  const int i_out = get_global_id(1), b_out = get_global_id(2) / heads_out, h_out = get_global_id(2) % heads_out;
  if (j_out >= (summed & 8 ? 1 : kv_len) || i_out >= rows_out) return;
  float acc = 0.0f;
  for (int b = summed & 1 ? 0 : b_out; b < (summed & 1 ? batch : b_out + 1); b++) {
    const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
    for (int h = summed & 2 ? 0 : h_out; h < (summed & 2 ? q_heads : h_out + 1); h++) {
      const int hk = h / group;
      for (int i = summed & 4 ? 0 : i_out; i < min(summed & 4 ? q_len : i_out + 1, sq.rows); i++) {
        const float row_lse = lse[ca_at(lse_off, lse_st, b, h, i, 0)];
        if (row_lse == -INFINITY) continue; /* an empty row */
        const float d_row = dsum[bwd_row(b, h, i, q_heads, q_len)];
        for (long j = summed & 8 ? 0 : j_out; j < min(summed & 8 ? (long)kv_len : j_out + 1, (long)sq.keys); j++) {
          if (!ca_in_window(i, j, sq.align_m, sq.align_n, window_left, window_right)) continue;
          if (has_mask && mask[ca_at(mask_off, mask_st, b, h, i, j)] == 0) continue;
          if (!CA_MOD_ALLOWS(b, h, i, j, sq)) continue;
          const float bias_ij = has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
          if (bias_ij == -INFINITY) continue; /* disallowed */
          float raw = 0.0f, dp = 0.0f;
          for (int d = 0; d < DK; d++) {
            const float qd = ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d));
            const float kd = ca_load(k, ca_at(k_off, k_st, b, hk, sq.k0 + j, d));
            raw = additive ? fma(add_w[d], tanh(qd + kd), raw) : fma(qd, kd, raw);
          }
          const float x = ca_shape(scale * raw, bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS);
          const float p = exp(x - row_lse);
          if (p == 0.0f) continue; /* disallowed by its score, or underflowed: no gradient */
          for (int c = 0; c < DV; c++)
            dp = fma(ca_load(d_o, ca_at(d_o_off, d_o_st, b, h, sq.q0 + i, c)),
                     ca_load(v, ca_at(v_off, v_st, b, hk, sq.k0 + j, c)), dp);
#ifdef CA_DROPOUT
          dp *= ca_dropout(dropout, b, h, i, j);
#endif
          /* the bias enters the score times its head's scale */
          acc += (has_bias & CA_BIAS_SCALED ? bias_scale[h] : 1.0f) * (p * (dp - d_row));
        }
      }
    }
  }
  d_bias[ca_at(d_bias_off, d_bias_st, b_out, h_out, i_out, j_out)] = acc;
}

/*
 * bwd_sum — out[c] = sum_{a < n_outer} sum_{r < n_inner} x[a * s_outer + c * s_col + r * s_inner],
 * in that order: the fixed-order reductions of d_sinks (per head over
 * batch and rows) and d_additive_w (per column over rows). NDRange: (n_cols).
 */
__kernel void bwd_sum(CA_PARAMS(bwd_sum, args)) {
  CA_UNPACK(bwd_sum, args)
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
__kernel void bwd_zero(CA_PARAMS(bwd_zero, args)) {
  CA_UNPACK(bwd_zero, args)
  const int r = get_global_id(0), h = get_global_id(1);
  if (r >= rows) return;
  for (int c = 0; c < cols; c++) ca_store(x, ca_at(x_off, x_st, 0, h, r, c), 0.0f);
}

/*
 * bwd_fill — x[0 .. n) = 0 (f32 accumulators). NDRange: (n).
 */
__kernel void bwd_fill(CA_PARAMS(bwd_fill, args)) {
  CA_UNPACK(bwd_fill, args)
  const ulong e = get_global_id(0);
  if (e < n) x[e] = 0.0f;
}

/*
 * bwd_store — writes f32 accumulators acc [heads * batch][len][acc_cols]
 * (columns col0 .. col0 + cols - 1) to a gradient view: query rows
 * (key_side 0: rows that exist, at the sequence's first row) or keys
 * (key_side 1: every key of a padded batch, whose accumulators are 0 past
 * kv_lens, or a packed sequence's keys). NDRange: (len, batch * heads).
 */
__kernel void bwd_store(CA_PARAMS(bwd_store, args)) {
  CA_UNPACK(bwd_store, args)
  const int r = get_global_id(0), bh = get_global_id(1);
  const int len = key_side ? kv_len : q_len;
  if (r >= len) return;
  const int b = bh / heads, h = bh % heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n = key_side ? (varlen ? sq.keys : kv_len) : sq.rows;
  if (r >= n) return;
  const long row = (key_side ? sq.k0 : sq.q0) + r;
  const ulong at = ((ulong)bh * (ulong)len + (ulong)r) * (ulong)acc_cols + (ulong)col0;
  for (int c = 0; c < cols; c++) ca_store(x, ca_at(x_off, x_st, b, h, row, c), acc[at + c]);
}
