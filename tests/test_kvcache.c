/*
 * K/V caches as inference engines keep them (issue 13): paged K/V through
 * block tables, Q8_0 and INT8 storage, clattn_kv_append.
 *
 *  - the contract's defaults and enum values;
 *  - clattn_kv_append for every cache storage, contiguous and paged, byte for
 *    byte against a host copy of ggml's quantize_row_q8_0_reference rules
 *    (and the INT8 and 16-bit rules), rows past the capacity, past the block
 *    table or on pages outside the pool skipped, everything else untouched;
 *  - every path (fused, staged, GEMM) over paged and quantised caches against the fp64
 *    reference over the dequantised values: odd page sizes, kv_lens that are
 *    not page multiples, shuffled and shared pages, entries outside the pool,
 *    NaN/Inf in unused rows of partly filled pages and in unused pages, GQA,
 *    masks, bias, windows, causal chunks, ALiBi, softcap, sinks, lse, route
 *    diagnostics, additive scores, decode with N = 4099 through split-KV;
 *  - bad input rejected before anything is enqueued, nothing touched.
 *
 * The cache on the host is the same bytes as on the device: the forward
 * tests quantise it on the host with ggml's rules (so clattn reads a cache
 * llama.cpp wrote), the append tests check the device's bytes against them
 * (so llama.cpp reads a cache clattn wrote).
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "problem.h"
#include "reference.h"

/* ---------- small helpers ---------- */

/* A non-NULL cl_mem for the reference, which only asks whether a field is set. */
#define DUMMY_MEM ((cl_mem)(uintptr_t)1)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}
static float urand(float a) { return a * (2.0f * (float)(rnd() % 1000001u) / 1000000.0f - 1.0f); }

static cl_mem make_buf(size_t bytes, const void *host) {
  cl_int e = CL_SUCCESS;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                            bytes ? bytes : 1, (void *)host, &e);
  return e == CL_SUCCESS ? m : NULL;
}
static int read_buf(cl_mem m, void *host, size_t bytes) {
  return clEnqueueReadBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, 0, bytes, host, 0, NULL, NULL) == CL_SUCCESS;
}
static void release(cl_mem *m) {
  if (*m) clReleaseMemObject(*m);
  *m = NULL;
}

/* ggml's quantize_row_q8_0_reference (ggml-quants.c), on a host copy of its
 * block layout: per 32 values d = amax / 127 as f16, q = roundf(x / d). */
static void quantize_row_q8_0_reference(const float *x, unsigned char *y, int k) {
  const int nb = k / 32;
  for (int i = 0; i < nb; i++) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
      const float v = x[i * 32 + j];
      amax = fmaxf(amax, fabsf(v));
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = cp_f16_bits(d); /* GGML_FP32_TO_FP16: round to nearest even */
    memcpy(y + i * 34, &dh, 2);
    for (int j = 0; j < 32; ++j) {
      const float x0 = x[i * 32 + j] * id;
      y[i * 34 + 2 + j] = (unsigned char)(int8_t)roundf(x0);
    }
  }
}

/* ggml's other 32-element blocks (ggml-common.h): bytes of one block, 0
 * for the element types. */
static size_t block_bytes(clattn_dtype t) {
  switch (t) {
    case CLATTN_Q8_0: return 34;
    case CLATTN_Q4_0: return 18;
    case CLATTN_Q4_1: return 20;
    case CLATTN_Q5_0: return 22;
    case CLATTN_Q5_1: return 24;
    case CLATTN_IQ4_NL: return 18;
    default: return 0;
  }
}

static const int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Element i of a Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL block, as ggml's
 * dequantize_row_* define it (d n + m with one rounding, as the kernels'
 * fma computes it). */
static float block_value(clattn_dtype t, const unsigned char *blk, int i) {
  uint16_t h;
  memcpy(&h, blk, 2);
  const float d = cp_f16_value(h);
  const int qs = t == CLATTN_Q4_1 ? 4 : t == CLATTN_Q5_0 ? 6 : t == CLATTN_Q5_1 ? 8 : 2;
  int n = i < 16 ? blk[qs + i] & 15 : blk[qs + i - 16] >> 4;
  if (t == CLATTN_IQ4_NL) return d * (float)iq4nl_levels[n];
  if (t == CLATTN_Q5_0 || t == CLATTN_Q5_1) {
    uint32_t qh;
    memcpy(&qh, blk + (t == CLATTN_Q5_0 ? 2 : 4), 4);
    n |= (int)((qh >> i) & 1u) << 4;
  }
  if (t == CLATTN_Q4_0) return d * (float)(n - 8);
  if (t == CLATTN_Q5_0) return d * (float)(n - 16);
  memcpy(&h, blk + 2, 2);
  return fmaf(d, (float)n, cp_f16_value(h));
}

/* 32 values into one block, with ggml's quantize_row_*_ref rules (IQ4_NL:
 * the nearest of its levels at d = amax / 127, a valid block if not
 * ggml's search for the best scale). */
static void quantize_block(clattn_dtype t, const float *x, unsigned char *y) {
  float amax = 0.0f, max = 0.0f, lo = x[0], hi = x[0];
  for (int j = 0; j < 32; j++) {
    if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    lo = fminf(lo, x[j]);
    hi = fmaxf(hi, x[j]);
  }
  const int offset = t == CLATTN_Q4_1 || t == CLATTN_Q5_1; /* d n + m */
  const int five = t == CLATTN_Q5_0 || t == CLATTN_Q5_1;
  float d = offset               ? (hi - lo) / (five ? 31.0f : 15.0f)
            : t == CLATTN_IQ4_NL ? amax / 127.0f
                                 : max / (five ? -16.0f : -8.0f);
  const float id = d ? 1.0f / d : 0.0f;
  uint16_t h = cp_f16_bits(d);
  memcpy(y, &h, 2);
  if (offset) {
    h = cp_f16_bits(lo);
    memcpy(y + 2, &h, 2);
  }
  const int qs = t == CLATTN_Q4_1 ? 4 : t == CLATTN_Q5_0 ? 6 : t == CLATTN_Q5_1 ? 8 : 2;
  uint32_t qh = 0;
  for (int j = 0; j < 32; j++) {
    int q;
    if (t == CLATTN_IQ4_NL) {
      q = 0;
      for (int l = 1; l < 16; l++)
        if (fabsf(x[j] * id - iq4nl_levels[l]) < fabsf(x[j] * id - iq4nl_levels[q])) q = l;
    } else if (offset) {
      q = (int)(uint8_t)((x[j] - lo) * id + 0.5f);
      if (!five && q > 15) q = 15;
    } else {
      q = (int8_t)(x[j] * id + (five ? 16.5f : 8.5f));
      if (q > (five ? 31 : 15)) q = five ? 31 : 15;
    }
    if (j < 16)
      y[qs + j] = (unsigned char)(q & 15);
    else
      y[qs + j - 16] |= (unsigned char)((q & 15) << 4);
    qh |= (uint32_t)((q >> 4) & 1) << j;
  }
  if (five) memcpy(y + (t == CLATTN_Q5_0 ? 2 : 4), &qh, 4);
}

/* ---------- a host model of a cache view ---------- */

typedef struct {
  clattn_dtype kv;
  int slots, heads, rows, cols; /* [batch or page, kv head, row, column] */
  clattn_tensor view;           /* offset and strides in units (bytes for Q8_0) */
  size_t unit, units;           /* bytes per unit, units in the buffer */
  unsigned char *data;
  float *scale; /* INT8: [slots, heads, rows] after one unit of offset */
  size_t scale_n;
  clattn_tensor scale_view;
} hcache;

static int hc_make(hcache *c, clattn_dtype kv, int slots, int heads, int rows, int cols) {
  memset(c, 0, sizeof *c);
  c->kv = kv;
  c->slots = slots;
  c->heads = heads;
  c->rows = rows;
  c->cols = cols;
  c->unit = kv == CLATTN_F32 ? 4 : (kv == CLATTN_F16 || kv == CLATTN_BF16) ? 2 : 1;
  const size_t block = block_bytes(kv), row_units = block ? (size_t)cols / 32 * block : (size_t)cols;
  const size_t s2 = row_units + 2, s1 = (size_t)rows * s2, s0 = (size_t)heads * s1; /* a gap after each row */
  c->view.offset = 2;
  c->view.stride[0] = s0;
  c->view.stride[1] = s1;
  c->view.stride[2] = s2;
  c->view.stride[3] = block ? block : 1;
  c->units = 2 + (size_t)slots * s0 + 2;
  c->data = malloc(c->units * c->unit);
  if (!c->data) return -1;
  if (kv == CLATTN_INT8) {
    c->scale_n = 1 + (size_t)slots * heads * rows + 1;
    c->scale = malloc(c->scale_n * sizeof(float));
    if (!c->scale) return -1;
    c->scale_view.offset = 1;
    c->scale_view.stride[0] = (size_t)heads * rows;
    c->scale_view.stride[1] = (size_t)rows;
    c->scale_view.stride[2] = 1;
  }
  return 0;
}
static void hc_free(hcache *c) {
  free(c->data);
  free(c->scale);
  memset(c, 0, sizeof *c);
}
static size_t hc_row(const hcache *c, int s, int h, int r) {
  return c->view.offset + (size_t)s * c->view.stride[0] + (size_t)h * c->view.stride[1] + (size_t)r * c->view.stride[2];
}
static size_t hc_scale_at(const hcache *c, int s, int h, int r) {
  return c->scale_view.offset + (size_t)s * c->scale_view.stride[0] + (size_t)h * c->scale_view.stride[1] + (size_t)r;
}
/* Row (s, h, r) := x, stored with ggml's / clattn's rules. */
static void hc_write(hcache *c, int s, int h, int r, const float *x) {
  unsigned char *row = c->data + hc_row(c, s, h, r) * c->unit;
  switch (c->kv) {
    case CLATTN_F32: memcpy(row, x, (size_t)c->cols * 4); break;
    case CLATTN_F16:
    case CLATTN_BF16:
      for (int i = 0; i < c->cols; i++) {
        uint16_t b = c->kv == CLATTN_F16 ? cp_f16_bits(x[i]) : cp_bf16_bits(x[i]);
        memcpy(row + 2 * i, &b, 2);
      }
      break;
    case CLATTN_Q8_0: quantize_row_q8_0_reference(x, row, c->cols); break;
    case CLATTN_Q4_0:
    case CLATTN_Q4_1:
    case CLATTN_Q5_0:
    case CLATTN_Q5_1:
    case CLATTN_IQ4_NL:
      for (int b = 0; b < c->cols / 32; b++) quantize_block(c->kv, x + 32 * b, row + (size_t)b * block_bytes(c->kv));
      break;
    default: {
      float amax = 0.0f;
      for (int i = 0; i < c->cols; i++) amax = fmaxf(amax, fabsf(x[i]));
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      for (int i = 0; i < c->cols; i++) row[i] = (unsigned char)(int8_t)roundf(x[i] * id);
      c->scale[hc_scale_at(c, s, h, r)] = d;
    }
  }
}
/* The dequantised value, in f32 as the kernels compute it. */
static float hc_read(const hcache *c, int s, int h, int r, int i) {
  const unsigned char *row = c->data + hc_row(c, s, h, r) * c->unit;
  uint16_t b;
  switch (c->kv) {
    case CLATTN_F32: {
      float v;
      memcpy(&v, row + 4 * i, 4);
      return v;
    }
    case CLATTN_F16: memcpy(&b, row + 2 * i, 2); return cp_f16_value(b);
    case CLATTN_BF16: memcpy(&b, row + 2 * i, 2); return cp_bf16_value(b);
    case CLATTN_Q8_0:
      memcpy(&b, row + (size_t)(i / 32) * 34, 2);
      return cp_f16_value(b) * (float)(int8_t)row[(size_t)(i / 32) * 34 + 2 + i % 32];
    case CLATTN_INT8: return c->scale[hc_scale_at(c, s, h, r)] * (float)(int8_t)row[i];
    default: return block_value(c->kv, row + (size_t)(i / 32) * block_bytes(c->kv), i % 32);
  }
}
/* NaN (or Inf) in a row no output may read. */
static void hc_poison(hcache *c, int s, int h, int r, int inf) {
  unsigned char *row = c->data + hc_row(c, s, h, r) * c->unit;
  const float f = inf ? INFINITY : NAN;
  const uint16_t f16 = inf ? 0x7c00u : 0x7e00u, bf16 = inf ? 0x7f80u : 0x7fc0u;
  for (int i = 0; i < c->cols; i++) switch (c->kv) {
      case CLATTN_F32: memcpy(row + 4 * i, &f, 4); break;
      case CLATTN_F16: memcpy(row + 2 * i, &f16, 2); break;
      case CLATTN_BF16: memcpy(row + 2 * i, &bf16, 2); break;
      case CLATTN_INT8:
        row[i] = (unsigned char)(rnd() & 0xff);
        c->scale[hc_scale_at(c, s, h, r)] = f;
        break;
      default: { /* a block type: its f16 d (and m) non-finite, random quants */
        unsigned char *blk = row + (size_t)(i / 32) * block_bytes(c->kv);
        if (i % 32 == 0) {
          for (size_t x = 2; x < block_bytes(c->kv); x++) blk[x] = (unsigned char)(rnd() & 0xff);
          memcpy(blk, &f16, 2);
          if (c->kv == CLATTN_Q4_1 || c->kv == CLATTN_Q5_1) memcpy(blk + 2, &f16, 2);
        }
      }
    }
}

static const char *kv_name(clattn_dtype t) {
  switch (t) {
    case CLATTN_F32: return "f32";
    case CLATTN_F16: return "f16";
    case CLATTN_BF16: return "bf16";
    case CLATTN_Q8_0: return "q8_0";
    case CLATTN_INT8: return "int8";
    case CLATTN_Q4_0: return "q4_0";
    case CLATTN_Q4_1: return "q4_1";
    case CLATTN_Q5_0: return "q5_0";
    case CLATTN_Q5_1: return "q5_1";
    case CLATTN_IQ4_NL: return "iq4_nl";
    default: return "same";
  }
}

/* ---------- 1. the contract ---------- */

