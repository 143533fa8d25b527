/*
 * A tiny test harness: CHECK macros record failures (file:line and a
 * message) without stopping the test; ct_main runs a table of tests, prints
 * each name with ok/FAIL and ends with "P passed, F failed" alone on a line.
 * Exit status: 0 all passed, 1 any failed, 77 skipped (no OpenCL device).
 *
 * The OpenCL suites share one clattn context per executable (kernel builds
 * take seconds on POCL): ct_context() creates it on first use.
 */
#ifndef CLATTN_TESTS_CHECK_H
#define CLATTN_TESTS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"

#define CT_SKIP 77

typedef struct {
  const char *name;
  void (*fn)(void);
} ct_test;

static int ct_current_failures; /* failed checks in the running test */
static long ct_total_checks;
static clattn_context *ct_ctx;
static void (*ct_teardown)(void); /* set by ct_context: destroys ct_ctx */
static void (*ct_cleanup)(void);  /* set by a test file: frees its objects before teardown */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline int
ct_check(int ok, const char *file, int line, const char *fmt, ...) {
  ct_total_checks++;
  if (ok) return 1;
  ct_current_failures++;
  if (ct_current_failures <= 20) {
    fprintf(stdout, "    %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
  } else if (ct_current_failures == 21) {
    fprintf(stdout, "    (further failures of this test not shown)\n");
  }
  return 0;
}

/* CHECK(cond): records "cond" on failure. CHECKF(cond, fmt, ...): with a message. */
#define CHECK(cond)       ct_check(!!(cond), __FILE__, __LINE__, "check failed: %s", #cond)
#define CHECKF(cond, ...) ct_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* |a - b| <= tol, with a message naming both values. */
#define CHECK_NEAR(a, b, tol)                                                                                        \
  ct_check(fabs((double)(a) - (double)(b)) <= (tol), __FILE__, __LINE__, "%s = %.17g, expected %s = %.17g (tol %g)", \
           #a, (double)(a), #b, (double)(b), (double)(tol))

/* A status, printed by name, with the context's last error on mismatch. */
#define CHECK_STATUS(got, want)                                                                \
  ct_check((got) == (want), __FILE__, __LINE__, "%s = %s, expected %s (last error: %s)", #got, \
           clattn_status_string(got), clattn_status_string(want), ct_ctx ? clattn_last_error(ct_ctx) : "")

/* Aborts the current test function (not the program) when a setup step fails. */
#define REQUIRE(cond)         \
  do {                        \
    if (!CHECK(cond)) return; \
  } while (0)
#define REQUIREF(cond, ...)                 \
  do {                                      \
    if (!CHECKF(cond, __VA_ARGS__)) return; \
  } while (0)

static inline void ct_destroy_context(void) {
  clattn_destroy(ct_ctx);
  ct_ctx = NULL;
}

/* Exits 77, saying why, when CLATTN_TEST_PLATFORM names a platform (a
 * substring of its name) other than the device's: a run that sets one
 * runtime's own variables (POCL_WORK_GROUP_METHOD) means nothing on another. */
static inline void ct_require_platform(clattn_context *ctx) {
  const char *want = getenv("CLATTN_TEST_PLATFORM");
  if (!want || !*want) return;
  cl_platform_id platform = NULL;
  char name[256] = "";
  if (clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) != CL_SUCCESS ||
      clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof name, name, NULL) != CL_SUCCESS)
    snprintf(name, sizeof name, "(unknown: its query failed)");
  if (strstr(name, want)) return;
  printf("skipped: this run is for platform \"%s\" only (CLATTN_TEST_PLATFORM: it sets that runtime's own "
         "variables, see tests/meson.build); the device's platform is \"%s\"\n",
         want, name);
  exit(CT_SKIP);
}

/* Exits 77, saying why, when `var` (a kernel's sub-group variant at a
 * size, or 0 for its local-memory reductions) asks for what this device
 * cannot run or what the run without it already is: sub-groups of N lanes
 * it does not offer (the library would ignore the value), or 0 on a device
 * without sub-groups. */
