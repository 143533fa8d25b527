/*
 * clattn_forward_kvcache: an engine's decode step in one call
 * (FlashAttention's flash_attn_with_kvcache). Each case builds a cache on
 * the host (the bytes the device holds: every storage the append writes,
 * contiguous, through cache_batch_idx, or paged over shuffled pages), its
 * rows outside each sequence NaN or Inf, then checks every algorithm:
 *
 *  - the appended rows are the new keys rotated on the host (f32, each
 *    product rounded, stored in the call's dtype) and stored with
 *    clattn_kv_append's rules, bit for bit (rotated keys in Q8_0 and INT8
 *    caches within a quantisation step); every other byte of the cache
 *    (rows, gaps, scales) as it was;
 *  - out and lse, NaN-filled before the call, against the fp64 reference of
 *    the rotated queries over the dequantised cache, each row's keys
 *    cache_leftpad[b] .. cache_seqlens[b] + new_len - 1 aligned on their own
 *    count, with NaN/Inf in padding rows and past each row's length;
 *  - the step equals clattn_kv_append then clattn_forward bitwise, and on
 *    an out-of-order queue a chain of steps equals the in-order one bitwise;
 *  - every refusal says why and writes nothing.
 */
#include <math.h>
#include <stdint.h>

#include "kit_checks.h"

/* A non-NULL cl_mem for the reference, which only asks whether a field is set. */
#define DUMMY_MEM ((cl_mem)(uintptr_t)1)

static uint64_t g_rng = 0x853c49e6748fea9bull;
static uint32_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}
static float urand(float a) { return a * (2.0f * (float)(rnd() % 1000001u) / 1000000.0f - 1.0f); }
static int irand(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); } /* [lo, hi] */

static const char *dtype_name(clattn_dtype t) { return ca_dtype_name(t) + strlen("CLATTN_"); }

/* ---------- a cache's bytes on the host ---------- */

/* [slot or page, kv head, row, column] in storage kv, two units of gap after
 * each row and around the view (units: elements, bytes for Q8_0). */
typedef struct {
  clattn_dtype kv;
  int slots, heads, rows, cols;
  size_t unit, units, row_units;
  clattn_tensor view;
  unsigned char *data;
  float *scale; /* INT8: one per row, after one float of offset */
  size_t scale_n;
  clattn_tensor scale_view;
} scache;

static int sc_make(scache *c, clattn_dtype kv, int slots, int heads, int rows, int cols) {
  memset(c, 0, sizeof *c);
  c->kv = kv;
  c->slots = slots, c->heads = heads, c->rows = rows, c->cols = cols;
  c->unit = kv == CLATTN_F32 ? 4 : (kv == CLATTN_F16 || kv == CLATTN_BF16) ? 2 : 1;
  c->row_units = kv == CLATTN_Q8_0 ? (size_t)cols / 32 * 34 : (size_t)cols;
  const size_t s2 = c->row_units + 2, s1 = (size_t)rows * s2;
  c->view = (clattn_tensor){NULL, 2, {(size_t)heads * s1, s1, s2, kv == CLATTN_Q8_0 ? 34 : 1}};
  c->units = 2 + (size_t)slots * heads * s1 + 2;
  c->data = calloc(c->units, c->unit);
  if (kv == CLATTN_INT8) {
    c->scale_n = 1 + (size_t)slots * heads * rows + 1;
    c->scale = calloc(c->scale_n, sizeof(float));
    c->scale_view = (clattn_tensor){NULL, 1, {(size_t)heads * rows, (size_t)rows, 1, 0}};
  }
  return c->data && (kv != CLATTN_INT8 || c->scale) ? 0 : -1;
}
static int sc_copy(scache *to, const scache *from) {
  if (sc_make(to, from->kv, from->slots, from->heads, from->rows, from->cols)) return -1;
  memcpy(to->data, from->data, from->units * from->unit);
  if (from->scale) memcpy(to->scale, from->scale, from->scale_n * sizeof(float));
  return 0;
}
static void sc_free(scache *c) {
  free(c->data);
  free(c->scale);
  memset(c, 0, sizeof *c);
}
static size_t sc_at(const scache *c, int s, int h, int r) { /* first unit of a row */
  return c->view.offset + (size_t)s * c->view.stride[0] + (size_t)h * c->view.stride[1] + (size_t)r * c->view.stride[2];
}
static size_t sc_scale_at(const scache *c, int s, int h, int r) { return 1 + ((size_t)s * c->heads + h) * c->rows + r; }
/* Row (s, h, r) := x, stored as clattn_kv_append stores it. */
static void sc_write(scache *c, int s, int h, int r, const float *x) {
  unsigned char *row = c->data + sc_at(c, s, h, r) * c->unit;
  if (c->kv == CLATTN_Q8_0) {
    cp_quantize_q8_0_row(x, row, c->cols);
  } else if (c->kv == CLATTN_INT8) {
    c->scale[sc_scale_at(c, s, h, r)] = cp_quantize_int8_row(x, row, c->cols);
  } else {
    for (int i = 0; i < c->cols; i++) {
      const uint16_t b = c->kv == CLATTN_F16 ? cp_f16_bits(x[i]) : cp_bf16_bits(x[i]);
      if (c->kv == CLATTN_F32)
        memcpy(row + 4 * (size_t)i, &x[i], 4);
      else
        memcpy(row + 2 * (size_t)i, &b, 2);
    }
  }
}
/* Element i of row (s, h, r), dequantised in f32 as the kernels read it. */
static float sc_read(const scache *c, int s, int h, int r, int i) {
  const unsigned char *row = c->data + sc_at(c, s, h, r) * c->unit;
  uint16_t b;
  float f;
  switch (c->kv) {
    case CLATTN_F32: memcpy(&f, row + 4 * (size_t)i, 4); return f;
    case CLATTN_F16: memcpy(&b, row + 2 * (size_t)i, 2); return cp_f16_value(b);
    case CLATTN_BF16: memcpy(&b, row + 2 * (size_t)i, 2); return cp_bf16_value(b);
    case CLATTN_Q8_0:
      memcpy(&b, row + (size_t)(i / 32) * 34, 2);
      return cp_f16_value(b) * (float)(int8_t)row[(size_t)(i / 32) * 34 + 2 + i % 32];
    default: return c->scale[sc_scale_at(c, s, h, r)] * (float)(int8_t)row[i];
  }
}
/* A row no output may read: NaN or Inf in every element (a block's scale). */
static void sc_poison(scache *c, int s, int h, int r, int inf) {
  float x[512];
  for (int i = 0; i < c->cols; i++) x[i] = inf ? (i % 2 ? -INFINITY : INFINITY) : NAN;
  if (c->kv == CLATTN_Q8_0 || c->kv == CLATTN_INT8) {
    for (int i = 0; i < c->cols; i++) x[i] = urand(1.0f);
    sc_write(c, s, h, r, x);
    unsigned char *row = c->data + sc_at(c, s, h, r) * c->unit;
    const uint16_t f16 = inf ? 0x7c00u : 0x7e00u;
    if (c->kv == CLATTN_Q8_0)
      for (int k = 0; k < c->cols / 32; k++) memcpy(row + (size_t)k * 34, &f16, 2);
    else
      c->scale[sc_scale_at(c, s, h, r)] = inf ? INFINITY : NAN;
    return;
  }
  sc_write(c, s, h, r, x);
}

/* ---------- a step's problem ---------- */

typedef struct {
  const char *name;
  int batch, q_heads, kv_heads, q_len, new_len;
  int cap; /* attn.kv_len: rows per slot (contiguous) or the rows a block-table row addresses (paged) */
  int head_dim, value_dim;
  clattn_dtype dtype, kv;
  int rotary_dim, interleaved; /* rotary_dim 0: no tables */
  int causal, window_left, window_right;
  int leftpad;   /* random starts */
  int slots;     /* contiguous through cache_batch_idx over this many slots (distinct, shuffled); 0 = b */
  int page_size; /* > 0: paged over shuffled pages */
  int want_lse;
  const int32_t *seqlens; /* device values as given (batch of them), or NULL: random, each fitting */
} step_case;

typedef struct {
  step_case c;
  int paged, n_slots, bts, rows; /* cache dimension 0 and rows per slot or page; table entries per row */
  int32_t *seqlens, *leftpad, *slot_of, *table;
  float *q, *k_new, *v_new; /* whole buffers, in the views below; gaps NaN */
  size_t q_n, kn_n, vn_n;
  clattn_tensor q_view, kn_view, vn_view;
  float *cos, *sin; /* [rotary_len, rotary_dim / 2 + 1] after 3 floats: a gap per position */
  size_t tab_n;
  int rotary_len;
  clattn_tensor tab_view;
  scache k0, v0, k1, v1;                  /* the cache before and after the step */
  unsigned char *appended_k, *appended_v; /* per unit of the cache: a row the step writes */
  double *ref_out, *ref_lse;
  size_t out_n, lse_n;
} step_prob;

