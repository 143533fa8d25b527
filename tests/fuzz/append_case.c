/*
 * Decoding and checking of one clattn_kv_append fuzz input (append_case.h).
 *
 * Input format (bytes past the end read as 0; tools/scripts/fuzz_seeds.py writes it):
 *   0..4   batch, kv_heads, new_len, head_dim, value_dim: < 0xF0 small
 *          (batch 1..3, kv_heads 1..3, new_len 0..5, dims 32 64 3 17),
 *          else hostile_int (0, -1, INT_MAX, INT_MIN, ...)
 *   5      src_dtype (b % 4): F32 F16 BF16, 3 Q8_0 (refused)
 *   6      kv_dtype (b % 8): SAME F32 F16 BF16 Q8_0 INT8, 6 out of range (10), 7 Q8_0
 *   7      flags: 1 paged, 2 k_scale / v_scale present exactly when kv is
 *          NOT INT8, 4 positions NULL, 8 positions one int short, 16 block
 *          table one entry short
 *   8..11  capacity 1 + b % 12, page_size 1 + b % 8, num_pages 1 + b % 8,
 *          block_table_stride ceil(new_len / page_size) + 0, 1, 2, -1
 *          (b % 4); >= 0xF0 hostile_int
 *   12..35 six views (k_new v_new k v k_scale v_scale), 4 bytes each:
 *          mode (0xFF NULL; % 4: 0 dense, 1 row gap 1 + param % 3, 2
 *          hostile strides by param's bit pairs, 3 row stride 0), offset
 *          (< 0xF0 b % 3 units, else huge), size (% 4: exact, one unit
 *          short, (b / 4) % 8 units more, one byte short), param (bit 7: a
 *          Q8_0 cache view's offset made odd). Q8_0 views are decoded in
 *          34-byte blocks, then in bytes.
 *   36..   data: positions (< 0xF0 -1 .. rows + 1, else INT_MAX, INT_MIN,
 *          ...), the block table (< 0xF0 b % num_pages, else -1,
 *          num_pages, INT_MIN, ...), then k_new and v_new values (the forward
 *          harness's float table times 1..4, finite). The cache starts as a
 *          byte pattern (scales -1.25).
 */
#include "append_case.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_case.h"
#include "fuzz_fields.h"
#include "problem.h"

#define AP_HEADER   36
#define AP_WORK_CAP 2e5

enum { V_KN, V_VN, V_K, V_V, V_KS, V_VS, V_COUNT };
static const char *const v_name[V_COUNT] = {"k_new", "v_new", "k", "v", "k_scale", "v_scale"};

typedef struct {
  clattn_append_params ap;
  clattn_dtype kv;
  int paged, present[V_COUNT], q8[V_COUNT], need_ok[V_COUNT];
  size_t dims[V_COUNT][4], esize[V_COUNT], need[V_COUNT], bytes[V_COUNT];
  unsigned char *host[V_COUNT];
  cl_mem mem[V_COUNT];
  int positions_null;
  size_t pos_bytes, table_bytes;
  int32_t *pos, *table;
  cl_mem pos_mem, table_mem;
} ap_case;

static uint8_t hb(const uint8_t *d, size_t n, size_t i) { return i < n ? d[i] : 0; }
static int small(uint8_t b, int base, int mod) { return b < 0xF0 ? base + b % mod : fz_hostile_int[b - 0xF0]; }
static size_t mul_w(size_t a, size_t b) { return a * b; }

static clattn_tensor *view(const ap_case *c, int v) {
  clattn_append_params *a = (clattn_append_params *)&c->ap;
  clattn_tensor *t[V_COUNT] = {&a->k_new, &a->v_new, &a->k, &a->v, &a->k_scale, &a->v_scale};
  return t[v];
}

/* validate.c's arithmetic: bytes addressed by dims / strides (rank 4; a
 * rank-3 view has dims[3] 1), 0 on overflow */
