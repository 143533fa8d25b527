/*
 * The field groups of the fuzz format's extension (fuzz_fields.h; the format
 * is documented in fuzz_case.c): decoding, filling the buffers in their
 * storage, the host-side rules of include/clattn.h / the DESIGN's "Contract,
 * second wave", and the reference's inputs over the stored (dequantised,
 * paged) values.
 */
#include "fuzz_fields.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problem.h"

#define DUMMY_MEM ((cl_mem)(uintptr_t)1) /* the reference only asks whether a field is set */

/* extension header bytes (after the magic) */
enum {
  E_DTYPE,
  E_KV_DTYPE,
  E_SCORE,
  E_SOFTCAP,
  E_VARLEN,
  E_PAGED,
  E_PAGE_SIZE,
  E_NUM_PAGES,
  E_BT_STRIDE,
  E_SCALES,
  E_K_SCALE_VIEW,
  E_V_SCALE_VIEW = E_K_SCALE_VIEW + 4,
  E_Q8_K = E_V_SCALE_VIEW + 4,
  E_Q8_V,
  E_ALIBI_STRIDE,
  E_DROPOUT_P,
  E_DROPOUT_SEED,                        /* two bytes: the seed's low, high 32 bits */
  E_DROPOUT_OFFSET = E_DROPOUT_SEED + 2, /* two bytes: the offset's low, high 32 bits */
  E_LEFTPAD = E_DROPOUT_OFFSET + 2
};
enum { S_SOFTCAP = 1, S_ALIBI = 2, S_SINKS = 4, S_ADDITIVE = 8, S_BAD_SCORE = 16, S_W_MISMATCH = 32, S_SHORT = 64 };
enum { V_CU_Q = 1, V_CU_K = 2, V_SHORT = 4, V_BATCH_STRIDE = 8 };
enum { P_TABLE = 1, P_SHORT = 2 };
enum { L_LEFTPAD = 1, L_SHORT = 2 };

/* decoded extension state kept in the params and in these statics of the case */
static size_t q_esize(clattn_dtype d) { return d == CLATTN_F16 || d == CLATTN_BF16 ? 2 : 4; }
size_t fz_q_esize(const clattn_params *p) { return q_esize(p->dtype); }

static int is16(clattn_dtype d) { return d == CLATTN_F16 || d == CLATTN_BF16; }

static size_t kv_esize(clattn_dtype kv) {
  switch (kv) {
    case CLATTN_F16:
    case CLATTN_BF16: return 2;
    case CLATTN_INT8: return 1;
    case CLATTN_Q8_0: return 34; /* one block, while the view is decoded in block units */
    default: return 4;
  }
}

static int varlen(const fz_case *c) { return c->aux[A_CU_Q]; }
static int paged(const fz_case *c) { return c->aux[A_TABLE]; }

static uint8_t e_byte(const fz_case *c, int i) { return c->ext ? c->ext_hdr[i] : 0; }

/* One 32-bit word of a dropout seed or offset: < 0x80 small, < 0xF0 just
 * below 2^32 (the low word: j / 4 carries into the high word; the high
 * word: the offset near 2^64, so i * 2^32 wraps), else spread bit patterns. */
static uint32_t dec_word(uint8_t b) {
  static const uint32_t spread[16] = {0x80000000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x9E3779B9u, 0xDEADBEEFu, 0x00010000u,
                                      0xFFFF0000u, 0x55555555u, 0xAAAAAAAAu, 0x00000100u, 0x80000001u, 0xFFFFFFFEu,
                                      0x01234567u, 0x89ABCDEFu, 0xFFFFFF00u, 0x00FFFFFFu};
  return b < 0x80 ? b : b < 0xF0 ? 0xFFFFFFFFu - (uint32_t)(b - 0x80) : spread[b - 0xF0];
}

