/*
 * Decoding and checking of one fuzz input (see fuzz_case.h).
 *
 * Input format (bytes past the end read as 0; tools/scripts/fuzz_seeds.py writes it):
 *
 *   0..6   batch q_heads kv_heads q_len kv_len head_dim value_dim: one byte
 *          each; < 0xF0 a small value (batch 1..3, q_heads 1..8, kv_heads
 *          1..4, q_len 1..33, kv_len 1..48, head/value dim one of
 *          1 3 4 16 17 32), >= 0xF0 hostile_int[b - 0xF0] (0, -1,
 *          INT_MAX, INT_MIN, ...)
 *   7      dtype (< 0xF0 F32, else out of range; 16-bit storage: the
 *          extension's byte 0)
 *   8      scale: scale_table[b % 16] (NaN, 0, +-inf, -0, FLT_MIN, ...)
 *   9      causal (bit 0; 0xFF = -7, "true" but not 1)
 *   10,11  window_left, window_right (< 0xF0: -1 0 1 2 3 4 7 16; else
 *          -2, INT_MIN, INT_MAX, -1000)
 *   12     empty_rows (< 0xF8: bit 0; else out of range)
 *   13     algo (< 0xF8: b % 4; else out of range)
 *   14     flags: 1 done event, 2 kv_lens, 4 mask, 8 bias, 16 lse,
 *          32 weights, 64 entropy, 128 max_weight
 *   15     flags: 1 argmax, 2 kv_lens buffer one int short, 4 also call
 *          with ctx NULL, 8 also call with params NULL
 *   16..59 eleven views (q k v out mask bias lse weights entropy max_weight
 *          argmax), 4 bytes each: mode, offset, size, param
 *            mode 0xFF: buf NULL; else mode % 8: 0 [B,H,S,D] dense, 1
 *            [B,S,H,D], 2 row gap 1 + param % 4, 3 dense with the strides
 *            of param's bits 0..3 zeroed (broadcast), 4 rows and columns
 *            transposed, 5 row stride param % (D + 1) (overlap), 6 each
 *            dense stride times (param >> 2d) & 3, 7 hostile strides
 *            (0, 1, SIZE_MAX, 2^63, 2^62, 2^32, 7, SIZE_MAX/4)
 *            offset: < 0xF0 b % 5 elements, else huge (SIZE_MAX, 2^40 ...)
 *            size: % 4 = 0 exactly what the view needs, 1 one element
 *            short, 2 (b / 4) % 16 elements more, 3 one byte short; a view
 *            that needs more than 1 MiB (or overflows) gets 64 bytes or
 *            1 MiB (bit 0)
 *   60..   data: kv_lens entries (one byte each, kv_lens_table), then every
 *          element of the q, k, v, mask and bias buffers in that order
 *          (floats: float_table[b % 16], 0xFD..0xFF NaN +inf -inf; mask:
 *          0 when b % 4 == 0, else b). Past the end: a PRNG seeded by the
 *          input's hash, finite values only.
 *
 * The extension (tests/fuzz/fuzz_fields.c): an input that starts with the
 * magic C1 A7 7E 02 carries 32 more header bytes, then an input of the
 * format above (whose meaning is unchanged). Extension header:
 *   0      dtype of q and out (b % 8): 1 F16, 2 BF16, 3 Q8_0 and 4 INT8
 *          (refused), else byte 7's
 *   1      kv_dtype (b % 8): 0 and 7 SAME, 1 F32, 2 F16, 3 BF16, 4 Q8_0,
 *          5 INT8, 6 out of range (10, -2, INT_MAX, INT_MIN by (b >> 3) & 3)
 *   2      score flags: 1 softcap, 2 alibi_slopes, 4 sinks, 8 ADDITIVE score
 *          (with additive_w), 16 score out of range (bit 7: -1, else 2),
 *          32 additive_w mismatched (ADDITIVE without it, DOT with it),
 *          64 the alibi, sinks and additive_w buffers one float short
 *   3      softcap: 5 1 0.5 30 2 0.25 10 50 NaN -1 inf -0 0 FLT_MIN -inf 1e-3
 *   4      packed sequences: 1 cu_seqlens_q, 2 cu_seqlens_k, 4 their buffers
 *          one int short, 8 q/k/v/out keep their batch stride (else 0; a
 *          paged k/v keeps its page stride); bits 4-5 total_q, 6-7
 *          total_kv: the last entry, +1, -1, 0. With a block table, packed
 *          queries take cu_seqlens_q alone (cu_seqlens_k is refused)
 *   5      paged K/V: 1 block table (K/V, k_scale and v_scale then index
 *          [page, head, row in page]), 2 its buffer one entry short
 *   6, 7   page_size 1 + b % 16, num_pages 1 + b % 32 (>= 0xF0 hostile_int)
 *   8      block_table_stride: ceil(kv_len / page_size) + 0, 1, 2 or -1
 *          (b % 4; >= 0xF0 hostile_int)
 *   9      bit 0 / 1: k_scale / v_scale present exactly when kv is NOT INT8
 *   10..17 the k_scale and v_scale views (f32 [slot, kv head, key]), as above
 *   18, 19 Q8_0 k / v view (decoded in 34-byte blocks, then in bytes):
 *          1 odd offset, 2 odd stride[2], 4 stride[3] 32, 8 odd stride[0]
 *   20     alibi_batch_stride (slopes per (batch, head)): b % 3: 0, q_heads,
 *          q_heads + 1; >= 0xF0 hostile_int; the alibi buffer then holds
 *          (batch - 1) * stride + q_heads floats
 *   21     dropout_p (b % 16): 0 (off) 0.5 0.1 0.9999999 -0.1 1 NaN inf 0.25
 *          -0 0.9 1e-10 -inf 1.0000001 0.75 0.99999994 (the largest float
 *          below 1); outside [0, 1), or NaN, is refused
 *   22, 23 dropout_seed's low and high 32 bits, and 24, 25 dropout_offset's,
 *          a word a byte: < 0x80 b; < 0xF0 2^32 - 1 - (b - 0x80) (just
 *          below 2^32: in the offset's low word j / 4 carries into the high
 *          word, in its high word the offset is near 2^64 and i * 2^32
 *          wraps); else 2^31, 2^31 - 1, 2^32 - 1, 0x9E3779B9, 0xDEADBEEF,
 *          2^16, 0xFFFF0000, 0x55555555, 0xAAAAAAAA, 2^8, 2^31 + 1,
 *          2^32 - 2, 0x01234567, 0x89ABCDEF, 0xFFFFFF00, 0x00FFFFFF
 *   26     cache_leftpad: 1 present (int32 [B]; needs kv_lens, refused with
 *          cu_seqlens_k), 2 its buffer one int short
 * Its data, after kv_lens: cu_seqlens_q and _k ([B + 1]; < 0xF0 steps of
 * b % (len + 1) from 0, else -1, INT_MAX, INT_MIN, a decrease, a step past
 * the longest length, ...), the block table ([B * stride]; < 0xF0 b %
 * num_pages, else -1, num_pages, INT_MIN, INT_MAX, ...), alibi_slopes and
 * sinks ([q_heads]) and additive_w ([head_dim]) as floats, cache_leftpad
 * ([B]; < 0xF0 b % (end + 1), end = kv_lens[b] clamped to [0, kv_len], so
 * end itself leaves the row no key; else -1, INT_MIN, INT_MAX, end + 1,
 * end, kv_len + 1, -end - 1, 2^30); then the views
 * in their storage: 16-bit q/k/v hold the floats above; INT8 and Q8_0
 * quants are b % 33 - 16 (>= 0xF0: -128, 127, ...), one per byte of the
 * buffer, then Q8_0's f16 block scales (one per block the view reaches) and
 * INT8's f32 scales (the scale views, after bias) are small powers of two,
 * 0, a subnormal (0xFD..0xFF NaN +inf -inf). A valid call with storage other than f32 runs only
 * for head and value dims 32 (each storage pair builds programs of its own).
 *
 * Outputs start filled with the canary 0x7FA5A5A5 (0x7FA5 for 16-bit out:
 * NaNs no kernel writes).
 */