/* Where key row j of batch row b lies: (slot or page, row). */
static void sp_locate(const step_prob *p, int b, int j, int *s, int *r) {
  if (p->paged) {
    *s = p->table[b * p->bts + j / p->c.page_size];
    *r = j % p->c.page_size;
  } else {
    *s = p->slot_of ? p->slot_of[b] : b;
    *r = j;
  }
}

static float rounded_product(float a, float b) {
  volatile float p = a * b; /* one rounding, never fused into a multiply-add */
  return p;
}

/* x (cols elements, element stride st) rotated at position pos into y
 * (dense), as the call does; then rounded to dtype. */
static void sp_rotate(const step_prob *p, const float *x, size_t st, int pos, float *y) {
  const int d = p->c.head_dim, half = p->c.rotary_dim / 2;
  for (int i = 0; i < d; i++) y[i] = x[(size_t)i * st];
  if (p->c.rotary_dim) {
    pos = pos < 0 ? 0 : pos >= p->rotary_len ? p->rotary_len - 1 : pos;
    for (int t = 0; t < half; t++) {
      const int ix = p->c.interleaved ? 2 * t : t, iy = p->c.interleaved ? 2 * t + 1 : t + half;
      const size_t at = p->tab_view.offset + (size_t)pos * p->tab_view.stride[2] + (size_t)t * p->tab_view.stride[3];
      const float c = p->cos[at], s = p->sin[at], x0 = x[(size_t)ix * st], y0 = x[(size_t)iy * st];
      y[ix] = rounded_product(x0, c) - rounded_product(y0, s);
      y[iy] = rounded_product(x0, s) + rounded_product(y0, c);
    }
  }
  for (int i = 0; i < d; i++) y[i] = cp_round_to(p->c.dtype, y[i]);
}

static void sp_free(step_prob *p) {
  free(p->seqlens), free(p->leftpad), free(p->slot_of), free(p->table);
  free(p->q), free(p->k_new), free(p->v_new), free(p->cos), free(p->sin);
  sc_free(&p->k0), sc_free(&p->v0), sc_free(&p->k1), sc_free(&p->v1);
  free(p->appended_k), free(p->appended_v), free(p->ref_out), free(p->ref_lse);
  memset(p, 0, sizeof *p);
}

static float *nan_filled(size_t n) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  if (x)
    for (size_t i = 0; i < n; i++) x[i] = NAN;
  return x;
}

/* Marks the units of row (s, h, r) as written by the step. */
static void mark_row(unsigned char *mask, const scache *c, int s, int h, int r) {
  memset(mask + sc_at(c, s, h, r), 1, c->row_units);
}

/* The reference of the step (p's host cache after it, rotated queries). */
static int sp_reference(step_prob *p) {
  const step_case *c = &p->c;
  const int B = c->batch, Hq = c->q_heads, Hkv = c->kv_heads, M = c->q_len, N = c->cap;
  const int dk = c->head_dim, dv = c->value_dim;
  const size_t kn = (size_t)B * Hkv * N;
  float *q = malloc(sizeof(float) * B * Hq * M * dk), *k = malloc(sizeof(float) * kn * dk),
        *v = malloc(sizeof(float) * kn * dv);
  int32_t *lens = malloc(sizeof(int32_t) * B), *starts = malloc(sizeof(int32_t) * B);
  p->out_n = (size_t)B * Hq * M * dv;
  p->lse_n = (size_t)B * Hq * M;
  p->ref_out = malloc(sizeof(double) * p->out_n);
  p->ref_lse = malloc(sizeof(double) * p->lse_n);
  int rc = -1;
  if (!q || !k || !v || !lens || !starts || !p->ref_out || !p->ref_lse) goto done;
  const int per_row = c->causal || c->window_left >= 0 || c->window_right >= 0;
  for (int b = 0; b < B; b++) {
    lens[b] = p->seqlens[b] + c->new_len;
    starts[b] = p->leftpad ? p->leftpad[b] : 0;
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < M; i++)
        sp_rotate(p, p->q + cp_index(&p->q_view, b, h, i, 0), p->q_view.stride[3], p->seqlens[b] + (per_row ? i : 0),
                  q + (((size_t)b * Hq + h) * M + i) * dk);
    for (int h = 0; h < Hkv; h++)
      for (int j = 0; j < N; j++) {
        int s, r;
        sp_locate(p, b, j, &s, &r);
        for (int d = 0; d < dk; d++) k[(((size_t)b * Hkv + h) * N + j) * dk + d] = sc_read(&p->k1, s, h, r, d);
        for (int d = 0; d < dv; d++) v[(((size_t)b * Hkv + h) * N + j) * dv + d] = sc_read(&p->v1, s, h, r, d);
      }
  }
  clattn_params rp = clattn_params_default();
  rp.batch = B, rp.q_heads = Hq, rp.kv_heads = Hkv, rp.q_len = M, rp.kv_len = N;
  rp.head_dim = dk, rp.value_dim = dv;
  rp.q = (clattn_tensor){DUMMY_MEM, 0, {(size_t)Hq * M * dk, (size_t)M * dk, (size_t)dk, 1}};
  rp.k = (clattn_tensor){DUMMY_MEM, 0, {(size_t)Hkv * N * dk, (size_t)N * dk, (size_t)dk, 1}};
  rp.v = (clattn_tensor){DUMMY_MEM, 0, {(size_t)Hkv * N * dv, (size_t)N * dv, (size_t)dv, 1}};
  rp.causal = c->causal, rp.window_left = c->window_left, rp.window_right = c->window_right;
  rp.kv_lens = DUMMY_MEM;
  rp.cache_leftpad = DUMMY_MEM;
  ref_inputs in = {0};
  in.q = q, in.k = k, in.v = v, in.kv_lens = lens, in.cache_leftpad = starts;
  ref_outputs o = {0};
  o.out = p->ref_out, o.lse = p->ref_lse;
  rc = ref_forward(&rp, &in, &o);
done:
  free(q), free(k), free(v), free(lens), free(starts);
  return rc;
}