void fz_ext_header(fz_case *c, const uint8_t *e) {
  memcpy(c->ext_hdr, e, FZ_EXT);
  clattn_params *p = &c->p;
  switch (e[E_DTYPE] % 8) {
    case 1: p->dtype = CLATTN_F16; break;
    case 2: p->dtype = CLATTN_BF16; break;
    case 3: p->dtype = CLATTN_Q8_0; break; /* q and out never quantised: INVALID */
    case 4: p->dtype = CLATTN_INT8; break;
    default: break; /* byte 7's */
  }
  static const int bad_kv[4] = {CLATTN_IQ4_NL + 1, -2, INT_MAX, INT_MIN};
  static const clattn_dtype kvs[8] = {CLATTN_DTYPE_SAME, CLATTN_F32,  CLATTN_F16, CLATTN_BF16,
                                      CLATTN_Q8_0,       CLATTN_INT8, CLATTN_F32, CLATTN_DTYPE_SAME};
  const uint8_t k = e[E_KV_DTYPE];
  p->kv_dtype = k % 8 == 6 ? (clattn_dtype)bad_kv[(k >> 3) & 3] : kvs[k % 8];
  c->kv = p->kv_dtype == CLATTN_DTYPE_SAME ? p->dtype : p->kv_dtype;

  const uint8_t s = e[E_SCORE];
  static const float softcaps[16] = {5.f, 1.f,  0.5f,     30.f, 2.f, 0.25f,   10.f,      50.f,
                                     NAN, -1.f, INFINITY, -0.f, 0.f, FLT_MIN, -INFINITY, 1e-3f};
  p->softcap = (s & S_SOFTCAP) ? softcaps[e[E_SOFTCAP] % 16] : 0.f;
  c->aux[A_ALIBI] = !!(s & S_ALIBI);
  /* slopes per (batch, head): 0 (per head), q_heads, q_heads + 1 apart, or hostile */
  const uint8_t as = e[E_ALIBI_STRIDE];
  const long long stride = as >= 0xF0    ? fz_hostile_int[as - 0xF0]
                           : as % 3 == 0 ? 0
                                         : p->q_heads + (long long)(as % 3 == 2);
  p->alibi_batch_stride = (int)(stride > INT_MAX ? INT_MAX : stride < INT_MIN ? INT_MIN : stride);
  c->aux[A_SINKS] = !!(s & S_SINKS);
  p->score = (s & S_BAD_SCORE)  ? (clattn_score)((s & 128) ? -1 : 2)
             : (s & S_ADDITIVE) ? CLATTN_SCORE_ADDITIVE
                                : CLATTN_SCORE_DOT;
  c->aux[A_ADDW] = !!(s & S_ADDITIVE) != !!(s & S_W_MISMATCH);

  const uint8_t v = e[E_VARLEN];
  c->aux[A_CU_Q] = !!(v & V_CU_Q);
  c->aux[A_CU_K] = !!(v & V_CU_K);
  c->aux[A_TABLE] = !!(e[E_PAGED] & P_TABLE);
  if (paged(c)) {
    const uint8_t ps = e[E_PAGE_SIZE], np = e[E_NUM_PAGES], bt = e[E_BT_STRIDE];
    p->page_size = ps < 0xF0 ? 1 + ps % 16 : fz_hostile_int[ps - 0xF0];
    p->num_pages = np < 0xF0 ? 1 + np % 32 : fz_hostile_int[np - 0xF0];
    const long long need =
        p->page_size > 0 && p->kv_len > 0 ? (p->kv_len + (long long)p->page_size - 1) / p->page_size : 1;
    static const int add[4] = {0, 1, 2, -1};
    p->block_table_stride = bt < 0xF0 ? (int)(need + add[bt % 4]) : fz_hostile_int[bt - 0xF0];
  }

  /* dropout: 0 (off), valid rates up to the largest float below 1, and the
   * refused ones (negative, 1, past 1, NaN, infinities) */
  static const float rates[16] = {0.f,   0.5f, 0.1f, 0.9999999f, -0.1f,     1.f,        NAN,   INFINITY,
                                  0.25f, -0.f, 0.9f, 1e-10f,     -INFINITY, 1.0000001f, 0.75f, 0.99999994f};
  p->dropout_p = rates[e[E_DROPOUT_P] % 16];
  p->dropout_seed = dec_word(e[E_DROPOUT_SEED]) | (cl_ulong)dec_word(e[E_DROPOUT_SEED + 1]) << 32;
  p->dropout_offset = dec_word(e[E_DROPOUT_OFFSET]) | (cl_ulong)dec_word(e[E_DROPOUT_OFFSET + 1]) << 32;
  c->aux[A_LEFTPAD] = !!(e[E_LEFTPAD] & L_LEFTPAD);
}

void fz_view_dims(const fz_case *c, int t, size_t D[4]) {
  const clattn_params *p = &c->p;
  const int vl = varlen(c), kv = t == T_K || t == T_V || t == T_KS || t == T_VS;
  long b = p->batch, h = kv ? p->kv_heads : p->q_heads, rows = kv ? p->kv_len : p->q_len, cols = 1;
  if (t <= T_OUT && vl) {
    b = 1;
    rows = kv ? p->total_kv : p->total_q;
  }
  if (kv && paged(c)) {
    b = p->num_pages;
    rows = p->page_size;
  }
  switch (t) {
    case T_Q:
    case T_K: cols = p->head_dim; break;
    case T_V:
    case T_OUT: cols = p->value_dim; break;
    case T_MASK:
    case T_BIAS:
    case T_W: cols = p->kv_len; break;
    default: break;
  }
  if ((t == T_K || t == T_V) && c->kv == CLATTN_Q8_0) cols = cols >= 32 ? cols / 32 : 1; /* blocks */
  D[0] = (size_t)b;
  D[1] = (size_t)h;
  D[2] = (size_t)rows;
  D[3] = (size_t)cols;
}

static size_t mul_w(size_t a, size_t b) { return a * b; } /* wrapping on purpose */

/* The bytes a Q8_0 view addresses, as validate.c's check_q8_0_view counts them. */
static int q8_need(const clattn_tensor *t, const size_t *D, size_t *need) {
  const size_t dims[4] = {D[0], D[1], D[2], D[3] * 34};
  size_t last = t->offset;
  for (int d = 0; d < 4; d++) {
    size_t m = ((long)dims[d] > 0 ? dims[d] : 1) - 1, s = d < 3 ? t->stride[d] : 1, step;
    if (m != 0 && s > SIZE_MAX / m) return 0;
    step = m * s;
    if (step > SIZE_MAX - last) return 0;
    last += step;
  }
  if (last == SIZE_MAX) return 0;
  *need = last + 1;
  return 1;
}

