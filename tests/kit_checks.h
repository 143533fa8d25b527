/*
 * Checks built on the problem kit, shared by the OpenCL test executables.
 */
#ifndef CLATTN_TESTS_KIT_CHECKS_H
#define CLATTN_TESTS_KIT_CHECKS_H

#include "check.h"
#include "api/api.h"
#include "problem.h"

/* The algorithms every device test runs. STAGED and AUTO must run, GEMM too
 * when the build has it (CLBlast), FUSED unless the routing matrix (weights)
 * is asked for. */
static const clattn_algo kc_algos[] = {
    CLATTN_ALGO_STAGED,
    CLATTN_ALGO_AUTO,
    CLATTN_ALGO_FUSED,
    CLATTN_ALGO_GEMM,
};
#define KC_NALGOS (sizeof kc_algos / sizeof kc_algos[0])

static inline int kc_algo_optional(clattn_algo a, const clattn_params *p) {
  return (a == CLATTN_ALGO_FUSED && p->weights.buf != NULL) || (a == CLATTN_ALGO_GEMM && !ca_gemm_available());
}

/* Builds a problem; records a failure (with the kit's message) on error. */
#define KC_BUILD(pb, shape)                            \
  do {                                                 \
    char kc_err_[256] = "";                            \
    (pb) = cp_build((shape), kc_err_, sizeof kc_err_); \
    REQUIREF((pb) != NULL, "cp_build: %s", kc_err_);   \
  } while (0)

/* Whether the environment restricts this run to other algorithms:
 * CLATTN_TEST_ALGOS="fused,gemm" runs only those (meson uses it to rerun
 * the fused tests with the other fused kernel without redoing the rest). */
static inline int kc_algo_filtered_out(clattn_algo algo) {
  const char *only = getenv("CLATTN_TEST_ALGOS");
  return only && *only && !strstr(only, clattn_algo_name(algo));
}

/* Runs pb with algo: 1 ran (r filled), 0 skipped (optional algo unsupported,
 * or filtered out), -1 harness failure (recorded). */
static inline int kc_run(cp_problem *pb, clattn_algo algo, cp_result *r, const char *file, int line) {
  if (kc_algo_filtered_out(algo)) return 0;
  pb->params.algo = algo;
  if (cp_run(pb, ct_context(), r) != 0) {
    ct_check(0, file, line, "harness: %s", pb->err);
    return -1;
  }
  if (r->status == CLATTN_ERR_UNSUPPORTED && kc_algo_optional(algo, &pb->params)) return 0;
  return 1;
}

/* Runs and checks against the reference within tol; prints the shape on failure. */
static inline int kc_run_ok(cp_problem *pb, clattn_algo algo, double tol, const char *file, int line) {
  cp_result r;
  int ran = kc_run(pb, algo, &r, file, line);
  if (ran <= 0) return ran;
  if (!cp_result_ok(&r, tol)) {
    char d[512], f[512];
    cp_shape s = pb->shape;
    s.algo = algo;
    ct_check(0, file, line, "%s: %s\n      (%s)", clattn_algo_name(algo), cp_result_format(&r, f, sizeof f),
             cp_describe(&s, d, sizeof d));
    if (r.status != CLATTN_OK) printf("      last error: %s\n", clattn_last_error(ct_context()));
    return -1;
  }
  return 1;
}

#define KC_RUN_OK(pb, algo, tol) kc_run_ok((pb), (algo), (tol), __FILE__, __LINE__)

/* A CL_MEM_READ_WRITE copy of n bytes of host data: the kit uploads inputs
 * read-only, and an output on a read-only buffer is refused for that before
 * anything else is looked at. NULL (recorded) on failure. */
static inline cl_mem kc_rw_copy(cp_problem *pb, const void *host, size_t n) {
  cl_int e;
  cl_mem m = clCreateBuffer(pb->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, (void *)host, &e);
  CHECKF(e == CL_SUCCESS, "clCreateBuffer(%zu bytes): %d", n, e);
  return e == CL_SUCCESS ? m : NULL;
}

/* A clattn context embedded in ct_context()'s cl_context and device with a
 * queue of its own that runs commands out of order; NULL (with a note)
 * when the device has no such queues or creation fails. Destroy it with
 * clattn_destroy (it holds the queue's only reference). */
static inline clattn_context *kc_out_of_order_context(void) {
  clattn_context *base = ct_context(), *ctx = NULL;
  cl_command_queue_properties props = 0;
  clGetDeviceInfo(clattn_cl_device(base), CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  if (!(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    printf("  (the device has no out-of-order queues: not tested)\n");
    return NULL;
  }
  cl_int e;
  cl_command_queue q =
      clCreateCommandQueue(clattn_cl_context(base), clattn_cl_device(base), CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
  if (!CHECKF(e == CL_SUCCESS, "clCreateCommandQueue(out of order): %s", cp_cl_error_name(e))) return NULL;
  clattn_options opt;
  memset(&opt, 0, sizeof opt);
  opt.context = clattn_cl_context(base);
  opt.device = clattn_cl_device(base);
  opt.queue = q;
  CHECKF(clattn_create(&opt, &ctx) == CLATTN_OK, "embedded out-of-order context: %s", clattn_last_error(NULL));
  clReleaseCommandQueue(q);
  return ctx;
}

/* Relative closeness for single numbers: |x - want| <= tol * max(1, |want|). */
static inline int kc_close(double x, double want, double tol) { return fabs(x - want) <= tol * fmax(1.0, fabs(want)); }

#define CHECK_CLOSE(x, want, tol)                                                                         \
  ct_check(kc_close((x), (want), (tol)), __FILE__, __LINE__, "%s = %.9g, expected %.9g", #x, (double)(x), \
           (double)(want))

#endif