static void defaults_and_enum_values_follow_the_contract(void) {
  CHECK(CLATTN_Q8_0 == 3 && CLATTN_INT8 == 4 && CLATTN_DTYPE_SAME == -1);
  clattn_params p = clattn_params_default();
  CHECK(p.kv_dtype == CLATTN_DTYPE_SAME);
  CHECK(p.k_scale.buf == NULL && p.v_scale.buf == NULL && p.block_table == NULL);
  CHECK(p.block_table_stride == 0 && p.page_size == 0 && p.num_pages == 0);
  clattn_append_params ap = clattn_append_params_default();
  CHECK(ap.src_dtype == CLATTN_F32 && ap.kv_dtype == CLATTN_DTYPE_SAME);
  CHECK(ap.k_new.buf == NULL && ap.v_new.buf == NULL && ap.k.buf == NULL && ap.v.buf == NULL);
  CHECK(ap.positions == NULL && ap.block_table == NULL && ap.k_scale.buf == NULL && ap.v_scale.buf == NULL);
  CHECK(ap.batch == 0 && ap.new_len == 0 && ap.capacity == 0 && ap.page_size == 0 && ap.num_pages == 0);
}

/* ---------- 2. clattn_kv_append ---------- */

enum { AP_B = 2, AP_H = 2, AP_NEW = 5, AP_DK = 64, AP_DV = 32, AP_CAP = 12, AP_PS = 7, AP_PAGES = 5, AP_BTS = 3 };

/* New rows: random, plus a block with amax 127 and ties (x.5) that tell
 * round-half-away-from-zero from round-to-even, and an all-zero block. */
static void fill_new_rows(float *x, size_t n, int cols, clattn_dtype src) {
  for (size_t i = 0; i < n; i++) x[i] = urand(2.0f) * (i / (size_t)cols % 3 == 1 ? 50.0f : 1.0f);
  for (int c = 0; c < 32 && c < cols; c++) x[c] = c == 0 ? 127.0f : (float)(c % 7) - 3.5f; /* row 0, block 0 */
  if (cols >= 64)
    for (int c = 32; c < 64; c++) x[(size_t)cols + c] = 0.0f; /* row 1, block 1 */
  for (size_t i = 0; i < n; i++) x[i] = cp_round_to(src, x[i]);
}

static int upload_src(cl_mem *m, const float *x, size_t n, clattn_dtype src) {
  if (src == CLATTN_F32) return (*m = make_buf(n * 4, x)) != NULL;
  uint16_t *h = malloc(n * 2);
  if (!h) return 0;
  for (size_t i = 0; i < n; i++) h[i] = src == CLATTN_F16 ? cp_f16_bits(x[i]) : cp_bf16_bits(x[i]);
  *m = make_buf(n * 2, h);
  free(h);
  return *m != NULL;
}

/* One append call for (src, kv, paged), checked byte for byte. */
static void append_case_with(clattn_dtype src, clattn_dtype kv, int paged, const int32_t *positions,
                             const int32_t *table) {
  char label[96];
  snprintf(label, sizeof label, "%s -> %s %s (positions %d, %d)", kv_name(src), kv_name(kv),
           paged ? "paged" : "contiguous", positions[0], positions[1]);
  const int slots = paged ? AP_PAGES : AP_B, rows = paged ? AP_PS : AP_CAP;
  hcache kc, vc;
  float *kn = malloc(sizeof(float) * AP_B * AP_H * AP_NEW * AP_DK),
        *vn = malloc(sizeof(float) * AP_B * AP_H * AP_NEW * AP_DV);
  cl_mem kn_buf = NULL, vn_buf = NULL, k_buf = NULL, v_buf = NULL, ks_buf = NULL, vs_buf = NULL, pos_buf = NULL,
         bt_buf = NULL;
  unsigned char *kdev = NULL, *vdev = NULL;
  float *ksdev = NULL, *vsdev = NULL;
  if (hc_make(&kc, kv, slots, AP_H, rows, AP_DK) || hc_make(&vc, kv, slots, AP_H, rows, AP_DV) || !kn || !vn) {
    CHECKF(0, "%s: host memory", label);
    goto done;
  }
  fill_new_rows(kn, (size_t)AP_B * AP_H * AP_NEW * AP_DK, AP_DK, src);
  fill_new_rows(vn, (size_t)AP_B * AP_H * AP_NEW * AP_DV, AP_DV, src);
  /* the cache before: a byte pattern (and scales) that the call must keep where it writes nothing */
  memset(kc.data, 0xa5, kc.units * kc.unit);
  memset(vc.data, 0x5a, vc.units * vc.unit);
  for (size_t i = 0; i < kc.scale_n; i++) kc.scale[i] = vc.scale[i] = -1.25f;
  for (int b = 0; b < AP_B; b++)
    for (int h = 0; h < AP_H; h++)
      for (int r = 0; r < AP_NEW; r++) {
        const long pos = (long)positions[b] + r;
        int s = b, row = (int)pos;
        if (pos < 0) continue; /* before the cache: skipped */
        if (paged) {
          const long e = pos / AP_PS;
          const int page = e < AP_BTS ? table[b * AP_BTS + e] : -1;
          if (page < 0 || page >= AP_PAGES) continue;
          s = page;
          row = (int)(pos % AP_PS);
        } else if (pos >= AP_CAP) {
          continue;
        }
        hc_write(&kc, s, h, row, kn + (((size_t)b * AP_H + h) * AP_NEW + r) * AP_DK);
        hc_write(&vc, s, h, row, vn + (((size_t)b * AP_H + h) * AP_NEW + r) * AP_DV);
      }
  /* the device's cache starts from the same pattern */
  unsigned char *k0 = malloc(kc.units * kc.unit), *v0 = malloc(vc.units * vc.unit);
  if (!k0 || !v0) {
    free(k0);
    free(v0);
    CHECKF(0, "%s: host memory", label);
    goto done;
  }
  memset(k0, 0xa5, kc.units * kc.unit);
  memset(v0, 0x5a, vc.units * vc.unit);
  k_buf = make_buf(kc.units * kc.unit, k0);
  v_buf = make_buf(vc.units * vc.unit, v0);
  free(k0);
  free(v0);
  if (kv == CLATTN_INT8) {
    float *s0 = malloc(kc.scale_n * sizeof(float));
    if (s0) {
      for (size_t i = 0; i < kc.scale_n; i++) s0[i] = -1.25f;
      ks_buf = make_buf(kc.scale_n * sizeof(float), s0);
      vs_buf = make_buf(kc.scale_n * sizeof(float), s0);
      free(s0);
    }
  }
  pos_buf = make_buf(sizeof(int32_t) * AP_B, positions);
  bt_buf = make_buf(sizeof(int32_t) * AP_B * AP_BTS, table);
  if (!upload_src(&kn_buf, kn, (size_t)AP_B * AP_H * AP_NEW * AP_DK, src) ||
      !upload_src(&vn_buf, vn, (size_t)AP_B * AP_H * AP_NEW * AP_DV, src) || !k_buf || !v_buf || !pos_buf || !bt_buf ||
      (kv == CLATTN_INT8 && (!ks_buf || !vs_buf))) {
    CHECKF(0, "%s: device buffers", label);
    goto done;
  }
  clattn_append_params ap = clattn_append_params_default();
  ap.batch = AP_B;
  ap.kv_heads = AP_H;
  ap.new_len = AP_NEW;
  ap.head_dim = AP_DK;
  ap.value_dim = AP_DV;
  ap.src_dtype = src;
  ap.kv_dtype = kv == src ? CLATTN_DTYPE_SAME : kv;
  ap.k_new = (clattn_tensor){kn_buf, 0, {(size_t)AP_H * AP_NEW * AP_DK, (size_t)AP_NEW * AP_DK, AP_DK, 1}};
  ap.v_new = (clattn_tensor){vn_buf, 0, {(size_t)AP_H * AP_NEW * AP_DV, (size_t)AP_NEW * AP_DV, AP_DV, 1}};
  ap.positions = pos_buf;
  ap.k = kc.view;
  ap.k.buf = k_buf;
  ap.v = vc.view;
  ap.v.buf = v_buf;
  if (kv == CLATTN_INT8) {
    ap.k_scale = kc.scale_view;
    ap.k_scale.buf = ks_buf;
    ap.v_scale = vc.scale_view;
    ap.v_scale.buf = vs_buf;
  }
  if (paged) {
    ap.block_table = bt_buf;
    ap.block_table_stride = AP_BTS;
    ap.page_size = AP_PS;
    ap.num_pages = AP_PAGES;
  } else {
    ap.capacity = AP_CAP;
  }
  cl_event done_ev = NULL;
  clattn_status st = clattn_kv_append(ct_context(), &ap, 0, NULL, &done_ev);
  CHECK_STATUS(st, CLATTN_OK);
  if (st != CLATTN_OK) goto done;
  CHECK(done_ev != NULL && clWaitForEvents(1, &done_ev) == CL_SUCCESS);
  if (done_ev) clReleaseEvent(done_ev);
  kdev = malloc(kc.units * kc.unit);
  vdev = malloc(vc.units * vc.unit);
  if (!kdev || !vdev || !read_buf(k_buf, kdev, kc.units * kc.unit) || !read_buf(v_buf, vdev, vc.units * vc.unit)) {
    CHECKF(0, "%s: read back", label);
    goto done;
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < kc.units * kc.unit; i++)
    if (kdev[i] != kc.data[i] && bad++ == 0) first = i;
  CHECKF(bad == 0,
         "%s: k cache: %zu bytes differ from ggml's rules / the untouched pattern (first at byte %zu: %u, want %u)",
         label, bad, first, kdev[first], kc.data[first]);
  bad = 0;
  for (size_t i = 0; i < vc.units * vc.unit; i++)
    if (vdev[i] != vc.data[i] && bad++ == 0) first = i;
  CHECKF(bad == 0, "%s: v cache: %zu bytes differ (first at byte %zu: %u, want %u)", label, bad, first, vdev[first],
         vc.data[first]);
  if (kv == CLATTN_INT8) {
    ksdev = malloc(kc.scale_n * sizeof(float));
    vsdev = malloc(kc.scale_n * sizeof(float));
    if (ksdev && vsdev && read_buf(ks_buf, ksdev, kc.scale_n * 4) && read_buf(vs_buf, vsdev, kc.scale_n * 4)) {
      CHECKF(memcmp(ksdev, kc.scale, kc.scale_n * 4) == 0, "%s: k_scale differs", label);
      CHECKF(memcmp(vsdev, vc.scale, vc.scale_n * 4) == 0, "%s: v_scale differs", label);
    } else {
      CHECKF(0, "%s: scales read back", label);
    }
  }
done:
  free(kn);
  free(vn);
  free(kdev);
  free(vdev);
  free(ksdev);
  free(vsdev);
  hc_free(&kc);
  hc_free(&vc);
  release(&kn_buf);
  release(&vn_buf);
  release(&k_buf);
  release(&v_buf);
  release(&ks_buf);
  release(&vs_buf);
  release(&pos_buf);
  release(&bt_buf);
}

/* contiguous: b1's rows 12, 13 are past the capacity. paged (pages of 7,
 * three entries a row): b0 positions 11.. -> entry 1 (page 1, rows 4-6),
 * then entry 2 = 99, outside the pool; b1 positions 18.. -> entry 2
 * (page 0, rows 4-6), then entry 3, past the table. */
static const int32_t ap_table[AP_B * AP_BTS] = {4, 1, 99, 2, -1, 0};

static void append_case(clattn_dtype src, clattn_dtype kv, int paged) {
  const int32_t positions[AP_B] = {paged ? 11 : 3, paged ? 18 : 9};
  append_case_with(src, kv, paged, positions, ap_table);
}

/* Hostile positions and tables: negative and near-INT32_MAX positions (no
 * overflow: only the rows that land inside are written), entries at the
 * int32 extremes. */
static void append_skips_hostile_positions_and_entries(void) {
  const int32_t positions[][AP_B] = {{-2, INT32_MAX - 1}, {INT32_MIN, 0}, {-7, 5}};
  const int32_t table[AP_B * AP_BTS] = {INT32_MIN, 3, INT32_MAX, 0, AP_PAGES, -1};
  for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
    append_case_with(CLATTN_F32, CLATTN_Q8_0, 0, positions[i], table);
    append_case_with(CLATTN_F32, CLATTN_INT8, 1, positions[i], table);
    append_case_with(CLATTN_F32, CLATTN_F16, 1, positions[i], table);
  }
}

static void append_matches_ggml_rules_for_every_cache_storage(void) {
  const clattn_dtype kvs[] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16, CLATTN_Q8_0, CLATTN_INT8};
  for (int paged = 0; paged < 2; paged++)
    for (size_t i = 0; i < 5; i++) append_case(CLATTN_F32, kvs[i], paged);
  /* 16-bit sources */
  append_case(CLATTN_F16, CLATTN_Q8_0, 1);
  append_case(CLATTN_BF16, CLATTN_INT8, 0);
  append_case(CLATTN_F16, CLATTN_F16, 1);
}

