/*
 * `clattn bench --host`: what one decode step (B 1, H 32, KV 8, M 1, N 512,
 * d 128 unless --shape; f32, AUTO) costs the host, four ways:
 *
 *   floor           two one-argument kernels (a trivial kernel of the
 *                   bench's own) enqueued bare, each with an event, the
 *                   second chained on the first, the first after the
 *                   step's wait list: the least a step of two kernels can
 *                   cost the host;
 *   plan's kernels  the plan's own kernel objects (clattn_plan_launches:
 *                   every argument set) enqueued bare the same way: what
 *                   its kernels' arguments cost the runtime's enqueue;
 *   plan            clattn_plan_enqueue with the step's kv_len, plain
 *                   enqueues (CLATTN_COMMAND_BUFFER=0 for its context);
 *   command buffer  the same through command-buffer replay, where the
 *                   device offers it (CLATTN_COMMAND_BUFFER=1 for its
 *                   context): with mutable dispatch each step updates
 *                   kv_len in place; without, the steps keep the planned
 *                   kv_len (a loop driven by the kv_lens buffer), the only
 *                   steps it can replay;
 *   clattn_forward  the one-shot call with the step's kv_len.
 *
 * Each round times --steps steps of each variant, in turns (the order
 * rotating from round to round), enqueued behind one user event so the
 * device runs nothing while the host is timed, every step waiting on that
 * event and handing out a done event (released); the figure is the median
 * over --reps rounds of the host time per step. kv_len alternates between
 * N and N - 1, so a plan patches an argument every step and the key split
 * stays the same.
 *
 * Then decode end to end: --calls back-to-back steps and one clFinish, as
 * calls per second, medians over 7 rounds in turns: clattn_forward,
 * the plan, and with --before LIB the clattn_forward of another build of
 * the library (its libclattn.so, loaded with dlopen and embedded in the
 * same OpenCL context and queue, so both read the same buffers).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench_host.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_base.h"
#include "problem.h"

const char bench_host_usage[] =
    "       clattn bench --host [--shape H,HKV,M,N,D] [--reps R] [--steps S] [--calls C] [--before LIBCLATTN.so]\n";

bench_host_cfg bench_host_defaults(void) { return (bench_host_cfg){32, 8, 1, 512, 128, 200, 16, 200, NULL}; }

static int parse(int argc, char **argv, bench_host_cfg *c) {
  *c = bench_host_defaults();
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--host")) continue;
    if (!strcmp(o, "--reps") && v && atoi(v) > 0)
      c->reps = atoi(v), i++;
    else if (!strcmp(o, "--steps") && v && atoi(v) > 0)
      c->steps = atoi(v), i++;
    else if (!strcmp(o, "--calls") && v && atoi(v) > 0)
      c->calls = atoi(v), i++;
    else if (!strcmp(o, "--before") && v)
      c->before = v, i++;
    else if (!strcmp(o, "--shape") && v &&
             sscanf(v, "%d,%d,%d,%d,%d", &c->heads, &c->kv_heads, &c->q_len, &c->kv_len, &c->dim) == 5 &&
             c->heads > 0 && c->kv_heads > 0 && c->heads % c->kv_heads == 0 && c->q_len > 0 && c->kv_len > 1 &&
             c->dim > 0)
      i++;
    else {
      fprintf(stderr, "clattn bench --host: bad option %s\nusage:\n%s", o, bench_host_usage);
      return -1;
    }
  }
  return 0;
}

/* Another build's clattn_forward (--before), embedded in the same objects. */
typedef struct {
  void *lib;
  clattn_status (*create)(const clattn_options *, clattn_context **);
  void (*destroy)(clattn_context *);
  clattn_status (*forward)(clattn_context *, const clattn_params *, cl_uint, const cl_event *, cl_event *);
  const char *(*last_error)(const clattn_context *);
  clattn_context *ctx;
} other_build;

