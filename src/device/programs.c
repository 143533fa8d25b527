/*
 * The context's programs: one table of every program a call runs, keyed by
 * kind and what specialises it (ca_program_key), each built on first use
 * through program.c (and the disk cache) from the text program_text.c
 * gives, then kept for the context's life. The f32 core program is built at
 * creation, its tiles lowered until every kernel runs its group. A fused
 * program's flash_block tile (tuned or chosen per head dim) steps down
 * until the built kernel runs without spilling. Lookups after creation
 * hold programs_lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CL/cl_ext.h>

#include "device/device.h"
#include "device/program_text.h"

static clattn_dtype resolve(clattn_dtype t, clattn_dtype same) { return t == CLATTN_DTYPE_SAME ? same : t; }

ca_program_key ca_core_key(clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype) {
  k_dtype = resolve(k_dtype, dtype);
  return (ca_program_key){CA_PROGRAM_CORE, dtype, k_dtype, resolve(v_dtype, k_dtype), 0, 0, 0, {0}};
}

ca_program_key ca_fused_key(int head_dim, int value_dim, clattn_dtype dtype, clattn_dtype k_dtype,
                            clattn_dtype v_dtype, int dropout) {
  k_dtype = resolve(k_dtype, dtype);
  return (ca_program_key){CA_PROGRAM_FUSED, dtype, k_dtype, resolve(v_dtype, k_dtype), head_dim, value_dim, dropout != 0, {0}};
}

ca_program_key ca_backward_key(int head_dim, int value_dim, clattn_dtype dtype, int dropout) {
  return (ca_program_key){CA_PROGRAM_BACKWARD, dtype, dtype, dtype, head_dim, value_dim, dropout != 0, {0}};
}

ca_program_key ca_append_key(clattn_dtype src, clattn_dtype kv) {
  return (ca_program_key){CA_PROGRAM_APPEND, src, resolve(kv, src), resolve(kv, src), 0, 0, 0, {0}};
}

/* Whether text defines (or names) `name` as an identifier: the flag that
 * builds the kernels to call it (a text that only names it fails to build,
 * with the compiler's log). */