/* Builds the host side of case c (seeded). */
static int sp_build(step_prob *p, const step_case *c, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->c = *c;
  g_rng = 0x853c49e6748fea9bull ^ (seed * 0x9e3779b97f4a7c15ull);
  const int B = c->batch, Hq = c->q_heads, Hkv = c->kv_heads, M = c->q_len, L = c->new_len;
  const int dk = c->head_dim, dv = c->value_dim;
  p->paged = c->page_size > 0;
  p->bts = p->paged ? (c->cap + c->page_size - 1) / c->page_size : 1;
  p->n_slots = p->paged ? B * p->bts + 2 : c->slots ? c->slots : B;
  p->rows = p->paged ? c->page_size : c->cap;
  p->seqlens = malloc(sizeof(int32_t) * B);
  if (c->leftpad) p->leftpad = malloc(sizeof(int32_t) * B);
  if (c->slots) p->slot_of = malloc(sizeof(int32_t) * c->slots);
  if (p->paged) p->table = malloc(sizeof(int32_t) * p->n_slots);
  if (!p->seqlens || (c->leftpad && !p->leftpad) || (c->slots && !p->slot_of) || (p->paged && !p->table)) return -1;
  /* slots or pages shuffled (distinct), so no batch row sits where its index says */
  int32_t *perm = p->slot_of ? p->slot_of : p->table;
  if (perm) {
    for (int i = 0; i < p->n_slots; i++) perm[i] = i;
    for (int i = p->n_slots - 1; i > 0; i--) {
      const int j = irand(0, i);
      const int32_t t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
  }
  for (int b = 0; b < B; b++) {
    p->seqlens[b] = b == 0 ? c->cap - L : irand(0, c->cap - L); /* row 0: the cache full after the step */
    if (p->leftpad) p->leftpad[b] = b == 1 ? p->seqlens[b] : irand(0, p->seqlens[b]); /* row 1: no old key */
    if (c->seqlens) p->seqlens[b] = c->seqlens[b];
  }
  /* q in [B, M, Hq] rows with a gap (BSHD), k_new dense after an offset, v_new dense */
  const size_t qr = (size_t)dk + 3;
  p->q_view = (clattn_tensor){NULL, 5, {(size_t)M * Hq * qr, qr, (size_t)Hq * qr, 1}};
  p->q_n = 5 + (size_t)B * M * Hq * qr;
  p->kn_view = (clattn_tensor){NULL, 2, {(size_t)Hkv * L * dk, (size_t)L * dk, (size_t)dk, 1}};
  p->kn_n = 2 + (size_t)B * Hkv * L * dk;
  p->vn_view = (clattn_tensor){NULL, 0, {(size_t)Hkv * L * dv, (size_t)L * dv, (size_t)dv, 1}};
  p->vn_n = (size_t)B * Hkv * L * dv;
  p->q = nan_filled(p->q_n), p->k_new = nan_filled(p->kn_n), p->v_new = nan_filled(p->vn_n);
  if (!p->q || !p->k_new || !p->v_new) return -1;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < M; i++)
        for (int d = 0; d < dk; d++) p->q[cp_index(&p->q_view, b, h, i, d)] = cp_round_to(c->dtype, urand(1.5f));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hkv; h++)
      for (int r = 0; r < L; r++) {
        for (int d = 0; d < dk; d++) p->k_new[cp_index(&p->kn_view, b, h, r, d)] = cp_round_to(c->dtype, urand(1.5f));
        for (int d = 0; d < dv; d++) p->v_new[cp_index(&p->vn_view, b, h, r, d)] = cp_round_to(c->dtype, urand(1.0f));
      }
  /* the tables: theta_t = 10000^(-2t / rotary_dim), a row per position plus a gap */
  if (c->rotary_dim) {
    const int half = c->rotary_dim / 2;
    p->rotary_len = c->cap + 3;
    p->tab_view = (clattn_tensor){NULL, 3, {0, 0, (size_t)half + 1, 1}};
    p->tab_n = 3 + (size_t)p->rotary_len * (half + 1);
    p->cos = nan_filled(p->tab_n), p->sin = nan_filled(p->tab_n);
    if (!p->cos || !p->sin) return -1;
    for (int pos = 0; pos < p->rotary_len; pos++)
      for (int t = 0; t < half; t++) {
        const double angle = pos * pow(10000.0, -2.0 * t / c->rotary_dim);
        p->cos[3 + (size_t)pos * (half + 1) + t] = (float)cos(angle);
        p->sin[3 + (size_t)pos * (half + 1) + t] = (float)sin(angle);
      }
  }
  /* the cache before: every row NaN or Inf but each sequence's old keys */
  if (sc_make(&p->k0, c->kv, p->n_slots, Hkv, p->rows, dk) || sc_make(&p->v0, c->kv, p->n_slots, Hkv, p->rows, dv))
    return -1;
  for (int s = 0; s < p->n_slots; s++)
    for (int h = 0; h < Hkv; h++)
      for (int r = 0; r < p->rows; r++) {
        sc_poison(&p->k0, s, h, r, (s + r) % 2);
        sc_poison(&p->v0, s, h, r, (s + r + 1) % 2);
      }
  float x[512];
  for (int b = 0; b < B; b++)
    for (int j = p->leftpad ? p->leftpad[b] : 0; j < p->seqlens[b] && j < c->cap; j++)
      for (int h = 0; h < Hkv; h++) {
        int s, r;
        sp_locate(p, b, j, &s, &r);
        for (int d = 0; d < dk; d++) x[d] = cp_round_to(c->dtype, urand(1.5f));
        sc_write(&p->k0, s, h, r, x);
        for (int d = 0; d < dv; d++) x[d] = cp_round_to(c->dtype, urand(1.0f));
        sc_write(&p->v0, s, h, r, x);
      }
  /* after: the new rows, keys rotated */
  if (sc_copy(&p->k1, &p->k0) || sc_copy(&p->v1, &p->v0)) return -1;
  p->appended_k = calloc(p->k0.units, 1), p->appended_v = calloc(p->v0.units, 1);
  if (!p->appended_k || !p->appended_v) return -1;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hkv; h++)
      for (int r = 0; r < L; r++) {
        const int pos = p->seqlens[b] + r;
        if (pos < 0 || pos >= c->cap) continue; /* skipped (past attn.kv_len, paged too) */
        int s, row;
        sp_locate(p, b, pos, &s, &row);
        sp_rotate(p, p->k_new + cp_index(&p->kn_view, b, h, r, 0), 1, pos, x);
        sc_write(&p->k1, s, h, row, x);
        mark_row(p->appended_k, &p->k1, s, h, row);
        for (int d = 0; d < dv; d++) x[d] = p->v_new[cp_index(&p->vn_view, b, h, r, d)];
        sc_write(&p->v1, s, h, row, x);
        mark_row(p->appended_v, &p->v1, s, h, row);
      }
  return sp_reference(p);
}

/* ---------- the device side ---------- */

enum { D_Q, D_KN, D_VN, D_K, D_V, D_KS, D_VS, D_SEQ, D_LP, D_IDX, D_COS, D_SIN, D_OUT, D_LSE, D_COUNT };

typedef struct {
  cl_mem m[D_COUNT];
  size_t out_bytes;
} step_dev;

static cl_mem make_buf(size_t bytes, const void *host) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                            bytes ? bytes : 1, (void *)host, &e);
  return e == CL_SUCCESS ? m : NULL;
}

/* n floats as dtype's bytes (malloc'd). */
static void *as_storage(const float *x, size_t n, clattn_dtype dtype, size_t *bytes) {
  *bytes = n * (dtype == CLATTN_F32 ? 4 : 2);
  unsigned char *b = malloc(*bytes ? *bytes : 1);
  if (!b) return NULL;
  for (size_t i = 0; i < n; i++) {
    const uint16_t h = dtype == CLATTN_F16 ? cp_f16_bits(x[i]) : cp_bf16_bits(x[i]);
    if (dtype == CLATTN_F32)
      memcpy(b + 4 * i, &x[i], 4);
    else
      memcpy(b + 2 * i, &h, 2);
  }
  return b;
}
static float from_storage(const unsigned char *b, size_t i, clattn_dtype dtype) {
  float f;
  uint16_t h;
  if (dtype == CLATTN_F32) return memcpy(&f, b + 4 * i, 4), f;
  memcpy(&h, b + 2 * i, 2);
  return dtype == CLATTN_F16 ? cp_f16_value(h) : cp_bf16_value(h);
}

static cl_mem upload(const float *x, size_t n, clattn_dtype dtype) {
  size_t bytes;
  void *b = as_storage(x, n, dtype, &bytes);
  cl_mem m = b ? make_buf(bytes, b) : NULL;
  free(b);
  return m;
}

static void sd_free(step_dev *d) {
  for (int i = 0; i < D_COUNT; i++)
    if (d->m[i]) clReleaseMemObject(d->m[i]);
  memset(d, 0, sizeof *d);
}

/* Every buffer of the step, the cache as it was before, out and lse NaN. */
static int sd_upload(step_dev *d, const step_prob *p) {
  memset(d, 0, sizeof *d);
  const step_case *c = &p->c;
  d->m[D_Q] = upload(p->q, p->q_n, c->dtype);
  if (c->new_len) {
    d->m[D_KN] = upload(p->k_new, p->kn_n, c->dtype);
    d->m[D_VN] = upload(p->v_new, p->vn_n, c->dtype);
  }
  d->m[D_K] = make_buf(p->k0.units * p->k0.unit, p->k0.data);
  d->m[D_V] = make_buf(p->v0.units * p->v0.unit, p->v0.data);
  if (c->kv == CLATTN_INT8) {
    d->m[D_KS] = make_buf(p->k0.scale_n * sizeof(float), p->k0.scale);
    d->m[D_VS] = make_buf(p->v0.scale_n * sizeof(float), p->v0.scale);
  }
  d->m[D_SEQ] = make_buf(sizeof(int32_t) * c->batch, p->seqlens);
  if (p->leftpad) d->m[D_LP] = make_buf(sizeof(int32_t) * c->batch, p->leftpad);
  if (p->slot_of || p->table)
    d->m[D_IDX] = make_buf(sizeof(int32_t) * (p->paged ? (size_t)c->batch * p->bts : (size_t)c->batch),
                           p->paged ? p->table : p->slot_of);
  if (c->rotary_dim) {
    d->m[D_COS] = make_buf(p->tab_n * sizeof(float), p->cos);
    d->m[D_SIN] = make_buf(p->tab_n * sizeof(float), p->sin);
  }
  float *nan_out = nan_filled(p->out_n);
  d->m[D_OUT] = nan_out ? upload(nan_out, p->out_n, c->dtype) : NULL;
  free(nan_out);
  d->out_bytes = p->out_n * (c->dtype == CLATTN_F32 ? 4 : 2);
  if (c->want_lse) {
    float *nan_lse = nan_filled(p->lse_n);
    d->m[D_LSE] = nan_lse ? make_buf(p->lse_n * sizeof(float), nan_lse) : NULL;
    free(nan_lse);
  }
  for (int i = 0; i < D_COUNT; i++) {
    const int wanted = (i != D_KN && i != D_VN) || c->new_len;
    const int optional = i == D_KS || i == D_VS || i == D_LP || i == D_IDX || i == D_COS || i == D_SIN || i == D_LSE;
    if (wanted && !optional && !d->m[i]) return -1;
  }
  return 0;
}

