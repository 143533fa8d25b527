/*
 * First uses and waits, each in a child process of its own (fork; this
 * process never calls OpenCL, so each child's first call is the process's
 * first OpenCL use): a crash kills only the child, and an alarm() watchdog
 * in the child turns a hang into a failure.
 *
 *   - eight threads call clattn_create at once as the process's first
 *     OpenCL use (platform and device discovery);
 *   - eight threads make their first CLATTN_ALGO_GEMM call at once, on one
 *     shared context and on a context each (CLBlast's first use);
 *   - a GEMM call whose wait list holds a user event that is not complete
 *     returns at once, and computes on the inputs as they are when the event
 *     completes (an in-order queue, and an out-of-order embedded queue).
 *
 * The races are not certain to show in one run: each child runs
 * FIRST_USE_RUNS times (default 3).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kit_checks.h"

#define TOL        1e-5
#define NTHREADS   8
#define WATCHDOG_S 300 /* a child that runs longer is hung */
#define PROMPT_S   20  /* clattn_forward must return within this while its wait list is pending */

static int g_skipped;

/* Runs fn in a child process with an alarm() watchdog; the child's failed
 * checks, a crash or the watchdog fail the test. */
static void in_child(const char *what, void (*fn)(void)) {
  const char *env = getenv("FIRST_USE_RUNS");
  int runs = env && *env ? atoi(env) : 3;
  for (int run = 0; run < runs && !g_skipped; run++) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIREF(pid >= 0, "%s: fork: %s", what, strerror(errno));
    if (pid == 0) {
      alarm(WATCHDOG_S);
      ct_current_failures = 0;
      fn();
      fflush(stdout);
      exit(ct_current_failures ? 1 : 0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == CT_SKIP) {
      g_skipped = 1;
      return;
    }
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      CHECKF(0, "%s, run %d: hung (the child's %d s watchdog fired)", what, run + 1, WATCHDOG_S);
    else if (WIFSIGNALED(status))
      CHECKF(0, "%s, run %d: the child was killed by signal %d (%s)", what, run + 1, WTERMSIG(status),
             strsignal(WTERMSIG(status)));
    else
      CHECKF(WEXITSTATUS(status) == 0, "%s, run %d: failed in the child (exit status %d)", what, run + 1,
             WEXITSTATUS(status));
  }
}

/* ---------- eight threads at once ---------- */

typedef struct {
  int index;
  pthread_barrier_t *start;
  clattn_context *ctx; /* in: the shared context, or NULL to create one; out: the one used */
  cp_problem *pb;      /* NULL: only create */
  clattn_status create_status;
  char failure[1024];
} racer;

static void *race(void *arg) {
  racer *r = arg;
  /* the outputs NaN-poisoned before the barrier: after it, the threads go
   * straight into clattn_forward together */
  if (r->pb && r->ctx && cp_fill_outputs(r->pb, NAN) != 0)
    snprintf(r->failure, sizeof r->failure, "harness: %s", r->pb->err);
  pthread_barrier_wait(r->start);
  if (r->failure[0]) return NULL;
  if (!r->ctx) {
    r->create_status = clattn_create(NULL, &r->ctx);
    if (r->create_status != CLATTN_OK) {
      snprintf(r->failure, sizeof r->failure, "clattn_create: %s: %s", clattn_status_string(r->create_status),
               clattn_last_error(NULL));
      return NULL;
    }
  }
  if (!r->pb) return NULL;
  cp_result res;
  memset(&res, 0, sizeof res);
  res.status = clattn_forward(r->ctx, &r->pb->params, 0, NULL, NULL);
  cl_int e = clFinish(r->pb->queue);
  if (e != CL_SUCCESS || cp_read_outputs(r->pb) != 0 || cp_compare(r->pb, &res) != 0) {
    snprintf(r->failure, sizeof r->failure, "harness: clFinish %d; %s", (int)e, r->pb->err);
    return NULL;
  }
  char f[400];
  if (!cp_result_ok(&res, TOL))
    snprintf(r->failure, sizeof r->failure, "first GEMM call: %s (%s)", cp_result_format(&res, f, sizeof f),
             clattn_last_error(r->ctx));
  return NULL;
}

/* A GQA problem the GEMM path runs with CLBlast (several (b, head) runs). */
static cp_shape gemm_shape(int index) {
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = 64;
  s.value_dim = 40;
  s.causal = index % 2;
  s.want_lse = 1;
  s.algo = CLATTN_ALGO_GEMM;
  s.seed = 900 + (uint64_t)index;
  return s;
}

/* Starts NTHREADS racers together; shared: one context for all (created
 * here), else each creates its own (in the thread when create_in_thread).
 * with_gemm: each then makes its first GEMM call. */