void fz_q8_view(fz_case *c, int t, uint8_t tweak) {
  clattn_tensor *tv = t == T_K ? &c->p.k : &c->p.v;
  tv->offset = mul_w(tv->offset, 34);
  for (int d = 0; d < 4; d++) tv->stride[d] = mul_w(tv->stride[d], 34);
  if (tweak & 1) tv->offset += 1;
  if (tweak & 2) tv->stride[2] += 1;
  if (tweak & 4) tv->stride[3] = 32;
  if (tweak & 8) tv->stride[0] += 1;
  c->esize[t] = 1;
  c->q8[t] = 1;
  c->need_ok[t] = q8_need(tv, c->dims[t], &c->need[t]);
}

/* ---------- the data ---------- */

static size_t small_bytes(long count, int one_short) {
  size_t want = count > 0 && (size_t)count <= FZ_BUF_CAP / 4 ? (size_t)count * 4 : 64;
  return one_short && want > 4 ? want - 4 : want;
}

/* cu_seqlens entries: < 0xF0 steps of 0..len from 0 (a valid packing),
 * else a hostile value (negative, decreasing, too long, huge). A hostile
 * len (the case's own q_len or kv_len, negative) takes steps of 0. */
static void dec_cu(int32_t *cu, size_t n, int len, fz_reader *r) {
  for (size_t i = 0; i < n; i++) {
    const uint8_t x = fz_rd(r);
    const long long prev = i ? cu[i - 1] : 0;
    long long v;
    if (x < 0xF0) {
      v = i && len > 0 ? prev + x % (len + 1LL) : prev;
    } else {
      const long long hostile[8] = {-1, INT_MAX, INT_MIN, prev - 1, prev + len + 1LL, prev + 1, 0, 1 << 30};
      v = hostile[x & 7];
    }
    cu[i] = (int32_t)(v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : v);
  }
}

/* cache_leftpad entries: < 0xF0 a start in 0 .. end (end = batch row b's
 * kv_lens clamped to [0, kv_len], kv_len without one; a start at end leaves
 * no key), else a hostile value (negative, past the end, INT_MIN, INT_MAX). */
static void dec_leftpad(const fz_case *c, int32_t *lp, size_t n, fz_reader *r) {
  const long long N = c->p.kv_len > 0 ? c->p.kv_len : 0;
  for (size_t i = 0; i < n; i++) {
    const uint8_t x = fz_rd(r);
    long long end = N;
    if (c->kv_lens && i < c->kv_lens_bytes / 4) end = c->kv_lens_host[i] < 0 ? 0 : c->kv_lens_host[i];
    if (end > N) end = N;
    const long long hostile[8] = {-1, INT_MIN, INT_MAX, end + 1, end, N + 1, -end - 1, 1 << 30};
    const long long v = x < 0xF0 ? x % (end + 1) : hostile[x & 7];
    lp[i] = (int32_t)(v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : v);
  }
}

int fz_ext_data(fz_case *c, fz_reader *r) {
  clattn_params *p = &c->p;
  if (!c->ext) return 0;
  const int vshort = !!(e_byte(c, E_VARLEN) & V_SHORT), sshort = !!(e_byte(c, E_SCORE) & S_SHORT);
  const long long table_n = (long long)p->batch * p->block_table_stride;
  const long long alibi_n =
      p->alibi_batch_stride > 0 ? (p->batch - 1LL) * p->alibi_batch_stride + p->q_heads : p->q_heads;
  const long counts[A_COUNT] = {p->batch + 1L,
                                p->batch + 1L,
                                table_n > 0 && table_n <= INT_MAX ? (long)table_n : -1,
                                alibi_n > 0 && alibi_n <= INT_MAX ? (long)alibi_n : -1,
                                p->q_heads,
                                p->head_dim,
                                p->batch};
  const int shorts[A_COUNT] = {vshort, vshort, !!(e_byte(c, E_PAGED) & P_SHORT),  sshort,
                               sshort, sshort, !!(e_byte(c, E_LEFTPAD) & L_SHORT)};
  for (int a = 0; a < A_COUNT; a++) {
    if (!c->aux[a]) continue;
    c->aux_bytes[a] = small_bytes(counts[a], shorts[a]);
    c->aux_host[a] = malloc(c->aux_bytes[a]);
    if (!c->aux_host[a]) return -1;
    const size_t n = c->aux_bytes[a] / 4;
    int32_t *iv = (int32_t *)(void *)c->aux_host[a];
    float *fv = (float *)(void *)c->aux_host[a];
    switch (a) {
      case A_CU_Q: dec_cu(iv, n, p->q_len, r); break;
      case A_CU_K: dec_cu(iv, n, p->kv_len, r); break;
      case A_TABLE:
        for (size_t i = 0; i < n; i++) {
          const uint8_t x = fz_rd(r);
          const int np = p->num_pages;
          const int32_t hostile[8] = {-1, np, INT_MIN, INT_MAX, np + 1, -2, 1 << 30, 0};
          iv[i] = x < 0xF0 ? (np > 0 ? x % np : 0) : hostile[x & 7];
        }
        break;
      case A_LEFTPAD: dec_leftpad(c, iv, n, r); break;
      default:
        for (size_t i = 0; i < n; i++) fv[i] = fz_dec_float(fz_rd(r));
        break;
    }
  }
  /* the totals: the last entries, or off by one, or 0 */
  const uint8_t v = e_byte(c, E_VARLEN);
  for (int a = A_CU_Q; a <= A_CU_K; a++) {
    int *total = a == A_CU_Q ? &p->total_q : &p->total_kv;
    const int mode = (v >> (a == A_CU_Q ? 4 : 6)) & 3;
    long long last = 0;
    if (c->aux[a]) last = ((const int32_t *)(const void *)c->aux_host[a])[c->aux_bytes[a] / 4 - 1];
    const long long t[4] = {last, last + 1, last - 1, 0};
    *total = c->aux[a] ? (int)(t[mode] > INT_MAX ? INT_MAX : t[mode] < INT_MIN ? INT_MIN : t[mode]) : 0;
  }
  return 0;
}

