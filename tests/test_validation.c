/*
 * Every rejected call returns its status, names the offending field in
 * clattn_last_error, and leaves every output buffer as it was (nothing is
 * enqueued). A valid call afterwards still works.
 */
#include <ctype.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>

#include "api/api.h"
#include "kit_checks.h"

#define PATTERN 12345.0f

static cp_problem *g_pb; /* B=3, Hq=4, Hkv=2, M=8, N=8, dk=16, dv=8, all outputs, mask, bias, kv_lens */

static cp_problem *base(void) {
  if (g_pb) return g_pb;
  cp_shape s = cp_shape_default();
  s.batch = 3;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 8;
  s.kv_len = 8;
  s.head_dim = 16;
  s.value_dim = 8;
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.want_diag = 1;
  s.algo = CLATTN_ALGO_STAGED;
  char err[256];
  g_pb = cp_build(&s, err, sizeof err);
  if (!g_pb) {
    CHECKF(0, "cp_build: %s", err);
    return NULL;
  }
  if (cp_upload(g_pb, ct_context()) != 0) {
    CHECKF(0, "cp_upload: %s", g_pb->err);
    cp_free(g_pb);
    g_pb = NULL;
  }
  return g_pb;
}

static void free_base(void) {
  cp_free(g_pb);
  g_pb = NULL;
}

/* Whether msg contains field as a whole identifier (not inside a longer name). */
static int names_field(const char *msg, const char *field) {
  size_t n = strlen(field);
  for (const char *p = msg; (p = strstr(p, field)) != NULL; p++) {
    int before = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
    int after = !(isalnum((unsigned char)p[n]) || p[n] == '_');
    if (before && after) return 1;
  }
  return 0;
}

/* Every element of every output buffer still holds PATTERN. */
static long untouched_violations(cp_problem *pb) {
  if (cp_read_outputs(pb) != 0) {
    CHECKF(0, "%s", pb->err);
    return -1;
  }
  long bad = 0;
  for (size_t i = 0; i < pb->out_elems; i++) bad += pb->out_raw[i] != PATTERN;
  for (size_t i = 0; i < pb->lse_elems; i++) bad += pb->lse_raw[i] != PATTERN;
  for (size_t i = 0; i < pb->weights_elems; i++) bad += pb->weights_raw[i] != PATTERN;
  return bad;
}

/* Calls forward with p; checks the status (want, or want2 when not -1), that the
 * last error names field (when non-NULL) and that the outputs are untouched. */
static void expect_reject(const clattn_params *p, clattn_status want, int want2, const char *field, const char *what,
                          const char *file, int line) {
  cp_problem *pb = base();
  if (!pb) return;
  clattn_context *ctx = ct_context();
  if (cp_fill_outputs(pb, PATTERN) != 0) {
    ct_check(0, file, line, "%s", pb->err);
    return;
  }
  cl_event done = NULL;
  clattn_status st = clattn_forward(ctx, p, 0, NULL, &done);
  clFinish(clattn_cl_queue(ctx));
  const char *msg = clattn_last_error(ctx);
  if (!msg) msg = "";
  int status_ok = st == want || (want2 >= 0 && st == (clattn_status)want2);
  ct_check(status_ok, file, line, "%s: status %s, expected %s%s%s (last error: %s)", what, clattn_status_string(st),
           clattn_status_string(want), want2 >= 0 ? " or " : "",
           want2 >= 0 ? clattn_status_string((clattn_status)want2) : "", msg);
  if (st == CLATTN_OK) {
    if (done) clReleaseEvent(done);
    return;
  }
  ct_check(done == NULL, file, line, "%s: a rejected call returned an event", what);
  if (field)
    ct_check(names_field(msg, field), file, line, "%s: last error does not name '%s': \"%s\"", what, field, msg);
  long bad = untouched_violations(pb);
  ct_check(bad == 0, file, line, "%s: %ld output elements changed by a rejected call", what, bad);
}

#define REJECT(p, want, field, what)         expect_reject((p), (want), -1, (field), (what), __FILE__, __LINE__)
#define REJECT2(p, want, want2, field, what) expect_reject((p), (want), (want2), (field), (what), __FILE__, __LINE__)

static void non_positive_dims_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p;
  const struct {
    const char *name;
    int *field;
  } cases[] = {{"batch", &p.batch},   {"q_heads", &p.q_heads},   {"kv_heads", &p.kv_heads},  {"q_len", &p.q_len},
               {"kv_len", &p.kv_len}, {"head_dim", &p.head_dim}, {"value_dim", &p.value_dim}};
  const int bad_values[] = {0, -1};
  for (int v = 0; v < 2; v++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      p = pb->params;
      *cases[c].field = bad_values[v];
      char what[64];
      snprintf(what, sizeof what, "%s = %d", cases[c].name, bad_values[v]);
      REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, cases[c].name, what);
    }
}

static void kv_heads_not_dividing_q_heads_is_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.kv_heads = 3; /* 4 % 3 != 0 */
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "kv_heads", "q_heads 4, kv_heads 3");
  p = pb->params;
  p.q_heads = 2;
  p.kv_heads = 4; /* more kv heads than q heads */
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "kv_heads", "q_heads 2, kv_heads 4");
}

static void null_required_buffers_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.q.buf = NULL;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "q", "q.buf NULL");
  p = pb->params;
  p.k.buf = NULL;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "k", "k.buf NULL");
  p = pb->params;
  p.v.buf = NULL;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "v", "v.buf NULL");
  p = pb->params;
  p.out.buf = NULL;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out.buf NULL");
}

