/*
 * What the backward's two plans share (backward.c, backward_staged.c): the
 * program, the resolved forward call and the per-row scratch (D_i, sinks'
 * terms, d_additive_w's row terms), cl/args.h.cl's bwd group, which every
 * pass of both takes first, and bwd_store (backward_pass.c).
 */
#ifndef CLATTN_PLAN_BACKWARD_PASS_H
#define CLATTN_PLAN_BACKWARD_PASS_H

#include "plan/fill.h"

typedef struct {
  const clattn_backward_params *bp;
  const clattn_params *p; /* bp->fwd as the passes read it */
  ca_resolved r;
  cl_program program;
  ca_buf dsum, sinkt, dw_rows; /* dw_rows: with d_additive_w, else absent */
} ca_bwd;

/* The bwd group of a pass's arguments (b, a: ca_bufs_F, ca_args_F of a bwd family). */
#define CA_FILL_BWD(b, a, w)                                                                            \
  do {                                                                                                  \
    const clattn_params *fp_ = (w)->p;                                                                  \
    CA_FILL_VIEW(b, a, q, &fp_->q);                                                                     \
    CA_FILL_VIEW(b, a, k, &fp_->k);                                                                     \
    CA_FILL_VIEW(b, a, v, &fp_->v);                                                                     \
    CA_FILL_VIEW(b, a, o, &fp_->out);                                                                   \
    CA_FILL_VIEW(b, a, d_o, &(w)->bp->d_out);                                                           \
    CA_FILL_VIEW(b, a, lse, &fp_->lse);                                                                 \
    CA_FILL_SCORE(b, a, fp_);                                                                           \
    CA_FILL_MASK(b, a, fp_);                                                                            \
    CA_FILL_BIAS(b, a, fp_);                                                                            \
    CA_FILL_SEQ(b, a, fp_);                                                                             \
    (a).q_heads = fp_->q_heads, (a).kv_heads = fp_->kv_heads, (a).group = (w)->r.group;                 \
    (a).q_len = fp_->q_len, (a).kv_len = fp_->kv_len, (a).scale = (w)->r.scale, (a).softcap = fp_->softcap; \
    CA_FILL_ALIBI(b, a, fp_);                                                                           \
    CA_FILL_SINKS(b, a, fp_);                                                                           \
    (a).window_left = (w)->r.window_left, (a).window_right = (w)->r.window_right;                       \
    (b).dsum = (w)->dsum, (b).sinkt = (w)->sinkt, (a).dropout = (w)->r.dropout;                          \
    CA_FILL_MOD(b, a, fp_);                                                                             \
  } while (0)

/* bwd_store: f32 accumulators acc [batch * heads][len][acc_cols] (columns
 * col0 .. col0 + cols - 1) to a gradient view; len is q_len (key_side 0)
 * or kv_len. */
void ca_plan_bwd_store(ca_list *l, const ca_bwd *w, ca_buf acc, int acc_cols, int col0, int cols, int heads,
                       int key_side, const clattn_tensor *view);
/* The staged path's passes after bwd_rowdot: dQ (and with dw_rows,
 * d_additive_w's row terms), dK and dV, its scratch chunked to the
 * context's budget. */
clattn_status ca_plan_backward_staged(clattn_context *ctx, const ca_bwd *w, ca_list *l);

#endif
