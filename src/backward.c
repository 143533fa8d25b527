/*
 * The backward pass (clattn_backward): validation, then cl/backward.cl's
 * passes in order on the context's queue:
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "program_text.h"

enum { BWD_BN = 16 }; /* keys / rows per work-item: cl/backward.cl's BWD_BN */

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

clattn_backward_params clattn_backward_params_default(void) {
  clattn_backward_params bp = {0};
  bp.fwd = clattn_params_default();
  bp.deterministic = 1;
  return bp;
}

/* Everything beyond the forward's own checks: lse, d_out and the gradient
 * views, the optional d_sinks / d_additive_w and what they need, each
 * recorded in vs with the forward's views. */
static clattn_status validate_backward(ca_views *vs, const clattn_backward_params *bp) {
  const clattn_params *p = &bp->fwd;
  clattn_status st;
  if (!p->lse.buf) return BAD("fwd.lse.buf is NULL: the backward recomputes the weights from the forward's lse");
  const struct {
    const char *name;
    const clattn_tensor *t;
  } required[] = {{"d_out", &bp->d_out}, {"d_q", &bp->d_q}, {"d_k", &bp->d_k}, {"d_v", &bp->d_v}};
  for (size_t i = 0; i < 4; i++)
    if (!required[i].t->buf) return BAD("%s.buf is NULL (d_out, d_q, d_k and d_v are required)", required[i].name);
  const int varlen = p->cu_seqlens_q != NULL, qb = varlen ? 1 : p->batch;
  const int q_rows = varlen ? p->total_q : p->q_len, k_rows = varlen ? p->total_kv : p->kv_len;
  const int q_dims[] = {qb, p->q_heads, q_rows, p->head_dim};
  const int k_dims[] = {qb, p->kv_heads, k_rows, p->head_dim};
  const int v_dims[] = {qb, p->kv_heads, k_rows, p->value_dim};
  const int o_dims[] = {qb, p->q_heads, q_rows, p->value_dim};
  const size_t elem = p->dtype == CLATTN_F32 ? sizeof(float) : 2;
  if (varlen) {
    const struct {
      const char *name;
      const clattn_tensor *t;
    } views[] = {{"d_out", &bp->d_out}, {"d_q", &bp->d_q}, {"d_k", &bp->d_k}, {"d_v", &bp->d_v}};
    for (size_t i = 0; i < 4; i++)
      if (views[i].t->stride[0] != 0)
        return BAD("%s.stride[0] must be 0 with cu_seqlens (got %zu)", views[i].name, views[i].t->stride[0]);
  }
  if ((st = ca_check_view(vs, "d_out", &bp->d_out, o_dims, 4, elem, 0)) ||
      (st = ca_check_view(vs, "d_q", &bp->d_q, q_dims, 4, elem, 1)) ||
      (st = ca_check_view(vs, "d_k", &bp->d_k, k_dims, 4, elem, 1)) ||
      (st = ca_check_view(vs, "d_v", &bp->d_v, v_dims, 4, elem, 1)))
    return st;
  if (bp->d_sinks) {
    if (!p->sinks) return BAD("d_sinks is set but fwd.sinks is NULL: there is no sink to differentiate");
    const int h_dims[] = {p->q_heads};
    const clattn_tensor t = {bp->d_sinks, 0, {1, 0, 0, 0}};
    if ((st = ca_check_view(vs, "d_sinks", &t, h_dims, 1, sizeof(float), 1))) return st;
  }
  if (bp->d_bias.buf) { /* a dimension the view broadcasts is summed: one element there */
    const int s_dims[] = {p->batch, p->q_heads, p->q_len, p->kv_len};
    int dims[4];
    for (int d = 0; d < 4; d++) dims[d] = bp->d_bias.stride[d] == 0 ? 1 : s_dims[d];
    if ((st = ca_check_view(vs, "d_bias", &bp->d_bias, dims, 4, sizeof(float), 1))) return st;
  }
  if (bp->d_additive_w) {
    if (p->score != CLATTN_SCORE_ADDITIVE) return BAD("d_additive_w is set but fwd.score is not CLATTN_SCORE_ADDITIVE");
    const int d_dims[] = {p->head_dim};
    const clattn_tensor t = {bp->d_additive_w, 0, {1, 0, 0, 0}};
    if ((st = ca_check_view(vs, "d_additive_w", &t, d_dims, 1, sizeof(float), 1))) return st;
  }
  return CLATTN_OK;
}

