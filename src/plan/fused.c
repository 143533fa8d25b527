/*
 * The fused path's plan: flash_pack first where K and V are packed (K
 * transposed, V padded), then the chosen kernel (flash_rows*, flash_block,
 * flash_tiled or flash_decode: one pass over the keys with the online
 * softmax), then, when the keys are split, merge_states. Scratch is O(N d):
 * nothing proportional to M x N is ever allocated. The packed copies and
 * the split's partial states share one work buffer.
 */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "plan/fill.h"

enum { GPU_KEY_TILE = 16 }; /* the GPU kernels' split ranges are whole tiles of 16 keys */

/* A part of the work buffer: `floats` floats from float `at` (64-byte aligned). */
static cl_long take(cl_ulong *end, cl_ulong floats) {
  const cl_ulong at = *end;
  *end = (at + floats + 15) / 16 * 16;
  return (cl_long)at;
}

/* Whether any of the fused kernels' extras is in the call (flash_extra). */
static int has_extras(const clattn_params *p, const ca_resolved *r) {
  return p->mask.buf || p->bias.buf || p->score == CLATTN_SCORE_ADDITIVE || p->alibi_slopes || p->sinks ||
         p->cu_seqlens_q || r->diag || r->dropout.on || p->score_mod || p->mask_mod;
}

/* flash_step is the leading part of flash_core, buffers and struct alike. */
_Static_assert(offsetof(ca_args_flash_step, want_lse) == offsetof(ca_args_flash_core, want_lse) &&
                   offsetof(ca_args_flash_step, kv_len) == offsetof(ca_args_flash_core, kv_len) &&
                   offsetof(ca_args_flash_step, split_keys) == offsetof(ca_args_flash_core, split_keys) &&
                   offsetof(ca_bufs_flash_step, empty_flag) == offsetof(ca_bufs_flash_core, empty_flag) &&
                   sizeof(ca_args_flash_step) == offsetof(ca_args_flash_core, lse),
               "flash_step leads flash_core");

/* Whether flash_core's arguments past flash_step's are all absent (no
 * buffer, every field zero), so a *_step entry sees the same call. */
static int rest_absent(const ca_bufs_flash_core *b, const ca_args_flash_core *a) {
  const ca_buf *buf = (const ca_buf *)b;
  for (int i = CA_NBUF(flash_step); i < CA_NBUF(flash_core); i++)
    if (buf[i].mem || buf[i].role != CA_BUF_MEM) return 0;
  const unsigned char *rest = (const unsigned char *)a + sizeof(ca_args_flash_step);
  for (size_t i = 0; i < sizeof *a - sizeof(ca_args_flash_step); i++)
    if (rest[i]) return 0;
  return 1;
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
 *                      traffic), whole 16-column slices with unit strides;
 *                      the _core entry where the call has no extras,
 *                      the _step entry where it has none of flash_core's
 *                      rest either (lse, work, lengths, paging, scales)
 *   flash_rows         CPUs: flash_pack first (K transposed, V packed) */
