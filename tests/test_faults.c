/*
 * Fault injection: every OpenCL call clattn makes (and CLBlast's, which the
 * executable's wrappers see too) is made to fail in turn, through the shim
 * in cl_shim.c. After each injected failure:
 *   - the call returns a status from the enum that fits the error
 *     (CL_OUT_OF_RESOURCES / CL_OUT_OF_HOST_MEMORY /
 *     CL_MEM_OBJECT_ALLOCATION_FAILURE -> CLATTN_ERR_OUT_OF_MEMORY, others
 *     -> CLATTN_ERR_OPENCL), with clattn_last_error naming the failed call
 *     or the error, and no event handed out;
 *   - after clFinish, the objects alive through the shim (buffers,
 *     kernels, programs, events, queues, contexts) are those alive before;
 *   - the next call without a fault succeeds and matches the fp64 reference.
 * A fault clattn may absorb (best-effort queries, the binary cache) must
 * leave a correct result instead.
 *
 * Also: context creation with a fault at each call (own objects and
 * embedded mode), and out-of-memory statuses (an allocation past the
 * device's largest, an injected CL_MEM_OBJECT_ALLOCATION_FAILURE).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cl_shim.h"
#include "api/api.h" /* the context's pools: trimmed, counted */
#include "kit_checks.h"
#include "reference_backward.h"

static char g_cache_dir[256];
static clattn_context *fx; /* the fault sweep's context (also ct_ctx) */

/* ---------- totals and call sites ---------- */

enum { MAX_SITES = 1024 };
static struct {
  const char *fn;
  void *caller;
  int in_main;
  long hits;
} g_sites[MAX_SITES];
static int g_n_sites;
static char *g_msgs[MAX_SITES]; /* distinct "what failed" heads of clattn_last_error */
static int g_n_msgs;
static long g_spared;
static long g_injected, g_failed_cleanly, g_absorbed, g_leaks, g_in_main, g_in_lib;
static int g_leak_reports;

static void note_site(const shim_fault *f) {
  for (int i = 0; i < g_n_sites; i++)
    if (g_sites[i].fn == f->fn && g_sites[i].caller == f->caller) {
      g_sites[i].hits++;
      return;
    }
  if (g_n_sites < MAX_SITES) {
    g_sites[g_n_sites].fn = f->fn;
    g_sites[g_n_sites].caller = f->caller;
    g_sites[g_n_sites].in_main = f->in_main;
    g_sites[g_n_sites].hits = 1;
    g_n_sites++;
  }
}

/* The message up to " failed" (or its first 80 characters): what failed. */
static void note_message(const char *msg) {
  char head[128];
  const char *end = strstr(msg, " failed");
  size_t n = end ? (size_t)(end - msg) : strlen(msg);
  if (n > 80) n = 80;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) { /* "argument 3" and "argument 4" are one site */
    if (msg[i] >= '0' && msg[i] <= '9') {
      if (k == 0 || head[k - 1] != '#') head[k++] = '#';
    } else {
      head[k++] = msg[i];
    }
  }
  head[k] = '\0';
  for (int i = 0; i < g_n_msgs; i++)
    if (strcmp(g_msgs[i], head) == 0) return;
  if (g_n_msgs < MAX_SITES) g_msgs[g_n_msgs++] = strdup(head);
}

static const char *cl_name(cl_int c) { return cp_cl_error_name(c); }