static void window_below_minus_one_is_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.window_left = -2;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "window_left", "window_left -2");
  p = pb->params;
  p.window_right = INT_MIN;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "window_right", "window_right INT_MIN");
}

static void views_past_the_buffer_are_too_small(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p;
#define TOO_SMALL(field, edit)                             \
  do {                                                     \
    p = pb->params;                                        \
    edit;                                                  \
    REJECT(&p, CLATTN_ERR_BUFFER_TOO_SMALL, field, #edit); \
  } while (0)
  TOO_SMALL("q", p.q.offset += 1);
  TOO_SMALL("k", p.k.stride[2] += 1);
  TOO_SMALL("v", p.v.stride[0] *= 2);
  TOO_SMALL("out", p.out.offset = pb->out_elems);
  TOO_SMALL("mask", p.mask.offset += 1);
  TOO_SMALL("bias", p.bias.stride[3] = 2);
  TOO_SMALL("lse", p.lse.stride[0] += 1);
  TOO_SMALL("weights", p.weights.offset += 3);
  TOO_SMALL("entropy", p.entropy.offset = pb->diag_elems);
  TOO_SMALL("max_weight", p.max_weight.offset += 2);
  TOO_SMALL("argmax", p.argmax.stride[0] *= 2);
  TOO_SMALL("q", p.q.stride[3] = 1000);
#undef TOO_SMALL
  /* kv_lens holds one int32 for a batch of 3 */
  cl_int e;
  cl_mem small = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_ONLY, sizeof(int32_t), NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  p = pb->params;
  p.kv_lens = small;
  REJECT(&p, CLATTN_ERR_BUFFER_TOO_SMALL, "kv_lens", "kv_lens of 1 element, batch 3");
  clReleaseMemObject(small);
}

static void size_overflow_is_rejected_without_crash(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p;
  const clattn_status inv = CLATTN_ERR_INVALID_ARGUMENT, small = CLATTN_ERR_BUFFER_TOO_SMALL;
  /* (B-1) * stride wraps to 0 in size_t arithmetic */
  p = pb->params;
  p.q.stride[0] = (SIZE_MAX >> 1) + 1;
  REJECT2(&p, inv, small, "q", "q.stride[0] = 2^63 with batch 3 (wraps)");
  p = pb->params;
  p.k.offset = SIZE_MAX;
  REJECT2(&p, inv, small, "k", "k.offset = SIZE_MAX");
  p = pb->params;
  p.out.stride[2] = SIZE_MAX / 4;
  REJECT2(&p, inv, small, "out", "out.stride[2] = SIZE_MAX/4");
  p = pb->params;
  p.v.stride[3] = SIZE_MAX;
  REJECT2(&p, inv, small, "v", "v.stride[3] = SIZE_MAX");
  /* huge dimensions: every view overflows or exceeds its buffer */
  p = pb->params;
  p.q_len = INT_MAX;
  p.kv_len = INT_MAX;
  REJECT2(&p, inv, small, NULL, "q_len = kv_len = INT_MAX");
  p = pb->params;
  p.head_dim = INT_MAX;
  p.value_dim = INT_MAX;
  REJECT2(&p, inv, small, NULL, "head_dim = value_dim = INT_MAX");
  p = pb->params;
  p.batch = INT_MAX;
  p.q_heads = INT_MAX;
  p.kv_heads = 1;
  REJECT2(&p, inv, small, NULL, "batch = q_heads = INT_MAX");
}

static void weights_with_fused_are_unsupported(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.algo = CLATTN_ALGO_FUSED;
  REJECT(&p, CLATTN_ERR_UNSUPPORTED, NULL, "weights with FUSED");
}

/* A build without CLBlast (meson -Dclblast=disabled) refuses GEMM with a
 * message naming CLBlast and touches nothing; with CLBlast the call runs. */
static void gemm_runs_or_is_unsupported_without_clblast(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.algo = CLATTN_ALGO_GEMM;
  const int gemm = ca_gemm_available();
  REJECT(&p, gemm ? CLATTN_OK : CLATTN_ERR_UNSUPPORTED, gemm ? NULL : "CLBlast", "GEMM");
}

static void null_context_or_params_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  CHECK_STATUS(clattn_forward(NULL, &pb->params, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT);
  clattn_status st = clattn_forward(ct_context(), NULL, 0, NULL, NULL);
  CHECK_STATUS(st, CLATTN_ERR_INVALID_ARGUMENT);
  CHECK(clattn_last_error(NULL) != NULL);
  CHECK(clattn_create(NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  clattn_destroy(NULL); /* harmless */
}

/* 16-bit storage sizes q, k, v and out in 2-byte elements: the f32
 * buffers hold twice that, so views reaching past their 16-bit half still
 * fit, and views past the whole buffer do not. */
static void half_precision_views_are_sized_in_16_bits(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  const clattn_dtype types[] = {CLATTN_F16, CLATTN_BF16};
  for (int t = 0; t < 2; t++) {
    clattn_params p = pb->params;
    p.dtype = types[t];
    p.weights.buf = NULL;         /* only what validation reads: views against buffer sizes */
    p.out.offset = pb->out_elems; /* past the 16-bit half of out's f32-sized buffer, inside the buffer */
    p.lse.buf = p.entropy.buf = p.max_weight.buf = p.argmax.buf = NULL;
    CHECKF(ca_check_forward(ct_context(), &p, NULL) == CLATTN_OK, "%s: %s", t ? "bf16" : "f16",
           clattn_last_error(ct_context()));
    p.out.offset = 2 * pb->out_elems;
    REJECT(&p, CLATTN_ERR_BUFFER_TOO_SMALL, "out", "16-bit out view past its buffer");
  }
  clattn_params p = pb->params;
  p.dtype = (clattn_dtype)7;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "dtype", "dtype 7");
  p = pb->params;
  p.softcap = -1.0f;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "softcap", "softcap -1");
  p.softcap = NAN;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "softcap", "softcap NaN");
  p = pb->params;
  p.score = (clattn_score)5;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "score", "score 5");
}

