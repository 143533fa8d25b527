/*
 * The context's program registry: every program a call runs, looked up
 * here, built on first use through program.c (and the disk cache) with the
 * options program_text.c lists for it, then kept for the context's life:
 *   core         qk_score, softmax_rows, mix_values, merge_states, gemm
 *                kernels per storage type (f32 at creation, its tiles
 *                lowered until every kernel runs its group), and per (q, K, V)
 *                storage pair
 *   fused        flash_* and flash_decode per (dk, dv, dtype, k and v storage),
 *                flash_block's tile (tuned or chosen per head dim) stepped
 *                down until it runs without spilling
 *   backward     cl/backward.cl per (dk, dv, dtype)
 *   kv_append    per (source, cache) storage, with clattn_forward_kvcache's
 *                lengths and rotary kernels
 * Lookups after creation hold programs_lock.
 */
#include <stdio.h>
#include <stdlib.h>

#include <CL/cl_ext.h>

#include "program_text.h"
#include "internal.h"

static clattn_status build_core_for(clattn_context *ctx, clattn_dtype dtype, cl_program *out) {
  ca_program_text text;
  ca_core_text(&ctx->tiles, dtype, &text);
  return ca_build_program(ctx,
                          dtype == CLATTN_F32   ? "core"
                          : dtype == CLATTN_F16 ? "core f16"
                                                : "core bf16",
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

clattn_status ca_core_program_kv(clattn_context *ctx, clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                 cl_program *out) {
  if (k_dtype == CLATTN_DTYPE_SAME) k_dtype = dtype;
  if (v_dtype == CLATTN_DTYPE_SAME) v_dtype = k_dtype;
  if (k_dtype == dtype && v_dtype == dtype) return ca_core_program(ctx, dtype, out);
  clattn_status st = CLATTN_OK;
  pthread_mutex_lock(&ctx->programs_lock);
  cl_program *slot = &ctx->core_kv[dtype][k_dtype][v_dtype];
  if (!*slot) {
    ca_program_text text;
    ca_core_kv_text(&ctx->tiles, dtype, k_dtype, v_dtype, &text);
    char name[48];
    snprintf(name, sizeof name, "core dtype=%d k_dtype=%d v_dtype=%d", (int)dtype, (int)k_dtype, (int)v_dtype);
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
    if (err != CL_SUCCESS)
      st = ca_cl_fail(err, "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)");
    else if (wg < *limit)
      *limit = wg;
  }
  return st;
}

clattn_status ca_build_core(clattn_context *ctx) {
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

/* A table of programs keyed by (head_dim, value_dim, dtype, k_dtype, v_dtype,
 * dropout) (ctx->fused, ctx->backward): *entry is the matching one (*found 1), or
 * room for a new one at (*table)[*n] (*found 0: the caller fills it and
 * counts it in *n once built). OUT_OF_MEMORY, naming `what`, when the table
 * cannot grow. The caller holds programs_lock. */
static clattn_status program_entry(struct ca_fused_program **table, int *n, int *cap, const char *what, int head_dim,
                                   int value_dim, clattn_dtype dtype, clattn_dtype k_dtype, clattn_dtype v_dtype,
                                   int dropout, struct ca_fused_program **entry, int *found) {
  for (int i = 0; i < *n; i++) {
    struct ca_fused_program *e = &(*table)[i];
    if (e->head_dim == head_dim && e->value_dim == value_dim && e->dtype == dtype && e->k_dtype == k_dtype &&
        e->v_dtype == v_dtype && e->dropout == dropout) {
      *entry = e;
      *found = 1;
      return CLATTN_OK;
    }
  }
  if (*n == *cap) {
    const int grown_cap = *cap ? *cap * 2 : 4;
    void *grown = realloc(*table, (size_t)grown_cap * sizeof **table);
    if (!grown) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "%s program table: out of host memory", what);
    *table = grown;
    *cap = grown_cap;
  }
  *entry = &(*table)[*n];
  **entry = (struct ca_fused_program){.head_dim = head_dim,
                                      .value_dim = value_dim,
                                      .dtype = dtype,
                                      .k_dtype = k_dtype,
                                      .v_dtype = v_dtype,
                                      .dropout = dropout};
  *found = 0;
  return CLATTN_OK;
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

clattn_status ca_fused_program(clattn_context *ctx, int head_dim, int value_dim, clattn_dtype dtype,
                               clattn_dtype k_dtype, clattn_dtype v_dtype, int dropout, cl_program *out,
                               struct ca_fused_program *info) {
  clattn_status st = CLATTN_OK;
  if (k_dtype == CLATTN_DTYPE_SAME) k_dtype = dtype; /* one program either way */
  if (v_dtype == CLATTN_DTYPE_SAME) v_dtype = k_dtype;
  struct ca_fused_program *entry = NULL;
  int found = 0;
  pthread_mutex_lock(&ctx->programs_lock);
  if ((st = program_entry(&ctx->fused, &ctx->n_fused, &ctx->cap_fused, "fused", head_dim, value_dim, dtype, k_dtype,
                          v_dtype, dropout, &entry, &found)) ||
      found) {
    if (found) {
      *out = entry->program;
      if (info) *info = *entry;
    }
    goto done;
  }
  /* every fused kernel takes FLASH_KERNEL_ARGS: refused before building
   * when the device takes fewer bytes of arguments */
  const size_t arg_bytes = ca_fused_arg_bytes(ctx->caps.address_bits ? ctx->caps.address_bits : 64);
  if (ctx->caps.max_param && arg_bytes > ctx->caps.max_param) {
    st = ca_fail(CLATTN_ERR_UNSUPPORTED,
                 "fused: the kernels' %zu bytes of arguments exceed the device's CL_DEVICE_MAX_PARAMETER_SIZE (%zu "
                 "bytes); use the staged or GEMM algorithm",
                 arg_bytes, ctx->caps.max_param);
    goto done;
  }
  /* flash_block where the work-group kernels are used (GPUs, or forced) and
   * a tile fits (the tuned one, block_rm x block_rn, or the next smaller
   * that fits these head dims); stepped down while the built kernel cannot
   * run it */
  tl_block blk = {0, 0};
  const tl_block want = {ctx->tiles.block_rm, ctx->tiles.block_rn};
  int with_block = ctx->tiles.flash_wg > 0 && tl_flash_block_tuned(&ctx->caps, head_dim, value_dim, want, &blk) == 0;
  cl_program program = NULL;
  for (;;) {
    ca_program_text text;
    ca_fused_text_tile(&ctx->tiles, &ctx->caps, head_dim, value_dim, dtype, k_dtype, v_dtype, with_block ? &blk : NULL,
                       &text);
    if (dropout) ca_text_dropout(&text);
    char name[128];
    snprintf(name, sizeof name, "flash dk=%d dv=%d dtype=%d k_dtype=%d v_dtype=%d block=%dx%d%s", head_dim, value_dim,
             (int)dtype, (int)k_dtype, (int)v_dtype, with_block ? blk.rm : 0, with_block ? blk.rn : 0,
             dropout ? " dropout" : "");
    if ((st = ca_build_program(ctx, name, text.sources, text.n_sources, text.options, &program)) != CLATTN_OK) break;
    /* flash_block can fail to run its group, or spill: a smaller tile, and
     * when none fits flash_tiled runs instead */
    if (!with_block || kernel_runs(ctx, program, "flash_block", CA_BLOCK_WG, ctx->block_private_max)) break;
    if (tl_flash_block_step(&ctx->caps, head_dim, value_dim, want.rm > 0, &blk) != 0) {
      with_block = 0; /* no smaller tile: this program's flash_tiled runs */
      break;
    }
    clReleaseProgram(program);
    program = NULL;
  }
  if (st == CLATTN_OK) {
    entry->program = program;
    /* asked once per program, not per call; the program holds flash_decode
     * where the work-group kernels are used and its tile fits */
    entry->block = with_block ? blk : (tl_block){0, 0};
    entry->decode_runs = ctx->tiles.flash_wg > 0 && tl_decode_keys(&ctx->caps, head_dim, value_dim) > 0 &&
                         kernel_runs(ctx, program, "flash_decode", CA_DECODE_WG, CL_ULONG_MAX);
    if (info) *info = *entry;
    ctx->n_fused++;
    *out = program;
  }
done:
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

clattn_status ca_backward_program(clattn_context *ctx, int head_dim, int value_dim, clattn_dtype dtype, int dropout,
                                  cl_program *out) {
  struct ca_fused_program *entry = NULL;
  int found = 0;
  pthread_mutex_lock(&ctx->programs_lock);
  clattn_status st = program_entry(&ctx->backward, &ctx->n_backward, &ctx->cap_backward, "backward", head_dim,
                                   value_dim, dtype, dtype, dtype, dropout, &entry, &found);
  if (st != CLATTN_OK || found) {
    if (found) *out = entry->program;
    goto done;
  }
  ca_program_text text;
  ca_backward_text(head_dim, value_dim, dtype, &text);
  if (ca_device_float_atomics(ctx->device)) ca_backward_float_atomics(&text);
  if (dropout) ca_text_dropout(&text);
  char name[80];
  snprintf(name, sizeof name, "backward dk=%d dv=%d dtype=%d%s", head_dim, value_dim, (int)dtype,
           dropout ? " dropout" : "");
  if ((st = ca_build_program(ctx, name, text.sources, text.n_sources, text.options, &entry->program)) == CLATTN_OK) {
    ctx->n_backward++;
    *out = entry->program;
  }
done:
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

clattn_status ca_append_program(clattn_context *ctx, clattn_dtype src, clattn_dtype kv, cl_program *out) {
  clattn_status st = CLATTN_OK;
  pthread_mutex_lock(&ctx->programs_lock);
  cl_program *slot = &ctx->append[src][kv];
  if (!*slot) {
    ca_program_text text;
    ca_append_text(src, kv, &text);
    char name[48];
    snprintf(name, sizeof name, "kv_append src=%d kv=%d", (int)src, (int)kv);
    st = ca_build_program(ctx, name, text.sources, text.n_sources, text.options, slot);
  }
  *out = *slot;
  pthread_mutex_unlock(&ctx->programs_lock);
  return st;
}

void ca_release_programs(clattn_context *ctx) {
  if (ctx->core) clReleaseProgram(ctx->core);
  for (int i = 0; i < 2; i++)
    if (ctx->core_16[i]) clReleaseProgram(ctx->core_16[i]);
  for (int i = 0; i < ctx->n_fused; i++) clReleaseProgram(ctx->fused[i].program);
  for (int s = 0; s < 3; s++) {
    for (int c = 0; c < 5; c++)
      if (ctx->append[s][c]) clReleaseProgram(ctx->append[s][c]);
    for (int k = 0; k < CA_DTYPES; k++)
      for (int v = 0; v < CA_DTYPES; v++)
        if (ctx->core_kv[s][k][v]) clReleaseProgram(ctx->core_kv[s][k][v]);
  }
  free(ctx->fused);
  for (int i = 0; i < ctx->n_backward; i++) clReleaseProgram(ctx->backward[i].program);
  free(ctx->backward);
}