#include "fuzz_case.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_fields.h"
#include "problem.h"
#include "reference.h"

#define FZ_WORK_CAP         1e6  /* B*Hq*M*N*(dk+dv) of a call that is run */
#define FZ_TOL              1e-4 /* norm-wise relative tolerance */
#define FZ_KNOWN_GOOD_EVERY 100
#define FZ_NDIMS            6 /* head/value dims a run builds fused programs for */

static const uint32_t CANARY = 0x7FA5A5A5u;
static const uint16_t CANARY16 = 0x7FA5u; /* a NaN in f16 and bf16 alike */

static const char *const t_name[T_COUNT] = {"q",       "k",       "v",          "out",    "mask",    "bias",   "lse",
                                            "weights", "entropy", "max_weight", "argmax", "k_scale", "v_scale"};
static const int t_output[T_COUNT] = {0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0};
static const int t_rank[T_COUNT] = {4, 4, 4, 4, 4, 4, 3, 4, 3, 3, 3, 3, 3};

const int fz_hostile_int[16] = {0,      -1,  INT_MAX, INT_MIN,     INT_MAX / 2 + 1, 65536,   46341, 1 << 20,
                                100000, 300, -2,      INT_MAX - 1, 0x10000001,      1 << 24, 3000,  40};
static const int dim_table[FZ_NDIMS] = {1, 3, 4, 16, 17, 32};
static const size_t hostile_stride[8] = {0, 1,           SIZE_MAX, (size_t)1 << 63, (size_t)1 << 62, (size_t)1 << 32,
                                         7, SIZE_MAX / 4};
static const size_t hostile_offset[8] = {SIZE_MAX,         SIZE_MAX - 1,    (size_t)1 << 40, SIZE_MAX / 4,
                                         SIZE_MAX / 2 + 1, (size_t)1 << 31, (size_t)1 << 32, SIZE_MAX - 1000};
static const float float_table[16] = {0.f,     0.5f,  -0.5f,  1.f,    -1.f, 0.25f, -0.25f,  0.125f,
                                      -0.125f, 0.75f, -0.75f, 0.375f, -1.f, 1.f,   0.0625f, -0.0625f};

static fz_stats stats;

/* Known library bugs to tolerate so a run can explore past them:
 * CLATTN_FUZZ_KNOWN is a comma-separated list of their names
 * ("alias": self-overlapping output views accepted; "nan-row-weights":
 * NaN weights for disallowed keys of a row whose scores hold NaN;
 * "ref-inf-row-diag": the reference's entropy and max_weight are 0, not
 * NaN, for a row whose weights are NaN because a score is +inf). */
static int known(const char *name) {
  const char *k = getenv("CLATTN_FUZZ_KNOWN");
  size_t len = strlen(name);
  while (k && *k) {
    if (!strncmp(k, name, len) && (k[len] == ',' || k[len] == 0)) return 1;
    k = strchr(k, ',');
    if (k) k++;
  }
  return 0;
}
static clattn_context *the_ctx;
static cp_problem *good_pb;

const fz_stats *fz_get_stats(void) { return &stats; }

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(char *why, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (why && n) vsnprintf(why, n, fmt, ap);
  va_end(ap);
  return FZ_FAIL;
}

clattn_context *fz_context(char *why, size_t n, int *no_device) {
  if (no_device) *no_device = 0;
  if (the_ctx) return the_ctx;
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.tuning_file = ""; /* AUTO keeps its built-in rule: FUSED, STAGED with weights */
  clattn_status st = clattn_create(&opt, &the_ctx);
  if (st != CLATTN_OK) {
    the_ctx = NULL;
    if (no_device) *no_device = st == CLATTN_ERR_NO_DEVICE;
    fail(why, n, "clattn_create: %s: %s", clattn_status_string(st), clattn_last_error(NULL));
    return NULL;
  }
  return the_ctx;
}

void fz_shutdown(void) {
  cp_free(good_pb);
  good_pb = NULL;
  clattn_destroy(the_ctx);
  the_ctx = NULL;
}

/* ---------- decoding ---------- */

