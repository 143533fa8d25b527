/*
 * clattn — the command-line tool.
 *
 *   clattn info              platforms, devices, the chosen device and its tiles
 *   clattn run [options]     one verified problem (random data, chosen shape,
 *                            masks and algorithm): error against fp64 and time
 *   clattn demo              the main job: device summary, the seeds' worked
 *                            examples on the device, one larger verified run
 *   clattn bench [options]   clattn against CLBlast staged attention and host
 *                            OpenBLAS attention (bench.c)
 *   clattn tune [options]    times candidate tiles, writes a tuning file (tune.c)
 *   clattn lab [options]     the seeds' routing checks and interventions, with
 *                            assertions; JSON and a heat map on request (lab.c)
 *
 * The device is CLATTN_DEVICE's match, else the first GPU, else the first
 * device (POCL's CPU device where there is no GPU).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "clattn.h"
#include "heatmap.h"
#include "lab.h"
#include "problem.h"
#include "tune.h"

static int usage(FILE *f) {
  fprintf(f,
          "usage: clattn info\n"
          "       clattn demo\n"
          "       clattn run [--batch B] [--heads H] [--kv-heads HKV] [--q-len M] [--kv-len N]\n"
          "                  [--head-dim DK] [--value-dim DV] [--causal] [--window L,R]\n"
          "                  [--kv-lens] [--mask random|block|none] [--bias] [--layout bhsd|bshd]\n"
          "                  [--scale S] [--algo auto|staged|fused|gemm] [--weights] [--lse] [--diag]\n"
          "                  [--empty zero|error] [--poison] [--reps R] [--seed S] [--tol T]\n"
          "                  [--dtype f32|f16|bf16] [--softcap C] [--alibi] [--sinks] [--additive] [--varlen]\n"
          "                  [--heatmap FILE.png]\n"
          "%s%s%s",
          bench_usage, tune_usage, lab_usage);
  return 2;
}

static clattn_context *open_context(void) {
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(NULL, &ctx);
  if (st != CLATTN_OK) {
    fprintf(stderr, "clattn: cannot create a context: %s: %s\n", clattn_status_string(st), clattn_last_error(NULL));
    return NULL;
  }
  return ctx;
}

/* ---- info ---- */

static void list_devices(void) {
  cl_platform_id platforms[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS || np == 0) {
    printf("no OpenCL platforms\n");
    return;
  }
  for (cl_uint p = 0; p < np && p < 16; p++) {
    char name[256] = "?", version[256] = "?";
    clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
    clGetPlatformInfo(platforms[p], CL_PLATFORM_VERSION, sizeof version, version, NULL);
    printf("platform %u: %s (%s)\n", p, name, version);
    cl_device_id devices[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &nd) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < nd && d < 16; d++) {
      char dname[256] = "?";
      cl_ulong mem = 0;
      clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof dname, dname, NULL);
      clGetDeviceInfo(devices[d], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
      printf("  device %u: %s, %.1f GiB\n", d, dname, mem / 1073741824.0);
    }
  }
}

static int cmd_info(void) {
  list_devices();
  clattn_context *ctx = open_context();
  if (!ctx) return 1;
  printf("\nchosen device:\n%s", clattn_describe(ctx));
  clattn_destroy(ctx);
  return 0;
}

/* ---- run ---- */

static int parse_algo(const char *s, clattn_algo *a) {
  const clattn_algo all[] = {CLATTN_ALGO_AUTO, CLATTN_ALGO_STAGED, CLATTN_ALGO_FUSED, CLATTN_ALGO_GEMM};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, clattn_algo_name(all[i])) == 0) return *a = all[i], 0;
  return -1;
}

