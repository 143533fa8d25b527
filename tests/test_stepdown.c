/*
 * flash_block's step-down (src/registry.c): a device whose built kernel cannot
 * run 128 work-items per group, or spills into private memory, gets the
 * next smaller tile rebuilt, then flash_tiled; never a launch failure.
 * The device's answers are faked through the OpenCL shim (tests/cl_shim.c)
 * on POCL with the GPU kernels forced (CLATTN_FLASH_WG=64); a tuned tile
 * (block_rm x block_rn) likewise, and stepped down per head dim where it
 * does not fit. And the argument block against CL_DEVICE_MAX_PARAMETER_SIZE.
 */
#include <stdlib.h>

#include <string.h>

#include "cl_shim.h"
#include "api/api.h"
#include "kit_checks.h"
#include "device/program_text.h"

/* One fused call of a prefill with head dims d on a fresh context (the
 * fused program is built, and the step-down taken, once per context), with
 * `n` answers of flash_block's `param` faked as `value`; *queries:
 * flash_block's queries; *built: the tile its flash_block runs with (rm 0:
 * none, flash_tiled). */
static void run_faked_d(int d, cl_kernel_work_group_info param, cl_ulong value, long n, const char *what, long *queries,
                        tl_block *built) {
  *queries = -1;
  *built = (tl_block){-1, -1};
  clattn_options opt = {0};
  opt.cache_dir = ""; /* every program built here, none loaded */
  clattn_status st = clattn_create(&opt, &ct_ctx);
  if (st == CLATTN_ERR_NO_DEVICE) {
    printf("skipped: no OpenCL device (%s)\n", clattn_last_error(NULL));
    exit(CT_SKIP);
  }
  REQUIREF(st == CLATTN_OK, "clattn_create: %s", clattn_last_error(NULL));
  cp_shape s = cp_shape_default();
  s.q_heads = 2;
  s.kv_heads = 1;
  s.q_len = 37;
  s.kv_len = 53;
  s.head_dim = d;
  s.value_dim = d;
  s.causal = 1;
  s.want_lse = 1;
  s.poison_gaps = 1;
  s.poison_disallowed = 1;
  cp_problem *pb;
  KC_BUILD(pb, &s);
  shim_fake_kernel_info("flash_block", param, value, n);
  CHECKF(KC_RUN_OK(pb, CLATTN_ALGO_FUSED, 2e-5) == 1, "%s: the fused call failed or was wrong", what);
  *queries = shim_kernel_queries();
  shim_fake_kernel_info(NULL, 0, 0, 0);
  ca_program info;
  const ca_program_key key = ca_fused_key(d, d, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, 0);
  if (CHECK(ca_program_get(ct_ctx, &key, &info) == CLATTN_OK)) *built = info.block;
  cp_free(pb);
  clattn_destroy(ct_ctx);
  ct_ctx = NULL;
}