/* The step's params over d's buffers. */
static clattn_kvcache_params sd_params(const step_dev *d, const step_prob *p, clattn_algo algo) {
  const step_case *c = &p->c;
  clattn_kvcache_params kp = clattn_kvcache_params_default();
  clattn_params *a = &kp.attn;
  a->batch = c->batch, a->q_heads = c->q_heads, a->kv_heads = c->kv_heads;
  a->q_len = c->q_len, a->kv_len = c->cap, a->head_dim = c->head_dim, a->value_dim = c->value_dim;
  a->dtype = c->dtype;
  a->kv_dtype = c->kv == c->dtype ? CLATTN_DTYPE_SAME : c->kv;
  a->q = p->q_view, a->q.buf = d->m[D_Q];
  a->k = p->k0.view, a->k.buf = d->m[D_K];
  a->v = p->v0.view, a->v.buf = d->m[D_V];
  if (c->kv == CLATTN_INT8) {
    a->k_scale = p->k0.scale_view, a->k_scale.buf = d->m[D_KS];
    a->v_scale = p->v0.scale_view, a->v_scale.buf = d->m[D_VS];
  }
  const size_t dv = (size_t)c->value_dim, M = (size_t)c->q_len;
  a->out = (clattn_tensor){d->m[D_OUT], 0, {c->q_heads * M * dv, M * dv, dv, 1}};
  if (c->want_lse) a->lse = (clattn_tensor){d->m[D_LSE], 0, {c->q_heads * M, M, 1, 0}};
  a->causal = c->causal, a->window_left = c->window_left, a->window_right = c->window_right;
  a->cache_leftpad = d->m[D_LP];
  a->algo = algo;
  if (p->paged) {
    a->block_table = d->m[D_IDX];
    a->block_table_stride = p->bts;
    a->page_size = c->page_size;
    a->num_pages = p->n_slots;
  } else if (c->slots) {
    kp.cache_batch_idx = d->m[D_IDX];
    kp.num_slots = c->slots;
  }
  kp.cache_seqlens = d->m[D_SEQ];
  kp.new_len = c->new_len;
  if (c->new_len) {
    kp.k_new = p->kn_view, kp.k_new.buf = d->m[D_KN];
    kp.v_new = p->vn_view, kp.v_new.buf = d->m[D_VN];
  }
  if (c->rotary_dim) {
    kp.rotary_cos = p->tab_view, kp.rotary_cos.buf = d->m[D_COS];
    kp.rotary_sin = p->tab_view, kp.rotary_sin.buf = d->m[D_SIN];
    kp.rotary_dim = c->rotary_dim;
    kp.rotary_len = p->rotary_len;
    kp.rotary_interleaved = c->interleaved;
  }
  return kp;
}

static void *read_all(cl_mem m, size_t bytes) {
  void *host = malloc(bytes ? bytes : 1);
  if (host &&
      clEnqueueReadBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, 0, bytes, host, 0, NULL, NULL) != CL_SUCCESS) {
    free(host);
    return NULL;
  }
  return host;
}

/* A written element's tolerance: 0 (bitwise) but for rotated keys in a
 * quantised cache, where a rotated value one bit off (a device that fused
 * a product anyway) may move the block's scale: then a quantisation step. */
static double written_tol(const step_prob *p, const scache *c, int s, int h, int r) {
  if (!p->c.rotary_dim || c != &p->k1 || (c->kv != CLATTN_Q8_0 && c->kv != CLATTN_INT8)) return 0.0;
  if (c->kv == CLATTN_INT8) return 1.01 * c->scale[sc_scale_at(c, s, h, r)];
  double amax = 0.0;
  for (int i = 0; i < c->cols; i++) amax = fmax(amax, fabs(sc_read(c, s, h, r, i)));
  return 1.01 * amax / 127.0;
}

/* The device's cache (and scales) against the host's after the step: the
 * step's rows as written on the host, every other byte as before. */
static void check_cache(const step_prob *p, const scache *want, const scache *before, const unsigned char *written,
                        const unsigned char *dev, const float *dev_scale, const char *what, const char *label) {
  size_t bad = 0, first = 0;
  for (size_t u = 0; u < want->units; u++)
    if (!written[u] && memcmp(dev + u * want->unit, before->data + u * want->unit, want->unit) && bad++ == 0) first = u;
  CHECKF(bad == 0, "%s: %s cache: %zu units the step does not write changed (first at unit %zu)", label, what, bad,
         first);
  scache got = *want;
  got.data = (unsigned char *)dev;
  got.scale = (float *)dev_scale;
  long off = 0;
  double worst = 0.0;
  for (int s = 0; s < want->slots; s++)
    for (int h = 0; h < want->heads; h++)
      for (int r = 0; r < want->rows; r++) {
        if (!written[sc_at(want, s, h, r)]) {
          if (want->scale &&
              memcmp(&dev_scale[sc_scale_at(want, s, h, r)], &before->scale[sc_scale_at(want, s, h, r)], sizeof(float)))
            off++;
          continue;
        }
        for (int i = 0; i < want->cols; i++) {
          const float x = sc_read(&got, s, h, r, i), w = sc_read(want, s, h, r, i);
          const double tol = written_tol(p, want, s, h, r);
          if (tol == 0.0 ? memcmp(&x, &w, sizeof x) != 0 : !(fabs((double)x - w) <= tol)) off++;
          if (isfinite(x) && isfinite(w)) worst = fmax(worst, fabs((double)x - w));
        }
        if (written_tol(p, want, s, h, r) == 0.0 &&
            memcmp(dev + sc_at(want, s, h, r) * want->unit, want->data + sc_at(want, s, h, r) * want->unit,
                   want->row_units * want->unit))
          off++;
      }
  CHECKF(off == 0, "%s: %s cache: %ld values differ from the host's append (largest difference %g)", label, what, off,
         worst);
}

/* Runs case p on algo through ctx (in order), checks everything; keeps
 * the device's out (raw bytes) when out_bytes is not NULL. */
static void run_and_check(const step_prob *p, clattn_algo algo) {
  const step_case *c = &p->c;
  char label[200];
  snprintf(label, sizeof label, "%s, %s (dtype %s, cache %s)", c->name, clattn_algo_name(algo), dtype_name(c->dtype),
           dtype_name(c->kv));
  step_dev d;
  if (!CHECKF(sd_upload(&d, p) == 0, "%s: device buffers", label)) {
    sd_free(&d);
    return;
  }
  clattn_kvcache_params kp = sd_params(&d, p, algo);
  clattn_context *ctx = ct_context();
  cl_event done = NULL;
  const clattn_status st = clattn_forward_kvcache(ctx, &kp, 0, NULL, &done);
  if (st == CLATTN_ERR_UNSUPPORTED && kc_algo_optional(algo, &kp.attn)) {
    sd_free(&d);
    return;
  }
  CHECKF(st == CLATTN_OK, "%s: %s: %s", label, clattn_status_string(st), clattn_last_error(ctx));
  if (st != CLATTN_OK) {
    sd_free(&d);
    return;
  }
  CHECK(done != NULL && clWaitForEvents(1, &done) == CL_SUCCESS);
  if (done) clReleaseEvent(done);
  const char *route = clattn_last_route();
  CHECKF(strstr(route, c->new_len ? "kv_append" : "kvcache_lengths") &&
             (!c->rotary_dim || strstr(route, "kvcache_rotary")),
         "%s: route \"%s\"", label, route);
  unsigned char *out = read_all(d.m[D_OUT], d.out_bytes), *kdev = read_all(d.m[D_K], p->k0.units * p->k0.unit),
                *vdev = read_all(d.m[D_V], p->v0.units * p->v0.unit);
  float *lse = c->want_lse ? read_all(d.m[D_LSE], p->lse_n * sizeof(float)) : NULL;
  float *ks = d.m[D_KS] ? read_all(d.m[D_KS], p->k0.scale_n * sizeof(float)) : NULL;
  float *vs = d.m[D_VS] ? read_all(d.m[D_VS], p->v0.scale_n * sizeof(float)) : NULL;
  float *o = malloc(sizeof(float) * (p->out_n ? p->out_n : 1));
  if (CHECKF(out && kdev && vdev && o && (!c->want_lse || lse) && (c->kv != CLATTN_INT8 || (ks && vs)), "%s: read back",
             label)) {
    long nans = 0;
    for (size_t i = 0; i < p->out_n; i++) nans += !isfinite(o[i] = from_storage(out, i, c->dtype));
    const double tol = c->dtype == CLATTN_F32 ? 2e-5 : c->dtype == CLATTN_F16 ? 2e-3 : 1.6e-2;
    const double err = cp_rel_err(o, p->ref_out, p->out_n);
    CHECKF(nans == 0 && err <= tol, "%s: out: %ld non-finite, relative error %.3g (tolerance %g)", label, nans, err,
           tol);
    if (lse) {
      long mismatch = 0;
      for (size_t i = 0; i < p->lse_n; i++)
        mismatch += isfinite(p->ref_lse[i]) ? !isfinite(lse[i]) : !(isinf(lse[i]) && lse[i] < 0);
      const double lerr = cp_rel_err(lse, p->ref_lse, p->lse_n);
      CHECKF(mismatch == 0 && lerr <= 2e-5, "%s: lse: %ld class mismatches, relative error %.3g", label, mismatch,
             lerr);
    }
    check_cache(p, &p->k1, &p->k0, p->appended_k, kdev, ks, "k", label);
    check_cache(p, &p->v1, &p->v0, p->appended_v, vdev, vs, "v", label);
  }
  free(out), free(kdev), free(vdev), free(lse), free(ks), free(vs), free(o);
  sd_free(&d);
}

