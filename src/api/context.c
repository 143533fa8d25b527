/* Context life: device choice or embedding, tuning (tuning.c), load-time builds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "device/program_text.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The warp/wavefront width, which OpenCL 1.2 reports only per kernel: ask
 * a one-line kernel. */
static clattn_status probe_preferred_multiple(clattn_context *ctx, size_t *out) {
  ca_program_text text;
  ca_probe_text(&text);
  cl_program program = NULL;
  cl_kernel kernel = NULL;
  clattn_status st = ca_build_program(ctx, "probe", text.sources, text.n_sources, text.options, &program);
  if (st != CLATTN_OK) goto fail;
  st = ca_create_kernel(program, "ca_probe", &kernel);
  if (st != CLATTN_OK) goto fail;
  CA_CHECK_CL(st,
              clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof *out,
                                       out, NULL),
              "clGetKernelWorkGroupInfo(CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE)");
fail:
  if (kernel) clReleaseKernel(kernel);
  if (program) clReleaseProgram(program);
  return st;
}

static void describe(clattn_context *ctx) {
  char platform[256], device[256], driver[128];
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, device, sizeof device);
  ca_device_string(ctx->device, CL_DRIVER_VERSION, driver, sizeof driver);
  const tl_device *c = &ctx->caps;
  const tl_tiles *t = &ctx->tiles;
  char fused[320], sg[80] = "";
  if (t->block_sg) snprintf(sg, sizeof sg, "; row maxima and sums by shuffles in sub-groups of %d", t->block_sg);
  const char *half = !t->block_half                     ? ""
                     : t->block_half_math && c->fp16 ? "; f16 K/V tiles as half, P V in half products"
                                                        : "; f16 K/V tiles as half";
  if (t->flash_wg > 0 && ctx->flash_block)
    snprintf(fused, sizeof fused,
             "flash_block (16 rm rows x 8 rn keys per group of 128, the tile per head dim%s%s), flash_tiled (%d rows "
             "per work-group) for route diagnostics and additive scoring",
             half, sg, t->flash_wg);
  else if (t->flash_wg > 0)
    snprintf(fused, sizeof fused, "flash_tiled, %d rows per work-group, K/V tiles in local memory", t->flash_wg);
  else
    snprintf(fused, sizeof fused,
             "flash_rows, %d rows per work-item, %d-wide vectors, %d keys per block; decode reads K/V in place",
             t->flash_bm, t->flash_vw, 2 * t->flash_vw);
  char softmax[160];
  if (t->softmax_sg)
    snprintf(softmax, sizeof softmax, "%d work-items per row, one sub-group: row maxima and sums by shuffles",
             t->softmax_wg);
  else
    snprintf(softmax, sizeof softmax, "%d work-items per row, row maxima and sums by trees in local memory",
             t->softmax_wg);
  snprintf(ctx->description, sizeof ctx->description,
           "platform: %s\n"
           "device: %s (%s, driver %s)\n"
           "compute units: %u, max work-group: %zu, preferred multiple: %zu, local memory: %llu bytes\n"
           "fused kernel: %s\n"
           "softmax kernel (staged and GEMM paths): %s\n",
           platform, device,
           (c->type & CL_DEVICE_TYPE_GPU)   ? "GPU"
           : (c->type & CL_DEVICE_TYPE_CPU) ? "CPU"
                                            : "other",
           driver, c->compute_units, c->max_wg, c->pref_multiple, (unsigned long long)c->local_mem, fused, softmax);
  ca_tuning_describe(ctx, ctx->description, sizeof ctx->description);
  size_t at = strlen(ctx->description);
  snprintf(ctx->description + at, sizeof ctx->description - at,
           "program build at creation: %.1f ms\n"
           "program cache: %s%s (at creation: %d built from source, %d loaded from cache)\n",
           ctx->build_ms, ctx->cache_dir ? ctx->cache_dir : "off",
           ctx->cache_dir && !ctx->cache_binaries
               ? " holds the tuning file; binaries: POCL's own kernel cache (CLATTN_CACHE_DIR names a directory that "
                 "keeps them)"
               : "",
           ctx->builds_from_source, ctx->builds_from_cache);
}

