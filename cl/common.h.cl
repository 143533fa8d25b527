/*
 * Helpers shared by every clattn kernel. The host prepends this file to each
 * program's sources.
 *
 * Views: a tensor is (offset, stride.s0..s3) in elements over a buffer,
 * indexed [batch, head, row, column]. All index arithmetic is 64-bit.
 */

/* Storage of q, k, v and out: -D CA_DTYPE 0 f32, 1 f16 (vload_half /
 * vstore_half_rte, core OpenCL 1.2), 2 bf16 (16-bit patterns, stored with
 * round-to-nearest-even). Arithmetic is f32 throughout. */
#ifndef CA_DTYPE
#define CA_DTYPE 0
#endif
#if CA_DTYPE == 0
typedef float store_t;
static inline float ca_load(__global const store_t *p, ulong i) { return p[i]; }
static inline void ca_store(__global store_t *p, ulong i, float v) { p[i] = v; }
static inline float16 ca_load16(__global const store_t *p) { return vload16(0, p); }
#elif CA_DTYPE == 1
typedef half store_t;
static inline float ca_load(__global const store_t *p, ulong i) { return vload_half(0, p + i); }
static inline void ca_store(__global store_t *p, ulong i, float v) { vstore_half_rte(v, 0, p + i); }
static inline float16 ca_load16(__global const store_t *p) { return vload_half16(0, p); }
#else
typedef ushort store_t;
static inline float ca_load(__global const store_t *p, ulong i) { return as_float((uint)p[i] << 16); }
static inline void ca_store(__global store_t *p, ulong i, float v) {
  uint u = as_uint(v);
  u = isnan(v) ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  p[i] = (ushort)(u >> 16);
}
static inline float16 ca_load16(__global const store_t *p) { return as_float16(convert_uint16(vload16(0, p)) << 16); }
#endif

/* Element index of [b, h, r, c] in a view. */
static inline ulong ca_at(ulong offset, ulong4 stride, long b, long h, long r, long c) {
  return offset + (ulong)b * stride.s0 + (ulong)h * stride.s1 + (ulong)r * stride.s2 + (ulong)c * stride.s3;
}

/* ---- K/V storage: -D CA_K_DTYPE (keys) and -D CA_V_DTYPE (values), each
 * 0 f32, 1 f16, 2 bf16, 3 Q8_0, 4 INT8, 5 Q4_0, 6 Q4_1, 7 Q5_0, 8 Q5_1,
 * 9 IQ4_NL (clattn_dtype's values); default CA_KV_DTYPE, itself default
 * like q (CA_DTYPE). Loads dequantise to f32. The block types are ggml's
 * (ggml-common.h), 32 elements a block along the row, views counting
 * bytes with stride[3] one block:
 *   Q8_0   34 bytes: f16 d, 32 int8 q;                  x = d q
 *   Q4_0   18 bytes: f16 d, 16 bytes of nibbles;         x = d (n - 8)
 *   Q4_1   20 bytes: f16 d, f16 m, 16 bytes of nibbles;  x = d n + m
 *   Q5_0   22 bytes: f16 d, 32 high bits, nibbles;       x = d (n + 16 h - 16)
 *   Q5_1   24 bytes: f16 d, f16 m, 32 high bits, nibbles; x = d (n + 16 h) + m
 *   IQ4_NL 18 bytes: f16 d, 16 bytes of nibbles;         x = d kvalues[n]
 * where element i of a block takes the low nibble of byte i (i < 16) or the
 * high nibble of byte i - 16, and its high bit is bit i of the 32 (little
 * endian). ---- */
#ifndef CA_KV_DTYPE
#define CA_KV_DTYPE CA_DTYPE
#endif
#ifndef CA_K_DTYPE
#define CA_K_DTYPE CA_KV_DTYPE
#endif
#ifndef CA_V_DTYPE
#define CA_V_DTYPE CA_KV_DTYPE
#endif
#define CA_CAT_(a, b) a##b
#define CA_CAT(a, b) CA_CAT_(a, b)
/* the element type a view of each storage indexes (bytes for the block types) */
typedef float ca_storage_0;
typedef half ca_storage_1;
typedef ushort ca_storage_2;
typedef uchar ca_storage_3;
typedef char ca_storage_4;
typedef uchar ca_storage_5;
typedef uchar ca_storage_6;
typedef uchar ca_storage_7;
typedef uchar ca_storage_8;
typedef uchar ca_storage_9;
typedef CA_CAT(ca_storage_, CA_K_DTYPE) k_t;
typedef CA_CAT(ca_storage_, CA_V_DTYPE) v_t;
typedef CA_CAT(ca_storage_, CA_KV_DTYPE) kv_t; /* a cache clattn_kv_append writes */