static void run_race(int shared, int create_in_thread, int with_gemm) {
  racer r[NTHREADS];
  pthread_t tid[NTHREADS];
  int started[NTHREADS] = {0};
  pthread_barrier_t start;
  clattn_context *one = NULL;
  memset(r, 0, sizeof r);
  if (shared || !create_in_thread) {
    clattn_status st = clattn_create(NULL, &one);
    if (st == CLATTN_ERR_NO_DEVICE) exit(CT_SKIP);
    REQUIREF(st == CLATTN_OK, "clattn_create: %s", clattn_last_error(NULL));
  }
  pthread_barrier_init(&start, NULL, NTHREADS);
  for (int t = 0; t < NTHREADS; t++) {
    r[t].index = t;
    r[t].start = &start;
    if (shared)
      r[t].ctx = one;
    else if (!create_in_thread && t > 0 && clattn_create(NULL, &r[t].ctx) != CLATTN_OK)
      CHECKF(0, "clattn_create %d: %s", t, clattn_last_error(NULL));
    else if (!create_in_thread && t == 0)
      r[t].ctx = one;
    if (with_gemm) {
      cp_shape s = gemm_shape(t);
      char err[256];
      r[t].pb = cp_build(&s, err, sizeof err);
      /* uploaded now, so the threads meet in clattn_forward */
      if (CHECKF(r[t].pb != NULL, "cp_build: %s", err) && r[t].ctx)
        CHECKF(cp_upload(r[t].pb, r[t].ctx) == 0, "cp_upload: %s", r[t].pb->err);
    }
  }
  if (ct_current_failures) return;
  for (int t = 0; t < NTHREADS; t++)
    started[t] = CHECKF(pthread_create(&tid[t], NULL, race, &r[t]) == 0, "pthread_create %d", t);
  for (int t = 0; t < NTHREADS; t++)
    if (!started[t]) { /* the others wait at the barrier for ever */
      printf("    not every thread started\n");
      exit(1);
    }
  for (int t = 0; t < NTHREADS; t++) pthread_join(tid[t], NULL);
  int no_device = 0;
  for (int t = 0; t < NTHREADS; t++) {
    no_device += r[t].create_status == CLATTN_ERR_NO_DEVICE;
    CHECKF(!r[t].failure[0], "thread %d: %s", t, r[t].failure);
  }
  if (no_device == NTHREADS) exit(CT_SKIP); /* no device at all, not a race */
  if (ct_current_failures == 0)
    printf("  %d threads at once: %s\n", NTHREADS,
           with_gemm ? (shared ? "first GEMM calls on one context, all correct"
                               : "first GEMM calls on a context each, all correct")
                     : "every clattn_create succeeded");
  for (int t = 0; t < NTHREADS; t++) {
    cp_free(r[t].pb);
    if (!shared) clattn_destroy(r[t].ctx);
  }
  if (shared) clattn_destroy(one); /* otherwise r[0]'s, destroyed above */
  pthread_barrier_destroy(&start);
}

static void create_race_child(void) { run_race(0, 1, 0); }
static void shared_gemm_race_child(void) { run_race(1, 0, 1); }
static void own_gemm_race_child(void) { run_race(0, 0, 1); }

static void concurrent_create_is_the_first_opencl_use(void) {
  in_child("eight threads in clattn_create as the process's first OpenCL calls", create_race_child);
}

static void concurrent_first_gemm_calls_on_a_shared_context(void) {
  in_child("eight threads' first GEMM calls on one shared context", shared_gemm_race_child);
}

static void concurrent_first_gemm_calls_on_own_contexts(void) {
  in_child("eight threads' first GEMM calls on a context each", own_gemm_race_child);
}

/* ---------- a wait list that is still pending ---------- */

/* Completes the user event when clattn_forward has not returned within
 * PROMPT_S seconds, so a call that waits on it ends and the test reports. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int returned, late;
  cl_event user;
} prompt_watch;

static void *watch(void *arg) {
  prompt_watch *w = arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += PROMPT_S;
  pthread_mutex_lock(&w->lock);
  int rc = 0;
  while (!w->returned && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cond, &w->lock, &until);
  w->late = !w->returned;
  pthread_mutex_unlock(&w->lock);
  if (w->late) clSetUserEventStatus(w->user, CL_COMPLETE);
  return NULL;
}

static int write_inputs(cl_command_queue queue, cp_problem *pb, const float *q, const float *k, const float *v) {
  return clEnqueueWriteBuffer(queue, pb->q_buf, CL_TRUE, 0, pb->q_elems * sizeof(float), q, 0, NULL, NULL) ||
         clEnqueueWriteBuffer(queue, pb->k_buf, CL_TRUE, 0, pb->k_elems * sizeof(float), k, 0, NULL, NULL) ||
         clEnqueueWriteBuffer(queue, pb->v_buf, CL_TRUE, 0, pb->v_elems * sizeof(float), v, 0, NULL, NULL);
}

/* A call with algo whose wait list is a user event: it must return while
 * the event is pending, and compute on the inputs written (through another
 * queue) before the event completes, not on the zeros there at the call. */