static int other_open(other_build *o, const char *path, clattn_context *like) {
  memset(o, 0, sizeof o[0]);
  if (!(o->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
    fprintf(stderr, "clattn bench --host: --before %s: %s\n", path, dlerror());
    return -1;
  }
  *(void **)&o->create = dlsym(o->lib, "clattn_create");
  *(void **)&o->destroy = dlsym(o->lib, "clattn_destroy");
  *(void **)&o->forward = dlsym(o->lib, "clattn_forward");
  *(void **)&o->last_error = dlsym(o->lib, "clattn_last_error");
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = clattn_cl_context(like);
  opt.device = clattn_cl_device(like);
  opt.queue = clattn_cl_queue(like);
  if (!o->create || !o->destroy || !o->forward || !o->last_error || o->create(&opt, &o->ctx) != CLATTN_OK) {
    fprintf(stderr, "clattn bench --host: --before %s: no clattn_create there, or it failed: %s\n", path,
            o->last_error ? o->last_error(NULL) : "");
    return -1;
  }
  return 0;
}

static void other_close(other_build *o) {
  if (o->ctx) o->destroy(o->ctx);
  if (o->lib) dlclose(o->lib);
}

/* A plan of p on an embedded context of its own on ctx's objects, whose
 * plans replay command buffers (cb 1) or never do (cb 0): the environment
 * is read at a context's first plan. */
static clattn_status plan_with(clattn_context *ctx, int cb, const clattn_params *p, clattn_context **own,
                               clattn_plan **plan) {
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = clattn_cl_context(ctx);
  opt.device = clattn_cl_device(ctx);
  opt.queue = clattn_cl_queue(ctx);
  clattn_status st = clattn_create(&opt, own);
  if (st != CLATTN_OK) return st;
  setenv("CLATTN_COMMAND_BUFFER", cb ? "1" : "0", 1);
  return clattn_plan_create(*own, p, plan);
}

enum { V_FLOOR, V_BARE, V_PLAN, V_CB, V_FORWARD, V_BEFORE, N_VARIANTS };
static const char *const variant_names[N_VARIANTS] = {
    "floor (two one-argument kernels)", "the plan's kernels bare", "plan", "command buffer", "clattn_forward",
    "clattn_forward, --before build"};

typedef struct {
  clattn_context *ctx;
  clattn_plan *plan, *cb_plan;
  int cb_mutable;    /* steps through the command buffer change kv_len */
  clattn_launch floor[2], bare[4]; /* the one-argument kernels; the plan's */
  int n_bare;
  clattn_params p;
  other_build *before;
} host_runs;

/* Step i of variant v after wait (none when NULL); *done when asked. */
static clattn_status step(host_runs *h, int v, int i, cl_event *wait, cl_event *done) {
  const int kv_len = h->p.kv_len - (i & 1);
  const cl_uint n_wait = wait ? 1 : 0;
  clattn_step s = clattn_step_default();
  s.kv_len = kv_len;
  clattn_params p = h->p;
  p.kv_len = kv_len;
  switch (v) {
    case V_FLOOR:
    case V_BARE: {
      cl_event prev = NULL;
      const clattn_launch *launches = v == V_FLOOR ? h->floor : h->bare;
      for (int k = 0; k < (v == V_FLOOR ? 2 : h->n_bare); k++) {
        const clattn_launch *l = &launches[k];
        cl_event ev = NULL;
        cl_int err = clEnqueueNDRangeKernel(clattn_cl_queue(h->ctx), l->kernel, l->work_dim, NULL, l->global,
                                            l->local_given ? l->local : NULL, prev ? 1 : n_wait, prev ? &prev : wait,
                                            &ev);
        if (prev) clReleaseEvent(prev);
        if (err != CL_SUCCESS) return CLATTN_ERR_OPENCL;
        prev = ev;
      }
      if (done)
        *done = prev;
      else
        clReleaseEvent(prev);
      return CLATTN_OK;
    }
    case V_PLAN: return clattn_plan_enqueue(h->plan, &s, n_wait, wait, done);
    case V_CB: return clattn_plan_enqueue(h->cb_plan, h->cb_mutable ? &s : NULL, n_wait, wait, done);
    case V_FORWARD: return clattn_forward(h->ctx, &p, n_wait, wait, done);
    default: return h->before->forward(h->before->ctx, &p, n_wait, wait, done);
  }
}

/* Host time per step (ms) of `steps` steps of v behind a user event. */
static int time_steps(host_runs *h, int v, int steps, double *per_step) {
  cl_command_queue q = clattn_cl_queue(h->ctx);
  cl_int err = clFinish(q);
  cl_event gate = clCreateUserEvent(clattn_cl_context(h->ctx), &err);
  if (err != CL_SUCCESS) return -1;
  int rc = 0;
  const double t0 = bb_now_ms();
  for (int i = 0; i < steps && rc == 0; i++) {
    cl_event done = NULL;
    rc = step(h, v, i, &gate, &done) == CLATTN_OK ? 0 : -1;
    if (done) clReleaseEvent(done);
  }
  *per_step = (bb_now_ms() - t0) / steps;
  clSetUserEventStatus(gate, CL_COMPLETE);
  clReleaseEvent(gate);
  return clFinish(q) == CL_SUCCESS ? rc : -1;
}

/* Calls per second of `calls` back-to-back steps of v and one clFinish. */
static int decode_rate(host_runs *h, int v, int calls, double *per_s) {
  cl_command_queue q = clattn_cl_queue(h->ctx);
  if (clFinish(q) != CL_SUCCESS) return -1;
  const double t0 = bb_now_ms();
  for (int i = 0; i < calls; i++)
    if (step(h, v, i, NULL, NULL) != CLATTN_OK) return -1;
  if (clFinish(q) != CL_SUCCESS) return -1;
  *per_s = calls / ((bb_now_ms() - t0) / 1e3);
  return 0;
}

/* Whether a plan step's output is bitwise clattn_forward's (kv_len N - 1). */
static int plan_matches(host_runs *h, clattn_plan *plan, cp_problem *pb, const char *what) {
  clattn_step s = clattn_step_default();
  s.kv_len = h->p.kv_len - 1;
  clattn_params p = h->p;
  p.kv_len = s.kv_len;
  float *a = malloc(pb->out_elems * sizeof *a);
  int same = a && cp_fill_outputs(pb, NAN) == 0 && clattn_plan_enqueue(plan, &s, 0, NULL, NULL) == CLATTN_OK &&
             cp_read_outputs(pb) == 0;
  if (same) memcpy(a, pb->out_raw, pb->out_elems * sizeof *a);
  same = same && cp_fill_outputs(pb, NAN) == 0 && clattn_forward(h->ctx, &p, 0, NULL, NULL) == CLATTN_OK &&
         cp_read_outputs(pb) == 0 && memcmp(a, pb->out_raw, pb->out_elems * sizeof *a) == 0;
  free(a);
  if (!same) fprintf(stderr, "clattn bench --host: the %s's output is not clattn_forward's\n", what);
  return same ? 0 : -1;
}

/* Whether the device lists the extension (a whole word). */
static int has_extension(cl_device_id device, const char *name) {
  char list[8192] = "";
  clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, sizeof list, list, NULL);
  const size_t n = strlen(name);
  for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
    if ((at == list || at[-1] == ' ') && (at[n] == ' ' || at[n] == 0)) return 1;
  return 0;
}