enum { CA_ST_F32, CA_ST_F16, CA_ST_BF16, CA_ST_Q8_0, CA_ST_INT8, CA_ST_Q4_0, CA_ST_Q4_1, CA_ST_Q5_0, CA_ST_Q5_1, CA_ST_IQ4_NL };

/* Where key row `row` of batch row b lives: the view's dimension-0 index
 * (b, or the page) and row. Paged: row % page_size of page
 * block_table[b * bt_stride + row / page_size]; an entry outside
 * [0, num_pages) (or past the table row) gives ok = false and page 0 row 0,
 * an address inside the views that no output may use. */
#define CA_KV_ARGS                                                                                  \
  __global const int *block_table, int bt_stride, int page_size, int num_pages,                     \
      __global const float *k_scale, ulong k_scale_off, ulong4 k_scale_st, __global const float *v_scale, ulong v_scale_off, \
      ulong4 v_scale_st
#define CA_KV_PASS block_table, bt_stride, page_size, num_pages, k_scale, k_scale_off, k_scale_st, v_scale, v_scale_off, v_scale_st
#define CA_PAGE_PASS block_table, bt_stride, page_size, num_pages, paged
typedef struct {
  long slot, row;
  bool ok;
} ca_kv_pos;

static inline ca_kv_pos ca_kv_locate(long b, long row, __global const int *block_table, int bt_stride, int page_size,
                                     int num_pages, int paged) {
  ca_kv_pos at = {b, row, true};
  if (paged) {
    const long entry = row / page_size;
    const int page = row >= 0 && entry < bt_stride ? block_table[b * (long)bt_stride + entry] : -1;
    at.ok = page >= 0 && page < num_pages;
    at.slot = at.ok ? page : 0;
    at.row = at.ok ? row % page_size : 0;
  }
  return at;
}

/* Whether rows row0 .. row0 + n - 1 of batch row b all lie on pages in the
 * pool (always for contiguous K/V): one table entry per page spanned. */
static inline bool ca_kv_rows_ok(long b, long row0, int n, __global const int *block_table, int bt_stride,
                                 int page_size, int num_pages, int paged) {
  if (!paged) return true;
  for (long e = row0 / page_size; e <= (row0 + n - 1) / page_size; e++)
    if (!ca_kv_locate(b, e * page_size, CA_PAGE_PASS).ok) return false;
  return true;
}

/* The INT8 scale of a located row (1 for the other storages). dt is a
 * compile-time constant at every call (CA_K_DTYPE or CA_V_DTYPE through the
 * ca_k_* / ca_v_* names below), so each switch folds to its one case. */
static inline float ca_dt_scale(const int dt, __global const float *scale, ulong s_off, ulong4 s_st, ca_kv_pos at,
                                long h) {
  return dt == CA_ST_INT8 ? scale[ca_at(s_off, s_st, at.slot, h, at.row, 0)] : 1.0f;
}

/* A block's f16 field. POCL converts a scalar vload_half in software
 * (about 15 instructions) and a vector one with the CPU's conversion
 * instruction, so on x86-64 it is converted as the first of a private
 * vector of four halves. */
static inline float ca_f16_at(__global const uchar *p) {
#if defined(__x86_64__)
  const ushort4 bits = (ushort4)(*(__global const ushort *)p, 0, 0, 0);
  return vload_half4(0, (const half *)&bits).s0;
#else
  return vload_half(0, (__global const half *)p);
#endif
}

