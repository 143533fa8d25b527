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
 * and at the end O = acc / l, lse = m + log(l). When route diagnostics are
 * asked for, each row also keeps t = sum_j p_j (s_j - m), rescaled like l
 * (t' = alpha (t + l (m - m')) + sum_j p_j (s_j - m')), for its entropy
 * log(l) - t / l, and the first key reaching the running maximum (argmax;
 * the host does not split the keys then). A row with l = 0 had no
 * allowed key (or only -inf scores): O = 0, lse = -INFINITY, *empty_flag set.
 * Blocks wholly outside the window/causal band or past kv_lens are skipped;
 * blocks wholly inside skip the per-element masking.
 *
 * Split-KV: dimension 2 of the NDRange splits the keys into n_splits ranges of
 * split_keys each. With n_splits > 1 each range writes a partial state
 * (O_s normalised, lse_s) to part_o [n_splits][B*Hq*M][DV] and part_lse
 * [n_splits][B*Hq*M], combined by merge.cl. split_keys is a multiple of FLASH_BN.
 *
 * K/V storage (paged, Q8_0, INT8; common.h.cl's ca_kv_*) is located and
 * dequantised on load: by flash_pack into the packed copies, in place by the
 * direct and tiled kernels. A key whose page is outside the pool is
 * disallowed (a block spanning such a page takes the per-key pass).
 *
 * -D DK, DV: head dim and value dim (the program is specialised per pair).
 * -D FLASH_BM: rows per work-item (register block); FLASH_VW: floats per
 * vector of flash_rows* (4, 8 or 16: the device's float vector width,
 * src/device.c); FLASH_BN = 2 FLASH_VW keys per block, so each query value
 * loaded feeds two vector multiply-adds.
 * -D FLASH_NO_ROWS leaves out the CPU kernels (flash_pack, flash_rows*) and
 * -D FLASH_NO_TILED flash_tiled: a program holds one device's kernels only,
 * as a program binary holds every kernel compiled (POCL compiles them all
 * when asked for it).
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
#ifndef FLASH_VW
#define FLASH_VW 16
#endif
#if FLASH_VW != 4 && FLASH_VW != 8 && FLASH_VW != 16
#error "FLASH_VW must be 4, 8 or 16"
#endif
#define FLASH_BN (2 * FLASH_VW)
#define FLASH_CAT_(a, b) a##b
#define FLASH_CAT(a, b) FLASH_CAT_(a, b)
#define flash_vec FLASH_CAT(float, FLASH_VW)
#define flash_ivec FLASH_CAT(int, FLASH_VW)
#define flash_vload FLASH_CAT(vload, FLASH_VW)
#define flash_vstore FLASH_CAT(vstore, FLASH_VW)
/* Row-block capacity of the private arrays: the packed kernel's FLASH_BM
 * and the direct kernels' 1, 2, 4, 8 (the host clamps FLASH_BM to 16). */
#define FLASH_BM_MAX 16
/* flash_rows' prefetches (CA_PREFETCH): the cache lines of a block's
 * packed values asked for per step of its scores' loop over DK, and of
 * the next block's packed keys per step of the values' loop (its
 * DVP / (2 FLASH_VW) passes over FLASH_BN keys; none where DVP is one
 * vector): spread so, the next operands arrive while the arithmetic runs. */
#define FLASH_V_LINES_PER_D ((FLASH_BN * DVP * 4 / 64 + DK - 1) / DK)
#define FLASH_K_STEPS (DVP >= 2 * FLASH_VW ? DVP / (2 * FLASH_VW) * FLASH_BN : 1)
#define FLASH_K_LINES_PER_KEY ((FLASH_BN * DK * 4 / 64 + FLASH_K_STEPS - 1) / FLASH_K_STEPS)
/* Where a block's packed keys and values pass 16 KB together (d = 128 and
 * up with 16-wide vectors), they and the rows' queries and accumulators
 * overflow a 32-48 KB L1 data cache, and lines asked for a whole block
 * ahead are gone before their use: the hints then run FLASH_BN steps
 * ahead of the loop that reads them (the scores' loop over the block's
 * keys, then the first pass's value rows; each pass over the values, the
 * next pass's, then the next block's first keys). On the 2-core Xeon
 * (docs/performance.md) that made d = 256 1.10x and d = 128 1.03x as fast,
 * and d = 64 0.98x, hence the threshold. */
#define FLASH_PREFETCH_ROLLING (FLASH_BN * (DK + DVP) * 4 > 16384)
/* Value rows are packed to a multiple of 16 (the direct kernels' slices;
 * a multiple of every FLASH_VW). */
#define DVP (((DV) + 15) / 16 * 16)

/* The fused kernels' arguments (args.h.cl's flash_core and flash_extra);
 * the *_core entries take flash_core alone, every extra absent, so they
 * build without the extras' code; the *_step entries take flash_step
 * alone, the rest of flash_core absent too. FLASH_UNPACK declares every
 * argument, and the packed copies and partial states in the work buffer. */
#define FLASH_PARAMS CA_PARAMS(flash_core, args), CA_PARAMS(flash_extra, xargs)
#define FLASH_PASS CA_PASS(flash_core, args), CA_PASS(flash_extra, xargs)
#define FLASH_CORE_PASS CA_PASS(flash_core, args), CA_ABSENT(flash_extra)
#define FLASH_UNPACK                                                             \
  CA_UNPACK(flash_core, args)                                                    \
  CA_UNPACK(flash_extra, xargs)                                                  \
  __global const float *kt = work + kt_at, *vp = work + vp_at;                   \
  __global float *part_o = work + part_o_at, *part_lse = work + part_lse_at;      \
  CA_MOD_CAPTURES

#ifdef CA_PREFETCH
/* the cache lines of one step of flash_rows' loops over a packed block:
 * two vectors from p (64-byte aligned: a step of K^T, a pass's value row) */
static inline void flash_prefetch_step(__global const float *p) {
#pragma unroll
  for (int u = 0; u < (2 * FLASH_VW * 4 + 63) / 64; u++) ca_prefetch_line((__global const uchar *)p + 64 * u);
}
#endif

/*
 * flash_pack — copies K transposed per key block and V row-major into
 * contiguous scratch, with keys past kv_lens[b] (and the padding up to
 * n_pad, a multiple of FLASH_BN) zeroed, so the main kernel reads a block's
 * keys of one dimension as two vectors, the block's DK rows one after
 * another (unit stride), and never multiplies a padded NaN.
 *   kt[bh][j / BN][d][j % BN] = k[b, hk, j, d]
 *   vp[bh][j][c] = v[b, hk, j, c] (c < DV, else 0)
 * NDRange: (n_pad, batch * kv_heads); any work-group shape. Both copies
 * go to the call's work buffer, at kt_at and vp_at.
 */
#ifndef FLASH_NO_ROWS
__kernel void flash_pack(CA_PARAMS(flash_pack, args)) {
  CA_UNPACK(flash_pack, args)
  __global float *kt = work + kt_at, *vp = work + vp_at;
  const long j = get_global_id(0);   /* n_pad reaches 2^31 for kv_len near INT_MAX */
  const int bh = get_global_id(1);
  if (j >= n_pad) return;
  const int b = bh / kv_heads, hk = bh % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const bool valid = j < sq.keys;
  /* key j's column of its block: the block's DK rows of FLASH_BN keys */
  __global float *kt_key =
      kt + ((ulong)bh * (ulong)n_pad + (ulong)j / FLASH_BN * FLASH_BN) * DK + (ulong)j % FLASH_BN;
  /* K/V storage (paged, quantised): located and dequantised here, once */
  const ca_kv_pos at = ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS);
  const bool use = valid && at.ok;
  const ulong k_row = ca_at(k_off, k_st, at.slot, hk, at.row, 0), v_row = ca_at(v_off, v_st, at.slot, hk, at.row, 0);
  const float ks = use ? ca_k_scale(k_scale, k_scale_off, k_scale_st, at, hk) : 0.0f;
  const float vs = use ? ca_v_scale(v_scale, v_scale_off, v_scale_st, at, hk) : 0.0f;
  for (int d = 0; d < DK; d++) kt_key[d * FLASH_BN] = use ? ca_k_load(k, k_row, k_st.s3, d, ks) : 0.0f;
  __global float *vp_row = vp + ((ulong)bh * (ulong)n_pad + (ulong)j) * DVP;
  for (int c = 0; c < DVP; c++) vp_row[c] = (use && c < DV) ? ca_v_load(v, v_row, v_st.s3, c, vs) : 0.0f;
}
#endif /* FLASH_NO_ROWS */

/* The key range [lo, hi] that row (h, i) may see: window and kv_lens. */
static inline int2 flash_row_keys(long i, int q_len, int kv_len, int n_valid, int window_left, int window_right) {
  long p = i + (long)kv_len - (long)q_len;
  long lo = window_left >= 0 ? p - window_left : 0;
  long hi = window_right >= 0 ? p + window_right : (long)kv_len - 1;
  lo = max(lo, 0L);
  hi = min(hi, (long)n_valid - 1);
  return (int2)((int)min(lo, (long)INT_MAX), (int)max(hi, -1L));
}

/* exp(x) for the softmax's x = s - max <= 0 (or -inf): Cody-Waite's
 * reduction to r in [-ln2/2, ln2/2], Cephes' degree-5 polynomial, and 2^n
 * built in the exponent bits: about 17 operations where the library's exp
 * takes 25-30 (its range checks cover what the softmax never passes), within
 * 1.24 ulp of exp over [-87.3, 0] (float32 model of these steps, numpy).
 * Below -87.34 (exp past the normal floats) and at -inf it is exactly 0;
 * NaN stays NaN. */
#define FLASH_EXP_LE0(T, IT)                                                                       \
  static inline T __attribute__((overloadable)) flash_exp_le0(const T x) {                         \
    const T magic = (T)(12582912.0f); /* 1.5 2^23: x log2(e) rounds into its low bits */           \
    const T t = fma(x, (T)(1.44269504f), magic), n = t - magic;                                    \
    T r = fma(n, (T)(-0.693359375f), x);                                                           \
    r = fma(n, (T)(2.12194440e-4f), r);                                                            \
    T p = fma((T)(1.9875691500e-4f), r, (T)(1.3981999507e-3f));                                    \
    p = fma(p, r, (T)(8.3334519073e-3f));                                                          \
    p = fma(p, r, (T)(4.1665795894e-2f));                                                          \
    p = fma(p, r, (T)(1.6666665459e-1f));                                                          \
    p = fma(p, r, (T)(5.0000001201e-1f));                                                          \
    p = fma(p, r * r, r + 1.0f);                                                                   \
    const IT n_biased = FLASH_CAT(as_, IT)(t) - (FLASH_CAT(as_, IT)(magic) - 127);                 \
    const T two_n = FLASH_CAT(as_, T)(n_biased << 23);                                             \
    return select(p * two_n, (T)(0.0f), x < -87.3365f);                                            \
  }
FLASH_EXP_LE0(float, int)
FLASH_EXP_LE0(flash_vec, flash_ivec)
#if FLASH_VW != 16
FLASH_EXP_LE0(float16, int16)
#endif

/* Horizontal max and sum of a flash_vec (fmax: NaN lanes are passed over),
 * and the sum of a float16 (the direct kernels' dot products). */
static inline float flash_hmax(flash_vec x) {
#if FLASH_VW == 16
  const float8 a = fmax(x.lo, x.hi);
  const float4 b = fmax(a.lo, a.hi);
#elif FLASH_VW == 8
  const float4 b = fmax(x.lo, x.hi);
#else
  const float4 b = x;
#endif
  const float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}

static inline float flash_hsum(flash_vec x) {
#if FLASH_VW == 16
  const float8 a = x.lo + x.hi;
  const float4 b = a.lo + a.hi;
#elif FLASH_VW == 8
  const float4 b = x.lo + x.hi;
#else
  const float4 b = x;
#endif
  const float2 c = b.lo + b.hi;
  return c.x + c.y;
}

static inline float flash_hsum16(float16 x) {
  const float8 a = x.lo + x.hi;
  const float4 b = a.lo + a.hi;
  const float2 c = b.lo + b.hi;
  return c.x + c.y;
}

/* The sums of 16 keys' float16 dot products at once, in key order, each
 * added in flash_hsum16's order (so bitwise its sums) in about a third of
 * its operations: l1[i] holds keys 2i and 2i + 1's first halving (lanes
 * 0-7 and 8-15); each further level halves two vectors' groups into one. */
static inline float16 flash_hsum16_keys(const float16 *l1) {
  float16 l2[4], l3[2];
  for (int i = 0; i < 4; i++) { /* lanes: keys 4i, 4i + 2, 4i + 1, 4i + 3, four each */
    const float16 a = l1[2 * i], b = l1[2 * i + 1];
    l2[i] = (float16)(a.s0123, b.s0123, a.s89ab, b.s89ab) + (float16)(a.s4567, b.s4567, a.scdef, b.scdef);
  }
  for (int i = 0; i < 2; i++) { /* keys 8i + 0, 4, 2, 6, 1, 5, 3, 7, two lanes each */
    const float16 a = l2[2 * i], b = l2[2 * i + 1];
    l3[i] = (float16)(a.s01, b.s01, a.s45, b.s45, a.s89, b.s89, a.scd, b.scd) +
            (float16)(a.s23, b.s23, a.s67, b.s67, a.sab, b.sab, a.sef, b.sef);
  }
  const float16 a = l3[0], b = l3[1];
  const float16 l4 = (float16)(a.s0, b.s0, a.s2, b.s2, a.s4, b.s4, a.s6, b.s6, a.s8, b.s8, a.sa, b.sa, a.sc, b.sc,
                               a.se, b.se) +
                     (float16)(a.s1, b.s1, a.s3, b.s3, a.s5, b.s5, a.s7, b.s7, a.s9, b.s9, a.sb, b.sb, a.sd, b.sd,
                               a.sf, b.sf);
  /* key k sits in lane bit-reverse(k) */
  return shuffle(l4, (uint16)(0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15));
}

/* A row's end state from its running (m, l): O = acc * inv and lse. The
 * sink (-INFINITY: none) joins as one more logit without a value: folded
 * here, or by the merge when the keys were split (n_splits > 1). l = 0
 * means no allowed key: O = 0, lse = -INFINITY (or the sink). */
typedef struct {
  bool empty;
  float alpha, l_keys, l_f, inv, lse, m_f;
} flash_final;
static inline flash_final flash_finish(float m, float l, float sink, int n_splits) {
  flash_final f;
  if (n_splits > 1) sink = -INFINITY;
  f.empty = l == 0.0f;
  f.m_f = ca_max_nan(m, sink);
  f.alpha = f.empty ? 0.0f : exp(m - f.m_f);
  f.l_keys = l * f.alpha;
  f.l_f = sink == -INFINITY ? f.l_keys : f.l_keys + exp(sink - f.m_f);
  f.inv = f.empty ? 0.0f : f.alpha / f.l_f;
  f.lse = f.empty ? sink : f.m_f + log(f.l_f);
  return f;
}

/* Where row (b, h, i)'s partial state goes when the keys were split. */
static inline ulong flash_part_row(int b, int h, int i, int q_heads, int kv_heads, int q_len, int split) {
  const ulong rows_total = (ulong)(get_global_size(1) / kv_heads) * (ulong)q_heads * (ulong)q_len;
  return (ulong)split * rows_total + ((ulong)b * q_heads + h) * (ulong)q_len + i;
}

/* Finishes one row: O = acc / l and lse = m + log(l) to the outputs, or to
 * split `split`'s partial state when the keys were split; an empty row
 * raises the empty-row flag. */
static inline void flash_store_row(const float *acc, float m, float l, float t, int best, float sink, int b, int h, int i,
                            long out_row, int q_heads, int kv_heads, int q_len, int split, int n_splits, __global store_t *out,
                            ulong out_off, ulong4 out_st, __global float *lse, ulong lse_off, ulong4 lse_st,
                            int want_lse, CA_DIAG_ARGS, __global float *part_o, __global float *part_lse,
                            __global int *empty_flag) {
  const flash_final f = flash_finish(m, l, sink, n_splits);
  if (n_splits > 1) {
    const ulong part = flash_part_row(b, h, i, q_heads, kv_heads, q_len, split);
    for (int c = 0; c < DV; c++) part_o[part * DV + c] = acc[c] * f.inv;
    part_lse[part] = f.lse;
  } else {
    for (int c = 0; c < DV; c++) ca_store(out, ca_at(out_off, out_st, b, h, out_row, c), acc[c] * f.inv);
    if (want_lse) lse[ca_at(lse_off, lse_st, b, h, i, 0)] = f.lse;
    if (diag)
      ca_store_diag(f.empty, f.l_keys, f.l_f, f.empty ? 0.0f : f.alpha * (t + l * (m - f.m_f)), f.alpha, best, b, h, i,
                    CA_DIAG_PASS);
    if (f.empty) ca_raise_empty(empty_flag);
  }
}

/* The same for columns c0 .. c0 + n - 1 (those below DV) of a row whose
 * accumulator is spread over several work-items (flash_block); `lead` is
 * the one that writes lse and raises the flag. */
static inline void flash_store_cols(const float4 *acc, int c0, int n, bool lead, float m, float l, float sink, int b,
                                    int h, int i, long out_row, int q_heads, int kv_heads, int q_len, int split,
                                    int n_splits, __global store_t *out, ulong out_off, ulong4 out_st,
                                    __global float *lse, ulong lse_off, ulong4 lse_st, int want_lse,
                                    __global float *part_o, __global float *part_lse, __global int *empty_flag) {
  const flash_final f = flash_finish(m, l, sink, n_splits);
  const ulong part = n_splits > 1 ? flash_part_row(b, h, i, q_heads, kv_heads, q_len, split) : 0;
  for (int g = 0; g < n / 4; g++) {
    /* the four columns by name, not through an array a loop with an exit
     * indexes (16-bit stores: IGC kept it in scratch memory, ocloc) */
    const float4 e = acc[g] * f.inv;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 + 4 * g + u;
      const float x = u == 0 ? e.x : u == 1 ? e.y : u == 2 ? e.z : e.w;
      if (c < DV) {
        if (n_splits > 1) part_o[part * DV + c] = x;
        else ca_store(out, ca_at(out_off, out_st, b, h, out_row, c), x);
      }
    }
  }
  if (!lead) return;
  if (n_splits > 1) part_lse[part] = f.lse;
  else {
    if (want_lse) lse[ca_at(lse_off, lse_st, b, h, i, 0)] = f.lse;
    if (f.empty) ca_raise_empty(empty_flag);
  }
}