static int ident_char(char c) { return c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

static int names(const char *text, const char *name) {
  const size_t n = strlen(name);
  for (const char *at = text; (at = strstr(at, name)) != NULL; at += n)
    if (!(at > text && ident_char(at[-1])) && !ident_char(at[n])) return 1;
  return 0;
}

int ca_mod_flags_of(const clattn_params *p) {
  return (p->score_mod ? CA_MODF_SCORE | (names(p->score_mod, "clattn_score_mod_grad") ? CA_MODF_GRAD : 0) : 0) |
         (p->mask_mod ? CA_MODF_MASK : 0);
}

ca_mod_key ca_mod_key_of(const clattn_params *p) {
  ca_mod_key m = {ca_mod_flags_of(p), {0}, p->score_mod, p->mask_mod};
  if (m.flags) {
    const char *texts[2] = {p->score_mod ? p->score_mod : "", p->mask_mod ? p->mask_mod : ""};
    ca_cache_key h;
    ca_text_key_of(texts, 2, &h);
    memcpy(m.hash, h.bytes, sizeof m.hash);
  }
  return m;
}

ca_program_key ca_key_with_mod(ca_program_key k, const clattn_params *p) {
  k.mod = ca_mod_key_of(p);
  return k;
}

ca_program_key ca_modifier_key(const clattn_params *p) {
  return ca_key_with_mod((ca_program_key){CA_PROGRAM_MODIFIER, CLATTN_F32, CLATTN_F32, CLATTN_F32, 0, 0, 0, {0}}, p);
}

static int same_key(const ca_program_key *a, const ca_program_key *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->k_dtype == b->k_dtype && a->v_dtype == b->v_dtype &&
         a->head_dim == b->head_dim && a->value_dim == b->value_dim && a->dropout == b->dropout &&
         a->mod.flags == b->mod.flags && memcmp(a->mod.hash, b->mod.hash, sizeof a->mod.hash) == 0;
}

/* A readable name for messages and the build log. */
static void key_name(const ca_program_key *k, char *buf, size_t n) {
  static const char *const kinds[] = {"core", "flash", "backward", "kv_append", "modifier"};
  snprintf(buf, n, "%s dtype=%d k_dtype=%d v_dtype=%d dk=%d dv=%d%s%s%s", kinds[k->kind], (int)k->dtype,
           (int)k->k_dtype, (int)k->v_dtype, k->head_dim, k->value_dim, k->dropout ? " dropout" : "",
           k->mod.flags & CA_MODF_SCORE ? " score_mod" : "", k->mod.flags & CA_MODF_MASK ? " mask_mod" : "");
}

/* Whether kernel `name` of a built program can run as built: `items`
 * work-items per group (a GPU compiler may allow fewer: registers) and at
 * most private_max bytes of private memory and spills per work-item (a
 * GPU's spilled registers). Asked once per program, when it is built. */
static int kernel_runs(clattn_context *ctx, cl_program program, const char *name, size_t items, cl_ulong private_max) {
  cl_kernel kernel = NULL;
  size_t max_items = 0;
  cl_ulong private_bytes = 0;
  if (ca_create_kernel(program, name, &kernel) != CLATTN_OK) return 0;
  cl_int err =
      clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof max_items, &max_items, NULL);
  if (err == CL_SUCCESS)
    err = clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_PRIVATE_MEM_SIZE, sizeof private_bytes,
                                   &private_bytes, NULL);
  /* Intel's drivers count spilled registers apart (cl_intel_required_subgroup_size) */
  cl_ulong spill_bytes = 0;
  if (err == CL_SUCCESS && ctx->caps.sg_sizes &&
      clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_SPILL_MEM_SIZE_INTEL, sizeof spill_bytes, &spill_bytes,
                               NULL) == CL_SUCCESS)
    private_bytes += spill_bytes;
  clReleaseKernel(kernel);
  return err == CL_SUCCESS && max_items >= items && private_bytes <= private_max;
}

static clattn_status build_text(clattn_context *ctx, const ca_program_key *key, const ca_program_text *text,
                                cl_program *out) {
  char name[160];
  key_name(key, name, sizeof name);
  ca_program_text with = *text;
  if (key->mod.flags) ca_text_modifier(&with, key->mod.flags, key->mod.score_text, key->mod.mask_text);
  const clattn_status st = ca_build_program(ctx, name, with.sources, with.n_sources, with.options, out);
  /* the caller's text did not compile: its argument is at fault */
  if (st == CLATTN_ERR_BUILD && key->mod.flags) {
    char *log = strdup(clattn_last_error(ctx)); /* ca_fail writes where it lies */
    ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "the modifier does not compile: %s", log ? log : "(no memory for the log)");
    free(log);
    return CLATTN_ERR_INVALID_ARGUMENT;
  }
  return st;
}

/* A fused program: flash_block where the work-group kernels are used (GPUs,
 * or forced) and a tile fits (the tuned one, block_rm x block_rn, or the
 * next smaller that fits these head dims), stepped down while the built
 * kernel cannot run it; flash_tiled runs where none can. */