/* IQ4_NL's sixteen levels (ggml's kvalues_iq4nl) */
__constant float ca_iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Element i (0 .. 31) of the block at blk. */
static inline float ca_block_load(const int dt, __global const uchar *blk, int i) {
  const float d = ca_f16_at(blk);
  if (dt == CA_ST_Q8_0) return d * (float)((__global const char *)blk)[2 + i];
  const int qs_at = dt == CA_ST_Q4_1 ? 4 : dt == CA_ST_Q5_0 ? 6 : dt == CA_ST_Q5_1 ? 8 : 2;
  const uchar byte = blk[qs_at + (i & 15)];
  int n = i < 16 ? byte & 15 : byte >> 4;
  if (dt == CA_ST_IQ4_NL) return d * ca_iq4nl_levels[n];
  if (dt == CA_ST_Q5_0 || dt == CA_ST_Q5_1) n |= ((blk[(dt == CA_ST_Q5_0 ? 2 : 4) + (i >> 3)] >> (i & 7)) & 1) << 4;
  if (dt == CA_ST_Q4_0) return d * (float)(n - 8);
  if (dt == CA_ST_Q5_0) return d * (float)(n - 16);
  return fma(d, (float)n, ca_f16_at(blk + 2)); /* Q4_1, Q5_1: d n + m */
}

/* Elements i .. i + 15 (i 0 or 16) of the block at blk. */
static inline float16 ca_block_load16(const int dt, __global const uchar *blk, int i) {
  const float d = ca_f16_at(blk);
  if (dt == CA_ST_Q8_0) return d * convert_float16(vload16(0, (__global const char *)blk + 2 + i));
  const int qs_at = dt == CA_ST_Q4_1 ? 4 : dt == CA_ST_Q5_0 ? 6 : dt == CA_ST_Q5_1 ? 8 : 2;
  const uchar16 bytes = vload16(0, blk + qs_at);
  int16 n = convert_int16(i == 0 ? bytes & (uchar16)15 : bytes >> (uchar16)4);
  if (dt == CA_ST_IQ4_NL) {
    int nn[16];
    float e[16];
    vstore16(n, 0, nn);
    for (int u = 0; u < 16; u++) e[u] = ca_iq4nl_levels[nn[u]];
    return d * vload16(0, e);
  }
  if (dt == CA_ST_Q5_0 || dt == CA_ST_Q5_1) {
    __global const uchar *qh = blk + (dt == CA_ST_Q5_0 ? 2 : 4) + (i >> 3);
    const uint bits = (uint)qh[0] | (uint)qh[1] << 8;
    const int16 shift = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    n |= (((int16)(bits) >> shift) & 1) << 4;
  }
  if (dt == CA_ST_Q4_0) return d * convert_float16(n - 8);
  if (dt == CA_ST_Q5_0) return d * convert_float16(n - 16);
  return fma((float16)(d), convert_float16(n), (float16)(ca_f16_at(blk + 2)));
}

/* Column c of the row starting at `base` (ca_at of column 0); s3 the column
 * stride (bytes of one block for the block types). */
static inline float ca_dt_load(const int dt, __global const void *p, ulong base, ulong s3, int c, float scale) {
  switch (dt) {
    case CA_ST_F32: return ((__global const float *)p)[base + (ulong)c * s3];
    case CA_ST_F16: return vload_half(0, (__global const half *)p + base + (ulong)c * s3);
    case CA_ST_BF16: return as_float((uint)((__global const ushort *)p)[base + (ulong)c * s3] << 16);
    case CA_ST_INT8: return scale * (float)((__global const char *)p)[base + (ulong)c * s3];
    default: return ca_block_load(dt, (__global const uchar *)p + base + (ulong)(c / 32) * s3, c % 32);
  }
}

/* Columns c .. c+15 (c % 16 == 0) of a row with unit column stride (the
 * block types: one block per stride[3] bytes; 16 columns never straddle a
 * block). */
static inline float16 ca_dt_load16(const int dt, __global const void *p, ulong base, ulong s3, int c, float scale) {
  switch (dt) {
    case CA_ST_F32: return vload16(0, (__global const float *)p + base + c);
    case CA_ST_F16: return vload_half16(0, (__global const half *)p + base + c);
    case CA_ST_BF16: return as_float16(convert_uint16(vload16(0, (__global const ushort *)p + base + c)) << 16);
    case CA_ST_INT8: return scale * convert_float16(vload16(0, (__global const char *)p + base + c));
    default: return ca_block_load16(dt, (__global const uchar *)p + base + (ulong)(c / 32) * s3, c % 32);
  }
}

