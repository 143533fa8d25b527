/* clattn_prepare: the programs clattn_forward builds on first use, built
 * ahead of the first call. */
#include <stdio.h>

#include "internal.h"

clattn_status clattn_prepare(clattn_context *ctx, const clattn_params *shapes, int n) {
  if (!ctx) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: ctx is NULL");
  if (n < 0 || (n > 0 && !shapes))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: n is %d and shapes %s", n, shapes ? "given" : "NULL");
  for (int i = 0; i < n; i++) {
    const clattn_params *p = &shapes[i];
    clattn_status st = ca_check_storage(p);
    if (st != CLATTN_OK) { /* the forward's message, naming the shape */
      char why[512];
      snprintf(why, sizeof why, "%s", clattn_last_error(ctx));
      return ca_fail(st, "clattn_prepare: shapes[%d]: %s", i, why);
    }
    cl_program program;
    /* STAGED and GEMM read K/V through the core program of (dtype, k and v
     * storage); the split-KV merge writes out through dtype's; FUSED has its own. */
    if ((st = ca_core_program_kv(ctx, p->dtype, p->kv_dtype, p->v_dtype, &program)) ||
        (st = ca_core_program(ctx, p->dtype, &program)) ||
        (st = ca_fused_program(ctx, p->head_dim, p->value_dim, p->dtype, p->kv_dtype, p->v_dtype, p->dropout_p > 0.0f,
                               &program, NULL)))
      return st;
  }
  return CLATTN_OK;
}