static void call_after_user_event(clattn_context *ctx, clattn_algo algo, const char *queue_kind) {
  cp_shape s = gemm_shape(1);
  s.algo = algo;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  cl_command_queue side = NULL;
  cl_event user = NULL, done = NULL;
  float *zeros = NULL;
  cp_result r;
  /* A first call builds what the path needs, so the timing below is the wait alone. */
  if (!CHECKF(cp_run(pb, ctx, &r) == 0, "harness: %s", pb->err) ||
      !CHECKF(cp_result_ok(&r, TOL), "%s, %s queue: first call wrong: %s", clattn_algo_name(algo), queue_kind,
              clattn_last_error(ctx)))
    goto out;
  cl_int e;
  side = clCreateCommandQueue(pb->cl_ctx, clattn_cl_device(ctx), 0, &e);
  REQUIRE(e == CL_SUCCESS);
  size_t most = pb->q_elems > pb->k_elems ? pb->q_elems : pb->k_elems;
  if (pb->v_elems > most) most = pb->v_elems;
  zeros = calloc(most, sizeof(float));
  if (!CHECK(zeros) || !CHECK(cp_fill_outputs(pb, NAN) == 0) ||
      !CHECK(write_inputs(side, pb, zeros, zeros, zeros) == 0))
    goto out;
  user = clCreateUserEvent(pb->cl_ctx, &e);
  if (!CHECK(e == CL_SUCCESS)) goto out;

  prompt_watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, user};
  pthread_t tid;
  if (!CHECK(pthread_create(&tid, NULL, watch, &w) == 0)) goto out;
  double t0 = cp_now_ms();
  clattn_status st = clattn_forward(ctx, &pb->params, 1, &user, &done);
  double ms = cp_now_ms() - t0;
  pthread_mutex_lock(&w.lock);
  w.returned = 1;
  pthread_cond_signal(&w.cond);
  pthread_mutex_unlock(&w.lock);
  pthread_join(tid, NULL);
  printf("  %s, %s queue: clattn_forward returned in %.1f ms with its wait list pending\n", clattn_algo_name(algo),
         queue_kind, ms);
  CHECKF(!w.late,
         "%s, %s queue: clattn_forward had not returned after %d s: it waited for its pending wait list "
         "(the test completed the event)",
         clattn_algo_name(algo), queue_kind, PROMPT_S);
  CHECK_STATUS(st, CLATTN_OK);
  CHECK(write_inputs(side, pb, pb->q, pb->k, pb->v) == 0);
  if (!w.late) clSetUserEventStatus(user, CL_COMPLETE);
  CHECK(!done || clWaitForEvents(1, &done) == CL_SUCCESS);
  CHECK(clFinish(pb->queue) == CL_SUCCESS);
  if (CHECK(cp_read_outputs(pb) == 0) && CHECK(cp_compare(pb, &r) == 0)) {
    r.status = st;
    char f[400];
    CHECKF(cp_result_ok(&r, TOL),
           "%s, %s queue: the result is not that of the inputs written before the event "
           "completed: %s",
           clattn_algo_name(algo), queue_kind, cp_result_format(&r, f, sizeof f));
  }
out:
  if (done) clReleaseEvent(done);
  if (user) clReleaseEvent(user);
  if (side) clReleaseCommandQueue(side);
  free(zeros);
  cp_free(pb);
}

static const clattn_algo g_wait_algos[] = {CLATTN_ALGO_GEMM, CLATTN_ALGO_STAGED, CLATTN_ALGO_FUSED};

static void pending_wait_list_in_order_child(void) {
  clattn_context *ctx = ct_context();
  for (size_t i = 0; i < sizeof g_wait_algos / sizeof g_wait_algos[0]; i++)
    call_after_user_event(ctx, g_wait_algos[i], "in-order");
  ct_destroy_context();
}

/* A context's scratch reused on an out-of-order queue: a second call (no
 * wait list) takes the buffer the first call, waiting on a user event,
 * still has to use, so it is ordered after that call's last command (its
 * first command waits for that event) instead of overtaking it, and both results are
 * right. A context of its own: its pool holds just that one buffer. */