/* Column c of key/value row `row` of (b, h), located, scaled and loaded;
 * 0 for a row whose page is outside the pool. */
static inline float ca_dt_get(const int dt, __global const void *p, ulong off, ulong4 st, __global const float *scale,
                              ulong s_off, ulong4 s_st, long b, long h, long row, int c,
                              __global const int *block_table, int bt_stride, int page_size, int num_pages,
                              int paged) {
  const ca_kv_pos at = ca_kv_locate(b, row, CA_PAGE_PASS);
  if (!at.ok) return 0.0f;
  return ca_dt_load(dt, p, ca_at(off, st, at.slot, h, at.row, 0), st.s3, c, ca_dt_scale(dt, scale, s_off, s_st, at, h));
}

/* The same for keys (CA_K_DTYPE) and values (CA_V_DTYPE). */
#define ca_k_scale(...) ca_dt_scale(CA_K_DTYPE, __VA_ARGS__)
#define ca_v_scale(...) ca_dt_scale(CA_V_DTYPE, __VA_ARGS__)
#define ca_k_load(p, base, s3, c, scale) ca_dt_load(CA_K_DTYPE, p, base, s3, c, scale)
#define ca_v_load(p, base, s3, c, scale) ca_dt_load(CA_V_DTYPE, p, base, s3, c, scale)
#define ca_k_load16(p, base, s3, c, scale) ca_dt_load16(CA_K_DTYPE, p, base, s3, c, scale)
#define ca_v_load16(p, base, s3, c, scale) ca_dt_load16(CA_V_DTYPE, p, base, s3, c, scale)
#define ca_k_get(...) ca_dt_get(CA_K_DTYPE, __VA_ARGS__)
#define ca_v_get(...) ca_dt_get(CA_V_DTYPE, __VA_ARGS__)

/* Bytes of a row's first n columns, unit column stride (the block types:
 * n / 32 blocks of s3 bytes). */
static inline ulong ca_dt_row_bytes(const int dt, int n, ulong s3) {
  switch (dt) {
    case CA_ST_F32: return 4 * (ulong)n;
    case CA_ST_F16:
    case CA_ST_BF16: return 2 * (ulong)n;
    case CA_ST_INT8: return (ulong)n;
    default: return (ulong)(n / 32) * s3;
  }
}

/* ca_prefetch(p, n): asks for the cache lines of bytes [p, p + n) ahead of
 * their use (ca_prefetch_line(p): p's line). A kernel streaming K and V
 * in place waits on each row otherwise: the hardware's prefetchers stop
 * at every 4 KiB page. OpenCL's prefetch() compiles to nothing in POCL and
 * slowed Intel's CPU runtime down, so the hint is x86's instruction, where
 * the kernel compiler says it targets x86-64 (POCL) or the host does
 * (-D CA_X86_ASM: device/rules.c); elsewhere (GPUs, other runtimes), or
 * with -D CA_NO_PREFETCH, there is none. Used by the CPU kernels only. */
#if (defined(__x86_64__) || defined(CA_X86_ASM)) && !defined(CA_NO_PREFETCH)
#define CA_PREFETCH 1
static inline void ca_prefetch_line(__global const uchar *p) { __asm__ volatile("prefetcht0 %0" ::"m"(*p)); }
static inline void ca_prefetch(__global const uchar *p, ulong n) {
  const ulong last = ((ulong)p + n - 1) & ~(ulong)63;
  for (ulong at = (ulong)p & ~(ulong)63; at <= last; at += 64) ca_prefetch_line((__global const uchar *)at);
}
#endif

/* Whether key j lies inside query i's window (bottom-right aligned: query i
 * sits at key position i + kv_len - q_len); a bound of -1 is unbounded. */
static inline bool ca_in_window(long i, long j, int q_len, int kv_len, int window_left, int window_right) {
  long p = i + (long)kv_len - (long)q_len;
  return (window_left < 0 || j >= p - window_left) && (window_right < 0 || j <= p + window_right);
}

/* The number of valid keys of batch row b: kv_lens[b] clamped to [0, kv_len]. */
static inline int ca_valid_keys(__global const int *kv_lens, int has_kv_lens, long b, int kv_len) {
  if (!has_kv_lens) return kv_len;
  int n = kv_lens[b];
  return clamp(n, 0, kv_len);
}

