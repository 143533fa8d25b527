/*
 * The staged path: qk_score -> softmax_rows -> mix, over chunks of query
 * rows (ca_plan_chunks) so the score scratch stays under the context's
 * budget whatever M and N are.
 */
#include <stdint.h>
#include <stdio.h>

#include "internal.h"

clattn_status ca_staged_forward(clattn_context *ctx, const clattn_params *p, const ca_plan *plan, cl_uint n_wait,
                                const cl_event *wait, cl_event *done) {
  clattn_status st = CLATTN_OK;
  cl_kernel score = NULL, softmax = NULL, mix = NULL;
  cl_mem scratch = NULL, empty_flag = NULL;
  cl_event prev = NULL;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  const tl_tiles *t = &ctx->tiles;
  const int pairs = p->batch * p->q_heads;
  const ca_chunk chunk = plan->chunk;

  if (done) *done = NULL;
  cl_program core = NULL;
  size_t scratch_bytes = (size_t)chunk.heads * (size_t)chunk.rows * (size_t)p->kv_len * sizeof(float);
  if ((st = ca_core_program_kv(ctx, p->dtype, plan->k_dtype, plan->v_dtype, &core)) ||
      (st = ca_kernel_take(ctx, core, "qk_score", &score)) ||
      (st = ca_kernel_take(ctx, core, "softmax_rows", &softmax)) ||
      (st = ca_kernel_take(ctx, core, "mix_values", &mix)) ||
      (st = ca_scratch_take(ctx, scratch_bytes, "staged score scratch", &deps, &scratch)) ||
      (st = ca_flag_take(ctx, p->empty_rows, &deps, &empty_flag)) ||
      (st = ca_deps_list(&deps, &n_wait, &wait))) /* the first command's wait list */
    goto fail;
  ca_note_scratch(ctx, scratch_bytes + sizeof(cl_int));

  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs; bh0 += heads) {
    heads = chunk.heads < pairs - bh0 ? chunk.heads : pairs - bh0;
    for (int i0 = 0, rows; i0 < p->q_len; i0 += rows) {
      rows = chunk.rows < p->q_len - i0 ? chunk.rows : p->q_len - i0;

      if ((st = ca_enqueue_qk_score(ctx, score, scratch, p, plan, bh0, i0, rows, heads, n_wait, wait, &prev)))
        goto fail;

      if ((st = ca_enqueue_softmax(ctx, softmax, scratch, p, plan, bh0, i0, rows, heads, empty_flag, n_wait, wait,
                                   &prev)))
        goto fail;

      ca_args m = {mix, "mix_values", 0, 0, CL_SUCCESS, NULL};
      ca_arg_mem(&m, scratch);
      ca_arg_view(&m, &p->v);
      ca_arg_seq(&m, p);
      ca_arg_kv(&m, p);
      ca_arg_int(&m, p->q_heads);
      ca_arg_int(&m, plan->group);
      ca_arg_int(&m, p->q_len);
      ca_arg_int(&m, p->kv_len);
      ca_arg_int(&m, p->value_dim);
      ca_arg_int(&m, bh0);
      ca_arg_int(&m, i0);
      ca_arg_int(&m, rows);
      ca_arg_view(&m, &p->out);
      if ((st = ca_args_done(&m))) goto fail;
      const size_t mix_local[3] = {(size_t)t->mix_tv, (size_t)t->mix_tm, 1};
      const size_t mix_global[3] = {ca_round_up((size_t)p->value_dim, t->mix_tv), ca_round_up((size_t)rows, t->mix_tm),
                                    (size_t)heads};
      if ((st = ca_enqueue(ctx, mix, "mix_values", 3, mix_global, mix_local, n_wait, wait, &prev))) goto fail;
    }
  }

  st = ca_finish_call(ctx, p->empty_rows, &empty_flag, prev);
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  ca_scratch_give(ctx, scratch, used);
  ca_flag_give(ctx, empty_flag, 0, used);
  ca_kernel_give(ctx, score);
  ca_kernel_give(ctx, softmax);
  ca_kernel_give(ctx, mix);
  ca_deps_release(&deps);
  ca_hand_out(st, &prev, done);
  return st;
}
