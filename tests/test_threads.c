/*
 * Threads: eight host threads call clattn_forward concurrently, 1000 calls
 * in total over a table of small problems (shapes, masks, bias, causal and
 * windows, kv_lens, MHA/GQA/MQA, decode with split keys, every algorithm,
 * lse, weights, the route diagnostics, empty-row errors and a rejected
 * call). Threads 0-3 share the test's clattn context and its queue; threads
 * 4-7 each create (concurrently) an embedded clattn context on the same
 * cl_context and device with a command queue of their own. Every thread
 * owns its problems and buffers (the kit's cp_run is per problem).
 *
 * Every other call of a thread goes through a plan of its own instead
 * (clattn_plan_create on its context, clattn_plan_enqueue as planned), and
 * the threads on the shared context also enqueue one plan they all share.
 *
 * Every result must be bitwise equal (whole output buffers: out, lse,
 * weights, entropy, max_weight, argmax, gaps included) to the same problem
 * computed single-threaded beforehand, with the same status; the
 * single-threaded results are checked against the fp64 reference first.
 * They are computed on a context of their own (embedded, own queue), so
 * the shared context meets its first calls in the threads: its fused
 * programs (built on first use per head_dim/value_dim) are asked for by
 * four threads at once.
 *
 * Worker threads never touch the harness's globals (CHECK is not thread
 * safe): they record failures in their own slot, and the main thread
 * reports them after joining.
 *
 * THREADS_CALLS=n changes the total number of calls (default 1000).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "api/api.h" /* ca_cache_counts: programs a context has built */
#include "kit_checks.h"

#define TOL            1e-5
#define NTHREADS       8
#define SHARED_THREADS 4 /* threads [0, SHARED_THREADS) use ct_context() */
#define DEFAULT_CALLS  1000

typedef struct {
  cp_shape shape;
  clattn_status expect; /* the status every run must return */
  const char *what;
} tcase;

#define MAX_CASES 32
static tcase g_cases[MAX_CASES];
static int g_ncases;

/* The single-threaded results: whole raw output buffers and the status. */
typedef struct {
  clattn_status status;
  float *out, *lse, *weights, *entropy, *max_weight;
  int32_t *argmax;
  size_t out_elems, lse_elems, weights_elems, diag_elems;
} baseline;
static baseline g_base[MAX_CASES];

static void add_case(cp_shape s, clattn_algo algo, clattn_status expect, const char *what) {
  s.algo = algo;
  s.seed = 7000 + (uint64_t)g_ncases;
  g_cases[g_ncases].shape = s;
  g_cases[g_ncases].expect = expect;
  g_cases[g_ncases].what = what;
  g_ncases++;
}

/* Small problems, so a call takes about a millisecond. The fused programs
 * are built per (head_dim, value_dim) and per context: the cases that can
 * run FUSED (FUSED, and AUTO without weights) keep to a few pairs. */
