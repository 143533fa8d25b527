/*
 * The backward's plan (clattn_backward): cl/backward.cl's passes in order:
 *   (packed sequences: bwd_zero over d_q, d_k, d_v)
 *   bwd_rowdot   D_i = rowsum(dO o O), sinks' per-row terms
 *   fwd.algo FUSED / AUTO, FlashAttention-2's kernels:
 *     bwd_dkdv   dK, dV, one work-item per 16 keys (one float16 lane each)
 *     bwd_dq     dQ, one work-item per 16 query rows (+ additive w's row terms)
 *     or, with deterministic = 0 (and no d_additive_w), FA2's single pass:
 *     bwd_dkdv adds dQ's shares atomically to f32 rows (bwd_fill first,
 *     bwd_store after)
 *   fwd.algo STAGED / GEMM: the staged path (backward_staged.c)
 *   bwd_dbias    d_bias: each pair's dS, summed where the view broadcasts
 *   bwd_sum      d_sinks, d_additive_w in a fixed order
 * Every deterministic pass writes each output element from one work-item
 * in a fixed order, so results are bitwise repeatable; the atomic dQ's
 * last bits depend on scheduling. Scratch is O(B Hq M) (O(B Hq M dk) for
 * d_additive_w and the atomic dQ).
 */
#include <stdint.h>
#include <string.h>

#include "plan/backward_pass.h"

enum { BWD_BN = 16 }; /* keys / rows per work-item: cl/backward.cl's BWD_BN */

/* bwd_zero over a packed gradient view [1, heads, rows, cols]. */
static void zero(ca_list *l, const ca_bwd *w, const clattn_tensor *t, int heads, int rows, int cols) {
  ca_args_bwd_zero a;
  ca_bufs_bwd_zero b;
  CA_FILL_VIEW(b, a, x, t);
  a.rows = rows;
  a.cols = cols;
  const size_t global[2] = {(size_t)rows, (size_t)heads};
  ca_list_kernel(l, w->program, "bwd_zero", 2, global, NULL);
  CA_LIST_ARGS(l, bwd_zero, b, a);
}

/* bwd_fill: x[0 .. n) = 0. */
static void fill(ca_list *l, const ca_bwd *w, ca_buf x, cl_ulong n) {
  const ca_args_bwd_fill a = {n};
  const ca_bufs_bwd_fill b = {x};
  const size_t global[1] = {(size_t)n};
  ca_list_kernel(l, w->program, "bwd_fill", 1, global, NULL);
  CA_LIST_ARGS(l, bwd_fill, b, a);
}

/* bwd_sum: out[c] = sum over a < n_outer, r < n_inner of x[a so + c sc + r si]. */
static void sum(ca_list *l, const ca_bwd *w, ca_buf x, int n_cols, cl_ulong n_outer, cl_ulong n_inner,
                cl_ulong s_outer, cl_ulong s_col, cl_ulong s_inner, cl_mem out) {
  ca_args_bwd_sum a;
  memset(&a, 0, sizeof a); /* the padding too */
  a.n_cols = n_cols;
  a.n_outer = n_outer;
  a.n_inner = n_inner;
  a.s_outer = s_outer;
  a.s_col = s_col;
  a.s_inner = s_inner;
  const ca_bufs_bwd_sum b = {x, ca_mem(out)};
  const size_t global[1] = {(size_t)n_cols};
  ca_list_kernel(l, w->program, "bwd_sum", 1, global, NULL);
  CA_LIST_ARGS(l, bwd_sum, b, a);
}

/* bwd_dbias: each pair's dS, summed over the dimensions d_bias broadcasts. */
static void dbias(ca_list *l, const ca_bwd *w) {
  const clattn_params *p = w->p;
  const int dims[4] = {p->batch, p->q_heads, p->q_len, p->kv_len};
  int summed = 0; /* bit d: the view broadcasts dimension d, which is summed */
  for (int d = 0; d < 4; d++) summed |= w->bp->d_bias.stride[d] == 0 ? 1 << d : 0;
  ca_args_bwd_dbias a;
  ca_bufs_bwd_dbias b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CA_FILL_BWD(b, a, w);
  a.batch = p->batch;
  CA_FILL_VIEW(b, a, d_bias, &w->bp->d_bias);
  a.summed = summed;
  const size_t global[3] = {summed & 8 ? 1 : (size_t)dims[3], summed & 4 ? 1 : (size_t)dims[2],
                            (summed & 1 ? 1 : (size_t)dims[0]) * (summed & 2 ? 1 : (size_t)dims[1])};
  ca_list_kernel(l, w->program, "bwd_dbias", 3, global, NULL);
  CA_LIST_ARGS(l, bwd_dbias, b, a);
}

