/*
 * The problem kit (see problem.h): random attention problems, upload,
 * forward, read back and comparison against the fp64 reference.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "problem.h"
#include "reference_modifier.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------- small helpers ---------- */

static void set_err(char *err, size_t n, const char *fmt, ...) {
  if (!err || n == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

#define PB_ERR(pb, ...) set_err((pb)->err, sizeof(pb)->err, __VA_ARGS__)

double cp_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

cl_uint cp_context_refs(cl_context c) {
  cl_uint n = 0;
  clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL);
  return n;
}

cl_uint cp_implicit_context_refs(cl_context c) {
  const cl_uint before = cp_context_refs(c);
  cl_int e;
  cl_mem probe = clCreateBuffer(c, CL_MEM_READ_WRITE, 16, NULL, &e);
  if (e != CL_SUCCESS) return 1;
  const cl_uint with = cp_context_refs(c);
  clReleaseMemObject(probe);
  return with - before;
}

int cp_refs_show_leaks(cl_context c) {
  if (cp_implicit_context_refs(c) > 0) return 1;
  printf("  note: this runtime's objects hold no counted reference to their context (a new buffer adds none; "
         "OpenCL leaves that to the implementation), so the reference counts below show only explicit retains, "
         "not a leaked buffer, kernel, program or event\n");
  return 0;
}

cl_uint cp_queue_refs(cl_command_queue q) {
  cl_uint n = 0;
  clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof n, &n, NULL);
  return n;
}

size_t cp_index(const clattn_tensor *t, int b, int h, int row, int col) {
  return t->offset + (size_t)b * t->stride[0] + (size_t)h * t->stride[1] + (size_t)row * t->stride[2] +
         (size_t)col * t->stride[3];
}

const char *cp_cl_error_name(cl_int code) {
  return clattn_opencl_error_name(code); /* the library's table: one list of names */
}

/* splitmix64: small, seedable, the same everywhere. */
typedef struct {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rng_unit(rng *r) /* [0, 1) */
{
  return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static float rng_sym(rng *r, double amp) /* [-amp, amp] */
{
  return (float)((2.0 * rng_unit(r) - 1.0) * amp);
}

/* ---------- shapes ---------- */

/* ---------- 16-bit storage ---------- */

uint16_t cp_f16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (mag >= 0x477ff000u)                                   /* rounds past 65504: inf */
    return (uint16_t)(sign | 0x7c00u);
  if (mag < 0x38800000u) { /* subnormal half (or zero) */
    float a;
    uint32_t am = mag;
    memcpy(&a, &am, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f)); /* units of 2^-24, ties to even */
  }
  uint32_t r = mag + 0x0fffu + ((mag >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float cp_f16_value(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float x;
  if (e == 0) {
    x = (float)m * (1.0f / 16777216.0f); /* subnormal: m 2^-24 */
    uint32_t u;
    memcpy(&u, &x, 4);
    u |= sign;
    memcpy(&x, &u, 4);
    return x;
  }
  uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
  memcpy(&x, &u, 4);
  return x;
}

uint16_t cp_bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float cp_bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

float cp_round_to(clattn_dtype dtype, float x) {
  if (dtype == CLATTN_F16) return cp_f16_value(cp_f16_bits(x));
  if (dtype == CLATTN_BF16) return cp_bf16_value(cp_bf16_bits(x));
  return x;
}

void cp_quantize_q8_0_row(const float *x, unsigned char *y, int k) {
  for (int i = 0; i < k / 32; i++) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i * 32 + j]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = cp_f16_bits(d);
    memcpy(y + i * 34, &dh, 2);
    for (int j = 0; j < 32; j++) y[i * 34 + 2 + j] = (unsigned char)(int8_t)roundf(x[i * 32 + j] * id);
  }
}

float cp_quantize_int8_row(const float *x, unsigned char *q, int k) {
  float amax = 0.0f;
  for (int i = 0; i < k; i++) amax = fmaxf(amax, fabsf(x[i]));
  const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
  for (int i = 0; i < k; i++) q[i] = (unsigned char)(int8_t)roundf(x[i] * id);
  return d;
}

/* Bytes of one q, k, v or out element. */
static size_t storage_bytes(const cp_problem *pb) {
  return pb->shape.dtype == CLATTN_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* n floats in the problem's storage format: x itself for f32, else a new
 * array of 16-bit patterns (*owned set; free it). NULL when out of memory. */
static const void *to_storage(const cp_problem *pb, const float *x, size_t n, void **owned) {
  *owned = NULL;
  if (pb->shape.dtype == CLATTN_F32 || !x) return x;
  uint16_t *h = malloc(n ? n * sizeof *h : 1);
  if (!h) return NULL;
  for (size_t i = 0; i < n; i++) h[i] = pb->shape.dtype == CLATTN_F16 ? cp_f16_bits(x[i]) : cp_bf16_bits(x[i]);
  *owned = h;
  return h;
}

cp_shape cp_shape_default(void) {
  cp_shape s;
  memset(&s, 0, sizeof s);
  s.batch = 1;
  s.q_heads = 1;
  s.kv_heads = 1;
  s.q_len = 16;
  s.kv_len = 16;
  s.head_dim = 32;
  s.value_dim = 32;
  s.scale = NAN;
  s.window_left = -1;
  s.window_right = -1;
  s.layout = CP_BHSD;
  s.mask = CP_MASK_NONE;
  s.mask_density = 0.7;
  s.mask_blocks = 2;
  s.bias = CP_BIAS_NONE;
  s.bias_amp = 1.0;
  s.qk_amp = 1.0;
  s.v_amp = 1.0;
  s.empty_rows = CLATTN_EMPTY_ZERO;
  s.algo = CLATTN_ALGO_AUTO;
  s.seed = 1;
  return s;
}

static const char *mask_name(cp_mask_kind k) {
  switch (k) {
    case CP_MASK_NONE: return "none";
    case CP_MASK_ONES: return "ones";
    case CP_MASK_ZEROS: return "zeros";
    case CP_MASK_RANDOM: return "random";
    case CP_MASK_BLOCK_DIAG: return "blockdiag";
  }
  return "?";
}

static const char *bias_name(cp_bias_kind k) {
  switch (k) {
    case CP_BIAS_NONE: return "none";
    case CP_BIAS_RANDOM: return "random";
    case CP_BIAS_CONST: return "const";
  }
  return "?";
}

char *cp_describe(const cp_shape *s, char *buf, size_t n) {
  char sc[32];
  if (isnan(s->scale))
    snprintf(sc, sizeof sc, "default");
  else
    snprintf(sc, sizeof sc, "%g", (double)s->scale);
  snprintf(buf, n,
           "B=%d Hq=%d Hkv=%d M=%d N=%d dk=%d dv=%d scale=%s causal=%d win=[%d,%d] "
           "%s pad=%zu gap=%zu kv_lens=%d mask=%s/%u bias=%s(%g)/%u lse=%d weights=%d "
           "diag=%d softcap=%g alibi=%d sinks=%d additive=%d dtype=%s varlen=%d leftpad=%d dropout=%g/%llu/%llu "
           "empty=%s algo=%s seed=%llu",
           s->batch, s->q_heads, s->kv_heads, s->q_len, s->kv_len, s->head_dim, s->value_dim, sc, s->causal,
           s->window_left, s->window_right, s->layout == CP_BSHD ? "bshd" : "bhsd", s->pad, s->row_gap, s->kv_lens,
           mask_name(s->mask), s->mask_bcast, bias_name(s->bias), s->bias_amp, s->bias_bcast, s->want_lse,
           s->want_weights, s->want_diag, (double)s->softcap, s->alibi, s->sinks, s->additive,
           s->dtype == CLATTN_F16    ? "f16"
           : s->dtype == CLATTN_BF16 ? "bf16"
                                     : "f32",
           s->varlen, s->leftpad, (double)s->dropout_p, (unsigned long long)s->dropout_seed,
           (unsigned long long)s->dropout_offset, s->empty_rows == CLATTN_EMPTY_ERROR ? "error" : "zero",
           clattn_algo_name(s->algo),
           (unsigned long long)s->seed);
  return buf;
}

/* ---------- views ---------- */

/* A [B,H,R,C] view in the shape's layout with a row gap; returns the buffer
 * size in elements (pad + extent + pad). */
static size_t make_view(clattn_tensor *t, cp_layout layout, size_t pad, size_t gap, int B, int H, int R, int C) {
  size_t row = (size_t)C + gap;
  memset(t, 0, sizeof *t);
  t->offset = pad;
  t->stride[3] = 1;
  if (layout == CP_BHSD) {
    t->stride[2] = row;
    t->stride[1] = row * (size_t)R;
    t->stride[0] = t->stride[1] * (size_t)H;
  } else {
    t->stride[1] = row;
    t->stride[2] = row * (size_t)H;
    t->stride[0] = t->stride[2] * (size_t)R;
  }
  return pad + t->stride[0] * (size_t)B + pad;
}

/* A dense [B,H,M,N] view in that order with broadcast dims (stride 0). */
static size_t make_bcast_view(clattn_tensor *t, size_t pad, unsigned bcast, int B, int H, int M, int N) {
  size_t rows = (bcast & CP_BCAST_ROW) ? 1 : (size_t)M;
  size_t heads = (bcast & CP_BCAST_HEAD) ? 1 : (size_t)H;
  size_t batches = (bcast & CP_BCAST_BATCH) ? 1 : (size_t)B;
  memset(t, 0, sizeof *t);
  t->offset = pad;
  t->stride[3] = 1;
  t->stride[2] = (bcast & CP_BCAST_ROW) ? 0 : (size_t)N;
  t->stride[1] = (bcast & CP_BCAST_HEAD) ? 0 : rows * (size_t)N;
  t->stride[0] = (bcast & CP_BCAST_BATCH) ? 0 : heads * rows * (size_t)N;
  return pad + batches * heads * rows * (size_t)N + pad;
}

/* Fills the logical [B,H,R,C] elements of view t in buf with random values. */
static void fill_view(float *buf, const clattn_tensor *t, int B, int H, int R, int C, rng *g, double amp) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) buf[cp_index(t, b, h, r, c)] = rng_sym(g, amp);
}