/* The diagnostics' update for one block of scores x0, x1 (-inf = not
 * allowed) whose weights are p0, p1 = exp(x - m_safe); m_old and l_old
 * before the block. */
static inline void flash_diag_block(flash_vec x0, flash_vec x1, flash_vec p0, flash_vec p1, float m_old, float l_old,
                                    float alpha, float m_safe, long j0, float *t, int *best) {
  const flash_vec z = (flash_vec)(0.0f);
  const flash_vec term =
      select(z, p0 * (x0 - m_safe), isnotequal(p0, z)) + select(z, p1 * (x1 - m_safe), isnotequal(p1, z));
  *t = (l_old == 0.0f ? 0.0f : alpha * (*t + l_old * (m_old - m_safe))) + flash_hsum(term);
  const float block_max = flash_hmax(fmax(x0, x1));
  if (block_max > m_old) {   /* strictly: on a tie the earlier key stays */
    float e[FLASH_BN];
    flash_vstore(x0, 0, e);
    flash_vstore(x1, 0, e + FLASH_VW);
    for (int jj = FLASH_BN - 1; jj >= 0; jj--)
      if (e[jj] == block_max) *best = (int)(j0 + jj);
  }
}

/* Key j0 + jj's place when the direct kernels locate pages per half block
 * (FLASH_VW keys on one page: at_h[jj / FLASH_VW]), else located itself. */
