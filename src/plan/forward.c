/*
 * A forward call resolved (AUTO's choice, the effective scale and window)
 * and planned on its path.
 */
#include <math.h>

#include "plan/plan.h"

void ca_resolve(const clattn_context *ctx, const clattn_params *p, ca_resolved *r) {
  r->algo = p->algo != CLATTN_ALGO_AUTO ? p->algo : ca_auto_algo(ctx, p->q_len, p->weights.buf != NULL);
  r->scale = isnan(p->scale) ? (float)(1.0 / sqrt((double)p->head_dim)) : p->scale;
  r->window_left = p->window_left;
  r->window_right = p->causal ? 0 : p->window_right; /* causal: no key after the aligned position */
  r->group = p->q_heads / p->kv_heads;
  r->k_dtype = ca_k_dtype(p);
  r->v_dtype = ca_v_dtype(p);
  r->paged = p->block_table != NULL;
  r->diag = (p->entropy.buf ? CA_DIAG_ENTROPY : 0) | (p->max_weight.buf ? CA_DIAG_MAX_WEIGHT : 0) |
            (p->argmax.buf ? CA_DIAG_ARGMAX : 0);
  r->want_lse = p->lse.buf != NULL;
  r->want_weights = p->weights.buf != NULL;
  r->dropout = ca_dropout_words(p);
}

clattn_status ca_plan_forward(clattn_context *ctx, const clattn_params *p, ca_list *l) {
  ca_resolved r;
  ca_resolve(ctx, p, &r);
  /* The staged and GEMM paths hold rows of scores, one row at a time when
   * a row passes the scratch budget: a row is held up to a quarter of the
   * device's largest allocation (past that its grid and its passes over
   * the keys run for minutes: kv_len 2^31 on POCL; FUSED holds no row). */
  const cl_ulong row_bytes = (cl_ulong)p->kv_len * sizeof(float);
  if (r.algo != CLATTN_ALGO_FUSED && row_bytes > ctx->max_alloc / 4)
    return ca_fail(CLATTN_ERR_OUT_OF_MEMORY,
                   "kv_len %d: one row of scores (%llu bytes) is more than the %s path holds: a quarter of the "
                   "device's largest allocation (%llu bytes); use CLATTN_ALGO_FUSED or AUTO",
                   p->kv_len, (unsigned long long)row_bytes, clattn_algo_name(r.algo),
                   (unsigned long long)(ctx->max_alloc / 4));
  switch (r.algo) {
    case CLATTN_ALGO_FUSED: return ca_plan_fused(ctx, p, &r, l);
    case CLATTN_ALGO_GEMM: return ca_plan_gemm(ctx, p, &r, l);
    default: return ca_plan_staged(ctx, p, &r, l);
  }
}

clattn_status ca_plan_programs(clattn_context *ctx, const clattn_params *p) {
  ca_program program;
  /* STAGED and GEMM read K/V through the core program of (dtype, k and v
   * storage); the split-KV merge writes out through dtype's; FUSED has its own. */
  ca_program_key keys[3] = {ca_key_with_mod(ca_core_key(p->dtype, p->kv_dtype, p->v_dtype), p),
                            ca_core_key(p->dtype, CLATTN_DTYPE_SAME, CLATTN_DTYPE_SAME),
                            ca_key_with_mod(ca_fused_key(p->head_dim, p->value_dim, p->dtype, p->kv_dtype,
                                                         p->v_dtype, p->dropout_p > 0.0f),
                                            p)};
  clattn_status st = CLATTN_OK;
  for (int i = 0; i < 3 && st == CLATTN_OK; i++)
    if ((st = ca_program_get(ctx, &keys[i], &program)) == CLATTN_OK && keys[i].mod.flags)
      clReleaseProgram(program.program); /* built: the table holds it */
  return st;
}
