/*
 * clattn — the command-line tool: one command per word (usage() says what
 * each does; `clattn COMMAND --help` gives its options).
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
#include "lab.h"
#include "problem.h"
#include "run.h"
#include "tune.h"
#include "worked.h"

/* meson's project version (tools/meson.build) */
#ifndef CLATTN_TOOL_VERSION
#define CLATTN_TOOL_VERSION CLATTN_VERSION_STRING
#endif

static const char commands[] =
    "commands:\n"
    "  info     list OpenCL platforms and devices; the chosen device, its tiles and tuning\n"
    "  run      one attention problem (random, or from .npy files), verified against fp64\n"
    "  demo     device summary, the seeds' worked examples, one larger verified run\n"
    "  bench    clattn against CLBlast staged attention and host OpenBLAS attention\n"
    "  tune     time candidate tiles on this device and write a tuning file\n"
    "  lab      the seeds' routing checks and interventions, with assertions\n"
    "\n"
    "`clattn COMMAND --help` lists a command's options; `clattn --version` prints the version.\n"
    "The device is CLATTN_DEVICE's match (a substring of the platform or device name),\n"
    "else the first GPU, else the first device.\n";

static int usage(FILE *f) {
  fprintf(f, "usage: clattn info\n       clattn demo\n%s%s%s%s\n%s", run_usage, bench_usage, tune_usage, lab_usage,
          commands);
  return f == stdout ? 0 : 2;
}

/* info and demo take no options. */
static int no_options(const char *cmd, const char *what, int argc, char **argv) {
  if (argc < 3) return 0;
  if (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) {
    printf("usage: clattn %s\n\n%s\n", cmd, what);
    return 1;
  }
  fprintf(stderr, "clattn %s: takes no options, got '%s' (clattn %s --help)\n", cmd, argv[2], cmd);
  return -1;
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

/* ---- demo: the seeds' worked examples on the device ---- */

static int run_example(clattn_context *ctx, const cp_worked *e) {
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
    for (int d = 0; d < e->dk; d++) pb->k[cp_index(&p->k, 0, 0, j, d)] = e->k[j * e->dk + d];
    for (int d = 0; d < e->dv; d++) pb->v[cp_index(&p->v, 0, 0, j, d)] = e->v[j * e->dv + d];
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
    ok = ok && fabs(pb->weights[j] - e->want_w[j]) <= e->tol_w;
  }
  printf("]  output [");
  for (int d = 0; d < e->dv; d++) {
    printf("%s%.3f", d ? ", " : "", pb->out[d]);
    ok = ok && fabs(pb->out[d] - e->want_out[d]) <= e->tol_out;
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
  for (int i = 0; i < CP_N_WORKED; i++) failed += run_example(ctx, &cp_worked_examples[i]);

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
  failed += run_verified(ctx, &s, 3, 1e-5);
  printf("\n%s\n", failed ? "demo: SOME CHECKS FAILED" : "demo: all checks passed");
  clattn_destroy(ctx);
  return failed ? 1 : 0;
}

static const char info_what[] =
    "Lists the OpenCL platforms and devices, then the device clattn picks (CLATTN_DEVICE,\n"
    "else the first GPU, else the first device): its tiles and budgets and where each\n"
    "came from, the tuning file, AUTO's choices and the program cache.";
static const char demo_what[] =
    "The main job: the device summary, the seeds' worked examples computed on the\n"
    "device and checked against their hand-worked values, then one larger verified\n"
    "run (causal, GQA, padding). Exit status 0 when every check passes.";

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  const char *cmd = argv[1];
  int rc;
  if (!strcmp(cmd, "info")) return (rc = no_options(cmd, info_what, argc, argv)) ? (rc > 0 ? 0 : 2) : cmd_info();
  if (!strcmp(cmd, "demo")) return (rc = no_options(cmd, demo_what, argc, argv)) ? (rc > 0 ? 0 : 2) : cmd_demo();
  if (!strcmp(cmd, "run")) return run_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return bench_main(argc, argv);
  if (!strcmp(cmd, "tune")) return tune_main(argc, argv);
  if (!strcmp(cmd, "lab")) return lab_main(argc, argv);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) return usage(stdout);
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) return printf("clattn %s\n", CLATTN_TOOL_VERSION), 0;
  fprintf(stderr, "clattn: unknown command '%s'\n", cmd);
  return usage(stderr);
}