/* Where batch row b's sequence lies. Padded batches: rows and keys start at
 * 0, q_len rows, kv_lens[b] (or kv_len) keys, aligned on q_len / kv_len.
 * Packed variable-length batches (varlen): sequence b is rows cu_q[b] ..
 * cu_q[b+1]-1 of q and out and cu_k[b] .. cu_k[b+1]-1 of k and v, aligned
 * on its own lengths. Paged K/V (paged): each batch row's kv_lens[b] keys
 * through the block table (k0 = 0; cu_k is not read), aligned on that
 * length, so packed queries over a paged cache are each sequence's last
 * positions. Left-padded rows (has_kv_lens & CA_KV_START: clattn_params'
 * cache_leftpad in kv_start): row b's keys begin at row kv_start[b] of its
 * cache (k0) and end at kv_lens[b], aligned on their own count. The offsets
 * are clamped to the totals and the lengths to q_len / kv_len, so malformed
 * cu_seqlens or starts never leave the views. */
#define CA_KV_START 2
#define CA_SEQ_ARGS                                                                                 \
  __global const int *kv_lens, int has_kv_lens, __global const int *cu_q, __global const int *cu_k, \
      int varlen, int total_q, int total_kv, int paged, __global const int *kv_start
#define CA_SEQ_PASS kv_lens, has_kv_lens, cu_q, cu_k, varlen, total_q, total_kv, paged, kv_start
typedef struct {
  long q0, k0;          /* first physical row of q/out and of k/v */
  int rows, keys;       /* query rows that exist, keys that are valid */
  int align_m, align_n; /* the lengths the bottom-right alignment uses */
} ca_seq;

static inline ca_seq ca_sequence(long b, int q_len, int kv_len, CA_SEQ_ARGS) {
  ca_seq s = {0, 0, q_len, kv_len, q_len, kv_len};
  if (varlen) {
    const int q0 = clamp(cu_q[b], 0, total_q), q1 = clamp(cu_q[b + 1], q0, total_q);
    s.q0 = q0;
    s.rows = s.align_m = min(q1 - q0, q_len);
  }
  if (varlen && !paged) {
    const int k0 = clamp(cu_k[b], 0, total_kv), k1 = clamp(cu_k[b + 1], k0, total_kv);
    s.k0 = k0;
    s.keys = s.align_n = min(k1 - k0, kv_len);
  } else {
    s.keys = ca_valid_keys(kv_lens, has_kv_lens, b, kv_len);
    if (has_kv_lens & CA_KV_START) { /* the rows before kv_start[b] are padding */
      s.k0 = clamp(kv_start[b], 0, s.keys);
      s.keys -= (int)s.k0;
    }
    /* a paged or left-padded row is aligned on its own length */
    if (paged || (has_kv_lens & CA_KV_START)) s.align_n = s.keys;
  }
  return s;
}

/* The score before scaling: <q, k>, or with `additive` (Bahdanau) the sum
 * over t of w_t tanh(q_t + k_t); add_w is f32 [head_dim]. */
#define CA_SCORE_ARGS __global const float *add_w, int additive
#define CA_SCORE_PASS add_w, additive

/* The additive score bias (clattn_params.bias), entry (b, h, i, j): f32, or
 * f16 where has_bias has CA_BIAS_F16, times bias_scale[h] where it has
 * CA_BIAS_SCALED (has_bias 0: no bias). An entry of -inf (before the scale)
 * disallows its key, as a zero mask entry does: callers test for it before
 * the key's score or value is used. */
#define CA_BIAS_ARGS \
  __global const float *bias, ulong bias_off, ulong4 bias_st, int has_bias, __global const float *bias_scale
#define CA_BIAS_PASS bias, bias_off, bias_st, has_bias, bias_scale
#define CA_BIAS_F16 2
#define CA_BIAS_SCALED 4
/* The entry at element `at` of the bias as stored, and head h's scaling of it. */
static inline float ca_bias_raw(CA_BIAS_ARGS, ulong at) {
  (void)bias_off, (void)bias_st, (void)bias_scale;
  return (has_bias & CA_BIAS_F16) ? vload_half(0, (__global const half *)bias + at) : bias[at];
}
static inline float ca_bias_scaled(float x, int has_bias, __global const float *bias_scale, long h) {
  return (has_bias & CA_BIAS_SCALED) && x != -INFINITY ? x * bias_scale[h] : x;
}
static inline float ca_bias(CA_BIAS_ARGS, long b, long h, long i, long j) {
  return ca_bias_scaled(ca_bias_raw(CA_BIAS_PASS, ca_at(bias_off, bias_st, b, h, i, j)), has_bias, bias_scale, h);
}