uint8_t fz_rd(fz_reader *r) {
  if (r->i < r->n) return r->p[r->i++];
  /* splitmix64, finite values only (no 0xFD..0xFF specials) */
  uint64_t z = (r->prng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (uint8_t)(z % 0xF0);
}

static uint8_t hdr(const uint8_t *data, size_t size, size_t i) { return i < size ? data[i] : 0; }

static int dec_dim(uint8_t b, int which) {
  if (b >= 0xF0) return fz_hostile_int[b - 0xF0];
  switch (which) {
    case 0: return 1 + b % 3;
    case 1: return 1 + b % 8;
    case 2: return 1 + b % 4;
    case 3: return 1 + b % 33;
    case 4: return 1 + b % 48;
    default: return dim_table[b % FZ_NDIMS];
  }
}

static float dec_scale(uint8_t b) {
  static const float t[16] = {NAN,   1.f, 0.5f,     0.125f,    0.f,  -1.f,    0.25f,   -0.5f,
                              1e-3f, 2.f, INFINITY, -INFINITY, -0.f, FLT_MIN, 0.0625f, -NAN};
  return t[b % 16];
}

static int dec_window(uint8_t b) {
  static const int small[8] = {-1, 0, 1, 2, 3, 4, 7, 16};
  static const int hostile[4] = {-2, INT_MIN, INT_MAX, -1000};
  return b >= 0xF0 ? hostile[b & 3] : small[b % 8];
}

float fz_dec_float(uint8_t b) {
  if (b == 0xFD) return NAN;
  if (b == 0xFE) return INFINITY;
  if (b == 0xFF) return -INFINITY;
  return float_table[b % 16];
}

static size_t mul_w(size_t a, size_t b) { return a * b; } /* wrapping on purpose */

/* Mirrors validate.c's check_view arithmetic: bytes addressed, 0 on overflow. */
static int view_need(const clattn_tensor *t, const size_t *dims, int rank, size_t esize, size_t *need) {
  size_t last = t->offset;
  for (int d = 0; d < rank; d++) {
    size_t m = dims[d] - 1, step;
    if (m != 0 && t->stride[d] > SIZE_MAX / m) return 0;
    step = m * t->stride[d];
    if (step > SIZE_MAX - last) return 0;
    last += step;
  }
  if (last == SIZE_MAX || last + 1 > SIZE_MAX / esize) return 0;
  *need = (last + 1) * esize;
  return 1;
}

static void decode_view(fz_case *c, int t, const uint8_t vb[4], int present) {
  clattn_tensor *tv = NULL;
  clattn_params *p = &c->p;
  switch (t) {
    case T_Q: tv = &p->q; break;
    case T_K: tv = &p->k; break;
    case T_V: tv = &p->v; break;
    case T_OUT: tv = &p->out; break;
    case T_MASK: tv = &p->mask; break;
    case T_BIAS: tv = &p->bias; break;
    case T_LSE: tv = &p->lse; break;
    case T_W: tv = &p->weights; break;
    case T_ENT: tv = &p->entropy; break;
    case T_MAXW: tv = &p->max_weight; break;
    case T_ARGMAX: tv = &p->argmax; break;
    case T_KS: tv = &p->k_scale; break;
    default: tv = &p->v_scale; break;
  }
  memset(tv, 0, sizeof *tv);
  c->present[t] = present && vb[0] != 0xFF;
  if (!c->present[t]) return;
  size_t *D = c->dims[t];
  fz_view_dims(c, t, D);
  const size_t B = D[0], H = D[1], R = D[2], C = D[3];
  (void)B;
  size_t *s = tv->stride;
  const uint8_t mode = vb[0], off = vb[1], param = vb[3];
  size_t dense[4] = {mul_w(mul_w(H, R), C), mul_w(R, C), C, 1};
  switch (mode % 8) {
    case 0: memcpy(s, dense, sizeof dense); break;
    case 1:
      s[0] = mul_w(mul_w(R, H), C);
      s[1] = C;
      s[2] = mul_w(H, C);
      s[3] = 1;
      break;
    case 2: {
      size_t row = C + 1 + param % 4;
      s[0] = mul_w(mul_w(H, R), row);
      s[1] = mul_w(R, row);
      s[2] = row;
      s[3] = 1;
      break;
    }
    case 3:
      for (int d = 0; d < 4; d++) s[d] = (param >> d) & 1 ? 0 : dense[d];
      break;
    case 4:
      s[0] = dense[0];
      s[1] = dense[1];
      s[2] = 1;
      s[3] = R;
      break;
    case 5:
      s[0] = dense[0];
      s[1] = dense[1];
      s[2] = C + 1 ? param % (C + 1) : param;
      s[3] = 1;
      break;
    case 6:
      for (int d = 0; d < 4; d++) s[d] = mul_w(dense[d], (size_t)((param >> (2 * d)) & 3));
      break;
    default:
      for (int d = 0; d < 4; d++) s[d] = hostile_stride[((param >> (2 * d)) & 3) + 4 * ((off >> d) & 1)];
      break;
  }
  tv->offset = off >= 0xF0 ? hostile_offset[off & 7] : (mode % 8 == 7 ? 0 : off % 5);
  const size_t es = c->esize[t] = fz_view_esize(c, t);
  /* Dims that are not positive: allocate as if they were 1 (the call is
   * rejected before any view is looked at). */
  size_t Dn[4];
  for (int d = 0; d < 4; d++) Dn[d] = (long)D[d] > 0 ? D[d] : 1;
  c->need_ok[t] = view_need(tv, Dn, t_rank[t], es, &c->need[t]);
  const uint8_t sb = vb[2];
  size_t bytes;
  if (!c->need_ok[t] || c->need[t] > FZ_BUF_CAP) {
    bytes = (sb & 1) ? FZ_BUF_CAP : 64;
  } else {
    size_t need = c->need[t];
    switch (sb % 4) {
      case 0: bytes = need; break;
      case 1: bytes = need > es ? need - es : need; break;
      case 2: bytes = need + (size_t)((sb / 4) % 16) * es; break;
      default: bytes = need > 1 ? need - 1 : need; break;
    }
  }
  c->bytes[t] = bytes;
  fz_ext_adjust_view(c, t);
}

static void case_free(fz_case *c) {
  for (int t = 0; t < T_COUNT; t++) {
    if (c->mem[t]) clReleaseMemObject(c->mem[t]);
    free(c->host[t]);
  }
  if (c->kv_lens_mem) clReleaseMemObject(c->kv_lens_mem);
  free(c->kv_lens_host);
  for (int a = 0; a < A_COUNT; a++) {
    if (c->aux_mem[a]) clReleaseMemObject(c->aux_mem[a]);
    free(c->aux_host[a]);
  }
}

static void fill_canary(unsigned char *b, size_t bytes, size_t esize) {
  for (size_t i = 0; i < bytes; i++)
    b[i] = esize == 2 ? (unsigned char)(CANARY16 >> (8 * (i % 2))) : (unsigned char)(CANARY >> (8 * (i % 4)));
}

static uint64_t fnv(const uint8_t *d, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 1099511628211ull;
  return h;
}

/* Decodes the whole case (host side only). 0, or -1 out of host memory. */
static int decode(const uint8_t *input, size_t input_size, fz_case *c) {
  memset(c, 0, sizeof *c);
  /* the extension: the magic, its header, then an input of the first format */
  const uint8_t *data = input;
  size_t size = input_size;
  if (size >= FZ_MAGIC_LEN && !memcmp(data, FZ_MAGIC, FZ_MAGIC_LEN)) {
    c->ext = 1;
    const size_t skip = size < FZ_MAGIC_LEN + FZ_EXT ? size : FZ_MAGIC_LEN + FZ_EXT;
    for (size_t i = 0; i < FZ_EXT; i++) c->ext_hdr[i] = hdr(data, size, FZ_MAGIC_LEN + i);
    data += skip;
    size -= skip;
  }
  clattn_params *p = &c->p;
  *p = clattn_params_default();
  p->batch = dec_dim(hdr(data, size, 0), 0);
  p->q_heads = dec_dim(hdr(data, size, 1), 1);
  p->kv_heads = dec_dim(hdr(data, size, 2), 2);
  p->q_len = dec_dim(hdr(data, size, 3), 3);
  p->kv_len = dec_dim(hdr(data, size, 4), 4);
  p->head_dim = dec_dim(hdr(data, size, 5), 5);
  p->value_dim = dec_dim(hdr(data, size, 6), 6);
  uint8_t b = hdr(data, size, 7);
  static const int bad_dtype[8] = {3, -1, INT_MAX, 100, 7, -2, 1 << 20, 255};
  p->dtype = b < 0xF0 ? CLATTN_F32 : (clattn_dtype)bad_dtype[b & 7];
  p->scale = dec_scale(hdr(data, size, 8));
  b = hdr(data, size, 9);
  p->causal = b == 0xFF ? -7 : (b & 1);
  p->window_left = dec_window(hdr(data, size, 10));
  p->window_right = dec_window(hdr(data, size, 11));
  static const int bad_enum[4] = {2, -1, INT_MAX, 100};
  static const int bad_algo[4] = {4, -1, INT_MIN, 100};
  b = hdr(data, size, 12);
  p->empty_rows = b < 0xF8 ? (clattn_empty_rows)(b & 1) : (clattn_empty_rows)bad_enum[b & 3];
  b = hdr(data, size, 13);
  p->algo = b < 0xF8 ? (clattn_algo)(b % 4) : (clattn_algo)bad_algo[b & 3];
  const uint8_t f1 = hdr(data, size, 14), f2 = hdr(data, size, 15);
  c->want_done = f1 & 1;
  c->kv_lens = (f1 >> 1) & 1;
  c->call_null_ctx = (f2 >> 2) & 1;
  c->call_null_params = (f2 >> 3) & 1;
  c->kv = CLATTN_F32; /* the first format's k and v: f32 buffers, whatever byte 7 says */
  if (c->ext) fz_ext_header(c, c->ext_hdr);

  fz_reader r = {data, size, size < FZ_HEADER ? size : FZ_HEADER, fnv(input, input_size)};
  if (c->kv_lens) {
    const long B = p->batch;
    size_t want = B > 0 && (size_t)B <= FZ_BUF_CAP / 4 ? (size_t)B * 4 : 64;
    if ((f2 & 2) && want > 4) want -= 4;
    c->kv_lens_bytes = want;
    c->kv_lens_host = malloc(want);
    if (!c->kv_lens_host) return -1;
    const int N = p->kv_len;
    for (size_t i = 0; i < want / 4; i++) {
      uint8_t x = fz_rd(&r);
      const long long t[12] = {N, N, N - 1LL, 1, 0, -1, N / 2, N + 1LL, INT_MAX, INT_MIN, 2, N + 100LL};
      /* (hostile kv_len: wraps to int32 on purpose) */
      c->kv_lens_host[i] = x < 0xF0 ? (int32_t)(uint32_t)(unsigned long long)t[x % 12] : (int32_t)(x - 0xF8);
    }
  }
  if (fz_ext_data(c, &r) != 0) return -1;

  /* the views (their dims may depend on the extension's totals) */
  const int optional[T_COUNT] = {
      1,      1, 1, 1, (f1 >> 2) & 1, (f1 >> 3) & 1, (f1 >> 4) & 1, (f1 >> 5) & 1, (f1 >> 6) & 1, (f1 >> 7) & 1,
      f2 & 1, 0, 0};
  for (int t = 0; t < T_COUNT; t++) {
    uint8_t vb[4];
    int present = optional[t];
    if (t == T_KS || t == T_VS)
      present = fz_ext_view(c, t, vb);
    else
      for (int i = 0; i < 4; i++) vb[i] = hdr(data, size, 16 + 4 * (size_t)t + i);
    decode_view(c, t, vb, present);
  }
  for (int t = 0; t < T_COUNT; t++) {
    if (!c->present[t]) continue;
    c->host[t] = malloc(c->bytes[t]);
    if (!c->host[t]) return -1;
    if (t_output[t]) {
      fill_canary(c->host[t], c->bytes[t], c->esize[t]);
    } else if (t == T_MASK) {
      for (size_t i = 0; i < c->bytes[t]; i++) {
        uint8_t x = fz_rd(&r);
        c->host[t][i] = x % 4 == 0 ? 0 : x;
      }
    } else {
      fz_fill_input(c, t, &r);
    }
  }
  return 0;
}

static const clattn_tensor *view_of(const clattn_params *p, int t) {
  switch (t) {
    case T_Q: return &p->q;
    case T_K: return &p->k;
    case T_V: return &p->v;
    case T_OUT: return &p->out;
    case T_MASK: return &p->mask;
    case T_BIAS: return &p->bias;
    case T_LSE: return &p->lse;
    case T_W: return &p->weights;
    case T_ENT: return &p->entropy;
    case T_MAXW: return &p->max_weight;
    case T_ARGMAX: return &p->argmax;
    case T_KS: return &p->k_scale;
    default: return &p->v_scale;
  }
}

/* ---------- the host-side rules (clattn.h / validate.c) ---------- */

/* Whether output view t breaks clattn's rule against self-overlap (clattn.h):
 * ordered by stride, each dimension longer than 1 must step past the span
 * of the smaller ones. (Stricter than disjointness: interleaved dimensions
 * are refused too; check_accepted still checks accepted views by marking.) */
static int view_self_overlaps(const fz_case *c, int t) {
  const clattn_tensor *tv = view_of(&c->p, t);
  const size_t *D = c->dims[t];
  const size_t dims[4] = {D[0], D[1], D[2], t_rank[t] == 4 ? D[3] : 1};
  int used[4] = {0, 0, 0, 0};
  size_t span = 0;
  for (int n = 0; n < 4; n++) {
    int next = -1;
    for (int d = 0; d < 4; d++)
      if (!used[d] && dims[d] > 1 && (next < 0 || tv->stride[d] < tv->stride[next])) next = d;
    if (next < 0) break;
    used[next] = 1;
    if (tv->stride[next] <= span) return 1;
    span += (dims[next] - 1) * tv->stride[next];
  }
  return 0;
}

#define BIT(s) (1u << (unsigned)(s))

typedef struct {
  unsigned set;
  char *why;
  size_t at, n;
} prediction;

/* Adds a status and its reason to a prediction (the extension's rules' callback). */
static void add_reason(void *ctx, int status, const char *text) {
  prediction *pr = ctx;
  pr->set |= BIT(status);
  if (pr->at < pr->n) {
    int w = snprintf(pr->why + pr->at, pr->n - pr->at, "%s%s", pr->at ? "; " : "", text);
    if (w > 0) pr->at += (size_t)w;
  }
}

/* The set of statuses the rules allow for the call (0 = it must be
 * accepted), with the reasons. */
static unsigned predict(const fz_case *c, char *why, size_t n) {
  const clattn_params *p = &c->p;
  unsigned set = 0;
  size_t at = 0;
#define REASON(st, ...)                                    \
  do {                                                     \
    set |= BIT(st);                                        \
    if (at < n) {                                          \
      int w_ = snprintf(why + at, n - at, at ? "; " : ""); \
      if (w_ > 0) at += (size_t)w_;                        \
    }                                                      \
    if (at < n) {                                          \
      int w_ = snprintf(why + at, n - at, __VA_ARGS__);    \
      if (w_ > 0) at += (size_t)w_;                        \
    }                                                      \
  } while (0)
  if (n) why[0] = 0;
  const int dims[7] = {p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, p->head_dim, p->value_dim};
  int dims_ok = 1;
  for (int i = 0; i < 7; i++)
    if (dims[i] <= 0) {
      REASON(CLATTN_ERR_INVALID_ARGUMENT, "dim %d is %d", i, dims[i]);
      dims_ok = 0;
    }
  if (dims_ok && p->q_heads % p->kv_heads) {
    REASON(CLATTN_ERR_INVALID_ARGUMENT, "kv_heads %d does not divide q_heads %d", p->kv_heads, p->q_heads);
    dims_ok = 0;
  }
  if (dims_ok && (long long)p->batch * p->q_heads > INT_MAX) {
    REASON(CLATTN_ERR_INVALID_ARGUMENT, "batch*q_heads > INT_MAX");
    dims_ok = 0;
  }
  const int dtype = (int)p->dtype, empty = (int)p->empty_rows, algo = (int)p->algo;
  if (dtype < 0 || dtype > 2) REASON(CLATTN_ERR_INVALID_ARGUMENT, "dtype %d", dtype);
  if (empty != 0 && empty != 1) REASON(CLATTN_ERR_INVALID_ARGUMENT, "empty_rows %d", empty);
  if (algo < 0 || algo > 3) REASON(CLATTN_ERR_INVALID_ARGUMENT, "algo %d", algo);
  if (p->window_left < -1) REASON(CLATTN_ERR_INVALID_ARGUMENT, "window_left %d", p->window_left);
  if (p->window_right < -1) REASON(CLATTN_ERR_INVALID_ARGUMENT, "window_right %d", p->window_right);
  if (isinf(p->scale)) REASON(CLATTN_ERR_INVALID_ARGUMENT, "scale %g", (double)p->scale);
  if (dims_ok) {
    for (int t = 0; t < T_COUNT; t++) {
      if (!c->present[t]) {
        if (t <= T_OUT) REASON(CLATTN_ERR_INVALID_ARGUMENT, "%s.buf NULL", t_name[t]);
        continue;
      }
      if (t_output[t])
        for (int d = 0; d < t_rank[t]; d++)
          if (c->dims[t][d] > 1 && view_of(p, t)->stride[d] == 0)
            REASON(CLATTN_ERR_INVALID_ARGUMENT, "output %s broadcasts dim %d", t_name[t], d);
      if (!c->need_ok[t])
        REASON(CLATTN_ERR_INVALID_ARGUMENT, "%s overflows", t_name[t]);
      else {
        if (c->need[t] > c->bytes[t])
          REASON(CLATTN_ERR_BUFFER_TOO_SMALL, "%s needs %zu bytes, has %zu", t_name[t], c->need[t], c->bytes[t]);
        if (t_output[t] && view_self_overlaps(c, t))
          REASON(CLATTN_ERR_INVALID_ARGUMENT, "output %s overlaps itself", t_name[t]);
      }
    }
    if (c->kv_lens && (size_t)p->batch * 4 > c->kv_lens_bytes)
      REASON(CLATTN_ERR_BUFFER_TOO_SMALL, "kv_lens needs %zu bytes, has %zu", (size_t)p->batch * 4, c->kv_lens_bytes);
  }
  if (c->present[T_W] && algo == CLATTN_ALGO_FUSED) REASON(CLATTN_ERR_UNSUPPORTED, "weights with FUSED");
#undef REASON
  if (c->ext) {
    prediction pr = {set, why, at, n};
    fz_ext_rules(c, dims_ok, add_reason, &pr);
    set = pr.set;
  }
  return set;
}

/* ---------- running ---------- */

static int in_dim_table(int d) {
  for (int i = 0; i < FZ_NDIMS; i++)
    if (dim_table[i] == d) return 1;
  return 0;
}

static int is_canary(const unsigned char *b, size_t at, size_t esize) {
  if (esize == 2) {
    uint16_t x;
    memcpy(&x, b + at, 2);
    return x == CANARY16;
  }
  uint32_t x;
  memcpy(&x, b + at, 4);
  return x == CANARY;
}

/* Norm-wise comparison with exact NaN / inf classes; skip (per row of
 * row_len elements) may be NULL. */
static int compare(const char *name, const float *x, const double *r, size_t count, size_t row_len,
                   const unsigned char *skip, double tol, double atol, const unsigned char *nan_rows, const char *knob,
                   char *why, size_t n) {
  const int tolerate = knob && known(knob);
  double num = 0.0, den = 0.0;
  size_t used = 0;
  for (size_t i = 0; i < count; i++) {
    if (skip && skip[i / row_len]) continue;
    const double a = (double)x[i], b = r[i];
    if (tolerate && isnan(a) && !isnan(b) && nan_rows[i / row_len]) {
      stats.known_skipped++;
      continue;
    }
    if (isnan(a) != isnan(b) || (!isnan(a) && (!isfinite(a) || !isfinite(b)) && a != b)) {
      /* the whole row (up to 16 entries), device / reference */
      char row[1024];
      size_t at = 0, r0 = i / row_len * row_len;
      for (size_t k = r0; k < r0 + row_len && k < r0 + 16 && at < sizeof row; k++)
        at += (size_t)snprintf(row + at, sizeof row - at, " %g/%g", (double)x[k], r[k]);
      return fail(why, n, "%s[%zu] = %g, reference %g (class mismatch; row %zu: device/reference%s)", name, i, a, b,
                  i / row_len, row);
    }
    if (isfinite(a) && isfinite(b)) {
      num += (a - b) * (a - b);
      den += b * b;
      used++;
    }
  }
  if (sqrt(num) > tol * sqrt(den) + atol * sqrt((double)used))
    return fail(why, n, "%s: error norm %.3g against reference norm %.3g over %zu entries", name, sqrt(num), sqrt(den),
                used);
  return FZ_PASS;
}

/* The element index of the k-th entry of output view t in dense
 * [B,Hq,M,C] order. */
static size_t view_element(const fz_case *c, int t, size_t k) {
  const clattn_tensor *tv = view_of(&c->p, t);
  const size_t *D = c->dims[t];
  const size_t C = t_rank[t] == 4 ? D[3] : 1;
  const size_t j = k % C, i = k / C % D[2], h = k / C / D[2] % D[1], b = k / C / D[2] / D[1];
  return tv->offset + b * tv->stride[0] + h * tv->stride[1] + i * tv->stride[2] +
         (t_rank[t] == 4 ? j * tv->stride[3] : 0);
}

static size_t view_count(const fz_case *c, int t) {
  const size_t *D = c->dims[t];
  return D[0] * D[1] * D[2] * (t_rank[t] == 4 ? D[3] : 1);
}

/* Marks the elements of output view t; returns 1 when two results share an
 * element (the view overlaps itself). */
static int mark_view(const fz_case *c, int t, unsigned char *mark) {
  int alias = 0;
  for (size_t k = 0, n = view_count(c, t); k < n; k++) {
    const size_t e = view_element(c, t, k);
    alias |= mark[e];
    mark[e] = 1;
  }
  return alias;
}

/* Element e of output buffer t as a float (16-bit out in its storage). */
static float out_value(const fz_case *c, int t, const unsigned char *raw, size_t e) {
  if (c->esize[t] == 2) {
    uint16_t h;
    memcpy(&h, raw + e * 2, 2);
    return c->p.dtype == CLATTN_F16 ? cp_f16_value(h) : cp_bf16_value(h);
  }
  float f;
  memcpy(&f, raw + e * 4, 4);
  return f;
}

/* Dense [B,Hq,M,C] gather of output view t from its read-back buffer. Rows
 * that do not exist (past a packed sequence's end) gather 0; out's rows of
 * a packed sequence lie at its q0 + i. */
static void gather(const fz_case *c, int t, const unsigned char *raw, float *dst) {
  const clattn_params *p = &c->p;
  const clattn_tensor *tv = view_of(p, t);
  const size_t C = t_rank[t] == 4 ? c->dims[t][3] : 1;
  size_t k = 0;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++) {
        long row;
        const int here = fz_row_exists(c, b, i, &row);
        if (t != T_OUT) row = i;
        for (size_t j = 0; j < C; j++, k++)
          dst[k] = here ? out_value(c, t, raw, cp_index(tv, b, h, (int)row, (int)j)) : 0.0f;
      }
}

