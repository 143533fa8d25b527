/* Context life: device choice or embedding, tile choice, load-time builds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "program_text.h"
#include "internal.h"

enum { DEFAULT_SCRATCH_BYTES = 64 << 20 };

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
  CA_CHECK_CL(st, clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                           sizeof *out, out, NULL),
              "clGetKernelWorkGroupInfo(CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE)");
fail:
  if (kernel) clReleaseKernel(kernel);
  if (program) clReleaseProgram(program);
  return st;
}

/* CLATTN_FLASH_WG=n forces the work-group fused kernel (flash_tiled) with
 * n rows per group, CLATTN_FLASH_WG=0 the register-blocked one (flash_rows):
 * how the tests run both on one device. CLATTN_SCRATCH_BYTES sets the
 * staged and GEMM paths' scratch budget. Each is checked by the tuning
 * file's rule; a value that breaks it is ignored, and ctx->env_note says why. */
static void apply_environment(clattn_context *ctx) {
  static const struct {
    const char *name;
    ca_tunable t;
  } vars[] = {{"CLATTN_FLASH_WG", CA_T_FLASH_WG}, {"CLATTN_SCRATCH_BYTES", CA_T_SCRATCH_BYTES}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *env = getenv(vars[i].name);
    if (!env || !*env) continue;
    long long v = 0;
    char why[256];
    if (ca_tunable_parse(vars[i].t, vars[i].name, env, &v, why, sizeof why) != 0) {
      size_t at = strlen(ctx->env_note);
      snprintf(ctx->env_note + at, sizeof ctx->env_note - at, "%signored %s", at ? "; " : "", why);
      continue;
    }
    ca_tunable_set(&ctx->tiles, &ctx->scratch_budget, vars[i].t, v);
    ctx->origin[vars[i].t] = CA_FROM_ENV;
  }
}

char *ca_tuning_default_path(const clattn_context *ctx) {
  if (!ctx->cache_dir) return NULL;
  ca_cache_key key;
  ca_device_key_of(ctx, &key); /* not the library version: an upgrade keeps the tuning */
  size_t n = strlen(ctx->cache_dir) + 64;
  char *path = malloc(n);
  if (!path) return NULL;
  int at = snprintf(path, n, "%s/tuning-", ctx->cache_dir);
  for (int i = 0; i < 8; i++) at += snprintf(path + at, n - (size_t)at, "%02x", key.bytes[i]);
  snprintf(path + at, n - (size_t)at, ".txt");
  return path;
}

/* The tuning file to look for: the option, else CLATTN_TUNING_FILE, else
 * the cache directory's file for this device. *explicit: named by the caller. */
static char *tuning_path(const clattn_context *ctx, const char *opt, int *explicit) {
  const char *named = opt ? opt : getenv("CLATTN_TUNING_FILE");
  *explicit = named != NULL;
  if (named) return *named ? strdup(named) : NULL;
  return ca_tuning_default_path(ctx);
}

/* Applies a tuning file's values when it is for this device and every value
 * fits the device's limits; otherwise leaves the tiles as they were and says
 * why in ctx->tuning_note. */
static void apply_tuning_file(clattn_context *ctx, const char *opt) {
  int explicit = 0;
  ctx->tuning_path = tuning_path(ctx, opt, &explicit);
  const char *path = ctx->tuning_path;
  if (!path) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note, "none (turned off)");
    return;
  }
  if (!explicit && access(path, F_OK) != 0) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note, "none (no %s; `clattn tune` writes it)", path);
    return;
  }
  ca_tuning file;
  char err[512];
  if (ca_tuning_read(path, &file, err, sizeof err) != 0) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note, "rejected, defaults used: %s", err);
    return;
  }
  char platform[256], device[256], driver[256];
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, device, sizeof device);
  ca_device_string(ctx->device, CL_DRIVER_VERSION, driver, sizeof driver);
  if (strcmp(platform, file.platform) || strcmp(device, file.device) || strcmp(driver, file.driver)) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note, "ignored: %s is for %s / %s / driver %s", path,
             file.platform, file.device, file.driver);
    return;
  }
  tl_tiles tiles = ctx->tiles;
  size_t scratch = ctx->scratch_budget;
  for (int t = 0; t < CA_T_COUNT; t++)
    if (file.has[t]) ca_tunable_set(&tiles, &scratch, (ca_tunable)t, file.value[t]);
  /* Values the device cannot run would be changed by the clamp: refuse them. */
  tl_tiles clamped = tiles;
  int fits = tl_clamp(&clamped, &ctx->caps) == 0;
  for (int t = 0; t < CA_T_SCRATCH_BYTES && fits; t++)
    if (file.has[t] && ca_tunable_get(&clamped, 0, (ca_tunable)t) != file.value[t]) {
      snprintf(ctx->tuning_note, sizeof ctx->tuning_note,
               "rejected, defaults used: %s: %s = %lld does not fit this device (work-group %zu, local memory %llu)",
               path, ca_tunable_name((ca_tunable)t), file.value[t], ctx->caps.max_wg,
               (unsigned long long)ctx->caps.local_mem);
      return;
    }
  if (!fits) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note,
             "rejected, defaults used: %s: its tiles together do not fit this device", path);
    return;
  }
  if (file.has[CA_T_SCRATCH_BYTES] && ctx->max_alloc && scratch > ctx->max_alloc) {
    snprintf(ctx->tuning_note, sizeof ctx->tuning_note,
             "rejected, defaults used: %s: scratch_bytes = %zu exceeds the device's largest allocation", path,
             scratch);
    return;
  }
  ctx->tiles = tiles;
  ctx->scratch_budget = scratch;
  for (int t = 0; t < CA_T_COUNT; t++)
    if (file.has[t]) ctx->origin[t] = CA_FROM_FILE;
  memcpy(ctx->auto_algo, file.auto_algo, sizeof ctx->auto_algo);
  snprintf(ctx->tuning_note, sizeof ctx->tuning_note, "applied: %s", path);
}