static inline ca_kv_pos flash_key_at(const ca_kv_pos *at_h, bool page_halves, int b, long key, int jj,
                                     __global const int *block_table, int bt_stride, int page_size, int num_pages,
                                     int paged) {
  if (page_halves) {
    const ca_kv_pos h = at_h[jj / FLASH_VW];
    return (ca_kv_pos){h.slot, h.row + jj % FLASH_VW, h.ok};
  }
  return ca_kv_locate(b, key, CA_PAGE_PASS);
}

/* The direct kernels' values in columns c .. c + 16 w - 1: acc = alpha acc
 * + p V over the block's first n keys, V's rows read in place (v_base,
 * with their scales), w 16-column slices (1 or 2, a constant at each call)
 * per pass over the rows, their w bm accumulators in registers (four
 * slices spilled Q8_0's); a block type's two slices share one scale's load.
 * `guarded` (the block has a zero weight): a zero weight mixes nothing in,
 * even a NaN or Inf value. */
static inline __attribute__((always_inline)) void flash_mix_slices(float (*acc)[DVP], float (*p)[FLASH_BN],
                                                                   const float *alpha, __global const v_t *v,
                                                                   const ulong *v_base, ulong v_s3,
                                                                   const float *v_sc, int n, const bool guarded,
                                                                   const int bm, int c, const int w) {
  float16 a[2][FLASH_BM_MAX];
#pragma unroll
  for (int u = 0; u < w; u++)
#pragma unroll
    for (int r = 0; r < bm; r++) a[u][r] = vload16(0, acc[r] + c + 16 * u) * alpha[r];
  for (int jj = 0; jj < n; jj++) {
    float16 vv[2];
#pragma unroll
    for (int u = 0; u < w; u++) vv[u] = ca_v_load16(v, v_base[jj], v_s3, c + 16 * u, v_sc[jj]);
#pragma unroll
    for (int r = 0; r < bm; r++) {
      const float16 pw = (float16)(p[r][jj]);
      const bool use = !guarded || p[r][jj] != 0.0f;
#pragma unroll
      for (int u = 0; u < w; u++) a[u][r] = use ? fma(pw, vv[u], a[u][r]) : a[u][r];
    }
  }
#pragma unroll
  for (int u = 0; u < w; u++)
#pragma unroll
    for (int r = 0; r < bm; r++) vstore16(a[u][r], 0, acc[r] + c + 16 * u);
}

