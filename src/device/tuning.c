/* Tuning policy: the layers, their origins and notes, AUTO's rule, and the
 * public tuning API (see tuning.h). */
#include "device/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"
#include "device/rules.h"

enum { DEFAULT_SCRATCH_BYTES = 64 << 20 };

const char *ca_origin_name(ca_origin o) {
  switch (o) {
    case CA_FROM_QUERY: return "default from device query";
    case CA_FROM_TABLE: return "built-in table";
    case CA_FROM_FILE: return "tuning file";
    case CA_FROM_ENV: return "environment";
  }
  return "?";
}

/* ---- layer 2: the built-in table ---- */

/* Values measured with `clattn tune` on known devices (matched by substrings
 * of the platform and device names, and the device type), only where they
 * differ from tl_choose's defaults for that device: a row that repeats a
 * default would only mislabel its origin. None differs yet: POCL's
 * measurements (docs/tuning.md) are tl_choose's CPU preset itself. */
typedef struct {
  const char *platform, *device; /* NULL platform ends the table */
  cl_device_type type;
  ca_tunable key;
  int value;
} builtin_entry;

static const builtin_entry builtin[] = {
    {NULL, NULL, 0, CA_T_COUNT, 0},
};

static void apply_builtin(clattn_context *ctx) {
  char platform[256], device[256];
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, platform, sizeof platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, device, sizeof device);
  for (const builtin_entry *e = builtin; e->platform; e++) {
    if (!(ctx->caps.type & e->type) || !strstr(platform, e->platform) || !strstr(device, e->device)) continue;
    ca_tunable_set(&ctx->tiles, &ctx->scratch_budget, e->key, e->value);
    ctx->origin[e->key] = CA_FROM_TABLE;
  }
}

/* ---- layer 3: the tuning file ---- */

/* This device's platform, device and driver: what a tuning file is for. */
static void device_identity(const clattn_context *ctx, ca_tuning *t) {
  ca_platform_string(ctx->platform, CL_PLATFORM_NAME, t->platform, sizeof t->platform);
  ca_device_string(ctx->device, CL_DEVICE_NAME, t->device, sizeof t->device);
  ca_device_string(ctx->device, CL_DRIVER_VERSION, t->driver, sizeof t->driver);
}

/* The cache directory's file for this device (not keyed by the library
 * version: an upgrade keeps the tuning), malloc'd; NULL without a cache. */
static char *default_path(const clattn_context *ctx) {
  if (!ctx->cache_dir) return NULL;
  ca_cache_key key;
  ca_device_key_of(ctx, &key);
  size_t n = strlen(ctx->cache_dir) + 64;
  char *path = malloc(n);
  if (!path) return NULL;
  int at = snprintf(path, n, "%s/tuning-", ctx->cache_dir);
  for (int i = 0; i < 8; i++) at += snprintf(path + at, n - (size_t)at, "%02x", key.bytes[i]);
  snprintf(path + at, n - (size_t)at, ".txt");
  return path;
}

/* Applies the tuning file (the option, else CLATTN_TUNING_FILE, else the
 * cache directory's) when it is for this device and every value fits the
 * device's limits; otherwise leaves the values as they were and says why in
 * ctx->tuning_note. */
