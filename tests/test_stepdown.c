/*
 * flash_block's step-down (src/fused.c): a device whose built kernel cannot
 * run 128 work-items per group, or spills into private memory, gets the
 * next smaller tile rebuilt, then flash_tiled; never a launch failure.
 * The device's answers are faked through the OpenCL shim (tests/cl_shim.c)
 * on POCL with the GPU kernels forced (CLATTN_FLASH_WG=64).
 */
#include <stdlib.h>

#include "cl_shim.h"
#include "kit_checks.h"

/* One fused call of a d=64 prefill on a fresh context (the fused program is
 * built, and the step-down taken, once per context), with `n` answers of
 * flash_block's `param` faked as `value`; *queries: flash_block's queries. */
static void run_faked(cl_kernel_work_group_info param, cl_ulong value, long n, const char *what, long *queries) {
  *queries = -1;
  char cache[256];
  snprintf(cache, sizeof cache, "%s/clattn-stepdown-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  REQUIREF(mkdtemp(cache) != NULL, "mkdtemp %s", cache);
  clattn_options opt = {0};
  opt.cache_dir = cache;
  clattn_status st = clattn_create(&opt, &ct_ctx);
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: no OpenCL device (%s)\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  REQUIREF(st == CLATTN_OK, "clattn_create: %s", clattn_last_error(NULL));
  cp_shape s = cp_shape_default();
  s.q_heads = 2; s.kv_heads = 1; s.q_len = 37; s.kv_len = 53; s.head_dim = 64; s.value_dim = 64;
  s.causal = 1; s.want_lse = 1; s.poison_gaps = 1; s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  shim_fake_kernel_info("flash_block", param, value, n);
  CHECKF(KC_RUN_OK(pb, CLATTN_ALGO_FUSED, 2e-5) == 1, "%s: the fused call failed or was wrong", what);
  *queries = shim_kernel_queries();
  shim_fake_kernel_info(NULL, 0, 0, 0);
  cp_free(pb);
  clattn_destroy(ct_ctx);
  ct_ctx = NULL;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  (void)!system(cmd);
}

/* Each built flash_block is asked twice (work-group size, private memory). */
static void runs_as_built_without_a_step(void) {
  long queries;
  run_faked(CL_KERNEL_WORK_GROUP_SIZE, 0, 0, "real answers", &queries);
  CHECKF(queries == 2, "%ld queries", queries);
}

static void small_work_group_steps_down_one_tile(void) {
  long queries;
  run_faked(CL_KERNEL_WORK_GROUP_SIZE, 64, 1, "one answer of 64 work-items", &queries);
  CHECKF(queries == 4, "%ld queries", queries);
}

static void large_private_memory_steps_down_one_tile(void) {
  long queries;
  /* a CPU's private memory is its stack: the limit is set for the test,
   * above POCL's answers and below the faked one */
  setenv("CLATTN_BLOCK_PRIVATE_MAX", "1099511627776", 1);
  run_faked(CL_KERNEL_PRIVATE_MEM_SIZE, 1ull << 41, 1, "one answer of 2 TiB private memory", &queries);
  unsetenv("CLATTN_BLOCK_PRIVATE_MAX");
  CHECKF(queries == 4, "%ld queries", queries);
}

/* No tile runs: every smaller one is built and asked (five at d=64 here),
 * then flash_tiled computes the call. */
static void no_tile_runs_falls_back_to_flash_tiled(void) {
  long queries;
  run_faked(CL_KERNEL_WORK_GROUP_SIZE, 32, 1000, "every answer 32 work-items", &queries);
  CHECKF(queries == 10, "%ld queries", queries);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(runs_as_built_without_a_step),
      CT_TEST(small_work_group_steps_down_one_tile),
      CT_TEST(large_private_memory_steps_down_one_tile),
      CT_TEST(no_tile_runs_falls_back_to_flash_tiled),
  };
  if (!shim_active()) {
    printf("skipped: the OpenCL shim found no OpenCL library\n");
    return CT_SKIP;
  }
  setenv("CLATTN_FLASH_WG", "64", 1);
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
