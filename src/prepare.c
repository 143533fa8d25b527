/* clattn_prepare: the programs clattn_forward builds on first use, built
 * ahead of the first call. */
#include "internal.h"

clattn_status clattn_prepare(clattn_context *ctx, const clattn_params *shapes, int n) {
  if (!ctx) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: ctx is NULL");
  if (n < 0 || (n > 0 && !shapes))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: n is %d and shapes %s", n, shapes ? "given" : "NULL");
  for (int i = 0; i < n; i++) {
    const clattn_params *p = &shapes[i];
    if (p->dtype < CLATTN_F32 || p->dtype > CLATTN_BF16)
      return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: shapes[%d].dtype %d: q and out are F32, F16 or BF16",
                     i, (int)p->dtype);
    if (p->kv_dtype != CLATTN_DTYPE_SAME && (p->kv_dtype < CLATTN_F32 || p->kv_dtype > CLATTN_INT8))
      return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: shapes[%d].kv_dtype %d is not a clattn_dtype", i,
                     (int)p->kv_dtype);
    if (p->head_dim <= 0 || p->value_dim <= 0)
      return ca_fail(CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_prepare: shapes[%d]: head_dim %d and value_dim %d must be "
                     "positive",
                     i, p->head_dim, p->value_dim);
    cl_program program;
    clattn_status st;
    /* STAGED and GEMM read K/V through the core program of (dtype, kv_dtype);
     * the split-KV merge writes out through dtype's; FUSED has its own. */
    if ((st = ca_core_program_kv(ctx, p->dtype, p->kv_dtype, &program)) ||
        (st = ca_core_program(ctx, p->dtype, &program)) ||
        (st = ca_fused_program(ctx, p->head_dim, p->value_dim, p->dtype, p->kv_dtype, &program, NULL)))
      return st;
  }
  return CLATTN_OK;
}