/* The same at d = 64. */
static void run_faked(cl_kernel_work_group_info param, cl_ulong value, long n, const char *what, long *queries) {
  tl_block built;
  run_faked_d(64, param, value, n, what, queries, &built);
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

/* run_faked_d on CL_KERNEL_WORK_GROUP_SIZE with the tile tuned to rm x rn
 * (CLATTN_BLOCK_RM / RN, as a tuning file's block_rm / block_rn). */
static void run_tuned(const char *rm, const char *rn, int d, cl_ulong value, long n, const char *what, long *queries,
                      tl_block *built) {
  setenv("CLATTN_BLOCK_RM", rm, 1);
  setenv("CLATTN_BLOCK_RN", rn, 1);
  run_faked_d(d, CL_KERNEL_WORK_GROUP_SIZE, value, n, what, queries, built);
  unsetenv("CLATTN_BLOCK_RM");
  unsetenv("CLATTN_BLOCK_RN");
}

/* A tuned tile (CLATTN_BLOCK_RM / RN, as a tuning file's block_rm /
 * block_rn) whose local memory does not fit these head dims is stepped down
 * before building, to the next smaller pair that fits: 4x4 at d = 128 needs
 * 64 KiB against the 48 KiB cap, 2x4 40 KiB. Built once, asked once. */
static void oversize_tuned_tile_steps_down_per_head_dim(void) {
  long queries;
  tl_block built;
  run_tuned("4", "4", 128, 0, 0, "tuned 4x4 at d=128", &queries, &built);
  CHECKF(queries == 2, "%ld queries", queries);
  CHECKF(built.rm == 2 && built.rn == 4, "built %dx%d", built.rm, built.rn);
}

/* A tuned tile whose built kernel cannot run its group steps down after
 * building like a chosen one, by local memory alone (the register budget
 * is the tuning's to override): tuned 2x4 at d = 64 (the choice would be
 * 4x4) -> 1x4; the call still matches the reference. */
static void tuned_tile_that_cannot_run_steps_down(void) {
  long queries;
  tl_block built;
  run_tuned("2", "4", 64, 64, 1, "tuned 2x4, one answer of 64 work-items", &queries, &built);
  CHECKF(queries == 4, "%ld queries", queries);
  CHECKF(built.rm == 1 && built.rn == 4, "built %dx%d", built.rm, built.rn);
}

/* The fused kernels of program each take the arguments cl/args.h.cl's
 * families give the host: flash_pack its own, the *_core entries
 * flash_core's, the others flash_core's and flash_extra's (each family's
 * buffers and its struct), the *_step entries flash_step's; `want` among them. */
static void fused_kernels_take_the_host_count(cl_program program, const char *const *want, int n_want) {
  cl_kernel kernels[32];
  cl_uint n = 0;
  REQUIRE(clCreateKernelsInProgram(program, 32, kernels, &n) == CL_SUCCESS);
  int found = 0;
  for (cl_uint i = 0; i < n; i++) {
    char name[64] = "";
    cl_uint args = 0;
    CHECK(clGetKernelInfo(kernels[i], CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) == CL_SUCCESS);
    CHECK(clGetKernelInfo(kernels[i], CL_KERNEL_NUM_ARGS, sizeof args, &args, NULL) == CL_SUCCESS);
    const size_t len = strlen(name);
    const int expected = !strcmp(name, "flash_pack")                   ? CA_NBUF(flash_pack) + 1
                         : len > 5 && !strcmp(name + len - 5, "_core") ? CA_NBUF(flash_core) + 1
                         : len > 5 && !strcmp(name + len - 5, "_step") ? CA_NBUF(flash_step) + 1
                                                                       : CA_NBUF(flash_core) + CA_NBUF(flash_extra) + 2;
    CHECKF((int)args == expected, "%s takes %u arguments, the host counts %d", name, args, expected);
    for (int w = 0; w < n_want; w++) found += !strcmp(name, want[w]);
    clReleaseKernel(kernels[i]);
  }
  CHECKF(found == n_want, "%d of the %d kernels expected in the program (%u kernels)", found, n_want, n);
}

/* The argument block the host checks against CL_DEVICE_MAX_PARAMETER_SIZE
 * is the kernels' own: as many arguments as the built kernels take, in the
 * work-group kernels' program (this context's) and in flash_rows' (a CPU's). */
static void argument_block_is_the_kernels(void) {
  CHECK(ca_fused_arg_bytes(32) < ca_fused_arg_bytes(64));
  clattn_context *ctx = ct_context();
  ca_program built;
  const ca_program_key key = ca_fused_key(64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, 0);
  REQUIREF(ca_program_get(ctx, &key, &built) == CLATTN_OK, "%s", clattn_last_error(ctx));
  cl_program program = built.program;
  const char *work_group[] = {"flash_block", "flash_tiled", "flash_decode"};
  fused_kernels_take_the_host_count(program, work_group, 3);
  tl_tiles rows_tiles = ctx->tiles;
  rows_tiles.flash_wg = 0;
  ca_program_text text;
  ca_fused_text(&rows_tiles, &ctx->caps, 64, 64, CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME, &text);
  REQUIREF(
      ca_build_program(ctx, "fused (flash_rows)", text.sources, text.n_sources, text.options, &program) == CLATTN_OK,
      "%s", clattn_last_error(ctx));
  const char *rows[] = {"flash_pack", "flash_rows", "flash_rows_direct8", "flash_rows_direct8_core",
                        "flash_rows_direct8_step"};
  fused_kernels_take_the_host_count(program, rows, 5);
  clReleaseProgram(program);
}

/* A device taking fewer bytes of arguments than the fused kernels need
 * (as if it answered 512) is refused before anything is built or
 * enqueued, with a message naming the limit; the outputs stay as they
 * were. */
static void small_parameter_size_is_refused(void) {
  clattn_context *ctx = ct_context();
  const size_t real = ctx->caps.max_param;
  ctx->caps.max_param = 512;
  cp_shape s = cp_shape_default();
  s.q_len = 7;
  s.kv_len = 37;
  s.head_dim = 40;
  s.value_dim = 24; /* a program not built yet */
  cp_problem *pb;
  KC_BUILD(pb, &s);
  cp_result r;
  if (kc_run(pb, CLATTN_ALGO_FUSED, &r, __FILE__, __LINE__) == 1) {
    CHECKF(r.status == CLATTN_ERR_UNSUPPORTED, "status %s", clattn_status_string(r.status));
    CHECKF(strstr(clattn_last_error(ctx), "CL_DEVICE_MAX_PARAMETER_SIZE") != NULL, "message: %s",
           clattn_last_error(ctx));
  }
  ctx->caps.max_param = real;
  CHECK(KC_RUN_OK(pb, CLATTN_ALGO_FUSED, 2e-5) == 1); /* the real limit: built and run */
  cp_free(pb);
}

int main(int argc, char **argv) {
  static const ct_test tests[] = {
      CT_TEST(runs_as_built_without_a_step),
      CT_TEST(small_work_group_steps_down_one_tile),
      CT_TEST(large_private_memory_steps_down_one_tile),
      CT_TEST(no_tile_runs_falls_back_to_flash_tiled),
      CT_TEST(oversize_tuned_tile_steps_down_per_head_dim),
      CT_TEST(tuned_tile_that_cannot_run_steps_down),
      CT_TEST(argument_block_is_the_kernels),
      CT_TEST(small_parameter_size_is_refused),
  };
  if (!shim_active()) {
    printf("skipped: the OpenCL shim found no OpenCL library\n");
    return CT_SKIP;
  }
  setenv("CLATTN_FLASH_WG", "64", 1);
  return ct_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