static int need_of(const clattn_tensor *t, const size_t *dims, size_t esize, size_t *need) {
  size_t last = t->offset;
  for (int d = 0; d < 4; d++) {
    const size_t m = ((long)dims[d] > 0 ? dims[d] : 1) - 1;
    if (m != 0 && t->stride[d] > SIZE_MAX / m) return 0;
    if (m * t->stride[d] > SIZE_MAX - last) return 0;
    last += m * t->stride[d];
  }
  if (last == SIZE_MAX || last + 1 > SIZE_MAX / esize) return 0;
  *need = (last + 1) * esize;
  return 1;
}

/* validate.c's view_overlaps */
static int overlaps(const size_t *stride, const size_t *dims, int rank) {
  int order[4], n = 0;
  for (int d = 0; d < rank; d++) {
    if ((long)dims[d] <= 1) continue;
    int at = n++;
    while (at > 0 && stride[order[at - 1]] > stride[d]) {
      order[at] = order[at - 1];
      at--;
    }
    order[at] = d;
  }
  size_t span = 0;
  for (int k = 0; k < n; k++) {
    if (stride[order[k]] <= span) return 1;
    span += (dims[order[k]] - 1) * stride[order[k]];
  }
  return 0;
}

/* The byte view of a Q8_0 cache view (blocks as runs of bytes). */
static void q8_bytes(const ap_case *c, int v, clattn_tensor *t, size_t dims[4]) {
  *t = *view(c, v);
  t->stride[3] = 1;
  memcpy(dims, c->dims[v], sizeof c->dims[v]);
  dims[3] = c->dims[v][3] * 34;
}

static void decode_view(ap_case *c, int v, const uint8_t vb[4], int present) {
  const clattn_append_params *a = &c->ap;
  clattn_tensor *t = view(c, v);
  memset(t, 0, sizeof *t);
  c->present[v] = present && vb[0] != 0xFF;
  const int cache = v >= V_K, cols = v == V_KN || v == V_K ? a->head_dim : v == V_VN || v == V_V ? a->value_dim : 1;
  size_t *D = c->dims[v];
  D[0] = (size_t)(long)(cache && c->paged ? a->num_pages : a->batch);
  D[1] = (size_t)(long)a->kv_heads;
  D[2] = (size_t)(long)(!cache ? a->new_len : c->paged ? a->page_size : a->capacity);
  D[3] = (size_t)(long)cols;
  c->q8[v] = (v == V_K || v == V_V) && c->kv == CLATTN_Q8_0;
  if (c->q8[v]) D[3] = cols >= 32 ? (size_t)cols / 32 : 1;
  c->esize[v] = v < V_K                ? (a->src_dtype == CLATTN_F16 || a->src_dtype == CLATTN_BF16 ? 2 : 4)
                : v >= V_KS            ? 4
                : c->q8[v]             ? 34
                : c->kv == CLATTN_F32  ? 4
                : c->kv == CLATTN_INT8 ? 1
                                       : 2;
  if (!c->present[v]) return;
  size_t Dn[4];
  for (int d = 0; d < 4; d++) Dn[d] = (long)D[d] > 0 ? D[d] : 1;
  size_t *s = t->stride;
  const size_t dense[4] = {mul_w(mul_w(Dn[1], Dn[2]), Dn[3]), mul_w(Dn[2], Dn[3]), Dn[3], 1};
  static const size_t hostile[4] = {0, 1, SIZE_MAX, (size_t)1 << 62};
  const uint8_t mode = vb[0], param = vb[3];
  switch (mode % 4) {
    case 0: memcpy(s, dense, sizeof dense); break;
    case 1: {
      const size_t row = Dn[3] + 1 + param % 3;
      s[0] = mul_w(mul_w(Dn[1], Dn[2]), row);
      s[1] = mul_w(Dn[2], row);
      s[2] = row;
      s[3] = 1;
      break;
    }
    case 2:
      for (int d = 0; d < 4; d++) s[d] = (param >> (2 * d)) & 1 ? hostile[(param >> (2 * d)) & 3] : dense[d];
      break;
    default:
      memcpy(s, dense, sizeof dense);
      s[2] = 0;
      break;
  }
  if (v >= V_KS) s[3] = 0;
  t->offset = vb[1] < 0xF0 ? vb[1] % 3 : SIZE_MAX / 2;
  c->need_ok[v] = need_of(t, Dn, c->esize[v], &c->need[v]);
  const size_t es = c->esize[v];
  size_t bytes = 64;
  if (c->need_ok[v] && c->need[v] <= FZ_BUF_CAP) {
    const size_t need = c->need[v];
    switch (vb[2] % 4) {
      case 0: bytes = need; break;
      case 1: bytes = need > es ? need - es : need; break;
      case 2: bytes = need + (size_t)((vb[2] / 4) % 8) * es; break;
      default: bytes = need > 1 ? need - 1 : need; break;
    }
  }
  c->bytes[v] = bytes;
  if (c->q8[v]) { /* to bytes */
    t->offset = mul_w(t->offset, 34) + (param >> 7);
    for (int d = 0; d < 4; d++) s[d] = mul_w(s[d], 34);
    c->esize[v] = 1;
    clattn_tensor bt;
    size_t bd[4];
    q8_bytes(c, v, &bt, bd);
    c->need_ok[v] = need_of(&bt, bd, 1, &c->need[v]);
  }
}