/* Rejections of append: nothing enqueued, the cache untouched. */
static void append_rejects_bad_input_and_touches_nothing(void) {
  const int cap = 8, H = 1, dk = 32, B = 1;
  const size_t cache_bytes = (size_t)B * H * cap * 34;
  unsigned char *pattern = malloc(cache_bytes), *back = malloc(cache_bytes);
  float src[4 * 32];
  for (int i = 0; i < 4 * 32; i++) src[i] = urand(1.0f);
  const int32_t pos = 0, table[2] = {0, 0};
  if (!pattern || !back) {
    free(pattern);
    free(back);
    CHECK(0);
    return;
  }
  memset(pattern, 0x77, cache_bytes);
  cl_mem k = make_buf(cache_bytes, pattern), v = make_buf(cache_bytes, pattern), s = make_buf(sizeof src, src),
         p = make_buf(sizeof pos, &pos), bt = make_buf(sizeof table, table);
  if (!k || !v || !s || !p || !bt) {
    CHECK(0);
    goto done;
  }
  clattn_append_params ok = clattn_append_params_default();
  ok.batch = B;
  ok.kv_heads = H;
  ok.new_len = 4;
  ok.head_dim = ok.value_dim = dk;
  ok.k_new = (clattn_tensor){s, 0, {128, 128, 32, 1}};
  ok.v_new = ok.k_new;
  ok.positions = p;
  ok.kv_dtype = CLATTN_Q8_0;
  ok.k = (clattn_tensor){k, 0, {(size_t)cap * 34, (size_t)cap * 34, 34, 34}};
  ok.v = ok.k;
  ok.v.buf = v;
  ok.capacity = cap;
  struct {
    const char *what;
    clattn_append_params ap;
    clattn_status want;
  } cases[24];
  int n = 0;
#define CASE(w, st, edit)                     \
  do {                                        \
    cases[n].what = (w);                      \
    cases[n].ap = ok;                         \
    cases[n].want = (st);                     \
    {                                         \
      clattn_append_params *a = &cases[n].ap; \
      edit;                                   \
    }                                         \
    n++;                                      \
  } while (0)
  CASE("new_len past capacity", CLATTN_ERR_INVALID_ARGUMENT, a->new_len = cap + 1);
  CASE("negative new_len", CLATTN_ERR_INVALID_ARGUMENT, a->new_len = -1);
  CASE("positions NULL", CLATTN_ERR_INVALID_ARGUMENT, a->positions = NULL);
  CASE("Q8_0 source", CLATTN_ERR_INVALID_ARGUMENT, a->src_dtype = CLATTN_Q8_0);
  CASE("Q8_0 head dim 48", CLATTN_ERR_INVALID_ARGUMENT, a->head_dim = 48);
  CASE("Q8_0 stride[3] 32", CLATTN_ERR_INVALID_ARGUMENT, a->k.stride[3] = 32);
  CASE("Q8_0 odd offset", CLATTN_ERR_INVALID_ARGUMENT, a->k.offset = 1);
  CASE("INT8 without scales", CLATTN_ERR_INVALID_ARGUMENT, a->kv_dtype = CLATTN_INT8);
  CASE("cache too small", CLATTN_ERR_BUFFER_TOO_SMALL, a->capacity = cap + 1);
  CASE("cache broadcast", CLATTN_ERR_INVALID_ARGUMENT, a->k.stride[2] = 0);
  CASE("capacity 0", CLATTN_ERR_INVALID_ARGUMENT, a->capacity = 0);
  CASE("paged: page_size 0", CLATTN_ERR_INVALID_ARGUMENT,
       (a->block_table = bt, a->block_table_stride = 2, a->num_pages = 1, a->page_size = 0));
  CASE("paged: new_len past the table", CLATTN_ERR_INVALID_ARGUMENT,
       (a->block_table = bt, a->block_table_stride = 1, a->num_pages = 1, a->page_size = 2));
  CASE("paged: table buffer too small", CLATTN_ERR_BUFFER_TOO_SMALL,
       (a->block_table = bt, a->block_table_stride = 3, a->num_pages = 1, a->page_size = 8));
  CASE("paged: pool larger than the views", CLATTN_ERR_BUFFER_TOO_SMALL,
       (a->block_table = bt, a->block_table_stride = 1, a->num_pages = 2, a->page_size = 8));
  CASE("kv_dtype out of range", CLATTN_ERR_INVALID_ARGUMENT, a->kv_dtype = (clattn_dtype)(CLATTN_IQ4_NL + 1));
  CASE("a Q4_0 cache (read, not written)", CLATTN_ERR_UNSUPPORTED, a->kv_dtype = CLATTN_Q4_0);
#undef CASE
  for (int i = 0; i < n; i++) {
    clattn_status st = clattn_kv_append(ct_context(), &cases[i].ap, 0, NULL, NULL);
    CHECKF(st == cases[i].want, "%s: %s, expected %s (%s)", cases[i].what, clattn_status_string(st),
           clattn_status_string(cases[i].want), clattn_last_error(ct_context()));
    /* rows past the table: the refusal names new_len and the rows the table holds */
    if (strstr(cases[i].what, "new_len past the table"))
      CHECKF(strstr(clattn_last_error(ct_context()), "new_len 4 exceeds the block table's capacity of 2 rows"), "%s",
             clattn_last_error(ct_context()));
  }
  CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
  CHECK(read_buf(k, back, cache_bytes) && memcmp(back, pattern, cache_bytes) == 0);
  CHECK(read_buf(v, back, cache_bytes) && memcmp(back, pattern, cache_bytes) == 0);
  /* new_len 0: a valid no-op (its event completes, nothing written) */
  clattn_append_params z = ok;
  z.new_len = 0;
  cl_event ev = NULL;
  CHECK_STATUS(clattn_kv_append(ct_context(), &z, 0, NULL, &ev), CLATTN_OK);
  CHECK(ev != NULL && clWaitForEvents(1, &ev) == CL_SUCCESS);
  if (ev) clReleaseEvent(ev);
  CHECK(read_buf(k, back, cache_bytes) && memcmp(back, pattern, cache_bytes) == 0);
  /* and the valid call works after the rejections */
  CHECK_STATUS(clattn_kv_append(ct_context(), &ok, 0, NULL, NULL), CLATTN_OK);
  CHECK(read_buf(k, back, cache_bytes) && memcmp(back, pattern, cache_bytes) != 0);
done:
  free(pattern);
  free(back);
  release(&k);
  release(&v);
  release(&s);
  release(&p);
  release(&bt);
}

/* An append refused because output a shares bytes with view b: the
 * message names both, and no buffer of bufs[0..n) changes. */
static void append_refused_sharing(const clattn_append_params *ap, const cl_mem *bufs, int n, const char *a,
                                   const char *b, const char *what) {
  unsigned char *before[8] = {NULL};
  size_t bytes[8] = {0};
  for (int i = 0; i < n; i++) before[i] = ct_mem_bytes(bufs[i], &bytes[i]);
  cl_event ev = NULL;
  const clattn_status st = clattn_kv_append(ct_context(), ap, 0, NULL, &ev);
  const char *msg = clattn_last_error(ct_context());
  CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT && !ev && strstr(msg, a) && strstr(msg, b) && strstr(msg, "share"),
         "%s: %s, expected invalid argument naming %s and %s (%s)", what, clattn_status_string(st), a, b, msg);
  if (ev) clReleaseEvent(ev);
  CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
  for (int i = 0; i < n; i++) {
    size_t m = 0;
    unsigned char *after = before[i] ? ct_mem_bytes(bufs[i], &m) : NULL;
    CHECKF(before[i] && after && m == bytes[i] && memcmp(before[i], after, m) == 0,
           "%s: a refused append changed a buffer", what);
    free(before[i]);
    free(after);
  }
}

/* clattn_kv_append writes k, v (and k_scale, v_scale): none may share a
 * byte with another, nor with k_new, v_new, positions or the block table.
 * The k and v caches on the same bytes, v over k's later rows, the new rows
 * inside the cache they go to, INT8 scales on each other or inside a cache,
 * positions and the block table read from a cache's bytes, a cache through
 * a sub-buffer of the other's buffer: each refused, nothing written. */
static void append_outputs_sharing_bytes_are_refused(void) {
  enum { CAP = 8, D = 32, NEW = 4 };
  float *init = malloc(2 * CAP * D * sizeof *init);
  if (!CHECK(init)) return;
  for (int i = 0; i < 2 * CAP * D; i++) init[i] = urand(1.0f);
  const int32_t pos = 2, table[2] = {0, 1};
  cl_mem k = make_buf(2 * CAP * D * sizeof(float), init), v = make_buf(2 * CAP * D * sizeof(float), init),
         kn = make_buf(NEW * D * sizeof(float), init), vn = make_buf(NEW * D * sizeof(float), init + NEW * D),
         p = make_buf(sizeof pos, &pos), bt = make_buf(sizeof table, table);
  free(init);
  if (!CHECK(k && v && kn && vn && p && bt)) goto done;
  const cl_mem bufs[] = {k, v, kn, vn, p, bt};
  const int n = sizeof bufs / sizeof bufs[0];
  clattn_append_params ok = clattn_append_params_default();
  ok.batch = ok.kv_heads = 1;
  ok.new_len = NEW;
  ok.head_dim = ok.value_dim = D;
  ok.k_new = (clattn_tensor){kn, 0, {NEW * D, NEW * D, D, 1}};
  ok.v_new = (clattn_tensor){vn, 0, {NEW * D, NEW * D, D, 1}};
  ok.positions = p;
  ok.k = (clattn_tensor){k, 0, {CAP * D, CAP * D, D, 1}};
  ok.v = (clattn_tensor){v, 0, {CAP * D, CAP * D, D, 1}};
  ok.capacity = CAP;
  clattn_append_params a = ok;
  a.v = a.k;
  append_refused_sharing(&a, bufs, n, "v", "k", "k and v caches on the same bytes");
  a = ok;
  a.v.buf = k, a.v.offset = 4 * D; /* from k's fifth row on */
  append_refused_sharing(&a, bufs, n, "v", "k", "v over k's rows 4..");
  a = ok;
  a.k_new.buf = k, a.k_new.offset = CAP * D - D; /* k's last row, and past it */
  append_refused_sharing(&a, bufs, n, "k", "k_new", "k_new from k's last row on");
  a = ok;
  a.v_new = a.v;
  append_refused_sharing(&a, bufs, n, "v", "v_new", "v_new on the v cache");
  a = ok;
  a.positions = v;
  append_refused_sharing(&a, bufs, n, "v", "positions", "positions read from the v cache");
  a = ok;
  a.block_table = k, a.block_table_stride = 2, a.page_size = 4, a.num_pages = 2;
  append_refused_sharing(&a, bufs, n, "k", "block_table", "block table read from the k cache");
  /* INT8: scales on each other, or inside a cache */
  a = ok;
  a.kv_dtype = CLATTN_INT8;
  a.k_scale = (clattn_tensor){k, CAP * D, {CAP, CAP, 1, 0}}; /* floats past k's int8 rows, in k's buffer */
  a.v_scale = a.k_scale;
  append_refused_sharing(&a, bufs, n, "v_scale", "k_scale", "INT8: v_scale on k_scale");
  a.v_scale = (clattn_tensor){v, 0, {CAP, CAP, 1, 0}}; /* v's first int8 rows */
  append_refused_sharing(&a, bufs, n, "v_scale", "v", "INT8: v_scale inside the v cache");
  /* the v cache through a sub-buffer of k's buffer */
  cl_buffer_region whole = {0, 2 * CAP * D * sizeof(float)};
  cl_int e;
  cl_mem sub = clCreateSubBuffer(k, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &whole, &e);
  if (CHECKF(e == CL_SUCCESS, "clCreateSubBuffer: %d", e)) {
    a = ok;
    a.v.buf = sub;
    append_refused_sharing(&a, bufs, n, "v", "k", "v cache through a sub-buffer of k's");
    clReleaseMemObject(sub);
  }
  CHECK_STATUS(clattn_kv_append(ct_context(), &ok, 0, NULL, NULL), CLATTN_OK);
done:
  release(&k), release(&v), release(&kn), release(&vn), release(&p), release(&bt);
}

/* A paged Q8_0 cache holding K and V in one buffer page by page, [page, 2,
 * head, row, block] as FlashInfer keeps it: k and v share no byte, so the
 * append is accepted, and it writes exactly what it writes into two
 * separate caches (checked against ggml's rules by the tests above). */
static void append_into_k_and_v_interleaved_by_page(void) {
  enum { PAGES = 3, PS = 4, H = 2, D = 64, RB = D / 32 * 34, NEW = 5, B = 2, BTS = 2 };
  const size_t half = (size_t)H * PS * RB, pool = PAGES * half;       /* one of k, v: bytes per page, per pool */
  const int32_t positions[B] = {2, 0}, table[B * BTS] = {2, 0, 1, 2}; /* b0: page 2 rows 2-3, page 0 rows 0-2 */
  float src[2][B * H * NEW * D];
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < sizeof src[t] / sizeof src[t][0]; i++) src[t][i] = urand(2.0f);
  unsigned char *pattern = malloc(2 * pool), *both = malloc(2 * pool), *sep[2] = {malloc(pool), malloc(pool)};
  cl_mem kn = make_buf(sizeof src[0], src[0]), vn = make_buf(sizeof src[1], src[1]),
         p = make_buf(sizeof positions, positions), bt = make_buf(sizeof table, table), one = NULL,
         two[2] = {NULL, NULL};
  if (!CHECK(pattern && both && sep[0] && sep[1] && kn && vn && p && bt)) goto done;
  memset(pattern, 0x5a, 2 * pool);
  one = make_buf(2 * pool, pattern), two[0] = make_buf(pool, pattern), two[1] = make_buf(pool, pattern);
  if (!CHECK(one && two[0] && two[1])) goto done;
  clattn_append_params ap = clattn_append_params_default();
  ap.batch = B, ap.kv_heads = H, ap.new_len = NEW, ap.head_dim = ap.value_dim = D;
  ap.kv_dtype = CLATTN_Q8_0;
  ap.k_new = (clattn_tensor){kn, 0, {(size_t)H * NEW * D, (size_t)NEW * D, D, 1}};
  ap.v_new = (clattn_tensor){vn, 0, {(size_t)H * NEW * D, (size_t)NEW * D, D, 1}};
  ap.positions = p;
  ap.block_table = bt, ap.block_table_stride = BTS, ap.page_size = PS, ap.num_pages = PAGES;
  clattn_append_params sp = ap;
  sp.k = (clattn_tensor){two[0], 0, {half, (size_t)PS * RB, RB, 34}};
  sp.v = (clattn_tensor){two[1], 0, {half, (size_t)PS * RB, RB, 34}};
  ap.k = (clattn_tensor){one, 0, {2 * half, (size_t)PS * RB, RB, 34}};
  ap.v = (clattn_tensor){one, half, {2 * half, (size_t)PS * RB, RB, 34}};
  CHECK_STATUS(clattn_kv_append(ct_context(), &sp, 0, NULL, NULL), CLATTN_OK);
  const clattn_status st = clattn_kv_append(ct_context(), &ap, 0, NULL, NULL);
  CHECKF(st == CLATTN_OK, "k and v interleaved by page: %s", clattn_last_error(ct_context()));
  if (!CHECK(read_buf(one, both, 2 * pool) && read_buf(two[0], sep[0], pool) && read_buf(two[1], sep[1], pool)))
    goto done;
  size_t differ = 0, written = 0;
  for (size_t page = 0; page < PAGES; page++)
    for (int t = 0; t < 2; t++)
      for (size_t x = 0; x < half; x++) {
        differ += both[(2 * page + t) * half + x] != sep[t][page * half + x];
        written += sep[t][page * half + x] != pattern[page * half + x];
      }
  CHECKF(differ == 0 && written > 0,
         "k and v interleaved by page: %zu bytes differ from two separate caches (%zu written)", differ, written);