static void out_of_range_enums_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.algo = (clattn_algo)99;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "algo", "algo 99");
  p = pb->params;
  p.empty_rows = (clattn_empty_rows)7;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "empty_rows", "empty_rows 7");
  p = pb->params;
  p.dtype = (clattn_dtype)42;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "dtype", "dtype 42");
}

static void broadcast_output_view_is_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_params p = pb->params;
  p.out.stride[2] = 0; /* every row would write the same elements */
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out.stride[2] = 0");
  /* rows closer than a row is wide: neighbouring rows share elements */
  p = pb->params;
  p.out.stride[2] = (size_t)p.value_dim - 1;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out rows overlapping");
  p = pb->params;
  p.lse.stride[1] = 1; /* heads 1 apart while each head spans q_len rows */
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "lse", "lse heads overlapping");
  /* transposed but disjoint ([B,S,H,D]-like strides) is fine */
  p = pb->params;
  const size_t d = (size_t)p.value_dim, h = (size_t)p.q_heads, m = (size_t)p.q_len;
  p.out.stride[1] = d;
  p.out.stride[2] = h * d;
  p.out.stride[0] = m * h * d;
  CHECKF(ca_check_forward(ct_context(), &p, NULL) == CLATTN_OK, "transposed out view: %s", clattn_last_error(ct_context()));
}

static cl_mem floats_buffer(size_t n) {
  cl_int e;
  cl_mem m = clCreateBuffer(clattn_cl_context(ct_context()), CL_MEM_READ_WRITE, n * sizeof(float), NULL, &e);
  CHECKF(e == CL_SUCCESS, "clCreateBuffer(%zu floats): %d", n, e);
  return e == CL_SUCCESS ? m : NULL;
}

/* Two different outputs of one call may not share bytes: lse inside out,
 * entropy on max_weight, a one-element overlap, argmax inside weights, out
 * over weights' tail, and the same on FUSED. Each is refused before
 * anything is enqueued, naming the view; outputs side by side in one buffer
 * are fine. (Merge's out / out_lse: test_fused.) */
static void outputs_overlapping_each_other_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  const size_t rows = pb->diag_count; /* dense [B, Hq, M] views, no padding */
  clattn_params p = pb->params;
  p.lse.buf = p.out.buf; /* lse's 96 floats inside out's 768 */
  p.lse.offset = 100;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "lse", "lse inside out");
  p = pb->params;
  p.entropy.buf = p.max_weight.buf;
  p.entropy.offset = p.max_weight.offset;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "entropy", "entropy == max_weight");
  cl_mem two = floats_buffer(2 * rows);
  REQUIRE(two);
  p = pb->params;
  p.entropy.buf = p.max_weight.buf = two;
  p.entropy.offset = 0;
  p.max_weight.offset = rows - 1; /* starts on entropy's last element */
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "max_weight", "max_weight on entropy's last element");
  p.max_weight.offset = rows; /* side by side: accepted */
  CHECKF(ca_check_forward(ct_context(), &p, NULL) == CLATTN_OK, "entropy and max_weight side by side: %s",
         clattn_last_error(ct_context()));
  clReleaseMemObject(two);
  p = pb->params;
  p.argmax.buf = p.weights.buf; /* int32 argmax inside the f32 weights */
  p.argmax.offset = 7;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "argmax", "argmax inside weights");
  cl_mem shared = floats_buffer(pb->weights_elems + pb->out_elems / 2);
  REQUIRE(shared);
  p = pb->params;
  p.weights.buf = p.out.buf = shared; /* out's first half over weights' second half */
  p.weights.offset = 0;
  p.out.offset = pb->weights_elems - pb->out_elems / 2;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "weights", "out over weights' tail");
  clReleaseMemObject(shared);
  /* FUSED (no weights): refused there too */
  p = pb->params;
  p.weights.buf = NULL;
  p.algo = CLATTN_ALGO_FUSED;
  p.lse.buf = p.out.buf;
  p.lse.offset = 0;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "lse", "FUSED: lse at out's start");
}

/* Inputs the kernels could be made to write: the problem's q, k, v, mask,
 * bias and kv_lens copied into CL_MEM_READ_WRITE buffers (the kit's are
 * read-only, which is refused for an output before any sharing is seen). */
typedef struct {
  clattn_params p;
  cl_mem bufs[6];
} rw_inputs;

static void rw_free(rw_inputs *rw) {
  for (int i = 0; i < 6; i++)
    if (rw->bufs[i]) clReleaseMemObject(rw->bufs[i]);
}

static int rw_make(cp_problem *pb, rw_inputs *rw) {
  memset(rw, 0, sizeof *rw);
  rw->p = pb->params;
  const struct {
    cl_mem *view_buf;
    const void *host;
    size_t bytes;
  } in[] = {
      {&rw->p.q.buf, pb->q, pb->q_elems * sizeof(float)},
      {&rw->p.k.buf, pb->k, pb->k_elems * sizeof(float)},
      {&rw->p.v.buf, pb->v, pb->v_elems * sizeof(float)},
      {&rw->p.mask.buf, pb->mask, pb->mask_elems},
      {&rw->p.bias.buf, pb->bias, pb->bias_elems * sizeof(float)},
      {&rw->p.kv_lens, pb->kv_lens, (size_t)pb->params.batch * sizeof(int32_t)},
  };
  for (int i = 0; i < 6; i++)
    if (!(rw->bufs[i] = *in[i].view_buf = kc_rw_copy(pb, in[i].host, in[i].bytes))) return rw_free(rw), -1;
  return 0;
}