/* The floor's two launches: a one-argument kernel of the bench's own,
 * twice, one work-item each. */
static int floor_kernels(clattn_context *ctx, cl_program *program, clattn_launch out[2]) {
  static const char *src = "__kernel void floor_one(int x) { (void)x; }\n";
  cl_device_id device = clattn_cl_device(ctx);
  cl_int err = CL_SUCCESS;
  *program = clCreateProgramWithSource(clattn_cl_context(ctx), 1, &src, NULL, &err);
  if (err == CL_SUCCESS) err = clBuildProgram(*program, 1, &device, "", NULL, NULL);
  const int one = 1;
  for (int k = 0; k < 2 && err == CL_SUCCESS; k++) {
    out[k] = (clattn_launch){clCreateKernel(*program, "floor_one", &err), "floor_one", 1, {1, 1, 1}, {1, 1, 1}, 1};
    if (err == CL_SUCCESS) err = clSetKernelArg(out[k].kernel, 0, sizeof one, &one);
  }
  if (err != CL_SUCCESS) fprintf(stderr, "clattn bench --host: the floor's kernel: OpenCL error %d\n", (int)err);
  return err == CL_SUCCESS ? 0 : -1;
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
  host_runs h;
  memset(&h, 0, sizeof h);
  h.ctx = ctx;
  other_build before;
  memset(&before, 0, sizeof before);
  clattn_context *plain_ctx = NULL, *cb_ctx = NULL;
  cl_program floor_program = NULL;
  char *env = getenv("CLATTN_COMMAND_BUFFER") ? strdup(getenv("CLATTN_COMMAND_BUFFER")) : NULL;
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
  if (cp_run(pb, ctx, &r) != 0 || !cp_result_ok(&r, 2e-4)) { /* programs built, and a correct result */
    fprintf(stderr, "clattn bench --host: the decode call is wrong or failed: %s\n",
            cp_result_format(&r, err, sizeof err));
    goto done;
  }
  h.p = pb->params;
  const int made = plan_with(ctx, 0, &h.p, &plain_ctx, &h.plan) == CLATTN_OK &&
                   plan_with(ctx, 1, &h.p, &cb_ctx, &h.cb_plan) == CLATTN_OK;
  if (env)
    setenv("CLATTN_COMMAND_BUFFER", env, 1);
  else
    unsetenv("CLATTN_COMMAND_BUFFER");
  if (!made) {
    fprintf(stderr, "clattn bench --host: making the plans: %s\n", clattn_last_error(NULL));
    goto done;
  }
  h.n_bare = clattn_plan_launches(h.plan, h.bare, 4);
  if (h.n_bare < 1 || h.n_bare > 4) {
    fprintf(stderr, "clattn bench --host: the plan's step is not one to four kernels (%d)\n", h.n_bare);
    goto done;
  }
  if (floor_kernels(ctx, &floor_program, h.floor) != 0 || plan_matches(&h, h.plan, pb, "plan") != 0 ||
      plan_matches(&h, h.cb_plan, pb, "command buffer's") != 0)
    goto done;
  /* command buffers: a step as planned replays wherever they are offered;
   * a changed kv_len replays only with mutable dispatch */
  const int cb_offered = has_extension(clattn_cl_device(ctx), "cl_khr_command_buffer");
  h.cb_mutable = has_extension(clattn_cl_device(ctx), "cl_khr_command_buffer_mutable_dispatch");
  if (c.before && other_open(&before, c.before, ctx) != 0) goto done;
  h.before = &before;
  clFinish(clattn_cl_queue(ctx));

  char platform[128] = "?", device[128] = "?";
  cl_platform_id pf = NULL;
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_PLATFORM, sizeof pf, &pf, NULL);
  clGetPlatformInfo(pf, CL_PLATFORM_NAME, sizeof platform, platform, NULL);
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_NAME, sizeof device, device, NULL);
  clattn_step s0 = clattn_step_default();
  clattn_plan_enqueue(h.plan, &s0, 0, NULL, NULL);
  printf("clattn bench --host: decode step B 1, H %d/KV %d, M %d, N %d, d %d, f32, AUTO on %s (%s)\n", c.heads,
         c.kv_heads, c.q_len, c.kv_len, c.dim, platform, device);
  printf("  %s: %d kernel%s per step; plan and command-buffer outputs bitwise clattn_forward's\n",
         clattn_last_route(), h.n_bare, h.n_bare == 1 ? "" : "s");
  printf("%s", clattn_plan_describe(h.plan));

  int variants[N_VARIANTS], n_var = 0;
  for (int v = 0; v < N_VARIANTS; v++)
    if ((v != V_CB || cb_offered) && (v != V_BEFORE || c.before)) variants[n_var++] = v;
  double *t[N_VARIANTS] = {NULL};
  for (int v = 0; v < N_VARIANTS; v++)
    if (!(t[v] = malloc((size_t)c.reps * sizeof(double)))) goto timed;
  for (int rep = 0; rep < c.reps; rep++)
    for (int k = 0; k < n_var; k++) {
      const int v = variants[(rep + k) % n_var];
      if (time_steps(&h, v, c.steps, &t[v][rep]) != 0) {
        fprintf(stderr, "clattn bench --host: %s failed: %s\n", variant_names[v], clattn_last_error(NULL));
        goto timed;
      }
    }
  double med[N_VARIANTS] = {0};
  for (int k = 0; k < n_var; k++) med[variants[k]] = bb_median(t[variants[k]], c.reps);
  printf("  host time per step, median of %d rounds of %d steps behind a user event (kv_len %d and %d in turn):\n",
         c.reps, c.steps, c.kv_len, c.kv_len - 1);
  printf("    %-34s %7.2f us\n", variant_names[V_FLOOR], med[V_FLOOR] * 1e3);
  printf("    %-34s %7.2f us  %.2fx the floor\n", variant_names[V_BARE], med[V_BARE] * 1e3, med[V_BARE] / med[V_FLOOR]);
  printf("    %-34s %7.2f us  %.2fx the floor (target <= 1.3x)\n", variant_names[V_PLAN], med[V_PLAN] * 1e3,
         med[V_PLAN] / med[V_FLOOR]);
  if (cb_offered)
    printf("    %-34s %7.2f us  %.2fx the floor (%s)\n", variant_names[V_CB], med[V_CB] * 1e3, med[V_CB] / med[V_FLOOR],
           h.cb_mutable ? "mutable dispatch: kv_len updated in place" : "no mutable dispatch: kv_len as planned");
  else
    printf("    %-34s  not offered by this device\n", variant_names[V_CB]);
  printf("    %-34s %7.2f us  %.2fx the floor (target <= 2x)\n", variant_names[V_FORWARD], med[V_FORWARD] * 1e3,
         med[V_FORWARD] / med[V_FLOOR]);
  if (c.before)
    printf("    %-34s %7.2f us  %.2fx the floor\n", variant_names[V_BEFORE], med[V_BEFORE] * 1e3,
           med[V_BEFORE] / med[V_FLOOR]);

  /* decode end to end */
  enum { ROUNDS = 7 };
  double rate[N_VARIANTS][ROUNDS];
  const int e2e[] = {V_BEFORE, V_FORWARD, V_PLAN}, first = c.before ? 0 : 1, n_e2e = 3 - first;
  for (int rep = 0; rep < ROUNDS; rep++)
    for (int k = 0; k < n_e2e; k++) {
      const int v = e2e[first + (rep + k) % n_e2e];
      if (decode_rate(&h, v, c.calls, &rate[v][rep]) != 0) {
        fprintf(stderr, "clattn bench --host: %s failed end to end\n", variant_names[v]);
        goto timed;
      }
    }
  printf("  decode end to end, %d back-to-back steps + clFinish, median of %d rounds in turns:\n", c.calls, ROUNDS);
  for (int k = first; k < 3; k++)
    printf("    %-34s %7.0f calls/s\n", e2e[k] == V_BEFORE ? "clattn_forward, before" : variant_names[e2e[k]],
           bb_median(rate[e2e[k]], ROUNDS));
  if (c.before) printf("    (before: %s)\n", c.before);
  rc = 0;
timed:
  for (int v = 0; v < N_VARIANTS; v++) free(t[v]);
done:
  clattn_plan_release(h.plan);
  clattn_plan_release(h.cb_plan);
  for (int k = 0; k < 2; k++)
    if (h.floor[k].kernel) clReleaseKernel(h.floor[k].kernel);
  if (floor_program) clReleaseProgram(floor_program);
  clattn_destroy(plain_ctx);
  clattn_destroy(cb_ctx);
  other_close(&before);
  free(env);
  cp_free(pb);
  return rc;
}