static const char *status_name(int s) {
  return s >= 0 && s <= CLATTN_ERR_OPENCL ? clattn_status_string((clattn_status)s) : "(not a status)";
}

/* The checks of an accepted call (OK or EMPTY_ROW). */
static int check_accepted(fz_case *c, clattn_status st, unsigned char *const *back, char *why, size_t n) {
  const clattn_params *p = &c->p;
  const int B = p->batch, Hq = p->q_heads, M = p->q_len, N = p->kv_len, dv = p->value_dim;
  const size_t rows = (size_t)B * Hq * M;
  int verdict = FZ_PASS;
  /* Packed sequences: rows past a sequence's end do not exist, and out rows
   * that no sequence (or several: malformed offsets) claims have no
   * defined value, so an output element may keep its canary; the
   * comparisons below catch unwritten rows that do exist. */
  const int may_keep_canary = c->p.cu_seqlens_q != NULL;

  /* every element of every output view written, nothing outside them */
  for (int t = T_OUT; t < T_COUNT; t++) {
    if (!t_output[t] || !c->present[t]) continue;
    const size_t es = c->esize[t];
    unsigned char *mark = calloc(c->bytes[t] / es + 1, 1);
    if (!mark) return fail(why, n, "harness: out of host memory");
    if (mark_view(c, t, mark)) {
      free(mark);
      if (known("alias")) {
        stats.known_skipped++;
        return FZ_PASS;
      }
      return fail(why, n,
                  "accepted (%s) an output view whose elements overlap: %s strides {%zu,%zu,%zu,%zu}, "
                  "so several results share an element",
                  status_name(st), t_name[t], view_of(p, t)->stride[0], view_of(p, t)->stride[1],
                  view_of(p, t)->stride[2], view_of(p, t)->stride[3]);
    }
    const size_t elems = c->bytes[t] / es;
    for (size_t e = 0; e < elems && verdict == FZ_PASS; e++) {
      const int canary = is_canary(back[t], e * es, es);
      if (mark[e] && canary && !may_keep_canary)
        verdict = fail(why, n, "%s[%zu] inside the view was not written (still the canary)", t_name[t], e);
      else if (!mark[e] && !canary)
        verdict = fail(why, n, "%s[%zu] outside the view was written (%g)", t_name[t], e,
                       (double)out_value(c, t, back[t], e));
    }
    for (size_t e = elems * es; e < c->bytes[t] && verdict == FZ_PASS; e++)
      if (back[t][e] != c->host[t][e])
        verdict = fail(why, n, "%s: byte %zu past the last element was written", t_name[t], e);
    free(mark);
    if (verdict != FZ_PASS) return verdict;
  }

  /* the fp64 reference on host copies of exactly the uploaded buffers, as
   * the kernels read them (16-bit values widened, quantised ones
   * dequantised, paged keys gathered) */
  fz_ref fr;
  ref_outputs ro;
  memset(&ro, 0, sizeof ro);
  double *ref = calloc(rows * (size_t)dv + rows * 3 + rows * (size_t)N + 1, sizeof(double));
  int32_t *ref_arg = calloc(rows + 1, sizeof(int32_t));
  float *got = calloc(rows * ((size_t)dv + (size_t)N) + 1, sizeof(float));
  unsigned char *skip = calloc(rows + 1, 1), *nan_rows = calloc(rows + 1, 1), *gone = calloc(rows + 1, 1);
  unsigned char *claims = NULL;
  const int built = fz_ref_build(c, &fr);
  const clattn_params *rp = &fr.rp;
  const ref_inputs in = fr.in;
  if (!ref || !ref_arg || !got || !skip || !nan_rows || !gone || built != 0) {
    verdict = fail(why, n, "harness: out of host memory");
    goto done;
  }
  /* storage tolerances: 16-bit out rounds each element; quantised K/V and
   * larger scores cost f32 digits */
  const int quantised = c->kv == CLATTN_Q8_0 || c->kv == CLATTN_INT8;
  const double tol = fmax(p->dtype == CLATTN_F16    ? 1e-3
                          : p->dtype == CLATTN_BF16 ? 8e-3
                                                    : FZ_TOL,
                          quantised ? 1e-3 : FZ_TOL);
  const double tol_f32 = quantised ? 1e-3 : FZ_TOL;
  /* rows that do not exist, and out rows claimed by other than one sequence */
  if (may_keep_canary) {
    const size_t out_rows = c->dims[T_OUT][2] + 1;
    claims = calloc(out_rows, 1);
    if (!claims) {
      verdict = fail(why, n, "harness: out of host memory");
      goto done;
    }
    for (int b = 0; b < B; b++)
      for (int i = 0; i < M; i++) {
        long orow;
        if (fz_row_exists(c, b, i, &orow) && orow >= 0 && (size_t)orow < out_rows && claims[orow] < 2) claims[orow]++;
      }
    for (size_t row = 0; row < rows; row++) {
      long orow;
      const int b = (int)(row / ((size_t)Hq * M)), i = (int)(row % M);
      gone[row] = !fz_row_exists(c, b, i, &orow);
      skip[row] = gone[row] || orow < 0 || (size_t)orow >= out_rows || claims[orow] != 1;
    }
  }
  ro.out = ref;
  ro.lse = ref + rows * (size_t)dv;
  ro.entropy = ro.lse + rows;
  ro.max_weight = ro.entropy + rows;
  ro.weights = ro.max_weight + rows;
  ro.argmax = ref_arg;
  if (ref_forward(rp, &in, &ro) != 0) {
    verdict = fail(why, n, "harness: ref_forward rejected accepted params");
    goto done;
  }
  const int want_error = p->empty_rows == CLATTN_EMPTY_ERROR && ro.empty_rows > 0;
  if ((st == CLATTN_ERR_EMPTY_ROW) != want_error) {
    verdict = fail(why, n, "status %s but the reference has %ld empty rows (empty_rows policy %d)", status_name(st),
                   ro.empty_rows, (int)p->empty_rows);
    goto done;
  }

  /* A key whose fp64 weight is below f32's range is 0 on the device, whose
   * kernels never multiply a zero weight into a value; the reference
   * multiplies it (0 * inf = NaN). Such rows' outputs are not compared
   * when that key's value holds NaN or inf. */
  const int group = Hq / p->kv_heads;
  for (size_t row = 0; row < rows; row++) {
    const int b = (int)(row / ((size_t)Hq * M)), h = (int)(row / M % Hq);
    const ref_seq sq = ref_sequence(rp, &in, b);
    for (int j = 0; j < N && !skip[row]; j++) {
      const double w = ro.weights[row * N + j];
      if (!(w > 0.0 && w < 1e-30)) continue;
      for (int d = 0; d < dv; d++)
        if (!isfinite(in.v[cp_index(&rp->v, b, h / group, (int)sq.k0 + j, d)])) skip[row] = 1;
    }
  }

  /* rows whose reference weights hold NaN (a NaN or +inf score) */
  for (size_t row = 0; row < rows; row++)
    for (int j = 0; j < N; j++)
      if (isnan(ro.weights[row * N + j])) nan_rows[row] = 1;

  gather(c, T_OUT, back[T_OUT], got);
  if ((verdict = compare("out", got, ro.out, rows * (size_t)dv, (size_t)dv, skip, tol, 1e-5, NULL, NULL, why, n)))
    goto done;
  if (c->present[T_LSE]) {
    gather(c, T_LSE, back[T_LSE], got);
    if ((verdict = compare("lse", got, ro.lse, rows, 1, gone, tol_f32, 1e-5, NULL, NULL, why, n))) goto done;
  }
  if (c->present[T_W]) {
    gather(c, T_W, back[T_W], got);
    if ((verdict = compare("weights", got, ro.weights, rows * (size_t)N, (size_t)N, gone, tol_f32, 1e-5, nan_rows,
                           "nan-row-weights", why, n)))
      goto done;
  }
  if (c->present[T_ENT]) {
    gather(c, T_ENT, back[T_ENT], got);
    if ((verdict =
             compare("entropy", got, ro.entropy, rows, 1, gone, tol_f32, 1e-4, nan_rows, "ref-inf-row-diag", why, n)))
      goto done;
  }
  if (c->present[T_MAXW]) {
    gather(c, T_MAXW, back[T_MAXW], got);
    if ((verdict = compare("max_weight", got, ro.max_weight, rows, 1, gone, tol_f32, 1e-5, nan_rows, "ref-inf-row-diag",
                           why, n)))
      goto done;
  }
  if (c->present[T_ARGMAX]) {
    gather(c, T_ARGMAX, back[T_ARGMAX], got);
    const int32_t *arg = (const int32_t *)(const void *)got;
    for (size_t row = 0; row < rows; row++) {
      const int32_t want = ref_arg[row], have = arg[row];
      if (want == REF_ARGMAX_UNSPECIFIED || have == want || gone[row]) continue;
      const int b = (int)(row / ((size_t)Hq * M)), h = (int)(row / M % Hq), i = (int)(row % M);
      int ok = want >= 0 && have >= 0 && have < N && ref_allowed(rp, &in, b, h, i, have);
      if (ok) {
        const double top = ref_score(rp, &in, b, h, i, want);
        ok = ref_score(rp, &in, b, h, i, have) >= top - 1e-5 * fmax(1.0, fabs(top)) * (quantised ? 100 : 1);
      }
      if (!ok) {
        verdict = fail(why, n, "argmax[row %zu] = %d, reference %d", row, (int)have, (int)want);
        goto done;
      }
    }
  }
done:
  fz_ref_free(&fr);
  free(claims);
  free(gone);
  free(ref);
  free(ref_arg);
  free(got);
  free(skip);
  free(nan_rows);
  return verdict;
}

