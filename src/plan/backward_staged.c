/*
 * The staged backward (fwd.algo STAGED or GEMM): per chunk of query rows
 * (ca_plan_chunks, for two score-sized arrays P and G in the context's
 * scratch budget), cl/backward_staged.cl's
 *   bwds_pairs   P = exp(S - lse), G = P (dO Vᵀ - D) dshape
 *   bwds_dq      dQ = G dscore/dq                (whole for the chunk's rows)
 *   bwds_dkdv    dK += Gᵀ dscore/dk, dV += Pᵀ dO   (f32 accumulators)
 * each a tiled product in local memory (the staged forward's way),
 * then bwd_store writes the accumulators to d_k and d_v. S is the forward's
 * shaped score recomputed (softcap, bias, ALiBi, mask, window, kv_lens,
 * additive scoring), so every feature of the fused backward holds here;
 * GQA sums the group's heads in head order and rows in order: bitwise
 * repeatable. A second path beside the FA2 kernels, and a cross-check of
 * them: it shares only bwd_rowdot (D, sinks' terms) and bwd_sum.
 */
#include <stdint.h>
#include <string.h>

#include "plan/backward_pass.h"

enum { BS_TM = 8, BS_TN = 16 }; /* cl/backward_staged.cl's work-group tiles */

clattn_status ca_plan_backward_staged(clattn_context *ctx, const ca_bwd *w, ca_list *l) {
  const clattn_params *p = w->p;
  const clattn_backward_params *bp = w->bp;
  const ca_chunk chunk = ca_plan_chunks(p, ctx->scratch_budget / 2);
  const cl_ulong pair_bytes = (cl_ulong)chunk.heads * (cl_ulong)chunk.rows * (cl_ulong)p->kv_len * sizeof(float);
  const int pairs = p->batch * p->q_heads, dk = p->head_dim, dv = p->value_dim;
  const cl_ulong acc_elems = (cl_ulong)p->batch * (cl_ulong)p->kv_heads * (cl_ulong)p->kv_len * (cl_ulong)(dk + dv);
  if (pair_bytes > ctx->max_alloc || pair_bytes > SIZE_MAX)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "staged backward: one row of weights (%llu bytes) exceeds the device's largest allocation",
                   (unsigned long long)pair_bytes);
  if (acc_elems * sizeof(float) > ctx->max_alloc || acc_elems * sizeof(float) > SIZE_MAX)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "staged backward: the f32 dK, dV accumulators (%llu bytes) exceed the device's largest allocation",
                   (unsigned long long)(acc_elems * sizeof(float)));
  const ca_buf pw = ca_scratch(ca_list_scratch(l, (size_t)pair_bytes, "staged backward weights P"));
  const ca_buf gw = ca_scratch(ca_list_scratch(l, (size_t)pair_bytes, "staged backward score gradients G"));
  const ca_buf acc =
      ca_scratch(ca_list_scratch(l, (size_t)(acc_elems * sizeof(float)), "staged backward dK, dV accumulators"));
  {
    const ca_args_bwd_fill a = {acc_elems};
    const ca_bufs_bwd_fill b = {acc};
    const size_t global[1] = {(size_t)acc_elems};
    ca_list_kernel(l, w->program, "bwd_fill", 1, global, NULL);
    CA_LIST_ARGS(l, bwd_fill, b, a);
  }
  ca_args_bwds_pairs pa;
  ca_bufs_bwds_pairs pb;
  ca_args_bwds_dq qa;
  ca_bufs_bwds_dq qb;
  ca_args_bwds_dkdv ka;
  ca_bufs_bwds_dkdv kb;
  memset(&pa, 0, sizeof pa);
  memset(&pb, 0, sizeof pb);
  memset(&qa, 0, sizeof qa);
  memset(&qb, 0, sizeof qb);
  memset(&ka, 0, sizeof ka);
  memset(&kb, 0, sizeof kb);
  CA_FILL_BWD(pb, pa, w);
  CA_FILL_BWD(qb, qa, w);
  CA_FILL_BWD(kb, ka, w);
  pb.pw = pw;
  pb.gw = gw;
  qb.gw = gw;
  CA_FILL_VIEW(qb, qa, d_q, &bp->d_q);
  qb.dw_rows = w->dw_rows;
  qa.want_dw = bp->d_additive_w != NULL;
  kb.pw = pw;
  kb.gw = gw;
  kb.acc = acc;
  const size_t tile[3] = {BS_TN, BS_TM, 1};
  const size_t col_tiles = (size_t)((dk + BS_TN - 1) / BS_TN + (dv + BS_TN - 1) / BS_TN); /* dK's, then dV's */
  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs && !l->error; bh0 += heads) {
    heads = chunk.heads < pairs - bh0 ? chunk.heads : pairs - bh0;
    const size_t kv_pairs = (size_t)((bh0 + heads - 1) / w->r.group - bh0 / w->r.group + 1);
    for (int i0 = 0, rows; i0 < p->q_len && !l->error; i0 += rows) {
      rows = chunk.rows < p->q_len - i0 ? chunk.rows : p->q_len - i0;
      CA_FILL_CHUNK(pa, bh0, i0, rows);
      const size_t pair_global[3] = {ca_round_up((size_t)p->kv_len, BS_TN), ca_round_up((size_t)rows, BS_TM),
                                     (size_t)heads};
      ca_list_kernel(l, w->program, "bwds_pairs", 3, pair_global, tile);
      CA_LIST_ARGS(l, bwds_pairs, pb, pa);
      CA_FILL_CHUNK(qa, bh0, i0, rows);
      const size_t dq_global[3] = {ca_round_up((size_t)dk, BS_TN), ca_round_up((size_t)rows, BS_TM), (size_t)heads};
      ca_list_kernel(l, w->program, "bwds_dq", 3, dq_global, tile);
      CA_LIST_ARGS(l, bwds_dq, qb, qa);
      CA_FILL_CHUNK(ka, bh0, i0, rows);
      ka.heads = heads;
      const size_t kv_global[3] = {col_tiles * BS_TN, ca_round_up((size_t)p->kv_len, BS_TM), kv_pairs};
      ca_list_kernel(l, w->program, "bwds_dkdv", 3, kv_global, tile);
      CA_LIST_ARGS(l, bwds_dkdv, kb, ka);
    }
  }
  ca_plan_bwd_store(l, w, acc, dk + dv, 0, dk, p->kv_heads, 1, &bp->d_k);
  ca_plan_bwd_store(l, w, acc, dk + dv, dk, dv, p->kv_heads, 1, &bp->d_v);
  return l->error;
}