static void *xcalloc(size_t n, size_t size) {
  if (n == 0) n = 1;
  return calloc(n, size);
}

/* ---------- build ---------- */

/* Sequence lengths for a packed batch: the shape's, or random: sequence 0
 * has q_len and kv_len (the longest), the others 0 .. q_len and 0 .. kv_len. */
static int make_sequences(cp_problem *pb, int B, int M, int N) {
  pb->cu_q = calloc((size_t)B + 1, sizeof(int32_t));
  pb->cu_k = calloc((size_t)B + 1, sizeof(int32_t));
  if (!pb->cu_q || !pb->cu_k) return 0;
  rng g = {pb->shape.seed * 0x9E3779B97F4A7C15ull + 0x5eedull};
  for (int b = 0; b < B; b++) {
    int m = b == 0 ? M : (int)(rng_next(&g) % (uint64_t)(M + 1));
    int n = b == 0 ? N : (int)(rng_next(&g) % (uint64_t)(N + 1));
    if (pb->shape.seq_q) m = pb->shape.seq_q[b], n = pb->shape.seq_k[b];
    pb->cu_q[b + 1] = pb->cu_q[b] + m;
    pb->cu_k[b + 1] = pb->cu_k[b] + n;
  }
  pb->params.total_q = pb->cu_q[B];
  pb->params.total_kv = pb->cu_k[B];
  return 1;
}

