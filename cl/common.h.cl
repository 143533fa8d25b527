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
 * on its own lengths. The offsets are clamped to the totals and the
 * lengths to q_len / kv_len, so malformed cu_seqlens never leave the views. */
#define CA_SEQ_ARGS                                                                                 \
  __global const int *kv_lens, int has_kv_lens, __global const int *cu_q, __global const int *cu_k, \
      int varlen, int total_q, int total_kv
#define CA_SEQ_PASS kv_lens, has_kv_lens, cu_q, cu_k, varlen, total_q, total_kv
typedef struct {
  long q0, k0;          /* first physical row of q/out and of k/v */
  int rows, keys;       /* query rows that exist, keys that are valid */
  int align_m, align_n; /* the lengths the bottom-right alignment uses */
} ca_seq;

static inline ca_seq ca_sequence(long b, int q_len, int kv_len, CA_SEQ_ARGS) {
  ca_seq s;
  if (!varlen) {
    s.q0 = 0;
    s.k0 = 0;
    s.rows = q_len;
    s.keys = ca_valid_keys(kv_lens, has_kv_lens, b, kv_len);
    s.align_m = q_len;
    s.align_n = kv_len;
    return s;
  }
  const int q0 = clamp(cu_q[b], 0, total_q), q1 = clamp(cu_q[b + 1], q0, total_q);
  const int k0 = clamp(cu_k[b], 0, total_kv), k1 = clamp(cu_k[b + 1], k0, total_kv);
  s.q0 = q0;
  s.k0 = k0;
  s.rows = min(q1 - q0, q_len);
  s.keys = min(k1 - k0, kv_len);
  s.align_m = s.rows;
  s.align_n = s.keys;
  return s;
}

/* The score before scaling: <q, k>, or with `additive` (Bahdanau) the sum
 * over t of w_t tanh(q_t + k_t); add_w is f32 [head_dim]. */
#define CA_SCORE_ARGS __global const float *add_w, int additive
#define CA_SCORE_PASS add_w, additive

/* Score shaping after scale * <q, k> (clattn.h's order): softcap, then the
 * bias and ALiBi's -slope_h |p_i - j| with p_i the bottom-right aligned
 * position. softcap 0 = off; alibi NULL when has_alibi is 0. */
#define CA_SHAPE_ARGS float softcap, __global const float *alibi, int has_alibi
#define CA_SHAPE_PASS softcap, alibi, has_alibi
static inline float ca_softcap(float s, float softcap) { return softcap > 0.0f ? softcap * tanh(s / softcap) : s; }
static inline float ca_alibi(long i, long j, int q_len, int kv_len, float slope) {
  return -slope * (float)abs((long)(i + (long)kv_len - (long)q_len) - j);
}
static inline float ca_shape(float s, float bias_ij, long h, long i, long j, int q_len, int kv_len, CA_SHAPE_ARGS) {
  s = ca_softcap(s, softcap) + bias_ij;
  return has_alibi ? s + ca_alibi(i, j, q_len, kv_len, alibi[h]) : s;
}

/* Route diagnostics (bits of `diag`) and where a row's go. */
#define CA_DIAG_ENTROPY 1
#define CA_DIAG_MAX_WEIGHT 2
#define CA_DIAG_ARGMAX 4
#define CA_DIAG_ARGS                                                                          \
  __global float *entropy, ulong ent_off, ulong4 ent_st, __global float *max_weight, ulong mw_off, \
      ulong4 mw_st, __global int *argmax, ulong am_off, ulong4 am_st, int diag

#define CA_DIAG_PASS entropy, ent_off, ent_st, max_weight, mw_off, mw_st, argmax, am_off, am_st, diag

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
    entropy[ca_at(ent_off, ent_st, b, h, i, 0)] = empty ? 0.0f : l_keys / l * log(l) - t / l;
  if (diag & CA_DIAG_MAX_WEIGHT) max_weight[ca_at(mw_off, mw_st, b, h, i, 0)] = empty ? 0.0f : top / l;
  if (diag & CA_DIAG_ARGMAX) argmax[ca_at(am_off, am_st, b, h, i, 0)] = empty ? -1 : best;
}

/* A maximum that keeps NaN, so a NaN score reaches its row's outputs. */
static inline float ca_max_nan(float a, float b) { return (a > b || isnan(a)) ? a : b; }
