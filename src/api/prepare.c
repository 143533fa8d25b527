/* clattn_prepare: the programs clattn_forward builds on first use, built
 * ahead of the first call. */
#include <stdio.h>

#include "api/api.h"

clattn_status clattn_prepare(clattn_context *ctx, const clattn_params *shapes, int n) {
  if (!ctx) return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: ctx is NULL");
  if (n < 0 || (n > 0 && !shapes))
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_prepare: n is %d and shapes %s", n, shapes ? "given" : "NULL");
  /* the caller's array steps by its own sizeof(clattn_params) */
  const size_t stride = n > 0 ? (shapes->struct_size ? shapes->struct_size : sizeof *shapes) : 0;
  for (int i = 0; i < n; i++) {
    clattn_params shape;
    clattn_status st = ca_params_in((const clattn_params *)(const void *)((const char *)shapes + (size_t)i * stride),
                                    &shape, "shapes[i]");
    if (st == CLATTN_OK) st = ca_check_storage(&shape);
    if (st != CLATTN_OK) { /* the forward's message, naming the shape */
      char why[512];
      snprintf(why, sizeof why, "%s", clattn_last_error(ctx));
      return ca_fail(st, "clattn_prepare: shapes[%d]: %s", i, why);
    }
    if ((st = ca_plan_programs(ctx, &shape))) return st;
  }
  return CLATTN_OK;
}