cp_problem *cp_build(const cp_shape *s, char *err, size_t errlen) {
  if (!s) {
    set_err(err, errlen, "cp_build: NULL shape");
    return NULL;
  }
  if (s->batch <= 0 || s->q_heads <= 0 || s->kv_heads <= 0 || s->q_len <= 0 || s->kv_len <= 0 || s->head_dim <= 0 ||
      s->value_dim <= 0) {
    set_err(err, errlen, "cp_build: every dimension must be positive");
    return NULL;
  }
  if (s->q_heads % s->kv_heads != 0) {
    set_err(err, errlen, "cp_build: kv_heads (%d) must divide q_heads (%d)", s->kv_heads, s->q_heads);
    return NULL;
  }
  if (s->window_left < -1 || s->window_right < -1) {
    set_err(err, errlen, "cp_build: windows must be >= -1");
    return NULL;
  }

  cp_problem *pb = calloc(1, sizeof *pb);
  if (!pb) {
    set_err(err, errlen, "cp_build: out of memory");
    return NULL;
  }
  pb->shape = *s;
  const int B = s->batch, Hq = s->q_heads, Hk = s->kv_heads, M = s->q_len, N = s->kv_len;
  const int dk = s->head_dim, dv = s->value_dim;
  clattn_params *p = &pb->params;
  *p = clattn_params_default();
  p->batch = B;
  p->q_heads = Hq;
  p->kv_heads = Hk;
  p->q_len = M;
  p->kv_len = N;
  p->head_dim = dk;
  p->value_dim = dv;
  p->dtype = s->dtype;
  p->scale = s->scale;
  p->causal = s->causal;
  p->window_left = s->window_left;
  p->window_right = s->window_right;
  p->empty_rows = s->empty_rows;
  p->algo = s->algo;
  p->softcap = s->softcap;
  p->score = s->additive ? CLATTN_SCORE_ADDITIVE : CLATTN_SCORE_DOT;
  p->dropout_p = s->dropout_p;
  p->dropout_seed = s->dropout_seed;
  p->dropout_offset = s->dropout_offset;
  p->score_mod = s->score_mod;
  p->mask_mod = s->mask_mod;
  for (int n = 0; n < 4; n++) {
    p->captures[n] = s->captures[n];
    p->capture_f[n] = s->capture_f[n];
    p->capture_i[n] = s->capture_i[n];
  }

  /* packed sequences: q, k, v and out are one batch of total rows */
  if (s->varlen && !make_sequences(pb, B, M, N)) {
    set_err(err, errlen, "cp_build: out of memory");
    cp_free(pb);
    return NULL;
  }
  const int QB = s->varlen ? 1 : B, QM = s->varlen ? p->total_q : M, KN = s->varlen ? p->total_kv : N;
  pb->q_elems = make_view(&p->q, s->layout, s->pad, s->row_gap, QB, Hq, QM, dk);
  pb->k_elems = make_view(&p->k, s->layout, s->pad, s->row_gap, QB, Hk, KN, dk);
  pb->v_elems = make_view(&p->v, s->layout, s->pad, s->row_gap, QB, Hk, KN, dv);
  pb->out_elems = make_view(&p->out, s->layout, s->pad, s->row_gap, QB, Hq, QM, dv);
  if (s->varlen) p->q.stride[0] = p->k.stride[0] = p->v.stride[0] = p->out.stride[0] = 0;
  if (s->want_lse) pb->lse_elems = make_view(&p->lse, s->layout, s->pad, 0, B, Hq, M, 1);
  if (s->want_weights) pb->weights_elems = make_view(&p->weights, s->layout, s->pad, s->row_gap, B, Hq, M, N);
  if (s->want_diag) {
    pb->diag_elems = make_view(&p->entropy, s->layout, s->pad, 0, B, Hq, M, 1);
    make_view(&p->max_weight, s->layout, s->pad, 0, B, Hq, M, 1);
    make_view(&p->argmax, s->layout, s->pad, 0, B, Hq, M, 1);
  }
  if (s->mask != CP_MASK_NONE) pb->mask_elems = make_bcast_view(&p->mask, s->pad, s->mask_bcast, B, Hq, M, N);
  if (s->bias != CP_BIAS_NONE) pb->bias_elems = make_bcast_view(&p->bias, s->pad, s->bias_bcast, B, Hq, M, N);

  pb->out_count = (size_t)B * Hq * M * dv;
  pb->lse_count = s->want_lse ? (size_t)B * Hq * M : 0;
  pb->weights_count = s->want_weights ? (size_t)B * Hq * M * N : 0;
  pb->diag_count = s->want_diag ? (size_t)B * Hq * M : 0;

  int ok = 1;
  ok &= !!(pb->q = xcalloc(pb->q_elems, sizeof(float)));
  ok &= !!(pb->k = xcalloc(pb->k_elems, sizeof(float)));
  ok &= !!(pb->v = xcalloc(pb->v_elems, sizeof(float)));
  ok &= !!(pb->out_raw = xcalloc(pb->out_elems, sizeof(float)));
  ok &= !!(pb->out = xcalloc(pb->out_count, sizeof(float)));
  ok &= !!(pb->ref_out = xcalloc(pb->out_count, sizeof(double)));
  if (s->want_lse) {
    ok &= !!(pb->lse_raw = xcalloc(pb->lse_elems, sizeof(float)));
    ok &= !!(pb->lse = xcalloc(pb->lse_count, sizeof(float)));
    ok &= !!(pb->ref_lse = xcalloc(pb->lse_count, sizeof(double)));
  }
  if (s->want_weights) {
    ok &= !!(pb->weights_raw = xcalloc(pb->weights_elems, sizeof(float)));
    ok &= !!(pb->weights = xcalloc(pb->weights_count, sizeof(float)));
    ok &= !!(pb->ref_weights = xcalloc(pb->weights_count, sizeof(double)));
  }
  if (s->want_diag) {
    ok &= !!(pb->entropy_raw = xcalloc(pb->diag_elems, sizeof(float)));
    ok &= !!(pb->max_weight_raw = xcalloc(pb->diag_elems, sizeof(float)));
    ok &= !!(pb->argmax_raw = xcalloc(pb->diag_elems, sizeof(int32_t)));
    ok &= !!(pb->entropy = xcalloc(pb->diag_count, sizeof(float)));
    ok &= !!(pb->max_weight = xcalloc(pb->diag_count, sizeof(float)));
    ok &= !!(pb->argmax = xcalloc(pb->diag_count, sizeof(int32_t)));
    ok &= !!(pb->ref_entropy = xcalloc(pb->diag_count, sizeof(double)));
    ok &= !!(pb->ref_max_weight = xcalloc(pb->diag_count, sizeof(double)));
    ok &= !!(pb->ref_argmax = xcalloc(pb->diag_count, sizeof(int32_t)));
  }
  if (s->mask != CP_MASK_NONE) ok &= !!(pb->mask = xcalloc(pb->mask_elems, 1));
  if (s->bias != CP_BIAS_NONE) ok &= !!(pb->bias = xcalloc(pb->bias_elems, sizeof(float)));
  if ((s->kv_lens || s->leftpad) && !s->varlen) ok &= !!(pb->kv_lens = xcalloc((size_t)B, sizeof(int32_t)));
  if (s->leftpad && !s->varlen) ok &= !!(pb->leftpad = xcalloc((size_t)B, sizeof(int32_t)));
  if (s->alibi) {
    p->alibi_batch_stride = s->alibi == 2 ? Hq + 1 : 0;
    pb->alibi_elems = (size_t)(B - 1) * (size_t)p->alibi_batch_stride + (size_t)Hq;
    ok &= !!(pb->alibi_slopes = xcalloc(pb->alibi_elems, sizeof(float)));
  }
  if (s->sinks) ok &= !!(pb->sinks = xcalloc((size_t)Hq, sizeof(float)));
  if (s->additive) ok &= !!(pb->additive_w = xcalloc((size_t)dk, sizeof(float)));
  if (!ok) {
    set_err(err, errlen, "cp_build: out of memory");
    cp_free(pb);
    return NULL;
  }

  rng g = {s->seed * 0x2545F4914F6CDD1Dull + 0x1234567ull};
  if (s->poison_gaps) {
    for (size_t i = 0; i < pb->q_elems; i++) pb->q[i] = NAN;
    for (size_t i = 0; i < pb->k_elems; i++) pb->k[i] = NAN;
    for (size_t i = 0; i < pb->v_elems; i++) pb->v[i] = NAN;
    for (size_t i = 0; i < pb->bias_elems; i++) pb->bias[i] = NAN;
  }
  fill_view(pb->q, &p->q, QB, Hq, QM, dk, &g, s->qk_amp);
  fill_view(pb->k, &p->k, QB, Hk, KN, dk, &g, s->qk_amp);
  fill_view(pb->v, &p->v, QB, Hk, KN, dv, &g, s->v_amp);
  if (s->dtype != CLATTN_F32) {
    float *arrays[] = {pb->q, pb->k, pb->v};
    size_t counts[] = {pb->q_elems, pb->k_elems, pb->v_elems};
    for (int a = 0; a < 3; a++)
      for (size_t i = 0; i < counts[a]; i++) arrays[a][i] = cp_round_to(s->dtype, arrays[a][i]);
  }

  if (pb->mask) {
    /* gaps: a recognisable value that is "allowed" if ever wrongly read */
    memset(pb->mask, s->poison_gaps ? 0x5A : 0, pb->mask_elems);
    int Bm = (s->mask_bcast & CP_BCAST_BATCH) ? 1 : B;
    int Hm = (s->mask_bcast & CP_BCAST_HEAD) ? 1 : Hq;
    int Mm = (s->mask_bcast & CP_BCAST_ROW) ? 1 : M;
    int blocks = s->mask_blocks > 0 ? s->mask_blocks : 1;
    for (int b = 0; b < Bm; b++)
      for (int h = 0; h < Hm; h++)
        for (int i = 0; i < Mm; i++)
          for (int j = 0; j < N; j++) {
            unsigned char a = 1;
            switch (s->mask) {
              case CP_MASK_NONE:
              case CP_MASK_ONES: a = 1; break;
              case CP_MASK_ZEROS: a = 0; break;
              case CP_MASK_RANDOM: a = rng_unit(&g) < s->mask_density; break;
              case CP_MASK_BLOCK_DIAG: a = (long)i * blocks / M == (long)j * blocks / N; break;
            }
            /* any nonzero byte means allowed: use a few different ones */
            pb->mask[cp_index(&p->mask, b, h, i, j)] = a ? (unsigned char)(1 + (j % 3) * 100) : 0;
          }
  }
  if (pb->bias) {
    int Bm = (s->bias_bcast & CP_BCAST_BATCH) ? 1 : B;
    int Hm = (s->bias_bcast & CP_BCAST_HEAD) ? 1 : Hq;
    int Mm = (s->bias_bcast & CP_BCAST_ROW) ? 1 : M;
    for (int b = 0; b < Bm; b++)
      for (int h = 0; h < Hm; h++)
        for (int i = 0; i < Mm; i++)
          for (int j = 0; j < N; j++)
            pb->bias[cp_index(&p->bias, b, h, i, j)] =
                s->bias == CP_BIAS_CONST ? (float)s->bias_amp : rng_sym(&g, s->bias_amp);
  }
  if (pb->kv_lens)
    for (int b = 0; b < B; b++) pb->kv_lens[b] = 1 + (int32_t)(rng_next(&g) % (uint64_t)N);
  for (int b = 0; pb->leftpad && b < B; b++) pb->leftpad[b] = (int32_t)(rng_next(&g) % (uint64_t)(pb->kv_lens[b] + 1));
  for (int d = 0; pb->additive_w && d < dk; d++) pb->additive_w[d] = rng_sym(&g, 1.0);
  for (size_t e = 0; e < pb->alibi_elems; e++) { /* per batch row: each row's own slopes, NaN between rows */
    const size_t stride = p->alibi_batch_stride ? (size_t)p->alibi_batch_stride : (size_t)Hq;
    const int b = (int)(e / stride), h = (int)(e % stride);
    pb->alibi_slopes[e] =
        h == Hq ? NAN : (float)(pow(2.0, -8.0 * (h + 1) / Hq) * (s->alibi == 2 ? (b + 2) / 2.0 : 1.0));
  }
  for (int h = 0; h < Hq && pb->sinks; h++) pb->sinks[h] = 1.0f + rng_sym(&g, 2.0);

  if (s->poison_disallowed) cp_poison_disallowed(pb);
  return pb;
}