static void case_free(ap_case *c) {
  for (int v = 0; v < V_COUNT; v++) {
    if (c->mem[v]) clReleaseMemObject(c->mem[v]);
    free(c->host[v]);
  }
  if (c->pos_mem) clReleaseMemObject(c->pos_mem);
  if (c->table_mem) clReleaseMemObject(c->table_mem);
  free(c->pos);
  free(c->table);
}

static size_t small_bytes(long long count, int short_one) {
  size_t want = count > 0 && count <= (long long)(FZ_BUF_CAP / 4) ? (size_t)count * 4 : 64;
  return short_one && want > 4 ? want - 4 : want;
}

static int decode(const uint8_t *data, size_t size, ap_case *c) {
  memset(c, 0, sizeof *c);
  clattn_append_params *a = &c->ap;
  *a = clattn_append_params_default();
  static const int dims[4] = {32, 64, 3, 17};
  uint8_t b;
  a->batch = small(hb(data, size, 0), 1, 3);
  a->kv_heads = small(hb(data, size, 1), 1, 3);
  a->new_len = small(hb(data, size, 2), 0, 6);
  b = hb(data, size, 3);
  a->head_dim = b < 0xF0 ? dims[b % 4] : fz_hostile_int[b - 0xF0];
  b = hb(data, size, 4);
  a->value_dim = b < 0xF0 ? dims[b % 4] : fz_hostile_int[b - 0xF0];
  static const clattn_dtype srcs[4] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16, CLATTN_Q8_0};
  a->src_dtype = srcs[hb(data, size, 5) % 4];
  static const int kvs[8] = {CLATTN_DTYPE_SAME, CLATTN_F32,  CLATTN_F16, CLATTN_BF16,
                             CLATTN_Q8_0,       CLATTN_INT8, CLATTN_IQ4_NL + 1, CLATTN_Q8_0};
  a->kv_dtype = (clattn_dtype)kvs[hb(data, size, 6) % 8];
  c->kv = a->kv_dtype == CLATTN_DTYPE_SAME ? a->src_dtype : a->kv_dtype;
  const uint8_t f = hb(data, size, 7);
  c->paged = f & 1;
  c->positions_null = !!(f & 4);
  a->capacity = small(hb(data, size, 8), 1, 12);
  if (c->paged) {
    a->capacity = 0;
    a->page_size = small(hb(data, size, 9), 1, 8);
    a->num_pages = small(hb(data, size, 10), 1, 8);
    const long long need =
        a->page_size > 0 && a->new_len > 0 ? (a->new_len + (long long)a->page_size - 1) / a->page_size : 0;
    static const int add[4] = {0, 1, 2, -1};
    b = hb(data, size, 11);
    a->block_table_stride = b < 0xF0 ? (int)(need + add[b % 4]) : fz_hostile_int[b - 0xF0];
  }
  for (int v = 0; v < V_COUNT; v++) {
    uint8_t vb[4];
    for (int i = 0; i < 4; i++) vb[i] = hb(data, size, 12 + 4 * (size_t)v + i);
    decode_view(c, v, vb, v < V_KS || ((c->kv == CLATTN_INT8) != !!(f & 2)));
  }
  fz_reader r = {data, size, size < AP_HEADER ? size : AP_HEADER, 0x51ED270B02A5F00Dull ^ size};
  c->pos_bytes = small_bytes(a->batch, f & 8);
  c->pos = malloc(c->pos_bytes);
  if (!c->pos) return -1;
  const long long rows = c->paged ? (long long)a->block_table_stride * a->page_size : a->capacity;
  for (size_t i = 0; i < c->pos_bytes / 4; i++) {
    const uint8_t x = fz_rd(&r);
    const long long hostile[8] = {INT_MAX, INT_MIN, INT_MAX - 1, -7, rows, rows - 1, 1 << 30, -2};
    const long long v = x < 0xF0 ? (rows > 0 ? x % (rows + 3) - 1 : x % 4 - 1) : hostile[x & 7];
    c->pos[i] = (int32_t)(v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : v);
  }
  if (c->paged) {
    const long long n = (long long)a->batch * a->block_table_stride;
    c->table_bytes = small_bytes(n, f & 16);
    c->table = malloc(c->table_bytes);
    if (!c->table) return -1;
    for (size_t i = 0; i < c->table_bytes / 4; i++) {
      const uint8_t x = fz_rd(&r);
      const int np = a->num_pages;
      const int32_t hostile[8] = {-1, np, INT_MIN, INT_MAX, np + 1, -2, 0, 1};
      c->table[i] = x < 0xF0 ? (np > 0 ? x % np : 0) : hostile[x & 7];
    }
  }
  for (int v = 0; v < V_COUNT; v++) {
    if (!c->present[v]) continue;
    c->host[v] = malloc(c->bytes[v]);
    if (!c->host[v]) return -1;
    if (v >= V_K) { /* the cache before: a pattern */
      const float pat = -1.25f;
      for (size_t i = 0; i < c->bytes[v]; i++)
        c->host[v][i] = v >= V_KS ? ((const unsigned char *)&pat)[i % 4] : (unsigned char)(v == V_K ? 0xA5 : 0x5A);
      continue;
    }
    const size_t es = c->esize[v];
    for (size_t i = 0; i + es <= c->bytes[v]; i += es) {
      const uint8_t x = fz_rd(&r);
      const float val = fz_dec_float(x < 0xFD ? x : 0) * (float)(1 + (x >> 4) % 4);
      if (es == 4) {
        memcpy(c->host[v] + i, &val, 4);
      } else {
        const uint16_t h = a->src_dtype == CLATTN_F16 ? cp_f16_bits(val) : cp_bf16_bits(val);
        memcpy(c->host[v] + i, &h, 2);
      }
    }
    for (size_t i = c->bytes[v] / es * es; i < c->bytes[v]; i++) c->host[v][i] = 0x7F;
  }
  return 0;
}