static void apply_file(clattn_context *ctx, const char *opt) {
  const char *named = opt ? opt : getenv("CLATTN_TUNING_FILE");
  ctx->tuning_path = named ? (*named ? strdup(named) : NULL) : default_path(ctx);
  const char *path = ctx->tuning_path;
  char *note = ctx->tuning_note;
  const size_t nn = sizeof ctx->tuning_note;
  if (!path) {
    snprintf(note, nn, "none (turned off)");
    return;
  }
  if (!named && access(path, F_OK) != 0) {
    snprintf(note, nn, "none (no %s; `clattn tune` writes it)", path);
    return;
  }
  ca_tuning file, here;
  char err[512];
  if (ca_tuning_read(path, &file, err, sizeof err) != 0) {
    snprintf(note, nn, "rejected, defaults used: %s", err);
    return;
  }
  device_identity(ctx, &here);
  if (strcmp(here.platform, file.platform) || strcmp(here.device, file.device) || strcmp(here.driver, file.driver)) {
    snprintf(note, nn, "ignored: %s is for %s / %s / driver %s", path, file.platform, file.device, file.driver);
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
      snprintf(note, nn,
               "rejected, defaults used: %s: %s = %lld does not fit this device (work-group %zu, local memory %llu)",
               path, ca_tunable_name((ca_tunable)t), file.value[t], ctx->caps.max_wg,
               (unsigned long long)ctx->caps.local_mem);
      return;
    }
  if (!fits) {
    snprintf(note, nn, "rejected, defaults used: %s: its tiles together do not fit this device", path);
    return;
  }
  if (file.has[CA_T_SCRATCH_BYTES] && ctx->max_alloc && scratch > ctx->max_alloc) {
    snprintf(note, nn, "rejected, defaults used: %s: scratch_bytes = %zu exceeds the device's largest allocation", path,
             scratch);
    return;
  }
  ctx->tiles = tiles;
  ctx->scratch_budget = scratch;
  for (int t = 0; t < CA_T_COUNT; t++)
    if (file.has[t]) ctx->origin[t] = CA_FROM_FILE;
  ctx->tuning_applied = 1;
  int at = snprintf(note, nn, "applied: %s", path);
  for (int c = 0; c < CA_CLASS_COUNT; c++) {
    /* A build without CLBlast keeps the rule for a class the file gives to GEMM. */
    if (file.auto_algo[c] == CLATTN_ALGO_GEMM && !ca_gemm_available()) {
      at += snprintf(note + at, nn - (size_t)at, " (auto_%s = gemm left out: no GEMM path in this build)",
                     ca_class_name((ca_shape_class)c));
      continue;
    }
    ctx->auto_algo[c] = file.auto_algo[c];
  }
}

/* ---- layer 4: the environment ---- */

/* Appends "ignored <why>" to the environment's note. */
static void env_ignored(clattn_context *ctx, const char *why) {
  size_t at = strlen(ctx->env_note);
  snprintf(ctx->env_note + at, sizeof ctx->env_note - at, "%signored %s", at ? "; " : "", why);
}

/* CLATTN_BLOCK_RM and CLATTN_BLOCK_RN: each by the file's rule, then the
 * pair they make with the other's value so far; ignored together. */
static void apply_block_environment(clattn_context *ctx) {
  static const char *const names[2] = {"CLATTN_BLOCK_RM", "CLATTN_BLOCK_RN"};
  static const ca_tunable keys[2] = {CA_T_BLOCK_RM, CA_T_BLOCK_RN};
  const char *env[2] = {getenv(names[0]), getenv(names[1])};
  long long v[2] = {ctx->tiles.block_rm, ctx->tiles.block_rn};
  int given[2], any = 0;
  char why[320];
  for (int i = 0; i < 2; i++) {
    given[i] = env[i] && *env[i];
    any |= given[i];
    if (given[i] && ca_tunable_parse(keys[i], names[i], env[i], &v[i], why, sizeof why) != 0) {
      env_ignored(ctx, why);
      return;
    }
  }
  if (!any) return;
  if (ca_block_pair_check(given[0] ? names[0] : "block_rm", v[0], given[1] ? names[1] : "block_rn", v[1], why,
                          sizeof why) != 0) {
    env_ignored(ctx, why);
    return;
  }
  for (int i = 0; i < 2; i++) {
    ca_tunable_set(&ctx->tiles, &ctx->scratch_budget, keys[i], v[i]);
    if (given[i]) ctx->origin[keys[i]] = CA_FROM_ENV;
  }
}

/* A sub-group size variable (CLATTN_BLOCK_SG, CLATTN_SOFTMAX_SG): 1 with
 * *lanes when it is 0, or 8, 16 or 32 lanes the device lets a kernel
 * require; 0 when unset, or ignored (the note says why). */
static int env_sub_group(clattn_context *ctx, const char *name, int *lanes) {
  const char *value = getenv(name);
  if (!value || !*value) return 0;
  const int n = atoi(value);
  if (!strcmp(value, "0") || ((n == 8 || n == 16 || n == 32) && (ctx->caps.sg_sizes & (cl_uint)n))) {
    *lanes = n;
    return 1;
  }
  char why[320];
  snprintf(why, sizeof why, "%s = %s: must be 0, or 8, 16 or 32 lanes the device offers (%s)", name, value,
           ctx->caps.sg_sizes ? "cl_intel_required_subgroup_size" : "this device offers none");
  env_ignored(ctx, why);
  return 0;
}

