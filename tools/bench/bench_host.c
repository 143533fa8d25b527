/*
 * `clattn bench --host`: what one clattn_forward call costs the host, for a
 * decode step (B 1, H 32, KV 8, M 1, N 512, d 128 unless --shape), against
 * a floor of the same number of empty kernels enqueued the way clattn
 * enqueues its kernels (each with an event, chained on the one before).
 *
 *   enqueue   host time of one call, no device wait: the median over --reps
 *             calls, each started on an idle queue (a clFinish before it,
 *             not timed);
 *   loop      1,000 back-to-back calls (--calls) and one clFinish, end to
 *             end: calls per second; and the host time of their enqueues
 *             alone (the queue busy behind them);
 * each for clattn and for the floor, and their ratio. The kernel count per
 * call is what the library's launcher counted for one call (CLBlast's GEMMs
 * are not counted: a decode step takes the fused path).
 */
#include "bench_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_base.h"
#include "internal.h" /* kernels_enqueued: the floor enqueues as many kernels as a call does */
#include "problem.h"

const char bench_host_usage[] = "       clattn bench --host [--shape H,HKV,M,N,D] [--reps R] [--calls C]\n";

bench_host_cfg bench_host_defaults(void) { return (bench_host_cfg){32, 8, 1, 512, 128, 500, 1000}; }

static int parse(int argc, char **argv, bench_host_cfg *c) {
  *c = bench_host_defaults();
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--host")) continue;
    if (!strcmp(o, "--reps") && v && atoi(v) > 0)
      c->reps = atoi(v), i++;
    else if (!strcmp(o, "--calls") && v && atoi(v) > 0)
      c->calls = atoi(v), i++;
    else if (!strcmp(o, "--shape") && v &&
             sscanf(v, "%d,%d,%d,%d,%d", &c->heads, &c->kv_heads, &c->q_len, &c->kv_len, &c->dim) == 5 &&
             c->heads > 0 && c->kv_heads > 0 && c->heads % c->kv_heads == 0 && c->q_len > 0 && c->kv_len > 0 &&
             c->dim > 0)
      i++;
    else {
      fprintf(stderr, "clattn bench --host: bad option %s\nusage:\n%s", o, bench_host_usage);
      return -1;
    }
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The floor's kernels: empty, enqueued like ca_enqueue does (event out, the
 * previous one in the wait list, released after). */
typedef struct {
  cl_command_queue queue;
  cl_program program;
  cl_kernel kernel;
  int per_call;
} floor_kernels;

static int floor_init(floor_kernels *f, clattn_context *ctx, int per_call) {
  static const char *src = "__kernel void empty(void) {}\n";
  cl_device_id dev = clattn_cl_device(ctx);
  cl_int err = CL_SUCCESS;
  memset(f, 0, sizeof *f);
  f->queue = clattn_cl_queue(ctx);
  f->per_call = per_call;
  f->program = clCreateProgramWithSource(clattn_cl_context(ctx), 1, &src, NULL, &err);
  if (err == CL_SUCCESS) err = clBuildProgram(f->program, 1, &dev, "", NULL, NULL);
  if (err == CL_SUCCESS) f->kernel = clCreateKernel(f->program, "empty", &err);
  if (err != CL_SUCCESS)
    fprintf(stderr, "clattn bench --host: the empty kernel: %s (%d)\n", cp_cl_error_name(err), err);
  return err == CL_SUCCESS ? 0 : -1;
}

static void floor_release(floor_kernels *f) {
  if (f->kernel) clReleaseKernel(f->kernel);
  if (f->program) clReleaseProgram(f->program);
}

/* One "call" of the floor: per_call empty kernels chained by events. */
static int floor_call(floor_kernels *f) {
  const size_t one = 1;
  cl_event prev = NULL;
  for (int i = 0; i < f->per_call; i++) {
    cl_event ev = NULL;
    cl_int err =
        clEnqueueNDRangeKernel(f->queue, f->kernel, 1, NULL, &one, NULL, prev ? 1 : 0, prev ? &prev : NULL, &ev);
    if (prev) clReleaseEvent(prev);
    if (err != CL_SUCCESS) return -1;
    prev = ev;
  }
  if (prev) clReleaseEvent(prev);
  return 0;
}

typedef int (*call_fn)(void *arg);

typedef struct {
  clattn_context *ctx;
  cp_problem *pb;
} decode_call;

static int clattn_call(void *arg) {
  decode_call *d = arg;
  return clattn_forward(d->ctx, &d->pb->params, 0, NULL, NULL) == CLATTN_OK ? 0 : -1;
}

static int floor_fn(void *arg) { return floor_call(arg); }

/* The median host time of one call (ms), each on an idle queue. */
static int enqueue_median(call_fn fn, void *arg, cl_command_queue q, int reps, double *median) {
  double *t = malloc((size_t)reps * sizeof *t);
  if (!t) return -1;
  for (int i = 0; i < reps; i++) {
    clFinish(q);
    double t0 = bb_now_ms();
    if (fn(arg) != 0) {
      free(t);
      return -1;
    }
    t[i] = bb_now_ms() - t0;
  }
  clFinish(q);
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  *median = t[reps / 2];
  free(t);
  return 0;
}