static void put16(unsigned char *at, clattn_dtype d, float x) {
  const uint16_t b = d == CLATTN_F16 ? cp_f16_bits(x) : cp_bf16_bits(x);
  memcpy(at, &b, 2);
}

/* int8 quants: < 0xF0 small (-16..16), else the extremes */
static unsigned char dec_q(uint8_t x) {
  static const int8_t hostile[8] = {-128, 127, -127, 0, 1, -1, 64, -64};
  return (unsigned char)(x < 0xF0 ? (int8_t)(x % 33 - 16) : hostile[x & 7]);
}

/* scales (Q8_0's f16 d, INT8's f32): small powers of two, 0, a subnormal, NaN, +-inf */
static float dec_scale8(uint8_t x) {
  static const float t[8] = {0.0078125f, 0.015625f, 0.00390625f, 0.f, -0.0078125f, 0.03125f, 5.9604645e-8f, 0.0625f};
  if (x == 0xFD) return NAN;
  if (x == 0xFE) return INFINITY;
  if (x == 0xFF) return -INFINITY;
  return t[x % 8];
}

void fz_fill_input(fz_case *c, int t, fz_reader *r) {
  unsigned char *h = c->host[t];
  const size_t bytes = c->bytes[t];
  const clattn_dtype st = t == T_Q ? c->p.dtype : (t == T_K || t == T_V) ? c->kv : CLATTN_F32;
  if (t == T_KS || t == T_VS || !c->ext || (st != CLATTN_INT8 && st != CLATTN_Q8_0 && !is16(st))) {
    float *f = (float *)(void *)h;
    const size_t n = bytes / 4;
    for (size_t i = 0; i < n; i++) f[i] = (t == T_KS || t == T_VS) ? dec_scale8(fz_rd(r)) : fz_dec_float(fz_rd(r));
    for (size_t i = n * 4; i < bytes; i++) h[i] = 0x7F; /* the partial element past the last float */
    return;
  }
  if (is16(st)) {
    for (size_t i = 0; i + 1 < bytes; i += 2) put16(h + i, st, fz_dec_float(fz_rd(r)));
    if (bytes % 2) h[bytes - 1] = 0x7F;
    return;
  }
  for (size_t i = 0; i < bytes; i++) h[i] = dec_q(fz_rd(r));
  if (st != CLATTN_Q8_0 || !c->need_ok[t] || c->need[t] > bytes)
    return; /* (a call that is rejected: no block structure to honour) */
  /* each block's f16 scale, through the view */
  const clattn_tensor *tv = t == T_K ? &c->p.k : &c->p.v;
  const size_t *D = c->dims[t];
  if ((double)D[0] * (double)D[1] * (double)D[2] * (double)D[3] > (double)FZ_BUF_CAP)
    return; /* broadcast over huge dims: the data's bytes stand */
  for (size_t s = 0; s < D[0]; s++)
    for (size_t hh = 0; hh < D[1]; hh++)
      for (size_t row = 0; row < D[2]; row++)
        for (size_t blk = 0; blk < D[3]; blk++) {
          const size_t at = tv->offset + s * tv->stride[0] + hh * tv->stride[1] + row * tv->stride[2] + blk * 34;
          if (at + 2 <= bytes) put16(h + at, CLATTN_F16, dec_scale8(fz_rd(r)));
        }
}

/* ---------- the rules ---------- */

