/*
 * The fused call at decode shapes on GPUs: flash_decode (cl/decode.cl), one
 * work-group of 64 work-items per (batch, KV head, split) over keys and value
 * columns instead of one row per work-item, then merge_states when the keys
 * were split. The kernel is in the fused program and takes flash_rows'
 * arguments; only the grid and the split plan differ: each split covers its
 * share of the batch row's own length (kv_lens), so the host plans the
 * number of splits from the kv_len bound alone.
 */
#include <stdio.h>

#include "internal.h"
#include "tiles.h"

clattn_status ca_decode_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_program program,
                                cl_uint n_wait, const cl_event *wait, cl_event *done, int *taken) {
  clattn_status st = CLATTN_OK;
  cl_kernel kernel = NULL;
  cl_mem part_o = NULL, part_lse = NULL, empty_flag = NULL;
  cl_event prev = NULL;
  *taken = 0;
  /* Route diagnostics and additive scoring stay with flash_tiled. */
  const size_t rows_per_kv = (size_t)plan->group * (size_t)p->q_len;
  if (plan->diag || p->score == CLATTN_SCORE_ADDITIVE || rows_per_kv > CA_DECODE_KERNEL_ROWS) return CLATTN_OK;
  *taken = 1;
  if ((st = ca_kernel_take(ctx, program, "flash_decode", &kernel))) return st;
  if (done) *done = NULL;

  const size_t kv_pairs = (size_t)p->batch * (size_t)p->kv_heads;
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;
  /* Packed sequences' rows are not mapped by the merge: one pass. */
  const ca_splits splits =
      p->cu_seqlens_q ? (ca_splits){p->kv_len, 1} : ca_plan_splits(&ctx->caps, CA_DECODE_WG, kv_pairs, p->kv_len);
  const size_t n_splits = splits.n_splits;
  if ((st = ca_flag_take(ctx, p->empty_rows, &empty_flag))) goto fail;
  if (n_splits > 1 &&
      ((st = ca_scratch_take(ctx, n_splits * rows_total * (size_t)p->value_dim * sizeof(float),
                             "decode split-KV partial outputs", &part_o)) ||
       (st = ca_scratch_take(ctx, n_splits * rows_total * sizeof(float), "decode split-KV partial lse", &part_lse))))
    goto fail;
  const size_t states = n_splits > 1 ? n_splits * rows_total * ((size_t)p->value_dim + 1) * sizeof(float) : 0;
  ca_note_scratch(ctx, sizeof(cl_int) + states);

  ca_args r = {kernel, "flash_decode", 0, 0, CL_SUCCESS};
  /* no packed copies; split_keys unused: each split follows its batch row's length */
  ca_arg_fused(&r, p, plan, NULL, NULL, 0, splits.split_keys, 0, part_o, part_lse, empty_flag);
  if ((st = ca_args_done(&r))) goto fail;
  const size_t global[3] = {CA_DECODE_WG, kv_pairs, n_splits}, local[3] = {CA_DECODE_WG, 1, 1};
  if ((st = ca_enqueue(ctx, kernel, "flash_decode", 3, global, local, n_wait, wait, &prev))) goto fail;

  if (n_splits > 1 &&
      (st = ca_enqueue_split_merge(ctx, p, n_splits, part_o, part_lse, empty_flag, n_wait, wait, &prev)))
    goto fail;
  st = ca_finish_call(ctx, p->empty_rows, &empty_flag, prev);
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  ca_kernel_give(ctx, kernel);
  ca_scratch_give(ctx, part_o, used);
  ca_scratch_give(ctx, part_lse, used);
  ca_flag_give(ctx, empty_flag, 0, used);
  ca_hand_out(st, &prev, done);
  return st;
}
