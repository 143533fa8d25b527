/* The public entry: validate everything, then dispatch to a path. */
#include <math.h>

#include "internal.h"

clattn_params clattn_params_default(void) {
  clattn_params p = {0};
  p.dtype = CLATTN_F32;
  p.scale = NAN;
  p.window_left = -1;
  p.window_right = -1;
  p.empty_rows = CLATTN_EMPTY_ZERO;
  p.algo = CLATTN_ALGO_AUTO;
  p.kv_dtype = CLATTN_DTYPE_SAME;
  return p;
}

const char *clattn_algo_name(clattn_algo a) {
  switch (a) {
    case CLATTN_ALGO_AUTO: return "auto";
    case CLATTN_ALGO_STAGED: return "staged";
    case CLATTN_ALGO_FUSED: return "fused";
    case CLATTN_ALGO_GEMM: return "gemm";
  }
  return "unknown";
}

clattn_status clattn_forward(clattn_context *ctx, const clattn_params *p, cl_uint n_wait, const cl_event *wait,
                             cl_event *done) {
  ca_plan plan;
  if (done) *done = NULL;
  if (n_wait > 0 && !wait)
    return ca_fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_forward: n_wait is %u but wait is NULL", n_wait);
  clattn_status st = ca_validate(ctx, p, &plan);
  if (st != CLATTN_OK) return st;
  ca_route_begin(clattn_algo_name(plan.algo)); /* each enqueue adds its kernel */
  switch (plan.algo) {
    case CLATTN_ALGO_FUSED: return ca_fused_forward(ctx, p, &plan, n_wait, wait, done);
    case CLATTN_ALGO_GEMM: return ca_gemm_forward(ctx, p, &plan, n_wait, wait, done);
    default: return ca_staged_forward(ctx, p, &plan, n_wait, wait, done);
  }
}