/* ---- The caller's modifiers (clattn_params.score_mod / mask_mod,
 * docs/modifiers.md): OpenCL C the host places between args.h.cl (which
 * defines clattn_captures) and this file, defining clattn_score_mod (built
 * with -D CA_MOD_SCORE), clattn_mask_mod (CA_MOD_MASK) and
 * clattn_score_mod_grad (CA_MOD_GRAD). They see the call's captures, and
 * (q_idx, kv_idx) = (i + n - m, j): row i of m over n keys at its
 * bottom-right aligned position, key j from its sequence's first key. ---- */
/* The captures of a kernel whose family holds args.h.cl's CA_ARGS_MOD, as
 * the pointer ca_cap the hooks below (and CA_SHAPE_PASS) read. */
#define CA_MOD_CAPTURES                                                                              \
  const clattn_captures ca_cap_v = {{cap0, cap1, cap2, cap3},                                        \
                                    {mod.f[0], mod.f[1], mod.f[2], mod.f[3]},                        \
                                    {mod.i[0], mod.i[1], mod.i[2], mod.i[3]}};                       \
  const clattn_captures *ca_cap = &ca_cap_v;
#define CA_Q_IDX(i, sq) (int)((long)(i) + (long)(sq).align_n - (long)(sq).align_m)
#if defined(CA_MOD_SCORE) || defined(CA_MOD_MASK)
#define CA_MOD_ANY 1
#else
#define CA_MOD_ANY 0
#endif
/* Whether the mask modifier allows (i, j) of (b, h) in sequence sq (no
 * modifier: true). It is asked only of pairs of the sequence (a padding
 * row's or key's indices could reach past what its captures hold). */
#ifdef CA_MOD_MASK
#define CA_MOD_ALLOWS(b, h, i, j, sq)                                   \
  ((long)(i) < (long)(sq).rows && (long)(j) < (long)(sq).keys &&       \
   clattn_mask_mod((int)(b), (int)(h), CA_Q_IDX(i, sq), (int)(j), ca_cap) != 0)
#else
#define CA_MOD_ALLOWS(b, h, i, j, sq) true
#endif

/* The block mask (clattn_block_mask_create): blocks of bm_q rows by bm_k
 * keys, each CA_BM_EMPTY (the mask modifier allows none of its pairs),
 * CA_BM_FULL (all) or CA_BM_PARTIAL, classes uchar [b * bm_bs + h * bm_hs
 * + qb * bm_kb + kb] (strides 0 broadcast). */
enum { CA_BM_EMPTY = 0, CA_BM_PARTIAL = 1, CA_BM_FULL = 2 };
/* Where row i of (b, h)'s classes begin, or -1 where the block mask does
 * not serve the row: none, or a sequence whose lengths are not those it
 * was made for (its q_idx would differ). */
static inline long ca_bm_row(ca_mod mod, long b, long h, long i, ca_seq sq) {
  if (!mod.bm_on || sq.align_m != mod.bm_q_len || sq.align_n != mod.bm_kv_len || i >= mod.bm_q_len) return -1;
  return (long)((ulong)b * mod.bm_bs + (ulong)h * mod.bm_hs + (ulong)(i / mod.bm_q) * (ulong)mod.bm_kb);
}
/* The class of keys j_lo .. j_hi in n rows whose classes begin at
 * row_at[0 .. n) (ca_bm_row): EMPTY or FULL where every row's is, PARTIAL
 * where any row is not served. */