/* A forward call refused because output `a` shares bytes with view `b`:
 * INVALID_ARGUMENT naming both, the problem's outputs untouched, and every
 * input buffer (and `also`, when given) byte for byte as it was. */
static void refuse_sharing(const rw_inputs *rw, const clattn_params *p, const char *a, const char *b, cl_mem also,
                           const char *what) {
  const cl_mem kept[] = {rw->bufs[0], rw->bufs[1], rw->bufs[2], rw->bufs[3], rw->bufs[4], rw->bufs[5], also};
  enum { N_KEPT = sizeof kept / sizeof kept[0] };
  unsigned char *before[N_KEPT] = {NULL};
  size_t n[N_KEPT] = {0};
  for (int i = 0; i < N_KEPT; i++)
    if (kept[i]) before[i] = ct_mem_bytes(kept[i], &n[i]);
  REJECT(p, CLATTN_ERR_INVALID_ARGUMENT, a, what);
  const char *msg = clattn_last_error(ct_context());
  CHECKF(names_field(msg, b) && strstr(msg, "share"), "%s: the message does not say %s shares bytes with %s: \"%s\"",
         what, a, b, msg);
  for (int i = 0; i < N_KEPT; i++) {
    size_t m = 0;
    unsigned char *after = before[i] ? ct_mem_bytes(kept[i], &m) : NULL;
    CHECKF(!before[i] || (after && m == n[i] && memcmp(before[i], after, m) == 0),
           "%s: a refused call changed a buffer", what);
    free(before[i]);
    free(after);
  }
}

static cl_mem sub_buffer(cl_mem parent, size_t origin, size_t size) {
  cl_buffer_region r = {origin, size};
  cl_int e;
  cl_mem m = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
  CHECKF(e == CL_SUCCESS, "clCreateSubBuffer(%zu, %zu): %d", origin, size, e);
  return e == CL_SUCCESS ? m : NULL;
}

/* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: where a sub-buffer may start. */
static size_t sub_buffer_align(void) {
  cl_uint bits = 0;
  clGetDeviceInfo(clattn_cl_device(ct_context()), CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL);
  return bits >= 8 ? bits / 8 : 128;
}

/* An output may share no byte with any input of its call: out on q, lse in
 * k, the uchar mask read from the weights' bytes, entropy in bias, kv_lens
 * from argmax's ints, max_weight on q's last element (FUSED); through a
 * sub-buffer of q's buffer; and through two buffers over one host array
 * (CL_MEM_USE_HOST_PTR). Each is refused before anything is enqueued, and
 * no buffer changes. */
static void outputs_sharing_bytes_with_inputs_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  rw_inputs rw;
  REQUIRE(rw_make(pb, &rw) == 0);
  clattn_params p = rw.p;
  p.out.buf = p.q.buf, p.out.offset = p.q.offset;
  refuse_sharing(&rw, &p, "out", "q", NULL, "out on q");
  p = rw.p;
  p.lse.buf = p.k.buf, p.lse.offset = 5;
  refuse_sharing(&rw, &p, "lse", "k", NULL, "lse inside k");
  p = rw.p;
  p.mask.buf = p.weights.buf; /* the mask's bytes read from the weights' buffer */
  refuse_sharing(&rw, &p, "weights", "mask", NULL, "mask from the weights' bytes");
  p = rw.p;
  p.entropy.buf = p.bias.buf, p.entropy.offset = 3;
  refuse_sharing(&rw, &p, "entropy", "bias", NULL, "entropy inside bias");
  p = rw.p;
  p.kv_lens = p.argmax.buf;
  refuse_sharing(&rw, &p, "argmax", "kv_lens", NULL, "kv_lens read from argmax's ints");
  /* FUSED: max_weight's last element on q's first, in one buffer */
  p = rw.p;
  p.algo = CLATTN_ALGO_FUSED, p.weights.buf = NULL;
  p.max_weight.offset = 0;
  const size_t last = cp_index(&p.max_weight, p.batch - 1, p.q_heads - 1, p.q_len - 1, 0);
  cl_int e;
  cl_mem shared = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE, (last + pb->q_elems) * sizeof(float), NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  p.max_weight.buf = p.q.buf = shared;
  p.q.offset += last;
  refuse_sharing(&rw, &p, "max_weight", "q", shared, "FUSED: max_weight's last element on q's first");
  clReleaseMemObject(shared);

  /* a sub-buffer of q's buffer, starting inside q's view */
  const size_t align = sub_buffer_align(), q_bytes = pb->q_elems * sizeof(float);
  cl_mem sub = align < q_bytes / 2 ? sub_buffer(rw.p.q.buf, align, q_bytes - align) : NULL;
  if (sub) {
    p = rw.p;
    p.out.buf = sub, p.out.offset = 0;
    refuse_sharing(&rw, &p, "out", "q", sub, "out through a sub-buffer of q's");
    /* the bytes named are the parent's: out's first lies at the sub-buffer's origin */
    char at[64];
    snprintf(at, sizeof at, "out: bytes [%zu, ", align);
    const char *msg = clattn_last_error(ct_context());
    CHECKF(strstr(msg, at) && strstr(msg, "of the parent buffer"), "out through a sub-buffer: \"%s\" (expected \"%s\")",
           msg, at);
    clReleaseMemObject(sub);
  }
  /* two cl_mems over one host array */
  float *host = calloc(pb->q_elems, sizeof(float));
  REQUIRE(host);
  cl_int e1, e2;
  const cl_context cc = clattn_cl_context(ct_context());
  cl_mem qa = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, q_bytes, host, &e1);
  cl_mem qb = clCreateBuffer(cc, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, q_bytes / 2, host + pb->q_elems / 2, &e2);
  if (CHECK(e1 == CL_SUCCESS && e2 == CL_SUCCESS)) {
    p = rw.p;
    p.q.buf = qa;
    p.lse.buf = qb, p.lse.offset = 0; /* the second half of q's host memory */
    refuse_sharing(&rw, &p, "lse", "q", NULL, "lse and q over one host array");
  }
  if (qa) clReleaseMemObject(qa);
  if (qb) clReleaseMemObject(qb);
  free(host);
  rw_free(&rw);
}