clattn_status ca_plan_fused(clattn_context *ctx, const clattn_params *p, const ca_resolved *r, ca_list *l) {
  l->what = "fused";
  const size_t rows_per_kv = (size_t)r->group * (size_t)p->q_len;
  const size_t kv_pairs = (size_t)p->batch * (size_t)p->kv_heads;
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;
  const int wg = ctx->tiles.flash_wg; /* > 0: the work-group kernels (GPUs) */
  const int plain = !r->diag && p->score != CLATTN_SCORE_ADDITIVE;
  /* unit column strides: an element, or one block of the block types */
  const size_t k_unit = ca_block_bytes(r->k_dtype) ? ca_block_bytes(r->k_dtype) : 1;
  const size_t v_unit = ca_block_bytes(r->v_dtype) ? ca_block_bytes(r->v_dtype) : 1;
  /* flash_rows*' keys per block (cl/flash.cl's FLASH_BN): two vectors */
  const size_t key_block = 2 * (size_t)(ctx->tiles.flash_vw > 0 ? ctx->tiles.flash_vw : 16);
  const int direct = !wg && rows_per_kv <= 8 && p->head_dim % 16 == 0 && p->value_dim % 16 == 0 &&
                     p->k.stride[3] == k_unit && p->v.stride[3] == v_unit;
  const int packed = !wg && !direct;
  /* Dimensions are positive ints, so these products of at most three fit in 64 bits. */
  const cl_ulong n_pad = packed ? ca_round_up((size_t)p->kv_len, key_block) : 0; /* 2^31 near INT_MAX: a long */
  const cl_ulong kt_floats = (cl_ulong)kv_pairs * (cl_ulong)p->head_dim * n_pad;
  const cl_ulong vp_floats = (cl_ulong)kv_pairs * n_pad * ca_round_up((size_t)p->value_dim, 16);
  if (kt_floats * sizeof(float) > ctx->max_alloc || vp_floats * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "fused: packed keys (%llu bytes) or values (%llu bytes) exceed the device's largest allocation "
                   "(%llu bytes)",
                   (unsigned long long)(kt_floats * sizeof(float)), (unsigned long long)(vp_floats * sizeof(float)),
                   (unsigned long long)ctx->max_alloc);
  /* After the size check: a call that cannot run builds nothing */
  ca_program prog;
  const ca_program_key key =
      ca_key_with_mod(ca_fused_key(p->head_dim, p->value_dim, p->dtype, r->k_dtype, r->v_dtype, p->dropout_p > 0.0f), p);
  clattn_status st = ca_plan_program(ctx, &key, l, &prog);
  if (st != CLATTN_OK) return st;
  const int decode = wg && ctx->flash_block && prog.decode_runs && plain && rows_per_kv <= CA_DECODE_KERNEL_ROWS;
  const int block = !decode && wg && ctx->flash_block && plain && prog.block.rm > 0;
  /* rows per work-item (flash_rows*) or per work-group (flash_block,
   * flash_tiled); flash_decode: every row of a KV head */
  const int bm = decode             ? (int)rows_per_kv
                 : block            ? 16 * prog.block.rm
                 : wg               ? wg
                 : !direct          ? ctx->tiles.flash_bm
                 : rows_per_kv <= 1 ? 1
                 : rows_per_kv <= 2 ? 2
                 : rows_per_kv <= 4 ? 4
                                    : 8;
  const size_t group_items = decode ? CA_DECODE_WG : block ? CA_BLOCK_WG : (size_t)wg;
  const size_t row_blocks = (rows_per_kv + (size_t)bm - 1) / (size_t)bm;
  const size_t key_multiple = wg ? GPU_KEY_TILE : key_block;
  /* The diagnostics are not merged across splits, nor are packed
   * sequences' rows mapped by the merge: with either, one pass. */
  const int unsplit = r->diag || p->cu_seqlens_q;
  const ca_splits splits = unsplit ? (ca_splits){p->kv_len, 1, 1, INT_MAX}
                                   : ca_plan_splits(&ctx->caps, group_items, row_blocks * kv_pairs, p->kv_len,
                                                    key_multiple);
  /* partial states for this split, or (a plan's) the most any of its steps takes */
  const int most_keys = l->steps_kv_len > p->kv_len ? l->steps_kv_len : p->kv_len;
  const size_t room = unsplit          ? 1
                      : l->steps_kv_len ? ca_plan_splits_bound(&ctx->caps, group_items, most_keys)
                                        : splits.n_splits;
  const cl_ulong part_o_floats = room > 1 ? (cl_ulong)room * rows_total * (cl_ulong)p->value_dim : 0;
  if (part_o_floats * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "fused: partial states of %zu key splits (%llu bytes) exceed the device's largest allocation", room,
                   (unsigned long long)(part_o_floats * sizeof(float)));

  ca_args_flash_core a;
  ca_bufs_flash_core b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  cl_ulong work_floats = 0;
  a.kt_at = take(&work_floats, kt_floats);
  a.vp_at = take(&work_floats, vp_floats);
  a.part_o_at = take(&work_floats, part_o_floats);
  a.part_lse_at = take(&work_floats, room > 1 ? (cl_ulong)room * rows_total : 0);
  if (work_floats * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "fused: packed K/V and partial states (%llu bytes) exceed the device's largest allocation",
                   (unsigned long long)(work_floats * sizeof(float)));
  const ca_buf work = work_floats ? ca_scratch(ca_list_scratch(l, (size_t)work_floats * sizeof(float), "fused work"))
                                  : ca_mem(NULL);
  CA_FILL_VIEW(b, a, q, &p->q);
  CA_FILL_VIEW(b, a, k, &p->k);
  CA_FILL_VIEW(b, a, v, &p->v);
  CA_FILL_VIEW(b, a, out, &p->out);
  CA_FILL_VIEW(b, a, lse, &p->lse);
  b.work = packed || splits.n_splits > 1 ? work : ca_mem(NULL); /* a plan's step may use none of it */
  b.empty_flag = ca_flag_of(l, p->empty_rows);
  CA_FILL_ROWS(b, a, p);
  CA_FILL_KV(b, a, p);
  a.n_pad = (cl_long)n_pad;
  a.q_heads = p->q_heads;
  a.kv_heads = p->kv_heads;
  a.group = r->group;
  a.q_len = p->q_len;
  a.kv_len = p->kv_len;
  a.scale = r->scale;
  a.softcap = p->softcap;
  a.window_left = r->window_left;
  a.window_right = r->window_right;
  a.split_keys = splits.split_keys;
  a.want_lse = r->want_lse;

  if (packed) {
    ca_args_flash_pack pa;
    ca_bufs_flash_pack pb;
    memset(&pa, 0, sizeof pa);
    memset(&pb, 0, sizeof pb);
    CA_FILL_VIEW(pb, pa, k, &p->k);
    CA_FILL_VIEW(pb, pa, v, &p->v);
    CA_FILL_SEQ(pb, pa, p);
    CA_FILL_KV(pb, pa, p);
    pa.q_len = p->q_len;
    pa.kv_heads = p->kv_heads;
    pa.kv_len = p->kv_len;
    pa.n_pad = (cl_long)n_pad;
    pb.work = work;
    pa.kt_at = a.kt_at;
    pa.vp_at = a.vp_at;
    const size_t global[2] = {(size_t)n_pad, kv_pairs};
    ca_list_kernel(l, prog.program, "flash_pack", 2, global, NULL);
    CA_LIST_ARGS(l, flash_pack, pb, pa);
    /* another kv_len: the packed copies' layout holds while n_pad does */
    ca_list_step_site(l, offsetof(ca_args_flash_pack, kv_len));
    ca_list_step_range(l, (int)(n_pad - key_block + 1), n_pad < INT_MAX ? (int)n_pad : INT_MAX);
  }

  const int core_only = direct && !has_extras(p, r);
  const int step_only = core_only && rest_absent(&b, &a);
  static const char *const direct_names[3][4] = {
      {"flash_rows_direct1", "flash_rows_direct2", "flash_rows_direct4", "flash_rows_direct8"},
      {"flash_rows_direct1_core", "flash_rows_direct2_core", "flash_rows_direct4_core", "flash_rows_direct8_core"},
      {"flash_rows_direct1_step", "flash_rows_direct2_step", "flash_rows_direct4_step", "flash_rows_direct8_step"}};
  const int bm_at = bm == 1 ? 0 : bm == 2 ? 1 : bm == 4 ? 2 : 3;
  const char *kernel = decode   ? "flash_decode"
                       : block  ? "flash_block"
                       : wg     ? "flash_tiled"
                       : direct ? direct_names[core_only + step_only][bm_at]
                                : "flash_rows";
  const size_t global[3] = {wg ? row_blocks * group_items : row_blocks, kv_pairs, splits.n_splits};
  const size_t local[3] = {wg ? group_items : 1, 1, 1};
  ca_list_kernel(l, prog.program, kernel, 3, global, local);
  if (step_only) /* flash_core's leading buffers and the leading part of its struct */
    ca_list_args(l, CA_NBUF(flash_step), (const ca_buf *)&b, sizeof(ca_args_flash_step), &a);
  else
    CA_LIST_ARGS(l, flash_core, b, a);
  /* another kv_len within the splits' range changes kv_len and the one split's keys alone */
  ca_list_step_site(l, offsetof(ca_args_flash_core, kv_len));
  if (splits.n_splits == 1) ca_list_step_site(l, offsetof(ca_args_flash_core, split_keys));
  ca_list_step_range(l, splits.same_lo, splits.same_hi);
  if (!core_only) {
    ca_args_flash_extra x;
    ca_bufs_flash_extra xb;
    memset(&x, 0, sizeof x);
    memset(&xb, 0, sizeof xb);
    CA_FILL_MASK(xb, x, p);
    CA_FILL_BIAS(xb, x, p);
    CA_FILL_SCORE(xb, x, p);
    CA_FILL_ALIBI(xb, x, p);
    CA_FILL_SINKS(xb, x, p);
    CA_FILL_PACKED(xb, x, p);
    CA_FILL_DIAG(xb, x, p, r->diag);
    x.dropout = r->dropout;
    CA_FILL_MOD(xb, x, p);
    CA_LIST_ARGS(l, flash_extra, xb, x);
  }

  if (splits.n_splits > 1) { /* the partial states, [split][b][h][m] rows of value_dim, merged */
    const size_t m = (size_t)p->q_len, h = (size_t)p->q_heads, dv = (size_t)p->value_dim;
    const clattn_merge_params mp = {
        .n_states = (int)splits.n_splits,
        .batch = p->batch,
        .heads = p->q_heads,
        .q_len = p->q_len,
        .value_dim = p->value_dim,
        .o = {NULL, (size_t)a.part_o_at, {h * m * dv, m * dv, dv, 1}},
        .lse = {NULL, (size_t)a.part_lse_at, {h * m, m, 1, 0}},
        .o_state_stride = rows_total * dv,
        .lse_state_stride = rows_total,
        .out = p->out,
        .out_lse = p->lse,
        .empty_rows = p->empty_rows,
        .out_dtype = p->dtype,
    };
    if ((st = ca_plan_merge_into(ctx, &mp, work, work, p->sinks, p->sinks_offset, b.empty_flag, l))) return st;
  }
  return l->error;
}