static clattn_status attach(clattn_context *ctx, const clattn_options *opt) {
  clattn_status st = CLATTN_OK;
  cl_int err = CL_SUCCESS;
  int given = (opt->context != NULL) + (opt->device != NULL) + (opt->queue != NULL);
  if (given != 0 && given != 3)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT,
                   "options: context, device and queue must be given together (embedded mode) or not at all");
  if (given == 3) {
    cl_context queue_ctx = NULL;
    cl_device_id queue_dev = NULL;
    CA_CHECK_CL(st, clGetCommandQueueInfo(opt->queue, CL_QUEUE_CONTEXT, sizeof queue_ctx, &queue_ctx, NULL),
                "options.queue: clGetCommandQueueInfo(CL_QUEUE_CONTEXT)");
    CA_CHECK_CL(st, clGetCommandQueueInfo(opt->queue, CL_QUEUE_DEVICE, sizeof queue_dev, &queue_dev, NULL),
                "options.queue: clGetCommandQueueInfo(CL_QUEUE_DEVICE)");
    if (queue_ctx != opt->context || queue_dev != opt->device)
      return ca_fail(CLATTN_ERR_INVALID_ARGUMENT,
                     "options.queue does not belong to options.context and options.device");
    CA_CHECK_CL(st, clGetDeviceInfo(opt->device, CL_DEVICE_PLATFORM, sizeof ctx->platform, &ctx->platform, NULL),
                "options.device: clGetDeviceInfo(CL_DEVICE_PLATFORM)");
    CA_CHECK_CL(st, clRetainContext(opt->context), "clRetainContext(options.context)");
    ctx->context = opt->context;
    CA_CHECK_CL(st, clRetainCommandQueue(opt->queue), "clRetainCommandQueue(options.queue)");
    ctx->queue = opt->queue;
    cl_command_queue_properties props = 0;
    CA_CHECK_CL(st, clGetCommandQueueInfo(opt->queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL),
                "options.queue: clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
    ctx->out_of_order = (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    CA_CHECK_CL(st, clRetainDevice(opt->device), "clRetainDevice(options.device)");
    ctx->device = opt->device;
    ctx->retained_device = 1;
    return CLATTN_OK;
  }
  const char *match = opt->device_match ? opt->device_match : getenv("CLATTN_DEVICE");
  if (match && !*match) match = NULL;
  st = ca_pick_device(match, &ctx->platform, &ctx->device);
  if (st != CLATTN_OK) return st;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)ctx->platform, 0};
  ctx->context = clCreateContext(props, 1, &ctx->device, NULL, NULL, &err);
  CA_CHECK_CL(st, err, "clCreateContext");
  ctx->queue = clCreateCommandQueue(ctx->context, ctx->device, 0, &err);
  CA_CHECK_CL(st, err, "clCreateCommandQueue");
fail:
  return st;
}

clattn_status clattn_create(const clattn_options *opt, clattn_context **out) {
  clattn_options defaults = {0}, own;
  clattn_status st = CLATTN_OK;
  if (!out) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_create: out is NULL");
  *out = NULL;
  if (opt && (st = ca_options_in(opt, &own))) return st;
  if (opt) opt = &own;
  clattn_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_create: out of host memory");
  pthread_mutex_init(&ctx->programs_lock, NULL);
  pthread_mutex_init(&ctx->kernels_lock, NULL);
  pthread_mutex_init(&ctx->scratch_lock, NULL);
  pthread_mutex_init(&ctx->barrier_lock, NULL);
  st = attach(ctx, opt ? opt : &defaults);
  if (st != CLATTN_OK) goto fail;
  st = ca_query_device(ctx->device, &ctx->caps, &ctx->max_alloc);
  if (st != CLATTN_OK) goto fail;
  const char *named_dir = opt && opt->cache_dir ? opt->cache_dir : getenv("CLATTN_CACHE_DIR");
  ctx->cache_dir = ca_cache_dir_resolve(named_dir); /* NULL: no disk cache */
  ctx->cache_binaries = ctx->cache_dir && ca_cache_keeps_binaries(ctx->platform, named_dir != NULL);

  double t0 = now_ms();
  st = probe_preferred_multiple(ctx, &ctx->caps.pref_multiple);
  if (st != CLATTN_OK) goto fail;
  ca_tuning_choose(ctx, (opt ? opt : &defaults)->tuning_file);
  if (tl_clamp(&ctx->tiles, &ctx->caps) != 0) {
    st = ca_fail(CLATTN_ERR_UNSUPPORTED, "device limits (work-group %zu, local memory %llu bytes) fit no tile shape",
                 ctx->caps.max_wg, (unsigned long long)ctx->caps.local_mem);
    goto fail;
  }
  st = ca_build_core(ctx);
  if (st != CLATTN_OK) goto fail;
  ctx->build_ms = now_ms() - t0;
  ctx->last_call = ca_last_call_new(); /* NULL without host memory: every call plans */
  describe(ctx);
  *out = ctx;
  return CLATTN_OK;
fail:
  clattn_destroy(ctx);
  return st;
}

void clattn_destroy(clattn_context *ctx) {
  if (!ctx) return;
  /* Its own queue drains first: a runtime still building or running a
   * kernel of an enqueued call when the process exits can crash there
   * (POCL, in LLVM's teardown). An embedded context leaves the caller's
   * queue to the caller. */
  if (!ctx->retained_device && ctx->queue) clFinish(ctx->queue);
  ca_kernel_pool_trim(ctx); /* no call is in progress: every pooled object is idle */
  ca_last_call_free(ctx->last_call);
  ca_scratch_pool_trim(ctx);
  pthread_mutex_destroy(&ctx->kernels_lock);
  pthread_mutex_destroy(&ctx->scratch_lock);
  pthread_mutex_destroy(&ctx->barrier_lock);
  ca_release_programs(ctx);
  ca_blast_release(ctx);
  ca_command_buffer_forget(ctx);
  free(ctx->cache_dir);
  free(ctx->tuning_path);
  free(ctx->tuning_default_path);
  pthread_mutex_destroy(&ctx->programs_lock);
  if (ctx->queue) clReleaseCommandQueue(ctx->queue);
  if (ctx->context) clReleaseContext(ctx->context);
  if (ctx->retained_device) clReleaseDevice(ctx->device);
  free(ctx);
}

cl_context clattn_cl_context(const clattn_context *ctx) { return ctx ? ctx->context : NULL; }
cl_command_queue clattn_cl_queue(const clattn_context *ctx) { return ctx ? ctx->queue : NULL; }
cl_device_id clattn_cl_device(const clattn_context *ctx) { return ctx ? ctx->device : NULL; }
const char *clattn_describe(const clattn_context *ctx) { return ctx ? ctx->description : ""; }