/* All DVP columns: two slices a pass, one for a last 16. */
static inline __attribute__((always_inline)) void flash_mix_direct(float (*acc)[DVP], float (*p)[FLASH_BN],
                                                                   const float *alpha, __global const v_t *v,
                                                                   const ulong *v_base, ulong v_s3,
                                                                   const float *v_sc, int n, const bool guarded,
                                                                   const int bm) {
  for (int c = 0; c + 32 <= DVP; c += 32) flash_mix_slices(acc, p, alpha, v, v_base, v_s3, v_sc, n, guarded, bm, c, 2);
#if DVP % 32 != 0
  flash_mix_slices(acc, p, alpha, v, v_base, v_s3, v_sc, n, guarded, bm, DVP - 16, 1);
#endif
}

/* One row's weights over a block from its scaled scores x0, x1 (a
 * disallowed key's -inf): its running maximum *m moves to m_new and the
 * weights exp(x - m_new) go to p_row, their sums in lanes to *p_sum; the
 * old maximum and the one subtracted stay for the rows' rescaling. */
static inline __attribute__((always_inline)) void flash_row_weights(const flash_vec x0, const flash_vec x1, float *m,
                                                                    float *m_old, float *m_sub, flash_vec *p_sum,
                                                                    float *p_row, flash_ivec *zero_lanes) {
  const float m_new = fmax(*m, flash_hmax(fmax(x0, x1)));
  const float m_safe = m_new == -INFINITY ? 0.0f : m_new; /* no -inf - -inf */
  const flash_vec pr0 = flash_exp_le0(x0 - m_safe), pr1 = flash_exp_le0(x1 - m_safe);
  *m_old = *m;
  *m_sub = m_safe;
  *m = m_new;
  *p_sum = pr0 + pr1;
  *zero_lanes |= isequal(pr0, (flash_vec)(0.0f)) | isequal(pr1, (flash_vec)(0.0f));
  flash_vstore(pr0, 0, p_row);
  flash_vstore(pr1, 0, p_row + FLASH_VW);
}

/*
 * The fused kernel's body, shared by flash_rows (packed K^T / V) and
 * flash_rows_direct* (K and V read in place). Each work-item keeps bm
 * query rows, their running (m, l) and their DVP-wide accumulators in
 * private memory and walks the keys in blocks of FLASH_BN = 2 FLASH_VW:
 * a bm x FLASH_BN register tile of scores, two vectors per row, so each
 * query value (and each weight, for the values) is loaded once for two
 * vector multiply-adds. `direct` and `bm` are constants at each call, so
 * each kernel compiles to one branch with its row loops unrolled and its
 * accumulators in registers. always_inline: POCL builds with -Dinline=, and
 * the copy of the body it then kept for itself failed to unroll those
 * loops, with eleven warnings on stderr at every build.
 */