/* Tiles and scratch budget: device-query defaults, then the built-in table,
 * the tuning file and the environment, each over the one before. */
static void choose_tiles(clattn_context *ctx, const clattn_options *opt) {
  ctx->tiles = tl_choose(&ctx->caps);
  ctx->scratch_budget = DEFAULT_SCRATCH_BYTES;
  for (int t = 0; t < CA_T_COUNT; t++) ctx->origin[t] = CA_FROM_QUERY;
  for (int c = 0; c < CA_CLASS_COUNT; c++) ctx->auto_algo[c] = CLATTN_ALGO_AUTO;
  char platform[256], device[256];
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, device, sizeof device);
  ca_tuning_builtin(platform, device, ctx->caps.type, &ctx->tiles, ctx->origin);
  apply_tuning_file(ctx, opt->tuning_file);
  apply_environment(ctx);
  const char *block = getenv("CLATTN_FLASH_BLOCK");
  ctx->flash_block = !(block && strcmp(block, "0") == 0);
  /* CLATTN_BLOCK_HALF=1/0 forces flash_block's half K/V tiles on or off
   * (they need no cl_khr_fp16: vload_half/vstore_half are core OpenCL) */
  const char *half = getenv("CLATTN_BLOCK_HALF");
  if (half && *half) ctx->tiles.block_half = strcmp(half, "0") != 0;
  /* A GPU's flash_block with more private memory than this spilled
   * registers (fused.c steps down); a CPU's private memory is its stack.
   * CLATTN_BLOCK_PRIVATE_MAX=bytes sets the limit on any device (tests). */
  ctx->block_private_max = (ctx->caps.type & CL_DEVICE_TYPE_GPU) ? 64 : CL_ULONG_MAX;
  const char *private_max = getenv("CLATTN_BLOCK_PRIVATE_MAX");
  if (private_max && *private_max) ctx->block_private_max = strtoull(private_max, NULL, 10);
  if (ctx->max_alloc && ctx->scratch_budget > ctx->max_alloc) ctx->scratch_budget = (size_t)ctx->max_alloc;
}

static clattn_status build_core_for(clattn_context *ctx, clattn_dtype dtype, cl_program *out) {
  ca_program_text text;
  ca_core_text(&ctx->tiles, dtype, &text);
  return ca_build_program(ctx, dtype == CLATTN_F32 ? "core" : dtype == CLATTN_F16 ? "core f16" : "core bf16",
                          text.sources, text.n_sources, text.options, out);
}

static clattn_status build_core(clattn_context *ctx) { return build_core_for(ctx, CLATTN_F32, &ctx->core); }

