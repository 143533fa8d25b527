/*
 * The fused path, as ca_plan_fused planned it (plan.c): flash_pack first
 * where the plan packs K and V (K transposed, V padded), then the planned
 * kernel (flash_rows*, flash_block, flash_tiled or flash_decode: one pass over
 * the keys with the online softmax), then, when the keys were split,
 * merge_states. Scratch is O(N d): nothing proportional to M x N is ever
 * allocated.
 */
#include "internal.h"

clattn_status ca_fused_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan,
                               const ca_fused_launch *l, cl_uint n_wait, const cl_event *wait, cl_event *done) {
  clattn_status st = CLATTN_OK;
  ca_args pack = {0}, rows = {0}; /* the kernels, with the argument values they hold */
  cl_mem kt = NULL, vp = NULL, part_o = NULL, part_lse = NULL, empty_flag = NULL;
  cl_event prev = NULL;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  const size_t kv_pairs = (size_t)p->batch * (size_t)p->kv_heads;
  const size_t n_splits = l->splits.n_splits;
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;
  if (done) *done = NULL;

  if ((st = ca_kernel_take_args(ctx, l->program, l->kernel, &rows)) ||
      (st = ca_flag_take(ctx, p->empty_rows, &deps, &empty_flag)))
    goto fail;
  if (l->packed && ((st = ca_kernel_take_args(ctx, l->program, "flash_pack", &pack)) ||
                    (st = ca_scratch_take(ctx, (size_t)l->kt_bytes, "fused packed keys", &deps, &kt)) ||
                    (st = ca_scratch_take(ctx, (size_t)l->vp_bytes, "fused packed values", &deps, &vp))))
    goto fail;
  if (n_splits > 1 &&
      ((st = ca_scratch_take(ctx, n_splits * rows_total * (size_t)p->value_dim * sizeof(float),
                             "split-KV partial outputs", &deps, &part_o)) ||
       (st = ca_scratch_take(ctx, n_splits * rows_total * sizeof(float), "split-KV partial lse", &deps, &part_lse))))
    goto fail;
  ca_note_scratch(ctx, (size_t)(l->kt_bytes + l->vp_bytes) + sizeof(cl_int) +
                           (n_splits > 1 ? n_splits * rows_total * ((size_t)p->value_dim + 1) * sizeof(float) : 0));
  if ((st = ca_deps_list(&deps, &n_wait, &wait))) goto fail; /* the first command's wait list */

  if (l->packed) {
    ca_arg_pack(&pack, p, l->n_pad, kt, vp, NULL);
    if ((st = ca_args_done(&pack))) goto fail;
    const size_t pack_global[2] = {(size_t)l->n_pad, kv_pairs};
    if ((st = ca_enqueue(ctx, pack.kernel, "flash_pack", 2, pack_global, NULL, n_wait, wait, &prev))) goto fail;
  }

  ca_arg_fused(&rows, p, plan, kt, vp, l->n_pad, l->splits.split_keys, plan->diag, part_o, part_lse, empty_flag, NULL);
  if ((st = ca_args_done(&rows))) goto fail;
  if ((st = ca_enqueue(ctx, rows.kernel, l->kernel, 3, l->global, l->local, n_wait, wait, &prev))) goto fail;

  if (n_splits > 1 &&
      (st = ca_enqueue_split_merge(ctx, p, n_splits, part_o, part_lse, empty_flag, n_wait, wait, &prev)))
    goto fail;
  st = ca_finish_call(ctx, p->empty_rows, &empty_flag, prev);
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  ca_kernel_give(ctx, pack.kernel);
  ca_kernel_give(ctx, rows.kernel);
  ca_scratch_give(ctx, kt, used);
  ca_scratch_give(ctx, vp, used);
  ca_scratch_give(ctx, part_o, used);
  ca_scratch_give(ctx, part_lse, used);
  ca_flag_give(ctx, empty_flag, 0, used);
  ca_deps_release(&deps);
  ca_hand_out(st, &prev, done);
  return st;
}