/* Parses run's options into s; returns -1 on a bad option. */
static int parse_run(int argc, char **argv, cp_shape *s, int *reps, double *tol, const char **heatmap) {
  for (int i = 0; i < argc; i++) {
    const char *o = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_OPT(flag, field) \
  if (strcmp(o, flag) == 0 && val) { field = atoi(val); i++; continue; }
    INT_OPT("--batch", s->batch)
    INT_OPT("--heads", s->q_heads)
    INT_OPT("--kv-heads", s->kv_heads)
    INT_OPT("--q-len", s->q_len)
    INT_OPT("--kv-len", s->kv_len)
    INT_OPT("--head-dim", s->head_dim)
    INT_OPT("--value-dim", s->value_dim)
    INT_OPT("--reps", *reps)
#undef INT_OPT
    if (strcmp(o, "--seed") == 0 && val) { s->seed = strtoull(val, NULL, 10); i++; continue; }
    if (strcmp(o, "--scale") == 0 && val) { s->scale = strtof(val, NULL); i++; continue; }
    if (strcmp(o, "--tol") == 0 && val) { *tol = strtod(val, NULL); i++; continue; }
    if (strcmp(o, "--heatmap") == 0 && val) { *heatmap = val; s->want_weights = 1; i++; continue; }
    if (strcmp(o, "--causal") == 0) { s->causal = 1; continue; }
    if (strcmp(o, "--kv-lens") == 0) { s->kv_lens = 1; continue; }
    if (strcmp(o, "--bias") == 0) { s->bias = CP_BIAS_RANDOM; continue; }
    if (strcmp(o, "--weights") == 0) { s->want_weights = 1; continue; }
    if (strcmp(o, "--lse") == 0) { s->want_lse = 1; continue; }
    if (strcmp(o, "--diag") == 0) { s->want_diag = 1; continue; }
    if (strcmp(o, "--alibi") == 0) { s->alibi = 1; continue; }
    if (strcmp(o, "--additive") == 0) { s->additive = 1; continue; }
    if (strcmp(o, "--varlen") == 0) { s->varlen = 1; continue; }
    if (strcmp(o, "--dtype") == 0 && val) {
      if (!strcmp(val, "f32")) s->dtype = CLATTN_F32;
      else if (!strcmp(val, "f16")) s->dtype = CLATTN_F16;
      else if (!strcmp(val, "bf16")) s->dtype = CLATTN_BF16;
      else return fprintf(stderr, "clattn run: --dtype f32|f16|bf16\n"), -1;
      i++;
      continue;
    }
    if (strcmp(o, "--sinks") == 0) { s->sinks = 1; continue; }
    if (strcmp(o, "--softcap") == 0 && val) { s->softcap = strtof(val, NULL); i++; continue; }
    if (strcmp(o, "--poison") == 0) { s->poison_disallowed = 1; s->poison_gaps = 1; continue; }
    if (strcmp(o, "--window") == 0 && val && sscanf(val, "%d,%d", &s->window_left, &s->window_right) == 2) { i++; continue; }
    if (strcmp(o, "--layout") == 0 && val && (!strcmp(val, "bhsd") || !strcmp(val, "bshd"))) {
      s->layout = strcmp(val, "bshd") == 0 ? CP_BSHD : CP_BHSD;
      i++;
      continue;
    }
    if (strcmp(o, "--mask") == 0 && val) {
      if (!strcmp(val, "random")) s->mask = CP_MASK_RANDOM;
      else if (!strcmp(val, "block")) s->mask = CP_MASK_BLOCK_DIAG;
      else if (!strcmp(val, "none")) s->mask = CP_MASK_NONE;
      else return -1;
      i++;
      continue;
    }
    if (strcmp(o, "--empty") == 0 && val && (!strcmp(val, "zero") || !strcmp(val, "error"))) {
      s->empty_rows = strcmp(val, "error") == 0 ? CLATTN_EMPTY_ERROR : CLATTN_EMPTY_ZERO;
      i++;
      continue;
    }
    if (strcmp(o, "--algo") == 0 && val && parse_algo(val, &s->algo) == 0) { i++; continue; }
    fprintf(stderr, "clattn run: bad option %s\n", o);
    return -1;
  }
  return 0;
}

/* Renders the routing matrix of batch 0, head 0 (dense weights start with
 * it), at most HEAT_MAX x HEAT_MAX cells from the top-left corner. */
#define HEAT_MAX 512
static int write_run_heatmap(const cp_problem *pb, const char *desc, const char *path) {
  const cp_shape *s = &pb->shape;
  int rows = s->q_len < HEAT_MAX ? s->q_len : HEAT_MAX, cols = s->kv_len < HEAT_MAX ? s->kv_len : HEAT_MAX;
  char title[160], caption[1200], crop[160] = "", err[512];
  if (rows < s->q_len || cols < s->kv_len)
    snprintf(crop, sizeof crop, " Shown: the top-left %d x %d of the %d x %d matrix.", rows, cols, s->q_len, s->kv_len);
  snprintf(title, sizeof title, "clattn run: routing matrix of batch 0, head 0 (%d queries x %d keys)", s->q_len,
           s->kv_len);
  snprintf(caption, sizeof caption,
           "Routing coefficients a_ij (the weights output) of one head for one random input.%s Disallowed keys "
           "have weight 0.\nThis is a routing diagnostic, not an explanation of any output.\nProblem: %s",
           crop, desc);
  heatmap h = {pb->weights, rows, cols, (size_t)s->kv_len, title, caption};
  if (heatmap_write_png(&h, path, err, sizeof err) != 0) return fprintf(stderr, "clattn: %s\n", err), 1;
  printf("  heat map: %s\n", path);
  return 0;
}

