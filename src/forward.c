/* The public entry: validate everything, plan (plan.c), then the path enqueues. */
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
  p.v_dtype = CLATTN_DTYPE_SAME;
  p.bias_dtype = CLATTN_F32;
  return p;
}

clattn_status ca_forward_enqueue(clattn_context *ctx, const clattn_params *p, ca_plan *plan, cl_uint n_wait,
                                 const cl_event *wait, cl_event *done) {
  ca_fused_launch launch;
  clattn_status st;
  switch (plan->algo) {
    case CLATTN_ALGO_FUSED:
      if ((st = ca_plan_fused(ctx, p, plan, &launch)) || (st = ca_dropout_take(ctx, p, &plan->dropout))) break;
      st = ca_fused_forward(ctx, p, plan, &launch, n_wait, wait, done);
      break;
    case CLATTN_ALGO_GEMM:
      plan->chunk = ca_plan_chunks(p, ctx->scratch_budget);
      if ((st = ca_dropout_take(ctx, p, &plan->dropout))) break;
      st = ca_gemm_forward(ctx, p, plan, n_wait, wait, done);
      break;
    default:
      plan->chunk = ca_plan_chunks(p, ctx->scratch_budget);
      if ((st = ca_dropout_take(ctx, p, &plan->dropout))) break;
      st = ca_staged_forward(ctx, p, plan, n_wait, wait, done);
  }
  if (plan->dropout) clReleaseMemObject(plan->dropout); /* the enqueued kernels keep it until they ran */
  plan->dropout = NULL;
  return st;
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
  return ca_forward_enqueue(ctx, p, &plan, n_wait, wait, done);
}
