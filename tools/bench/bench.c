/*
 * `clattn bench`: one run on the chosen device (clattn_create(NULL): env
 * CLATTN_DEVICE, else the first GPU, else the first device), f32.
 *
 * For each shape: clattn AUTO and FUSED, CLBlast staged attention on the same
 * device (bench_base.c), and a host OpenBLAS attention, as GFLOP/s with
 * FLOPs = 4·B·H·M·N·d (halved for causal); FUSED against each baseline and
 * against the device's and host's SGEMM rates; decode rows also as GB/s
 * (K and V read once, plus Q and O) against the device's copy bandwidth.
 * Every output is compared with clattn FUSED's (max abs difference), and the
 * smallest prefill shape also with the fp64 reference. A memory row runs
 * FUSED at M = N = 32768 and reports clattn_peak_scratch_bytes. A host
 * section (bench_host.c, also `clattn bench --host`) times what one decode
 * call costs the host against a floor of empty kernel enqueues.
 *
 * Times are wall clock around the call and its clFinish: one warm-up call,
 * then the median of up to --reps calls, stopping once the next call would
 * take the measured time past --cap seconds (at least one timed call).
 *
 * --paged P[,P...] and --kv-dtype T[,T...] (f32|f16|bf16|q8_0|int8) add, per
 * shape, FUSED over the same keys and values written by clattn_kv_append
 * into a cache of each type and paging (page size 0: contiguous; pages are
 * handed out in reverse order), side by side: cache bytes per token, time,
 * the cache's read rate, time relative to the first cache listed, the cost
 * of paging against the same type contiguous, and the largest difference
 * from the f32 FUSED output (the quantisation error, not a failure).
 *
 * --readme FILE replaces the block between <!-- bench:begin --> and
 * <!-- bench:end --> in FILE (creating it at the end of the "## Performance"
 * section, or that section at the end of the file, when absent).
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_backward.h"
#include "bench_host.h"
#include "bench_kvcache.h"
#include "bench_modifiers.h"
#include "bench_base.h"
#include "clattn.h"
#include "problem.h"

const char bench_usage[] =
    "       clattn bench [--quick] [--readme FILE] [--only prefill,gqa,decode,memory,host]\n"
    "                    [--shape H,HKV,M,N,D[,causal]]... [--reps R] [--cap SECONDS]\n"
    "                    [--no-staged] [--no-host] [--baseline-max-len L] [--no-check] [--verbose]\n"
    "                    [--paged P[,P...]] [--kv-dtype T[,T...]]  (P: keys per page, 0 contiguous;\n"
    "                    T: f32|f16|bf16|q8_0|int8)\n"
    "       clattn bench --backward [--quick] [--shape H,HKV,M,N,D[,causal]]... [--reps R] [--cap SECONDS]\n"
    "                    [--no-host]\n"
    "       clattn bench --host [--shape H,HKV,M,N,D] [--reps R] [--steps S] [--calls C] [--before LIBCLATTN.so]\n"
    "       clattn bench --kvcache [--shape H,HKV,N,D] [--reps R] [--steps S]\n"
    "       clattn bench --modifiers [--shape H,HKV,N,D] [--reps R] [--cap SECONDS]\n";

#define BEGIN_MARK "<!-- bench:begin -->"
#define END_MARK   "<!-- bench:end -->"
#define MAX_ROWS   64
#define MAX_KV     5 /* entries of --kv-dtype and of --paged */
#define MIB        (1024.0 * 1024.0)

/* ---- a growable string ---- */

typedef struct {
  char *s;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_add(sbuf *b, const char *f, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, f);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, f, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->s && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

/* ---- configuration ---- */

enum { K_PREFILL = 1, K_GQA = 2, K_DECODE = 4, K_MEMORY = 8, K_HOST = 16 };

typedef struct {
  int kind;
  bb_shape s;
} bench_shape;

typedef struct {
  int quick, staged, host, check, verbose, max_reps;
  double cap_ms;
  unsigned only;
  int baseline_max_len; /* 0 = no limit */
  const char *readme;
  bench_shape custom[MAX_ROWS];
  int n_custom;
  clattn_dtype kv_types[MAX_KV]; /* --kv-dtype list (none: f32 like q) */
  int n_kv_types;
  int kv_pages[MAX_KV]; /* --paged list: keys per page, 0 = contiguous (none: contiguous) */
  int n_kv_pages;
} bench_cfg;

typedef enum { CELL_NONE, CELL_OK, CELL_FAIL } cell_state;

typedef struct {
  cell_state state;
  double ms;
  int reps;
} cell;

typedef struct {
  bench_shape sh;
  double flops, bytes;
  cell a, f, st, h;
  cell f16, bf16;                  /* FUSED with q, k, v, out stored in 16 bits */
  cell kv[MAX_KV * MAX_KV];        /* FUSED over each --kv-dtype x --paged cache (kv_cache()) */
  double diff_kv[MAX_KV * MAX_KV]; /* max |FUSED over that cache - FUSED f32|; NAN = not run */
  double diff_st, diff_h;          /* max |FUSED - baseline|; NAN = not compared */
  size_t scratch;                  /* memory row: peak scratch */
  int finite;                      /* memory row: output all finite */
} row;

typedef struct {
  double dev_gemm, host_gemm, copy_gbps, dev_fma;
  int gemm_n;
  size_t copy_bytes;
} ceilings;

static int parse_shape(const char *v, bench_shape *out) {
  int h, hk, m, n, d, used = 0;
  if (sscanf(v, "%d,%d,%d,%d,%d%n", &h, &hk, &m, &n, &d, &used) != 5) return -1;
  int causal = 0;
  if (v[used] == ',' && strcmp(v + used + 1, "causal") == 0)
    causal = 1;
  else if (v[used] != 0)
    return -1;
  if (h <= 0 || hk <= 0 || m <= 0 || n <= 0 || d <= 0 || h % hk) return -1;
  out->s = (bb_shape){1, h, hk, m, n, d, causal};
  out->kind = m <= 16 ? K_DECODE : h != hk ? K_GQA : K_PREFILL;
  return 0;
}

static int parse_only(const char *v, unsigned *only) {
  *only = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", v);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (!strcmp(t, "prefill"))
      *only |= K_PREFILL;
    else if (!strcmp(t, "gqa"))
      *only |= K_GQA;
    else if (!strcmp(t, "decode"))
      *only |= K_DECODE;
    else if (!strcmp(t, "memory"))
      *only |= K_MEMORY;
    else if (!strcmp(t, "host"))
      *only |= K_HOST;
    else
      return -1;
  }
  return *only ? 0 : -1;
}

static int parse_kv_dtype(const char *v, clattn_dtype *out) {
  static const struct {
    const char *name;
    clattn_dtype dtype;
  } names[] = {
      {"f32", CLATTN_F32}, {"f16", CLATTN_F16}, {"bf16", CLATTN_BF16}, {"q8_0", CLATTN_Q8_0}, {"int8", CLATTN_INT8}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(v, names[i].name)) {
      *out = names[i].dtype;
      return 0;
    }
  return -1;
}

static const char *kv_dtype_name(clattn_dtype d) {
  return d == CLATTN_F16    ? "f16"
         : d == CLATTN_BF16 ? "bf16"
         : d == CLATTN_Q8_0 ? "q8_0"
         : d == CLATTN_INT8 ? "int8"
                            : "f32";
}

/* --kv-dtype T[,T...]: at most MAX_KV names. */
static int parse_kv_types(const char *v, bench_cfg *c) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", v);
  c->n_kv_types = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (c->n_kv_types == MAX_KV || parse_kv_dtype(t, &c->kv_types[c->n_kv_types++]) != 0) return -1;
  return c->n_kv_types ? 0 : -1;
}