/* Runs one problem, prints its line; returns 0 when verified within tol.
 * heatmap (may be NULL): a PNG of batch 0 / head 0's weights (needs them). */
static int run_verified(clattn_context *ctx, const cp_shape *s, int reps, double tol, const char *heatmap) {
  char err[512], line[512], desc[512];
  cp_problem *pb = cp_build(s, err, sizeof err);
  if (!pb) {
    fprintf(stderr, "clattn: %s\n", err);
    return 1;
  }
  cp_result r;
  int rc = 1;
  if (cp_run(pb, ctx, &r) != 0) {
    fprintf(stderr, "clattn: %s\n", pb->err);
    goto done;
  }
  printf("%s\n", cp_describe(s, desc, sizeof desc));
  if (r.status != CLATTN_OK) {
    printf("  status: %s: %s\n", clattn_status_string(r.status), clattn_last_error(ctx));
    goto done;
  }
  double ms = r.ms;
  clattn_status st = CLATTN_OK;
  if (reps > 0 && cp_time_forward(pb, ctx, reps, &ms, &st) != 0) {
    fprintf(stderr, "clattn: %s\n", pb->err);
    goto done;
  }
  double flops = 4.0 * s->batch * s->q_heads * (double)s->q_len * s->kv_len * 0.5 * (s->head_dim + s->value_dim);
  if (s->causal) flops *= 0.5;
  int ok = cp_result_ok(&r, tol);
  printf("  %s\n  time: %.3f ms per call (%s), %.2f GFLOP/s\n  verified against fp64 within %g: %s\n",
         cp_result_format(&r, line, sizeof line), ms, reps > 0 ? "mean of timed calls" : "first call",
         flops / (ms * 1e6), tol, ok ? "yes" : "NO");
  rc = ok ? 0 : 1;
  if (heatmap && pb->weights && write_run_heatmap(pb, desc, heatmap) != 0) rc = 1;
done:
  cp_free(pb);
  return rc;
}

static int cmd_run(int argc, char **argv) {
  cp_shape s = cp_shape_default();
  s.q_len = s.kv_len = 256;
  s.head_dim = s.value_dim = 64;
  s.q_heads = s.kv_heads = 4;
  int reps = 3;
  double tol = 1e-5;
  const char *heatmap = NULL;
  if (parse_run(argc, argv, &s, &reps, &tol, &heatmap) != 0) return usage(stderr);
  clattn_context *ctx = open_context();
  if (!ctx) return 1;
  int rc = run_verified(ctx, &s, reps, tol, heatmap);
  clattn_destroy(ctx);
  return rc;
}

/* ---- demo: the seeds' worked examples on the device ---- */

typedef struct {
  const char *name;
  int n, dk, dv;            /* candidates, key width, value width */
  float q[2];
  float k[3][2], v[3][2];
  float scale;              /* NAN = 1/sqrt(dk) */
  unsigned char allowed[3];
  double want_out[2], want_w[3];
  double tol;
} worked_example;