static inline __attribute__((always_inline)) void flash_body(FLASH_PARAMS, const int direct, const int bm) {
  FLASH_UNPACK
  const int rows_per_kv = group * q_len;
  const int t0 = get_global_id(0) * bm;
  const int bhk = get_global_id(1);
  const int split = get_global_id(2), n_splits = get_global_size(2);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n_valid = sq.keys;
  if (t0 >= rows_per_kv) return;

  float qr[FLASH_BM_MAX][DK];  /* direct mode needs DK % 16 == 0 */
  float acc[FLASH_BM_MAX][DVP];
  float m[FLASH_BM_MAX], tsum[FLASH_BM_MAX];
  flash_vec l_lanes[FLASH_BM_MAX]; /* each row's running l lane by lane, summed across at its end */
  int hs[FLASH_BM_MAX], is[FLASH_BM_MAX], best[FLASH_BM_MAX];
  int lo_min = INT_MAX, lo_max = 0, hi_min = INT_MAX, hi_max = -1;
  for (int r = 0; r < bm; r++) {
    int t = min(t0 + r, rows_per_kv - 1); /* padding rows repeat the last row, never written */
    hs[r] = hk * group + t / q_len;
    is[r] = t % q_len;
    for (int d = 0; d < DK; d++)   /* a row past a packed sequence's end does not exist */
      qr[r][d] = is[r] < sq.rows ? ca_load(q, ca_at(q_off, q_st, b, hs[r], sq.q0 + is[r], d)) : 0.0f;
    for (int c = 0; c < DVP; c++) acc[r][c] = 0.0f;
    m[r] = -INFINITY;
    l_lanes[r] = (flash_vec)(0.0f);
    tsum[r] = 0.0f;
    best[r] = -1;
    int2 keys = flash_row_keys(is[r], sq.align_m, sq.align_n, n_valid, window_left, window_right);
    lo_min = min(lo_min, keys.x);
    lo_max = max(lo_max, keys.x);
    hi_min = min(hi_min, keys.y);
    hi_max = max(hi_max, keys.y);
  }

#ifdef CA_MOD_MASK
  long bm_rows[FLASH_BM_MAX]; /* where each row's block-mask classes begin */
  for (int r = 0; r < bm; r++) bm_rows[r] = ca_bm_row(mod, b, hs[r], is[r], sq);
#endif
  /* Key positions in 64 bits: near kv_len = INT_MAX a split's end and the
   * next block's start pass 2^31 - 1. */
  const long split_begin = (long)split * split_keys;
  const long split_end = min((long)kv_len, split_begin + split_keys);
  const long j_begin = max(split_begin, (long)lo_min) / FLASH_BN * FLASH_BN;
  const long j_end = min(split_end, (long)hi_max + 1);
  const ulong kt_head = (ulong)bhk * DK * (ulong)n_pad;
  const ulong vp_head = (ulong)bhk * (ulong)n_pad * DVP;

  /* Pages holding whole half blocks (half blocks start at k0 plus
   * multiples of FLASH_VW; paged calls have no packed keys, and k0 is 0 but
   * for a left-padded row): direct mode locates each half block once, not
   * each key (a division each). */
  const bool page_halves = direct && paged && page_size % FLASH_VW == 0 && sq.k0 % FLASH_VW == 0;
  for (long j0 = j_begin; j0 < j_end; j0 += FLASH_BN) {
    /* The block mask: a block the mask modifier allows no pair of is
     * skipped, one it allows every pair of skips evaluating it. */
#ifdef CA_MOD_MASK
    const int bm_cls = ca_bm_rows_class(bm_class, mod, bm_rows, bm, j0, j0 + FLASH_BN - 1);
    if (bm_cls == CA_BM_EMPTY) continue;
    /* In a partial block, the modifier's verdicts first, once per pair: a
     * tile it allows none of is skipped as well (the rows of a causal
     * mask's diagonal blocks past their own position). */
    uchar mod_ok[FLASH_BM_MAX][FLASH_BN];
    if (bm_cls == CA_BM_PARTIAL) {
      bool any = false;
      for (int r = 0; r < bm; r++) {
        const int2 keys = flash_row_keys(is[r], sq.align_m, sq.align_n, n_valid, window_left, window_right);
        for (int jj = 0; jj < FLASH_BN; jj++) {
          const long j = j0 + jj;
          const bool ok = j >= keys.x && j <= keys.y && j >= split_begin && j < split_end &&
                          CA_MOD_ALLOWS(b, hs[r], is[r], j, sq);
          mod_ok[r][jj] = ok;
          any = any || ok;
        }
      }
      if (!any) continue;
    }
#else
    const int bm_cls = CA_BM_FULL;
#endif
    /* The block's bias, as stored (each row scales its own), read before
     * its scores: a block that every row's bias disallows (an engine's
     * causal mask above the diagonal, its padding) is skipped like a block
     * outside the window, and rows under one bias row (heads of a group
     * under a mask broadcast over heads) read it once. */
    float bias_raw[FLASH_BM_MAX][FLASH_BN];
    if (has_bias) {
      bool live = false;
      ulong prev_row = ~(ulong)0;
      for (int r = 0; r < bm; r++) {
        const ulong row_at = ca_at(bias_off, bias_st, b, hs[r], is[r], 0);
        for (int jj = 0; jj < FLASH_BN; jj++) {
          const long j = j0 + jj;
          bias_raw[r][jj] = row_at == prev_row ? bias_raw[r - 1][jj]
                            : j < kv_len      ? ca_bias_raw(CA_BIAS_PASS, row_at + (ulong)j * bias_st.s3)
                                              : -INFINITY;
          live = live || bias_raw[r][jj] != -INFINITY;
        }
        prev_row = row_at;
      }
      if (!live) continue;
    }
    flash_vec s0[FLASH_BM_MAX], s1[FLASH_BM_MAX];   /* keys j0 .. j0+VW-1, j0+VW .. j0+BN-1 */
    /* with page_halves, key j0 + jj is row at_h[h].row + jj % FLASH_VW of
     * page at_h[h].slot (h = jj / FLASH_VW): keys past n_valid then read
     * rows of that page (or of page 0), never used */
    ca_kv_pos at_h[2] = {{0, 0, true}, {0, 0, true}};
    if (page_halves) {
      at_h[0] = ca_kv_locate(b, sq.k0 + j0, CA_PAGE_PASS);
      at_h[1] = ca_kv_locate(b, sq.k0 + j0 + FLASH_VW, CA_PAGE_PASS);
    }
#ifdef CA_PREFETCH
    /* Where the next block's half blocks lie: their key and value rows are
     * asked for key by key while this block's are used. */
    ca_kv_pos ahead[2] = {{0, 0, false}, {0, 0, false}};
    if (direct && (page_halves || !paged))
      for (int h = 0; h < 2; h++) {
        const long key = j0 + FLASH_BN + h * FLASH_VW;
        if (key < j_end) ahead[h] = ca_kv_locate(b, sq.k0 + key, CA_PAGE_PASS);
      }
#endif
    if (!direct) {
      /* Scores: bm x FLASH_BN outer products over the head dimension, the
       * 2 bm accumulators held in registers (the loops over r unroll); the
       * block's K^T rows lie one after another. */
#pragma unroll
      for (int r = 0; r < bm; r++) s0[r] = s1[r] = (flash_vec)(0.0f);
      __global const float *kt_block = kt + kt_head + (ulong)j0 * DK;
      if (additive)
        for (int d = 0; d < DK; d++) {
          const flash_vec k0 = flash_vload(0, kt_block + d * FLASH_BN);
          const flash_vec k1 = flash_vload(0, kt_block + d * FLASH_BN + FLASH_VW);
          const flash_vec wd = (flash_vec)(add_w[d]);
#pragma unroll
          for (int r = 0; r < bm; r++) {
            const flash_vec qd = (flash_vec)(qr[r][d]);
            s0[r] = fma(wd, tanh(qd + k0), s0[r]);
            s1[r] = fma(wd, tanh(qd + k1), s1[r]);
          }
        }
      else
        for (int d = 0; d < DK; d++) {
          const flash_vec k0 = flash_vload(0, kt_block + d * FLASH_BN);
          const flash_vec k1 = flash_vload(0, kt_block + d * FLASH_BN + FLASH_VW);
#ifdef CA_PREFETCH
          if (FLASH_PREFETCH_ROLLING) {
            if (d + FLASH_BN < DK) flash_prefetch_step(kt_block + (d + FLASH_BN) * FLASH_BN);
            else flash_prefetch_step(vp + vp_head + ((ulong)j0 + d + FLASH_BN - DK) * DVP);
          } else {
            /* the block's packed values, a share per step */
#pragma unroll
            for (int u = 0; u < FLASH_V_LINES_PER_D; u++)
              if ((d * FLASH_V_LINES_PER_D + u) * 64 < FLASH_BN * DVP * 4)
                ca_prefetch_line((__global const uchar *)(vp + vp_head + (ulong)j0 * DVP) +
                                 (d * FLASH_V_LINES_PER_D + u) * 64);
          }
#endif
#pragma unroll
          for (int r = 0; r < bm; r++) {
            const flash_vec qd = (flash_vec)(qr[r][d]);
            s0[r] = fma(qd, k0, s0[r]);
            s1[r] = fma(qd, k1, s1[r]);
          }
        }
    } else {
      /* Scores as dot products with each key row read in place (DK % 16 == 0,
       * unit column stride); keys past kv_len are not read. */
      float e[FLASH_BM_MAX][FLASH_BN];
#if FLASH_BN % 16 == 0
      float16 half_sums[FLASH_BM_MAX][8], even_dot[FLASH_BM_MAX];
#endif
      for (int jj = 0; jj < FLASH_BN; jj++) {
        const long j = j0 + jj;
        const ca_kv_pos at = flash_key_at(at_h, page_halves, b, sq.k0 + min(j, (long)n_valid - 1), jj, CA_PAGE_PASS);
        const ulong krow = ca_at(k_off, k_st, at.slot, hk, at.row, 0);
        const float ks = ca_k_scale(k_scale, k_scale_off, k_scale_st, at, hk);
#ifdef CA_PREFETCH
        if (ahead[jj / FLASH_VW].ok && j + FLASH_BN < j_end) {
          const ca_kv_pos a = ahead[jj / FLASH_VW];
          const long row = a.row + jj % FLASH_VW;
          ca_prefetch((__global const uchar *)(k + ca_at(k_off, k_st, a.slot, hk, row, 0)),
                      ca_dt_row_bytes(CA_K_DTYPE, DK, k_st.s3));
          ca_prefetch((__global const uchar *)(v + ca_at(v_off, v_st, a.slot, hk, row, 0)),
                      ca_dt_row_bytes(CA_V_DTYPE, DV, v_st.s3));
        }
#endif
        /* each 16 columns of the key loaded (and dequantised) once for all
         * the rows; every row's sum keeps its order */
        float16 dot[FLASH_BM_MAX];
#pragma unroll
        for (int r = 0; r < bm; r++) dot[r] = (float16)(0.0f);
        /* two slices a step: a block type's 32 columns share one scale,
         * loaded and converted once (Q8_0's decode 0.89x the time) */
#pragma unroll 2
        for (int d = 0; d < DK; d += 16) {
          const float16 kd = ca_k_load16(k, krow, k_st.s3, d, ks);
          if (additive) {
            const float16 wd = vload16(0, add_w + d);
#pragma unroll
            for (int r = 0; r < bm; r++) dot[r] = fma(wd, tanh(vload16(0, qr[r] + d) + kd), dot[r]);
          } else {
#pragma unroll
            for (int r = 0; r < bm; r++) dot[r] = fma(vload16(0, qr[r] + d), kd, dot[r]);
          }
        }
#if FLASH_BN % 16 == 0
        /* the dots of 16 keys summed together: first halvings by pairs */
        if (jj % 2 == 0) {
#pragma unroll
          for (int r = 0; r < bm; r++) even_dot[r] = dot[r];
        } else {
#pragma unroll
          for (int r = 0; r < bm; r++)
            half_sums[r][jj % 16 / 2] =
                (float16)(even_dot[r].lo, dot[r].lo) + (float16)(even_dot[r].hi, dot[r].hi);
        }
        if (jj % 16 == 15) {
#pragma unroll
          for (int r = 0; r < bm; r++) vstore16(flash_hsum16_keys(half_sums[r]), 0, e[r] + jj - 15);
        }
#else
#pragma unroll
        for (int r = 0; r < bm; r++) e[r][jj] = flash_hsum16(dot[r]);
#endif
      }
#pragma unroll
      for (int r = 0; r < bm; r++) {
        s0[r] = flash_vload(0, e[r]);
        s1[r] = flash_vload(0, e[r] + FLASH_VW);
      }
    }
    /* Every key of the block allowed for every row, inside this split? */
    const bool full = !has_mask && j0 >= lo_max && j0 + FLASH_BN - 1 <= hi_min &&
                      j0 >= split_begin && j0 + FLASH_BN <= split_end &&
#ifdef CA_MOD_MASK
                      bm_cls == CA_BM_FULL &&
#endif
                      (page_halves ? at_h[0].ok && at_h[1].ok : ca_kv_rows_ok(b, sq.k0 + j0, FLASH_BN, CA_PAGE_PASS));
    /* an element-wise pass is needed (a score modifier applies per key);
     * else the bias may add in whole vectors */
#ifdef CA_MOD_SCORE
    const bool per_key = true, bias_vectors = false;
#else
    const bool per_key = !full || has_bias || has_alibi, bias_vectors = full && has_bias && !has_alibi;
#endif
    float p[FLASH_BM_MAX][FLASH_BN], alpha[FLASH_BM_MAX];
    /* each row's maximum before the block, the one subtracted, its weights'
     * sums (in lanes: no sum across a vector per block) */
    float m_old[FLASH_BM_MAX] = {0}, m_sub[FLASH_BM_MAX] = {0};
    flash_vec p_sum[FLASH_BM_MAX];
    flash_ivec zero_lanes = (flash_ivec)(0);   /* lanes where some row's weight is exactly 0 */
    if (!direct && !per_key && !bias_vectors && !(softcap > 0.0f) && !diag) {
      /* the scores as they are (prefill, packed keys): the rows' loop
       * unrolled, so that their chains (maximum, then exponentials)
       * interleave (1.03-1.10x as fast on the 2-core Xeon; the whole loop
       * unrolled built 1.3x as slowly). Not in the direct kernels: decode
       * gained nothing measurable, and each of their twelve entries built
       * the unrolled copy too (cold builds of a prefill and a decode
       * program 1.05x as long). */
#pragma unroll
      for (int r = 0; r < bm; r++)
        flash_row_weights(s0[r] * scale, s1[r] * scale, &m[r], &m_old[r], &m_sub[r], &p_sum[r], p[r], &zero_lanes);
    } else {
      for (int r = 0; r < bm; r++) {
        flash_vec x0 = s0[r] * scale, x1 = s1[r] * scale;
        if (softcap > 0.0f) {
          x0 = softcap * tanh(x0 / softcap);
          x1 = softcap * tanh(x1 / softcap);
        }
        if (bias_vectors) {
          /* every key allowed but for the bias: it adds in whole vectors, a
           * -inf entry disallowing its key whatever the score (a NaN key's) */
          const flash_vec b0 = flash_vload(0, bias_raw[r]), b1 = flash_vload(0, bias_raw[r] + FLASH_VW);
          const float bs = (has_bias & CA_BIAS_SCALED) ? bias_scale[hs[r]] : 1.0f;
          const flash_vec none = (flash_vec)(-INFINITY);
          x0 = select(x0 + b0 * bs, none, isequal(b0, none));
          x1 = select(x1 + b1 * bs, none, isequal(b1, none));
        } else if (per_key) {
          float e[FLASH_BN];
          flash_vstore(x0, 0, e);
          flash_vstore(x1, 0, e + FLASH_VW);
          const int2 keys = flash_row_keys(is[r], sq.align_m, sq.align_n, n_valid, window_left, window_right);
          for (int jj = 0; jj < FLASH_BN; jj++) {
            const long j = j0 + jj;
            bool allowed = j >= keys.x && j <= keys.y && j >= split_begin && j < split_end;
            if (allowed && paged) /* page in the pool */
              allowed = page_halves ? at_h[jj / FLASH_VW].ok : ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok;
            if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, hs[r], is[r], j)] != 0;
#ifdef CA_MOD_MASK
            if (allowed && bm_cls != CA_BM_FULL) allowed = mod_ok[r][jj];
#endif
            if (allowed && is[r] < sq.rows)
              e[jj] = CA_MOD_SCORE_AT(e[jj], b, hs[r], is[r], j, sq.align_m, sq.align_n);
            if (allowed && has_bias) {
              allowed = bias_raw[r][jj] != -INFINITY;
              e[jj] += ca_bias_scaled(bias_raw[r][jj], has_bias, bias_scale, hs[r]);
            }
            if (allowed && has_alibi)
              e[jj] += ca_alibi(is[r], j, sq.align_m, sq.align_n, ca_alibi_slope(alibi, alibi_bstride, b, hs[r]));
            e[jj] = allowed ? e[jj] : -INFINITY;
          }
          x0 = flash_vload(0, e);
          x1 = flash_vload(0, e + FLASH_VW);
        }
        flash_row_weights(x0, x1, &m[r], &m_old[r], &m_sub[r], &p_sum[r], p[r], &zero_lanes);
        if (diag)
          flash_diag_block(x0, x1, flash_vload(0, p[r]), flash_vload(0, p[r] + FLASH_VW), m_old[r],
                           flash_hsum(l_lanes[r]), flash_exp_le0(m_old[r] - m_sub[r]), m_sub[r], j0, &tsum[r],
                           &best[r]);
      }
    }
    /* every row's rescaling by one vector exponential: exp(0) is exactly 1
     * (an unchanged maximum), exp(-inf) 0 (a row's first allowed keys) */
    vstore16(flash_exp_le0(vload16(0, m_old) - vload16(0, m_sub)), 0, alpha);