/* --paged P[,P...]: at most MAX_KV page sizes, 0 = contiguous. */
static int parse_kv_pages(const char *v, bench_cfg *c) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", v);
  c->n_kv_pages = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *end;
    long ps = strtol(t, &end, 10);
    if (c->n_kv_pages == MAX_KV || *end || ps < 0 || ps > 1 << 20) return -1;
    c->kv_pages[c->n_kv_pages++] = (int)ps;
  }
  return c->n_kv_pages ? 0 : -1;
}

/* The caches the run compares: every --kv-dtype with every --paged, the
 * first listed first; none without either option. */
static int kv_caches(const bench_cfg *c) {
  if (!c->n_kv_types && !c->n_kv_pages) return 0;
  return (c->n_kv_types ? c->n_kv_types : 1) * (c->n_kv_pages ? c->n_kv_pages : 1);
}

static void kv_cache(const bench_cfg *c, int i, clattn_dtype *type, int *page_size) {
  const int n_pages = c->n_kv_pages ? c->n_kv_pages : 1;
  *type = c->n_kv_types ? c->kv_types[i / n_pages] : CLATTN_F32;
  *page_size = c->n_kv_pages ? c->kv_pages[i % n_pages] : 0;
}

/* Bytes one token takes in the cache, K and V of every KV head (INT8: with
 * its f32 scale per row). */
static double kv_token_bytes(clattn_dtype type, int kv_heads, int dim) {
  const double row = type == CLATTN_Q8_0   ? dim / 32 * 34.0
                     : type == CLATTN_INT8 ? dim + 4.0
                                           : dim * (type == CLATTN_F32 ? 4.0 : 2.0);
  return 2.0 * kv_heads * row;
}

static char *kv_cache_name(clattn_dtype type, int page_size, char *buf, size_t n) {
  if (page_size)
    snprintf(buf, n, "%s paged %d", kv_dtype_name(type), page_size);
  else
    snprintf(buf, n, "%s contiguous", kv_dtype_name(type));
  return buf;
}

static int parse_args(int argc, char **argv, bench_cfg *c) {
  memset(c, 0, sizeof *c);
  c->staged = c->host = c->check = 1;
  c->max_reps = 7;
  c->cap_ms = 2000.0;
  c->only = K_PREFILL | K_GQA | K_DECODE | K_MEMORY | K_HOST;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      printf("usage:\n%s", bench_usage);
      return 1;
    } else if (!strcmp(o, "--quick"))
      c->quick = 1;
    else if (!strcmp(o, "--verbose") || !strcmp(o, "-v"))
      c->verbose = 1;
    else if (!strcmp(o, "--no-staged"))
      c->staged = 0;
    else if (!strcmp(o, "--no-host"))
      c->host = 0;
    else if (!strcmp(o, "--no-check"))
      c->check = 0;
    else if (!strcmp(o, "--readme") && v)
      c->readme = v, i++;
    else if (!strcmp(o, "--reps") && v && atoi(v) > 0)
      c->max_reps = atoi(v), i++;
    else if (!strcmp(o, "--cap") && v && strtod(v, NULL) > 0)
      c->cap_ms = strtod(v, NULL) * 1e3, i++;
    else if (!strcmp(o, "--baseline-max-len") && v && atoi(v) > 0)
      c->baseline_max_len = atoi(v), i++;
    else if (!strcmp(o, "--only") && v && parse_only(v, &c->only) == 0)
      i++;
    else if (!strcmp(o, "--paged") && v && parse_kv_pages(v, c) == 0)
      i++;
    else if (!strcmp(o, "--kv-dtype") && v && parse_kv_types(v, c) == 0)
      i++;
    else if (!strcmp(o, "--shape") && v && c->n_custom < MAX_ROWS && parse_shape(v, &c->custom[c->n_custom]) == 0)
      c->n_custom++, i++;
    else {
      fprintf(stderr, "clattn bench: bad option %s%s%s\nusage:\n%s", o, v ? " " : "", v ? v : "", bench_usage);
      return -1;
    }
  }
  return 0;
}

static int default_shapes(const bench_cfg *c, bench_shape *out) {
  int n = 0;
  if (c->n_custom) {
    for (int i = 0; i < c->n_custom; i++) out[n++] = c->custom[i];
    return n;
  }
  if (c->quick) {
    for (int causal = 0; causal < 2; causal++) out[n++] = (bench_shape){K_PREFILL, {1, 8, 8, 512, 512, 64, causal}};
    out[n++] = (bench_shape){K_GQA, {1, 16, 4, 256, 256, 128, 1}};
    out[n++] = (bench_shape){K_DECODE, {1, 32, 8, 1, 4096, 128, 0}};
    return n;
  }
  const int lens[] = {1024, 2048, 4096}, dims[] = {64, 128};
  for (int li = 0; li < 3; li++)
    for (int di = 0; di < 2; di++)
      for (int causal = 0; causal < 2; causal++)
        out[n++] = (bench_shape){K_PREFILL, {1, 8, 8, lens[li], lens[li], dims[di], causal}};
  out[n++] = (bench_shape){K_GQA, {1, 16, 4, 2048, 2048, 128, 1}};
  out[n++] = (bench_shape){K_DECODE, {1, 32, 8, 1, 8192, 128, 0}};
  out[n++] = (bench_shape){K_DECODE, {1, 32, 8, 1, 32768, 128, 0}};
  return n;
}

static unsigned kind_of(const bench_shape *s) { return (unsigned)s->kind; }

static char *shape_label(const bench_shape *sh, char *buf, size_t n) {
  const bb_shape *s = &sh->s;
  char heads[32], lens[48], batch[16] = "";
  if (s->heads == s->kv_heads)
    snprintf(heads, sizeof heads, "H%d", s->heads);
  else
    snprintf(heads, sizeof heads, "H%d/%d", s->heads, s->kv_heads);
  if (s->q_len == s->kv_len)
    snprintf(lens, sizeof lens, "M=N=%d", s->q_len);
  else
    snprintf(lens, sizeof lens, "M=%d N=%d", s->q_len, s->kv_len);
  if (s->batch != 1) snprintf(batch, sizeof batch, "B%d ", s->batch);
  const char *kind = sh->kind == K_DECODE   ? "decode"
                     : sh->kind == K_GQA    ? "GQA"
                     : sh->kind == K_MEMORY ? "memory"
                                            : "prefill";
  snprintf(buf, n, "%s %s%s %s d%d%s", kind, batch, heads, lens, s->dim, s->causal ? " causal" : "");
  return buf;
}

static double shape_flops(const bb_shape *s) {
  double f = 4.0 * s->batch * s->heads * (double)s->q_len * s->kv_len * s->dim;
  return s->causal ? f * 0.5 : f;
}

static double shape_bytes(const bb_shape *s) {
  return 4.0 * ((double)s->batch * s->kv_heads * s->kv_len * s->dim * 2 +
                (double)s->batch * s->heads * s->q_len * s->dim * 2);
}

/* ---- machine ---- */

typedef struct {
  char cpu[256];
  int cpus;
  char platform[256], platform_version[256], device[256], driver[128], device_version[256];
  cl_uint units;
  char openblas[512];
  char load[64]; /* /proc/loadavg's first three fields at the start */
} machine;

static void trim(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
}