static int is_oom_code(cl_int c) {
  return c == CL_OUT_OF_RESOURCES || c == CL_OUT_OF_HOST_MEMORY || c == CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

/* Faults clattn may absorb by design: best-effort queries (device strings,
 * the cache key's hash), the binary cache (load falls back to a source
 * build, store is best effort), keeping a cl_mem's facts (asked again
 * next time) and recording a plan's command buffer (the plain path runs). */
static int absorbable(const char *fn) {
  static const char *ok[] = {"clGetPlatformInfo",     "clGetDeviceInfo",           "clGetProgramInfo",
                             "clGetProgramBuildInfo", "clCreateProgramWithBinary", "clBuildProgram",
                             "clGetDeviceIDs",        "clSetMemObjectDestructorCallback",
                             /* a plan whose command buffer cannot be recorded enqueues plainly */
                             "clCreateCommandBufferKHR", "clCommandNDRangeKernelKHR", "clFinalizeCommandBufferKHR",
                             "clGetCommandQueueInfo"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (strcmp(fn, ok[i]) == 0) return 1;
  return 0;
}

/* The error a fault at call n injects: the function's own out-of-memory
 * code mostly, sometimes another out-of-memory code or a non-memory error. */
static cl_int code_for(long n) {
  switch (n % 4) {
    case 1: return CL_OUT_OF_HOST_MEMORY;
    case 3: return CL_INVALID_OPERATION;
    default: return 0; /* the shim's per-function default */
  }
}

static int live_snapshot(long kinds[SHIM_KINDS]) {
  for (int k = 0; k < SHIM_KINDS; k++) kinds[k] = shim_live_kind((shim_kind)k);
  return 0;
}

static void report_leak(const char *label, long n, const shim_fault *f, const long before[SHIM_KINDS],
                        const char *msg) {
  g_leaks++;
  char what[256] = "";
  size_t at = 0;
  for (int k = 0; k < SHIM_KINDS; k++) {
    long d = shim_live_kind((shim_kind)k) - before[k];
    if (d) at += (size_t)snprintf(what + at, sizeof what - at, " %s%+ld", shim_kind_name((shim_kind)k), d);
  }
  if (g_leak_reports++ < 40)
    CHECKF(0, "%s: fault %ld in %s (%s, code %s): live objects changed:%s; status message: %s", label, n, f->fn,
           f->in_main ? "clattn" : "library", cl_name(f->code), what, msg);
  else
    ct_current_failures++;
}

/* ---------- one sweep ---------- */

/* A call under test: enqueue it, poison its outputs, check its outputs. */
typedef struct {
  const char *label;
  clattn_status (*call)(void *arg, cl_event *done);
  int (*prepare)(void *arg);                  /* 0 ok */
  int (*verify)(void *arg, clattn_status st); /* 1 when the outputs are right for status st */
  void *arg;
  clattn_status baseline; /* what the call returns without a fault */
} call_case;

static int finish(void) { return clFinish(clattn_cl_queue(fx)) == CL_SUCCESS; }

/* Releases what the context's pools hold idle, so the next call creates its
 * kernels and scratch again (and live counts can be compared). */
static void trim_pools(void) {
  finish();
  ca_kernel_pool_trim(fx);
  ca_scratch_pool_trim(fx);
}

/* Runs the call once with no fault: 1 when it returned the baseline status
 * with correct outputs and left no object behind; *calls gets the count. */
static int clean_run(call_case *c, long *calls, int check_live) {
  if (!CHECKF(c->prepare(c->arg) == 0, "%s: prepare failed", c->label)) return 0;
  finish();
  long live0 = shim_live();
  cl_event done = NULL;
  shim_reset();
  clattn_status st = c->call(c->arg, &done);
  if (calls) *calls = shim_calls();
  if (done) clReleaseEvent(done);
  finish();
  int ok = CHECKF(st == c->baseline, "%s: status %s, expected %s: %s", c->label, clattn_status_string(st),
                  clattn_status_string(c->baseline), clattn_last_error(NULL));
  ok &= CHECKF(c->verify(c->arg, st), "%s: outputs differ from the reference (no fault)", c->label);
  if (check_live)
    ok &= CHECKF(shim_live() == live0, "%s: no fault, live objects %ld -> %ld", c->label, live0, shim_live());
  return ok;
}

/* Injects a fault at each of the call's OpenCL calls in turn. */
static void sweep(call_case *c) {
  long calls = 0;
  if (!clean_run(c, &calls, 0)) /* warm-up: builds programs, CLBlast's kernels */
    return;
  if (!clean_run(c, &calls, 1)) return;
  long again = 0;
  clean_run(c, &again, 1);
  CHECKF(again == calls, "%s: the call count is not repeatable (%ld, then %ld)", c->label, calls, again);
  long injected = 0, absorbed = 0, leaks0 = g_leaks;
  for (long n = 1; n <= calls; n++) {
    long before[SHIM_KINDS];
    if (c->prepare(c->arg) != 0) {
      CHECKF(0, "%s: prepare failed", c->label);
      return;
    }
    finish();
    live_snapshot(before);
    long live0 = shim_live();
    cl_event done = (cl_event)(uintptr_t)0x1; /* must come back NULL on failure */
    shim_reset();
    shim_arm(n, code_for(n), NULL);
    clattn_status st = c->call(c->arg, &done);
    shim_fault f;
    int fired = shim_fired(&f);
    shim_disarm();
    const char *msg = clattn_last_error(NULL);
    char msg_copy[512];
    snprintf(msg_copy, sizeof msg_copy, "%s", msg);
    if (!fired && shim_spared()) { /* CLBlast's clCreateBuffer: see gemm_clblast_temp_buffer_failure */
      g_spared++;
      if (done && done != (cl_event)(uintptr_t)0x1) clReleaseEvent(done);
      finish();
      CHECKF(st == c->baseline && c->verify(c->arg, st), "%s: spared call %ld: %s", c->label, n,
             clattn_status_string(st));
      continue;
    }
    if (!CHECKF(fired, "%s: fault %ld of %ld did not fire (status %s)", c->label, n, calls, clattn_status_string(st))) {
      if (st == CLATTN_OK && done) clReleaseEvent(done);
      finish();
      continue;
    }
    injected++;
    g_injected++;
    note_site(&f);
    if (f.in_main)
      g_in_main++;
    else
      g_in_lib++;
    if (st == c->baseline) {
      /* absorbed: allowed for best-effort calls, and for CLBlast's own calls when the result is right */
      absorbed++;
      g_absorbed++;
      if (st == CLATTN_OK && done && done != (cl_event)(uintptr_t)0x1) clReleaseEvent(done);
      finish();
      CHECKF(!f.in_main || absorbable(f.fn), "%s: fault %ld in %s (%s) was ignored: status %s", c->label, n, f.fn,
             cl_name(f.code), clattn_status_string(st));
      CHECKF(c->verify(c->arg, st), "%s: fault %ld in %s (%s) was absorbed but the outputs are wrong", c->label, n,
             f.fn, cl_name(f.code));
    } else {
      g_failed_cleanly++;
      CHECKF(done == NULL, "%s: fault %ld in %s: status %s but *done was set", c->label, n, f.fn,
             clattn_status_string(st));
      CHECKF(st > CLATTN_OK && st <= CLATTN_ERR_OPENCL, "%s: fault %ld: status %d is not in the enum", c->label, n,
             (int)st);
      CHECKF(msg_copy[0] != '\0', "%s: fault %ld in %s: empty clattn_last_error", c->label, n, f.fn);
      note_message(msg_copy);
      if (f.in_main) {
        clattn_status want = is_oom_code(f.code) ? CLATTN_ERR_OUT_OF_MEMORY : CLATTN_ERR_OPENCL;
        int fits = st == want || (strcmp(f.fn, "clGetMemObjectInfo") == 0 && st == CLATTN_ERR_INVALID_ARGUMENT &&
                                  !is_oom_code(f.code));
        CHECKF(fits, "%s: fault %ld in %s (%s): status %s, expected %s; message: %s", c->label, n, f.fn,
               cl_name(f.code), clattn_status_string(st), clattn_status_string(want), msg_copy);
        CHECKF(strstr(msg_copy, f.fn) || strstr(msg_copy, cl_name(f.code)),
               "%s: fault %ld in %s (%s): the message names neither: %s", c->label, n, f.fn, cl_name(f.code), msg_copy);
      } else {
        CHECKF(st == CLATTN_ERR_OPENCL || st == CLATTN_ERR_OUT_OF_MEMORY, "%s: fault %ld in CLBlast's %s: status %s",
               c->label, n, f.fn, clattn_status_string(st));
        CHECKF(strstr(msg_copy, "CLBlast") != NULL, "%s: fault %ld in CLBlast's %s: message %s", c->label, n, f.fn,
               msg_copy);
      }
      finish();
    }
    if (shim_live() != live0) report_leak(c->label, n, &f, before, msg_copy);
    /* the next call without a fault works */
    if (c->prepare(c->arg) != 0) {
      CHECKF(0, "%s: prepare failed", c->label);
      return;
    }
    cl_event d2 = NULL;
    long live1 = shim_live();
    shim_reset();
    clattn_status st2 = c->call(c->arg, &d2);
    if (d2) clReleaseEvent(d2);
    finish();
    CHECKF(st2 == c->baseline, "%s: after fault %ld in %s: status %s: %s", c->label, n, f.fn, clattn_status_string(st2),
           clattn_last_error(NULL));
    CHECKF(c->verify(c->arg, st2), "%s: after fault %ld in %s: outputs differ from the reference", c->label, n, f.fn);
    CHECKF(shim_live() == live1, "%s: after fault %ld: a clean call left %ld objects", c->label, n,
           shim_live() - live1);
  }
  printf("    %s: %ld OpenCL calls, %ld faults injected, %ld absorbed, %ld leaking\n", c->label, calls, injected,
         absorbed, g_leaks - leaks0);
}

/* ---------- forward calls through the kit ---------- */

typedef struct {
  cp_problem *pb;
  double tol;
} fwd_arg;

static clattn_status fwd_call(void *arg, cl_event *done) {
  fwd_arg *a = arg;
  return clattn_forward(fx, &a->pb->params, 0, NULL, done);
}

static int fwd_prepare(void *arg) {
  fwd_arg *a = arg;
  return cp_fill_outputs(a->pb, NAN);
}

static int fwd_verify(void *arg, clattn_status st) {
  fwd_arg *a = arg;
  cp_result r;
  memset(&r, 0, sizeof r); /* cp_compare leaves the diagnostics' fields alone when there are none */
  if (cp_read_outputs(a->pb) != 0 || cp_compare(a->pb, &r) != 0) return 0;
  r.status = st == CLATTN_ERR_EMPTY_ROW ? CLATTN_OK : st; /* EMPTY_ERROR: outputs hold the EMPTY_ZERO result */
  if (!cp_result_ok(&r, a->tol)) {
    char b[512];
    printf("      %s\n", cp_result_format(&r, b, sizeof b));
    return 0;
  }
  return 1;
}

static void sweep_shape(const char *label, const cp_shape *s, clattn_status baseline) {
  cp_problem *pb;
  KC_BUILD(pb, s);
  if (cp_upload(pb, fx) != 0) {
    CHECKF(0, "%s: upload: %s", label, pb->err);
    cp_free(pb);
    return;
  }
  /* 16-bit storage: within the bounds test_precision holds it to */
  const double tol = s->dtype == CLATTN_F16 ? 1e-3 : s->dtype == CLATTN_BF16 ? 8e-3 : 2e-4;
  fwd_arg a = {pb, tol};
  call_case c = {label, fwd_call, fwd_prepare, fwd_verify, &a, baseline};
  sweep(&c);
  cp_free(pb);
}

static cp_shape small_shape(clattn_algo algo) {
  cp_shape s = cp_shape_default();
  s.batch = 1;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 5;
  s.kv_len = 7;
  s.head_dim = 16;
  s.value_dim = 16;
  s.algo = algo;
  s.seed = 11;
  return s;
}

static void faults_staged(void) {
  cp_shape s = small_shape(CLATTN_ALGO_STAGED);
  s.causal = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.want_diag = 1;
  s.mask = CP_MASK_RANDOM;
  s.bias = CP_BIAS_RANDOM;
  s.kv_lens = 1;
  sweep_shape("staged lse+weights+diag, chunked", &s, CLATTN_OK);
}

static void faults_fused_prefill(void) {
  cp_shape s = small_shape(CLATTN_ALGO_FUSED);
  s.q_len = 9;
  s.kv_len = 20;
  s.causal = 1;
  s.want_lse = 1;
  s.layout = CP_BSHD;
  sweep_shape("fused prefill (packed K/V) lse", &s, CLATTN_OK);
  s.want_diag = 1;
  s.algo = CLATTN_ALGO_AUTO;
  sweep_shape("auto (fused) with diagnostics", &s, CLATTN_OK);
}

static void faults_fused_decode_split(void) {
  cp_shape s = cp_shape_default();
  s.q_heads = 1;
  s.kv_heads = 1;
  s.q_len = 1;
  s.kv_len = 1024; /* >= 2 x 256 keys and one row block: split-KV, then merge_states */
  s.head_dim = 16;
  s.value_dim = 16;
  s.want_lse = 1;
  s.algo = CLATTN_ALGO_FUSED;
  s.seed = 5;
  sweep_shape("fused split-KV decode + merge", &s, CLATTN_OK);
}

static void faults_gemm(void) {
  cp_shape s = small_shape(CLATTN_ALGO_GEMM);
  s.kv_lens = 1; /* V copied with the padding rows zeroed: gemm_dense_copy */
  s.want_lse = 1;
  s.want_weights = 1;
  s.bias = CP_BIAS_RANDOM;
  sweep_shape("gemm kv_lens lse+weights, chunked", &s, CLATTN_OK);
}

static void faults_empty_error(void) {
  cp_shape s = small_shape(CLATTN_ALGO_FUSED);
  s.empty_rows = CLATTN_EMPTY_ERROR;
  s.want_lse = 1;
  sweep_shape("fused EMPTY_ERROR, no empty row", &s, CLATTN_OK);
  s.algo = CLATTN_ALGO_STAGED;
  s.mask = CP_MASK_ZEROS; /* every row empty */
  sweep_shape("staged EMPTY_ERROR, empty rows", &s, CLATTN_ERR_EMPTY_ROW);
}

/* 16-bit storage (its own core and fused programs), packed sequences, score
 * shaping and additive scores: the paths issue 5 added. */
static void faults_storage_sequences_shaping(void) {
  cp_shape s = small_shape(CLATTN_ALGO_STAGED);
  s.batch = 2;
  s.varlen = 1;
  s.dtype = CLATTN_F16;
  s.softcap = 3.0f;
  s.alibi = 1;
  s.sinks = 1;
  s.want_lse = 1;
  sweep_shape("staged f16, packed sequences, softcap+ALiBi+sinks", &s, CLATTN_OK);
  s.algo = CLATTN_ALGO_FUSED;
  s.dtype = CLATTN_BF16;
  sweep_shape("fused bf16, packed sequences, softcap+ALiBi+sinks", &s, CLATTN_OK);
  s = small_shape(CLATTN_ALGO_GEMM);
  s.additive = 1;
  s.dtype = CLATTN_F16;
  s.want_lse = 1;
  sweep_shape("gemm f16, additive scores", &s, CLATTN_OK);
}

/* ---------- merge_states ---------- */

typedef struct {
  int S, H, M, dv;
  float *o, *lse;
  double *want, *want_lse;
  cl_mem o_buf, lse_buf, out_buf, out_lse_buf;
  clattn_merge_params mp;
} merge_arg;

static clattn_status merge_call(void *arg, cl_event *done) {
  merge_arg *a = arg;
  return clattn_merge_states(fx, &a->mp, 0, NULL, done);
}

static int merge_prepare(void *arg) {
  merge_arg *a = arg;
  float nan = NAN;
  cl_command_queue q = clattn_cl_queue(fx);
  size_t rows = (size_t)a->H * a->M;
  if (clEnqueueFillBuffer(q, a->out_buf, &nan, sizeof nan, 0, rows * a->dv * sizeof(float), 0, NULL, NULL) ||
      clEnqueueFillBuffer(q, a->out_lse_buf, &nan, sizeof nan, 0, rows * sizeof(float), 0, NULL, NULL))
    return -1;
  return clFinish(q) == CL_SUCCESS ? 0 : -1;
}

static int merge_verify(void *arg, clattn_status st) {
  merge_arg *a = arg;
  (void)st;
  size_t rows = (size_t)a->H * a->M;
  float *out = malloc(rows * a->dv * sizeof(float)), *lse = malloc(rows * sizeof(float));
  int ok = out && lse;
  cl_command_queue q = clattn_cl_queue(fx);
  ok = ok && clEnqueueReadBuffer(q, a->out_buf, CL_TRUE, 0, rows * a->dv * sizeof(float), out, 0, NULL, NULL) == 0;
  ok = ok && clEnqueueReadBuffer(q, a->out_lse_buf, CL_TRUE, 0, rows * sizeof(float), lse, 0, NULL, NULL) == 0;
  for (size_t r = 0; ok && r < rows; r++) {
    ok = kc_close(lse[r], a->want_lse[r], 1e-5);
    for (int c = 0; ok && c < a->dv; c++) ok = kc_close(out[r * a->dv + c], a->want[r * a->dv + c], 1e-5);
  }
  free(out);
  free(lse);
  return ok;
}

static void faults_merge(void) {
  merge_arg a = {3, 2, 5, 8, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {0}};
  size_t rows = (size_t)a.H * a.M, per_o = rows * a.dv;
  a.o = malloc(a.S * per_o * sizeof(float));
  a.lse = malloc(a.S * rows * sizeof(float));
  a.want = calloc(per_o, sizeof(double));
  a.want_lse = calloc(rows, sizeof(double));
  REQUIRE(a.o && a.lse && a.want && a.want_lse);
  uint64_t x = 7;
  for (size_t i = 0; i < a.S * per_o; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    a.o[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1);
  }
  for (size_t i = 0; i < a.S * rows; i++) a.lse[i] = (float)((double)(i % 7) * 0.37 - 1.0);
  for (size_t r = 0; r < rows; r++) {
    double m = -INFINITY, sum = 0;
    for (int s = 0; s < a.S; s++) m = fmax(m, a.lse[s * rows + r]);
    for (int s = 0; s < a.S; s++) sum += exp(a.lse[s * rows + r] - m);
    a.want_lse[r] = m + log(sum);
    for (int s = 0; s < a.S; s++)
      for (int c = 0; c < a.dv; c++)
        a.want[r * a.dv + c] += exp(a.lse[s * rows + r] - a.want_lse[r]) * a.o[s * per_o + r * a.dv + c];
  }
  cl_int e = 0;
  cl_context cc = clattn_cl_context(fx);
  a.o_buf = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, a.S * per_o * sizeof(float), a.o, &e);
  a.lse_buf = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, a.S * rows * sizeof(float), a.lse, &e);
  a.out_buf = clCreateBuffer(cc, CL_MEM_READ_WRITE, per_o * sizeof(float), NULL, &e);
  a.out_lse_buf = clCreateBuffer(cc, CL_MEM_READ_WRITE, rows * sizeof(float), NULL, &e);
  if (CHECK(a.o_buf && a.lse_buf && a.out_buf && a.out_lse_buf)) {
    size_t m = (size_t)a.M, dv = (size_t)a.dv, h = (size_t)a.H;
    a.mp.n_states = a.S;
    a.mp.batch = 1;
    a.mp.heads = a.H;
    a.mp.q_len = a.M;
    a.mp.value_dim = a.dv;
    a.mp.o = (clattn_tensor){a.o_buf, 0, {h * m * dv, m * dv, dv, 1}};
    a.mp.lse = (clattn_tensor){a.lse_buf, 0, {h * m, m, 1, 0}};
    a.mp.o_state_stride = per_o;
    a.mp.lse_state_stride = rows;
    a.mp.out = (clattn_tensor){a.out_buf, 0, {h * m * dv, m * dv, dv, 1}};
    a.mp.out_lse = (clattn_tensor){a.out_lse_buf, 0, {h * m, m, 1, 0}};
    a.mp.empty_rows = CLATTN_EMPTY_ERROR; /* reads the flag back: one more call to fail */
    call_case c = {"merge_states", merge_call, merge_prepare, merge_verify, &a, CLATTN_OK};
    sweep(&c);
  }
  cl_mem all[] = {a.o_buf, a.lse_buf, a.out_buf, a.out_lse_buf};
  for (int i = 0; i < 4; i++)
    if (all[i]) clReleaseMemObject(all[i]);
  free(a.o);
  free(a.lse);
  free(a.want);
  free(a.want_lse);
}

