/* Combining partial attention states: the public clattn_merge_states and the
 * split-KV path's final step share one kernel (cl/merge.cl). */
#include "internal.h"
#include "program_text.h"

void ca_arg_merge(ca_args *a, const clattn_merge_params *mp, cl_mem sinks, size_t sinks_offset, cl_mem empty_flag,
                  ca_merge_slots *slots) {
  cl_ulong o_state = mp->o_state_stride, lse_state = mp->lse_state_stride;
  ca_arg_view(a, &mp->o);
  ca_arg(a, sizeof o_state, &o_state);
  ca_arg_view(a, &mp->lse);
  ca_arg(a, sizeof lse_state, &lse_state);
  if (slots) slots->n_states = a->index;
  ca_arg_int(a, mp->n_states);
  ca_arg_int(a, mp->value_dim);
  ca_arg_int(a, mp->heads);
  if (slots) slots->out_off = a->index + 1; /* a view: buffer, offset, strides */
  ca_arg_view(a, &mp->out);
  if (slots) slots->lse_off = a->index + 1;
  ca_arg_view(a, &mp->out_lse);
  ca_arg_int(a, mp->out_lse.buf != NULL);
  ca_arg_mem(a, sinks);
  const cl_long sinks_at = sinks ? (cl_long)sinks_offset : -1; /* cl/common.h.cl's ca_sink */
  ca_arg(a, sizeof sinks_at, &sinks_at);
  ca_arg_mem(a, empty_flag);
}

void ca_merge_global(const clattn_merge_params *mp, size_t global[3]) {
  global[0] = ((size_t)mp->value_dim + CA_MERGE_COLS - 1) / CA_MERGE_COLS;
  global[1] = (size_t)mp->q_len;
  global[2] = (size_t)mp->heads * (size_t)mp->batch;
}

clattn_status ca_enqueue_merge(clattn_context *ctx, const clattn_merge_params *mp, cl_mem sinks, size_t sinks_offset,
                               cl_mem empty_flag,
                               cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  ca_args a = {0};
  cl_program core = NULL;
  clattn_status st = ca_core_program(ctx, mp->out_dtype, &core);
  if (st == CLATTN_OK) st = ca_kernel_take_args(ctx, core, "merge_states", &a);
  if (st != CLATTN_OK) return st;
  ca_arg_merge(&a, mp, sinks, sinks_offset, empty_flag, NULL);
  size_t global[3];
  ca_merge_global(mp, global);
  if ((st = ca_args_done(&a)) == CLATTN_OK)
    st = ca_enqueue(ctx, a.kernel, "merge_states", 3, global, NULL, n_wait, wait, prev);
  ca_kernel_give(ctx, a.kernel);
  return st;
}

clattn_merge_params ca_split_merge_params(const clattn_params *p, size_t n_splits, cl_mem part_o, cl_mem part_lse) {
  const size_t m = (size_t)p->q_len, h = (size_t)p->q_heads, dv = (size_t)p->value_dim;
  const size_t rows_total = (size_t)p->batch * h * m;
  return (clattn_merge_params){
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
      .out_dtype = p->dtype,
  };
}

clattn_status ca_enqueue_split_merge(clattn_context *ctx, const clattn_params *p, size_t n_splits, cl_mem part_o,
                                     cl_mem part_lse, cl_mem flag, cl_uint n_wait, const cl_event *wait,
                                     cl_event *prev) {
  const clattn_merge_params mp = ca_split_merge_params(p, n_splits, part_o, part_lse);
  return ca_enqueue_merge(ctx, &mp, p->sinks, p->sinks_offset, flag, n_wait, wait, prev);
}

clattn_status clattn_merge_states(clattn_context *ctx, const clattn_merge_params *mp, cl_uint n_wait,
                                  const cl_event *wait, cl_event *done) {
  cl_mem flag = NULL;
  cl_event last = NULL;
  if (done) *done = NULL;
  if (n_wait > 0 && !wait)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_merge_states: n_wait is %u but wait is NULL", n_wait);
  clattn_status st = ca_validate_merge(ctx, mp);
  if (st != CLATTN_OK) return st;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  ca_route_begin("merge_states");
  if (st == CLATTN_OK) st = ca_flag_take(ctx, mp->empty_rows, &deps, &flag);
  if (st == CLATTN_OK) st = ca_deps_list(&deps, &n_wait, &wait);
  if (st == CLATTN_OK) st = ca_enqueue_merge(ctx, mp, NULL, 0, flag, n_wait, wait, &last);
  if (st == CLATTN_OK) st = ca_finish_call(ctx, mp->empty_rows, &flag, last);
  ca_flag_give(ctx, flag, 0, NULL); /* a failed call's */
  ca_deps_release(&deps);
  ca_hand_out(st, &last, done);
  return st;
}