#pragma unroll
    for (int r = 0; r < bm; r++) l_lanes[r] = fma((flash_vec)(alpha[r]), l_lanes[r], p_sum[r]);
#ifdef CA_DROPOUT
    /* dropout: the weights that mix V lose their dropped keys (l above
     * summed every weight) */
    for (int r = 0; r < bm; r++)
      for (int jj = 0; jj < FLASH_BN; jj += 4)
        vstore4(vload4(0, p[r] + jj) * ca_dropout4(dropout, b, hs[r], is[r], (j0 + jj) >> 2), 0, p[r] + jj);
    const bool guard = true; /* dropped weights are 0 */
#else
    const bool guard = !full || any(zero_lanes); /* an allowed key's weight underflowed to exactly 0 */
#endif
    /* Values: per slice of columns, rescale the bm accumulators once, then
     * add the block's weighted value rows (only keys below kv_len are read).
     * A zero weight (disallowed, underflowed or dropped) mixes nothing in,
     * even a NaN or Inf value: without one, no guard is needed. */
    const int n_block = guard ? (int)min((long)FLASH_BN, n_valid - j0) : FLASH_BN;
    if (!direct) {
      /* two vectors of columns per step: each weight feeds two multiply-adds */
      __global const float *v_block = vp + vp_head + (ulong)j0 * DVP;
      for (int c = 0; c + 2 * FLASH_VW <= DVP; c += 2 * FLASH_VW) {
        flash_vec a0[FLASH_BM_MAX], a1[FLASH_BM_MAX];
#pragma unroll
        for (int r = 0; r < bm; r++) {
          a0[r] = flash_vload(0, acc[r] + c) * alpha[r];
          a1[r] = flash_vload(0, acc[r] + c + FLASH_VW) * alpha[r];
        }
        if (!guard) {
          for (int jj = 0; jj < FLASH_BN; jj++) {
            const flash_vec v0 = flash_vload(0, v_block + jj * DVP + c);
            const flash_vec v1 = flash_vload(0, v_block + jj * DVP + c + FLASH_VW);
#ifdef CA_PREFETCH
            if (FLASH_PREFETCH_ROLLING) {
              if (c + 2 * FLASH_VW < DVP) flash_prefetch_step(v_block + jj * DVP + c + 2 * FLASH_VW);
              else if (j0 + FLASH_BN < j_end)
                flash_prefetch_step(kt + kt_head + (ulong)(j0 + FLASH_BN) * DK + jj * FLASH_BN);
            } else if (j0 + FLASH_BN < j_end) {
              /* the next block's packed keys, a share per step */
              const int line = (c / (2 * FLASH_VW) * FLASH_BN + jj) * FLASH_K_LINES_PER_KEY;
#pragma unroll
              for (int u = 0; u < FLASH_K_LINES_PER_KEY; u++)
                if ((line + u) * 64 < FLASH_BN * DK * 4)
                  ca_prefetch_line((__global const uchar *)(kt + kt_head + (ulong)(j0 + FLASH_BN) * DK) +
                                   (line + u) * 64);
            }
#endif
#pragma unroll
            for (int r = 0; r < bm; r++) {
              const flash_vec w = (flash_vec)(p[r][jj]);
              a0[r] = fma(w, v0, a0[r]);
              a1[r] = fma(w, v1, a1[r]);
            }
          }
        } else {
          for (int jj = 0; jj < n_block; jj++) {
            const flash_vec v0 = flash_vload(0, v_block + jj * DVP + c);
            const flash_vec v1 = flash_vload(0, v_block + jj * DVP + c + FLASH_VW);
#pragma unroll
            for (int r = 0; r < bm; r++) {
              const flash_vec w = (flash_vec)(p[r][jj]);
              const bool use = p[r][jj] != 0.0f;
              a0[r] = use ? fma(w, v0, a0[r]) : a0[r];
              a1[r] = use ? fma(w, v1, a1[r]) : a1[r];
            }
          }
        }
#pragma unroll
        for (int r = 0; r < bm; r++) {
          flash_vstore(a0[r], 0, acc[r] + c);
          flash_vstore(a1[r], 0, acc[r] + c + FLASH_VW);
        }
      }
#if DVP % (2 * FLASH_VW) != 0
      { /* the last FLASH_VW columns, one vector */
        const int c = DVP - FLASH_VW;
        flash_vec a0[FLASH_BM_MAX];
#pragma unroll
        for (int r = 0; r < bm; r++) a0[r] = flash_vload(0, acc[r] + c) * alpha[r];
        for (int jj = 0; jj < n_block; jj++) {
          const flash_vec v0 = flash_vload(0, v_block + jj * DVP + c);
#pragma unroll
          for (int r = 0; r < bm; r++)
            a0[r] = !guard || p[r][jj] != 0.0f ? fma((flash_vec)(p[r][jj]), v0, a0[r]) : a0[r];
        }
#pragma unroll
        for (int r = 0; r < bm; r++) flash_vstore(a0[r], 0, acc[r] + c);
      }
#endif
    } else {
      /* each key's value row, located once per block, read in place 16 columns at a time */
      ulong v_base[FLASH_BN];
      float v_sc[FLASH_BN];
      for (int jj = 0; jj < FLASH_BN; jj++) {
        const ca_kv_pos at =
            flash_key_at(at_h, page_halves, b, sq.k0 + min(j0 + jj, (long)n_valid - 1), jj, CA_PAGE_PASS);
        v_base[jj] = ca_at(v_off, v_st, at.slot, hk, at.row, 0);
        v_sc[jj] = ca_v_scale(v_scale, v_scale_off, v_scale_st, at, hk);
      }
      if (guard)
        flash_mix_direct(acc, p, alpha, v, v_base, v_st.s3, v_sc, n_block, true, bm);
      else
        flash_mix_direct(acc, p, alpha, v, v_base, v_st.s3, v_sc, FLASH_BN, false, bm);
    }
  }

  for (int r = 0; r < bm && t0 + r < rows_per_kv; r++)
    if (is[r] < sq.rows)
      flash_store_row(acc[r], m[r], flash_hsum(l_lanes[r]), tsum[r], best[r], ca_sink(sinks, sinks_at, hs[r]), b,
                      hs[r], is[r], sq.q0 + is[r], q_heads, kv_heads, q_len, split, n_splits,
                      out, out_off, out_st, lse, lse_off, lse_st, want_lse, CA_DIAG_PASS, part_o, part_lse,
                      empty_flag);
}