/* ---------- plans: creation, and steps ---------- */

typedef struct {
  fwd_arg fwd;
  clattn_plan *plan;
} plan_arg;

/* A plan made, one step as planned, the plan released. */
static clattn_status plan_create_call(void *arg, cl_event *done) {
  plan_arg *a = arg;
  clattn_plan *plan = NULL;
  *done = NULL;
  clattn_status st = clattn_plan_create(fx, &a->fwd.pb->params, &plan);
  if (st == CLATTN_OK) st = clattn_plan_enqueue(plan, NULL, 0, NULL, done);
  clattn_plan_release(plan);
  return st;
}

/* Two steps of the plan: kv_len one short (arguments patched, the plain
 * enqueues), then as planned (patched back; a command buffer replayed where
 * one was recorded); the outputs are the planned call's. */
static clattn_status plan_steps_call(void *arg, cl_event *done) {
  plan_arg *a = arg;
  *done = NULL;
  clattn_step s = clattn_step_default();
  s.kv_len = a->fwd.pb->params.kv_len - 1;
  clattn_status st = clattn_plan_enqueue(a->plan, &s, 0, NULL, NULL);
  return st == CLATTN_OK ? clattn_plan_enqueue(a->plan, NULL, 0, NULL, done) : st;
}

static int plan_prepare(void *arg) { return fwd_prepare(&((plan_arg *)arg)->fwd); }
static int plan_verify(void *arg, clattn_status st) { return fwd_verify(&((plan_arg *)arg)->fwd, st); }

/* Plans over a shape: creation with a fault at each of its calls, then a
 * plan's steps with a fault at each of theirs (the plan keeps working). */
static void sweep_plan(const char *label, const cp_shape *s) {
  cp_problem *pb;
  KC_BUILD(pb, s);
  plan_arg a = {{pb, 2e-4}, NULL};
  char name[128];
  if (CHECKF(cp_upload(pb, fx) == 0, "%s: upload: %s", label, pb->err)) {
    snprintf(name, sizeof name, "plan creation, %s", label);
    call_case c = {name, plan_create_call, plan_prepare, plan_verify, &a, CLATTN_OK};
    sweep(&c);
    if (CHECKF(clattn_plan_create(fx, &pb->params, &a.plan) == CLATTN_OK, "%s: %s", label, clattn_last_error(NULL))) {
      snprintf(name, sizeof name, "plan steps, %s", label);
      call_case d = {name, plan_steps_call, plan_prepare, plan_verify, &a, CLATTN_OK};
      sweep(&d);
      clattn_plan_release(a.plan);
    }
  }
  cp_free(pb);
}

/* With command buffers wherever the device offers them (recorded at
 * creation, replayed by the steps as planned). */
static void faults_plans(void) {
  setenv("CLATTN_COMMAND_BUFFER", "1", 1); /* read at the context's first plan */
  cp_shape s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 1;
  s.kv_len = 1100; /* split keys, then merge_states, at both step lengths */
  s.head_dim = s.value_dim = 16;
  s.want_lse = 1;
  s.algo = CLATTN_ALGO_FUSED;
  s.seed = 21;
  sweep_plan("fused split-KV decode + merge", &s);
  s = small_shape(CLATTN_ALGO_FUSED);
  s.q_len = 9;
  s.kv_len = 20;
  s.causal = 1;
  s.empty_rows = CLATTN_EMPTY_ERROR; /* no row empty: the flag read back each step */
  sweep_plan("fused prefill (packed K/V), EMPTY_ERROR", &s);
  s = small_shape(CLATTN_ALGO_STAGED);
  s.want_lse = 1;
  sweep_plan("staged, chunked", &s);
  unsetenv("CLATTN_COMMAND_BUFFER");
}

/* ---------- a program built on first use ---------- */

/* The fused program for a new head-dim pair is built inside the call:
 * faults in clCreateProgramWithSource / clBuildProgram fail the call
 * cleanly, and a later call builds it. clBuildProgram failing for lack of
 * memory is an out-of-memory status like any other call's. */
/* ---------- paged Q8_0 caches: clattn_kv_append, then forward on every path ---------- */

enum { KVF_H = 2, KVF_HQ = 4, KVF_D = 32, KVF_ROW = 34, KVF_PS = 4, KVF_PAGES = 3, KVF_NEW = 5, KVF_M = 5 };
#define KVF_CACHE_BYTES ((size_t)KVF_PAGES * KVF_H * KVF_PS * KVF_ROW)

