/*
 * The fused path: flash_pack (K transposed, V packed, padding zeroed), then
 * flash_rows (one pass over key blocks with the online softmax), then, when
 * the keys were split across work-items, merge_states. Calls with few rows
 * per KV head (decode) skip the pack and read K and V in place
 * (flash_rows_direct): there the pack would triple the memory traffic of a
 * bandwidth-bound call. Scratch is O(N d): nothing proportional to M x N is
 * ever allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "program_text.h"
#include "internal.h"

enum { FLASH_BN = 16 };        /* keys per block; cl/flash.cl's FLASH_BN */
enum { MIN_SPLIT_KEYS = 256 }; /* a split smaller than this costs more than it hides */
enum { BLOCK_WG = 128 };       /* work-items per group of cl/flash_block.cl */

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* Whether kernel `name` of a built program can run as built: `items`
 * work-items per group (a GPU compiler may allow fewer: registers) and at
 * most private_max bytes of private memory per work-item (a GPU's spilled
 * registers). Asked once per program, when it is built. */
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
  clReleaseKernel(kernel);
  return err == CL_SUCCESS && max_items >= items && private_bytes <= private_max;
}

clattn_status ca_fused_program(clattn_context *ctx, int head_dim, int value_dim, clattn_dtype dtype,
                               clattn_dtype kv_dtype, cl_program *out, struct ca_fused_program *info) {
  clattn_status st = CLATTN_OK;
  if (kv_dtype == CLATTN_DTYPE_SAME) kv_dtype = dtype; /* one program either way */
  struct ca_fused_program *entry = NULL;
  int found = 0;
  pthread_mutex_lock(&ctx->programs_lock);
  if ((st = ca_program_entry(&ctx->fused, &ctx->n_fused, &ctx->cap_fused, "fused", head_dim, value_dim, dtype, kv_dtype,
                             &entry, &found)) ||
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
   * a tile fits; stepped down while the built kernel cannot run it */
  tl_block blk = {0, 0};
  int with_block = ctx->tiles.flash_wg > 0 && tl_flash_block(&ctx->caps, head_dim, value_dim, &blk) == 0;
  cl_program program = NULL;
  for (;;) {
    ca_program_text text;
    ca_fused_text_tile(&ctx->tiles, &ctx->caps, head_dim, value_dim, dtype, kv_dtype, with_block ? &blk : NULL, &text);
    char name[96];
    snprintf(name, sizeof name, "flash dk=%d dv=%d dtype=%d kv_dtype=%d block=%dx%d", head_dim, value_dim, (int)dtype,
             (int)kv_dtype, with_block ? blk.rm : 0, with_block ? blk.rn : 0);
    if ((st = ca_build_program(ctx, name, text.sources, text.n_sources, text.options, &program)) != CLATTN_OK) break;
    /* flash_block can fail to run its group, or spill: a smaller tile, and
     * when none fits flash_tiled runs instead */
    if (!with_block || kernel_runs(ctx, program, "flash_block", BLOCK_WG, ctx->block_private_max)) break;
    if (tl_flash_block_below(&ctx->caps, head_dim, value_dim, &blk) != 0) {
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

/* Splits the keys when the work-groups alone would leave the device partly
 * idle (decode: few query rows, many keys), by FlashAttention-2's rule
 * (num_splits_heuristic): no split when the groups fill 80% of the device's
 * slots; else, of the split counts that change the keys per split, the
 * smallest whose wave efficiency (groups / slots over the whole waves they
 * take) is within 85% of the best. Slots: on CPUs four groups per compute
 * unit (a thread runs one group at a time; four per thread keep the threads
 * evenly busy when rows differ in work: windows, causal, kv_lens). On GPUs a
 * compute unit holds at least one largest group's work-items (max_wg), so
 * max_wg / group_items groups of this kernel. Intel GPUs report EUs as
 * compute units, and a work-group runs inside one subslice of 8 EUs (Gen9
 * to Gen12; an Xe core's 8 or 16 vector engines likewise): their slots
 * count subslices. At least MIN_SPLIT_KEYS keys per split, at most 128
 * splits. A fixed function of the shape and the device, so results stay
 * bitwise repeatable. */
ca_splits ca_plan_splits(const tl_device *dev, size_t group_items, size_t items, int kv_len) {
  ca_splits sp = {kv_len, 1};
  size_t units = dev->compute_units ? dev->compute_units : 1;
  const int gpu = !(dev->type & CL_DEVICE_TYPE_CPU);
  if (gpu && dev->vendor_id == TL_VENDOR_INTEL) units = units >= 8 ? units / 8 : 1;
  const size_t per_unit = !gpu ? 4 : group_items && dev->max_wg > group_items ? dev->max_wg / group_items : 1;
  const size_t slots = units * per_unit;
  const size_t blocks = (size_t)kv_len / MIN_SPLIT_KEYS;
  if (items == 0 || (double)items >= 0.8 * (double)slots || blocks < 2) return sp;
  size_t max_splits = 128;
  if (max_splits > slots) max_splits = slots;
  if (max_splits > blocks) max_splits = blocks;
  double eff[129] = {0}, best = 0;
  for (size_t s = 1; s <= max_splits; s++) {
    /* only counts that change the blocks per split */
    if (s > 1 && (blocks + s - 1) / s == (blocks + s - 2) / (s - 1)) continue;
    const double waves = (double)items * (double)s / (double)slots;
    eff[s] = waves / ceil(waves);
    if (eff[s] > best) best = eff[s];
  }
  size_t splits = 1;
  while (splits < max_splits && eff[splits] < 0.85 * best) splits++;
  if (splits == 1) return sp;
  /* at most kv_len / 2 rounded up to 16: fits an int */
  sp.split_keys = (int)round_up(((size_t)kv_len + splits - 1) / splits, FLASH_BN);
  sp.n_splits = ((size_t)kv_len + (size_t)sp.split_keys - 1) / (size_t)sp.split_keys;
  return sp;
}

void ca_arg_fused(ca_args *r, const clattn_params *p, const ca_plan *plan, cl_mem kt, cl_mem vp, cl_long n_pad,
                  int split_keys, int diag, cl_mem part_o, cl_mem part_lse, cl_mem flag) {
  ca_arg_view(r, &p->q);
  ca_arg_mem(r, kt);
  ca_arg_mem(r, vp);
  ca_arg(r, sizeof n_pad, &n_pad);
  ca_arg_view(r, &p->k);
  ca_arg_view(r, &p->v);
  ca_arg_score(r, p);
  ca_arg_allowed(r, p);
  ca_arg_kv(r, p);
  ca_arg_int(r, p->q_heads);
  ca_arg_int(r, p->kv_heads);
  ca_arg_int(r, plan->group);
  ca_arg_int(r, p->q_len);
  ca_arg_int(r, p->kv_len);
  ca_arg_float(r, plan->scale);
  ca_arg_shape(r, p);
  ca_arg_sinks(r, p);
  ca_arg_int(r, plan->window_left);
  ca_arg_int(r, plan->window_right);
  ca_arg_int(r, split_keys);
  ca_arg_view(r, &p->out);
  ca_arg_view(r, &p->lse);
  ca_arg_int(r, plan->want_lse);
  ca_arg_diag(r, p, diag);
  ca_arg_mem(r, part_o);
  ca_arg_mem(r, part_lse);
  ca_arg_mem(r, flag);
}

clattn_status ca_enqueue_split_merge(clattn_context *ctx, const clattn_params *p, size_t n_splits, cl_mem part_o,
                                     cl_mem part_lse, cl_mem flag, cl_uint n_wait, const cl_event *wait,
                                     cl_event *prev) {
  const size_t m = (size_t)p->q_len, h = (size_t)p->q_heads, dv = (size_t)p->value_dim;
  const size_t rows_total = (size_t)p->batch * h * m;
  clattn_merge_params mp = {
      .n_states = (int)n_splits,
      .batch = p->batch,
      .heads = p->q_heads,
      .q_len = p->q_len,
      .value_dim = p->value_dim,
      .o = {part_o, 0, {h * m * dv, m * dv, dv, 1}},
      .lse = {part_lse, 0, {h * m, m, 1, 0}},
      .o_state_stride = rows_total * dv,
      .lse_state_stride = rows_total,
      .out = p->out,
      .out_lse = p->lse,
      .empty_rows = p->empty_rows,
  };
  return ca_enqueue_merge(ctx, &mp, p->dtype, p->sinks, flag, n_wait, wait, prev);
}

clattn_status ca_fused_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                               const cl_event *wait, cl_event *done) {
  clattn_status st = CLATTN_OK;
  cl_program program = NULL;
  cl_kernel pack = NULL, rows = NULL;
  char rows_name[32];
  cl_mem kt = NULL, vp = NULL, part_o = NULL, part_lse = NULL, empty_flag = NULL;
  cl_event prev = NULL;
  const size_t rows_per_kv = (size_t)plan->group * (size_t)p->q_len;
  const int wg = ctx->tiles.flash_wg; /* > 0: the work-group kernels (GPUs) */
  if (done) *done = NULL;
  /* Few rows per KV head (decode): read K and V in place, 1-8 rows per item
   * (whole 16-column slices: unit column strides, or Q8_0's blocks). */
  const size_t unit = plan->kv_dtype == CLATTN_Q8_0 ? 34 : 1;
  const int direct = !wg && rows_per_kv <= 8 && p->head_dim % 16 == 0 && p->value_dim % 16 == 0 &&
                     p->k.stride[3] == unit && p->v.stride[3] == unit;
  const size_t kv_pairs = (size_t)p->batch * (size_t)p->kv_heads;
  const size_t n_pad = round_up((size_t)p->kv_len, FLASH_BN); /* 2^31 for kv_len near INT_MAX: a long */
  const cl_long n_pad_arg = (cl_long)n_pad;
  const size_t dvp = round_up((size_t)p->value_dim, 16);
  /* Dimensions are positive ints, so these products of at most three fit in 64 bits. */
  const cl_ulong kt_bytes = (cl_ulong)kv_pairs * (cl_ulong)p->head_dim * n_pad * sizeof(float);
  const cl_ulong vp_bytes = (cl_ulong)kv_pairs * n_pad * dvp * sizeof(float);
  const int packed = !wg && !direct;
  if (packed && (kt_bytes > ctx->max_alloc || vp_bytes > ctx->max_alloc || kt_bytes > SIZE_MAX || vp_bytes > SIZE_MAX))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "fused: packed keys (%llu bytes) or values (%llu bytes) exceed the device's largest allocation "
                   "(%llu bytes)",
                   (unsigned long long)kt_bytes, (unsigned long long)vp_bytes, (unsigned long long)ctx->max_alloc);

  struct ca_fused_program info;
  int decoded = 0;
  if ((st = ca_fused_program(ctx, p->head_dim, p->value_dim, p->dtype, plan->kv_dtype, &program, &info))) return st;
  const tl_block blk = info.block;
  /* Decode shapes on GPUs: the key-parallel kernel (src/decode.c), where it applies. */
  if (wg && ctx->flash_block && info.decode_runs && rows_per_kv <= CA_DECODE_KERNEL_ROWS &&
      ((st = ca_decode_forward(ctx, p, plan, program, n_wait, wait, done, &decoded)) || decoded))
    return st;
  /* flash_block where it applies; flash_tiled keeps the route diagnostics
   * and additive scoring. */
  const int block = wg && ctx->flash_block && !plan->diag && p->score != CLATTN_SCORE_ADDITIVE && blk.rm > 0;
  /* rows per work-item (flash_rows*) or per work-group (flash_block, flash_tiled) */
  const int bm = block              ? 16 * blk.rm
                 : wg               ? wg
                 : !direct          ? ctx->tiles.flash_bm
                 : rows_per_kv <= 1 ? 1
                 : rows_per_kv <= 2 ? 2
                 : rows_per_kv <= 4 ? 4
                                    : 8;
  const size_t group_items = block ? BLOCK_WG : (size_t)wg;
  const size_t row_blocks = (rows_per_kv + (size_t)bm - 1) / (size_t)bm;
  /* The diagnostics are not merged across splits, nor are packed sequences'
   * rows mapped by the merge: with either, one pass. */
  const ca_splits splits = plan->diag || p->cu_seqlens_q
                               ? (ca_splits){p->kv_len, 1}
                               : ca_plan_splits(&ctx->caps, group_items, row_blocks * kv_pairs, p->kv_len);
  const int split_keys = splits.split_keys;
  const size_t n_splits = splits.n_splits;
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;

  snprintf(rows_name, sizeof rows_name,
           block    ? "flash_block"
           : wg     ? "flash_tiled"
           : direct ? "flash_rows_direct%d"
                    : "flash_rows",
           bm);
  if ((st = ca_kernel_take(ctx, program, rows_name, &rows)) || (st = ca_flag_take(ctx, p->empty_rows, &empty_flag)))
    goto fail;
  if (packed && ((st = ca_kernel_take(ctx, program, "flash_pack", &pack)) ||
                 (st = ca_scratch_take(ctx, (size_t)kt_bytes, "fused packed keys", &kt)) ||
                 (st = ca_scratch_take(ctx, (size_t)vp_bytes, "fused packed values", &vp))))
    goto fail;
  if (n_splits > 1 &&
      ((st = ca_scratch_take(ctx, n_splits * rows_total * (size_t)p->value_dim * sizeof(float),
                             "split-KV partial outputs", &part_o)) ||
       (st = ca_scratch_take(ctx, n_splits * rows_total * sizeof(float), "split-KV partial lse", &part_lse))))
    goto fail;
  ca_note_scratch(ctx, (packed ? (size_t)(kt_bytes + vp_bytes) : 0) + sizeof(cl_int) +
                           (n_splits > 1 ? n_splits * rows_total * ((size_t)p->value_dim + 1) * sizeof(float) : 0));

  if (packed) {
    ca_args a = {pack, "flash_pack", 0, 0, CL_SUCCESS};
    ca_arg_view(&a, &p->k);
    ca_arg_view(&a, &p->v);
    ca_arg_seq(&a, p);
    ca_arg_kv(&a, p);
    ca_arg_int(&a, p->q_len);
    ca_arg_int(&a, p->kv_heads);
    ca_arg_int(&a, p->kv_len);
    ca_arg(&a, sizeof n_pad_arg, &n_pad_arg);
    ca_arg_mem(&a, kt);
    ca_arg_mem(&a, vp);
    if ((st = ca_args_done(&a))) goto fail;
    const size_t pack_global[2] = {n_pad, kv_pairs};
    if ((st = ca_enqueue(ctx, pack, "flash_pack", 2, pack_global, NULL, n_wait, wait, &prev))) goto fail;
  }

  ca_args r = {rows, rows_name, 0, 0, CL_SUCCESS};
  ca_arg_fused(&r, p, plan, kt, vp, n_pad_arg, split_keys, plan->diag, part_o, part_lse, empty_flag);
  if ((st = ca_args_done(&r))) goto fail;
  const size_t rows_global[3] = {wg ? row_blocks * group_items : row_blocks, kv_pairs, n_splits};
  const size_t rows_local[3] = {wg ? group_items : 1, 1, 1};
  if ((st = ca_enqueue(ctx, rows, rows_name, 3, rows_global, rows_local, n_wait, wait, &prev))) goto fail;

  if (n_splits > 1 &&
      (st = ca_enqueue_split_merge(ctx, p, n_splits, part_o, part_lse, empty_flag, n_wait, wait, &prev)))
    goto fail;
  st = ca_finish_call(ctx, p->empty_rows, &empty_flag, prev);
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  ca_kernel_give(ctx, pack);
  ca_kernel_give(ctx, rows);
  ca_scratch_give(ctx, kt, used);
  ca_scratch_give(ctx, vp, used);
  ca_scratch_give(ctx, part_o, used);
  ca_scratch_give(ctx, part_lse, used);
  ca_flag_give(ctx, empty_flag, 0, used);
  ca_hand_out(st, &prev, done);
  return st;
}