void fz_ext_rules(const fz_case *c, int dims_ok, fz_reason_fn reason, void *rc) {
  const clattn_params *p = &c->p;
  char w[256];
#define R(st, ...) (snprintf(w, sizeof w, __VA_ARGS__), reason(rc, (st), w))
  const int inv = CLATTN_ERR_INVALID_ARGUMENT, small = CLATTN_ERR_BUFFER_TOO_SMALL;
  if ((int)p->kv_dtype < -1 || (int)p->kv_dtype > 4) R(inv, "kv_dtype %d", (int)p->kv_dtype);
  if (!(p->softcap >= 0.f) || isinf(p->softcap)) R(inv, "softcap %g", (double)p->softcap);
  if (p->score != CLATTN_SCORE_DOT && p->score != CLATTN_SCORE_ADDITIVE) R(inv, "score %d", (int)p->score);
  if (p->score == CLATTN_SCORE_ADDITIVE && !c->aux[A_ADDW]) R(inv, "additive score without additive_w");
  if (p->score == CLATTN_SCORE_DOT && c->aux[A_ADDW]) R(inv, "additive_w with the dot score");
  const int vl = c->aux[A_CU_Q] || c->aux[A_CU_K];
  if (vl && paged(c)) { /* packed queries over the pages: cu_seqlens_q alone, lengths in kv_lens */
    if (c->aux[A_CU_K]) R(inv, "cu_seqlens_k with a block table");
    if (c->aux[A_CU_Q] && p->total_q <= 0) R(inv, "total_q %d", p->total_q);
  } else if (vl) {
    if (c->aux[A_CU_Q] != c->aux[A_CU_K]) R(inv, "only one of cu_seqlens_q / cu_seqlens_k");
    if (c->kv_lens) R(inv, "kv_lens with cu_seqlens");
    if (p->total_q <= 0 || p->total_kv <= 0) R(inv, "total_q %d, total_kv %d", p->total_q, p->total_kv);
  }
  if (vl) {
    if (p->batch == INT_MAX) R(inv, "cu_seqlens with batch INT_MAX");
    const clattn_tensor *v4[4] = {&p->q, &p->k, &p->v, &p->out};
    for (int i = 0; i < 4; i++) /* paged k and v: stride[0] steps a page */
      if (c->present[i] && v4[i]->stride[0] != 0 && !(paged(c) && (i == T_K || i == T_V)))
        R(inv, "view %d has a batch stride with cu_seqlens", i);
  }
  if (p->alibi_batch_stride < 0) R(inv, "alibi_batch_stride %d", p->alibi_batch_stride);
  if (p->alibi_batch_stride > 0 && !c->aux[A_ALIBI]) R(inv, "alibi_batch_stride without alibi_slopes");
  if (!(p->dropout_p >= 0.f && p->dropout_p < 1.f)) R(inv, "dropout_p %.9g", (double)p->dropout_p);
  if (paged(c) && !c->kv_lens) R(inv, "block table without kv_lens");
  if (c->aux[A_LEFTPAD] && !c->kv_lens) R(inv, "cache_leftpad without kv_lens");
  if (c->aux[A_LEFTPAD] && c->aux[A_CU_K]) R(inv, "cache_leftpad with cu_seqlens_k");
  if (!dims_ok) return;
  if (c->aux[A_LEFTPAD] && c->aux_bytes[A_LEFTPAD] < (size_t)p->batch * 4)
    R(small, "cache_leftpad buffer %zu bytes", c->aux_bytes[A_LEFTPAD]);
  if (vl) {
    for (int a = A_CU_Q; a <= A_CU_K; a++)
      if (c->aux[a] && c->aux_bytes[a] < ((size_t)p->batch + 1) * 4)
        R(small, "cu_seqlens buffer %zu bytes", c->aux_bytes[a]);
  }
  if (paged(c)) {
    if (p->page_size <= 0) R(inv, "page_size %d", p->page_size);
    if (p->num_pages <= 0) R(inv, "num_pages %d", p->num_pages);
    if (p->page_size > 0) {
      const long long need = (p->kv_len + (long long)p->page_size - 1) / p->page_size;
      if (p->block_table_stride <= 0 || p->block_table_stride < need)
        R(inv, "block_table_stride %d < %lld", p->block_table_stride, need);
      else if ((size_t)p->batch * (size_t)p->block_table_stride * 4 > c->aux_bytes[A_TABLE])
        R(small, "block table buffer %zu bytes", c->aux_bytes[A_TABLE]);
    }
  }
  const clattn_dtype kv = c->kv;
  for (int t = T_K; t <= T_V; t++) {
    if (kv != CLATTN_Q8_0 || !c->present[t]) continue;
    const clattn_tensor *tv = t == T_K ? &p->k : &p->v;
    const int cols = t == T_K ? p->head_dim : p->value_dim;
    if (cols % 32) R(inv, "Q8_0 %s of %d columns", t == T_K ? "k" : "v", cols);
    if (tv->stride[3] != 34) R(inv, "Q8_0 stride[3] %zu", tv->stride[3]);
    if (tv->offset % 2 || tv->stride[0] % 2 || tv->stride[1] % 2 || tv->stride[2] % 2)
      R(inv, "Q8_0 view with an odd offset or stride");
  }
  if (kv == CLATTN_INT8 && (!c->present[T_KS] || !c->present[T_VS])) R(inv, "INT8 without k_scale / v_scale");
  if (kv != CLATTN_INT8 && (c->present[T_KS] || c->present[T_VS])) R(inv, "k_scale / v_scale without INT8");
  const size_t heads = (size_t)p->q_heads * 4;
  if (c->aux[A_ALIBI] && p->alibi_batch_stride >= 0) { /* [batch, heads] with the batch stride (0: broadcast) */
    const unsigned long long last = (unsigned long long)(p->batch - 1) * (unsigned)p->alibi_batch_stride + p->q_heads;
    if (last * 4 > c->aux_bytes[A_ALIBI]) R(small, "alibi_slopes %zu bytes", c->aux_bytes[A_ALIBI]);
  }
  if (c->aux[A_SINKS] && c->aux_bytes[A_SINKS] < heads) R(small, "sinks %zu bytes", c->aux_bytes[A_SINKS]);
  if (c->aux[A_ADDW] && c->aux_bytes[A_ADDW] < (size_t)p->head_dim * 4)
    R(small, "additive_w %zu bytes", c->aux_bytes[A_ADDW]);
#undef R
}