static void release_mem(cl_mem *m) {
  if (*m) clReleaseMemObject(*m);
  *m = NULL;
}

/* Releases every device buffer of the problem (NULL ones are skipped). */
static void release_buffers(cp_problem *pb) {
  cl_mem *all[] = {&pb->q_buf,          &pb->k_buf,          &pb->v_buf,       &pb->out_buf,     &pb->mask_buf,
                   &pb->bias_buf,       &pb->lse_buf,        &pb->weights_buf, &pb->kv_lens_buf, &pb->alibi_buf,
                   &pb->sinks_buf,      &pb->additive_w_buf, &pb->cu_q_buf,    &pb->cu_k_buf,    &pb->entropy_buf,
                   &pb->max_weight_buf, &pb->argmax_buf,     &pb->leftpad_buf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release_mem(all[i]);
}

void cp_free(cp_problem *pb) {
  if (!pb) return;
  free(pb->mod_allowed);
  free(pb->mod_score);
  free(pb->mod_grad);
  release_buffers(pb);
  free(pb->entropy_raw);
  free(pb->max_weight_raw);
  free(pb->argmax_raw);
  free(pb->entropy);
  free(pb->max_weight);
  free(pb->argmax);
  free(pb->ref_entropy);
  free(pb->ref_max_weight);
  free(pb->ref_argmax);
  free(pb->q);
  free(pb->k);
  free(pb->v);
  free(pb->bias);
  free(pb->mask);
  free(pb->kv_lens);
  free(pb->alibi_slopes);
  free(pb->sinks);
  free(pb->additive_w);
  free(pb->cu_q);
  free(pb->cu_k);
  free(pb->leftpad);
  free(pb->out_raw);
  free(pb->lse_raw);
  free(pb->weights_raw);
  free(pb->out);
  free(pb->lse);
  free(pb->weights);
  free(pb->ref_out);
  free(pb->ref_lse);
  free(pb->ref_weights);
  free(pb);
}

ref_inputs cp_ref_inputs(const cp_problem *pb) {
  ref_inputs in;
  in.q = pb->q;
  in.k = pb->k;
  in.v = pb->v;
  in.mask = pb->mask;
  in.bias = pb->bias;
  in.kv_lens = pb->kv_lens;
  in.alibi_slopes = pb->alibi_slopes;
  in.sinks = pb->sinks;
  in.additive_w = pb->additive_w;
  in.cu_seqlens_q = pb->cu_q;
  in.cu_seqlens_k = pb->cu_k;
  in.cache_leftpad = pb->leftpad;
  in.mod_allowed = pb->mod_allowed;
  in.mod_score = pb->mod_score;
  in.mod_grad = pb->mod_grad;
  return in;
}

long cp_poison_disallowed(cp_problem *pb) {
  const clattn_params *p = &pb->params;
  const int B = p->batch, Hq = p->q_heads, M = p->q_len, N = p->kv_len;
  const int group = Hq / p->kv_heads;
  ref_inputs in = cp_ref_inputs(pb);
  long count = 0;

  /* keys and values no query row of the group may read (of packed
   * sequences, only the sequence's own rows) */
  for (int b = 0; b < B; b++)
    for (int g = 0; g < p->kv_heads; g++)
      for (int j = 0; j < N; j++) {
        const ref_seq sq = ref_sequence(p, &in, b);
        if ((in.cu_seqlens_q || in.cache_leftpad) && j >= sq.keys) break;
        int reachable = 0;
        for (int h = g * group; h < (g + 1) * group && !reachable; h++)
          for (int i = 0; i < M && !reachable; i++) reachable = ref_allowed(p, &in, b, h, i, j);
        if (reachable) continue;
        /* vary the poison: NaN and +-Inf in keys and values */
        float kp = (j % 3 == 0) ? NAN : (j % 3 == 1) ? INFINITY : -INFINITY;
        float vp = (j % 2 == 0) ? INFINITY : NAN;
        for (int d = 0; d < p->head_dim; d++) pb->k[cp_index(&p->k, b, g, (int)sq.k0 + j, d)] = kp;
        for (int d = 0; d < p->value_dim; d++) pb->v[cp_index(&p->v, b, g, (int)sq.k0 + j, d)] = vp;
        count++;
      }

  /* a left-padded row's padding */
  for (int b = 0; in.cache_leftpad && b < B; b++)
    for (int g = 0; g < p->kv_heads; g++)
      for (long r = 0; r < ref_sequence(p, &in, b).k0; r++) {
        for (int d = 0; d < p->head_dim; d++) pb->k[cp_index(&p->k, b, g, (int)r, d)] = NAN;
        for (int d = 0; d < p->value_dim; d++) pb->v[cp_index(&p->v, b, g, (int)r, d)] = INFINITY;
        count++;
      }

  /* query rows with no allowed key at all */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < M; i++) {
        const ref_seq sq = ref_sequence(p, &in, b);
        int any = i >= sq.rows; /* no such row: nothing to poison */
        for (int j = 0; j < N && !any; j++) any = ref_allowed(p, &in, b, h, i, j);
        if (!any)
          for (int d = 0; d < p->head_dim; d++) pb->q[cp_index(&p->q, b, h, (int)sq.q0 + i, d)] = NAN;
      }

  /* bias elements that only disallowed (b, h, i, j) read (broadcast strides
   * can share one element among several positions) */
  if (pb->bias) {
    unsigned char *reach = calloc(pb->bias_elems ? pb->bias_elems : 1, 1);
    if (reach) {
      for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
          for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
              if (ref_allowed(p, &in, b, h, i, j)) reach[cp_index(&p->bias, b, h, i, j)] = 1;
      for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
          for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
              size_t x = cp_index(&p->bias, b, h, i, j);
              if (!reach[x]) pb->bias[x] = (j % 2) ? NAN : INFINITY;
            }
      free(reach);
    }
  }
  pb->ref_valid = 0;
  return count;
}