clattn_status ca_plan_backward(clattn_context *ctx, const clattn_backward_params *bp, ca_list *l) {
  ca_bwd w = {bp, &bp->fwd, {0}, NULL, {0}, {0}, {0}};
  const clattn_params *p = &bp->fwd;
  ca_resolve(ctx, p, &w.r);
  const size_t rows_total = (size_t)p->batch * (size_t)p->q_heads * (size_t)p->q_len;
  const int varlen = p->cu_seqlens_q != NULL;
  const int want_sinks = bp->d_sinks != NULL, want_dw = bp->d_additive_w != NULL;
  /* rows_total fits (each factor is an int, batch * q_heads < 2^31); times head_dim it may not */
  const cl_ulong dw_bytes = want_dw ? (cl_ulong)rows_total * (cl_ulong)p->head_dim * sizeof(float) : 0;
  if (want_dw && (dw_bytes > ctx->max_alloc || dw_bytes > SIZE_MAX))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "backward: d_additive_w's per-row terms (%llu bytes) exceed the device's largest allocation",
                   (unsigned long long)dw_bytes);
  if ((cl_ulong)rows_total * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "backward: per-row scratch exceeds the device's largest allocation");
  const int use_staged = p->algo == CLATTN_ALGO_STAGED || p->algo == CLATTN_ALGO_GEMM;
  /* FA2's single pass: dQ added atomically to f32 rows; d_additive_w's row
   * terms come from bwd_dq, so with them the two deterministic passes run */
  const int use_atomics = !use_staged && !bp->deterministic && !want_dw;
  l->what = use_staged ? "backward staged" : use_atomics ? "backward fa2 atomic dq" : "backward fa2";
  const cl_ulong dq_bytes = use_atomics ? (cl_ulong)rows_total * (cl_ulong)p->head_dim * sizeof(float) : 0;
  if (use_atomics && (dq_bytes > ctx->max_alloc || dq_bytes > SIZE_MAX))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "backward: the atomic dQ's f32 rows (%llu bytes) exceed the device's largest allocation",
                   (unsigned long long)dq_bytes);
  ca_program program;
  const ca_program_key key =
      ca_key_with_mod(ca_backward_key(p->head_dim, p->value_dim, p->dtype, p->dropout_p > 0.0f), p);
  clattn_status st = ca_plan_program(ctx, &key, l, &program);
  if (st != CLATTN_OK) return st;
  w.program = program.program;
  w.dsum = ca_scratch(ca_list_scratch(l, rows_total * sizeof(float), "backward row sums D"));
  w.sinkt = p->sinks ? ca_scratch(ca_list_scratch(l, rows_total * sizeof(float), "backward sink terms")) : ca_mem(NULL);
  w.dw_rows = want_dw ? ca_scratch(ca_list_scratch(l, (size_t)dw_bytes, "backward additive-w row terms"))
                      : ca_mem(NULL);
  const ca_buf dq_acc =
      use_atomics ? ca_scratch(ca_list_scratch(l, (size_t)dq_bytes, "backward atomic dQ rows")) : ca_mem(NULL);

  if (varlen) { /* rows no sequence covers (and rows past q_len / kv_len) still get 0 */
    zero(l, &w, &bp->d_q, p->q_heads, p->total_q, p->head_dim);
    zero(l, &w, &bp->d_k, p->kv_heads, p->total_kv, p->head_dim);
    zero(l, &w, &bp->d_v, p->kv_heads, p->total_kv, p->value_dim);
  }
  {
    ca_args_bwd_rowdot a;
    ca_bufs_bwd_rowdot b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    CA_FILL_BWD(b, a, &w);
    const size_t global[2] = {(size_t)p->q_len, (size_t)p->batch * (size_t)p->q_heads};
    ca_list_kernel(l, w.program, "bwd_rowdot", 2, global, NULL);
    CA_LIST_ARGS(l, bwd_rowdot, b, a);
  }
  if (use_staged) {
    if ((st = ca_plan_backward_staged(ctx, &w, l))) return st;
  } else {
    const size_t row_blocks[2] = {((size_t)p->q_len + BWD_BN - 1) / BWD_BN, (size_t)p->batch * (size_t)p->q_heads};
    const size_t key_blocks[2] = {((size_t)p->kv_len + BWD_BN - 1) / BWD_BN, (size_t)p->batch * (size_t)p->kv_heads};
    /* One work-item per group where the fused kernel runs so too (CPUs):
     * POCL then runs each item's 16-wide code as written instead of
     * vectorising its loops across work-items. */
    const size_t one[2] = {1, 1};
    const size_t *block_local = ctx->tiles.flash_wg ? NULL : one;
    if (use_atomics) fill(l, &w, dq_acc, (cl_ulong)rows_total * (cl_ulong)p->head_dim);
    ca_args_bwd_dkdv a;
    ca_bufs_bwd_dkdv b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    CA_FILL_BWD(b, a, &w);
    CA_FILL_VIEW(b, a, d_k, &bp->d_k);
    CA_FILL_VIEW(b, a, d_v, &bp->d_v);
    b.dq_acc = dq_acc;
    a.dq_atomic = use_atomics;
    ca_list_kernel(l, w.program, "bwd_dkdv", 2, key_blocks, block_local);
    CA_LIST_ARGS(l, bwd_dkdv, b, a);
    if (use_atomics) {
      ca_plan_bwd_store(l, &w, dq_acc, p->head_dim, 0, p->head_dim, p->q_heads, 0, &bp->d_q);
    } else {
      ca_args_bwd_dq qa;
      ca_bufs_bwd_dq qb;
      memset(&qa, 0, sizeof qa);
      memset(&qb, 0, sizeof qb);
      CA_FILL_BWD(qb, qa, &w);
      CA_FILL_VIEW(qb, qa, d_q, &bp->d_q);
      qb.dw_rows = w.dw_rows;
      qa.want_dw = want_dw;
      ca_list_kernel(l, w.program, "bwd_dq", 2, row_blocks, block_local);
      CA_LIST_ARGS(l, bwd_dq, qb, qa);
    }
  }
  if (bp->d_bias.buf) dbias(l, &w);
  const cl_ulong m = (cl_ulong)p->q_len, hq = (cl_ulong)p->q_heads;
  if (want_sinks) /* d_sinks[h] = sum over b, then i, of sinkt[(b Hq + h) M + i] */
    sum(l, &w, w.sinkt, p->q_heads, (cl_ulong)p->batch, m, hq * m, m, 1, bp->d_sinks);
  if (want_dw) /* d_w[t] = sum over rows r of dw_rows[r dk + t] */
    sum(l, &w, w.dw_rows, p->head_dim, 1, (cl_ulong)rows_total, 0, 1, (cl_ulong)p->head_dim, bp->d_additive_w);
  return l->error;
}