int fz_known_good(char *why, size_t n) {
  clattn_context *ctx = fz_context(why, n, NULL);
  if (!ctx) return FZ_FAIL;
  stats.known_good++;
  if (!good_pb) {
    cp_shape s = cp_shape_default();
    s.q_len = 19;
    s.kv_len = 23;
    s.causal = 1;
    s.want_lse = 1;
    s.want_diag = 1;
    char err[256];
    good_pb = cp_build(&s, err, sizeof err);
    if (!good_pb) return fail(why, n, "harness: cp_build: %s", err);
  }
  cp_result r;
  if (cp_run(good_pb, ctx, &r) != 0) return fail(why, n, "known-good call: harness: %s", good_pb->err);
  if (!cp_result_ok(&r, 1e-5)) {
    char line[512];
    return fail(why, n, "known-good call failed after earlier inputs: %s (last error: %s)",
                cp_result_format(&r, line, sizeof line), clattn_last_error(ctx));
  }
  return FZ_PASS;
}

int fz_warm_up(char *why, size_t n) {
  clattn_context *ctx = fz_context(why, n, NULL);
  if (!ctx || fz_known_good(why, n) != FZ_PASS) return FZ_FAIL;
  /* CLATTN_FUZZ_WARM_PART=i/n: this process builds only every n-th of the
   * programs below from the i-th (tools/scripts/fuzz.sh runs n such
   * processes side by side to fill the kernel caches before the timed run) */
  const char *part_env = getenv("CLATTN_FUZZ_WARM_PART");
  int part = 0, parts = 1;
  if (!part_env || sscanf(part_env, "%d/%d", &part, &parts) != 2 || parts < 1) part = 0, parts = 1;
  int program = 0; /* counts the programs below, this process's and the others' */
  /* each twice: without and with dropout (the fused programs that drop
   * weights are programs of their own) */
  for (int a = 0; a < FZ_NDIMS; a++)
    for (int b = 0; b < FZ_NDIMS; b++)
      for (int algo = 0; algo < 8; algo++) {
        if (algo % 4 != CLATTN_ALGO_FUSED && (a || b))
          continue; /* the staged and GEMM programs do not depend on the dims */
        if (program++ % parts != part) continue;
        cp_shape s = cp_shape_default();
        s.q_len = 3;
        s.kv_len = 5;
        s.head_dim = dim_table[a];
        s.value_dim = dim_table[b];
        s.algo = (clattn_algo)(algo % 4);
        s.want_weights = s.algo == CLATTN_ALGO_STAGED || s.algo == CLATTN_ALGO_GEMM;
        s.dropout_p = algo < 4 ? 0.f : 0.5f;
        char err[256];
        cp_problem *pb = cp_build(&s, err, sizeof err);
        if (!pb) return fail(why, n, "harness: cp_build: %s", err);
        cp_result r;
        int ok = cp_run(pb, ctx, &r) == 0 && cp_result_ok(&r, 1e-5);
        if (!ok) {
          char line[512];
          fail(why, n, "warm-up dk=%d dv=%d algo=%d dropout %g: %s %s", s.head_dim, s.value_dim, (int)s.algo,
               (double)s.dropout_p, cp_result_format(&r, line, sizeof line), pb->err);
        }
        cp_free(pb);
        if (!ok) return FZ_FAIL;
      }
  /* every storage pair of the extension (q/out f32, f16, bf16; K/V f32,
   * f16, bf16, Q8_0, INT8) on each path, head dims 32, without and with
   * dropout: inputs of the extended format, checked like any other */
  for (int dtype = 0; dtype < 3; dtype++)
    for (int kv = 1; kv <= 5; kv++)
      for (int algo = 1; algo <= 3; algo++)
        for (int drop = 0; drop < 2; drop++) {
          if (program++ % parts != part) continue;
          uint8_t in[FZ_MAGIC_LEN + FZ_EXT + FZ_HEADER] = {0};
          memcpy(in, FZ_MAGIC, FZ_MAGIC_LEN);
          in[FZ_MAGIC_LEN + 0] = (uint8_t)dtype;
          in[FZ_MAGIC_LEN + 1] = (uint8_t)kv;
          in[FZ_MAGIC_LEN + 21] = (uint8_t)drop; /* dropout_p 0 or 0.5 */
          uint8_t *h = in + FZ_MAGIC_LEN + FZ_EXT;
          h[3] = 2;        /* q_len 3 */
          h[4] = 4;        /* kv_len 5 */
          h[5] = h[6] = 5; /* head and value dim 32 */
          h[13] = (uint8_t)algo;
          char w[1024];
          if (fz_run(in, sizeof in, w, sizeof w) != FZ_PASS)
            return fail(why, n, "warm-up dtype %d kv_dtype %d algo %d dropout %d: %s", dtype, kv - 1, algo, drop, w);
        }
  return FZ_PASS;
}