done:
  free(pattern), free(both), free(sep[0]), free(sep[1]);
  release(&kn), release(&vn), release(&p), release(&bt), release(&one), release(&two[0]), release(&two[1]);
}

/* ---------- 3. forward over paged / quantised caches ---------- */

typedef struct {
  const char *label;
  int B, Hq, Hkv, M, N, dk, dv;
  clattn_dtype dtype, kv;
  int paged, page_size, spare_pages;
  int shared;      /* batch row 1's first page is batch row 0's (same keys) */
  int bad_entry;   /* batch row 0's second entry is outside the pool: its keys are disallowed */
  const int *lens; /* kv_lens [B] */
  int causal, window_left, window_right;
  int mask, bias, alibi, softcap, sinks, lse, diag, additive;
  int expect_split;    /* peak scratch shows split-KV partial states */
  int hostile;         /* every cache row finite, then block-table entries random (many outside the pool) */
  const int *dev_lens; /* kv_lens as given to the device (NULL: lens); lens is what it clamps them to */
  const int *q_lens;   /* packed queries (cu_seqlens_q): sequence b has q_lens[b] <= M rows, its last
                          positions; NULL: a padded batch of M rows each */
  int v_apart;         /* values stored as v_kv (v_dtype), keys as kv */
  clattn_dtype v_kv;
  /* an engine's mask as the bias (llama.cpp's FLASH_ATTN_EXT): f16 entries,
   * -inf for keys not allowed (each batch row's every third key, for every
   * query, its K/V rows poisoned, and 1 in 8 entries elsewhere), times a
   * per-head bias_scale */
  int engine_bias;
  int v_in_k; /* DeepSeek's MLA as llama.cpp keeps it: the values are the first dv columns of the
                 keys' rows, V a view of K's bytes */
  const int *leftpad; /* cache_leftpad: batch row b's lens[b] keys start at cache position leftpad[b]
                         (kv_lens leftpad[b] + lens[b]; contiguous: within N), the rows before poisoned */
} kvcase;

/* The storage of the values. */
static clattn_dtype kv_v(const kvcase *c) { return c->v_apart ? c->v_kv : c->kv; }
/* The cache position of batch row b's key j. */
static int kv_pos(const kvcase *c, int b, int j) { return (c->leftpad ? c->leftpad[b] : 0) + j; }
/* Whether engine_bias disallows key j of batch row b for every query. */
static int engine_key_off(int j) { return j % 3 == 2; }

typedef struct {
  kvcase c;
  float *q, *kl, *vl; /* q [B,Hq,M,dk] (rounded to dtype); logical keys/values [B,Hkv,N,d] */
  hcache kc, vc;
  int32_t *table, bt_stride, num_pages;
  unsigned char *mask, *ref_mask;
  float *bias, *alibi, *sinks, *addw;
  float *bias_scale;      /* engine_bias: [Hq] */
  float *ref_bias;        /* what the reference adds: bias times its head's scale (finite entries) */
  int alibi_stride;       /* c.alibi 2: slopes per (batch, head), Hq + 1 apart; else 0 */
  int32_t *cu_q, total_q; /* c.q_lens: the packed rows' offsets [B + 1] */
} kvprob;

static void kvprob_free(kvprob *p) {
  free(p->q);
  free(p->kl);
  free(p->vl);
  hc_free(&p->kc);
  hc_free(&p->vc);
  free(p->table);
  free(p->mask);
  free(p->ref_mask);
  free(p->bias);
  free(p->bias_scale);
  free(p->ref_bias);
  free(p->alibi);
  free(p->sinks);
  free(p->addw);
  free(p->cu_q);
}

/* Query rows of batch row b: its packed sequence's, or M. */
static int kv_rows(const kvcase *c, int b) { return c->q_lens ? c->q_lens[b] : c->M; }

/* Where query row i of (b, h) lies in the device's q and out, in rows:
 * packed [1, Hq, total_q], or [B, Hq, M]. */
static size_t kv_qrow(const kvprob *p, int b, int h, int i) {
  const kvcase *c = &p->c;
  return c->q_lens ? (size_t)h * p->total_q + p->cu_q[b] + i : ((size_t)b * c->Hq + h) * c->M + i;
}

/* Builds the host problem: logical keys, the cache (pages shuffled, shared,
 * unused rows and pages poisoned), the reference's mask (user mask and page
 * validity). */
static int kvprob_build(kvprob *p, const kvcase *c) {
  memset(p, 0, sizeof *p);
  p->c = *c;
  const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, M = c->M, N = c->N, ps = c->paged ? c->page_size : N;
  const size_t nq = (size_t)B * Hq * M * c->dk, nk = (size_t)B * Hkv * N * c->dk, nv = (size_t)B * Hkv * N * c->dv;
  const size_t ns = (size_t)B * Hq * M * N;
  p->q = malloc(nq * 4);
  p->kl = calloc(nk, 4);
  p->vl = calloc(nv, 4);
  p->ref_mask = malloc(ns);
  if (!p->q || !p->kl || !p->vl || !p->ref_mask) return -1;
  for (size_t i = 0; i < nq; i++) p->q[i] = cp_round_to(c->dtype, urand(1.5f));
  for (size_t i = 0; i < nk; i++) p->kl[i] = urand(1.5f);
  for (size_t i = 0; i < nv; i++) p->vl[i] = urand(1.0f);
  if (c->shared) /* row 1's first page holds row 0's first keys */
    for (int h = 0; h < Hkv; h++)
      for (int j = 0; j < ps; j++) {
        memcpy(p->kl + (((size_t)1 * Hkv + h) * N + j) * c->dk, p->kl + ((size_t)h * N + j) * c->dk, (size_t)c->dk * 4);
        memcpy(p->vl + (((size_t)1 * Hkv + h) * N + j) * c->dv, p->vl + ((size_t)h * N + j) * c->dv, (size_t)c->dv * 4);
      }
  /* pages: each row's own, the shared one once, spares; ids shuffled */
  p->bt_stride = (N + ps - 1) / ps + 1;
  int used = 0;
  for (int b = 0; b < B; b++) used += (kv_pos(c, b, c->lens[b]) + ps - 1) / ps;
  if (c->shared) used--;
  p->num_pages = c->paged ? used + c->spare_pages : B;
  if (p->num_pages < 1) p->num_pages = 1; /* a pool has a page, even when no sequence has a key */
  int *perm = malloc(sizeof(int) * (size_t)(p->num_pages > 0 ? p->num_pages : 1));
  p->table = malloc(sizeof(int32_t) * (size_t)B * p->bt_stride);
  if (!perm || !p->table) {
    free(perm);
    return -1;
  }
  for (int i = 0; i < p->num_pages; i++) perm[i] = i;
  for (int i = p->num_pages - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint32_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  int next = 0;
  const int32_t outside[] = {-1, 0, 1 << 30, INT32_MIN};
  for (int b = 0; b < B; b++)
    for (int e = 0; e < p->bt_stride; e++) {
      int32_t *t = &p->table[(size_t)b * p->bt_stride + e];
      if (e < (kv_pos(c, b, c->lens[b]) + ps - 1) / ps)
        *t = (c->shared && b == 1 && e == 0) ? p->table[0] : perm[next++];
      else
        *t = outside[(b + e) % 4] == 0 ? p->num_pages : outside[(b + e) % 4]; /* never followed */
    }
  free(perm);
  if (c->paged && c->bad_entry) p->table[1] = -3;
  /* the cache: every row poisoned, then the valid keys written */
  const int slots = c->paged ? p->num_pages : B, rows = c->paged ? ps : N;
  if (hc_make(&p->kc, c->kv, slots, Hkv, rows, c->dk) || hc_make(&p->vc, kv_v(c), slots, Hkv, rows, c->dv)) return -1;
  for (int s = 0; s < slots; s++)
    for (int h = 0; h < Hkv; h++)
      for (int r = 0; r < rows; r++) {
        hc_poison(&p->kc, s, h, r, (s + r) % 2);
        hc_poison(&p->vc, s, h, r, (s + r + 1) % 2);
      }
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hkv; h++)
      for (int j = 0; j < c->lens[b]; j++) {
        int s = b, r = kv_pos(c, b, j);
        if (c->paged) {
          s = p->table[(size_t)b * p->bt_stride + r / ps];
          r %= ps;
          if (s < 0 || s >= p->num_pages) continue;
        }
        if (c->engine_bias && engine_key_off(j) && !c->shared) continue; /* never read: stays poisoned */
        hc_write(&p->kc, s, h, r, p->kl + (((size_t)b * Hkv + h) * N + j) * c->dk);
        hc_write(&p->vc, s, h, r, p->vl + (((size_t)b * Hkv + h) * N + j) * c->dv);
      }
  if (c->v_in_k) { /* V: K's rows, read to dv columns */
    hc_free(&p->vc);
    if (hc_make(&p->vc, c->kv, slots, Hkv, rows, c->dk)) return -1;
    memcpy(p->vc.data, p->kc.data, p->kc.units * p->kc.unit);
  }
  if (c->hostile) { /* any page may now be reached: all finite, entries anywhere */
    float *row = malloc(sizeof(float) * (size_t)(c->dk > c->dv ? c->dk : c->dv));
    if (!row) return -1;
    for (int s = 0; s < slots; s++)
      for (int h = 0; h < Hkv; h++)
        for (int r = 0; r < rows; r++) {
          for (int d = 0; d < c->dk; d++) row[d] = urand(1.5f);
          hc_write(&p->kc, s, h, r, row);
          for (int d = 0; d < c->dv; d++) row[d] = urand(1.0f);
          hc_write(&p->vc, s, h, r, row);
        }
    free(row);
    const int32_t extremes[] = {INT32_MIN, INT32_MAX, -1, p->num_pages};
    for (size_t i = 0; i < (size_t)B * p->bt_stride; i++)
      p->table[i] = rnd() % 3 == 0 ? extremes[rnd() % 4] : (int32_t)(rnd() % (uint32_t)(p->num_pages + 3)) - 1;
  }
  if (c->mask) {
    p->mask = malloc(ns);
    if (!p->mask) return -1;
    for (size_t i = 0; i < ns; i++) p->mask[i] = rnd() % 5 != 0;
  }
  for (int b = 0; b < B; b++)
    for (size_t r = 0; r < (size_t)Hq * M; r++)
      for (int j = 0; j < N; j++) {
        const size_t at = ((size_t)b * Hq * M + r) * N + j;
        int ok = p->mask ? p->mask[at] : 1;
        /* a left-padded row's last keys lie past the table: beyond its length, never read */
        const int e = kv_pos(c, b, j) / ps;
        if (c->paged && e < p->bt_stride) {
          const int32_t page = p->table[(size_t)b * p->bt_stride + e];
          ok = ok && page >= 0 && page < p->num_pages;
        }
        p->ref_mask[at] = (unsigned char)ok;
      }
  if (c->bias) {
    p->bias = malloc(ns * 4);
    p->ref_bias = malloc(ns * 4);
    p->bias_scale = malloc(sizeof(float) * Hq);
    if (!p->bias || !p->ref_bias || !p->bias_scale) return -1;
    for (size_t i = 0; i < ns; i++) p->bias[i] = urand(1.0f);
    for (int h = 0; h < Hq; h++) p->bias_scale[h] = c->engine_bias ? 0.25f + 0.5f * (float)h : 1.0f;
    for (size_t i = 0; i < ns && c->engine_bias; i++) {
      const int j = (int)(i % N);
      if (engine_key_off(j) || rnd() % 8 == 0) p->bias[i] = -INFINITY;
      p->bias[i] = cp_round_to(CLATTN_F16, p->bias[i]); /* stored as f16 */
    }
    for (size_t i = 0; i < ns; i++) {
      const int h = (int)(i / ((size_t)M * N) % Hq);
      const int off = p->bias[i] == -INFINITY; /* disallowed, as a zero mask entry */
      p->ref_bias[i] = off ? 0.0f : p->bias[i] * p->bias_scale[h];
      if (off) p->ref_mask[i] = 0;
    }
  }
  p->alibi_stride = c->alibi == 2 ? Hq + 1 : 0;
  p->alibi = malloc(sizeof(float) * (size_t)B * (Hq + 1));
  p->sinks = malloc(sizeof(float) * Hq);
  p->addw = malloc(sizeof(float) * c->dk);
  p->cu_q = calloc((size_t)B + 1, sizeof(int32_t));
  if (!p->alibi || !p->sinks || !p->addw || !p->cu_q) return -1;
  for (int b = 0; b < B; b++) /* per (batch, head): each batch row's own, NaN in the slot between */
    for (int h = 0; h <= Hq; h++)
      p->alibi[(size_t)b * (Hq + 1) + h] = h == Hq ? NAN : powf(2.0f, -8.0f * (h + 1) / Hq) * (b + 2) / 2.0f;
  if (!p->alibi_stride)
    for (int h = 0; h < Hq; h++) p->alibi[h] = powf(2.0f, -8.0f * (h + 1) / Hq);
  for (int h = 0; h < Hq; h++) p->sinks[h] = urand(2.0f) + 1.0f;
  for (int b = 0; b < B; b++) p->cu_q[b + 1] = p->cu_q[b] + kv_rows(c, b);
  p->total_q = p->cu_q[B];
  for (int d = 0; d < c->dk; d++) p->addw[d] = urand(1.0f);
  return 0;
}

/* The values a row that does not exist (past a packed sequence's rows) gets
 * in the dense arrays, on both sides of the comparison. */
static void kv_absent_row(size_t row, int dv, double *out, double *lse, double *ent, double *mw, int32_t *am) {
  for (int d = 0; d < dv; d++) out[row * dv + d] = 0.0;
  lse[row] = ent[row] = mw[row] = 0.0;
  am[row] = -1;
}

/* The fp64 reference over the dequantised cache, dense outputs. A paged row
 * is its own sequence of kv_lens[b] keys (aligned on it), with q_lens[b]
 * queries when packed (its last positions): one reference call per batch
 * row, into the first rows of each head. */