static void machine_info(clattn_context *ctx, machine *mc) {
  memset(mc, 0, sizeof *mc);
  snprintf(mc->cpu, sizeof mc->cpu, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    int have = 0;
    while (fgets(line, sizeof line, f)) {
      if (!strncmp(line, "processor", 9)) mc->cpus++;
      char *colon = strchr(line, ':');
      if (!have && colon && !strncmp(line, "model name", 10)) {
        snprintf(mc->cpu, sizeof mc->cpu, "%s", colon + 1 + (colon[1] == ' '));
        trim(mc->cpu);
        have = 1;
      }
    }
    fclose(f);
  }
  f = fopen("/proc/loadavg", "r");
  double l1, l5, l15;
  if (f && fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3)
    snprintf(mc->load, sizeof mc->load, "%.2f %.2f %.2f", l1, l5, l15);
  else
    snprintf(mc->load, sizeof mc->load, "?");
  if (f) fclose(f);
  cl_device_id dev = clattn_cl_device(ctx);
  cl_platform_id plat = NULL;
  snprintf(mc->platform, sizeof mc->platform, "?");
  snprintf(mc->device, sizeof mc->device, "?");
  snprintf(mc->driver, sizeof mc->driver, "?");
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof mc->device, mc->device, NULL);
  clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof mc->driver, mc->driver, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof mc->device_version, mc->device_version, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof mc->units, &mc->units, NULL);
  if (clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL) == CL_SUCCESS) {
    clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof mc->platform, mc->platform, NULL);
    clGetPlatformInfo(plat, CL_PLATFORM_VERSION, sizeof mc->platform_version, mc->platform_version, NULL);
  }
  trim(mc->device);
  trim(mc->driver);
  trim(mc->platform_version);
  trim(mc->device_version);
  sbuf b = {0};
  sb_add(&b, "%s; openblas_get_num_threads() = %d", bb_openblas_config(), bb_openblas_threads());
  const char *env[] = {"OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"};
  for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
    if (getenv(env[i])) sb_add(&b, "; %s=%s", env[i], getenv(env[i]));
  snprintf(mc->openblas, sizeof mc->openblas, "%s", b.s ? b.s : "?");
  free(b.s);
}

/* ---- measuring ---- */

typedef struct {
  clattn_context *ctx;
  const clattn_params *p;
  cl_command_queue q;
} clattn_arg;

static int clattn_once(void *arg, char *err, size_t errlen) {
  clattn_arg *a = arg;
  clattn_status st = clattn_forward(a->ctx, a->p, 0, NULL, NULL);
  if (st != CLATTN_OK) {
    snprintf(err, errlen, "clattn_forward (%s): %s: %s", clattn_algo_name(a->p->algo), clattn_status_string(st),
             clattn_last_error(a->ctx));
    return -1;
  }
  cl_int e = clFinish(a->q);
  if (e != CL_SUCCESS) {
    snprintf(err, errlen, "clFinish: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

static int staged_once(void *arg, char *err, size_t errlen) {
  bb_device *b = ((void **)arg)[0];
  bb_staged *sp = ((void **)arg)[1];
  if (bb_staged_run(b, sp) != 0) {
    snprintf(err, errlen, "%s", b->err);
    return -1;
  }
  return 0;
}

static int host_once(void *arg, char *err, size_t errlen) {
  bb_host *h = arg;
  if (bb_host_run(h) != 0) {
    snprintf(err, errlen, "%s", h->err);
    return -1;
  }
  return 0;
}

/* Times one cell. *rate (GFLOP/s of this method's previous cell, 0 = none)
 * decides the warm-up: a cell expected to take longer than the cap on its
 * own is timed once without one (the smaller shapes before it have warmed
 * the same kernels). */
static void measure(const char *what, const char *label, bb_run_fn fn, void *arg, int warmup, const bench_cfg *c,
                    double flops, double *rate, cell *out, int *failures) {
  char err[768] = "";
  if (warmup && rate && *rate > 0 && flops / (*rate * 1e6) > c->cap_ms) warmup = 0;
  const double t0 = bb_now_ms();
  if (bb_time(fn, arg, warmup, c->max_reps, c->cap_ms, &out->ms, &out->reps, err, sizeof err) == 0) {
    out->state = CELL_OK;
    if (rate) *rate = flops / (out->ms * 1e6);
    if (c->verbose)
      fprintf(stderr, "  %s, %s: median %.2f ms of %d, %.2f s in all%s\n", label, what, out->ms, out->reps,
              (bb_now_ms() - t0) / 1e3, warmup ? "" : " (no warm-up)");
  } else {
    out->state = CELL_FAIL;
    (*failures)++;
    fprintf(stderr, "clattn bench: %s, %s: %s\n", label, what, err);
  }
}

static int read_buf(cl_command_queue q, cl_mem m, float *dst, size_t count, char *err, size_t n) {
  cl_int e = clEnqueueReadBuffer(q, m, CL_TRUE, 0, count * sizeof(float), dst, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    snprintf(err, n, "clEnqueueReadBuffer: %s (%d)", cp_cl_error_name(e), e);
    return -1;
  }
  return 0;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= m)) m = d; /* NaN wins */
  }
  return m;
}

static cp_problem *build_problem(clattn_context *ctx, const bb_shape *s, clattn_dtype dtype, const char *label,
                                 int *failures) {
  cp_shape cs = cp_shape_default();
  cs.dtype = dtype;
  cs.batch = s->batch;
  cs.q_heads = s->heads;
  cs.kv_heads = s->kv_heads;
  cs.q_len = s->q_len;
  cs.kv_len = s->kv_len;
  cs.head_dim = cs.value_dim = s->dim;
  cs.causal = s->causal;
  cs.poison_gaps = cs.poison_disallowed = 0;
  cs.seed = 12345;
  char err[512];
  cp_problem *pb = cp_build(&cs, err, sizeof err);
  if (!pb) {
    fprintf(stderr, "clattn bench: %s: %s\n", label, err);
    (*failures)++;
    return NULL;
  }
  if (cp_upload(pb, ctx) != 0) {
    fprintf(stderr, "clattn bench: %s: %s\n", label, pb->err);
    (*failures)++;
    cp_free(pb);
    return NULL;
  }
  return pb;
}

#define DIFF_TOL 1e-4

/* A --kv-dtype x --paged cache: pb's keys and values written there by
 * clattn_kv_append, and the FUSED call that reads it. */
enum { KV_MEMS = 7 };
typedef struct {
  clattn_params p;
  clattn_arg arg;
  cl_mem mems[KV_MEMS]; /* k, v, scales, block table, positions, kv_lens */
} kv_cell;

static void kv_release(kv_cell *kc) {
  for (int i = 0; i < KV_MEMS; i++)
    if (kc->mems[i]) clReleaseMemObject(kc->mems[i]);
  memset(kc, 0, sizeof *kc);
}

/* Builds cache `which` (kv_cache()); 0, 1 when the shape cannot have it, or
 * -1 with a message (kv_release frees what was made either way). */