typedef struct {
  cl_mem k, v, kn, vn, pos, bt, lens, q, out;
  clattn_append_params ap;
  clattn_params fp;
  unsigned char want_k[KVF_CACHE_BYTES], want_v[KVF_CACHE_BYTES];
  float want_out[KVF_HQ * KVF_M * KVF_D];
} kvf_arg;

static clattn_status kvf_append_call(void *arg, cl_event *done) {
  kvf_arg *a = arg;
  return clattn_kv_append(fx, &a->ap, 0, NULL, done);
}

static int kvf_append_prepare(void *arg) {
  kvf_arg *a = arg;
  unsigned char pattern = 0x33;
  cl_command_queue q = clattn_cl_queue(fx);
  if (clEnqueueFillBuffer(q, a->k, &pattern, 1, 0, KVF_CACHE_BYTES, 0, NULL, NULL) ||
      clEnqueueFillBuffer(q, a->v, &pattern, 1, 0, KVF_CACHE_BYTES, 0, NULL, NULL))
    return -1;
  return clFinish(q) == CL_SUCCESS ? 0 : -1;
}

/* The caches as a clean append left them (the bytes themselves are checked
 * against ggml's rules in test_kvcache). */
static int kvf_append_verify(void *arg, clattn_status st) {
  kvf_arg *a = arg;
  unsigned char k[KVF_CACHE_BYTES], v[KVF_CACHE_BYTES];
  cl_command_queue q = clattn_cl_queue(fx);
  (void)st;
  return clEnqueueReadBuffer(q, a->k, CL_TRUE, 0, sizeof k, k, 0, NULL, NULL) == CL_SUCCESS &&
         clEnqueueReadBuffer(q, a->v, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL) == CL_SUCCESS &&
         memcmp(k, a->want_k, sizeof k) == 0 && memcmp(v, a->want_v, sizeof v) == 0;
}

static clattn_status kvf_forward_call(void *arg, cl_event *done) {
  kvf_arg *a = arg;
  return clattn_forward(fx, &a->fp, 0, NULL, done);
}

static int kvf_forward_prepare(void *arg) {
  kvf_arg *a = arg;
  float nan = NAN;
  cl_command_queue q = clattn_cl_queue(fx);
  if (clEnqueueFillBuffer(q, a->out, &nan, sizeof nan, 0, sizeof a->want_out, 0, NULL, NULL)) return -1;
  return clFinish(q) == CL_SUCCESS ? 0 : -1;
}

/* Bitwise the output of a clean call on the same path. */
static int kvf_forward_verify(void *arg, clattn_status st) {
  kvf_arg *a = arg;
  float out[KVF_HQ * KVF_M * KVF_D];
  (void)st;
  return clEnqueueReadBuffer(clattn_cl_queue(fx), a->out, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL) == CL_SUCCESS &&
         memcmp(out, a->want_out, sizeof out) == 0;
}

static void faults_paged_q8_0(void) {
  static kvf_arg a;
  cl_context cc = clattn_cl_context(fx);
  cl_int e = 0;
  float src[KVF_H * KVF_NEW * KVF_D], q[KVF_HQ * KVF_M * KVF_D];
  for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) src[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  const int32_t pos = 1, table[2] = {2, 0}, len = KVF_NEW + 1;
  memset(&a, 0, sizeof a);
  a.k = clCreateBuffer(cc, CL_MEM_READ_WRITE, KVF_CACHE_BYTES, NULL, &e);
  a.v = clCreateBuffer(cc, CL_MEM_READ_WRITE, KVF_CACHE_BYTES, NULL, &e);
  a.kn = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof src, src, &e);
  a.vn = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof src, src, &e);
  a.pos = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof pos, (void *)&pos, &e);
  a.bt = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof table, (void *)table, &e);
  a.lens = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof len, (void *)&len, &e);
  a.q = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof q, q, &e);
  a.out = clCreateBuffer(cc, CL_MEM_READ_WRITE, sizeof a.want_out, NULL, &e);
  if (!CHECK(a.k && a.v && a.kn && a.vn && a.pos && a.bt && a.lens && a.q && a.out)) goto done;
  const clattn_tensor cache = {NULL, 0, {(size_t)KVF_H * KVF_PS * KVF_ROW, (size_t)KVF_PS * KVF_ROW, KVF_ROW, 34}};
  a.ap = clattn_append_params_default();
  a.ap.batch = 1;
  a.ap.kv_heads = KVF_H;
  a.ap.new_len = KVF_NEW;
  a.ap.head_dim = a.ap.value_dim = KVF_D;
  a.ap.k_new = (clattn_tensor){a.kn, 0, {0, (size_t)KVF_NEW * KVF_D, KVF_D, 1}};
  a.ap.v_new = (clattn_tensor){a.vn, 0, {0, (size_t)KVF_NEW * KVF_D, KVF_D, 1}};
  a.ap.positions = a.pos;
  a.ap.kv_dtype = CLATTN_Q8_0;
  a.ap.k = cache;
  a.ap.k.buf = a.k;
  a.ap.v = cache;
  a.ap.v.buf = a.v;
  a.ap.block_table = a.bt;
  a.ap.block_table_stride = 2;
  a.ap.page_size = KVF_PS;
  a.ap.num_pages = KVF_PAGES;
  /* the wanted caches: a clean append */
  if (!CHECK(kvf_append_prepare(&a) == 0 && clattn_kv_append(fx, &a.ap, 0, NULL, NULL) == CLATTN_OK && finish()))
    goto done;
  cl_command_queue cq = clattn_cl_queue(fx);
  if (!CHECK(clEnqueueReadBuffer(cq, a.k, CL_TRUE, 0, KVF_CACHE_BYTES, a.want_k, 0, NULL, NULL) == CL_SUCCESS &&
             clEnqueueReadBuffer(cq, a.v, CL_TRUE, 0, KVF_CACHE_BYTES, a.want_v, 0, NULL, NULL) == CL_SUCCESS))
    goto done;
  call_case c = {"kv_append paged Q8_0", kvf_append_call, kvf_append_prepare, kvf_append_verify, &a, CLATTN_OK};
  sweep(&c);
  /* forward over that cache: 6 keys on pages 2 and 0, causal, lse-free */
  a.fp = clattn_params_default();
  a.fp.batch = 1;
  a.fp.q_heads = KVF_HQ;
  a.fp.kv_heads = KVF_H;
  a.fp.q_len = KVF_M;
  a.fp.kv_len = 2 * KVF_PS;
  a.fp.head_dim = a.fp.value_dim = KVF_D;
  a.fp.q = (clattn_tensor){a.q, 0, {0, (size_t)KVF_M * KVF_D, KVF_D, 1}};
  a.fp.out = (clattn_tensor){a.out, 0, {0, (size_t)KVF_M * KVF_D, KVF_D, 1}};
  a.fp.kv_dtype = CLATTN_Q8_0;
  a.fp.k = a.ap.k;
  a.fp.v = a.ap.v;
  a.fp.block_table = a.bt;
  a.fp.block_table_stride = 2;
  a.fp.page_size = KVF_PS;
  a.fp.num_pages = KVF_PAGES;
  a.fp.kv_lens = a.lens;
  a.fp.causal = 1;
  const clattn_algo algos[] = {CLATTN_ALGO_FUSED, CLATTN_ALGO_STAGED, CLATTN_ALGO_GEMM};
  const char *labels[] = {"fused paged Q8_0", "staged paged Q8_0", "gemm paged Q8_0 (gathered)"};
  for (int i = 0; i < 3; i++) {
    if (kc_algo_filtered_out(algos[i])) continue;
    a.fp.algo = algos[i];
    if (!CHECK(kvf_forward_prepare(&a) == 0 && clattn_forward(fx, &a.fp, 0, NULL, NULL) == CLATTN_OK && finish() &&
               clEnqueueReadBuffer(cq, a.out, CL_TRUE, 0, sizeof a.want_out, a.want_out, 0, NULL, NULL) == CL_SUCCESS))
      continue;
    int finite = 1;
    for (size_t j = 0; j < sizeof a.want_out / sizeof a.want_out[0]; j++) finite &= isfinite(a.want_out[j]) != 0;
    CHECKF(finite, "%s: the clean output is not finite", labels[i]);
    call_case f = {labels[i], kvf_forward_call, kvf_forward_prepare, kvf_forward_verify, &a, CLATTN_OK};
    sweep(&f);
  }
done:;
  cl_mem all[] = {a.k, a.v, a.kn, a.vn, a.pos, a.bt, a.lens, a.q, a.out};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) clReleaseMemObject(all[i]);
}

/* A call whose program is not built yet, with each of the build's OpenCL
 * calls (program creation, build) failing with each of n codes: the call
 * returns OUT_OF_MEMORY or OPENCL naming the failed function and code, sets
 * no done event and leaks nothing. `what` names the call in messages. */
