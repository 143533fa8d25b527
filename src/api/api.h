/*
 * The api layer: the public functions (clattn.h), each a check, a plan and
 * a run. What tests ask of a plan beyond the public functions is here.
 */
#ifndef CLATTN_API_H
#define CLATTN_API_H

#include "run/run.h"

enum { CA_PLAN_LAUNCHES_MAX = 16 };

/* A caller's struct read through its struct_size (params.c): the fields
 * its header knew, every later one its default; INVALID_ARGUMENT for a
 * size no header gives, UNSUPPORTED for one newer than the library's.
 * what names it in messages. */
clattn_status ca_params_in(const clattn_params *in, clattn_params *out, const char *what);
clattn_status ca_backward_params_in(const clattn_backward_params *in, clattn_backward_params *out);
clattn_status ca_kvcache_params_in(const clattn_kvcache_params *in, clattn_kvcache_params *out);
clattn_status ca_append_params_in(const clattn_append_params *in, clattn_append_params *out);
clattn_status ca_merge_params_in(const clattn_merge_params *in, clattn_merge_params *out);
clattn_status ca_step_in(const clattn_step *in, clattn_step *out);
clattn_status ca_options_in(const clattn_options *in, clattn_options *out);

/* A context's last clattn_forward call and its list (last_call.c). */
typedef struct ca_last_call ca_last_call;
ca_last_call *ca_last_call_new(void);
void ca_last_call_free(ca_last_call *m);
/* Runs checked call p on m's list, patched when p differs from the last
 * call only in a kv_len it holds, else planned anew and kept. *ran 0: m
 * is in use by another call (or NULL), nothing was done. */
clattn_status ca_last_call_run(clattn_context *ctx, ca_last_call *m, const clattn_params *p, cl_uint n_wait,
                               const cl_event *wait, cl_event *done, int *ran);

/* Steps of a plan that replayed its command buffer; of those, the steps
 * that first updated its arguments or grids in place (for tests). */
long ca_plan_replays(clattn_plan *plan);
long ca_plan_updates(clattn_plan *plan);
/* Steps that took the last step's list without planning (as it was, or
 * patched at its step sites); whether the list the last step ran is the
 * one the planner makes for that step (for tests). */
long ca_plan_patches(clattn_plan *plan);
int ca_plan_list_is_planners(clattn_plan *plan);
/* The same of ctx's clattn_forward calls: the calls that took the last
 * call's list; whether the list the last call ran is the planner's. */
long ca_last_call_patches(clattn_context *ctx);
int ca_last_call_is_planners(clattn_context *ctx);

#endif
