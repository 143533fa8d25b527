/*
 * Embedded mode: clattn runs inside the caller's own cl_context, device and
 * queue, and on destroy gives back exactly the references it took, so the
 * caller's objects keep working and release cleanly.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <time.h>

#include "kit_checks.h"

static cl_platform_id g_platform;
static cl_device_id g_device;

/* The first device of the first platform that has one; exits 77 without. */
static void find_device(void) {
  cl_uint np = 0;
  if (clGetPlatformIDs(0, NULL, &np) != CL_SUCCESS || np == 0) {
    printf("skipped: no OpenCL platform\n");
    exit(CT_SKIP);
  }
  cl_platform_id plats[16];
  if (np > 16) np = 16;
  if (clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) {
    printf("skipped: clGetPlatformIDs failed\n");
    exit(CT_SKIP);
  }
  for (cl_uint i = 0; i < np; i++) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &g_device, &nd) == CL_SUCCESS && nd > 0) {
      g_platform = plats[i];
      return;
    }
  }
  printf("skipped: no OpenCL device\n");
  exit(CT_SKIP);
}

static void embedded_context_runs_and_leaves_caller_objects_working(void) {
  cl_int e;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)g_platform, 0};
  cl_context cc = clCreateContext(props, 1, &g_device, NULL, NULL, &e);
  REQUIREF(e == CL_SUCCESS && cc, "clCreateContext: %s", cp_cl_error_name(e));
  cl_command_queue cq = clCreateCommandQueue(cc, g_device, 0, &e);
  if (!CHECKF(e == CL_SUCCESS && cq, "clCreateCommandQueue: %s", cp_cl_error_name(e))) {
    clReleaseContext(cc);
    return;
  }
  const cl_uint ctx_refs0 = cp_context_refs(cc), queue_refs0 = cp_queue_refs(cq);
  cp_refs_show_leaks(cc);

  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = cc;
  opt.device = g_device;
  opt.queue = cq;
  clattn_context *ctx = NULL;
  clattn_status st = clattn_create(&opt, &ctx);
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: %s\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  CHECKF(st == CLATTN_OK, "clattn_create(embedded): %s: %s", clattn_status_string(st), clattn_last_error(NULL));
  if (st == CLATTN_OK) {
    ct_ctx = ctx; /* for kc_run / CHECK_STATUS messages */
    CHECK(clattn_cl_context(ctx) == cc);
    CHECK(clattn_cl_queue(ctx) == cq);
    CHECK(clattn_cl_device(ctx) == g_device);
    const char *d = clattn_describe(ctx);
    CHECK(d != NULL && *d != '\0');

    cp_shape s = cp_shape_default();
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
    s.seed = 81;
    char err[256];
    cp_problem *pb = cp_build(&s, err, sizeof err);
    if (CHECKF(pb != NULL, "cp_build: %s", err)) {
      if (CHECKF(cp_upload(pb, ctx) == 0, "%s", pb->err)) CHECK(pb->cl_ctx == cc && pb->queue == cq);
      KC_RUN_OK(pb, CLATTN_ALGO_STAGED, 1e-5);
      KC_RUN_OK(pb, CLATTN_ALGO_AUTO, 1e-5);
      cp_free(pb);
    }
    clattn_destroy(ctx);
    ct_ctx = NULL;
  }

  /* Drivers release the objects behind finished commands asynchronously
   * (POCL under load), so the counts may settle a little after destroy. */
  clFinish(cq);
  for (int tries = 0; tries < 300; tries++) {
    if (cp_context_refs(cc) == ctx_refs0 && cp_queue_refs(cq) == queue_refs0) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECKF(cp_context_refs(cc) == ctx_refs0, "context reference count %u after destroy, %u before", cp_context_refs(cc),
         ctx_refs0);
  CHECKF(cp_queue_refs(cq) == queue_refs0, "queue reference count %u after destroy, %u before", cp_queue_refs(cq),
         queue_refs0);

  /* the caller's queue and context still work */
  float host[64], back[64];
  for (int i = 0; i < 64; i++) host[i] = (float)i * 0.5f;
  cl_mem buf = clCreateBuffer(cc, CL_MEM_READ_WRITE, sizeof host, NULL, &e);
  CHECKF(e == CL_SUCCESS && buf, "clCreateBuffer after destroy: %s", cp_cl_error_name(e));
  if (buf) {
    CHECK(clEnqueueWriteBuffer(cq, buf, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL) == CL_SUCCESS);
    CHECK(clEnqueueReadBuffer(cq, buf, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL) == CL_SUCCESS);
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK(clFinish(cq) == CL_SUCCESS);
    CHECK(clReleaseMemObject(buf) == CL_SUCCESS);
  }
  CHECK(clReleaseCommandQueue(cq) == CL_SUCCESS);
  CHECK(clReleaseContext(cc) == CL_SUCCESS);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(embedded_context_runs_and_leaves_caller_objects_working),
  };
  find_device();
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