static int kvprob_reference(const kvprob *p, double *out, double *lse, double *ent, double *mw, int32_t *am) {
  const kvcase *c = &p->c;
  const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, M = c->M, N = c->N, ps = c->paged ? c->page_size : N;
  float *kd = calloc((size_t)Hkv * N * c->dk, 4), *vd = calloc((size_t)Hkv * N * c->dv, 4);
  const size_t hm = (size_t)Hq * M; /* one batch row's dense rows */
  double *o1 = malloc(hm * c->dv * 8), *l1 = malloc(hm * 8), *e1 = malloc(hm * 8), *w1 = malloc(hm * 8);
  int32_t *a1 = malloc(hm * 4);
  int rc = 0;
  if (!kd || !vd || !o1 || !l1 || !e1 || !w1 || !a1) rc = -1;
  for (size_t r = 0; r < (size_t)B * hm; r++) kv_absent_row(r, c->dv, out, lse, ent, mw, am);
  for (int b = 0; b < B && rc == 0; b++) {
    /* a paged or left-padded row: its own keys, aligned on their count */
    const int n = c->paged || c->leftpad ? c->lens[b] : N;
    for (int h = 0; h < Hkv; h++)
      for (int j = 0; j < n; j++) {
        int s = b, r = kv_pos(c, b, j), ok = j < c->lens[b];
        if (c->paged) {
          s = p->table[(size_t)b * p->bt_stride + r / ps];
          r %= ps;
          ok = ok && s >= 0 && s < p->num_pages;
        }
        for (int d = 0; d < c->dk; d++) kd[((size_t)h * N + j) * c->dk + d] = ok ? hc_read(&p->kc, s, h, r, d) : 0.0f;
        for (int d = 0; d < c->dv; d++) vd[((size_t)h * N + j) * c->dv + d] = ok ? hc_read(&p->vc, s, h, r, d) : 0.0f;
      }
    const size_t rows = (size_t)Hq * M, o0 = (size_t)b * rows;
    const int m = kv_rows(c, b);
    if (m == 0) continue;
    if (n == 0) { /* no keys: an empty row everywhere */
      for (size_t i = 0; i < rows; i++) {
        if ((int)(i % M) >= m) continue;
        for (int d = 0; d < c->dv; d++) out[(o0 + i) * c->dv + d] = 0.0;
        lse[o0 + i] = c->sinks ? p->sinks[i / M] : -INFINITY;
        ent[o0 + i] = mw[o0 + i] = 0.0;
        am[o0 + i] = -1;
      }
      continue;
    }
    clattn_params rp = clattn_params_default();
    rp.batch = 1;
    rp.q_heads = Hq;
    rp.kv_heads = Hkv;
    rp.q_len = m;
    rp.kv_len = n;
    rp.head_dim = c->dk;
    rp.value_dim = c->dv;
    rp.causal = c->causal;
    rp.window_left = c->window_left;
    rp.window_right = c->window_right;
    rp.q = (clattn_tensor){NULL, o0 * c->dk, {rows * c->dk, (size_t)M * c->dk, (size_t)c->dk, 1}};
    rp.k = (clattn_tensor){NULL, 0, {(size_t)Hkv * N * c->dk, (size_t)N * c->dk, (size_t)c->dk, 1}};
    rp.v = (clattn_tensor){NULL, 0, {(size_t)Hkv * N * c->dv, (size_t)N * c->dv, (size_t)c->dv, 1}};
    /* the mask (the user's and page validity) is always given to the reference */
    rp.mask = (clattn_tensor){DUMMY_MEM, o0 * N, {rows * N, (size_t)M * N, (size_t)N, 1}};
    if (c->bias) rp.bias = rp.mask;
    rp.softcap = c->softcap ? 5.0f : 0.0f;
    if (c->alibi) rp.alibi_slopes = DUMMY_MEM;
    if (c->sinks) rp.sinks = DUMMY_MEM;
    if (c->additive) {
      rp.score = CLATTN_SCORE_ADDITIVE;
      rp.additive_w = DUMMY_MEM;
    }
    int32_t len = c->lens[b];
    if (!c->paged && !c->leftpad) rp.kv_lens = DUMMY_MEM;
    ref_inputs in = {0};
    in.q = p->q;
    in.k = kd;
    in.v = vd;
    in.mask = p->ref_mask;
    in.bias = p->ref_bias;
    in.kv_lens = &len;
    in.alibi_slopes = c->alibi ? p->alibi + (size_t)b * p->alibi_stride : NULL; /* batch row b's */
    in.sinks = c->sinks ? p->sinks : NULL;
    in.additive_w = c->additive ? p->addw : NULL;
    ref_outputs o = {0};
    o.out = o1;
    o.lse = l1;
    o.entropy = e1;
    o.max_weight = w1;
    o.argmax = a1;
    if (ref_forward(&rp, &in, &o) != 0) rc = -1;
    for (int h = 0; h < Hq; h++) /* [Hq, m] rows into the first m of each head's M */
      for (int i = 0; i < m; i++) {
        const size_t from = (size_t)h * m + i, to = o0 + (size_t)h * M + i;
        memcpy(out + to * c->dv, o1 + from * c->dv, (size_t)c->dv * 8);
        lse[to] = l1[from];
        ent[to] = e1[from];
        mw[to] = w1[from];
        am[to] = a1[from];
      }
  }
  free(kd);
  free(vd);
  free(o1);
  free(l1);
  free(e1);
  free(w1);
  free(a1);
  return rc;
}

static double rel_err(const float *x, const double *ref, size_t n, long *nan_or_class) {
  double num = 0, den = 0;
  long bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(x[i]) || isnan(ref[i]) || isinf(x[i]) != isinf(ref[i])) {
      bad += !(isnan(x[i]) && isnan(ref[i]));
      continue;
    }
    if (isinf(ref[i])) {
      bad += x[i] != ref[i];
      continue;
    }
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  *nan_or_class = bad;
  return sqrt(num) / fmax(sqrt(den), 1e-30);
}

/* Runs one case through clattn_forward (algo) and compares with the reference. */
static void kv_forward_case_on(const kvcase *case_in, clattn_algo algo) {
  char label[160];
  snprintf(label, sizeof label, "%s [%s]", case_in->label, clattn_algo_name(algo));
  kvcase labelled = *case_in;
  labelled.label = label;
  const kvcase *c = &labelled;
  kvprob p;
  cl_mem q_buf = NULL, k_buf = NULL, v_buf = NULL, ks_buf = NULL, vs_buf = NULL, bt_buf = NULL, lens_buf = NULL;
  cl_mem out_buf = NULL, lse_buf = NULL, ent_buf = NULL, mw_buf = NULL, am_buf = NULL, mask_buf = NULL, bias_buf = NULL,
         alibi_buf = NULL, sinks_buf = NULL, w_buf = NULL, cu_buf = NULL, bscale_buf = NULL, pad_buf = NULL;
  const int B = c->B, Hq = c->Hq, M = c->M;
  const size_t rows = (size_t)B * Hq * M, no = rows * c->dv, elem = c->dtype == CLATTN_F32 ? 4 : 2;
  double *ro = malloc(no * 8), *rl = malloc(rows * 8), *re = malloc(rows * 8), *rm = malloc(rows * 8);
  int32_t *ra = malloc(rows * 4), *am = malloc(rows * 4);
  float *out = malloc(no * 4), *lse = malloc(rows * 4), *ent = malloc(rows * 4), *mw = malloc(rows * 4);
  void *raw = malloc(no * 4);
  if (kvprob_build(&p, c) || !ro || !rl || !re || !rm || !ra || !am || !out || !lse || !ent || !mw || !raw) {
    CHECKF(0, "%s: host setup", c->label);
    goto done;
  }
  /* device buffers: q's existing rows where the device reads them, NaN past them */
  {
    const size_t nq = rows * c->dk;
    float *qd = malloc(nq * 4);
    uint16_t *h = malloc(nq * 2);
    if (qd && h) {
      for (size_t i = 0; i < nq; i++) qd[i] = NAN;
      for (int b = 0; b < B; b++)
        for (int hh = 0; hh < Hq; hh++)
          for (int i = 0; i < kv_rows(c, b); i++)
            memcpy(qd + kv_qrow(&p, b, hh, i) * c->dk, p.q + (((size_t)b * Hq + hh) * M + i) * c->dk,
                   (size_t)c->dk * 4);
      for (size_t i = 0; i < nq; i++) h[i] = c->dtype == CLATTN_F16 ? cp_f16_bits(qd[i]) : cp_bf16_bits(qd[i]);
      q_buf = c->dtype == CLATTN_F32 ? make_buf(nq * 4, qd) : make_buf(nq * 2, h);
    }
    free(qd);
    free(h);
  }
  k_buf = make_buf(p.kc.units * p.kc.unit, p.kc.data);
  v_buf = c->v_in_k ? NULL : make_buf(p.vc.units * p.vc.unit, p.vc.data);
  if (c->kv == CLATTN_INT8) ks_buf = make_buf(p.kc.scale_n * 4, p.kc.scale);
  if (kv_v(c) == CLATTN_INT8) vs_buf = make_buf(p.vc.scale_n * 4, p.vc.scale);
  bt_buf = make_buf(sizeof(int32_t) * (size_t)B * p.bt_stride, p.table);
  if (c->leftpad) { /* each row's keys end at leftpad[b] + lens[b] */
    int32_t ends[16];
    for (int b = 0; b < B && b < 16; b++) ends[b] = kv_pos(c, b, c->lens[b]);
    lens_buf = make_buf(sizeof(int32_t) * (size_t)B, ends);
    pad_buf = make_buf(sizeof(int32_t) * (size_t)B, c->leftpad);
  } else
    lens_buf = make_buf(sizeof(int32_t) * (size_t)B, c->dev_lens ? c->dev_lens : c->lens);
  {
    unsigned char *nanfill = malloc(no * elem > rows * 4 ? no * elem : rows * 4);
    if (nanfill) {
      memset(nanfill, 0xff, no * elem > rows * 4 ? no * elem : rows * 4); /* NaN in every storage */
      out_buf = make_buf(no * elem, nanfill);
      lse_buf = make_buf(rows * 4, nanfill);
      ent_buf = make_buf(rows * 4, nanfill);
      mw_buf = make_buf(rows * 4, nanfill);
      am_buf = make_buf(rows * 4, nanfill);
      free(nanfill);
    }
  }
  if (c->mask) mask_buf = make_buf((size_t)B * Hq * M * c->N, p.mask);
  if (c->bias && c->engine_bias) {
    const size_t ns = (size_t)B * Hq * M * c->N;
    uint16_t *h = malloc(ns * 2);
    for (size_t i = 0; h && i < ns; i++) h[i] = cp_f16_bits(p.bias[i]);
    if (h) bias_buf = make_buf(ns * 2, h);
    free(h);
    bscale_buf = make_buf(sizeof(float) * Hq, p.bias_scale);
  } else if (c->bias) {
    bias_buf = make_buf((size_t)B * Hq * M * c->N * 4, p.bias);
  }
  alibi_buf = make_buf(sizeof(float) * (size_t)B * (Hq + 1), p.alibi);
  cu_buf = make_buf(sizeof(int32_t) * ((size_t)B + 1), p.cu_q);
  /* engine_bias: the sinks inside a larger buffer (sinks_offset), NaN before them */
  const size_t sinks_at = c->engine_bias ? 5 : 0;
  {
    float *s = malloc(sizeof(float) * (sinks_at + Hq));
    for (size_t i = 0; s && i < sinks_at + Hq; i++) s[i] = i < sinks_at ? NAN : p.sinks[i - sinks_at];
    if (s) sinks_buf = make_buf(sizeof(float) * (sinks_at + Hq), s);
    free(s);
  }
  w_buf = make_buf(sizeof(float) * c->dk, p.addw);
  if (!q_buf || !k_buf || (!v_buf && !c->v_in_k) || !bt_buf || !lens_buf || !out_buf || !lse_buf || !ent_buf || !mw_buf || !am_buf ||
      !cu_buf || (c->kv == CLATTN_INT8 && !ks_buf) || (kv_v(c) == CLATTN_INT8 && !vs_buf) || (c->mask && !mask_buf) ||
      (c->bias && !bias_buf) || (c->engine_bias && !bscale_buf) || !alibi_buf || !sinks_buf || !w_buf ||
      (c->leftpad && (!pad_buf || B > 16))) {
    CHECKF(0, "%s: device buffers", c->label);
    goto done;
  }
  clattn_params fp = clattn_params_default();
  fp.batch = B;
  fp.q_heads = Hq;
  fp.kv_heads = c->Hkv;
  fp.q_len = M;
  fp.kv_len = c->N;
  fp.head_dim = c->dk;
  fp.value_dim = c->dv;
  fp.dtype = c->dtype;
  fp.kv_dtype = c->kv == c->dtype ? CLATTN_DTYPE_SAME : c->kv; /* SAME: stored like q */
  if (c->v_apart) fp.v_dtype = c->v_kv;
  /* packed queries: one batch of total_q rows per head */
  const size_t q_rows = c->q_lens ? (size_t)p.total_q : (size_t)M, q_b = c->q_lens ? 0 : (size_t)Hq * q_rows;
  fp.q = (clattn_tensor){q_buf, 0, {q_b * c->dk, q_rows * c->dk, (size_t)c->dk, 1}};
  if (c->q_lens) {
    fp.cu_seqlens_q = cu_buf;
    fp.total_q = p.total_q;
  }
  fp.k = p.kc.view;
  fp.k.buf = k_buf;
  fp.v = p.vc.view;
  fp.v.buf = c->v_in_k ? k_buf : v_buf;
  if (c->kv == CLATTN_INT8) {
    fp.k_scale = p.kc.scale_view;
    fp.k_scale.buf = ks_buf;
  }
  if (kv_v(c) == CLATTN_INT8) {
    fp.v_scale = p.vc.scale_view;
    fp.v_scale.buf = vs_buf;
  }
  if (c->paged) {
    fp.block_table = bt_buf;
    fp.block_table_stride = p.bt_stride;
    fp.page_size = c->page_size;
    fp.num_pages = p.num_pages;
  }
  fp.kv_lens = lens_buf;
  fp.cache_leftpad = pad_buf;
  fp.out = (clattn_tensor){out_buf, 0, {q_b * c->dv, q_rows * c->dv, (size_t)c->dv, 1}};
  const clattn_tensor row_view = {NULL, 0, {(size_t)Hq * M, (size_t)M, 1, 0}};
  if (c->lse) {
    fp.lse = row_view;
    fp.lse.buf = lse_buf;
  }
  if (c->diag) {
    fp.entropy = fp.max_weight = fp.argmax = row_view;
    fp.entropy.buf = ent_buf;
    fp.max_weight.buf = mw_buf;
    fp.argmax.buf = am_buf;
  }
  fp.causal = c->causal;
  fp.window_left = c->window_left;
  fp.window_right = c->window_right;
  const clattn_tensor s_view = {NULL, 0, {(size_t)Hq * M * c->N, (size_t)M * c->N, (size_t)c->N, 1}};
  if (c->mask) {
    fp.mask = s_view;
    fp.mask.buf = mask_buf;
  }
  if (c->bias) {
    fp.bias = s_view;
    fp.bias.buf = bias_buf;
  }
  if (c->engine_bias) {
    fp.bias_dtype = CLATTN_F16;
    fp.bias_scale = bscale_buf;
  }
  fp.softcap = c->softcap ? 5.0f : 0.0f;
  if (c->alibi) fp.alibi_slopes = alibi_buf;
  fp.alibi_batch_stride = p.alibi_stride;
  if (c->sinks) {
    fp.sinks = sinks_buf;
    fp.sinks_offset = sinks_at;
  }
  if (c->additive) {
    fp.score = CLATTN_SCORE_ADDITIVE;
    fp.additive_w = w_buf;
  }
  fp.algo = algo;
  clattn_peak_scratch_bytes(ct_context(), 1);
  clattn_status st = clattn_forward(ct_context(), &fp, 0, NULL, NULL);
  CHECKF(st == CLATTN_OK, "%s: clattn_forward: %s (%s)", c->label, clattn_status_string(st),
         clattn_last_error(ct_context()));
  if (st != CLATTN_OK) goto done;
  const size_t peak = clattn_peak_scratch_bytes(ct_context(), 1);
  if (!read_buf(out_buf, raw, no * elem) || !read_buf(lse_buf, lse, rows * 4) || !read_buf(ent_buf, ent, rows * 4) ||
      !read_buf(mw_buf, mw, rows * 4) || !read_buf(am_buf, am, rows * 4)) {
    CHECKF(0, "%s: read back", c->label);
    goto done;
  }
  for (size_t r = 0; r < rows; r++) { /* dense logical rows, the absent ones as the reference has them */
    const int b = (int)(r / ((size_t)Hq * M)), h = (int)(r / M % Hq), i = (int)(r % M);
    const size_t at = kv_qrow(&p, b, h, i) * c->dv;
    for (int d = 0; d < c->dv && i < kv_rows(c, b); d++)
      out[r * c->dv + d] = c->dtype == CLATTN_F32   ? ((float *)raw)[at + d]
                           : c->dtype == CLATTN_F16 ? cp_f16_value(((uint16_t *)raw)[at + d])
                                                    : cp_bf16_value(((uint16_t *)raw)[at + d]);
    if (i >= kv_rows(c, b)) {
      for (int d = 0; d < c->dv; d++) out[r * c->dv + d] = 0.0f;
      lse[r] = ent[r] = mw[r] = 0.0f;
      am[r] = -1;
    }
  }
  if (kvprob_reference(&p, ro, rl, re, rm, ra)) {
    CHECKF(0, "%s: reference failed", c->label);
    goto done;
  }
  const double tol = c->dtype == CLATTN_F32 ? 2e-5 : c->dtype == CLATTN_F16 ? 2e-3 : 1e-2;
  long bad = 0;
  long nan_out = 0;
  for (size_t i = 0; i < no; i++) nan_out += isnan(out[i]) != 0;
  const double e_out = rel_err(out, ro, no, &bad);
  CHECKF(nan_out == 0, "%s: %ld NaN in out", c->label, nan_out);
  CHECKF(e_out <= tol && bad == 0, "%s: out rel err %.3g (tol %.1g), %ld class mismatches", c->label, e_out, tol, bad);
  if (c->lse) {
    long lb = 0;
    double worst = 0;
    for (size_t i = 0; i < rows; i++) {
      if (isinf(rl[i]) || isinf(lse[i]) || isnan(lse[i])) {
        lb += !(lse[i] == rl[i]);
        continue;
      }
      worst = fmax(worst, fabs(lse[i] - rl[i]));
    }
    CHECKF(lb == 0 && worst <= 1e-4, "%s: lse: %ld class mismatches, max abs err %.3g", c->label, lb, worst);
  }
  if (c->diag) {
    long eb = 0, mb = 0, ab = 0;
    const double ee = rel_err(ent, re, rows, &eb), me = rel_err(mw, rm, rows, &mb);
    for (size_t i = 0; i < rows; i++) ab += am[i] != ra[i] && ra[i] != REF_ARGMAX_UNSPECIFIED;
    CHECKF(ee <= 1e-4 && me <= 1e-4 && eb == 0 && mb == 0 && ab == 0,
           "%s: diagnostics: entropy err %.3g, max_weight err %.3g, %ld/%ld class mismatches, %ld argmax differ",
           c->label, ee, me, eb, mb, ab);
  }
  if (c->expect_split && algo == CLATTN_ALGO_FUSED)
    CHECKF(peak >= 2 * rows * ((size_t)c->dv + 1) * sizeof(float),
           "%s: peak scratch %zu bytes shows no split-KV partial states", c->label, peak);
done:
  kvprob_free(&p);
  free(ro);
  free(rl);
  free(re);
  free(rm);
  free(ra);
  free(am);
  free(out);
  free(lse);
  free(ent);
  free(mw);
  free(raw);
  cl_mem *all[] = {&q_buf,     &k_buf,     &v_buf,   &ks_buf, &vs_buf,    &bt_buf,   &lens_buf,
                   &out_buf,   &lse_buf,   &ent_buf, &mw_buf, &am_buf,    &mask_buf, &bias_buf,
                   &alibi_buf, &sinks_buf, &w_buf,   &cu_buf, &bscale_buf, &pad_buf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
}

/* The case on every path (CLATTN_TEST_ALGOS="fused" keeps only those named,
 * as the -tiled rerun does); AUTO runs it when asked for. */
static void kv_forward_case(const kvcase *c, clattn_algo algo) {
  const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM};
  const char *only = getenv("CLATTN_TEST_ALGOS");
  if (algo == CLATTN_ALGO_AUTO) {
    kv_forward_case_on(c, algo);
    return;
  }
  for (size_t i = 0; i < 3; i++)
    if (!only || !*only || strstr(only, clattn_algo_name(algos[i]))) kv_forward_case_on(c, algos[i]);
}