clattn_status ca_core_program(clattn_context *ctx, clattn_dtype dtype, cl_program *out) {
  if (dtype == CLATTN_F32) {
    *out = ctx->core;
    return CLATTN_OK;
  }
  clattn_status st = CLATTN_OK;
  pthread_mutex_lock(&ctx->programs_lock);
  cl_program *slot = &ctx->core_16[dtype == CLATTN_F16 ? 0 : 1];
  if (!*slot) st = build_core_for(ctx, dtype, slot);
  *out = *slot;
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

clattn_status ca_core_program_kv(clattn_context *ctx, clattn_dtype dtype, clattn_dtype kv_dtype, cl_program *out) {
  if (kv_dtype == CLATTN_DTYPE_SAME || kv_dtype == dtype) return ca_core_program(ctx, dtype, out);
  clattn_status st = CLATTN_OK;
  pthread_mutex_lock(&ctx->programs_lock);
  cl_program *slot = &ctx->core_kv[dtype][kv_dtype];
  if (!*slot) {
    ca_program_text text;
    ca_core_kv_text(&ctx->tiles, dtype, kv_dtype, &text);
    char name[40];
    snprintf(name, sizeof name, "core dtype=%d kv_dtype=%d", (int)dtype, (int)kv_dtype);
    st = ca_build_program(ctx, name, text.sources, text.n_sources, text.options, slot);
  }
  *out = *slot;
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

/* The largest group each core kernel can run with, as built: a GPU
 * compiler may allow fewer work-items than the device maximum (registers). */
static clattn_status core_kernel_limit(clattn_context *ctx, size_t *limit) {
  static const char *names[] = {"qk_score", "softmax_rows", "mix_values"};
  clattn_status st = CLATTN_OK;
  *limit = ctx->caps.max_wg;
  for (int i = 0; i < 3 && st == CLATTN_OK; i++) {
    cl_kernel k = NULL;
    size_t wg = 0;
    if ((st = ca_create_kernel(ctx->core, names[i], &k))) break;
    cl_int err = clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    clReleaseKernel(k);
    if (err != CL_SUCCESS) st = ca_cl_fail(err, "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)");
    else if (wg < *limit) *limit = wg;
  }
  return st;
}

/* Builds the core program; when a kernel cannot run the chosen group size,
 * lowers the work-group limit, chooses again and rebuilds. */
static clattn_status build_core_fitting(clattn_context *ctx) {
  for (int attempt = 0; attempt < 4; attempt++) {
    size_t limit = 0;
    clattn_status st = build_core(ctx);
    if (st == CLATTN_OK) st = core_kernel_limit(ctx, &limit);
    if (st != CLATTN_OK) return st;
    const tl_tiles *t = &ctx->tiles;
    if ((size_t)t->score_tm * t->score_tn <= limit && (size_t)t->mix_tm * t->mix_tv <= limit &&
        (size_t)t->softmax_wg <= limit)
      return CLATTN_OK;
    clReleaseProgram(ctx->core);
    ctx->core = NULL;
    ctx->caps.max_wg = limit;
    if (tl_clamp(&ctx->tiles, &ctx->caps) != 0) break;
  }
  return ca_fail(CLATTN_ERR_UNSUPPORTED, "the staged kernels cannot run any tile shape on this device");
}

static void describe(clattn_context *ctx) {
  char platform[256], device[256], driver[128];
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, device, sizeof device);
  ca_device_string(ctx->device, CL_DRIVER_VERSION, driver, sizeof driver);
  const tl_device *c = &ctx->caps;
  const tl_tiles *t = &ctx->tiles;
  char fused[256];
  if (t->flash_wg > 0 && ctx->flash_block)
    snprintf(fused, sizeof fused,
             "flash_block (16 rm rows x 8 rn keys per group of 128, the tile per head dim%s), flash_tiled (%d rows "
             "per work-group) for route diagnostics and additive scoring",
             t->block_half ? "; f16 K/V tiles as half" : "", t->flash_wg);
  else if (t->flash_wg > 0)
    snprintf(fused, sizeof fused, "flash_tiled, %d rows per work-group, K/V tiles in local memory", t->flash_wg);
  else
    snprintf(fused, sizeof fused, "flash_rows, %d rows per work-item, 16-wide vectors; decode reads K/V in place",
             t->flash_bm);
  char values[1024] = "", autos[256] = "";
  for (int i = 0, at = 0; i < CA_T_COUNT; i++)
    at += snprintf(values + at, sizeof values - (size_t)at, "  %-14s %-10lld (%s)\n", ca_tunable_name((ca_tunable)i),
                   ca_tunable_get(t, ctx->scratch_budget, (ca_tunable)i), ca_origin_name(ctx->origin[i]));
  for (int i = 0, at = 0; i < CA_CLASS_COUNT; i++)
    at += snprintf(autos + at, sizeof autos - (size_t)at, "%s%s: %s", i ? ", " : "", ca_class_name((ca_shape_class)i),
                   ctx->auto_algo[i] != CLATTN_ALGO_AUTO ? clattn_algo_name(ctx->auto_algo[i])
                   : i == CA_CLASS_WEIGHTS ? "staged" : "fused");
  snprintf(ctx->description, sizeof ctx->description,
           "platform: %s\n"
           "device: %s (%s, driver %s)\n"
           "compute units: %u, max work-group: %zu, preferred multiple: %zu, local memory: %llu bytes\n"
           "tiles and budgets (value, origin):\n%s"
           "fused kernel: %s\n"
           "tuning file: %s\n"
           "environment: %s\n"
           "AUTO picks: %s\n"
           "program build at creation: %.1f ms\n"
           "program cache: %s (at creation: %d built from source, %d loaded from cache)\n",
           platform, device, (c->type & CL_DEVICE_TYPE_GPU) ? "GPU" : (c->type & CL_DEVICE_TYPE_CPU) ? "CPU" : "other",
           driver, c->compute_units, c->max_wg, c->pref_multiple, (unsigned long long)c->local_mem, values, fused,
           ctx->tuning_note, ctx->env_note[0] ? ctx->env_note : "no values ignored", autos, ctx->build_ms,
           ctx->cache_dir ? ctx->cache_dir : "off", ctx->builds_from_source, ctx->builds_from_cache);
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
      return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "options.queue does not belong to options.context and options.device");
    CA_CHECK_CL(st, clGetDeviceInfo(opt->device, CL_DEVICE_PLATFORM, sizeof ctx->platform, &ctx->platform, NULL),
                "options.device: clGetDeviceInfo(CL_DEVICE_PLATFORM)");
    CA_CHECK_CL(st, clRetainContext(opt->context), "clRetainContext(options.context)");
    ctx->context = opt->context;
    CA_CHECK_CL(st, clRetainCommandQueue(opt->queue), "clRetainCommandQueue(options.queue)");
    ctx->queue = opt->queue;
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
  clattn_options defaults = {0};
  clattn_status st = CLATTN_OK;
  if (!out) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_create: out is NULL");
  *out = NULL;
  clattn_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "clattn_create: out of host memory");
  pthread_mutex_init(&ctx->programs_lock, NULL);
  st = attach(ctx, opt ? opt : &defaults);
  if (st != CLATTN_OK) goto fail;
  st = ca_query_device(ctx->device, &ctx->caps, &ctx->max_alloc);
  if (st != CLATTN_OK) goto fail;
  ctx->cache_dir = ca_cache_dir_resolve((opt ? opt : &defaults)->cache_dir); /* NULL: no disk cache */

  double t0 = now_ms();
  st = probe_preferred_multiple(ctx, &ctx->caps.pref_multiple);
  if (st != CLATTN_OK) goto fail;
  choose_tiles(ctx, opt ? opt : &defaults);
  if (tl_clamp(&ctx->tiles, &ctx->caps) != 0) {
    st = ca_fail(CLATTN_ERR_UNSUPPORTED, "device limits (work-group %zu, local memory %llu bytes) fit no tile shape",
                 ctx->caps.max_wg, (unsigned long long)ctx->caps.local_mem);
    goto fail;
  }
  st = build_core_fitting(ctx);
  if (st != CLATTN_OK) goto fail;
  ctx->build_ms = now_ms() - t0;
  describe(ctx);
  *out = ctx;
  return CLATTN_OK;