/* ---------- the reference's inputs ---------- */

static float f16v(const unsigned char *at) {
  uint16_t b;
  memcpy(&b, at, 2);
  return cp_f16_value(b);
}

/* Element (s, h, r, col) of view t (k or v) as the kernels read it, in f32. */
static float kv_elem(const fz_case *c, int t, size_t s, size_t h, size_t r, size_t col) {
  const clattn_tensor *tv = t == T_K ? &c->p.k : &c->p.v;
  const unsigned char *buf = c->host[t];
  const size_t base = tv->offset + s * tv->stride[0] + h * tv->stride[1] + r * tv->stride[2];
  uint16_t b16;
  switch (c->kv) {
    case CLATTN_F16:
    case CLATTN_BF16:
      memcpy(&b16, buf + (base + col * tv->stride[3]) * 2, 2);
      return c->kv == CLATTN_F16 ? cp_f16_value(b16) : cp_bf16_value(b16);
    case CLATTN_Q8_0: {
      const unsigned char *blk = buf + base + col / 32 * 34;
      return f16v(blk) * (float)(int8_t)blk[2 + col % 32];
    }
    case CLATTN_INT8: {
      const clattn_tensor *sv = t == T_K ? &c->p.k_scale : &c->p.v_scale;
      float scale;
      memcpy(&scale,
             c->host[t == T_K ? T_KS : T_VS] +
                 (sv->offset + s * sv->stride[0] + h * sv->stride[1] + r * sv->stride[2]) * 4,
             4);
      return scale * (float)(int8_t)buf[base + col * tv->stride[3]];
    }
    default: {
      float f;
      memcpy(&f, buf + (base + col * tv->stride[3]) * 4, 4);
      return f;
    }
  }
}

/* Dense [slots, heads, rows, cols] copy of view t's logical elements. */
static float *kv_dense(const fz_case *c, int t, size_t slots, size_t heads, size_t rows, size_t cols) {
  float *d = malloc((slots * heads * rows * cols + 1) * sizeof *d);
  if (!d) return NULL;
  size_t at = 0;
  for (size_t s = 0; s < slots; s++)
    for (size_t h = 0; h < heads; h++)
      for (size_t r = 0; r < rows; r++)
        for (size_t col = 0; col < cols; col++) d[at++] = kv_elem(c, t, s, h, r, col);
  return d;
}

static clattn_tensor dense_view(size_t heads, size_t rows, size_t cols, int batch_stride) {
  clattn_tensor t = {DUMMY_MEM, 0, {batch_stride ? heads * rows * cols : 0, rows * cols, cols, 1}};
  return t;
}

static long clampl(long x, long lo, long hi) { return x < lo ? lo : x > hi ? hi : x; }

/* The view of a dense [B, Hq, M, N] mask. */
static clattn_tensor dense_mask(const clattn_params *p) {
  const size_t M = (size_t)p->q_len, N = (size_t)p->kv_len;
  clattn_tensor t = {DUMMY_MEM, 0, {(size_t)p->q_heads * M * N, M * N, N, 1}};
  return t;
}