int fz_run(const uint8_t *data, size_t size, char *why, size_t n) {
  if (n) why[0] = 0;
  stats.inputs++;
  if (stats.inputs % FZ_KNOWN_GOOD_EVERY == 0 && fz_known_good(why, n) != FZ_PASS) return FZ_FAIL;

  fz_case c;
  unsigned char *back[T_COUNT] = {0};
  int verdict = FZ_PASS;
  if (decode(data, size, &c) != 0) {
    case_free(&c);
    return fail(why, n, "harness: out of host memory");
  }
  char reasons[1024];
  const unsigned set = predict(&c, reasons, sizeof reasons);
  const clattn_params *p = &c.p;
  if (!set) {
    /* a call the rules accept: run it only when it is cheap and its head
     * dims are among the few whose fused program is built (seconds each) */
    const double work = (double)p->batch * p->q_heads * p->q_len * p->kv_len * (p->head_dim + p->value_dim) +
                        (double)c.dims[T_K][0] * p->kv_heads * c.dims[T_K][2] * (p->head_dim + p->value_dim);
    /* storage other than f32 builds programs of its own: only for head dims 32 */
    const int f32 = p->dtype == CLATTN_F32 && c.kv == CLATTN_F32;
    if (work > FZ_WORK_CAP || !in_dim_table(p->head_dim) || !in_dim_table(p->value_dim) ||
        (!f32 && (p->head_dim != 32 || p->value_dim != 32))) {
      stats.skipped++;
      case_free(&c);
      return FZ_SKIP;
    }
  }
  clattn_context *ctx = fz_context(why, n, NULL);
  if (!ctx) {
    case_free(&c);
    return FZ_FAIL;
  }
  cl_context clc = clattn_cl_context(ctx);
  cl_command_queue queue = clattn_cl_queue(ctx);
  for (int t = 0; t < T_COUNT; t++) {
    if (!c.present[t]) continue;
    cl_int e = CL_SUCCESS;
    c.mem[t] = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.bytes[t], c.host[t], &e);
    if (e != CL_SUCCESS) {
      verdict = fail(why, n, "harness: clCreateBuffer(%s, %zu bytes): %d", t_name[t], c.bytes[t], (int)e);
      goto out;
    }
  }
  if (c.kv_lens) {
    cl_int e = CL_SUCCESS;
    c.kv_lens_mem = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.kv_lens_bytes, c.kv_lens_host, &e);
    if (e != CL_SUCCESS) {
      verdict = fail(why, n, "harness: clCreateBuffer(kv_lens): %d", (int)e);
      goto out;
    }
  }
  for (int a = 0; a < A_COUNT; a++) {
    if (!c.aux[a]) continue;
    cl_int e = CL_SUCCESS;
    c.aux_mem[a] = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.aux_bytes[a], c.aux_host[a], &e);
    if (e != CL_SUCCESS) {
      verdict = fail(why, n, "harness: clCreateBuffer(extension buffer %d): %d", a, (int)e);
      goto out;
    }
  }
  clattn_params *pp = &c.p;
  pp->q.buf = c.mem[T_Q];
  pp->k.buf = c.mem[T_K];
  pp->v.buf = c.mem[T_V];
  pp->out.buf = c.mem[T_OUT];
  pp->mask.buf = c.mem[T_MASK];
  pp->bias.buf = c.mem[T_BIAS];
  pp->lse.buf = c.mem[T_LSE];
  pp->weights.buf = c.mem[T_W];
  pp->entropy.buf = c.mem[T_ENT];
  pp->max_weight.buf = c.mem[T_MAXW];
  pp->argmax.buf = c.mem[T_ARGMAX];
  pp->kv_lens = c.kv_lens_mem;
  pp->k_scale.buf = c.mem[T_KS];
  pp->v_scale.buf = c.mem[T_VS];
  pp->cu_seqlens_q = c.aux_mem[A_CU_Q];
  pp->cu_seqlens_k = c.aux_mem[A_CU_K];
  pp->block_table = c.aux_mem[A_TABLE];
  pp->alibi_slopes = c.aux_mem[A_ALIBI];
  pp->sinks = c.aux_mem[A_SINKS];
  pp->additive_w = c.aux_mem[A_ADDW];
  pp->cache_leftpad = c.aux_mem[A_LEFTPAD];

  /* NULL context / params: rejected, nothing touched */
  if (c.call_null_ctx) {
    clattn_status s = clattn_forward(NULL, pp, 0, NULL, NULL);
    if (s != CLATTN_ERR_INVALID_ARGUMENT) {
      verdict = fail(why, n, "clattn_forward(NULL ctx) = %s", status_name(s));
      goto out;
    }
  }
  if (c.call_null_params) {
    clattn_status s = clattn_forward(ctx, NULL, 0, NULL, NULL);
    if (s != CLATTN_ERR_INVALID_ARGUMENT) {
      verdict = fail(why, n, "clattn_forward(NULL params) = %s", status_name(s));
      goto out;
    }
  }
  /* a sentinel failure first: a rejection must leave a message of its own */
  char sentinel[512];
  (void)clattn_forward(ctx, pp, 1, NULL, NULL);
  snprintf(sentinel, sizeof sentinel, "%s", clattn_last_error(ctx));

  int dummy;
  cl_event done = (cl_event)(void *)&dummy; /* must be overwritten */
  stats.calls++;
  const clattn_status st = clattn_forward(ctx, pp, 0, NULL, c.want_done ? &done : NULL);
  cl_int e = clFinish(queue);
  if (e != CL_SUCCESS) {
    verdict = fail(why, n, "clFinish after clattn_forward (%s): %d", status_name(st), (int)e);
    goto out;
  }
  if (getenv("CLATTN_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz: status %s; rules: %s\n", status_name(st), set ? reasons : "accept");
  if ((int)st < CLATTN_OK || (int)st > CLATTN_ERR_OPENCL) {
    verdict = fail(why, n, "clattn_forward returned %d, not a clattn_status", (int)st);
    goto out;
  }
  for (int t = 0; t < T_COUNT; t++) {
    if (!t_output[t] || !c.present[t]) continue;
    back[t] = malloc(c.bytes[t]);
    if (!back[t]) {
      verdict = fail(why, n, "harness: out of host memory");
      goto out;
    }
    e = clEnqueueReadBuffer(queue, c.mem[t], CL_TRUE, 0, c.bytes[t], back[t], 0, NULL, NULL);
    if (e != CL_SUCCESS) {
      verdict = fail(why, n, "harness: clEnqueueReadBuffer(%s): %d", t_name[t], (int)e);
      goto out;
    }
  }

  if (st == CLATTN_OK || st == CLATTN_ERR_EMPTY_ROW) {
    if (c.want_done && st == CLATTN_OK) {
      if (!done || done == (cl_event)(void *)&dummy) {
        verdict = fail(why, n, "status ok but *done was not set");
        goto out;
      }
      clWaitForEvents(1, &done);
      clReleaseEvent(done);
    } else if (c.want_done && done && done != (cl_event)(void *)&dummy) {
      clReleaseEvent(done);
    }
    stats.accepted++;
    stats.ext_accepted += c.ext;
    if (st == CLATTN_ERR_EMPTY_ROW) stats.empty_row++;
    if (set) {
      verdict = fail(why, n, "accepted (%s) a call the rules reject: %s", status_name(st), reasons);
      goto out;
    }
    verdict = check_accepted(&c, st, back, why, n);
  } else {
    stats.rejected++;
    const char *msg = clattn_last_error(ctx);
    if (!set)
      verdict = fail(why, n, "rejected a valid call: %s: %s", status_name(st), msg);
    else if (!(set & BIT(st)))
      verdict = fail(why, n, "status %s is not among the rules' answers (%s): %s", status_name(st), reasons, msg);
    else if (!msg || !msg[0] || !strcmp(msg, sentinel))
      verdict = fail(why, n, "%s without a message of its own (last error: \"%s\")", status_name(st), msg ? msg : "");
    else if (c.want_done && done != NULL)
      verdict = fail(why, n, "%s but *done is not NULL", status_name(st));
    for (int t = 0; t < T_COUNT && verdict == FZ_PASS; t++)
      if (back[t] && memcmp(back[t], c.host[t], c.bytes[t]) != 0)
        verdict = fail(why, n, "%s but output %s was touched", status_name(st), t_name[t]);
  }
out:
  for (int t = 0; t < T_COUNT; t++) free(back[t]);
  case_free(&c);
  return verdict;
}

