/*
 * The plan step: how a validated call runs, decided before anything is
 * enqueued, as a pure function of the call and what the device reported
 * (so results stay bitwise repeatable). The paths then only enqueue.
 *   ca_plan_chunks   the staged and GEMM paths' chunks of query rows
 *   ca_plan_splits   split-KV: how many key ranges, FlashAttention-2's rule
 *   ca_plan_fused    the fused call's kernel, grid, packed copies and split
 *   ca_fused_lengths what of that follows kv_len (a plan's step re-plans it)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"

enum { GPU_KEY_TILE = 16 };    /* the GPU kernels' split ranges are whole tiles of 16 keys */
enum { MIN_SPLIT_KEYS = 256 }; /* a split smaller than this costs more than it hides */

ca_chunk ca_plan_chunks(const clattn_params *p, size_t budget) {
  size_t row_bytes = (size_t)p->kv_len * sizeof(float);
  size_t fit = budget / row_bytes;
  size_t pairs = (size_t)p->batch * (size_t)p->q_heads;
  ca_chunk c;
  if (fit < 1) fit = 1;
  if (fit >= (size_t)p->q_len) {
    c.rows = p->q_len;
    size_t heads = fit / (size_t)p->q_len;
    c.heads = (int)(heads < pairs ? heads : pairs);
  } else {
    c.rows = (int)fit;
    c.heads = 1;
  }
  /* Keep the softmax's rows x heads grid dimension inside int range. */
  while ((long long)c.heads * c.rows > INT32_MAX / 2 && c.heads > 1) c.heads /= 2;
  return c;
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
 * splits, each a multiple of `multiple` keys (the kernel's key block). A
 * fixed function of the shape and the device, so results stay bitwise
 * repeatable. */
/* The groups of a kernel of group_items work-items the device runs at once. */
static size_t split_slots(const tl_device *dev, size_t group_items) {
  size_t units = dev->compute_units ? dev->compute_units : 1;
  const int gpu = !(dev->type & CL_DEVICE_TYPE_CPU);
  if (gpu && dev->vendor_id == TL_VENDOR_INTEL) units = units >= 8 ? units / 8 : 1;
  const size_t per_unit = !gpu ? 4 : group_items && dev->max_wg > group_items ? dev->max_wg / group_items : 1;
  return units * per_unit;
}

size_t ca_plan_splits_bound(const tl_device *dev, size_t group_items, int kv_len) {
  size_t bound = split_slots(dev, group_items), blocks = (size_t)kv_len / MIN_SPLIT_KEYS;
  if (bound > 128) bound = 128;
  if (bound > blocks) bound = blocks;
  return bound > 1 ? bound : 1;
}

ca_splits ca_plan_splits(const tl_device *dev, size_t group_items, size_t items, int kv_len, size_t multiple) {
  ca_splits sp = {kv_len, 1};
  const size_t slots = split_slots(dev, group_items);
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
  /* at most kv_len / 2 rounded up to a key block (kv_len >= 512, blocks of
   * at most 32 keys): fits an int, and leaves at least two ranges */
  sp.split_keys = (int)ca_round_up(((size_t)kv_len + splits - 1) / splits, multiple);
  sp.n_splits = ((size_t)kv_len + (size_t)sp.split_keys - 1) / (size_t)sp.split_keys;
  return sp;
}

/* The fused call's kernel, in order of preference:
 *   flash_decode       GPUs, at most CA_DECODE_KERNEL_ROWS rows per KV head
 *                      (decode): one group of 64 work-items per (batch, KV
 *                      head, split) over keys and value columns, each split
 *                      following its batch row's own length (kv_lens)
 *   flash_block        GPUs (or CLATTN_FLASH_WG), where its tile was built
 *   flash_tiled        work-group kernels otherwise, and for route
 *                      diagnostics and additive scoring
 *   flash_rows_directN CPUs, at most 8 rows per KV head: K and V read in
 *                      place (a pack would triple a bandwidth-bound call's
 *                      traffic), whole 16-column slices with unit strides
 *   flash_rows         CPUs: flash_pack first (K transposed, V packed) */
clattn_status ca_plan_fused(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, ca_fused_launch *l) {
  *l = (ca_fused_launch){0};
  const size_t rows_per_kv = (size_t)plan->group * (size_t)p->q_len;
  const size_t kv_pairs = (size_t)p->batch * (size_t)p->kv_heads;
  const int wg = ctx->tiles.flash_wg; /* > 0: the work-group kernels (GPUs) */
  const int plain = !plan->diag && p->score != CLATTN_SCORE_ADDITIVE;
  /* unit column strides: an element, or one block of the block types */
  const size_t k_unit = ca_block_bytes(plan->k_dtype) ? ca_block_bytes(plan->k_dtype) : 1;
  const size_t v_unit = ca_block_bytes(plan->v_dtype) ? ca_block_bytes(plan->v_dtype) : 1;
  /* flash_rows*' keys per block (cl/flash.cl's FLASH_BN): two vectors */
  const size_t key_block = 2 * (size_t)(ctx->tiles.flash_vw > 0 ? ctx->tiles.flash_vw : 16);
  const int direct = !wg && rows_per_kv <= 8 && p->head_dim % 16 == 0 && p->value_dim % 16 == 0 &&
                     p->k.stride[3] == k_unit && p->v.stride[3] == v_unit;
  l->packed = !wg && !direct;
  if (l->packed) {
    const size_t n_pad = ca_round_up((size_t)p->kv_len, key_block); /* 2^31 for kv_len near INT_MAX: a long */
    l->n_pad = (cl_long)n_pad;
    /* Dimensions are positive ints, so these products of at most three fit in 64 bits. */
    l->kt_bytes = (cl_ulong)kv_pairs * (cl_ulong)p->head_dim * n_pad * sizeof(float);
    l->vp_bytes = (cl_ulong)kv_pairs * n_pad * ca_round_up((size_t)p->value_dim, 16) * sizeof(float);
    if (l->kt_bytes > ctx->max_alloc || l->vp_bytes > ctx->max_alloc || l->kt_bytes > SIZE_MAX ||
        l->vp_bytes > SIZE_MAX)
      return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                     "fused: packed keys (%llu bytes) or values (%llu bytes) exceed the device's largest allocation "
                     "(%llu bytes)",
                     (unsigned long long)l->kt_bytes, (unsigned long long)l->vp_bytes,
                     (unsigned long long)ctx->max_alloc);
  }
  /* After the size check: a call that cannot run builds nothing */
  struct ca_fused_program info;
  clattn_status st =
      ca_fused_program(ctx, p->head_dim, p->value_dim, p->dtype, plan->k_dtype, plan->v_dtype, p->dropout_p > 0.0f,
                       &l->program, &info);
  if (st != CLATTN_OK) return st;
  const int decode = wg && ctx->flash_block && info.decode_runs && plain && rows_per_kv <= CA_DECODE_KERNEL_ROWS;
  const int block = !decode && wg && ctx->flash_block && plain && info.block.rm > 0;
  /* rows per work-item (flash_rows*) or per work-group (flash_block, flash_tiled); flash_decode: every row of a KV head
   */
  const int bm = decode             ? (int)rows_per_kv
                 : block            ? 16 * info.block.rm
                 : wg               ? wg
                 : !direct          ? ctx->tiles.flash_bm
                 : rows_per_kv <= 1 ? 1
                 : rows_per_kv <= 2 ? 2
                 : rows_per_kv <= 4 ? 4
                                    : 8;
  l->group_items = decode ? CA_DECODE_WG : block ? CA_BLOCK_WG : (size_t)wg;
  l->row_blocks = (rows_per_kv + (size_t)bm - 1) / (size_t)bm;
  l->kv_pairs = kv_pairs;
  l->key_multiple = wg ? GPU_KEY_TILE : key_block;
  /* The diagnostics are not merged across splits, nor are packed sequences'
   * rows mapped by the merge: with either, one pass. */
  l->unsplit = plan->diag || p->cu_seqlens_q;
  snprintf(l->kernel, sizeof l->kernel,
           decode   ? "flash_decode"
           : block  ? "flash_block"
           : wg     ? "flash_tiled"
           : direct ? "flash_rows_direct%d"
                    : "flash_rows",
           bm);
  l->global[0] = wg ? l->row_blocks * l->group_items : l->row_blocks;
  l->global[1] = kv_pairs;
  l->local[0] = wg ? l->group_items : 1;
  l->local[1] = l->local[2] = 1;
  ca_fused_lengths(ctx, l, p->kv_len);
  return CLATTN_OK;
}

void ca_fused_lengths(const clattn_context *ctx, ca_fused_launch *l, int kv_len) {
  if (l->packed) l->n_pad = (cl_long)ca_round_up((size_t)kv_len, l->key_multiple);
  l->splits = l->unsplit ? (ca_splits){kv_len, 1}
                         : ca_plan_splits(&ctx->caps, l->group_items, l->row_blocks * l->kv_pairs, kv_len,
                                          l->key_multiple);
  l->global[2] = l->splits.n_splits;
}