static int kv_setup(clattn_context *ctx, const bench_cfg *c, const cp_problem *pb, const bb_shape *s, int which,
                    const char *label, kv_cell *kc) {
  clattn_dtype kv;
  int ps;
  kv_cache(c, which, &kv, &ps);
  const int paged = ps > 0, d = s->dim;
  memset(kc, 0, sizeof *kc);
  if (kv == CLATTN_Q8_0 && d % 32) {
    fprintf(stderr, "clattn bench: %s: q8_0 needs a head dim that is a multiple of 32: skipped\n", label);
    return 1;
  }
  const int per_seq = paged ? (s->kv_len + ps - 1) / ps : 1, pool = s->batch * per_seq;
  const int slots = paged ? pool : s->batch, rows = paged ? ps : s->kv_len;
  const size_t row_units = kv == CLATTN_Q8_0 ? (size_t)d / 32 * 34 : (size_t)d;
  const size_t unit = kv == CLATTN_F32 ? 4 : (kv == CLATTN_F16 || kv == CLATTN_BF16) ? 2 : 1;
  const size_t cache_bytes = (size_t)slots * s->kv_heads * rows * row_units * unit;
  const size_t n_scales = (size_t)slots * s->kv_heads * rows;
  cl_context cc = clattn_cl_context(ctx);
  cl_command_queue q = clattn_cl_queue(ctx);
  cl_int e = CL_SUCCESS;
  int32_t *table = malloc(sizeof(int32_t) * (size_t)pool), *zeros = calloc((size_t)s->batch, sizeof(int32_t)),
          *lens = malloc(sizeof(int32_t) * (size_t)s->batch);
  cl_mem k = NULL, v = NULL, ks = NULL, vs = NULL, bt = NULL, pos = NULL, kl = NULL;
  clattn_status st;
  int rc = -1;
  if (!table || !zeros || !lens) goto oom;
  for (int i = 0; i < pool; i++) table[i] = pool - 1 - i; /* any order: the last page first */
  for (int b = 0; b < s->batch; b++) lens[b] = s->kv_len;
  k = clCreateBuffer(cc, CL_MEM_READ_WRITE, cache_bytes, NULL, &e);
  if (e == CL_SUCCESS) v = clCreateBuffer(cc, CL_MEM_READ_WRITE, cache_bytes, NULL, &e);
  if (e == CL_SUCCESS && kv == CLATTN_INT8) ks = clCreateBuffer(cc, CL_MEM_READ_WRITE, n_scales * 4, NULL, &e);
  if (e == CL_SUCCESS && kv == CLATTN_INT8) vs = clCreateBuffer(cc, CL_MEM_READ_WRITE, n_scales * 4, NULL, &e);
  if (e == CL_SUCCESS)
    bt = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int32_t) * (size_t)pool, table, &e);
  if (e == CL_SUCCESS)
    pos = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int32_t) * (size_t)s->batch, zeros, &e);
  if (e == CL_SUCCESS)
    kl = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int32_t) * (size_t)s->batch, lens, &e);
  if (e != CL_SUCCESS) {
    fprintf(stderr, "clattn bench: %s: kv cache: clCreateBuffer: %s (%d)\n", label, cp_cl_error_name(e), e);
    goto fail;
  }
  const clattn_tensor view = {
      NULL,
      0,
      {(size_t)s->kv_heads * rows * row_units, (size_t)rows * row_units, row_units, kv == CLATTN_Q8_0 ? 34 : 1}};
  const clattn_tensor scale_view = {NULL, 0, {(size_t)s->kv_heads * rows, (size_t)rows, 1, 0}};
  clattn_append_params ap = clattn_append_params_default();
  ap.batch = s->batch;
  ap.kv_heads = s->kv_heads;
  ap.new_len = s->kv_len;
  ap.head_dim = ap.value_dim = d;
  ap.k_new = pb->params.k;
  ap.v_new = pb->params.v;
  ap.positions = pos;
  ap.kv_dtype = kv;
  ap.k = view;
  ap.k.buf = k;
  ap.v = view;
  ap.v.buf = v;
  if (kv == CLATTN_INT8) {
    ap.k_scale = scale_view;
    ap.k_scale.buf = ks;
    ap.v_scale = scale_view;
    ap.v_scale.buf = vs;
  }
  if (paged) {
    ap.block_table = bt;
    ap.block_table_stride = per_seq;
    ap.page_size = ps;
    ap.num_pages = pool;
  } else {
    ap.capacity = s->kv_len;
  }
  if ((st = clattn_kv_append(ctx, &ap, 0, NULL, NULL)) != CLATTN_OK || clFinish(q) != CL_SUCCESS) {
    fprintf(stderr, "clattn bench: %s: clattn_kv_append: %s: %s\n", label, clattn_status_string(st),
            clattn_last_error(ctx));
    goto fail;
  }
  clattn_params *p = &kc->p;
  *p = pb->params;
  p->algo = CLATTN_ALGO_FUSED;
  p->kv_dtype = kv;
  p->k = ap.k;
  p->v = ap.v;
  p->k_scale = ap.k_scale;
  p->v_scale = ap.v_scale;
  p->kv_lens = kl; /* contiguous or paged alike, as engines call */
  if (paged) {
    p->block_table = bt;
    p->block_table_stride = per_seq;
    p->page_size = ps;
    p->num_pages = pool;
  }
  rc = 0;
  goto done;
oom:
  fprintf(stderr, "clattn bench: %s: kv cache: out of host memory\n", label);
fail:
done:;
  const cl_mem mems[KV_MEMS] = {k, v, ks, vs, bt, pos, kl};
  memcpy(kc->mems, mems, sizeof mems);
  kc->arg = (clattn_arg){ctx, &kc->p, q};
  free(table);
  free(zeros);
  free(lens);
  return rc;
}

/* FUSED over every cache of kv_cache(), timed in turns (one call of each per
 * round, so a noisy neighbour slows them alike), then each output against
 * the f32 FUSED output (fused_out, or NULL). */
static void run_kv_cells(clattn_context *ctx, const bench_cfg *c, cp_problem *pb, row *r, const char *label,
                         const float *fused_out, size_t out_count, int *failures) {
  kv_cell cells[MAX_KV * MAX_KV];
  void *args[MAX_KV * MAX_KV];
  int which[MAX_KV * MAX_KV], n = 0;
  for (int i = 0; i < kv_caches(c); i++) {
    const int made = kv_setup(ctx, c, pb, &r->sh.s, i, label, &cells[n]);
    if (made != 0) {
      kv_release(&cells[n]);
      if (made < 0) r->kv[i].state = CELL_FAIL, (*failures)++;
      continue;
    }
    args[n] = &cells[n].arg;
    which[n++] = i;
  }
  double ms[MAX_KV * MAX_KV];
  int reps = 0;
  char err[768];
  float *out = malloc(out_count * sizeof(float));
  if (n && bb_time_rounds(clattn_once, args, n, c->max_reps, c->cap_ms, ms, &reps, err, sizeof err) != 0) {
    fprintf(stderr, "clattn bench: %s, clattn FUSED kv: %s\n", label, err);
    for (int j = 0; j < n; j++) r->kv[which[j]].state = CELL_FAIL;
    (*failures)++;
    n = 0;
  }
  for (int j = 0; j < n; j++) {
    r->kv[which[j]] = (cell){CELL_OK, ms[j], reps};
    if (!fused_out || !out) continue;
    if (clattn_once(args[j], err, sizeof err) == 0 &&
        read_buf(clattn_cl_queue(ctx), pb->out_buf, out, out_count, err, sizeof err) == 0)
      r->diff_kv[which[j]] = max_abs_diff(fused_out, out, out_count);
    else
      fprintf(stderr, "clattn bench: %s: %s\n", label, err), (*failures)++;
  }
  for (int j = 0; j < n; j++) kv_release(&cells[j]);
  free(out);
}

/* One line per cache of kv_cache(): bytes per token, time, the cache's read
 * rate, time against the first cache, paging's cost against the same type
 * contiguous (when both ran), difference from f32 FUSED. */