fail:
  clattn_destroy(ctx);
  return st;
}

void clattn_destroy(clattn_context *ctx) {
  if (!ctx) return;
  if (ctx->core) clReleaseProgram(ctx->core);
  for (int i = 0; i < 2; i++)
    if (ctx->core_16[i]) clReleaseProgram(ctx->core_16[i]);
  for (int i = 0; i < ctx->n_fused; i++) clReleaseProgram(ctx->fused[i].program);
  for (int s = 0; s < 3; s++)
    for (int c = 0; c < 5; c++) {
      if (ctx->append[s][c]) clReleaseProgram(ctx->append[s][c]);
      if (ctx->core_kv[s][c]) clReleaseProgram(ctx->core_kv[s][c]);
    }
  free(ctx->fused);
  for (int i = 0; i < ctx->n_backward; i++) clReleaseProgram(ctx->backward[i].program);
  free(ctx->backward);
  free(ctx->cache_dir);
  free(ctx->tuning_path);
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

void ca_note_scratch(clattn_context *ctx, size_t bytes) {
  pthread_mutex_lock(&ctx->programs_lock);
  if (bytes > ctx->peak_scratch) ctx->peak_scratch = bytes;
  pthread_mutex_unlock(&ctx->programs_lock);
}

size_t clattn_peak_scratch_bytes(clattn_context *ctx, int reset) {
  if (!ctx) return 0;
  pthread_mutex_lock(&ctx->programs_lock);
  size_t peak = ctx->peak_scratch;
  if (reset) ctx->peak_scratch = 0;
  pthread_mutex_unlock(&ctx->programs_lock);
  return peak;
}