/* Views that share no byte are fine however they interleave, and the call
 * is right: q and out in one buffer row by row ([dk of q | dv of out] per
 * row), and q and out in two sub-buffers of one parent, side by side. Each
 * output against the fp64 reference, every q byte as it was. */
static void interleaved_views_sharing_no_byte_are_right(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  REQUIRE(cp_reference(pb) == 0);
  clattn_context *ctx = ct_context();
  const clattn_params *bp = &pb->params;
  const int B = bp->batch, H = bp->q_heads, M = bp->q_len, dk = bp->head_dim, dv = bp->value_dim;
  const size_t row = (size_t)dk + dv, n = (size_t)B * H * M * row, n_out = (size_t)B * H * M * dv;
  float *both = malloc(n * sizeof *both), *got = malloc(n * sizeof *got), *dense = malloc(n_out * sizeof *dense);
  REQUIRE(both && got && dense);
  clattn_params p = *bp;
  p.q = (clattn_tensor){NULL, 0, {(size_t)H * M * row, (size_t)M * row, row, 1}};
  p.out = (clattn_tensor){NULL, (size_t)dk, {(size_t)H * M * row, (size_t)M * row, row, 1}};
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < M; i++)
        for (size_t c = 0; c < row; c++)
          both[cp_index(&p.q, b, h, i, 0) + c] = c < (size_t)dk ? pb->q[cp_index(&bp->q, b, h, i, (int)c)] : NAN;
  cl_int e;
  cl_mem buf = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *both, both, &e);
  REQUIRE(e == CL_SUCCESS);
  p.q.buf = p.out.buf = buf;
  for (size_t a = 0; a < KC_NALGOS; a++) {
    p.algo = kc_algos[a];
    if (kc_algo_filtered_out(p.algo) || kc_algo_optional(p.algo, &p)) continue;
    CHECK(clEnqueueWriteBuffer(pb->queue, buf, CL_TRUE, 0, n * sizeof *both, both, 0, NULL, NULL) == CL_SUCCESS);
    const clattn_status st = clattn_forward(ctx, &p, 0, NULL, NULL);
    CHECKF(st == CLATTN_OK, "%s: q and out interleaved: %s", clattn_algo_name(p.algo), clattn_last_error(ctx));
    CHECK(clEnqueueReadBuffer(pb->queue, buf, CL_TRUE, 0, n * sizeof *got, got, 0, NULL, NULL) == CL_SUCCESS);
    long nan = 0, q_changed = 0;
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < M; i++) {
          for (int c = 0; c < dv; c++) {
            const float x = got[cp_index(&p.out, b, h, i, c)];
            dense[(((size_t)b * H + h) * M + i) * dv + c] = x;
            nan += isnan(x);
          }
          for (int c = 0; c < dk; c++)
            q_changed += memcmp(&got[cp_index(&p.q, b, h, i, c)], &both[cp_index(&p.q, b, h, i, c)], 4) != 0;
        }
    const double err = cp_rel_err(dense, pb->ref_out, n_out);
    CHECKF(st != CLATTN_OK || (err <= 1e-5 && nan == 0 && q_changed == 0),
           "%s: q and out interleaved: out error %.3g, %ld NaN, %ld q elements changed", clattn_algo_name(p.algo), err,
           nan, q_changed);
  }
  clReleaseMemObject(buf);

  /* two sub-buffers of one parent, q's bytes then out's */
  const size_t align = sub_buffer_align(), q_bytes = pb->q_elems * sizeof(float),
               out_at = (q_bytes + align - 1) / align * align, out_bytes = pb->out_elems * sizeof(float);
  cl_mem parent = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE, out_at + out_bytes, NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  cl_mem sq = sub_buffer(parent, 0, q_bytes), so = sub_buffer(parent, out_at, out_bytes);
  if (sq && so && CHECK(clEnqueueWriteBuffer(pb->queue, sq, CL_TRUE, 0, q_bytes, pb->q, 0, NULL, NULL) == CL_SUCCESS)) {
    p = *bp;
    p.q.buf = sq, p.out.buf = so;
    const clattn_status st = clattn_forward(ctx, &p, 0, NULL, NULL);
    CHECKF(st == CLATTN_OK, "q and out in sub-buffers of one parent: %s", clattn_last_error(ctx));
    float *raw = malloc(out_bytes);
    REQUIRE(raw);
    CHECK(clEnqueueReadBuffer(pb->queue, so, CL_TRUE, 0, out_bytes, raw, 0, NULL, NULL) == CL_SUCCESS);
    long nan = 0;
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < M; i++)
          for (int c = 0; c < dv; c++)
            nan += isnan(dense[(((size_t)b * H + h) * M + i) * dv + c] = raw[cp_index(&p.out, b, h, i, c)]);
    const double err = cp_rel_err(dense, pb->ref_out, n_out);
    CHECKF(st != CLATTN_OK || (err <= 1e-5 && nan == 0), "sub-buffers: out error %.3g, %ld NaN", err, nan);
    free(raw);
  }
  if (sq) clReleaseMemObject(sq);
  if (so) clReleaseMemObject(so);
  clReleaseMemObject(parent);
  free(both), free(got), free(dense);
}