static void run_case(const step_case *c, uint64_t seed) {
  step_prob p;
  if (!CHECKF(sp_build(&p, c, seed) == 0, "%s: host problem", c->name)) {
    sp_free(&p);
    return;
  }
  for (size_t a = 0; a < KC_NALGOS; a++)
    if (!kc_algo_filtered_out(kc_algos[a])) run_and_check(&p, kc_algos[a]);
  sp_free(&p);
}

/* ---------- the cases ---------- */

static step_case base_case(const char *name) {
  step_case c;
  memset(&c, 0, sizeof c);
  c.name = name;
  c.batch = 3, c.q_heads = 4, c.kv_heads = 2; /* GQA */
  c.q_len = 1, c.new_len = 1, c.cap = 53;
  c.head_dim = c.value_dim = 64;
  c.dtype = c.kv = CLATTN_F32;
  c.window_left = c.window_right = -1;
  c.want_lse = 1;
  return c;
}

static void defaults_follow_the_contract(void) {
  const clattn_kvcache_params kp = clattn_kvcache_params_default();
  const clattn_params d = clattn_params_default();
  CHECK(kp.attn.kv_dtype == d.kv_dtype && kp.attn.algo == d.algo && isnan(kp.attn.scale) && kp.attn.window_left == -1);
  CHECK(kp.cache_seqlens == NULL && kp.k_new.buf == NULL && kp.v_new.buf == NULL && kp.new_len == 0);
  CHECK(kp.cache_batch_idx == NULL && kp.num_slots == 0 && kp.rotary_cos.buf == NULL && kp.rotary_sin.buf == NULL);
  CHECK(kp.rotary_dim == 0 && kp.rotary_len == 0 && kp.rotary_interleaved == 1);
}

/* Decode: one new token, its query at the cache's end, GPT-J pairs. */
static void decode_step_matches_reference(void) {
  step_case c = base_case("decode, f32, GPT-J rotary");
  c.rotary_dim = 32, c.interleaved = 1, c.causal = 1;
  run_case(&c, 1);
  c.name = "decode, f32, GPT-J rotary, not causal";
  c.causal = 0;
  run_case(&c, 2);
}

/* A chunk of 7 new keys and 5 queries over 300 rows, head dims 40 with
 * every dim rotated (GPT-NeoX pairs), left-padded, f16. */
static void chunk_with_neox_rotary_and_leftpad(void) {
  step_case c = base_case("chunk, f16, GPT-NeoX rotary over the whole head, leftpad");
  c.q_len = 5, c.new_len = 7, c.cap = 300;
  c.head_dim = c.value_dim = 40;
  c.dtype = c.kv = CLATTN_F16;
  c.rotary_dim = 40, c.interleaved = 0, c.causal = 1, c.leftpad = 1;
  run_case(&c, 3);
}

/* Paged Q8_0 over shuffled pages of 16 rows, queries not causal (every
 * query rotated at cache_seqlens[b]). */
static void paged_q8_0_not_causal(void) {
  step_case c = base_case("paged q8_0, f16, GPT-J rotary, not causal");
  c.q_len = 5, c.new_len = 7, c.cap = 300, c.page_size = 16;
  c.dtype = CLATTN_F16, c.kv = CLATTN_Q8_0;
  c.rotary_dim = 32, c.interleaved = 1;
  run_case(&c, 4);
}

/* INT8 through cache_batch_idx (batch rows on shuffled slots of five), a
 * sliding window (queries at their own positions), value_dim apart. */
static void int8_through_cache_batch_idx_with_window(void) {
  step_case c = base_case("cache_batch_idx int8, f32, GPT-NeoX rotary, window");
  c.value_dim = 32, c.kv = CLATTN_INT8, c.slots = 5;
  c.rotary_dim = 32, c.interleaved = 0, c.window_left = 20, c.window_right = 0;
  c.q_len = 5, c.new_len = 7, c.cap = 53;
  run_case(&c, 5);
  c.name = "cache_batch_idx int8, f32, decode, leftpad";
  c.q_len = c.new_len = 1, c.leftpad = 1, c.window_left = -1, c.window_right = -1, c.causal = 1;
  run_case(&c, 6);
}

/* BF16, paged and left-padded, no rotary: the appended rows bit for bit. */
static void bf16_paged_leftpad_without_rotary(void) {
  step_case c = base_case("paged bf16, leftpad, no rotary");
  c.q_len = 5, c.new_len = 7, c.cap = 300, c.page_size = 13;
  c.head_dim = 40, c.value_dim = 24;
  c.dtype = c.kv = CLATTN_BF16;
  c.causal = 1, c.leftpad = 1;
  run_case(&c, 7);
}

/* Nothing appended: the step attends over the cache as it is, q rotated. */
static void no_new_rows_attends_over_the_cache(void) {
  step_case c = base_case("new_len 0, f32, GPT-J rotary");
  c.new_len = 0, c.q_len = 5, c.causal = 1;
  c.rotary_dim = 32, c.interleaved = 1;
  run_case(&c, 8);
}

/* Lengths are device values, unchecked without host_seqlens: a row whose
 * new rows pass the capacity (its queries' positions past the tables,
 * clamped to their last row), and one whose cache_seqlens is negative (the
 * rows before position 0 skipped, its queries at position 0), each against
 * the reference of what was written. */
static void device_lengths_past_the_cache_are_skipped_and_clamped(void) {
  static const int32_t seqlens[3] = {53, -3, 10};
  step_case c = base_case("hostile lengths, f32, GPT-J rotary");
  c.q_len = 5, c.new_len = 7, c.causal = 1, c.rotary_dim = 32, c.interleaved = 1;
  c.seqlens = seqlens;
  run_case(&c, 13);
  /* a block table reaching past attn.kv_len (19 pages of 16 rows for 300
   * keys): rows 300..303 have pages but are skipped, never stored rotated
   * at a clamped position */
  static const int32_t past_kv_len[3] = {0, 297, 5};
  c = base_case("paged rows past attn.kv_len, f32, GPT-J rotary");
  c.q_len = 5, c.new_len = 7, c.cap = 300, c.page_size = 16, c.rotary_dim = 32, c.causal = 1;
  c.seqlens = past_kv_len;
  run_case(&c, 15);
}

/* The lengths given on the host too (host_seqlens): a step whose rows have
 * no place is refused before anything is enqueued, naming the row, and
 * writes nothing (neither the cache nor the outputs). */
static void refused_lengths(const step_case *c, const char *message) {
  step_prob p;
  step_dev d;
  if (!CHECKF(sp_build(&p, c, 14) == 0 && sd_upload(&d, &p) == 0, "%s: setup", c->name)) {
    sp_free(&p);
    return;
  }
  clattn_context *ctx = ct_context();
  const int watched[] = {D_K, D_V, D_OUT, D_LSE};
  unsigned char *before[4];
  size_t sizes[4];
  for (int i = 0; i < 4; i++) before[i] = ct_mem_bytes(d.m[watched[i]], &sizes[i]);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (kc_algo_filtered_out(kc_algos[a])) continue;
    clattn_kvcache_params kp = sd_params(&d, &p, kc_algos[a]);
    kp.host_seqlens = p.seqlens;
    const clattn_status st = clattn_forward_kvcache(ctx, &kp, 0, NULL, NULL);
    CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT && strstr(clattn_last_error(ctx), message),
           "%s, %s: %s, \"%s\" (expected a refusal with \"%s\")", c->name, clattn_algo_name(kc_algos[a]),
           clattn_status_string(st), clattn_last_error(ctx), message);
  }
  clFinish(clattn_cl_queue(ctx));
  for (int i = 0; i < 4; i++) {
    size_t n = 0;
    unsigned char *now = ct_mem_bytes(d.m[watched[i]], &n);
    CHECKF(before[i] && now && n == sizes[i] && memcmp(before[i], now, n) == 0, "%s: buffer %d changed", c->name,
           watched[i]);
    free(before[i]), free(now);
  }
  sd_free(&d);
  sp_free(&p);
}