static void scratch_reuse_is_ordered(const clattn_options *opt) {
  cp_shape s = cp_shape_default();
  s.q_len = 9;
  s.kv_len = 37;
  s.head_dim = s.value_dim = 24;
  s.want_lse = 1;
  s.algo = CLATTN_ALGO_STAGED;
  clattn_context *ctx = NULL;
  cp_problem *a = NULL, *b = NULL;
  cl_event user = NULL, done[2] = {NULL, NULL};
  cp_result r;
  if (!CHECKF(clattn_create(opt, &ctx) == CLATTN_OK, "embedded: %s", clattn_last_error(NULL))) return;
  char err[256];
  a = cp_build(&s, err, sizeof err);
  s.seed = 2;
  b = cp_build(&s, err, sizeof err);
  if (!CHECKF(a && b, "cp_build: %s", err) || !CHECK(cp_run(a, ctx, &r) == 0 && cp_result_ok(&r, TOL)) ||
      !CHECK(cp_upload(b, ctx) == 0) || !CHECK(cp_fill_outputs(a, NAN) == 0 && cp_fill_outputs(b, NAN) == 0))
    goto out;
  cl_int e;
  user = clCreateUserEvent(a->cl_ctx, &e);
  if (!CHECK(e == CL_SUCCESS)) goto out;
  CHECK_STATUS(clattn_forward(ctx, &a->params, 1, &user, &done[0]), CLATTN_OK);
  CHECK_STATUS(clattn_forward(ctx, &b->params, 0, NULL, &done[1]), CLATTN_OK);
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL);
  cl_int second = CL_COMPLETE;
  CHECK(done[1] && clGetEventInfo(done[1], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof second, &second, NULL) == 0);
  if (CHECKF(second != CL_COMPLETE, "the second call finished while the first, sharing its scratch, had not started"))
    printf("  staged, out-of-order queue: a call reusing the scratch of a pending call waits for it\n");
  clSetUserEventStatus(user, CL_COMPLETE);
  CHECK(clWaitForEvents(2, done) == CL_SUCCESS);
  cp_problem *both[2] = {a, b};
  for (int i = 0; i < 2; i++)
    if (CHECK(cp_read_outputs(both[i]) == 0) && CHECK(cp_compare(both[i], &r) == 0)) {
      r.status = CLATTN_OK;
      char f[400];
      CHECKF(cp_result_ok(&r, TOL), "call %d of two sharing a scratch buffer: %s", i + 1,
             cp_result_format(&r, f, sizeof f));
    }
out:
  for (int i = 0; i < 2; i++)
    if (done[i]) clReleaseEvent(done[i]);
  if (user) clReleaseEvent(user);
  cp_free(a);
  cp_free(b);
  clattn_destroy(ctx);
}

static void pending_wait_list_out_of_order_child(void) {
  clattn_context *base = ct_context();
  cl_command_queue_properties props = 0;
  clGetDeviceInfo(clattn_cl_device(base), CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  if (!(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    printf("  (the device has no out-of-order queues: not tested)\n");
    ct_destroy_context();
    return;
  }
  cl_int e;
  cl_command_queue ooo =
      clCreateCommandQueue(clattn_cl_context(base), clattn_cl_device(base), CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
  REQUIRE(e == CL_SUCCESS);
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = clattn_cl_context(base);
  opt.device = clattn_cl_device(base);
  opt.queue = ooo;
  clattn_context *ctx = NULL;
  if (CHECKF(clattn_create(&opt, &ctx) == CLATTN_OK, "embedded: %s", clattn_last_error(NULL))) {
    for (size_t i = 0; i < sizeof g_wait_algos / sizeof g_wait_algos[0]; i++)
      call_after_user_event(ctx, g_wait_algos[i], "out-of-order embedded");
    clattn_destroy(ctx);
  }
  scratch_reuse_is_ordered(&opt);
  clReleaseCommandQueue(ooo);
  ct_destroy_context();
}

static void calls_with_a_pending_wait_list_return_at_once(void) {
  in_child("calls waiting on a user event (in-order queue)", pending_wait_list_in_order_child);
  in_child("calls waiting on a user event (out-of-order embedded queue)", pending_wait_list_out_of_order_child);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(concurrent_create_is_the_first_opencl_use),
      CT_TEST(concurrent_first_gemm_calls_on_a_shared_context),
      CT_TEST(concurrent_first_gemm_calls_on_own_contexts),
      CT_TEST(calls_with_a_pending_wait_list_return_at_once),
  };
  int rc = ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
  if (g_skipped) {
    printf("skipped: no OpenCL device\n");
    return CT_SKIP;
  }
  return rc;
}