static void first_build_faults(const char *what, clattn_status (*call)(void *arg, cl_event *done), void *arg,
                               const cl_int *codes, int n) {
  const char *build_fns[] = {"clCreateProgramWithSource", "clBuildProgram"};
  trim_pools();
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < n; k++) {
      finish();
      long live0 = shim_live();
      cl_event done = NULL;
      shim_reset();
      shim_arm(1, codes[k], build_fns[i]);
      clattn_status st = call(arg, &done);
      shim_fault f;
      int fired = shim_fired(&f);
      shim_disarm();
      finish();
      char msg[512];
      snprintf(msg, sizeof msg, "%s", clattn_last_error(NULL));
      if (!CHECKF(fired, "%s: %s was not called: is the program already built?", what, build_fns[i])) continue;
      g_injected++;
      g_failed_cleanly += st != CLATTN_OK;
      g_in_main++;
      note_site(&f);
      note_message(msg);
      clattn_status want = is_oom_code(codes[k]) ? CLATTN_ERR_OUT_OF_MEMORY : CLATTN_ERR_OPENCL;
      CHECKF(st == want, "%s, %s failing with %s: status %s, expected %s; message: %.200s", what, build_fns[i],
             cl_name(codes[k]), clattn_status_string(st), clattn_status_string(want), msg);
      CHECKF(strstr(msg, build_fns[i]) && strstr(msg, cl_name(codes[k])), "message: %.200s", msg);
      CHECKF(done == NULL, "done set on failure");
      CHECKF(shim_live() == live0, "%s, %s failing: live objects %ld -> %ld", what, build_fns[i], live0, shim_live());
    }
}

static clattn_status forward_call(void *pb, cl_event *done) {
  return clattn_forward(fx, &((cp_problem *)pb)->params, 0, NULL, done);
}

static void faults_fused_first_build(void) {
  cp_shape s = small_shape(CLATTN_ALGO_FUSED);
  s.head_dim = 12;
  s.value_dim = 20;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  if (cp_upload(pb, fx) != 0 || cp_fill_outputs(pb, NAN) != 0) {
    CHECKF(0, "upload: %s", pb->err);
    cp_free(pb);
    return;
  }
  const cl_int codes[] = {CL_OUT_OF_HOST_MEMORY, CL_OUT_OF_RESOURCES, CL_INVALID_OPERATION};
  first_build_faults("first build", forward_call, pb, codes, 3);
  cp_result r;
  long live0 = shim_live();
  CHECK(cp_run(pb, fx, &r) == 0);
  CHECKF(cp_result_ok(&r, 2e-4), "after the failed builds: %s: %s", clattn_status_string(r.status),
         clattn_last_error(NULL));
  trim_pools();                    /* the call's pooled kernels and scratch */
  CHECK(shim_live() == live0 + 1); /* the program, kept for the context's life */
  cp_free(pb);
}

/* ---------- the backward pass ---------- */

/* clattn_backward with sinks (d_sinks) and additive scoring (d_additive_w),
 * on each path (FA2, staged, FA2 with atomic dQ without d_additive_w):
 * a fault at each OpenCL call of the call in turn (its program is built
 * by the sweep's warm-up call), the forward's out and lse computed once
 * beforehand. */
typedef struct {
  cp_problem *pb;
  clattn_backward_params bp;
  cl_mem bufs[6]; /* d_out, d_q, d_k, d_v, d_sinks, d_additive_w */
  size_t n[6];
  int outputs; /* bufs[1 .. outputs) are checked: 5 without d_additive_w */
  ref_grads ref;
} bwd_arg;

static clattn_status bwd_call(void *arg, cl_event *done) {
  bwd_arg *a = arg;
  return clattn_backward(fx, &a->bp, 0, NULL, done);
}

static int bwd_prepare(void *arg) {
  bwd_arg *a = arg;
  for (int i = 1; i < 6; i++) {
    float *nan = malloc(a->n[i] * sizeof(float));
    if (!nan) return -1;
    for (size_t e = 0; e < a->n[i]; e++) nan[e] = NAN;
    cl_int err =
        clEnqueueWriteBuffer(clattn_cl_queue(fx), a->bufs[i], CL_TRUE, 0, a->n[i] * sizeof(float), nan, 0, NULL, NULL);
    free(nan);
    if (err != CL_SUCCESS) return -1;
  }
  return 0;
}

static int bwd_verify(void *arg, clattn_status st) {
  bwd_arg *a = arg;
  if (st != CLATTN_OK) return 0;
  const double *want[6] = {NULL, a->ref.d_q, a->ref.d_k, a->ref.d_v, a->ref.d_sinks, a->ref.d_additive_w};
  for (int i = 1; i < a->outputs; i++) {
    float *got = malloc(a->n[i] * sizeof(float));
    int ok = got && clEnqueueReadBuffer(clattn_cl_queue(fx), a->bufs[i], CL_TRUE, 0, a->n[i] * sizeof(float), got, 0,
                                        NULL, NULL) == CL_SUCCESS;
    for (size_t e = 0; ok && e < a->n[i]; e++) ok = isfinite(got[e]);
    ok = ok && cp_rel_err(got, want[i], a->n[i]) <= 1e-4;
    free(got);
    if (!ok) return 0;
  }
  return 1;
}

static void bwd_free(bwd_arg *a) {
  for (int i = 0; i < 6; i++)
    if (a->bufs[i]) clReleaseMemObject(a->bufs[i]);
  free(a->ref.d_q);
  free(a->ref.d_k);
  free(a->ref.d_v);
  free(a->ref.d_sinks);
  free(a->ref.d_additive_w);
  cp_free(a->pb);
  memset(a, 0, sizeof *a);
}

/* A backward call for head dims (dk, dv): the forward run, dO, the
 * gradient buffers and the reference. 0 on success (failures recorded). */
static int bwd_setup(bwd_arg *a, int dk_, int dv_) {
  memset(a, 0, sizeof *a);
  cp_shape s = small_shape(CLATTN_ALGO_FUSED);
  s.head_dim = dk_;
  s.value_dim = dv_;
  s.want_lse = 1;
  s.causal = 1;
  s.sinks = 1;
  s.additive = 1;
  char err[256] = "";
  a->pb = cp_build(&s, err, sizeof err);
  if (!CHECKF(a->pb != NULL, "cp_build: %s", err)) return -1;
  cp_result r;
  const clattn_params *p = &a->pb->params;
  const size_t nq = (size_t)p->q_heads * p->q_len * p->head_dim, nk = (size_t)p->kv_heads * p->kv_len * p->head_dim;
  const size_t nv = (size_t)p->kv_heads * p->kv_len * p->value_dim, no = (size_t)p->q_heads * p->q_len * p->value_dim;
  const size_t n[6] = {no, nq, nk, nv, (size_t)p->q_heads, (size_t)p->head_dim};
  double *dout = malloc(no * sizeof *dout);
  float *dout_f = malloc(no * sizeof *dout_f);
  a->ref.d_q = malloc(nq * sizeof(double));
  a->ref.d_k = malloc(nk * sizeof(double));
  a->ref.d_v = malloc(nv * sizeof(double));
  a->ref.d_sinks = malloc(n[4] * sizeof(double));
  a->ref.d_additive_w = malloc(n[5] * sizeof(double));
  int rc = -1;
  if (!CHECK(dout && dout_f && a->ref.d_q && a->ref.d_k && a->ref.d_v && a->ref.d_sinks && a->ref.d_additive_w) ||
      !CHECK(cp_run(a->pb, fx, &r) == 0 && cp_result_ok(&r, 2e-4)))
    goto done;
  for (size_t e = 0; e < no; e++) dout[e] = dout_f[e] = (float)((double)((e * 2654435761u) % 1000) / 500.0 - 1.0);
  const ref_inputs in = cp_ref_inputs(a->pb);
  if (!CHECK(ref_backward(p, &in, dout, &a->ref) == 0)) goto done;
  cl_int e = CL_SUCCESS;
  for (int i = 0; i < 6; i++) {
    a->n[i] = n[i];
    a->bufs[i] = clCreateBuffer(clattn_cl_context(fx), CL_MEM_READ_WRITE | (i == 0 ? CL_MEM_COPY_HOST_PTR : 0),
                                n[i] * sizeof(float), i == 0 ? dout_f : NULL, &e);
    if (!CHECK(e == CL_SUCCESS)) goto done;
  }
  const size_t H = (size_t)p->q_heads, Hk = (size_t)p->kv_heads, M = (size_t)p->q_len, N = (size_t)p->kv_len;
  const size_t dk = (size_t)p->head_dim, dv = (size_t)p->value_dim;
  a->bp = clattn_backward_params_default();
  a->bp.fwd = *p;
  a->bp.d_out = (clattn_tensor){a->bufs[0], 0, {H * M * dv, M * dv, dv, 1}};
  a->bp.d_q = (clattn_tensor){a->bufs[1], 0, {H * M * dk, M * dk, dk, 1}};
  a->bp.d_k = (clattn_tensor){a->bufs[2], 0, {Hk * N * dk, N * dk, dk, 1}};
  a->bp.d_v = (clattn_tensor){a->bufs[3], 0, {Hk * N * dv, N * dv, dv, 1}};
  a->bp.d_sinks = a->bufs[4];
  a->bp.d_additive_w = a->bufs[5];
  a->outputs = 6;
  rc = 0;
done:
  free(dout);
  free(dout_f);
  return rc;
}

static void faults_backward(void) {
  bwd_arg a;
  if (bwd_setup(&a, 8, 24) == 0) {
    call_case c = {"backward (sinks, additive)", bwd_call, bwd_prepare, bwd_verify, &a, CLATTN_OK};
    sweep(&c);
    a.bp.fwd.algo = CLATTN_ALGO_STAGED;
    call_case staged = {"staged backward (sinks, additive)", bwd_call, bwd_prepare, bwd_verify, &a, CLATTN_OK};
    sweep(&staged);
    a.bp.fwd.algo = CLATTN_ALGO_FUSED;
    a.bp.deterministic = 0; /* FA2's single pass, which d_additive_w would turn off */
    a.bp.d_additive_w = NULL;
    a.outputs = 5;
    call_case atomic = {"backward, atomic dQ (sinks, additive)", bwd_call, bwd_prepare, bwd_verify, &a, CLATTN_OK};
    sweep(&atomic);
  }
  bwd_free(&a);
}