static inline int ca_bm_rows_class(__global const uchar *bm_class, ca_mod mod, const long *row_at, int n, long j_lo,
                                   long j_hi) {
  for (int r = 0; r < n; r++)
    if (row_at[r] < 0) return CA_BM_PARTIAL;
  j_hi = min(j_hi, (long)mod.bm_kv_len - 1);
  if (j_lo > j_hi) return CA_BM_EMPTY; /* keys past the sequence */
  const long kb_lo = j_lo / mod.bm_k, kb_hi = j_hi / mod.bm_k;
  bool all_empty = true, all_full = true;
  for (int r = 0; r < n; r++) {
    if (r > 0 && row_at[r] == row_at[r - 1]) continue; /* rows of one block row */
    for (long kb = kb_lo; kb <= kb_hi; kb++) {
      const uchar c = bm_class[row_at[r] + kb];
      all_empty = all_empty && c == CA_BM_EMPTY;
      all_full = all_full && c == CA_BM_FULL;
    }
  }
  return all_empty ? CA_BM_EMPTY : all_full ? CA_BM_FULL : CA_BM_PARTIAL;
}

/* The same for a work-group's rows over keys j_lo .. j_hi, the same answer
 * in every work-item: each passes its row (h, i), or live false for none
 * (a group with no live row gets CA_BM_EMPTY). flags: a __local int.
 * Barriers inside: every work-item calls it. */