int fz_ref_build(const fz_case *c, fz_ref *r) {
  memset(r, 0, sizeof *r);
  const clattn_params *p = &c->p;
  clattn_params *rp = &r->rp;
  ref_inputs *in = &r->in;
  *rp = *p;
  rp->dtype = CLATTN_F32;
  rp->kv_dtype = CLATTN_DTYPE_SAME;
  rp->block_table = NULL;
  rp->block_table_stride = rp->page_size = rp->num_pages = 0;
  memset(&rp->k_scale, 0, sizeof rp->k_scale);
  memset(&rp->v_scale, 0, sizeof rp->v_scale);
  const int B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, M = p->q_len, N = p->kv_len;
  const int dk = p->head_dim, dv = p->value_dim;
  in->mask = c->present[T_MASK] ? c->host[T_MASK] : NULL;
  in->bias = c->present[T_BIAS] ? (const float *)(const void *)c->host[T_BIAS] : NULL;
  in->kv_lens = c->kv_lens ? c->kv_lens_host : NULL;
  in->alibi_slopes = c->aux[A_ALIBI] ? (const float *)(const void *)c->aux_host[A_ALIBI] : NULL;
  in->sinks = c->aux[A_SINKS] ? (const float *)(const void *)c->aux_host[A_SINKS] : NULL;
  in->additive_w = p->score == CLATTN_SCORE_ADDITIVE ? (const float *)(const void *)c->aux_host[A_ADDW] : NULL;
  in->cu_seqlens_q = varlen(c) ? (const int32_t *)(const void *)c->aux_host[A_CU_Q] : NULL;
  in->cu_seqlens_k = varlen(c) ? (const int32_t *)(const void *)c->aux_host[A_CU_K] : NULL;
  in->cache_leftpad = c->aux[A_LEFTPAD] ? (const int32_t *)(const void *)c->aux_host[A_LEFTPAD] : NULL;
  rp->alibi_slopes = in->alibi_slopes ? DUMMY_MEM : NULL;
  rp->sinks = in->sinks ? DUMMY_MEM : NULL;
  rp->additive_w = in->additive_w ? DUMMY_MEM : NULL;
  rp->cache_leftpad = in->cache_leftpad ? DUMMY_MEM : NULL;
  /* (dropout_p, dropout_seed and dropout_offset pass as the call's: the
   * reference draws the same mask with its own Philox) */

  /* q as floats, indexed by its own view */
  if (is16(p->dtype)) {
    const size_t n = c->bytes[T_Q] / 2;
    r->q = malloc((n + 1) * sizeof *r->q);
    if (!r->q) return -1;
    for (size_t i = 0; i < n; i++) {
      uint16_t b;
      memcpy(&b, c->host[T_Q] + 2 * i, 2);
      r->q[i] = p->dtype == CLATTN_F16 ? cp_f16_value(b) : cp_bf16_value(b);
    }
    in->q = r->q;
  } else {
    in->q = (const float *)(const void *)c->host[T_Q];
  }

  const size_t slots = c->dims[T_K][0], rows = c->dims[T_K][2];
  if (!paged(c)) {
    /* K/V as dense floats over their logical elements */
    r->k = kv_dense(c, T_K, slots, (size_t)Hkv, rows, (size_t)dk);
    r->v = kv_dense(c, T_V, slots, (size_t)Hkv, rows, (size_t)dv);
    if (!r->k || !r->v) return -1;
    rp->k = dense_view((size_t)Hkv, rows, (size_t)dk, !varlen(c));
    rp->v = dense_view((size_t)Hkv, rows, (size_t)dv, !varlen(c));
    in->k = r->k;
    in->v = r->v;
    return 0;
  }

  /* Paged: each batch row is its own sequence of end - start keys (end =
   * clamp(kv_lens[b], 0, kv_len), start = clamp(cache_leftpad[b], 0, end) or
   * 0), aligned on them, which the reference knows as packed sequences: key j
   * is table row position start + j; keys on a page outside the pool are
   * masked out. */
  const size_t pages = (size_t)p->num_pages, ps = (size_t)p->page_size, bts = (size_t)p->block_table_stride;
  const int32_t *table = (const int32_t *)(const void *)c->aux_host[A_TABLE];
  long *start = calloc((size_t)B + 1, sizeof *start);
  float *pool_k = kv_dense(c, T_K, pages, (size_t)Hkv, ps, (size_t)dk);
  float *pool_v = kv_dense(c, T_V, pages, (size_t)Hkv, ps, (size_t)dv);
  r->cu_q = malloc(sizeof(int32_t) * ((size_t)B + 1));
  r->cu_k = malloc(sizeof(int32_t) * ((size_t)B + 1));
  r->mask = malloc((size_t)B * Hq * M * N);
  if (!pool_k || !pool_v || !r->cu_q || !r->cu_k || !r->mask || !start) {
    free(start);
    free(pool_k);
    free(pool_v);
    return -1;
  }
  /* queries: packed as the call has them (cu_seqlens_q, clamped alike by
   * the reference), else batch row b's M rows packed at b * M */
  const int32_t *cu_q = varlen(c) ? (const int32_t *)(const void *)c->aux_host[A_CU_Q] : NULL;
  long total = 0;
  r->cu_q[0] = cu_q ? cu_q[0] : 0;
  r->cu_k[0] = 0;
  for (int b = 0; b < B; b++) {
    const long end = clampl(c->kv_lens_host[b], 0, N);
    start[b] = in->cache_leftpad ? clampl(in->cache_leftpad[b], 0, end) : 0;
    total += end - start[b];
    r->cu_q[b + 1] = cu_q ? cu_q[b + 1] : (b + 1) * M;
    r->cu_k[b + 1] = (int32_t)total;
  }
  const size_t T = total > 0 ? (size_t)total : 1;
  r->k = calloc((size_t)Hkv * T * dk + 1, sizeof(float));
  r->v = calloc((size_t)Hkv * T * dv + 1, sizeof(float));
  float *qp = malloc(((size_t)Hq * B * M * dk + 1) * sizeof(float));
  if (!r->k || !r->v || !qp) {
    free(start);
    free(pool_k);
    free(pool_v);
    free(qp);
    return -1;
  }
  for (int b = 0; b < B; b++) {
    const long n = r->cu_k[b + 1] - r->cu_k[b];
    for (long j = 0; j < n; j++) {
      const size_t at = (size_t)(start[b] + j); /* the key's position in its table row */
      const int32_t e = table[(size_t)b * bts + at / ps];
      if (e < 0 || e >= p->num_pages) continue; /* masked out below; zeros never read */
      for (int h = 0; h < Hkv; h++) {
        memcpy(r->k + ((size_t)h * T + (size_t)(r->cu_k[b] + j)) * dk,
               pool_k + (((size_t)e * Hkv + h) * ps + at % ps) * dk, sizeof(float) * dk);
        memcpy(r->v + ((size_t)h * T + (size_t)(r->cu_k[b] + j)) * dv,
               pool_v + (((size_t)e * Hkv + h) * ps + at % ps) * dv, sizeof(float) * dv);
      }
    }
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < M; i++) {
        for (int d = 0; d < dk && !cu_q; d++)
          qp[((size_t)h * B * M + (size_t)b * M + i) * dk + d] = in->q[cp_index(&p->q, b, h, i, d)];
        for (int j = 0; j < N; j++) {
          const size_t at = (((size_t)b * Hq + h) * M + i) * N + j;
          int ok = !in->mask || in->mask[cp_index(&p->mask, b, h, i, j)];
          if (j < n) {
            const int32_t e = table[(size_t)b * bts + (size_t)(start[b] + j) / ps];
            ok = ok && e >= 0 && e < p->num_pages;
          }
          r->mask[at] = (unsigned char)ok;
        }
      }
  }
  free(start);
  free(pool_k);
  free(pool_v);
  if (cu_q) { /* the call's own q and view */
    free(qp);
  } else {
    free(r->q);
    r->q = qp;
    in->q = qp;
    rp->q = dense_view((size_t)Hq, (size_t)B * M, (size_t)dk, 0);
    rp->total_q = B * M;
  }
  in->k = r->k;
  in->v = r->v;
  in->mask = r->mask;
  in->kv_lens = NULL;
  in->cache_leftpad = NULL; /* (the gather started each row at its start) */
  in->cu_seqlens_q = r->cu_q;
  in->cu_seqlens_k = r->cu_k;
  rp->kv_lens = NULL;
  rp->cache_leftpad = NULL;
  rp->cu_seqlens_q = rp->cu_seqlens_k = DUMMY_MEM;
  rp->total_kv = (int)total;
  rp->k = dense_view((size_t)Hkv, T, (size_t)dk, 0);
  rp->v = dense_view((size_t)Hkv, T, (size_t)dv, 0);
  rp->mask = dense_mask(p);
  return 0;
}

