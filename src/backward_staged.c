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

#include "backward.h"

enum { BS_TM = 8, BS_TN = 16 }; /* cl/backward_staged.cl's work-group tiles */

clattn_status ca_backward_staged_init(clattn_context *ctx, cl_program program, const clattn_params *p,
                                      ca_backward_staged *s, ca_deps *deps, size_t *scratch_bytes) {
  clattn_status st = CLATTN_OK;
  *s = (ca_backward_staged){0};
  s->chunk = ca_plan_chunks(p, ctx->scratch_budget / 2);
  const cl_ulong pair_bytes = (cl_ulong)s->chunk.heads * (cl_ulong)s->chunk.rows * (cl_ulong)p->kv_len * sizeof(float);
  const cl_ulong acc_bytes = (cl_ulong)p->batch * (cl_ulong)p->kv_heads * (cl_ulong)p->kv_len *
                             (cl_ulong)(p->head_dim + p->value_dim) * sizeof(float);
  if (pair_bytes > ctx->max_alloc || pair_bytes > SIZE_MAX)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "staged backward: one row of weights (%llu bytes) exceeds the device's "
                   "largest allocation",
                   (unsigned long long)pair_bytes);
  if (acc_bytes > ctx->max_alloc || acc_bytes > SIZE_MAX)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "staged backward: the f32 dK, dV accumulators (%llu bytes) exceed the "
                   "device's largest allocation",
                   (unsigned long long)acc_bytes);
  if ((st = ca_kernel_take(ctx, program, "bwds_pairs", &s->pairs)) ||
      (st = ca_kernel_take(ctx, program, "bwds_dq", &s->dq)) ||
      (st = ca_kernel_take(ctx, program, "bwds_dkdv", &s->dkdv)) ||
      (st = ca_kernel_take(ctx, program, "bwd_fill", &s->fill)) ||
      (st = ca_kernel_take(ctx, program, "bwd_store", &s->store)) ||
      (st = ca_scratch_take(ctx, (size_t)pair_bytes, "staged backward weights P", deps, &s->pw)) ||
      (st = ca_scratch_take(ctx, (size_t)pair_bytes, "staged backward score gradients G", deps, &s->gw)) ||
      (st = ca_scratch_take(ctx, (size_t)acc_bytes, "staged backward dK, dV accumulators", deps, &s->acc))) {
    ca_backward_staged_release(ctx, s, NULL);
    return st;
  }
  *scratch_bytes += (size_t)(2 * pair_bytes + acc_bytes);
  return CLATTN_OK;
}

void ca_backward_staged_release(clattn_context *ctx, ca_backward_staged *s, cl_event last_use) {
  const cl_kernel kernels[] = {s->pairs, s->dq, s->dkdv, s->fill, s->store};
  for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) ca_kernel_give(ctx, kernels[i]);
  const cl_mem bufs[] = {s->pw, s->gw, s->acc};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ca_scratch_give(ctx, bufs[i], last_use);
  *s = (ca_backward_staged){0};
}

/* The chunk's position: its first (batch, head) pair, first row and rows. */
static void arg_chunk(ca_args *a, int bh0, int i0, int rows) {
  ca_arg_int(a, bh0);
  ca_arg_int(a, i0);
  ca_arg_int(a, rows);
}

clattn_status ca_backward_staged_run(clattn_context *ctx, const ca_backward_staged *s, const clattn_params *p,
                                     const ca_plan *plan, const clattn_backward_params *bp, cl_mem dsum, cl_mem sinkt,
                                     cl_mem dw_rows, cl_uint n_wait, const cl_event *wait, cl_event *prev) {
  clattn_status st;
  const int pairs = p->batch * p->q_heads, dk = p->head_dim, dv = p->value_dim;
  const size_t tile[3] = {BS_TN, BS_TM, 1};
  const size_t col_tiles = (size_t)((dk + BS_TN - 1) / BS_TN + (dv + BS_TN - 1) / BS_TN); /* dK's, then dV's */
  const cl_ulong acc_elems = (cl_ulong)p->batch * (cl_ulong)p->kv_heads * (cl_ulong)p->kv_len * (cl_ulong)(dk + dv);
  if ((st = ca_backward_fill(ctx, s->fill, s->acc, acc_elems, n_wait, wait, prev))) return st;
  /* Step by what was done, not by the chunk: i0 + chunk.rows can pass INT_MAX. */
  for (int bh0 = 0, heads; bh0 < pairs; bh0 += heads) {
    heads = s->chunk.heads < pairs - bh0 ? s->chunk.heads : pairs - bh0;
    const size_t kv_pairs = (size_t)((bh0 + heads - 1) / plan->group - bh0 / plan->group + 1);
    for (int i0 = 0, rows; i0 < p->q_len; i0 += rows) {
      rows = s->chunk.rows < p->q_len - i0 ? s->chunk.rows : p->q_len - i0;
      ca_args a = {s->pairs, "bwds_pairs", 0, 0, CL_SUCCESS, NULL};
      ca_backward_args(&a, p, plan, bp, dsum, sinkt);
      arg_chunk(&a, bh0, i0, rows);
      ca_arg_mem(&a, s->pw);
      ca_arg_mem(&a, s->gw);
      const size_t pair_global[3] = {ca_round_up((size_t)p->kv_len, BS_TN), ca_round_up((size_t)rows, BS_TM),
                                     (size_t)heads};
      if ((st = ca_args_done(&a)) ||
          (st = ca_enqueue(ctx, s->pairs, "bwds_pairs", 3, pair_global, tile, n_wait, wait, prev)))
        return st;

      a = (ca_args){s->dq, "bwds_dq", 0, 0, CL_SUCCESS, NULL};
      ca_backward_args(&a, p, plan, bp, dsum, sinkt);
      arg_chunk(&a, bh0, i0, rows);
      ca_arg_mem(&a, s->gw);
      ca_arg_view(&a, &bp->d_q);
      ca_arg_mem(&a, dw_rows);
      ca_arg_int(&a, dw_rows != NULL);
      const size_t dq_global[3] = {ca_round_up((size_t)dk, BS_TN), ca_round_up((size_t)rows, BS_TM), (size_t)heads};
      if ((st = ca_args_done(&a)) || (st = ca_enqueue(ctx, s->dq, "bwds_dq", 3, dq_global, tile, n_wait, wait, prev)))
        return st;

      a = (ca_args){s->dkdv, "bwds_dkdv", 0, 0, CL_SUCCESS, NULL};
      ca_backward_args(&a, p, plan, bp, dsum, sinkt);
      arg_chunk(&a, bh0, i0, rows);
      ca_arg_int(&a, heads);
      ca_arg_mem(&a, s->pw);
      ca_arg_mem(&a, s->gw);
      ca_arg_mem(&a, s->acc);
      const size_t kv_global[3] = {col_tiles * BS_TN, ca_round_up((size_t)p->kv_len, BS_TM), kv_pairs};
      if ((st = ca_args_done(&a)) ||
          (st = ca_enqueue(ctx, s->dkdv, "bwds_dkdv", 3, kv_global, tile, n_wait, wait, prev)))
        return st;
    }
  }
  if ((st = ca_backward_store(ctx, s->store, s->acc, dk + dv, 0, dk, p->kv_heads, 1, p, &bp->d_k, n_wait, wait, prev)))
    return st;
  return ca_backward_store(ctx, s->store, s->acc, dk + dv, dk, dv, p->kv_heads, 1, p, &bp->d_v, n_wait, wait, prev);
}