static clattn_status build_fused(clattn_context *ctx, ca_program *e) {
  const ca_program_key *k = &e->key;
  /* every fused kernel takes the same arguments: refused before building
   * when the device takes fewer bytes of them */
  const size_t arg_bytes = ca_fused_arg_bytes(ctx->caps.address_bits ? ctx->caps.address_bits : 64);
  if (ctx->caps.max_param && arg_bytes > ctx->caps.max_param)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "fused: the kernels' %zu bytes of arguments exceed the device's CL_DEVICE_MAX_PARAMETER_SIZE (%zu "
                   "bytes); use the staged or GEMM algorithm",
                   arg_bytes, ctx->caps.max_param);
  tl_block blk = {0, 0};
  const tl_block want = {ctx->tiles.block_rm, ctx->tiles.block_rn};
  int with_block =
      ctx->tiles.flash_wg > 0 && tl_flash_block_tuned(&ctx->caps, k->head_dim, k->value_dim, want, &blk) == 0;
  clattn_status st;
  for (;;) {
    ca_program_text text;
    ca_fused_text_tile(&ctx->tiles, &ctx->caps, k->head_dim, k->value_dim, k->dtype, k->k_dtype, k->v_dtype,
                       with_block ? &blk : NULL, &text);
    if (k->dropout) ca_text_dropout(&text);
    if ((st = build_text(ctx, k, &text, &e->program))) return st;
    if (!with_block || kernel_runs(ctx, e->program, "flash_block", CA_BLOCK_WG, ctx->block_private_max)) break;
    if (tl_flash_block_step(&ctx->caps, k->head_dim, k->value_dim, want.rm > 0, &blk) != 0) {
      with_block = 0; /* no smaller tile: this program's flash_tiled runs */
      break;
    }
    clReleaseProgram(e->program);
    e->program = NULL;
  }
  e->block = with_block ? blk : (tl_block){0, 0};
  /* the program holds flash_decode where the work-group kernels are used and its tile fits */
  e->decode_runs = ctx->tiles.flash_wg > 0 && tl_decode_keys(&ctx->caps, k->head_dim, k->value_dim) > 0 &&
                   kernel_runs(ctx, e->program, "flash_decode", CA_DECODE_WG, CL_ULONG_MAX);
  return CLATTN_OK;
}

static clattn_status build(clattn_context *ctx, ca_program *e) {
  const ca_program_key *k = &e->key;
  ca_program_text text;
  switch (k->kind) {
    case CA_PROGRAM_FUSED: return build_fused(ctx, e);
    case CA_PROGRAM_CORE: ca_core_kv_text(&ctx->tiles, k->dtype, k->k_dtype, k->v_dtype, &text); break;
    case CA_PROGRAM_BACKWARD:
      ca_backward_text(k->head_dim, k->value_dim, k->dtype, &text);
      if (ca_device_float_atomics(ctx->device)) ca_backward_float_atomics(&text);
      if (k->dropout) ca_text_dropout(&text);
      break;
    case CA_PROGRAM_APPEND: ca_append_text(k->dtype, k->k_dtype, &text); break;
    case CA_PROGRAM_MODIFIER: ca_modifier_text(&text); break;
  }
  return build_text(ctx, k, &text, &e->program);
}

/* Adds a built entry to the table (programs_lock held, or at creation). */
static clattn_status add(clattn_context *ctx, const ca_program *e) {
  if (ctx->n_programs == ctx->cap_programs) {
    const int cap = ctx->cap_programs ? 2 * ctx->cap_programs : 8;
    ca_program *grown = realloc(ctx->programs, (size_t)cap * sizeof *grown);
    if (!grown) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "program table: out of host memory");
    ctx->programs = grown;
    ctx->cap_programs = cap;
  }
  ctx->programs[ctx->n_programs++] = *e;
  return CLATTN_OK;
}

/* Past CA_MOD_PROGRAMS_MAX programs with modifiers, the least recently
 * used is released (programs_lock held); lists and pooled kernels that
 * still use it hold their own references. */
static void evict_modifiers(clattn_context *ctx) {
  int n = 0, oldest = -1;
  for (int i = 0; i < ctx->n_programs; i++)
    if (ctx->programs[i].key.mod.flags) {
      n++;
      if (oldest < 0 || ctx->programs[i].last_use < ctx->programs[oldest].last_use) oldest = i;
    }
  if (n <= CA_MOD_PROGRAMS_MAX) return;
  clReleaseProgram(ctx->programs[oldest].program);
  ctx->programs[oldest] = ctx->programs[--ctx->n_programs];
  ctx->programs_released++;
}

unsigned long ca_programs_released(clattn_context *ctx) {
  pthread_mutex_lock(&ctx->programs_lock);
  const unsigned long n = ctx->programs_released;
  pthread_mutex_unlock(&ctx->programs_lock);
  return n;
}

