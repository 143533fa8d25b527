/* Launching cl/backward.cl's shared passes (BWD_ARGS, bwd_zero, bwd_fill,
 * bwd_store, bwd_sum), which the FA2 passes (backward.c) and the staged
 * path (backward_staged.c) both enqueue. */
#include "backward.h"

void ca_backward_args(ca_args *a, const clattn_params *p, const ca_plan *plan, const clattn_backward_params *bp,
                      cl_mem dsum, cl_mem sinkt) {
  ca_arg_view(a, &p->q);
  ca_arg_view(a, &p->k);
  ca_arg_view(a, &p->v);
  ca_arg_view(a, &p->out);
  ca_arg_view(a, &bp->d_out);
  ca_arg_view(a, &p->lse);
  ca_arg_score(a, p);
  ca_arg_allowed(a, p);
  ca_arg_int(a, p->q_heads);
  ca_arg_int(a, p->kv_heads);
  ca_arg_int(a, plan->group);
  ca_arg_int(a, p->q_len);
  ca_arg_int(a, p->kv_len);
  ca_arg_float(a, plan->scale);
  ca_arg_shape(a, p);
  ca_arg_sinks(a, p);
  ca_arg_int(a, plan->window_left);
  ca_arg_int(a, plan->window_right);
  ca_arg_mem(a, dsum);
  ca_arg_mem(a, sinkt);
  ca_arg_mem(a, plan->dropout);
}

clattn_status ca_backward_zero(clattn_context *ctx, cl_kernel zero, const clattn_tensor *t, int heads, int rows,
                               int cols, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  ca_args a = {zero, "bwd_zero", 0, 0, CL_SUCCESS, NULL};
  ca_arg_view(&a, t);
  ca_arg_int(&a, rows);
  ca_arg_int(&a, cols);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[2] = {(size_t)rows, (size_t)heads};
  return ca_enqueue(ctx, zero, "bwd_zero", 2, global, NULL, n_wait, wait, prev);
}

clattn_status ca_backward_fill(clattn_context *ctx, cl_kernel fill, cl_mem x, cl_ulong n, cl_uint n_wait,
                               const cl_event *wait, cl_event *prev) {
  ca_args a = {fill, "bwd_fill", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&a, x);
  ca_arg(&a, sizeof n, &n);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[1] = {(size_t)n};
  return ca_enqueue(ctx, fill, "bwd_fill", 1, global, NULL, n_wait, wait, prev);
}

clattn_status ca_backward_store(clattn_context *ctx, cl_kernel store, cl_mem acc, int acc_cols, int col0, int cols,
                                int heads, int key_side, const clattn_params *p, const clattn_tensor *view,
                                cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  ca_args a = {store, "bwd_store", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&a, acc);
  ca_arg_int(&a, acc_cols);
  ca_arg_int(&a, col0);
  ca_arg_int(&a, cols);
  ca_arg_int(&a, heads);
  ca_arg_int(&a, key_side);
  ca_arg_seq(&a, p);
  ca_arg_int(&a, p->q_len);
  ca_arg_int(&a, p->kv_len);
  ca_arg_view(&a, view);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[2] = {(size_t)(key_side ? p->kv_len : p->q_len), (size_t)p->batch * (size_t)heads};
  return ca_enqueue(ctx, store, "bwd_store", 2, global, NULL, n_wait, wait, prev);
}

clattn_status ca_backward_dbias(clattn_context *ctx, cl_kernel dbias, const clattn_params *p, const ca_plan *plan,
                                const clattn_backward_params *bp, cl_mem dsum, cl_mem sinkt, cl_uint n_wait,
                                const cl_event *wait, cl_event *prev) {
  const int dims[4] = {p->batch, p->q_heads, p->q_len, p->kv_len};
  int summed = 0; /* bit d: the view broadcasts dimension d, which is summed */
  for (int d = 0; d < 4; d++) summed |= bp->d_bias.stride[d] == 0 ? 1 << d : 0;
  ca_args a = {dbias, "bwd_dbias", 0, 0, CL_SUCCESS, NULL};
  ca_backward_args(&a, p, plan, bp, dsum, sinkt);
  ca_arg_int(&a, p->batch);
  ca_arg_view(&a, &bp->d_bias);
  ca_arg_int(&a, summed);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[3] = {summed & 8 ? 1 : (size_t)dims[3], summed & 4 ? 1 : (size_t)dims[2],
                            (summed & 1 ? 1 : (size_t)dims[0]) * (summed & 2 ? 1 : (size_t)dims[1])};
  return ca_enqueue(ctx, dbias, "bwd_dbias", 3, global, NULL, n_wait, wait, prev);
}

clattn_status ca_backward_sum(clattn_context *ctx, cl_kernel sum, cl_mem x, int n_cols, cl_ulong n_outer,
                              cl_ulong n_inner, cl_ulong s_outer, cl_ulong s_col, cl_ulong s_inner, cl_mem out,
                              cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  ca_args a = {sum, "bwd_sum", 0, 0, CL_SUCCESS, NULL};
  ca_arg_mem(&a, x);
  ca_arg_int(&a, n_cols);
  ca_arg(&a, sizeof n_outer, &n_outer);
  ca_arg(&a, sizeof n_inner, &n_inner);
  ca_arg(&a, sizeof s_outer, &s_outer);
  ca_arg(&a, sizeof s_col, &s_col);
  ca_arg(&a, sizeof s_inner, &s_inner);
  ca_arg_mem(&a, out);
  clattn_status st = ca_args_done(&a);
  if (st) return st;
  const size_t global[1] = {(size_t)n_cols};
  return ca_enqueue(ctx, sum, "bwd_sum", 1, global, NULL, n_wait, wait, prev);
}