static const clattn_dtype all_kv[] = {CLATTN_Q8_0, CLATTN_INT8, CLATTN_F16, CLATTN_BF16, CLATTN_F32};

/* Prefill chunks (several query rows per KV head: the fused path's packed
 * kernel on CPUs) over paged caches of every storage: page size 7, lengths that are
 * not page multiples, shuffled and shared pages, an entry outside the
 * pool, spare poisoned pages; causal chunk alignment per row. */
static void paged_prefill_matches_reference(void) {
  static const int lens[3] = {29, 23, 9};
  for (size_t i = 0; i < sizeof all_kv / sizeof all_kv[0]; i++) {
    char label[96];
    snprintf(label, sizeof label, "prefill paged kv=%s", kv_name(all_kv[i]));
    kvcase c = {.label = label,
                .B = 3,
                .Hq = 4,
                .Hkv = 2,
                .M = 5,
                .N = 31,
                .dk = 64,
                .dv = 32,
                .dtype = CLATTN_F32,
                .kv = all_kv[i],
                .paged = 1,
                .page_size = 7,
                .spare_pages = 3,
                .shared = 1,
                .bad_entry = 1,
                .lens = lens,
                .causal = 1,
                .window_left = -1,
                .window_right = -1,
                .lse = 1};
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
}

/* Every score-shaping and output feature at once over Q8_0 and INT8 pages:
 * GQA, mask, bias, ALiBi, softcap, sinks, window, lse, diagnostics. */
static void paged_quantised_with_every_feature(void) {
  static const int lens[3] = {40, 17, 0}; /* the last sequence is empty: its rows too */
  const clattn_dtype kvs[] = {CLATTN_Q8_0, CLATTN_INT8};
  for (size_t i = 0; i < 2; i++)
    for (int m = 1; m <= 6; m += 5) {
      char label[96];
      snprintf(label, sizeof label, "features paged kv=%s M=%d", kv_name(kvs[i]), m);
      kvcase c = {.label = label,
                  .B = 3,
                  .Hq = 6,
                  .Hkv = 2,
                  .M = m,
                  .N = 45,
                  .dk = 64,
                  .dv = 32,
                  .dtype = CLATTN_F32,
                  .kv = kvs[i],
                  .paged = 1,
                  .page_size = 5,
                  .spare_pages = 2,
                  .shared = 1,
                  .lens = lens,
                  .window_left = 11,
                  .window_right = 2,
                  .mask = 1,
                  .bias = 1,
                  .alibi = 1,
                  .softcap = 1,
                  .sinks = 1,
                  .lse = 1,
                  .diag = 1};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
  /* additive scores and f16 queries/outputs over a Q8_0 cache */
  static const int lens2[2] = {33, 8};
  kvcase a = {.label = "additive f16 q over paged q8_0",
              .B = 2,
              .Hq = 2,
              .Hkv = 1,
              .M = 3,
              .N = 40,
              .dk = 32,
              .dv = 64,
              .dtype = CLATTN_F16,
              .kv = CLATTN_Q8_0,
              .paged = 1,
              .page_size = 16,
              .spare_pages = 1,
              .lens = lens2,
              .causal = 1,
              .window_left = -1,
              .window_right = -1,
              .sinks = 1,
              .lse = 1,
              .additive = 1};
  kv_forward_case(&a, CLATTN_ALGO_FUSED);
}

/* 16-bit queries and outputs over paged caches stored like them
 * (kv_dtype CLATTN_DTYPE_SAME) and over INT8. */
static void paged_16bit_storage_matches_reference(void) {
  static const int lens[2] = {26, 11};
  const struct {
    clattn_dtype q, kv;
  } types[] = {{CLATTN_F16, CLATTN_F16}, {CLATTN_BF16, CLATTN_BF16}, {CLATTN_BF16, CLATTN_INT8}};
  for (size_t i = 0; i < 3; i++)
    for (int m = 1; m <= 7; m += 6) {
      char label[96];
      snprintf(label, sizeof label, "paged q=%s kv=%s M=%d", kv_name(types[i].q), kv_name(types[i].kv), m);
      kvcase c = {.label = label,
                  .B = 2,
                  .Hq = 4,
                  .Hkv = 2,
                  .M = m,
                  .N = 30,
                  .dk = 32,
                  .dv = 32,
                  .dtype = types[i].q,
                  .kv = types[i].kv,
                  .paged = 1,
                  .page_size = 3,
                  .spare_pages = 1,
                  .shared = 1,
                  .bad_entry = 1,
                  .lens = lens,
                  .causal = 1,
                  .window_left = -1,
                  .window_right = -1,
                  .bias = 1,
                  .lse = 1};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
}

/* Contiguous quantised caches (no block table): kv_lens keeps its padding
 * meaning, rows past it poisoned. */
static void contiguous_quantised_matches_reference(void) {
  static const int lens[2] = {37, 50};
  for (size_t i = 0; i < 4; i++)
    for (int m = 1; m <= 9; m += 8) {
      char label[96];
      snprintf(label, sizeof label, "contiguous kv=%s M=%d", kv_name(all_kv[i]), m);
      kvcase c = {.label = label,
                  .B = 2,
                  .Hq = 4,
                  .Hkv = 2,
                  .M = m,
                  .N = 50,
                  .dk = 64,
                  .dv = 32,
                  .dtype = CLATTN_F32,
                  .kv = all_kv[i],
                  .lens = lens,
                  .causal = 1,
                  .window_left = -1,
                  .window_right = -1,
                  .mask = 1,
                  .lse = 1,
                  .diag = 1};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
}

/* ggml's other block types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) and K and V
 * stored apart (llama.cpp's -ctk / -ctv), each type as keys and as values,
 * on every path: decode rows (M = 1: on CPUs the direct kernels' 16-column
 * loads) over a contiguous cache, and prefill chunks (M = 5: flash_rows'
 * packed copies, element by element) over a paged one, rows past kv_lens
 * and unused pages poisoned. */
static void block_types_and_k_v_stored_apart(void) {
  static const struct {
    clattn_dtype k, v;
  } pairs[] = {{CLATTN_Q4_0, CLATTN_Q4_1}, {CLATTN_Q5_0, CLATTN_Q5_1},   {CLATTN_IQ4_NL, CLATTN_Q4_0},
               {CLATTN_Q4_1, CLATTN_Q5_0}, {CLATTN_Q5_1, CLATTN_IQ4_NL}, {CLATTN_INT8, CLATTN_F16},
               {CLATTN_Q8_0, CLATTN_F32}};
  static const int lens[2] = {53, 37};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    for (int m = 1; m <= 5; m += 4) {
      char label[96];
      snprintf(label, sizeof label, "k=%s v=%s M=%d %s", kv_name(pairs[i].k), kv_name(pairs[i].v), m,
               m == 1 ? "contiguous" : "paged");
      const kvcase c = {.label = label,
                        .B = 2,
                        .Hq = 4,
                        .Hkv = 2,
                        .M = m,
                        .N = 53,
                        .dk = 64,
                        .dv = 32,
                        .dtype = CLATTN_F32,
                        .kv = pairs[i].k,
                        .paged = m > 1,
                        .page_size = 7,
                        .spare_pages = 1,
                        .lens = lens,
                        .causal = 1,
                        .window_left = -1,
                        .window_right = -1,
                        .mask = m > 1,
                        .lse = 1,
                        .v_apart = 1,
                        .v_kv = pairs[i].v};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
}

/* llama.cpp's FLASH_ATTN_EXT as an engine passes it: an f16 mask of
 * additive values as the bias, -inf where a key is not allowed (every third
 * key of each sequence for every query, whose K and V rows hold NaN and
 * Inf, and 1 entry in 8 elsewhere), times a per-head scale (ALiBi's slopes
 * in ggml's encoding), with GQA, sinks and softcap, decode and prefill,
 * contiguous and paged, f16 and Q8_0 caches, every path. */
static void engine_mask_as_f16_bias_with_minus_inf(void) {
  static const int lens[2] = {113, 61};
  const clattn_dtype kvs[] = {CLATTN_F16, CLATTN_Q8_0};
  for (size_t i = 0; i < 2; i++)
    for (int m = 1; m <= 7; m += 6) {
      char label[96];
      snprintf(label, sizeof label, "engine mask kv=%s M=%d %s", kv_name(kvs[i]), m, i ? "paged" : "contiguous");
      const kvcase c = {.label = label,
                        .B = 2,
                        .Hq = 4,
                        .Hkv = 1,
                        .M = m,
                        .N = 113,
                        .dk = 64,
                        .dv = 32,
                        .dtype = CLATTN_F32,
                        .kv = kvs[i],
                        .paged = (int)i,
                        .page_size = 16,
                        .spare_pages = 1,
                        .lens = lens,
                        .window_left = -1,
                        .window_right = -1,
                        .bias = 1,
                        .engine_bias = 1,
                        .softcap = m > 1,
                        .sinks = 1,
                        .lse = 1};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
}

/* The head sizes ggml's models bring, each on every path: DeepSeek's MLA
 * (dk 576, dv 512, 16 query heads over one KV head, the values the first
 * 512 columns of the keys' rows: V a view of K's bytes), f16 and Q8_0, decode
 * and a paged prefill chunk; odd sizes (65 / 67) under an engine's f16 mask;
 * 40. */
static void head_sizes_of_ggml_models(void) {
  static const int lens[2] = {77, 40};
  const struct {
    int dk, dv, Hq, Hkv, M, paged, v_in_k, engine_bias;
    clattn_dtype kv;
  } cases[] = {{576, 512, 16, 1, 1, 0, 1, 0, CLATTN_F16}, {576, 512, 16, 1, 4, 1, 1, 0, CLATTN_F16},
               {576, 512, 16, 1, 1, 0, 1, 0, CLATTN_Q8_0}, {65, 67, 4, 2, 3, 0, 0, 1, CLATTN_F16},
               {40, 40, 4, 4, 7, 1, 0, 0, CLATTN_BF16}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char label[96];
    snprintf(label, sizeof label, "dk=%d dv=%d kv=%s M=%d%s%s", cases[i].dk, cases[i].dv, kv_name(cases[i].kv),
             cases[i].M, cases[i].paged ? " paged" : "", cases[i].v_in_k ? ", V inside K" : "");
    const kvcase c = {.label = label, .B = 2, .Hq = cases[i].Hq, .Hkv = cases[i].Hkv, .M = cases[i].M, .N = 77,
                      .dk = cases[i].dk, .dv = cases[i].dv, .dtype = CLATTN_F32, .kv = cases[i].kv,
                      .paged = cases[i].paged, .page_size = 16, .spare_pages = 1, .lens = lens, .causal = 1,
                      .window_left = -1, .window_right = -1, .bias = cases[i].engine_bias,
                      .engine_bias = cases[i].engine_bias, .sinks = cases[i].engine_bias, .lse = 1,
                      .v_in_k = cases[i].v_in_k};
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
}

/* Decode (one query row) over a long paged cache: N = 4099 keys split
 * across work-items and merged; page size 7 (4099 = 585 * 7 + 4). */
static void paged_decode_split_kv_matches_reference(void) {
  static const int lens[2] = {4099, 3001};
  const clattn_dtype kvs[] = {CLATTN_Q8_0, CLATTN_INT8, CLATTN_F16};
  for (size_t i = 0; i < 3; i++) {
    char label[96];
    snprintf(label, sizeof label, "decode N=4099 paged kv=%s", kv_name(kvs[i]));
    kvcase c = {.label = label,
                .B = 2,
                .Hq = 4,
                .Hkv = 1,
                .M = 1,
                .N = 4099,
                .dk = 64,
                .dv = 32,
                .dtype = CLATTN_F32,
                .kv = kvs[i],
                .paged = 1,
                .page_size = 7,
                .spare_pages = 2,
                .shared = 1,
                .lens = lens,
                .causal = 1,
                .window_left = -1,
                .window_right = -1,
                .sinks = 1,
                .lse = 1,
                .expect_split = 1};
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
}

/* Packed queries over a paged cache (continuous batching): cu_seqlens_q with
 * a block table, each sequence's kv_lens[b] keys through its table row and
 * its queries at its last positions (FlashAttention's and vLLM's alignment),
 * sequences of 0 .. M queries and key counts that are not page or tile
 * multiples, on every path: a chunked prefill beside decodes over every
 * storage, decode-only batches (the decode kernels), and every feature at
 * once with ALiBi slopes per (batch, head). */
static void packed_queries_over_paged_cache(void) {
  static const int lens[3] = {29, 23, 9}, q_lens[3] = {5, 1, 3};
  for (size_t i = 0; i < sizeof all_kv / sizeof all_kv[0]; i++) {
    char label[96];
    snprintf(label, sizeof label, "packed queries, paged kv=%s", kv_name(all_kv[i]));
    kvcase c = {.label = label,
                .B = 3,
                .Hq = 4,
                .Hkv = 2,
                .M = 5,
                .N = 31,
                .dk = 64,
                .dv = 32,
                .dtype = CLATTN_F32,
                .kv = all_kv[i],
                .paged = 1,
                .page_size = 7,
                .spare_pages = 3,
                .shared = 1,
                .bad_entry = 1,
                .lens = lens,
                .causal = 1,
                .window_left = -1,
                .window_right = -1,
                .lse = 1,
                .q_lens = q_lens};
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
  static const int dec_lens[3] = {300, 17, 0}, ones[3] = {1, 1, 1};
  const clattn_dtype kvs[] = {CLATTN_Q8_0, CLATTN_F16};
  for (size_t i = 0; i < 2; i++) {
    char label[96];
    snprintf(label, sizeof label, "packed decode, paged kv=%s", kv_name(kvs[i]));
    kvcase c = {.label = label,
                .B = 3,
                .Hq = 4,
                .Hkv = 1,
                .M = 1,
                .N = 300,
                .dk = 64,
                .dv = 32,
                .dtype = CLATTN_F32,
                .kv = kvs[i],
                .paged = 1,
                .page_size = 7,
                .spare_pages = 2,
                .lens = dec_lens,
                .causal = 1,
                .window_left = -1,
                .window_right = -1,
                .sinks = 1,
                .lse = 1,
                .q_lens = ones};
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
  static const int f_lens[3] = {40, 17, 0}, f_q[3] = {6, 0, 2};
  kvcase f = {.label = "packed queries, paged int8, every feature",
              .B = 3,
              .Hq = 6,
              .Hkv = 2,
              .M = 6,
              .N = 45,
              .dk = 64,
              .dv = 32,
              .dtype = CLATTN_BF16,
              .kv = CLATTN_INT8,
              .paged = 1,
              .page_size = 5,
              .spare_pages = 2,
              .shared = 1,
              .lens = f_lens,
              .window_left = 11,
              .window_right = 2,
              .mask = 1,
              .bias = 1,
              .alibi = 2,
              .softcap = 1,
              .sinks = 1,
              .lse = 1,
              .diag = 1,
              .q_lens = f_q};
  kv_forward_case(&f, CLATTN_ALGO_FUSED);
}

/* Left-padded caches (cache_leftpad) of every storage, contiguous and
 * paged: each row's keys start at its own position (not a page multiple;
 * a whole page of padding; none), the padding rows poisoned; prefill
 * chunks, packed queries and decode with split keys, every feature. */
static void left_padded_caches_of_every_storage(void) {
  static const int lens[3] = {20, 9, 0}, pads[3] = {3, 14, 7}, q_lens[3] = {5, 2, 3};
  for (size_t i = 0; i < sizeof all_kv / sizeof all_kv[0]; i++)
    for (int paged = 0; paged <= 1; paged++) {
      char label[96];
      snprintf(label, sizeof label, "left-padded %s kv=%s", paged ? "paged" : "contiguous", kv_name(all_kv[i]));
      kvcase c = {.label = label,
                  .B = 3,
                  .Hq = 4,
                  .Hkv = 2,
                  .M = 5,
                  .N = 31,
                  .dk = 64,
                  .dv = 32,
                  .dtype = CLATTN_F32,
                  .kv = all_kv[i],
                  .paged = paged,
                  .page_size = 7,
                  .spare_pages = 2,
                  .lens = lens,
                  .leftpad = pads,
                  .causal = 1,
                  .window_left = -1,
                  .window_right = -1,
                  .lse = 1,
                  .q_lens = paged ? q_lens : NULL};
      kv_forward_case(&c, CLATTN_ALGO_FUSED);
    }
  static const int dec_lens[2] = {290, 17}, dec_pads[2] = {9, 100};
  kvcase d = {.label = "left-padded paged q8_0 decode, split keys",
              .B = 2,
              .Hq = 8,
              .Hkv = 2,
              .M = 1,
              .N = 300,
              .dk = 64,
              .dv = 64,
              .dtype = CLATTN_F32,
              .kv = CLATTN_Q8_0,
              .paged = 1,
              .page_size = 16,
              .spare_pages = 1,
              .lens = dec_lens,
              .leftpad = dec_pads,
              .causal = 1,
              .window_left = -1,
              .window_right = -1,
              .sinks = 1,
              .lse = 1};
  kv_forward_case(&d, CLATTN_ALGO_FUSED);
  static const int f_lens[2] = {30, 11}, f_pads[2] = {6, 1};
  kvcase f = {.label = "left-padded contiguous int8, every feature",
              .B = 2,
              .Hq = 6,
              .Hkv = 2,
              .M = 4,
              .N = 40,
              .dk = 64,
              .dv = 32,
              .dtype = CLATTN_BF16,
              .kv = CLATTN_INT8,
              .lens = f_lens,
              .leftpad = f_pads,
              .window_left = 11,
              .window_right = 2,
              .mask = 1,
              .bias = 1,
              .alibi = 2,
              .softcap = 1,
              .sinks = 1,
              .lse = 1,
              .diag = 1};
  kv_forward_case(&f, CLATTN_ALGO_FUSED);
}

/* Hostile block tables and kv_lens: entries at the int32 extremes, -1,
 * num_pages and random pages (shared by rows, in any order); kv_lens
 * negative and past kv_len (clamped to [0, kv_len]). Keys on entries
 * outside the pool are disallowed, nothing is read outside the views. */
static void paged_hostile_tables_and_lengths(void) {
  static const int dev_lens[3] = {-5, 1000, 20}, lens[3] = {0, 24, 20};
  const clattn_dtype kvs[] = {CLATTN_Q8_0, CLATTN_F32};
  for (int seed = 0; seed < 3; seed++)
    for (size_t i = 0; i < 2; i++)
      for (int m = 1; m <= 4; m += 3) {
        char label[96];
        snprintf(label, sizeof label, "hostile table #%d kv=%s M=%d", seed, kv_name(kvs[i]), m);
        kvcase c = {.label = label,
                    .B = 3,
                    .Hq = 4,
                    .Hkv = 2,
                    .M = m,
                    .N = 24,
                    .dk = 64,
                    .dv = 32,
                    .dtype = CLATTN_F32,
                    .kv = kvs[i],
                    .paged = 1,
                    .page_size = 5,
                    .spare_pages = 2,
                    .lens = lens,
                    .causal = 1,
                    .window_left = -1,
                    .window_right = -1,
                    .lse = 1,
                    .diag = 1,
                    .hostile = 1,
                    .dev_lens = dev_lens};
        kv_forward_case(&c, CLATTN_ALGO_FUSED);
      }
}

/* A seeded random sweep over the combinations above: batch, heads, GQA
 * group, rows, lengths (0 included), page sizes 1..17, storage, shared
 * pages, entries outside the pool, hostile tables, and each feature on or
 * off, every case on every path. Storage pairs are the ones the cases above
 * already build programs for. */
static void random_paged_quantised_sweep(void) {
  const struct {
    clattn_dtype q, kv;
    int dk, dv;
  } combos[] = {{CLATTN_F32, CLATTN_Q8_0, 64, 32},  {CLATTN_F32, CLATTN_INT8, 64, 32}, {CLATTN_F32, CLATTN_F16, 64, 32},
                {CLATTN_F32, CLATTN_BF16, 64, 32},  {CLATTN_F32, CLATTN_F32, 64, 32},  {CLATTN_F16, CLATTN_F16, 32, 32},
                {CLATTN_BF16, CLATTN_INT8, 32, 32}, {CLATTN_F16, CLATTN_Q8_0, 32, 64}};
  const uint64_t saved = rng_state;
  rng_state = 0x5eed13ull;
  for (int n = 0; n < 40; n++) {
    const size_t ci = rnd() % (sizeof combos / sizeof combos[0]);
    kvcase c;
    memset(&c, 0, sizeof c);
    char label[160];
    int lens[3];
    c.B = 1 + (int)(rnd() % 3);
    c.Hkv = 1 + (int)(rnd() % 2);
    c.Hq = c.Hkv * (1 + (int)(rnd() % 3));
    c.M = 1 + (int)(rnd() % 9);
    c.N = 1 + (int)(rnd() % 70);
    c.dk = combos[ci].dk;
    c.dv = combos[ci].dv;
    c.dtype = combos[ci].q;
    c.kv = combos[ci].kv;
    c.paged = rnd() % 4 != 0;
    c.page_size = 1 + (int)(rnd() % 17);
    c.spare_pages = (int)(rnd() % 3);
    for (int b = 0; b < c.B; b++) lens[b] = rnd() % 6 == 0 ? 0 : 1 + (int)(rnd() % (uint32_t)c.N);
    c.lens = lens;
    c.shared = c.paged && c.B >= 2 && lens[0] >= c.page_size && lens[1] >= c.page_size && rnd() % 2;
    c.bad_entry = c.paged && rnd() % 3 == 0;
    c.hostile = c.paged && rnd() % 4 == 0;
    c.causal = rnd() % 2;
    c.window_left = rnd() % 3 == 0 ? (int)(rnd() % 9) : -1;
    c.window_right = !c.causal && rnd() % 3 == 0 ? (int)(rnd() % 5) : -1;
    c.mask = rnd() % 3 == 0;
    c.bias = rnd() % 3 == 0;
    c.alibi = rnd() % 4 == 0 ? 1 + (int)(rnd() % 2) : 0; /* 2: slopes per (batch, head) */
    c.softcap = rnd() % 4 == 0;
    c.sinks = rnd() % 4 == 0;
    c.lse = 1;
    c.diag = rnd() % 3 == 0;
    c.additive = rnd() % 6 == 0;
    int q_lens[3] = {c.M, 0, 0}; /* packed queries: sequence 0 the longest */
    for (int b = 1; b < c.B; b++) q_lens[b] = (int)(rnd() % (uint32_t)(c.M + 1));
    c.q_lens = c.paged && rnd() % 3 == 0 ? q_lens : NULL;
    snprintf(label, sizeof label, "random #%d: B=%d Hq=%d Hkv=%d M=%d N=%d q=%s kv=%s %s ps=%d%s%s%s", n, c.B, c.Hq,
             c.Hkv, c.M, c.N, kv_name(c.dtype), kv_name(c.kv),
             c.paged ? (c.q_lens ? "paged, packed q" : "paged") : "contiguous", c.page_size, c.shared ? " shared" : "",
             c.bad_entry ? " bad-entry" : "", c.hostile ? " hostile" : "");
    c.label = label;
    kv_forward_case(&c, CLATTN_ALGO_FUSED);
  }
  rng_state = saved;
}

/* AUTO takes the fused path for paged / quantised K/V. */
static void auto_runs_paged_quantised_calls(void) {
  static const int lens[2] = {20, 13};
  kvcase c = {.label = "auto paged q8_0",
              .B = 2,
              .Hq = 2,
              .Hkv = 2,
              .M = 4,
              .N = 21,
              .dk = 64,
              .dv = 64,
              .dtype = CLATTN_F32,
              .kv = CLATTN_Q8_0,
              .paged = 1,
              .page_size = 7,
              .spare_pages = 1,
              .lens = lens,
              .causal = 1,
              .window_left = -1,
              .window_right = -1,
              .lse = 1};
  kv_forward_case(&c, CLATTN_ALGO_AUTO);
}

/* ---------- 4. forward: rejections ---------- */

static void forward_rejects_bad_kv_input_and_touches_nothing(void) {
  /* a valid paged Q8_0 call: B 1, H 1, M 2, N 16, dk = dv = 32, 3 pages of 8 */
  const int B = 1, H = 1, M = 2, N = 16, D = 32, PS = 8, PAGES = 3;
  float qh[2 * 32], outp[2 * 32];
  for (int i = 0; i < 64; i++) qh[i] = urand(1.0f);
  for (int i = 0; i < 64; i++) outp[i] = NAN;
  const size_t kv_bytes = (size_t)PAGES * H * PS * 34;
  unsigned char *kvh = calloc(kv_bytes, 1);
  const int32_t table[2] = {2, 0}, lens = 13, cu[2] = {0, 2};
  float scales[3 * 8];
  for (int i = 0; i < 24; i++) scales[i] = 0.01f;
  cl_mem q = make_buf(sizeof qh, qh), k = make_buf(kv_bytes, kvh), v = make_buf(kv_bytes, kvh),
         out = make_buf(sizeof outp, outp), bt = make_buf(sizeof table, table), kl = make_buf(4, &lens),
         sc = make_buf(sizeof scales, scales), cuq = make_buf(sizeof cu, cu), w = make_buf(sizeof outp, outp);
  free(kvh);
  if (!q || !k || !v || !out || !bt || !kl || !sc || !cuq || !w) {
    CHECK(0);
    goto done;
  }
  clattn_params ok = clattn_params_default();
  ok.batch = B;
  ok.q_heads = ok.kv_heads = H;
  ok.q_len = M;
  ok.kv_len = N;
  ok.head_dim = ok.value_dim = D;
  ok.q = (clattn_tensor){q, 0, {64, 64, 32, 1}};
  ok.out = (clattn_tensor){out, 0, {64, 64, 32, 1}};
  ok.kv_dtype = CLATTN_Q8_0;
  ok.k = (clattn_tensor){k, 0, {(size_t)H * PS * 34, (size_t)PS * 34, 34, 34}};
  ok.v = ok.k;
  ok.v.buf = v;
  ok.block_table = bt;
  ok.block_table_stride = 2;
  ok.page_size = PS;
  ok.num_pages = PAGES;
  ok.kv_lens = kl;
  ok.algo = CLATTN_ALGO_FUSED;
  const clattn_tensor int8_view = {k, 0, {(size_t)H * PS * 32, (size_t)PS * 32, 32, 1}};
  const clattn_tensor scale_view = {sc, 0, {8, 8, 1, 0}};
  struct {
    const char *what;
    clattn_params p;
    clattn_status want;
  } cases[48];
  int n = 0;
#define CASE(wh, st, edit)            \
  do {                                \
    cases[n].what = (wh);             \
    cases[n].p = ok;                  \
    cases[n].want = (st);             \
    {                                 \
      clattn_params *a = &cases[n].p; \
      edit;                           \
    }                                 \
    n++;                              \
  } while (0)
  CASE("page_size 0 with a block table", CLATTN_ERR_INVALID_ARGUMENT, a->page_size = 0);
  CASE("negative page_size", CLATTN_ERR_INVALID_ARGUMENT, a->page_size = -8);
  CASE("num_pages 0", CLATTN_ERR_INVALID_ARGUMENT, a->num_pages = 0);
  CASE("block table without kv_lens", CLATTN_ERR_INVALID_ARGUMENT, a->kv_lens = NULL);
  CASE("block_table_stride below ceil(kv_len / page_size)", CLATTN_ERR_INVALID_ARGUMENT, a->block_table_stride = 1);
  CASE("block table buffer too small", CLATTN_ERR_BUFFER_TOO_SMALL, a->block_table_stride = 3);
  CASE("views smaller than num_pages pages", CLATTN_ERR_BUFFER_TOO_SMALL, a->num_pages = PAGES + 1);
  CASE("Q8_0 head dim 48", CLATTN_ERR_INVALID_ARGUMENT, (a->head_dim = 48, a->q_len = 1, a->q.stride[2] = 48));
  CASE("Q8_0 column stride 32", CLATTN_ERR_INVALID_ARGUMENT, a->k.stride[3] = 32);
  CASE("Q8_0 odd offset", CLATTN_ERR_INVALID_ARGUMENT, a->v.offset = 1);
  CASE("Q8_0 odd row stride", CLATTN_ERR_INVALID_ARGUMENT, a->k.stride[2] = 35);
  CASE("Q8_0 as dtype", CLATTN_ERR_INVALID_ARGUMENT, a->dtype = CLATTN_Q8_0);
  CASE("INT8 as dtype", CLATTN_ERR_INVALID_ARGUMENT, a->dtype = CLATTN_INT8);
  CASE("kv_dtype out of range", CLATTN_ERR_INVALID_ARGUMENT, a->kv_dtype = (clattn_dtype)(CLATTN_IQ4_NL + 1));
  CASE("v_dtype out of range", CLATTN_ERR_INVALID_ARGUMENT, a->v_dtype = (clattn_dtype)(CLATTN_IQ4_NL + 1));
  CASE("Q4_0 with Q8_0's block stride", CLATTN_ERR_INVALID_ARGUMENT, a->kv_dtype = CLATTN_Q4_0);
  CASE("Q5_1 values, value dim 48", CLATTN_ERR_INVALID_ARGUMENT,
       (a->v_dtype = CLATTN_Q5_1, a->value_dim = 48, a->out.stride[2] = 48));
  CASE("INT8 values without v_scale", CLATTN_ERR_INVALID_ARGUMENT, (a->v_dtype = CLATTN_INT8, a->v = int8_view));
  CASE("bias_dtype BF16", CLATTN_ERR_INVALID_ARGUMENT, a->bias_dtype = CLATTN_BF16);
  CASE("bias_scale without a bias", CLATTN_ERR_INVALID_ARGUMENT, a->bias_scale = sc);
  CASE("sinks_offset past the sinks' buffer", CLATTN_ERR_BUFFER_TOO_SMALL, (a->sinks = sc, a->sinks_offset = 1000));
  CASE("INT8 without scales", CLATTN_ERR_INVALID_ARGUMENT, (a->kv_dtype = CLATTN_INT8, a->k = a->v = int8_view));
  CASE("INT8 with k_scale only", CLATTN_ERR_INVALID_ARGUMENT,
       (a->kv_dtype = CLATTN_INT8, a->k = a->v = int8_view, a->k_scale = scale_view));
  CASE("INT8 scales smaller than num_pages pages", CLATTN_ERR_BUFFER_TOO_SMALL,
       (a->kv_dtype = CLATTN_INT8, a->k = a->v = int8_view, a->k_scale = a->v_scale = scale_view,
        a->k_scale.stride[0] = 9));
  CASE("scales with Q8_0", CLATTN_ERR_INVALID_ARGUMENT, a->k_scale = scale_view);
  CASE("cu_seqlens_k with a block table", CLATTN_ERR_INVALID_ARGUMENT,
       (a->cu_seqlens_q = a->cu_seqlens_k = cuq, a->total_q = 2, a->total_kv = 2, a->q.stride[0] = 0,
        a->out.stride[0] = 0));
  CASE("cu_seqlens_k alone with a block table", CLATTN_ERR_INVALID_ARGUMENT, (a->cu_seqlens_k = cuq, a->total_kv = 2));
  CASE("packed queries over pages without kv_lens", CLATTN_ERR_INVALID_ARGUMENT,
       (a->cu_seqlens_q = cuq, a->total_q = 2, a->q.stride[0] = a->out.stride[0] = 0, a->kv_lens = NULL));
  CASE("packed queries over pages, q batch stride", CLATTN_ERR_INVALID_ARGUMENT,
       (a->cu_seqlens_q = cuq, a->total_q = 2, a->out.stride[0] = 0));
  CASE("packed queries over pages, total_q 0", CLATTN_ERR_INVALID_ARGUMENT,
       (a->cu_seqlens_q = cuq, a->total_q = 0, a->q.stride[0] = a->out.stride[0] = 0));
  CASE("packed queries over pages, cu_seqlens_q short", CLATTN_ERR_BUFFER_TOO_SMALL,
       (a->cu_seqlens_q = kl, a->total_q = 2, a->q.stride[0] = a->out.stride[0] = 0));
  CASE("weights too small with paged K/V", CLATTN_ERR_BUFFER_TOO_SMALL,
       (a->algo = CLATTN_ALGO_STAGED, a->weights = (clattn_tensor){w, 0, {128, 128, 64, 1}}));
#undef CASE
  for (int i = 0; i < n; i++) {
    clattn_status st = clattn_forward(ct_context(), &cases[i].p, 0, NULL, NULL);
    CHECKF(st == cases[i].want, "%s: %s, expected %s (%s)", cases[i].what, clattn_status_string(st),
           clattn_status_string(cases[i].want), clattn_last_error(ct_context()));
    /* rows past the table: the refusal names new_len and the rows the table holds */
    if (strstr(cases[i].what, "new_len past the table"))
      CHECKF(strstr(clattn_last_error(ct_context()), "new_len 4 exceeds the block table's capacity of 2 rows"), "%s",
             clattn_last_error(ct_context()));
  }
  float back[64];
  CHECK(clFinish(clattn_cl_queue(ct_context())) == CL_SUCCESS);
  CHECK(read_buf(out, back, sizeof back) && memcmp(back, outp, sizeof back) == 0);
  CHECK(read_buf(w, back, sizeof back) && memcmp(back, outp, sizeof back) == 0);
  /* the valid call runs after the rejections (a zero cache: O = 0), and so
   * does its packed-queries form (one sequence of 2 rows) */
  CHECK_STATUS(clattn_forward(ct_context(), &ok, 0, NULL, NULL), CLATTN_OK);
  CHECK(read_buf(out, back, sizeof back) && back[0] == 0.0f);
  clattn_params packed = ok;
  packed.cu_seqlens_q = cuq;
  packed.total_q = 2;
  packed.q.stride[0] = packed.out.stride[0] = 0;
  CHECK_STATUS(clattn_forward(ct_context(), &packed, 0, NULL, NULL), CLATTN_OK);
  /* every entry outside the pool: every row is empty, on every path */
  const int32_t outside[2] = {-1, PAGES};
  cl_mem bt_out = make_buf(sizeof outside, outside);
  if (bt_out) {
    const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM};
    for (int i = 0; i < 3; i++) {
      clattn_params e = ok;
      e.block_table = bt_out;
      e.algo = algos[i];
      e.empty_rows = CLATTN_EMPTY_ERROR;
      clattn_status st = clattn_forward(ct_context(), &e, 0, NULL, NULL);
      CHECKF(st == CLATTN_ERR_EMPTY_ROW, "%s: no page in the pool: %s, expected an empty row",
             clattn_algo_name(algos[i]), clattn_status_string(st));
      int zeros = read_buf(out, back, sizeof back);
      for (int j = 0; j < 64; j++) zeros = zeros && back[j] == 0.0f;
      CHECKF(zeros, "%s: an empty row's output is not 0", clattn_algo_name(algos[i]));
    }
    release(&bt_out);
  } else {
    CHECK(0);
  }
done:
  release(&q);
  release(&k);
  release(&v);
  release(&out);
  release(&bt);
  release(&kl);
  release(&sc);
  release(&cuq);
  release(&w);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(defaults_and_enum_values_follow_the_contract),
      CT_TEST(append_rejects_bad_input_and_touches_nothing),
      CT_TEST(append_outputs_sharing_bytes_are_refused),
      CT_TEST(append_into_k_and_v_interleaved_by_page),
      CT_TEST(forward_rejects_bad_kv_input_and_touches_nothing),
      CT_TEST(append_matches_ggml_rules_for_every_cache_storage),
      CT_TEST(append_skips_hostile_positions_and_entries),
      CT_TEST(paged_prefill_matches_reference),
      CT_TEST(paged_quantised_with_every_feature),
      CT_TEST(paged_16bit_storage_matches_reference),
      CT_TEST(contiguous_quantised_matches_reference),
      CT_TEST(block_types_and_k_v_stored_apart),
      CT_TEST(engine_mask_as_f16_bias_with_minus_inf),
      CT_TEST(head_sizes_of_ggml_models),
      CT_TEST(paged_decode_split_kv_matches_reference),
      CT_TEST(packed_queries_over_paged_cache),
      CT_TEST(left_padded_caches_of_every_storage),
      CT_TEST(paged_hostile_tables_and_lengths),
      CT_TEST(random_paged_quantised_sweep),
      CT_TEST(auto_runs_paged_quantised_calls),
  };
  ct_context();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