static inline void ct_require_sub_group_size(clattn_context *ctx, const char *var, const char *kernel) {
  const char *want = getenv(var);
  if (!want || !*want) return;
  const size_t lanes = (size_t)atoi(want);
  size_t sizes[16], bytes = 0;
  char ext[8192] = "";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
  if (!strstr(ext, "cl_intel_subgroups") || !strstr(ext, "cl_intel_required_subgroup_size") ||
      clGetDeviceInfo(clattn_cl_device(ctx), 0x4108 /* CL_DEVICE_SUB_GROUP_SIZES_INTEL */, sizeof sizes, sizes,
                      &bytes) != CL_SUCCESS)
    bytes = 0;
  int offered = 0;
  for (size_t i = 0; i < bytes / sizeof sizes[0]; i++) offered |= sizes[i] == lanes;
  if (lanes == 0 ? bytes > 0 : offered) return;
  if (lanes == 0)
    printf("skipped: %s=0 (%s through local memory) is this device's only %s: it has no sub-groups "
           "(cl_intel_required_subgroup_size), so the run without the variable is this one\n",
           var, kernel, kernel);
  else
    printf("skipped: %s=%s: this device offers no sub-groups of %zu lanes a kernel can require "
           "(cl_intel_subgroups, CL_DEVICE_SUB_GROUP_SIZES_INTEL)\n",
           var, want, lanes);
  exit(CT_SKIP);
}

/* flash_block's (CLATTN_BLOCK_SG) and softmax_rows' (CLATTN_SOFTMAX_SG). */
static inline void ct_require_sub_groups(clattn_context *ctx) {
  ct_require_sub_group_size(ctx, "CLATTN_BLOCK_SG", "flash_block");
  ct_require_sub_group_size(ctx, "CLATTN_SOFTMAX_SG", "softmax_rows");
}

/* Exits 77, saying why, when CLATTN_BLOCK_HALF_MATH=1 (flash_block's half
 * products) asks for half arithmetic the device does not report. */
static inline void ct_require_half_math(clattn_context *ctx) {
  const char *want = getenv("CLATTN_BLOCK_HALF_MATH");
  if (!want || strcmp(want, "1") != 0) return;
  char ext[8192] = "";
  clGetDeviceInfo(clattn_cl_device(ctx), CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
  if (strstr(ext, "cl_khr_fp16")) return;
  printf("skipped: CLATTN_BLOCK_HALF_MATH=1: this device reports no cl_khr_fp16 (no half arithmetic)\n");
  exit(CT_SKIP);
}

/* The shared clattn context, created with defaults on first use. Exits 77
 * when there is no OpenCL device, when the device is not on
 * CLATTN_TEST_PLATFORM or cannot run CLATTN_BLOCK_SG's, CLATTN_SOFTMAX_SG's or
 * CLATTN_BLOCK_HALF_MATH's variant, and 1 when creation fails otherwise. */
static inline clattn_context *ct_context(void) {
  if (ct_ctx) return ct_ctx;
  ct_teardown = ct_destroy_context;
  clattn_status st = clattn_create(NULL, &ct_ctx);
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: no OpenCL device (%s)\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  if (st != CLATTN_OK) {
    printf("clattn_create failed: %s: %s\n", clattn_status_string(st), clattn_last_error(NULL));
    printf("0 passed, 1 failed\n");
    exit(1);
  }
  ct_require_platform(ct_ctx);
  ct_require_sub_groups(ct_ctx);
  ct_require_half_math(ct_ctx);
  return ct_ctx;
}

/* The whole of a cl_mem of the shared context (malloc'd), or NULL with a
 * failure recorded: to check that a refused call left a buffer as it was. */
static inline unsigned char *ct_mem_bytes(cl_mem m, size_t *n) {
  *n = 0;
  unsigned char *host = NULL;
  if (clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof *n, n, NULL) == CL_SUCCESS && (host = malloc(*n ? *n : 1)) &&
      clEnqueueReadBuffer(clattn_cl_queue(ct_context()), m, CL_TRUE, 0, *n, host, 0, NULL, NULL) == CL_SUCCESS)
    return host;
  free(host);
  CHECKF(0, "cannot read a cl_mem back");
  return NULL;
}

/* Runs the tests whose names contain argv[1] (all when absent). */
static inline int ct_main(int argc, char **argv, const ct_test *tests, size_t n) {
  /* argv[1]: run only the tests whose names contain it; "-NAME": all but those */
  const char *filter = argc > 1 ? argv[1] : NULL;
  const int exclude = filter && filter[0] == '-';
  if (exclude) filter++;
  int passed = 0, failed = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (size_t t = 0; t < n; t++) {
    if (filter && (strstr(tests[t].name, filter) == NULL) != exclude) continue;
    ct_current_failures = 0;
    printf("%s ...\n", tests[t].name);
    tests[t].fn();
    if (ct_current_failures == 0) {
      printf("  ok   %s\n", tests[t].name);
      passed++;
    } else {
      printf("  FAIL %s (%d failed checks)\n", tests[t].name, ct_current_failures);
      failed++;
    }
  }
  if (ct_cleanup) ct_cleanup();
  if (ct_teardown) ct_teardown();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

#define CT_TEST(name) \
  { #name, name }

#endif