void fz_ref_free(fz_ref *r) {
  free(r->q);
  free(r->k);
  free(r->v);
  free(r->mask);
  free(r->cu_q);
  free(r->cu_k);
  memset(r, 0, sizeof *r);
}

int fz_row_exists(const fz_case *c, int b, int i, long *out_row) {
  *out_row = i;
  if (!varlen(c)) return 1;
  ref_inputs in;
  memset(&in, 0, sizeof in);
  in.cu_seqlens_q = (const int32_t *)(const void *)c->aux_host[A_CU_Q];
  in.cu_seqlens_k = (const int32_t *)(const void *)c->aux_host[A_CU_K];
  const ref_seq sq = ref_sequence(&c->p, &in, b);
  *out_row = sq.q0 + i;
  return i < sq.rows;
}

int fz_ext_view(const fz_case *c, int t, uint8_t vb[4]) {
  const int at = t == T_KS ? E_K_SCALE_VIEW : E_V_SCALE_VIEW;
  for (int i = 0; i < 4; i++) vb[i] = e_byte(c, at + i);
  const int flip = (e_byte(c, E_SCALES) >> (t == T_KS ? 0 : 1)) & 1;
  return c->ext && ((c->kv == CLATTN_INT8) != flip);
}

void fz_ext_adjust_view(fz_case *c, int t) {
  if (!c->ext || !c->present[t]) return;
  clattn_tensor *tv = t == T_Q ? &c->p.q : t == T_K ? &c->p.k : t == T_V ? &c->p.v : t == T_OUT ? &c->p.out : NULL;
  if (tv && varlen(c) && !(e_byte(c, E_VARLEN) & V_BATCH_STRIDE) && !(paged(c) && (t == T_K || t == T_V)))
    tv->stride[0] = 0; /* sequences are rows (the batch dimension is 1); pages keep their stride */
  if ((t == T_K || t == T_V) && c->kv == CLATTN_Q8_0) fz_q8_view(c, t, e_byte(c, t == T_K ? E_Q8_K : E_Q8_V));
}

size_t fz_view_esize(const fz_case *c, int t) {
  switch (t) {
    case T_Q:
    case T_OUT: return q_esize(c->p.dtype);
    case T_K:
    case T_V: return kv_esize(c->kv);
    case T_MASK: return 1;
    default: return 4;
  }
}