/*
 * flash_rows — the fused kernel over packed K^T / V (flash_pack): scores as
 * outer products, FLASH_VW keys per vector; any head dims and strides.
 * flash_rows_direct{1,2,4,8} — the same over K and V read in place with 1,
 * 2, 4 or 8 rows per work-item, for calls with few rows per KV head
 * (decode), where packing would cost more than it saves; they need DK and
 * DV multiples of 16 and unit column strides.
 * NDRange: (ceil(group * q_len / rows per work-item), batch * kv_heads, n_splits);
 * work-group (1, 1, 1) — each work-item is an independent task.
 */
#ifndef FLASH_NO_ROWS
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_rows(FLASH_PARAMS) {
  flash_body(FLASH_PASS, 0, FLASH_BM);
}

/* Only where the host can use them (vector loads of whole rows): building
 * them for other head dims would only cost compile time. */
#if DK % 16 == 0 && DV % 16 == 0
#define FLASH_DIRECT_KERNEL(bm)                                                                       \
  __kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_rows_direct##bm(FLASH_PARAMS) {    \
    flash_body(FLASH_PASS, 1, bm);                                                                    \
  }                                                                                                   \
  __kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_rows_direct##bm##_core(          \
      CA_PARAMS(flash_core, args)) {                                                                  \
    flash_body(FLASH_CORE_PASS, 1, bm);                                                               \
  }                                                                                                   \
  __kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_rows_direct##bm##_step(          \
      CA_PARAMS(flash_step, args)) {                                                                  \
    CA_WIDEN(flash_core, flash_step, args)                                                            \
    flash_body(CA_PASS_WIDE(flash_step, flash_rest, args), CA_ABSENT(flash_extra), 1, bm);            \
  }
FLASH_DIRECT_KERNEL(1)
FLASH_DIRECT_KERNEL(2)
FLASH_DIRECT_KERNEL(4)
FLASH_DIRECT_KERNEL(8)
#endif
#endif /* FLASH_NO_ROWS */