static void kv_lines(sbuf *b, const bench_cfg *c, const row *r, const char *indent) {
  char label[128], name[48];
  shape_label(&r->sh, label, sizeof label);
  const bb_shape *s = &r->sh.s;
  for (int i = 0; i < kv_caches(c); i++) {
    clattn_dtype type;
    int ps;
    kv_cache(c, i, &type, &ps);
    const double token = kv_token_bytes(type, s->kv_heads, s->dim);
    sb_add(b, "%s%s: FUSED over a %s cache (%.0f bytes per token): ", indent, label,
           kv_cache_name(type, ps, name, sizeof name), token);
    const cell *k = &r->kv[i];
    if (k->state != CELL_OK) {
      sb_add(b, "%s\n", k->state == CELL_FAIL ? "FAILED" : "not run");
      continue;
    }
    sb_add(b, "%.2f ms, %.1f GB/s of cache", k->ms, token * s->batch * (double)s->kv_len / (k->ms * 1e6));
    if (i > 0 && r->kv[0].state == CELL_OK) {
      clattn_dtype t0;
      int p0;
      kv_cache(c, 0, &t0, &p0);
      sb_add(b, ", %.2fx the %s time", k->ms / r->kv[0].ms, kv_cache_name(t0, p0, name, sizeof name));
    }
    for (int j = 0; ps && j < kv_caches(c); j++) {
      clattn_dtype tj;
      int pj;
      kv_cache(c, j, &tj, &pj);
      if (tj == type && pj == 0 && r->kv[j].state == CELL_OK)
        sb_add(b, ", paging %+.1f%%", 100.0 * (k->ms / r->kv[j].ms - 1.0));
    }
    sb_add(b, ", max |diff| vs f32 FUSED %.3g\n", r->diff_kv[i]);
  }
}

/* A row's label, work and bytes, and no difference measured yet. */
static void row_begin(row *r, char *label, size_t n) {
  shape_label(&r->sh, label, n);
  r->flops = shape_flops(&r->sh.s);
  r->bytes = shape_bytes(&r->sh.s);
  r->diff_st = r->diff_h = NAN;
  for (int i = 0; i < MAX_KV * MAX_KV; i++) r->diff_kv[i] = NAN;
}

/* Runs every column of one shape. */
static void run_row(clattn_context *ctx, bb_device *dev, int dev_ok, const bench_cfg *c, row *r, int ref_check,
                    double rates[6], int *failures) {
  char label[128];
  row_begin(r, label, sizeof label);
  const bb_shape *s = &r->sh.s;
  cp_problem *pb = build_problem(ctx, s, CLATTN_F32, label, failures);
  if (!pb) {
    r->a.state = r->f.state = CELL_FAIL;
    return;
  }
  cl_command_queue q = clattn_cl_queue(ctx);
  const size_t out_count = (size_t)s->batch * s->heads * s->q_len * s->dim;
  float *fused_out = malloc(out_count * sizeof(float)), *tmp = malloc(out_count * sizeof(float));
  int have_fused_out = 0;
  char err[512];
  if (!fused_out || !tmp) {
    fprintf(stderr, "clattn bench: %s: out of memory\n", label);
    (*failures)++;
    r->a.state = r->f.state = CELL_FAIL;
    goto done;
  }

  if (ref_check) { /* clattn FUSED against the fp64 reference, once */
    pb->params.algo = CLATTN_ALGO_FUSED;
    cp_result res;
    if (cp_run(pb, ctx, &res) != 0) {
      fprintf(stderr, "clattn bench: %s: reference check: %s\n", label, pb->err);
      (*failures)++;
    } else {
      char line[512];
      int ok = cp_result_ok(&res, 1e-5);
      printf("check: %s, clattn FUSED against the fp64 reference: %s (%s)\n", label, ok ? "ok" : "FAILED",
             cp_result_format(&res, line, sizeof line));
      if (!ok) (*failures)++;
    }
  }

  clattn_arg ca = {ctx, &pb->params, q};
  pb->params.algo = CLATTN_ALGO_AUTO;
  measure("clattn AUTO", label, clattn_once, &ca, 1, c, r->flops, &rates[0], &r->a, failures);
  pb->params.algo = CLATTN_ALGO_FUSED;
  measure("clattn FUSED", label, clattn_once, &ca, 1, c, r->flops, &rates[1], &r->f, failures);
  if (r->f.state == CELL_OK) {
    if (read_buf(q, pb->out_buf, fused_out, out_count, err, sizeof err) == 0)
      have_fused_out = 1;
    else
      fprintf(stderr, "clattn bench: %s: %s\n", label, err), (*failures)++;
  }

  if (kv_caches(c)) {
    run_kv_cells(ctx, c, pb, r, label, have_fused_out ? fused_out : NULL, out_count, failures);
    sbuf lines = {0};
    kv_lines(&lines, c, r, "  ");
    if (lines.s) printf("%s", lines.s);
    free(lines.s);
  }

  /* FUSED again with 16-bit storage (f32 arithmetic) */
  const clattn_dtype half_types[2] = {CLATTN_F16, CLATTN_BF16};
  cell *half_cells[2] = {&r->f16, &r->bf16};
  for (int t = 0; t < 2; t++) {
    cp_problem *hp = build_problem(ctx, s, half_types[t], label, failures);
    if (!hp) {
      half_cells[t]->state = CELL_FAIL;
      continue;
    }
    clattn_arg ha = {ctx, &hp->params, q};
    hp->params.algo = CLATTN_ALGO_FUSED;
    measure(t ? "clattn FUSED bf16" : "clattn FUSED f16", label, clattn_once, &ha, 1, c, r->flops, &rates[4 + t],
            half_cells[t], failures);
    cp_free(hp);
  }

  const int baselines = !c->baseline_max_len || (s->q_len <= c->baseline_max_len && s->kv_len <= c->baseline_max_len);
  if (c->staged && baselines) {
    bb_staged sp;
    if (!dev_ok) {
      r->st.state = CELL_FAIL;
    } else if (bb_staged_prepare(dev, &sp, s, pb->q_buf, pb->k_buf, pb->v_buf, (size_t)512 << 20) != 0) {
      fprintf(stderr, "clattn bench: %s: CLBlast staged: %s\n", label, dev->err);
      r->st.state = CELL_FAIL;
      (*failures)++;
    } else {
      void *arg[2] = {dev, &sp};
      measure("CLBlast staged", label, staged_once, arg, 1, c, r->flops, &rates[2], &r->st, failures);
      if (r->st.state == CELL_OK && have_fused_out) {
        if (read_buf(q, sp.o, tmp, out_count, err, sizeof err) == 0)
          r->diff_st = max_abs_diff(fused_out, tmp, out_count);
        else
          fprintf(stderr, "clattn bench: %s: %s\n", label, err), (*failures)++;
      }
      bb_staged_release(&sp);
    }
  }
  if (c->host && baselines) {
    bb_host h;
    if (bb_host_prepare(&h, s, pb->q, pb->k, pb->v, (size_t)256 << 20, bb_openblas_threads()) != 0) {
      fprintf(stderr, "clattn bench: %s: host: %s\n", label, h.err);
      r->h.state = CELL_FAIL;
      (*failures)++;
    } else {
      measure("host OpenBLAS", label, host_once, &h, 1, c, r->flops, &rates[3], &r->h, failures);
      if (r->h.state == CELL_OK && have_fused_out) r->diff_h = max_abs_diff(fused_out, h.o, out_count);
      bb_host_release(&h);
    }
  }
  if (!(r->diff_st <= DIFF_TOL) && !isnan(r->diff_st)) {
    fprintf(stderr, "clattn bench: %s: clattn FUSED and CLBlast staged disagree (max abs diff %.3g)\n", label,
            r->diff_st);
    (*failures)++;
  }
  if (!(r->diff_h <= DIFF_TOL) && !isnan(r->diff_h)) {
    fprintf(stderr, "clattn bench: %s: clattn FUSED and host OpenBLAS disagree (max abs diff %.3g)\n", label,
            r->diff_h);
    (*failures)++;
  }
done:
  free(fused_out);
  free(tmp);
  cp_free(pb);
}

