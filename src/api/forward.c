/* The calls that enqueue at once: each checked, planned into a launch list,
 * run, and the list dropped (a plan keeps its list: plan.c). */
#include "api/api.h"

#define BAD(...) ca_fail(CLATTN_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* A list made by plan from a checked call, run on the context's pools. */
static clattn_status run_list(clattn_context *ctx, ca_list *l, clattn_status planned, cl_uint n_wait,
                              const cl_event *wait, cl_event *done) {
  const clattn_status st = planned != CLATTN_OK ? planned : ca_run(ctx, l, n_wait, wait, done);
  ca_list_free(l);
  return st;
}

/* The checks every call makes of its wait list. */
static clattn_status check_wait(const char *call, cl_uint n_wait, const cl_event *wait, cl_event *done) {
  if (done) *done = NULL;
  return n_wait > 0 && !wait ? BAD("%s: n_wait is %u but wait is NULL", call, n_wait) : CLATTN_OK;
}

clattn_status clattn_forward(clattn_context *ctx, const clattn_params *p, cl_uint n_wait, const cl_event *wait,
                             cl_event *done) {
  ca_list l;
  clattn_params own;
  clattn_status st = check_wait("clattn_forward", n_wait, wait, done);
  if (st == CLATTN_OK && p && (st = ca_params_in(p, &own, "params")) == CLATTN_OK) p = &own;
  if (st == CLATTN_OK) st = ca_check_forward(ctx, p, NULL);
  if (st != CLATTN_OK) return st;
  int ran;
  st = ca_last_call_run(ctx, ctx->last_call, p, n_wait, wait, done, &ran);
  if (ran) return st;
  ca_list_init(&l, "forward");
  return run_list(ctx, &l, ca_plan_forward(ctx, p, &l), n_wait, wait, done);
}

clattn_status clattn_backward(clattn_context *ctx, const clattn_backward_params *bp, cl_uint n_wait,
                              const cl_event *wait, cl_event *done) {
  ca_list l;
  clattn_backward_params own;
  if (done) *done = NULL;
  clattn_status st = CLATTN_OK;
  if (bp && (st = ca_backward_params_in(bp, &own)) == CLATTN_OK) bp = &own;
  if (st == CLATTN_OK) st = ca_check_backward(ctx, bp);
  if (st == CLATTN_OK) st = check_wait("clattn_backward", n_wait, wait, done);
  if (st != CLATTN_OK) return st;
  ca_list_init(&l, "backward");
  return run_list(ctx, &l, ca_plan_backward(ctx, bp, &l), n_wait, wait, done);
}

clattn_status clattn_kv_append(clattn_context *ctx, const clattn_append_params *ap, cl_uint n_wait,
                               const cl_event *wait, cl_event *done) {
  ca_list l;
  clattn_append_params own;
  clattn_status st = check_wait("clattn_kv_append", n_wait, wait, done);
  if (st == CLATTN_OK && ap && (st = ca_append_params_in(ap, &own)) == CLATTN_OK) ap = &own;
  if (st == CLATTN_OK) st = ca_check_append(ctx, ap);
  if (st != CLATTN_OK) return st;
  ca_list_init(&l, "kv_append");
  return run_list(ctx, &l, ca_plan_append(ctx, ap, NULL, &l), n_wait, wait, done);
}

clattn_status clattn_forward_kvcache(clattn_context *ctx, const clattn_kvcache_params *kp, cl_uint n_wait,
                                     const cl_event *wait, cl_event *done) {
  ca_list l;
  clattn_kvcache_params own;
  clattn_status st = check_wait("clattn_forward_kvcache", n_wait, wait, done);
  if (st == CLATTN_OK && kp && (st = ca_kvcache_params_in(kp, &own)) == CLATTN_OK) kp = &own;
  if (st == CLATTN_OK) st = ca_check_kvcache(ctx, kp);
  if (st != CLATTN_OK) return st;
  ca_list_init(&l, "forward_kvcache");
  return run_list(ctx, &l, ca_plan_kvcache(ctx, kp, &l), n_wait, wait, done);
}

clattn_status clattn_merge_states(clattn_context *ctx, const clattn_merge_params *mp, cl_uint n_wait,
                                  const cl_event *wait, cl_event *done) {
  ca_list l;
  clattn_merge_params own;
  clattn_status st = check_wait("clattn_merge_states", n_wait, wait, done);
  if (st == CLATTN_OK && mp && (st = ca_merge_params_in(mp, &own)) == CLATTN_OK) mp = &own;
  if (st == CLATTN_OK) st = ca_check_merge(ctx, mp);
  if (st != CLATTN_OK) return st;
  ca_list_init(&l, "merge_states");
  return run_list(ctx, &l, ca_plan_merge(ctx, mp, &l), n_wait, wait, done);
}