/* clattn_prepare checks the fields that pick a call's programs (dtype,
 * kv_dtype, head_dim, value_dim) exactly as the forward does: each shape
 * the forward refuses, prepare refuses with the forward's message, after
 * "clattn_prepare: shapes[i]: " naming which, and builds nothing. */
static void prepare_and_forward_refuse_the_same_shapes_with_one_message(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_context *ctx = ct_context();
  clattn_params p;
  const struct {
    const char *what;
    int *field;
    int value;
    clattn_dtype kv_dtype;
  } cases[] = {
      {"Q8_0 with head_dim 33", &p.head_dim, 33, CLATTN_Q8_0},
      {"Q8_0 with value_dim 40", &p.value_dim, 40, CLATTN_Q8_0},
      {"Q8_0 with head_dim 16", &p.head_dim, 16, CLATTN_Q8_0},
      {"head_dim 0", &p.head_dim, 0, CLATTN_DTYPE_SAME},
      {"value_dim -3", &p.value_dim, -3, CLATTN_DTYPE_SAME},
      {"dtype Q8_0", (int *)&p.dtype, CLATTN_Q8_0, CLATTN_Q8_0},
      {"dtype INT8", (int *)&p.dtype, CLATTN_INT8, CLATTN_DTYPE_SAME},
      {"dtype 9", (int *)&p.dtype, 9, CLATTN_DTYPE_SAME},
      {"kv_dtype 10", (int *)&p.kv_dtype, CLATTN_IQ4_NL + 1, CLATTN_DTYPE_SAME},
      {"v_dtype 10", (int *)&p.v_dtype, CLATTN_IQ4_NL + 1, CLATTN_DTYPE_SAME},
      {"Q4_0 with head_dim 48", &p.head_dim, 48, CLATTN_Q4_0},
      {"IQ4_NL with value_dim 40", &p.value_dim, 40, CLATTN_IQ4_NL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    p = pb->params;
    p.head_dim = p.value_dim = 64;
    p.kv_dtype = cases[i].kv_dtype;
    *cases[i].field = cases[i].value;
    REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, NULL, cases[i].what);
    char forward_msg[512];
    snprintf(forward_msg, sizeof forward_msg, "%s", clattn_last_error(ctx));
    int src0, cache0, src, cache;
    ca_cache_counts(ctx, &src0, &cache0);
    const clattn_status st = clattn_prepare(ctx, &p, 1);
    ca_cache_counts(ctx, &src, &cache);
    char want[600];
    snprintf(want, sizeof want, "clattn_prepare: shapes[0]: %s", forward_msg);
    const char *msg = clattn_last_error(ctx);
    CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT && strcmp(msg, want) == 0,
           "%s: prepare returned %s with \"%s\"; the forward refused it with \"%s\"", cases[i].what,
           clattn_status_string(st), msg, forward_msg);
    CHECKF(src == src0 && cache == cache0, "%s: prepare built %d programs for a refused shape", cases[i].what,
           src + cache - src0 - cache0);
  }
}

/* A merge call that must be rejected naming field, with nothing written. */
static void merge_reject(cp_problem *pb, const clattn_merge_params *m, const char *field, const char *what) {
  clattn_context *ctx = ct_context();
  CHECK(cp_fill_outputs(pb, PATTERN) == 0);
  cl_event done = NULL;
  clattn_status st = clattn_merge_states(ctx, m, 0, NULL, &done);
  clFinish(clattn_cl_queue(ctx));
  const char *msg = clattn_last_error(ctx);
  CHECKF(st == CLATTN_ERR_INVALID_ARGUMENT && names_field(msg, field) && !done, "%s: status %s, last error \"%s\"",
         what, clattn_status_string(st), msg);
  if (done) clReleaseEvent(done);
  CHECKF(untouched_violations(pb) == 0, "%s: a rejected merge changed an output", what);
}

/* Merge: out and out_lse may share no byte with any state (o and lse over
 * all n_states, as far as o_state_stride reaches) nor with each other. */
