/* What both backward plans launch alike: bwd_store (backward_pass.h). */
#include <string.h>

#include "plan/backward_pass.h"

void ca_plan_bwd_store(ca_list *l, const ca_bwd *w, ca_buf acc, int acc_cols, int col0, int cols, int heads,
                       int key_side, const clattn_tensor *view) {
  const clattn_params *p = w->p;
  ca_args_bwd_store a;
  ca_bufs_bwd_store b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  b.acc = acc;
  a.acc_cols = acc_cols;
  a.col0 = col0;
  a.cols = cols;
  a.heads = heads;
  a.key_side = key_side;
  CA_FILL_SEQ(b, a, p);
  a.q_len = p->q_len;
  a.kv_len = p->kv_len;
  CA_FILL_VIEW(b, a, x, view);
  const size_t global[2] = {(size_t)(key_side ? p->kv_len : p->q_len), (size_t)p->batch * (size_t)heads};
  ca_list_kernel(l, w->program, "bwd_store", 2, global, NULL);
  CA_LIST_ARGS(l, bwd_store, b, a);
}