/* CLATTN_FLASH_WG=n forces the work-group fused kernel (flash_tiled) with
 * n rows per group, CLATTN_FLASH_WG=0 the register-blocked one (flash_rows):
 * how the tests run both on one device. CLATTN_SCRATCH_BYTES sets the
 * staged and GEMM paths' scratch budget, CLATTN_FLASH_TILE flash_tiled's
 * keys per K/V tile. Each is checked by the tuning
 * file's rule; a value that breaks it is ignored, and ctx->env_note says why.
 * CLATTN_BLOCK_RM / CLATTN_BLOCK_RN set flash_block's tile (either or both,
 * over the file's: the pair they make must be one the file could give).
 * CLATTN_FLASH_BLOCK=0 keeps flash_block out of the work-group fused calls. */
static void apply_environment(clattn_context *ctx) {
  static const struct {
    const char *name;
    ca_tunable t;
  } vars[] = {{"CLATTN_FLASH_WG", CA_T_FLASH_WG},
              {"CLATTN_SCRATCH_BYTES", CA_T_SCRATCH_BYTES},
              {"CLATTN_FLASH_TILE", CA_T_FLASH_TILE}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *env = getenv(vars[i].name);
    if (!env || !*env) continue;
    long long v = 0;
    char why[256];
    if (ca_tunable_parse(vars[i].t, vars[i].name, env, &v, why, sizeof why) != 0) {
      env_ignored(ctx, why);
      continue;
    }
    ca_tunable_set(&ctx->tiles, &ctx->scratch_budget, vars[i].t, v);
    ctx->origin[vars[i].t] = CA_FROM_ENV;
  }
  apply_block_environment(ctx);
  /* CLATTN_FLASH_VW=4|8|16: flash_rows' floats per vector instead of the
   * device's (ca_flash_vw) */
  const char *vw = getenv("CLATTN_FLASH_VW");
  if (vw && *vw) {
    if (!strcmp(vw, "4") || !strcmp(vw, "8") || !strcmp(vw, "16"))
      ctx->tiles.flash_vw = atoi(vw);
    else {
      char why[320];
      snprintf(why, sizeof why, "CLATTN_FLASH_VW = %s: must be 4, 8 or 16", vw);
      env_ignored(ctx, why);
    }
  }
  const char *block = getenv("CLATTN_FLASH_BLOCK");
  ctx->flash_block = !(block && strcmp(block, "0") == 0);
  /* CLATTN_BLOCK_HALF=1/0 forces flash_block's half K/V tiles on or off
   * (they need no cl_khr_fp16: vload_half/vstore_half are core OpenCL) */
  const char *half = getenv("CLATTN_BLOCK_HALF");
  if (half && *half) ctx->tiles.block_half = strcmp(half, "0") != 0;
  /* CLATTN_BLOCK_HALF_MATH=1/0: half products in flash_block's P V (with
   * the half tiles; devices with cl_khr_fp16 only) */
  const char *half_math = getenv("CLATTN_BLOCK_HALF_MATH");
  if (half_math && *half_math) {
    ctx->tiles.block_half_math = strcmp(half_math, "0") != 0;
    if (ctx->tiles.block_half_math && !ctx->caps.fp16)
      env_ignored(ctx, "CLATTN_BLOCK_HALF_MATH = 1: the device reports no cl_khr_fp16 (no half arithmetic)");
  }
  /* CLATTN_BLOCK_SG=0|8|16|32: flash_block's sub-group variant at that size
   * (one the device lets a kernel require), or 0 for local memory */
  int lanes;
  if (env_sub_group(ctx, "CLATTN_BLOCK_SG", &lanes)) ctx->tiles.block_sg = lanes;
  /* softmax_rows' sub-group variant where the device offers the group's
   * size (a file may have changed softmax_wg since tl_choose);
   * CLATTN_SOFTMAX_SG=8|16|32 forces it at that size, the group then that
   * many work-items, and 0 the local-memory trees */
  ctx->tiles.softmax_sg = tl_softmax_sg(&ctx->caps, ctx->tiles.softmax_wg);
  if (env_sub_group(ctx, "CLATTN_SOFTMAX_SG", &lanes)) {
    ctx->tiles.softmax_sg = lanes;
    if (lanes) {
      ctx->tiles.softmax_wg = lanes;
      ctx->origin[CA_T_SOFTMAX_WG] = CA_FROM_ENV;
    }
  }
  /* A GPU's flash_block with more private memory than this spilled
   * registers (registry.c steps down); a CPU's private memory is its stack.
   * CLATTN_BLOCK_PRIVATE_MAX=bytes sets the limit on any device (tests). */
  const long long private_rule = ca_rule(&ctx->caps, CA_RULE_BLOCK_PRIVATE, NULL);
  ctx->block_private_max = private_rule < 0 ? CL_ULONG_MAX : (cl_ulong)private_rule;
  const char *private_max = getenv("CLATTN_BLOCK_PRIVATE_MAX");
  if (private_max && *private_max) ctx->block_private_max = strtoull(private_max, NULL, 10);
}