static const worked_example examples[] = {
    {"positive read", 3, 2, 2, {2, 0}, {{2, 0}, {0, 2}, {1.2f, 0.8f}}, {{10, 0}, {0, 10}, {6, 4}}, NAN, {1, 1, 1},
     {8.638, 1.362}, {0.724, 0.043, 0.233}, 5e-4},
    {"structural mask", 3, 2, 2, {2, 0}, {{2, 0}, {0, 2}, {1.2f, 0.8f}}, {{10, 0}, {0, 10}, {6, 4}}, NAN, {0, 1, 1},
     {5.071, 4.929}, {0.0, 0.155, 0.845}, 5e-4},
    {"key collision", 2, 2, 1, {1, 0}, {{1, 0}, {1, 0}}, {{0}, {100}}, NAN, {1, 1}, {50}, {0.5, 0.5}, 1e-4},
    {"uniform control", 3, 2, 1, {1, 0}, {{2, 0}, {0, 2}, {1.2f, 0.8f}}, {{2}, {8}, {14}}, 0.0f, {1, 1, 1}, {8},
     {1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-4},
    {"memory read", 3, 2, 1, {1, 0}, {{1, 0}, {0, 1}, {-1, 0}}, {{10}, {20}, {40}}, NAN, {1, 1, 1}, {17.04},
     {0.576, 0.284, 0.140}, 5e-3},
    {"two-key mixture", 2, 2, 2, {1, 0}, {{1, 0}, {0, 1}}, {{2, 0}, {0, 4}}, NAN, {1, 1}, {1.34, 1.32},
     {0.67, 0.33}, 1e-2},
};

static int run_example(clattn_context *ctx, const worked_example *e) {
  cp_shape s = cp_shape_default();
  s.q_len = 1;
  s.kv_len = e->n;
  s.head_dim = e->dk;
  s.value_dim = e->dv;
  s.scale = e->scale;
  s.want_weights = 1;
  s.mask = CP_MASK_ONES;
  char err[512];
  cp_problem *pb = cp_build(&s, err, sizeof err);
  if (!pb) return fprintf(stderr, "clattn: %s\n", err), 1;
  const clattn_params *p = &pb->params;
  for (int d = 0; d < e->dk; d++) pb->q[cp_index(&p->q, 0, 0, 0, d)] = e->q[d];
  for (int j = 0; j < e->n; j++) {
    for (int d = 0; d < e->dk; d++) pb->k[cp_index(&p->k, 0, 0, j, d)] = e->k[j][d];
    for (int d = 0; d < e->dv; d++) pb->v[cp_index(&p->v, 0, 0, j, d)] = e->v[j][d];
    pb->mask[cp_index(&p->mask, 0, 0, 0, j)] = e->allowed[j];
  }
  cp_result r;
  int rc = 1;
  if (cp_run(pb, ctx, &r) != 0) {
    fprintf(stderr, "clattn: %s\n", pb->err);
    goto done;
  }
  int ok = r.status == CLATTN_OK && cp_result_ok(&r, 1e-5);
  printf("  %-16s weights [", e->name);
  for (int j = 0; j < e->n; j++) {
    printf("%s%.3f", j ? ", " : "", pb->weights[j]);
    ok = ok && fabs(pb->weights[j] - e->want_w[j]) <= e->tol * 2;
  }
  printf("]  output [");
  for (int d = 0; d < e->dv; d++) {
    printf("%s%.3f", d ? ", " : "", pb->out[d]);
    ok = ok && fabs(pb->out[d] - e->want_out[d]) <= e->tol * (1 + fabs(e->want_out[d]));
  }
  printf("]  %s\n", ok ? "ok" : "MISMATCH");
  rc = ok ? 0 : 1;
done:
  cp_free(pb);
  return rc;
}

static int cmd_demo(void) {
  clattn_context *ctx = open_context();
  if (!ctx) return 1;
  printf("clattn %s: scaled dot-product attention on OpenCL\n\n%s\n", CLATTN_VERSION_STRING, clattn_describe(ctx));
  int failed = 0;
  printf("the seeds' worked examples, computed on the device:\n");
  for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) failed += run_example(ctx, &examples[i]);

  printf("\na larger verified run (causal, GQA, padding with NaN past kv_lens):\n");
  cp_shape s = cp_shape_default();
  s.batch = 2;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.q_len = 333;
  s.kv_len = 517;
  s.head_dim = 64;
  s.value_dim = 64;
  s.causal = 1;
  s.kv_lens = 1;
  s.want_lse = 1;
  s.poison_disallowed = 1;
  s.algo = CLATTN_ALGO_AUTO;
  failed += run_verified(ctx, &s, 3, 1e-5, NULL);
  printf("\n%s\n", failed ? "demo: SOME CHECKS FAILED" : "demo: all checks passed");
  clattn_destroy(ctx);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (strcmp(argv[1], "info") == 0) return cmd_info();
  if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 2, argv + 2);
  if (strcmp(argv[1], "demo") == 0) return cmd_demo();
  if (strcmp(argv[1], "bench") == 0) return bench_main(argc, argv);
  if (strcmp(argv[1], "tune") == 0) return tune_main(argc, argv);
  if (strcmp(argv[1], "lab") == 0) return lab_main(argc, argv);
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout), 0;
  return usage(stderr);
}