/* The memory row: FUSED once on a long sequence, its peak scratch. */
static void run_memory(clattn_context *ctx, const bench_cfg *c, row *r, int *failures) {
  char label[128];
  row_begin(r, label, sizeof label);
  const bb_shape *s = &r->sh.s;
  cp_problem *pb = build_problem(ctx, s, CLATTN_F32, label, failures);
  if (!pb) {
    r->f.state = CELL_FAIL;
    return;
  }
  cl_command_queue q = clattn_cl_queue(ctx);
  pb->params.algo = CLATTN_ALGO_FUSED;
  clattn_arg ca = {ctx, &pb->params, q};
  clattn_peak_scratch_bytes(ctx, 1);
  bench_cfg one = {0};
  one.max_reps = 1;
  one.cap_ms = 0;
  one.verbose = c->verbose;
  measure("clattn FUSED", label, clattn_once, &ca, 0, &one, r->flops, NULL, &r->f, failures);
  r->scratch = clattn_peak_scratch_bytes(ctx, 1);
  if (r->f.state == CELL_OK) {
    const size_t n = (size_t)s->batch * s->heads * s->q_len * s->dim;
    float *o = malloc(n * sizeof(float));
    char err[256];
    r->finite = 1;
    if (!o || read_buf(q, pb->out_buf, o, n, err, sizeof err) != 0) {
      fprintf(stderr, "clattn bench: %s: %s\n", label, o ? err : "out of memory");
      r->finite = 0;
      (*failures)++;
    } else {
      for (size_t i = 0; i < n; i++)
        if (!isfinite(o[i])) {
          r->finite = 0;
          break;
        }
      if (!r->finite) {
        fprintf(stderr, "clattn bench: %s: non-finite output\n", label);
        (*failures)++;
      }
    }
    free(o);
  }
  cp_free(pb);
}

/* ---- the table ---- */

#define NCOLS 16

static const char *col_md[NCOLS] = {"shape",
                                    "AUTO GFLOP/s",
                                    "FUSED GFLOP/s",
                                    "FUSED ms",
                                    "FUSED f16 GFLOP/s",
                                    "FUSED bf16 GFLOP/s",
                                    "CLBlast staged GFLOP/s",
                                    "FUSED ÷ staged",
                                    "host OpenBLAS GFLOP/s",
                                    "FUSED ÷ host",
                                    "FUSED % of device SGEMM",
                                    "FUSED % of host SGEMM",
                                    "FUSED GB/s",
                                    "% of copy BW",
                                    "FUSED % of device FMA peak",
                                    "max abs diff vs staged / host"};
static const char *col_txt[NCOLS] = {"shape",  "auto",    "fused", "fused ms", "f16",
                                     "bf16",   "staged",  "f/stg", "host",     "f/host",
                                     "%devmm", "%hostmm", "GB/s",  "%copy",    "%peak",
                                     "maxdiff stg/host"};
static const int col_w[NCOLS] = {-40, 7, 7, 9, 7, 7, 7, 6, 7, 6, 7, 7, 6, 6, 6, 17};

static void cell_gflops(const cell *c, double flops, char *buf, size_t n) {
  if (c->state == CELL_OK)
    snprintf(buf, n, "%.1f", flops / (c->ms * 1e6));
  else
    snprintf(buf, n, "%s", c->state == CELL_FAIL ? "fail" : "-");
}

static void row_cells(const row *r, const ceilings *cl, char cells[NCOLS][64]) {
  shape_label(&r->sh, cells[0], 64);
  if (r->sh.kind == K_MEMORY) {
    char extra[64];
    snprintf(extra, sizeof extra, ", 1 call");
    strncat(cells[0], extra, 63 - strlen(cells[0]));
  }
  cell_gflops(&r->a, r->flops, cells[1], 64);
  cell_gflops(&r->f, r->flops, cells[2], 64);
  const int f_ok = r->f.state == CELL_OK;
  const double f_rate = f_ok ? r->flops / (r->f.ms * 1e6) : NAN;
  if (f_ok)
    snprintf(cells[3], 64, "%.1f", r->f.ms);
  else
    snprintf(cells[3], 64, "%s", r->f.state == CELL_FAIL ? "fail" : "-");
  cell_gflops(&r->f16, r->flops, cells[4], 64);
  cell_gflops(&r->bf16, r->flops, cells[5], 64);
  cell_gflops(&r->st, r->flops, cells[6], 64);
  if (f_ok && r->st.state == CELL_OK)
    snprintf(cells[7], 64, "%.2f", r->st.ms / r->f.ms);
  else
    snprintf(cells[7], 64, "-");
  cell_gflops(&r->h, r->flops, cells[8], 64);
  if (f_ok && r->h.state == CELL_OK)
    snprintf(cells[9], 64, "%.2f", r->h.ms / r->f.ms);
  else
    snprintf(cells[9], 64, "-");
  if (f_ok && cl->dev_gemm > 0)
    snprintf(cells[10], 64, "%.0f%%", 100.0 * f_rate / cl->dev_gemm);
  else
    snprintf(cells[10], 64, "-");
  if (f_ok && cl->host_gemm > 0)
    snprintf(cells[11], 64, "%.0f%%", 100.0 * f_rate / cl->host_gemm);
  else
    snprintf(cells[11], 64, "-");
  if (f_ok && r->sh.kind == K_DECODE) {
    double gbps = r->bytes / (r->f.ms * 1e6);
    snprintf(cells[12], 64, "%.1f", gbps);
    if (cl->copy_gbps > 0)
      snprintf(cells[13], 64, "%.0f%%", 100.0 * gbps / cl->copy_gbps);
    else
      snprintf(cells[13], 64, "-");
  } else {
    snprintf(cells[12], 64, "-");
    snprintf(cells[13], 64, "-");
  }
  if (f_ok && cl->dev_fma > 0)
    snprintf(cells[14], 64, "%.0f%%", 100.0 * f_rate / cl->dev_fma);
  else
    snprintf(cells[14], 64, "-");
  char a[24] = "-", b[24] = "-";
  if (!isnan(r->diff_st)) snprintf(a, sizeof a, "%.1e", r->diff_st);
  if (!isnan(r->diff_h)) snprintf(b, sizeof b, "%.1e", r->diff_h);
  if (isnan(r->diff_st) && isnan(r->diff_h))
    snprintf(cells[15], 64, "-");
  else
    snprintf(cells[15], 64, "%s / %s", a, b);
}

static void print_header(void) {
  for (int i = 0; i < NCOLS; i++) printf("%s%*s", i ? " " : "", col_w[i], col_txt[i]);
  printf("\n");
  fflush(stdout);
}

static void print_row(const row *r, const ceilings *cl) {
  char cells[NCOLS][64];
  row_cells(r, cl, cells);
  for (int i = 0; i < NCOLS; i++) printf("%s%*s", i ? " " : "", col_w[i], cells[i]);
  printf("\n");
  fflush(stdout);
}

/* ---- README ---- */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  sbuf b = {0};
  char chunk[8192];
  size_t n;
  sb_add(&b, "%s", "");
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) sb_add(&b, "%.*s", (int)n, chunk);
  int bad = ferror(f) || b.oom;
  fclose(f);
  if (bad) {
    free(b.s);
    return NULL;
  }
  *len = b.len;
  return b.s;
}

/* Start of the line "## Performance" in text, or NULL. */
static const char *find_heading(const char *text, const char *heading) {
  size_t hl = strlen(heading);
  for (const char *p = text; p && *p;) {
    if (!strncmp(p, heading, hl) && (p[hl] == '\n' || p[hl] == '\r' || p[hl] == ' ' || p[hl] == 0)) return p;
    p = strchr(p, '\n');
    if (p) p++;
  }
  return NULL;
}