void ca_tuning_choose(clattn_context *ctx, const char *tuning_file) {
  ctx->tiles = tl_choose(&ctx->caps);
  ctx->tiles.flash_vw = ca_flash_vw(&ctx->caps);
  ctx->scratch_budget = DEFAULT_SCRATCH_BYTES;
  for (int t = 0; t < CA_T_COUNT; t++) ctx->origin[t] = CA_FROM_QUERY;
  for (int c = 0; c < CA_CLASS_COUNT; c++) ctx->auto_algo[c] = CLATTN_ALGO_AUTO;
  ctx->tuning_default_path = default_path(ctx);
  apply_builtin(ctx);
  apply_file(ctx, tuning_file);
  apply_environment(ctx);
  /* rows per work-item follow the vector width (CLATTN_FLASH_VW's too)
   * unless a layer set them */
  if (ctx->origin[CA_T_FLASH_BM] == CA_FROM_QUERY) ctx->tiles.flash_bm = ca_flash_bm(&ctx->caps, ctx->tiles.flash_vw);
  if (ctx->max_alloc && ctx->scratch_budget > ctx->max_alloc) ctx->scratch_budget = (size_t)ctx->max_alloc;
}

clattn_algo ca_auto_algo(const clattn_context *ctx, int q_len, int want_weights) {
  const ca_shape_class cls = want_weights              ? CA_CLASS_WEIGHTS
                             : q_len <= CA_DECODE_ROWS ? CA_CLASS_DECODE
                                                       : CA_CLASS_PREFILL;
  if (ctx->auto_algo[cls] != CLATTN_ALGO_AUTO) return ctx->auto_algo[cls];
  return want_weights ? CLATTN_ALGO_STAGED : CLATTN_ALGO_FUSED;
}

static const int described_dims[] = {32, 64, 80, 96, 128, 192, 256};
#define N_DESCRIBED_DIMS (sizeof described_dims / sizeof described_dims[0])

/* flash_tiled's key tile per head dim (dk = dv), where the work-group
 * kernels run. */
static void describe_tiled(const clattn_context *ctx, char *buf, size_t size, size_t *at) {
#define PUT(...) (*at += (size_t)snprintf(buf + *at, size > *at ? size - *at : 0, __VA_ARGS__))
  const int want = ctx->tiles.flash_tile;
  if (ctx->tiles.flash_wg <= 0) return;
  if (want)
    PUT("flash_tiled keys per tile per head dim (tuned %d, smaller where it does not fit):", want);
  else
    PUT("flash_tiled keys per tile per head dim:");
  for (size_t i = 0; i < N_DESCRIBED_DIMS; i++)
    PUT("%s %d: %d", i ? "," : "", described_dims[i],
        tl_flash_tile(&ctx->caps, described_dims[i], described_dims[i], want));
  PUT("\n");
#undef PUT
}

/* flash_block's tile per head dim (dk = dv) as chosen before building (a
 * built kernel that cannot run its group, or spills, steps down again). */
static void describe_block(const clattn_context *ctx, char *buf, size_t size, size_t *at) {
#define PUT(...) (*at += (size_t)snprintf(buf + *at, size > *at ? size - *at : 0, __VA_ARGS__))
  const tl_tiles *t = &ctx->tiles;
  if (t->flash_wg <= 0 || !ctx->flash_block) {
    PUT("flash_block tile: not used (%s)\n",
        t->flash_wg <= 0 ? "flash_rows on this device; CLATTN_FLASH_WG=64 forces the work-group kernels"
                         : "CLATTN_FLASH_BLOCK=0");
    return;
  }
  const int *dims = described_dims;
  const tl_block want = {t->block_rm, t->block_rn};
  if (want.rm)
    PUT("flash_block tile per head dim (rm x rn; tuned %dx%d, smaller where it does not fit):", want.rm, want.rn);
  else
    PUT("flash_block tile per head dim (rm x rn):");
  for (size_t i = 0; i < N_DESCRIBED_DIMS; i++) {
    tl_block blk;
    if (tl_flash_block_tuned(&ctx->caps, dims[i], dims[i], want, &blk) == 0)
      PUT("%s %d: %dx%d", i ? "," : "", dims[i], blk.rm, blk.rn);
    else
      PUT("%s %d: none (flash_tiled)", i ? "," : "", dims[i]);
  }
  PUT("\n");
#undef PUT
}