static void make_cases(void) {
  cp_shape s;

  s = cp_shape_default(); /* 16 x 16, d 32 */
  s.want_lse = 1;
  add_case(s, CLATTN_ALGO_STAGED, CLATTN_OK, "default, staged");
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_OK, "default, fused");

  s = cp_shape_default(); /* GQA 2, causal, kv_lens */
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 64;
  s.value_dim = 40;
  s.causal = 1;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.want_diag = 1;
  s.poison_gaps = 1;
  add_case(s, CLATTN_ALGO_STAGED, CLATTN_OK, "gqa causal kv_lens weights diag, staged");
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "gqa causal kv_lens weights diag, gemm");
  add_case(s, CLATTN_ALGO_AUTO, CLATTN_OK, "gqa causal kv_lens weights diag, auto");
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_ERR_UNSUPPORTED, "fused with weights: rejected");
  s.want_weights = 0;
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_OK, "gqa causal kv_lens diag, fused");
  add_case(s, CLATTN_ALGO_AUTO, CLATTN_OK, "gqa causal kv_lens diag, auto");

  s = cp_shape_default(); /* MQA, window, mask, bias, BSHD */
  s.q_heads = 4;
  s.kv_heads = 1;
  s.q_len = 23;
  s.kv_len = 29;
  s.head_dim = 32;
  s.value_dim = 32;
  s.window_left = 5;
  s.window_right = 2;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 0.8;
  s.mask_bcast = CP_BCAST_HEAD;
  s.bias = CP_BIAS_RANDOM;
  s.bias_bcast = CP_BCAST_BATCH;
  s.layout = CP_BSHD;
  s.pad = 3;
  s.row_gap = 2;
  s.want_lse = 1;
  s.want_diag = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_OK, "mqa window mask bias bshd, fused");
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "mqa window mask bias bshd, gemm");
  add_case(s, CLATTN_ALGO_STAGED, CLATTN_OK, "mqa window mask bias bshd, staged");

  s = cp_shape_default(); /* decode: split keys + merge */
  s.batch = 2;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.q_len = 1;
  s.kv_len = 600;
  s.head_dim = 64;
  s.value_dim = 64;
  s.causal = 1;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.layout = CP_BSHD;
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_OK, "decode gqa 4, fused (split keys)");
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "decode gqa 4, gemm");
  s.want_diag = 1;
  add_case(s, CLATTN_ALGO_AUTO, CLATTN_OK, "decode gqa 4 diag, auto");

  s = cp_shape_default(); /* block-diagonal, dk != dv */
  s.batch = 2;
  s.q_heads = 2;
  s.kv_heads = 2;
  s.q_len = 32;
  s.kv_len = 32;
  s.head_dim = 8;
  s.value_dim = 24;
  s.causal = 1;
  s.mask = CP_MASK_BLOCK_DIAG;
  s.mask_blocks = 3;
  s.mask_bcast = CP_BCAST_HEAD | CP_BCAST_BATCH;
  s.want_lse = 1;
  s.want_weights = 1;
  add_case(s, CLATTN_ALGO_STAGED, CLATTN_OK, "block-diagonal causal, staged");
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "block-diagonal causal, gemm");

  s = cp_shape_default(); /* no allowed key: EMPTY_ERROR */
  s.q_len = 9;
  s.kv_len = 11;
  s.mask = CP_MASK_ZEROS;
  s.want_lse = 1;
  s.want_diag = 1;
  s.empty_rows = CLATTN_EMPTY_ERROR;
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_ERR_EMPTY_ROW, "all rows empty, error policy, fused");
  s = cp_shape_default(); /* causal M > N: leading rows empty */
  s.q_heads = 3;
  s.kv_heads = 1;
  s.q_len = 20;
  s.kv_len = 9;
  s.head_dim = 1;
  s.value_dim = 1;
  s.causal = 1;
  s.want_lse = 1;
  s.want_weights = 1;
  s.want_diag = 1;
  s.empty_rows = CLATTN_EMPTY_ERROR;
  add_case(s, CLATTN_ALGO_STAGED, CLATTN_ERR_EMPTY_ROW, "causal M > N, error policy, staged");
  s.empty_rows = CLATTN_EMPTY_ZERO;
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "causal M > N, d 1, gemm");
  s = cp_shape_default(); /* error policy, nothing empty */
  s.batch = 2;
  s.q_heads = 2;
  s.kv_heads = 2;
  s.q_len = 24;
  s.kv_len = 40;
  s.bias = CP_BIAS_CONST;
  s.bias_amp = 3.0;
  s.mask = CP_MASK_RANDOM;
  s.mask_density = 1.0;
  s.mask_bcast = CP_BCAST_BATCH;
  s.empty_rows = CLATTN_EMPTY_ERROR;
  s.want_lse = 1;
  add_case(s, CLATTN_ALGO_GEMM, CLATTN_OK, "error policy without empty rows, gemm");
  add_case(s, CLATTN_ALGO_FUSED, CLATTN_OK, "error policy without empty rows, fused");

  s = cp_shape_default(); /* uniform routing (scale 0) */
  s.q_len = 13;
  s.kv_len = 17;
  s.head_dim = 5;
  s.value_dim = 3;
  s.scale = 0.0f;
  s.want_weights = 1;
  s.want_diag = 1;
  add_case(s, CLATTN_ALGO_AUTO, CLATTN_OK, "scale 0, auto (staged for weights)");
}

