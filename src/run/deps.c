/*
 * What a call's first command waits for: the caller's wait list and the
 * pending last uses of the scratch buffers and flags the call took
 * (scratch_pool.c hands them over on out-of-order queues). Every later
 * command of the call chains on the one before (ca_enqueue's *prev), so
 * one wait list on the first command orders the whole call. No barrier is
 * enqueued: a barrier orders every later command of the queue, other
 * threads' too, and POCL 3.1 lets a command that follows two barriers wait
 * for the last one's list alone.
 */
#include <stdlib.h>
#include <string.h>

#include "run/run.h"

void ca_deps_init(ca_deps *d, cl_uint n_wait, const cl_event *wait) {
  memset(d, 0, sizeof *d);
  d->n_caller = n_wait;
  d->caller = n_wait ? wait : NULL;
}

clattn_status ca_deps_add(clattn_context *ctx, ca_deps *d, cl_event ev) {
  if (d->n_own == CA_DEPS_MAX) { /* one marker stands for those held so far */
    cl_event all = NULL;
    cl_int err = clEnqueueMarkerWithWaitList(ctx->queue, d->n_own, d->own, &all);
    if (err != CL_SUCCESS) {
      clReleaseEvent(ev);
      return ca_cl_fail(err, "clEnqueueMarkerWithWaitList(a call's pending scratch uses)");
    }
    for (cl_uint i = 0; i < d->n_own; i++) clReleaseEvent(d->own[i]);
    d->own[0] = all;
    d->n_own = 1;
  }
  d->own[d->n_own++] = ev;
  return CLATTN_OK;
}

clattn_status ca_deps_list(ca_deps *d, cl_uint *n, const cl_event **list) {
  if (d->n_own == 0 || d->n_caller == 0) {
    *n = d->n_own ? d->n_own : d->n_caller;
    *list = d->n_own ? d->own : d->caller;
    return CLATTN_OK;
  }
  free(d->merged);
  d->merged = malloc((size_t)(d->n_caller + d->n_own) * sizeof *d->merged);
  if (!d->merged) return ca_fail(CLATTN_ERR_OUT_OF_MEMORY, "a call's wait list: out of host memory");
  memcpy(d->merged, d->caller, d->n_caller * sizeof *d->merged);
  memcpy(d->merged + d->n_caller, d->own, d->n_own * sizeof *d->merged);
  *n = d->n_caller + d->n_own;
  *list = d->merged;
  return CLATTN_OK;
}

void ca_deps_release(ca_deps *d) {
  for (cl_uint i = 0; i < d->n_own; i++) clReleaseEvent(d->own[i]);
  free(d->merged);
  ca_deps_init(d, 0, NULL);
}