/* ---------- device ---------- */

static int create_buf(cp_problem *pb, cl_mem *m, cl_mem_flags flags, size_t bytes, void *host, const char *what) {
  cl_int e = CL_SUCCESS;
  if (host) flags |= CL_MEM_COPY_HOST_PTR;
  *m = clCreateBuffer(pb->cl_ctx, flags, bytes, host, &e);
  if (e != CL_SUCCESS || !*m) {
    PB_ERR(pb, "clCreateBuffer(%s, %zu bytes): %s (%d)", what, bytes, cp_cl_error_name(e), e);
    *m = NULL;
    return -1;
  }
  return 0;
}

static int write_buf(cp_problem *pb, cl_mem m, size_t bytes, const void *host, const char *what) {
  if (!m) return 0;
  cl_int e = clEnqueueWriteBuffer(pb->queue, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clEnqueueWriteBuffer(%s): %s (%d)", what, cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

static int read_buf(cp_problem *pb, cl_mem m, size_t bytes, void *host, const char *what) {
  if (!m) return 0;
  cl_int e = clEnqueueReadBuffer(pb->queue, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clEnqueueReadBuffer(%s): %s (%d)", what, cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

/* q, k and v in the storage format: into new buffers (create) or the
 * existing ones. */
static int write_inputs_qkv(cp_problem *pb, int create) {
  const float *host[] = {pb->q, pb->k, pb->v};
  const size_t elems[] = {pb->q_elems, pb->k_elems, pb->v_elems};
  cl_mem *bufs[] = {&pb->q_buf, &pb->k_buf, &pb->v_buf};
  const char *names[] = {"q", "k", "v"};
  for (int a = 0; a < 3; a++) {
    void *owned;
    const void *data = to_storage(pb, host[a], elems[a], &owned);
    if (!data) {
      PB_ERR(pb, "%s: out of host memory", names[a]);
      return -1;
    }
    const size_t bytes = elems[a] * storage_bytes(pb);
    int rc = create ? create_buf(pb, bufs[a], CL_MEM_READ_ONLY, bytes, (void *)data, names[a])
                    : write_buf(pb, *bufs[a], bytes, data, names[a]);
    free(owned);
    if (rc) return -1;
  }
  return 0;
}

int cp_write_inputs(cp_problem *pb) {
  if (!pb->queue) {
    PB_ERR(pb, "cp_write_inputs: not uploaded");
    return -1;
  }
  pb->ref_valid = 0;
  if (write_inputs_qkv(pb, 0) || write_buf(pb, pb->mask_buf, pb->mask_elems, pb->mask, "mask") ||
      write_buf(pb, pb->bias_buf, pb->bias_elems * sizeof(float), pb->bias, "bias") ||
      write_buf(pb, pb->kv_lens_buf, (size_t)pb->params.batch * sizeof(int32_t), pb->kv_lens, "kv_lens") ||
      write_buf(pb, pb->alibi_buf, pb->alibi_elems * sizeof(float), pb->alibi_slopes, "alibi") ||
      write_buf(pb, pb->sinks_buf, (size_t)pb->params.q_heads * sizeof(float), pb->sinks, "sinks") ||
      write_buf(pb, pb->additive_w_buf, (size_t)pb->params.head_dim * sizeof(float), pb->additive_w, "additive_w") ||
      write_buf(pb, pb->cu_q_buf, ((size_t)pb->params.batch + 1) * sizeof(int32_t), pb->cu_q, "cu_seqlens_q") ||
      write_buf(pb, pb->cu_k_buf, ((size_t)pb->params.batch + 1) * sizeof(int32_t), pb->cu_k, "cu_seqlens_k") ||
      write_buf(pb, pb->leftpad_buf, (size_t)pb->params.batch * sizeof(int32_t), pb->leftpad, "cache_leftpad"))
    return -1;
  return 0;
}

int cp_upload(cp_problem *pb, clattn_context *ctx) {
  if (!ctx) {
    PB_ERR(pb, "cp_upload: NULL context");
    return -1;
  }
  if (pb->q_buf) return cp_write_inputs(pb);
  pb->ctx = ctx;
  pb->cl_ctx = clattn_cl_context(ctx);
  pb->queue = clattn_cl_queue(ctx);
  pb->ref_valid = 0;
  if (!pb->cl_ctx || !pb->queue) {
    PB_ERR(pb, "cp_upload: the clattn context has no cl_context/queue");
    return -1;
  }
  const cl_mem_flags ro = CL_MEM_READ_ONLY, rw = CL_MEM_READ_WRITE;
  if (write_inputs_qkv(pb, 1) || create_buf(pb, &pb->out_buf, rw, pb->out_elems * storage_bytes(pb), NULL, "out"))
    goto fail;
  if (pb->mask && create_buf(pb, &pb->mask_buf, ro, pb->mask_elems, pb->mask, "mask")) goto fail;
  if (pb->bias && create_buf(pb, &pb->bias_buf, ro, pb->bias_elems * sizeof(float), pb->bias, "bias")) goto fail;
  if (pb->kv_lens &&
      create_buf(pb, &pb->kv_lens_buf, ro, (size_t)pb->params.batch * sizeof(int32_t), pb->kv_lens, "kv_lens"))
    goto fail;
  if (pb->alibi_slopes &&
      create_buf(pb, &pb->alibi_buf, ro, pb->alibi_elems * sizeof(float), pb->alibi_slopes, "alibi_slopes"))
    goto fail;
  if (pb->sinks && create_buf(pb, &pb->sinks_buf, ro, (size_t)pb->params.q_heads * sizeof(float), pb->sinks, "sinks"))
    goto fail;
  if (pb->additive_w && create_buf(pb, &pb->additive_w_buf, ro, (size_t)pb->params.head_dim * sizeof(float),
                                   pb->additive_w, "additive_w"))
    goto fail;
  if (pb->cu_q &&
      (create_buf(pb, &pb->cu_q_buf, ro, ((size_t)pb->params.batch + 1) * sizeof(int32_t), pb->cu_q, "cu_seqlens_q") ||
       create_buf(pb, &pb->cu_k_buf, ro, ((size_t)pb->params.batch + 1) * sizeof(int32_t), pb->cu_k, "cu_seqlens_k")))
    goto fail;
  if (pb->leftpad &&
      create_buf(pb, &pb->leftpad_buf, ro, (size_t)pb->params.batch * sizeof(int32_t), pb->leftpad, "cache_leftpad"))
    goto fail;
  if (pb->lse_elems && create_buf(pb, &pb->lse_buf, rw, pb->lse_elems * sizeof(float), NULL, "lse")) goto fail;
  if (pb->weights_elems && create_buf(pb, &pb->weights_buf, rw, pb->weights_elems * sizeof(float), NULL, "weights"))
    goto fail;
  if (pb->diag_elems && (create_buf(pb, &pb->entropy_buf, rw, pb->diag_elems * sizeof(float), NULL, "entropy") ||
                         create_buf(pb, &pb->max_weight_buf, rw, pb->diag_elems * sizeof(float), NULL, "max_weight") ||
                         create_buf(pb, &pb->argmax_buf, rw, pb->diag_elems * sizeof(int32_t), NULL, "argmax")))
    goto fail;

  clattn_params *p = &pb->params;
  p->q.buf = pb->q_buf;
  p->k.buf = pb->k_buf;
  p->v.buf = pb->v_buf;
  p->out.buf = pb->out_buf;
  p->mask.buf = pb->mask_buf;
  p->bias.buf = pb->bias_buf;
  p->kv_lens = pb->kv_lens_buf;
  p->alibi_slopes = pb->alibi_buf;
  p->sinks = pb->sinks_buf;
  p->additive_w = pb->additive_w_buf;
  p->cu_seqlens_q = pb->cu_q_buf;
  p->cu_seqlens_k = pb->cu_k_buf;
  p->cache_leftpad = pb->leftpad_buf;
  p->lse.buf = pb->lse_buf;
  p->weights.buf = pb->weights_buf;
  p->entropy.buf = pb->entropy_buf;
  p->max_weight.buf = pb->max_weight_buf;
  p->argmax.buf = pb->argmax_buf;
  return 0;

fail:
  release_buffers(pb);
  pb->queue = NULL;
  pb->cl_ctx = NULL;
  return -1;
}

static int fill_buf(cp_problem *pb, cl_mem m, size_t elems, float value, const char *what) {
  if (!m) return 0;
  cl_int e = clEnqueueFillBuffer(pb->queue, m, &value, sizeof value, 0, elems * sizeof(float), 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clEnqueueFillBuffer(%s): %s (%d)", what, cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

/* Fills an out-like buffer (in the storage format) with value. */
static int fill_storage(cp_problem *pb, cl_mem m, size_t elems, float value, const char *what) {
  if (pb->shape.dtype == CLATTN_F32) return fill_buf(pb, m, elems, value, what);
  uint16_t pattern = pb->shape.dtype == CLATTN_F16 ? cp_f16_bits(value) : cp_bf16_bits(value);
  cl_int e = clEnqueueFillBuffer(pb->queue, m, &pattern, sizeof pattern, 0, elems * sizeof pattern, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clEnqueueFillBuffer(%s): %s (%d)", what, cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

int cp_fill_outputs(cp_problem *pb, float value) {
  if (!pb->queue) {
    PB_ERR(pb, "cp_fill_outputs: not uploaded");
    return -1;
  }
  if (fill_storage(pb, pb->out_buf, pb->out_elems, value, "out") ||
      fill_buf(pb, pb->lse_buf, pb->lse_elems, value, "lse") ||
      fill_buf(pb, pb->weights_buf, pb->weights_elems, value, "weights") ||
      fill_buf(pb, pb->entropy_buf, pb->diag_elems, value, "entropy") ||
      fill_buf(pb, pb->max_weight_buf, pb->diag_elems, value, "max_weight") ||
      fill_buf(pb, pb->argmax_buf, pb->diag_elems, value, "argmax")) /* NaN's bits: no key index */
    return -1;
  cl_int e = clFinish(pb->queue);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clFinish after fill: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

/* Reads an out-like buffer in the storage format into floats. */
static int read_storage(cp_problem *pb, cl_mem m, size_t elems, float *dst, const char *what) {
  if (pb->shape.dtype == CLATTN_F32) return read_buf(pb, m, elems * sizeof(float), dst, what);
  uint16_t *h = malloc(elems ? elems * sizeof *h : 1);
  if (!h) {
    PB_ERR(pb, "%s: out of host memory", what);
    return -1;
  }
  int rc = read_buf(pb, m, elems * sizeof *h, h, what);
  for (size_t i = 0; rc == 0 && i < elems; i++)
    dst[i] = pb->shape.dtype == CLATTN_F16 ? cp_f16_value(h[i]) : cp_bf16_value(h[i]);
  free(h);
  return rc;
}

int cp_read_outputs(cp_problem *pb) {
  if (!pb->queue) {
    PB_ERR(pb, "cp_read_outputs: not uploaded");
    return -1;
  }
  if (read_storage(pb, pb->out_buf, pb->out_elems, pb->out_raw, "out") ||
      read_buf(pb, pb->lse_buf, pb->lse_elems * sizeof(float), pb->lse_raw, "lse") ||
      read_buf(pb, pb->weights_buf, pb->weights_elems * sizeof(float), pb->weights_raw, "weights") ||
      read_buf(pb, pb->entropy_buf, pb->diag_elems * sizeof(float), pb->entropy_raw, "entropy") ||
      read_buf(pb, pb->max_weight_buf, pb->diag_elems * sizeof(float), pb->max_weight_raw, "max_weight") ||
      read_buf(pb, pb->argmax_buf, pb->diag_elems * sizeof(int32_t), pb->argmax_raw, "argmax"))
    return -1;
  /* Dense gathers. Rows past a packed sequence's end do not exist: the
   * gathers hold what the reference writes there (0, argmax -1). */
  const clattn_params *p = &pb->params;
  const int B = p->batch, H = p->q_heads, M = p->q_len, N = p->kv_len, dv = p->value_dim;
  const ref_inputs in = cp_ref_inputs(pb);
  size_t row = 0;
  for (int b = 0; b < B; b++) {
    const ref_seq sq = ref_sequence(p, &in, b);
    for (int h = 0; h < H; h++)
      for (int i = 0; i < M; i++, row++) {
        const int here = i < sq.rows;
        for (int c = 0; c < dv; c++)
          pb->out[row * (size_t)dv + c] = here ? pb->out_raw[cp_index(&p->out, b, h, (int)sq.q0 + i, c)] : 0.0f;
        if (pb->lse) pb->lse[row] = here ? pb->lse_raw[cp_index(&p->lse, b, h, i, 0)] : 0.0f;
        if (pb->entropy) {
          pb->entropy[row] = here ? pb->entropy_raw[cp_index(&p->entropy, b, h, i, 0)] : 0.0f;
          pb->max_weight[row] = here ? pb->max_weight_raw[cp_index(&p->max_weight, b, h, i, 0)] : 0.0f;
          pb->argmax[row] = here ? pb->argmax_raw[cp_index(&p->argmax, b, h, i, 0)] : -1;
        }
        for (int j = 0; pb->weights && j < N; j++)
          pb->weights[row * (size_t)N + j] = here ? pb->weights_raw[cp_index(&p->weights, b, h, i, j)] : 0.0f;
      }
  }
  return 0;
}

/* ---------- reference and comparison ---------- */

int cp_modifier_tables(cp_problem *pb) {
  const clattn_params *p = &pb->params;
  if ((!p->score_mod && !p->mask_mod) || pb->mod_allowed || pb->mod_score) return 0;
  if (!pb->ctx) {
    PB_ERR(pb, "cp_modifier_tables: modifiers are evaluated on the device: cp_upload first");
    return -1;
  }
  const ref_inputs plain = cp_ref_inputs(pb);
  return ref_modifier_tables(pb->ctx, p, &plain, &pb->mod_allowed, &pb->mod_score, &pb->mod_grad, pb->err,
                             sizeof pb->err);
}

int cp_reference(cp_problem *pb) {
  if (pb->ref_valid) return 0;
  if (cp_modifier_tables(pb) != 0) return -1;
  ref_inputs in = cp_ref_inputs(pb);
  ref_outputs o;
  o.out = pb->ref_out;
  o.lse = pb->ref_lse;
  o.weights = pb->ref_weights;
  o.entropy = pb->ref_entropy;
  o.max_weight = pb->ref_max_weight;
  o.argmax = pb->ref_argmax;
  o.empty_rows = 0;
  clattn_params as_f32 = pb->params; /* the host arrays hold the stored values as floats */
  as_f32.dtype = CLATTN_F32;
  if (ref_forward(&as_f32, &in, &o) != 0) {
    PB_ERR(pb, "ref_forward rejected the params");
    return -1;
  }
  pb->ref_empty_rows = o.empty_rows;
  pb->ref_valid = 1;
  return 0;
}

double cp_rel_err(const float *x, const double *ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double a = (double)x[i], r = ref[i];
    if (!isfinite(a) || !isfinite(r)) continue;
    num += (a - r) * (a - r);
    den += r * r;
  }
  return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static void compare_one(const float *x, const double *ref, size_t n, double *err, long *nans, long *mismatch) {
  *err = 0.0;
  *nans = 0;
  *mismatch = 0;
  if (!x || !ref) return;
  for (size_t i = 0; i < n; i++) {
    double a = (double)x[i], r = ref[i];
    if (isnan(a)) (*nans)++;
    if (isnan(a) != isnan(r))
      (*mismatch)++;
    else if (!isnan(a) && (!isfinite(a) || !isfinite(r)) && a != r)
      (*mismatch)++;
  }
  *err = cp_rel_err(x, ref, n);
}

/* argmax entries that are neither the reference's key nor one whose fp64
 * score ties the row's maximum within 1e-5 (fp32 scores may order near
 * ties differently); rows the reference leaves unspecified are skipped. */
static long argmax_mismatches(cp_problem *pb) {
  const clattn_params *p = &pb->params;
  ref_inputs in = cp_ref_inputs(pb);
  long bad = 0;
  size_t n = 0;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->q_heads; h++)
      for (int i = 0; i < p->q_len; i++, n++) {
        const int32_t want = pb->ref_argmax[n], got = pb->argmax[n];
        if (want == REF_ARGMAX_UNSPECIFIED || got == want) continue;
        if (want < 0 || got < 0 || !ref_allowed(p, &in, b, h, i, got)) {
          bad++;
          continue;
        }
        const double top = ref_score(p, &in, b, h, i, want);
        if (!(ref_score(p, &in, b, h, i, got) >= top - 1e-5 * fmax(1.0, fabs(top)))) bad++;
      }
  return bad;
}

int cp_compare(cp_problem *pb, cp_result *r) {
  if (cp_reference(pb) != 0) return -1;
  compare_one(pb->out, pb->ref_out, pb->out_count, &r->err_out, &r->nan_out, &r->mismatch_out);
  compare_one(pb->lse, pb->ref_lse, pb->lse_count, &r->err_lse, &r->nan_lse, &r->mismatch_lse);
  compare_one(pb->weights, pb->ref_weights, pb->weights_count, &r->err_weights, &r->nan_weights, &r->mismatch_weights);
  if (pb->diag_count) {
    long nans, mismatch_e, mismatch_m;
    compare_one(pb->entropy, pb->ref_entropy, pb->diag_count, &r->err_entropy, &nans, &mismatch_e);
    compare_one(pb->max_weight, pb->ref_max_weight, pb->diag_count, &r->err_max_weight, &nans, &mismatch_m);
    r->mismatch_diag = mismatch_e + mismatch_m + argmax_mismatches(pb);
  }
  r->empty_rows = pb->ref_empty_rows;
  return 0;
}

int cp_run(cp_problem *pb, clattn_context *ctx, cp_result *r) {
  memset(r, 0, sizeof *r);
  r->status = CLATTN_ERR_OPENCL;
  if (!pb->q_buf && cp_upload(pb, ctx) != 0) return -1;
  if (cp_fill_outputs(pb, NAN) != 0) return -1;
  if (cp_modifier_tables(pb) != 0) return -1; /* before the call: its route is the call's */
  double t0 = cp_now_ms();
  r->status = clattn_forward(ctx, &pb->params, 0, NULL, NULL);
  cl_int e = clFinish(pb->queue);
  r->ms = cp_now_ms() - t0;
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clFinish after clattn_forward: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  if (cp_read_outputs(pb) != 0) return -1;
  return cp_compare(pb, r);
}

int cp_time_forward(cp_problem *pb, clattn_context *ctx, int reps, double *ms, clattn_status *st) {
  *ms = 0.0;
  *st = CLATTN_ERR_OPENCL;
  if (!pb->q_buf && cp_upload(pb, ctx) != 0) return -1;
  if (reps < 1) reps = 1;
  *st = clattn_forward(ctx, &pb->params, 0, NULL, NULL); /* warm-up */
  cl_int e = clFinish(pb->queue);
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clFinish: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  if (*st != CLATTN_OK) return 0;
  double t0 = cp_now_ms();
  for (int i = 0; i < reps && *st == CLATTN_OK; i++) *st = clattn_forward(ctx, &pb->params, 0, NULL, NULL);
  e = clFinish(pb->queue);
  *ms = (cp_now_ms() - t0) / reps;
  if (e != CL_SUCCESS) {
    PB_ERR(pb, "clFinish: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

int cp_result_ok(const cp_result *r, double tol) {
  return r->status == CLATTN_OK && r->mismatch_out == 0 && r->mismatch_lse == 0 && r->mismatch_weights == 0 &&
         r->err_out <= tol && r->err_lse <= tol && r->err_weights <= tol && r->mismatch_diag == 0 &&
         r->err_entropy <= tol && r->err_max_weight <= tol;
}

char *cp_result_format(const cp_result *r, char *buf, size_t n) {
  snprintf(buf, n,
           "status=%s err out=%.3g lse=%.3g weights=%.3g nan out/lse/w=%ld/%ld/%ld "
           "mismatch out/lse/w=%ld/%ld/%ld diag err entropy/max_weight=%.3g/%.3g mismatch=%ld "
           "empty_rows=%ld %.2f ms",
           clattn_status_string(r->status), r->err_out, r->err_lse, r->err_weights, r->nan_out, r->nan_lse,
           r->nan_weights, r->mismatch_out, r->mismatch_lse, r->mismatch_weights, r->err_entropy, r->err_max_weight,
           r->mismatch_diag, r->empty_rows, r->ms);
  return buf;
}