static clattn_status backward_call(void *a, cl_event *done) {
  return clattn_backward(fx, &((bwd_arg *)a)->bp, 0, NULL, done);
}

/* The backward program for a new head-dim pair is built inside the call:
 * a failing build fails the call cleanly (nothing kept, nothing leaked),
 * and a later call builds it. */
static void faults_backward_first_build(void) {
  bwd_arg a;
  if (bwd_setup(&a, 12, 4) != 0) {
    bwd_free(&a);
    return;
  }
  const cl_int codes[] = {CL_OUT_OF_HOST_MEMORY, CL_INVALID_OPERATION};
  first_build_faults("backward first build", backward_call, &a, codes, 2);
  long live0 = shim_live();
  CHECK(bwd_prepare(&a) == 0);
  CHECK_STATUS(clattn_backward(fx, &a.bp, 0, NULL, NULL), CLATTN_OK);
  finish();
  CHECKF(bwd_verify(&a, CLATTN_OK), "after the failed builds: gradients differ from the reference");
  trim_pools();                    /* the call's pooled kernels and scratch */
  CHECK(shim_live() == live0 + 1); /* the program, kept for the context's life */
  bwd_free(&a);
}

/* ---------- context creation ---------- */

static int quick_forward_ok(clattn_context *c) {
  cp_shape s = small_shape(CLATTN_ALGO_STAGED);
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) return 0;
  cp_result r;
  int ok = cp_run(pb, c, &r) == 0 && cp_result_ok(&r, 2e-4);
  cp_free(pb);
  return ok;
}

static void create_sweep(const char *label, const clattn_options *opt) {
  long live0 = shim_live();
  clattn_context *c = NULL;
  shim_reset();
  clattn_status st = clattn_create(opt, &c);
  long calls = shim_calls();
  REQUIREF(st == CLATTN_OK, "%s: %s: %s", label, clattn_status_string(st), clattn_last_error(NULL));
  clattn_destroy(c);
  REQUIREF(shim_live() == live0, "%s: create + destroy: live objects %ld -> %ld", label, live0, shim_live());
  long injected = 0, absorbed = 0, leaks0 = g_leaks;
  for (long n = 1; n <= calls; n++) {
    long before[SHIM_KINDS];
    live_snapshot(before);
    c = (clattn_context *)(uintptr_t)0x1;
    shim_reset();
    shim_arm(n, code_for(n), NULL);
    st = clattn_create(opt, &c);
    shim_fault f;
    int fired = shim_fired(&f);
    shim_disarm();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", clattn_last_error(NULL));
    if (!CHECKF(fired, "%s: fault %ld of %ld did not fire", label, n, calls)) {
      if (st == CLATTN_OK) clattn_destroy(c);
      continue;
    }
    injected++;
    g_injected++;
    note_site(&f);
    g_in_main += f.in_main;
    g_in_lib += !f.in_main;
    if (st == CLATTN_OK) {
      absorbed++;
      g_absorbed++;
      CHECKF(absorbable(f.fn), "%s: fault %ld in %s (%s) was ignored", label, n, f.fn, cl_name(f.code));
      CHECKF(quick_forward_ok(c), "%s: fault %ld in %s absorbed, but the context computes wrong results", label, n,
             f.fn);
      clattn_destroy(c);
    } else {
      g_failed_cleanly++;
      note_message(msg);
      CHECKF(c == NULL, "%s: fault %ld in %s: failed create left *out set", label, n, f.fn);
      CHECKF(msg[0] != '\0', "%s: fault %ld: empty message", label, n);
      clattn_status want = is_oom_code(f.code) ? CLATTN_ERR_OUT_OF_MEMORY : CLATTN_ERR_OPENCL;
      int fits = st == want || (strcmp(f.fn, "clGetDeviceIDs") == 0 && st == CLATTN_ERR_NO_DEVICE);
      CHECKF(fits, "%s: fault %ld in %s (%s): status %s, expected %s; message: %.300s", label, n, f.fn, cl_name(f.code),
             clattn_status_string(st), clattn_status_string(want), msg);
      CHECKF(strstr(msg, f.fn) || strstr(msg, cl_name(f.code)) || st == CLATTN_ERR_NO_DEVICE,
             "%s: fault %ld in %s (%s): the message names neither: %.300s", label, n, f.fn, cl_name(f.code), msg);
    }
    if (shim_live() != live0) report_leak(label, n, &f, before, msg);
  }
  printf("    %s: %ld OpenCL calls, %ld faults injected, %ld absorbed, %ld leaking\n", label, calls, injected, absorbed,
         g_leaks - leaks0);
}

static void faults_create(void) {
  clattn_options opt = {0};
  opt.cache_dir = g_cache_dir; /* warm: the programs load from the binary cache */
  create_sweep("create (own context, binary cache)", &opt);
}

static void faults_create_embedded(void) {
  clattn_options opt = {0};
  opt.context = clattn_cl_context(fx);
  opt.device = clattn_cl_device(fx);
  opt.queue = clattn_cl_queue(fx);
  opt.cache_dir = g_cache_dir;
  create_sweep("create (embedded)", &opt);
}

/* Without a cache every create compiles the programs: inject only into the
 * calls of the source builds (and what follows the first one). */
static void faults_create_no_cache(void) {
  clattn_options opt = {0};
  opt.cache_dir = "";
  const char *fns[] = {"clCreateProgramWithSource", "clBuildProgram", "clGetProgramBuildInfo"};
  for (int i = 0; i < 3; i++)
    for (long n = 1; n <= 2; n++) {
      long live0 = shim_live();
      clattn_context *c = NULL;
      shim_reset();
      shim_arm(n, CL_OUT_OF_RESOURCES, fns[i]);
      clattn_status st = clattn_create(&opt, &c);
      shim_fault f;
      int fired = shim_fired(&f);
      shim_disarm();
      char msg[512];
      snprintf(msg, sizeof msg, "%s", clattn_last_error(NULL));
      if (!fired) {
        /* clGetProgramBuildInfo runs only after a failed build */
        CHECKF(i == 2 && st == CLATTN_OK, "no-cache create: %s #%ld not called", fns[i], n);
        if (c) clattn_destroy(c);
        continue;
      }
      g_injected++;
      g_in_main++;
      note_site(&f);
      if (st == CLATTN_OK) {
        g_absorbed++;
        clattn_destroy(c);
      } else {
        g_failed_cleanly++;
        note_message(msg);
        CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY, "no-cache create: %s #%ld failing with CL_OUT_OF_RESOURCES: %s: %.200s",
               fns[i], n, clattn_status_string(st), msg);
      }
      CHECKF(shim_live() == live0, "no-cache create, %s #%ld: live objects %ld -> %ld", fns[i], n, live0, shim_live());
    }
}

/* ---------- out of memory ---------- */

/* A problem whose keys and values are one row broadcast over a huge kv_len
 * (row stride 0): tiny buffers, but scratch proportional to kv_len. */
static void oom_case(clattn_algo algo, int kv_len, int dk, const char *label, clattn_status also_ok) {
  cl_int e = 0;
  cl_context cc = clattn_cl_context(fx);
  const int dv = dk;
  float host[64];
  for (int i = 0; i < 64; i++) host[i] = 0.01f * (float)i;
  cl_mem q = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof host, host, &e);
  cl_mem kv = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof host, host, &e);
  cl_mem out = clCreateBuffer(cc, CL_MEM_READ_WRITE, sizeof host, NULL, &e);
  REQUIRE(q && kv && out);
  clattn_params p = clattn_params_default();
  p.batch = 1;
  p.q_heads = 1;
  p.kv_heads = 1;
  p.q_len = 1;
  p.kv_len = kv_len;
  p.head_dim = dk;
  p.value_dim = dv;
  p.q = (clattn_tensor){q, 0, {0, 0, (size_t)dk, 1}};
  p.k = (clattn_tensor){kv, 0, {0, 0, 0, 1}};
  p.v = (clattn_tensor){kv, 0, {0, 0, 0, 1}};
  p.out = (clattn_tensor){out, 0, {0, 0, (size_t)dv, 1}};
  p.algo = algo;
  finish();
  long live0 = shim_live();
  shim_reset();
  cl_event done = NULL;
  clattn_status st = clattn_forward(fx, &p, 0, NULL, &done);
  long calls = shim_calls();
  int enqueued = 0;
  for (long i = 1; i <= calls; i++) {
    const char *fn = shim_trace_fn(i);
    enqueued += fn && strncmp(fn, "clEnqueue", 9) == 0;
  }
  if (done) clReleaseEvent(done);
  finish();
  CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY || st == also_ok, "%s: N = %d: status %s, expected out of memory; message: %s",
         label, kv_len, clattn_status_string(st), clattn_last_error(NULL));
  CHECKF(clattn_last_error(NULL)[0] != '\0', "%s: empty message", label);
  CHECKF(enqueued == 0, "%s: %d commands enqueued by a call that cannot run", label, enqueued);
  CHECKF(shim_live() == live0, "%s: live objects %ld -> %ld", label, live0, shim_live());
  printf("    %s: %s: %s\n", label, clattn_status_string(st), clattn_last_error(NULL));
  clReleaseMemObject(q);
  clReleaseMemObject(kv);
  clReleaseMemObject(out);
}