static void merge_outputs_sharing_bytes_with_states_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  const clattn_params *bp = &pb->params;
  const size_t rows = (size_t)bp->batch * bp->q_heads * bp->q_len, o_elems = rows * (size_t)bp->value_dim;
  cl_int e;
  cl_mem states = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE, 3 * (o_elems + rows) * sizeof(float), NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  const size_t H = (size_t)bp->q_heads, M = (size_t)bp->q_len, dv = (size_t)bp->value_dim;
  clattn_merge_params mp;
  memset(&mp, 0, sizeof mp);
  mp.n_states = 3;
  mp.batch = bp->batch, mp.heads = bp->q_heads, mp.q_len = bp->q_len, mp.value_dim = bp->value_dim;
  /* state s: o at s * (o + lse), its lse right after it */
  mp.o = (clattn_tensor){states, 0, {H * M * dv, M * dv, dv, 1}};
  mp.lse = (clattn_tensor){states, o_elems, {H * M, M, 1, 0}};
  mp.o_state_stride = mp.lse_state_stride = o_elems + rows;
  mp.out = bp->out;
  mp.out_lse = bp->lse;
  mp.empty_rows = CLATTN_EMPTY_ZERO;
  clattn_merge_params m = mp;
  m.out = mp.o;
  merge_reject(pb, &m, "out", "merge out on state 0's o");
  m = mp;
  m.out = mp.o, m.out.offset = 2 * mp.o_state_stride;
  merge_reject(pb, &m, "out", "merge out on the last state's o");
  m = mp;
  m.out_lse = mp.lse, m.out_lse.offset += mp.lse_state_stride;
  merge_reject(pb, &m, "out_lse", "merge out_lse on state 1's lse");
  m = mp;
  m.out_lse.buf = states, m.out_lse.offset = 7;
  merge_reject(pb, &m, "out_lse", "merge out_lse inside state 0's o");
  m = mp;
  m.out_lse.buf = m.out.buf, m.out_lse.offset = m.out.offset + 3;
  merge_reject(pb, &m, "out_lse", "merge out_lse inside out");
  /* a state stride whose last state lies past the address range (in
   * elements it fits, in bytes it does not): the stride is named */
  m = mp;
  m.o_state_stride = SIZE_MAX / 8;
  merge_reject(pb, &m, "o_state_stride", "merge o_state_stride past the address range");
  m = mp;
  m.lse_state_stride = SIZE_MAX / 8;
  merge_reject(pb, &m, "lse_state_stride", "merge lse_state_stride past the address range");
  /* past the last state in the same buffer: shares nothing */
  cl_mem more =
      clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE, (3 * (o_elems + rows) + o_elems) * sizeof(float), NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  m = mp;
  m.o.buf = m.lse.buf = m.out.buf = more;
  m.out.offset = 3 * mp.o_state_stride;
  m.out_lse.buf = NULL;
  CHECKF(ca_check_merge(ct_context(), &m) == CLATTN_OK, "merge out past the last state: %s",
         clattn_last_error(ct_context()));
  clReleaseMemObject(more);
  clReleaseMemObject(states);
}

/* Every view must be a buffer of the clattn context's cl_context that the
 * kernels may read (inputs) or write (outputs): images, buffers of another
 * context, CL_MEM_READ_ONLY outputs and CL_MEM_WRITE_ONLY inputs are
 * rejected before anything is enqueued, for forward and merge_states. */
static void unusable_cl_mem_objects_are_invalid(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  clattn_context *ctx = ct_context();
  cl_context cc = clattn_cl_context(ctx);
  cl_device_id dev = clattn_cl_device(ctx);
  const size_t out_bytes = pb->out_elems * sizeof(float), q_bytes = pb->q_elems * sizeof(float);
  cl_int e;
  cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
  REQUIRE(e == CL_SUCCESS);
  cl_mem foreign_out = clCreateBuffer(other, CL_MEM_READ_WRITE, out_bytes, NULL, &e);
  cl_mem foreign_q = clCreateBuffer(other, CL_MEM_READ_WRITE, q_bytes, NULL, &e);
  cl_mem read_only = clCreateBuffer(cc, CL_MEM_READ_ONLY, out_bytes, NULL, &e);
  cl_mem write_only = clCreateBuffer(cc, CL_MEM_WRITE_ONLY, q_bytes, NULL, &e);
  cl_mem lse_read_only = clCreateBuffer(cc, CL_MEM_READ_ONLY, pb->lse_elems * sizeof(float), NULL, &e);
  if (!CHECK(foreign_out && foreign_q && read_only && write_only && lse_read_only)) goto out;
  /* the read-only output holds PATTERN: a rejected call leaves it so */
  float *pattern = malloc(out_bytes);
  REQUIRE(pattern);
  for (size_t i = 0; i < pb->out_elems; i++) pattern[i] = PATTERN;
  CHECK(clEnqueueWriteBuffer(clattn_cl_queue(ctx), read_only, CL_TRUE, 0, out_bytes, pattern, 0, NULL, NULL) ==
        CL_SUCCESS);

  clattn_params p = pb->params;
  p.out.buf = read_only;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out created CL_MEM_READ_ONLY");
  p = pb->params;
  p.lse.buf = lse_read_only;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "lse", "lse created CL_MEM_READ_ONLY");
  p = pb->params;
  p.out.buf = foreign_out;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out from another cl_context");
  p = pb->params;
  p.q.buf = foreign_q;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "q", "q from another cl_context");
  p = pb->params;
  p.q.buf = write_only;
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "q", "q created CL_MEM_WRITE_ONLY");
  /* a handle of another kind where a cl_mem belongs: refused, not dereferenced as a buffer */
  p = pb->params;
  p.q.buf = (cl_mem)(void *)clattn_cl_queue(ctx);
  REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "q", "q is a cl_command_queue");

  cl_bool images = CL_FALSE;
  clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
  if (images) {
    /* RGBA float texels, 16 bytes: as many bytes as the views need */
    const cl_image_format fmt = {CL_RGBA, CL_FLOAT};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = q_bytes > out_bytes ? q_bytes / 16 + 1 : out_bytes / 16 + 1;
    desc.image_height = 2;
    cl_mem image = clCreateImage(cc, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &e);
    if (CHECKF(e == CL_SUCCESS, "clCreateImage: %d", e)) {
      p = pb->params;
      p.out.buf = image;
      REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "out", "out is a 2-D image");
      p = pb->params;
      p.k.buf = image;
      REJECT(&p, CLATTN_ERR_INVALID_ARGUMENT, "k", "k is a 2-D image");
      clReleaseMemObject(image);
    }
  } else {
    printf("  (no image support: images not tried)\n");
  }

  /* merge_states: one state, the problem's out and lse as its o and lse */
  clattn_merge_params mp;
  memset(&mp, 0, sizeof mp);
  mp.n_states = 1;
  mp.batch = pb->params.batch;
  mp.heads = pb->params.q_heads;
  mp.q_len = pb->params.q_len;
  mp.value_dim = pb->params.value_dim;
  mp.o = pb->params.out;
  mp.lse = pb->params.lse;
  mp.out = pb->params.out;
  mp.empty_rows = CLATTN_EMPTY_ZERO;
  clattn_merge_params m = mp;
  m.out.buf = read_only;
  merge_reject(pb, &m, "out", "merge out created CL_MEM_READ_ONLY");
  m = mp;
  m.out.buf = foreign_out;
  merge_reject(pb, &m, "out", "merge out from another cl_context");
  m = mp;
  m.o.buf = foreign_out;
  merge_reject(pb, &m, "o", "merge o from another cl_context");
  m = mp;
  m.out_lse = pb->params.lse;
  m.out_lse.buf = lse_read_only;
  merge_reject(pb, &m, "out_lse", "merge out_lse created CL_MEM_READ_ONLY");

  float *back = calloc(pb->out_elems, sizeof(float));
  if (CHECK(back) && CHECK(clEnqueueReadBuffer(clattn_cl_queue(ctx), read_only, CL_TRUE, 0, out_bytes, back, 0, NULL,
                                               NULL) == CL_SUCCESS))
    CHECKF(!memcmp(back, pattern, out_bytes), "the CL_MEM_READ_ONLY output buffer was written");
  free(back);
  free(pattern);