static int update_readme(const char *path, const char *block) {
  size_t len = 0;
  char *text = read_file(path, &len);
  if (!text && errno != ENOENT) {
    fprintf(stderr, "clattn bench: cannot read %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!text) {
    text = calloc(1, 1);
    if (!text) return -1;
  }
  sbuf out = {0};
  sb_add(&out, "%s", "");
  char *begin = strstr(text, BEGIN_MARK);
  char *end = begin ? strstr(begin, END_MARK) : NULL;
  if (begin && end) {
    end += strlen(END_MARK);
    if (*end == '\n') end++;
    sb_add(&out, "%.*s%s%s", (int)(begin - text), text, block, end);
  } else {
    const char *h = find_heading(text, "## Performance");
    if (h) {
      const char *body = strchr(h, '\n');
      body = body ? body + 1 : h + strlen(h);
      /* the end of the section: the next "## " or "# " heading, else the end */
      const char *stop = NULL;
      for (const char *p = body; *p;) {
        if (!strncmp(p, "## ", 3) || !strncmp(p, "# ", 2)) {
          stop = p;
          break;
        }
        p = strchr(p, '\n');
        if (!p) break;
        p++;
      }
      if (!stop) stop = text + len;
      /* keep the section's text, then one blank line, the block, a blank line */
      const char *keep_end = stop;
      while (keep_end > body && (keep_end[-1] == '\n' || keep_end[-1] == '\r')) keep_end--;
      sb_add(&out, "%.*s", (int)(keep_end - text), text);
      sb_add(&out, "%s%s", keep_end > body ? "\n\n" : "\n", block);
      if (*stop) sb_add(&out, "\n%s", stop);
    } else {
      size_t n = len;
      while (n && text[n - 1] == '\n') n--;
      sb_add(&out, "%.*s%s## Performance\n\n%s", (int)n, text, n ? "\n\n" : "", block);
    }
  }
  free(text);
  if (out.oom) {
    free(out.s);
    return -1;
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.bench-tmp", path);
  FILE *f = fopen(tmp, "wb");
  int rc = -1;
  if (!f) {
    fprintf(stderr, "clattn bench: cannot write %s: %s\n", tmp, strerror(errno));
  } else {
    size_t w = fwrite(out.s, 1, out.len, f);
    int bad = fclose(f) != 0 || w != out.len;
    if (bad || rename(tmp, path) != 0) {
      fprintf(stderr, "clattn bench: cannot write %s: %s\n", path, strerror(errno));
      remove(tmp);
    } else {
      rc = 0;
    }
  }
  free(out.s);
  return rc;
}

static int needs_quotes(const char *a) {
  if (!*a) return 1;
  for (; *a; a++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./,=:+", *a)) return 1;
  return 0;
}

static void command_line(int argc, char **argv, sbuf *b) {
  const char *dev = getenv("CLATTN_DEVICE");
  if (dev) sb_add(b, "CLATTN_DEVICE=%s%s%s ", needs_quotes(dev) ? "'" : "", dev, needs_quotes(dev) ? "'" : "");
  for (int i = 0; i < argc; i++) {
    int qt = needs_quotes(argv[i]);
    sb_add(b, "%s%s%s%s", i ? " " : "", qt ? "'" : "", argv[i], qt ? "'" : "");
  }
}

static void md_row(sbuf *b, char cells[NCOLS][64]) {
  for (int i = 0; i < NCOLS; i++) sb_add(b, "| %s ", cells[i]);
  sb_add(b, "|\n");
}

static void readme_block(sbuf *b, int argc, char **argv, const machine *mc, const ceilings *cl, const row *rows,
                         int nrows, const bench_cfg *c, double total_s, int failures) {
  char date[64] = "?";
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  sb_add(b, "%s\n", BEGIN_MARK);
  sb_add(b, "<!-- written by `clattn bench --readme`; rerun it to replace this block -->\n\n");
  sb_add(b, "Measured %s with `", date);
  command_line(argc, argv, b);
  sb_add(b, "` (clattn %s, f32, %.0f s in all):\n\n", CLATTN_VERSION_STRING, total_s);
  sb_add(b, "- CPU: %s, %d logical CPUs (load average %s at the start)\n", mc->cpu, mc->cpus, mc->load);
  sb_add(b, "- OpenCL: platform %s (%s); device %s (%s, %u compute units), driver %s\n", mc->platform,
         mc->platform_version, mc->device, mc->device_version, mc->units, mc->driver);
  sb_add(b, "- OpenBLAS: %s\n", mc->openblas);
  sb_add(b, "- ceilings: CLBlast SGEMM %dx%dx%d on the device ", cl->gemm_n, cl->gemm_n, cl->gemm_n);
  if (cl->dev_gemm > 0)
    sb_add(b, "%.1f GFLOP/s", cl->dev_gemm);
  else
    sb_add(b, "not measured");
  sb_add(b, "; OpenBLAS SGEMM %dx%dx%d on the host ", cl->gemm_n, cl->gemm_n, cl->gemm_n);
  if (cl->host_gemm > 0)
    sb_add(b, "%.1f GFLOP/s", cl->host_gemm);
  else
    sb_add(b, "not measured");
  sb_add(b, "; FMA peak on the device ");
  if (cl->dev_fma > 0)
    sb_add(b, "%.1f GFLOP/s", cl->dev_fma);
  else
    sb_add(b, "not measured");
  sb_add(b, "; device copy (clEnqueueCopyBuffer, %.0f MiB, read + write) ", cl->copy_bytes / MIB);
  if (cl->copy_gbps > 0)
    sb_add(b, "%.1f GB/s", cl->copy_gbps);
  else
    sb_add(b, "not measured");
  sb_add(b, "\n\n");

  char cells[NCOLS][64];
  for (int i = 0; i < NCOLS; i++) snprintf(cells[i], 64, "%s", col_md[i]);
  md_row(b, cells);
  for (int i = 0; i < NCOLS; i++) snprintf(cells[i], 64, "%s", i ? "---:" : "---");
  md_row(b, cells);
  for (int i = 0; i < nrows; i++) {
    row_cells(&rows[i], cl, cells);
    md_row(b, cells);
  }
  sb_add(b,
         "\nGFLOP/s count 4·B·H·M·N·d FLOPs (QKᵀ and A·V), halved for causal, over the median wall time "
         "of a call and its clFinish (one warm-up call, then up to %d timed calls within %.1f s; a cell expected to "
         "take longer than that is timed once, without a warm-up); every "
         "column uses the same count, so the staged baselines, which compute the whole score matrix even "
         "when causal, are charged the same work. FUSED f16 / bf16: the same call with q, k, v and out stored in "
         "16 bits (arithmetic f32). Ratios are baseline time ÷ FUSED time (above 1: FUSED "
         "is faster). CLBlast staged: QKᵀ and A·V by CLBlastSgemmStridedBatched (one matrix per KV head, "
         "its query heads stacked), a one-work-group-per-row softmax kernel in between, scores in one "
         "buffer of up to 512 MiB. Host: the same with cblas_sgemm and a C softmax (expf) split across "
         "openblas_get_num_threads() threads. Decode GB/s count K and V read once plus Q and O (a K/V cache smaller "
         "than the CPU's last-level cache can beat the copy bandwidth). "
         "The FMA peak: independent float multiply-add chains in the device's native vector width, "
         "the most arithmetic its units do (attention's exponentials and maxima come on top). The "
         "last column is the largest absolute difference between clattn FUSED's output and each baseline's.\n",
         c->max_reps, c->cap_ms / 1e3);
  if (kv_caches(c)) {
    sb_add(b,
           "\nFUSED over the same keys and values written by clattn_kv_append into each cache of "
           "`--kv-dtype` x `--paged` (pages handed out in reverse order):\n\n");
    for (int i = 0; i < nrows; i++)
      if (rows[i].sh.kind != K_MEMORY) kv_lines(b, c, &rows[i], "- ");
  }
  for (int i = 0; i < nrows; i++) {
    const row *r = &rows[i];
    if (r->sh.kind != K_MEMORY) continue;
    char label[128];
    shape_label(&r->sh, label, sizeof label);
    const double mn = 4.0 * r->sh.s.batch * r->sh.s.heads * (double)r->sh.s.q_len * r->sh.s.kv_len;
    sb_add(b,
           "\nMemory check: %s with FUSED (one call, %s): clattn_peak_scratch_bytes = %zu bytes (%.2f MiB), "
           "where one f32 score matrix M·N·4 would be %.2f GiB; output %s.\n",
           label + strlen("memory "), r->f.state == CELL_OK ? "ok" : "FAILED", r->scratch, r->scratch / MIB,
           mn / (MIB * 1024.0), r->finite ? "all finite" : "NOT all finite");
  }
  if (failures) sb_add(b, "\n%d failure(s) during the run; see the tool's messages.\n", failures);
  sb_add(b, "%s\n", END_MARK);
}

/* ---- main ---- */

int bench_main(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--backward")) return bench_backward_main(argc, argv);
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--host")) return bench_host_main(argc, argv);
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--kvcache")) return bench_kvcache_main(argc, argv);
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--modifiers")) return bench_modifiers_main(argc, argv);
  bench_cfg c;
  int pa = parse_args(argc, argv, &c);
  if (pa != 0) return pa < 0 ? 2 : 0;
  const double t_start = bb_now_ms();
  int failures = 0;

  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn bench: cannot create a context: %s: %s\n", clattn_status_string(st),
            clattn_last_error(NULL));
    return 1;
  }
  machine mc;
  machine_info(ctx, &mc);
  printf(
      "clattn bench (clattn %s, f32)\ncpu: %s, %d logical CPUs, load average %s\nopencl: %s (%s); device %s (%s), "
      "driver %s\n"
      "openblas: %s\n",
      CLATTN_VERSION_STRING, mc.cpu, mc.cpus, mc.load, mc.platform, mc.platform_version, mc.device, mc.device_version,
      mc.driver, mc.openblas);

  bb_device dev;
  int dev_ok = bb_device_init(&dev, ctx) == 0;
  if (!dev_ok) {
    fprintf(stderr, "clattn bench: the device baseline cannot run: %s\n", dev.err);
    failures++;
  }

  ceilings cl = {0};
  cl.gemm_n = c.quick ? 1024 : 2048;
  char err[512];
  if (dev_ok && bb_device_sgemm_rate(&dev, cl.gemm_n, 3, c.cap_ms, &cl.dev_gemm) != 0) {
    fprintf(stderr, "clattn bench: device SGEMM ceiling: %s\n", dev.err);
    failures++;
  }
  if (bb_host_sgemm_rate(cl.gemm_n, 3, c.cap_ms, &cl.host_gemm, err, sizeof err) != 0) {
    fprintf(stderr, "clattn bench: host SGEMM ceiling: %s\n", err);
    failures++;
  }
  if (dev_ok && bb_device_fma_rate(&dev, 5, c.cap_ms, &cl.dev_fma) != 0) {
    fprintf(stderr, "clattn bench: device FMA peak: %s\n", dev.err);
    failures++;
  }
  if (dev_ok &&
      bb_device_copy_rate(&dev, (size_t)(c.quick ? 64 : 256) << 20, 5, c.cap_ms, &cl.copy_gbps, &cl.copy_bytes) != 0) {
    fprintf(stderr, "clattn bench: device copy bandwidth: %s\n", dev.err);
    failures++;
  }
  if (c.verbose) fprintf(stderr, "  ceilings measured in %.1f s\n", (bb_now_ms() - t_start) / 1e3);
  printf(
      "ceilings: device CLBlast SGEMM %d^3 %.1f GFLOP/s, host OpenBLAS SGEMM %d^3 %.1f GFLOP/s, "
      "device copy %.0f MiB %.1f GB/s, device FMA peak %.1f GFLOP/s\n\n",
      cl.gemm_n, cl.dev_gemm, cl.gemm_n, cl.host_gemm, cl.copy_bytes / MIB, cl.copy_gbps, cl.dev_fma);

  static row rows[MAX_ROWS + 1];
  bench_shape shapes[MAX_ROWS];
  int nshapes = default_shapes(&c, shapes), nrows = 0;
  print_header();
  int ref_done = !c.check;
  double rates[6] = {0}; /* AUTO, FUSED, staged, host, FUSED f16, bf16: the last cell's GFLOP/s */
  for (int i = 0; i < nshapes; i++) {
    if (!(kind_of(&shapes[i]) & c.only) && !c.n_custom) continue;
    row *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    r->sh = shapes[i];
    int ref_check = !ref_done && (r->sh.kind == K_PREFILL || c.n_custom);
    if (ref_check) ref_done = 1;
    run_row(ctx, &dev, dev_ok, &c, r, ref_check, rates, &failures);
    print_row(r, &cl);
  }
  if ((c.only & K_MEMORY) && !c.n_custom) {
    row *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    int len = c.quick ? 8192 : 32768;
    r->sh = (bench_shape){K_MEMORY, {1, 1, 1, len, len, 64, 1}};
    run_memory(ctx, &c, r, &failures);
    print_row(r, &cl);
    char label[128];
    printf(
        "\n%s, FUSED: peak scratch %zu bytes (%.2f MiB); one f32 score matrix would be %.2f GiB; "
        "output %s\n",
        shape_label(&r->sh, label, sizeof label), r->scratch, r->scratch / MIB,
        4.0 * len * (double)len / (MIB * 1024.0), r->finite ? "all finite" : "NOT all finite");
  }
  if ((c.only & K_HOST) && !c.n_custom) { /* what one decode call costs the host (bench_host.c) */
    printf("\n");
    bench_host_cfg hc = bench_host_defaults();
    if (c.quick) hc.reps = 50;
    if (bench_host_run(ctx, &hc) != 0) failures++;
  }
  /* the correctness guard, spelled out for the smallest prefill shape */
  for (int i = 0; i < nrows; i++) {
    if (rows[i].sh.kind == K_MEMORY || (isnan(rows[i].diff_st) && isnan(rows[i].diff_h))) continue;
    char label[128];
    printf(
        "\ncheck: %s: max |clattn FUSED - CLBlast staged| = %.3g, max |clattn FUSED - host OpenBLAS| = %.3g "
        "(NaN: not compared)\n",
        shape_label(&rows[i].sh, label, sizeof label), rows[i].diff_st, rows[i].diff_h);
    break;
  }
  const double total_s = (bb_now_ms() - t_start) / 1e3;
  printf("\ntotal bench time: %.1f s\n", total_s);

  int rc = failures ? 1 : 0;
  if (c.readme) {
    sbuf b = {0};
    readme_block(&b, argc, argv, &mc, &cl, rows, nrows, &c, total_s, failures);
    if (b.oom || update_readme(c.readme, b.s) != 0) {
      fprintf(stderr, "clattn bench: could not update %s\n", c.readme);
      rc = 1;
    } else {
      printf("updated the bench block of %s\n", c.readme);
    }
    free(b.s);
  }
  if (failures) fprintf(stderr, "clattn bench: %d failure(s)\n", failures);
  if (dev_ok) bb_device_release(&dev);
  clattn_destroy(ctx);
  return rc;
}