/* An embedded clattn context on cl_ctx/device with a queue of its own. */
static clattn_status embedded_create(cl_context cl_ctx, cl_device_id device, cl_command_queue *queue,
                                     clattn_context **ctx, char *why, size_t n) {
  cl_int e;
  *ctx = NULL;
  *queue = clCreateCommandQueue(cl_ctx, device, 0, &e);
  if (e != CL_SUCCESS || !*queue) {
    snprintf(why, n, "clCreateCommandQueue: %s", cp_cl_error_name(e));
    *queue = NULL;
    return CLATTN_ERR_OPENCL;
  }
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = cl_ctx;
  opt.device = device;
  opt.queue = *queue;
  clattn_status st = clattn_create(&opt, ctx);
  if (st != CLATTN_OK) {
    snprintf(why, n, "clattn_create(embedded): %s: %s", clattn_status_string(st), clattn_last_error(NULL));
    *ctx = NULL;
    clReleaseCommandQueue(*queue);
    *queue = NULL;
    return st;
  }
  if (clattn_cl_queue(*ctx) != *queue || clattn_cl_context(*ctx) != cl_ctx) {
    snprintf(why, n, "the embedded context does not use the given queue and context");
    clattn_destroy(*ctx);
    clReleaseCommandQueue(*queue);
    *ctx = NULL;
    *queue = NULL;
    return CLATTN_ERR_OPENCL;
  }
  return CLATTN_OK;
}

static int copy_out(void **dst, const void *src, size_t bytes) {
  *dst = NULL;
  if (!src || bytes == 0) return 0;
  *dst = malloc(bytes);
  if (!*dst) return -1;
  memcpy(*dst, src, bytes);
  return 0;
}

/* Whether pb's raw outputs (after a run) equal the baseline bit for bit;
 * names the first output that differs. */
static const char *differs(const cp_problem *pb, const baseline *b) {
  if (b->out_elems && memcmp(pb->out_raw, b->out, b->out_elems * sizeof(float))) return "out";
  if (b->lse_elems && memcmp(pb->lse_raw, b->lse, b->lse_elems * sizeof(float))) return "lse";
  if (b->weights_elems && memcmp(pb->weights_raw, b->weights, b->weights_elems * sizeof(float))) return "weights";
  if (b->diag_elems && memcmp(pb->entropy_raw, b->entropy, b->diag_elems * sizeof(float))) return "entropy";
  if (b->diag_elems && memcmp(pb->max_weight_raw, b->max_weight, b->diag_elems * sizeof(float))) return "max_weight";
  if (b->diag_elems && memcmp(pb->argmax_raw, b->argmax, b->diag_elems * sizeof(int32_t))) return "argmax";
  return NULL;
}

/* Whether a single-threaded result is right: the expected status, then the
 * reference within TOL (for EMPTY_ROW too: the outputs hold EMPTY_ZERO's
 * result); a rejected call leaves the NaN-poisoned outputs as they were. */
static int baseline_ok(const tcase *c, const cp_problem *pb, const cp_result *r, char *why, size_t n) {
  char f[512];
  cp_result_format(r, f, sizeof f);
  if (r->status != c->expect) {
    snprintf(why, n, "status %s, expected %s (%s)", clattn_status_string(r->status), clattn_status_string(c->expect),
             clattn_last_error(NULL));
    return 0;
  }
  if (c->expect == CLATTN_OK || c->expect == CLATTN_ERR_EMPTY_ROW) {
    cp_result rr = *r;
    rr.status = CLATTN_OK;
    if (!cp_result_ok(&rr, TOL)) {
      snprintf(why, n, "against the reference: %s", f);
      return 0;
    }
    if (c->expect == CLATTN_ERR_EMPTY_ROW && r->empty_rows == 0) {
      snprintf(why, n, "EMPTY_ROW returned but the reference has no empty row");
      return 0;
    }
    return 1;
  }
  for (size_t i = 0; i < pb->out_elems; i++)
    if (!isnan(pb->out_raw[i])) {
      snprintf(why, n, "a rejected call wrote out[%zu]", i);
      return 0;
    }
  return 1;
}