void fz_describe(const uint8_t *data, size_t size, char *buf, size_t n) {
  fz_case c;
  if (decode(data, size, &c) != 0) {
    case_free(&c);
    snprintf(buf, n, "(out of memory)");
    return;
  }
  const clattn_params *p = &c.p;
  size_t at = (size_t)snprintf(buf, n,
                               "B=%d Hq=%d Hkv=%d M=%d N=%d dk=%d dv=%d dtype=%d scale=%g causal=%d win=[%d,%d] "
                               "empty=%d algo=%d kv_lens=%d",
                               p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, p->head_dim, p->value_dim,
                               (int)p->dtype, (double)p->scale, p->causal, p->window_left, p->window_right,
                               (int)p->empty_rows, (int)p->algo, c.kv_lens);
  if (c.ext && at < n)
    at +=
        (size_t)snprintf(buf + at, n - at,
                         " kv_dtype=%d softcap=%g score=%d alibi=%d sinks=%d additive_w=%d cu_seqlens=%d/%d "
                         "total=%d/%d block_table=%d page_size=%d num_pages=%d bt_stride=%d dropout_p=%g "
                         "seed=%#llx offset=%#llx cache_leftpad=%d",
                         (int)p->kv_dtype, (double)p->softcap, (int)p->score, c.aux[A_ALIBI], c.aux[A_SINKS],
                         c.aux[A_ADDW], c.aux[A_CU_Q], c.aux[A_CU_K], p->total_q, p->total_kv, c.aux[A_TABLE],
                         p->page_size, p->num_pages, p->block_table_stride, (double)p->dropout_p,
                         (unsigned long long)p->dropout_seed, (unsigned long long)p->dropout_offset, c.aux[A_LEFTPAD]);
  for (int t = 0; t < T_COUNT && at < n; t++) {
    if (!c.present[t]) continue;
    const clattn_tensor *tv = view_of(p, t);
    at += (size_t)snprintf(buf + at, n - at, " %s{off %zu, strides %zu %zu %zu %zu, %zu/%zu bytes}", t_name[t],
                           tv->offset, tv->stride[0], tv->stride[1], tv->stride[2], tv->stride[3],
                           c.need_ok[t] ? c.need[t] : (size_t)0, c.bytes[t]);
  }
  case_free(&c);
}

void fz_initialize(const char *who, int (*warm_up)(char *why, size_t n)) {
  char why[1024];
  int no_device = 0;
  if (!fz_context(why, sizeof why, &no_device)) {
    fprintf(stderr, "%s: %s\n", who, why);
    exit(no_device ? 77 : 1);
  }
  if (warm_up(why, sizeof why) != FZ_PASS) {
    fprintf(stderr, "%s: warm-up: %s\n", who, why);
    exit(1);
  }
  /* POCL's LLVM installs its own handlers for SIGILL, SIGABRT, SIGFPE and
   * SIGBUS while it builds kernels; libFuzzer never overrides an existing
   * handler, and LLVM's re-raises the signal without libFuzzer saving the
   * input. Back to the defaults, so libFuzzer installs its crash handler
   * (installed after this function returns). SIGSEGV stays with ASan, whose
   * report ends in libFuzzer's death callback. */
  signal(SIGILL, SIG_DFL);
  signal(SIGABRT, SIG_DFL);
  signal(SIGFPE, SIG_DFL);
  signal(SIGBUS, SIG_DFL);
}