static void device_lengths_without_a_place_are_refused(void) {
  step_case c = base_case("new rows past a contiguous cache");
  c.q_len = 5, c.new_len = 7, c.causal = 1, c.rotary_dim = 32, c.interleaved = 1;
  static const int32_t past_the_cache[3] = {10, 47, 0};
  c.seqlens = past_the_cache;
  refused_lengths(&c, "cache_seqlens[1] = 47 plus new_len = 7 rows ends at row 54, past the cache's capacity of 53");
  static const int32_t negative[3] = {10, 0, -3};
  c.name = "a negative length", c.seqlens = negative;
  refused_lengths(&c, "cache_seqlens[2] = -3");
  /* one page of 16 rows per sequence, full: the new key has no page */
  c = base_case("new row past the block table");
  c.page_size = 16, c.cap = 16;
  static const int32_t full[3] = {16, 3, 0};
  c.seqlens = full;
  refused_lengths(&c, "cache_seqlens[0] = 16 plus new_len = 1 rows ends at row 17, past the block table's capacity of 16");
  /* a table reaching past attn.kv_len (19 pages of 16 rows for 300 keys):
   * rows 300..303 have pages but no rotary position and no key index */
  c = base_case("new rows past attn.kv_len, inside the table");
  c.q_len = 5, c.new_len = 7, c.cap = 300, c.page_size = 16, c.rotary_dim = 32, c.causal = 1;
  static const int32_t past_kv_len[3] = {0, 297, 5};
  c.seqlens = past_kv_len;
  refused_lengths(&c, "the row's 304 keys pass attn.kv_len = 300");
  /* nothing appended, the queries rotated past the tables */
  c = base_case("queries past the rotary tables");
  c.new_len = 0, c.q_len = 5, c.causal = 1, c.rotary_dim = 32;
  static const int32_t at_the_end[3] = {0, 50, 53};
  c.seqlens = at_the_end;
  refused_lengths(&c, "cache_seqlens[2] = 53 puts a row at position 57, past the rotary tables");
}

/* The step equals clattn_kv_append then clattn_forward over the lengths
 * (cache_seqlens + new_len) and starts (cache_leftpad, or zeros) bitwise,
 * contiguous and paged, every algorithm. */
static void step_equals_append_then_forward(void) {
  step_case cases[2];
  cases[0] = base_case("contiguous f16, no rotary");
  cases[0].dtype = cases[0].kv = CLATTN_F16, cases[0].q_len = 5, cases[0].new_len = 7, cases[0].causal = 1;
  cases[1] = base_case("paged q8_0, leftpad, no rotary");
  cases[1].kv = CLATTN_Q8_0, cases[1].page_size = 16, cases[1].cap = 300, cases[1].leftpad = 1;
  for (int i = 0; i < 2; i++) {
    step_prob p;
    if (!CHECKF(sp_build(&p, &cases[i], 9 + (uint64_t)i) == 0, "host problem")) {
      sp_free(&p);
      continue;
    }
    const step_case *c = &p.c;
    for (size_t a = 0; a < KC_NALGOS; a++) {
      if (kc_algo_filtered_out(kc_algos[a]) || (kc_algos[a] == CLATTN_ALGO_GEMM && !ca_gemm_available())) continue;
      step_dev one, two;
      if (!CHECK(sd_upload(&one, &p) == 0 && sd_upload(&two, &p) == 0)) {
        sd_free(&one), sd_free(&two);
        continue;
      }
      clattn_context *ctx = ct_context();
      clattn_kvcache_params kp = sd_params(&one, &p, kc_algos[a]);
      CHECK_STATUS(clattn_forward_kvcache(ctx, &kp, 0, NULL, NULL), CLATTN_OK);
      /* the same by hand */
      kp = sd_params(&two, &p, kc_algos[a]);
      int32_t lens[8], starts[8];
      for (int b = 0; b < c->batch; b++) lens[b] = p.seqlens[b] + c->new_len, starts[b] = p.leftpad ? p.leftpad[b] : 0;
      cl_mem lens_buf = make_buf(sizeof lens, lens), starts_buf = make_buf(sizeof starts, starts);
      clattn_append_params ap = clattn_append_params_default();
      ap.batch = c->batch, ap.kv_heads = c->kv_heads, ap.new_len = c->new_len;
      ap.head_dim = c->head_dim, ap.value_dim = c->value_dim, ap.src_dtype = c->dtype, ap.kv_dtype = c->kv;
      ap.k_new = kp.k_new, ap.v_new = kp.v_new, ap.positions = kp.cache_seqlens;
      ap.k = kp.attn.k, ap.v = kp.attn.v, ap.k_scale = kp.attn.k_scale, ap.v_scale = kp.attn.v_scale;
      ap.block_table = kp.attn.block_table, ap.block_table_stride = kp.attn.block_table_stride;
      ap.page_size = kp.attn.page_size, ap.num_pages = kp.attn.num_pages, ap.capacity = c->cap;
      clattn_params fp = kp.attn;
      fp.kv_lens = lens_buf;
      fp.cache_leftpad = starts_buf;
      CHECK_STATUS(clattn_kv_append(ctx, &ap, 0, NULL, NULL), CLATTN_OK);
      CHECK_STATUS(clattn_forward(ctx, &fp, 0, NULL, NULL), CLATTN_OK);
      const size_t kb = p.k0.units * p.k0.unit, vb = p.v0.units * p.v0.unit;
      const int bufs[] = {D_OUT, D_K, D_V};
      const size_t sizes[] = {one.out_bytes, kb, vb};
      for (int k = 0; k < 3; k++) {
        void *x = read_all(one.m[bufs[k]], sizes[k]), *y = read_all(two.m[bufs[k]], sizes[k]);
        CHECKF(x && y && memcmp(x, y, sizes[k]) == 0, "%s, %s: %s differs from append + forward", c->name,
               clattn_algo_name(kc_algos[a]),
               k == 0   ? "out"
               : k == 1 ? "k cache"
                        : "v cache");
        free(x), free(y);
      }
      clReleaseMemObject(lens_buf), clReleaseMemObject(starts_buf);
      sd_free(&one), sd_free(&two);
    }
    sp_free(&p);
  }
}

/* A chain of three steps on an out-of-order queue (each waiting only for
 * the one before, the first for a user event set once all are in) equals the same steps on the in-order queue bitwise:
 * out of every step, and the cache. */
static void out_of_order_steps_equal_in_order(void) {
  clattn_context *ooo = kc_out_of_order_context();
  if (!ooo) return;
  step_case c = base_case("paged q8_0 chain");
  c.kv = CLATTN_Q8_0, c.page_size = 16, c.cap = 300, c.q_len = 2, c.new_len = 2, c.causal = 1;
  c.rotary_dim = 32, c.interleaved = 0, c.leftpad = 1;
  step_prob p;
  if (!CHECKF(sp_build(&p, &c, 11) == 0, "host problem")) {
    sp_free(&p);
    clattn_destroy(ooo);
    return;
  }
  enum { STEPS = 3 };
  for (int b = 0; b < c.batch; b++)
    p.seqlens[b] = p.seqlens[b] > STEPS * c.new_len ? p.seqlens[b] - STEPS * c.new_len : 0;
  if (p.leftpad)
    for (int b = 0; b < c.batch; b++) p.leftpad[b] = p.leftpad[b] < p.seqlens[b] ? p.leftpad[b] : p.seqlens[b];
  clattn_context *ctxs[2] = {ct_context(), ooo};
  step_dev d[2];
  cl_mem seq[2][STEPS], outs[2][STEPS];
  memset(seq, 0, sizeof seq), memset(outs, 0, sizeof outs);
  int ok = sd_upload(&d[0], &p) == 0 && sd_upload(&d[1], &p) == 0;
  for (int q = 0; q < 2 && ok; q++) {
    /* the chain waits behind a user event until every step is in */
    cl_int e;
    cl_event prev = clCreateUserEvent(clattn_cl_context(ctxs[q]), &e), gate = prev;
    if (!CHECK(e == CL_SUCCESS && clRetainEvent(gate) == CL_SUCCESS)) break;
    for (int s = 0; s < STEPS && ok; s++) {
      int32_t lens[8];
      for (int b = 0; b < c.batch; b++) lens[b] = p.seqlens[b] + s * c.new_len;
      float *nan_out = nan_filled(p.out_n);
      seq[q][s] = make_buf(sizeof lens, lens);
      outs[q][s] = nan_out ? upload(nan_out, p.out_n, c.dtype) : NULL;
      free(nan_out);
      if (!seq[q][s] || !outs[q][s]) ok = 0;
      clattn_kvcache_params kp = sd_params(&d[q], &p, CLATTN_ALGO_FUSED);
      kp.cache_seqlens = seq[q][s];
      kp.attn.out.buf = outs[q][s];
      kp.attn.lse.buf = NULL;
      cl_event done = NULL;
      const clattn_status st = ok ? clattn_forward_kvcache(ctxs[q], &kp, 1, &prev, &done) : CLATTN_ERR_INVALID_ARGUMENT;
      CHECKF(st == CLATTN_OK, "%s queue, step %d: %s", q ? "out-of-order" : "in-order", s, clattn_last_error(ctxs[q]));
      if (prev) clReleaseEvent(prev);
      prev = done;
      ok = ok && st == CLATTN_OK;
    }
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE) == CL_SUCCESS);
    clReleaseEvent(gate);
    if (prev) {
      CHECK(clWaitForEvents(1, &prev) == CL_SUCCESS);
      clReleaseEvent(prev);
    }
    clFinish(clattn_cl_queue(ctxs[q]));
  }
  if (ok) {
    const size_t ob = p.out_n * (c.dtype == CLATTN_F32 ? 4 : 2);
    for (int s = 0; s < STEPS; s++) {
      void *x = read_all(outs[0][s], ob), *y = read_all(outs[1][s], ob);
      CHECKF(x && y && memcmp(x, y, ob) == 0, "step %d: out differs between the queues", s);
      free(x), free(y);
    }
    const int bufs[] = {D_K, D_V};
    const size_t sizes[] = {p.k0.units * p.k0.unit, p.v0.units * p.v0.unit};
    for (int k = 0; k < 2; k++) {
      void *x = read_all(d[0].m[bufs[k]], sizes[k]), *y = read_all(d[1].m[bufs[k]], sizes[k]);
      CHECKF(x && y && memcmp(x, y, sizes[k]) == 0, "the %s cache differs between the queues", k ? "v" : "k");
      free(x), free(y);
    }
  }
  for (int q = 0; q < 2; q++)
    for (int s = 0; s < STEPS; s++) {
      if (seq[q][s]) clReleaseMemObject(seq[q][s]);
      if (outs[q][s]) clReleaseMemObject(outs[q][s]);
    }
  sd_free(&d[0]), sd_free(&d[1]);
  sp_free(&p);
  clattn_destroy(ooo);
}