static void compute_baselines(clattn_context *ctx) {
  for (int i = 0; i < g_ncases; i++) {
    const tcase *c = &g_cases[i];
    cp_problem *pb;
    KC_BUILD(pb, &c->shape);
    cp_result r;
    if (!CHECKF(cp_run(pb, ctx, &r) == 0, "case %d (%s): harness: %s", i, c->what, pb->err)) {
      cp_free(pb);
      continue;
    }
    char why[768];
    CHECKF(baseline_ok(c, pb, &r, why, sizeof why), "case %d (%s): %s", i, c->what, why);
    baseline *b = &g_base[i];
    b->status = r.status;
    b->out_elems = pb->out_elems;
    b->lse_elems = pb->lse_elems;
    b->weights_elems = pb->weights_elems;
    b->diag_elems = pb->diag_elems;
    int bad = copy_out((void **)&b->out, pb->out_raw, pb->out_elems * sizeof(float)) ||
              copy_out((void **)&b->lse, pb->lse_raw, pb->lse_elems * sizeof(float)) ||
              copy_out((void **)&b->weights, pb->weights_raw, pb->weights_elems * sizeof(float)) ||
              copy_out((void **)&b->entropy, pb->entropy_raw, pb->diag_elems * sizeof(float)) ||
              copy_out((void **)&b->max_weight, pb->max_weight_raw, pb->diag_elems * sizeof(float)) ||
              copy_out((void **)&b->argmax, pb->argmax_raw, pb->diag_elems * sizeof(int32_t));
    CHECKF(!bad, "case %d: out of host memory", i);
    /* A second single-threaded run must repeat the first bit for bit. */
    if (CHECKF(cp_run(pb, ctx, &r) == 0, "case %d: harness: %s", i, pb->err)) {
      const char *d = differs(pb, b);
      CHECKF(r.status == b->status && !d, "case %d (%s): a repeated single-threaded run differs (%s)", i, c->what,
             d ? d : "status");
    }
    cp_free(pb);
  }
}

/* ---------- the threads ---------- */

typedef struct {
  int index;
  int calls;         /* calls to make */
  cl_context cl_ctx; /* for the embedded threads */
  cl_device_id device;
  /* results */
  int done; /* calls made */
  int planned; /* of them through a plan */
  int shared_steps; /* steps of the shared plan enqueued */
  int per_case[MAX_CASES];
  int failures;
  char first_failure[768];
  double ms;
} worker;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
fail(worker *w, const char *fmt, ...) {
  if (w->failures++ == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first_failure, sizeof w->first_failure, fmt, ap);
    va_end(ap);
  }
}

/* The plan the shared-context threads all enqueue: its problem, its plan. */
static cp_problem *g_shared_pb;
static clattn_plan *g_shared_plan;
static int g_shared_case = -1;

/* Runs pb through a plan (made on first use, kept in *plan): poisons the
 * outputs, enqueues a step as planned, waits, reads them back. The status
 * is the creation's when it refused the params. 0, or -1 (harness). */
static int run_planned(cp_problem *pb, clattn_context *ctx, clattn_plan **plan, clattn_status *made,
                       clattn_status *st) {
  if (!pb->q_buf && cp_upload(pb, ctx) != 0) return -1;
  if (!*plan && *made == CLATTN_OK) *made = clattn_plan_create(ctx, &pb->params, plan);
  if (cp_fill_outputs(pb, NAN) != 0) return -1;
  *st = *made != CLATTN_OK ? *made : clattn_plan_enqueue(*plan, NULL, 0, NULL, NULL);
  return clFinish(pb->queue) == CL_SUCCESS && cp_read_outputs(pb) == 0 ? 0 : -1;
}