/* Calls per second of `calls` back-to-back calls and one clFinish, and
 * the host time per call of their enqueues alone (ms). */
static int loop_rate(call_fn fn, void *arg, cl_command_queue q, int calls, double *per_s, double *enqueue_ms) {
  clFinish(q);
  double t0 = bb_now_ms();
  for (int i = 0; i < calls; i++)
    if (fn(arg) != 0) return -1;
  *enqueue_ms = (bb_now_ms() - t0) / calls;
  if (clFinish(q) != CL_SUCCESS) return -1;
  *per_s = calls / ((bb_now_ms() - t0) / 1e3);
  return 0;
}

int bench_host_main(int argc, char **argv) {
  bench_host_cfg c;
  if (parse(argc, argv, &c) != 0) return 2;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn bench --host: cannot create a context: %s: %s\n", clattn_status_string(st),
            clattn_last_error(NULL));
    return 1;
  }
  int rc = bench_host_run(ctx, &c) == 0 ? 0 : 1;
  clattn_destroy(ctx);
  return rc;
}

int bench_host_run(clattn_context *ctx, const bench_host_cfg *cfg) {
  const bench_host_cfg c = *cfg;
  int rc = -1;
  floor_kernels fl = {0};
  cp_shape s = cp_shape_default();
  s.q_heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.q_len = c.q_len;
  s.kv_len = c.kv_len;
  s.head_dim = s.value_dim = c.dim;
  s.poison_gaps = s.poison_disallowed = 0;
  s.seed = 12345;
  char err[512];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) {
    fprintf(stderr, "clattn bench --host: %s\n", err);
    goto done;
  }
  cp_result r;
  memset(&r, 0, sizeof r);
  if (cp_run(pb, ctx, &r) != 0 || !cp_result_ok(&r, 2e-4)) { /* warm-up (programs built), and a correct result */
    fprintf(stderr, "clattn bench --host: the decode call is wrong or failed: %s\n",
            cp_result_format(&r, err, sizeof err));
    goto done;
  }
  decode_call dc = {ctx, pb};
  cl_command_queue q = clattn_cl_queue(ctx);
  clFinish(q);
  unsigned long k0 = atomic_load(&ctx->kernels_enqueued);
  if (clattn_call(&dc) != 0) goto call_failed;
  clFinish(q);
  const int per_call = (int)(atomic_load(&ctx->kernels_enqueued) - k0);
  if (per_call < 1 || floor_init(&fl, ctx, per_call) != 0) goto done;

  double host_ms = 0, floor_ms = 0, rate = 0, floor_rate = 0, loop_ms = 0, floor_loop_ms = 0;
  if (floor_call(&fl) != 0) goto floor_failed;
  if (enqueue_median(clattn_call, &dc, q, c.reps, &host_ms) != 0) goto call_failed;
  if (enqueue_median(floor_fn, &fl, q, c.reps, &floor_ms) != 0) goto floor_failed;
  if (loop_rate(clattn_call, &dc, q, c.calls, &rate, &loop_ms) != 0) goto call_failed;
  if (loop_rate(floor_fn, &fl, q, c.calls, &floor_rate, &floor_loop_ms) != 0) goto floor_failed;

  printf("clattn bench --host: decode step B 1, H %d/KV %d, M %d, N %d, d %d, f32 (AUTO): %d kernel%s per call\n",
         c.heads, c.kv_heads, c.q_len, c.kv_len, c.dim, per_call, per_call == 1 ? "" : "s");
  printf("  enqueue, one call (median of %d, no device wait): clattn %.1f us, floor %.1f us, ratio %.2f\n", c.reps,
         host_ms * 1e3, floor_ms * 1e3, host_ms / floor_ms);
  printf("  %d back-to-back calls + clFinish: clattn %.0f calls/s (%.1f us/call), floor %.0f calls/s, ratio %.2f\n",
         c.calls, rate, 1e6 / rate, floor_rate, floor_rate / rate);
  printf("  of which enqueueing, per call: clattn %.1f us, floor %.1f us, ratio %.2f\n", loop_ms * 1e3,
         floor_loop_ms * 1e3, loop_ms / floor_loop_ms);
  int buffers = 0;
  size_t bytes = 0;
  ca_scratch_stats(ctx, &buffers, &bytes);
  printf("  the context holds %d kernel objects and %d scratch buffers (%zu bytes), created once\n",
         ca_kernel_pool_size(ctx), buffers, bytes);
  rc = 0;
  goto done;
call_failed:
  fprintf(stderr, "clattn bench --host: clattn_forward: %s\n", clattn_last_error(NULL));
  goto done;
floor_failed:
  fprintf(stderr, "clattn bench --host: enqueueing the empty kernels failed\n");
done:
  floor_release(&fl);
  cp_free(pb);
  return rc;
}