int ca_program_live(clattn_context *ctx, cl_program program) {
  int live = 0;
  pthread_mutex_lock(&ctx->programs_lock);
  for (int i = 0; i < ctx->n_programs && !live; i++) live = ctx->programs[i].program == program;
  pthread_mutex_unlock(&ctx->programs_lock);
  return live;
}

clattn_status ca_program_get(clattn_context *ctx, const ca_program_key *key, ca_program *out) {
  clattn_status st = CLATTN_OK;
  const int modded = key->mod.flags != 0;
  pthread_mutex_lock(&ctx->programs_lock);
  for (int i = 0; i < ctx->n_programs; i++)
    if (same_key(&ctx->programs[i].key, key)) {
      if (modded) {
        ctx->programs[i].last_use = ++ctx->program_clock;
        clRetainProgram(ctx->programs[i].program); /* the caller's reference */
      }
      *out = ctx->programs[i];
      pthread_mutex_unlock(&ctx->programs_lock);
      return CLATTN_OK;
    }
  ca_program e = {*key, NULL, {0, 0}, 0, modded ? ++ctx->program_clock : 0};
  st = build(ctx, &e);
  e.key.mod.score_text = e.key.mod.mask_text = NULL; /* the caller's, read while building */
  if (st == CLATTN_OK && (st = add(ctx, &e)) != CLATTN_OK) clReleaseProgram(e.program);
  if (st == CLATTN_OK) {
    *out = e;
    if (modded) {
      clRetainProgram(e.program);
      evict_modifiers(ctx);
    }
  }
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

/* The largest group each core kernel can run with, as built: a GPU
 * compiler may allow fewer work-items than the device maximum (registers). */
static clattn_status core_kernel_limit(clattn_context *ctx, cl_program core, size_t *limit) {
  static const char *names[] = {"qk_score", "softmax_rows", "mix_values"};
  clattn_status st = CLATTN_OK;
  *limit = ctx->caps.max_wg;
  for (int i = 0; i < 3 && st == CLATTN_OK; i++) {
    cl_kernel k = NULL;
    size_t wg = 0;
    if ((st = ca_create_kernel(core, names[i], &k))) break;
    cl_int err = clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    clReleaseKernel(k);
    if (err != CL_SUCCESS)
      st = ca_cl_fail(err, "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)");
    else if (wg < *limit)
      *limit = wg;
  }
  return st;
}

clattn_status ca_build_core(clattn_context *ctx) {
  ca_program e = {ca_core_key(CLATTN_F32, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME), NULL, {0, 0}, 0, 0};
  for (int attempt = 0; attempt < 4; attempt++) {
    size_t limit = 0;
    clattn_status st = build(ctx, &e);
    if (st == CLATTN_OK) st = core_kernel_limit(ctx, e.program, &limit);
    if (st != CLATTN_OK) {
      if (e.program) clReleaseProgram(e.program);
      return st;
    }
    const tl_tiles *t = &ctx->tiles;
    if ((size_t)t->score_tm * t->score_tn <= limit && (size_t)t->mix_tm * t->mix_tv <= limit &&
        (size_t)t->softmax_wg <= limit) {
      if ((st = add(ctx, &e)) != CLATTN_OK) clReleaseProgram(e.program);
      return st;
    }
    clReleaseProgram(e.program);
    e.program = NULL;
    ctx->caps.max_wg = limit;
    if (tl_clamp(&ctx->tiles, &ctx->caps) != 0) break;
  }
  return ca_fail(CLATTN_ERR_UNSUPPORTED, "the staged kernels cannot run any tile shape on this device");
}

void ca_release_programs(clattn_context *ctx) {
  for (int i = 0; i < ctx->n_programs; i++) clReleaseProgram(ctx->programs[i].program);
  free(ctx->programs);
  ctx->programs = NULL;
  ctx->n_programs = ctx->cap_programs = 0;
}