static void *work(void *arg) {
  worker *w = arg;
  double t0 = cp_now_ms();
  clattn_context *ctx = NULL;
  cl_command_queue queue = NULL;
  cp_problem *pbs[MAX_CASES] = {0};
  clattn_plan *plans[MAX_CASES] = {0};
  clattn_status made[MAX_CASES] = {CLATTN_OK};

  if (w->index < SHARED_THREADS) {
    ctx = ct_ctx; /* created by the main thread before any worker */
  } else {
    char why[512];
    if (embedded_create(w->cl_ctx, w->device, &queue, &ctx, why, sizeof why) != CLATTN_OK) {
      fail(w, "thread %d: %s", w->index, why);
      goto out;
    }
  }

  for (int i = 0; i < g_ncases; i++) {
    char err[256];
    pbs[i] = cp_build(&g_cases[i].shape, err, sizeof err);
    if (!pbs[i]) {
      fail(w, "thread %d: cp_build case %d: %s", w->index, i, err);
      goto out;
    }
  }

  /* Threads start at different cases, so different problems (and paths)
   * run at the same time. */
  const int start = w->index * g_ncases / NTHREADS;
  for (int n = 0; n < w->calls; n++) {
    const int i = (start + n) % g_ncases;
    cp_problem *pb = pbs[i];
    const baseline *b = &g_base[i];
    cp_result r;
    const int planned = n % 2;
    if (planned ? run_planned(pb, ctx, &plans[i], &made[i], &r.status) != 0 : cp_run(pb, ctx, &r) != 0) {
      fail(w, "thread %d, call %d, case %d (%s): harness: %s", w->index, n, i, g_cases[i].what, pb->err);
      break;
    }
    w->done++;
    w->planned += planned;
    if (g_shared_plan && w->index < SHARED_THREADS && n % 4 == 0) {
      if (clattn_plan_enqueue(g_shared_plan, NULL, 0, NULL, NULL) != CLATTN_OK)
        fail(w, "thread %d: the shared plan's step: %s", w->index, clattn_last_error(ctx));
      w->shared_steps++;
    }
    w->per_case[i]++;
    if (r.status != b->status) {
      fail(w, "thread %d, call %d, case %d (%s): status %s, single-threaded %s (%s)", w->index, n, i, g_cases[i].what,
           clattn_status_string(r.status), clattn_status_string(b->status), clattn_last_error(ctx));
      continue;
    }
    const char *d = differs(pb, b);
    if (d)
      fail(w, "thread %d, call %d, case %d (%s): %s differs from the single-threaded result", w->index, n, i,
           g_cases[i].what, d);
    if (n % 50 == 0) (void)clattn_peak_scratch_bytes(ctx, 0); /* reads under the context's lock */
  }

out:
  for (int i = 0; i < g_ncases; i++) { /* before the embedded context and its queue go */
    clattn_plan_release(plans[i]);
    cp_free(pbs[i]);
  }
  if (w->index >= SHARED_THREADS) {
    clattn_destroy(ctx);
    if (queue) clReleaseCommandQueue(queue);
  }
  w->ms = cp_now_ms() - t0;
  return NULL;
}

/* The context's reference count once POCL has released the objects behind
 * the commands that finished (it does so asynchronously, after clFinish):
 * unchanged over 100 ms, or after 3 s. Counted before the threads too early,
 * it held the baseline's last events, and the count after them read low. */
static cl_uint settled_context_refs(cl_context c) {
  cl_uint refs = cp_context_refs(c);
  for (int tries = 0, same = 0; tries < 300 && same < 10; tries++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    const cl_uint now = cp_context_refs(c);
    same = now == refs ? same + 1 : 0;
    refs = now;
  }
  return refs;
}

