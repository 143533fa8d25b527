/* clattn_backward's checks: the forward's call (without its optional
 * outputs: the backward writes none of them) and the gradients. */
#include <stdio.h>

#include "check/check.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* Everything beyond the forward's own checks: lse, d_out and the gradient
 * views, the optional d_sinks / d_additive_w and what they need, each
 * recorded in vs with the forward's views. */
static clattn_status check_gradients(ca_views *vs, const clattn_backward_params *bp) {
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
  if ((st = ca_check_view(vs, "d_out", &bp->d_out, o_dims, 4, elem, CA_VIEW_IN)) ||
      (st = ca_check_view(vs, "d_q", &bp->d_q, q_dims, 4, elem, CA_VIEW_OUT)) ||
      (st = ca_check_view(vs, "d_k", &bp->d_k, k_dims, 4, elem, CA_VIEW_OUT)) ||
      (st = ca_check_view(vs, "d_v", &bp->d_v, v_dims, 4, elem, CA_VIEW_OUT)))
    return st;
  if (bp->d_sinks) {
    if (!p->sinks) return BAD("d_sinks is set but fwd.sinks is NULL: there is no sink to differentiate");
    const int h_dims[] = {p->q_heads};
    const clattn_tensor t = {bp->d_sinks, 0, {1, 0, 0, 0}};
    if ((st = ca_check_view(vs, "d_sinks", &t, h_dims, 1, sizeof(float), CA_VIEW_OUT))) return st;
  }
  if (bp->d_bias.buf) { /* a dimension the view broadcasts is summed: one element there */
    const int s_dims[] = {p->batch, p->q_heads, p->q_len, p->kv_len};
    int dims[4];
    for (int d = 0; d < 4; d++) dims[d] = bp->d_bias.stride[d] == 0 ? 1 : s_dims[d];
    if ((st = ca_check_view(vs, "d_bias", &bp->d_bias, dims, 4, sizeof(float), CA_VIEW_OUT))) return st;
  }
  if (bp->d_additive_w) {
    if (p->score != CLATTN_SCORE_ADDITIVE) return BAD("d_additive_w is set but fwd.score is not CLATTN_SCORE_ADDITIVE");
    const int d_dims[] = {p->head_dim};
    const clattn_tensor t = {bp->d_additive_w, 0, {1, 0, 0, 0}};
    if ((st = ca_check_view(vs, "d_additive_w", &t, d_dims, 1, sizeof(float), CA_VIEW_OUT))) return st;
  }
  return CLATTN_OK;
}

clattn_status ca_check_backward(const clattn_context *ctx, const clattn_backward_params *bp) {
  clattn_status st;
  if (!ctx) return BAD("clattn_backward: ctx is NULL");
  if (!bp) return BAD("clattn_backward: params is NULL");
  if (bp->fwd.algo < CLATTN_ALGO_AUTO || bp->fwd.algo > CLATTN_ALGO_GEMM)
    return BAD("fwd.algo %d is not a clattn_algo", (int)bp->fwd.algo);
  if (bp->fwd.block_table || bp->fwd.cache_leftpad || ca_k_dtype(&bp->fwd) != bp->fwd.dtype ||
      ca_v_dtype(&bp->fwd) != bp->fwd.dtype)
    return ca_fail(CLATTN_ERR_UNSUPPORTED,
                   "clattn_backward: paged K/V (fwd.block_table), left-padded caches (fwd.cache_leftpad) and K/V "
                   "stored otherwise than q (fwd.kv_dtype, fwd.v_dtype) are forward-only");
  clattn_params p = bp->fwd;
  p.weights.buf = p.entropy.buf = p.max_weight.buf = p.argmax.buf = NULL;
  p.algo = CLATTN_ALGO_FUSED; /* moot here */
  ca_views views;
  if ((st = ca_check_forward_read(ctx, &p, &views)) || (st = check_gradients(&views, bp)) ||
      (st = ca_check_score_mod_grad(&p)))
    return st;
  return ca_views_disjoint(&views);
}