#define BIT(s) (1u << (unsigned)(s))

static unsigned predict(const ap_case *c, char *why, size_t n) {
  const clattn_append_params *a = &c->ap;
  unsigned set = 0;
  size_t at = 0;
#define REASON(st, ...)                                          \
  do {                                                           \
    set |= BIT(st);                                              \
    if (at < n) {                                                \
      int w_ = snprintf(why + at, n - at, "%s", at ? "; " : ""); \
      if (w_ > 0) at += (size_t)w_;                              \
    }                                                            \
    if (at < n) {                                                \
      int w_ = snprintf(why + at, n - at, __VA_ARGS__);          \
      if (w_ > 0) at += (size_t)w_;                              \
    }                                                            \
  } while (0)
  const int inv = CLATTN_ERR_INVALID_ARGUMENT, too_small = CLATTN_ERR_BUFFER_TOO_SMALL;
  if (n) why[0] = 0;
  int ok = a->batch > 0 && a->kv_heads > 0 && a->head_dim > 0 && a->value_dim > 0 && a->new_len >= 0;
  if (!ok) REASON(inv, "a dim is not positive (or new_len negative)");
  if (ok && (long long)a->batch * a->kv_heads > INT_MAX) {
    REASON(inv, "batch * kv_heads > INT_MAX");
    ok = 0;
  }
  if (a->src_dtype != CLATTN_F32 && a->src_dtype != CLATTN_F16 && a->src_dtype != CLATTN_BF16)
    REASON(inv, "src_dtype %d", (int)a->src_dtype);
  if ((int)a->kv_dtype < -1 || (int)a->kv_dtype > 4) REASON(inv, "kv_dtype %d", (int)a->kv_dtype);
  for (int v = V_KN; v <= V_V; v++)
    if (!c->present[v]) REASON(inv, "%s NULL", v_name[v]);
  if (c->positions_null) REASON(inv, "positions NULL");
  if (!ok) return set;
  if (c->paged) {
    if (a->page_size <= 0) REASON(inv, "page_size %d", a->page_size);
    if (a->num_pages <= 0) REASON(inv, "num_pages %d", a->num_pages);
    if (a->page_size > 0) {
      const long long need = (a->new_len + (long long)a->page_size - 1) / a->page_size;
      if (a->block_table_stride <= 0 || a->block_table_stride < need)
        REASON(inv, "block_table_stride %d < %lld", a->block_table_stride, need);
      else if ((size_t)a->batch * (size_t)a->block_table_stride * 4 > c->table_bytes)
        REASON(too_small, "block table %zu bytes", c->table_bytes);
    }
  } else {
    if (a->capacity <= 0) REASON(inv, "capacity %d", a->capacity);
    if (a->new_len > a->capacity) REASON(inv, "new_len %d > capacity %d", a->new_len, a->capacity);
  }
  if (!c->positions_null && (size_t)a->batch * 4 > c->pos_bytes) REASON(too_small, "positions %zu bytes", c->pos_bytes);
  if ((int)a->kv_dtype < -1 || (int)a->kv_dtype > 4) return set;
  for (int v = 0; v < V_COUNT; v++) {
    if (!c->present[v] || (v < V_K && a->new_len == 0)) continue;
    const clattn_tensor *t = view(c, v);
    if (c->q8[v]) {
      const int cols = v == V_K ? a->head_dim : a->value_dim;
      if (cols % 32) REASON(inv, "Q8_0 %s of %d columns", v_name[v], cols);
      if (t->stride[3] != 34) REASON(inv, "Q8_0 %s stride[3] %zu", v_name[v], t->stride[3]);
      if (t->offset % 2 || t->stride[0] % 2 || t->stride[1] % 2 || t->stride[2] % 2)
        REASON(inv, "Q8_0 %s odd offset or stride", v_name[v]);
    }
    if (v >= V_K) {
      clattn_tensor bt = *t;
      size_t bd[4];
      memcpy(bd, c->dims[v], sizeof bd);
      if (c->q8[v]) q8_bytes(c, v, &bt, bd);
      for (int d = 0; d < (v >= V_KS ? 3 : 4); d++)
        if ((long)bd[d] > 1 && bt.stride[d] == 0) REASON(inv, "%s broadcasts dim %d", v_name[v], d);
      if (c->need_ok[v] && overlaps(bt.stride, bd, v >= V_KS ? 3 : 4)) REASON(inv, "%s overlaps itself", v_name[v]);
    }
    if (!c->need_ok[v])
      REASON(inv, "%s overflows", v_name[v]);
    else if (c->need[v] > c->bytes[v])
      REASON(too_small, "%s needs %zu bytes, has %zu", v_name[v], c->need[v], c->bytes[v]);
  }
  if (c->kv == CLATTN_INT8 && (!c->present[V_KS] || !c->present[V_VS])) REASON(inv, "INT8 without scales");
  if (c->kv != CLATTN_INT8 && (c->present[V_KS] || c->present[V_VS])) REASON(inv, "scales without INT8");
#undef REASON
  return set;
}