static void threads_match_single_threaded_results(void) {
  clattn_context *ctx = ct_context();
  make_cases();
  const char *env = getenv("THREADS_CALLS");
  int total = env && *env ? atoi(env) : DEFAULT_CALLS;
  if (total < NTHREADS) total = NTHREADS;

  /* CLBlast keeps its programs for this cl_context while a context that
   * called it lives (clattn_destroy of the last one empties its caches): a
   * GEMM call on the shared context first, so that the baseline context's
   * end leaves them be, and the count below sees neither their building
   * nor their release. */
  for (int i = 0; i < g_ncases && ca_gemm_available(); i++)
    if (g_cases[i].shape.algo == CLATTN_ALGO_GEMM) {
      cp_problem *pb;
      KC_BUILD(pb, &g_cases[i].shape);
      cp_result r;
      CHECKF(cp_run(pb, ctx, &r) == 0 && r.status == CLATTN_OK, "a first GEMM call: %s", pb->err);
      cp_free(pb);
      clFinish(clattn_cl_queue(ctx));
      ca_kernel_pool_trim(ctx); /* what the call pooled goes, as after the threads */
      ca_scratch_pool_trim(ctx);
      break;
    }
  double t0 = cp_now_ms();
  cl_command_queue base_queue;
  clattn_context *base_ctx;
  char why[512];
  REQUIREF(embedded_create(clattn_cl_context(ctx), clattn_cl_device(ctx), &base_queue, &base_ctx, why, sizeof why) ==
               CLATTN_OK,
           "baseline context: %s", why);
  compute_baselines(base_ctx);
  clattn_destroy(base_ctx);
  clReleaseCommandQueue(base_queue);
  double base_ms = cp_now_ms() - t0;
  printf("  %d cases computed single-threaded (each twice, on a context of their own) in %.0f ms\n", g_ncases, base_ms);
  if (ct_current_failures) return;

  /* Every OpenCL object clattn or the kit creates (buffers, kernels,
   * programs, events, queues) retains the cl_context on POCL: its count
   * after the threads have destroyed their problems and contexts shows a
   * leak that LeakSanitizer would not attribute to us (the objects live in
   * POCL). The shared context keeps the fused programs it builds in the
   * threads (one per head_dim/value_dim, however many threads ask at once),
   * each holding the runtime's implicit references (none on Intel's, which
   * counts explicit retains only: cp_refs_show_leaks says so). */
  const cl_context cl_ctx = clattn_cl_context(ctx);
  const cl_uint per_program = cp_refs_show_leaks(cl_ctx) ? cp_implicit_context_refs(cl_ctx) : 0;
  const cl_command_queue shared_queue = clattn_cl_queue(ctx);
  const cl_uint ctx_refs0 = settled_context_refs(cl_ctx), queue_refs0 = cp_queue_refs(shared_queue);
  int src0, cache0;
  ca_cache_counts(ctx, &src0, &cache0);

  /* the plan the shared-context threads all enqueue: split-key decode */
  for (int i = 0; i < g_ncases; i++)
    if (strstr(g_cases[i].what, "split keys")) g_shared_case = i;
  REQUIRE(g_shared_case >= 0);
  KC_BUILD(g_shared_pb, &g_cases[g_shared_case].shape);
  REQUIRE(cp_upload(g_shared_pb, ctx) == 0);
  REQUIRE(clattn_plan_create(ctx, &g_shared_pb->params, &g_shared_plan) == CLATTN_OK);

  static worker w[NTHREADS];
  pthread_t tid[NTHREADS];
  int started[NTHREADS] = {0};
  for (int t = 0; t < NTHREADS; t++) {
    memset(&w[t], 0, sizeof w[t]);
    w[t].index = t;
    w[t].calls = total / NTHREADS + (t < total % NTHREADS);
    w[t].cl_ctx = clattn_cl_context(ctx);
    w[t].device = clattn_cl_device(ctx);
  }
  t0 = cp_now_ms();
  for (int t = 0; t < NTHREADS; t++)
    started[t] = CHECKF(pthread_create(&tid[t], NULL, work, &w[t]) == 0, "pthread_create %d", t);
  for (int t = 0; t < NTHREADS; t++)
    if (started[t]) pthread_join(tid[t], NULL);
  double ms = cp_now_ms() - t0;

  int calls = 0, shared = 0, planned = 0, shared_steps = 0;
  for (int t = 0; t < NTHREADS; t++) {
    calls += w[t].done;
    planned += w[t].planned;
    shared_steps += w[t].shared_steps;
    if (t < SHARED_THREADS) shared += w[t].done;
    printf("  thread %d (%s): %d calls in %.0f ms%s%s\n", t,
           t < SHARED_THREADS ? "shared context and queue" : "own embedded context and queue", w[t].done, w[t].ms,
           w[t].failures ? ", FAILED: " : "", w[t].failures ? w[t].first_failure : "");
    CHECKF(w[t].failures == 0, "thread %d: %d failures, first: %s", t, w[t].failures, w[t].first_failure);
    CHECKF(w[t].done == w[t].calls, "thread %d made %d of %d calls", t, w[t].done, w[t].calls);
  }
  for (int i = 0; i < g_ncases; i++) {
    int n = 0;
    for (int t = 0; t < NTHREADS; t++) n += w[t].per_case[i];
    CHECKF(n > 0, "case %d (%s) never ran in a thread", i, g_cases[i].what);
  }
  printf(
      "  %d concurrent calls (%d on the shared context, %d on %d embedded contexts) over %d cases "
      "in %.0f ms (%.2f ms per call), all bitwise equal to the single-threaded results\n",
      calls, shared, calls - shared, NTHREADS - SHARED_THREADS, g_ncases, ms, calls ? ms / calls : 0.0);
  CHECKF(calls == total, "%d calls made, %d planned", calls, total);
  /* the shared plan's last step wrote what the baseline holds */
  if (CHECK(clFinish(clattn_cl_queue(ctx)) == CL_SUCCESS) && CHECK(cp_read_outputs(g_shared_pb) == 0)) {
    const char *d = differs(g_shared_pb, &g_base[g_shared_case]);
    CHECKF(!d, "the plan shared by %d threads: %s differs from the single-threaded result", SHARED_THREADS, d);
  }
  printf("  of them %d through plans of their threads' own; %d steps of one plan shared by %d threads\n", planned,
         shared_steps, SHARED_THREADS);
  clattn_plan_release(g_shared_plan);
  g_shared_plan = NULL;
  cp_free(g_shared_pb);
  g_shared_pb = NULL;

  /* The fused programs the shared context built: at most one per distinct
   * (head_dim, value_dim) among the cases that can run FUSED. */
  int src1, cache1, pairs = 0;
  ca_cache_counts(ctx, &src1, &cache1);
  const int built = (src1 - src0) + (cache1 - cache0);
  for (int i = 0; i < g_ncases; i++) {
    const cp_shape *a = &g_cases[i].shape;
    int fresh = (a->algo == CLATTN_ALGO_FUSED || a->algo == CLATTN_ALGO_AUTO) && !a->want_weights;
    for (int j = 0; j < i && fresh; j++) {
      const cp_shape *b = &g_cases[j].shape;
      if ((b->algo == CLATTN_ALGO_FUSED || b->algo == CLATTN_ALGO_AUTO) && !b->want_weights &&
          b->head_dim == a->head_dim && b->value_dim == a->value_dim)
        fresh = 0;
    }
    pairs += fresh;
  }
  printf(
      "  the shared context built %d fused programs in the threads (%d head/value dim pairs can "
      "run fused)\n",
      built, pairs);
  CHECKF(built <= pairs, "the shared context built %d programs for %d (head_dim, value_dim) pairs", built, pairs);

  /* POCL releases the objects behind finished commands asynchronously. The
   * context's pooled kernels and scratch (as many as calls held at once) go
   * with a trim; the programs stay. */
  const cl_uint ctx_refs1 = ctx_refs0 + (cl_uint)built * per_program;
  clFinish(shared_queue);
  printf("  the shared context pooled %d kernel objects in the threads\n", ca_kernel_pool_size(ctx));
  ca_kernel_pool_trim(ctx);
  ca_scratch_pool_trim(ctx);
  for (int tries = 0; tries < 300; tries++) {
    if (cp_context_refs(cl_ctx) == ctx_refs1 && cp_queue_refs(shared_queue) == queue_refs0) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECKF(cp_context_refs(cl_ctx) == ctx_refs1,
         "cl_context reference count %u after the threads, %u before and %d programs kept: an OpenCL "
         "object leaked",
         cp_context_refs(cl_ctx), ctx_refs0, built);
  CHECKF(cp_queue_refs(shared_queue) == queue_refs0, "shared queue reference count %u after the threads, %u before",
         cp_queue_refs(shared_queue), queue_refs0);
}

static void free_baselines(void) {
  for (int i = 0; i < g_ncases; i++) {
    baseline *b = &g_base[i];
    free(b->out);
    free(b->lse);
    free(b->weights);
    free(b->entropy);
    free(b->max_weight);
    free(b->argmax);
  }
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(threads_match_single_threaded_results),
  };
  ct_cleanup = free_baselines;
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