/*
 * flash_tiled — the fused kernel for GPUs: a work-group of FLASH_WG
 * work-items takes FLASH_WG consecutive rows of one KV head (one row each)
 * and walks the keys in tiles of FLASH_TILE, each tile of K and V staged in
 * local memory once for the whole group (coalesced reads; every row then
 * reads the tile as a broadcast). Per row: scores of the tile in private
 * memory, the tile's maximum, one rescale of the accumulator per tile.
 * NDRange: (ceil(group * q_len / FLASH_WG) * FLASH_WG, batch * kv_heads,
 * n_splits); work-group (FLASH_WG, 1, 1). Same arguments as flash_rows.
 * -D FLASH_WG, FLASH_TILE (keys per tile; local memory is
 * FLASH_TILE * (DK + DV) floats).
 */
#ifndef FLASH_WG
#define FLASH_WG 64
#endif
#ifndef FLASH_TILE
#define FLASH_TILE 32
#endif

#ifndef FLASH_NO_TILED
__kernel __attribute__((reqd_work_group_size(FLASH_WG, 1, 1))) void flash_tiled(FLASH_PARAMS) {
  __local float k_tile[FLASH_TILE][DK];
  __local float v_tile[FLASH_TILE][DV];
  __local int range[2];
#ifdef CA_MOD_MASK
  __local int bm_flags;
#endif
  FLASH_UNPACK
  const int lid = get_local_id(0);
  const int rows_per_kv = group * q_len;
  const int t = get_global_id(0);
  const int bhk = get_global_id(1);
  const int split = get_global_id(2), n_splits = get_global_size(2);
  const int b = bhk / kv_heads, hk = bhk % kv_heads;
  const ca_seq sq = ca_sequence(b, q_len, kv_len, CA_SEQ_PASS);
  const int n_valid = sq.keys;
  const int tr = min(t, rows_per_kv - 1);
  const int h = hk * group + tr / q_len, i = tr % q_len;
  /* padding items, and rows past a packed sequence's end, join the loads and barriers only */
  const bool live = t < rows_per_kv && i < sq.rows;

  float qr[DK], acc[DV];
  for (int d = 0; d < DK; d++) qr[d] = live ? ca_load(q, ca_at(q_off, q_st, b, h, sq.q0 + i, d)) : 0.0f;
  for (int c = 0; c < DV; c++) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f, t_diag = 0.0f;
  int best = -1;
  const int2 keys = flash_row_keys(i, sq.align_m, sq.align_n, n_valid, window_left, window_right);

  /* The group's key range: the union of its rows' ranges. */
  if (lid == 0) {
    range[0] = INT_MAX;
    range[1] = -1;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (live && keys.x <= keys.y) {
    atomic_min(&range[0], keys.x);
    atomic_max(&range[1], keys.y);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const long split_begin = (long)split * split_keys;   /* 64 bits: see flash_body */
  const long split_end = min((long)kv_len, split_begin + split_keys);
  const long j_begin = max(split_begin, (long)range[0]) / FLASH_TILE * FLASH_TILE;
  const long j_end = min(split_end, (long)range[1] + 1);

  for (long j0 = j_begin; j0 < j_end; j0 += FLASH_TILE) {
#ifdef CA_MOD_MASK /* the block mask: a tile no row may see is skipped */
    const int tile_cls = ca_bm_group_class(&bm_flags, live, bm_class, mod, b, h, i, j0, j0 + FLASH_TILE - 1, sq);
    if (tile_cls == CA_BM_EMPTY) continue;
#else
    const int tile_cls = CA_BM_FULL;
#endif
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile is consumed */
    for (int e = lid; e < FLASH_TILE * DK; e += FLASH_WG) {
      const int jj = e / DK, d = e % DK;
      const long j = j0 + jj;
      k_tile[jj][d] = j < n_valid ? ca_k_get(k, k_off, k_st, k_scale, k_scale_off, k_scale_st, b, hk, sq.k0 + j, d, CA_PAGE_PASS)
                                  : 0.0f;
    }
    for (int e = lid; e < FLASH_TILE * DV; e += FLASH_WG) {
      const int jj = e / DV, c = e % DV;
      const long j = j0 + jj;
      v_tile[jj][c] = j < n_valid ? ca_v_get(v, v_off, v_st, v_scale, v_scale_off, v_scale_st, b, hk, sq.k0 + j, c, CA_PAGE_PASS)
                                  : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[FLASH_TILE];
    float tile_max = -INFINITY;
    for (int jj = 0; jj < FLASH_TILE; jj++) {
      const long j = j0 + jj;
      bool allowed = j >= keys.x && j <= keys.y && j >= split_begin && j < split_end;
#if CA_MOD_ANY
      allowed = allowed && live; /* the modifiers see the sequence's pairs only */
#endif
      if (allowed && paged) allowed = ca_kv_locate(b, sq.k0 + j, CA_PAGE_PASS).ok; /* page in the pool */
      if (allowed && has_mask) allowed = mask[ca_at(mask_off, mask_st, b, h, i, j)] != 0;
      if (allowed && tile_cls != CA_BM_FULL) allowed = CA_MOD_ALLOWS(b, h, i, j, sq);
      const float bias_ij = allowed && has_bias ? ca_bias(CA_BIAS_PASS, b, h, i, j) : 0.0f;
      allowed = allowed && bias_ij != -INFINITY;
      float x = -INFINITY;
      if (allowed) {
        float dot = 0.0f;
        if (additive)
          for (int d = 0; d < DK; d++) dot += add_w[d] * tanh(qr[d] + k_tile[jj][d]);
        else
          for (int d = 0; d < DK; d++) dot += qr[d] * k_tile[jj][d];
        x = ca_shape(scale * dot, bias_ij, b, h, i, j, sq.align_m, sq.align_n, CA_SHAPE_PASS);
      }
      s[jj] = x;
      tile_max = fmax(tile_max, x);
    }
    const float m_new = fmax(m, tile_max);
    const float m_safe = m_new == -INFINITY ? 0.0f : m_new; /* no -inf - -inf */
    const float alpha = exp(m - m_safe);
    float tile_sum = 0.0f, tile_t = 0.0f;
    for (int c = 0; c < DV; c++) acc[c] *= alpha;
    if (diag && tile_max > m)   /* the first key at the new maximum; ties keep the earlier */
      for (int jj = FLASH_TILE - 1; jj >= 0; jj--)
        if (s[jj] == tile_max) best = (int)(j0 + jj);
    for (int jj = 0; jj < FLASH_TILE; jj++) {
      const float p = exp(s[jj] - m_safe);
      tile_sum += p;
      if (diag && p != 0.0f) tile_t += p * (s[jj] - m_safe);
#ifdef CA_DROPOUT
      const float w = p * ca_dropout(dropout, b, h, i, j0 + jj); /* the weight that mixes V */
#else
      const float w = p;
#endif
      /* a zero weight mixes nothing in */
      if (w != 0.0f)
        for (int c = 0; c < DV; c++) acc[c] += w * v_tile[jj][c];
    }
    if (diag) t_diag = (l == 0.0f ? 0.0f : alpha * (t_diag + l * (m - m_safe))) + tile_t;
    l = l * alpha + tile_sum;
    m = m_new;
  }
  if (live)
    flash_store_row(acc, m, l, t_diag, best, ca_sink(sinks, sinks_at, h), b, h, i, sq.q0 + i, q_heads, kv_heads,
                    q_len, split,
                    n_splits, out, out_off, out_st, lse, lse_off, lse_st, want_lse, CA_DIAG_PASS, part_o, part_lse,
                    empty_flag);
}
#endif /* FLASH_NO_TILED */