/* ---------- the plan form ---------- */

/* A decode loop through clattn_plan_create_kvcache: four steps, each
 * appending one row per sequence at cache_seqlens (moved on between steps,
 * as an engine does) and attending, bitwise equal to clattn_forward_kvcache
 * on a second copy of every buffer (out, lse and both caches), paged Q8_0
 * with rotary and contiguous F16 through cache_batch_idx, every algorithm.
 * Then what a step may not change is refused, naming the field, and a
 * step whose host lengths leave no place writes nothing. */
static void plan_steps_equal_forward_kvcache(void) {
  static const int32_t start[3] = {0, 5, 17};
  step_case cases[2];
  cases[0] = base_case("plan: paged q8_0, GPT-J rotary, causal");
  cases[0].kv = CLATTN_Q8_0, cases[0].page_size = 16, cases[0].cap = 64, cases[0].rotary_dim = 32;
  cases[0].causal = 1, cases[0].seqlens = start;
  cases[1] = base_case("plan: contiguous f16 through cache_batch_idx, leftpad");
  cases[1].dtype = cases[1].kv = CLATTN_F16, cases[1].slots = 4, cases[1].leftpad = 1, cases[1].seqlens = start;
  clattn_context *ctx = ct_context();
  cl_command_queue queue = clattn_cl_queue(ctx);
  enum { STEPS = 4 };
  for (int ci = 0; ci < 2; ci++) {
    const step_case *c = &cases[ci];
    for (size_t a = 0; a < KC_NALGOS; a++) {
      if (kc_algo_filtered_out(kc_algos[a])) continue;
      step_prob p;
      step_dev planned, called;
      if (!CHECKF(sp_build(&p, c, 21) == 0 && sd_upload(&planned, &p) == 0 && sd_upload(&called, &p) == 0, "%s: setup",
                  c->name)) {
        sp_free(&p);
        continue;
      }
      const char *algo = clattn_algo_name(kc_algos[a]);
      const clattn_kvcache_params kp_plan = sd_params(&planned, &p, kc_algos[a]),
                                  kp_call = sd_params(&called, &p, kc_algos[a]);
      clattn_plan *plan = NULL;
      if (!CHECKF(clattn_plan_create_kvcache(ctx, &kp_plan, &plan) == CLATTN_OK, "%s, %s: %s", c->name, algo,
                  clattn_last_error(ctx)))
        goto next;
      for (int step = 0; step < STEPS; step++) {
        int32_t lens[3];
        for (int b = 0; b < 3; b++) lens[b] = start[b] + step * c->new_len;
        CHECK(clEnqueueWriteBuffer(queue, planned.m[D_SEQ], CL_TRUE, 0, sizeof lens, lens, 0, NULL, NULL) ==
                  CL_SUCCESS &&
              clEnqueueWriteBuffer(queue, called.m[D_SEQ], CL_TRUE, 0, sizeof lens, lens, 0, NULL, NULL) == CL_SUCCESS);
        clattn_step s = clattn_step_default();
        s.host_seqlens = lens;
        CHECKF(clattn_plan_enqueue(plan, &s, 0, NULL, NULL) == CLATTN_OK, "%s, %s, step %d: %s", c->name, algo, step,
               clattn_last_error(ctx));
        CHECKF(clattn_forward_kvcache(ctx, &kp_call, 0, NULL, NULL) == CLATTN_OK, "%s, %s, step %d: %s", c->name, algo,
               step, clattn_last_error(ctx));
        clFinish(queue);
        const int bufs[] = {D_OUT, D_LSE, D_K, D_V};
        for (int i = 0; i < 4; i++) {
          size_t n1 = 0, n2 = 0;
          unsigned char *x = ct_mem_bytes(planned.m[bufs[i]], &n1), *y = ct_mem_bytes(called.m[bufs[i]], &n2);
          CHECKF(x && y && n1 == n2 && memcmp(x, y, n1) == 0, "%s, %s, step %d: buffer %d differs from the call's",
                 c->name, algo, step, bufs[i]);
          free(x), free(y);
        }
        /* and the step ran: every lse written (the NaN fill gone) */
        size_t n = 0;
        float *lse = (float *)(void *)ct_mem_bytes(planned.m[D_LSE], &n);
        long unwritten = 0;
        for (size_t i = 0; lse && i < n / sizeof *lse; i++) unwritten += isnan(lse[i]);
        CHECKF(lse && unwritten == 0, "%s, %s, step %d: %ld lse values unwritten", c->name, algo, step, unwritten);
        free(lse);
      }
      /* what a step cannot change, and lengths with no place */
      clattn_step s = clattn_step_default();
      s.kv_len = 5;
      CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(clattn_last_error(ctx), "step.kv_len"));
      s = clattn_step_default();
      s.out_offset = 0;
      CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(clattn_last_error(ctx), "step.out_offset"));
      const int32_t full[3] = {0, c->cap, 1};
      s = clattn_step_default();
      s.host_seqlens = full;
      size_t n_before = 0, n_after = 0;
      unsigned char *before = ct_mem_bytes(planned.m[D_K], &n_before);
      CHECK_STATUS(clattn_plan_enqueue(plan, &s, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
      CHECKF(strstr(clattn_last_error(ctx), "cache_seqlens[1]"), "%s", clattn_last_error(ctx));
      clFinish(queue);
      unsigned char *after = ct_mem_bytes(planned.m[D_K], &n_after);
      CHECKF(before && after && n_before == n_after && memcmp(before, after, n_before) == 0,
             "%s, %s: a refused step wrote the cache", c->name, algo);
      free(before), free(after);
      CHECKF(strstr(clattn_plan_describe(plan), "kv_append"), "%s: %s", algo, clattn_plan_describe(plan));
    next:
      clattn_plan_release(plan);
      sd_free(&planned), sd_free(&called);
      sp_free(&p);
    }
  }
}

/* ---------- refusals ---------- */

