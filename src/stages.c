/* The stages the staged and GEMM paths share: qk_score's scaled, shaped,
 * masked scores of a chunk, and softmax_rows over them. */
#include "internal.h"

clattn_status ca_enqueue_qk_score(clattn_context *ctx, cl_kernel score, cl_mem scores, const clattn_params *p,
                                  const ca_plan *plan, int bh0, int i0, int rows, int heads, cl_uint n_wait,
                                  const cl_event *wait, cl_event *prev) {
  clattn_status st;
  const tl_tiles *t = &ctx->tiles;
  ca_args a = {score, "qk_score", 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&a, &p->q);
  ca_arg_view(&a, &p->k);
  ca_arg_score(&a, p);
  ca_arg_allowed(&a, p);
  ca_arg_kv(&a, p);
  ca_arg_int(&a, p->q_heads);
  ca_arg_int(&a, plan->group);
  ca_arg_int(&a, p->q_len);
  ca_arg_int(&a, p->kv_len);
  ca_arg_int(&a, p->head_dim);
  ca_arg_float(&a, plan->scale);
  ca_arg_shape(&a, p);
  ca_arg_int(&a, plan->window_left);
  ca_arg_int(&a, plan->window_right);
  ca_arg_int(&a, bh0);
  ca_arg_int(&a, i0);
  ca_arg_int(&a, rows);
  ca_arg_mem(&a, scores);
  if ((st = ca_args_done(&a))) return st;
  const size_t local[3] = {(size_t)t->score_tn, (size_t)t->score_tm, 1};
  const size_t global[3] = {ca_round_up((size_t)p->kv_len, t->score_tn), ca_round_up((size_t)rows, t->score_tm),
                            (size_t)heads};
  return ca_enqueue(ctx, score, "qk_score", 3, global, local, n_wait, wait, prev);
}

clattn_status ca_enqueue_softmax(clattn_context *ctx, cl_kernel softmax, cl_mem scores, const clattn_params *p,
                                 const ca_plan *plan, int bh0, int i0, int rows, int heads, cl_mem empty_flag,
                                 cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  clattn_status st;
  ca_args s = {softmax, "softmax_rows", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&s, scores);
  ca_arg_int(&s, p->kv_len);
  ca_arg_seq(&s, p);
  ca_arg_int(&s, p->q_heads);
  ca_arg_int(&s, p->q_len);
  ca_arg_int(&s, bh0);
  ca_arg_int(&s, i0);
  ca_arg_int(&s, rows);
  ca_arg_view(&s, &p->lse);
  ca_arg_int(&s, plan->want_lse);
  ca_arg_view(&s, &p->weights);
  ca_arg_int(&s, plan->want_weights);
  ca_arg_sinks(&s, p);
  ca_arg_mem(&s, plan->dropout);
  ca_arg_diag(&s, p, plan->diag);
  ca_arg_mem(&s, empty_flag);
  if ((st = ca_args_done(&s))) return st;
  const size_t local[3] = {(size_t)ctx->tiles.softmax_wg, 1, 1};
  const size_t global[3] = {(size_t)ctx->tiles.softmax_wg, (size_t)heads * (size_t)rows, 1};
  return ca_enqueue(ctx, softmax, "softmax_rows", 3, global, local, n_wait, wait, prev);
}