clattn_status clattn_backward(clattn_context *ctx, const clattn_backward_params *bp, cl_uint n_wait,
                              const cl_event *wait, cl_event *done) {
  clattn_status st = CLATTN_OK;
  ca_plan plan;
  if (done) *done = NULL;
  if (!ctx) return BAD("clattn_backward: ctx is NULL");
  if (!bp) return BAD("clattn_backward: params is NULL");
  if (n_wait > 0 && !wait) return BAD("clattn_backward: n_wait is %u but wait is NULL", n_wait);
  /* The forward's own checks, without its optional outputs (the backward
   * writes none of them) and with the algorithm moot. */
  if (bp->fwd.algo < CLATTN_ALGO_AUTO || bp->fwd.algo > CLATTN_ALGO_GEMM)
    return BAD("fwd.algo %d is not a clattn_algo", (int)bp->fwd.algo);
  if (bp->fwd.block_table || bp->fwd.cache_leftpad || ca_k_dtype(&bp->fwd) != bp->fwd.dtype ||
      ca_v_dtype(&bp->fwd) != bp->fwd.dtype)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "clattn_backward: paged K/V (fwd.block_table), left-padded caches (fwd.cache_leftpad) and K/V "
                   "stored otherwise than q (fwd.kv_dtype, fwd.v_dtype) are forward-only");
  clattn_params p = bp->fwd;
  p.weights.buf = p.entropy.buf = p.max_weight.buf = p.argmax.buf = NULL;
  p.algo = CLATTN_ALGO_FUSED;
  ca_views views;
  if ((st = ca_validate_backward_fwd(ctx, &p, &plan, &views)) || (st = validate_backward(&views, bp)) ||
      (st = ca_views_disjoint(&views)))
    return st;
  p.algo = bp->fwd.algo;

  cl_program program = NULL;
  cl_kernel rowdot = NULL, dkdv = NULL, dq = NULL, sum = NULL, zero = NULL, fill = NULL, store = NULL, dbias = NULL;
  cl_mem dsum = NULL, sinkt = NULL, dw_rows = NULL, dq_acc = NULL;
  ca_backward_staged staged = {0};
  cl_event prev = NULL;
  ca_deps deps;
  ca_deps_init(&deps, n_wait, wait);
  const size_t rows_total = (size_t)p.batch * (size_t)p.q_heads * (size_t)p.q_len;
  const int varlen = p.cu_seqlens_q != NULL;
  const int want_sinks = bp->d_sinks != NULL, want_dw = bp->d_additive_w != NULL;
  /* rows_total fits (each factor is an int, batch * q_heads < 2^31); times head_dim it may not */
  const cl_ulong dw_bytes = want_dw ? (cl_ulong)rows_total * (cl_ulong)p.head_dim * sizeof(float) : 0;
  if (want_dw && (dw_bytes > ctx->max_alloc || dw_bytes > SIZE_MAX))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "backward: d_additive_w's per-row terms (%llu bytes) exceed the device's largest allocation",
                   (unsigned long long)dw_bytes);
  if ((cl_ulong)rows_total * sizeof(float) > ctx->max_alloc)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "backward: per-row scratch exceeds the device's largest allocation");
  const int use_staged = p.algo == CLATTN_ALGO_STAGED || p.algo == CLATTN_ALGO_GEMM;
  /* FA2's single pass: dQ added atomically to f32 rows; d_additive_w's row
   * terms come from bwd_dq, so with them the two deterministic passes run */
  const int use_atomics = !use_staged && !bp->deterministic && !want_dw;
  ca_route_begin(use_staged ? "backward staged" : use_atomics ? "backward fa2 atomic dq" : "backward fa2");
  const cl_ulong dq_bytes = use_atomics ? (cl_ulong)rows_total * (cl_ulong)p.head_dim * sizeof(float) : 0;
  if (use_atomics && (dq_bytes > ctx->max_alloc || dq_bytes > SIZE_MAX))
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "backward: the atomic dQ's f32 rows (%llu bytes) exceed the device's "
                   "largest allocation",
                   (unsigned long long)dq_bytes);

  size_t scratch_bytes = rows_total * sizeof(float) * (p.sinks ? 2 : 1) + (size_t)dw_bytes + (size_t)dq_bytes;
  if ((st = ca_backward_program(ctx, p.head_dim, p.value_dim, p.dtype, p.dropout_p > 0.0f, &program)) ||
      (st = ca_kernel_take(ctx, program, "bwd_rowdot", &rowdot)))
    goto fail;
  if (use_staged && (st = ca_backward_staged_init(ctx, program, &p, &staged, &deps, &scratch_bytes))) goto fail;
  if (!use_staged &&
      ((st = ca_kernel_take(ctx, program, "bwd_dkdv", &dkdv)) || (st = ca_kernel_take(ctx, program, "bwd_dq", &dq))))
    goto fail;
  if (use_atomics && ((st = ca_kernel_take(ctx, program, "bwd_fill", &fill)) ||
                      (st = ca_kernel_take(ctx, program, "bwd_store", &store))))
    goto fail;
  if ((want_sinks || want_dw) && (st = ca_kernel_take(ctx, program, "bwd_sum", &sum))) goto fail;
  if (varlen && (st = ca_kernel_take(ctx, program, "bwd_zero", &zero))) goto fail;
  if (bp->d_bias.buf && (st = ca_kernel_take(ctx, program, "bwd_dbias", &dbias))) goto fail;
  if ((st = ca_scratch_take(ctx, rows_total * sizeof(float), "backward row sums D", &deps, &dsum)) ||
      (p.sinks && (st = ca_scratch_take(ctx, rows_total * sizeof(float), "backward sink terms", &deps, &sinkt))) ||
      (want_dw && (st = ca_scratch_take(ctx, (size_t)dw_bytes, "backward additive-w row terms", &deps, &dw_rows))) ||
      (use_atomics && (st = ca_scratch_take(ctx, (size_t)dq_bytes, "backward atomic dQ rows", &deps, &dq_acc))))
    goto fail;
  ca_note_scratch(ctx, scratch_bytes);
  if ((st = ca_dropout_take(ctx, &p, &plan.dropout))) goto fail;
  if ((st = ca_deps_list(&deps, &n_wait, &wait))) goto fail; /* the first command's wait list */

  if (varlen) {
    /* rows no sequence covers (and rows past q_len / kv_len) still get 0 */
    if ((st = ca_backward_zero(ctx, zero, &bp->d_q, p.q_heads, p.total_q, p.head_dim, n_wait, wait, &prev)) ||
        (st = ca_backward_zero(ctx, zero, &bp->d_k, p.kv_heads, p.total_kv, p.head_dim, n_wait, wait, &prev)) ||
        (st = ca_backward_zero(ctx, zero, &bp->d_v, p.kv_heads, p.total_kv, p.value_dim, n_wait, wait, &prev)))
      goto fail;
  }

  const size_t row_global[2] = {(size_t)p.q_len, (size_t)p.batch * (size_t)p.q_heads};
  const size_t row_blocks[2] = {((size_t)p.q_len + BWD_BN - 1) / BWD_BN, (size_t)p.batch * (size_t)p.q_heads};
  const size_t key_blocks[2] = {((size_t)p.kv_len + BWD_BN - 1) / BWD_BN, (size_t)p.batch * (size_t)p.kv_heads};
  /* One work-item per group where the fused kernel runs so too (CPUs):
   * POCL then runs each item's 16-wide code as written instead of
   * vectorising its loops across work-items. */
  const size_t one[2] = {1, 1};
  const size_t *block_local = ctx->tiles.flash_wg ? NULL : one;
  ca_args a = {rowdot, "bwd_rowdot", 0, 0, CL_SUCCESS, NULL};
  ca_backward_args(&a, &p, &plan, bp, dsum, sinkt);
  if ((st = ca_args_done(&a)) || (st = ca_enqueue(ctx, rowdot, "bwd_rowdot", 2, row_global, NULL, n_wait, wait, &prev)))
    goto fail;

  if (use_staged) {
    if ((st = ca_backward_staged_run(ctx, &staged, &p, &plan, bp, dsum, sinkt, dw_rows, n_wait, wait, &prev)))
      goto fail;
  } else {
    if (use_atomics &&
        (st = ca_backward_fill(ctx, fill, dq_acc, (cl_ulong)rows_total * (cl_ulong)p.head_dim, n_wait, wait, &prev)))
      goto fail;
    a = (ca_args){dkdv, "bwd_dkdv", 0, 0, CL_SUCCESS, NULL};
    ca_backward_args(&a, &p, &plan, bp, dsum, sinkt);
    ca_arg_view(&a, &bp->d_k);
    ca_arg_view(&a, &bp->d_v);
    ca_arg_mem(&a, dq_acc);
    ca_arg_int(&a, use_atomics);
    if ((st = ca_args_done(&a)) ||
        (st = ca_enqueue(ctx, dkdv, "bwd_dkdv", 2, key_blocks, block_local, n_wait, wait, &prev)))
      goto fail;

    if (use_atomics) {
      if ((st = ca_backward_store(ctx, store, dq_acc, p.head_dim, 0, p.head_dim, p.q_heads, 0, &p, &bp->d_q, n_wait,
                                  wait, &prev)))
        goto fail;
    } else {
      a = (ca_args){dq, "bwd_dq", 0, 0, CL_SUCCESS, NULL};
      ca_backward_args(&a, &p, &plan, bp, dsum, sinkt);
      ca_arg_view(&a, &bp->d_q);
      ca_arg_mem(&a, dw_rows);
      ca_arg_int(&a, want_dw);
      if ((st = ca_args_done(&a)) ||
          (st = ca_enqueue(ctx, dq, "bwd_dq", 2, row_blocks, block_local, n_wait, wait, &prev)))
        goto fail;
    }
  }

  if (dbias && (st = ca_backward_dbias(ctx, dbias, &p, &plan, bp, dsum, sinkt, n_wait, wait, &prev))) goto fail;
  const cl_ulong m = (cl_ulong)p.q_len, hq = (cl_ulong)p.q_heads;
  if (want_sinks && /* d_sinks[h] = sum over b, then i, of sinkt[(b Hq + h) M + i] */
      (st = ca_backward_sum(ctx, sum, sinkt, p.q_heads, (cl_ulong)p.batch, m, hq * m, m, 1, bp->d_sinks, n_wait, wait,
                            &prev)))
    goto fail;
  if (want_dw && /* d_w[t] = sum over rows r of dw_rows[r dk + t] */
      (st = ca_backward_sum(ctx, sum, dw_rows, p.head_dim, 1, (cl_ulong)rows_total, 0, 1, (cl_ulong)p.head_dim,
                            bp->d_additive_w, n_wait, wait, &prev)))
    goto fail;
fail:;
  const cl_event used = st == CLATTN_OK ? prev : NULL; /* a failed call's last event may not follow all it enqueued */
  const cl_kernel kernels[] = {rowdot, dkdv, dq, sum, zero, fill, store, dbias};
  for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) ca_kernel_give(ctx, kernels[i]);
  const cl_mem bufs[] = {dsum, sinkt, dw_rows, dq_acc};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ca_scratch_give(ctx, bufs[i], used);
  if (plan.dropout) clReleaseMemObject(plan.dropout); /* the enqueued kernels keep it until they ran */
  ca_backward_staged_release(ctx, &staged, used);
  ca_deps_release(&deps);
  ca_hand_out(st, &prev, done);
  return st;
}