out:
  if (foreign_out) clReleaseMemObject(foreign_out);
  if (foreign_q) clReleaseMemObject(foreign_q);
  if (read_only) clReleaseMemObject(read_only);
  if (write_only) clReleaseMemObject(write_only);
  if (lse_read_only) clReleaseMemObject(lse_read_only);
  clReleaseContext(other);
}

static void valid_call_after_rejections_still_works(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  for (size_t a = 0; a < KC_NALGOS; a++) {
    if (kc_algo_optional(kc_algos[a], &pb->params)) continue; /* weights requested: staged paths only */
    KC_RUN_OK(pb, kc_algos[a], 1e-5);
  }
  /* the default params alone (no buffers) are rejected, not crashed on */
  clattn_params d = clattn_params_default();
  CHECK(isnan(d.scale) && d.window_left == -1 && d.window_right == -1 && d.algo == CLATTN_ALGO_AUTO &&
        d.empty_rows == CLATTN_EMPTY_ZERO && !d.q.buf);
  CHECK(clattn_forward(ct_context(), &d, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
}

static void *route_in_new_thread(void *out) {
  snprintf(out, 64, "%s", clattn_last_route());
  return NULL;
}

/* clattn_last_route names the algorithm and the kernels a call enqueued; a
 * rejected call leaves it as it was; it belongs to the calling thread. */
static void last_route_names_what_ran(void) {
  cp_problem *pb = base();
  REQUIRE(pb);
  KC_RUN_OK(pb, CLATTN_ALGO_STAGED, 1e-5);
  const char *route = clattn_last_route();
  CHECKF(!strcmp(route, "staged: qk_score, softmax_rows, mix_values"), "staged call's route \"%s\"", route);
  clattn_params bad = pb->params;
  bad.head_dim = 0;
  CHECK(clattn_forward(ct_context(), &bad, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT);
  CHECKF(!strncmp(clattn_last_route(), "staged:", 7), "a rejected call changed the route to \"%s\"",
         clattn_last_route());
  char other[64] = "unset";
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, route_in_new_thread, other) == 0);
  pthread_join(t, NULL);
  CHECKF(other[0] == 0, "a new thread's route is \"%s\", not empty", other);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(non_positive_dims_are_invalid),
      CT_TEST(kv_heads_not_dividing_q_heads_is_invalid),
      CT_TEST(null_required_buffers_are_invalid),
      CT_TEST(window_below_minus_one_is_invalid),
      CT_TEST(views_past_the_buffer_are_too_small),
      CT_TEST(size_overflow_is_rejected_without_crash),
      CT_TEST(weights_with_fused_are_unsupported),
      CT_TEST(gemm_runs_or_is_unsupported_without_clblast),
      CT_TEST(null_context_or_params_are_invalid),
      CT_TEST(half_precision_views_are_sized_in_16_bits),
      CT_TEST(out_of_range_enums_are_invalid),
      CT_TEST(prepare_and_forward_refuse_the_same_shapes_with_one_message),
      CT_TEST(broadcast_output_view_is_invalid),
      CT_TEST(outputs_overlapping_each_other_are_invalid),
      CT_TEST(outputs_sharing_bytes_with_inputs_are_invalid),
      CT_TEST(interleaved_views_sharing_no_byte_are_right),
      CT_TEST(merge_outputs_sharing_bytes_with_states_are_invalid),
      CT_TEST(unusable_cl_mem_objects_are_invalid),
      CT_TEST(valid_call_after_rejections_still_works),
      CT_TEST(last_route_names_what_ran),
  };
  ct_context();
  ct_cleanup = free_base;
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