static inline int ca_bm_group_class(__local int *flags, bool live, __global const uchar *bm_class, ca_mod mod, long b,
                                    long h, long i, long j_lo, long j_hi, ca_seq sq) {
  if (get_local_id(0) == 0) *flags = 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (live) {
    const long row = ca_bm_row(mod, b, h, i, sq);
    const int c = ca_bm_rows_class(bm_class, mod, &row, 1, j_lo, j_hi);
    if (c != CA_BM_EMPTY) atomic_or(flags, 1);
    if (c != CA_BM_FULL) atomic_or(flags, 2);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const int f = *flags;
  barrier(CLK_LOCAL_MEM_FENCE); /* read by all before the next call resets it */
  return !(f & 1) ? CA_BM_EMPTY : !(f & 2) ? CA_BM_FULL : CA_BM_PARTIAL;
}

/* Score shaping after scale * <q, k> (clattn.h's order): softcap, the
 * score modifier, then the bias and ALiBi's -slope |p_i - j| with p_i the
 * bottom-right aligned position and slope alibi[b * alibi_bstride + h]
 * (alibi_bstride 0: one slope per head). softcap 0 = off; alibi NULL when
 * has_alibi is 0; ca_cap the modifier's captures. */
#define CA_SHAPE_ARGS \
  float softcap, __global const float *alibi, int has_alibi, int alibi_bstride, const clattn_captures *ca_cap
#define CA_SHAPE_PASS softcap, alibi, has_alibi, alibi_bstride, ca_cap
/* The score modifier at (i, j) of (b, h), i's position counted on kv_len
 * keys over q_len rows (no modifier: s). */
#ifdef CA_MOD_SCORE
#define CA_MOD_SCORE_AT(s, b, h, i, j, q_len, kv_len) \
  clattn_score_mod((s), (int)(b), (int)(h), (int)((long)(i) + (long)(kv_len) - (long)(q_len)), (int)(j), ca_cap)
#else
#define CA_MOD_SCORE_AT(s, b, h, i, j, q_len, kv_len) (s)
#endif
static inline float ca_softcap(float s, float softcap) { return softcap > 0.0f ? softcap * tanh(s / softcap) : s; }
static inline float ca_alibi_slope(__global const float *alibi, int alibi_bstride, long b, long h) {
  return alibi[b * (long)alibi_bstride + h];
}
static inline float ca_alibi(long i, long j, int q_len, int kv_len, float slope) {
  return -slope * (float)abs((long)(i + (long)kv_len - (long)q_len) - j);
}
static inline float ca_shape(float s, float bias_ij, long b, long h, long i, long j, int q_len, int kv_len,
                             CA_SHAPE_ARGS) {
  s = CA_MOD_SCORE_AT(ca_softcap(s, softcap), b, h, i, j, q_len, kv_len) + bias_ij;
  return has_alibi ? s + ca_alibi(i, j, q_len, kv_len, ca_alibi_slope(alibi, alibi_bstride, b, h)) : s;
}

/* Head h's sink logit: sinks[sinks_at + h], or -INFINITY without sinks
 * (NULL; clattn_params.sinks and its sinks_offset). */
static inline float ca_sink(__global const float *sinks, long sinks_at, long h) {
  return sinks ? sinks[sinks_at + h] : -INFINITY;
}

/* Raises the empty-row flag: a row had no allowed key. NULL where the
 * call never reads it (CLATTN_EMPTY_ZERO). */
static inline void ca_raise_empty(__global int *empty_flag) {
  if (empty_flag) atomic_or(empty_flag, 1);
}

/* Dropout (clattn_params.dropout_p; args.h.cl's ca_drop). Weight (b, h, i,
 * j) (i the row within its sequence, j the key) is kept when lane j % 4 of
 * Philox4x32-10 at counter (offset + i 2^32 + j / 4 as two words, h, b)
 * reaches the threshold. The fused and backward programs apply it where
 * built with -D CA_DROPOUT; other kernels test d.on. */
static inline uint4 ca_philox4x32_10(uint4 c, uint2 k) {
  for (int round = 0; round < 10; round++) {
    const uint hi0 = mul_hi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint hi1 = mul_hi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k += (uint2)(0x9E3779B9u, 0xBB67AE85u);
  }
  return c;
}
/* The factors (0 or 1 / (1 - p)) of keys 4 j4 .. 4 j4 + 3 of row (b, h, i). */
static inline float4 ca_dropout4(ca_drop d, long b, long h, long i, long j4) {
  const ulong at = ((ulong)d.offset_hi << 32 | d.offset_lo) + ((ulong)i << 32) + (ulong)j4;
  const uint4 r = ca_philox4x32_10((uint4)((uint)at, (uint)(at >> 32), (uint)h, (uint)b), (uint2)(d.key_lo, d.key_hi));
  return select((float4)(0.0f), (float4)(as_float(d.factor)), r >= (uint4)(d.threshold));
}
/* Key j's factor; 1 without dropout. */
static inline float ca_dropout(ca_drop d, long b, long h, long i, long j) {
  if (!d.on) return 1.0f;
  const float4 z = ca_dropout4(d, b, h, i, j >> 2);
  const int lane = (int)(j & 3);
  return lane == 0 ? z.x : lane == 1 ? z.y : lane == 2 ? z.z : z.w;
}

/* Route diagnostics (bits of `diag`) and where a row's go. */
#define CA_DIAG_ENTROPY 1
#define CA_DIAG_MAX_WEIGHT 2
#define CA_DIAG_ARGMAX 4
#define CA_DIAG_ARGS                                                                          \
  __global float *entropy, ulong entropy_off, ulong4 entropy_st, __global float *max_weight, ulong max_weight_off, \
      ulong4 max_weight_st, __global int *argmax, ulong argmax_off, ulong4 argmax_st, int diag

#define CA_DIAG_PASS entropy, entropy_off, entropy_st, max_weight, max_weight_off, max_weight_st, argmax, argmax_off, argmax_st, diag

/* Writes row (b, h, i)'s diagnostics from its softmax state, relative to a
 * reference m: l_keys = sum_j e_j and t = sum_j e_j (s_j - m) over the
 * allowed keys (e_j = exp(s_j - m)), l the whole denominator (l_keys, plus
 * a sink's term), top = exp(max_j s_j - m). With a_j = e_j / l:
 *   entropy = -sum_j a_j log a_j = (l_keys / l) log(l) - t / l,
 *   max_weight = top / l.   empty: no allowed key (a sink far above every
 * key can make l_keys underflow to 0 in a row that is not empty). */
static inline void ca_store_diag(bool empty, float l_keys, float l, float t, float top, int best, long b, long h, long i,
                          CA_DIAG_ARGS) {
  if (diag & CA_DIAG_ENTROPY)
    entropy[ca_at(entropy_off, entropy_st, b, h, i, 0)] = empty ? 0.0f : l_keys / l * log(l) - t / l;
  if (diag & CA_DIAG_MAX_WEIGHT) max_weight[ca_at(max_weight_off, max_weight_st, b, h, i, 0)] = empty ? 0.0f : top / l;
  if (diag & CA_DIAG_ARGMAX) argmax[ca_at(argmax_off, argmax_st, b, h, i, 0)] = empty ? -1 : best;
}

/* A maximum that keeps NaN, so a NaN score reaches its row's outputs. */
static inline float ca_max_nan(float a, float b) { return (a > b || isnan(a)) ? a : b; }