/* The source value (b, h, r, col) of k_new / v_new as a float. */
static float src_value(const ap_case *c, int v, int b, int h, int r, int col) {
  const clattn_tensor *t = v == V_KN ? &c->ap.k_new : &c->ap.v_new;
  const size_t e = cp_index(t, b, h, r, col);
  if (c->esize[v] == 4) {
    float f;
    memcpy(&f, c->host[v] + e * 4, 4);
    return f;
  }
  uint16_t h16;
  memcpy(&h16, c->host[v] + e * 2, 2);
  return c->ap.src_dtype == CLATTN_F16 ? cp_f16_value(h16) : cp_bf16_value(h16);
}

/* The cache's expected bytes (want), and which bytes are not compared (free:
 * rows that several new rows land on). */
static int expect(const ap_case *c, unsigned char **want, unsigned char **free_mask) {
  const clattn_append_params *a = &c->ap;
  const int slots = (int)c->dims[V_K][0], rows = (int)c->dims[V_K][2], H = a->kv_heads;
  unsigned char *writers = calloc((size_t)slots * H * rows + 1, 1);
  float *x = malloc(sizeof(float) * (size_t)(a->head_dim > a->value_dim ? a->head_dim : a->value_dim));
  unsigned char *qrow = malloc((size_t)(a->head_dim > a->value_dim ? a->head_dim : a->value_dim) * 2 + 64);
  if (!writers || !x || !qrow) {
    free(writers);
    free(x);
    free(qrow);
    return -1;
  }
  for (int pass = 0; pass < 2; pass++)
    for (int b = 0; b < a->batch; b++)
      for (int h = 0; h < H; h++)
        for (int r = 0; r < a->new_len; r++) {
          const long long pos = (long long)c->pos[b] + r;
          long long slot = b, row = pos;
          if (pos < 0) continue;
          if (c->paged) {
            const long long e = pos / a->page_size;
            if (e >= a->block_table_stride) continue;
            const int32_t page = c->table[(size_t)b * a->block_table_stride + (size_t)e];
            if (page < 0 || page >= a->num_pages) continue;
            slot = page;
            row = pos % a->page_size;
          } else if (pos >= a->capacity) {
            continue;
          }
          unsigned char *cnt = &writers[((size_t)slot * H + h) * rows + (size_t)row];
          if (pass == 0) {
            if (*cnt < 2) (*cnt)++;
            continue;
          }
          for (int kv = 0; kv < 2; kv++) {
            const int v = kv ? V_V : V_K, cols = kv ? a->value_dim : a->head_dim;
            const clattn_tensor *t = kv ? &a->v : &a->k;
            unsigned char *dst = want[v], *fm = free_mask[v];
            for (int col = 0; col < cols; col++) x[col] = src_value(c, kv ? V_VN : V_KN, b, h, r, col);
            const size_t base =
                t->offset + (size_t)slot * t->stride[0] + (size_t)h * t->stride[1] + (size_t)row * t->stride[2];
            float scale = 0.0f;
            if (c->kv == CLATTN_Q8_0)
              cp_quantize_q8_0_row(x, qrow, cols);
            else if (c->kv == CLATTN_INT8)
              scale = cp_quantize_int8_row(x, qrow, cols);
            const size_t units = c->kv == CLATTN_Q8_0 ? (size_t)cols / 32 * 34 : (size_t)cols;
            for (size_t u = 0; u < units; u++) {
              size_t at;
              unsigned char bytes[4];
              size_t nb = 1;
              switch (c->kv) {
                case CLATTN_Q8_0:
                  at = base + u;
                  bytes[0] = qrow[u];
                  break;
                case CLATTN_INT8:
                  at = base + u * t->stride[3];
                  bytes[0] = qrow[u];
                  break;
                case CLATTN_F32:
                  at = (base + u * t->stride[3]) * 4;
                  memcpy(bytes, &x[u], 4);
                  nb = 4;
                  break;
                default: {
                  const uint16_t h16 = c->kv == CLATTN_F16 ? cp_f16_bits(x[u]) : cp_bf16_bits(x[u]);
                  at = (base + u * t->stride[3]) * 2;
                  memcpy(bytes, &h16, 2);
                  nb = 2;
                }
              }
              for (size_t k = 0; k < nb; k++) {
                dst[at + k] = bytes[k];
                fm[at + k] |= *cnt > 1;
              }
            }
            if (c->kv == CLATTN_INT8) {
              const int sv = kv ? V_VS : V_KS;
              const clattn_tensor *st = kv ? &a->v_scale : &a->k_scale;
              const size_t at = (st->offset + (size_t)slot * st->stride[0] + (size_t)h * st->stride[1] +
                                 (size_t)row * st->stride[2]) *
                                4;
              memcpy(want[sv] + at, &scale, 4);
              for (int k = 0; k < 4; k++) free_mask[sv][at + (size_t)k] |= *cnt > 1;
            }
          }
        }
  free(writers);
  free(x);
  free(qrow);
  return 0;
}