static void oom_past_max_alloc(void) {
  cl_ulong max_alloc = 0;
  REQUIRE(clGetDeviceInfo(clattn_cl_device(fx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL) ==
          CL_SUCCESS);
  /* fused: packed K is dk x N floats; N = 2^30, dk = 8: 32 GiB */
  oom_case(CLATTN_ALGO_FUSED, 1 << 30, 8, "fused, packed keys past the largest allocation", CLATTN_ERR_OUT_OF_MEMORY);
  /* staged / GEMM: one row of scores is N floats: past max_alloc when 4 N > max_alloc */
  long long n = (long long)(max_alloc / 4) * 2;
  if (n > INT32_MAX) n = INT32_MAX;
  if ((cl_ulong)n * 4 > max_alloc) {
    /* refused before anything is enqueued (the fused path could run them) */
    oom_case(CLATTN_ALGO_STAGED, (int)n, 8, "staged, one score row past the largest allocation",
             CLATTN_ERR_OUT_OF_MEMORY);
    oom_case(CLATTN_ALGO_GEMM, (int)n, 8, "gemm, one score row past the largest allocation", CLATTN_ERR_OUT_OF_MEMORY);
  } else {
    printf("    (max alloc %llu: no score row can exceed it; staged/GEMM cases skipped)\n",
           (unsigned long long)max_alloc);
  }
}

/* An injected CL_MEM_OBJECT_ALLOCATION_FAILURE on each clCreateBuffer of a call. */
static void oom_injected_alloc(void) {
  const clattn_algo algos[] = {CLATTN_ALGO_STAGED, CLATTN_ALGO_FUSED, CLATTN_ALGO_GEMM};
  for (int a = 0; a < 3; a++) {
    cp_shape s = small_shape(algos[a]);
    s.kv_lens = 1;
    s.want_lse = 1;
    cp_problem *pb;
    KC_BUILD(pb, &s);
    cp_result r;
    if (!CHECK(cp_run(pb, fx, &r) == 0 && cp_result_ok(&r, 2e-4))) {
      cp_free(pb);
      continue;
    }
    for (long n = 1;; n++) {
      trim_pools(); /* the call creates its scratch anew */
      long live0 = shim_live();
      cl_event done = NULL;
      shim_reset();
      shim_arm(n, CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer");
      clattn_status st = clattn_forward(fx, &pb->params, 0, NULL, &done);
      shim_fault f;
      int fired = shim_fired(&f);
      shim_disarm();
      if (done) clReleaseEvent(done);
      finish();
      if (!fired) {
        if (shim_spared()) continue;
        CHECKF(n > 1, "%s: no clCreateBuffer", clattn_algo_name(algos[a]));
        break;
      }
      if (!f.in_main) /* CLBlast's own buffers: its status mapping */
        continue;
      g_injected++;
      g_in_main++;
      const char *msg = clattn_last_error(NULL);
      CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY, "%s: clCreateBuffer #%ld failing: %s: %s", clattn_algo_name(algos[a]), n,
             clattn_status_string(st), msg);
      CHECKF(strstr(msg, "clCreateBuffer") && strstr(msg, "CL_MEM_OBJECT_ALLOCATION_FAILURE"), "message: %s", msg);
      trim_pools(); /* what the call pooled before the failure; nothing may be left taken */
      CHECKF(shim_live() == live0, "%s: clCreateBuffer #%ld failing: live objects %ld -> %ld",
             clattn_algo_name(algos[a]), n, live0, shim_live());
    }
    cp_free(pb);
  }
}

/* ---------- CLBlast's temporary buffers ---------- */

static char g_self[4096];

/* Runs in a child process (the test executable again): a GEMM call whose
 * CLBlast temporary buffer cannot be allocated. Exits 0 when clattn_forward
 * returned an out-of-memory status, 1 on another status; CLBlast 1.5.3
 * aborts instead (its Buffer constructor throws, and the deleter of the
 * half-made buffer throws again during unwinding: std::terminate). */
static int clblast_alloc_child(void) {
  /* CLBlast allocates temporary (padded) matrices only in its indirect
   * GEMM, which it runs when m n k reaches XGEMM_MIN_INDIRECT_SIZE^3 (896^3
   * by default): Q K^T here is 1000 x 1000 x 728, in one chunk (setup's
   * budget for this child). Its direct kernel allocates nothing. */
  cp_shape s = small_shape(CLATTN_ALGO_GEMM);
  s.q_heads = s.kv_heads = 1;
  s.q_len = s.kv_len = 1000;
  s.head_dim = 728;
  char err[256];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  cp_result r;
  if (!pb || cp_run(pb, fx, &r) != 0 || !cp_result_ok(&r, 2e-4)) return 2;
  shim_reset();
  shim_arm(1, CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer");
  shim_arm_library_only(1);
  clattn_status st = clattn_forward(fx, &pb->params, 0, NULL, NULL);
  int fired = shim_fired(NULL);
  shim_disarm();
  finish();
  printf("child: fault fired %d, status %s: %s\n", fired, clattn_status_string(st), clattn_last_error(NULL));
  cp_free(pb);
  return fired && st == CLATTN_ERR_OUT_OF_MEMORY ? 0 : 1;
}

static void gemm_clblast_temp_buffer_failure(void) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "'%s' --clblast-alloc-child 2>&1", g_self);
  FILE *f = popen(cmd, "r");
  REQUIRE(f != NULL);
  char line[512];
  while (fgets(line, sizeof line, f)) printf("      | %s", line);
  int rc = pclose(f);
  CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
         "a GEMM call whose CLBlast temporary buffer fails to allocate %s (CLBlast's clblast::Buffer constructor: "
         "the host process must get CLATTN_ERR_OUT_OF_MEMORY, not an abort)",
         WIFSIGNALED(rc)                        ? "killed the process"
         : WIFEXITED(rc) && WEXITSTATUS(rc) > 1 ? "aborted (exit status)"
                                                : "returned another status");
}

/* ---------- the shim itself ---------- */

/* The wrappers see the calls made from clattn's objects: a forward call
 * counts calls, and a fault injected at the first clCreateKernel fails it. */
static void shim_interposes(void) {
  REQUIRE(shim_active());
  cp_shape s = small_shape(CLATTN_ALGO_STAGED);
  cp_problem *pb;
  KC_BUILD(pb, &s);
  cp_result r;
  REQUIRE(cp_run(pb, fx, &r) == 0);
  shim_reset();
  clattn_status st = clattn_forward(fx, &pb->params, 0, NULL, NULL);
  long calls = shim_calls();
  finish();
  CHECK(st == CLATTN_OK);
  CHECKF(calls > 10, "a staged call made %ld OpenCL calls through the shim", calls);
  CHECK(shim_trace_fn(1) != NULL);
  trim_pools(); /* the call creates its kernels anew */
  shim_reset();
  shim_arm(1, 0, "clCreateKernel");
  st = clattn_forward(fx, &pb->params, 0, NULL, NULL);
  shim_fault f;
  CHECK(shim_fired(&f) && f.in_main);
  shim_disarm();
  CHECK(st == CLATTN_ERR_OUT_OF_MEMORY);
  CHECK(strstr(clattn_last_error(NULL), "clCreateKernel(qk_score)") != NULL);
  finish();
  /* CLBlast's calls come through too (the executable exports the wrappers) */
  s.algo = CLATTN_ALGO_GEMM;
  cp_free(pb);
  KC_BUILD(pb, &s);
  REQUIRE(cp_run(pb, fx, &r) == 0);
  REQUIRE(cp_result_ok(&r, 2e-4));
  shim_reset();
  shim_arm(1, 0, "clEnqueueNDRangeKernel");
  st = clattn_forward(fx, &pb->params, 0, NULL, NULL);
  int lib_seen = 0;
  shim_disarm();
  finish();
  for (int i = 0; i < 2000; i++) {
    shim_reset();
    shim_arm(i + 1, 0, "clEnqueueNDRangeKernel");
    st = clattn_forward(fx, &pb->params, 0, NULL, NULL);
    int fired = shim_fired(&f);
    shim_disarm();
    finish();
    if (!fired) break;
    if (!f.in_main) {
      lib_seen = 1;
      break;
    }
  }
  printf("    staged call: %ld OpenCL calls seen; CLBlast's enqueues seen: %s\n", calls, lib_seen ? "yes" : "no");
  cp_free(pb);
}

/* ---------- the context's kernels and scratch ---------- */

/* Objects clattn created since shim_reset (kernels, buffers, programs;
 * CLBlast's own kernel objects per GEMM are not clattn's). */
static long creations(const char **first) {
  long n = 0;
  *first = "";
  for (long i = 1; i <= shim_calls(); i++) {
    const char *fn = shim_trace_fn(i);
    if (fn && shim_trace_in_main(i) &&
        (!strcmp(fn, "clCreateKernel") || !strcmp(fn, "clCreateBuffer") || !strcmp(fn, "clCreateSubBuffer") ||
         !strncmp(fn, "clCreateProgram", 15))) {
      if (!n) *first = fn;
      n++;
    }
  }
  return n;
}