void ca_tuning_describe(const clattn_context *ctx, char *buf, size_t size) {
  size_t at = strlen(buf);
#define PUT(...) (at += (size_t)snprintf(buf + at, size > at ? size - at : 0, __VA_ARGS__))
  PUT("tiles and budgets (value, origin):\n");
  for (int i = 0; i < CA_T_COUNT; i++)
    PUT("  %-14s %-10lld (%s)\n", ca_tunable_name((ca_tunable)i),
        ca_tunable_get(&ctx->tiles, ctx->scratch_budget, (ca_tunable)i), ca_origin_name(ctx->origin[i]));
  describe_block(ctx, buf, size, &at);
  describe_tiled(ctx, buf, size, &at);
  PUT("device rules (%s; looked up by device, architecture, vendor, device type, default):\n",
      ca_architecture(&ctx->caps));
  for (int r = 0; r < CA_RULE_COUNT; r++) {
    const char *from = NULL;
    const long long v = ca_rule(&ctx->caps, (ca_rule_key)r, &from);
    PUT("  %-17s %-10lld (%s)\n", ca_rule_name((ca_rule_key)r), v, from);
  }
  PUT("tuning file: %s\nenvironment: %s\nAUTO picks: ", ctx->tuning_note,
      ctx->env_note[0] ? ctx->env_note : "no values ignored");
  const struct {
    int q_len, weights;
  } class_call[CA_CLASS_COUNT] = {
      [CA_CLASS_PREFILL] = {CA_DECODE_ROWS + 1, 0}, [CA_CLASS_DECODE] = {1, 0}, [CA_CLASS_WEIGHTS] = {1, 1}};
  for (int c = 0; c < CA_CLASS_COUNT; c++)
    PUT("%s%s: %s", c ? ", " : "", ca_class_name((ca_shape_class)c),
        clattn_algo_name(ca_auto_algo(ctx, class_call[c].q_len, class_call[c].weights)));
  PUT("\n");
#undef PUT
}

/* ---- the public tuning API (clattn.h) ---- */

const char *clattn_tuning_name(int i) { return i >= 0 && i < CA_T_COUNT ? ca_tunable_name((ca_tunable)i) : NULL; }

clattn_status clattn_tuning_get(const clattn_context *ctx, const char *name, long long *value, const char **origin) {
  if (!ctx || !name || !value)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_get: ctx, name or value is NULL");
  const ca_tunable t = ca_tunable_by_name(name);
  if (t == CA_T_COUNT) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_get: no tunable value '%s'", name);
  *value = ca_tunable_get(&ctx->tiles, ctx->scratch_budget, t);
  if (origin) *origin = ca_origin_name(ctx->origin[t]);
  return CLATTN_OK;
}

const char *clattn_tuning_note(const clattn_context *ctx, int *applied) {
  if (applied) *applied = ctx ? ctx->tuning_applied : 0;
  return ctx ? ctx->tuning_note : "";
}

const char *clattn_tuning_default_path(const clattn_context *ctx) { return ctx ? ctx->tuning_default_path : NULL; }

clattn_status clattn_tuning_write(const clattn_context *ctx, const char *settings, const char *path) {
  if (!ctx || !settings) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_write: ctx or settings is NULL");
  if (!path) path = ctx->tuning_default_path;
  if (!path || !*path)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_write: no path and no cache directory to write into");
  ca_tuning t;
  char err[512];
  if (ca_tuning_parse_values(settings, strlen(settings), "settings", &t, err, sizeof err) != 0)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_write: %s", err);
  device_identity(ctx, &t);
  if (ca_tuning_write(path, &t, err, sizeof err) != 0)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_tuning_write: %s", err);
  return CLATTN_OK;
}