int fz_append_run(const uint8_t *data, size_t size, char *why, size_t n) {
  if (n) why[0] = 0;
  ap_case c;
  int verdict = FZ_PASS;
  unsigned char *back[V_COUNT] = {0}, *want[V_COUNT] = {0}, *free_mask[V_COUNT] = {0};
  if (decode(data, size, &c) != 0) {
    case_free(&c);
    snprintf(why, n, "harness: out of host memory");
    return FZ_FAIL;
  }
  char reasons[1024];
  const unsigned set = predict(&c, reasons, sizeof reasons);
  const clattn_append_params *a = &c.ap;
  if (!set &&
      (double)a->batch * a->kv_heads * (a->new_len + c.dims[V_K][0] * c.dims[V_K][2]) * (a->head_dim + a->value_dim) >
          AP_WORK_CAP) {
    case_free(&c);
    return FZ_SKIP;
  }
  clattn_context *ctx = fz_context(why, n, NULL);
  if (!ctx) {
    case_free(&c);
    return FZ_FAIL;
  }
  cl_context clc = clattn_cl_context(ctx);
  cl_command_queue queue = clattn_cl_queue(ctx);
  cl_int e = CL_SUCCESS;
  for (int v = 0; v < V_COUNT && e == CL_SUCCESS; v++)
    if (c.present[v])
      c.mem[v] = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.bytes[v], c.host[v], &e);
  if (e == CL_SUCCESS && !c.positions_null)
    c.pos_mem = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.pos_bytes, c.pos, &e);
  if (e == CL_SUCCESS && c.paged)
    c.table_mem = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.table_bytes, c.table, &e);
  if (e != CL_SUCCESS) {
    snprintf(why, n, "harness: clCreateBuffer: %d", (int)e);
    verdict = FZ_FAIL;
    goto out;
  }
  clattn_append_params p = c.ap;
  p.k_new.buf = c.mem[V_KN];
  p.v_new.buf = c.mem[V_VN];
  p.k.buf = c.mem[V_K];
  p.v.buf = c.mem[V_V];
  p.k_scale.buf = c.mem[V_KS];
  p.v_scale.buf = c.mem[V_VS];
  p.positions = c.pos_mem;
  p.block_table = c.table_mem;
  char sentinel[512];
  (void)clattn_kv_append(ctx, &p, 1, NULL, NULL);
  snprintf(sentinel, sizeof sentinel, "%s", clattn_last_error(ctx));
  const clattn_status st = clattn_kv_append(ctx, &p, 0, NULL, NULL);
  if ((e = clFinish(queue)) != CL_SUCCESS) {
    snprintf(why, n, "clFinish after clattn_kv_append: %d", (int)e);
    verdict = FZ_FAIL;
    goto out;
  }
  if (getenv("CLATTN_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz append: status %s; rules: %s\n", clattn_status_string(st), set ? reasons : "accept");
  for (int v = V_K; v < V_COUNT; v++) {
    if (!c.present[v]) continue;
    back[v] = malloc(c.bytes[v]);
    want[v] = malloc(c.bytes[v]);
    free_mask[v] = calloc(c.bytes[v], 1);
    if (!back[v] || !want[v] || !free_mask[v] ||
        clEnqueueReadBuffer(queue, c.mem[v], CL_TRUE, 0, c.bytes[v], back[v], 0, NULL, NULL) != CL_SUCCESS) {
      snprintf(why, n, "harness: reading %s back", v_name[v]);
      verdict = FZ_FAIL;
      goto out;
    }
    memcpy(want[v], c.host[v], c.bytes[v]);
  }
  if (st != CLATTN_OK) {
    const char *msg = clattn_last_error(ctx);
    if (!set || !(set & BIT(st)))
      snprintf(why, n, "%s, rules: %s: %s", clattn_status_string(st), set ? reasons : "accept", msg);
    else if (!msg[0] || !strcmp(msg, sentinel))
      snprintf(why, n, "%s without a message of its own", clattn_status_string(st));
    for (int v = V_K; v < V_COUNT && !why[0]; v++)
      if (back[v] && memcmp(back[v], c.host[v], c.bytes[v]))
        snprintf(why, n, "%s but the cache's %s was touched", clattn_status_string(st), v_name[v]);
    verdict = why[0] ? FZ_FAIL : FZ_PASS;
    goto out;
  }
  if (set) {
    snprintf(why, n, "accepted a call the rules reject: %s", reasons);
    verdict = FZ_FAIL;
    goto out;
  }
  if (expect(&c, want, free_mask) != 0) {
    snprintf(why, n, "harness: out of host memory");
    verdict = FZ_FAIL;
    goto out;
  }
  for (int v = V_K; v < V_COUNT && verdict == FZ_PASS; v++)
    for (size_t i = 0; back[v] && i < c.bytes[v]; i++)
      if (!free_mask[v][i] && back[v][i] != want[v][i]) {
        snprintf(why, n, "%s byte %zu is %u, the host model says %u (the pattern: %u)", v_name[v], i, back[v][i],
                 want[v][i], c.host[v][i]);
        verdict = FZ_FAIL;
        break;
      }
out:
  for (int v = 0; v < V_COUNT; v++) {
    free(back[v]);
    free(want[v]);
    free(free_mask[v]);
  }
  case_free(&c);
  return verdict;
}

int fz_append_warm_up(char *why, size_t n) {
  /* every (source, cache) storage pair: F32 F16 BF16 into F32 F16 BF16 Q8_0 INT8 */
  for (uint8_t src = 0; src < 3; src++)
    for (uint8_t kv = 1; kv <= 5; kv++) {
      uint8_t in[AP_HEADER] = {0, 0, 2, 0, 0, src, kv, 0, 7};
      if (fz_append_run(in, sizeof in, why, n) != FZ_PASS) return FZ_FAIL;
    }
  return FZ_PASS;
}
