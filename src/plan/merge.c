/* Combining partial attention states: the public clattn_merge_states and the
 * split-KV path's last launch share one kernel (cl/merge.cl). */
#include <string.h>

#include "device/program_text.h"
#include "plan/fill.h"

clattn_status ca_plan_merge_into(clattn_context *ctx, const clattn_merge_params *mp, ca_buf o, ca_buf lse,
                                 cl_mem sinks, size_t sinks_offset, ca_buf flag, ca_list *l) {
  ca_program core;
  const ca_program_key key = ca_core_key(mp->out_dtype, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME);
  clattn_status st = ca_program_get(ctx, &key, &core);
  if (st != CLATTN_OK) return st;
  ca_args_merge_states a;
  ca_bufs_merge_states b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  b.o = o;
  a.o = ca_view_of(&mp->o);
  a.o_state = mp->o_state_stride;
  b.lse = lse;
  a.lse = ca_view_of(&mp->lse);
  a.lse_state = mp->lse_state_stride;
  a.n_states = mp->n_states;
  a.value_dim = mp->value_dim;
  a.heads = mp->heads;
  CA_FILL_VIEW(b, a, out, &mp->out);
  CA_FILL_VIEW(b, a, lse_out, &mp->out_lse);
  a.want_lse = mp->out_lse.buf != NULL;
  b.sinks = ca_mem(sinks);
  a.sinks_at = (cl_long)sinks_offset;
  b.empty_flag = flag;
  const size_t global[3] = {((size_t)mp->value_dim + CA_MERGE_COLS - 1) / CA_MERGE_COLS, (size_t)mp->q_len,
                            (size_t)mp->heads * (size_t)mp->batch};
  ca_list_kernel(l, core.program, "merge_states", 3, global, NULL);
  CA_LIST_ARGS(l, merge_states, b, a);
  return l->error;
}

clattn_status ca_plan_merge(clattn_context *ctx, const clattn_merge_params *mp, ca_list *l) {
  l->what = "merge_states";
  const ca_buf flag = ca_flag_of(l, mp->empty_rows);
  return ca_plan_merge_into(ctx, mp, ca_mem(mp->o.buf), ca_mem(mp->lse.buf), NULL, 0, flag, l);
}