static void refusals_say_why_and_write_nothing(void) {
  step_case c = base_case("refusals");
  c.q_len = 2, c.new_len = 2, c.causal = 1, c.rotary_dim = 32, c.kv = CLATTN_INT8, c.dtype = CLATTN_F16;
  step_prob p;
  step_dev d;
  if (!CHECKF(sp_build(&p, &c, 12) == 0 && sd_upload(&d, &p) == 0, "setup")) {
    sp_free(&p);
    return;
  }
  clattn_context *ctx = ct_context();
  const clattn_kvcache_params good = sd_params(&d, &p, CLATTN_ALGO_AUTO);
  const int watched[] = {D_K, D_V, D_KS, D_VS, D_OUT, D_LSE, D_Q, D_KN};
  unsigned char *before[8];
  size_t sizes[8];
  for (int i = 0; i < 8; i++) before[i] = ct_mem_bytes(d.m[watched[i]], &sizes[i]);
  cl_mem small = make_buf(4, NULL), other = make_buf(1 << 16, NULL);
  cl_mem ro = NULL;
  {
    cl_int e;
    ro = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_ONLY, p.k0.units * p.k0.unit, NULL, &e);
  }
  struct {
    const char *what;
    clattn_status want;
    const char *message; /* a part of the message */
  } cases[] = {
      {"attn.kv_lens set", CLATTN_ERR_INVALID_ARGUMENT, "attn.kv_lens must be NULL"},
      {"attn.cu_seqlens_q set", CLATTN_ERR_INVALID_ARGUMENT, "cu_seqlens"},
      {"cache_seqlens NULL", CLATTN_ERR_INVALID_ARGUMENT, "cache_seqlens is NULL"},
      {"new_len -1", CLATTN_ERR_INVALID_ARGUMENT, "new_len must be >= 0"},
      {"k_new absent", CLATTN_ERR_INVALID_ARGUMENT, "k_new.buf is NULL"},
      {"v_new with new_len 0", CLATTN_ERR_INVALID_ARGUMENT, "new_len is 0"},
      {"v_dtype other than the cache's", CLATTN_ERR_INVALID_ARGUMENT, "v_dtype"},
      {"a q4_0 cache", CLATTN_ERR_UNSUPPORTED, "Q4_0"},
      {"cache_batch_idx with a block table", CLATTN_ERR_INVALID_ARGUMENT, "cache_batch_idx with attn.block_table"},
      {"num_slots -1", CLATTN_ERR_INVALID_ARGUMENT, "num_slots must be >= 0"},
      {"num_slots without cache_batch_idx", CLATTN_ERR_INVALID_ARGUMENT, "cache_batch_idx is NULL"},
      {"new_len past the capacity", CLATTN_ERR_INVALID_ARGUMENT, "exceeds the cache's capacity"},
      {"rotary_sin absent", CLATTN_ERR_INVALID_ARGUMENT, "come together"},
      {"rotary_dim odd", CLATTN_ERR_INVALID_ARGUMENT, "rotary_dim must be even"},
      {"rotary_dim past head_dim", CLATTN_ERR_INVALID_ARGUMENT, "rotary_dim must be even"},
      {"rotary_len short", CLATTN_ERR_INVALID_ARGUMENT, "rotary_len"},
      {"rotary_interleaved 2", CLATTN_ERR_INVALID_ARGUMENT, "rotary_interleaved"},
      {"rotary_dim without tables", CLATTN_ERR_INVALID_ARGUMENT, "without rotary_cos"},
      {"cache_seqlens too small", CLATTN_ERR_BUFFER_TOO_SMALL, "cache_seqlens"},
      {"rotary_cos too small", CLATTN_ERR_BUFFER_TOO_SMALL, "rotary_cos"},
      {"cache_batch_idx too small", CLATTN_ERR_BUFFER_TOO_SMALL, "cache_batch_idx"},
      {"k_new on out", CLATTN_ERR_INVALID_ARGUMENT, "k_new"},
      {"q on the k cache", CLATTN_ERR_INVALID_ARGUMENT, "share"},
      {"k_new inside the v cache", CLATTN_ERR_INVALID_ARGUMENT, "share"},
      {"the k and v caches on the same bytes", CLATTN_ERR_INVALID_ARGUMENT, "share"},
      {"out on cache_seqlens", CLATTN_ERR_INVALID_ARGUMENT, "cache_seqlens"},
      {"k_scale on a rotary table", CLATTN_ERR_INVALID_ARGUMENT, "rotary_"},
      {"a read-only k cache", CLATTN_ERR_INVALID_ARGUMENT, "CL_MEM_READ_ONLY"},
      {"n_wait without wait", CLATTN_ERR_INVALID_ARGUMENT, "wait is NULL"},
      {"paged, new_len past the table", CLATTN_ERR_INVALID_ARGUMENT, "new_len 54 exceeds attn.kv_len = 53"},
  };
  const int n_cases = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n_cases; i++) {
    clattn_kvcache_params kp = good;
    cl_uint n_wait = 0;
    switch (i) {
      case 0: kp.attn.kv_lens = d.m[D_SEQ]; break;
      case 1: kp.attn.cu_seqlens_q = d.m[D_SEQ], kp.attn.total_q = 1; break;
      case 2: kp.cache_seqlens = NULL; break;
      case 3: kp.new_len = -1; break;
      case 4: kp.k_new.buf = NULL; break;
      case 5: kp.new_len = 0, kp.k_new.buf = NULL; break;
      case 6: kp.attn.v_dtype = CLATTN_F16; break;
      case 7: kp.attn.kv_dtype = kp.attn.v_dtype = CLATTN_Q4_0; break;
      case 8:
        kp.cache_batch_idx = d.m[D_SEQ];
        kp.attn.block_table = d.m[D_SEQ], kp.attn.block_table_stride = 1;
        kp.attn.page_size = c.cap, kp.attn.num_pages = c.batch;
        break;
      case 9: kp.num_slots = -1; break;
      case 10: kp.num_slots = 4; break;
      case 11: kp.new_len = c.cap + 1; break;
      case 12: kp.rotary_sin.buf = NULL; break;
      case 13: kp.rotary_dim = 31; break;
      case 14: kp.rotary_dim = c.head_dim + 2; break;
      case 15: kp.rotary_len = c.cap - 1; break;
      case 16: kp.rotary_interleaved = 2; break;
      case 17: kp.rotary_cos.buf = kp.rotary_sin.buf = NULL; break;
      case 18: kp.cache_seqlens = small; break;
      case 19: kp.rotary_cos.buf = small; break;
      case 20: kp.cache_batch_idx = small, kp.num_slots = c.batch; break;
      case 21: kp.k_new.buf = d.m[D_OUT]; break;
      case 22: kp.attn.q.buf = d.m[D_K]; break;
      case 23: kp.k_new.buf = d.m[D_V], kp.k_new.offset = 0; break;
      case 24: kp.attn.v = kp.attn.k; break;
      case 25:
        kp.attn.out.buf = other;
        kp.cache_seqlens = other;
        break;
      case 26: kp.attn.k_scale.buf = kp.rotary_cos.buf = other, kp.attn.k_scale.offset = 0; break;
      case 27: kp.attn.k.buf = ro; break;
      case 28: n_wait = 1; break;
      case 29:
        kp.attn.block_table = d.m[D_SEQ], kp.attn.block_table_stride = 1;
        kp.attn.page_size = c.cap, kp.attn.num_pages = c.batch;
        kp.new_len = c.cap + 1;
        break;
    }
    const clattn_status st = clattn_forward_kvcache(ctx, &kp, n_wait, NULL, NULL);
    CHECKF(st == cases[i].want && strstr(clattn_last_error(ctx), cases[i].message),
           "%s: %s, \"%s\" (expected %s and a message with \"%s\")", cases[i].what, clattn_status_string(st),
           clattn_last_error(ctx), clattn_status_string(cases[i].want), cases[i].message);
  }
  clFinish(clattn_cl_queue(ctx));
  for (int i = 0; i < 8; i++) {
    size_t n = 0;
    unsigned char *now = ct_mem_bytes(d.m[watched[i]], &n);
    CHECKF(before[i] && now && n == sizes[i] && memcmp(before[i], now, n) == 0, "buffer %d changed by a refused call",
           watched[i]);
    free(before[i]), free(now);
  }
  /* and the good params run (waited for: nothing of it may still run when the process exits) */
  clattn_kvcache_params kp = good;
  CHECK_STATUS(clattn_forward_kvcache(ctx, &kp, 0, NULL, NULL), CLATTN_OK);
  CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS);
  clReleaseMemObject(small), clReleaseMemObject(other);
  if (ro) clReleaseMemObject(ro);
  sd_free(&d);
  sp_free(&p);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(defaults_follow_the_contract),
      CT_TEST(decode_step_matches_reference),
      CT_TEST(chunk_with_neox_rotary_and_leftpad),
      CT_TEST(paged_q8_0_not_causal),
      CT_TEST(int8_through_cache_batch_idx_with_window),
      CT_TEST(bf16_paged_leftpad_without_rotary),
      CT_TEST(no_new_rows_attends_over_the_cache),
      CT_TEST(device_lengths_past_the_cache_are_skipped_and_clamped),
      CT_TEST(device_lengths_without_a_place_are_refused),
      CT_TEST(step_equals_append_then_forward),
      CT_TEST(out_of_order_steps_equal_in_order),
      CT_TEST(plan_steps_equal_forward_kvcache),
      CT_TEST(refusals_say_why_and_write_nothing),
  };
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