/* Issue #12 item 4: a second identical call creates no OpenCL object. */
static void no_setup_on_repeat_calls(void) {
  cp_shape decode = cp_shape_default();
  decode.q_heads = 8;
  decode.kv_heads = 2;
  decode.q_len = 1;
  decode.kv_len = 515;
  decode.head_dim = decode.value_dim = 64;
  decode.seed = 3;
  cp_shape split = decode; /* one row block per KV head, many keys: split-KV and merge_states */
  split.q_heads = split.kv_heads = 1;
  split.kv_len = 1037;
  cp_shape error = decode;
  error.empty_rows = CLATTN_EMPTY_ERROR;
  error.kv_lens = 1;
  cp_shape staged = small_shape(CLATTN_ALGO_STAGED), gemm = small_shape(CLATTN_ALGO_GEMM);
  staged.want_lse = gemm.want_lse = 1;
  gemm.kv_lens = 1; /* a dense copy of V too */
  const struct {
    const char *label;
    const cp_shape *s;
  } cases[] = {{"decode (AUTO)", &decode},
               {"split-KV decode", &split},
               {"decode, EMPTY_ERROR", &error},
               {"staged, chunked", &staged},
               {"GEMM, V copied", &gemm}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    cp_problem *pb;
    KC_BUILD(pb, cases[c].s);
    cp_result r;
    if (!CHECKF(cp_run(pb, fx, &r) == 0 && cp_result_ok(&r, 2e-4), "%s: first call: %s", cases[c].label,
                clattn_last_error(NULL))) {
      cp_free(pb);
      continue;
    }
    for (int rep = 0; rep < 2; rep++) {
      finish();
      long live0 = shim_live();
      cl_event done = NULL;
      shim_reset();
      clattn_status st = clattn_forward(fx, &pb->params, 0, NULL, &done);
      const char *first;
      long made = creations(&first), calls = shim_calls();
      if (done) clReleaseEvent(done);
      finish();
      CHECKF(st == CLATTN_OK, "%s: %s", cases[c].label, clattn_last_error(NULL));
      CHECKF(made == 0, "%s: call %d after the first created %ld OpenCL objects (first: %s)", cases[c].label, rep + 2,
             made, first);
      CHECKF(shim_live() == live0, "%s: live objects %ld -> %ld", cases[c].label, live0, shim_live());
      if (rep == 1) printf("    %s: %ld OpenCL calls, none creating an object\n", cases[c].label, calls);
    }
    cp_free(pb);
  }
  int buffers;
  size_t bytes;
  ca_scratch_stats(fx, &buffers, &bytes);
  printf("    the context holds %d kernel objects and %d scratch buffers (%zu bytes)\n", ca_kernel_pool_size(fx),
         buffers, bytes);
}

/* A failure while the pools grow (a new scratch buffer, a grown one, a new
 * kernel object) fails that call cleanly and leaves the context usable: the
 * next call succeeds, and nothing is left taken (a trim frees it all). */
static void pool_growth_failure(void) {
  cp_shape small = small_shape(CLATTN_ALGO_STAGED);
  cp_shape big = small;
  big.kv_len = 1500; /* a score row of 6000 bytes: more scratch than small's call took (4 KiB) */
  const struct {
    const char *fn;
    int trim; /* 1: from empty pools (new objects), 0: grow the scratch small's call left */
  } steps[] = {{"clCreateBuffer", 1}, {"clCreateBuffer", 0}, {"clCreateKernel", 1}};
  cp_problem *ps, *pb;
  KC_BUILD(ps, &small);
  KC_BUILD(pb, &big);
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    cp_result r;
    trim_pools();
    if (!steps[i].trim && !CHECK(cp_run(ps, fx, &r) == 0 && cp_result_ok(&r, 2e-4))) continue;
    if (!CHECK(cp_upload(pb, fx) == 0 && cp_fill_outputs(pb, NAN) == 0)) continue;
    finish();
    long live0 = shim_live();
    cl_event done = NULL;
    shim_reset();
    shim_arm(1, 0, steps[i].fn);
    clattn_status st = clattn_forward(fx, &pb->params, 0, NULL, &done);
    shim_fault f;
    int fired = shim_fired(&f);
    shim_disarm();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", clattn_last_error(NULL));
    finish();
    if (!CHECKF(fired, "%s (%s pools): not called", steps[i].fn, steps[i].trim ? "empty" : "warm")) continue;
    g_injected++;
    g_in_main++;
    g_failed_cleanly += st != CLATTN_OK;
    CHECKF(st == CLATTN_ERR_OUT_OF_MEMORY && done == NULL, "%s failing: status %s, done %p: %s", steps[i].fn,
           clattn_status_string(st), (void *)done, msg);
    CHECKF(strstr(msg, steps[i].fn) != NULL, "the message names no %s: %s", steps[i].fn, msg);
    /* what the failed call took went back: a trim releases it all */
    trim_pools();
    CHECKF(shim_live() <= live0, "%s failing: %ld objects left taken", steps[i].fn, shim_live() - live0);
    /* the next calls succeed, the grown one and the small one */
    CHECKF(cp_run(pb, fx, &r) == 0 && cp_result_ok(&r, 2e-4), "after %s failed: %s: %s", steps[i].fn,
           clattn_status_string(r.status), clattn_last_error(NULL));
    CHECKF(cp_run(ps, fx, &r) == 0 && cp_result_ok(&r, 2e-4), "after %s failed, the small call: %s", steps[i].fn,
           clattn_status_string(r.status));
  }
  cp_free(ps);
  cp_free(pb);
}

/* ---------- setup ---------- */

static void summary(void) {
  printf(
      "  totals: %ld faults injected (%ld in clattn's calls, %ld in CLBlast's), %ld failed the call cleanly, "
      "%ld absorbed, %ld leaking\n",
      g_injected, g_in_main, g_in_lib, g_failed_cleanly, g_absorbed, g_leaks);
  printf("  %ld calls spared (CLBlast's own clCreateBuffer, which aborts the process when it fails)\n", g_spared);
  int main_sites = 0;
  for (int i = 0; i < g_n_sites; i++) main_sites += g_sites[i].in_main;
  printf(
      "  call sites hit: %d distinct (OpenCL function, return address) pairs, %d in clattn, %d in CLBlast; "
      "%d distinct failure messages\n",
      g_n_sites, main_sites, g_n_sites - main_sites, g_n_msgs);
  if (getenv("CLATTN_FAULTS_VERBOSE")) {
    for (int i = 0; i < g_n_msgs; i++) printf("    - %s\n", g_msgs[i]);
    for (int i = 0; i < g_n_sites; i++)
      printf("    site %-28s %p %s x%ld\n", g_sites[i].fn, g_sites[i].caller, g_sites[i].in_main ? "clattn" : "lib",
             g_sites[i].hits);
  }
  for (int i = 0; i < g_n_msgs; i++) free(g_msgs[i]);
}

static void cleanup(void) {
  summary();
  /* everything the context holds goes with it */
  clattn_destroy(fx);
  fx = NULL;
  ct_ctx = NULL;
  if (shim_live() != 0) {
    printf("  after destroying every context, alive through the shim:");
    for (int k = 0; k < SHIM_KINDS; k++)
      if (shim_live_kind((shim_kind)k)) printf(" %s %ld", shim_kind_name((shim_kind)k), shim_live_kind((shim_kind)k));
    printf(" (CLBlast's program cache keeps its programs and their context)\n");
  }
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache_dir);
  if (g_cache_dir[0]) (void)!system(cmd);
}

/* scratch: the staged and GEMM paths' budget in bytes (CLATTN_SCRATCH_BYTES). */
static void setup(const char *scratch) {
  snprintf(g_cache_dir, sizeof g_cache_dir, "%s/clattn-faults-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_cache_dir)) {
    printf("mkdtemp failed\n");
    exit(1);
  }
  setenv("CLATTN_SCRATCH_BYTES", scratch, 1);
  clattn_options opt = {0};
  opt.cache_dir = g_cache_dir;
  clattn_status st = clattn_create(&opt, &fx);
  unsetenv("CLATTN_SCRATCH_BYTES");
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: no OpenCL device (%s)\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  if (st != CLATTN_OK) {
    printf("clattn_create failed: %s: %s\n0 passed, 1 failed\n", clattn_status_string(st), clattn_last_error(NULL));
    exit(1);
  }
  ct_ctx = fx;
  ct_cleanup = cleanup;
  shim_spare_library_fn("clCreateBuffer");
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(shim_interposes),
      CT_TEST(faults_staged),
      CT_TEST(faults_fused_prefill),
      CT_TEST(faults_fused_decode_split),
      CT_TEST(faults_gemm),
      CT_TEST(faults_empty_error),
      CT_TEST(faults_storage_sequences_shaping),
      CT_TEST(faults_merge),
      CT_TEST(faults_paged_q8_0),
      CT_TEST(faults_plans),
      CT_TEST(faults_fused_first_build),
      CT_TEST(faults_backward),
      CT_TEST(faults_backward_first_build),
      CT_TEST(faults_create),
      CT_TEST(faults_create_embedded),
      CT_TEST(faults_create_no_cache),
      CT_TEST(oom_past_max_alloc),
      CT_TEST(oom_injected_alloc),
      CT_TEST(gemm_clblast_temp_buffer_failure),
      CT_TEST(no_setup_on_repeat_calls),
      CT_TEST(pool_growth_failure),
  };
  ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (len > 0) g_self[len] = '\0';
  if (argc > 1 && strcmp(argv[1], "--clblast-alloc-child") == 0) {
    setup("8000000");
    shim_spare_library_fn(NULL);
    int rc = clblast_alloc_child();
    clattn_destroy(fx);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache_dir);
    (void)!system(cmd);
    return rc;
  }
  setup("256"); /* a small scratch budget: the staged and GEMM calls run in several chunks */
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
